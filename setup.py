"""The Python package's build: setuptools-rust builds libferroccl, ferroccl's NCCL
library and the two binaries with cargo and puts them in the package under their C
names; this file adds what a C user of a pip install needs (headers, CMake package,
pkg-config files). Everything declarative is in pyproject.toml.

Installed layout, under site-packages/ferroccl (the prefix of a `make install` tree):
    lib/libferroccl.so.<major>       the library, under its SONAME (what ctypes loads)
    lib/ferroccl/libnccl.so.2        NCCL's ABI on ferroccl, in a directory of its own
    bin/ferroccl-run, ferroccl-bench the launcher and the benchmark (console scripts too)
    include/ferroccl.h, include/ferroccl/nccl.h
    lib/cmake/ferroccl/              find_package(ferroccl CONFIG), paths relative to it
    lib/pkgconfig/ferroccl.pc, ferroccl-nccl.pc   relative to ${pcfiledir}, with an rpath
"""

import atexit
import os
import pathlib
import re
import shutil
import sys
import tempfile

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools_rust import Binding, RustExtension, Strip
from setuptools_rust.build import build_rust

ROOT = pathlib.Path(__file__).resolve().parent
HEADER = ROOT / "include" / "ferroccl.h"


def _version():
    text = HEADER.read_text()
    parts = [re.search(rf"^#define FCCL_{k} (\d+)", text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise RuntimeError(f"{HEADER}: no FCCL_MAJOR/MINOR/PATCH")
    return ".".join(m.group(1) for m in parts)


VERSION = _version()
MAJOR = VERSION.split(".")[0]
# Extension name -> the file it is installed as, relative to the build's package root.
C_NAMES = {
    "ferroccl.lib.libferroccl": f"ferroccl/lib/libferroccl.so.{MAJOR}",
    "ferroccl.lib.ferroccl.libnccl": "ferroccl/lib/ferroccl/libnccl.so.2",
}

# Binary -> the manifest of the crate that builds it.
BINARIES = {"ferroccl-run": "Cargo.toml", "ferroccl-bench": "bench/Cargo.toml"}


class BuildRustCNames(build_rust):
    """Shared libraries under their C names, not Python's extension-module suffix: C
    programs record libferroccl.so.<major> and libnccl.so.2 and must find those files."""

    def get_dylib_ext_path(self, ext, target_fname):
        if target_fname in C_NAMES:
            build_ext = self.get_finalized_command("build_ext")
            base = str(ROOT / "python") if build_ext.inplace else build_ext.build_lib
            return os.path.join(base, C_NAMES[target_fname])
        return super().get_dylib_ext_path(ext, target_fname)


def _subst(template, values):
    text = (ROOT / "cmake" / template).read_text()
    for k, v in values.items():
        text = text.replace(f"@{k}@", v)
    left = re.findall(r"@[A-Z_]+@", text)
    if left:
        raise RuntimeError(f"cmake/{template}: no value for {sorted(set(left))}")
    return text


class BuildPyWithC(build_py):
    """build_py, then the headers, the CMake package and the pkg-config files."""

    def run(self):
        super().run()
        pkg = pathlib.Path(self.build_lib) / "ferroccl"
        files = {
            "include/ferroccl.h": HEADER.read_text(),
            "include/ferroccl/nccl.h": (ROOT / "include" / "ferroccl" / "nccl.h").read_text(),
            "lib/cmake/ferroccl/ferrocclConfig.cmake": _subst("ferrocclConfig.cmake.in", {
                "FERROCCL_PREFIX_REL": "../../..",
                "FERROCCL_LIBDIR_REL": "lib",
                "FERROCCL_INCLUDEDIR_REL": "include",
                "FERROCCL_BINDIR_REL": "bin",
                "FERROCCL_NCCLDIR_REL": "lib/ferroccl",
                "FERROCCL_LIBFILE": f"libferroccl.so.{MAJOR}",
                "FERROCCL_STATIC_DEPS": "",
                "FERROCCL_SONAME": f"libferroccl.so.{MAJOR}",
            }),
            "lib/cmake/ferroccl/ferrocclConfigVersion.cmake": _subst("ferrocclConfigVersion.cmake.in",
                                                                     {"FERROCCL_VERSION": VERSION}),
        }
        # No -L/-l pair can name libferroccl.so.<major> without a libferroccl.so link,
        # which a wheel cannot hold: -l:<file> does, and the rpath finds it at run time.
        pc = {
            "FERROCCL_VERSION": VERSION,
            "PREFIX": "${pcfiledir}/../..",
            "LIBDIR": "${prefix}/lib",
            "INCLUDEDIR": "${prefix}/include",
            "BINDIR": "${prefix}/bin",
            "NCCLDIR": "${prefix}/lib/ferroccl",
            "FERROCCL_LINK": f"-L${{libdir}} -l:libferroccl.so.{MAJOR} -Wl,-rpath,${{libdir}}",
            "FERROCCL_NCCL_LINK": "-L${nccllibdir} -l:libnccl.so.2 -Wl,-rpath,${nccllibdir}",
            "FERROCCL_STATIC_LIBS": "",
        }
        for name in ("ferroccl", "ferroccl-nccl"):
            files[f"lib/pkgconfig/{name}.pc"] = _subst(f"{name}.pc.in", pc)
        for rel, text in files.items():
            dest = pkg / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)


class PlatformWheel(bdist_wheel):
    """Native code but no CPython extension: one py3-none-<platform> wheel serves every
    Python 3 (auditwheel then turns linux_<arch> into the manylinux tag it satisfies)."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


# Setuptools' scratch directories go outside the source tree (`pip install .` would
# otherwise leave build/lib* and python/ferroccl.egg-info behind).
_scratch = tempfile.mkdtemp(prefix="ferroccl-setup-")
atexit.register(shutil.rmtree, _scratch, True)
_options = {"build": {"build_base": os.path.join(_scratch, "build")}}
if not any(a.startswith("--egg-base") or a == "-e" for a in sys.argv):
    _options["egg_info"] = {"egg_base": _scratch}

setup(
    version=VERSION,
    options=_options,
    rust_extensions=[
        RustExtension("ferroccl.lib.libferroccl", path="Cargo.toml", binding=Binding.NoBinding, debug=False, strip=Strip.Debug),
        RustExtension("ferroccl.lib.ferroccl.libnccl", path="nccl/Cargo.toml", binding=Binding.NoBinding,
                      debug=False, strip=Strip.Debug),
        # One extension per binary: setuptools-rust takes the executables from cargo's
        # messages for the manifest's own package, and ferroccl-bench is a crate of its own.
        *(RustExtension({b: f"ferroccl.bin.{b}"}, path=manifest, binding=Binding.Exec, args=["--bin", b],
                        debug=False, strip=Strip.Debug) for b, manifest in BINARIES.items()),
    ],
    cmdclass={"build_rust": BuildRustCNames, "build_py": BuildPyWithC, "bdist_wheel": PlatformWheel},
)
