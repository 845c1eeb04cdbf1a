"""Ranks as processes: `ferroccl-run -n N python worker.py` at world sizes 1, 2 and 4;
each rank runs checks.run_all against numpy and prints `rank r/N: OK`."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 60


def run_ranks(launcher, env, n, *args):
    cmd = [launcher, "-n", str(n), sys.executable, os.path.join(HERE, "worker.py"), *args]
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT_S,
                           start_new_session=True, check=False)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)}: no result in {TIMEOUT_S} s\n{(e.stdout or b'').decode(errors='replace')}")
    return p.returncode, p.stdout.decode("utf-8", "replace")


@pytest.mark.parametrize("n", [1, 2, 4])
def test_worker_processes(launcher, subprocess_env, n):
    rc, out = run_ranks(launcher, subprocess_env, n)
    print(out)
    assert rc == 0, out
    for r in range(n):
        assert f"rank {r}/{n}: OK" in out, out
