#!/usr/bin/env python3
"""gpu_lease: the first call of a short GPU lease (scripts/gpu-lease.sh runs it).

Measures, most important first, each part in a time box cut from what is left of the
budget, and appends every result line to OUT/lease.md the moment it is measured
(write, flush, fsync), so that a call cut short at any point still returns what it
measured:

  1. the device attribute profile (tools/simgpu/capture-profile.py --compare
     tools/simgpu/profile/stock-hopper.json), its lines as they come;
  2. the path of each collective: FERROCCL_DEBUG=INFO ferroccl-bench, 2 ranks on
     device 0, 1 MiB, one call: the library's "backend ... algorithm ..." line of rank
     0, every Warn line and the "stream memory operations on the control words work"
     line;
  3. side by side at 2 and 4 ranks (processes sharing device 0), 64 MiB and 256 MiB
     (--quick: 1 MiB and 4 MiB): the device's own copy (cuMemcpyDtoDAsync through
     ctypes, torch's y.copy_(x)), ferroccl-bench --mem cuda, torch.distributed's Gloo
     on the same CUDA tensors (tools/compare/gloo_bench.py); busbw, the ratio, the
     fraction of the roofline computed from the copy rate, the backend and algorithm;
  4. time per call and 5. host time per call (enqueue) at 8 B, 64 KiB and 1 MiB, then
     at 8 B and 2 ranks with the other FERROCCL_CHECK (its price side by side);
  6. bench/memop_pingpong.c without MPS, then, if the budget allows and this run may
     start MPS (root, nvidia-cuda-mps-control present, none running), with MPS: the
     ping-pong and (4) at 2 ranks; MPS is stopped again only if this run started it.
At the end: issue 30's targets (bench/device_compare.py's TARGETS, metric, verdict),
met or missed where measured, "not measured (why)" elsewhere.

ferroccl runs with --check (default FERROCCL_CHECK from the environment, else 0: every
rank posts its device calls' descriptors, no host exchange between the ranks per call,
the mode the roofline's budget is for; 1, the library's default, agrees on each call
first with one host exchange). The first lines say which.

Raw outputs of every part go to OUT/raw/ as they arrive, and OUT/lease.jsonl holds one
JSON record per figure. Every child runs in its own session and is killed with all of
its descendants when its box ends, and on any exit of this program (normal, an
exception, SIGTERM, SIGINT, SIGHUP); the wrapper's trap kills what remains if this
program itself is killed (the sessions are listed in $FERROCCL_LEASE_RUNDIR/children).

Usage: python3 bench/gpu_lease.py [--budget SECONDS] [--quick] [--out DIR] [--bin DIR]
(normally through scripts/gpu-lease.sh). Python standard library only.
"""

import argparse
import contextlib
import ctypes
import json
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COLLS = ["all_reduce", "all_gather", "all_to_all", "reduce_scatter", "broadcast", "reduce"]
FCCL = {"all_reduce": "fcclAllReduce", "all_gather": "fcclAllGather", "all_to_all": "fcclAlltoAll",
        "reduce_scatter": "fcclReduceScatter", "broadcast": "fcclBroadcast", "reduce": "fcclReduce"}
KIB, MIB = 1 << 10, 1 << 20
RANKS = [2, 4]
SMALL = [8, 64 * KIB, MIB]
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
END_MARGIN = 3.0  # seconds kept for the target table and the exit
# The least time box each kind of step is worth starting with (seconds); what is
# reserved for the steps still to come. The MPS part is optional: nothing is reserved
# for it before it starts, and it starts only with time for two of its steps and the stop.
FLOORS = {"facts": 4, "profile": 10, "paths": 10, "copy": 8, "torch": 15, "big": 8, "gloo": 25,
          "small": 6, "checked": 6, "pingpong": 6, "mps": 6}
MPS_STOP = 12  # seconds held back, while MPS runs, to stop it
ORDER = ["facts", "profile", "paths", "copy", "torch", "big", "gloo", "small", "checked", "pingpong", "mps"]
INFO_RE = re.compile(r"rank (\d+) comm (\S+) seq (\d+) (fccl\w+) count (\d+) (\S+)(?: wire \S+)? "
                     r"backend (\S+) algorithm (\S*) +([0-9.]+) us")
_libc = ctypes.CDLL(None, use_errno=True)


class Stopped(Exception):
    """Raised by the signal handler: the run is being ended by a signal."""


def fmt_size(b):
    for unit, name in ((1 << 30, "G"), (MIB, "M"), (KIB, "K")):
        if b >= unit and b % unit == 0:
            return f"{b // unit}{name}"
    return f"{b} B"


def fname(b):
    """A size for a file name: 8, 64K, 1M."""
    return fmt_size(b).replace(" B", "")


def gb(v):
    return "-" if v is None else (f"{v:.1f}" if v >= 100 else f"{v:.2f}" if v >= 0.1 else f"{v:.4f}")


def roofline(coll, n, c):
    """The busbw a collective of n ranks on one device reaches at best, from C, the
    device's copy rate (bytes copied per second at that size)."""
    if coll == "all_reduce":
        return 2 * c * (n - 1) / n ** 2
    if coll in ("reduce_scatter", "all_gather"):
        return 2 * c * (n - 1) / (n * (n + 1))
    if coll == "all_to_all":
        return c * (n - 1) / n ** 2
    return 2 * c / (n + 1)  # broadcast, reduce


def parse_table_row(line):
    """A row of ferroccl-bench's or gloo_bench.py's table: (size, count, [out, in]) with
    each placement None or dict(time_us, busbw, wrong[, backend, algorithm]); None for
    other lines. ferroccl-bench may print each placement's backend and algorithm after
    the 13 columns of nccl-tests."""
    f = line.split()
    if len(f) < 13 or not f[0].isdigit() or not f[1].isdigit():
        return None
    paths = [f[13:15], f[15:17]] if len(f) >= 17 else [[], []]
    places = []
    for k, path in zip((5, 9), paths):
        t, _alg, bus, wrong = f[k:k + 4]
        if t == "N/A":
            places.append(None)
            continue
        try:
            d = dict(time_us=float(t), busbw=float(bus), wrong=None if wrong == "N/A" else int(wrong))
        except ValueError:
            return None
        if len(path) == 2:
            d["backend"], d["algorithm"] = path
        places.append(d)
    return int(f[0]), int(f[1]), places


def _session_pids(sid):
    """Live (not zombie) processes of session sid."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(")") + 2:].split()
        if len(rest) > 3 and rest[3] == str(sid) and rest[0] not in ("Z", "X"):
            out.append(int(d))
    return out


def _signal_session(sid, sig):
    try:
        os.killpg(sid, sig)
    except OSError:
        pass
    for pid in _session_pids(sid):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def end_session(sid, grace=2.0):
    """SIGTERM to every process of the session, SIGKILL to what is left after grace."""
    _signal_session(sid, signal.SIGTERM)
    t = time.monotonic() + grace
    while time.monotonic() < t:
        if not _session_pids(sid):
            return
        time.sleep(0.05)
    _signal_session(sid, signal.SIGKILL)


def _child_setup():
    # Between fork and exec: die with this program, however it dies (PR_SET_PDEATHSIG).
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)


class Lease:
    def __init__(self, o):
        self.o = o
        self.quick = o.quick
        self.check = o.check
        self.budget = float(o.budget)
        t0 = os.environ.get("FERROCCL_LEASE_T0")
        try:
            self.t0 = time.monotonic() - max(0.0, time.time() - float(t0)) if t0 else time.monotonic()
        except ValueError:
            self.t0 = time.monotonic()
        self.out = os.path.abspath(o.out)
        self.raw = os.path.join(self.out, "raw")
        self.rundir = os.environ.get("FERROCCL_LEASE_RUNDIR") or os.path.join(self.out, "raw")
        self.sim = bool(os.environ.get("FERROCCL_SIMGPU"))
        self.big = [MIB, 4 * MIB] if self.quick else [64 * MIB, 256 * MIB]
        self.children = {}
        self.stopping = 0
        self.mps_started = False
        self.hold = 0.0  # seconds held back for stopping MPS while it runs
        self.skipped = []
        self.plan = {}
        self.md = None
        self.stdout_ok = True
        # Results
        self.ferro = {"big": {}, "small": {}, "checked": {}, "mps": {}}  # kind -> {n: [records]}
        self.gloo = {}  # n -> [records]
        self.copies = {}  # size -> {method: GB/s}
        self.why = {}  # (kind, n[, coll]) -> why it was not measured
        self.mps_note = None
        self.no_mps_note = None
        self.warned = set()
        self.torch = None  # (python, version, cuda, gloo) or None
        self.torch_why = "torch was not looked for"
        self.torch_short = "no torch"
        self.json_has_backend = None
        self.outcome = "no result"  # of the last ferroccl-bench run, for the targets' "not measured (why)"

    # ---------------------------------------------------------------- output

    @staticmethod
    @contextlib.contextmanager
    def _masked():
        """SIGTERM, SIGINT and SIGHUP held while the block runs (a signal arriving then is
        handled after it), so that no line is half written and no child goes unrecorded."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def elapsed(self):
        return time.monotonic() - self.t0

    def left(self):
        return self.budget - self.elapsed()

    def write(self, text):
        """Appends text (one or more lines) to lease.md now, flushed and synced, and
        echoes it on stdout."""
        with self._masked():
            self.md.write(text + "\n")
            self.md.flush()
            os.fsync(self.md.fileno())
            if self.stdout_ok:
                try:
                    sys.stdout.write(text + "\n")
                    sys.stdout.flush()
                except (OSError, ValueError):
                    self.stdout_ok = False

    def line(self, text):
        self.write(f"- [{self.elapsed():.0f}s] {text}")

    def section(self, title):
        self.write("")
        self.write(f"## {title}" + (" (SIMULATED GPU: figures mean nothing)" if self.sim else ""))
        self.write("")

    def record(self, **kw):
        kw["t_s"] = round(self.elapsed(), 1)
        with self._masked():
            self.jl.write(json.dumps(kw) + "\n")
            self.jl.flush()
            os.fsync(self.jl.fileno())

    def skip(self, what, why):
        self.skipped.append(what)
        self.line(f"skipped: {what}: {why}")

    # ---------------------------------------------------------------- the budget

    def box(self, kind, usual, what):
        """The time box of the next step of this kind, or None (and a line saying so)
        when it cannot fit: at most `usual`, leaving the floors of the steps still to come
        unless that would cut this one below its own floor."""
        self.plan[kind] = max(self.plan.get(kind, 1) - 1, 0)
        reserve = sum(FLOORS[k] * self.plan.get(k, 0) for k in ORDER[ORDER.index(kind):])
        avail = self.left() - END_MARGIN - self.hold
        floor = FLOORS[kind]
        if avail < floor:
            self.skip(what, f"{max(avail + END_MARGIN, 0):.0f} s of the {self.budget:.0f} s budget left, it needs "
                      f"at least {floor} s")
            return None
        return max(min(usual, avail - reserve), floor)

    def drop(self, kind):
        """Nothing more of this kind will run: reserve nothing for it."""
        self.plan[kind] = 0

    # ---------------------------------------------------------------- children

    def _save_children(self):
        try:
            tmp = os.path.join(self.rundir, "children.tmp")
            with open(tmp, "w") as f:
                f.write("".join(f"{pid}\n" for pid in self.children))
            os.replace(tmp, os.path.join(self.rundir, "children"))
        except OSError:
            pass

    def run(self, name, cmd, limit, env=None, on_line=None):
        """Runs cmd in its own session for at most `limit` seconds, output (stdout and
        stderr) streamed to raw/NAME.txt and to on_line, line by line. Returns
        (exit code, lines, timed out); 124 when its box ended it, 127 when it did not
        start. Waits on nothing but this child; kills its whole session before
        returning."""
        raw_path = os.path.join(self.raw, name + ".txt")
        rf = open(raw_path, "ab")
        rf.write(f"$ {' '.join(shlex.quote(str(c)) for c in cmd)}   (at most {limit:.0f} s, at {self.elapsed():.0f} s)\n"
                 .encode())
        rf.flush()
        lines, buf, timed_out = [], b"", False
        # The box covers the end too: the kill's grace and reading what was left.
        start = time.monotonic()
        grace = min(1.5, limit * 0.15)
        deadline = start + max(limit - grace - 0.5, limit * 0.5)

        def handle(b):
            text = b.decode("utf-8", "replace").rstrip("\r")
            lines.append(text)
            if on_line:
                try:
                    on_line(text)
                except Stopped:
                    raise
                except Exception:
                    self.error(f"reading the output of {name}")

        with self._masked():
            try:
                p = subprocess.Popen([str(c) for c in cmd], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True,
                                     preexec_fn=_child_setup)
            except OSError as e:
                rf.write(f"could not start: {e}\n".encode())
                rf.close()
                return 127, [f"could not start: {e}"], False
            self.children[p.pid] = p
            self._save_children()
        fd = p.stdout.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        try:
            exited_at = None
            while True:
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    break
                if exited_at is None and p.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at > 2:
                    break  # something it left behind holds the pipe
                if not sel.select(min(deadline - now, 0.25)):
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                rf.write(chunk)
                rf.flush()
                buf += chunk
                *done, buf = buf.split(b"\n")
                for b in done:
                    handle(b)
            if not timed_out:
                try:
                    p.wait(max(deadline - time.monotonic(), 0.01))
                except subprocess.TimeoutExpired:
                    timed_out = True
            # The child, its descendants and whatever they left behind, now.
            end_session(p.pid, grace=grace if timed_out else 0.3)
            try:
                p.wait(1)
            except subprocess.TimeoutExpired:
                pass
            # What was written before the end.
            t = time.monotonic() + 0.5
            while time.monotonic() < t and sel.select(0.1):
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                rf.write(chunk)
                buf += chunk
                *done, buf = buf.split(b"\n")
                for b in done:
                    handle(b)
            if buf:
                handle(buf)
                buf = b""
        finally:
            if p.poll() is None or _session_pids(p.pid):
                end_session(p.pid, grace=1.0)
                try:
                    p.wait(2)
                except subprocess.TimeoutExpired:
                    pass
            with self._masked():
                self.children.pop(p.pid, None)
                self._save_children()
            sel.close()
            p.stdout.close()
            rc = 124 if timed_out else p.returncode
            rf.write(f"[exit {rc}{' (time box)' if timed_out else ''} after {time.monotonic() - start:.1f} s]\n".encode())
            rf.close()
        return rc, lines, timed_out

    def kill_children(self):
        for pid in list(self.children):
            end_session(pid, grace=1.0)
            try:
                self.children[pid].wait(1)
            except Exception:
                pass
            self.children.pop(pid, None)
        self._save_children()

    def error(self, what):
        tb = traceback.format_exc()
        try:
            with open(os.path.join(self.raw, "errors.txt"), "a") as f:
                f.write(f"[{self.elapsed():.0f}s] {what}\n{tb}\n")
        except OSError:
            pass
        self.line(f"error in {what}: {tb.strip().splitlines()[-1]} (see raw/errors.txt)")

    def env(self, **kw):
        e = dict(os.environ)
        e["CUDA_VISIBLE_DEVICES"] = "0"
        e.pop("FERROCCL_DEBUG", None)
        e["FERROCCL_CHECK"] = self.check
        e.update({k: str(v) for k, v in kw.items()})
        return e

    # ---------------------------------------------------------------- the parts

    def find_bench(self):
        cands = []
        if self.o.bin:
            cands.append(os.path.join(self.o.bin, "ferroccl-bench"))
        cands += [os.path.join(ROOT, ".gpubin", "bin", "ferroccl-bench"),
                  os.path.join(ROOT, "target", "release", "ferroccl-bench")]
        for c in cands:
            if os.path.isfile(c):
                if not os.access(c, os.X_OK):
                    dst = os.path.join(self.rundir, "ferroccl-bench")
                    shutil.copy(c, dst)
                    os.chmod(dst, 0o755)
                    return dst, c
                return c, c
        return None, " or ".join(cands)

    def part_facts(self):
        commit = None
        for p in (os.path.join(ROOT, ".gpubin", "commit"),):
            if os.path.isfile(p):
                commit = open(p).read().strip()
        if not commit:
            try:
                commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, timeout=5).stdout.decode().strip() or "unknown"
            except Exception:
                commit = "unknown"
        self.write(f"# GPU lease, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
                   f"budget {self.budget:.0f} s{', --quick' if self.quick else ''}")
        self.write("")
        if self.sim:
            self.write("**SIMULATED GPU: figures mean nothing** (scripts/sim-gpu.sh; FERROCCL_SIMGPU=1)")
            self.write("")
        if self.quick:
            self.line(f"--quick: large sizes {', '.join(fmt_size(s) for s in self.big)} instead of 64M, 256M; "
                      "small sizes as in a full run")
        bench, where = self.bench
        self.line(f"ferroccl-bench: {where if bench else 'missing: ' + where}")
        self.line(f"FERROCCL_CHECK={self.check}: " + (
            "device calls post their descriptors (no host exchange between the ranks per call once the first "
            "call agreed); the library's default, 1, is measured at 8 B and 2 ranks beside it" if self.check == "0"
            else "every device call is agreed first (one host exchange between the ranks per call); 0 is "
                 "measured at 8 B and 2 ranks beside it"))
        if shutil.which("nvidia-smi"):
            lim = self.box("facts", 10, "nvidia-smi")
            if lim:
                rc, lines, to = self.run("nvidia-smi", ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,"
                                         "compute_mode,pci.bus_id", "--format=csv,noheader"], lim)
                self.line("gpu: " + ("; ".join(l for l in lines if l.strip()) if rc == 0 else f"nvidia-smi exit {rc}"))
        else:
            self.drop("facts")
            self.line("gpu: nvidia-smi not found")

    def part_profile(self):
        self.section("1. Device attribute profile")
        script = os.path.join(ROOT, "tools", "simgpu", "capture-profile.py")
        stock = os.path.join(ROOT, "tools", "simgpu", "profile", "stock-hopper.json")
        if not os.path.isfile(script):
            self.drop("profile")
            self.skip("the device attribute profile", f"{os.path.relpath(script, ROOT)} is missing")
            return
        cmd = [sys.executable, script, "--out", os.path.join(self.out, "profile-captured.json")]
        if os.path.isfile(stock):
            cmd += ["--compare", stock]
        else:
            self.line(f"{os.path.relpath(stock, ROOT)} is missing: the profile is captured, not compared")
        lim = self.box("profile", 45, "the device attribute profile")
        if not lim:
            return
        shown = [0]

        def on(l):
            if not l.strip():
                return
            shown[0] += 1
            if shown[0] <= 3000:
                self.line("profile: " + l)
            elif shown[0] == 3001:
                self.line("profile: (more lines in raw/profile.txt)")

        rc, lines, to = self.run("profile", cmd, lim, env=self.env(), on_line=on)
        self.line(f"profile: {'stopped by its time box of %.0f s' % lim if to else 'exit %d' % rc}, "
                  f"{len([l for l in lines if l.strip()])} lines (raw/profile.txt, profile-captured.json)")

    def info_line(self, l):
        m = INFO_RE.search(l)
        if not m:
            return None
        return dict(rank=int(m.group(1)), fn=m.group(4), count=int(m.group(5)), dtype=m.group(6),
                    backend=m.group(7), algorithm=m.group(8), us=float(m.group(9)))

    def warn_line(self, l, where):
        if " Warn: " not in l:
            return
        msg = l.split(" Warn: ", 1)[1]
        if msg in self.warned:
            return
        self.warned.add(msg)
        self.line(f"WARN ({where}): {l.strip()}")

    def part_paths(self):
        self.section("2. Which path each collective takes (FERROCCL_DEBUG=INFO, 2 ranks on device 0, 1 MiB, one call)")
        bench = self.bench[0]
        if not bench:
            self.drop("paths")
            self.skip("the paths", "no ferroccl-bench (scripts/gpu-pack.sh, or cargo build --release)")
            return
        lim = self.box("paths", 40, "the paths")
        if not lim:
            return
        seen, ctl = {}, []
        by_fn = {v: k for k, v in FCCL.items()}

        def on(l):
            i = self.info_line(l)
            if i and i["rank"] == 0 and i["dtype"] == "float" and i["fn"] in by_fn and by_fn[i["fn"]] not in seen:
                c = by_fn[i["fn"]]
                seen[c] = i
                self.line(f"path {c}: {l.strip()}")
                self.record(part="path", collective=c, ranks=2, size=MIB, backend=i["backend"],
                            algorithm=i["algorithm"], us=i["us"])
            elif "stream memory operations on the control words work" in l and len(ctl) < 4:
                ctl.append(l)
                self.line(f"control words: {l.strip()}")
            else:
                self.warn_line(l, "paths")

        jpath = os.path.join(self.raw, "paths.json")
        cmd = [bench, "--nranks", 2, "--mem", "cuda", "-b", MIB, "-e", MIB, "-n", 1, "-w", 0, "-c", 0,
               "--max-time", 0, "-J", jpath, *COLLS]
        rc, lines, to = self.run("paths", cmd, lim, env=self.env(FERROCCL_DEBUG="INFO"), on_line=on)
        recs = self.bench_json(jpath)
        if recs:
            # Whether later runs need the INFO lines to name the path.
            self.json_has_backend = all("backend" in r for r in recs)
        for c in COLLS:
            if c not in seen:
                self.line(f"path {c}: no INFO line ({'time box' if to else 'exit %d' % rc}; see raw/paths.txt)")
        if not ctl:
            self.line("control words: no \"stream memory operations on the control words work\" line")
        if rc and not to:
            tail = [l for l in lines if l.strip()][-1:] or [""]
            self.line(f"paths: ferroccl-bench exit {rc}: {tail[0].strip()}")

    def part_copy(self):
        self.section("3. Side by side: the device's own copy, ferroccl --mem cuda, Gloo on CUDA tensors "
                     f"({', '.join(fmt_size(s) for s in self.big)}; ranks as processes sharing device 0)")
        sizes = ",".join(str(s) for s in self.big)
        lim = self.box("copy", 30, "the device's copy (cuMemcpyDtoDAsync)")
        if lim:
            self._copy("driver", [sys.executable, __file__, "--copy-worker", "driver", sizes, "0.1"], lim)
        # torch: a Python that imports it, with CUDA and Gloo.
        self.find_torch()
        if self.torch and self.torch[2]:
            lim = self.box("torch", 40, "torch's copy (y.copy_(x))")
            if lim:
                self._copy("torch", [self.torch[0], __file__, "--copy-worker", "torch", sizes, "0.1"], lim)
        else:
            self.drop("torch")
            self.skip("torch's copy (y.copy_(x))", self.torch_why)

    def _copy(self, method, cmd, lim):
        def on(l):
            if l.startswith("{"):
                try:
                    r = json.loads(l)
                except ValueError:
                    return
                self.copies.setdefault(r["size"], {})[method] = r["GBps"]
                self.line(f"copy {r['method']}: {fmt_size(r['size'])} in {r['time_us']:.1f} us: "
                          f"C = {r['GBps']:.1f} GB/s (bytes copied per second)")
                self.record(part="copy", **r)

        rc, lines, to = self.run(f"copy-{method}", cmd, lim, env=self.env(), on_line=on)
        if rc:
            tail = [l for l in lines if l.strip()][-1:] or [""]
            self.line(f"copy ({method}): {'stopped by its time box' if to else 'exit %d' % rc}: {tail[0].strip()}")

    def find_torch(self):
        cands = [os.environ.get("FERROCCL_TORCH_PYTHON"), os.path.expanduser("~/.cache/ferroccl/torch-venv/bin/python"),
                 os.path.join(ROOT, "tools", "compare", ".venv", "bin", "python"), sys.executable]
        probe = ("import torch, torch.distributed as d; print('TORCH', torch.__version__, "
                 "int(torch.cuda.is_available()), int(d.is_gloo_available()))")
        tried = set()
        self.torch_why = "torch is not importable by any Python found ($FERROCCL_TORCH_PYTHON, " \
                         "~/.cache/ferroccl/torch-venv, tools/compare/.venv, " + sys.executable + ")"
        for py in cands:
            if not py or py in tried or not os.path.exists(py):
                continue
            tried.add(py)
            lim = self.box("torch", 45, f"looking for torch in {py}")
            if not lim:
                self.torch_why, self.torch_short = "no time left to look for torch", "budget"
                return
            rc, lines, to = self.run("torch-probe", [py, "-c", probe], lim, env=self.env())
            got = [l.split() for l in lines if l.startswith("TORCH ")]
            if rc == 0 and got:
                _, ver, cuda, gloo = got[-1][:4]
                self.torch = (py, ver, cuda == "1", gloo == "1")
                self.line(f"torch {ver} at {py}: CUDA {'yes' if cuda == '1' else 'no'}, "
                          f"Gloo {'yes' if gloo == '1' else 'no'}")
                if cuda != "1":
                    self.torch_why, self.torch_short = f"torch {ver} at {py} sees no CUDA device", "torch sees no CUDA"
                elif gloo != "1":
                    self.torch_why, self.torch_short = f"torch {ver} at {py} has no Gloo", "torch has no Gloo"
                    self.torch = (py, ver, False, False)
                return

    def bench_json(self, path):
        try:
            with open(path) as f:
                j = json.load(f)
        except (OSError, ValueError):
            return None
        out = []
        for r in j.get("results", []):
            r = dict(r)
            r["busbw"] = r.get("busbw_GBps")
            out.append(r)
        return out

    def bench_run(self, name, n, sizes, colls, iters, kind, lim, info, extra=None):
        """ferroccl-bench --mem cuda at n ranks on device 0; records (JSON, else the rows of
        its table) and the (count -> backend, algorithm) of its INFO lines."""
        bench = self.bench[0]
        jpath = os.path.join(self.raw, name + ".json")
        if os.path.exists(jpath):
            os.remove(jpath)
        paths, rows, cur = {}, [], [colls[0] if len(colls) == 1 else None]
        by_fn = {v: k for k, v in FCCL.items()}

        def on(l):
            if l.startswith("# Collective:") or l.startswith("#  Collective"):
                cur[0] = l.split(":", 1)[1].strip().split()[0] if ":" in l else cur[0]
            if info:
                i = self.info_line(l)
                if i:
                    if i["rank"] == 0 and i["dtype"] == "float" and i["fn"] in by_fn:
                        paths.setdefault((by_fn[i["fn"]], i["count"]), (i["backend"], i["algorithm"]))
                    return
            self.warn_line(l, name)
            r = parse_table_row(l)
            if r and cur[0]:
                rows.append((cur[0], r))

        cmd = [bench, "--nranks", n, "--mem", "cuda", "-b", sizes[0], "-e", sizes[-1], "-f",
               max(sizes[-1] // sizes[0], 2) if len(sizes) == 2 else 2, *iters, "-J", jpath, *colls]
        env = self.env(**(extra or {}), **({"FERROCCL_DEBUG": "INFO"} if info else {}))
        rc, lines, to = self.run(name, cmd, lim, env=env, on_line=on)
        recs = self.bench_json(jpath)
        if recs is None:
            # Cut short: the rows it printed.
            recs = []
            for c, (size, count, places) in rows:
                for pl, d in zip(("out", "in"), places):
                    if d:
                        recs.append(dict(d, collective=c, size_bytes=size, count=count, placement=pl, host_us=None,
                                         from_table=True))
        elif recs and self.json_has_backend is None:
            self.json_has_backend = all("backend" in r for r in recs)
        for r in recs:
            if not r.get("backend") and (r["collective"], int(r["count"])) in paths:
                r["backend"], r["algorithm"] = paths[(r["collective"], int(r["count"]))]
                r["backend_from"] = "INFO"
        self.outcome = f"ferroccl-bench stopped by its time box of {lim:.0f} s" if to else \
            f"ferroccl-bench exit {rc}" if rc else "no result"
        if rc or to:
            tail = [l for l in lines if l.strip() and not self.info_line(l)][-1:] or [""]
            self.line(f"ferroccl-bench ({name}): {'stopped by its time box of %.0f s' % lim if to else 'exit %d' % rc}"
                      f"{': ' + tail[0].strip() if tail[0] and not to else ''} (raw/{name}.txt)")
        self.ferro[kind].setdefault(n, []).extend(recs)
        return recs

    @staticmethod
    def pick(recs, coll, size):
        """The out-of-place record of (coll, size), else the in-place one; and the other."""
        rs = [r for r in recs if r["collective"] == coll and int(r["size_bytes"]) == size]
        out = [r for r in rs if r["placement"] == "out"]
        inn = [r for r in rs if r["placement"] == "in"]
        first = (out or inn or [None])[0]
        other = (inn if out else [None])[0] if first else None
        return first, other

    def copy_rate(self, size):
        c = self.copies.get(size, {})
        if "driver" in c:
            return c["driver"], "cuMemcpyDtoDAsync"
        if "torch" in c:
            return c["torch"], "torch copy_"
        return None, None

    @staticmethod
    def path_of(r):
        if r and r.get("backend"):
            return f"backend {r['backend']} algorithm {r.get('algorithm') or '-'}"
        return "backend -"

    def part_big(self):
        bench = self.bench[0]
        self.write("")
        self.write("### ferroccl-bench --mem cuda (busbw out of place; in place in brackets)")
        self.write("")
        if not bench:
            self.drop("big")
            self.skip("ferroccl at large sizes", "no ferroccl-bench")
            return
        for n in RANKS:
            for c in COLLS:
                what = f"ferroccl {c}, {n} ranks, {'-'.join(fmt_size(s) for s in self.big)}"
                lim = self.box("big", 40, what)
                if not lim:
                    self.why[("big", n, c)] = "skipped: budget"
                    continue
                recs = self.bench_run(f"ferroccl-np{n}-{c}", n, self.big, [c],
                                      ["-n", 5, "-w", 2, "-c", 1, "--max-time", 0.5], "big", lim,
                                      info=self.json_has_backend is not True)
                for size in self.big:
                    r, ri = self.pick(recs, c, size)
                    if not r:
                        self.line(f"ferroccl {c}, {n} ranks, {fmt_size(size)}: not measured (raw/ferroccl-np{n}-{c}.txt)")
                        self.why.setdefault(("big", n, c), self.outcome)
                        continue
                    C, how = self.copy_rate(size)
                    roof = roofline(c, n, C) if C else None
                    frac = f"{r['busbw'] / roof:.3f} of the roofline {gb(roof)} GB/s (C {gb(C)} GB/s, {how})" if roof \
                        else "roofline: no copy rate"
                    wrong = f", {r['wrong']} WRONG" if r.get("wrong") else ""
                    self.line(f"ferroccl {c}, {n} ranks, {fmt_size(size)}: busbw {gb(r['busbw'])} GB/s "
                              f"[{gb(ri['busbw']) if ri else '-'}], {r['time_us']:.1f} us, {frac}, "
                              f"{self.path_of(r)}{wrong}")
                    self.record(part="ferroccl", collective=c, ranks=n, size=size, busbw=r["busbw"],
                                busbw_in=ri["busbw"] if ri else None, time_us=r["time_us"], copy_GBps=C,
                                roofline=roof, backend=r.get("backend"), algorithm=r.get("algorithm"))
        if self.json_has_backend is False:
            self.line("note: this ferroccl-bench's JSON has no backend/algorithm fields: those named come from "
                      "its FERROCCL_DEBUG=INFO lines")

    def side_line(self, n, c, size, g, why=None):
        r, _ = self.pick(self.ferro["big"].get(n, []), c, size)
        C, how = self.copy_rate(size)
        fb = r["busbw"] if r else None
        gbw = g["busbw"] if g else None
        ratio = f"{fb / gbw:.2f}x" if fb and gbw else "-"
        roof = roofline(c, n, C) if C else None
        frac = f"{fb / roof:.3f}" if fb is not None and roof else "-"
        gtxt = f"{gb(gbw)} GB/s" if g else f"- ({why})"
        self.line(f"side by side {c}, {n} ranks, {fmt_size(size)}: ferroccl {gb(fb)} GB/s, gloo {gtxt}, "
                  f"copy C {gb(C)} GB/s{' (' + how + ')' if how else ''}, ferroccl/gloo {ratio}, "
                  f"{frac} of the roofline ({gb(roof)} GB/s), {self.path_of(r)}")
        self.record(part="side_by_side", collective=c, ranks=n, size=size, ferroccl=fb, gloo=gbw, copy_GBps=C,
                    roofline=roof, gloo_why=why, backend=r.get("backend") if r else None,
                    algorithm=r.get("algorithm") if r else None)

    def part_gloo(self):
        self.write("")
        self.write("### Side by side with torch.distributed Gloo on the same CUDA tensors")
        self.write("")
        done, notrun = set(), {}
        script = os.path.join(ROOT, "tools", "compare", "gloo_bench.py")
        for n in RANKS:
            why = None
            if not (self.torch and self.torch[2]):
                why, full = "skipped: " + self.torch_short, self.torch_why
            elif not os.path.isfile(script):
                why = full = "skipped: tools/compare/gloo_bench.py is missing"
            if why:
                self.drop("gloo")
                if n == RANKS[0]:
                    self.skip("Gloo", full)
            else:
                lim = self.box("gloo", 150, f"Gloo at {n} ranks")
                if not lim:
                    why = "skipped: budget"
                else:
                    why = self._gloo(n, script, lim, done, notrun)
            for c in COLLS:
                for size in self.big:
                    if (n, c, size) not in done:
                        self.side_line(n, c, size, None,
                                       "not run by Gloo on CUDA tensors" if (n, c) in notrun else why or "no row")

    def _gloo(self, n, script, lim, done, notrun):
        cur, recs = [None], []

        def on(l):
            if l.startswith("# Collective:"):
                cur[0] = l.split(":", 1)[1].strip()
                return
            m = re.match(r"# (\w+): not run: (.*)", l)
            if m:
                notrun[(n, m.group(1))] = m.group(2)
                self.line(f"gloo {m.group(1)}, {n} ranks: not run: {m.group(2)}")
                return
            r = parse_table_row(l)
            if not r or not cur[0]:
                return
            size, count, places = r
            for pl, d in zip(("out", "in"), places):
                if d:
                    recs.append(dict(collective=cur[0], size_bytes=size, count=count, placement=pl,
                                     time_us=d["time_us"], busbw=d["busbw"], host_us=None))
            g = places[0] or places[1]
            if cur[0] in COLLS and (n, cur[0], size) not in done:
                done.add((n, cur[0], size))
                self.side_line(n, cur[0], size, g)

        cmd = [self.torch[0], script, "--device", "cuda", "--nranks", n, "-b", self.big[0], "-e", self.big[-1],
               "-f", max(self.big[-1] // self.big[0], 2), "-n", 2, "-w", 1, "-c", 0, "--max-time", 0,
               "--csv", os.path.join(self.raw, f"gloo-np{n}.csv"), *COLLS]
        rc, lines, to = self.run(f"gloo-np{n}", cmd, lim, env=self.env(), on_line=on)
        self.gloo[n] = recs
        if to:
            return f"Gloo's time box of {lim:.0f} s ended first"
        if rc:
            tail = [l for l in lines if l.strip()][-1:] or [""]
            self.line(f"gloo_bench.py at {n} ranks: exit {rc}: {tail[0].strip()} (raw/gloo-np{n}.txt)")
            return f"gloo_bench.py exit {rc}"
        return "Gloo printed no row"

    def part_small(self, kind="small", ranks=None, label=""):
        bench = self.bench[0]
        if kind == "small":
            self.section("4-5. Time per call and host time per call (8 B, 64 KiB, 1 MiB)")
        if not bench:
            self.drop(kind)
            if kind == "small":
                self.drop("checked")
            self.skip(f"small sizes{label}", "no ferroccl-bench")
            return
        iters = ["-n", 50, "-w", 10, "-c", 1, "--max-time", 0.1 if self.quick else 0.2]
        for n in ranks or RANKS:
            for size in SMALL:
                what = f"ferroccl small sizes{label}, {n} ranks, {fmt_size(size)}"
                lim = self.box(kind if kind == "small" else "mps", 30, what)
                if not lim:
                    for c in COLLS:
                        self.why[(kind, n, c)] = "skipped: budget"
                    continue
                tag = "-mps" if kind == "mps" else ""
                recs = self.bench_run(f"small{tag}-np{n}-{fname(size)}", n, [size], COLLS, iters, kind, lim,
                                      info=False)
                for c in COLLS:
                    r, ri = self.pick(recs, c, size)
                    ran = ""
                    if not r:
                        # Under one element per rank (8 B at 4 ranks) the bench runs size 0.
                        other = sorted({int(x["size_bytes"]) for x in recs if x["collective"] == c})
                        if len(other) == 1:
                            r, ri = self.pick(recs, c, other[0])
                            ran = f" (ran as {fmt_size(other[0])}: under one element per rank)"
                    if not r:
                        self.line(f"small{label} {c}, {n} ranks, {fmt_size(size)}: not measured"
                                  f"{' (see raw/small%s-np%d-%s.txt)' % (tag, n, fname(size))}")
                        self.why.setdefault((kind, n, c), self.outcome)
                        continue
                    h = r.get("host_us")
                    hi = ri.get("host_us") if ri else None
                    cnt = ran or ("" if int(r["count"]) else " (0 elements per rank)")
                    wrong = f", {r['wrong']} WRONG" if r.get("wrong") else ""
                    self.line(f"small{label} {c}, {n} ranks, {fmt_size(size)}{cnt}: {r['time_us']:.2f} us per call "
                              f"[{'-' if not ri else '%.2f' % ri['time_us']}], host {'-' if h is None else '%.2f' % h} "
                              f"us per call [{'-' if hi is None else '%.2f' % hi}], {self.path_of(r)}{wrong}")
                    self.record(part="small" + tag, collective=c, ranks=n, size=size, time_us=r["time_us"],
                                time_us_in=ri["time_us"] if ri else None, host_us=h, host_us_in=hi,
                                backend=r.get("backend"), algorithm=r.get("algorithm"), check=self.check)
        if kind == "small":
            self.part_checked(iters)

    def part_checked(self, iters):
        """8 B at 2 ranks with the other FERROCCL_CHECK: what agreeing on each call costs."""
        other = "1" if self.check == "0" else "0"
        n, size = 2, SMALL[0]
        lim = self.box("checked", 30, f"ferroccl small sizes with FERROCCL_CHECK={other}")
        if not lim:
            return
        recs = self.bench_run(f"small-check{other}-np{n}-{fname(size)}", n, [size], COLLS, iters, "checked", lim,
                              info=False, extra={"FERROCCL_CHECK": other})
        for c in COLLS:
            r, _ = self.pick(recs, c, size)
            mine, _ = self.pick(self.ferro["small"].get(n, []), c, size)
            if not r:
                self.line(f"small {c}, {n} ranks, {fmt_size(size)}, FERROCCL_CHECK={other}: not measured "
                          f"(raw/small-check{other}-np{n}-{fname(size)}.txt)")
                continue
            h = r.get("host_us")
            beside = f" (FERROCCL_CHECK={self.check}: {mine['time_us']:.2f} us)" if mine else ""
            self.line(f"small {c}, {n} ranks, {fmt_size(size)}, FERROCCL_CHECK={other}: {r['time_us']:.2f} us per "
                      f"call{beside}, host {'-' if h is None else '%.2f' % h} us per call, {self.path_of(r)}")
            self.record(part="small-check" + other, collective=c, ranks=n, size=size, time_us=r["time_us"],
                        host_us=h, backend=r.get("backend"), algorithm=r.get("algorithm"), check=other)

    def pingpong_exe(self, lim):
        pre = os.path.join(ROOT, ".gpubin", "bin", "memop_pingpong")
        if os.path.isfile(pre) and os.access(pre, os.X_OK):
            return pre, None
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if not cc:
            return None, "no prebuilt .gpubin/bin/memop_pingpong and no C compiler (cc)"
        exe = os.path.join(self.rundir, "memop_pingpong")
        rc, lines, to = self.run("pingpong-build", [cc, "-O2", os.path.join(HERE, "memop_pingpong.c"), "-o", exe, "-ldl"],
                                 lim)
        if rc:
            return None, f"bench/memop_pingpong.c did not build ({'time box' if to else 'exit %d' % rc}; raw/pingpong-build.txt)"
        return exe, None

    def pingpong(self, exe, tag, lim):
        rounds = 200 if self.quick else 1000
        got = []

        def on(l):
            if " us per round trip" in l or l.startswith("skipped"):
                got.append(l)
                self.line(f"ping-pong {tag}: {l.strip()}")
                m = re.match(r"(.*): ([0-9.]+) us per round trip", l)
                if m:
                    self.record(part="pingpong", mps=tag, case=m.group(1), us=float(m.group(2)))

        rc, lines, to = self.run(f"pingpong{'-mps' if tag == 'with MPS' else ''}", [exe, "--rounds", rounds], lim,
                                 env=self.env(), on_line=on)
        if rc and rc != 77:
            tail = [l for l in lines if l.strip()][-1:] or [""]
            self.line(f"ping-pong {tag}: {'stopped by its time box' if to else 'exit %d' % rc}: {tail[0].strip()}")

    @staticmethod
    def mps_running():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    exe = os.path.basename(f.read().split(b"\0")[0])
            except OSError:
                continue
            if exe in (b"nvidia-cuda-mps-control", b"nvidia-cuda-mps-server"):
                return True
        return False

    def mps_state(self):
        """(this run may start MPS, why not)."""
        if self.mps_running():
            return False, "MPS was already running"
        if not shutil.which("nvidia-cuda-mps-control"):
            return False, "nvidia-cuda-mps-control is not installed"
        if os.geteuid() != 0:
            return False, "starting MPS needs root"
        return True, ""

    def part_pingpong(self):
        self.section("6. Stream memory operations: a round trip between two processes on device 0 (bench/memop_pingpong.c)")
        can, why = self.mps_state()
        exe = None
        lim = self.box("pingpong", 40, "the ping-pong")
        if lim:
            t = time.monotonic()
            exe, bad = self.pingpong_exe(lim / 2)
            if not exe:
                self.skip("the ping-pong", bad)
            else:
                self.pingpong(exe, "without MPS" if why != "MPS was already running" else "with MPS (it was running)",
                              max(lim - (time.monotonic() - t), 1))
        if why == "MPS was already running":
            self.no_mps_note = "MPS was running: every figure is with MPS"
            self.mps_note = why
            self.line("MPS was already running: every figure above is with MPS; it is left running")
            return
        if not can:
            self.mps_note = why
            self.skip("MPS (ping-pong and small sizes at 2 ranks)", why)
            return
        need = 2 * FLOORS["mps"] + MPS_STOP + 5
        if self.left() - END_MARGIN < need:
            self.mps_note = "skipped: budget"
            self.skip("MPS (ping-pong and small sizes at 2 ranks)",
                      f"{max(self.left(), 0):.0f} s of the budget left, it needs {need} s")
            return
        self.section("6b. With MPS (started by this run, stopped at its end)")
        if not self.start_mps():
            self.mps_note = "nvidia-cuda-mps-control -d failed"
            return
        self.hold = MPS_STOP
        try:
            self.plan["mps"] = len(SMALL) + 1
            if exe:
                lim = self.box("mps", 30, "the ping-pong with MPS")
                if lim:
                    self.pingpong(exe, "with MPS", lim)
            self.part_small(kind="mps", ranks=[2], label=" with MPS")
            self.mps_note = "MPS did not run" if not self.ferro["mps"] else None
        finally:
            self.hold = 0.0
            self.stop_mps()

    def start_mps(self):
        marker = os.path.join(self.rundir, "mps-started")
        with self._masked():
            try:
                open(marker, "w").close()
            except OSError:
                pass
            self.mps_started = True
        log = open(os.path.join(self.raw, "mps.txt"), "ab")
        try:
            p = subprocess.Popen(["nvidia-cuda-mps-control", "-d"], stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
            rc = p.wait(15)
        except (OSError, subprocess.TimeoutExpired) as e:
            rc = f"{e}"
        finally:
            log.close()
        if rc != 0:
            self.line(f"MPS: nvidia-cuda-mps-control -d failed ({rc}); not used")
            self.stop_mps()
            return False
        self.line("MPS: started (nvidia-cuda-mps-control -d)")
        return True

    def stop_mps(self):
        """Stops MPS if and only if this run started it."""
        if not self.mps_started:
            return
        self.mps_started = False
        try:
            log = open(os.path.join(self.raw, "mps.txt"), "ab")
            p = subprocess.Popen(["nvidia-cuda-mps-control"], stdin=subprocess.PIPE, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
            try:
                p.communicate(b"quit\n", timeout=15)
            except subprocess.TimeoutExpired:
                end_session(p.pid, grace=1.0)
                p.wait(2)
            finally:
                log.close()
            t = time.monotonic() + 10
            while time.monotonic() < t and self.mps_running():
                time.sleep(0.1)
            still = self.mps_running()
            try:
                os.remove(os.path.join(self.rundir, "mps-started"))
            except OSError:
                pass
            self.line("MPS: stopped (echo quit | nvidia-cuda-mps-control)" + ("; it is STILL RUNNING" if still else ""))
        except Exception:
            self.error("stopping MPS")

    # ---------------------------------------------------------------- the targets

    def part_targets(self):
        self.write("")
        self.write("## Targets (issue 30; bench/device_compare.py's TARGETS, metric, verdict)"
                   + (" (SIMULATED GPU: figures mean nothing)" if self.sim else ""))
        self.write("")
        try:
            sys.path.insert(0, HERE)
            import device_compare as dc
            TARGETS, metric, verdict = dc.TARGETS, dc.metric, dc.verdict
            SMALL_MPS, SMALL_T = dc.SMALL_MPS, dc.SMALL
        except Exception:
            self.error("importing bench/device_compare.py for the targets")
            return
        def of(kinds, n, name):
            """The records a metric reads: busbw from the large sizes only, host time from
            the runs that reported it (not rows read off a table cut short)."""
            recs = [r for k in kinds for r in self.ferro[k].get(n, [])]
            if name == "busbw_big":
                recs = [r for k in kinds if k != "small" for r in self.ferro[k].get(n, [])]
            if name == "host_us":
                recs = [r for r in recs if r.get("host_us") is not None]
            return recs or None

        rows = []
        try:
            for what, colls, name, goals, sense, unit in TARGETS:
                for n in RANKS:
                    if n not in goals:
                        continue
                    for c in colls:
                        mps = what == SMALL_MPS
                        if mps:
                            kinds = ("big", "small") if self.no_mps_note else ("mps",)
                        else:
                            kinds = ("big", "small")
                        recs = of(kinds, n, name)
                        kind = "mps" if mps else ("big" if name == "busbw_big" else "small")
                        if what == SMALL_T and self.no_mps_note:
                            value, why = None, self.no_mps_note
                        elif recs is None or not any(r["collective"] == c for r in recs):
                            value = None
                            why = self.why.get((kind, n, c)) or ((self.mps_note or "MPS did not run") if mps else
                                                                 "ferroccl-bench did not run")
                        else:
                            value, why = metric(recs, c, name)
                            why = self.why.get((kind, n, c), why) if value is None else why
                        g = self.gloo.get(n)
                        gv = metric(g, c, name)[0] if g and not mps and name != "host_us" else None
                        rows.append(dict(target=what, collective=c, ranks=n, goal=goals[n], sense=sense, unit=unit,
                                         ferroccl=value, gloo=gv,
                                         verdict=verdict(value, goals[n], sense) if value is not None
                                         else f"not measured ({why})"))
        except Exception:
            self.error("computing the targets")
            return

        def fv(v, unit):
            return "-" if v is None else (f"{v:.1f} {unit}" if v >= 10 else f"{v:.2f} {unit}")

        lines = ["| target | collective | ranks | goal | ferroccl | gloo | verdict |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            goal = (">= " if r["sense"] == "ge" else "<= ") + f"{r['goal']} {r['unit']}"
            v = r["verdict"]
            lines.append(f"| {r['target']} | {r['collective']} | {r['ranks']} | {goal} | {fv(r['ferroccl'], r['unit'])} | "
                         f"{fv(r['gloo'], r['unit'])} | {'**missed**' if v == 'missed' else v} |")
        met = sum(r["verdict"] == "met" for r in rows)
        missed = sum(r["verdict"] == "missed" for r in rows)
        lines += ["", f"{met} met, {missed} missed, {len(rows) - met - missed} not measured, of {len(rows)}."]
        big = max(self.copies, default=None)
        if big:
            C, how = self.copy_rate(big)
            lines.append(f"The device's own copy ({how}): {C:.1f} GB/s at {fmt_size(big)} (bytes copied per second).")
        self.write("\n".join(lines))
        self.record(part="targets", rows=rows)

    # ---------------------------------------------------------------- the whole run

    def on_signal(self, signum, frame):
        if self.stopping:
            return
        self.stopping = signum
        raise Stopped(signum)

    def cleanup(self):
        """Every child session killed; MPS stopped if this run started it. Idempotent."""
        with self._masked():
            self.kill_children()
        self.stop_mps()

    def main(self):
        os.makedirs(self.out, exist_ok=True)
        shutil.rmtree(self.raw, ignore_errors=True)
        os.makedirs(self.raw, exist_ok=True)
        os.makedirs(self.rundir, exist_ok=True)
        self.md = open(os.path.join(self.out, "lease.md"), "w")
        self.jl = open(os.path.join(self.out, "lease.jsonl"), "w")
        for s in SIGNALS:
            signal.signal(s, self.on_signal)
        self.bench = self.find_bench()
        nb = len(RANKS) * len(COLLS)
        self.plan = {"facts": 1, "profile": 1, "paths": 1, "copy": 1, "torch": 2, "big": nb, "gloo": len(RANKS),
                     "small": len(RANKS) * len(SMALL), "checked": 1, "pingpong": 1, "mps": 0}
        rc = 0
        try:
            for part in (self.part_facts, self.part_profile, self.part_paths, self.part_copy, self.part_big,
                         self.part_gloo, self.part_small, self.part_pingpong):
                try:
                    part()
                except Stopped:
                    raise
                except Exception:
                    self.error(part.__name__)
                    with self._masked():
                        self.kill_children()
        except Stopped as e:
            rc = 128 + int(e.args[0])
            self.write("")
            self.line(f"STOPPED by {signal.Signals(e.args[0]).name} after {self.elapsed():.0f} s: "
                      "what follows the lines above was not measured")
        finally:
            self.cleanup()
        try:
            if self.skipped:
                self.write("")
                self.line("skipped in this run: " + "; ".join(self.skipped))
            self.part_targets()
            self.write("")
            self.line(f"{'stopped' if rc else 'done'} in {self.elapsed():.0f} s of the {self.budget:.0f} s budget; "
                      f"raw outputs in raw/, every figure in lease.jsonl")
        except Stopped:
            rc = rc or 128 + self.stopping
        except Exception:
            self.error("the target table")
        return rc


# ---------------------------------------------------------------- copy workers


def time_loop(one, sync, budget):
    for _ in range(3):
        one()
    sync()
    t = time.perf_counter()
    one()
    sync()
    est = max(time.perf_counter() - t, 1e-7)
    iters = int(min(max(budget / est, 3), 1000))
    t0 = time.perf_counter()
    for _ in range(iters):
        one()
    sync()
    return (time.perf_counter() - t0) / iters


def copy_worker(method, sizes, budget):
    """One JSON line per size: a device-to-device copy of `size` bytes on device 0."""
    if method == "torch":
        import torch
        dev = torch.device("cuda", 0)
        for size in sizes:
            x = torch.ones(size, dtype=torch.uint8, device=dev)
            y = torch.empty_like(x)
            t = time_loop(lambda: y.copy_(x), torch.cuda.synchronize, budget)
            print(json.dumps(dict(method="torch y.copy_(x)", size=size, time_us=t * 1e6, GBps=size / t / 1e9)), flush=True)
            del x, y
        return 0
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
        t = time_loop(lambda: ok(cu.cuMemcpyDtoDAsync_v2(y.value, x.value, size, None), "cuMemcpyDtoDAsync"),
                      lambda: ok(cu.cuCtxSynchronize(), "cuCtxSynchronize"), budget)
        print(json.dumps(dict(method="cuMemcpyDtoDAsync", size=size, time_us=t * 1e6, GBps=size / t / 1e9)), flush=True)
        ok(cu.cuMemFree_v2(x), "cuMemFree")
        ok(cu.cuMemFree_v2(y), "cuMemFree")
    return 0


def main(argv):
    if argv[:1] == ["--copy-worker"]:
        return copy_worker(argv[1], [int(s) for s in argv[2].split(",")], float(argv[3]))
    ap = argparse.ArgumentParser(prog="gpu_lease.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=float, default=360, help="seconds for the whole run, from its start (default 360)")
    ap.add_argument("--quick", action="store_true", help="large sizes 1M and 4M instead of 64M and 256M (CI)")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "build", "gpu-lease"),
                    help="output folder (default $OUT, else build/gpu-lease)")
    ap.add_argument("--bin", help="folder of ferroccl-bench (default .gpubin/bin, else target/release)")
    ap.add_argument("--check", choices=("0", "1"), default=os.environ.get("FERROCCL_CHECK") or "0",
                    help="FERROCCL_CHECK for ferroccl's runs (default: the environment's, else 0: descriptors posted)")
    o = ap.parse_args(argv)
    if o.budget < 1:
        ap.error("--budget needs seconds >= 1")
    lease = Lease(o)
    try:
        return lease.main()
    finally:
        lease.cleanup()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
