#!/usr/bin/env bash
# The Python package as a user gets it (called by scripts/test.sh):
# 1. a fresh venv (build/py-fresh-venv, made anew each run) installs ./python with pip,
#    no FERROCCL_LIB / FERROCCL_RUN, and runs python/tests against the installed copy
#    (the library and ferroccl-run come from the package); the source tree must be left
#    without a build/ or egg-info;
# 2. torch's tests (the "ferroccl" torch.distributed backend under torchrun, DDP against
#    gloo, torch tensors of every dtype) in a venv with torch kept between runs under
#    ${FERROCCL_TORCH_VENV:-~/.cache/ferroccl/torch-venv} (torch from PyPI with its CUDA
#    wheels: about 4 GB on disk, 1-2 minutes to install once). If torch cannot be
#    installed, the torch tests skip and say why.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
quiet=(--quiet --disable-pip-version-check)
unset FERROCCL_LIB FERROCCL_RUN
export FERROCCL_TEST_INSTALLED=1 FERROCCL_TIMEOUT_MS="${FERROCCL_TIMEOUT_MS:-60000}"

fresh="$root/build/py-fresh-venv"
"$py" -m venv --clear "$fresh"
"$fresh/bin/python" -m pip install "${quiet[@]}" ./python pytest
left="$(git status --porcelain --ignored -- python | grep -E 'python/(build|.*\.egg-info)' || true)"
if [ -n "$left" ]; then
  echo "pip install ./python left build output in the source tree:" >&2
  echo "$left" >&2
  exit 1
fi
(cd "$root/build" && "$fresh/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/python/tests")

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
"$tv/bin/python" -m pip install "${quiet[@]}" --no-deps --force-reinstall ./python
(cd "$root/build" && "$tv/bin/python" -m pytest -q -rs -p no:cacheprovider \
  "$root/python/tests/test_torch.py" "$root/python/tests/test_interop.py")
