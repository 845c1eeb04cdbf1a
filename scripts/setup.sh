#!/usr/bin/env bash
# Installs what the tests and the benchmark need and is not on a fresh machine:
# a virtual environment in .venv with cmake (from PyPI), pytest, numpy and
# ml_dtypes (bfloat16 for the Python package tests), and Open MPI's mpirun (apt-get).
# Idempotent and quiet when everything is already there. Source it or run it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
need=(cmake pytest numpy ml_dtypes)
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv (cmake, pytest, numpy from PyPI)" >&2
  python3 -m venv "$venv"
fi
missing=()
for m in "${need[@]}"; do
  case "$m" in
    cmake) [ -x "$venv/bin/cmake" ] || missing+=(cmake) ;;
    *) "$venv/bin/python" -c "import $m" 2>/dev/null || missing+=("$m") ;;
  esac
done
if [ ${#missing[@]} -gt 0 ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${missing[@]}" >&2
fi
# Open MPI's mpirun for tests/launchers/run.sh (Debian's openmpi-bin, as tools/compare
# installs it); where it cannot be installed, that test skips its mpirun part, saying so.
if ! command -v mpirun >/dev/null && command -v apt-get >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  echo "setup: installing Open MPI (apt-get install openmpi-bin)" >&2
  { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin; } >&2 ||
    echo "setup: could not install openmpi-bin: the mpirun launcher test will skip" >&2
fi
command -v cargo >/dev/null || { echo "setup: cargo (the Rust toolchain) is required" >&2; exit 1; }
command -v cc >/dev/null || { echo "setup: a C compiler (cc) is required" >&2; exit 1; }
