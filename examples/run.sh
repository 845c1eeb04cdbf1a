#!/usr/bin/env bash
# Builds every example against this checkout and runs it on 2 and 3 ranks under
# ferroccl-run (called by scripts/test.sh):
#   c/allreduce.c       cc -std=c99 -Wall -Wextra -Wpedantic -Werror, -lferroccl
#   cpp/allreduce.cpp   c++ -std=c++11, same flags, -lferroccl
#   python/allreduce.py the package in python/ on target/release/libferroccl.so (numpy)
#   nccl/allreduce.c    NCCL's API: include/ferroccl/nccl.h, -lnccl = libferroccl_nccl.so
# Usage: examples/run.sh [LIBDIR]   (default $CARGO_TARGET_DIR/release or target/release;
# build it first with cargo build --release). Environment: CC, CXX, PYTHON (python3).
# Last line: `examples: N passed, M failed`; exit status 0 when M is 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
here="$root/examples"
libdir="$(cd "${1:-${CARGO_TARGET_DIR:-$root/target}/release}" && pwd)"
out="$root/build/examples"
cc="${CC:-cc}" cxx="${CXX:-c++}" py="${PYTHON:-python3}"
launcher="$libdir/ferroccl-run"
passed=0 failed=0 skipped=0
ok() { passed=$((passed + 1)); echo "  ok    $*"; }
bad() { failed=$((failed + 1)); echo "  FAIL  $*"; }
skip() { skipped=$((skipped + 1)); echo "  skip  $*"; }
run() {  # run NAME LOG CMD...: pass when CMD exits 0; the log's tail on failure
  local name="$1" log="$2"; shift 2
  local rc=0
  timeout 300 "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then ok "$name"; return 0; fi
  bad "$name (exit $rc; $log):"; sed 's/^/        /' "$log" | tail -30; return 1
}
finish() {
  [ "$skipped" -gt 0 ] && echo "examples: $skipped skipped (see above)"
  echo "examples: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}

for f in libferroccl.so libferroccl_nccl.so ferroccl-run; do
  [ -e "$libdir/$f" ] || { bad "$libdir/$f not found (cargo build --release)"; finish; }
done
rm -rf "$out" && mkdir -p "$out/nccl-lib"
# The NCCL library under the names an NCCL program links and loads.
ln -s "$libdir/libferroccl_nccl.so" "$out/nccl-lib/libnccl.so.2"
ln -s libnccl.so.2 "$out/nccl-lib/libnccl.so"

progs=()
warn=(-Wall -Wextra -Wpedantic -Werror)
if run "build c/allreduce.c" "$out/c.log" "$cc" -std=c99 "${warn[@]}" "$here/c/allreduce.c" \
       -I"$root/include" -L"$libdir" -lferroccl -Wl,-rpath,"$libdir" -o "$out/allreduce_c"; then
  progs+=("c:$out/allreduce_c")
fi
if run "build cpp/allreduce.cpp" "$out/cpp.log" "$cxx" -std=c++11 "${warn[@]}" "$here/cpp/allreduce.cpp" \
       -I"$root/include" -L"$libdir" -lferroccl -Wl,-rpath,"$libdir" -o "$out/allreduce_cpp"; then
  progs+=("cpp:$out/allreduce_cpp")
fi
if run "build nccl/allreduce.c" "$out/nccl.log" "$cc" -std=c99 "${warn[@]}" "$here/nccl/allreduce.c" \
       -I"$root/include/ferroccl" -L"$out/nccl-lib" -lnccl -Wl,-rpath,"$out/nccl-lib" -o "$out/allreduce_nccl"; then
  needed="$(readelf -d "$out/allreduce_nccl" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
  case " $needed" in
    *" libnccl.so.2 "*) progs+=("nccl:$out/allreduce_nccl") ;;
    *) bad "nccl/allreduce.c does not need libnccl.so.2: $needed" ;;
  esac
fi
if "$py" -c "import numpy" 2>/dev/null; then
  progs+=("python:$py $here/python/allreduce.py")
else
  skip "python/allreduce.py: $py has no numpy (scripts/setup.sh installs it into .venv)"
fi

# Each example checks its results itself (exit status) and rank 0 says so.
ranks() {  # ranks NAME N CMD...
  local name="$1" n="$2" log="$out/$1-np$2.log"; shift 2
  local rc=0
  timeout 300 env PYTHONPATH="$root/python" FERROCCL_LIB="$libdir/libferroccl.so" \
    "$launcher" -n "$n" "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ] && grep -q "over $n ranks: correct" "$log"; then ok "$name on $n ranks"; return; fi
  bad "$name on $n ranks (exit $rc; $log):"; sed 's/^/        /' "$log" | tail -30
}
for p in "${progs[@]}"; do
  for n in 2 3; do
    # shellcheck disable=SC2086 # the part after the name is a program and its arguments
    ranks "${p%%:*}" "$n" ${p#*:}
  done
done
finish
