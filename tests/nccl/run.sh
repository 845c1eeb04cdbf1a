#!/usr/bin/env bash
# NCCL's ABI on ferroccl: libferroccl_nccl.so (SONAME libnccl.so.2) and its nccl.h,
# proven against NVIDIA's library and with programs written for NCCL:
#   1. NVIDIA's NCCL 2.28 (the nvidia-nccl-cu13 2.28.9 wheel, downloaded from PyPI into
#      build/nccl-reference, or FERROCCL_NCCL_REFERENCE=<dir with include/nccl.h and
#      lib/libnccl.so.2>) exports exactly nccl/nccl-2.28.symbols, and its nccl.h and ours
#      agree on every function's type, the struct layouts and every value (a C++ program
#      built against each prints them). Skipped, saying why, when it cannot be had.
#   2. make install into a temporary prefix; tests/nccl/nccl_style.c (nccl-tests' style:
#      weak declarations, a weak ncclGetLastError fallback, dlsym probes) is built against
#      the installed header with -L<prefix>/lib/ferroccl -lnccl and run on host memory:
#      1 rank, 2-4 threads (ncclCommInitRank), one thread driving 4 ranks of
#      ncclCommInitAll and 3 of ncclCommInitRank inside a group, and 2-4 processes
#      (ferroccl-run -n N).
#      NCCL_DEBUG and NCCL_DEBUG_FILE set ferroccl's log when FERROCCL_DEBUG is unset.
#      tests/nccl/pg_replay.c replays PyTorch's ProcessGroupNCCL (config init, split,
#      batched send/recv, PREMUL_SUM, a watchdog thread polling ncclCommGetAsyncError
#      that aborts a hung all_reduce) at 2 and 4 ranks, threads and processes,
#      blocking and non-blocking, on host memory and on CUDA memory with every rank on
#      one simulated GPU (--device; processes post their device calls, and once more
#      with FERROCCL_CHECK=1, where every call is agreed first).
#      tests/nccl/shrink.c calls ncclCommShrink as PyTorch's shrink_group does.
#      tests/nccl/premul_device.c runs PreMulSum on device memory on the simulated GPU.
#      tests/nccl/graph_capture.c calls ncclAllReduce inside CUDA graph capture on the
#      simulated GPU: ncclInvalidUsage naming the capture, the capture still valid.
#   3. The same program linked against a stand-in libnccl.so.2 whose functions all fail:
#      it fails alone, and passes with LD_PRELOAD=libferroccl_nccl.so and nothing else.
# Usage: tests/nccl/run.sh [LIBDIR]   (default $CARGO_TARGET_DIR/release or target/release)
# Environment: KEEP=1 keeps the temporary tree. Last line: `nccl: N passed, M failed`.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/tests/nccl"
libdir="${1:-${CARGO_TARGET_DIR:-$root/target}/release}"
shim="$libdir/libferroccl_nccl.so"
run_bin="$libdir/ferroccl-run"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/ferroccl-nccl.XXXXXX")"
if [ "${KEEP:-0}" = 1 ]; then echo "nccl: keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
passed=0 failed=0 skipped=0
cc="${CC:-cc}" cxx="${CXX:-c++}"

ok() { passed=$((passed + 1)); echo "  ok    $*"; }
bad() { failed=$((failed + 1)); echo "  FAIL  $*"; }
skip() { skipped=$((skipped + 1)); echo "  skip  $*"; }
run() {  # run NAME LOG CMD...: pass when CMD exits 0; the log's tail on failure
  local name="$1" log="$2"; shift 2
  if timeout 300 "$@" >"$log" 2>&1; then ok "$name"; return 0; fi
  bad "$name (exit $?; $log):"; sed 's/^/        /' "$log" | tail -30; return 1
}
finish() {
  [ "$skipped" -gt 0 ] && echo "nccl: $skipped skipped (see above)"
  echo "nccl: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}

for f in "$shim" "$run_bin"; do [ -f "$f" ] || { bad "$f not found (cargo build --release)"; finish; }; done
echo "nccl: $shim"
want="$tmp/want.syms"
grep -v '^#' "$root/nccl/nccl-2.28.symbols" | sed '/^$/d' | LC_ALL=C sort >"$want"

# ------------------------------------------------------------------ 1. NVIDIA's NCCL 2.28
ref="${FERROCCL_NCCL_REFERENCE:-}"
if [ -z "$ref" ]; then
  cache="$root/build/nccl-reference"
  if [ ! -f "$cache/nvidia/nccl/lib/libnccl.so.2" ]; then
    mkdir -p "$cache"
    py="$(command -v python3 || command -v python || true)"
    if [ -n "$py" ] && timeout 300 "$py" -m pip download --quiet --no-deps --only-binary=:all: \
         --dest "$cache" "nvidia-nccl-cu13==2.28.9" >"$tmp/pip.log" 2>&1; then
      "$py" -m zipfile -e "$cache"/nvidia_nccl_cu13-2.28.9-*.whl "$cache" >/dev/null 2>&1
      rm -f "$cache"/*.whl
    fi
  fi
  [ -f "$cache/nvidia/nccl/lib/libnccl.so.2" ] && ref="$cache/nvidia/nccl"
fi
if [ -z "$ref" ] || [ ! -f "$ref/lib/libnccl.so.2" ] || [ ! -f "$ref/include/nccl.h" ]; then
  why="$(tail -1 "$tmp/pip.log" 2>/dev/null)"
  skip "comparison with NVIDIA's NCCL 2.28: nvidia-nccl-cu13==2.28.9 could not be downloaded${why:+ ($why)}"
else
  nm -D --defined-only "$ref/lib/libnccl.so.2" | awk 'NF >= 3 { print $3 }' | LC_ALL=C sort >"$tmp/real.syms"
  if cmp -s "$want" "$tmp/real.syms"; then
    ok "NVIDIA's libnccl.so.2 exports exactly nccl/nccl-2.28.symbols ($(wc -l <"$want") symbols)"
  else
    bad "NVIDIA's libnccl.so.2 and nccl/nccl-2.28.symbols differ (< list only, > NVIDIA only):"
    diff "$want" "$tmp/real.syms" | grep '^[<>]' | head -20 | sed 's/^/        /'
  fi
  # Every function of both headers, by its C++ type; the layouts; every value.
  mkdir -p "$tmp/cudastub"
  printf '#include <stddef.h>\ntypedef struct CUstream_st* cudaStream_t;\n' >"$tmp/cudastub/cuda_runtime.h"
  : >"$tmp/cudastub/cuda_fp16.h"
  cat "$ref/include/nccl.h" "$root/include/ferroccl/nccl.h" |
    sed -nE 's/^(ncclResult_t|const char\*|void) +(p?nccl[A-Za-z]+)\(.*/\2/p' | LC_ALL=C sort -u >"$tmp/funcs"
  {
    echo '#include <nccl.h>'
    echo '#include <cstddef>'
    echo '#include <cstdio>'
    echo '#include <typeinfo>'
    echo '#define F(f) std::printf("%s %s\n", #f, typeid(f).name())'
    echo '#define V(v) std::printf("%s %lld\n", #v, static_cast<long long>(v))'
    echo '#define O(s, m) std::printf("offsetof(%s, %s) %zu\n", #s, #m, offsetof(s, m))'
    echo 'int main() {'
    sed 's/.*/  F(&);/' "$tmp/funcs"
    for m in size magic version blocking cgaClusterSize minCTAs maxCTAs netName splitShare trafficClass \
             commName collnetEnable CTAPolicy shrinkShare nvlsCTAs nChannelsPerNetPeer nvlinkCentricSched; do
      echo "  O(ncclConfig_t, $m);"
    done
    for m in size magic version estimatedTime; do echo "  O(ncclSimInfo_t, $m);"; done
    echo '  V(sizeof(ncclConfig_t)); V(sizeof(ncclSimInfo_t)); V(sizeof(ncclUniqueId)); V(sizeof(ncclRedOp_t));'
    echo '  { ncclConfig_t c = NCCL_CONFIG_INITIALIZER; V(c.size); V(c.magic); V(c.version); V(c.blocking); V(c.CTAPolicy); }'
    echo '  { ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER; V(s.magic); V(s.version); V(s.estimatedTime); }'
    for v in ncclSuccess ncclUnhandledCudaError ncclSystemError ncclInternalError ncclInvalidArgument \
             ncclInvalidUsage ncclRemoteError ncclInProgress ncclNumResults ncclSum ncclProd ncclMax ncclMin \
             ncclAvg ncclNumOps ncclMaxRedOp ncclInt8 ncclChar ncclUint8 ncclInt32 ncclInt ncclUint32 ncclInt64 \
             ncclUint64 ncclFloat16 ncclHalf ncclFloat32 ncclFloat ncclFloat64 ncclDouble ncclBfloat16 \
             ncclFloat8e4m3 ncclFloat8e5m2 ncclNumTypes ncclScalarDevice ncclScalarHostImmediate \
             NCCL_MAJOR NCCL_MINOR NCCL_PATCH NCCL_VERSION_CODE NCCL_UNIQUE_ID_BYTES NCCL_CONFIG_UNDEF_INT \
             NCCL_SPLIT_NOCOLOR NCCL_WIN_DEFAULT NCCL_WIN_COLL_SYMMETRIC NCCL_WIN_REQUIRED_ALIGNMENT \
             NCCL_CTA_POLICY_DEFAULT NCCL_CTA_POLICY_EFFICIENCY NCCL_CTA_POLICY_ZERO NCCL_SHRINK_DEFAULT \
             NCCL_SHRINK_ABORT NCCL_REVOKE_DEFAULT 'NCCL_VERSION(2, 8, 4)' 'NCCL_VERSION(2, 28, 9)'; do
      echo "  V($v);"
    done
    echo '  return 0;'
    echo '}'
  } >"$tmp/facts.cpp"
  facts() {  # facts NAME INCLUDE_DIRS...
    local name="$1"; shift
    "$cxx" -std=c++11 -Wno-deprecated-declarations "$@" "$tmp/facts.cpp" -o "$tmp/facts-$name" \
      >"$tmp/facts-$name.log" 2>&1 && "$tmp/facts-$name" >"$tmp/facts-$name.txt"
  }
  if ! facts nvidia -I"$ref/include" -I"$tmp/cudastub"; then
    bad "the facts program does not build against NVIDIA's nccl.h:"; tail -20 "$tmp/facts-nvidia.log" | sed 's/^/        /'
  elif ! facts ours -I"$root/include/ferroccl" -DFERROCCL_NCCL_NO_CUDA_RUNTIME; then
    bad "the facts program does not build against ferroccl's nccl.h:"; tail -20 "$tmp/facts-ours.log" | sed 's/^/        /'
  elif cmp -s "$tmp/facts-nvidia.txt" "$tmp/facts-ours.txt"; then
    nf="$(wc -l <"$tmp/funcs")"
    ok "nccl.h: NVIDIA's and ours agree on $nf functions' types, the layouts and $(($(wc -l <"$tmp/facts-ours.txt") - nf)) values"
  else
    bad "nccl.h: NVIDIA's and ours differ (< NVIDIA, > ours):"
    diff "$tmp/facts-nvidia.txt" "$tmp/facts-ours.txt" | grep '^[<>]' | head -20 | sed 's/^/        /'
  fi
fi

# ------------------------------------------------------------------ 2. installed, -lnccl
prefix="$tmp/prefix"
if ! run "make install PREFIX=<tmp>" "$tmp/install.log" make -C "$root" install PREFIX="$prefix"; then finish; fi
flags=(-std=c99 -Wall -Wextra -Wpedantic -Werror -I"$prefix/include/ferroccl")
exe="$tmp/nccl_style"
if run "nccl_style.c: cc -I<prefix>/include/ferroccl -L<prefix>/lib/ferroccl -lnccl" "$tmp/build.log" \
       "$cc" "${flags[@]}" "$here/nccl_style.c" -o "$exe" -L"$prefix/lib/ferroccl" -lnccl \
       -Wl,-rpath,"$prefix/lib/ferroccl" -lpthread -ldl -lm; then
  run "nccl_style: 1 rank" "$tmp/r1.log" "$exe"
  for n in 2 3 4; do run "nccl_style: $n ranks as threads (ncclCommInitRank)" "$tmp/t$n.log" "$exe" --threads $n; done
  run "nccl_style: 4 ranks of ncclCommInitAll, one thread, groups" "$tmp/a4.log" "$exe" --initall 4
  run "nccl_style: 3 ranks of ncclCommInitRank in a group, one thread" "$tmp/g3.log" "$exe" --group 3
  for n in 2 3 4; do run "nccl_style: ferroccl-run -n $n (processes)" "$tmp/p$n.log" "$run_bin" -n $n "$exe"; done
  # ProcessGroupNCCL's call pattern (tests/nccl/pg_replay.c), blocking and non-blocking.
  pexe="$tmp/pg_replay"
  if run "pg_replay.c (ProcessGroupNCCL's calls): cc ... -lnccl" "$tmp/pbuild.log" \
         "$cc" "${flags[@]}" "$here/pg_replay.c" -o "$pexe" -L"$prefix/lib/ferroccl" -lnccl \
         -Wl,-rpath,"$prefix/lib/ferroccl" -lpthread -ldl; then
    for mode in "" --nonblocking; do
      for n in 2 4; do
        run "pg_replay $n ranks as threads ${mode:-blocking}" "$tmp/pg-t$n$mode.log" "$pexe" --threads $n $mode
        run "pg_replay ferroccl-run -n $n ${mode:-blocking}" "$tmp/pg-p$n$mode.log" "$run_bin" -n $n "$pexe" $mode
      done
    done
    # The same on CUDA memory, every rank on one simulated GPU (torchrun on a one-GPU box).
    for mode in "" --nonblocking; do
      for n in 2 4; do
        for how in threads processes; do
          log="$tmp/pg-dev-$how$n$mode.log"
          if [ $how = threads ]; then
            FERROCCL_SIM_DEVICES=1 timeout 300 bash "$root/scripts/sim-gpu.sh" "$pexe" --threads $n --device $mode >"$log" 2>&1
          else
            FERROCCL_SIM_DEVICES=1 timeout 300 bash "$root/scripts/sim-gpu.sh" "$run_bin" -n $n "$pexe" --device $mode >"$log" 2>&1
          fi
          case $? in
            0) ok "pg_replay on one simulated GPU: $n ranks as $how, ${mode:-blocking}, device buffers" ;;
            77) skip "pg_replay on a simulated GPU: none ($(tail -1 "$log"))" ;;
            *) bad "pg_replay on one simulated GPU: $n ranks as $how ${mode:-blocking} ($log):"; tail -20 "$log" | sed 's/^/        /' ;;
          esac
        done
      done
    done
    # Processes above post their device calls (NCCL's contract); FERROCCL_CHECK=1 agrees
    # on each first, and the skipped all_reduce then blocks until the abort.
    log="$tmp/pg-dev-check1.log"
    FERROCCL_CHECK=1 FERROCCL_SIM_DEVICES=1 timeout 300 bash "$root/scripts/sim-gpu.sh" "$run_bin" -n 2 "$pexe" --device >"$log" 2>&1
    case $? in
      0) ok "pg_replay on one simulated GPU: 2 processes, FERROCCL_CHECK=1 (calls agreed), device buffers" ;;
      77) skip "pg_replay on a simulated GPU: none ($(tail -1 "$log"))" ;;
      *) bad "pg_replay on one simulated GPU: 2 processes, FERROCCL_CHECK=1 ($log):"; tail -20 "$log" | sed 's/^/        /' ;;
    esac
  fi
  # ncclCommShrink as PyTorch's shrink_group calls it (tests/nccl/shrink.c).
  sexe="$tmp/shrink"
  if run "shrink.c (ncclCommShrink): cc ... -lnccl" "$tmp/sbuild.log" \
         "$cc" "${flags[@]}" "$here/shrink.c" -o "$sexe" -L"$prefix/lib/ferroccl" -lnccl \
         -Wl,-rpath,"$prefix/lib/ferroccl" -lpthread -ldl; then
    for mode in "" --nonblocking; do
      for n in 2 4; do
        run "shrink $n ranks as threads ${mode:-blocking}" "$tmp/sh-t$n$mode.log" "$sexe" --threads $n $mode
        run "shrink ferroccl-run -n $n ${mode:-blocking}" "$tmp/sh-p$n$mode.log" "$run_bin" -n $n "$sexe" $mode
      done
    done
  fi
  # PreMulSum on device memory, on the simulated GPU (2 devices; 1 for 4 ranks on one).
  dexe="$tmp/premul_device"
  if run "premul_device.c: cc ... -lnccl" "$tmp/dbuild.log" \
         "$cc" "${flags[@]}" "$here/premul_device.c" -o "$dexe" -L"$prefix/lib/ferroccl" -lnccl \
         -Wl,-rpath,"$prefix/lib/ferroccl" -lpthread -ldl; then
    for spec in "2 2" "2 4" "1 4"; do
      set -- $spec
      log="$tmp/pd-$1-$2.log"
      FERROCCL_DEBUG=INFO FERROCCL_SIM_DEVICES=$1 timeout 300 bash "$root/scripts/sim-gpu.sh" "$dexe" "$2" >"$log" 2>&1
      case $? in
        0) ok "premul_device: $2 ranks on $1 simulated GPUs (ncclScalarDevice, device buffers)" ;;
        77) skip "premul_device: no simulated GPU ($(tail -1 "$log"))" ;;
        *) bad "premul_device: $2 ranks on $1 simulated GPUs ($log):"; tail -20 "$log" | sed 's/^/        /' ;;
      esac
    done
    # Ranks sharing one GPU: the products are shareable device memory, so both PreMulSum
    # calls of every rank went GPU to GPU, none through host staging.
    served=$(grep -cE 'seq [0-9]+ fccl(AllReduce|ReduceScatter) count 23 .* backend ipc ' "$tmp/pd-1-4.log")
    if [ "$served" = 8 ]; then
      ok "premul_device: 4 ranks on one simulated GPU: every PreMulSum call served GPU to GPU (backend ipc)"
    else
      bad "premul_device: 4 ranks on one simulated GPU: $served of 8 PreMulSum calls served by backend ipc ($tmp/pd-1-4.log)"
    fi
  fi
  # ncclAllReduce inside graph capture: refused on every rank alike, the capture intact
  # (ranks sharing one simulated GPU, and on two, staged).
  gexe="$tmp/graph_capture"
  if run "graph_capture.c: cc ... -lnccl" "$tmp/gbuild.log" \
         "$cc" "${flags[@]}" "$here/graph_capture.c" -o "$gexe" -L"$prefix/lib/ferroccl" -lnccl \
         -Wl,-rpath,"$prefix/lib/ferroccl" -lpthread -ldl; then
    for spec in "1 2" "1 4" "2 2"; do
      set -- $spec
      log="$tmp/gc-$1-$2.log"
      FERROCCL_SIM_DEVICES=$1 timeout 300 bash "$root/scripts/sim-gpu.sh" "$gexe" "$2" >"$log" 2>&1
      case $? in
        0) ok "graph_capture: $2 ranks on $1 simulated GPUs (ncclAllReduce inside capture: ncclInvalidUsage)" ;;
        77) skip "graph_capture: no simulated GPU ($(tail -1 "$log"))" ;;
        *) bad "graph_capture: $2 ranks on $1 simulated GPUs ($log):"; tail -20 "$log" | sed 's/^/        /' ;;
      esac
    done
  fi
  # NCCL's logging variables stand in for ferroccl's, which win when set.
  if NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$tmp/nccl-debug.%p" timeout 60 "$exe" --threads 2 >"$tmp/dbg.log" 2>&1 &&
     grep -qs 'Info: rank 1/2 joined' "$tmp"/nccl-debug.*; then
    ok "NCCL_DEBUG=INFO NCCL_DEBUG_FILE=<file>.%p: ferroccl's INFO log in that file"
  else
    bad "NCCL_DEBUG=INFO NCCL_DEBUG_FILE=<file>.%p left no INFO log ($tmp/dbg.log)"
  fi
  if FERROCCL_DEBUG=WARN NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$tmp/warn-debug.%p" timeout 60 "$exe" --threads 2 \
       >"$tmp/dbg2.log" 2>&1 && ! grep -qs 'Info:' "$tmp"/warn-debug.*; then
    ok "FERROCCL_DEBUG=WARN wins over NCCL_DEBUG=INFO"
  else
    bad "FERROCCL_DEBUG=WARN did not win over NCCL_DEBUG=INFO ($tmp/dbg2.log)"
  fi
fi

# ------------------------------------------------------------------ 3. a binary built for another libnccl.so.2
sd="$tmp/standin"
mkdir -p "$sd"
{
  echo '/* A stand-in libnccl.so.2: every function fails. */'
  while read -r f; do
    case "$f" in
      ncclGetErrorString|ncclGetLastError|pncclGetErrorString|pncclGetLastError) echo "const char* $f() { return \"stand-in\"; }" ;;
      *) echo "int $f() { return 3; }" ;;
    esac
  done <"$want"
} >"$sd/standin.c"
if run "stand-in libnccl.so.2 (all calls fail) builds" "$tmp/standin.log" \
       "$cc" -shared -fPIC -w -Wl,-soname,libnccl.so.2 "$sd/standin.c" -o "$sd/libnccl.so.2"; then
  ln -sf libnccl.so.2 "$sd/libnccl.so"
  sexe="$tmp/nccl_style_standin"
  if run "nccl_style linked against the stand-in" "$tmp/sbuild.log" \
         "$cc" "${flags[@]}" "$here/nccl_style.c" -o "$sexe" -L"$sd" -lnccl -Wl,-rpath,"$sd" -lpthread -ldl -lm; then
    if timeout 60 "$sexe" --threads 2 >"$tmp/s-alone.log" 2>&1; then
      bad "nccl_style on the stand-in alone should fail"
    else
      ok "nccl_style on the stand-in alone fails (it is the library the binary loads)"
    fi
    run "nccl_style on the stand-in with LD_PRELOAD=libferroccl_nccl.so: 2 threads" "$tmp/s-t2.log" \
        env LD_PRELOAD="$shim" "$sexe" --threads 2
    run "nccl_style on the stand-in with LD_PRELOAD=libferroccl_nccl.so: ferroccl-run -n 3" "$tmp/s-p3.log" \
        "$run_bin" -n 3 env LD_PRELOAD="$shim" "$sexe"
  fi
fi

finish
