"""The unique id through torch's store: under torchrun the agent's TCPStore already
listens on MASTER_PORT, so rank 0 puts the 128-byte id there and the others read it
(no second listener on that port)."""

import itertools
import os
from datetime import timedelta

_counter = itertools.count()


def exchange(store, rank, key):
    """Rank 0 makes a unique id and sets it under `key`; every rank returns it."""
    from . import UniqueId, get_unique_id

    if rank == 0:
        uid = get_unique_id()
        store.set(key, bytes(uid))
        return uid
    return UniqueId(store.get(key))  # blocks until rank 0 has set it (the store's timeout)


def unique_id_from_torchrun():
    """(unique id, rank, world size) for Comm.from_env under torchrun."""
    import torch.distributed as dist

    try:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError) as e:
        raise RuntimeError(f"Comm.from_env under torchrun: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT must be "
                           f"set ({e!r})") from None
    timeout = timedelta(milliseconds=int(os.environ.get("FERROCCL_TIMEOUT_MS", "600000")))
    store = dist.TCPStore(host, port, size, is_master=False, timeout=timeout)
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    # Every rank calls from_env in the same order, so the n-th calls share a key.
    key = f"ferroccl/from_env/{run}/{restart}/{next(_counter)}"
    return exchange(store, rank, key), rank, size
