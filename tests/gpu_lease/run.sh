#!/usr/bin/env bash
# scripts/gpu-lease.sh (bench/gpu_lease.py) on the simulated GPU:
#   (a) a whole --quick run ends within its budget and lease.md holds the profile lines,
#       one path line per collective, the side-by-side lines, the small-size lines, the
#       ping-pong line, the target table, and says SIMULATED; with a stand-in for
#       nvidia-cuda-mps-control on PATH (and root), MPS is started and stopped again;
#   (b) a run killed by SIGTERM about 25 s after it started keeps the lines measured so
#       far and leaves no process behind (children found by a tag in their environment:
#       the lease's Python, ferroccl-bench and its ranks, memop_pingpong, ...) and no MPS;
#   (c) a run with --budget 30 ends in time and says which parts it skipped;
#   (d) with a stand-in for a Python with torch (fake_torch_python.py: made-up figures),
#       the torch copy and Gloo parts run: side-by-side lines with both sides and a
#       ratio, a collective Gloo refuses named as such, Gloo's column in the targets.
# Needs cargo (or built binaries in target/release), cc and python3. About 1.5 minutes.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
tmp="$(mktemp -d)"
tag="gpu-lease-test-$$-$RANDOM"
fail() { echo "tests/gpu_lease: FAIL: $*" >&2; exit 1; }
# Live processes carrying the tag: "pid name" per line.
tagged() {
  python3 - "$tag" <<'PY'
import os, sys
want = ("FERROCCL_LEASE_TEST_TAG=" + sys.argv[1]).encode()
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) == os.getpid():
        continue
    try:
        env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
        stat = open(f"/proc/{d}/stat").read()
    except OSError:
        continue
    if want in env and stat[stat.rfind(")") + 2] not in "ZX":
        print(d, open(f"/proc/{d}/comm").read().strip())
PY
}
cleanup() {
  # Never leave a run of ours behind, even when a check failed.
  tagged | while read -r pid _; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# A stand-in for nvidia-cuda-mps-control: -d starts a "daemon" in its own session (a
# sleep whose argv[0] is the real daemon's name, as the lease looks for it); "quit" on
# stdin stops it.
mkdir -p "$tmp/fakebin" "$tmp/mps"
cat >"$tmp/fakebin/nvidia-cuda-mps-control" <<'SH'
#!/usr/bin/env bash
state="${FERROCCL_FAKE_MPS_DIR:?}"
if [ "${1:-}" = -d ]; then
  setsid bash -c 'echo $$ >"$0/pid"; exec -a nvidia-cuda-mps-control sleep 600' "$state" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 50); do [ -s "$state/pid" ] && break; sleep 0.1; done
  echo started >>"$state/log"
  exit 0
fi
read -r cmd || true
if [ "$cmd" = quit ] && [ -s "$state/pid" ]; then
  kill "$(cat "$state/pid")" 2>/dev/null
  rm -f "$state/pid"
  echo quit >>"$state/log"
fi
SH
chmod +x "$tmp/fakebin/nvidia-cuda-mps-control"
mps_alive() { [ -s "$tmp/mps/pid" ] && kill -0 "$(cat "$tmp/mps/pid")" 2>/dev/null; }

if command -v cargo >/dev/null; then cargo build --release --quiet; fi
bash scripts/sim-gpu.sh true  # builds the simulator now, not inside a timed run
lease() {  # lease OUT ARGS...: the lease on the simulated GPU, tagged (sim-gpu.sh execs it)
  local out="$1"; shift
  exec env FERROCCL_LEASE_TEST_TAG="$tag" OUT="$out" PATH="$tmp/fakebin:$PATH" FERROCCL_FAKE_MPS_DIR="$tmp/mps" \
    bash scripts/sim-gpu.sh bash scripts/gpu-lease.sh "$@"
}
has() { grep -qE -- "$2" "$1" || fail "$(basename "$(dirname "$1")")/lease.md lacks /$2/"; }

# ---------------------------------------------------------------- (a) a whole --quick run
echo "tests/gpu_lease: (a) --quick --budget 240"
t=$SECONDS
(lease "$tmp/a" --quick --budget 240) >"$tmp/a.log" 2>&1 || { tail -20 "$tmp/a.log" >&2; fail "(a) exit $?"; }
ta=$((SECONDS - t))
md="$tmp/a/lease.md"
[ "$ta" -le 245 ] || fail "(a) took ${ta} s with a budget of 240 s"
has "$md" 'SIMULATED GPU: figures mean nothing'
if [ -f tools/simgpu/capture-profile.py ]; then
  has "$md" '^- \[[0-9]+s\] profile: .*CU_DEVICE_ATTRIBUTE_'
  has "$md" '^- \[[0-9]+s\] profile: exit 0'
else
  has "$md" 'skipped: the device attribute profile: tools/simgpu/capture-profile.py is missing'
fi
for c in all_reduce all_gather all_to_all reduce_scatter broadcast reduce; do
  has "$md" "^- \[[0-9]+s\] path $c: .*rank 0 comm .* backend [a-z]+ algorithm "
  for n in 2 4; do
    for s in 1M 4M; do has "$md" "^- \[[0-9]+s\] side by side $c, $n ranks, $s: ferroccl [0-9.]+ GB/s, gloo .*roofline"; done
    for s in '8 B' 64K 1M; do has "$md" "^- \[[0-9]+s\] small $c, $n ranks, $s.*: [0-9.]+ us per call .*host [0-9.]+ us per call"; done
  done
done
has "$md" 'control words work'
has "$md" '^- \[[0-9]+s\] FERROCCL_CHECK=0: device calls post their descriptors'
for c in all_reduce all_gather all_to_all reduce_scatter broadcast reduce; do
  has "$md" "^- \[[0-9]+s\] small $c, 2 ranks, 8 B, FERROCCL_CHECK=1: [0-9.]+ us per call \(FERROCCL_CHECK=0: [0-9.]+ us\)"
done
has "$md" 'ping-pong without MPS: memory operations only: [0-9.]+ us per round trip'
has "$md" 'skipped: Gloo|side by side .*gloo [0-9.]+ GB/s'
has "$md" '^\| target \| collective \| ranks \| goal \| ferroccl \| gloo \| verdict \|$'
has "$md" '^[0-9]+ met, [0-9]+ missed, [0-9]+ not measured, of [0-9]+\.$'
has "$md" '^- \[[0-9]+s\] done in [0-9]+ s of the 240 s budget'
if [ "$(id -u)" = 0 ]; then
  has "$md" 'MPS: started' && has "$md" 'ping-pong with MPS: memory operations only'
  has "$md" 'small with MPS all_reduce, 2 ranks' && has "$md" 'MPS: stopped'
  grep -qx quit "$tmp/mps/log" || fail "(a) MPS was started but not told to quit"
else
  has "$md" 'skipped: MPS .*starting MPS needs root'
fi
mps_alive && fail "(a) left MPS running"
left="$(tagged)"; [ -z "$left" ] || fail "(a) left processes behind: $left"
echo "tests/gpu_lease: (a) ok in ${ta} s"

# ---------------------------------------------------------------- (b) SIGTERM at ~25 s
echo "tests/gpu_lease: (b) SIGTERM about 25 s into a full-size run"
rm -f "$tmp/mps/log"
# In a subshell that execs: $! is the pid of gpu-lease.sh itself.
(lease "$tmp/b" --budget 240) >"$tmp/b.log" 2>&1 &
pid=$!
for _ in $(seq 600); do [ -s "$tmp/b/lease.md" ] && break; sleep 0.1; done
[ -s "$tmp/b/lease.md" ] || fail "(b) no lease.md after 60 s"
sleep 25
kill -0 "$pid" 2>/dev/null || fail "(b) the run ended before it could be killed"
busy="$(tagged | grep -vE 'gpu-lease|bash$' || true)"
before="$(grep -c '' "$tmp/b/lease.md")"
kill -TERM "$pid"
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "(b) still running 30 s after SIGTERM"
wait "$pid" && fail "(b) exit 0 after SIGTERM" || rc=$?
[ "$rc" = 143 ] || fail "(b) exit $rc after SIGTERM (want 143)"
[ -n "$busy" ] || fail "(b) no child was running when it was killed (nothing to prove)"
md="$tmp/b/lease.md"
[ "$(grep -c '' "$md")" -ge "$before" ] || fail "(b) lease.md lost lines"
has "$md" '^- \[[0-9]+s\] path all_reduce: '
has "$md" '^- \[[0-9]+s\] copy cuMemcpyDtoDAsync: 64M'
has "$md" 'STOPPED by SIGTERM after [0-9]+ s'
has "$md" '^\| target \| collective'
sleep 0.5
left="$(tagged)"; [ -z "$left" ] || fail "(b) left processes behind: $left (running at the kill: $busy)"
mps_alive && fail "(b) left MPS running"
echo "tests/gpu_lease: (b) ok (killed while running: $(echo "$busy" | awk '{print $2}' | sort | uniq -c | xargs))"

# ---------------------------------------------------------------- (c) --budget 30
echo "tests/gpu_lease: (c) --budget 30 (full sizes: more than fits)"
t=$SECONDS
(lease "$tmp/c" --budget 30) >"$tmp/c.log" 2>&1 || { tail -20 "$tmp/c.log" >&2; fail "(c) exit $?"; }
tc=$((SECONDS - t))
[ "$tc" -le 34 ] || fail "(c) took ${tc} s with a budget of 30 s"
md="$tmp/c/lease.md"
has "$md" '^- \[[0-9]+s\] skipped: ferroccl .*: [0-9]+ s of the 30 s budget left, it needs at least [0-9]+ s'
has "$md" '^- \[[0-9]+s\] skipped in this run: .*ferroccl small sizes'
has "$md" '^- \[[0-9]+s\] path all_reduce: '
has "$md" '^[0-9]+ met, [0-9]+ missed, [0-9]+ not measured'
has "$md" '^- \[([0-9]|[12][0-9]|30)s\] done in [0-9]+ s of the 30 s budget'
left="$(tagged)"; [ -z "$left" ] || fail "(c) left processes behind: $left"
mps_alive && fail "(c) left MPS running"
echo "tests/gpu_lease: (c) ok in ${tc} s"

# ---------------------------------------------------------------- (d) torch and Gloo, faked
echo "tests/gpu_lease: (d) --quick with a stand-in for torch"
printf '#!/usr/bin/env bash\nexec python3 %q "$@"\n' "$root/tests/gpu_lease/fake_torch_python.py" >"$tmp/fakebin/torch-python"
chmod +x "$tmp/fakebin/torch-python"
(FERROCCL_TORCH_PYTHON="$tmp/fakebin/torch-python" lease "$tmp/d" --quick --budget 120) >"$tmp/d.log" 2>&1 ||
  { tail -20 "$tmp/d.log" >&2; fail "(d) exit $?"; }
md="$tmp/d/lease.md"
has "$md" 'torch 0\.0\+fake at .*: CUDA yes, Gloo yes'
has "$md" 'copy torch y\.copy_\(x\): 4M in [0-9.]+ us: C = 100\.0 GB/s'
for n in 2 4; do
  has "$md" "side by side all_gather, $n ranks, 4M: ferroccl [0-9.]+ GB/s, gloo $((n / 2)).00 GB/s, copy C [0-9.]+ GB/s \(cuMemcpyDtoDAsync\), ferroccl/gloo [0-9.]+x, [0-9.]+ of the roofline"
  has "$md" "side by side all_reduce, $n ranks, 1M: ferroccl [0-9.]+ GB/s, gloo [0-9.]+ GB/s, .*ferroccl/gloo [0-9.]+x"
  has "$md" "gloo reduce_scatter, $n ranks: not run: Gloo cannot run it on CUDA tensors"
  has "$md" "side by side reduce_scatter, $n ranks, 4M: ferroccl [0-9.]+ GB/s, gloo - \(not run by Gloo on CUDA tensors\)"
done
has "$md" '^\| time per call, 8 B - 64 KiB, without MPS \| all_reduce \| 2 \| <= 20 us \| [0-9.]+ us \| - \|'
has "$md" '^\| busbw, sizes >= 64 MiB \| all_gather \| 2 \| >= 385 GB/s \| - \| - \| not measured \(largest size 4M < 64M\) \|'
left="$(tagged)"; [ -z "$left" ] || fail "(d) left processes behind: $left"
echo "tests/gpu_lease: (d) ok"
echo "tests/gpu_lease: all passed"
