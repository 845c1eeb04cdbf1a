"""One rank under torchrun (test_torch.py): Comm.from_env through torchrun's store, every
collective of the "ferroccl" torch.distributed backend against the values it must give,
async work and its errors, and DDP training of a small model side by side with gloo
(same seeds, same data): the losses must match step by step.

Prints `rank r/N: OK` and `ddp max loss difference X` on success; exit status 1 and
`FAIL ...` lines otherwise."""

import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import ferroccl
import ferroccl.torch  # noqa: F401 - registers the backend

FAILS = []


def expect(what, got, want):
    if not torch.equal(got, want):
        FAILS.append(f"{what}: got {got.tolist()}, expected {want.tolist()}")


def from_env_check():
    # torchrun's TCPStore already listens on MASTER_PORT: from_env must not open a second listener there.
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        FAILS.append("not under torchrun's agent store: from_env's torch path is not exercised")
    with ferroccl.Comm.from_env() as comm:
        x = np.full(4, comm.rank + 1, np.float32)
        comm.all_reduce(x)
        n = comm.size
        if not np.array_equal(x, np.full(4, n * (n + 1) / 2, np.float32)):
            FAILS.append(f"Comm.from_env all_reduce: {x}")


def collectives(r, n):
    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t)
    expect("all_reduce", t, torch.full((3,), n * (n + 1) / 2))
    t = torch.full((2,), r + 1, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    expect("all_reduce max", t, torch.full((2,), n, dtype=torch.int64))
    t = torch.full((4,), float(r), dtype=torch.bfloat16)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    expect("all_reduce avg bf16", t, torch.full((4,), (n - 1) / 2, dtype=torch.bfloat16))

    t = torch.full((5,), float(r))
    dist.broadcast(t, src=n - 1)
    expect("broadcast", t, torch.full((5,), float(n - 1)))

    t = torch.full((2,), float(r + 1))
    dist.reduce(t, dst=0)
    if r == 0:
        expect("reduce", t, torch.full((2,), n * (n + 1) / 2))

    outs = [torch.empty(2) for _ in range(n)]
    dist.all_gather(outs, torch.full((2,), float(r)))
    for p in range(n):
        expect(f"all_gather[{p}]", outs[p], torch.full((2,), float(p)))
    out = torch.empty(n * 3)
    dist.all_gather_into_tensor(out, torch.arange(3.0) + 10 * r)
    expect("all_gather_into_tensor", out, torch.cat([torch.arange(3.0) + 10 * p for p in range(n)]))

    out = torch.empty(2)
    dist.reduce_scatter(out, [torch.full((2,), float(p + r)) for p in range(n)])
    expect("reduce_scatter", out, torch.full((2,), float(n * r + n * (n - 1) / 2)))
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, torch.arange(2.0 * n))
    expect("reduce_scatter_tensor", out, (torch.arange(2.0 * n) * n)[2 * r:2 * r + 2])

    outs = [torch.empty(2, dtype=torch.int32) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((2,), 10 * r + p, dtype=torch.int32) for p in range(n)])
    for p in range(n):
        expect(f"all_to_all[{p}]", outs[p], torch.full((2,), 10 * p + r, dtype=torch.int32))
    out = torch.empty(n)
    dist.all_to_all_single(out, torch.arange(float(n)) + 10 * r)
    expect("all_to_all_single", out, torch.tensor([10.0 * p + r for p in range(n)]))
    # uneven: rank r sends p+1 rows of width 2 to rank p, receives r+1 rows from each
    send = torch.cat([torch.full((p + 1, 2), float(10 * r + p)) for p in range(n)])
    out = torch.empty(n * (r + 1), 2)
    dist.all_to_all_single(out, send, output_split_sizes=[r + 1] * n, input_split_sizes=[p + 1 for p in range(n)])
    expect("all_to_all_single splits", out, torch.cat([torch.full((r + 1, 2), float(10 * p + r)) for p in range(n)]))

    gl = [torch.empty(3) for _ in range(n)] if r == 0 else None
    dist.gather(torch.full((3,), float(r)), gather_list=gl, dst=0)
    if r == 0:
        for p in range(n):
            expect(f"gather[{p}]", gl[p], torch.full((3,), float(p)))
    out = torch.empty(2)
    dist.scatter(out, scatter_list=[torch.full((2,), float(p * 7)) for p in range(n)] if r == 0 else None, src=0)
    expect("scatter", out, torch.full((2,), float(r * 7)))

    # point to point: evens send first, odds receive first
    peer = r ^ 1
    if peer < n:
        got = torch.empty(4)
        if r % 2 == 0:
            dist.send(torch.full((4,), float(r)), peer)
            dist.recv(got, peer)
        else:
            dist.recv(got, peer)
            dist.send(torch.full((4,), float(r)), peer)
        expect("send/recv", got, torch.full((4,), float(peer)))
    # async: several in flight, waited in any order
    ts = [torch.full((1000,), float(r + k)) for k in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for k in reversed(range(4)):
        works[k].wait()
        expect(f"async all_reduce {k}", ts[k], torch.full((1000,), float(n * k + n * (n - 1) / 2)))
    dist.barrier()

    # a subgroup of the even ranks
    evens = list(range(0, n, 2))
    sub = dist.new_group(evens, backend="ferroccl")
    if r in evens:
        t = torch.ones(2)
        dist.all_reduce(t, group=sub)
        expect("new_group all_reduce", t, torch.full((2,), float(len(evens))))


def batch_p2p(r, n):
    """dist.batch_isend_irecv: a ring shift and an exchange with both neighbours, each rank
    posting its receives first (a blocking send would deadlock here)."""
    nxt, prv = (r + 1) % n, (r - 1) % n
    got = torch.empty(5)
    ops = [dist.P2POp(dist.irecv, got, prv), dist.P2POp(dist.isend, torch.arange(5.0) + 100 * r, nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    expect("batch_isend_irecv ring", got, torch.arange(5.0) + 100 * prv)
    from_prv, from_nxt = torch.empty(3, dtype=torch.int64), torch.empty(3, dtype=torch.int64)
    ops = [dist.P2POp(dist.irecv, from_nxt, nxt), dist.P2POp(dist.irecv, from_prv, prv),
           dist.P2POp(dist.isend, torch.full((3,), 10 * r + 1, dtype=torch.int64), nxt),
           dist.P2POp(dist.isend, torch.full((3,), 10 * r + 2, dtype=torch.int64), prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    if n == 2:  # next and previous are one rank: its two sends arrive in the order posted
        expect("batch_isend_irecv both ways, first", from_nxt, torch.full((3,), 10 * nxt + 1, dtype=torch.int64))
        expect("batch_isend_irecv both ways, second", from_prv, torch.full((3,), 10 * prv + 2, dtype=torch.int64))
    else:
        expect("batch_isend_irecv from next", from_nxt, torch.full((3,), 10 * nxt + 2, dtype=torch.int64))
        expect("batch_isend_irecv from previous", from_prv, torch.full((3,), 10 * prv + 1, dtype=torch.int64))
    t = torch.full((2,), float(r))
    dist.all_reduce(t)  # the group is closed: plain calls run again
    expect("all_reduce after batch_isend_irecv", t, torch.full((2,), n * (n - 1) / 2))
    # A refused op inside a coalesced batch raises, and the group it opened is closed
    # again. Driven through the process group itself: after an exception inside
    # batch_isend_irecv, torch 2.15 leaves the group in its Python coalescing state and
    # records later dist.* calls of that group there instead of running them.
    pg = dist.distributed_c10d._get_default_group()
    pg._start_coalescing(torch.device("cpu"))
    try:
        pg.send([torch.zeros(2, dtype=torch.complex64)], nxt, 0)
        FAILS.append("a coalesced send of a complex64 tensor (no ferroccl type) did not fail")
    except RuntimeError as e:
        if "dtype" not in str(e):
            FAILS.append(f"a coalesced send of a complex64 tensor: {e}")
    t = torch.full((2,), float(r))
    dist.all_reduce(t)
    expect("all_reduce after a failed coalesced send", t, torch.full((2,), n * (n - 1) / 2))


def ddp_check(r, n, steps=20):
    """The same model, data and seeds under DDP over ferroccl and over gloo."""
    gloo = dist.new_group(backend="gloo")
    losses = {}
    for name, pg in (("ferroccl", None), ("gloo", gloo)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg, bucket_cap_mb=0.0005)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        gen = torch.Generator().manual_seed(100 + r)  # each rank its own data
        x = torch.randn(64, 8, generator=gen)
        y = x.sum(1, keepdim=True).sin()
        curve = []
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            avg = loss.detach().clone()
            dist.all_reduce(avg, op=dist.ReduceOp.SUM, group=gloo)  # one reference for the comparison
            curve.append(avg.item() / n)
        losses[name] = curve
    diffs = [abs(a - b) for a, b in zip(losses["ferroccl"], losses["gloo"])]
    worst = max(diffs)
    print(f"rank {r}: ddp max loss difference {worst:.3g} over {steps} steps "
          f"(first {losses['ferroccl'][0]:.6f}, last {losses['ferroccl'][-1]:.6f})", flush=True)
    if worst > 1e-6 * max(1.0, max(losses["gloo"])):
        FAILS.append(f"DDP losses differ from gloo's: ferroccl {losses['ferroccl']}, gloo {losses['gloo']}")
    if not losses["ferroccl"][-1] < losses["ferroccl"][0]:
        FAILS.append(f"DDP did not train: {losses['ferroccl']}")


_LOGICAL = {"SUM": any, "MAX": any, "BOR": any, "PRODUCT": all, "MIN": all, "BAND": all,
            "BXOR": lambda bits: sum(bits) % 2 == 1}
_INTEGER = {"SUM": lambda a, b: a + b, "PRODUCT": lambda a, b: a * b, "MAX": max, "MIN": min,
            "BAND": lambda a, b: a & b, "BOR": lambda a, b: a | b, "BXOR": lambda a, b: a ^ b}


def dtypes_check(r, n):
    """bitwise ops, bool and int16 tensors: each result against the value torch's
    semantics give (bool: or for SUM/MAX/BOR, and for PRODUCT/MIN/BAND; int16 wraps)
    and, where gloo takes the call, against gloo's."""
    gloo = dist.new_group(backend="gloo")

    def ints(p, dtype):
        return torch.tensor([1 << p, 0x7ff ^ (1 << p), -1 - p, 181 * (p + 1), 30000 - p], dtype=dtype)

    def bools(p):
        return torch.tensor([p == 0, True, False, p % 2 == 1, p != n - 1])

    for opname in _LOGICAL:
        op = getattr(dist.ReduceOp, opname)
        want_b = torch.tensor([_LOGICAL[opname]([bool(bools(p)[i]) for p in range(n)]) for i in range(5)])
        for dtype in (torch.int16, torch.int32, torch.int64):
            vals = [ints(p, torch.int64).tolist() for p in range(n)]
            acc = vals[0]
            for v in vals[1:]:
                acc = [_INTEGER[opname](a, b) for a, b in zip(acc, v)]
            want = torch.tensor(acc, dtype=torch.int64).to(dtype)  # wraps as the type's arithmetic does
            t = ints(r, dtype)
            dist.all_reduce(t, op=op)
            expect(f"all_reduce {opname} {dtype}", t, want)
            out = torch.empty(1, dtype=dtype)
            dist.reduce_scatter_tensor(out, torch.cat([ints(r, dtype)[:1]] * n), op=op)
            expect(f"reduce_scatter_tensor {opname} {dtype}", out, want[:1])
        t = bools(r)
        dist.all_reduce(t, op=op)
        # as bytes: a bool holding 2 (a sum) equals True, but is no bool
        expect(f"all_reduce {opname} bool", t.view(torch.uint8), want_b.view(torch.uint8))
        g = bools(r)
        try:
            dist.all_reduce(g, op=op, group=gloo)
        except Exception as e:  # noqa: BLE001 - gloo lacks some (op, dtype) pairs: nothing to compare
            print(f"rank {r}: gloo refuses {opname} on bool ({str(e).splitlines()[0][:80]})", flush=True)
        else:
            expect(f"gloo all_reduce {opname} bool (the semantics followed)", g, want_b)
    for dtype in (torch.int16, torch.bool):
        try:
            dist.all_reduce(torch.ones(2, dtype=dtype), op=dist.ReduceOp.AVG)
            FAILS.append(f"AVG of {dtype} did not fail")
        except ferroccl.FcclError as e:
            if "avg" not in str(e):
                FAILS.append(f"AVG of {dtype}: the message does not say why: {e}")
    try:
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BXOR)
        FAILS.append("BXOR of float32 did not fail")
    except ferroccl.FcclError as e:
        if "fcclBxor" not in str(e) or "fcclFloat32" not in str(e):
            FAILS.append(f"BXOR of float32: the message does not name the op and type: {e}")
    # moved, not reduced: their bytes
    outs = [torch.empty(3, dtype=torch.int16) for _ in range(n)]
    dist.all_gather(outs, torch.tensor([r, -r, 300 * r], dtype=torch.int16))
    for p in range(n):
        expect(f"all_gather int16[{p}]", outs[p], torch.tensor([p, -p, 300 * p], dtype=torch.int16))
    t = bools(r)
    dist.broadcast(t, src=n - 1)
    expect("broadcast bool", t, bools(n - 1))


def errors_check(r, n):
    # the library's message comes out of wait() on a bad root (every rank calls: nothing is sent)
    pg = dist.distributed_c10d._get_default_group()
    try:
        dist.broadcast(torch.ones(2), src=0, group=pg, async_op=False)  # a good one first
        opts = dist.BroadcastOptions()
        opts.rootRank = n + 3
        pg.broadcast([torch.ones(2)], opts).wait()
        FAILS.append("broadcast to a bad root did not fail")
    except Exception as e:  # noqa: BLE001 - torch wraps it; the message must be the library's
        if "fcclBroadcast" not in str(e) or "root" not in str(e):
            FAILS.append(f"broadcast error lacks the library's message: {e}")


def main():
    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    from_env_check()
    dist.init_process_group("ferroccl")
    try:
        if dist.get_backend() != "ferroccl":
            FAILS.append(f"backend is {dist.get_backend()}")
        want = os.environ.get("FERROCCL_TORCH_EXPECT", "native")
        served = ferroccl.torch.served_by()
        print(f"rank {r}: served by the {served} backend", flush=True)
        if served != want:
            why = ferroccl.torch.native_module()[1]
            FAILS.append(f"served by the {served} backend, expected {want}" + (f" (native: {why})" if why else ""))
        if served == "native":
            batch_p2p(r, n)
        if os.environ.get("FERROCCL_TORCH_ONLY_P2P") != "1":
            collectives(r, n)
            dtypes_check(r, n)
            errors_check(r, n)
            if os.environ.get("FERROCCL_TORCH_DDP", "1") == "1":
                ddp_check(r, n)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    for f in FAILS:
        print(f"FAIL rank {r}/{n}: {f}", flush=True)
    print(f"rank {r}/{n}: {'OK' if not FAILS else f'{len(FAILS)} failed'}", flush=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
