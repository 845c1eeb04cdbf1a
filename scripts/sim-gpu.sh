#!/usr/bin/env bash
# Runs a command with the simulated CUDA driver and NVRTC (tools/simgpu) in place of the
# real ones: it loads as libcuda.so.1 / libnvrtc.so through LD_LIBRARY_PATH. See
# docs/sim-gpu.md for what it simulates and the FERROCCL_SIM_* variables.
#
#   scripts/sim-gpu.sh CMD [ARGS...]
#
# Builds the simulator first when cargo is available (machines without Rust use the
# library already built). Honours CARGO_TARGET_DIR (default: target/ in the repository).
set -euo pipefail

if [ "$#" -eq 0 ]; then
  echo "usage: $0 CMD [ARGS...]   (runs CMD on the simulated GPU; see docs/sim-gpu.md)" >&2
  exit 2
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
lib="$target/release/libferroccl_simgpu.so"

if command -v cargo >/dev/null 2>&1; then
  (cd "$root" && cargo build --release -q -p ferroccl-simgpu)
elif [ ! -e "$lib" ]; then
  echo "$0: no cargo to build the simulator and no $lib" >&2
  exit 1
fi

dir="$target/simgpu"
mkdir -p "$dir"
for name in libcuda.so.1 libcuda.so libnvrtc.so libnvrtc.so.13 libnvrtc.so.12; do
  ln -sfn ../release/libferroccl_simgpu.so "$dir/$name"
done

# A real NCCL (a GPU machine's) would be picked where ranks have devices of their own, and
# cannot run on the simulated driver: keep such runs on the built-in backend.
if [ -z "${FERROCCL_BACKEND:-}" ] && { ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; }; then
  echo "$0: a real libnccl.so.2 is installed; FERROCCL_BACKEND=host under the simulator" >&2
  export FERROCCL_BACKEND=host
fi

# Kernels the simulated NVRTC compiled (one shared object per source), kept between runs.
export FERROCCL_SIM_KERNEL_CACHE="${FERROCCL_SIM_KERNEL_CACHE:-$dir/kernels}"
export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FERROCCL_SIMGPU=1
exec "$@"
