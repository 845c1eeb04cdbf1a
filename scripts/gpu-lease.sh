#!/usr/bin/env bash
# A short GPU lease (run on the GPU machine, after scripts/gpu-pack.sh here), in two calls:
#
#   bash scripts/gpu-lease.sh [--budget SECONDS] [--quick] [--out DIR]
#   bash scripts/gpu-lease.sh --deeper [--budget SECONDS] [PHASE...]
#
# First call (default budget 360 s, counted from this script's start): bench/gpu_lease.py
# measures, most important first, the device attribute profile, the path (backend,
# algorithm) of each collective, ferroccl side by side with the device's own copy and
# Gloo at 2 and 4 ranks sharing device 0 (64M, 256M; --quick: 1M, 4M), the time and
# host time per call at 8 B, 64 KiB, 1 MiB, the memop ping-pong (and, budget allowing,
# MPS), then issue 30's target table. Each line goes to OUT/lease.md (OUT: --out, else
# $OUT, else build/gpu-lease) the moment it is measured, raw outputs to OUT/raw/, so a
# call cut short still returns what it measured. Every part is time-boxed from what is
# left of the budget, or skipped with a line saying so. On any exit (signal included)
# every process it started is killed, and MPS stopped if and only if it started it.
#
# Second call, with what is left (--deeper; default budget 420 s): the older phases of
# scripts/gpu-validate.sh, in this order unless named: smoke (ferroccl-bench --mem cuda,
# 2 ranks, three collectives), suite-device, nccl (nccl-tests from .gpubin/nccl-tests
# built for this GPU against NVIDIA's and ferroccl's headers, PyTorch backend=nccl),
# startup, compare, bench, suite. A phase gets its usual limit or what is left, whichever
# is less, and is skipped when under 20 s is left. At the end `gpu-validate.sh report`
# writes docs/gpu-validation.md, and the record, the raw outputs and the log go to OUT.
set -uo pipefail
t0="$(date +%s.%N)"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
mode=lease
budget=""
quick=()
outdir=""
phases=()
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) budget="${2:?--budget needs seconds}"; shift 2 ;;
    --quick) quick=(--quick); shift ;;
    --out) outdir="${2:?--out needs a folder}"; shift 2 ;;
    --deeper) mode=deeper; shift ;;
    smoke|suite-device|nccl|startup|compare|bench|suite) phases+=("$1"); shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "gpu-lease: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$budget" in ''|*[!0-9]*) [ -z "$budget" ] || { echo "gpu-lease: --budget takes whole seconds" >&2; exit 2; } ;; esac
if [ "$mode" = lease ] && [ ${#phases[@]} -gt 0 ]; then
  echo "gpu-lease: phases (${phases[*]}) belong to --deeper" >&2; exit 2
fi
out="${outdir:-${OUT:-$root/build/gpu-lease}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

# ---------------------------------------------------------------- first call
if [ "$mode" = lease ]; then
  rundir="$(mktemp -d "${TMPDIR:-/tmp}/gpu-lease.XXXXXX")"
  py="$(command -v python3 || command -v python || true)"
  if [ -z "$py" ]; then
    echo "- gpu-lease.sh: no python3 on this machine: nothing measured" | tee -a "$out/lease.md"
    exit 1
  fi
  pid=""
  # Whatever the driver left: its child sessions (listed in $rundir/children) and MPS if
  # it started MPS ($rundir/mps-started). Waits on nothing but the driver, and that
  # for at most 15 s.
  finish() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill "-${1:-TERM}" "$pid" 2>/dev/null
      for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null
    fi
    if [ -s "$rundir/children" ]; then
      while read -r sid; do
        case "$sid" in ''|*[!0-9]*) continue ;; esac
        pkill -KILL -s "$sid" 2>/dev/null
      done <"$rundir/children"
    fi
    if [ -f "$rundir/mps-started" ]; then
      echo quit | timeout 15 nvidia-cuda-mps-control >/dev/null 2>&1
      echo "- gpu-lease.sh: stopped MPS, which this run had started" >>"$out/lease.md"
    fi
    rm -rf "$rundir"
  }
  on_signal() {
    trap - EXIT TERM INT HUP
    finish "$2"
    exit $((128 + $1))
  }
  trap 'on_signal 15 TERM' TERM
  trap 'on_signal 2 INT' INT
  trap 'on_signal 1 HUP' HUP
  trap finish EXIT
  FERROCCL_LEASE_T0="$t0" FERROCCL_LEASE_RUNDIR="$rundir" \
    "$py" bench/gpu_lease.py --out "$out" --budget "${budget:-360}" "${quick[@]}" &
  pid=$!
  # Only the driver: a signal ends this wait at once and runs the trap.
  wait "$pid"
  rc=$?
  pid=""
  # The driver ends with its own last line; a driver that was killed cannot.
  [ "$rc" = 0 ] || [ "$rc" = 143 ] || [ "$rc" = 130 ] || [ "$rc" = 129 ] ||
    echo "- gpu-lease.sh: bench/gpu_lease.py ended with exit $rc; the lines above are what it measured" >>"$out/lease.md"
  exit "$rc"
fi

# ---------------------------------------------------------------- second call (--deeper)
budget="${budget:-420}"
[ ${#phases[@]} -gt 0 ] || phases=(smoke suite-device nccl startup compare bench suite)
pack="$root/.gpubin"
[ -f "$pack/bin/libferroccl.so" ] || { echo "gpu-lease: run scripts/gpu-pack.sh first (no $pack/bin)" >&2; exit 1; }
log="$out/gpu-lease.log"
: >"$log"
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$log" >&2; }
left() { echo $(( budget - ($(date +%s) - t0) )); }
export PATH="/usr/local/cuda/bin:$PATH" FERROCCL_COMMIT="$(cat "$pack/commit" 2>/dev/null || echo unknown)"
gv=(bash scripts/gpu-validate.sh --bin "$pack/bin" --test-timeout 60)
mps_before=0
pgrep -x nvidia-cuda-mps-control >/dev/null 2>&1 && mps_before=1
nt_pid=""
cur=""
# On a signal: the phase running now and the nccl-tests build, then out.
deeper_stop() {
  trap - TERM INT HUP
  [ -n "$nt_pid" ] && pkill -TERM -P "$nt_pid" 2>/dev/null
  for p in $cur $nt_pid; do kill -TERM "$p" 2>/dev/null; done
  sleep 2
  for p in $cur $nt_pid; do kill -KILL "$p" 2>/dev/null; done
  say "stopped by a signal"
  exit 143
}
trap deeper_stop TERM INT HUP

# Runs "$@" for at most min(limit, what is left); waits on nothing but its own child.
boxed() {
  local name="$1" limit="$2"; shift 2
  local l; l=$(left)
  [ "$l" -lt "$limit" ] && limit="$l"
  if [ "$limit" -lt 20 ]; then say "$name: skipped, ${l}s of the budget left"; return; fi
  say "$name (at most ${limit}s)"
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1 &
  cur=$!
  wait "$cur"
  local rc=$?
  cur=""
  say "$name: exit $rc"
}

# nccl-tests, for this GPU's architecture only (minutes less than nccl-tests' default list).
if [[ " ${phases[*]} " == *" nccl "* ]] && [ -d "$pack/nccl-tests/src" ] && command -v nvcc >/dev/null; then
  cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)"
  gen="-gencode=arch=compute_${cc:-90},code=sm_${cc:-90}"
  mkdir -p "$pack/nvhome/lib"
  ln -sf "$(ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}')" "$pack/nvhome/lib/libnccl.so"
  (
    for h in nvidia ferroccl; do
      home="$pack/nvhome"; [ "$h" = ferroccl ] && home="$pack/ncclhome"
      [ -f "$home/include/nccl.h" ] || continue
      rm -rf "$pack/nccl-tests-$h-src" && cp -r "$pack/nccl-tests" "$pack/nccl-tests-$h-src"
      make -C "$pack/nccl-tests-$h-src/src" -j 8 -k MPI=0 NCCL_HOME="$home" NVCC_GENCODE="$gen" \
        BUILDDIR="$pack/nccl-tests-$h" >"$out/nccl-tests-build-$h.log" 2>&1
      echo "exit $?" >>"$out/nccl-tests-build-$h.log"
    done
  ) &
  nt_pid=$!
  say "nccl-tests building in the background for sm_${cc:-90}"
fi

for phase in "${phases[@]}"; do
  case "$phase" in
    smoke)
      for c in all_reduce all_to_all all_gather; do
        boxed "smoke $c" 30 "$pack/bin/ferroccl-bench" --nranks 2 --mem cuda -b 8 -e 64M -f 8 -c 1 "$c"
      done ;;
    suite-device) boxed suite-device 150 "${gv[@]}" suite-device ;;
    nccl)
      if [ -n "$nt_pid" ]; then
        # Only the build's own process: a bare `wait` would also wait on tee-like children.
        say "waiting for the nccl-tests build (at most 120 s)"
        for _ in $(seq 120); do kill -0 "$nt_pid" 2>/dev/null || break; sleep 1; done
        kill "$nt_pid" 2>/dev/null
      fi
      ntv=(); [ -x "$pack/nccl-tests-nvidia/all_reduce_perf" ] && ntv+=(NCCL_TESTS_DIR="$pack/nccl-tests-nvidia")
      [ -x "$pack/nccl-tests-ferroccl/all_reduce_perf" ] && ntv+=(NCCL_TESTS_FERROCCL_DIR="$pack/nccl-tests-ferroccl")
      boxed nccl 150 env "${ntv[@]}" "${gv[@]}" nccl ;;
    startup) boxed startup 40 "${gv[@]}" startup ;;
    compare) boxed compare 240 env GPU_VALIDATE_MAX_TIME=0.1 "${gv[@]}" compare ;;
    bench) boxed bench 120 "${gv[@]}" bench ;;
    suite) boxed suite 400 "${gv[@]}" suite ;;
  esac
done
# A comparison stopped mid-way can leave MPS running: stop it unless it ran before us.
if [ "$mps_before" = 0 ] && pgrep -x nvidia-cuda-mps-control >/dev/null 2>&1; then
  echo quit | timeout 15 nvidia-cuda-mps-control
fi
"${gv[@]}" report >>"$log" 2>&1
say "report written"
if [ -n "${OUT:-}" ]; then
  cp docs/gpu-validation.md "$OUT/" 2>/dev/null
  tar czf "$OUT/gpu-validation-raw.tgz" -C "$root" build/gpu-validation 2>/dev/null || true
fi
