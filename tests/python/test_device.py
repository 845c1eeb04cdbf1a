"""pytest: device memory through ctypes and the CUDA driver API (device_worker.py).

Runs where a CUDA driver is loadable: on a GPU host, or in CI under the simulated
GPU (`scripts/sim-gpu.sh python -m pytest tests/python/test_device.py`); skips
elsewhere. Process mode under ferroccl-run (every rank on device 0) and threads mode
(fcclCommInitAll with a device list, repeated and mixed devices).
"""

import ctypes
import os
import subprocess
import sys

import pytest

from test_ctypes import RUN, WORKER, _env, needs_lib, needs_run

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE_WORKER = os.path.join(HERE, "device_worker.py")
TIMEOUT_S = 180


def _driver_loadable():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


needs_driver = pytest.mark.skipif(not _driver_loadable(),
                                  reason="no CUDA driver (libcuda.so.1): run under scripts/sim-gpu.sh or on a GPU host")


def _run(cmd, what):
    p = subprocess.run(cmd, cwd=HERE, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=TIMEOUT_S, start_new_session=True)
    out = p.stdout.decode("utf-8", "replace")
    print(out)
    if p.returncode == 77:
        pytest.skip(out.strip().splitlines()[-1] if out.strip() else "skipped")
    assert p.returncode == 0, f"{what}: exit code {p.returncode}\n{out}"
    return out


@needs_lib
@needs_run
@needs_driver
@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_device_processes(nranks):
    out = _run([RUN, "-n", str(nranks), sys.executable, DEVICE_WORKER], f"ferroccl-run -n {nranks} device_worker.py")
    assert out.count("device checks, OK") == nranks, out


@needs_lib
@needs_driver
@pytest.mark.parametrize("devlist", ["0,0", "0,1,0"])
def test_device_threads(devlist):
    n = len(devlist.split(","))
    out = _run([sys.executable, DEVICE_WORKER, "--threads", str(n), "--devlist", devlist],
               f"device_worker.py --threads {n} --devlist {devlist}")
    assert out.count("device checks, OK") == n, out


assert os.path.isfile(WORKER)
