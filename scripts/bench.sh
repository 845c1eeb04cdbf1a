#!/usr/bin/env bash
# Builds ferroccl (make's build) and runs its benchmark: all_reduce over 4 local ranks (processes)
# on host memory, unless other arguments are given (they go to ferroccl-bench).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
command -v cargo >/dev/null || { echo "bench: cargo (the Rust toolchain) is required" >&2; exit 1; }
# The whole default build (the launcher, the benchmark, the libraries with the NCCL one).
cargo build --release --quiet
if [ $# -eq 0 ]; then set -- --nranks 4 all_reduce; fi
exec "$root/target/release/ferroccl-bench" "$@"
