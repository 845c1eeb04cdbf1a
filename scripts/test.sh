#!/usr/bin/env bash
# The whole test suite: the module layers (tools/check-layers.py), formatting and
# lints, Rust unit and integration tests (the header is regenerated and diffed there;
# the simulated GPU's own tests too), the C
# contract suite under ctest at several world sizes (plain and ASan/UBSan builds) and on
# 2 and 3 hosts as network namespaces (tests/multinode), the device suite and a GPU
# host's view of the host suite on the simulated GPU (tools/simgpu, scripts/sim-gpu.sh),
# the device kernels through the real NVRTC (scripts/nvrtc-check.sh), NCCL's ABI
# (tests/nccl/run.sh), the examples (examples/run.sh), and the Python tests.
# Installs what is missing (scripts/setup.sh).
#
#   scripts/test.sh             every step, in order (what CI runs)
#   scripts/test.sh STEP...     the named steps only, in the order given
#   scripts/test.sh --list      the steps' names and what each runs
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
names=()
descs=()
# step NAME DESCRIPTION: the step's commands are the function s_NAME.
step() { names+=("$1"); descs+=("$2"); }
[ "${1:-}" = "--list" ] || bash scripts/setup.sh
export PATH="$root/.venv/bin:$PATH"
jobs="${FERROCCL_TEST_JOBS:-$(nproc)}"
sim() { bash "$root/scripts/sim-gpu.sh" "$@"; }

lib="$root/target/release"
built=""
# What later steps need, done once per run: the Rust build, and the C suite's CMake builds.
need_cargo() {
  case " $built " in *" cargo "*) return ;; esac
  cargo build --workspace --release --quiet
  built="$built cargo"
}
ctest_build() {
  local dir="$1"; shift
  case " $built " in *" $dir "*) return ;; esac
  need_cargo
  cmake -S c_tests -B "$dir" -DCMAKE_BUILD_TYPE=Release -DFERROCCL_LIB_DIR="$lib" \
        -DFERROCCL_INCLUDE_DIR="$root/include" -DFERROCCL_RUN="$lib/ferroccl-run" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs" >/dev/null
  built="$built $dir"
}
ctest_run() {
  local dir="$1"; shift
  ctest --test-dir "$dir" -j "$jobs" --output-on-failure --timeout 300 "$@"
}
asan_env=(ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
asan() { ctest_build build/c_tests_asan -DFERROCCL_SANITIZE=ON; }

step layers "module layers, cycles and file sizes of src/, the kernels crate below the library (tools/check-layers.py)"
s_layers() { python3 tools/check-layers.py; }
step refs "no tracked file points outside the repository (tools/check-refs.sh)"
s_refs() { bash tools/check-refs.sh; }
step fmt "rustfmt"
s_fmt() { cargo fmt --all --check; }
step clippy "clippy"
s_clippy() { cargo clippy --workspace --release --all-targets --quiet -- -D warnings; }
step build "build (the library, its NCCL library, and the simulated CUDA driver)"
s_build() { need_cargo; }
step cargo-test "cargo test (unit, integration, header; the simulated GPU's own tests)"
s_cargo-test() { cargo test --workspace --release --quiet; }
step nvrtc "device kernels through the real NVRTC for sm_90 (PyPI's wheel, no GPU; skips without it)"
s_nvrtc() { bash scripts/nvrtc-check.sh; }
step ctest "C contract suite (ctest; the device tests skip: no driver here)"
s_ctest() { ctest_build build/c_tests; ctest_run build/c_tests; }
step ctest-asan "C contract suite under ASan/UBSan (ctest; 1-3 ranks, the 4- and 7-rank runs are the plain suite's)"
s_ctest-asan() {
  asan
  env "${asan_env[@]}" ctest --test-dir build/c_tests_asan -j "$jobs" --output-on-failure --timeout 300 -LE 'np4|np7' -E '4$'
}
step device "device suite on the simulated GPU (ctest -L 'device|cuda')"
s_device() {
  ctest_build build/c_tests
  sim ctest --test-dir build/c_tests -j "$jobs" --output-on-failure --timeout 300 -L 'device|cuda'
}
step device-asan "device suite on the simulated GPU under ASan/UBSan (1-3 ranks; the 4-rank, MPS and 10-rank runs are the plain suite's)"
s_device-asan() {
  asan
  env "${asan_env[@]}" bash scripts/sim-gpu.sh \
    ctest --test-dir build/c_tests_asan -j "$jobs" --output-on-failure --timeout 300 -L 'device|cuda' -E 'ipc\.np10|mps|4$'
}
step device-staged "device suite on the simulated GPU with every call staged through host memory (FERROCCL_CUDA_IPC=0; 1-3 ranks: the MPS and 10-rank runs test the GPU-to-GPU path only)"
s_device-staged() {
  ctest_build build/c_tests
  FERROCCL_CUDA_IPC=0 sim ctest --test-dir build/c_tests -j "$jobs" --output-on-failure --timeout 300 -L device -E 'mps|ipc\.np10|4$'
}
# Whether a host program starts CUDA is decided at set-up: every program of the host
# suite, as 2 processes and as 2 threads, covers it; the other sizes ran above.
step sim-host "host suite on a simulated GPU host: programs that never start CUDA (every program, 2 ranks)"
s_sim-host() {
  ctest_build build/c_tests
  sim ctest --test-dir build/c_tests -j "$jobs" --output-on-failure --timeout 300 -LE 'device|cuda' -R '\.(np2|threads2)$'
}
step sim-host-cuda-user "host suite on a simulated GPU host: programs that have made device 0 current (every program, 2 ranks)"
s_sim-host-cuda-user() {
  ctest_build build/c_tests_cuda_user -DFERROCCL_TEST_CUDA_USER=ON
  sim ctest --test-dir build/c_tests_cuda_user -j "$jobs" --output-on-failure --timeout 300 -LE 'device|cuda' -R '\.(np2|threads2)$'
}
step bench-sim "ferroccl-bench --mem cuda --nranks 4 all on two simulated GPUs, staged (exit 0: no wrong results)"
s_bench-sim() {
  need_cargo
  mkdir -p build
  sim "$lib/ferroccl-bench" --mem cuda --nranks 4 all >build/bench-sim.txt
  grep -E '^# Out of bounds' build/bench-sim.txt  # simulated: bandwidths mean nothing
  grep -E '^# Backend mixed' build/bench-sim.txt
}
step bench-sim-1gpu "ferroccl-bench --mem cuda --nranks 4 all, every rank on one simulated GPU (no size may be staged)"
s_bench-sim-1gpu() {
  need_cargo
  mkdir -p build
  CUDA_VISIBLE_DEVICES=0 sim "$lib/ferroccl-bench" --mem cuda --nranks 4 all -e 1M >build/bench-sim-1gpu.txt
  if grep -E '^# (the device path did not serve|Backend mixed\(ranks\) : [1-9])' build/bench-sim-1gpu.txt; then return 1; fi
}
step pingpong "bench/memop_pingpong.c on the simulated GPU (builds and completes; times mean nothing here)"
s_pingpong() {
  mkdir -p build
  cc -O2 -Wall -Werror bench/memop_pingpong.c -o build/memop_pingpong -ldl
  sim build/memop_pingpong --rounds 200
}
step gpu-lease "gpu-lease.sh on the simulated GPU: a --quick run, one killed by SIGTERM, a 30 s budget, faked torch/Gloo (tests/gpu_lease/run.sh)"
s_gpu-lease() { need_cargo; bash tests/gpu_lease/run.sh; }
step soak "ferroccl-bench --soak on the simulated GPU (random verified calls, host and device memory)"
s_soak() { need_cargo; FERROCCL_TIMEOUT_MS=60000 sim "$lib/ferroccl-bench" --soak 300 --mem cuda --nranks 2 --seed 11; }
step symbols "symbol hygiene"
s_symbols() { need_cargo; bash tests/symbols.sh "$lib"; }
step nccl "NCCL's ABI: libnccl.so.2 against NVIDIA's 2.28, and programs written for NCCL on it"
s_nccl() { need_cargo; bash tests/nccl/run.sh "$lib"; }
step compare "tools/compare scripts (no installs, no timing)"
s_compare() { bash tools/compare/smoke.sh; }
step examples "examples/: C, C++, Python and NCCL-style C, each built and run on 2 and 3 ranks"
s_examples() { need_cargo; bash examples/run.sh "$lib"; }
step install "install: CMake and pkg-config consumers of an installed copy"
s_install() { bash tests/install/run.sh; }
step python "Python: ctypes test and the ferroccl package (pytest; device tests on the simulated GPU)"
s_python() {
  need_cargo
  FERROCCL_LIB="$lib/libferroccl.so" FERROCCL_RUN="$lib/ferroccl-run" \
    sim python -m pytest -q -rs -p no:cacheprovider tests/python python/tests
}
step python-install "Python: the sdist, the manylinux wheel built from it, installed without cargo; package tests, C builds against it, torch's tests (scripts/wheel.sh)"
s_python-install() { bash scripts/python-install-test.sh; }
step multinode "cross-host: the contract suite, a killed host, an unreachable address and torchrun on 2 and 3 hosts as network namespaces (tests/multinode; skips without root)"
s_multinode() { need_cargo; bash tests/multinode/run.sh; }
step launchers "launchers: mpirun, torchrun, and ferroccl-run under torch.distributed (tests/launchers/run.sh)"
s_launchers() { ctest_build build/c_tests; bash tests/launchers/run.sh "$lib" build/c_tests; }

if [ "${1:-}" = "--list" ]; then
  for i in "${!names[@]}"; do printf '%-20s %s\n' "${names[$i]}" "${descs[$i]}"; done
  exit 0
fi
want=("$@")
[ "${#want[@]}" -gt 0 ] || want=("${names[@]}")
for w in "${want[@]}"; do
  case " ${names[*]} " in *" $w "*) ;; *) echo "scripts/test.sh: no step $w (scripts/test.sh --list names them)" >&2; exit 2 ;; esac
done
for w in "${want[@]}"; do
  for i in "${!names[@]}"; do
    if [ "${names[$i]}" = "$w" ]; then
      printf '\n==> %s (at %d s)\n' "${descs[$i]}" "$SECONDS"
      "s_$w"
    fi
  done
done
