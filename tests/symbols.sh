#!/usr/bin/env bash
# Symbol hygiene of libferroccl (docs/abi.md: the C prefix is fccl):
#   1. libferroccl.so exports only fccl* symbols (nm -D --defined-only; the linker's own
#      _init/_fini/_edata/_end/__bss_start and version nodes are ignored);
#   2. what it exports is exactly the functions include/ferroccl.h declares;
#   3. libferroccl.a's public symbols with C linkage (global, defined, default
#      visibility, not Rust- or C++-mangled) are fccl*, apart from Rust's runtime hook
#      rust_eh_personality that every Rust static library carries, and it defines every
#      function the header declares;
#   4. libferroccl_nccl.so (NCCL's ABI) has SONAME libnccl.so.2 and exports exactly the
#      names of nccl/nccl-2.28.symbols and its marker ferroccl_nccl_shim (tests/nccl/run.sh
#      compares that list with NVIDIA's library);
#   5. the version is one number: the header's FCCL_MAJOR.MINOR.PATCH, Cargo.toml's
#      version and fcclGetVersion() agree.
# Usage: tests/symbols.sh [LIBDIR]   (default $FERROCCL_LIB_DIR, $CARGO_TARGET_DIR/release
#                                     or target/release; build with `cargo build --release`)
# Last line: `symbols: N passed, M failed`; exit status 0 when M is 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
libdir="${1:-${FERROCCL_LIB_DIR:-${CARGO_TARGET_DIR:-$root/target}/release}}"
so="$libdir/libferroccl.so"
ar_="$libdir/libferroccl.a"
header="$root/include/ferroccl.h"
passed=0 failed=0 skipped=0
tmp="$(mktemp -d "${TMPDIR:-/tmp}/ferroccl-symbols.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

ok() { passed=$((passed + 1)); echo "  ok    $*"; }
bad() { failed=$((failed + 1)); echo "  FAIL  $*"; }
skip() { skipped=$((skipped + 1)); echo "  skip  $*"; }
show() { sed 's/^/        /' | head -"${2:-30}"; }
finish() {
  [ "$skipped" -gt 0 ] && echo "symbols: $skipped skipped (see above)"
  echo "symbols: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}

echo "symbols: $so, $ar_"
for t in nm readelf; do command -v "$t" >/dev/null || { bad "$t (binutils) is not installed"; finish; }; done

# Functions the header declares: `<type> fcclName(` at the start of a line.
sed -nE 's/^[A-Za-z_][A-Za-z0-9_ ]*[ *](fccl[A-Za-z0-9_]+)\(.*/\1/p' "$header" | sort -u >"$tmp/header.txt"
if [ -s "$tmp/header.txt" ]; then
  ok "include/ferroccl.h declares $(wc -l <"$tmp/header.txt") fccl functions"
else
  bad "no fccl function declarations found in $header"
fi

# ------------------------------------------------------------------ shared library
if [ ! -f "$so" ]; then
  bad "$so not found (run cargo build --release)"
else
  nm -D --defined-only "$so" >"$tmp/so.nm" 2>"$tmp/so.err" || { bad "nm -D $so failed:"; show <"$tmp/so.err"; }
  # name without @VERSION; skip the linker's symbols and version nodes (type A)
  awk 'NF >= 3 { n = $3; sub(/@.*/, "", n);
         if (n ~ /^(_init|_fini|_edata|_end|__bss_start|_etext|__end__|__data_start)$/) next;
         if ($2 == "A") next;
         print $2, n }' "$tmp/so.nm" >"$tmp/so.syms"
  awk '$2 !~ /^fccl/' "$tmp/so.syms" >"$tmp/so.other"
  if [ -s "$tmp/so.other" ]; then
    bad "libferroccl.so exports $(wc -l <"$tmp/so.other") symbol(s) outside fccl*:"; show <"$tmp/so.other"
  else
    ok "libferroccl.so exports only fccl* ($(wc -l <"$tmp/so.syms") symbols)"
  fi
  awk '$2 ~ /^fccl/ { print $2 }' "$tmp/so.syms" | sort -u >"$tmp/so.fccl"
  awk '$2 ~ /^fccl/ && $1 != "T" { print }' "$tmp/so.syms" >"$tmp/so.nonfunc"
  if [ -s "$tmp/so.nonfunc" ]; then
    bad "libferroccl.so exports fccl* symbols that are not functions:"; show <"$tmp/so.nonfunc"
  else
    ok "every fccl* export is a function"
  fi
  comm -23 "$tmp/header.txt" "$tmp/so.fccl" >"$tmp/missing"
  comm -13 "$tmp/header.txt" "$tmp/so.fccl" >"$tmp/extra"
  if [ -s "$tmp/missing" ]; then
    bad "declared in ferroccl.h but not exported by libferroccl.so:"; show <"$tmp/missing"
  else
    ok "libferroccl.so exports every function ferroccl.h declares"
  fi
  if [ -s "$tmp/extra" ]; then
    bad "exported by libferroccl.so but not declared in ferroccl.h:"; show <"$tmp/extra"
  else
    ok "libferroccl.so exports nothing ferroccl.h does not declare"
  fi
fi

# ------------------------------------------------------------------ static library
if [ ! -f "$ar_" ]; then
  bad "$ar_ not found (run cargo build --release)"
else
  # readelf rather than nm: GNU nm's LTO plugin cannot read every member rustc writes.
  readelf -Ws --wide "$ar_" 2>/dev/null | awk '
    /^File: / { f = $2; next }
    ($5 == "GLOBAL" || $5 == "WEAK") && $7 != "UND" && $6 == "DEFAULT" && NF >= 8 {
      n = $8
      if (n ~ /^_Z/ || n ~ /^_R/) next      # C++ / Rust (legacy and v0) mangled names
      print f, $4, n
    }' | sort -u >"$tmp/a.syms"
  if [ ! -s "$tmp/a.syms" ]; then
    bad "readelf found no public symbol in $ar_"
  else
    awk '$3 !~ /^fccl/ && $3 != "rust_eh_personality"' "$tmp/a.syms" >"$tmp/a.other"
    if [ -s "$tmp/a.other" ]; then
      bad "libferroccl.a has public C-linkage symbols outside fccl* (member, type, name):"; show <"$tmp/a.other"
    else
      ok "libferroccl.a's public C-linkage symbols are fccl* (and Rust's rust_eh_personality)"
    fi
    awk '$3 ~ /^fccl/ { print $3 }' "$tmp/a.syms" | sort -u >"$tmp/a.fccl"
    comm -23 "$tmp/header.txt" "$tmp/a.fccl" >"$tmp/a.missing"
    if [ -s "$tmp/a.missing" ]; then
      bad "declared in ferroccl.h but not defined in libferroccl.a:"; show <"$tmp/a.missing"
    else
      ok "libferroccl.a defines every function ferroccl.h declares"
    fi
  fi
fi

# ------------------------------------------------------------------ compat header, version
cc="${CC:-cc}"
if ! command -v "$cc" >/dev/null; then
  skip "compat-header and version checks: no C compiler ($cc)"
  finish
fi
# ferroccl's NCCL library exports NCCL 2.28's names (nccl/nccl-2.28.symbols, taken
# from NVIDIA's library) and its marker, nothing of ferroccl's or Rust's.
nso="$libdir/libferroccl_nccl.so"
list="$root/nccl/nccl-2.28.symbols"
if [ ! -f "$nso" ]; then
  bad "$nso not found (run cargo build --release)"
else
  grep -v '^#' "$list" | sed '/^$/d' | LC_ALL=C sort >"$tmp/nccl.want"
  nm -D --defined-only "$nso" | awk 'NF >= 3 && $2 != "A" { n = $3; sub(/@.*/, "", n);
      if (n ~ /^(_init|_fini|_edata|_end|__bss_start)$/) next; print n }' | LC_ALL=C sort >"$tmp/nccl.have"
  echo ferroccl_nccl_shim | cat - "$tmp/nccl.want" | LC_ALL=C sort >"$tmp/nccl.want+marker"
  if cmp -s "$tmp/nccl.want+marker" "$tmp/nccl.have"; then
    ok "libferroccl_nccl.so exports exactly NCCL 2.28's $(wc -l <"$tmp/nccl.want") symbols and ferroccl_nccl_shim"
  else
    bad "libferroccl_nccl.so's exports differ from nccl/nccl-2.28.symbols (+ ferroccl_nccl_shim): < missing, > extra"
    diff "$tmp/nccl.want+marker" "$tmp/nccl.have" | grep '^[<>]' | show
  fi
  soname="$(readelf -d "$nso" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
  if [ "$soname" = libnccl.so.2 ]; then ok "libferroccl_nccl.so's SONAME is libnccl.so.2"
  else bad "libferroccl_nccl.so's SONAME is '$soname', not libnccl.so.2"; fi
fi

hv="$(awk '$1 == "#define" && $2 ~ /^FCCL_(MAJOR|MINOR|PATCH)$/ { v[$2] = $3 }
  END { if (length(v) == 3) print v["FCCL_MAJOR"] "." v["FCCL_MINOR"] "." v["FCCL_PATCH"] }' "$header")"
cv="$(awk -F'"' '/^\[/ { s = $0 } s == "[package]" && $1 ~ /^version *= */ { print $2; exit }' "$root/Cargo.toml")"
if [ -n "$hv" ] && [ "$hv" = "$cv" ]; then
  ok "version: ferroccl.h FCCL_MAJOR.MINOR.PATCH = Cargo.toml = $hv"
else
  bad "version: ferroccl.h says '$hv', Cargo.toml '$cv'"
fi
if [ -f "$so" ]; then
  cat >"$tmp/v.c" <<'EOF'
#include <stdio.h>
#include <ferroccl.h>
int main(void) {
  int v = -1;
  if (fcclGetVersion(&v) != fcclSuccess) return 2;
  printf("%d %d\n", v, FCCL_VERSION_CODE);
  return v == FCCL_VERSION_CODE ? 0 : 1;
}
EOF
  if "$cc" -std=c99 -I"$root/include" "$tmp/v.c" -L"$libdir" -lferroccl -Wl,-rpath,"$libdir" -o "$tmp/v" \
       2>"$tmp/v.err" && out="$("$tmp/v")"; then
    ok "version: fcclGetVersion() = FCCL_VERSION_CODE = ${out%% *}"
  else
    bad "version: fcclGetVersion() and FCCL_VERSION_CODE differ (${out:-no output}):"; show <"$tmp/v.err"
  fi
fi

finish
