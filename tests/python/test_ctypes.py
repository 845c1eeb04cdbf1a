"""pytest: ferroccl through ctypes, checked against numpy (see worker.py).

Runs worker.py in process mode under ferroccl-run (one rank per process,
fcclCommInitFromEnv) and in thread mode (fcclCommInitAll with devlist NULL, one
Python thread per rank; plus one fcclGetUniqueId/fcclCommInitRank run).

Paths: $FERROCCL_LIB (default ../../target/release/libferroccl.so) and
$FERROCCL_RUN (default ../../target/release/ferroccl-run), relative to this file.
Build them with `cargo build --release`.
"""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
WORKER = os.path.join(HERE, "worker.py")
LIB = os.environ.get("FERROCCL_LIB") or os.path.join(ROOT, "target", "release", "libferroccl.so")
RUN = os.environ.get("FERROCCL_RUN") or os.path.join(ROOT, "target", "release", "ferroccl-run")
TIMEOUT_S = 120

needs_lib = pytest.mark.skipif(
    not os.path.isfile(LIB),
    reason=f"libferroccl.so not built ({LIB} missing): run `cargo build --release` or set FERROCCL_LIB")
needs_run = pytest.mark.skipif(
    not os.path.isfile(RUN) or not os.access(RUN, os.X_OK),
    reason=f"ferroccl-run not built ({RUN} missing): run `cargo build --release` or set FERROCCL_RUN")


def _env():
    env = dict(os.environ)
    env["FERROCCL_LIB"] = LIB
    env.setdefault("FERROCCL_TIMEOUT_MS", "60000")  # a hang fails the run before pytest's timeout
    env.setdefault("RUST_BACKTRACE", "0")
    return env


def _run(cmd, what):
    try:
        p = subprocess.run(cmd, cwd=HERE, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=TIMEOUT_S, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace")
        print(out)
        pytest.fail(f"{what}: no result within {TIMEOUT_S} s\n{out}")
    out = p.stdout.decode("utf-8", "replace")
    print(out)  # shown by pytest on failure
    if p.returncode != 0:
        fails = [ln for ln in out.splitlines() if "FAIL" in ln or "panicked" in ln]
        pytest.fail(f"{what}: exit code {p.returncode}\n" + "\n".join(fails) + "\n--- full output ---\n" + out,
                    pytrace=False)
    return out


@needs_lib
@needs_run
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_processes(nranks):
    out = _run([RUN, "-n", str(nranks), sys.executable, WORKER], f"ferroccl-run -n {nranks} worker.py")
    assert out.count(" checks, OK") == nranks, out


@needs_lib
@pytest.mark.parametrize("nranks", [1, 3])
def test_threads(nranks):
    out = _run([sys.executable, WORKER, "--threads", str(nranks)], f"worker.py --threads {nranks}")
    assert out.count(" checks, OK") == nranks, out


@needs_lib
def test_threads_unique_id():
    # fcclGetUniqueId + fcclCommInitRank: the 128-byte id struct passed by value through ctypes
    out = _run([sys.executable, WORKER, "--threads", "2", "--init", "uid", "--big", "10007"],
               "worker.py --threads 2 --init uid")
    assert out.count(" checks, OK") == 2, out
