#!/usr/bin/env python3
"""Checks ferroccl's collectives through ctypes against numpy references.

Process mode, one rank per process (the communicator comes from fcclCommInitFromEnv):
    ferroccl-run -n N python3 worker.py
Thread mode, one process, fcclCommInitAll(comms, N, NULL), one Python thread per rank:
    python3 worker.py --threads N
Thread mode with fcclGetUniqueId + fcclCommInitRank (the id passed by value):
    python3 worker.py --threads N --init uid

Every rank runs the same sequence of calls. Inputs are deterministic functions of
(case, rank, count), so each rank builds the inputs of all ranks and the expected
result with numpy. Floating-point inputs are chosen so that every sum is exact in
float32 whatever the order of accumulation; the checks are therefore exact.

Value mismatches are collected (the sequence goes on, so one run lists them all);
a call that returns an error stops the rank. Exit status 0 when all checks pass,
1 otherwise, with one line per failure naming collective, type, op, count, nranks,
mode and rank, expected and got.
"""

import argparse
import os
import sys
import threading
import time
import traceback
import zlib

os.environ.setdefault("FERROCCL_TIMEOUT_MS", "60000")  # a hang becomes an error, not a stall

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import ferroccl_ctypes as F  # noqa: E402
from ferroccl_ctypes import ptr, size_array  # noqa: E402

BIG = 1000003
SEED = 20240611


# ----------------------------------------------------------------------------------
# bfloat16 by hand (numpy has no bfloat16): uint16 bit patterns.

def f32_to_bf16(x):
    """float32 -> bfloat16 bit patterns, round to nearest, ties to even (no NaNs)."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    assert not np.isnan(np.asarray(x, dtype=np.float32)).any()
    bias = ((b >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    return ((b + bias) >> np.uint32(16)).astype(np.uint16)


def bf16_to_f32(h):
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _selftest_bf16():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1 + 2**-8 + 2**-20, 3.0, -0.0],
                 dtype=np.float32)
    want = np.array([0x3F80, 0x3F80, 0x3F82, 0xBF80, 0x3F81, 0x4040, 0x8000], dtype=np.uint16)
    got = f32_to_bf16(x)
    assert np.array_equal(got, want), f"bf16 helper broken: {got} != {want}"
    assert np.array_equal(bf16_to_f32(want[[0, 5]]), np.array([1.0, 3.0], dtype=np.float32))


# ----------------------------------------------------------------------------------
# Types and deterministic inputs.

# kind -> (numpy dtype of the buffer, fccl datatype, name)
KINDS = {
    "f32": (np.float32, F.fcclFloat32, "float32"),
    "f64": (np.float64, F.fcclFloat64, "float64"),
    "i32": (np.int32, F.fcclInt32, "int32"),
    "i32small": (np.int32, F.fcclInt32, "int32"),
    "u8": (np.uint8, F.fcclUint8, "uint8"),
    "i8": (np.int8, F.fcclInt8, "int8"),
    "i64": (np.int64, F.fcclInt64, "int64"),
    "u64": (np.uint64, F.fcclUint64, "uint64"),
    "f16": (np.float16, F.fcclFloat16, "float16"),
    "bf16": (np.uint16, F.fcclBfloat16, "bfloat16"),
}
OPNAMES = {F.fcclSum: "sum", F.fcclProd: "prod", F.fcclMax: "max", F.fcclMin: "min", F.fcclAvg: "avg"}


def rng_for(case, rank, count):
    return np.random.default_rng([SEED, zlib.crc32(case.encode()), rank, count])


def gen(kind, case, rank, count):
    """Input of `rank` for `case`: same on every rank that asks."""
    g = rng_for(case, rank, count)
    if kind == "f32":
        # multiples of 2^-8 below 2^12 in magnitude: sums of <= 4 are exact in float32
        return (g.integers(-4000, 4001, count) * 2.0**-8).astype(np.float32)
    if kind == "f64":
        return g.standard_normal(count) * 1e3
    if kind == "i32":
        return g.integers(-(2**30), 2**30, count, dtype=np.int32)
    if kind == "i32small":
        return g.integers(-3, 4, count, dtype=np.int32)
    if kind == "u8":
        return g.integers(0, 256, count, dtype=np.uint8)
    if kind == "i8":
        return g.integers(-128, 128, count, dtype=np.int8)
    if kind == "i64":
        return g.integers(-(10**12), 10**12, count, dtype=np.int64)
    if kind == "u64":
        return g.integers(0, 2**63, count, dtype=np.uint64)
    if kind == "f16":
        # multiples of 2^-4 below 2^7: float16-exact after the cast (which rounds some),
        # sums of <= 4 exact in float32 but needing up to 14 significant bits
        return (g.integers(-2047, 2048, count) * 2.0**-4).astype(np.float32).astype(np.float16)
    if kind == "bf16":
        # multiples of 2^-6 below 2^6 rounded (RNE) to 8 significant bits
        return f32_to_bf16((g.integers(-4095, 4096, count) * 2.0**-6).astype(np.float32))
    raise ValueError(kind)


def reference(kind, op, inputs):
    """Expected reduction of the list `inputs` (one array per rank) with `op`."""
    n = len(inputs)
    dt = KINDS[kind][0]
    count = inputs[0].size
    if count == 0:
        return np.empty(0, dtype=dt)
    s = np.stack(inputs)
    if kind in ("f16", "bf16"):
        # float32 accumulation, rounded once to the 16-bit type
        f = s.astype(np.float32) if kind == "f16" else bf16_to_f32(s)
        if op == F.fcclSum:
            acc = f.sum(axis=0, dtype=np.float32)
        elif op == F.fcclProd:
            acc = f.prod(axis=0, dtype=np.float32)
        elif op == F.fcclMax:
            acc = f.max(axis=0)
        elif op == F.fcclMin:
            acc = f.min(axis=0)
        else:
            acc = (f.sum(axis=0, dtype=np.float32) / np.float32(n)).astype(np.float32)
        return acc.astype(np.float16) if kind == "f16" else f32_to_bf16(acc)
    if op == F.fcclSum:
        return s.sum(axis=0, dtype=dt)  # integer types wrap around, as in C
    if op == F.fcclProd:
        return s.prod(axis=0, dtype=dt)
    if op == F.fcclMax:
        return s.max(axis=0)
    if op == F.fcclMin:
        return s.min(axis=0)
    if op == F.fcclAvg:
        tot = s.sum(axis=0, dtype=dt)
        if np.issubdtype(dt, np.integer):
            if np.issubdtype(dt, np.signedinteger):
                # C division truncates toward zero; numpy's // floors
                return (np.sign(tot) * (np.abs(tot) // dt(n))).astype(dt)
            return tot // dt(n)
        return (tot / dt(n)).astype(dt)
    raise ValueError(op)


def sentinel(kind, count):
    """A recv buffer filled with a recognisable pattern (bytes 0xA5)."""
    dt = KINDS[kind][0]
    b = np.full(count * np.dtype(dt).itemsize, 0xA5, dtype=np.uint8)
    return b.view(dt)


# ----------------------------------------------------------------------------------
# One rank's checks.

class Rank:
    def __init__(self, comm, rank, n, mode):
        self.comm, self.rank, self.n, self.mode = comm, rank, n, mode
        self.failures = []
        self.checks = 0
        self.doing = "setup"

    def call(self, name, result):
        """Raises FcclError, naming what this rank was doing, unless result is fcclSuccess."""
        if result != F.fcclSuccess:
            raise F.FcclError(f"{name} [{self.where(self.doing)}]", result, F.last_error(self.comm))

    def where(self, what):
        return f"{what} nranks={self.n} mode={self.mode} rank={self.rank}"

    def fail(self, what, msg):
        self.failures.append(f"FAIL {self.where(what)}: {msg}")

    def expect(self, what, got, want):
        self.checks += 1
        got = np.asarray(got)
        want = np.asarray(want)
        if got.shape != want.shape:
            self.fail(what, f"shape {got.shape} != expected {want.shape}")
            return
        if got.dtype != want.dtype:
            want = want.astype(got.dtype)
        # bitwise comparison: exact values, -0.0 vs 0.0 aside for floats
        if got.dtype.kind == "f":
            bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
        else:
            bad = got != want
        if bad.any():
            idx = np.flatnonzero(bad)
            i = idx[0]

            def show(a):
                v = a[i].item()
                if "bfloat16" in what:
                    return f"0x{v:04x} (= {float(bf16_to_f32(a[i:i + 1])[0])!r})"
                return repr(v)

            self.fail(what, f"{idx.size} of {got.size} elements differ; first at [{i}]: "
                            f"expected {show(want)} got {show(got)}")

    def expect_code(self, what, got, want):
        self.checks += 1
        if got != want:
            self.fail(what, f"returned {got} ({F.error_string(got)}), expected {want} "
                            f"({F.error_string(want)}); last error: {F.last_error(None)!r}")


def counts_for(big):
    return [0, 1, 7, big]


def check_all_reduce(R, big):
    L = F.load()
    cases = [("f32", F.fcclSum), ("f64", F.fcclMax), ("i32small", F.fcclProd), ("u8", F.fcclSum),
             ("i64", F.fcclAvg), ("f16", F.fcclSum), ("bf16", F.fcclSum), ("i32", F.fcclMin),
             ("f32", F.fcclAvg)]
    for kind, op in cases:
        dt, ft, tname = KINDS[kind]
        for count in counts_for(big):
            case = f"allreduce-{kind}-{op}"
            inputs = [gen(kind, case, r, count) for r in range(R.n)]
            want = reference(kind, op, inputs)
            what = R.doing = f"all_reduce {tname} {OPNAMES[op]} count={count}"
            send = inputs[R.rank].copy()
            recv = sentinel(kind, count)
            R.call("fcclAllReduce", L.fcclAllReduce(ptr(send), ptr(recv), count, ft, op, R.comm, None))
            R.expect(what, recv, want)
            R.expect(what + " (sendbuff unchanged)", send, inputs[R.rank])
    # in place
    for kind, op in [("f32", F.fcclSum), ("bf16", F.fcclSum), ("i64", F.fcclMax)]:
        dt, ft, tname = KINDS[kind]
        for count in counts_for(big):
            case = f"allreduce-inplace-{kind}-{op}"
            inputs = [gen(kind, case, r, count) for r in range(R.n)]
            buf = inputs[R.rank].copy()
            R.doing = f"all_reduce in-place {tname} {OPNAMES[op]} count={count}"
            R.call("fcclAllReduce", L.fcclAllReduce(ptr(buf), ptr(buf), count, ft, op, R.comm, None))
            R.expect(R.doing, buf,
                     reference(kind, op, inputs))
    # count 0 with NULL buffers is legal
    R.doing = "all_reduce float32 count=0 with NULL buffers"
    R.call("fcclAllReduce", L.fcclAllReduce(None, None, 0, F.fcclFloat32, F.fcclSum, R.comm, None))


def check_broadcast(R, big):
    L = F.load()
    for root in range(R.n):
        for kind, counts in [("f32", counts_for(big)), ("i8", [7]), ("bf16", [7])]:
            dt, ft, tname = KINDS[kind]
            for count in counts:
                data = gen(kind, f"bcast-{kind}-{root}", root, count)
                send = data.copy() if R.rank == root else sentinel(kind, count)
                recv = sentinel(kind, count)
                R.doing = f"broadcast {tname} root={root} count={count}"
                R.call("fcclBroadcast", L.fcclBroadcast(ptr(send), ptr(recv), count, ft, root, R.comm, None))
                R.expect(f"broadcast {tname} root={root} count={count}", recv, data)
        # in place
        count = 7
        data = gen("f64", f"bcast-inplace-{root}", root, count)
        buf = data.copy() if R.rank == root else sentinel("f64", count)
        R.doing = f"broadcast in-place float64 root={root} count={count}"
        R.call("fcclBroadcast", L.fcclBroadcast(ptr(buf), ptr(buf), count, F.fcclFloat64, root, R.comm, None))
        R.expect(f"broadcast in-place float64 root={root} count={count}", buf, data)


def check_reduce(R, big):
    L = F.load()
    for root in range(R.n):
        for kind, op, counts in [("f32", F.fcclSum, counts_for(big)), ("i32", F.fcclMax, [7]),
                                 ("f16", F.fcclSum, [1000]), ("u64", F.fcclMin, [7])]:
            dt, ft, tname = KINDS[kind]
            for count in counts:
                case = f"reduce-{kind}-{op}-{root}"
                inputs = [gen(kind, case, r, count) for r in range(R.n)]
                send = inputs[R.rank].copy()
                # recvbuff may be NULL on non-roots: do that on every other root
                recv = sentinel(kind, count) if (R.rank == root or root % 2 == 1) else None
                R.doing = f"reduce {tname} {OPNAMES[op]} root={root} count={count}"
                R.call("fcclReduce", L.fcclReduce(ptr(send), ptr(recv), count, ft, op, root, R.comm, None))
                if R.rank == root:
                    R.expect(f"reduce {tname} {OPNAMES[op]} root={root} count={count}", recv,
                             reference(kind, op, inputs))
        # in place on the root
        count = 7
        inputs = [gen("f32", f"reduce-inplace-{root}", r, count) for r in range(R.n)]
        buf = inputs[R.rank].copy()
        R.doing = f"reduce in-place float32 sum root={root} count={count}"
        R.call("fcclReduce", L.fcclReduce(ptr(buf), ptr(buf) if R.rank == root else None, count,
                                            F.fcclFloat32, F.fcclSum, root, R.comm, None))
        if R.rank == root:
            R.expect(f"reduce in-place float32 sum root={root} count={count}", buf,
                     reference("f32", F.fcclSum, inputs))


def check_all_gather(R, big):
    L = F.load()
    n = R.n
    for kind, counts in [("f32", counts_for(big)), ("u8", [7]), ("bf16", [7])]:
        dt, ft, tname = KINDS[kind]
        for count in counts:
            inputs = [gen(kind, f"allgather-{kind}", r, count) for r in range(n)]
            want = np.concatenate(inputs) if count else np.empty(0, dt)
            send = inputs[R.rank].copy()
            recv = sentinel(kind, n * count)
            R.doing = f"all_gather {tname} count={count}"
            R.call("fcclAllGather", L.fcclAllGather(ptr(send), ptr(recv), count, ft, R.comm, None))
            R.expect(f"all_gather {tname} count={count}", recv, want)
            # in place: sendbuff == recvbuff + rank*count
            buf = sentinel(kind, n * count)
            buf[R.rank * count:(R.rank + 1) * count] = inputs[R.rank]
            R.doing = f"all_gather in-place {tname} count={count}"
            R.call("fcclAllGather",
                    L.fcclAllGather(ptr(buf, R.rank * count), ptr(buf), count, ft, R.comm, None))
            R.expect(f"all_gather in-place {tname} count={count}", buf, want)


def check_reduce_scatter(R, big):
    L = F.load()
    n = R.n
    for kind, op, counts in [("f32", F.fcclSum, counts_for(big)), ("bf16", F.fcclSum, [7, 1000]),
                             ("i32", F.fcclMax, [7]), ("i64", F.fcclAvg, [7])]:
        dt, ft, tname = KINDS[kind]
        for count in counts:
            case = f"reducescatter-{kind}-{op}"
            inputs = [gen(kind, case, r, n * count) for r in range(n)]
            full = reference(kind, op, inputs)
            want = full[R.rank * count:(R.rank + 1) * count]
            send = inputs[R.rank].copy()
            recv = sentinel(kind, count)
            R.doing = f"reduce_scatter {tname} {OPNAMES[op]} count={count}"
            R.call("fcclReduceScatter",
                    L.fcclReduceScatter(ptr(send), ptr(recv), count, ft, op, R.comm, None))
            R.expect(f"reduce_scatter {tname} {OPNAMES[op]} count={count}", recv, want)
            # in place: recvbuff == sendbuff + rank*count
            buf = inputs[R.rank].copy()
            R.doing = f"reduce_scatter in-place {tname} {OPNAMES[op]} count={count}"
            R.call("fcclReduceScatter",
                    L.fcclReduceScatter(ptr(buf), ptr(buf, R.rank * count), count, ft, op, R.comm, None))
            R.expect(f"reduce_scatter in-place {tname} {OPNAMES[op]} count={count}",
                     buf[R.rank * count:(R.rank + 1) * count], want)


def tagged(src, dst, idx):
    """int64 values naming sender, receiver and position: (src<<40)|(dst<<32)|idx."""
    return (np.int64(src) << np.int64(40)) | (np.int64(dst) << np.int64(32)) | np.asarray(idx, np.int64)


def check_all_to_all(R, big):
    L = F.load()
    n, me = R.n, R.rank
    for count in counts_for(big):
        send = np.concatenate([tagged(me, p, np.arange(count)) for p in range(n)]) if count \
            else np.empty(0, np.int64)
        want = np.concatenate([tagged(p, me, np.arange(count)) for p in range(n)]) if count \
            else np.empty(0, np.int64)
        recv = sentinel("i64", n * count)
        R.doing = f"all_to_all int64 count={count}"
        R.call("fcclAlltoAll", L.fcclAlltoAll(ptr(send), ptr(recv), count, F.fcclInt64, R.comm, None))
        R.expect(f"all_to_all int64 count={count}", recv, want)
    for kind in ("f32", "f16"):
        dt, ft, tname = KINDS[kind]
        count = 7
        inputs = [gen(kind, f"alltoall-{kind}", r, n * count) for r in range(n)]
        want = np.concatenate([inputs[p][me * count:(me + 1) * count] for p in range(n)])
        recv = sentinel(kind, n * count)
        R.doing = f"all_to_all {tname} count={count}"
        R.call("fcclAlltoAll", L.fcclAlltoAll(ptr(inputs[me]), ptr(recv), count, ft, R.comm, None))
        R.expect(f"all_to_all {tname} count={count}", recv, want)


def check_gather_scatter(R, big):
    L = F.load()
    n, me = R.n, R.rank
    roots = sorted({0, n - 1})
    for root in roots:
        for count in counts_for(big):
            inputs = [gen("f32", f"gather-{root}", r, count) for r in range(n)]
            recv = sentinel("f32", n * count) if me == root else None  # NULL allowed off-root
            R.doing = f"gather float32 root={root} count={count}"
            R.call("fcclGather", L.fcclGather(ptr(inputs[me]), ptr(recv), count, F.fcclFloat32, root,
                                                R.comm, None))
            if me == root:
                R.expect(f"gather float32 root={root} count={count}", recv,
                         np.concatenate(inputs) if count else np.empty(0, np.float32))
        for count in counts_for(big):
            data = gen("f32", f"scatter-{root}", root, n * count)
            send = data.copy() if me == root else None  # NULL allowed off-root
            recv = sentinel("f32", count)
            R.doing = f"scatter float32 root={root} count={count}"
            R.call("fcclScatter", L.fcclScatter(ptr(send), ptr(recv), count, F.fcclFloat32, root,
                                                  R.comm, None))
            R.expect(f"scatter float32 root={root} count={count}", recv, data[me * count:(me + 1) * count])
        # another type
        count = 7
        inputs = [gen("u8", f"gather-u8-{root}", r, count) for r in range(n)]
        recv = sentinel("u8", n * count) if me == root else None
        R.doing = f"gather uint8 root={root} count={count}"
        R.call("fcclGather", L.fcclGather(ptr(inputs[me]), ptr(recv), count, F.fcclUint8, root, R.comm, None))
        if me == root:
            R.expect(f"gather uint8 root={root} count={count}", recv, np.concatenate(inputs))


def check_all_to_allv(R, big):
    L = F.load()
    n, me = R.n, R.rank
    for scale in (1, 20011):
        # uneven counts with zeros: what src sends to dst
        def cnt(src, dst):
            return ((3 * src + 5 * dst + 1) % 7) * scale

        sendcounts = [cnt(me, p) for p in range(n)]
        recvcounts = [cnt(p, me) for p in range(n)]
        # send blocks laid out in reverse peer order with a 1-element gap before each;
        # receive blocks in peer order with a 2-element gap before each
        sdispls, off = [0] * n, 0
        for p in reversed(range(n)):
            off += 1
            sdispls[p] = off
            off += sendcounts[p]
        stotal = off + 1
        rdispls, off = [0] * n, 0
        for p in range(n):
            off += 2
            rdispls[p] = off
            off += recvcounts[p]
        rtotal = off + 2
        send = np.full(stotal, -1, np.int64)
        for p in range(n):
            send[sdispls[p]:sdispls[p] + sendcounts[p]] = tagged(me, p, np.arange(sendcounts[p]))
        recv = sentinel("i64", rtotal)
        want = recv.copy()  # gaps must stay untouched
        R.doing = f"all_to_allv int64 sendcounts={sendcounts} recvcounts={recvcounts}"
        for p in range(n):
            want[rdispls[p]:rdispls[p] + recvcounts[p]] = tagged(p, me, np.arange(recvcounts[p]))
        R.call("fcclAlltoAllv",
                L.fcclAlltoAllv(ptr(send), size_array(sendcounts), size_array(sdispls), ptr(recv),
                                size_array(recvcounts), size_array(rdispls), F.fcclInt64, R.comm, None))
        R.expect(f"all_to_allv int64 sendcounts={sendcounts} recvcounts={recvcounts}", recv, want)


def check_send_recv(R, big):
    L = F.load()
    n, me = R.n, R.rank
    nxt, prv = (me + 1) % n, (me - 1) % n
    for count in counts_for(big):
        inputs = {r: gen("f32", "ring", r, count) for r in {me, prv}}
        recv = sentinel("f32", count)
        R.doing = f"send/recv ring float32 count={count} (send to {nxt}, recv from {prv}, in a group)"
        R.call("fcclGroupStart", L.fcclGroupStart())
        rs = L.fcclSend(ptr(inputs[me]), count, F.fcclFloat32, nxt, R.comm, None)
        rr = L.fcclRecv(ptr(recv), count, F.fcclFloat32, prv, R.comm, None)
        re = L.fcclGroupEnd()
        R.call("fcclSend", rs)
        R.call("fcclRecv", rr)
        R.call("fcclGroupEnd", re)
        R.expect(f"send/recv ring float32 count={count}", recv, inputs[prv])
    # both directions at once: only deadlock-free inside a group
    count = 1000
    from_prv, from_nxt = sentinel("bf16", count), sentinel("bf16", count)
    mine_fwd = gen("bf16", "ring-fwd", me, count)
    mine_bwd = gen("bf16", "ring-bwd", me, count)
    R.doing = f"send/recv bidirectional ring bfloat16 count={count} (in a group)"
    R.call("fcclGroupStart", L.fcclGroupStart())
    res = [L.fcclSend(ptr(mine_fwd), count, F.fcclBfloat16, nxt, R.comm, None),
           L.fcclSend(ptr(mine_bwd), count, F.fcclBfloat16, prv, R.comm, None),
           L.fcclRecv(ptr(from_prv), count, F.fcclBfloat16, prv, R.comm, None),
           L.fcclRecv(ptr(from_nxt), count, F.fcclBfloat16, nxt, R.comm, None)]
    re = L.fcclGroupEnd()
    for r in res:
        R.call("fcclSend/fcclRecv", r)
    R.call("fcclGroupEnd", re)
    R.expect(f"send/recv bidirectional ring bfloat16 count={count} (from prev)", from_prv,
             gen("bf16", "ring-fwd", prv, count))
    R.expect(f"send/recv bidirectional ring bfloat16 count={count} (from next)", from_nxt,
             gen("bf16", "ring-bwd", nxt, count))


def check_errors(R, big):
    L = F.load()
    a = np.zeros(4, np.float32)
    b = np.zeros(4, np.float32)
    rc = L.fcclAllReduce(ptr(a), ptr(b), 4, 99, F.fcclSum, R.comm, None)
    R.expect_code("all_reduce datatype=99", rc, F.fcclInvalidArgument)
    msg = F.last_error(R.comm)
    R.checks += 1
    if "fcclAllReduce" not in msg:
        R.fail("all_reduce datatype=99", f"fcclGetLastError does not name fcclAllReduce: {msg!r}")
    rc = L.fcclAllReduce(ptr(a), ptr(b), 4, F.fcclFloat32, 99, R.comm, None)
    R.expect_code("all_reduce op=99", rc, F.fcclInvalidArgument)
    rc = L.fcclAllReduce(ptr(a), ptr(b), 4, F.fcclFloat32, F.fcclSum, None, None)
    R.expect_code("all_reduce comm=NULL", rc, F.fcclInvalidArgument)
    msg = F.last_error(None)
    R.checks += 1
    if not msg:
        R.fail("all_reduce comm=NULL", "fcclGetLastError(NULL) is empty after a failed call")
    rc = L.fcclBroadcast(ptr(a), ptr(b), 4, F.fcclFloat32, R.n, R.comm, None)
    R.expect_code(f"broadcast root={R.n} (out of range)", rc, F.fcclInvalidArgument)
    rc = L.fcclAllReduce(None, ptr(b), 4, F.fcclFloat32, F.fcclSum, R.comm, None)
    R.expect_code("all_reduce sendbuff=NULL count=4", rc, F.fcclInvalidArgument)
    R.checks += 1
    s = F.error_string(F.fcclInvalidArgument)
    if not s:
        R.fail("fcclGetErrorString(4)", "empty")
    # the communicator still works after rejected calls
    x = np.full(3, R.rank + 1, np.int32)
    R.doing = "all_reduce int32 sum count=3 after rejected calls"
    R.call("fcclAllReduce", L.fcclAllReduce(ptr(x), ptr(x), 3, F.fcclInt32, F.fcclSum, R.comm, None))
    R.expect("all_reduce after rejected calls", x, np.full(3, R.n * (R.n + 1) // 2, np.int32))


CHECKS = [check_errors, check_all_reduce, check_broadcast, check_reduce, check_all_gather,
          check_reduce_scatter, check_all_to_all, check_gather_scatter, check_all_to_allv,
          check_send_recv]


def run_rank(R, big, verbose):
    n = F.comm_count(R.comm)
    r = F.comm_user_rank(R.comm)
    R.checks += 2
    if n != R.n:
        R.fail("fcclCommCount", f"expected {R.n} got {n}")
    if r != R.rank:
        R.fail("fcclCommUserRank", f"expected {R.rank} got {r}")
    dev = F.comm_cu_device(R.comm)
    R.checks += 1
    if dev != -1:
        R.fail("fcclCommCuDevice", f"expected -1 for a host rank, got {dev}")
    for fn in CHECKS:
        t0 = time.monotonic()
        fn(R, big)
        if verbose:
            print(f"rank {R.rank}: {fn.__name__} {time.monotonic() - t0:.2f}s", flush=True)
    R.call("fcclBarrier", F.load().fcclBarrier(R.comm, None))


def report(R, stopped=False, blocked=False):
    for f in R.failures:
        print(f, flush=True)
    status = "OK" if not R.failures else f"{len(R.failures)} FAILED"
    if stopped:
        status += f", then STOPPED by a failed call during: {R.doing}"
    elif blocked:
        status += f", still BLOCKED during: {R.doing}"
    print(f"rank {R.rank}/{R.n} ({R.mode}): {R.checks} checks, {status}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=0, help="thread mode with this many ranks")
    ap.add_argument("--init", choices=["all", "uid"], default="all",
                    help="thread mode: fcclCommInitAll (default) or fcclGetUniqueId + fcclCommInitRank")
    ap.add_argument("--big", type=int, default=BIG, help="the large count (default %(default)s)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print timings per collective")
    args = ap.parse_args()

    try:
        _selftest_bf16()
        F.load()
        ver = F.version()
    except Exception as e:  # noqa: BLE001
        print(f"FAIL setup: {e}", flush=True)
        return 1

    if args.threads <= 0:
        mode = "process"
        R = None
        try:
            comm = F.comm_init_from_env()
            rank = int(os.environ.get("FERROCCL_RANK", os.environ.get("RANK", "0")))
            n = int(os.environ.get("FERROCCL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
            R = Rank(comm, rank, n, mode)
            if rank == 0:
                print(f"ferroccl version {ver}, {n} ranks, process mode", flush=True)
            run_rank(R, args.big, args.verbose)
            R.doing = "fcclCommDestroy"
            R.call("fcclCommDestroy", F.load().fcclCommDestroy(comm))
        except Exception as e:  # noqa: BLE001
            print(f"FAIL rank {os.environ.get('FERROCCL_RANK', '?')} ({mode}): {e}\n"
                  f"{traceback.format_exc()}", flush=True)
            if R is not None:
                report(R, stopped=True)
            return 1
        report(R)
        return 0 if not R.failures else 1

    n = args.threads
    mode = f"threads/{args.init}"
    print(f"ferroccl version {ver}, {n} ranks, {mode} mode", flush=True)
    try:
        if args.init == "all":
            comms = F.comm_init_all(n)
        else:
            uid = F.get_unique_id()
            comms = [None] * n
            errs = []

            def init(r):
                try:
                    comms[r] = F.comm_init_rank(n, uid, r)
                except Exception as e:  # noqa: BLE001
                    errs.append(e)

            ts = [threading.Thread(target=init, args=(r,)) for r in range(n)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            if errs:
                raise errs[0]
    except Exception:  # noqa: BLE001
        print(f"FAIL init ({mode}): {traceback.format_exc()}", flush=True)
        return 1

    ranks = [Rank(comms[r], r, n, mode) for r in range(n)]
    crashed = []

    def body(R):
        try:
            run_rank(R, args.big, args.verbose)
            R.doing = "fcclCommDestroy"
            R.call("fcclCommDestroy", F.load().fcclCommDestroy(R.comm))
        except Exception as e:  # noqa: BLE001
            crashed.append(R.rank)
            print(f"FAIL rank {R.rank} ({mode}): {e}\n{traceback.format_exc()}", flush=True)

    threads = [threading.Thread(target=body, args=(R,), daemon=True) for R in ranks]
    for t in threads:
        t.start()
    deadline = None
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=0.2)
        if crashed and deadline is None:
            deadline = time.monotonic() + 5  # the others may be stuck waiting for it
        if deadline is not None and time.monotonic() > deadline:
            for R in ranks:
                report(R, stopped=R.rank in crashed, blocked=R.rank not in crashed)
            print(f"FAIL ({mode}): ranks {sorted(crashed)} failed and the others did not finish", flush=True)
            sys.stdout.flush()
            os._exit(1)
    for R in ranks:
        report(R, stopped=R.rank in crashed)
    return 0 if not crashed and not any(R.failures for R in ranks) else 1


if __name__ == "__main__":
    sys.exit(main())
