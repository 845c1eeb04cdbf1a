"""The package itself: version, library discovery, dtypes (bfloat16 via ml_dtypes)."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import ferroccl

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_version_is_the_headers():
    header = os.path.join(ROOT, "include", "ferroccl.h")
    if not os.path.isfile(header):
        pytest.skip(f"{header}: not in a checkout")
    with open(header) as f:
        text = f.read()
    want = tuple(int(re.search(rf"^#define FCCL_{k} (\d+)", text, re.M).group(1)) for k in ("MAJOR", "MINOR", "PATCH"))
    assert ferroccl.version() == want
    assert ferroccl.__version__ == ".".join(map(str, want))


def test_library_path_and_strings():
    assert os.path.isfile(ferroccl.library_path()) or ferroccl.library_path() == "libferroccl.so"
    assert ferroccl.error_string(4)
    assert isinstance(ferroccl.last_error(), str)


def test_dtypes_offered():
    names = [str(d) for d in ferroccl.dtypes()]
    assert names[:9] == ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64"]
    assert names[-2:] == ["bool", "int16"]  # no library type: carried as bytes (see the package's docs)
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        assert "bfloat16" not in names
    else:
        assert names[9:-2] == ["bfloat16", "float8_e4m3fn", "float8_e5m2"]


def test_bfloat16_all_reduce():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    comms = ferroccl.Comm.init_all(1)
    try:
        x = np.arange(10, dtype=np.float32).astype(ml_dtypes.bfloat16)
        got = comms[0].all_reduce(x)
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(got.astype(np.float32), np.arange(10, dtype=np.float32))
    finally:
        comms[0].close()


@pytest.mark.skipif(os.environ.get("FERROCCL_TEST_INSTALLED") != "1", reason="checks an installed package "
                    "(FERROCCL_TEST_INSTALLED=1 after pip install of the wheel or the checkout)")
def test_installed_package_bundles_library_and_launcher():
    pkg = os.path.dirname(os.path.abspath(ferroccl.__file__))
    assert "site-packages" in pkg, pkg
    assert "FERROCCL_LIB" not in os.environ
    major = ferroccl.version()[0]
    assert ferroccl.library_path() == os.path.join(pkg, "lib", f"libferroccl.so.{major}")
    assert ferroccl.launcher_path() == os.path.join(pkg, "bin", "ferroccl-run")
    # What a C build against the install needs, where `python -m ferroccl` says it is.
    from ferroccl import __main__ as cli
    assert os.path.isfile(os.path.join(cli._paths.include_dir(), "ferroccl.h"))
    assert os.path.isfile(os.path.join(cli._paths.nccl_lib_dir(), "libnccl.so.2"))
    assert os.path.isfile(os.path.join(cli._paths.cmake_dir(), "ferroccl", "ferrocclConfig.cmake"))
    pc = open(os.path.join(cli._paths.pkgconfig_dir(), "ferroccl.pc")).read()
    assert f"Version: {ferroccl.__version__}" in pc and "-Wl,-rpath,${libdir}" in pc, pc
    p = subprocess.run([sys.executable, "-m", "ferroccl", "--libdir", "--version"], stdout=subprocess.PIPE,
                       check=True, timeout=60)
    assert p.stdout.decode().split() == [ferroccl.__version__, os.path.join(pkg, "lib")]
    bench = os.path.join(os.path.dirname(sys.executable), "ferroccl-bench")
    p = subprocess.run([bench, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60, check=False)
    assert p.returncode == 0 and b"Usage: ferroccl-bench" in p.stdout, p.stdout
    script = os.path.join(os.path.dirname(sys.executable), "ferroccl-run")
    p = subprocess.run([script, "-n", "2", sys.executable, "-c",
                        "import ferroccl, numpy as np\n"
                        "with ferroccl.Comm.from_env() as c: print('sum', int(c.all_reduce(np.array([c.rank + 1]))[0]))"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120, check=False)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    assert out.count("sum 3") == 2, out


def test_ferroccl_lib_env_is_honoured(subprocess_env):
    env = dict(subprocess_env)
    lib = os.path.abspath(ferroccl.library_path())
    env["FERROCCL_LIB"] = os.path.join(HERE, "no-such-libferroccl.so")
    p = subprocess.run([sys.executable, "-c", "import ferroccl; ferroccl.version()"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60, check=False)
    assert p.returncode != 0
    assert b"FERROCCL_LIB" in p.stdout and b"no-such-libferroccl.so" in p.stdout
    # a directory holding the library works too
    env["FERROCCL_LIB"] = os.path.dirname(lib)
    p = subprocess.run([sys.executable, "-c", "import ferroccl; print(ferroccl.library_path())"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60, check=False)
    assert p.returncode == 0, p.stdout
    assert p.stdout.decode().strip() == lib
