"""``python -m ferroccl --cmakedir`` and friends: paths for C and C++ builds against a
pip install, printed one per line in the order asked."""

import argparse
import sys

from . import _paths, version

_FLAGS = {
    "--includedir": (_paths.include_dir, "directory of ferroccl.h (-I)"),
    "--libdir": (_paths.lib_dir, "directory of libferroccl.so.<major> (-L and an rpath)"),
    "--nccl-libdir": (_paths.nccl_lib_dir, "directory of ferroccl's libnccl.so.2 alone"),
    "--cmakedir": (_paths.cmake_dir, "CMAKE_PREFIX_PATH entry for find_package(ferroccl CONFIG)"),
    "--pkgconfigdir": (_paths.pkgconfig_dir, "PKG_CONFIG_PATH entry for ferroccl.pc, ferroccl-nccl.pc"),
}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ferroccl", description="Paths of the C library, headers, "
                                "CMake package and pkg-config files in this install of ferroccl.")
    for flag, (_, doc) in _FLAGS.items():
        p.add_argument(flag, dest="paths", action="append_const", const=flag, help=doc)
    p.add_argument("--version", action="store_true", help="the library's version")
    args = p.parse_args(argv)
    if args.version:
        print(".".join(str(v) for v in version()))
    if not (args.paths or args.version):
        p.print_help()
        return 2
    try:
        for flag in args.paths or []:
            print(_FLAGS[flag][0]())
    except FileNotFoundError as e:
        print(f"python -m ferroccl: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
