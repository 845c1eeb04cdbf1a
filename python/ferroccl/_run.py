"""The `ferroccl-run` console script: executes the launcher binary bundled with the
package (or, from a checkout, the one in target/release)."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def launcher_path():
    """Path of the ferroccl-run binary: $FERROCCL_RUN, the package's bin/, else next to
    the library this package loads."""
    env = os.environ.get("FERROCCL_RUN")
    if env:
        return env
    bundled = os.path.join(_HERE, "bin", "ferroccl-run")
    if os.path.isfile(bundled):
        return bundled
    from . import _lib

    return os.path.join(os.path.dirname(os.path.abspath(_lib.library_path())), "ferroccl-run")


def main():
    path = launcher_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        sys.stderr.write(f"ferroccl-run: the launcher binary is not at {path}; reinstall the ferroccl package "
                         "(pip install ./python builds it) or set FERROCCL_RUN to its path\n")
        return 127
    os.execv(path, [path] + sys.argv[1:])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
