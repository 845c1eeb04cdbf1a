#!/usr/bin/env bash
# Installs what the tests and the benchmark need and is not on a fresh machine:
# a virtual environment in .venv with cmake (from PyPI), pytest, numpy and
# ml_dtypes (bfloat16 for the Python package tests).
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
command -v cargo >/dev/null || { echo "setup: cargo (the Rust toolchain) is required" >&2; exit 1; }
command -v cc >/dev/null || { echo "setup: a C compiler (cc) is required" >&2; exit 1; }
