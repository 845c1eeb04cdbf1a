#!/usr/bin/env bash
# A cheap check of tools/compare that installs nothing and times nothing: the scripts
# parse, --help works without torch or MPI, ratios.py computes ratios and verdicts (and
# the points lost against a base build) right on made-up CSVs, ompi_bench.c compiles
# where mpicc is present, and where gcc is, the ideal peer builds and gets every
# collective right (three tiny sweeps, seconds); and
# bench/device_compare.py's table math on made-up sweeps and one tiny CPU run of it
# (Gloo on CPU tensors where a Python with torch is found; judges no timing).
# Usage: tools/compare/smoke.sh   (run by scripts/test.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pass=0 fail=0
ok() { echo "ok: $*"; pass=$((pass + 1)); }
bad() { echo "FAILED: $*"; fail=$((fail + 1)); }

bash -n "$here/run.sh" && ok "run.sh parses" || bad "run.sh parses"
"$here/run.sh" --help | grep -q -- '--peer ompi|gloo|ideal|both|all' && ok "run.sh --help" || bad "run.sh --help"
rc=0
"$here/run.sh" --nranks 2,x >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] && ok "run.sh refuses --nranks 2,x" || bad "run.sh refuses --nranks 2,x (exit $rc, want 2)"
rc=0
"$here/run.sh" --rotate 2 >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] && ok "run.sh refuses --rotate 2" || bad "run.sh refuses --rotate 2 (exit $rc, want 2)"
python3 -m py_compile "$here/gloo_bench.py" "$here/ratios.py" && ok "python compiles" || bad "python compiles"
python3 "$here/gloo_bench.py" --help | grep -q -- '--max-time' && ok "gloo_bench.py --help without torch" ||
    bad "gloo_bench.py --help without torch"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
h="collective,nranks,type,redop,root,size_bytes,count,placement,time_us,algbw_GBps,busbw_GBps,wrong"
# ferroccl twice as fast as the peer at 32K, half as fast at 8M, 3x slower at 8 B,
# 1000x slower at size 0 (a count that rounds to 0 elements: not judged).
for rep in 1 2; do
    printf '%s\n%s\n%s\n%s\n%s\n' "$h" \
        "all_reduce,2,float,sum,-1,0,0,out,10.000,0,0,0" \
        "all_reduce,2,float,sum,-1,8,2,out,0.600,0.013,0.013,0" \
        "all_reduce,2,float,sum,-1,32768,8192,out,5.000,6.5,6.5,0" \
        "all_reduce,2,float,sum,-1,8388608,2097152,out,2000.000,4.19,4.19,0" >"$tmp/ferroccl.rep$rep.csv"
    printf '%s\n%s\n%s\n%s\n%s\n' "$h" \
        "all_reduce,2,float,sum,-1,0,0,out,0.010,0,0,0" \
        "all_reduce,2,float,sum,-1,8,2,out,0.200,0.04,0.04,0" \
        "all_reduce,2,float,sum,-1,32768,8192,out,10.000,3.2,3.2,0" \
        "all_reduce,2,float,sum,-1,8388608,2097152,out,1000.000,8.4,8.4,0" >"$tmp/ompi.rep$rep.csv"
done
out="$(python3 "$here/ratios.py" "$tmp" --peer ompi)" || true
check() { grep -qF -- "$1" <<<"$out" && ok "ratios: $2" || { bad "ratios: $2 (no line with: $1)"; echo "$out"; }; }
check "| 32K | 6.50 | 3.20 | 2.00x |" "busbw ratio from the paired times"
check "| 8 | 0.013 | 0.04 | 0.333x |" "small sizes"
check "3.00x |" "time ratio at 8 B"
check "every size >= 32K: busbw >= 1.0x Open MPI's: **missed** at 1 of 2 points; worst all_reduce 8M out at 0.500x (50% short of 1x)" \
    "1.0x verdict"
check "<= 2K: time per call <= 2x Open MPI's: **missed** at 1 of 1 points" "time verdict"
check "(Not judged: size 0, where the count per rank rounds to 0 elements: all_reduce out.)" "size 0 not judged"
grep -q '^all_reduce,2,ompi,32768,out,6.5,3.2,2,' "$tmp/ompi.ratios.csv" && ok "ratios CSV" || bad "ratios CSV"
grep -q 'not rotated\|rotated buffers' <<<"$out" && bad "ratios: no rotation note by default" ||
    ok "ratios: no rotation note by default"
out="$(python3 "$here/ratios.py" "$tmp" --peer ompi --rotate 0)" || true
check "Buffers not rotated (\`--rotate 0\`)" "rotation note with --rotate 0"
check "these runs reuse them (--rotate 0), so the verdicts are for information" "verdicts marked with --rotate 0"
sed -i 's/,0$/,3/' "$tmp/ompi.rep1.csv"
python3 "$here/ratios.py" "$tmp" --peer ompi >"$tmp/o" 2>&1 && bad "wrong results fail ratios.py" ||
    { grep -q 'WRONG RESULTS' "$tmp/o" && ok "wrong results are reported"; }

# Against the ideal peer a summary takes the verdicts' place: ferroccl at 1/4 of the
# ideal at 32K out of place, 4/5 in place, 1/2 at 8M; 8 B is below the summary's sizes.
mkdir "$tmp/ideal"
for rep in 1 2; do
    printf '%s\n' "$h" \
        "all_reduce,2,float,sum,-1,8,2,out,0.600,0.013,0.013,0" \
        "all_reduce,2,float,sum,-1,32768,8192,out,20.000,1.6,1.6,0" \
        "all_reduce,2,float,sum,-1,32768,8192,in,10.000,3.2,3.2,0" \
        "send_recv,2,float,none,-1,8388608,2097152,in,2000.000,4.19,4.19," >"$tmp/ideal/ferroccl.rep$rep.csv"
    printf '%s\n' "$h" \
        "all_reduce,2,float,sum,-1,8,2,out,0.200,0.04,0.04,0" \
        "all_reduce,2,float,sum,-1,32768,8192,out,5.000,6.5,6.5,0" \
        "all_reduce,2,float,sum,-1,32768,8192,in,8.000,4.1,4.1,0" \
        "send_recv,2,float,none,-1,8388608,2097152,in,1000.000,8.4,8.4," >"$tmp/ideal/ideal.rep$rep.csv"
done
out="$(python3 "$here/ratios.py" "$tmp/ideal" --peer ideal)" && ok "ratios --peer ideal exits 0" ||
    bad "ratios --peer ideal exits 0"
check "| 32K | 1.60 | 6.50 | 0.250x | 3.20 | 4.10 | 0.800x |" "ideal table"
check "- sizes >= 32K: median 0.500x, range 0.250x .. 0.800x over 3 points; lowest: all_reduce 32K out 0.250x, send_recv 8M in 0.500x, all_reduce 32K in 0.800x" \
    "ideal summary"
check "- sizes >= 8M: median 0.500x, range 0.500x .. 0.500x over 1 points; lowest: send_recv 8M in 0.500x" \
    "ideal summary per size band"
grep -q 'Verdicts against the targets' <<<"$out" && bad "ratios: no verdicts against the targets against ideal" ||
    ok "ratios: no verdicts against the targets against ideal"
grep -q '^all_reduce,2,ideal,32768,out,1.6,6.5,0.25,' "$tmp/ideal/ideal.ratios.csv" && ok "ideal ratios CSV" ||
    bad "ideal ratios CSV"

# 4 ranks against a 2-rank run: ferroccl keeps 40% of its 2-rank busbw at both points;
# the bare data movement reaches 45% of ferroccl's 2-rank busbw for send_recv (the
# machine's bound) but 60% for broadcast (ferroccl's own miss).
mkdir "$tmp/b2" "$tmp/b4"
row() { printf '%s,%s,float,none,0,8388608,2097152,%s,1000.000,%s,%s,0\n' "$1" "$2" "$3" "$4" "$4"; }
for rep in 1 2; do
    { echo "$h"; row send_recv 2 in 10; row broadcast 2 out 10; } >"$tmp/b2/ferroccl.rep$rep.csv"
    { echo "$h"; row send_recv 2 in 8; row broadcast 2 out 8; } >"$tmp/b2/ideal.rep$rep.csv"
    { echo "$h"; row send_recv 4 in 4; row broadcast 4 out 4; } >"$tmp/b4/ferroccl.rep$rep.csv"
    { echo "$h"; row send_recv 4 in 4.5; row broadcast 4 out 6; } >"$tmp/b4/ideal.rep$rep.csv"
    { echo "$h"; row send_recv 4 in 3; row broadcast 4 out 3; } >"$tmp/b4/ompi.rep$rep.csv"
done
out="$(python3 "$here/ratios.py" "$tmp/b4" --peer ideal --baseline "$tmp/b2")" || true
check "| send_recv | 8M | in | 0.40 | 0.45 | 0.56 |" "4 ranks against 2: table"
check "- ferroccl below 50% at 2 of 2 points" "4 ranks against 2: misses"
check "(bounded by this machine) at 1: send_recv 8M in 0.40 (ideal 0.45)" "4 ranks against 2: the machine's bound"
check "did not run) at 1: broadcast 8M out 0.40 (ideal 0.60)" "4 ranks against 2: ferroccl's own miss"
rm "$tmp"/b4/ideal.*
out="$(python3 "$here/ratios.py" "$tmp/b4" --peer ompi --baseline "$tmp/b2")" || true
check "4 ranks, >= 8M: busbw >= 50% of the 2-rank run's ($tmp/b2): **missed** at 2 of 2 points" \
    "4 ranks against 2: the verdict against Open MPI's run"
check "- bound: not measured (run --peer ideal --nranks 4 into the same --out)" "4 ranks against 2: no ideal run"

# Against another build of ferroccl (--peer base): the points lost in every repetition
# beyond the noise. 8 B: half as fast in both repetitions (lost); 32K: slower in one,
# faster in the other (noise); 8M: 3% slower in both (within the 5% default).
rc=0
"$here/run.sh" --peer base >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] && ok "run.sh refuses --peer base without --base" ||
    bad "run.sh refuses --peer base without --base (exit $rc, want 2)"
rc=0
"$here/run.sh" --base /nowhere >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] && ok "run.sh refuses --base without --peer base" ||
    bad "run.sh refuses --base without --peer base (exit $rc, want 2)"
mkdir "$tmp/base"
for rep in 1 2; do
    t32=12.500
    [ "$rep" -eq 1 ] || t32=8.000
    printf '%s\n' "$h" \
        "all_reduce,2,float,sum,-1,8,2,out,2.000,0.008,0.008,0" \
        "all_reduce,2,float,sum,-1,32768,8192,out,$t32,5,5,0" \
        "all_reduce,2,float,sum,-1,8388608,2097152,in,1030.000,8.1,8.1,0" >"$tmp/base/ferroccl.rep$rep.csv"
    printf '%s\n' "$h" \
        "all_reduce,2,float,sum,-1,8,2,out,1.000,0.016,0.016,0" \
        "all_reduce,2,float,sum,-1,32768,8192,out,10.000,6.5,6.5,0" \
        "all_reduce,2,float,sum,-1,8388608,2097152,in,1000.000,8.4,8.4,0" >"$tmp/base/base.rep$rep.csv"
done
out="$(python3 "$here/ratios.py" "$tmp/base" --peer base)" && ok "ratios --peer base exits 0" ||
    bad "ratios --peer base exits 0"
check "- slower in every repetition and by more than 5% at the median: **1** of 3 points: all_reduce 8 out 0.500x" \
    "base: the lost point, not the noisy ones"
check "- sizes < 32K: median 0.500x, range 0.500x .. 0.500x over 1 points" "base summary per size band"
out="$(python3 "$here/ratios.py" "$tmp/base" --peer base --noise 0.6)" || true
check "by more than 60% at the median: **none** of 3 points" "base: --noise"
grep -q 'Verdicts against the targets' <<<"$out" && bad "ratios: no verdicts against the targets against base" ||
    ok "ratios: no verdicts against the targets against base"

# Debian's openmpi-bin brings the mpicc wrapper without MPI's headers (libopenmpi-dev).
if command -v mpicc >/dev/null && echo '#include <mpi.h>' | mpicc -E - >/dev/null 2>&1; then
    mpicc -O2 -Wall -Werror -o "$tmp/ompi_bench" "$here/ompi_bench.c" && ok "ompi_bench.c compiles" ||
        bad "ompi_bench.c compiles"
else
    echo "skip: ompi_bench.c (no mpicc, or no mpi.h: libopenmpi-dev is not installed)"
fi

# The ideal peer, built by the same command as run.sh's. Its runs go through timeout:
# a shim that loses a rank would hang at a barrier, and CI with it.
ideal_csv() { # CSV NRANKS NSIZES: every collective, both placements where it has them, right results
    python3 - "$@" <<'PY'
import csv, sys
path, nranks, nsizes = sys.argv[1], sys.argv[2], int(sys.argv[3])
colls = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
         "all_to_all", "all_to_allv", "gather", "scatter", "send_recv"]
# As ompi_bench.c: all_to_allv has no in-place row, send_recv in place is not checked.
want = {(c, pl) for c in colls for pl in ("out", "in") if (c, pl) != ("all_to_allv", "in")}
got, errs = {}, []
for r in csv.DictReader(open(path, newline="")):
    k = (r["collective"], r["placement"])
    got[k] = got.get(k, 0) + 1
    where = f"{k[0]} {r['size_bytes']} {k[1]}"
    if r["wrong"] != ("" if k == ("send_recv", "in") else "0"):
        errs.append(f"{where}: wrong {r['wrong']!r}")
    if r["nranks"] != nranks:
        errs.append(f"{where}: nranks {r['nranks']}")
for k in sorted(want | set(got)):
    n = nsizes if k in want else 0
    if got.get(k, 0) != n:
        errs.append(f"{k[0]} {k[1]}: {got.get(k, 0)} rows, not {n}")
print("\n".join(errs[:10]))
sys.exit(1 if errs else 0)
PY
}
ideal_run() { # NP NSIZES SWEEP...: one run of every collective, checked
    local np=$1 nsz=$2 what="ideal_bench --np $1 ${*:3}" rc=0
    shift 2
    timeout 120 "$tmp/ideal_bench" --np "$np" all "$@" -n 2 -w 1 --max-time 0 --csv "$tmp/ideal$np.csv" \
        >"$tmp/ideal$np.log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] && ok "$what exits 0" || { bad "$what exits 0 (exit $rc)"; tail -5 "$tmp/ideal$np.log"; }
    echo "(no CSV)" >"$tmp/o"
    if [ -s "$tmp/ideal$np.csv" ] && ideal_csv "$tmp/ideal$np.csv" "$np" "$nsz" >"$tmp/o" 2>&1; then
        ok "$what: every collective and placement, right results"
    else
        bad "$what: every collective and placement, right results"; cat "$tmp/o"
    fi
}
if ! command -v gcc >/dev/null; then
    echo "skip: ideal_bench (no gcc)"
elif gcc -O3 -march=native -Wall -Werror -DFCCL_IDEAL -I"$here/ideal" -o "$tmp/ideal_bench" \
    "$here/ompi_bench.c" "$here/ideal/ideal_mpi.c"; then
    ok "ideal_bench compiles"
    ideal_run 2 6 -b 8 -e 256K -f 8 # 8 64 512 4K 32K 256K
    ideal_run 3 3 -b 1K -e 64K -f 8 # 3 ranks: counts that do not divide evenly
    # A nonzero exit alone could be a crash: the CSV must show the wrong elements too.
    rc=0
    COMPARE_BENCH_CORRUPT=1 timeout 120 "$tmp/ideal_bench" --np 2 all_reduce -b 1K -e 1K -n 2 -w 1 --max-time 0 \
        --csv "$tmp/corrupt.csv" >"$tmp/corrupt.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q ',[1-9][0-9]*$' "$tmp/corrupt.csv" 2>/dev/null; then
        ok "ideal_bench reports wrong results (exit $rc)"
    else
        bad "ideal_bench reports wrong results (COMPARE_BENCH_CORRUPT=1: exit $rc)"; tail -5 "$tmp/corrupt.log"
    fi
else
    bad "ideal_bench compiles"
fi
# bench/device_compare.py: its table math on made-up sweeps, then a CPU run (host memory,
# Gloo on CPU tensors where torch is found): every target row judged or said why not.
root="$(cd "$here/../.." && pwd)"
bash -n "$root/bench/device_compare.sh" && python3 -m py_compile "$root/bench/device_compare.py" &&
    ok "device_compare parses" || bad "device_compare parses"
python3 "$root/tools/compare/gloo_bench.py" --help | grep -q -- '--device {cpu,cuda}' &&
    ok "gloo_bench.py --device" || bad "gloo_bench.py --device"
out="$(python3 "$root/bench/device_compare.py" --selftest)" && grep -q ' 0 failed' <<<"$out" &&
    ok "device_compare selftest: $out" || { bad "device_compare selftest"; echo "$out"; }
if [ -x "$root/target/release/ferroccl-bench" ]; then
    rc=0
    timeout 300 bash "$root/bench/device_compare.sh" --device cpu --nranks 2 -b 8 -e 4K --max-time 0.01 \
        --out "$tmp/dc" >"$tmp/dc.out" 2>"$tmp/dc.err" || rc=$?
    [ "$rc" -eq 0 ] && ok "device_compare.sh --device cpu exits 0" ||
        { bad "device_compare.sh --device cpu exits 0 (exit $rc)"; tail -5 "$tmp/dc.err"; }
    if python3 - "$tmp/dc" <<'PY'; then
import json, sys
j = json.load(open(sys.argv[1] + "/device-compare.json"))
rows, errs = j["targets"], []
# At 2 ranks: all_reduce and all_gather busbw, 4 more busbw rows, 6 small-size rows with
# and 6 without MPS, 1 MiB all_reduce, 6 host-time rows.
if len(rows) != 25:
    errs.append(f"{len(rows)} target rows, not 25")
for r in rows:
    if r["verdict"] not in ("met", "missed") and not r["verdict"].startswith("not measured ("):
        errs.append(f"verdict {r['verdict']!r}")
    if (r["verdict"] in ("met", "missed")) != (r["ferroccl"] is not None):
        errs.append(f"{r['target']} {r['collective']}: verdict {r['verdict']!r} with value {r['ferroccl']!r}")
small = [r for r in rows if r["target"].endswith("without MPS")]
if not all(r["ferroccl"] is not None for r in small):
    errs.append("ferroccl's small sizes were not read")
if j["torch"] and not all(r["gloo"] is not None for r in small):
    errs.append("torch is there but Gloo's small sizes were not read")
if not j["torch"] and not any("torch is not importable" in n for n in j["notes"]):
    errs.append("no torch, and no note saying so")
if errs:
    print("\n".join(errs))
sys.exit(1 if errs else 0)
PY
        ok "device_compare --device cpu: every target judged or said why not ($(grep -o '[0-9]* met, .*' "$tmp/dc/device-compare.md"))"
    else
        bad "device_compare --device cpu: the record"; head -40 "$tmp/dc.out"
    fi
else
    echo "skip: device_compare.sh --device cpu (no target/release/ferroccl-bench)"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
