"""Loading libferroccl and its C prototypes (ctypes; no compiled extension).

The library is looked for, in order, at:

1. ``$FERROCCL_LIB``: the path of the library, or a directory holding it;
2. inside this package (``ferroccl/lib/libferroccl.so.<major>``, where a wheel puts it);
3. ``<checkout>/target/release`` (and ``$CARGO_TARGET_DIR/release``) when the package
   is used from a source checkout (``python/ferroccl`` two levels under the root);
4. the system's search path (``ctypes.util.find_library("ferroccl")``, then
   ``libferroccl.so`` through the dynamic loader: ``LD_LIBRARY_PATH``, ldconfig).
"""

import ctypes
import ctypes.util
import glob
import os
import threading
from ctypes import POINTER, c_char, c_char_p, c_int, c_size_t, c_uint32, c_void_p

__all__ = ["FcclError", "lib", "library_path", "check", "error_string", "last_error"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIBNAME = "libferroccl.so"

# fcclResult_t names (docs/abi.md); values are NCCL's plus two of ferroccl's own.
RESULT_NAMES = {
    0: "fcclSuccess",
    1: "fcclUnhandledCudaError",
    2: "fcclSystemError",
    3: "fcclInternalError",
    4: "fcclInvalidArgument",
    5: "fcclInvalidUsage",
    6: "fcclRemoteError",
    7: "fcclInProgress",
    8: "fcclTimeout",
    100: "fcclCollectiveMismatch",
    101: "fcclUnavailable",
}

IN_PROGRESS = 7  # fcclInProgress: a non-blocking communicator's work is still running
UNIQUE_ID_BYTES = 128
CONFIG_MAGIC = 0xCAFEBEEF
CONFIG_VERSION = 1
CONFIG_UNDEF_INT = -2147483648


class FcclError(RuntimeError):
    """A ferroccl call failed.

    Attributes:
        code: the fcclResult_t value (e.g. 4 for fcclInvalidArgument).
        name: its name (``"fcclInvalidArgument"``).
        call: the C function that failed (``"fcclAllReduce"``).
        message: the library's message (fcclGetLastError): the call, the values, the
            cause and what to do.
    """

    def __init__(self, call, code, message):
        self.call = call
        self.code = int(code)
        self.name = RESULT_NAMES.get(self.code, f"result {self.code}")
        self.message = message
        # The library's messages start with the call: say it once.
        said = message[len(call) + 2:] if message.startswith(call + ": ") else message
        super().__init__(f"{call}: {self.name} ({self.code}): {said}")

    def __reduce__(self):  # picklable (multiprocessing, pytest-xdist)
        return (FcclError, (self.call, self.code, self.message))


# Users catch and see it as ferroccl.FcclError, where the package exports it.
FcclError.__module__ = "ferroccl"


class UniqueIdStruct(ctypes.Structure):
    _fields_ = [("internal", c_char * UNIQUE_ID_BYTES)]


class ConfigStruct(ctypes.Structure):
    """fcclConfig_t (include/ferroccl.h)."""

    _fields_ = [
        ("size", c_size_t),
        ("magic", c_uint32),
        ("version", c_uint32),
        ("blocking", c_int),
        ("timeoutMs", c_int),
        ("backend", c_int),
        ("commName", c_char_p),
        ("checkMode", c_int),
    ]

    @classmethod
    def default(cls):
        c = cls()
        c.size = ctypes.sizeof(cls)
        c.magic = CONFIG_MAGIC
        c.version = CONFIG_VERSION
        c.blocking = c.timeoutMs = c.backend = c.checkMode = CONFIG_UNDEF_INT
        c.commName = None
        return c


_res = c_int
_comm = c_void_p
_stream = c_void_p
_buf = c_void_p
_sizes = POINTER(c_size_t)
_ptrs = POINTER(c_void_p)
_PROTOTYPES = {
    "fcclGetVersion": (_res, [POINTER(c_int)]),
    "fcclGetUniqueId": (_res, [POINTER(UniqueIdStruct)]),
    "fcclCommInitRank": (_res, [POINTER(_comm), c_int, UniqueIdStruct, c_int]),
    "fcclCommInitRankConfig": (_res, [POINTER(_comm), c_int, UniqueIdStruct, c_int, POINTER(ConfigStruct)]),
    "fcclCommInitAll": (_res, [POINTER(_comm), c_int, POINTER(c_int)]),
    "fcclCommInitFromEnv": (_res, [POINTER(_comm)]),
    "fcclCommSplit": (_res, [_comm, c_int, c_int, POINTER(_comm), POINTER(ConfigStruct)]),
    "fcclCommFinalize": (_res, [_comm]),
    "fcclCommDestroy": (_res, [_comm]),
    "fcclCommAbort": (_res, [_comm]),
    "fcclCommGetAsyncError": (_res, [_comm, POINTER(c_int)]),
    "fcclCommCount": (_res, [_comm, POINTER(c_int)]),
    "fcclCommUserRank": (_res, [_comm, POINTER(c_int)]),
    "fcclCommCuDevice": (_res, [_comm, POINTER(c_int)]),
    "fcclCommGetLastPath": (_res, [_comm, POINTER(c_char_p), POINTER(c_char_p)]),
    "fcclCommGetLastExchanges": (_res, [_comm, POINTER(c_int)]),
    "fcclGetErrorString": (c_char_p, [_res]),
    "fcclGetLastError": (c_char_p, [_comm]),
    "fcclAllReduce": (_res, [_buf, _buf, c_size_t, c_int, c_int, _comm, _stream]),
    "fcclBroadcast": (_res, [_buf, _buf, c_size_t, c_int, c_int, _comm, _stream]),
    "fcclReduce": (_res, [_buf, _buf, c_size_t, c_int, c_int, c_int, _comm, _stream]),
    "fcclAllGather": (_res, [_buf, _buf, c_size_t, c_int, _comm, _stream]),
    "fcclReduceScatter": (_res, [_buf, _buf, c_size_t, c_int, c_int, _comm, _stream]),
    "fcclAlltoAll": (_res, [_buf, _buf, c_size_t, c_int, _comm, _stream]),
    "fcclGather": (_res, [_buf, _buf, c_size_t, c_int, c_int, _comm, _stream]),
    "fcclScatter": (_res, [_buf, _buf, c_size_t, c_int, c_int, _comm, _stream]),
    "fcclSend": (_res, [_buf, c_size_t, c_int, c_int, _comm, _stream]),
    "fcclRecv": (_res, [_buf, c_size_t, c_int, c_int, _comm, _stream]),
    "fcclBarrier": (_res, [_comm, _stream]),
    "fcclGroupStart": (_res, []),
    "fcclGroupEnd": (_res, []),
    "fcclAlltoAllv": (_res, [_buf, _sizes, _sizes, _buf, _sizes, _sizes, c_int, _comm, _stream]),
    "fcclAllGatherV": (_res, [_buf, c_size_t, _buf, _sizes, _sizes, c_int, _comm, _stream]),
    "fcclReduceScatterV": (_res, [_buf, _sizes, _sizes, _buf, c_int, c_int, _comm, _stream]),
    "fcclAllGatherAxis": (_res, [_buf, _buf, c_int, _sizes, c_int, c_int, _comm, _stream]),
    "fcclReduceScatterAxis": (_res, [_buf, _buf, c_int, _sizes, c_int, c_int, c_int, _comm, _stream]),
    "fcclAllReduceCoalesced": (_res, [_ptrs, _ptrs, _sizes, c_int, c_int, c_int, c_size_t, _comm, _stream]),
    "fcclBroadcastCoalesced": (_res, [_ptrs, _sizes, c_int, c_int, c_int, c_size_t, _comm, _stream]),
    "fcclAllReduceWire": (_res, [_buf, _buf, c_size_t, c_int, c_int, c_int, _comm, _stream]),
    "fcclMemAlloc": (_res, [POINTER(c_void_p), c_size_t]),
    "fcclMemAllocHost": (_res, [POINTER(c_void_p), c_size_t]),
    "fcclMemFree": (_res, [c_void_p]),
}

_lock = threading.Lock()
_lib = None
_lib_path = None


def _in_dir(d):
    """The library in directory d: libferroccl.so, else libferroccl.so.<major> (a wheel's)."""
    plain = os.path.join(d, _LIBNAME)
    versioned = sorted(glob.glob(plain + ".[0-9]*"))
    return plain if os.path.isfile(plain) or not versioned else versioned[-1]


def _candidates():
    env = os.environ.get("FERROCCL_LIB")
    if env:
        yield _in_dir(env) if os.path.isdir(env) else env
        return  # an explicit choice: nothing else is tried
    yield _in_dir(os.path.join(_HERE, "lib"))
    checkout = os.path.normpath(os.path.join(_HERE, "..", ".."))
    if os.path.isfile(os.path.join(checkout, "Cargo.toml")):
        target = os.environ.get("CARGO_TARGET_DIR")
        if target:
            yield os.path.join(target if os.path.isabs(target) else os.path.join(checkout, target), "release",
                               _LIBNAME)
        yield os.path.join(checkout, "target", "release", _LIBNAME)
    found = ctypes.util.find_library("ferroccl")
    if found:
        yield found
    yield _LIBNAME  # the dynamic loader's own search (LD_LIBRARY_PATH, ldconfig cache)


def lib():
    """The loaded library (a ctypes.CDLL with every prototype set), loaded once."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            if os.sep in path and not os.path.isfile(path):
                tried.append(f"{path} (no such file)")
                continue
            try:
                cdll = ctypes.CDLL(path)
            except OSError as e:
                tried.append(f"{path} ({e})")
                continue
            for name, (restype, argtypes) in _PROTOTYPES.items():
                fn = getattr(cdll, name)
                fn.restype = restype
                fn.argtypes = argtypes
            _lib_path = path
            _lib = cdll
            return _lib
        raise OSError("libferroccl.so not found; set FERROCCL_LIB to its path (build it with "
                      "`cargo build --release`). Tried:\n  " + "\n  ".join(tried))


def library_path():
    """Path the library was loaded from (loads it if needed)."""
    lib()
    return _lib_path


def error_string(code):
    """fcclGetErrorString: a fixed description of a result code."""
    s = lib().fcclGetErrorString(int(code))
    return s.decode("utf-8", "replace") if s else ""


def last_error():
    """fcclGetLastError: this thread's last error message."""
    s = lib().fcclGetLastError(None)
    return s.decode("utf-8", "replace") if s else ""


def check(call, code):
    """Raises FcclError for a result other than fcclSuccess."""
    if code != 0:
        msg = last_error() or error_string(code)
        raise FcclError(call, code, msg)


def async_error(code):
    """The FcclError for the error fcclCommGetAsyncError just reported on this thread:
    its message (last_error()) starts with the call that failed."""
    msg = last_error() or error_string(code)
    head = msg.split(":", 1)[0]
    return FcclError(head if head.startswith("fccl") and " " not in head else "fcclCommGetAsyncError", code, msg)
