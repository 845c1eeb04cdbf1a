"""The `ferroccl-run` and `ferroccl-bench` console scripts: execute the binaries bundled
with the package (or, from a checkout, the ones in target/release)."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def binary_path(name, env=None):
    """Path of a bundled binary: $<env> when set, the package's bin/, else next to the
    library this package loads (a checkout's target/release)."""
    if env and os.environ.get(env):
        return os.environ[env]
    bundled = os.path.join(_HERE, "bin", name)
    if os.path.isfile(bundled):
        return bundled
    from . import _lib

    return os.path.join(os.path.dirname(os.path.abspath(_lib.library_path())), name)


def launcher_path():
    """Path of the ferroccl-run binary ($FERROCCL_RUN overrides it)."""
    return binary_path("ferroccl-run", "FERROCCL_RUN")


def _exec(name, path):
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        sys.stderr.write(f"{name}: the binary is not at {path}; reinstall the ferroccl package "
                         "(pip install . in a checkout builds it)\n")
        return 127
    os.execv(path, [path] + sys.argv[1:])
    return 0  # not reached


def main():
    return _exec("ferroccl-run", launcher_path())


def bench():
    return _exec("ferroccl-bench", binary_path("ferroccl-bench"))


if __name__ == "__main__":
    sys.exit(main())
