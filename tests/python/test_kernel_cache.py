"""pytest: the on-disk cache of compiled device kernels (FERROCCL_KERNEL_CACHE). Two
ranks under ferroccl-run run device_worker.py's device checks (reductions and copies
on the GPU-to-GPU path), and the simulated GPU's cost model counts each process's NVRTC
compilations: the first run compiles and stores CUBINs, a second compiles nothing, a
damaged cache is compiled again and repaired, and `off` neither reads nor writes.
Needs the simulated GPU (its counters): skips on a real driver or without one."""

import ctypes
import os
import re
import subprocess
import sys

import pytest

from test_ctypes import RUN, _env, needs_lib, needs_run

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE_WORKER = os.path.join(HERE, "device_worker.py")


def _simulated():
    try:
        return hasattr(ctypes.CDLL("libcuda.so.1"), "simgpuGetCosts")
    except OSError:
        return False


pytestmark = [needs_lib, needs_run,
              pytest.mark.skipif(not _simulated(), reason="counts compilations with the simulated GPU's cost model "
                                                          "(scripts/sim-gpu.sh); a real driver has no counters")]


def _run(cache):
    env = _env()
    env["FERROCCL_KERNEL_CACHE"] = cache
    env.pop("FERROCCL_CUDA_IPC", None)
    p = subprocess.run([RUN, "-n", "2", sys.executable, DEVICE_WORKER], cwd=HERE, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=300, start_new_session=True)
    out = p.stdout.decode("utf-8", "replace")
    assert p.returncode == 0, out
    assert out.count("device checks, OK") == 2, out
    counts = [int(n) for n in re.findall(r"rank \d+: (\d+) NVRTC compilations", out)]
    assert len(counts) == 2, out
    return sum(counts), out


def _images(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".cubin")) if os.path.isdir(d) else []


def test_compiled_once_then_loaded_from_disk(tmp_path):
    cache = str(tmp_path / "kernels")
    first, out = _run(cache)
    assert first > 0, f"the first run compiled nothing: is the cache shared with another run?\n{out}"
    images = _images(cache)
    assert images, f"no CUBIN stored in {cache}\n{out}"
    second, out = _run(cache)
    assert second == 0, f"{second} NVRTC compilations with every image cached\n{out}"
    assert _images(cache) == images

    # A damaged image is refused by the driver, compiled again and replaced.
    for name in images:
        with open(os.path.join(cache, name), "wb") as f:
            f.write(b"not a cubin")
    third, out = _run(cache)
    assert third > 0, out
    for name in images:
        with open(os.path.join(cache, name), "rb") as f:
            assert f.read() != b"not a cubin", f"{name} was not repaired"
    assert not [f for f in os.listdir(cache) if f.endswith(".tmp")], "temporary files left behind"


def test_off_neither_reads_nor_writes(tmp_path):
    cache = tmp_path / "kernels"
    cache.mkdir()
    first, out = _run("off")
    assert first > 0, out
    assert not os.listdir(cache)
