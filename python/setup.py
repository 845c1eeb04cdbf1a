"""Build hook: the package version is the library's, read from ferroccl.h (FCCL_MAJOR,
FCCL_MINOR, FCCL_PATCH, generated from src/ffi/mod.rs), so it is kept in one place.
Everything else is in pyproject.toml."""

import pathlib
import re

from setuptools import setup


def _version():
    here = pathlib.Path(__file__).resolve().parent
    for header in (here / "ferroccl" / "ferroccl.h", here.parent / "include" / "ferroccl.h"):
        if header.is_file():
            text = header.read_text()
            parts = [re.search(rf"^#define FCCL_{k} (\d+)", text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
            if all(parts):
                return ".".join(m.group(1) for m in parts)
    raise RuntimeError("ferroccl.h not found next to python/ (include/ferroccl.h): build from a ferroccl checkout")


setup(version=_version())
