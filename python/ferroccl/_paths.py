"""Where a pip install keeps what C and C++ builds need (``python -m ferroccl --help``)."""

import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _bundled(*parts):
    path = os.path.join(_HERE, *parts)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: this ferroccl package was not installed from a wheel or "
                                "`pip install .` (a checkout's python/ has no C files; use `make install` there)")
    return path


def include_dir():
    """Directory holding ferroccl.h (and ferroccl/nccl.h, NCCL's API on ferroccl)."""
    return _bundled("include")


def lib_dir():
    """Directory holding libferroccl.so.<major>."""
    return _bundled("lib")


def nccl_lib_dir():
    """Directory holding ferroccl's libnccl.so.2 alone (for LD_LIBRARY_PATH or an rpath)."""
    return _bundled("lib", "ferroccl")


def cmake_dir():
    """A CMAKE_PREFIX_PATH entry for find_package(ferroccl CONFIG)."""
    return _bundled("lib", "cmake")


def pkgconfig_dir():
    """A PKG_CONFIG_PATH entry for ferroccl.pc and ferroccl-nccl.pc."""
    return _bundled("lib", "pkgconfig")
