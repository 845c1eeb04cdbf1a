"""Errors: the library's failures raise FcclError with its code and message; misuse that
Python can see first raises TypeError / ValueError before anything is sent."""

import pickle
import threading

import numpy as np
import pytest

import ferroccl


@pytest.fixture
def comm():
    (c,) = ferroccl.Comm.init_all(1)
    yield c
    c.close()


def test_invalid_root_raises_fccl_error(comm):
    with pytest.raises(ferroccl.FcclError) as ei:
        comm.broadcast(np.zeros(4, np.float32), root=3)
    e = ei.value
    assert e.code == ferroccl.Result.INVALID_ARGUMENT == 4
    assert e.name == "fcclInvalidArgument"
    assert e.call == "fcclBroadcast"
    assert "root" in e.message  # the library's own message
    assert e.message.split(": ", 1)[1] in str(e)
    assert pickle.loads(pickle.dumps(e)).message == e.message


@pytest.mark.parametrize("value", [2**40, 2**32 + 1, 2**31, -1, -(2**40)])
def test_roots_and_peers_beyond_a_c_int_are_refused_before_the_call(comm, value):
    # ctypes passes an int through a C int by truncating it: 2**40 would be root 0.
    x = np.arange(4, dtype=np.float32)
    calls = [
        ("fcclBroadcast", "root", lambda: comm.broadcast(x, root=value)),
        ("fcclReduce", "root", lambda: comm.reduce(x, root=value)),
        ("fcclGather", "root", lambda: comm.gather(x, root=value)),
        ("fcclScatter", "root", lambda: comm.scatter(x, root=value)),
        ("fcclBroadcastCoalesced", "root", lambda: comm.broadcast_coalesced([x], root=value)),
        ("gather_v", "root", lambda: comm.gather_v(x, [4], root=value)),
        ("scatter_v", "root", lambda: comm.scatter_v(x, [4], root=value)),
        ("fcclSend", "peer", lambda: comm.send(x, value)),
        ("fcclRecv", "peer", lambda: comm.recv(x, value)),
    ]
    for call, arg, run in calls:
        with pytest.raises(ferroccl.FcclError) as ei:
            run()
        e = ei.value
        assert (e.code, e.call) == (ferroccl.Result.INVALID_ARGUMENT, call), e
        assert f"{arg} is {value}: give a rank of this communicator, from 0 to 0" in e.message, e.message
    np.testing.assert_array_equal(x, np.arange(4, dtype=np.float32))


def test_roots_that_are_no_rank_are_refused_where_c_never_sees_them():
    comms = ferroccl.Comm.init_all(2)
    try:
        x = np.ones(2, np.float32)
        for run in (lambda: comms[0].gather_v(x, [2, 2], root=2), lambda: comms[0].scatter_v(x, [1, 1], root=2)):
            with pytest.raises(ferroccl.FcclError, match="root is 2: give a rank of this communicator, from 0 to 1"):
                run()
    finally:
        for c in comms:
            c.close()


def test_a_timeout_beyond_a_c_int_is_refused():
    with pytest.raises(ferroccl.FcclError, match="timeout_ms is 4294967296: give a number of milliseconds"):
        ferroccl.Comm.init_rank(1, ferroccl.get_unique_id(), 0, timeout_ms=2**32)


def test_closed_comm_raises_fccl_error(comm):
    (c,) = ferroccl.Comm.init_all(1)
    c.close()
    c.close()  # idempotent
    for run in (lambda: c.all_reduce(np.ones(2)), lambda: c.last_path, lambda: c.last_exchanges, c.async_error, c.finalize):
        with pytest.raises(ferroccl.FcclError) as ei:
            run()
        assert ei.value.code == ferroccl.Result.INVALID_ARGUMENT
        # Python's words, not the C library's "comm is NULL".
        assert "this communicator is closed (close() was called)" in str(ei.value), ei.value
        assert "NULL" not in str(ei.value)
    assert "closed" in repr(c)
    (d,) = ferroccl.Comm.init_all(1)
    d.abort()
    with pytest.raises(ferroccl.FcclError, match=r"closed \(abort\(\) was called\)"):
        d.broadcast(np.ones(2))


def test_the_error_is_ferroccl_fcclerror_and_names_the_call_once(comm):
    assert ferroccl.FcclError.__module__ == "ferroccl"
    assert ferroccl.FcclError.__qualname__ == "FcclError"
    with pytest.raises(ferroccl.FcclError) as ei:
        comm.broadcast(np.zeros(4, np.float32), root=3)
    text = str(ei.value)
    assert text.startswith("fcclBroadcast: fcclInvalidArgument (4): "), text
    assert text.count("fcclBroadcast") == 1, text
    assert ei.value.message.startswith("fcclBroadcast"), "the attribute keeps the library's message whole"


def test_python_side_checks(comm):
    with pytest.raises(TypeError, match="does not support dtype complex64"):
        comm.all_reduce(np.ones(3, dtype=np.complex64))
    with pytest.raises(TypeError, match="float16, float32, float64.*bool, int16"):
        comm.all_reduce(np.ones(3, dtype=np.complex128))
    # bool and int16 have no library type: avg of them has no meaning, and says so
    for dt in (bool, np.int16):
        with pytest.raises(ferroccl.FcclError, match="avg of"):
            comm.all_reduce(np.ones(3, dtype=dt), op="avg")
    with pytest.raises(TypeError, match="byte order"):
        comm.all_reduce(np.ones(3, dtype=">f4" if np.little_endian else "<f4"))
    with pytest.raises(ValueError, match="unknown reduction op"):
        comm.all_reduce(np.ones(3, np.float32), op="median")
    with pytest.raises(ValueError, match="elements"):
        comm.all_reduce(np.ones(3, np.float32), out=np.empty(4, np.float32))
    with pytest.raises(TypeError, match="dtype"):
        comm.all_reduce(np.ones(3, np.float32), out=np.empty(3, np.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        comm.all_reduce(np.ones(3, np.float32), out=np.empty(6, np.float32)[::2])
    with pytest.raises(TypeError, match="a list is not an array"):
        comm.recv([0, 0], 0)
    with pytest.raises(ValueError, match="read-only"):
        x = np.ones(3, np.float32)
        x.flags.writeable = False
        comm.all_reduce(x)


def test_uneven_blocks_are_refused_before_any_call():
    comms = ferroccl.Comm.init_all(2)
    try:
        with pytest.raises(ValueError, match="equal blocks"):
            comms[0].reduce_scatter(np.ones(3, np.float32))  # nothing sent: rank 1 need not call
    finally:
        for c in comms:
            c.close()


def test_mismatched_send_recv_reports_on_both_sides():
    comms = ferroccl.Comm.init_all(2)
    errors = [None, None]

    def rank(r):
        try:
            if r == 0:
                comms[0].send(np.ones(4, np.int32), 1)
            else:
                comms[1].recv(np.empty(5, np.int32), 0)
        except ferroccl.FcclError as e:
            errors[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        for e in errors:
            assert e is not None, "a mismatched send/recv did not raise"
            assert e.code == ferroccl.Result.COLLECTIVE_MISMATCH == 100
            assert e.message
    finally:
        for c in comms:
            c.abort()


def test_split_nocolor_and_context_manager():
    comms = ferroccl.Comm.init_all(2)
    subs = [None, None]

    def rank(r):
        subs[r] = comms[r].split(0 if r == 0 else ferroccl.SPLIT_NOCOLOR)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert subs[1] is None
    with subs[0] as s:
        assert (s.rank, s.size) == (0, 1)
        np.testing.assert_array_equal(s.all_reduce(np.arange(3)), np.arange(3))
    assert subs[0].closed
    for c in comms:
        c.close()
