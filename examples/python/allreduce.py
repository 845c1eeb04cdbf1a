"""ferroccl from Python: sum a numpy array over all ranks, gather one block from every
rank, and handle an error.

    pip install .                     # from a ferroccl checkout (needs cargo), or the wheel
    ferroccl-run -n 4 python allreduce.py

From a checkout without installing: PYTHONPATH=python FERROCCL_LIB=target/release.
"""

import numpy as np

import ferroccl


def main():
    # Rank, size and rendezvous from the launcher (ferroccl-run, torchrun, mpirun, srun);
    # the communicator is destroyed when the block ends.
    with ferroccl.Comm.from_env() as comm:
        rank, n = comm.rank, comm.size

        # all_reduce works in place on the array (and returns it).
        x = np.arange(1 << 20, dtype=np.float32) % 1000 + rank
        comm.all_reduce(x)  # op="sum" by default; also "prod", "max", "min", "avg"
        want = (np.arange(1 << 20, dtype=np.float32) % 1000) * n + n * (n - 1) // 2
        assert np.array_equal(x, want), f"rank {rank}: wrong all_reduce result"

        # all_gather returns a new array: one row per rank.
        rows = comm.all_gather(np.full(4, rank, dtype=np.int32))
        assert rows.shape == (n, 4) and (rows == np.arange(n)[:, None]).all()

        # A failed call raises ferroccl.FcclError with the library's message; a bad
        # argument fails on every rank before anything moves, and the communicator
        # stays usable.
        try:
            comm.broadcast(x, root=n)  # there is no rank n
            raise AssertionError("a broadcast from rank n should fail")
        except ferroccl.FcclError as e:
            assert e.name == "fcclInvalidArgument", e
            if rank == 0:
                print(f"a bad root is refused: {e.message}")
        comm.broadcast(x, root=0)

        if rank == 0:
            print(f"all_reduce and all_gather over {n} ranks: correct")


if __name__ == "__main__":
    main()
