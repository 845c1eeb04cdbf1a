"""pytest: the one ctypes prototype table of the repository against include/ferroccl.h.

The Python package (python/ferroccl/_lib.py) binds the C functions by hand, and the
ctypes tests (ferroccl_ctypes.py) use that same table; a parameter bound with the
wrong width or kind is truncated or misread without a word from ctypes. This reads
every function declaration of the header and holds the table to it: the same
functions exist, with as many parameters, each of the same kind (integer of the same
width, pointer, or the same struct by value), and the same return kind; and it checks
that no second table has grown back. Needs no library: it reads files only.
"""

import ctypes
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
HEADER = os.path.join(ROOT, "include", "ferroccl.h")

# C types of the header by kind: an integer of a width, a pointer, or a struct by value.
_C_INTS = {"int": 4, "fcclResult_t": 4, "fcclDataType_t": 4, "fcclRedOp_t": 4, "size_t": ctypes.sizeof(ctypes.c_size_t),
           "unsigned int": 4}
_C_POINTERS = {"fcclComm_t", "fcclStream_t"}  # typedefs of pointers
_C_STRUCTS = {"fcclUniqueId": "unique id", "fcclConfig_t": "config"}


def _c_kind(decl):
    """The kind of one C parameter or return type, its name dropped."""
    t = re.sub(r"\b(const|struct)\b", " ", decl).strip()
    stars = t.count("*")
    t = t.replace("*", " ").split()
    # The last word is the parameter's name when there are two or more words left.
    base = " ".join(t[:-1]) if len(t) > 1 and " ".join(t) not in _C_INTS else " ".join(t)
    if stars:
        return ("pointer",)
    if base in _C_POINTERS:
        return ("pointer",)
    if base in _C_INTS:
        return ("int", _C_INTS[base])
    if base in _C_STRUCTS:
        return ("struct", _C_STRUCTS[base])
    raise AssertionError(f"the header's type {decl!r} is not known to this test: add it")


def _py_kind(t):
    """The kind of one ctypes type."""
    if t is None:
        return ("void",)
    if t in (ctypes.c_void_p, ctypes.c_char_p) or (isinstance(t, type) and issubclass(t, ctypes._Pointer)):
        return ("pointer",)
    if isinstance(t, type) and issubclass(t, ctypes.Structure):
        size = ctypes.sizeof(t)
        return ("struct", "unique id" if size == 128 else "config")
    return ("int", ctypes.sizeof(t))


def header_functions():
    """name -> (return kind, [parameter kinds]) of every function the header declares."""
    text = open(HEADER).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    out = {}
    for ret, name, params in re.findall(r"([A-Za-z_][\w \t*]*?)\b(fccl\w+)\s*\(([^;{}]*?)\)\s*;", text):
        ret = ret.strip()
        if ret.startswith("typedef") or not ret:
            continue
        params = params.strip()
        kinds = [] if params in ("", "void") else [_c_kind(p) for p in params.split(",")]
        out[name] = (("void",) if ret == "void" else _c_kind(ret), kinds)
    return out


def _tables():
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        from ferroccl import _lib  # noqa: E402 (the package's table; loads no library)
    finally:
        sys.path[:1] = []
    return {"python/ferroccl/_lib.py": _lib._PROTOTYPES}


def test_the_ctypes_tests_bind_with_the_package_table():
    sys.path.insert(0, HERE)
    try:
        import ferroccl_ctypes  # noqa: E402 (loads no library until load())
    finally:
        sys.path[:1] = []
    pkg = ferroccl_ctypes._pkg
    assert os.path.samefile(pkg.__file__, os.path.join(ROOT, "python", "ferroccl", "_lib.py"))
    assert ferroccl_ctypes._PROTOTYPES is pkg._PROTOTYPES
    assert ferroccl_ctypes.fcclUniqueId is pkg.UniqueIdStruct
    # the table of the package's module as the package imports it: the same entries
    pkg_table = _tables()["python/ferroccl/_lib.py"]
    assert {n: (_py_kind(r), [_py_kind(a) for a in args]) for n, (r, args) in pkg_table.items()} == \
        {n: (_py_kind(r), [_py_kind(a) for a in args]) for n, (r, args) in pkg._PROTOTYPES.items()}


def test_no_second_prototype_table():
    """Only python/ferroccl/_lib.py writes out argtypes: another table would drift."""
    found = []
    for top in ("python", "tests", "tools", "examples", "bench"):
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                text = open(path, encoding="utf-8").read()
                if re.search(r"[\"']fcclAllReduce[\"']\s*:\s*\(", text):
                    found.append(os.path.relpath(path, ROOT))
    assert found == [os.path.join("python", "ferroccl", "_lib.py")], found


def test_the_header_parses_into_the_functions_it_declares():
    fns = header_functions()
    assert len(fns) > 40, sorted(fns)
    assert fns["fcclAllReduce"] == (("int", 4), [("pointer",), ("pointer",), ("int", 8), ("int", 4), ("int", 4),
                                                ("pointer",), ("pointer",)])
    assert fns["fcclCommInitRank"][1][2] == ("struct", "unique id")
    assert fns["fcclGetErrorString"][0] == ("pointer",)


def test_every_prototype_table_matches_the_header():
    fns = header_functions()
    wrong = []
    for where, table in _tables().items():
        for name, (restype, argtypes) in table.items():
            if name not in fns:
                wrong.append(f"{where}: {name} is not in the header")
                continue
            ret, params = fns[name]
            if _py_kind(restype) != ret:
                wrong.append(f"{where}: {name} returns {_py_kind(restype)}, the header {ret}")
            got = [_py_kind(a) for a in argtypes]
            if len(got) != len(params):
                wrong.append(f"{where}: {name} takes {len(got)} parameters, the header {len(params)}")
                continue
            for i, (g, h) in enumerate(zip(got, params)):
                if g != h:
                    wrong.append(f"{where}: {name} parameter {i + 1} is {g}, the header's is {h}")
    assert not wrong, "\n".join(wrong)


def test_the_package_binds_every_function_the_header_declares_but_the_local_and_planning_ones():
    fns = set(header_functions())
    bound = set(_tables()["python/ferroccl/_lib.py"])
    # Local copies between devices and the planning helpers have no Python API yet.
    unbound = {n for n in fns - bound if not n.startswith(("fcclLocal", "fcclCollective"))}
    assert not unbound, f"the header declares these, the package binds none of them: {sorted(unbound)}"
