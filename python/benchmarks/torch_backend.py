"""Per-call time of small all_reduces through torch.distributed, side by side in one run:
gloo, the "ferroccl" backend served natively (the c10d backend in ferroccl/csrc), the
same backend served by its Python fallback, ferroccl.Comm called directly (the Python
fallback group's communicator), and fcclAllReduce itself through ctypes with its
arguments prepared (the C call plus ctypes' own cost, about 1 us) on the native group's
communicator. Run under torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node=2 python/benchmarks/torch_backend.py

or alone for one rank (a HashStore; no peer to wait for, so the figures are the path's
own cost: torch's Python and C++ layers, the backend, and the C call).

Each repeat times I calls of each way in turn (the order rotating from repeat to
repeat, so a burst of load on the shared machine does not land on one way only), after
a barrier; rank 0 prints the min, lower quartile, median and max of the R repeats in us
per call. On a shared machine the min is the cost of the path; the rest is how often a
rank waited for its peer to be scheduled."""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import ferroccl._lib
import ferroccl.torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", "--numel", type=int, default=16, help="float32 elements per all_reduce")
    ap.add_argument("-i", "--iters", type=int, default=200)
    ap.add_argument("-r", "--repeats", type=int, default=41)
    ap.add_argument("-w", "--warmup", type=int, default=50)
    args = ap.parse_args()

    os.environ["FERROCCL_TORCH_BACKEND"] = "native"  # a failed build is an error here, not a fallback
    if "RANK" in os.environ:
        dist.init_process_group("ferroccl")
    else:
        dist.init_process_group("ferroccl", store=dist.HashStore(), rank=0, world_size=1)
    native = dist.distributed_c10d._get_default_group()
    gloo = dist.new_group(backend="gloo")
    os.environ["FERROCCL_TORCH_BACKEND"] = "python"
    python = dist.new_group(backend="ferroccl")
    assert ferroccl.torch.served_by(native) == "native" and ferroccl.torch.served_by(python) == "python"
    comm = python.comm
    c_all_reduce = ferroccl._lib.lib().fcclAllReduce
    rank, size = dist.get_rank(), dist.get_world_size()

    x = torch.ones(args.numel, dtype=torch.float32)
    ways = {
        "gloo": lambda: dist.all_reduce(x, group=gloo),
        "ferroccl native": lambda: dist.all_reduce(x, group=native),
        "ferroccl python": lambda: dist.all_reduce(x, group=python),
        "ferroccl.Comm": lambda: comm.all_reduce(x),
    }
    c_args = (x.data_ptr(), x.data_ptr(), x.numel(), 7, 0, native._get_backend(torch.device("cpu")).handle, None)
    ways["fcclAllReduce"] = lambda: c_all_reduce(*c_args)  # 7: fcclFloat32, 0: fcclSum
    names = list(ways)
    times = {k: [] for k in names}
    for k in names:
        for _ in range(args.warmup):
            ways[k]()
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for k in order:
            f = ways[k]
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            for _ in range(args.iters):
                f()
            times[k].append((time.perf_counter() - t0) / args.iters * 1e6)
    if rank == 0:
        print(f"# torch {torch.__version__}, {size} ranks, {args.numel} float32, all_reduce SUM in place: "
              f"us per call over {args.iters} calls, {args.repeats} repeats", flush=True)
        print(f"{'way':18s} {'min':>8s} {'q1':>8s} {'median':>8s} {'max':>8s}")
        for k in names:
            v = sorted(times[k])
            q1 = statistics.quantiles(v, n=4)[0]
            print(f"{k:18s} {v[0]:8.1f} {q1:8.1f} {statistics.median(v):8.1f} {v[-1]:8.1f}", flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
