"""pytest setup for python/tests: the package is imported from this checkout
(python/ferroccl) and finds the library in ../../target/release unless FERROCCL_LIB is
set; the multi-process tests use FERROCCL_RUN (default: the package's launcher).

With FERROCCL_TEST_INSTALLED=1 the tests use the package installed in this Python
(the wheel, or `pip install .` of the checkout) as a user would: no checkout on the path, no FERROCCL_LIB."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
ROOT = os.path.dirname(PYDIR)
INSTALLED = os.environ.get("FERROCCL_TEST_INSTALLED") == "1"
if INSTALLED:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != PYDIR]
elif PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
# A hang fails a test instead of stalling the suite (read when a communicator is made).
os.environ.setdefault("FERROCCL_TIMEOUT_MS", "20000")


def _lib_available():
    try:
        import ferroccl

        ferroccl.library_path()
        return True, ""
    except OSError as e:
        return False, str(e)


def launcher_path():
    import ferroccl

    return ferroccl.launcher_path()


def pytest_collection_modifyitems(config, items):
    ok, why = _lib_available()
    if not ok:
        skip = pytest.mark.skip(reason=f"libferroccl.so not available: {why}")
        for item in items:
            item.add_marker(skip)


@pytest.fixture
def launcher():
    path = launcher_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"ferroccl-run not found at {path}: build it or set FERROCCL_RUN")
    return path


@pytest.fixture
def subprocess_env():
    """Environment for child Pythons: this checkout's package on the path, the same
    library, and a bound on every wait so a hang fails instead of stalling the suite."""
    import ferroccl

    env = dict(os.environ)
    if not INSTALLED:
        env["PYTHONPATH"] = PYDIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["FERROCCL_LIB"] = os.path.abspath(ferroccl.library_path())
    env.setdefault("FERROCCL_TIMEOUT_MS", "20000")
    return env
