#!/usr/bin/env bash
# The side-by-side device comparison in one command: ferroccl with ranks sharing one
# GPU, the device's own copy, torch.distributed's Gloo on the same CUDA tensors and the
# stream memory-operation ping-pong, against issue 30's targets (bench/device_compare.py
# says what it runs and how it reads the targets). Builds ferroccl-bench first where
# cargo is here and it is missing; torch comes from the first Python that imports it
# (FERROCCL_TORCH_PYTHON, ~/.cache/ferroccl/torch-venv, bench/compare/.venv, python3),
# and without one the torch parts are skipped, saying so.
#
#   bench/device_compare.sh                       # GPU: 2 and 4 ranks, 8 B .. 128 MiB
#   bench/device_compare.sh --device cpu -e 64K   # the same on the CPU (CI's smoke)
#   bench/device_compare.sh --help
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case " $* " in
  *" --bin "* | *" -h "* | *" --help "* | *" --selftest "*) ;;
  *) if [ ! -x "$root/target/release/ferroccl-bench" ] && command -v cargo >/dev/null; then
       (cd "$root" && cargo build --release --quiet)
     fi ;;
esac
exec python3 "$root/bench/device_compare.py" "$@"
