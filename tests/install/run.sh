#!/usr/bin/env bash
# Installs ferroccl into a temporary prefix (`make install PREFIX=...`) and builds and
# runs small C++ consumers against the installed copy:
#   - CMake: find_package(ferroccl CONFIG REQUIRED) with ferroccl::ferroccl (shared),
#     ferroccl::ferroccl_static and ferroccl::nccl (an unchanged NCCL program, linked
#     against the installed lib/ferroccl/libnccl.so.2); the
#     package's version must be the header's; the prefix still works after being moved;
#     a version the package does not satisfy is refused;
#   - pkg-config: `pkg-config --cflags --libs ferroccl` (and ferroccl-nccl);
#   - the library is libferroccl.so.<version> with SONAME libferroccl.so.<major> and the
#     .so.<major> and .so links, and consumers record the SONAME; the shared libraries and
#     the launcher are stripped, with debug links to their .debug files, from which
#     addr2line and gdb (when installed) still name the source line of fcclAllReduce;
#   - the installed launcher: ferroccl-run -n 2 consumer --env;
#   - make uninstall leaves no file behind.
# Usage: tests/install/run.sh          (cmake from PATH or .venv/bin; pkg-config from PATH,
#                                       installed with apt-get when root, else skipped)
# Environment: CARGO_TARGET_DIR (where the build is), KEEP=1 (keep the temporary tree).
# Last line: `install: N passed, M failed`; exit status 0 when M is 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/tests/install"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/ferroccl-install.XXXXXX")"
if [ "${KEEP:-0}" = 1 ]; then echo "install: keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
prefix="$tmp/prefix"
passed=0 failed=0 skipped=0

ok() { passed=$((passed + 1)); echo "  ok    $*"; }
bad() { failed=$((failed + 1)); echo "  FAIL  $*"; }
skip() { skipped=$((skipped + 1)); echo "  skip  $*"; }
# run NAME LOGFILE CMD...: records pass/fail, shows the log on failure
run() {
  local name="$1" log="$2"; shift 2
  if "$@" >"$log" 2>&1; then ok "$name"; return 0; fi
  bad "$name (exit $?; $log):"; sed 's/^/        /' "$log" | tail -40; return 1
}
finish() {
  [ "$skipped" -gt 0 ] && echo "install: $skipped skipped (see above)"
  echo "install: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}

version="$(awk '$1 == "#define" && $2 ~ /^FCCL_(MAJOR|MINOR|PATCH)$/ { v[$2] = $3 }
  END { if (length(v) == 3) print v["FCCL_MAJOR"] "." v["FCCL_MINOR"] "." v["FCCL_PATCH"] }' "$root/include/ferroccl.h")"
echo "install: ferroccl $version into $prefix"

# ------------------------------------------------------------------ make install
command -v make >/dev/null || { bad "make is not installed"; finish; }
if ! run "make install PREFIX=$prefix" "$tmp/make-install.log" make -C "$root" install PREFIX="$prefix"; then
  finish
fi
missing=""
major="${version%%.*}"
for f in lib/libferroccl.so lib/libferroccl.so."$major" lib/libferroccl.so."$version" \
         lib/.debug/libferroccl.so."$version".debug lib/ferroccl/.debug/libnccl.so.2.debug \
         bin/.debug/ferroccl-run.debug lib/libferroccl.a include/ferroccl.h include/ferroccl/nccl.h bin/ferroccl-run \
         bin/ferroccl-bench bin/.debug/ferroccl-bench.debug \
         lib/ferroccl/libnccl.so.2 lib/ferroccl/libnccl.so \
         lib/cmake/ferroccl/ferrocclConfig.cmake lib/cmake/ferroccl/ferrocclConfigVersion.cmake \
         lib/pkgconfig/ferroccl.pc lib/pkgconfig/ferroccl-nccl.pc; do
  [ -f "$prefix/$f" ] || missing="$missing $f"
done
if [ -z "$missing" ]; then ok "installed files present"; else bad "installed files missing:$missing"; fi

# ------------------------------------------------------------------ SONAME, links, debug information
so="$prefix/lib/libferroccl.so.$version"
soname="$(readelf -d "$so" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
if [ "$soname" = "libferroccl.so.$major" ]; then ok "SONAME of libferroccl.so.$version is libferroccl.so.$major"
else bad "SONAME of libferroccl.so.$version is '$soname', expected libferroccl.so.$major"; fi
links="$(readlink "$prefix/lib/libferroccl.so") -> $(readlink "$prefix/lib/libferroccl.so.$major")"
if [ "$links" = "libferroccl.so.$major -> libferroccl.so.$version" ]; then
  ok "libferroccl.so -> libferroccl.so.$major -> libferroccl.so.$version"
else bad "libferroccl.so links: $links"; fi
for f in lib/libferroccl.so."$version" lib/ferroccl/libnccl.so.2 bin/ferroccl-run bin/ferroccl-bench; do
  sections="$(readelf -S -W "$prefix/$f" 2>/dev/null)"
  if grep -q '\.debug_info' <<<"$sections"; then bad "$f is not stripped (it has .debug_info)"
  elif ! grep -q '\.gnu_debuglink' <<<"$sections"; then bad "$f has no .gnu_debuglink to its debug file"
  else ok "$f is stripped, with a debug link"; fi
done
addr="$(nm -D --defined-only "$so" 2>/dev/null | awk '$3 == "fcclAllReduce" { print $1 }')"
where="$(addr2line -e "$prefix/lib/.debug/libferroccl.so.$version.debug" "0x$addr" 2>&1)"
case "$where" in
  *src/ffi/coll.rs:[0-9]*) ok "addr2line on the .debug file: fcclAllReduce at ${where##*/}" ;;
  *) bad "addr2line -e libferroccl.so.$version.debug 0x$addr: '$where' (expected src/ffi/coll.rs:N)" ;;
esac
if command -v gdb >/dev/null; then
  line="$(gdb -nx -batch -ex 'info line fcclAllReduce' "$so" 2>&1)"
  case "$line" in
    *'of "src/ffi/coll.rs"'*) ok "gdb finds the debug file through the link: fcclAllReduce in src/ffi/coll.rs" ;;
    *) bad "gdb 'info line fcclAllReduce' on the stripped library: $line" ;;
  esac
else
  skip "gdb symbolization: gdb is not installed"
fi

cxx="${CXX:-c++}"
command -v "$cxx" >/dev/null || { bad "no C++ compiler ($cxx)"; finish; }

# ------------------------------------------------------------------ CMake
cmake_bin="$(command -v cmake || true)"
[ -z "$cmake_bin" ] && [ -x "$root/.venv/bin/cmake" ] && cmake_bin="$root/.venv/bin/cmake"
cmake_consumer() {  # BUILD_DIR PREFIX_PATH [cmake args...]
  local b="$1" p="$2"; shift 2
  "$cmake_bin" -S "$here/consumer" -B "$b" -DCMAKE_PREFIX_PATH="$p" -DCMAKE_BUILD_TYPE=Release "$@" &&
    "$cmake_bin" --build "$b" -j "$(nproc 2>/dev/null || echo 2)"
}
if [ -z "$cmake_bin" ]; then
  skip "CMake consumers: cmake not found (scripts/setup.sh installs it into .venv)"
else
  b="$tmp/build-cmake"
  if run "cmake: find_package(ferroccl $version EXACT CONFIG REQUIRED), build" "$tmp/cmake.log" \
         cmake_consumer "$b" "$prefix" -DFERROCCL_EXPECT_VERSION="$version"; then
    run "cmake: ferroccl::ferroccl, 1 rank (fcclCommInitAll)" "$tmp/run-cmake-1.log" "$b/consumer"
    run "cmake: ferroccl::ferroccl, 3 ranks as threads" "$tmp/run-cmake-3.log" "$b/consumer" 3
    run "cmake: ferroccl::ferroccl_static, 2 ranks" "$tmp/run-cmake-static.log" "$b/consumer_static" 2
    if readelf -d "$b/consumer_static" 2>/dev/null | grep -q 'libferroccl'; then
      bad "cmake: consumer_static depends on a shared libferroccl"
    else
      ok "cmake: consumer_static has no libferroccl.so dependency"
    fi
    run "cmake: ferroccl::nccl, unchanged NCCL program (#include <nccl.h>)" "$tmp/run-cmake-nccl.log" \
        "$b/consumer_nccl" 4
    needed="$(readelf -d "$b/consumer_nccl" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
    case " $needed" in
      *" libnccl.so.2 "*) case "$needed" in *libferroccl*) bad "cmake: consumer_nccl also needs libferroccl: $needed" ;;
                          *) ok "cmake: consumer_nccl needs libnccl.so.2 (ferroccl's), not libferroccl" ;; esac ;;
      *) bad "cmake: consumer_nccl does not need libnccl.so.2: $needed" ;;
    esac
    needed="$(readelf -d "$b/consumer" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
    case " $needed" in
      *" libferroccl.so.$major "*) ok "cmake: consumer needs libferroccl.so.$major (the SONAME)" ;;
      *) bad "cmake: consumer does not need libferroccl.so.$major: $needed" ;;
    esac
    run "installed ferroccl-run -n 2 consumer --env" "$tmp/run-launcher.log" \
        "$prefix/bin/ferroccl-run" -n 2 "$b/consumer" --env
  fi
  if cmake_consumer "$tmp/build-cmake-bad" "$prefix" -DFERROCCL_EXPECT_VERSION="$((major + 1)).0.0" \
       >"$tmp/cmake-bad.log" 2>&1; then
    bad "cmake: find_package(ferroccl $((major + 1)).0.0) should be refused"
  else
    ok "cmake: find_package(ferroccl $((major + 1)).0.0) refused"
  fi
  # The package is relocatable: move the whole prefix and build again.
  moved="$tmp/moved/prefix"
  mkdir -p "$tmp/moved" && cp -a "$prefix" "$moved"
  if run "cmake: package works after moving the prefix (build)" "$tmp/cmake-moved.log" \
         cmake_consumer "$tmp/build-moved" "$moved"; then
    if grep -q "$moved/lib/libferroccl.so" "$tmp/build-moved/CMakeCache.txt" 2>/dev/null ||
       grep -rq "$moved" "$tmp/build-moved/CMakeFiles/consumer.dir/link.txt" 2>/dev/null; then
      ok "cmake: moved package links the moved library"
    else
      bad "cmake: moved package does not point at the moved prefix"
    fi
    run "cmake: moved package, 1 rank" "$tmp/run-moved.log" "$tmp/build-moved/consumer"
  fi
  rm -rf "$tmp/moved"
fi

# ------------------------------------------------------------------ pkg-config
pc_bin="$(command -v pkg-config || command -v pkgconf || true)"
if [ -z "$pc_bin" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "install: pkg-config not found; installing Debian's pkg-config with apt-get"
  if (apt-get install -y -qq pkg-config >/dev/null 2>&1 ||
      { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq pkg-config >/dev/null 2>&1; }); then
    pc_bin="$(command -v pkg-config || true)"
  fi
fi
if [ -z "$pc_bin" ]; then
  skip "pkg-config consumers: pkg-config is not installed (apt-get install pkg-config)"
else
  export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
  pcv="$("$pc_bin" --modversion ferroccl 2>/dev/null)"
  if [ "$pcv" = "$version" ]; then ok "pkg-config --modversion ferroccl = $version"
  else bad "pkg-config --modversion ferroccl is '$pcv', expected '$version'"; fi
  libdir="$("$pc_bin" --variable=libdir ferroccl)"
  p="$tmp/build-pc"; mkdir -p "$p"
  # shellcheck disable=SC2046 # word splitting of pkg-config's flags is intended
  if run "pkg-config: c++ main.cpp \$(pkg-config --cflags --libs ferroccl)" "$tmp/pc.log" \
         "$cxx" -std=c++11 -Wall -Wextra -Wpedantic -Werror -DFERROCCL_PKG_VERSION="$pcv" \
         "$here/consumer/main.cpp" -o "$p/consumer" \
         $("$pc_bin" --cflags --libs ferroccl) -pthread -Wl,-rpath,"$libdir"; then
    run "pkg-config: consumer, 1 rank (fcclCommInitAll)" "$tmp/run-pc-1.log" "$p/consumer"
    run "pkg-config: consumer, 2 ranks as threads" "$tmp/run-pc-2.log" "$p/consumer" 2
  fi
  # shellcheck disable=SC2046
  if run "pkg-config: unchanged NCCL program with \$(pkg-config --cflags --libs ferroccl-nccl)" \
         "$tmp/pc-nccl.log" "$cxx" -std=c++11 -Wall -Wextra -Wpedantic -Werror \
         "$here/consumer/nccl_main.cpp" -o "$p/consumer_nccl" \
         $("$pc_bin" --cflags --libs ferroccl-nccl) -pthread \
         -Wl,-rpath,"$("$pc_bin" --variable=nccllibdir ferroccl-nccl)"; then
    run "pkg-config: NCCL program, 2 ranks" "$tmp/run-pc-nccl.log" "$p/consumer_nccl" 2
  fi
  unset PKG_CONFIG_PATH
fi

# ------------------------------------------------------------------ uninstall
if run "make uninstall PREFIX=$prefix" "$tmp/make-uninstall.log" make -C "$root" uninstall PREFIX="$prefix"; then
  left="$(find "$prefix" \( -type f -o -type l \) 2>/dev/null | sed "s|^$prefix/||" | tr '\n' ' ')"
  left="$left$(find "$prefix" -type d -name .debug 2>/dev/null | sed "s|^$prefix/||" | tr '\n' ' ')"
  if [ -z "$left" ]; then ok "uninstall leaves no file"; else bad "uninstall left: $left"; fi
fi

finish
