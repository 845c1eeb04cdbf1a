"""ctypes access to libferroccl for the tests, with the Python package's prototypes.

The C functions' argtypes and restypes are the package's one table
(python/ferroccl/_lib.py, read from this checkout, which test_prototypes.py holds to
include/ferroccl.h); this module adds the enum values by name and small helpers:

  * fcclResult_t, fcclDataType_t and fcclRedOp_t are C ints;
  * fcclComm_t and fcclStream_t are opaque pointers (c_void_p);
  * fcclUniqueId is a struct of 128 chars, passed by value to fcclCommInitRank.

The library is loaded from $FERROCCL_LIB, by default
../../target/release/libferroccl.so relative to this file. ctypes.CDLL releases the
GIL around each foreign call, so one Python thread per rank can block in a collective
while the others make progress.
"""

import ctypes
import importlib.util
import os
from ctypes import byref, c_int, c_size_t, c_void_p

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LIB = os.path.normpath(os.path.join(HERE, "..", "..", "target", "release", "libferroccl.so"))


def lib_path():
    return os.environ.get("FERROCCL_LIB") or DEFAULT_LIB


def _package_lib():
    """python/ferroccl/_lib.py of this checkout, loaded on its own (it loads no library
    and imports only the standard library), whatever ferroccl is installed."""
    path = os.path.normpath(os.path.join(HERE, "..", "..", "python", "ferroccl", "_lib.py"))
    spec = importlib.util.spec_from_file_location("ferroccl_checkout_lib", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_pkg = _package_lib()


# fcclResult_t
fcclSuccess = 0
fcclUnhandledCudaError = 1
fcclSystemError = 2
fcclInternalError = 3
fcclInvalidArgument = 4
fcclInvalidUsage = 5
fcclRemoteError = 6
fcclInProgress = 7
fcclTimeout = 8
fcclCollectiveMismatch = 100
fcclUnavailable = 101

# fcclDataType_t
fcclInt8 = 0
fcclUint8 = 1
fcclInt32 = 2
fcclUint32 = 3
fcclInt64 = 4
fcclUint64 = 5
fcclFloat16 = 6
fcclFloat32 = 7
fcclFloat64 = 8
fcclBfloat16 = 9
fcclFloat8e4m3 = 10
fcclFloat8e5m2 = 11

# fcclRedOp_t
fcclSum = 0
fcclProd = 1
fcclMax = 2
fcclMin = 3
fcclAvg = 4
fcclBand = 64  # ferroccl's bitwise operators (integer types only)
fcclBor = 65
fcclBxor = 66

fcclResult_t = c_int
fcclDataType_t = c_int
fcclRedOp_t = c_int
fcclComm_t = c_void_p
fcclStream_t = c_void_p


fcclUniqueId = _pkg.UniqueIdStruct
FCCL_UNIQUE_ID_BYTES = _pkg.UNIQUE_ID_BYTES

# The package's table: one list of prototypes for the package and the tests.
_PROTOTYPES = _pkg._PROTOTYPES


class FcclError(RuntimeError):
    """A ferroccl call returned something other than fcclSuccess."""

    def __init__(self, call, code, message):
        self.call = call
        self.code = code
        self.message = message
        super().__init__(f"{call} returned {code} ({error_string(code)}): {message}")


_lib = None


def load(path=None):
    """Loads the library once and sets every prototype; returns the CDLL."""
    global _lib
    if _lib is not None and path is None:
        return _lib
    lib = ctypes.CDLL(path or lib_path())
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    if path is None:
        _lib = lib
    return lib


def last_error(comm=None):
    msg = load().fcclGetLastError(comm)
    return msg.decode("utf-8", "replace") if msg is not None else ""


def error_string(code):
    s = load().fcclGetErrorString(code)
    return s.decode("utf-8", "replace") if s is not None else "?"


def check(call, result, comm=None):
    """Raises FcclError with fcclGetLastError's message unless result is fcclSuccess."""
    if result != fcclSuccess:
        raise FcclError(call, result, last_error(comm))
    return result


def call(name, *args):
    """Calls fccl<name>(*args) and raises FcclError on failure."""
    return check(name, getattr(load(), name)(*args))


def ptr(arr, offset=0):
    """A void* to element `offset` of a C-contiguous numpy array (None passes NULL)."""
    if arr is None:
        return None
    assert arr.flags["C_CONTIGUOUS"], "ferroccl needs contiguous buffers"
    return c_void_p(arr.ctypes.data + offset * arr.itemsize)


def size_array(values):
    return (c_size_t * len(values))(*values)


# Small conveniences built on the raw calls.

def version():
    v = c_int(-1)
    call("fcclGetVersion", byref(v))
    return v.value


def comm_init_from_env():
    comm = fcclComm_t()
    call("fcclCommInitFromEnv", byref(comm))
    return comm


def comm_init_all(n):
    comms = (fcclComm_t * n)()
    call("fcclCommInitAll", comms, n, None)
    return [fcclComm_t(comms[i]) for i in range(n)]


def get_unique_id():
    uid = fcclUniqueId()
    call("fcclGetUniqueId", byref(uid))
    return uid


def comm_init_rank(nranks, uid, rank):
    comm = fcclComm_t()
    call("fcclCommInitRank", byref(comm), nranks, uid, rank)
    return comm


def comm_count(comm):
    v = c_int(-1)
    call("fcclCommCount", comm, byref(v))
    return v.value


def comm_user_rank(comm):
    v = c_int(-1)
    call("fcclCommUserRank", comm, byref(v))
    return v.value


def comm_cu_device(comm):
    v = c_int(-2)
    call("fcclCommCuDevice", comm, byref(v))
    return v.value
