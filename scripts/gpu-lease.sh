#!/usr/bin/env bash
# Every GPU check that fits a short lease, most valuable first, each phase time-boxed so
# that one hang cannot take the rest (run on the GPU machine, after scripts/gpu-pack.sh
# here):
#
#   bash scripts/gpu-lease.sh [--budget SECONDS] [PHASE...]
#
# Phases, in this order unless named: smoke (ferroccl-bench --mem cuda, 2 ranks, three
# collectives), suite-device, nccl (nccl-tests from .gpubin/nccl-tests built for this
# GPU against NVIDIA's and ferroccl's headers, PyTorch backend=nccl), startup, compare,
# bench, suite. The budget (default 420 s) is shared: a phase gets its usual limit or
# what is left, whichever is less, and is skipped when under 20 s is left. nccl-tests
# build in the background from the start. At the end `gpu-validate.sh report` writes
# docs/gpu-validation.md, and the record, the raw outputs and this log go to $OUT (the
# device tool's folder) when it is set.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
budget=420
phases=()
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) budget="$2"; shift 2 ;;
    smoke|suite-device|nccl|startup|compare|bench|suite) phases+=("$1"); shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "gpu-lease: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#phases[@]} -gt 0 ] || phases=(smoke suite-device nccl startup compare bench suite)
pack="$root/.gpubin"
[ -f "$pack/bin/libferroccl.so" ] || { echo "gpu-lease: run scripts/gpu-pack.sh first (no $pack/bin)" >&2; exit 1; }
out="${OUT:-$root/build/gpu-lease}"
mkdir -p "$out"
log="$out/gpu-lease.log"
: >"$log"
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$log" >&2; }
left() { echo $(( budget - ($(date +%s) - t0) )); }
export PATH="/usr/local/cuda/bin:$PATH" FERROCCL_COMMIT="$(cat "$pack/commit" 2>/dev/null || echo unknown)"
gv=(bash scripts/gpu-validate.sh --bin "$pack/bin" --test-timeout 60)
res="$root/build/gpu-validation"

# Runs "$@" for at most min(limit, what is left); never waits on anything else.
boxed() {
  local name="$1" limit="$2"; shift 2
  local l; l=$(left)
  [ "$l" -lt "$limit" ] && limit="$l"
  if [ "$limit" -lt 20 ]; then say "$name: skipped, ${l}s of the budget left"; return; fi
  say "$name (at most ${limit}s)"
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  say "$name: exit $?"
}

# nccl-tests, for this GPU's architecture only (minutes less than nccl-tests' default list).
nt_pid=""
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
# A comparison stopped mid-way can leave MPS running.
pgrep -f nvidia-cuda-mps-control >/dev/null && echo quit | nvidia-cuda-mps-control
"${gv[@]}" report >>"$log" 2>&1
say "report written"
if [ -n "${OUT:-}" ]; then
  cp docs/gpu-validation.md "$OUT/" 2>/dev/null
  tar czf "$OUT/gpu-validation-raw.tgz" -C "$root" build/gpu-validation 2>/dev/null
fi
