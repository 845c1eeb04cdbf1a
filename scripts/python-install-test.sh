#!/usr/bin/env bash
# The Python package as a user gets it (called by scripts/test.sh):
# 1. scripts/wheel.sh: the sdist, the manylinux wheel built from it, installed into a
#    fresh venv with no cargo on PATH; the package tests, ferroccl-run, ferroccl-bench
#    and C/C++ builds against the wheel (build/wheel);
# 2. torch's tests (the "ferroccl" torch.distributed backend under torchrun, DDP against
#    gloo, torch tensors of every dtype) with that wheel, in a venv with torch kept
#    between runs under ${FERROCCL_TORCH_VENV:-~/.cache/ferroccl/torch-venv} (torch from
#    PyPI with its CUDA wheels: about 4 GB on disk, 1-2 minutes to install once). If
#    torch cannot be installed, the torch tests skip and say why.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
quiet=(--quiet --disable-pip-version-check)
unset FERROCCL_LIB FERROCCL_RUN
export FERROCCL_TEST_INSTALLED=1 FERROCCL_TIMEOUT_MS="${FERROCCL_TIMEOUT_MS:-60000}"

bash scripts/wheel.sh "$root/build/wheel"
whl="$(ls "$root"/build/wheel/dist/ferroccl-*manylinux*.whl)"

tv="${FERROCCL_TORCH_VENV:-$HOME/.cache/ferroccl/torch-venv}"
if [ ! -x "$tv/bin/python" ]; then
  "$py" -m venv "$tv"
fi
if ! "$tv/bin/python" -c "import torch, numpy, pytest, ninja" 2>/dev/null; then
  echo "python-install-test: installing torch (CPU use; PyPI's wheel) into $tv, kept for later runs" >&2
  if ! "$tv/bin/python" -m pip install "${quiet[@]}" torch numpy pytest ninja; then
    echo "python-install-test: torch could not be installed: its tests will skip" >&2
  fi
fi
"$tv/bin/python" -m pip install "${quiet[@]}" --no-deps --force-reinstall "$whl"
(cd "$root/build" && "$tv/bin/python" -m pytest -q -rs -p no:cacheprovider \
  "$root/python/tests/test_torch.py" "$root/python/tests/test_interop.py")
