"""Build hook: builds libferroccl.so and ferroccl-run with cargo and puts them in the
package, so a wheel (or `pip install ./python`) works with no FERROCCL_LIB and no
checkout. Everything declarative is in pyproject.toml; python/README.md says why this is
plain setuptools rather than maturin or setuptools-rust.

The crate is the checkout's (../Cargo.toml) or, in an sdist, the copy under rust/ that
`sdist` puts there, so an sdist builds from itself. Cargo's target directory is the
checkout's target/ (or $CARGO_TARGET_DIR) with the same flags as `cargo build --release`,
so a checkout that was already built is not rebuilt. Setuptools' own build/ and
egg-info directories go to a temporary directory, not into the source tree.
"""

import atexit
import json
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent
# The crate's files an sdist carries: what `cargo build -p ferroccl` reads (the workspace
# members must exist for cargo to load the manifest, the bench binary's sources too).
CRATE_FILES = ["Cargo.toml", "Cargo.lock", "include/ferroccl.h"]
CRATE_FILES += ["tools/simgpu/Cargo.toml", "tools/simgpu/build.rs"]
CRATE_TREES = [("src", "*.rs"), ("bench", "*.rs"), ("tools/simgpu/src", "*.rs")]


def _crate_root():
    for root in (HERE / "rust", HERE.parent):
        if (root / "Cargo.toml").is_file() and (root / "src" / "ffi").is_dir():
            return root
    raise RuntimeError(f"the ferroccl crate is neither at {HERE.parent} (a checkout) nor at {HERE / 'rust'} "
                       "(an sdist): build from a ferroccl checkout or from its sdist")


def _version():
    header = _crate_root() / "include" / "ferroccl.h"
    text = header.read_text()
    parts = [re.search(rf"^#define FCCL_{k} (\d+)", text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise RuntimeError(f"{header}: no FCCL_MAJOR/MINOR/PATCH")
    return ".".join(m.group(1) for m in parts)


def _cargo_build(root):
    """`cargo build --release` of the library and the launcher; their paths."""
    cargo = os.environ.get("CARGO", "cargo")
    cmd = [cargo, "build", "--release", "--manifest-path", str(root / "Cargo.toml"), "-p", "ferroccl", "--lib",
           "--bin", "ferroccl-run", "--message-format=json-render-diagnostics"]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, check=False)
    except FileNotFoundError:
        raise RuntimeError("building ferroccl needs Rust's cargo (https://rustup.rs) on PATH, or set CARGO") from None
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed with exit code {p.returncode} (its errors are above)")
    lib = run = None
    for line in p.stdout.decode("utf-8", "replace").splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact":
            continue
        kinds = msg.get("target", {}).get("kind", [])
        for f in msg.get("filenames", []):
            if "cdylib" in kinds and f.endswith(".so"):
                lib = f
        if "bin" in kinds and msg["target"].get("name") == "ferroccl-run":
            run = msg.get("executable")
    if not (lib and run):
        raise RuntimeError(f"{' '.join(cmd)} reported no libferroccl.so / ferroccl-run (got {lib}, {run})")
    return lib, run


class BuildPyWithCrate(build_py):
    """build_py, then the library and launcher copied into the built package."""

    def run(self):
        super().run()
        lib, run = _cargo_build(_crate_root())
        pkg = pathlib.Path(self.build_lib) / "ferroccl"
        (pkg / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lib, pkg / "libferroccl.so")
        dest = pkg / "bin" / "ferroccl-run"
        shutil.copyfile(run, dest)
        dest.chmod(dest.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        for f in (pkg / "libferroccl.so", dest):
            _strip_debug(f)


def _strip_debug(path):
    """Drops the debug information of a bundled copy (about 90% of its size; `make
    install` keeps it in separate files instead). Kept as built without objcopy."""
    objcopy = shutil.which(os.environ.get("OBJCOPY", "objcopy"))
    if objcopy:
        subprocess.run([objcopy, "--strip-debug", str(path)], check=True)


class SdistWithCrate(sdist):
    """sdist that carries the crate under rust/, so it builds outside a checkout."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = _crate_root()
        dest = pathlib.Path(base_dir) / "rust"
        paths = [root / f for f in CRATE_FILES]
        for tree, pattern in CRATE_TREES:
            paths += sorted((root / tree).rglob(pattern))
        for src in paths:
            rel = src.relative_to(root)
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # setuptools >= 70 has its own
    from setuptools.command.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    """The wheel holds a native library but no CPython extension: py3-none-<platform>."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


# Setuptools' scratch directories go outside the source tree (`pip install ./python`
# would otherwise leave python/build and python/ferroccl.egg-info behind).
_scratch = tempfile.mkdtemp(prefix="ferroccl-setup-")
atexit.register(shutil.rmtree, _scratch, True)
_options = {"build": {"build_base": os.path.join(_scratch, "build")}}
if not any(a.startswith("--egg-base") or a == "-e" for a in sys.argv):
    _options["egg_info"] = {"egg_base": _scratch}

setup(
    version=_version(),
    cmdclass={"build_py": BuildPyWithCrate, "sdist": SdistWithCrate, "bdist_wheel": PlatformWheel},
    options=_options,
)
