#!/usr/bin/env bash
# Cross-host tests on one Linux machine: each "host" is a network namespace plus a UTS
# namespace with its own hostname, linked to the others through veth pairs on a bridge
# that sits in a namespace of its own. Ranks start with an empty environment (env -i)
# plus FERROCCL_RANK, FERROCCL_WORLD_SIZE, FERROCCL_ROOT_ADDR and FERROCCL_SECRET (and
# the contract tests' FERROCCL_DEBUG=INFO and FERROCCL_TIMEOUT_MS). Cases: the C
# contract suite's collectives at 2x2 and 3x2 ranks (IPv4) and 2x2 (IPv6), a killed
# host, a cut host, an unreachable advertised address, and 2x2 under torchrun with no
# ferroccl variable (when the torch venv's torchrun exists). Everything created (namespaces,
# bridge, a private subnet picked at random and checked unused, per-namespace hosts
# files under /etc/netns) is removed on exit.
#
# Usage (root; after `cargo build --release` and the c_tests build, see README.md):
#   tests/multinode/run.sh [--host-addr] [--keep-logs] [--only REGEX] [--repeat N]
#     --host-addr   also give every rank FERROCCL_HOST_ADDR=<its host's address>
#     --keep-logs   keep every rank's output (the directory is printed at the end)
#     --only REGEX  run only the cases whose name matches (grep -E), e.g. '2x2 ipv4 test_alltoallv'
#     --repeat N    run the chosen cases N times (an intermittent failure, counted per run)
# Environment: FERROCCL_LIB_DIR (target/release), FERROCCL_C_TESTS_DIR (build/c_tests),
# FERROCCL_TORCH_VENV (~/.cache/ferroccl/torch-venv).
# Prints one PASS/FAIL/SKIP line per case and "multinode: N passed, M failed, K skipped";
# exits 1 if any case failed, 0 otherwise (also when namespaces cannot be made: SKIP).
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
lib=${FERROCCL_LIB_DIR:-$root/target/release}
ctests=${FERROCCL_C_TESTS_DIR:-$root/build/c_tests}
host_addr=0 keep=0 only="" repeat=1
# torchrun of the torch venv (scripts/python-install-test.sh makes it), for the 2x2 torchrun case.
torchrun="${FERROCCL_TORCH_VENV:-$HOME/.cache/ferroccl/torch-venv}/bin/torchrun"
while [ $# -gt 0 ]; do
  case "$1" in
    --host-addr) host_addr=1 ;;
    --keep-logs) keep=1 ;;
    --only) [ $# -ge 2 ] || { echo "run.sh: --only needs a regular expression" >&2; exit 64; }; only=$2; shift ;;
    --repeat)
      [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --repeat needs a positive count" >&2; exit 64; }
      repeat=$2; shift ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (known: --host-addr, --keep-logs, --only, --repeat, --help)" >&2; exit 64 ;;
  esac
  shift
done

# Contract binaries run per host layout; each must pass as a rank started from the environment.
contract_tests=(test_allreduce test_broadcast test_reduce test_allgather test_reducescatter
  test_alltoall test_alltoallv test_gather test_scatter test_sendrecv test_barrier test_group
  test_split test_comm)
proc_timeout=60         # seconds any rank process may live (a hang fails the case, not CI)
contract_timeout_ms=30000
kill_bound_ms=5000      # docs/robustness.md "Dead peers": checked every 100 ms
cut_lost_ms=3000        # FERROCCL_PEER_LOST_MS of the cut-host case
cut_bound_ms=7000       # ...which the kernel's keepalive and retransmission timers keep to within a second or so
unreachable_bound_ms=30000
fcclRemoteError=6

passed=0 failed=0 skipped=0
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
skip() { skipped=$((skipped + 1)); echo "SKIP $*"; }
summary() { echo "multinode: $passed passed, $failed failed, $skipped skipped"; }
# wanted NAME: whether --only lets case NAME run. round: the --repeat round (logs in $tmp/<round>/).
wanted() { [ -z "$only" ] || grep -qE -- "$only" <<<"$1"; }
round=1
skip_all() { skip "multinode: $*"; summary; exit 0; }

[ "$(id -u)" = 0 ] || skip_all "needs root to create network namespaces (run as root, or in a container with CAP_SYS_ADMIN and CAP_NET_ADMIN)"
for c in ip:iproute2 unshare:util-linux env:coreutils od:coreutils; do
  command -v "${c%%:*}" >/dev/null 2>&1 || skip_all "'${c%%:*}' is not installed (package ${c#*:})"
done

tag="fccl$$"            # namespace names unique to this run
brns="${tag}br"
made_ns=()
pids=()                 # ranks of the running job (the launcher execs into the rank)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fccl-multinode.XXXXXX")

net_down() {
  local ns
  for ns in "${made_ns[@]}"; do
    ip netns del "$ns" 2>/dev/null
    rm -rf "/etc/netns/$ns"   # the hosts file torchrun's case gives each host
  done
  made_ns=()
}
cleanup() {
  [ ${#pids[@]} -gt 0 ] && kill -KILL "${pids[@]}" 2>/dev/null
  net_down
  if [ "$keep" = 1 ]; then echo "multinode: logs in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'echo "multinode: interrupted" >&2; exit 130' INT
trap 'exit 143' TERM

# Every address on the machine, in every named namespace: a subnet we pick must not appear.
all_addrs() {
  ip -o addr show 2>/dev/null
  ip route show table all 2>/dev/null
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    ip -n "$ns" -o addr show 2>/dev/null
  done
}
pick_subnets() {
  local used i a b
  used=$(all_addrs)
  v4net="" v6net=""
  for i in $(seq 1 100); do
    a=$((16 + RANDOM % 224)) b=$((RANDOM % 256))
    if ! grep -q "[^0-9]10\.$a\.$b\." <<<"$used"; then v4net="10.$a.$b"; break; fi
  done
  for i in $(seq 1 100); do
    # as the library prints addresses (RFC 5952: no leading zeros, no zero group)
    a=$(printf 'fd%02x:%x:%x' $((RANDOM % 256)) $((RANDOM + 1)) $((RANDOM + 1)))
    if ! grep -qi "$a:" <<<"$used"; then v6net="$a"; break; fi
  done
  [ -n "$v4net" ] && [ -n "$v6net" ]
}

# net_up FAMILY NHOSTS: a bridge namespace and NHOSTS host namespaces ${tag}h<i>, each
# with eth0 on the bridge at <subnet>.<i+1> (4) or <subnet>::<i+1> (6). Sets addr[i].
net_up() {
  local fam=$1 n=$2 h ns
  addr=()
  ip netns add "$brns" || return 1
  made_ns+=("$brns")
  ip -n "$brns" link add br0 type bridge mcast_snooping 0 || return 1
  ip -n "$brns" link set br0 up || return 1
  for ((h = 0; h < n; h++)); do
    ns="${tag}h$h"
    ip netns add "$ns" || return 1
    made_ns+=("$ns")
    ip -n "$brns" link add "h$h" type veth peer name eth0 netns "$ns" || return 1
    ip -n "$brns" link set "h$h" master br0 up || return 1
    ip -n "$ns" link set lo up || return 1
    ip -n "$ns" link set eth0 up || return 1
    if [ "$fam" = 4 ]; then
      addr[h]="$v4net.$((h + 1))"
      ip -n "$ns" addr add "${addr[h]}/24" dev eth0 || return 1
    else
      addr[h]="$v6net::$((h + 1))"
      ip -n "$ns" addr add "${addr[h]}/64" dev eth0 nodad || return 1
    fi
  done
}

# start_rank HOST RANK LOG ENV... -- CMD...: one rank in host HOST's namespaces with a
# clean environment (only ENV); appends its pid to pids. ip, unshare, sh and env each
# exec the next, so the pid is the rank's and every rank's parent is this script.
start_rank() {
  local h=$1 r=$2 log=$3; shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  # first, so that a FERROCCL_HOST_ADDR among ENV (later on env's line) wins
  [ "$host_addr" = 1 ] && envs=("FERROCCL_HOST_ADDR=${addr[h]}" "${envs[@]}")
  ip netns exec "${tag}h$h" unshare --uts sh -c 'printf %s "$1" >/proc/sys/kernel/hostname && shift && exec "$@"' \
    sh "fccl-host$h-$$" env -i PATH="$PATH" FERROCCL_RANK="$r" "${envs[@]}" "$@" >"$log" 2>&1 &
  pids+=($!)
}

# Below the ephemeral range (32768-60999), where earlier jobs' connections leave ports behind.
port=$((20000 + RANDOM % 10000))
# job_env NRANKS: the rendezvous of a new job (its own port and secret) on host 0.
job_env() {
  port=$((port + 1))
  local a=${addr[0]}
  [[ "$a" == *:* ]] && a="[$a]"
  jenv=(FERROCCL_WORLD_SIZE="$1" FERROCCL_ROOT_ADDR="$a:$port"
    FERROCCL_SECRET="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')")
  job_start=$SECONDS
}

# wait_all: waits for every rank in pids, SIGKILLing those still running
# proc_timeout seconds after the job started; rc[i] is its status, hung[i] set if killed.
wait_all() {
  local i running
  hung=()
  while :; do
    running=0
    for i in "${!pids[@]}"; do kill -0 "${pids[i]}" 2>/dev/null && running=1; done
    [ "$running" = 0 ] && break
    if [ $((SECONDS - job_start)) -ge "$proc_timeout" ]; then
      for i in "${!pids[@]}"; do
        kill -0 "${pids[i]}" 2>/dev/null && hung[i]=1 && kill -KILL "${pids[i]}" 2>/dev/null
      done
      break
    fi
    sleep 0.05
  done
  rc=()
  for i in "${!pids[@]}"; do
    wait "${pids[i]}"
    rc[i]=$?
  done
  pids=()
}

show_logs() {           # the ends of the given logs, indented, for a failed case
  local f
  for f in "$@"; do
    echo "    --- ${f##*/}"
    grep -v ' seq [0-9]* ' "$f" | tail -n 8 | sed 's/^/    /'
  done
}

# contract_case FAMILY NHOSTS PER_HOST TEST
contract_case() {
  local fam=$1 nh=$2 ph=$3 t=$4 n=$(($2 * $3)) r bad="" name dir t0 ms got
  name="${nh}x${ph} ipv$fam $t"
  wanted "$name" || return
  if [ ! -x "$ctests/$t" ]; then
    fail "$name: $ctests/$t not built (build the C contract suite first, see README.md)"
    return
  fi
  dir="$tmp/$round/$fam-$nh-$t"
  mkdir -p "$dir"
  job_env "$n"
  t0=$(date +%s%N)
  for ((r = 0; r < n; r++)); do
    start_rank $((r / ph)) "$r" "$dir/rank$r.log" "${jenv[@]}" FERROCCL_DEBUG=INFO \
      FERROCCL_TIMEOUT_MS="$contract_timeout_ms" -- "$ctests/$t"
  done
  wait_all
  ms=$((($(date +%s%N) - t0) / 1000000))
  for ((r = 0; r < n; r++)); do
    if [ "${rc[r]}" = 77 ]; then
      skip "$name: rank $r skipped: $(grep -m1 -i skip "$dir/rank$r.log")"
      return
    fi
    if [ "${rc[r]}" != 0 ]; then
      bad+=" rank $r exit ${rc[r]}${hung[r]:+ (hung: killed after ${proc_timeout} s)};"
      continue
    fi
    # How the first communicator connected its ranks: PER_HOST ranks on this host (shared memory),
    # the rest elsewhere (TCP). Anything else means hosts were not told apart.
    got=$(grep -m1 -oE "Info: rank $r: [0-9]+ ranks on this host" "$dir/rank$r.log" | awk '{print $4}')
    [ "$got" = "$ph" ] || bad+=" rank $r saw ${got:-no connection log of} ranks on its host, not $ph;"
    # ...and it gave the peers on other hosts its host's address on the bridge.
    got=$(grep -m1 -oE "peers on other hosts reach this rank at [^ ]+" "$dir/rank$r.log" | awk '{print $NF}')
    [ "$got" = "${addr[r / ph]}" ] || bad+=" rank $r advertised ${got:-nothing}, not ${addr[r / ph]};"
  done
  if [ -z "$bad" ]; then
    pass "$name: $n ranks in $ms ms, $ph per host over shared memory, TCP between hosts at their own addresses"
  else
    fail "$name:$bad"
    show_logs "$dir"/rank*.log
  fi
}

# loop_job NAME DIR ENV...: 3x2 ranks running hostloss (a loop of checked 1 MiB
# all_reduces, each rank with ENV) until every rank is 20 calls in; fails NAME and
# returns 1 if that does not happen within 30 s or ranks 2 and 3 are not the launched pids.
loop_job() {
  local name=$1 dir=$2 n=6 r i; shift 2
  mkdir -p "$dir/ready"
  job_env "$n"
  for ((r = 0; r < n; r++)); do
    start_rank $((r / 2)) "$r" "$dir/rank$r.log" "${jenv[@]}" FCCL_MN_READY_DIR="$dir/ready" "$@" \
      -- "$root/build/multinode/hostloss" 40 262144 20
  done
  for i in $(seq 1 300); do       # every rank 20 calls in: at most 30 s
    [ "$(ls "$dir/ready" | grep -c '^rank')" = "$n" ] && break
    for r in "${!pids[@]}"; do kill -0 "${pids[r]}" 2>/dev/null || break 2; done
    sleep 0.1
  done
  if [ "$(ls "$dir/ready" | grep -c '^rank')" != "$n" ]; then
    kill -KILL "${pids[@]}" 2>/dev/null
    wait_all
    fail "$name: not every rank got 20 all_reduces in (ready: $(ls "$dir/ready" | tr '\n' ' '))"
    show_logs "$dir"/rank*.log
    return 1
  fi
  if [ "$(cat "$dir/ready/rank2") $(cat "$dir/ready/rank3")" != "${pids[2]} ${pids[3]}" ]; then  # wait_all's hard timeout relies on this
    kill -KILL "${pids[@]}" 2>/dev/null
    wait_all
    fail "$name: ranks 2 and 3 run as pids $(cat "$dir/ready/rank2") $(cat "$dir/ready/rank3"), not as the launched ${pids[2]} ${pids[3]} (ip netns exec or unshare forked)"
    return 1
  fi
}

# survivors NAME DIR T0 BOUND_MS: after loop_job and wait_all, ranks 0, 1, 4 and 5 must
# each have failed with fcclRemoteError naming rank 2 or 3 within BOUND_MS of T0 (ns).
survivors() {
  local name=$1 dir=$2 t0=$3 bound=$4 r line code at ms bad="" times=()
  for r in 0 1 4 5; do
    line=$(grep -m1 '^hostloss rank' "$dir/rank$r.log")
    if [[ "$line" =~ error\ code\ ([0-9]+)\ .*at_ns\ ([0-9]+) ]]; then
      code=${BASH_REMATCH[1]} at=${BASH_REMATCH[2]}
      ms=$(((at - t0) / 1000000))
      times+=("$ms")
      [ "$code" = "$fcclRemoteError" ] || bad+=" rank $r: code $code, not fcclRemoteError;"
      [ "$ms" -le "$bound" ] || bad+=" rank $r: detected after $ms ms (bound $bound);"
      grep -qE 'rank (2|3)([^0-9]|$)' <<<"${line#*: }" || bad+=" rank $r: message does not name rank 2 or 3;"
    else
      bad+=" rank $r (exit ${rc[r]}${hung[r]:+, hung: killed after ${proc_timeout} s}): ${line:-no result line};"
    fi
  done
  if [ -z "$bad" ]; then
    pass "$name: ranks 0,1,4,5 failed with fcclRemoteError after $(IFS=,; echo "${times[*]}") ms (bound $bound); rank 0 said: $(grep -m1 -o 'calls (async.*' "$dir/rank0.log")"
  else
    fail "$name:$bad"
    show_logs "$dir"/rank*.log
  fi
}

# Kills both ranks of host 1 of 3x2 during a loop of all_reduces; the survivors must
# fail with fcclRemoteError naming rank 2 or 3 within kill_bound_ms (second-hand over
# TCP too: a survivor that stopped because of them says so before it closes).
kill_case() {
  local name="3x2 ipv4 killed host" dir="$tmp/$round/kill" t_kill v
  wanted "$name" || return
  loop_job "$name" "$dir" || return
  sleep 0.3
  t_kill=$(date +%s%N)
  kill -KILL "${pids[2]}" "${pids[3]}"
  local victims=("${pids[2]}" "${pids[3]}")
  wait_all
  for v in "${victims[@]}"; do rm -f /dev/shm/fccl-*-p"$v"; done   # what a SIGKILL leaves behind
  survivors "$name" "$dir" "$t_kill" "$kill_bound_ms"
}

# Cuts host 1's cable (its port on the bridge goes down) during a loop of all_reduces
# at 3x2 with FERROCCL_PEER_LOST_MS=cut_lost_ms: host 1's ranks live on but say
# nothing, not even that their sockets closed. The survivors must fail with
# fcclRemoteError naming rank 2 or 3 within cut_bound_ms, long before
# FERROCCL_TIMEOUT_MS (left at its default, 10 minutes).
cut_case() {
  local name="3x2 ipv4 cut host" dir="$tmp/$round/cut" t_cut
  wanted "$name" || return
  loop_job "$name" "$dir" FERROCCL_PEER_LOST_MS="$cut_lost_ms" || return
  sleep 0.3
  t_cut=$(date +%s%N)
  ip -n "$brns" link set h1 down
  wait_all
  ip -n "$brns" link set h1 up
  survivors "$name" "$dir" "$t_cut" "$cut_bound_ms"
}

# Host 1's ranks of a 2x2 job advertise an address no namespace holds; every rank must
# fail within unreachable_bound_ms (FERROCCL_TIMEOUT_MS at its default) naming it.
unreachable_case() {
  local name="2x2 ipv4 unreachable address" dir="$tmp/$round/unreach" n=4 r t0 ms line bad="" worst=0 el
  wanted "$name" || return
  local nowhere="$v4net.250"
  mkdir -p "$dir"
  job_env "$n"
  t0=$(date +%s%N)
  for ((r = 0; r < n; r++)); do
    local extra=()
    [ $((r / 2)) = 1 ] && extra=(FERROCCL_HOST_ADDR="$nowhere")
    start_rank $((r / 2)) "$r" "$dir/rank$r.log" "${jenv[@]}" "${extra[@]}" -- "$root/build/multinode/hostloss" 1 1
  done
  wait_all
  ms=$((($(date +%s%N) - t0) / 1000000))
  for ((r = 0; r < n; r++)); do
    line=$(grep -m1 '^hostloss rank' "$dir/rank$r.log")
    if [[ "$line" =~ init\ error\ code\ [0-9]+\ .*after\ ([0-9]+)\ ms:\ (.*)$ ]]; then
      el=${BASH_REMATCH[1]}
      [ "$el" -gt "$worst" ] && worst=$el
      [ "$el" -le "$unreachable_bound_ms" ] || bad+=" rank $r failed after $el ms (bound $unreachable_bound_ms);"
      grep -qF "$nowhere" <<<"${BASH_REMATCH[2]}" || bad+=" rank $r's message does not name $nowhere;"
      grep -qE 'rank (2|3)([^0-9]|$)' <<<"${BASH_REMATCH[2]}" || bad+=" rank $r's message does not name rank 2 or 3;"
    elif [ -n "${hung[r]:-}" ]; then
      bad+=" rank $r hung (killed after ${proc_timeout} s);"
    else
      bad+=" rank $r (exit ${rc[r]}): ${line:-no result line};"
    fi
  done
  if [ -z "$bad" ]; then
    pass "$name: all 4 ranks failed within $worst ms (bound $unreachable_bound_ms); rank 0 said: $(grep -m1 -o 'ms: .*' "$dir/rank0.log" | cut -c5-)"
  else
    fail "$name (${ms} ms):$bad"
    show_logs "$dir"/rank*.log
  fi
}

for f in "$lib/libferroccl.so" "$root/tests/multinode/hostloss.c"; do
  [ -e "$f" ] || { echo "run.sh: $f not found (run cargo build --release first)" >&2; exit 2; }
done
mkdir -p "$root/build/multinode"
cc -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I"$root/include" "$root/tests/multinode/hostloss.c" \
  -o "$root/build/multinode/hostloss" -L"$lib" -lferroccl -Wl,-rpath,"$lib" ||
  { echo "run.sh: cannot build tests/multinode/hostloss.c" >&2; exit 2; }

# 2 hosts x 2 ranks started by torchrun on each host (c10d rendezvous at host 0), no
# ferroccl variable at all: rank 0 passes the unique id through torchrun's store, and
# each host's ranks must advertise that host's address. torchrun looks up its own
# hostname, so each host gets a hosts file (ip netns exec mounts /etc/netns/NS/hosts).
torchrun_case() {
  local name="2x2 ipv4 torchrun" dir="$tmp/$round/torchrun" h r bad="" ok
  wanted "$name" || return
  if [ ! -x "$torchrun" ]; then
    skip "$name: no torchrun at $torchrun (scripts/python-install-test.sh makes the torch venv)"
    return
  fi
  mkdir -p "$dir"
  port=$((port + 1))
  for h in 0 1; do
    mkdir -p "/etc/netns/${tag}h$h"
    printf '127.0.0.1 localhost\n%s fccl-host0-%s\n%s fccl-host1-%s\n' "${addr[0]}" $$ "${addr[1]}" $$ >"/etc/netns/${tag}h$h/hosts"
  done
  job_start=$SECONDS
  for h in 0 1; do
    ip netns exec "${tag}h$h" unshare --uts sh -c 'printf %s "$1" >/proc/sys/kernel/hostname && shift && exec "$@"' \
      sh "fccl-host$h-$$" env -i PATH="$PATH" HOME="$HOME" FERROCCL_DEBUG=INFO FERROCCL_TIMEOUT_MS="$contract_timeout_ms" \
      "$torchrun" --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "${addr[0]}:$port" \
      --rdzv-id "fccl$$" --no-python "$ctests/test_allreduce" >"$dir/host$h.log" 2>&1 &
    pids+=($!)
  done
  wait_all
  for h in 0 1; do
    [ "${rc[h]}" = 0 ] || bad+=" host $h's torchrun exit ${rc[h]}${hung[h]:+ (hung: killed after ${proc_timeout} s)};"
    ok=$(grep -c 'test_allreduce: process, 4 rank(s): passed' "$dir/host$h.log")
    [ "$ok" = 2 ] || bad+=" host $h: $ok of its 2 ranks passed;"
    r=$(grep -c "reach this rank at ${addr[h]} " "$dir/host$h.log")
    [ "$r" = 2 ] || bad+=" host $h: $r of its 2 ranks advertised ${addr[h]};"
    grep -q "2 ranks on this host" "$dir/host$h.log" || bad+=" host $h: its ranks did not find each other on one host;"
  done
  if [ -z "$bad" ]; then
    pass "$name: 4 ranks, no ferroccl variable, each host advertising its own address"
  else
    fail "$name:$bad"
    show_logs "$dir"/host*.log
  fi
}

pick_subnets || skip_all "found no unused private subnet (10.x.y.0/24 and fdxx:xxxx:xxxx::/64) in 100 tries"
if ! net_up 4 3 2>"$tmp/net.err"; then
  skip_all "cannot create network namespaces, veth pairs or a bridge: $(head -n1 "$tmp/net.err")"
fi
echo "multinode: hosts ${addr[*]} (namespaces ${tag}h*, bridge in $brns)$([ "$host_addr" = 1 ] && echo ", FERROCCL_HOST_ADDR set")"
for ((round = 1; round <= repeat; round++)); do
  for t in "${contract_tests[@]}"; do contract_case 4 2 2 "$t"; done
  for t in "${contract_tests[@]}"; do contract_case 4 3 2 "$t"; done
  kill_case
  cut_case
  unreachable_case
  torchrun_case
done
net_down

if [ ! -d /proc/sys/net/ipv6 ]; then
  skip "2x2 ipv6: IPv6 is disabled on this machine"
elif ! net_up 6 2 2>"$tmp/net6.err"; then
  fail "2x2 ipv6: cannot set up IPv6 namespaces: $(head -n1 "$tmp/net6.err")"
else
  echo "multinode: hosts ${addr[*]}"
  for ((round = 1; round <= repeat; round++)); do
    for t in "${contract_tests[@]}"; do contract_case 6 2 2 "$t"; done
  done
fi
net_down

summary
[ "$failed" = 0 ]
