"""The "ferroccl" torch.distributed backend under torchrun at 2 and 4 ranks on CPU
(torch_worker.py: Comm.from_env through torchrun's store, every collective, async work
and errors, DDP against gloo step for step). Skips, saying so, where torch is not
installed (scripts/test.sh installs it in a cached venv)."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 240

torch = pytest.importorskip("torch", reason="torch is not installed in this Python: the torch backend tests need it")


@pytest.mark.parametrize("n", [2, 4])
def test_torchrun_backend_and_ddp(subprocess_env, n):
    env = dict(subprocess_env)
    env.setdefault("FERROCCL_TIMEOUT_MS", "60000")
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
    assert out.count("ddp max loss difference") == n, out


def test_in_process_group_of_one():
    """init_process_group("ferroccl") with a store given, and the library's errors."""
    import torch.distributed as dist

    import ferroccl
    import ferroccl.torch  # noqa: F401

    dist.init_process_group("ferroccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
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
