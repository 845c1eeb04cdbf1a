#!/usr/bin/env bash
# The whole test suite: formatting and lints, Rust unit and integration tests (the
# header is regenerated and diffed there), the C contract suite under ctest at
# several world sizes (plain and ASan/UBSan builds), and the Python ctypes tests.
# Installs what is missing (scripts/setup.sh). Usage: scripts/test.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
export PATH="$root/.venv/bin:$PATH"
jobs="${FERROCCL_TEST_JOBS:-$(nproc)}"
step() { printf '\n==> %s\n' "$*"; }

step "rustfmt"
cargo fmt --check
step "clippy"
cargo clippy --release --all-targets --quiet -- -D warnings
step "build"
cargo build --release --quiet
step "cargo test (unit, integration, header)"
cargo test --release --quiet

lib="$root/target/release"
ctest_suite() {
  local dir="$1"; shift
  cmake -S c_tests -B "$dir" -DCMAKE_BUILD_TYPE=Release -DFERROCCL_LIB_DIR="$lib" \
        -DFERROCCL_INCLUDE_DIR="$root/include" -DFERROCCL_RUN="$lib/ferroccl-run" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs" >/dev/null
  ctest --test-dir "$dir" -j "$jobs" --output-on-failure --timeout 300
}
step "C contract suite (ctest)"
ctest_suite build/c_tests
step "C contract suite under ASan/UBSan (ctest)"
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  ctest_suite build/c_tests_asan -DFERROCCL_SANITIZE=ON
step "symbol hygiene"
bash tests/symbols.sh "$lib"
step "bench/compare scripts (no installs, no timing)"
bash bench/compare/smoke.sh
step "install: CMake and pkg-config consumers of an installed copy"
bash tests/install/run.sh
step "Python: ctypes test and the ferroccl package (pytest)"
FERROCCL_LIB="$lib/libferroccl.so" FERROCCL_RUN="$lib/ferroccl-run" \
  python -m pytest -q -p no:cacheprovider tests/python python/tests
