#!/usr/bin/env bash
# Compiles every device kernel the library can generate with the real NVRTC (PyPI's
# nvidia-cuda-nvrtc wheel; no GPU needed), for sm_90, and fails on any error or warning
# (tests/nvrtc_kernels.rs). The wheel is kept under
# ${FERROCCL_NVRTC_DIR:-~/.cache/ferroccl/nvrtc}; when it cannot be installed the check
# is skipped, saying why. Called by scripts/test.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
dir="${FERROCCL_NVRTC_DIR:-$HOME/.cache/ferroccl/nvrtc}"
py="${PYTHON:-python3}"
find_lib() { { find "$dir" \( -name 'libnvrtc.so.1[0-9]' -o -name 'libnvrtc.so.1[0-9].*' \) 2>/dev/null || true; } | sort | head -1; }

lib="$(find_lib)"
if [ -z "$lib" ]; then
  echo "nvrtc-check: installing PyPI's nvidia-cuda-nvrtc into $dir (kept for later runs)" >&2
  rm -rf "$dir.part"
  for pkg in nvidia-cuda-nvrtc nvidia-cuda-nvrtc-cu12; do
    if "$py" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      --target "$dir.part" "$pkg" >&2; then
      rm -rf "$dir" && mv "$dir.part" "$dir"
      break
    fi
    rm -rf "$dir.part"
  done
  lib="$(find_lib)"
fi
if [ -z "$lib" ]; then
  echo "nvrtc-check: skipped: PyPI's nvidia-cuda-nvrtc wheel could not be installed (no libnvrtc to check the kernels with)"
  exit 0
fi
echo "nvrtc-check: $lib"
LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  cargo test --release --quiet --test nvrtc_kernels -- --ignored --nocapture
