"""ferroccl for Python: collectives on numpy arrays through libferroccl's C ABI (ctypes).

    import numpy as np, ferroccl

    with ferroccl.Comm.from_env() as comm:        # under `ferroccl-run -n 4 python app.py`
        x = np.arange(8, dtype=np.float32) * (comm.rank + 1)
        total = comm.all_reduce(x)                 # a new array; out=x for in place
        parts = comm.all_gather(x)                 # shape (comm.size, 8)

    comms = ferroccl.Comm.init_all(4)              # 4 ranks as threads of this process

Every failure of the library raises :class:`FcclError`, carrying the result code and the
library's message. Arrays must be host memory (numpy); any C-contiguous array of a
supported dtype is sent as is, others are copied into a contiguous one first. Results
are new arrays unless ``out=`` names one (``out`` may be the input itself: in place).

Supported dtypes: int8, uint8, int32, uint32, int64, uint64, float16, float32, float64,
and, when the ``ml_dtypes`` package is installed, bfloat16, float8_e4m3fn, float8_e5m2.
Reduction operators: ``"sum"``, ``"prod"``, ``"max"``, ``"min"``, ``"avg"`` (or
:class:`Op`).
"""

import contextlib
import ctypes
import enum
import threading
from ctypes import byref, c_int, c_void_p

import numpy as np

from . import _lib
from ._lib import FcclError, error_string, last_error, library_path

__all__ = [
    "Comm", "FcclError", "Op", "Result", "UniqueId", "group", "get_unique_id", "version",
    "library_path", "error_string", "last_error", "dtypes", "SPLIT_NOCOLOR",
]

SPLIT_NOCOLOR = -1


class Result(enum.IntEnum):
    """fcclResult_t values."""

    SUCCESS = 0
    UNHANDLED_CUDA_ERROR = 1
    SYSTEM_ERROR = 2
    INTERNAL_ERROR = 3
    INVALID_ARGUMENT = 4
    INVALID_USAGE = 5
    REMOTE_ERROR = 6
    IN_PROGRESS = 7
    TIMEOUT = 8
    COLLECTIVE_MISMATCH = 100
    UNAVAILABLE = 101


class Op(enum.IntEnum):
    """Reduction operators (fcclRedOp_t)."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


# ------------------------------------------------------------------ dtypes

_DTYPES = {
    np.dtype(np.int8): 0,
    np.dtype(np.uint8): 1,
    np.dtype(np.int32): 2,
    np.dtype(np.uint32): 3,
    np.dtype(np.int64): 4,
    np.dtype(np.uint64): 5,
    np.dtype(np.float16): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.float64): 8,
}
try:  # bfloat16 and fp8 come from ml_dtypes (as in JAX); offered only when it is there
    import ml_dtypes as _ml

    _DTYPES[np.dtype(_ml.bfloat16)] = 9
    _DTYPES[np.dtype(_ml.float8_e4m3fn)] = 10
    _DTYPES[np.dtype(_ml.float8_e5m2)] = 11
except ImportError:  # pragma: no cover - depends on the environment
    _ml = None


def dtypes():
    """The numpy dtypes ferroccl accepts here, in fcclDataType_t order."""
    return [d for d, _ in sorted(_DTYPES.items(), key=lambda kv: kv[1])]


def _fccl_type(dtype):
    d = np.dtype(dtype)
    if not d.isnative:
        raise TypeError(f"dtype {d} is not in this machine's byte order; convert with "
                        f"a.astype(a.dtype.newbyteorder('='))")
    code = _DTYPES.get(d)
    if code is None:
        names = ", ".join(str(x) for x in dtypes())
        hint = "" if _ml is not None else " (bfloat16 and fp8 need the ml_dtypes package)"
        raise TypeError(f"ferroccl does not support dtype {d}; supported: {names}{hint}")
    return code


def _fccl_op(op):
    if isinstance(op, str):
        try:
            return int(Op[op.upper()])
        except KeyError:
            raise ValueError(f"unknown reduction op {op!r}; use one of "
                             f"{', '.join(o.name.lower() for o in Op)}") from None
    return int(Op(op))


# ------------------------------------------------------------------ groups

_tls = threading.local()


def _keep(*objs):
    """Inside a group, buffers must live until the outermost group end."""
    if getattr(_tls, "depth", 0) > 0:
        _tls.keep.extend(o for o in objs if o is not None)


def group_start():
    """fcclGroupStart: calls on this thread are queued until the matching group_end."""
    _lib.check("fcclGroupStart", _lib.lib().fcclGroupStart())
    if getattr(_tls, "depth", 0) == 0:
        _tls.keep = []
    _tls.depth = getattr(_tls, "depth", 0) + 1


def group_end():
    """fcclGroupEnd: the outermost one runs the queued calls (results are then in place)."""
    try:
        _lib.check("fcclGroupEnd", _lib.lib().fcclGroupEnd())
    finally:
        _tls.depth = max(getattr(_tls, "depth", 1) - 1, 0)
        if _tls.depth == 0:
            _tls.keep = []


@contextlib.contextmanager
def group():
    """``with ferroccl.group(): ...``: the calls inside run together at the end (NCCL's
    group semantics: one thread may drive several communicators, matched send/recv
    pairs never deadlock). Arrays returned inside the block are filled when it ends."""
    group_start()
    try:
        yield
    finally:
        group_end()


# ------------------------------------------------------------------ unique ids

class UniqueId:
    """The 128-byte rendezvous handle (fcclUniqueId). Send it to the other ranks by any
    means (``bytes(uid)``, ``uid.hex()``); the process that made it serves the
    rendezvous and must stay alive until every rank has joined."""

    __slots__ = ("_raw",)

    def __init__(self, raw):
        raw = bytes(raw)
        if len(raw) != _lib.UNIQUE_ID_BYTES:
            raise ValueError(f"a unique id has {_lib.UNIQUE_ID_BYTES} bytes, got {len(raw)}")
        self._raw = raw

    @classmethod
    def from_hex(cls, text):
        return cls(bytes.fromhex(text.strip()))

    def hex(self):
        return self._raw.hex()

    def __bytes__(self):
        return self._raw

    def __eq__(self, other):
        return isinstance(other, UniqueId) and other._raw == self._raw

    def __hash__(self):
        return hash(self._raw)

    def __repr__(self):
        return "UniqueId(...)"  # never print the secret

    def _struct(self):
        s = _lib.UniqueIdStruct()
        ctypes.memmove(byref(s), self._raw, _lib.UNIQUE_ID_BYTES)
        return s


def get_unique_id():
    """fcclGetUniqueId: a new id whose rendezvous point lives in this process."""
    s = _lib.UniqueIdStruct()
    _lib.check("fcclGetUniqueId", _lib.lib().fcclGetUniqueId(byref(s)))
    return UniqueId(ctypes.string_at(byref(s), _lib.UNIQUE_ID_BYTES))


def version():
    """The library's version as (major, minor, patch), from fcclGetVersion."""
    v = c_int()
    _lib.check("fcclGetVersion", _lib.lib().fcclGetVersion(byref(v)))
    return (v.value // 10000, v.value // 100 % 100, v.value % 100)


def __getattr__(name):  # PEP 562: __version__ is the loaded library's version
    if name == "__version__":
        return ".".join(str(x) for x in version())
    raise AttributeError(f"module 'ferroccl' has no attribute {name!r}")


def _config(timeout_ms=None, name=None, blocking=None, check=None):
    if timeout_ms is None and name is None and blocking is None and check is None:
        return None, None
    c = _lib.ConfigStruct.default()
    if timeout_ms is not None:
        c.timeoutMs = int(timeout_ms)
    if blocking is not None:
        c.blocking = 1 if blocking else 0
    if check is not None:
        c.checkMode = 1 if check else 0
    keep = None
    if name is not None:
        keep = name.encode("utf-8")
        c.commName = keep
    return c, keep


# ------------------------------------------------------------------ buffers

def _src(array):
    """A C-contiguous array with the data of `array` (no copy when it already is one)."""
    a = np.asarray(array, order="C")
    _fccl_type(a.dtype)
    return a


def _ptr(a):
    return c_void_p(a.ctypes.data) if a is not None else None


def _check_out(out, dtype, shape_or_size, what):
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{what}: out must be a numpy array, not {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"{what}: out has dtype {out.dtype}, the data {dtype}")
    size = shape_or_size if isinstance(shape_or_size, int) else int(np.prod(shape_or_size, dtype=np.int64))
    if out.size != size:
        raise ValueError(f"{what}: out has {out.size} elements, the result {size}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"{what}: out must be C-contiguous and writeable")
    return out


def _blocks(a, nranks, what):
    """Shape of one rank's block of an array holding nranks blocks."""
    if a.ndim >= 1 and a.shape[0] % nranks == 0:
        return (a.shape[0] // nranks,) + a.shape[1:]
    if a.size % nranks == 0:
        return (a.size // nranks,)
    raise ValueError(f"{what}: {a.size} elements (shape {a.shape}) do not split into {nranks} equal blocks")


# ------------------------------------------------------------------ communicators

class Comm:
    """A communicator (fcclComm_t). Make one with :meth:`from_env`, :meth:`init_rank` or
    :meth:`init_all`; release it with :meth:`close` (or use it as a context manager).

    Collectives take numpy arrays and follow NCCL's semantics; every rank must make the
    same calls in the same order."""

    def __init__(self, handle):
        self._h = c_void_p(handle) if not isinstance(handle, c_void_p) else handle
        if not self._h.value:
            raise ValueError("Comm needs a non-NULL fcclComm_t")
        r, n = c_int(), c_int()
        self._call("fcclCommUserRank", self._h, byref(r))
        self._call("fcclCommCount", self._h, byref(n))
        self._rank, self._size = r.value, n.value

    @staticmethod
    def _call(name, *args):
        _lib.check(name, getattr(_lib.lib(), name)(*args))

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_env(cls):
        """fcclCommInitFromEnv: this process's rank of a job started by ``ferroccl-run``
        (FERROCCL_RANK, FERROCCL_WORLD_SIZE, FERROCCL_UNIQUE_ID / FERROCCL_ROOT_ADDR) or
        torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
        h = c_void_p()
        cls._call("fcclCommInitFromEnv", byref(h))
        return cls(h)

    @classmethod
    def init_rank(cls, nranks, unique_id, rank, *, timeout_ms=None, name=None, blocking=None, check=None):
        """fcclCommInitRank(Config): rank `rank` of `nranks` meeting at `unique_id`.
        Options: timeout_ms (bound on every wait), name (in logs and messages),
        check (fingerprint calls to detect mismatched collectives)."""
        if not isinstance(unique_id, UniqueId):
            unique_id = UniqueId(unique_id)
        h = c_void_p()
        cfg, _keepalive = _config(timeout_ms, name, blocking, check)
        cls._call("fcclCommInitRankConfig", byref(h), int(nranks), unique_id._struct(), int(rank),
                  byref(cfg) if cfg is not None else None)
        return cls(h)

    @classmethod
    def init_all(cls, n):
        """fcclCommInitAll(comms, n, NULL): `n` host-memory ranks in this process, returned
        as a list (rank r at index r). Drive them from one thread per rank, or from one
        thread inside :func:`group`."""
        arr = (c_void_p * int(n))()
        cls._call("fcclCommInitAll", arr, int(n), None)
        return [cls(c_void_p(arr[i])) for i in range(int(n))]

    def split(self, color, key=None, *, timeout_ms=None, name=None, blocking=None, check=None):
        """fcclCommSplit: every rank calls it; ranks with the same color form a new
        communicator ordered by key (default: this rank). Returns None for
        color=SPLIT_NOCOLOR."""
        h = c_void_p()
        cfg, _keepalive = _config(timeout_ms, name, blocking, check)
        self._call("fcclCommSplit", self._h, int(color), self._rank if key is None else int(key), byref(h),
                   byref(cfg) if cfg is not None else None)
        return Comm(h) if h.value else None

    # ---------------------------------------------------------------- lifetime

    @property
    def rank(self):
        """This rank's index in the communicator."""
        return self._rank

    @property
    def size(self):
        """Number of ranks."""
        return self._size

    @property
    def device(self):
        """fcclCommCuDevice: the CUDA device, -1 for host-memory ranks."""
        d = c_int()
        self._call("fcclCommCuDevice", self._h, byref(d))
        return d.value

    @property
    def closed(self):
        return self._h is None

    @property
    def handle(self):
        """The fcclComm_t as an int (for other ctypes / C code), None once closed."""
        return self._h.value if self._h is not None else None

    def async_error(self):
        """fcclCommGetAsyncError: the error that broke this communicator, or None."""
        e = c_int()
        self._call("fcclCommGetAsyncError", self._h, byref(e))
        if e.value == 0:
            return None
        try:
            return Result(e.value)
        except ValueError:
            return e.value

    def finalize(self):
        """fcclCommFinalize: finish outstanding work (then only close() is allowed)."""
        self._call("fcclCommFinalize", self._h)

    def close(self):
        """fcclCommDestroy. Idempotent."""
        if self._h is not None:
            h, self._h = self._h, None
            self._call("fcclCommDestroy", h)

    def abort(self):
        """fcclCommAbort: from any thread; every blocked call on this comm returns."""
        if self._h is not None:
            h, self._h = self._h, None
            self._call("fcclCommAbort", h)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()  # another rank may be blocked on us: do not wait for it
        return False

    def __repr__(self):
        state = "closed" if self._h is None else f"rank {self._rank} of {self._size}"
        return f"<ferroccl.Comm {state}>"

    # ---------------------------------------------------------------- collectives

    def all_reduce(self, array, op="sum", out=None):
        """Reduces `array` across ranks with `op`; every rank gets the result (a new array
        of the same shape, or `out`; ``out=array`` reduces in place)."""
        a = _src(array)
        t, o = _fccl_type(a.dtype), _fccl_op(op)
        if out is None:
            out = np.empty_like(a)
        else:  # out=array reduces in place
            _check_out(out, a.dtype, a.size, "all_reduce")
        _keep(a, out)
        self._call("fcclAllReduce", _ptr(a), _ptr(out), a.size, t, o, self._h, None)
        return out

    def broadcast(self, array, root=0, out=None):
        """Copies the root's `array` to every rank: returns a new array of the same shape
        (or `out`; ``out=array`` in place). Every rank passes an array of the root's shape
        and dtype; only the root's contents are read."""
        a = _src(array)
        t = _fccl_type(a.dtype)
        if out is None:
            out = np.empty_like(a)
        else:
            _check_out(out, a.dtype, a.size, "broadcast")
        _keep(a, out)
        self._call("fcclBroadcast", _ptr(a), _ptr(out), a.size, t, int(root), self._h, None)
        return out

    def reduce(self, array, op="sum", root=0, out=None):
        """Reduces `array` across ranks into the root: returns the result on the root (a
        new array or `out`), None on the other ranks."""
        a = _src(array)
        t, o = _fccl_type(a.dtype), _fccl_op(op)
        if self._rank == root:
            if out is None:
                out = np.empty_like(a)
            else:
                _check_out(out, a.dtype, a.size, "reduce")
        else:
            out = None
        _keep(a, out)
        self._call("fcclReduce", _ptr(a), _ptr(out), a.size, t, o, int(root), self._h, None)
        return out

    def all_gather(self, array, out=None):
        """Gathers every rank's `array` (all of one shape): returns shape
        ``(size,) + array.shape``, rank r's at index r (or fills `out`)."""
        a = _src(array)
        t = _fccl_type(a.dtype)
        if out is None:
            out = np.empty((self._size,) + a.shape, dtype=a.dtype)
        else:
            _check_out(out, a.dtype, a.size * self._size, "all_gather")
        _keep(a, out)
        self._call("fcclAllGather", _ptr(a), _ptr(out), a.size, t, self._h, None)
        return out

    def reduce_scatter(self, array, op="sum", out=None):
        """Reduces `array` (size equal blocks along axis 0, or of the flat data) across
        ranks; rank r gets block r of the result."""
        a = _src(array)
        t, o = _fccl_type(a.dtype), _fccl_op(op)
        shape = _blocks(a, self._size, "reduce_scatter")
        count = a.size // self._size
        if out is None:
            out = np.empty(shape, dtype=a.dtype)
        else:
            _check_out(out, a.dtype, count, "reduce_scatter")
        _keep(a, out)
        self._call("fcclReduceScatter", _ptr(a), _ptr(out), count, t, o, self._h, None)
        return out

    def all_to_all(self, array, out=None):
        """Sends block p of `array` (size equal blocks along axis 0) to rank p; block q of
        the result comes from rank q. Returns an array of `array`'s shape (or `out`)."""
        a = _src(array)
        t = _fccl_type(a.dtype)
        _blocks(a, self._size, "all_to_all")
        count = a.size // self._size
        if out is None:
            out = np.empty_like(a)
        else:
            _check_out(out, a.dtype, a.size, "all_to_all")
        _keep(a, out)
        self._call("fcclAlltoAll", _ptr(a), _ptr(out), count, t, self._h, None)
        return out

    def gather(self, array, root=0, out=None):
        """Gathers every rank's `array` into the root: shape ``(size,) + array.shape`` on
        the root (or `out`), None elsewhere."""
        a = _src(array)
        t = _fccl_type(a.dtype)
        if self._rank == root:
            if out is None:
                out = np.empty((self._size,) + a.shape, dtype=a.dtype)
            else:
                _check_out(out, a.dtype, a.size * self._size, "gather")
        else:
            out = None
        _keep(a, out)
        self._call("fcclGather", _ptr(a), _ptr(out), a.size, t, int(root), self._h, None)
        return out

    def scatter(self, array, root=0, out=None):
        """Sends block r of the root's `array` (size equal blocks along axis 0) to rank r.
        Every rank passes an array of the root's shape and dtype (only the root's is
        read), or None with `out` giving the block's size and dtype."""
        if array is None:
            if out is None:
                raise ValueError("scatter: pass the array (any contents off the root) or out=")
            a = None
            dtype, count = out.dtype, out.size
            _check_out(out, dtype, count, "scatter")
        else:
            a = _src(array)
            dtype = a.dtype
            shape = _blocks(a, self._size, "scatter")
            count = a.size // self._size
            if out is None:
                out = np.empty(shape, dtype=dtype)
            else:
                _check_out(out, dtype, count, "scatter")
        t = _fccl_type(dtype)
        _keep(a, out)
        self._call("fcclScatter", _ptr(a), _ptr(out), count, t, int(root), self._h, None)
        return out

    def send(self, array, peer):
        """Sends `array` to rank `peer`, which posts a matching recv (same size and dtype).
        Outside a group it returns once the peer has received it."""
        a = _src(array)
        t = _fccl_type(a.dtype)
        _keep(a)
        self._call("fcclSend", _ptr(a), a.size, t, int(peer), self._h, None)

    def recv(self, out, peer):
        """Receives from rank `peer` into `out` (a C-contiguous writeable array of the
        sent size and dtype) and returns it."""
        if not isinstance(out, np.ndarray):
            raise TypeError("recv: out must be a numpy array")
        t = _fccl_type(out.dtype)
        _check_out(out, out.dtype, out.size, "recv")
        _keep(out)
        self._call("fcclRecv", _ptr(out), out.size, t, int(peer), self._h, None)
        return out

    def barrier(self):
        """Returns once every rank has called barrier."""
        self._call("fcclBarrier", self._h, None)
