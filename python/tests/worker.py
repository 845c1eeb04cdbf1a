"""One rank of the process tests: `ferroccl-run -n N python worker.py`.
Runs checks.run_all on the communicator from the environment; exit status 1 on failure."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ferroccl  # noqa: E402
from checks import run_all  # noqa: E402


def main():
    with ferroccl.Comm.from_env() as comm:
        fails = run_all(comm)
        for f in fails:
            print("FAIL", f, flush=True)
        print(f"rank {comm.rank}/{comm.size}: {'OK' if not fails else f'{len(fails)} failed'}", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
