"""Per-call time of Comm.all_reduce from Python, in place on numpy arrays, over the
sizes ferroccl-bench uses: run under `ferroccl-run -n N python overhead.py` (or alone
for one rank) and compare with `ferroccl-bench all_reduce -b 8 -e 64K --nranks N`.
Rank 0 prints `bytes  us_per_call` lines: the median of R repeats of I calls each,
after a barrier, as the C benchmark times its loop."""

import argparse
import os
import statistics
import time

import numpy as np

import ferroccl


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", type=int, default=8)
    ap.add_argument("-e", type=int, default=65536)
    ap.add_argument("-i", "--iters", type=int, default=2000)
    ap.add_argument("-r", "--repeats", type=int, default=7)
    ap.add_argument("--kind", choices=["numpy", "torch"], default="numpy")
    args = ap.parse_args()
    comm = ferroccl.Comm.from_env() if "FERROCCL_RANK" in os.environ else ferroccl.Comm.init_all(1)[0]
    if args.kind == "torch":
        import torch
    size = args.b
    if comm.rank == 0:
        print(f"# {args.kind}, {comm.size} ranks: bytes  us_per_call (median of {args.repeats} x {args.iters})")
    while size <= args.e:
        n = max(size // 4, 1)
        x = np.ones(n, np.float32) if args.kind == "numpy" else torch.ones(n, dtype=torch.float32)
        ar = comm.all_reduce
        for _ in range(100):
            ar(x)
        times = []
        for _ in range(args.repeats):
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                ar(x)
            times.append((time.perf_counter() - t0) / args.iters * 1e6)
        if comm.rank == 0:
            print(f"{size:8d} {statistics.median(times):8.2f}", flush=True)
        size *= 2
    comm.close()


if __name__ == "__main__":
    main()
