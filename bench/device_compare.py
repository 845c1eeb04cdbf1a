#!/usr/bin/env python3
"""device_compare: ferroccl with ranks sharing one GPU, side by side with the device's
own copy and torch.distributed's Gloo on the same CUDA tensors, against issue 30's
targets. One run measures:

  1. copy      the device's own copy bandwidth: torch's y.copy_(x), and
               cuMemcpyDtoDAsync through ctypes (no torch needed)
  2. gloo      tools/compare/gloo_bench.py --device cuda: torch.distributed with backend
               gloo, ranks as processes on one GPU
  3. ferroccl  ferroccl-bench --mem cuda (every rank on device 0: the first visible GPU
               alone in CUDA_VISIBLE_DEVICES), JSON output
  4. pingpong  bench/memop_pingpong.c without MPS, and with MPS where this run can start
               it (root, nvidia-cuda-mps-control present, none running); under MPS also
               ferroccl-bench's small sizes, for the with-MPS targets

for all_reduce, all_gather, reduce_scatter, all_to_all, broadcast and reduce at 2 and 4
ranks, 8 B .. 128 MiB (factor 2; nccl-tests' busbw and time per call, as ferroccl-bench
and gloo_bench.py compute them). Then it prints one table of the targets, each marked
met, missed or not measured from the numbers measured (the targets are constants; the
verdicts are computed), the side-by-side tables, and writes them with every figure to
OUT/device-compare.md and OUT/device-compare.json, raw outputs beside them.

How a target is read from a sweep (out-of-place rows; in place where a side has only
that): busbw: the best at sizes of 64 MiB and more (nccl-tests' size column); time per
call, 8 B - 64 KiB: the slowest size in that range with at least one element per rank;
1 MiB all_reduce: its time at 1 MiB; host time: the most the calling thread spent in
one call at any size (ferroccl-bench's host_us, device memory only). The side-by-side
tables show what served each ferroccl size (path: ferroccl-bench's backend/algorithm),
and a note counts the sizes that staged or host calls served instead of the device path.

--device cpu runs the same on the CPU (torch's copy of CPU tensors, Gloo on CPU tensors,
ferroccl-bench on host memory, no ping-pong) so that CI can run it without a GPU: the
targets are a GPU's, and there its verdicts only show that the table is computed.

Usage: bench/device_compare.sh [options]   (finds a Python with torch; see --help)
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COLLS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"]
KIB, MIB = 1 << 10, 1 << 20

# Issue 30's targets (H100/H200, ranks sharing one GPU): (what, collectives, metric,
# {ranks: goal}, "ge" for at least / "le" for at most, unit).
BUSBW = "busbw, sizes >= 64 MiB"
SMALL = "time per call, 8 B - 64 KiB, without MPS"
SMALL_MPS = "time per call, 8 B - 64 KiB, with MPS"
ONE_MIB = "time per call at 1 MiB"
HOST = "host time per call (enqueue)"
TARGETS = [
    (BUSBW, ["all_reduce"], "busbw_big", {2: 580, 4: 435}, "ge", "GB/s"),
    (BUSBW, ["all_gather"], "busbw_big", {2: 385, 4: 350}, "ge", "GB/s"),
    (BUSBW, ["all_to_all", "reduce_scatter", "broadcast", "reduce"], "busbw_big", {2: 290, 4: 218}, "ge", "GB/s"),
    (SMALL, COLLS, "small_us", {2: 20, 4: 25}, "le", "us"),
    (SMALL_MPS, COLLS, "small_us", {2: 10, 4: 12}, "le", "us"),
    (ONE_MIB, ["all_reduce"], "us_1m", {2: 15, 4: 15}, "le", "us"),
    (HOST, COLLS, "host_us", {2: 5, 4: 5}, "le", "us"),
]


def parse_size(s):
    t = s.strip().upper().rstrip("B").rstrip("I")
    mul = {"K": KIB, "M": MIB, "G": 1 << 30}.get(t[-1:], 1)
    if mul > 1:
        t = t[:-1]
    try:
        return int(float(t) * mul)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a size (8, 64K, 1M, 128M)")


def fmt_size(b):
    for unit, name in ((1 << 30, "G"), (MIB, "M"), (KIB, "K")):
        if b >= unit and b % unit == 0:
            return f"{b // unit}{name}"
    return str(b)


# ---------------------------------------------------------------- reading sweeps


def rows_of(records):
    """Rows by (collective, size): the out-of-place row, else the in-place one."""
    by = {}
    for r in records:
        k = (r["collective"], int(r["size_bytes"]))
        if r["placement"] == "out" or k not in by:
            by[k] = r
    return by


def num(v):
    return None if v in (None, "") else float(v)


def metric(records, coll, name):
    """(value, why it is missing) of one metric of one collective in a sweep."""
    rs = sorted((r for (c, _), r in rows_of(records).items() if c == coll), key=lambda r: int(r["size_bytes"]))
    if not rs:
        return None, "not run"
    if name == "busbw_big":
        big = [num(r["busbw"]) for r in rs if int(r["size_bytes"]) >= 64 * MIB]
        if not big:
            return None, f"largest size {fmt_size(int(rs[-1]['size_bytes']))} < 64M"
        return max(big), None
    if name == "small_us":
        small = [num(r["time_us"]) for r in rs if 8 <= int(r["size_bytes"]) <= 64 * KIB and int(r["count"]) > 0]
        return (max(small), None) if small else (None, "no size in 8 B - 64 KiB")
    if name == "us_1m":
        one = [num(r["time_us"]) for r in rs if int(r["size_bytes"]) == MIB]
        return (one[0], None) if one else (None, "1 MiB not in the sweep")
    if name == "host_us":
        host = [num(r.get("host_us")) for r in rs]
        if any(h is None for h in host):
            return None, "host memory: a call returns when done"
        return max(host), None
    raise ValueError(name)


def verdict(value, goal, sense):
    return "met" if (value >= goal if sense == "ge" else value <= goal) else "missed"


def target_rows(runs, gloo, mps_runs, mps_note, ranks, no_mps_note=None):
    """One dict per (target, collective, ranks): goal, ferroccl's and Gloo's values,
    verdict. runs, gloo, mps_runs: {ranks: records}; mps_note: why mps_runs lacks a
    rank count; no_mps_note: why nothing ran without MPS (None when it did)."""
    out = []
    for what, colls, name, goals, sense, unit in TARGETS:
        for n in ranks:
            if n not in goals:
                continue
            for c in colls:
                recs = (mps_runs if what == SMALL_MPS else runs).get(n)
                if what == SMALL and no_mps_note:
                    value, why = None, no_mps_note
                elif recs is None:
                    value, why = None, (mps_note if what == SMALL_MPS else "ferroccl-bench did not run")
                else:
                    value, why = metric(recs, c, name)
                g = gloo.get(n)
                gv = metric(g, c, name)[0] if g is not None and what != SMALL_MPS and name != "host_us" else None
                out.append(dict(target=what, collective=c, ranks=n, goal=goals[n], sense=sense, unit=unit,
                                ferroccl=value, gloo=gv,
                                verdict=verdict(value, goals[n], sense) if value is not None else f"not measured ({why})"))
    return out


def fmt_v(v, unit):
    if v is None:
        return "-"
    return f"{v:.1f} {unit}" if v >= 10 else f"{v:.2f} {unit}"


def targets_md(rows, copy_big):
    lines = ["| target | collective | ranks | goal | ferroccl | gloo | verdict |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        goal = (">= " if r["sense"] == "ge" else "<= ") + f"{r['goal']} {r['unit']}"
        v = r["verdict"]
        lines.append(f"| {r['target']} | {r['collective']} | {r['ranks']} | {goal} | {fmt_v(r['ferroccl'], r['unit'])} | "
                     f"{fmt_v(r['gloo'], r['unit'])} | {'**missed**' if v == 'missed' else v} |")
    met = sum(r["verdict"] == "met" for r in rows)
    missed = sum(r["verdict"] == "missed" for r in rows)
    lines.append("")
    lines.append(f"{met} met, {missed} missed, {len(rows) - met - missed} not measured, of {len(rows)}.")
    if copy_big:
        what, size, bw = copy_big
        lines.append(f"{what}: {bw:.1f} GB/s at {fmt_size(size)} (bytes copied per second; "
                     f"each byte is read and written once, as a collective's at best).")
    return lines


def side_by_side_md(n, recs, grecs):
    lines = []
    fr, gr = rows_of(recs or []), rows_of(grecs or [])
    cell = lambda v, f: "-" if v is None else format(v, f)
    for c in COLLS:
        sizes = sorted({s for (cc, s) in list(fr) + list(gr) if cc == c})
        if not sizes:
            continue
        lines += [f"#### {c}, {n} ranks", "",
                  "| size | ferroccl us | host us | ferroccl busbw | gloo us | gloo busbw | busbw ferroccl/gloo | path |",
                  "|---|---|---|---|---|---|---|---|"]
        for s in sizes:
            f, g = fr.get((c, s), {}), gr.get((c, s), {})
            fb, gb = num(f.get("busbw")), num(g.get("busbw"))
            ratio = f"{fb / gb:.2f}x" if fb and gb else "-"
            lines.append(f"| {fmt_size(s)} | {cell(num(f.get('time_us')), '.2f')} | {cell(num(f.get('host_us')), '.2f')} | "
                         f"{cell(fb, '.3f')} | {cell(num(g.get('time_us')), '.2f')} | {cell(gb, '.3f')} | {ratio} | "
                         f"{f.get('path') or '-'} |")
        lines.append("")
    return lines


# ---------------------------------------------------------------- running the parts


def log(msg):
    print(f"device_compare: {msg}", file=sys.stderr, flush=True)


def run(cmd, out_path, env=None, timeout=3600):
    """Runs cmd with its output in out_path; returns (exit code, output)."""
    log("$ " + " ".join(cmd))
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=timeout)
        out, rc = p.stdout.decode("utf-8", "replace"), p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode("utf-8", "replace") + f"\ntimed out after {timeout} s\n", 124
    except OSError as e:
        out, rc = f"{e}\n", 127
    with open(out_path, "w") as f:
        f.write(out)
    return rc, out


def torch_python(explicit):
    """A Python that imports torch with Gloo: (path, torch version, has CUDA) or None."""
    cands = [explicit, os.environ.get("FERROCCL_TORCH_PYTHON"),
             os.path.expanduser("~/.cache/ferroccl/torch-venv/bin/python"),
             os.path.join(ROOT, "tools", "compare", ".venv", "bin", "python"), sys.executable, shutil.which("python3")]
    probe = ("import torch, torch.distributed as d; assert d.is_gloo_available(); "
             "print(torch.__version__, int(torch.cuda.is_available()))")
    for py in cands:
        if not py or not os.path.exists(py):
            continue
        try:
            p = subprocess.run([py, "-c", probe], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if p.returncode == 0:
            ver, cuda = p.stdout.decode().split()
            return py, ver, cuda == "1"
    return None


def copy_worker(method, device, sizes, budget):
    """Prints one JSON line per size: the time of one copy of `size` bytes and GB/s."""
    if method == "torch":
        import torch
        dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        for size in sizes:
            x = torch.ones(size, dtype=torch.uint8, device=dev)
            y = torch.empty_like(x)

            def one():
                y.copy_(x)

            t = time_loop(one, sync, budget)
            assert bool((y == 1).all()), "the copy is wrong"
            print(json.dumps(dict(method="torch y.copy_(x)", size=size, time_us=t * 1e6, GBps=size / t / 1e9)), flush=True)
            del x, y
        return 0
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    u64, vp = ctypes.c_uint64, ctypes.c_void_p

    def ok(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} returned CUresult {rc}")

    ok(cu.cuInit(0), "cuInit")
    d, ctx = ctypes.c_int(), vp()
    ok(cu.cuDeviceGet(ctypes.byref(d), 0), "cuDeviceGet")
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d), "cuDevicePrimaryCtxRetain")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    cu.cuMemcpyDtoDAsync_v2.argtypes = [u64, u64, ctypes.c_size_t, vp]
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), ctypes.c_size_t]
    cu.cuMemFree_v2.argtypes = [u64]
    for size in sizes:
        x, y = u64(), u64()
        ok(cu.cuMemAlloc_v2(ctypes.byref(x), size), "cuMemAlloc")
        ok(cu.cuMemAlloc_v2(ctypes.byref(y), size), "cuMemAlloc")

        def one():
            ok(cu.cuMemcpyDtoDAsync_v2(y.value, x.value, size, None), "cuMemcpyDtoDAsync")

        t = time_loop(one, lambda: ok(cu.cuCtxSynchronize(), "cuCtxSynchronize"), budget)
        print(json.dumps(dict(method="cuMemcpyDtoDAsync", size=size, time_us=t * 1e6, GBps=size / t / 1e9)), flush=True)
        ok(cu.cuMemFree_v2(x), "cuMemFree")
        ok(cu.cuMemFree_v2(y), "cuMemFree")
    return 0


def time_loop(one, sync, budget):
    """Seconds per call of one(): warmed up, then as many calls as fit the budget."""
    for _ in range(3):
        one()
    sync()
    t = time.perf_counter()
    one()
    sync()
    est = max(time.perf_counter() - t, 1e-7)
    iters = int(min(max(budget / est, 5), 10000))
    t0 = time.perf_counter()
    for _ in range(iters):
        one()
    sync()
    return (time.perf_counter() - t0) / iters


def json_lines(text):
    out = []
    for l in text.splitlines():
        if l.startswith("{"):
            try:
                out.append(json.loads(l))
            except ValueError:
                pass
    return out


def path_of(r):
    """"backend/algorithm" of a ferroccl-bench record; None where the sweep has no such
    fields (Gloo's CSV, older ferroccl-bench)."""
    b, a = r.get("backend"), r.get("algorithm")
    return f"{b}/{a}" if b else None


def read_csv(path):
    import csv
    if not os.path.exists(path):
        return None
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["busbw"] = r.pop("busbw_GBps")
        r["path"] = path_of(r)
    return rows


def read_bench_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        j = json.load(f)
    for r in j["results"]:
        r["busbw"] = r["busbw_GBps"]
        r["path"] = path_of(r)
    return j["results"]


def off_device(records):
    """Sizes (collective, bytes, placement) that staged or host calls served: not the
    device path, so their figures do not judge it. Calls of 0 elements move nothing."""
    return [(r["collective"], int(r["size_bytes"]), r["placement"]) for r in records or []
            if r.get("backend") in ("staged", "host") and int(r["count"]) > 0]


def one_gpu_env(env=None):
    """The environment with only the first visible GPU, so that every ferroccl-bench rank
    is on device 0 as Gloo's are (ferroccl-bench spreads ranks over the visible GPUs)."""
    env = dict(os.environ if env is None else env)
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if vis is None:
        env["CUDA_VISIBLE_DEVICES"] = "0"
    elif vis.strip():
        env["CUDA_VISIBLE_DEVICES"] = vis.split(",")[0].strip()
    return env


def mps_state():
    """(this run may start MPS, why not / what is there)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                exe = os.path.basename(f.read().split(b"\0")[0])
        except OSError:
            continue
        if exe in (b"nvidia-cuda-mps-control", b"nvidia-cuda-mps-server"):
            return False, "MPS was already running"
    if not shutil.which("nvidia-cuda-mps-control"):
        return False, "nvidia-cuda-mps-control is not installed"
    if os.geteuid() != 0:
        return False, "starting MPS needs root"
    return True, ""


def main(argv):
    ap = argparse.ArgumentParser(prog="device_compare.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cuda (default): device memory, ranks sharing GPU 0; cpu: everything on the CPU (CI)")
    ap.add_argument("--nranks", default="2,4", help="rank counts, comma-separated (default 2,4)")
    ap.add_argument("-b", "--minbytes", type=parse_size, default=8)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=128 * MIB)
    ap.add_argument("--max-time", type=float, default=0.25,
                    help="time budget per size and placement of each benchmark, seconds (default 0.25)")
    ap.add_argument("--parts", default="copy,gloo,ferroccl,pingpong",
                    help="which parts to run (default all: copy,gloo,ferroccl,pingpong)")
    ap.add_argument("--colls", default=",".join(COLLS), help=f"collectives (default {','.join(COLLS)})")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "device-compare"), help="output folder")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release"), help="folder of ferroccl-bench")
    ap.add_argument("--python", help="a Python with torch (default: the first that imports it of "
                    "$FERROCCL_TORCH_PYTHON, ~/.cache/ferroccl/torch-venv, tools/compare/.venv, this one)")
    ap.add_argument("--selftest", action="store_true", help="check the table math on made-up sweeps and exit")
    ap.add_argument("--copy-worker", nargs=2, metavar=("METHOD", "DEVICE"), help=argparse.SUPPRESS)
    o = ap.parse_args(argv)
    if o.selftest:
        return selftest()
    sizes = []
    s = max(o.minbytes, 1)
    while s <= o.maxbytes:
        sizes.append(s)
        s *= 2
    if o.copy_worker:
        return copy_worker(o.copy_worker[0], o.copy_worker[1],
                           sorted({x for x in sizes if x in (8, 4 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB)} | {sizes[-1]}),
                           o.max_time)
    try:
        ranks = [int(x) for x in o.nranks.split(",")]
        assert ranks and all(n >= 1 for n in ranks)
    except (ValueError, AssertionError):
        ap.error(f"--nranks {o.nranks!r}: give rank counts like 2,4")
    parts = set(o.parts.split(","))
    if parts - {"copy", "gloo", "ferroccl", "pingpong"}:
        ap.error(f"--parts {o.parts!r}: copy, gloo, ferroccl, pingpong")
    colls = o.colls.split(",")
    if set(colls) - set(COLLS):
        ap.error(f"--colls: of {','.join(COLLS)}")
    os.makedirs(o.out, exist_ok=True)
    cuda = o.device == "cuda"
    sim = bool(os.environ.get("FERROCCL_SIMGPU"))
    notes = []
    tp = torch_python(o.python)
    if tp is None:
        notes.append("torch is not importable by any Python found (see --python): the torch copy and Gloo "
                     "parts did not run")
    elif cuda and not tp[2]:
        notes.append(f"torch {tp[1]} at {tp[0]} sees no CUDA device: the torch copy and Gloo parts did not run")
    torch_ok = tp is not None and (tp[2] or not cuda)
    span = ["-b", str(o.minbytes), "-e", str(o.maxbytes), "-f", "2", "--max-time", str(o.max_time)]

    # 1. the device's own copy
    copies = []
    if "copy" in parts:
        if torch_ok:
            rc, out = run([tp[0], __file__, "--copy-worker", "torch", o.device, *span[:4], "--max-time", "0.05"],
                          os.path.join(o.out, "copy-torch.txt"))
            copies += json_lines(out)
            if rc:
                notes.append(f"the torch copy failed (exit {rc}; see copy-torch.txt)")
        if cuda:
            rc, out = run([sys.executable, __file__, "--copy-worker", "driver", "cuda", *span[:4], "--max-time", "0.05"],
                          os.path.join(o.out, "copy-driver.txt"))
            copies += json_lines(out)
            if rc:
                notes.append(f"cuMemcpyDtoDAsync through ctypes failed (exit {rc}; see copy-driver.txt)")

    # 2. Gloo on the same kind of tensors
    gloo = {}
    if "gloo" in parts and torch_ok:
        for n in ranks:
            csv_path = os.path.join(o.out, f"gloo-np{n}.csv")
            if os.path.exists(csv_path):
                os.remove(csv_path)
            rc, _ = run([tp[0], os.path.join(ROOT, "tools", "compare", "gloo_bench.py"), "--device", o.device, "--nranks", str(n),
                         *span, "--csv", csv_path, *colls], os.path.join(o.out, f"gloo-np{n}.txt"))
            gloo[n] = read_csv(csv_path)
            if rc or gloo[n] is None:
                notes.append(f"gloo_bench.py at {n} ranks: exit {rc} (see gloo-np{n}.txt)")

    # 3. ferroccl-bench
    bench = os.path.join(o.bin, "ferroccl-bench")
    runs = {}
    mem = "cuda" if cuda else "host"

    def ferroccl(n, extra_span, name):
        path = os.path.join(o.out, f"{name}-np{n}.json")
        if os.path.exists(path):
            os.remove(path)
        rc, _ = run([bench, "--nranks", str(n), "--mem", mem, *extra_span, "-c", "1", "-J", path, *colls],
                    os.path.join(o.out, f"{name}-np{n}.txt"), env=one_gpu_env() if cuda else None)
        if rc:
            notes.append(f"ferroccl-bench at {n} ranks ({name}): exit {rc} (see {name}-np{n}.txt)")
        recs = read_bench_json(path)
        off = off_device(recs) if cuda else []
        if off:
            notes.append(f"ferroccl-bench at {n} ranks ({name}): {len(off)} of {len(recs)} sizes and placements were "
                         f"not served by the device path (the path column says which; rerun with FERROCCL_DEBUG=WARN "
                         f"to see why)")
        return recs

    if "ferroccl" in parts:
        if not os.path.exists(bench):
            notes.append(f"{bench} is missing (cargo build --release, or --bin)")
        else:
            for n in ranks:
                runs[n] = ferroccl(n, span, "ferroccl")

    # 4. the ping-pong, and MPS
    pingpong, mps_runs = {}, {}
    can_mps, mps_why = mps_state() if cuda else (False, "a CPU run")
    if "pingpong" in parts and cuda:
        exe = os.path.join(o.out, "memop_pingpong")
        rc, _ = run([os.environ.get("CC", "cc"), "-O2", os.path.join(HERE, "memop_pingpong.c"), "-o", exe, "-ldl"],
                    os.path.join(o.out, "pingpong-build.txt"))
        if rc == 0:
            _, out = run([exe, "--rounds", "2000"], os.path.join(o.out, "pingpong.txt"))
            pingpong["without MPS" if mps_why != "MPS was already running" else "with MPS (it was running)"] = out
            if can_mps:
                started = subprocess.run(["nvidia-cuda-mps-control", "-d"]).returncode == 0
                try:
                    if started:
                        _, out = run([exe, "--rounds", "2000"], os.path.join(o.out, "pingpong-mps.txt"))
                        pingpong["with MPS"] = out
                        if os.path.exists(bench):
                            small = ["-b", str(o.minbytes), "-e", str(64 * KIB), "-f", "2", "--max-time", str(o.max_time)]
                            for n in ranks:
                                mps_runs[n] = ferroccl(n, small, "ferroccl-mps")
                    else:
                        mps_why = "nvidia-cuda-mps-control -d failed"
                finally:
                    if started:
                        subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n")
        else:
            notes.append("bench/memop_pingpong.c did not build (see pingpong-build.txt)")
    no_mps_note = None
    if mps_why == "MPS was already running":
        # Everything above ran under MPS: its small sizes answer the with-MPS targets.
        mps_runs, no_mps_note = dict(runs), "MPS was running: every figure is with MPS"
    mps_note = mps_why or "MPS did not run"

    # ---------------------------------------------------------------- the record
    big_copy = max((c for c in copies if c["method"].startswith("torch")), key=lambda c: c["size"], default=None) or \
        max(copies, key=lambda c: c["size"], default=None)
    rows = target_rows(runs, gloo, mps_runs, mps_note, ranks, no_mps_note)
    title = "ferroccl, ranks sharing one GPU, against issue 30's targets"
    if not cuda:
        title = "CPU run (host memory, CPU tensors): the targets are a GPU's; these verdicts only show the table works"
    elif sim:
        title += " (SIMULATED GPU: the figures mean nothing)"
    md = [f"## {title}", ""]
    copy_what = "The device's own copy" if cuda else "A copy of CPU tensors"
    md += targets_md(rows, (copy_what, big_copy["size"], big_copy["GBps"]) if big_copy else None)
    md += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    if copies:
        md += ["### The device's own copy" if cuda else "### Copy of CPU tensors", "",
               "| method | size | time (us) | GB/s |", "|---|---|---|---|"]
        md += [f"| {c['method']} | {fmt_size(c['size'])} | {c['time_us']:.2f} | {c['GBps']:.2f} |" for c in copies]
        md.append("")
    if pingpong:
        md += ["### Stream memory operations: a round trip between two processes on device 0", "",
               "| case | " + " | ".join(pingpong) + " |", "|---|" + "---|" * len(pingpong)]
        cases = {}
        for k, txt in pingpong.items():
            for l in txt.splitlines():
                if " us per round trip" in l:
                    cases.setdefault(l.split(":")[0], {})[k] = l.split(":", 1)[1].strip()
        for case, by in cases.items():
            md.append(f"| {case} | " + " | ".join(by.get(k, "-") for k in pingpong) + " |")
        if not cases:
            md.append("| (no result: " + "; ".join(t.strip().splitlines()[-1] if t.strip() else "" for t in pingpong.values()) + ") |")
        md.append("")
    if runs or gloo:
        md += ["### Side by side (out of place; Gloo in place where it has only that)", ""]
        for n in ranks:
            md += side_by_side_md(n, runs.get(n), gloo.get(n))
    text = "\n".join(md) + "\n"
    with open(os.path.join(o.out, "device-compare.md"), "w") as f:
        f.write(text)
    with open(os.path.join(o.out, "device-compare.json"), "w") as f:
        json.dump(dict(device=o.device, simulated=sim, ranks=ranks, notes=notes, copies=copies, targets=rows,
                       torch=(tp[1] if tp else None), ferroccl=runs, ferroccl_mps=mps_runs, gloo=gloo,
                       pingpong=pingpong), f, indent=1)
    print(text, end="")
    return 0


def selftest():
    """The table math on made-up sweeps: prints 'selftest: N passed, N failed'."""
    def rec(c, size, count, t, bw, host=None, placement="out", backend=None, algorithm=None):
        r = dict(collective=c, size_bytes=size, count=count, placement=placement, time_us=t, busbw=bw, host_us=host)
        if backend:
            r.update(backend=backend, algorithm=algorithm)
        r["path"] = path_of(r)
        return r

    f2 = [rec("all_reduce", 8, 2, 12.0, 0.001, 2.0), rec("all_reduce", 64 * KIB, 16384, 19.0, 3.0, 4.0),
          rec("all_reduce", MIB, 262144, 16.0, 60.0, 3.0), rec("all_reduce", 64 * MIB, 1 << 24, 200.0, 600.0, 3.5),
          rec("all_reduce", 128 * MIB, 1 << 25, 500.0, 540.0, 3.5),
          rec("all_gather", 0, 0, 90.0, 0.0, 1.0), rec("all_gather", 8, 1, 21.0, 0.0, 6.0),
          rec("all_gather", 32 * MIB, 1, 100.0, 390.0, 1.0)]
    f4 = [rec("all_reduce", 8, 2, 30.0, 0.001), rec("all_reduce", 64 * MIB, 1 << 24, 300.0, 400.0)]
    g2 = [rec("all_reduce", 8, 2, 700.0, 0.0, placement="in"), rec("all_reduce", 64 * MIB, 1 << 24, 9e4, 1.9, placement="in")]
    rows = target_rows({2: f2, 4: f4}, {2: g2}, {}, "starting MPS needs root", [2, 4])
    get = {(r["target"], r["collective"], r["ranks"]): r for r in rows}
    checks = [
        # the best busbw at >= 64 MiB (600 at 64M beats 540 at 128M)
        (get[(BUSBW, "all_reduce", 2)]["ferroccl"], 600.0), (get[(BUSBW, "all_reduce", 2)]["verdict"], "met"),
        (get[(BUSBW, "all_reduce", 2)]["gloo"], 1.9),
        (get[(BUSBW, "all_reduce", 4)]["verdict"], "missed"),
        (get[(BUSBW, "all_gather", 2)]["verdict"], "not measured (largest size 32M < 64M)"),
        (get[(BUSBW, "reduce", 2)]["verdict"], "not measured (not run)"),
        # the slowest of 8 B - 64 KiB (19 us): met at <= 20; size 0 (90 us) is not judged
        (get[(SMALL, "all_reduce", 2)]["ferroccl"], 19.0), (get[(SMALL, "all_reduce", 2)]["verdict"], "met"),
        (get[(SMALL, "all_gather", 2)]["ferroccl"], 21.0), (get[(SMALL, "all_gather", 2)]["verdict"], "missed"),
        (get[(SMALL, "all_reduce", 4)]["verdict"], "missed"),
        (get[(SMALL, "all_reduce", 2)]["gloo"], 700.0),
        (get[(SMALL_MPS, "all_reduce", 2)]["verdict"], "not measured (starting MPS needs root)"),
        (get[(ONE_MIB, "all_reduce", 2)]["ferroccl"], 16.0), (get[(ONE_MIB, "all_reduce", 2)]["verdict"], "missed"),
        (get[(ONE_MIB, "all_reduce", 4)]["verdict"], "not measured (1 MiB not in the sweep)"),
        (get[(HOST, "all_reduce", 2)]["ferroccl"], 4.0), (get[(HOST, "all_reduce", 2)]["verdict"], "met"),
        (get[(HOST, "all_gather", 2)]["verdict"], "missed"),
        (get[(HOST, "all_reduce", 4)]["verdict"], "not measured (host memory: a call returns when done)"),
        (len(rows), sum(len(c) * len(g) for _, c, _, g, _, _ in TARGETS)),
    ]
    md = "\n".join(targets_md(rows, ("The device's own copy", 128 * MIB, 1448.0)))
    checks += [("| busbw, sizes >= 64 MiB | all_reduce | 4 | >= 435 GB/s | 400.0 GB/s | - | **missed** |" in md, True),
               ("The device's own copy: 1448.0 GB/s at 128M" in md, True)]
    # The path column: ferroccl's backend/algorithm, "-" where a sweep has none; sizes
    # that staged or host calls served are named (0 elements excepted).
    p2 = [rec("all_reduce", 8, 2, 12.0, 0.001, backend="ipc", algorithm="exec-reduce-copy"),
          rec("all_reduce", 64 * KIB, 16384, 90.0, 1.0, backend="staged", algorithm="board"),
          rec("all_gather", 0, 0, 5.0, 0.0, backend="host", algorithm="board")]
    sbs = "\n".join(side_by_side_md(2, p2, g2))
    checks += [("| 8 | 12.00 | - | 0.001 | 700.00 | 0.000 | - | ipc/exec-reduce-copy |" in sbs, True),
               ("| 64M | - | - | - | 90000.00 | 1.900 | - | - |" in sbs, True),
               (off_device(p2), [("all_reduce", 64 * KIB, "out")])]
    # ferroccl's ranks go on Gloo's GPU: the first visible one.
    checks += [(one_gpu_env({})["CUDA_VISIBLE_DEVICES"], "0"),
               (one_gpu_env({"CUDA_VISIBLE_DEVICES": "3, 1"})["CUDA_VISIBLE_DEVICES"], "3"),
               (one_gpu_env({"CUDA_VISIBLE_DEVICES": ""})["CUDA_VISIBLE_DEVICES"], "")]
    bad = [(i, got, want) for i, (got, want) in enumerate(checks) if got != want]
    for i, got, want in bad:
        print(f"selftest: check {i}: got {got!r}, want {want!r}")
    print(f"selftest: {len(checks) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
