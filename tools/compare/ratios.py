#!/usr/bin/env python3
"""ratios.py: ferroccl against a peer, from the CSVs that run.sh leaves in one directory.

  ratios.py DIR --peer ompi|gloo|ideal|base [--baseline DIR2] [--noise F]

DIR holds ferroccl.repK.csv and PEER.repK.csv (ferroccl-bench's CSV columns), K = 1..R,
each pair measured back to back. For every collective, size and placement that both
sides ran, the busbw ratio ferroccl/peer is taken within each repetition (it equals
peer time / ferroccl time, as both use the same bytes and factor) and the median over
the repetitions is reported, with the medians of each side's busbw; sizes <= 2 KiB also
get the time ratio ferroccl/peer. Then the verdicts against docs/performance.md's targets.
--baseline names a 2-rank run's directory, for the oversubscribed (nranks > 2) target
"large messages keep >= 50% of their 2-rank busbw"; where DIR also holds the ideal
peer's N-rank run (and DIR2 its 2-rank one), the same table shows what the bare data
movement keeps of ferroccl's 2-rank busbw, which bounds that target. The ideal peer
(the bare data movement, tools/compare/ideal) has no targets: for it a summary of the
ratios from 32 KiB up takes the verdicts' place. The base peer is another build of
ferroccl (run.sh --peer base --base PATH, a change's before): a summary of the ratios
per size band and the points this build lost, slower in every repetition and by more
than --noise (default 0.05) at the median, take the verdicts' place.

Writes DIR/PEER.md (what it prints) and DIR/PEER.ratios.csv. Standard library only.
"""

import argparse
import csv
import glob
import os
import re
import statistics
import sys

SMALL = 2 << 10  # sizes up to this get the time ratio
PEER_TITLE = {"ompi": "Open MPI", "gloo": "Gloo", "ideal": "the bare data movement (tools/compare/ideal)",
              "base": "the base build (another build of ferroccl)"}
# Heads the tables of runs made with --rotate 0.
NOT_ROTATED = ("Buffers not rotated (`--rotate 0`): every call of a size reuses the same buffers, which stay "
               "in the caches up to their size (a program that calls a collective again and again on one "
               "tensor). With the default rotation (nccl-tests' and docs/performance.md's), calls up to 16M find them "
               "out of the caches.")

# Size bands of the ideal summary, [lo, hi) in bytes. Below 32K a call's time is mostly
# its fixed cost, which the ideal (barriers, no messages) hardly has, so a ratio there
# says little about data movement. 8M splits what stays in the caches from what streams
# through memory on the machines we measure on.
IDEAL_BANDS = [(32 << 10, None, ">= 32K"), (32 << 10, 8 << 20, "32K .. < 8M"), (8 << 20, None, ">= 8M")]
# Size bands of the base summary: below 32K a call's fixed cost dominates, which a
# change to set-up or dispatch moves; above, the data movement does.
BASE_BANDS = [(0, 32 << 10, "< 32K"), (32 << 10, 8 << 20, "32K .. < 8M"), (8 << 20, None, ">= 8M")]
ORDER = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
         "all_to_all", "all_to_allv", "gather", "scatter", "send_recv"]


def fmt_size(b):
    for s, u in ((30, "G"), (20, "M"), (10, "K")):
        if b >= 1 << s and b % (1 << s) == 0:
            return f"{b >> s}{u}"
    return str(b)


def fmt_x(v):
    if v is None:
        return "—"
    if v >= 100:
        return f"{v:.0f}x"
    if v >= 1:
        return f"{v:.2f}x"
    return f"{v:.3f}x" if v >= 0.01 else f"{v:.2g}x"


def fmt_bw(v):
    if v is None:
        return "—"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def read_runs(d, name):
    """{rep: {(collective, size, placement): row}} of DIR/name.repK.csv."""
    runs = {}
    for p in glob.glob(os.path.join(d, f"{name}.rep*.csv")):
        m = re.search(r"\.rep(\d+)\.csv$", p)
        if not m:
            continue
        rows = {}
        with open(p, newline="") as f:
            for r in csv.DictReader(f):
                key = (r["collective"], int(r["size_bytes"]), r["placement"])
                rows[key] = {
                    "time_us": float(r["time_us"]),
                    "busbw": float(r["busbw_GBps"]),
                    "wrong": r["wrong"],
                    "nranks": int(r["nranks"]),
                }
        runs[int(m.group(1))] = rows
    return runs


def median(xs):
    return statistics.median(xs) if xs else None


def compare(fer, peer):
    """Points both sides ran: {(coll, size, placement): stats over the paired reps}."""
    out = {}
    reps = sorted(set(fer) & set(peer))
    keys = set()
    for k in reps:
        keys |= set(fer[k]) & set(peer[k])
    for key in keys:
        bw_r, t_r, fb, pb, ft, pt = [], [], [], [], [], []
        for k in reps:
            f, p = fer[k].get(key), peer[k].get(key)
            if f is None or p is None:
                continue
            if f["time_us"] > 0 and p["time_us"] > 0:
                bw_r.append(p["time_us"] / f["time_us"])
                t_r.append(f["time_us"] / p["time_us"])
            fb.append(f["busbw"])
            pb.append(p["busbw"])
            ft.append(f["time_us"])
            pt.append(p["time_us"])
        if not fb:
            continue
        out[key] = {
            "ratio": median(bw_r), "ratio_min": min(bw_r) if bw_r else None, "ratio_max": max(bw_r) if bw_r else None,
            "time_ratio": median(t_r), "fer_bw": median(fb), "peer_bw": median(pb),
            "fer_t": median(ft), "peer_t": median(pt), "reps": len(fb),
        }
    return out, reps


def wrong_rows(runs, name):
    bad = []
    for k, rows in sorted(runs.items()):
        for (c, s, pl), r in sorted(rows.items()):
            if r["wrong"] not in ("", "0"):
                bad.append(f"{name} rep {k}: {c} {fmt_size(s)} {pl}: {r['wrong']} wrong elements")
    return bad


def verdict_min(points, need, what, metric="ratio", higher=True):
    """One target over a set of points: met, or missed by how much where."""
    if not points:
        return f"- {what}: not measured (no such sizes or placements in this run)"
    vals = [(v[metric], key) for key, v in points.items() if v[metric] is not None]
    if higher:
        miss = [(x, k) for x, k in vals if x < need]
        worst = min(vals)
    else:
        miss = [(x, k) for x, k in vals if x > need]
        worst = max(vals)
    x, (c, s, pl) = worst
    where = f"{c} {fmt_size(s)} {pl}"
    if not miss:
        return f"- {what}: **met** at all {len(vals)} points (worst {fmt_x(x)}, {where})"
    by = f"{(need - x) / need * 100:.0f}% short of {need:g}x" if higher else f"{x / need:.3g} times the {need:g}x allowed"
    listed = ", ".join(f"{c} {fmt_size(s)} {pl} {fmt_x(v)}" for v, (c, s, pl) in sorted(miss, reverse=not higher)[:6])
    more = f" and {len(miss) - 6} more" if len(miss) > 6 else ""
    return (f"- {what}: **missed** at {len(miss)} of {len(vals)} points; worst {where} at {fmt_x(x)} "
            f"({by}): {listed}{more}")


def band_summary(points, what):
    """One line over a set of points: median and range of the ratios, the 3 lowest."""
    vals = sorted((v["ratio"], key) for key, v in points.items() if v["ratio"] is not None)
    if not vals:
        return f"- {what}: not measured (no such sizes in this run)"
    lowest = ", ".join(f"{c} {fmt_size(s)} {pl} {fmt_x(x)}" for x, (c, s, pl) in vals[:3])
    return (f"- {what}: median {fmt_x(median([x for x, _ in vals]))}, range {fmt_x(vals[0][0])} .. "
            f"{fmt_x(vals[-1][0])} over {len(vals)} points; lowest: {lowest}")


def lost_points(points, noise):
    """One line: the points slower in every repetition and by more than `noise` at the
    median (a point slower in some repetitions only is within the machine's noise)."""
    vals = [(v["ratio"], key) for key, v in points.items() if v["ratio"] is not None]
    lost = sorted((x, k) for x, k in vals
                  for v in [points[k]] if v["ratio_max"] is not None and v["ratio_max"] < 1 and x < 1 - noise)
    what = f"slower in every repetition and by more than {noise * 100:g}% at the median"
    if not vals:
        return f"- {what}: not measured (no points in this run)"
    if not lost:
        return f"- {what}: **none** of {len(vals)} points"
    listed = ", ".join(f"{c} {fmt_size(s)} {pl} {fmt_x(x)}" for x, (c, s, pl) in lost[:12])
    more = f" and {len(lost) - 12} more" if len(lost) > 12 else ""
    return f"- {what}: **{len(lost)}** of {len(vals)} points: {listed}{more}"


def medians(runs):
    """{(collective, size, placement): median busbw over the repetitions} of read_runs."""
    acc = {}
    for rows in runs.values():
        for k, r in rows.items():
            acc.setdefault(k, []).append(r["busbw"])
    return {k: median(v) for k, v in acc.items()}


def oversubscribed(a, nranks):
    """docs/performance.md's "large messages keep >= 50% of their 2-rank busbw" at nranks > 2, and
    what bounds it: the same ratio for the bare data movement (DIR/ideal.rep*.csv,
    when the ideal peer ran at nranks into the same --out), taken against ferroccl's
    2-rank busbw, which is what the target divides by. Where that is below 0.5 too, no
    schedule that moves the collective's bytes as the ideal does meets the target on
    this machine; a miss is ferroccl's own where it is not. Returns the table's lines
    and, for the verdict, {point: {"ratio": ferroccl N-rank / 2-rank busbw}} (large
    = 8M and up; sizes match only where both runs rounded them alike)."""
    fer = medians(read_runs(a.dir, "ferroccl"))
    ideal = medians(read_runs(a.dir, "ideal"))
    base, base_ideal = medians(read_runs(a.baseline, "ferroccl")), medians(read_runs(a.baseline, "ideal"))
    keys = sorted((k for k in fer if k[1] >= 8 << 20 and base.get(k)),
                  key=lambda k: (ORDER.index(k[0]) if k[0] in ORDER else 99, k[1], k[2] != "out"))
    lines = [f"## {nranks} ranks against 2 ranks (>= 8M; 2-rank run: {a.baseline})", "",
             "docs/performance.md asks that large messages keep >= 50% of their 2-rank busbw. ferroccl N/2: ferroccl's",
             f"{nranks}-rank busbw over its 2-rank busbw (the target); ideal N / ferroccl 2: the bare data movement's",
             f"{nranks}-rank busbw over ferroccl's 2-rank busbw (what moving the bytes alone reaches of the",
             "target); ideal N/2: the bare data movement over its own 2-rank busbw. Medians over each run's",
             "repetitions; the two runs are minutes apart, so the machine's state may differ between them.", ""]
    if not keys:
        return lines + ["(No size >= 8M in both runs.)", ""], {}
    lines += ["| collective | size | placement | ferroccl N/2 | ideal N / ferroccl 2 | ideal N/2 |",
              "|---|---:|---|---:|---:|---:|"]
    miss, bound, own, ratios = [], [], [], {}
    for k in keys:
        r = fer[k] / base[k]
        ratios[k] = {"ratio": r}
        ib = ideal[k] / base[k] if ideal.get(k) else None
        i2 = ideal[k] / base_ideal[k] if ideal.get(k) and base_ideal.get(k) else None
        lines.append(f"| {k[0]} | {fmt_size(k[1])} | {k[2]} | {r:.2f} | "
                     f"{'—' if ib is None else f'{ib:.2f}'} | {'—' if i2 is None else f'{i2:.2f}'} |")
        if r < 0.5:
            name = f"{k[0]} {fmt_size(k[1])} {k[2]} {r:.2f}"
            miss.append(name)
            if ib is not None and ib < 0.5:
                bound.append(f"{name} (ideal {ib:.2f})")
            else:
                own.append(name if ib is None else f"{name} (ideal {ib:.2f})")
    lines.append("")
    if not miss:
        lines.append(f"- ferroccl keeps >= 50% at all {len(keys)} points")
    else:
        lines.append(f"- ferroccl below 50% at {len(miss)} of {len(keys)} points")
        if not ideal:
            lines.append(f"- bound: not measured (run --peer ideal --nranks {nranks} into the same --out)")
        else:
            lines.append(f"- of those, the bare data movement is below 50% of ferroccl's 2-rank busbw too "
                         f"(bounded by this machine) at {len(bound)}: {', '.join(bound) or 'none'}")
            lines.append(f"- ferroccl's own (the bare data movement does reach 50%, or did not run) at "
                         f"{len(own)}: {', '.join(own) or 'none'}")
    return lines + [""], ratios


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--peer", required=True, choices=sorted(PEER_TITLE))
    ap.add_argument("--baseline", help="a 2-rank run's directory (for the nranks > 2 target)")
    ap.add_argument("--rotate", type=int, choices=[0, 1], default=1,
                    help="the runs' --rotate (run.sh passes it); 0 marks the verdicts as off docs/performance.md's regime")
    ap.add_argument("--noise", type=float, default=0.05,
                    help="with --peer base: a point is lost when slower in every repetition and by more than "
                         "this fraction at the median (default 0.05)")
    a = ap.parse_args(argv)
    fer, peer = read_runs(a.dir, "ferroccl"), read_runs(a.dir, a.peer)
    title = PEER_TITLE[a.peer]
    if not fer or not peer:
        print(f"ratios.py: no ferroccl.rep*.csv or {a.peer}.rep*.csv in {a.dir}", file=sys.stderr)
        return 2
    pts, reps = compare(fer, peer)
    nranks = next(iter(next(iter(fer.values())).values()))["nranks"] if any(fer.values()) else 0
    lines = [f"# ferroccl vs {title}: {nranks} ranks, {len(reps)} repetition(s), alternating",
             "",
             "busbw in GB/s (median over repetitions); ratio = ferroccl/peer busbw, the median of the ratios",
             "measured within each repetition (range in the CSV); time ratio = ferroccl/peer time per call",
             f"(sizes <= {fmt_size(SMALL)}). `—`: that side has no such placement.",
             ""]
    if a.rotate == 0:
        lines += [NOT_ROTATED, ""]
    colls = sorted({k[0] for k in pts}, key=lambda c: ORDER.index(c) if c in ORDER else 99)
    only_one = sorted({k[0] for r in fer.values() for k in r} ^ {k[0] for r in peer.values() for k in r})
    for c in colls:
        sizes = sorted({k[1] for k in pts if k[0] == c})
        lines += [f"## {c}", "",
                  "| size | ferroccl out | peer out | ratio out | ferroccl in | peer in | ratio in | time ratio out | time ratio in |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in sizes:
            cells = [fmt_size(s)]
            for pl in ("out", "in"):
                v = pts.get((c, s, pl))
                cells += [fmt_bw(v["fer_bw"]), fmt_bw(v["peer_bw"]), fmt_x(v["ratio"])] if v else ["—"] * 3
            for pl in ("out", "in"):
                v = pts.get((c, s, pl))
                cells.append(fmt_x(v["time_ratio"]) if v and s <= SMALL else "")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if only_one:
        lines += [f"Run by one side only (not compared): {', '.join(only_one)}", ""]

    sel = lambda f: {k: v for k, v in pts.items() if k[1] > 0 and f(*k)}
    if a.peer == "ideal":
        # The ideal is a measured ceiling, not a target: docs/performance.md judges nothing against
        # it (its verdicts, ferroccl's absolute ones included, are in ompi.md and gloo.md).
        lines += [f"## ferroccl against the bare data movement ({nranks} ranks)", "",
                  "ferroccl/ideal busbw ratios, every collective and placement: how close ferroccl comes to what",
                  "the memory allows, not a target.", ""]
        for lo, hi, what in IDEAL_BANDS:
            lines.append(band_summary(sel(lambda c, s, pl: s >= lo and (hi is None or s < hi)),
                                      f"sizes {what}"))
        if nranks > 2 and a.baseline:
            lines += [""] + oversubscribed(a, nranks)[0]
        return finish(a, lines, pts, nranks, fer, peer)

    if a.peer == "base":
        # A before/after comparison of two builds: no targets, only what changed.
        lines += [f"## This build against the base build ({nranks} ranks)", "",
                  "ratio = this build's busbw over the base build's (above 1: this build is faster), every",
                  "collective and placement.", ""]
        for lo, hi, what in BASE_BANDS:
            lines.append(band_summary(sel(lambda c, s, pl: s >= lo and (hi is None or s < hi)), f"sizes {what}"))
        lines.append(lost_points(sel(lambda c, s, pl: True), a.noise))
        return finish(a, lines, pts, nranks, fer, peer)

    # ---- verdicts against docs/performance.md
    lines += [f"## Verdicts against the targets ({title}, {nranks} ranks)", ""]
    if nranks != 2:
        lines += ["(docs/performance.md states the peer targets for 2 ranks; shown here for information.)", ""]
    if a.rotate == 0:
        lines += ["(docs/performance.md's targets are measured with rotated buffers; these runs reuse them (--rotate 0), "
                  "so the verdicts are for information.)", ""]
    # A size of 0 bytes is what a small size becomes when its per-rank count rounds
    # to 0 elements (8 B of all_to_all over 4 ranks of 4-byte floats): both sides
    # then time a call that moves nothing, and a ratio of such times judges nothing.
    empty = sorted({f"{c} {pl}" for c, s, pl in pts if s == 0})
    if empty:
        lines += [f"(Not judged: size 0, where the count per rank rounds to 0 elements: {', '.join(empty)}.)", ""]
    if a.peer == "ompi":
        lines.append(verdict_min(sel(lambda c, s, pl: s >= 32 << 10), 1.0,
                                 "every collective, every size >= 32K: busbw >= 1.0x Open MPI's"))
        lines.append(verdict_min(sel(lambda c, s, pl: c in ("all_reduce", "reduce_scatter") and s >= 8 << 20), 2.0,
                                 "all_reduce and reduce_scatter >= 8M: busbw >= 2x Open MPI's"))
        lines.append(verdict_min(sel(lambda c, s, pl: s <= SMALL), 2.0,
                                 "<= 2K: time per call <= 2x Open MPI's", metric="time_ratio", higher=False))
    else:
        lines.append(verdict_min(sel(lambda c, s, pl: s >= 8 << 10), 5.0, "every size >= 8K: busbw >= 5x Gloo's"))
    # Absolute targets on ferroccl's own figures (median over the repetitions).
    fer_med = {}
    for rows in fer.values():
        for k, r in rows.items():
            fer_med.setdefault(k, []).append(r)
    ar64 = [(pl, median([r["busbw"] for r in fer_med[("all_reduce", 64 << 20, pl)]]))
            for pl in ("out", "in") if ("all_reduce", 64 << 20, pl) in fer_med]
    if nranks == 2:
        if ar64:
            worst = min(ar64, key=lambda x: x[1])
            ok = worst[1] >= 5.0
            lines.append(f"- all_reduce 64M busbw >= 5 GB/s: **{'met' if ok else 'missed'}** "
                         f"({', '.join(f'{pl} {bw:.2f}' for pl, bw in ar64)} GB/s"
                         f"{'' if ok else f'; {(5.0 - worst[1]) / 5.0 * 100:.0f}% short'})")
        else:
            lines.append("- all_reduce 64M busbw >= 5 GB/s: not measured (all_reduce at 64M not in this run)")
    else:
        t8 = [(pl, median([r["time_us"] for r in fer_med[k]])) for pl in ("out", "in")
              for k in [("all_reduce", 8, pl)] if k in fer_med]
        if t8:
            worst = max(t8, key=lambda x: x[1])
            ok = worst[1] < 100
            lines.append(f"- {nranks} ranks: 8-byte all_reduce median < 100 us: **{'met' if ok else 'missed'}** "
                         f"({', '.join(f'{pl} {t:.1f} us' for pl, t in t8)})")
        else:
            lines.append(f"- {nranks} ranks: 8-byte all_reduce < 100 us: not measured (no 8-byte all_reduce)")
        if a.baseline and read_runs(a.baseline, "ferroccl"):
            table, big = oversubscribed(a, nranks)
            lines.append(verdict_min(big, 0.5, f"{nranks} ranks, >= 8M: busbw >= 50% of the 2-rank run's "
                                     f"({a.baseline})"))
            lines += [""] + table
        else:
            lines.append(f"- {nranks} ranks, large messages >= 50% of 2-rank busbw: not measured "
                         "(run the same command with --nranks 2 first)")
    return finish(a, lines, pts, nranks, fer, peer)


def finish(a, lines, pts, nranks, fer, peer):
    """Wrong results, then DIR/PEER.md and DIR/PEER.ratios.csv; 1 when anything was wrong."""
    bad = wrong_rows(fer, "ferroccl") + wrong_rows(peer, a.peer)
    if bad:
        lines += ["", "## WRONG RESULTS", ""] + [f"- {b}" for b in bad]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    with open(os.path.join(a.dir, f"{a.peer}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.dir, f"{a.peer}.ratios.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["collective", "nranks", "peer", "size_bytes", "placement", "ferroccl_busbw_GBps",
                    "peer_busbw_GBps", "busbw_ratio", "busbw_ratio_min", "busbw_ratio_max", "ferroccl_time_us",
                    "peer_time_us", "time_ratio", "reps"])
        for (c, s, pl), v in sorted(pts.items(), key=lambda kv: (ORDER.index(kv[0][0]) if kv[0][0] in ORDER else 99,
                                                                  kv[0][1], kv[0][2] != "out")):
            r = lambda x: "" if x is None else f"{x:.6g}"
            w.writerow([c, nranks, a.peer, s, pl, r(v["fer_bw"]), r(v["peer_bw"]), r(v["ratio"]), r(v["ratio_min"]),
                        r(v["ratio_max"]), r(v["fer_t"]), r(v["peer_t"]), r(v["time_ratio"]), v["reps"]])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
