#!/usr/bin/env python3
"""sidebyside.py: two runs of run.sh against the same peer (a change's before and after),
set side by side from their PEER.ratios.csv files:

  sidebyside.py BEFORE_DIR AFTER_DIR --peer ompi|gloo|ideal [--noise F] [--nranks N]

For every collective, size and placement in both, the ferroccl/peer busbw ratio before
and after and their quotient (after/before; below 1: the change made ferroccl lose
ground against the peer). The runs were not interleaved, so machine drift between them
lands in the quotient: read it beside an A/A run's spread (run.sh --peer base against a
copy of the same build). Prints markdown; standard library only.
"""

import argparse
import csv
import os
import statistics
import sys


def load(d, peer, nranks):
    path = os.path.join(d, f"n{nranks}", f"{peer}.ratios.csv")
    if not os.path.exists(path):
        sys.exit(f"sidebyside: {path} missing (run tools/compare/run.sh --peer {peer} --out {d})")
    with open(path) as f:
        return {(r["collective"], int(r["size_bytes"]), r["placement"]): float(r["busbw_ratio"])
                for r in csv.DictReader(f) if r["busbw_ratio"] not in ("", "nan")}


def band(size):
    return "sizes < 32K" if size < 32 << 10 else "sizes 32K .. < 8M" if size < 8 << 20 else "sizes >= 8M"


def fmt_size(b):
    for unit, name in ((1 << 20, "M"), (1 << 10, "K")):
        if b >= unit and b % unit == 0:
            return f"{b // unit}{name}"
    return str(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--peer", required=True, choices=["ompi", "gloo", "ideal"])
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--noise", type=float, default=0.05, help="quotients below 1 - F are listed (default 0.05)")
    o = ap.parse_args()
    b, a = load(o.before, o.peer, o.nranks), load(o.after, o.peer, o.nranks)
    keys = sorted(set(a) & set(b), key=lambda k: (k[0], k[2], k[1]))
    if not keys:
        sys.exit("sidebyside: the two runs share no point")
    print(f"# ferroccl/{o.peer} busbw ratio before and after ({o.nranks} ranks)\n")
    print("| collective | size | placement | before | after | after/before |")
    print("|---|---:|---|---:|---:|---:|")
    q = {}
    for k in keys:
        q[k] = a[k] / b[k] if b[k] > 0 else float("nan")
        print(f"| {k[0]} | {fmt_size(k[1])} | {k[2]} | {b[k]:.3g}x | {a[k]:.3g}x | {q[k]:.3g} |")
    print()
    for name in ("sizes < 32K", "sizes 32K .. < 8M", "sizes >= 8M"):
        v = [q[k] for k in keys if band(k[1]) == name]
        if v:
            print(f"- {name}: after/before median {statistics.median(v):.3g}, range {min(v):.3g} .. "
                  f"{max(v):.3g} over {len(v)} points")
    low = sorted((v, k) for k, v in q.items() if v < 1 - o.noise)
    print(f"- below {1 - o.noise:.2f}: {len(low)} of {len(keys)} points" +
          (": " + ", ".join(f"{k[0]} {fmt_size(k[1])} {k[2]} {v:.3g}" for v, k in low) if low else ""))


if __name__ == "__main__":
    main()
