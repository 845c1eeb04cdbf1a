"""The "ferroccl" torch.distributed backend under torchrun at 2 and 4 ranks on CPU
(torch_worker.py: Comm.from_env through torchrun's store, every collective, async work
and errors, DDP against gloo step for step), served by the native c10d backend, with
dist.batch_isend_irecv at 2, 3 and 4 ranks; and once with FERROCCL_TORCH_BACKEND=python
(the Python backend, the fallback where the native one cannot be built). Skips, saying
so, where torch is not installed (scripts/test.sh installs it in a cached venv)."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 240

torch = pytest.importorskip("torch", reason="torch is not installed in this Python: the torch backend tests need it")


@pytest.fixture(scope="module")
def native_built():
    """Builds the native backend once here (minutes the first time), not under torchrun's clock."""
    import ferroccl.torch

    mod, why = ferroccl.torch.native_module()
    assert mod is not None, f"the native torch backend did not build: {why}"


def run_worker(subprocess_env, n, **extra):
    env = dict(subprocess_env)
    env.setdefault("FERROCCL_TIMEOUT_MS", "60000")
    env.update(extra)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           os.path.join(HERE, "torch_worker.py")]
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT_S,
                           start_new_session=True, check=False)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)}: no result in {TIMEOUT_S} s\n{(e.stdout or b'').decode(errors='replace')}")
    out = p.stdout.decode("utf-8", "replace")
    print(out)
    assert p.returncode == 0, out
    for r in range(n):
        assert f"rank {r}/{n}: OK" in out, out
    return out


@pytest.mark.parametrize("n", [2, 4])
def test_torchrun_backend_and_ddp(subprocess_env, native_built, n):
    out = run_worker(subprocess_env, n)
    assert out.count("served by the native backend") == n, out
    assert out.count("ddp max loss difference") == n, out


@pytest.mark.parametrize("n", [2, 3])
def test_batch_isend_irecv(subprocess_env, native_built, n):
    out = run_worker(subprocess_env, n, FERROCCL_TORCH_ONLY_P2P="1")
    assert out.count("served by the native backend") == n, out


def test_python_backend_forced(subprocess_env):
    out = run_worker(subprocess_env, 2, FERROCCL_TORCH_BACKEND="python", FERROCCL_TORCH_EXPECT="python")
    assert out.count("served by the python backend") == 2, out
    assert out.count("ddp max loss difference") == 2, out


@pytest.mark.parametrize("kind", ["native", "python"])
def test_in_process_group_of_one(monkeypatch, native_built, kind):
    """init_process_group("ferroccl") with a store given, and the library's errors."""
    import torch.distributed as dist

    import ferroccl
    import ferroccl.torch

    monkeypatch.setenv("FERROCCL_TORCH_BACKEND", kind)
    dist.init_process_group("ferroccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert ferroccl.torch.served_by() == kind
        t = torch.arange(4.0)
        dist.all_reduce(t)
        assert torch.equal(t, torch.arange(4.0))
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        assert w.is_completed()
        with pytest.raises(ferroccl.FcclError, match="root 3 out of range"):
            dist.broadcast(t, src=3)
    finally:
        dist.destroy_process_group()


def test_fallback_when_native_cannot_build(monkeypatch):
    """A failed build: the Python backend serves, with a warning naming why; =native makes it an error."""
    import torch.distributed as dist

    import ferroccl.torch

    monkeypatch.setattr(ferroccl.torch, "_native", (None, "CalledProcessError: no compiler here"))
    monkeypatch.delenv("FERROCCL_TORCH_BACKEND", raising=False)
    with pytest.warns(RuntimeWarning, match="Python one serves.*no compiler here"):
        dist.init_process_group("ferroccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert ferroccl.torch.served_by() == "python"
    finally:
        dist.destroy_process_group()
    monkeypatch.setenv("FERROCCL_TORCH_BACKEND", "native")
    with pytest.raises(RuntimeError, match="could not be built.*no compiler here"):
        dist.init_process_group("ferroccl", store=dist.HashStore(), rank=0, world_size=1)
