"""The checks every rank runs (processes: worker.py; threads: test_threads.py).

run_all(comm) makes the same sequence of calls on every rank whatever it finds, and
returns a list of failure messages (empty when everything matched numpy's reference).
Inputs are small integers so every float sum is exact whatever the order.
run_threads(fn, n) runs ranks as threads of this process."""

import threading

import numpy as np

import ferroccl

TIMEOUT_S = 60


def run_threads(fn, n):
    """fn(r) on one thread per rank r < n; their results by rank; raises the first error
    (after every thread has ended, or fails if one has not within TIMEOUT_S)."""
    results, errors = [None] * n, []

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((r, e))

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
        assert not t.is_alive(), "a rank thread did not finish"
    if errors:
        raise errors[0][1]
    return results

INT_TYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64]
FLOAT_TYPES = [np.float16, np.float32, np.float64]


def data(rank, shape, dtype, salt=0):
    n = int(np.prod(shape))
    v = (np.arange(n, dtype=np.int64) * 7 + rank * 3 + salt) % 11 + (1 if rank % 2 == 0 else 0)
    return v.astype(dtype).reshape(shape)


def reference(op, arrays):
    acc = np.stack([a.astype(np.float64) if a.dtype.kind == "f" else a.astype(np.int64) for a in arrays])
    if op == "sum":
        r = acc.sum(0)
    elif op == "prod":
        r = acc.prod(0)
    elif op == "max":
        r = acc.max(0)
    elif op == "min":
        r = acc.min(0)
    elif op in ("band", "bor", "bxor"):
        f = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
        r = f.reduce(acc, 0)
    else:  # avg: integer division for integer types (docs/abi.md)
        r = acc.sum(0) / len(arrays) if acc.dtype.kind == "f" else acc.sum(0) // len(arrays)
    return r.astype(arrays[0].dtype)


def bits(rank, n, dtype):
    """Distinct bit patterns per rank: every bit of the type set on some ranks, clear on others."""
    v = np.array([1 << (rank % 8), 0x5A ^ rank, -1 - rank, 0x7F00 + 3 * rank, rank * 0x0101], dtype=np.int64)
    return np.resize(v, n).astype(dtype)


def run_carried(comm, expect):
    """The bitwise ops on every integer type; bool and int16, which move as bytes and
    reduce as uint8 (bool, with the logical op) or widened to int32 (int16)."""
    r, n = comm.rank, comm.size
    for dtype in INT_TYPES + [np.int16]:
        for op in ("band", "bor", "bxor"):
            want = reference(op, [bits(p, 10, dtype) for p in range(n)])
            expect(f"all_reduce {np.dtype(dtype)} {op}", comm.all_reduce(bits(r, 10, dtype), op=op), want)
    try:
        comm.all_reduce(np.ones(3, np.float64), op=ferroccl.Op.BXOR)
        expect("bxor of float64 refused", np.zeros(0), None)
    except ferroccl.FcclError as e:
        if "fcclBxor" not in str(e) or "fcclFloat64" not in str(e):
            expect(f"bxor of float64: message {e}", np.zeros(0), None)

    # int16: reductions wrap as int16 arithmetic does
    big = [np.array([30000, -30000, 2 + p, 181 * (p + 1)], dtype=np.int16) for p in range(n)]
    for op in ("sum", "prod", "max", "min"):
        wide = [b.astype(np.int64) for b in big]
        want = reference(op, wide).astype(np.int16)
        expect(f"all_reduce int16 {op}", comm.all_reduce(big[r].copy(), op=op), want)
    expect("reduce_scatter int16", comm.reduce_scatter(np.concatenate([big[r][:2]] * n)),
           reference("sum", [b[:2].astype(np.int64) for b in big]).astype(np.int16))
    got = comm.reduce(big[r].copy(), op="max", root=n - 1)
    expect("reduce int16", got, reference("max", big) if r == n - 1 else None)
    x = np.arange(6, dtype=np.int16).reshape(2, 3) * (r + 1)
    expect("all_gather int16", comm.all_gather(x), np.stack([np.arange(6, dtype=np.int16).reshape(2, 3) * (p + 1)
                                                             for p in range(n)]))
    expect("all_gather_axis int16", comm.all_gather_axis(x, 1),
           np.concatenate([np.arange(6, dtype=np.int16).reshape(2, 3) * (p + 1) for p in range(n)], axis=1))
    expect("all_gather_v int16", comm.all_gather_v(np.full(r + 1, -r, np.int16), [p + 1 for p in range(n)]),
           np.concatenate([np.full(p + 1, -p, np.int16) for p in range(n)]))
    expect("broadcast int16", comm.broadcast(np.array([r - 7, 300], np.int16), root=0), np.array([-7, 300], np.int16))
    # async (a non-blocking communicator refuses it for int16: the result is narrowed when done)
    w = comm.all_reduce(big[r].copy(), op="sum", async_op=comm.blocking)
    expect("all_reduce int16 (async when blocking)", w.wait() if comm.blocking else w,
           reference("sum", [b.astype(np.int64) for b in big]).astype(np.int16))

    # bool: sum/max/bor are or, prod/min/band are and, bxor is xor (torch's semantics)
    flags = [np.array([p == 0, True, False, p % 2 == 1, p != n - 1]) for p in range(n)]
    logical = {"sum": np.logical_or, "max": np.logical_or, "bor": np.logical_or, "prod": np.logical_and,
               "min": np.logical_and, "band": np.logical_and, "bxor": np.logical_xor}
    for op, f in logical.items():
        # as bytes: a bool holding 2 or 3 (a sum) compares equal to True, but is not a bool
        expect(f"all_reduce bool {op}", comm.all_reduce(flags[r].copy(), op=op).view(np.uint8),
               f.reduce(np.stack(flags), 0).view(np.uint8))
    expect("all_gather bool", comm.all_gather(flags[r]), np.stack(flags))
    for dtype in (np.bool_, np.int16):
        try:
            comm.all_reduce(np.ones(2, dtype), op="avg")
            expect(f"avg of {np.dtype(dtype)} refused", np.zeros(0), None)
        except ferroccl.FcclError as e:
            if "avg" not in str(e) or e.name != "fcclInvalidArgument":
                expect(f"avg of {np.dtype(dtype)}: message {e}", np.zeros(0), None)


def run_all(comm):
    fails = []
    r, n = comm.rank, comm.size

    def expect(what, got, want):
        if got is None or want is None:
            if got is not want:
                fails.append(f"rank {r}/{n} {what}: got {got!r}, expected {want!r}")
            return
        if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
            fails.append(f"rank {r}/{n} {what}: got {got.dtype}{got.shape} {got.ravel()[:6]}..., "
                         f"expected {want.dtype}{want.shape} {want.ravel()[:6]}...")

    # all_reduce: every dtype, every op, out-of-place and in place, a 2-D shape
    for dtype in INT_TYPES + FLOAT_TYPES:
        for op in ("sum", "max", "min"):
            x = data(r, (3, 5), dtype)
            want = reference(op, [data(p, (3, 5), dtype) for p in range(n)])
            expect(f"all_reduce {np.dtype(dtype)} {op}", comm.all_reduce(x, op=op), want)
    x = data(r, (7,), np.float32)
    comm.all_reduce(x, op=ferroccl.Op.SUM, out=x)
    expect("all_reduce in place", x, reference("sum", [data(p, (7,), np.float32) for p in range(n)]))
    x = data(r, (4,), np.int32) % 2 + 1
    expect("all_reduce prod", comm.all_reduce(x, op="prod"),
           reference("prod", [data(p, (4,), np.int32) % 2 + 1 for p in range(n)]))
    x = data(r, (9,), np.int64)
    expect("all_reduce avg int64", comm.all_reduce(x, op="avg"), reference("avg", [data(p, (9,), np.int64)
                                                                                   for p in range(n)]))
    # a non-contiguous input is refused before anything is sent (nothing is ever copied)
    x = data(r, (6, 4), np.float64)[:, ::2]
    try:
        comm.all_reduce(x)
        fails.append(f"rank {r}/{n} all_reduce strided input: no error")
    except ValueError as e:
        if "C-contiguous" not in str(e):
            fails.append(f"rank {r}/{n} all_reduce strided input: {e}")
    # in place: the caller's array holds the result and is the one returned
    x = data(r, (5,), np.int32)
    if comm.all_reduce(x) is not x:
        fails.append(f"rank {r}/{n} all_reduce did not return its input")
    expect("all_reduce in place by default", x, reference("sum", [data(p, (5,), np.int32) for p in range(n)]))

    # broadcast / reduce
    for root in sorted({0, n - 1}):
        x = data(r, (2, 3), np.float32, salt=root)
        expect(f"broadcast root {root}", comm.broadcast(x, root=root), data(root, (2, 3), np.float32, salt=root))
        got = comm.reduce(data(r, (10,), np.int32), op="max", root=root)
        expect(f"reduce root {root}", got,
               reference("max", [data(p, (10,), np.int32) for p in range(n)]) if r == root else None)
    y = data(r, (5,), np.uint8, salt=4)
    comm.broadcast(y, root=0, out=y)
    expect("broadcast in place", y, data(0, (5,), np.uint8, salt=4))

    # all_gather / reduce_scatter / all_to_all
    x = data(r, (2, 3), np.float64)
    expect("all_gather", comm.all_gather(x), np.stack([data(p, (2, 3), np.float64) for p in range(n)]))
    full = [data(p, (n * 2, 3), np.float32) for p in range(n)]
    expect("reduce_scatter", comm.reduce_scatter(full[r]), reference("sum", full)[2 * r:2 * r + 2])
    send = np.stack([np.full((4,), 100 * r + q, dtype=np.int64) for q in range(n)])
    expect("all_to_all", comm.all_to_all(send), np.stack([np.full((4,), 100 * q + r, dtype=np.int64)
                                                          for q in range(n)]))

    # gather / scatter
    root = n - 1
    got = comm.gather(data(r, (3,), np.int32, salt=9), root=root)
    expect("gather", got, np.stack([data(p, (3,), np.int32, salt=9) for p in range(n)]) if r == root else None)
    src = np.arange(n * 3, dtype=np.float32).reshape(n, 3) + (1000 if r == 0 else 0)
    expect("scatter", comm.scatter(src, root=0), (np.arange(3, dtype=np.float32) + 3 * r + 1000).reshape(1, 3))

    # send/recv around the ring, in a group
    nxt, prv = (r + 1) % n, (r - 1) % n
    out = np.empty(6, dtype=np.int32)
    with ferroccl.group():
        comm.send(np.full(6, r, dtype=np.int32), nxt)
        comm.recv(out, prv)
    expect("send/recv ring in a group", out, np.full(6, prv, dtype=np.int32))

    run_carried(comm, expect)

    # split by parity
    sub = comm.split(r % 2)
    try:
        expect("split all_reduce", sub.all_reduce(np.array([r], dtype=np.int64)),
               np.array([sum(range(r % 2, n, 2))], dtype=np.int64))
        if sub.size != len(range(r % 2, n, 2)) or sub.rank != r // 2:
            fails.append(f"rank {r}/{n} split: rank {sub.rank} of {sub.size}")
    finally:
        sub.close()

    comm.barrier()
    if comm.async_error() is not None:
        fails.append(f"rank {r}/{n}: async error {comm.async_error()}")
    return fails
