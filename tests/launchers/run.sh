#!/usr/bin/env bash
# fcclCommInitFromEnv under real launchers, with the C contract suite's binaries
# (Slurm and PMI, which cannot run here, are covered by tests/launcher.rs by hand):
#   1. Open MPI's mpirun -np 3 with -x FERROCCL_ROOT_ADDR, with -x FERROCCL_SECRET and
#      without it (the secret then comes from PMIX_NAMESPACE / Open MPI's job id), and
#      with nothing set (rank 0 passes its unique id through PMIx), also in an MPI
#      program calling MPI_Init before and after fcclCommInitFromEnv (mpi_interop.c);
#   2. torchrun --nproc-per-node 3 --no-python (rank 0 passes the unique id through the
#      agent's store on MASTER_PORT), and with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
#      (rank 0 serves at MASTER_ADDR:MASTER_PORT, the secret from TORCHELASTIC_RUN_ID);
#   3. ferroccl-run -n 2 python with torch.distributed's env:// (gloo, then the
#      "ferroccl" backend), which needs ferroccl-run's RANK, WORLD_SIZE and MASTER_*.
# mpirun comes from Debian's openmpi-bin (scripts/setup.sh installs it); torchrun from
# the torch venv of scripts/python-install-test.sh. Each part is skipped, saying why,
# where its launcher is missing.
# Usage: tests/launchers/run.sh [LIBDIR [CONTRACT_BUILD_DIR]]
#   (default target/release and build/c_tests). Last line: `launchers: N passed, M failed`.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
libdir="${1:-${CARGO_TARGET_DIR:-$root/target}/release}"
build="${2:-$root/build/c_tests}"
tv="${FERROCCL_TORCH_VENV:-$HOME/.cache/ferroccl/torch-venv}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/ferroccl-launchers.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0 skipped=0
export FERROCCL_TIMEOUT_MS="${FERROCCL_TIMEOUT_MS:-60000}"
# The ranks must take their places from the launcher under test, not from this shell.
unset FERROCCL_RANK FERROCCL_WORLD_SIZE FERROCCL_UNIQUE_ID FERROCCL_ROOT_ADDR FERROCCL_SECRET \
  RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT

ok() { passed=$((passed + 1)); echo "  ok    $*"; }
bad() { failed=$((failed + 1)); echo "  FAIL  $*"; }
skip() { skipped=$((skipped + 1)); echo "  skip  $*"; }
# expect NAME N CMD...: CMD exits 0 and prints N "passed" lines of the contract harness.
expect() {
  local name="$1" n="$2" log="$tmp/$((passed + failed)).log"
  shift 2
  if timeout 180 "$@" >"$log" 2>&1 && [ "$(grep -c ": process, $n rank(s): passed" "$log")" -eq "$n" ]; then
    ok "$name"
  else
    bad "$name:"
    sed 's/^/        /' "$log" | tail -25
  fi
}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

for b in test_allreduce test_comm; do
  if [ ! -x "$build/$b" ]; then
    echo "launchers: $build/$b is missing: build the contract suite first (scripts/test.sh does)" >&2
    exit 1
  fi
done

echo "Open MPI's mpirun"
if command -v mpirun >/dev/null && mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  mpi=(mpirun --allow-run-as-root --oversubscribe -np 3)
  expect "mpirun -np 3 -x FERROCCL_ROOT_ADDR -x FERROCCL_SECRET test_allreduce" 3 \
    "${mpi[@]}" -x FERROCCL_ROOT_ADDR="127.0.0.1:$(free_port)" -x FERROCCL_SECRET="launchers-$$-$RANDOM" \
    "$build/test_allreduce"
  expect "mpirun -np 3 -x FERROCCL_ROOT_ADDR test_comm (the job's own secret)" 3 \
    "${mpi[@]}" -x FERROCCL_ROOT_ADDR="127.0.0.1:$(free_port)" "$build/test_comm"
  expect "mpirun -np 3 test_allreduce (nothing set: through PMIx)" 3 "${mpi[@]}" "$build/test_allreduce"
  expect "mpirun -np 3 test_comm (nothing set: through PMIx)" 3 "${mpi[@]}" "$build/test_comm"
  if cc -O1 -I"$root/include" "$root/tests/launchers/mpi_interop.c" -o "$tmp/mpi_interop" -L"$libdir" \
    -lferroccl -ldl -Wl,-rpath,"$libdir" 2>"$tmp/cc.log"; then
    for order in before after; do
      expect "mpirun -np 3 mpi_interop $order (MPI_Init $order fcclCommInitFromEnv, through PMIx)" 3 \
        "${mpi[@]}" "$tmp/mpi_interop" "$order"
    done
  else
    bad "mpi_interop.c does not compile:"
    sed 's/^/        /' "$tmp/cc.log" | tail -10
  fi
else
  skip "mpirun: Open MPI is not installed (scripts/setup.sh installs openmpi-bin with apt-get where it can)"
fi

echo "torchrun"
if [ -x "$tv/bin/torchrun" ] && "$tv/bin/python" -c "import torch" 2>/dev/null; then
  expect "torchrun --nproc-per-node 3 --no-python test_allreduce (the agent's store)" 3 \
    "$tv/bin/torchrun" --nproc-per-node 3 --no-python "$build/test_allreduce"
  expect "torchrun without a shared store: rank 0 serves MASTER_PORT" 2 \
    env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "$tv/bin/torchrun" --nproc-per-node 2 --no-python "$build/test_comm"
  cat >"$tmp/envinit.py" <<'EOF'
import os, torch, torch.distributed as dist
if os.environ["BACKEND"] == "ferroccl":
    import ferroccl.torch  # registers the backend
dist.init_process_group(os.environ["BACKEND"])
t = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(t)
n = dist.get_world_size()
assert t.tolist() == [n * (n + 1) / 2] * 4, t
print(f"{os.environ['BACKEND']}: process, {n} rank(s): passed")
dist.destroy_process_group()
EOF
  expect "ferroccl-run -n 2 python: torch.distributed env:// with gloo" 2 \
    env BACKEND=gloo "$libdir/ferroccl-run" -n 2 "$tv/bin/python" "$tmp/envinit.py"
  if "$tv/bin/python" -c "import ferroccl.torch" 2>/dev/null; then
    expect "ferroccl-run -n 2 python: torch.distributed env:// with the ferroccl backend" 2 \
      env BACKEND=ferroccl FERROCCL_LIB="$libdir/libferroccl.so" "$libdir/ferroccl-run" -n 2 \
      "$tv/bin/python" "$tmp/envinit.py"
  else
    skip "the ferroccl torch backend: the ferroccl package is not installed in $tv"
  fi
else
  skip "torchrun: no torch venv at $tv (scripts/python-install-test.sh makes it)"
fi

[ "$skipped" -gt 0 ] && echo "launchers: $skipped skipped (see above)"
echo "launchers: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
