#!/usr/bin/env bash
# Every check that needs a real GPU, in one command, and a record of what it saw:
#
#   scripts/gpu-validate.sh [--out FILE] [--bin DIR] [--quick] [--test-timeout S] [PHASE...]
#
# PHASE: suite (the whole C contract suite on the real driver: host tests, then the
# same as programs that use CUDA, then the device tests), suite-device (the device tests
# alone, to rerun them after a fix within a short lease), bench (ferroccl-bench
# --mem cuda at 1, 2 and 4 ranks, every collective), compare (bench/device_compare.sh:
# ferroccl at 2 and 4 ranks sharing device 0, side by side with the device's own copy
# and torch.distributed's Gloo on the same CUDA tensors, and the ping-pong below,
# against issue 30's targets, each marked met, missed or not measured), pingpong
# (bench/memop_pingpong.c alone: a round trip of stream memory operations between two
# processes on device 0, the floor of the one-GPU data plane's small calls; again
# under MPS when the script may start it; compare runs it too), startup (what the
# first call of a host-memory program costs with and without a CUDA context), nccl
# (nccl-tests' *_perf binaries from NCCL_TESTS_DIR and PyTorch's backend="nccl",
# unchanged, on ferroccl's libnccl.so.2 through LD_PRELOAD; skipped where missing),
# report (writes the record). Default: all of them but pingpong. Each phase leaves its
# raw output in build/gpu-validation/; `report` turns whatever is there into FILE
# (default docs/gpu-validation.md) with the date, GPU, driver, CUDA and NCCL versions,
# the commands, pass counts and figures (`report` alone keeps the facts already in
# build/gpu-validation/, so a record can be written here from a GPU machine's raw
# outputs). Nothing is written that was not measured.
# On the simulated GPU (scripts/sim-gpu.sh) the raw outputs go to
# /tmp/ferroccl-gpu-validation-sim and the record, marked SIMULATED, to
# /tmp/gpu-validation-simulated.md unless --out says otherwise.
#
# GPU machines may have no Rust toolchain: build on a machine that has one
# (`cargo build --release`), copy libferroccl.so, ferroccl-run, ferroccl-bench (and libferroccl_nccl.so)
# into a folder that travels with the repo, and pass it with --bin (the script
# copies them to target/release). cmake and a C compiler are needed here.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out_md="$root/docs/gpu-validation.md"
bin=""
quick=0
test_timeout=300
out_set=0
phases=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out_md="$(realpath -m "$2")"; out_set=1; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --test-timeout) test_timeout="$2"; shift 2 ;;
    suite|suite-device|bench|compare|pingpong|startup|nccl|report) phases+=("$1"); shift ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "gpu-validate: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#phases[@]} -gt 0 ] || phases=(suite bench compare startup nccl report)
res="$root/build/gpu-validation"
if [ -n "${FERROCCL_SIMGPU:-}" ]; then
  # A simulated run must not leave figures where a real run's report would pick them up.
  res="${TMPDIR:-/tmp}/ferroccl-gpu-validation-sim"
  [ "$out_set" = 1 ] || out_md="${TMPDIR:-/tmp}/gpu-validation-simulated.md"
fi
mkdir -p "$res"
lib="$root/target/release"
log() { printf '\n==> %s\n' "$*" >&2; }
# Each phase records its commands in its own file, rewritten when it runs again.
cmdlog() { printf '%s\n' "$*" >>"$res/commands-$phase.txt"; }
commit_of() {
  if [ -n "${FERROCCL_COMMIT:-}" ]; then echo "$FERROCCL_COMMIT"
  elif git rev-parse -q HEAD >/dev/null 2>&1; then
    echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (with uncommitted changes)')"
  else echo unknown; fi
}

if [ -n "${FERROCCL_SIMGPU:-}" ]; then
  echo "gpu-validate: running on the simulated GPU (scripts/sim-gpu.sh); the record says so" >&2
fi

# ---------------------------------------------------------------- binaries
if [ -n "$bin" ]; then
  mkdir -p "$lib"
  for f in libferroccl.so ferroccl-run ferroccl-bench; do cp -f "$bin/$f" "$lib/$f"; done
  # Programs linked with -lferroccl ask for the SONAME, as cargo's build leaves it.
  ln -sf libferroccl.so "$lib/libferroccl.so.0"
  if [ -f "$bin/libferroccl_nccl.so" ]; then cp -f "$bin/libferroccl_nccl.so" "$lib/"; fi
elif command -v cargo >/dev/null; then
  cargo build --release --quiet
fi
for f in libferroccl.so ferroccl-run ferroccl-bench; do
  [ -x "$lib/$f" ] || [ -f "$lib/$f" ] || { echo "gpu-validate: $lib/$f missing (build with cargo, or pass --bin)" >&2; exit 1; }
done
cmake_bin="$(command -v cmake || true)"
[ -n "$cmake_bin" ] || { [ -x "$root/.venv/bin/cmake" ] && cmake_bin="$root/.venv/bin/cmake"; }
need_cmake() { [ -n "$cmake_bin" ] || { echo "gpu-validate: the suite needs cmake" >&2; exit 1; }; }
ctest_bin="$(dirname "${cmake_bin:-.}")/ctest"
jobs="$(nproc)"

# ---------------------------------------------------------------- facts of the machine
facts() {
  {
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "host: $(hostname)"
    echo "commit: $(commit_of) (this run; each phase's commands name their own)"
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=index,name,memory.total,driver_version,pci.bus_id --format=csv,noheader | sed 's/^/gpu: /'
      echo "mps: $(pgrep -f nvidia-cuda-mps-control >/dev/null && echo running || echo 'not running')"
    else
      echo "gpu: none seen by nvidia-smi"
    fi
    cc -x c - -o "$res/versions" -ldl <<'EOF' && "$res/versions" || echo "versions: could not be read"
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
  int v = 0;
  void* cu = dlopen("libcuda.so.1", RTLD_NOW);
  void* nc = dlopen("libnccl.so.2", RTLD_NOW);
  int (*dv)(int*) = cu ? (int (*)(int*))dlsym(cu, "cuDriverGetVersion") : 0;
  int (*nv)(int*) = nc ? (int (*)(int*))dlsym(nc, "ncclGetVersion") : 0;
  if (dv && dv(&v) == 0) printf("cuda driver api: %d.%d\n", v / 1000, v % 1000 / 10);
  else printf("cuda driver api: not loadable\n");
  if (nv && nv(&v) == 0) printf("nccl: %d.%d.%d\n", v / 10000, v / 100 % 100, v % 100);
  else printf("nccl: not loadable\n");
  return 0;
}
EOF
    if command -v nvcc >/dev/null; then echo "nvcc: $(nvcc --version | tail -1)"; fi
    echo "cpus: $(nproc)"
    [ -n "${FERROCCL_SIMGPU:-}" ] && echo "simulated: yes (scripts/sim-gpu.sh; not a GPU)"
    true
  } >"$res/facts.txt"
}

# ---------------------------------------------------------------- phases
# ctest_in DIR OUT [CMAKE_OPTION...] -- [CTEST_ARGS...]: configure and build the C suite
# in DIR against this library, then run ctest there into OUT (the raw file).
ctest_in() {
  local dir="$1" outf="$2"; shift 2
  local cfg=(-DCMAKE_BUILD_TYPE=Release -DFERROCCL_LIB_DIR="$lib" -DFERROCCL_INCLUDE_DIR="$root/include"
             -DFERROCCL_RUN="$lib/ferroccl-run")
  while [ $# -gt 0 ] && [ "$1" != -- ]; do cfg+=("$1"); shift; done
  shift
  "$cmake_bin" -S c_tests -B "$dir" "${cfg[@]}" >/dev/null
  "$cmake_bin" --build "$dir" -j "$jobs" >/dev/null
  cmdlog "ctest --test-dir $dir $([ $# -eq 0 ] || printf '%q ' "$@")-j $jobs --timeout $test_timeout${cfg[4]:+  (cmake ${cfg[*]:4})}"
  "$ctest_bin" --test-dir "$dir" "$@" -j "$jobs" --timeout "$test_timeout" --output-on-failure >"$res/$outf" 2>&1 || true
  tail -n 3 "$res/$outf" >&2
}

run_suite() {
  log "C contract suite, every test (host memory, then device memory) on this machine's driver"
  ctest_in build/gpu-suite suite.txt --
  log "C contract suite as programs that use CUDA (host memory; device 0 current before main)"
  ctest_in build/gpu-suite-cuda-user suite-cuda-user.txt -DFERROCCL_TEST_CUDA_USER=ON -- -LE 'device|cuda'
}

run_suite_device() {
  log "C contract suite, the device tests alone"
  ctest_in build/gpu-suite suite-device.txt -- -L device
}

run_bench() {
  local sizes=(-b 16 -e 64M -f 4) colls=(all)
  [ "$quick" = 1 ] && sizes=(-b 16 -e 1M -f 4)
  for n in 1 2 4; do
    log "ferroccl-bench --mem cuda, $n rank(s)"
    local cmd=("$lib/ferroccl-bench" --nranks "$n" --mem cuda "${sizes[@]}" -c 1 -J "$res/bench-np$n.json" "${colls[@]}")
    cmdlog "FERROCCL_DEBUG=INFO ${cmd[*]#$root/}"
    FERROCCL_DEBUG=INFO "${cmd[@]}" >"$res/bench-np$n.txt" 2>"$res/bench-np$n.log" || echo "exit $?" >>"$res/bench-np$n.txt"
    grep -v '^#' "$res/bench-np$n.txt" | tail -4 >&2 || true
  done
}

# Stream memory operations between two processes on device 0, without MPS and (when
# this script may start it: root and nvidia-cuda-mps-control present, none running) with
# (bench/device_compare.py's ping-pong part; under MPS it also times ferroccl-bench's
# small sizes at 2 and 4 ranks).
run_pingpong() {
  log "stream write/wait round trips between two processes on device 0"
  cmdlog "python3 bench/device_compare.py --parts pingpong --out ${res#$root/}  (memop_pingpong --rounds 2000, without and with MPS)"
  rm -f "$res/pingpong.txt" "$res/pingpong-mps.txt"
  python3 bench/device_compare.py --parts pingpong --out "$res" --bin "$lib" >/dev/null ||
    echo "exit $?" >>"$res/pingpong.txt"
  cat "$res/pingpong.txt" >&2
}

# ferroccl at 2 and 4 ranks on device 0 against the device's own copy, Gloo on the same
# CUDA tensors and the ping-pong, with issue 30's targets marked met or missed.
# GPU_VALIDATE_MAX_TIME: seconds per size and side (default 0.25).
run_compare() {
  local span=(--max-time "${GPU_VALIDATE_MAX_TIME:-0.25}")
  [ "$quick" = 1 ] && span+=(-e 1M)
  log "side by side: ferroccl, the device's copy, Gloo on CUDA tensors, the ping-pong (bench/device_compare.sh)"
  cmdlog "bench/device_compare.sh --out ${res#$root/}/compare ${span[*]}"
  rm -rf "$res/compare"
  bash bench/device_compare.sh --out "$res/compare" --bin "$lib" "${span[@]}" >/dev/null 2>"$res/compare.log" ||
    echo "exit $?" >>"$res/compare.log"
  # Its ping-pong is the record's.
  for f in pingpong.txt pingpong-mps.txt; do
    rm -f "$res/$f"
    if [ -f "$res/compare/$f" ]; then cp "$res/compare/$f" "$res/$f"; fi
  done
  sed -n '/^| target/,/ met, /p' "$res/compare/device-compare.md" >&2 2>/dev/null || tail -3 "$res/compare.log" >&2
}

# Wall time of a one-rank program that makes one 8-byte all_reduce of host memory:
# as a host-only program (the library must not start CUDA) and as a program that
# has already created a CUDA context (what starting CUDA costs).
run_startup() {
  log "first call of a host-memory program, with and without CUDA started"
  cc -O2 -I include -x c - -o "$res/first_call" -L "$lib" -lferroccl -ldl -Wl,-rpath,"$lib" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <ferroccl.h>
#include <stdio.h>
int main(void) {
  fcclUniqueId id;
  fcclComm_t c;
  float x = 1, y = 0;
  if (fcclGetUniqueId(&id) || fcclCommInitRank(&c, 1, id, 0)) return 1;
  if (fcclAllReduce(&x, &y, 1, fcclFloat32, fcclSum, c, NULL) || y != 1) return 1;
  if (fcclCommDestroy(c) != 0) return 1;
  /* Whether anything in the process (the library, for a host-only program) loaded the driver. */
  printf("libcuda_mapped %d\n", dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY) != NULL);
  return 0;
}
EOF
  cc -O2 -shared -fPIC c_tests/cuda_user.c -o "$res/cuda_user.so" -ldl
  cmdlog "first_call (init, one 8-byte all_reduce, destroy) x5, then LD_PRELOAD=cuda_user.so first_call x5"
  : >"$res/startup.txt"
  for mode in host cuda_user; do
    for i in 1 2 3 4 5; do
      local t0 t1 said
      t0=$(date +%s%N)
      if [ "$mode" = host ]; then said=$("$res/first_call"); else said=$(LD_PRELOAD="$res/cuda_user.so" "$res/first_call"); fi
      t1=$(date +%s%N)
      echo "$mode $(( (t1 - t0) / 1000 )) ${said#libcuda_mapped }" >>"$res/startup.txt"
    done
  done
}

# NCCL programs on ferroccl's libnccl.so.2 (LD_PRELOAD, nothing rebuilt): nccl-tests'
# *_perf binaries from NCCL_TESTS_DIR (a built nccl-tests' build/ folder) on every GPU
# of this machine, and PyTorch's backend="nccl" when torch imports. Skipped, saying
# so in the record, where either is missing.
run_nccl() {
  local shim="$lib/libferroccl_nccl.so" ngpu
  ngpu="$( (nvidia-smi -L 2>/dev/null || true) | wc -l)"
  [ "$ngpu" -gt 0 ] || ngpu=1
  if [ ! -f "$shim" ]; then
    echo "skipped: $shim missing (cargo build --release, or --bin with it)" >"$res/nccl-tests.txt"
    return
  fi
  : >"$res/nccl-tests.txt"
  if [ -z "${NCCL_TESTS_DIR:-}${NCCL_TESTS_FERROCCL_DIR:-}" ]; then
    echo "skipped: NCCL_TESTS_DIR (a built nccl-tests' build/ folder) is not set" >"$res/nccl-tests.txt"
  fi
  # NCCL_TESTS_DIR: built against NVIDIA's nccl.h, run with ferroccl's library preloaded;
  # NCCL_TESTS_FERROCCL_DIR: built against ferroccl's nccl.h and linked to its libnccl.so.
  local how dir
  for how in nvidia ferroccl; do
    dir="${NCCL_TESTS_DIR:-}"
    [ "$how" = ferroccl ] && dir="${NCCL_TESTS_FERROCCL_DIR:-}"
    [ -n "$dir" ] || continue
    for t in all_reduce broadcast reduce all_gather reduce_scatter alltoall sendrecv; do
      local exe="$dir/${t}_perf"
      [ -x "$exe" ] || { echo "## $t (built against $how's nccl.h): $exe missing" >>"$res/nccl-tests.txt"; continue; }
      log "nccl-tests ${t}_perf -g $ngpu (built against $how's nccl.h) on ferroccl's libnccl.so.2"
      cmdlog "LD_PRELOAD=target/release/libferroccl_nccl.so $exe -b 8 -e 64M -f 4 -g $ngpu -c 1"
      {
        echo "## $t (built against $how's nccl.h)"
        LD_PRELOAD="$shim" FERROCCL_DEBUG=INFO timeout 600 "$exe" -b 8 -e 64M -f 4 -g "$ngpu" -c 1 2>&1 || echo "exit $?"
      } >>"$res/nccl-tests.txt"
    done
  done
  if ! python3 -c 'import torch, torch.distributed' 2>/dev/null; then
    echo "skipped: python3 cannot import torch" >"$res/nccl-torch.txt"
    return
  fi
  log "PyTorch backend=nccl, $ngpu rank(s), on ferroccl's libnccl.so.2"
  cmdlog "LD_PRELOAD=target/release/libferroccl_nccl.so python3 <all_reduce with backend nccl, $ngpu ranks>"
  # mp.spawn starts each rank by importing the main script again: it must be a file.
  cat >"$res/nccl_torch.py" <<'EOF'
import os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
def rank_main(rank, n):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=n)
    x = torch.full((1 << 20,), float(rank + 1), device="cuda")
    dist.all_reduce(x)
    ok = bool((x == n * (n + 1) / 2).all())
    print(f"rank {rank}: nccl version {torch.cuda.nccl.version()}, all_reduce {'ok' if ok else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    if not ok:
        sys.exit(1)
if __name__ == "__main__":
    n = int(sys.argv[1])
    mp.spawn(rank_main, args=(n,), nprocs=n)
EOF
  LD_PRELOAD="$shim" timeout 600 python3 "$res/nccl_torch.py" "$ngpu" >"$res/nccl-torch.txt" 2>&1 ||
    echo "exit $?" >>"$res/nccl-torch.txt"
}

report() {
  log "report -> ${out_md#$root/}"
  python3 - "$res" "$out_md" "$root" <<'EOF'
import json, os, re, sys
res, out, root = sys.argv[1], sys.argv[2], sys.argv[3]
def read(name):
    p = os.path.join(res, name)
    return open(p).read() if os.path.exists(p) else None
lines = []
facts = read("facts.txt") or ""
sim = "simulated: yes" in facts
lines.append("# GPU validation" + (" (SIMULATED GPU: not a real device)" if sim else ""))
lines.append("")
lines.append("Written by `scripts/gpu-validate.sh` from what it ran on this machine; nothing here was")
shown = os.path.relpath(res, root) if os.path.abspath(res).startswith(os.path.abspath(root) + os.sep) else res
lines.append(f"edited by hand. Raw outputs were in `{shown}/`.")
lines.append("")
lines.append("## Machine")
lines += ["- " + l for l in facts.strip().splitlines()]
lines.append("")
suite = read("suite.txt")
def ctest_summary(txt):
    # "100% tests passed out of N" or "92% tests passed, 19 tests failed out of N"
    m = re.search(r"\d+% tests passed(?:, (\d+) tests failed)? out of (\d+)", txt or "")
    skipped = len(re.findall(r"\(Skipped\)|\*\*\*Skipped", txt or ""))
    failed = re.findall(r"^\s*\d+ - (\S+) \((Failed|Timeout|SEGFAULT|Subprocess aborted|Child aborted)\)", txt or "", re.M)
    return m, skipped, failed
if any(read(f) is not None for f in ("suite.txt", "suite-cuda-user.txt", "suite-device.txt")):
    lines.append("## C contract suite on this driver")
    for name, title in (("suite.txt", "every test (host memory, then device memory)"),
                        ("suite-cuda-user.txt", "host tests as programs that use CUDA"),
                        ("suite-device.txt", "the device tests alone")):
        txt = read(name)
        if txt is None:
            continue
        ph = "suite-device" if name == "suite-device.txt" else "suite"
        at = next((l[2:] for l in (read(f"commands-{ph}.txt") or "").splitlines() if l.startswith("# ")), "")
        if at:
            title += f" ({at})"
        m, skipped, failed = ctest_summary(txt)
        if m:
            total, nfail = int(m.group(2)), int(m.group(1) or 0)
            lines.append(f"- {title}: {total - nfail} of {total} passed, {nfail} failed, {skipped} skipped")
        else:
            lines.append(f"- {title}: no ctest summary (see the raw output)")
        for t, why in failed:
            lines.append(f"  - {t}: {why}")
    lines.append("")
benches = [(n, read(f"bench-np{n}.json")) for n in (1, 2, 4)]
if any(b for _, b in benches):
    lines.append("## ferroccl-bench --mem cuda")
    lines.append("")
    lines.append("| ranks | collective | time, smallest size (us) | busbw at 1 MiB (GB/s) | largest size | busbw there (GB/s) | #wrong |")
    lines.append("|---|---|---|---|---|---|---|")
    for n, b in benches:
        if not b:
            txt = read(f"bench-np{n}.txt") or ""
            lines.append(f"| {n} | (no results: {txt.strip().splitlines()[-1] if txt.strip() else 'did not run'}) | | | | | |")
            continue
        j = json.loads(b)
        by = {}
        for r in j["results"]:
            if r["placement"] != "out":
                continue
            by.setdefault(r["collective"], []).append(r)
        for coll, rs in by.items():
            rs.sort(key=lambda r: r["size_bytes"])
            small = next((r for r in rs if r["count"] > 0), rs[0])  # 8 B may be 0 elements per rank
            mib = next((r for r in rs if r["size_bytes"] >= 1 << 20), None)
            big = rs[-1]
            wrong = sum(r["wrong"] or 0 for r in j["results"] if r["collective"] == coll)
            lines.append(f"| {n} | {coll} | {small['time_us']:.1f} | {mib['busbw_GBps']:.2f} | "
                         f"{big['size_bytes']} | {big['busbw_GBps']:.2f} | {wrong} |" if mib else
                         f"| {n} | {coll} | {small['time_us']:.1f} | - | {big['size_bytes']} | {big['busbw_GBps']:.2f} | {wrong} |")
        devs = sorted({r.get("device", -1) for r in j["ranks"]})
        served = {}
        for l in (read(f"bench-np{n}.log") or "").splitlines():
            m = re.search(r" backend (.+?) [0-9.]+ us$", l)
            if m:
                served[m.group(1)] = served.get(m.group(1), 0) + 1
        if served:
            lines.append("")
            lines.append(f"{n} rank(s), calls by backend (FERROCCL_DEBUG=INFO): " +
                         ", ".join(f"{k}: {v}" for k, v in sorted(served.items())))
        lines.append(f"")
        lines.append(f"{n} rank(s): devices {devs}; out of bounds (sizes with wrong results): {j['out_of_bounds']}; "
                     f"{j['duration_s']:.0f} s")
        lines.append("")
pp = read("pingpong.txt")
if pp:
    lines.append("## Stream memory operations: a round trip between two processes on device 0")
    lines.append("")
    lines.append("bench/memop_pingpong.c, all rounds queued up front (the GPU's time, not the host's):")
    lines.append("")
    mps = read("pingpong-mps.txt")
    lines.append("| case | without MPS | with MPS |")
    lines.append("|---|---|---|")
    def cases(t):
        return {l.split(":")[0]: l.split(":", 1)[1].strip() for l in (t or "").splitlines() if " us per round trip" in l}
    a, b = cases(pp), cases(mps)
    for k in a:
        lines.append(f"| {k} | {a[k]} | {b.get(k, 'not measured')} |")
    if not a:
        lines.append(f"| (no result) | {pp.strip().splitlines()[-1] if pp.strip() else ''} | |")
    lines.append("")
startup = read("startup.txt")
if startup:
    t = {}
    mapped = {}
    for l in startup.splitlines():
        mode, us, m = l.split()
        t.setdefault(mode, []).append(int(us))
        mapped.setdefault(mode, set()).add(m)
    med = lambda v: sorted(v)[len(v) // 2]
    said = lambda mode: {"0": "not mapped", "1": "mapped"}.get("".join(sorted(mapped[mode])), "mapped in some runs")
    lines.append("## First call of a host-memory program")
    lines.append("")
    lines.append("Wall time of a one-rank program (init, one 8-byte all_reduce, destroy), median of 5:")
    if "host" in t:
        lines.append(f"- host-only program: {med(t['host']) / 1000:.1f} ms (libcuda {said('host')} at exit)")
    if "cuda_user" in t:
        lines.append(f"- the same program with a CUDA context made before main: {med(t['cuda_user']) / 1000:.1f} ms "
                     f"(libcuda {said('cuda_user')})")
    lines.append("")
cmp = read(os.path.join("compare", "device-compare.md"))
if cmp is not None:
    lines.append("## Side by side: bench/device_compare.sh")
    lines.append("")
    lines += ["#" + l if l.startswith("#") else l for l in cmp.strip().splitlines()]
    lines.append("")
elif read("compare.log") is not None:
    lines.append("## Side by side: bench/device_compare.sh")
    lines.append("")
    lines.append("No record: " + (read("compare.log").strip().splitlines() or ["it did not run"])[-1])
    lines.append("")
nt, tt = read("nccl-tests.txt"), read("nccl-torch.txt")
if nt is not None or tt is not None:
    lines.append("## NCCL programs on ferroccl's libnccl.so.2 (LD_PRELOAD)")
    lines.append("")
    lines.append("```")
    for l in (nt or "").splitlines():
        if l.startswith(("## ", "skipped", "exit ")) or "Out of bounds" in l or "Avg bus bandwidth" in l or "missing" in l:
            lines.append(l)
    lines += [l for l in (tt or "").splitlines() if l.startswith(("rank ", "skipped", "exit "))]
    lines.append("```")
    lines.append("")
lines.append("## Commands")
lines.append("")
lines.append("```")
for ph in ("suite", "suite-device", "bench", "compare", "pingpong", "startup", "nccl"):
    lines += [l for l in (read(f"commands-{ph}.txt") or "").splitlines() if l.strip()]
lines.append("```")
open(out, "w").write("\n".join(lines) + "\n")
print(f"wrote {out}")
EOF
}

# `report` alone writes the record of raw outputs brought from the GPU machine: the
# facts are that machine's, not this one's.
if [ "${phases[*]}" != report ] || [ ! -f "$res/facts.txt" ]; then facts; fi
for phase in "${phases[@]}"; do
  rm -f "$res/commands-$phase.txt"
  [ "$phase" = report ] || cmdlog "# $phase at commit $(commit_of), $(date -u '+%Y-%m-%d %H:%M UTC')"
  case "$phase" in
    suite) need_cmake; run_suite ;;
    suite-device) need_cmake; run_suite_device ;;
    bench) run_bench ;;
    compare) run_compare ;;
    pingpong) run_pingpong ;;
    startup) run_startup ;;
    nccl) run_nccl ;;
    report) report ;;
  esac
done
