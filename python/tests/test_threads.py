"""Ranks as threads of this process: Comm.init_all(n) (and get_unique_id + init_rank),
one Python thread per rank running checks.run_all; one thread driving every rank inside
ferroccl.group()."""

import numpy as np
import pytest

import ferroccl
from checks import run_all, run_threads


@pytest.mark.parametrize("n", [1, 2, 3])
def test_init_all_threads(n):
    comms = ferroccl.Comm.init_all(n)
    try:
        assert [c.rank for c in comms] == list(range(n))
        assert all(c.size == n for c in comms)
        assert all(c.device == -1 for c in comms)
        assert all(c.last_path == ("none", "none") and c.last_exchanges == 0 for c in comms)
        fails = run_threads(lambda r: run_all(comms[r]), n)
        # host memory: the built-in host algorithms served the last call
        assert all(c.last_path[0] == "host" and c.last_path[1] for c in comms)
        # its only messages were its data
        assert all(c.last_exchanges == 0 for c in comms)
        assert [f for rank_fails in fails for f in rank_fails] == []
    finally:
        for c in comms:
            c.close()
    assert all(c.closed for c in comms)


def test_unique_id_init_rank_threads():
    n = 2
    uid = ferroccl.get_unique_id()
    assert ferroccl.UniqueId.from_hex(uid.hex()) == uid
    assert len(bytes(uid)) == 128

    def rank(r):
        with ferroccl.Comm.init_rank(n, uid, r, timeout_ms=20000, name="py-uid") as comm:
            return comm.all_reduce(np.arange(5, dtype=np.float64) * (r + 1))

    results = run_threads(rank, n)
    for got in results:
        np.testing.assert_array_equal(got, np.arange(5, dtype=np.float64) * 3)


def test_group_one_thread_drives_all_ranks():
    n = 4
    comms = ferroccl.Comm.init_all(n)
    try:
        xs = [np.full(8, r + 1, dtype=np.float32) for r in range(n)]
        with ferroccl.group():
            outs = [c.all_reduce(xs[c.rank]) for c in comms]
        for o in outs:
            np.testing.assert_array_equal(o, np.full(8, n * (n + 1) / 2, dtype=np.float32))
        # a ring of sends and receives from one thread: only possible in a group
        got = [np.empty(3, dtype=np.int64) for _ in range(n)]
        with ferroccl.group():
            for c in comms:
                # temporary send arrays: the group keeps them alive until it ends
                c.send(np.arange(3, dtype=np.int64) + 10 * c.rank, (c.rank + 1) % n)
                c.recv(got[c.rank], (c.rank - 1) % n)
        for r in range(n):
            np.testing.assert_array_equal(got[r], np.arange(3) + 10 * ((r - 1) % n))
    finally:
        for c in comms:
            c.close()
