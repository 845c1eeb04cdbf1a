"""Non-blocking communicators (blocking=False, the library's config.blocking = 0): the
creation returns at once, calls run on the library's progress thread, async_op=True
Works poll fcclCommGetAsyncError with no Python worker thread, errors carry the
library's message naming the call, abort ends pending work. Ranks are threads."""

import threading
import time

import numpy as np
import pytest

import ferroccl
from checks import TIMEOUT_S, run_all, run_threads


def ranks(fn, n, **kw):
    """fn(comm) on n thread ranks of a non-blocking communicator; results by rank."""
    uid = ferroccl.get_unique_id()

    def body(r):
        c = ferroccl.Comm.init_rank(n, uid, r, blocking=False, timeout_ms=20000, **kw)
        try:
            return fn(c)
        finally:
            if not c.closed:
                c.close()

    return run_threads(body, n)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_the_whole_api_works_on_non_blocking_communicators(n):
    def rank(c):
        assert not c.blocking and c.size == n and 0 <= c.rank < n
        return run_all(c)

    fails = ranks(rank, n)
    assert [f for rank_fails in fails for f in rank_fails] == []


def test_creation_returns_at_once_and_calls_wait_for_it():
    uid = ferroccl.get_unique_id()
    # Rank 0 alone: its creation cannot finish until rank 1 arrives.
    c0 = ferroccl.Comm.init_rank(2, uid, 0, blocking=False, timeout_ms=20000)
    assert c0.in_progress()
    assert c0.async_error() is ferroccl.Result.IN_PROGRESS
    assert (c0.rank, c0.size) == (0, 2)  # known from the arguments
    out = {}

    def late():
        time.sleep(0.2)
        with ferroccl.Comm.init_rank(2, uid, 1, timeout_ms=20000) as c1:  # a blocking peer
            out[1] = c1.all_reduce(np.array([10.0]))

    t = threading.Thread(target=late, daemon=True)
    t.start()
    out[0] = c0.all_reduce(np.array([1.0]))  # waits for the creation, then for the call
    t.join(TIMEOUT_S)
    assert out[0][0] == 11.0 and out[1][0] == 11.0
    assert not c0.in_progress() and c0.async_error() is None
    c0.close()


def test_async_work_uses_no_python_thread_and_completes_in_order():
    def rank(c):
        before = set(threading.enumerate())
        xs = [np.full(50_000, c.rank + k, np.float64) for k in range(6)]
        works = [c.all_reduce(x, async_op=True) for x in xs]
        started = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("ferroccl")]
        assert started == [] and c._worker is None, f"Python threads started: {started}"
        for k, (w, x) in enumerate(zip(works, xs)):
            assert w.wait(30) is x
            assert w.is_completed() and w.is_success() and w.exception() is None
            np.testing.assert_array_equal(x, 1 + 2 * k)
        # A call without async_op after async ones runs after them.
        y = np.full(3, 1.0)
        w = c.all_reduce(y, async_op=True)
        c.all_reduce(y)
        assert w.is_completed()
        np.testing.assert_array_equal(y, 4.0)
        return True

    assert ranks(rank, 2) == [True, True]


def test_a_bad_argument_fails_its_work_at_once_and_the_comm_goes_on():
    def rank(c):
        bad = c.broadcast(np.zeros(2, np.float32), root=7, async_op=True)
        assert bad.is_completed() and not bad.is_success()
        with pytest.raises(ferroccl.FcclError) as ei:
            bad.wait(5)
        assert ei.value.call == "fcclBroadcast" and "root 7" in ei.value.message
        assert c.async_error() is None
        return float(c.all_reduce(np.array([2.0]))[0])

    assert ranks(rank, 2) == [4.0, 4.0]


def test_an_error_on_the_progress_thread_reaches_every_pending_work():
    def rank(c):
        x = np.ones(10 + c.rank, np.float32)  # counts differ by rank
        w1 = c.all_reduce(x, async_op=True)
        y = np.full(4, 7.0)
        w2 = c.all_reduce(y, async_op=True)
        with pytest.raises(ferroccl.FcclError) as ei:
            w1.wait(30)
        e = ei.value
        assert e.code == ferroccl.Result.COLLECTIVE_MISMATCH and e.call == "fcclAllReduce", e
        assert "count 10" in e.message and "count 11" in e.message
        assert w2.exception() is not None  # queued behind the failure: never ran
        np.testing.assert_array_equal(y, 7.0)
        assert c.async_error() == ferroccl.Result.COLLECTIVE_MISMATCH
        with pytest.raises(ferroccl.FcclError, match="unusable after an earlier error"):
            c.all_reduce(np.ones(2))
        return True

    assert ranks(rank, 2, check=True) == [True, True]


def test_abort_ends_pending_work():
    uid = ferroccl.get_unique_id()
    got = {}

    def peer():
        with ferroccl.Comm.init_rank(2, uid, 1, blocking=False, timeout_ms=60000) as c1:
            c1.wait(30)
            got["peer ready"] = True
            while "aborted" not in got:
                time.sleep(0.01)
            with pytest.raises(ferroccl.FcclError) as ei:
                c1.barrier()
            got["peer"] = ei.value.code

    t = threading.Thread(target=peer, daemon=True)
    t.start()
    c0 = ferroccl.Comm.init_rank(2, uid, 0, blocking=False, timeout_ms=60000)
    buf = np.zeros(1 << 16, np.uint8)
    w = c0.recv(buf, 1, async_op=True)  # rank 1 never sends
    time.sleep(0.05)
    assert not w.is_completed()
    t0 = time.monotonic()
    c0.abort()
    assert time.monotonic() - t0 < 10
    with pytest.raises(ferroccl.FcclError, match="aborted"):
        w.wait(5)
    got["aborted"] = True
    t.join(TIMEOUT_S)
    assert got["peer"] == ferroccl.Result.REMOTE_ERROR
    assert not buf.any()


def test_groups_and_split_of_non_blocking_communicators():
    n = 3

    def rank(c):
        r = c.rank
        out = np.zeros(4, np.int32)
        with ferroccl.group():
            c.send(np.full(4, r, np.int32), (r + 1) % n)
            c.recv(out, (r - 1) % n)
        np.testing.assert_array_equal(out, (r - 1) % n)  # filled when the block ends
        sub = c.split(r % 2)
        assert not sub.blocking
        got = sub.all_reduce(np.array([r], np.int64))
        want = sum(q for q in range(n) if q % 2 == r % 2)
        sub.finalize()
        sub.close()
        return int(got[0]) == want and sub.closed

    assert ranks(rank, n) == [True] * n


def test_a_blocking_communicator_refused_inside_a_non_blocking_group():
    (b,) = ferroccl.Comm.init_all(1)

    def rank(c):
        with pytest.raises(ferroccl.FcclError, match="a group takes one kind"):
            with ferroccl.group():
                c.all_reduce(np.ones(2))
                b.all_reduce(np.ones(2))
        return True

    try:
        assert ranks(rank, 1) == [True]
    finally:
        b.close()
