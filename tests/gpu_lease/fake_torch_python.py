#!/usr/bin/env python3
"""A stand-in for a Python with torch (CUDA and Gloo), for tests/gpu_lease/run.sh: it
answers the three ways bench/gpu_lease.py uses such a Python, with made-up figures:

  -c CODE                                  the probe: "TORCH <version> 1 1"
  .../gpu_lease.py --copy-worker torch S T one JSON line per size, as the real worker
  .../gloo_bench.py [args] COLL...         gloo_bench.py's rank-0 table (13 columns), a
                                           row every 0.1 s; reduce_scatter is "not run"
                                           as Gloo says it of a collective on CUDA tensors
"""
import json
import os
import sys
import time

a = sys.argv[1:]
if a[:1] == ["-c"]:
    print("TORCH 0.0+fake 1 1", flush=True)
    sys.exit(0)
if len(a) >= 4 and a[1] == "--copy-worker":
    for s in a[3].split(","):
        s = int(s)
        print(json.dumps(dict(method="torch y.copy_(x)", size=s, time_us=s / 1e5, GBps=100.0)), flush=True)
    sys.exit(0)
if a and os.path.basename(a[0]) == "gloo_bench.py":
    def val(flag, default):
        return a[a.index(flag) + 1] if flag in a else default

    def size(s):
        mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
        return int(s[:-1] if mul > 1 else s) * mul

    n, b, e, f = int(val("--nranks", "2")), size(val("-b", "8")), size(val("-e", "8")), int(val("-f", "2"))
    colls = [x for x in a[1:] if not x.startswith("-") and x.replace("_", "").isalpha()]
    print(f"# gloo_bench: torch 0.0+fake, backend gloo, TCP over 127.0.0.1, CUDA tensors on a fake GPU", flush=True)
    for c in colls:
        print(f"#\n# Collective: {c}", flush=True)
        if c == "reduce_scatter":
            print(f"# {c}: not run: Gloo cannot run it on CUDA tensors in this torch (fake)", flush=True)
            continue
        s = b
        while s <= e:
            time.sleep(0.1)
            out = "      N/A     N/A     N/A    N/A" if c in ("all_reduce", "reduce") else f"  {s / 1e3:7.1f}  {1.0:6.2f}  {0.5 * n:6.2f}    N/A"
            print(f"{s:>12}  {s // 4:>12}     float     sum      -1{out}  {s / 1e3:7.1f}  {1.0:6.2f}  {0.25 * n:6.2f}    N/A",
                  flush=True)
            s *= f
    print("# Out of bounds values : 0 OK\n#", flush=True)
    sys.exit(0)
print(f"fake_torch_python: unexpected arguments {a}", file=sys.stderr)
sys.exit(2)
