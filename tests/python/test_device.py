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


def _run_fault(mode, op="all_reduce", **env_vars):
    """device_worker.py --fault MODE --op OP at 2 ranks with these variables; its output
    (the test skips when the worker did)."""
    env = _env()
    env.update(env_vars)
    cmd = [RUN, "-n", "2", sys.executable, DEVICE_WORKER, "--fault", mode, "--op", op]
    p = subprocess.run(cmd, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT_S,
                       start_new_session=True)
    out = p.stdout.decode("utf-8", "replace")
    print(out)
    if "skipped" in out:
        pytest.skip(out.strip().splitlines()[-1])
    return out


@needs_lib
@needs_run
@needs_driver
@pytest.mark.parametrize("mode", ["kill", "stop"])
@pytest.mark.parametrize("op", ["all_reduce", "send_recv"])
def test_a_rank_lost_mid_call_releases_the_others_streams(mode, op):
    """Ranks on one GPU, stream-ordered: rank 1's stream never gets to the call (an
    all_reduce, or a send from rank 0 to rank 1) and rank 1 dies (or stops). Rank 0's
    stream is released (by the watchdog, at once on a death, at the timeout on a stop)
    instead of hanging, and its communicator fails naming rank 1."""
    out = _run_fault(mode, op, FERROCCL_CUDA_IPC="1", FERROCCL_SIM_DEVICES="1", FERROCCL_TIMEOUT_MS="3000")
    line = next((l for l in out.splitlines() if "rank 0: enqueued in" in l), None)
    assert line is not None, f"rank 0 never reported (its stream hung?):\n{out}"
    enqueue = float(line.split("enqueued in ")[1].split(" s")[0])
    took = float(line.split("released after ")[1].split(" s")[0])
    assert enqueue < 1.0, f"the call waited for the GPU: {line}"
    if mode == "kill":
        assert took < 2.5, f"released {took} s after a death: {line}"
        assert "rank 1" in line and "died" in line, line
    else:
        assert 2.9 < took < 3.3 + 1.0, f"released {took} s with a 3 s timeout: {line}"
        assert "rank(s) [1]" in line and "next call operation timed out" in line, line
    assert "next call no error" not in line and "async error no error" not in line, line


@needs_lib
@needs_run
@needs_driver
def test_a_rank_lost_mid_pipeline_fails_the_staged_call_and_leaves_the_stream_clean():
    """Everything staged through host memory, cut into many chunks on a slow stream:
    rank 1 dies after some chunks. Rank 0's call returns an error naming rank 1 (the
    host's), not a hang, and its stream holds nothing of the call: it synchronises and a
    copy queued after it runs."""
    out = _run_fault("staged-kill", FERROCCL_CUDA_IPC="0", FERROCCL_STAGING_CHUNK="16K",
                     FERROCCL_SIM_LATENCY_US="5000", FERROCCL_SIM_DEVICES="1", FERROCCL_TIMEOUT_MS="5000")
    line = next((l for l in out.splitlines() if "rank 0: staged call returned" in l), None)
    assert line is not None, f"rank 0 never reported (hung?):\n{out}"
    assert "returned fcclSuccess" not in line and "rank 1" in line, line
    took = float(line.split(" after ")[1].split(" s")[0])
    assert took < 4.5, f"the failure took {took} s to show: {line}"
    assert "stream sync 0;" in line and "copy after it 0/0" in line, line


@needs_lib
@needs_run
@needs_driver
def test_a_rank_lost_before_its_recv_fails_the_send():
    """Ranks on one GPU: rank 1 dies before it posts the fcclRecv that rank 0's fcclSend
    waits for (the pair's mailbox). The send fails at once, naming rank 1, instead of
    waiting for the timeout."""
    out = _run_fault("vanish", "send_recv", FERROCCL_CUDA_IPC="1", FERROCCL_SIM_DEVICES="1", FERROCCL_TIMEOUT_MS="60000")
    line = next((l for l in out.splitlines() if "rank 0: send returned" in l), None)
    assert line is not None, f"rank 0 never reported (its send hung?):\n{out}"
    took = float(line.split(" after ")[1].split(" s")[0])
    assert "no error" not in line, line
    assert took < 10.0, f"the send waited {took} s for a dead peer (timeout 60 s): {line}"
    assert "rank 1" in line, line
