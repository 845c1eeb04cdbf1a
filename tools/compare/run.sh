#!/usr/bin/env bash
# ferroccl against its peers, side by side: builds what is missing, runs ferroccl-bench
# and the peer alternately (ferroccl, peer, ferroccl, peer, ...) over the same
# collectives and sizes, and prints ferroccl/peer ratios per collective and size with
# verdicts against docs/performance.md's targets, or, against the ideal peer (the bare data
# movement), how close ferroccl comes to it, or, against another build of ferroccl
# (--peer base --base PATH), which points this build lost (see tools/compare/README.md).
#
#   tools/compare/run.sh [--peer ompi|gloo|ideal|both|all|base] [--base PATH] [--nranks N[,N...]]
#                        [-b MIN] [-e MAX] [--reps R] [--rotate 0|1] [--transport auto|tcp]
#                        [--out DIR] [collectives...]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

usage() {
    cat <<EOF
usage: tools/compare/run.sh [--peer ompi|gloo|ideal|both|all|base] [--base PATH] [--nranks N[,N...]]
                            [-b MIN] [-e MAX] [--reps R] [--max-time S] [--rotate 0|1]
                            [--transport auto|tcp] [--out DIR] [collectives...]

Runs ferroccl-bench and a peer alternately, R times each, over the same collectives
and sizes (MIN, MIN*4, MIN*16, ... up to MAX, plus MAX itself when the factor 4 does
not land on it; default 8 .. 64M: 8 32 128 512 2K 8K 32K 128K 512K 2M 8M 32M 64M),
then prints per collective and size the busbw of both, the ratio ferroccl/peer (median
of the ratios within each repetition), the time ratio for sizes <= 2K, and verdicts
against docs/performance.md's targets (for ideal instead: the median, range and lowest
points of the ratios from 32K up; for base: the points this build lost). Tables and
CSVs go to DIR/n<N>/ (default tools/compare/out).

  --peer ompi|gloo|ideal|both|all|base
                          peer (default ompi): Open MPI (Debian's openmpi-bin, the
                          program tools/compare/ompi_bench.c), PyTorch's Gloo
                          (tools/compare/gloo_bench.py in tools/compare/.venv), or
                          ideal: the bare data movement, ompi_bench.c built with gcc
                          against the shim in tools/compare/ideal (a measured
                          ceiling, not a target); both = ompi and gloo, all = ompi,
                          gloo and ideal; base: another build of ferroccl (--base),
                          for a change's before and after
  --base PATH             with --peer base: the other build, as its ferroccl-bench
                          binary or a checkout whose target/release/ferroccl-bench is
                          built there first (cargo build --release --bin
                          ferroccl-bench; a no-op when up to date)
  --nranks N[,N...]       ranks (default 2); more than the cores is oversubscribed.
                          A list (2,4) runs each rank count in turn for every
                          collective of every repetition, so that a 4-rank figure
                          and the 2-rank one it is held against (docs/performance.md's 50%
                          target) are measured minutes apart at most
  -b MIN, -e MAX          sizes (default 8 and 64M; suffixes K M G)
  --reps R                repetitions of each side (default 3)
  --max-time S            time budget per size and placement (ferroccl-bench's
                          --max-time, default 0.25)
  --rotate 0|1            1 (default, as nccl-tests and docs/performance.md's figures): each
                          iteration uses the next slice of buffers as large as the
                          largest size, so calls up to 16M find them out of the
                          caches. 0: every call reuses the same buffers, which stay
                          in the caches up to their size, as in a program that calls
                          a collective again and again on one tensor. Both sides run
                          alike; docs/performance.md's targets are for 1
  --transport auto|tcp    ferroccl's transport (FERROCCL_TRANSPORT, for the ferroccl
                          side only): auto (default) uses shared memory between the
                          ranks of this host; tcp makes every rank a host of its own,
                          so ferroccl's TCP path is measured over loopback (against
                          Gloo, which always uses TCP). FERROCCL_NSOCKS, when set,
                          goes with it
  --out DIR               output directory (default tools/compare/out)
  collectives             any of ferroccl-bench's: all_reduce broadcast reduce
                          all_gather reduce_scatter all_to_all all_to_allv gather
                          scatter send_recv, or all (default all)

Installs on first use: openmpi-bin and libopenmpi-dev with apt-get (root) when mpicc
is missing; torch from PyPI into tools/compare/.venv (about 5 GB with its CUDA
dependencies: PyPI has no CPU-only torch for Linux x86_64).
EOF
}

peer=ompi base="" nranks=2 minb=8 maxb=64M reps=3 max_time=0.25 rotate=1 transport=auto out="$here/out"
colls=()
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) usage; exit 0 ;;
    --peer) peer="$2"; shift 2 ;;
    --peer=*) peer="${1#*=}"; shift ;;
    --base) base="$2"; shift 2 ;;
    --base=*) base="${1#*=}"; shift ;;
    --nranks | --np) nranks="$2"; shift 2 ;;
    --nranks=*) nranks="${1#*=}"; shift ;;
    -b) minb="$2"; shift 2 ;;
    -e) maxb="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --reps=*) reps="${1#*=}"; shift ;;
    --max-time) max_time="$2"; shift 2 ;;
    --rotate) rotate="$2"; shift 2 ;;
    --rotate=*) rotate="${1#*=}"; shift ;;
    --transport) transport="$2"; shift 2 ;;
    --transport=*) transport="${1#*=}"; shift ;;
    --out) out="$2"; shift 2 ;;
    -*) echo "run.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    *) colls+=("$1"); shift ;;
    esac
done
case "$peer" in
ompi | gloo | ideal | base) peers=("$peer") ;;
both) peers=(ompi gloo) ;;
all) peers=(ompi gloo ideal) ;;
*) echo "run.sh: --peer ompi, gloo, ideal, both, all or base, not $peer" >&2; exit 2 ;;
esac
[ "$peer" != base ] || [ -n "$base" ] ||
    { echo "run.sh: --peer base needs --base PATH: the other build's ferroccl-bench or its checkout" >&2; exit 2; }
[ -z "$base" ] || [ "$peer" = base ] || { echo "run.sh: --base goes with --peer base" >&2; exit 2; }
[[ "$nranks" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
    { echo "run.sh: --nranks needs a number >= 1 or a list of them (2,4), not $nranks" >&2; exit 2; }
IFS=, read -r -a nlist <<<"$nranks"
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --reps needs a number >= 1" >&2; exit 2; }
[[ "$rotate" =~ ^[01]$ ]] || { echo "run.sh: --rotate needs 0 or 1, not $rotate" >&2; exit 2; }
[[ "$transport" =~ ^(auto|tcp)$ ]] || { echo "run.sh: --transport needs auto or tcp, not $transport" >&2; exit 2; }
[ ${#colls[@]} -gt 0 ] || colls=(all)
# "all" is nccl-tests' set; each collective is run on its own (see the loop below).
expanded=()
for c in "${colls[@]}"; do
    if [ "$c" = all ]; then
        expanded+=(all_reduce broadcast reduce all_gather reduce_scatter all_to_all all_to_allv gather scatter send_recv)
    else
        expanded+=("$c")
    fi
done
colls=("${expanded[@]}")

bytes() { # 8, 2K, 64M -> bytes
    python3 -c 'import sys; s=sys.argv[1].strip().upper().removesuffix("IB").removesuffix("B"); u={"K":1<<10,"M":1<<20,"G":1<<30}.get(s[-1:],1); print(int(float(s[:-1] if u>1 else s)*u))' "$1"
}
minbytes="$(bytes "$minb")" maxbytes="$(bytes "$maxb")"
# The factor-4 sweep and, when it does not land on MAX, MAX on its own.
sweeps=("-b $minbytes -e $maxbytes -f 4")
last=$minbytes
while [ $((last * 4)) -le "$maxbytes" ]; do last=$((last * 4)); done
[ "$last" -eq "$maxbytes" ] || sweeps+=("-b $maxbytes -e $maxbytes -f 4")
common=(-n 20 -w 5 --max-time "$max_time" --rotate "$rotate")

log() { echo "== $*" >&2; }

# ---- build what is missing
fbench="$root/target/release/ferroccl-bench"
log "cargo build --release (a no-op when up to date)"
(cd "$root" && cargo build --release --quiet --bin ferroccl-bench) >&2
ompi_bin="$root/target/compare/ompi_bench"
if [[ " ${peers[*]} " == *" ompi "* ]]; then
    if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
        log "installing Open MPI from Debian's packages (apt-get install openmpi-bin libopenmpi-dev)"
        sudo=""
        [ "$(id -u)" -eq 0 ] || sudo=sudo
        t0=$SECONDS
        $sudo apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openmpi-bin libopenmpi-dev >&2
        log "apt-get took $((SECONDS - t0)) s"
    fi
    if [ ! -x "$ompi_bin" ] || [ "$here/ompi_bench.c" -nt "$ompi_bin" ]; then
        log "mpicc -O2 tools/compare/ompi_bench.c"
        mkdir -p "$(dirname "$ompi_bin")"
        mpicc -O2 -Wall -o "$ompi_bin" "$here/ompi_bench.c"
    fi
fi
# The ideal peer is the same harness program built against tools/compare/ideal's shim
# instead of MPI: gcc only, nothing to install. It is rebuilt when any of its three
# sources changed, as ompi_bench.c is shared with the Open MPI side.
ideal_bin="$root/target/compare/ideal_bench"
if [[ " ${peers[*]} " == *" ideal "* ]]; then
    command -v gcc >/dev/null || { echo "run.sh: --peer ideal needs gcc" >&2; exit 2; }
    if [ ! -x "$ideal_bin" ] || [ "$here/ompi_bench.c" -nt "$ideal_bin" ] ||
        [ "$here/ideal/ideal_mpi.c" -nt "$ideal_bin" ] || [ "$here/ideal/mpi.h" -nt "$ideal_bin" ]; then
        log "gcc -O3 -march=native -DFCCL_IDEAL tools/compare/ompi_bench.c tools/compare/ideal/ideal_mpi.c"
        mkdir -p "$(dirname "$ideal_bin")"
        gcc -O3 -march=native -Wall -Werror -DFCCL_IDEAL -I"$here/ideal" -o "$ideal_bin" \
            "$here/ompi_bench.c" "$here/ideal/ideal_mpi.c"
    fi
fi
# The base peer is ferroccl-bench of another build (it links ferroccl statically, so
# the binary is the whole build); a checkout is built first, as this one is above.
base_bin=""
if [ "$peer" = base ]; then
    if [ -d "$base" ]; then
        log "cargo build --release --bin ferroccl-bench in $base (the base build)"
        (cd "$base" && cargo build --release --quiet --bin ferroccl-bench) >&2
        base_bin="$(cd "$base" && pwd)/target/release/ferroccl-bench"
    else
        base_bin="$base"
    fi
    [ -x "$base_bin" ] || { echo "run.sh: --base $base: no ferroccl-bench at $base_bin" >&2; exit 2; }
    [ "$(readlink -f "$base_bin")" != "$(readlink -f "$fbench")" ] ||
        { echo "run.sh: --base names this build's own ferroccl-bench ($fbench)" >&2; exit 2; }
fi
venv="$here/.venv"
if [[ " ${peers[*]} " == *" gloo "* ]]; then
    if ! "$venv/bin/python" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
        log "installing torch from PyPI into tools/compare/.venv (about 5 GB with its CUDA dependencies)"
        t0=$SECONDS
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q torch numpy >&2
        log "pip took $((SECONDS - t0)) s"
    fi
fi

# ---- run, alternating
log "ferroccl's side${base_bin:+ and the base build}: FERROCCL_TRANSPORT=$transport${FERROCCL_NSOCKS:+ FERROCCL_NSOCKS=$FERROCCL_NSOCKS}"
for n in "${nlist[@]}"; do
    dir="$out/n$n"
    mkdir -p "$dir"
    # No stale repetitions or tables of an earlier run of the same peers; the tables
    # of another peer (run before with --peer of its own) stay.
    rm -f "$dir"/ferroccl.rep*.*
    for p in "${peers[@]}"; do
        rm -f "$dir/$p".rep*.* "$dir/$p.md" "$dir/$p.ratios.csv"
    done
done

run_side() { # side rep coll nranks: appends every sweep's rows of one collective to DIR/n<nranks>/side.repK.csv
    local side=$1 rep=$2 coll=$3 n=$4 dir="$out/n$4" sw
    local dst="$dir/$side.rep$rep.csv" tmp="$dir/.$side.part.csv"
    for sw in "${sweeps[@]}"; do
        # shellcheck disable=SC2086
        case "$side" in
        ferroccl) FERROCCL_TRANSPORT="$transport" "$fbench" --nranks "$n" $sw "${common[@]}" --csv "$tmp" "$coll" ;;
        ompi) mpirun --allow-run-as-root --oversubscribe -np "$n" "$ompi_bin" $sw "${common[@]}" --csv "$tmp" "$coll" ;;
        gloo) "$venv/bin/python" "$here/gloo_bench.py" --nranks "$n" $sw "${common[@]}" --csv "$tmp" "$coll" ;;
        ideal) "$ideal_bin" --np "$n" $sw "${common[@]}" --csv "$tmp" "$coll" ;;
        base) FERROCCL_TRANSPORT="$transport" "$base_bin" --nranks "$n" $sw "${common[@]}" --csv "$tmp" "$coll" ;;
        esac >> "$dir/$side.rep$rep.log" 2>&1 || { echo "run.sh: $side $coll failed (rep $rep); see $dir/$side.rep$rep.log" >&2; tail -5 "$dir/$side.rep$rep.log" >&2; return 1; }
        if [ -s "$dst" ]; then tail -n +2 "$tmp" >> "$dst"; else cat "$tmp" > "$dst"; fi
    done
    rm -f "$tmp"
}

# The machines we measure on share memory bandwidth with other tenants, whose load
# changes within seconds. So the two sides of every ratio run back to back, one
# collective at a time, and which side goes first alternates between repetitions
# (with several rank counts, so does which count goes first).
status=0
for rep in $(seq 1 "$reps"); do
    sides=(ferroccl "${peers[@]}")
    counts=("${nlist[@]}")
    if [ $((rep % 2)) -eq 0 ]; then
        sides=("${peers[@]}" ferroccl)
        counts=()
        for ((i = ${#nlist[@]} - 1; i >= 0; i--)); do counts+=("${nlist[i]}"); done
    fi
    log "repetition $rep/$reps: ${sides[*]} at ${counts[*]} ranks, one collective at a time"
    for n in "${counts[@]}"; do
        for s in "${sides[@]}"; do rm -f "$out/n$n/$s.rep$rep.csv" "$out/n$n/$s.rep$rep.log"; done
    done
    for c in "${colls[@]}"; do
        for n in "${counts[@]}"; do
            for s in "${sides[@]}"; do
                run_side "$s" "$rep" "$c" "$n" || status=1
            done
        done
    done
done

# ---- tables and verdicts
for n in "${nlist[@]}"; do
    dir="$out/n$n"
    baseline=()
    [ "$n" -eq 2 ] || [ ! -d "$out/n2" ] || baseline=(--baseline "$out/n2")
    for p in "${peers[@]}"; do
        echo
        python3 "$here/ratios.py" "$dir" --peer "$p" --rotate "$rotate" "${baseline[@]}" || status=1
        log "written: $dir/$p.md $dir/$p.ratios.csv (raw: $dir/*.rep*.csv, logs: $dir/*.rep*.log)"
    done
done
exit $status
