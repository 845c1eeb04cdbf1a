#!/usr/bin/env bash
# Packs what a short GPU lease needs into .gpubin/ (ignored by git, carried by the lease):
#
#   scripts/gpu-pack.sh [--nccl-tests SRC]
#
# - bin/: libferroccl.so, libferroccl_nccl.so, ferroccl-run, ferroccl-bench from a fresh
#   `cargo build --release`, without debug info (a lease carries at most 64 MiB), and
#   memop_pingpong (bench/memop_pingpong.c; the lease compiles it there when this is absent);
# - commit: the commit they were built from (the lease's copy of .git may be older);
# - nvhome/include: NVIDIA's nccl.h and device-API headers of the version ferroccl mirrors
#   (from the nvidia-nccl-cu13 wheel that tests/nccl/run.sh downloads), to build nccl-tests
#   as NVIDIA's users do; ncclhome/: ferroccl's nccl.h (with those device-API headers
#   beside it, which ferroccl does not ship) and libnccl.so, to build it against ferroccl;
# - nccl-tests/: the nccl-tests source tree SRC (a checkout; GPU machines reach no network).
#
# Then, on the GPU machine: scripts/gpu-lease.sh (see there; it also needs bench/*.py,
# tools/compare/gloo_bench.py and tools/simgpu/capture-profile.py with its profile, which
# travel with the working tree). Nothing here needs a GPU.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
nt_src=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nccl-tests) nt_src="$(realpath "$2")"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu-pack: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
pack="$root/.gpubin"
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpubin/' "$exclude" 2>/dev/null || echo '/.gpubin/' >>"$exclude"
cargo build --release --quiet
rm -rf "$pack/bin" "$pack/ncclhome" "$pack/nvhome"
mkdir -p "$pack/bin" "$pack/ncclhome/include" "$pack/ncclhome/lib"
for f in libferroccl.so libferroccl_nccl.so ferroccl-run ferroccl-bench; do
  strip --strip-debug -o "$pack/bin/$f" "target/release/$f"
done
cc -O2 -Wall bench/memop_pingpong.c -o "$pack/bin/memop_pingpong" -ldl
git rev-parse --short HEAD >"$pack/commit"
git diff --quiet HEAD -- || echo "gpu-pack: the tree has uncommitted changes; the record will name $(cat "$pack/commit")" >&2
cp include/ferroccl/nccl.h "$pack/ncclhome/include/"
cp "$pack/bin/libferroccl_nccl.so" "$pack/ncclhome/lib/libnccl.so"
# NVIDIA's headers, from the wheel tests/nccl/run.sh unpacks into build/nccl-reference.
ref="$root/build/nccl-reference/nvidia/nccl"
if [ ! -f "$ref/include/nccl.h" ]; then
  ver="$(sed -n 's/.*"nvidia-nccl-cu13==\([0-9.]*\)".*/\1/p' tests/nccl/run.sh | head -1)"
  mkdir -p build/nccl-reference
  if python3 -m pip download -q --no-deps --only-binary=:all: --dest build/nccl-reference \
       "nvidia-nccl-cu13==${ver:?no version in tests/nccl/run.sh}"; then
    python3 -m zipfile -e build/nccl-reference/nvidia_nccl_cu13-"$ver"-*.whl build/nccl-reference >/dev/null
    rm -f build/nccl-reference/*.whl
  fi
fi
if [ -f "$ref/include/nccl.h" ]; then
  mkdir -p "$pack/nvhome"
  cp -r "$ref/include" "$pack/nvhome/"
  cp -r "$ref/include/nccl_device.h" "$ref/include/nccl_device" "$pack/ncclhome/include/"
else
  echo "gpu-pack: NVIDIA's headers could not be had; nccl-tests will build against ferroccl's only" >&2
fi
if [ -n "$nt_src" ]; then
  case "$nt_src/" in "$pack"/*) echo "gpu-pack: --nccl-tests must lie outside $pack" >&2; exit 2 ;; esac
  [ -f "$nt_src/src/common.cu" ] || { echo "gpu-pack: $nt_src is not an nccl-tests tree (no src/common.cu)" >&2; exit 2; }
  rm -rf "$pack/nccl-tests"
  mkdir -p "$pack/nccl-tests"
  (cd "$nt_src" && tar -c --exclude=.git --exclude=build .) | tar -x -C "$pack/nccl-tests"
fi
du -sh "$pack"
echo "gpu-pack: now call the device tool's run with carry [\".gpubin\"] and: bash scripts/gpu-lease.sh (at most 360 s;"
echo "  then, with what is left: bash scripts/gpu-lease.sh --deeper --budget SECONDS [PHASE...])"
