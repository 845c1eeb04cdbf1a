"""ferroccl for Python: collectives on the arrays you have (numpy, torch, DLPack, CUDA
array interface, buffers) through libferroccl's C ABI (ctypes).

    import numpy as np, ferroccl

    with ferroccl.Comm.from_env() as comm:        # under `ferroccl-run -n 4 python app.py`
        x = np.arange(8, dtype=np.float32) * (comm.rank + 1)
        comm.all_reduce(x)                         # in place: x holds the sum, and is returned
        parts = comm.all_gather(x)                 # a new array, shape (comm.size, 8)
        work = comm.all_reduce(x, async_op=True)   # a Work: wait(), is_completed()
        work.wait()

    comms = ferroccl.Comm.init_all(4)              # 4 ranks as threads of this process

Same-shape collectives (all_reduce, broadcast, reduce on the root) work in place on the
caller's object and return it, unless ``out=`` names another array (of any accepted
kind). Collectives whose result has another shape return a new array of the input's
kind (numpy for host buffers, torch for torch, :class:`DeviceArray` for other device
memory) or fill ``out=``. Nothing is copied: non-contiguous inputs raise ValueError.
Device memory (torch CUDA tensors, ``__cuda_array_interface__``, DLPack CUDA) runs on
the producer's stream (torch's current stream, the interface's ``stream``) or
``stream=``.

Every failure of the library raises :class:`FcclError`, carrying the result code and the
library's message. Dtypes: int8, uint8, int32, uint32, int64, uint64, float16, float32,
float64, bfloat16, float8_e4m3fn, float8_e5m2 (numpy's bfloat16/fp8 through ml_dtypes),
and bool and int16, which the library has no type for: they move as their bytes; bool
reduces as uint8 with the logical operator (sum, max and bor: or; prod, min and band:
and; bxor: xor, as torch does), int16 reduces in int32 and is narrowed back (sums and
products wrap modulo 2**16, as int16 arithmetic does); "avg" of either is refused.
Reduction operators: ``"sum"``, ``"prod"``, ``"max"``, ``"min"``, ``"avg"`` and, for
integer types only, the bitwise ``"band"``, ``"bor"``, ``"bxor"`` (or :class:`Op`).
"""

import contextlib
import ctypes
import enum
import threading
from ctypes import byref, c_char_p, c_int, c_size_t, c_void_p

from . import _buf, _lib, _mem, _work
from ._lib import FcclError, error_string, last_error, library_path
from ._mem import DeviceArray, empty
from ._run import launcher_path
from ._work import Work

__all__ = [
    "Comm", "FcclError", "Op", "Result", "UniqueId", "group", "get_unique_id", "version",
    "library_path", "error_string", "last_error", "dtypes", "SPLIT_NOCOLOR", "Work", "DeviceArray", "empty",
    "launcher_path",
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
    BAND = 64  # bitwise and, or, xor: ferroccl's own (integer types only)
    BOR = 65
    BXOR = 66


# ------------------------------------------------------------------ dtypes

_DTYPES = _buf.NP_CODES


def dtypes():
    """The numpy dtypes ferroccl accepts here, in fcclDataType_t order (torch tensors,
    DLPack and array interfaces have bfloat16 and fp8 without ml_dtypes)."""
    return [d for d, _ in sorted(_DTYPES.items(), key=lambda kv: kv[1])]


def _wire_code(dtype):
    return _mem._code_of(dtype)


_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4, "band": 64, "bor": 65, "bxor": 66}
_OP_NAMES = {v: k for k, v in _OPS.items()}
# bool reduces as uint8 (0 or 1) with the logical operator: or for sum/max/bor, and for
# prod/min/band, xor for bxor (torch's semantics for bool; avg has none).
_BOOL_OPS = {0: 2, 1: 3, 2: 2, 3: 3, 64: 3, 65: 2, 66: 66}


def _fccl_op(op):
    code = _OPS.get(op) if isinstance(op, str) else None
    if code is not None:
        return code
    if isinstance(op, str):
        try:
            return int(Op[op.upper()])
        except KeyError:
            raise ValueError(f"unknown reduction op {op!r}; use one of "
                             f"{', '.join(o.name.lower() for o in Op)}") from None
    return int(Op(op))


# ------------------------------------------------------------------ groups

_tls = threading.local()


def group_start():
    """fcclGroupStart: calls on this thread are queued until the matching group_end."""
    _lib.check("fcclGroupStart", _lib.lib().fcclGroupStart())
    if getattr(_tls, "depth", 0) == 0:
        _tls.keep = []
        _tls.nonblocking = []
    _tls.depth = getattr(_tls, "depth", 0) + 1


def group_end():
    """fcclGroupEnd: the outermost one runs the queued calls (results are then in place;
    a group of non-blocking communicators is waited for here, as their calls are)."""
    try:
        rc = _lib.lib().fcclGroupEnd()
        if rc and rc != _lib.IN_PROGRESS:
            _lib.check("fcclGroupEnd", rc)
        if _tls.depth == 1:
            for c in _tls.nonblocking:
                c._settle("fcclGroupEnd")
    finally:
        _tls.depth = max(getattr(_tls, "depth", 1) - 1, 0)
        if _tls.depth == 0:
            _tls.keep = []
            _tls.nonblocking = []


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


_INT_MAX = 2**31 - 1  # a C int's largest value: ctypes would truncate a larger one silently


def _rank_arg(value, what, call, size, whole_range=False):
    """`value` (a root or peer) as an int for C: FcclError (fcclInvalidArgument), before
    any call, where it is negative or beyond a C int, which ctypes would truncate
    (2**40 becomes 0); with `whole_range`, also where it is no rank of the communicator
    (calls that never pass it to C)."""
    v = int(value)
    if v < 0 or v > _INT_MAX or (whole_range and v >= size):
        raise _lib.FcclError(call, 4, f"{call}: {what} is {v}: give a rank of this communicator, "
                                      f"from 0 to {size - 1}")
    return v


def _config(timeout_ms=None, name=None, blocking=None, check=None, call="fcclCommInitRankConfig"):
    if timeout_ms is None and name is None and blocking is None and check is None:
        return None, None
    c = _lib.ConfigStruct.default()
    if timeout_ms is not None:
        ms = int(timeout_ms)
        if not 0 <= ms <= _INT_MAX:  # a C int: ctypes would truncate it silently
            raise _lib.FcclError(call, 4, f"{call}: timeout_ms is {ms}: give a number of milliseconds from 1 to "
                                          f"{_INT_MAX} (about 24.8 days), or 0 or None for the default")
        c.timeoutMs = ms
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

_resolve = _buf.resolve
_ndarray = _buf.np.ndarray
_NP_CODES = {d: c for d, c in _buf.NP_CODES.items() if c not in _buf.C_TYPE}  # the fast path's
_C_TYPE = _buf.C_TYPE


def _cc(code):
    """The fcclDataType_t a buffer of `code` is passed as (bool and int16: uint8)."""
    t = _C_TYPE.get(code)
    return code if t is None else t[0]


def _cn(code, n):
    """`n` elements of `code` counted in the library's elements (int16: 2 bytes each)."""
    t = _C_TYPE.get(code)
    return n if t is None else n * t[1]


def _red_args(call, info, op):
    """(fcclDataType_t, fcclRedOp_t) of a reduction of `info` with `op`; None for int16,
    which reduces widened (Comm._int16). Refuses what has no meaning for bool or int16."""
    o = _OPS.get(op) if type(op) is str else None
    if o is None:
        o = _fccl_op(op)
    code = info.code
    if code not in _C_TYPE:
        return code, o
    name = _buf.TYPE_NAMES[code]
    if o == 4:
        raise FcclError(call, 4, f"{call}: op avg of {name} data has no {name} result; convert the data "
                                 "(e.g. to float32) and average that")
    if code == _buf.BOOL:
        return 1, _BOOL_OPS[o]
    return None


def _i16_view(info):
    """A numpy int16 view of host memory described by `info`."""
    raw = (ctypes.c_int16 * info.count).from_address(info.ptr) if info.count else b""
    return _buf.np.frombuffer(raw, dtype=_buf.np.int16).reshape(info.shape)


def _widen(info, what):
    """An int32 copy of the int16 data of `info` (torch for torch, else numpy)."""
    if info.kind == "torch":
        import torch

        return info.obj.to(torch.int32)
    if info.device:
        raise TypeError(f"{what}: int16 device memory reduces widened to int32, which this package does with "
                        "torch only: pass a torch tensor, or int32 data")
    return _i16_view(info).astype(_buf.np.int32)


def _narrow_into(info, wide):
    """Writes int32 `wide` (as many elements) into the int16 array of `info`, keeping
    the low 16 bits (int16 arithmetic's wrap-around); returns the array."""
    if info.kind == "torch":
        info.obj.copy_(wide.reshape(info.obj.shape))
    else:
        _i16_view(info)[...] = wide.astype(_buf.np.int16).reshape(info.shape)
    return info.obj
_addressof = ctypes.addressof
_from_buffer = ctypes.c_char.from_buffer


def _resolve_out(out, src, count, what, stream=None):
    """`out` resolved and checked against the data it receives (dtype, element count)."""
    o = _resolve(out, f"{what} out", src.stream if stream is None else stream)
    if o.code != src.code:
        raise TypeError(f"{what}: out has dtype {_buf.TYPE_NAMES[o.code]}, the data {_buf.TYPE_NAMES[src.code]}")
    if o.count != count:
        raise ValueError(f"{what}: out has {o.count} elements, the result {count}")
    if o.readonly:
        raise ValueError(f"{what}: out is read-only")
    return o


def _new_out(src, shape, what):
    return _resolve(_buf.new_like(src, shape, what), what, src.stream)


def _writable(info, what):
    if info.readonly:
        raise ValueError(f"{what}: the {type(info.obj).__name__} is read-only and this call works in place; "
                         "pass out= (a writeable array) for the result")
    return info


def _blocks(info, nranks, what):
    """Shape of one rank's block of an array holding nranks blocks."""
    shape = info.shape
    if len(shape) >= 1 and shape[0] % nranks == 0:
        return (shape[0] // nranks,) + tuple(shape[1:])
    if info.count % nranks == 0:
        return (info.count // nranks,)
    raise ValueError(f"{what}: {info.count} elements (shape {tuple(shape)}) do not split into {nranks} equal blocks")


def _sizes(values, n, what, name):
    vals = [int(v) for v in values]
    if len(vals) != n:
        raise ValueError(f"{what}: {name} has {len(vals)} entries, the communicator {n} ranks")
    if any(v < 0 for v in vals):
        raise ValueError(f"{what}: {name} has a negative entry: {vals}")
    return (c_size_t * n)(*vals), vals


def _displs(vals):
    out, acc = [], 0
    for v in vals:
        out.append(acc)
        acc += v
    return (c_size_t * len(vals))(*out), acc


def _c_counts(code, vals):
    """Counts and their displacements (packed one after another) in the library's
    elements, for a buffer of `code`: two C arrays."""
    vals = [_cn(code, v) for v in vals]
    return (c_size_t * len(vals))(*vals), _displs(vals)[0]


def _c_shape(code, shape):
    """`shape` in the library's elements: int16 moves as uint8 pairs, so the last (fastest)
    dimension doubles, which keeps every block along any axis whole."""
    shape = list(shape)
    if shape:
        shape[-1] = _cn(code, shape[-1])
    return shape


def _stream_arg(stream):
    """stream= as the library takes it: an int handle, an object with .cuda_stream
    (torch.cuda.Stream) or .ptr (CuPy), or None (NULL: the legacy default stream)."""
    if stream is None or isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise TypeError(f"stream must be an int (a cudaStream_t) or have .cuda_stream / .ptr, "
                    f"not {type(stream).__name__}")


def _in_group():
    return getattr(_tls, "depth", 0) > 0


# ------------------------------------------------------------------ communicators

class Comm:
    """A communicator (fcclComm_t). Make one with :meth:`from_env`, :meth:`init_rank` or
    :meth:`init_all`; release it with :meth:`close` (or use it as a context manager).

    Collectives follow NCCL's semantics; every rank must make the same calls in the same
    order. Each takes ``stream=`` (device memory: the CUDA stream to run on) and
    ``async_op=`` (True: returns a :class:`Work`; the calls of one communicator run in
    order on one worker thread).

    ``blocking=False`` (:meth:`init_rank`, :meth:`split`) makes a non-blocking
    communicator, NCCL's kind: its creation returns at once, and its calls run in order
    on the library's progress thread for the communicator (fcclInProgress), so
    ``async_op=True`` needs no Python thread; :class:`Work` objects poll
    fcclCommGetAsyncError. A call without ``async_op`` still returns its finished
    result. Calls made before the creation has finished wait for it. After an error
    the communicator only takes close() and abort()."""

    def __init__(self, handle, *, nonblocking=False, rank=None, size=None):
        self._h = c_void_p(handle) if not isinstance(handle, c_void_p) else handle
        if not self._h.value:
            raise ValueError("Comm needs a non-NULL fcclComm_t")
        self._L = _lib.lib()
        self._all_reduce = self._L.fcclAllReduce
        self._worker = None
        self._worker_lock = threading.Lock()
        self._nb = bool(nonblocking)
        # Non-blocking: whether the creation is known to have finished; the calls issued,
        # and how many of them are known to have finished (with their buffers until then).
        self._ready = not self._nb
        self._issued = 0
        self._settled = 0
        self._inflight = []
        self._aborted = False
        if rank is not None and size is not None:
            self._rank, self._size = int(rank), int(size)
        elif self._ready:
            self._query()
        # else: rank and size are read once the creation has finished (__getattr__)

    def _query(self):
        r, n = c_int(), c_int()
        self._call("fcclCommUserRank", self._h, byref(r))
        self._call("fcclCommCount", self._h, byref(n))
        self._rank, self._size = r.value, n.value

    def __getattr__(self, name):
        # Only for attributes not set: the rank and size of a non-blocking split's
        # communicator, known once its creation has finished.
        if name in ("_rank", "_size") and "_h" in self.__dict__:
            self._wait_ready()
            self._query()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @staticmethod
    def _call(name, *args):
        _lib.check(name, getattr(_lib.lib(), name)(*args))

    # ---------------------------------------------------------------- non-blocking

    @property
    def blocking(self):
        """False for a non-blocking communicator (``blocking=False``)."""
        return not self._nb

    def _live(self, name):
        """FcclError (fcclInvalidArgument) for a call `name` on a closed communicator,
        before the library sees a NULL handle."""
        if self._h is None:
            how = "abort()" if getattr(self, "_aborted", False) else "close()"
            raise _lib.FcclError(name, 4, f"{name}: this communicator is closed ({how} was called): create a new "
                                 "Comm for further calls")

    def _status(self):
        """fcclCommGetAsyncError's code; an error's message is then this thread's last_error()."""
        self._live("fcclCommGetAsyncError")
        e = c_int()
        self._call("fcclCommGetAsyncError", self._h, byref(e))
        return e.value

    def _wait_ready(self):
        """Waits for a non-blocking creation; raises its error."""
        if not self._ready:
            self._settle("fcclCommInitRankConfig")
            self._ready = True

    def _poll(self):
        """One poll of a non-blocking communicator: True once the calls issued before it
        have finished (their buffers are then let go); raises the communicator's error."""
        if self._h is None:
            raise ValueError("the communicator is closed")
        issued = self._issued
        st = self._status()
        if st == _lib.IN_PROGRESS:
            return False
        if st != 0:
            raise _lib.async_error(st)
        self._ready = True
        if issued > self._settled:
            self._settled = issued
            self._inflight = [w for w in self._inflight if w[0] > issued]
        return True

    def _settle(self, what, timeout=None):
        """Polls until the pending work has finished; raises its error."""
        _work.poll_until(self._poll, what, timeout)

    def in_progress(self):
        """True while work of this non-blocking communicator (its creation, a call, a
        group, a split, finalize) is queued or running; raises its error, if any."""
        if not self._nb:
            return False
        return not self._poll()

    def wait(self, timeout=None):
        """Waits until nothing is pending on this communicator (the creation of a
        non-blocking one included) and raises the error that stopped it, if any. With
        `timeout` (seconds): TimeoutError if still pending then. Returns self."""
        if self._nb:
            self._settle("wait", timeout)
        else:
            self.synchronize()
        return self

    def _issue(self, name, args, result, keep, async_op):
        """A call on a non-blocking communicator: the library queues it (fcclInProgress)
        and a Work polls for it; without async_op it is waited for here."""
        self._wait_ready()
        if _in_group():
            if async_op:
                raise ValueError(f"{name}: async_op=True inside ferroccl.group(); the group runs its calls at its "
                                 "end: leave async_op out there")
            _tls.keep.append(keep)
            if self not in _tls.nonblocking:
                _tls.nonblocking.append(self)
            rc = getattr(self._L, name)(*args)
            if rc:
                _lib.check(name, rc)
            return result
        rc = getattr(self._L, name)(*args)
        if rc and rc != _lib.IN_PROGRESS:
            err = _lib.FcclError(name, rc, _lib.last_error() or _lib.error_string(rc))
            if async_op:
                return _work.Work.failed(name, err)
            raise err
        self._issued += 1
        self._inflight.append((self._issued, keep))
        work = _work.Issued(self, self._issued, name, result)
        return work if async_op else work.wait()

    def _run(self, name, args, result, keep, async_op):
        """Calls `name` now, or on the worker thread for async_op (and while async calls
        are queued, so that calls stay in order); returns result, or a Work. Non-blocking
        communicators need no worker: see _issue."""
        self._live(name)
        if self._nb:
            return self._issue(name, args, result, keep, async_op)
        w = self._worker
        if not async_op and (w is None or not w.busy() or w.is_current()):
            if _in_group():
                _tls.keep.append(keep)
            rc = getattr(self._L, name)(*args)
            if rc:
                _lib.check(name, rc)
            return result
        if _in_group():
            raise ValueError(f"{name}: async_op=True inside ferroccl.group(); the group runs its calls at its end "
                             "on this thread: leave async_op out there")
        fn = getattr(self._L, name)

        def call():
            _keep_alive = keep  # noqa: F841 - the buffers live until the call is done
            rc = fn(*args)
            if rc:
                _lib.check(name, rc)
            return result

        work = self._ensure_worker().submit(call, name)
        return work if async_op else work.wait()

    def _int16(self, name, async_op, run):
        """An int16 reduction: `run()` widens to int32, reduces and narrows back; here, or
        on the worker in call order (async_op, or while async calls are queued)."""
        self._live(name)
        if _in_group():
            raise ValueError(f"{name}: an int16 reduction inside ferroccl.group(); it reduces an int32 copy and "
                             "narrows the result when the call is done, which in a group is only at its end: "
                             "make the call outside the group (or pass int32 data)")
        if self._nb:
            if async_op:
                raise ValueError(f"{name}: async_op=True with int16 data on a non-blocking communicator; the "
                                 "call narrows its int32 result when done: leave async_op out (or pass int32)")
            return run()
        w = self._worker
        if not async_op and (w is None or not w.busy() or w.is_current()):
            return run()
        work = self._ensure_worker().submit(run, name)
        return work if async_op else work.wait()

    def _ensure_worker(self):
        with self._worker_lock:
            if self._worker is None:
                self._worker = _work.Worker(f"ferroccl-comm-{self._rank}")
            return self._worker

    def synchronize(self):
        """Waits for every call started with async_op=True on this communicator (their
        errors come out of their Work objects)."""
        if self._nb:
            if self._h is not None:
                _work.poll_until(lambda: self._status() != _lib.IN_PROGRESS, "synchronize", None)
            return
        w = self._worker
        if w is not None:
            w.submit(lambda: None, "synchronize").wait()

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_env(cls):
        """This process's rank of a job started by ``ferroccl-run`` (FERROCCL_RANK,
        FERROCCL_WORLD_SIZE, FERROCCL_UNIQUE_ID / FERROCCL_ROOT_ADDR), torchrun, mpirun or
        srun (docs/launchers.md); a process started on its own is rank 0 of 1.

        Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True: torchrun's TCPStore already
        listens on MASTER_PORT) and with torch importable, the unique id travels
        through that store (rank 0 makes it, the others read it); otherwise
        fcclCommInitFromEnv reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT."""
        import os

        if "FERROCCL_RANK" not in os.environ and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            from . import _torchstore

            uid, rank, size = _torchstore.unique_id_from_torchrun()
            return cls.init_rank(size, uid, rank)
        h = c_void_p()
        cls._call("fcclCommInitFromEnv", byref(h))
        return cls(h)

    @classmethod
    def init_rank(cls, nranks, unique_id, rank, *, timeout_ms=None, name=None, blocking=None, check=None):
        """fcclCommInitRank(Config): rank `rank` of `nranks` meeting at `unique_id`.
        Options: timeout_ms (bound on every wait), name (in logs and messages),
        check (True: fingerprint and agree on every call, so a mismatched collective
        fails alone; False: off; None: the default, which posts device calls of ranks
        sharing one GPU without agreeing on them, as NCCL)."""
        if not isinstance(unique_id, UniqueId):
            unique_id = UniqueId(unique_id)
        h = c_void_p()
        cfg, _keepalive = _config(timeout_ms, name, blocking, check)
        rc = _lib.lib().fcclCommInitRankConfig(byref(h), int(nranks), unique_id._struct(), int(rank),
                                               byref(cfg) if cfg is not None else None)
        if rc == _lib.IN_PROGRESS:  # blocking=False: the rendezvous goes on in the background
            return cls(h, nonblocking=True, rank=rank, size=nranks)
        _lib.check("fcclCommInitRankConfig", rc)
        return cls(h)

    @classmethod
    def init_all(cls, n, devices=None):
        """fcclCommInitAll: `n` ranks in this process, returned as a list (rank r at index
        r); host-memory ranks, or with `devices` (n CUDA device ids) device ranks. Drive
        them from one thread per rank, or from one thread inside :func:`group`."""
        arr = (c_void_p * int(n))()
        devs = None if devices is None else (c_int * int(n))(*[int(d) for d in devices])
        cls._call("fcclCommInitAll", arr, int(n), devs)
        return [cls(c_void_p(arr[i])) for i in range(int(n))]

    def split(self, color, key=None, *, timeout_ms=None, name=None, blocking=None, check=None):
        """fcclCommSplit: every rank calls it; ranks with the same color form a new
        communicator ordered by key (default: this rank). Returns None for
        color=SPLIT_NOCOLOR. A non-blocking new communicator (blocking=False, or
        inherited) is returned at once; its calls wait for the split to finish."""
        self.synchronize()
        h = c_void_p()
        cfg, _keepalive = _config(timeout_ms, name, blocking, check, call="fcclCommSplit")
        rc = self._L.fcclCommSplit(self._h, int(color), self._rank if key is None else int(key), byref(h),
                                   byref(cfg) if cfg is not None else None)
        if rc and rc != _lib.IN_PROGRESS:
            _lib.check("fcclCommSplit", rc)
        nb = self._nb if blocking is None else not blocking
        if not h.value:
            if rc == _lib.IN_PROGRESS:  # this rank took part only; its parent finishes the split
                self.synchronize()
            return None
        return Comm(h, nonblocking=True) if nb else Comm(h)

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
    def last_path(self):
        """fcclCommGetLastPath: (backend, algorithm) that served the last call on this
        communicator, e.g. ("ipc", "exec-reduce") for device memory moved GPU to
        GPU, ("staged", ...) through host memory, ("host", ...) for host memory;
        ("none", "none") before the first call."""
        self._live("fcclCommGetLastPath")
        b, a = c_char_p(), c_char_p()
        self._call("fcclCommGetLastPath", self._h, byref(b), byref(a))
        return (b.value or b"").decode(), (a.value or b"").decode()

    @property
    def last_exchanges(self):
        """fcclCommGetLastExchanges: how many times the last call on this communicator
        waited for the other ranks on the host besides moving its data (0 for host
        memory; 1 for a device call of ranks sharing one GPU agreed on first: its
        descriptor exchange; 0 once the ranks post their calls, from the first call on
        device memory on, unless checkMode is on (check=True or FERROCCL_CHECK=1))."""
        self._live("fcclCommGetLastExchanges")
        n = c_int()
        self._call("fcclCommGetLastExchanges", self._h, byref(n))
        return n.value

    @property
    def closed(self):
        return self._h is None

    @property
    def handle(self):
        """The fcclComm_t as an int (for other ctypes / C code), None once closed."""
        return self._h.value if self._h is not None else None

    def async_error(self):
        """fcclCommGetAsyncError: the error that broke this communicator, or None;
        Result.IN_PROGRESS while a non-blocking communicator has work pending."""
        e = self._status()
        if e == 0:
            return None
        try:
            return Result(e)
        except ValueError:
            return e

    def finalize(self):
        """fcclCommFinalize: finish outstanding work (then only close() is allowed)."""
        self._live("fcclCommFinalize")
        self.synchronize()
        if self._nb:
            self._wait_ready()
            rc = self._L.fcclCommFinalize(self._h)
            if rc and rc != _lib.IN_PROGRESS:
                _lib.check("fcclCommFinalize", rc)
            self._settle("fcclCommFinalize")
            return
        self._call("fcclCommFinalize", self._h)

    def close(self):
        """Waits for async calls, then fcclCommDestroy. Idempotent."""
        if self._h is not None:
            w, self._worker = self._worker, None
            if w is not None:
                w.stop()
            h, self._h = self._h, None
            self._call("fcclCommDestroy", h)  # waits for a non-blocking communicator's work
            self._settled, self._inflight = self._issued, []

    def abort(self):
        """fcclCommAbort: from any thread; every blocked call on this comm returns (async
        calls still queued then fail with the library's error)."""
        if self._h is not None:
            h, self._h = self._h, None
            self._aborted = True
            self._call("fcclCommAbort", h)
            self._inflight = []  # the library has let go of every buffer
            w, self._worker = self._worker, None
            if w is not None:
                w.stop()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()  # another rank may be blocked on us: do not wait for it
        return False

    def __repr__(self):
        if self._h is None:
            state = "closed"
        elif "_rank" not in self.__dict__:
            state = "being created (non-blocking)"
        else:
            state = f"rank {self._rank} of {self._size}" + ("" if self.blocking else ", non-blocking")
        return f"<ferroccl.Comm {state}>"

    # ---------------------------------------------------------------- collectives

    def all_reduce(self, array, op="sum", out=None, *, stream=None, async_op=False):
        """Reduces `array` across ranks with `op`; every rank gets the result, in place
        in `array` (returned), or in `out` when given."""
        if type(array) is _ndarray and out is None and not async_op and self._worker is None and not self._nb:
            # The common case without the general path's objects: 1 us less per call.
            code = _NP_CODES.get(array.dtype)
            o = _OPS.get(op)
            if code is not None and o is not None and array.flags.c_contiguous and not _in_group():
                try:
                    p = _addressof(_from_buffer(array))
                except (TypeError, ValueError):  # read-only or empty: the general path says why
                    pass
                else:
                    rc = self._all_reduce(p, p, array.size, code, o, self._h, None)
                    if rc:
                        self._live("fcclAllReduce")  # a closed communicator, in Python's words
                        _lib.check("fcclAllReduce", rc)
                    return array
        a = _resolve(array, "all_reduce", stream)
        ra = _red_args("fcclAllReduce", a, op)
        d = _writable(a, "all_reduce") if out is None else _resolve_out(out, a, a.count, "all_reduce")
        if ra is None:
            return self._int16("fcclAllReduce", async_op, lambda: _narrow_into(
                d, self.all_reduce(_widen(a, "all_reduce"), op, stream=stream)))
        code, o = ra
        return self._run("fcclAllReduce", (a.ptr, d.ptr, a.count, code, o, self._h, a.stream), d.obj, (a, d),
                         async_op)

    def broadcast(self, array, root=0, out=None, *, stream=None, async_op=False):
        """Copies the root's `array` to every rank, in place (returned) or into `out`.
        Every rank passes an array of the root's size and dtype."""
        root = _rank_arg(root, "root", "fcclBroadcast", self._size)
        a = _resolve(array, "broadcast", stream)
        d = _writable(a, "broadcast") if out is None else _resolve_out(out, a, a.count, "broadcast")
        return self._run("fcclBroadcast", (a.ptr, d.ptr, _cn(a.code, a.count), _cc(a.code), root, self._h,
                                           a.stream), d.obj, (a, d), async_op)

    def reduce(self, array, op="sum", root=0, out=None, *, stream=None, async_op=False):
        """Reduces `array` across ranks into the root, in place (or into `out`); returns
        the result on the root, None elsewhere (whose arrays are left as they were)."""
        root = _rank_arg(root, "root", "fcclReduce", self._size)
        a = _resolve(array, "reduce", stream)
        ra = _red_args("fcclReduce", a, op)
        if self._rank == root:
            d = _writable(a, "reduce") if out is None else _resolve_out(out, a, a.count, "reduce")
            dptr, res = d.ptr, d.obj
        else:
            d, dptr, res = None, None, None
        if ra is None:
            def run():
                r = self.reduce(_widen(a, "reduce"), op, root, stream=stream)
                return None if d is None else _narrow_into(d, r)

            return self._int16("fcclReduce", async_op, run)
        code, o = ra
        return self._run("fcclReduce", (a.ptr, dptr, a.count, code, o, root, self._h, a.stream), res,
                         (a, d), async_op)

    def all_gather(self, array, out=None, *, stream=None, async_op=False):
        """Gathers every rank's `array` (all of one size): returns shape
        ``(size,) + array.shape`` of the input's kind, rank r's at index r (or fills
        `out`)."""
        a = _resolve(array, "all_gather", stream)
        n = self._size
        d = _new_out(a, (n,) + tuple(a.shape), "all_gather") if out is None else \
            _resolve_out(out, a, a.count * n, "all_gather")
        return self._run("fcclAllGather", (a.ptr, d.ptr, _cn(a.code, a.count), _cc(a.code), self._h, a.stream),
                         d.obj, (a, d), async_op)

    def all_gather_v(self, array, counts, out=None, *, stream=None, async_op=False):
        """fcclAllGatherV: rank p contributes counts[p] elements (its whole `array`);
        every rank gets them one after another in rank order (a flat array of
        sum(counts) elements, or `out`)."""
        a = _resolve(array, "all_gather_v", stream)
        _, vals = _sizes(counts, self._size, "all_gather_v", "counts")
        total = sum(vals)
        cc, dd = _c_counts(a.code, vals)
        d = _new_out(a, (total,), "all_gather_v") if out is None else _resolve_out(out, a, total, "all_gather_v")
        return self._run("fcclAllGatherV", (a.ptr, _cn(a.code, a.count), d.ptr, cc, dd, _cc(a.code), self._h,
                                            a.stream), d.obj, (a, d, cc, dd), async_op)

    def all_gather_axis(self, array, axis, out=None, *, stream=None, async_op=False):
        """fcclAllGatherAxis: concatenates every rank's `array` (one shape) along `axis`."""
        a = _resolve(array, "all_gather_axis", stream)
        shape = tuple(a.shape)
        ax = _axis(axis, len(shape), "all_gather_axis")
        res = shape[:ax] + (shape[ax] * self._size,) + shape[ax + 1:]
        d = _new_out(a, res, "all_gather_axis") if out is None else \
            _resolve_out(out, a, a.count * self._size, "all_gather_axis")
        cshape = (c_size_t * max(len(shape), 1))(*_c_shape(a.code, shape))
        return self._run("fcclAllGatherAxis", (a.ptr, d.ptr, len(shape), cshape, ax, _cc(a.code), self._h,
                                               a.stream), d.obj, (a, d, cshape), async_op)

    def reduce_scatter(self, array, op="sum", out=None, *, stream=None, async_op=False):
        """Reduces `array` (size equal blocks along axis 0, or of the flat data) across
        ranks; rank r gets block r of the result (new, or `out`)."""
        a = _resolve(array, "reduce_scatter", stream)
        ra = _red_args("fcclReduceScatter", a, op)
        shape = _blocks(a, self._size, "reduce_scatter")
        count = a.count // self._size
        d = _new_out(a, shape, "reduce_scatter") if out is None else _resolve_out(out, a, count, "reduce_scatter")
        if ra is None:
            return self._int16("fcclReduceScatter", async_op, lambda: _narrow_into(
                d, self.reduce_scatter(_widen(a, "reduce_scatter"), op, stream=stream)))
        code, o = ra
        return self._run("fcclReduceScatter", (a.ptr, d.ptr, count, code, o, self._h, a.stream), d.obj, (a, d),
                         async_op)

    def reduce_scatter_v(self, array, counts, op="sum", out=None, *, stream=None, async_op=False):
        """fcclReduceScatterV: `array` holds counts[0], counts[1], ... elements one after
        another; rank r gets the reduction of block r (counts[r] elements)."""
        a = _resolve(array, "reduce_scatter_v", stream)
        ra = _red_args("fcclReduceScatterV", a, op)
        cc, vals = _sizes(counts, self._size, "reduce_scatter_v", "counts")
        dd, total = _displs(vals)
        if total > a.count:
            raise ValueError(f"reduce_scatter_v: counts add up to {total} elements, the array has {a.count}")
        mine = vals[self._rank]
        d = _new_out(a, (mine,), "reduce_scatter_v") if out is None else \
            _resolve_out(out, a, mine, "reduce_scatter_v")
        if ra is None:
            return self._int16("fcclReduceScatterV", async_op, lambda: _narrow_into(
                d, self.reduce_scatter_v(_widen(a, "reduce_scatter_v"), vals, op, stream=stream)))
        code, o = ra
        return self._run("fcclReduceScatterV", (a.ptr, cc, dd, d.ptr, code, o, self._h, a.stream), d.obj,
                         (a, d, cc, dd), async_op)

    def reduce_scatter_axis(self, array, axis, op="sum", out=None, *, stream=None, async_op=False):
        """fcclReduceScatterAxis: reduces `array` across ranks; rank r gets block r along
        `axis` (which must divide by the number of ranks)."""
        a = _resolve(array, "reduce_scatter_axis", stream)
        ra = _red_args("fcclReduceScatterAxis", a, op)
        shape = tuple(a.shape)
        ax = _axis(axis, len(shape), "reduce_scatter_axis")
        if shape[ax] % self._size:
            raise ValueError(f"reduce_scatter_axis: axis {ax} has {shape[ax]} entries, not a multiple of "
                             f"{self._size} ranks")
        res = shape[:ax] + (shape[ax] // self._size,) + shape[ax + 1:]
        d = _new_out(a, res, "reduce_scatter_axis") if out is None else \
            _resolve_out(out, a, a.count // self._size, "reduce_scatter_axis")
        if ra is None:
            return self._int16("fcclReduceScatterAxis", async_op, lambda: _narrow_into(
                d, self.reduce_scatter_axis(_widen(a, "reduce_scatter_axis"), ax, op, stream=stream)))
        code, o = ra
        cshape = (c_size_t * max(len(shape), 1))(*shape)
        return self._run("fcclReduceScatterAxis",
                         (a.ptr, d.ptr, len(shape), cshape, ax, code, o, self._h, a.stream), d.obj,
                         (a, d, cshape), async_op)

    def all_to_all(self, array, out=None, *, stream=None, async_op=False):
        """Sends block p of `array` (size equal blocks along axis 0) to rank p; block q of
        the result comes from rank q. Returns a new array of `array`'s shape (or `out`)."""
        a = _resolve(array, "all_to_all", stream)
        _blocks(a, self._size, "all_to_all")
        count = a.count // self._size
        d = _new_out(a, tuple(a.shape), "all_to_all") if out is None else \
            _resolve_out(out, a, a.count, "all_to_all")
        return self._run("fcclAlltoAll", (a.ptr, d.ptr, _cn(a.code, count), _cc(a.code), self._h, a.stream),
                         d.obj, (a, d), async_op)

    def all_to_allv(self, array, send_counts, recv_counts, out=None, *, stream=None, async_op=False):
        """fcclAlltoAllv: sends send_counts[p] elements (blocks one after another in
        `array`) to rank p and receives recv_counts[p] from rank p, one after another in
        the result (a flat array of sum(recv_counts), or `out`)."""
        a = _resolve(array, "all_to_allv", stream)
        _, svals = _sizes(send_counts, self._size, "all_to_allv", "send_counts")
        _, rvals = _sizes(recv_counts, self._size, "all_to_allv", "recv_counts")
        stotal, rtotal = sum(svals), sum(rvals)
        sc, sd = _c_counts(a.code, svals)
        rc, rd = _c_counts(a.code, rvals)
        if stotal > a.count:
            raise ValueError(f"all_to_allv: send_counts add up to {stotal} elements, the array has {a.count}")
        d = _new_out(a, (rtotal,), "all_to_allv") if out is None else _resolve_out(out, a, rtotal, "all_to_allv")
        return self._run("fcclAlltoAllv", (a.ptr, sc, sd, d.ptr, rc, rd, _cc(a.code), self._h, a.stream), d.obj,
                         (a, d, sc, sd, rc, rd), async_op)

    def gather(self, array, root=0, out=None, *, stream=None, async_op=False):
        """Gathers every rank's `array` into the root: shape ``(size,) + array.shape`` on
        the root (or `out`), None elsewhere."""
        root = _rank_arg(root, "root", "fcclGather", self._size)
        a = _resolve(array, "gather", stream)
        if self._rank == root:
            d = _new_out(a, (self._size,) + tuple(a.shape), "gather") if out is None else \
                _resolve_out(out, a, a.count * self._size, "gather")
            dptr, res = d.ptr, d.obj
        else:
            d, dptr, res = None, None, None
        return self._run("fcclGather", (a.ptr, dptr, _cn(a.code, a.count), _cc(a.code), root, self._h, a.stream),
                         res, (a, d), async_op)

    def gather_v(self, array, counts, root=0, out=None, *, stream=None, async_op=False):
        """Rank p sends its `array` (counts[p] elements) to the root, which gets them one
        after another in rank order (a flat array of sum(counts), or `out`); None
        elsewhere. One fcclAlltoAllv with every count but the root's zero."""
        # Never passed to C: a root that is no rank would make every count zero.
        root = _rank_arg(root, "root", "gather_v", self._size, whole_range=True)
        a = _resolve(array, "gather_v", stream)
        n, r = self._size, self._rank
        _, vals = _sizes(counts, n, "gather_v", "counts")
        if vals[r] != a.count:
            raise ValueError(f"gather_v: counts[{r}] is {vals[r]}, this rank's array has {a.count} elements")
        send = [a.count if p == root else 0 for p in range(n)]
        recv = vals if r == root else [0] * n
        if r != root:
            return self._v_call("gather_v", a, send, recv, None, None, async_op)
        total = sum(vals)
        d = _new_out(a, (total,), "gather_v") if out is None else _resolve_out(out, a, total, "gather_v")
        return self._v_call("gather_v", a, send, recv, d, d.obj, async_op)

    def scatter_v(self, array, counts, root=0, out=None, *, stream=None, async_op=False):
        """The root sends counts[p] elements of `array` (blocks one after another) to rank
        p; every rank gets its block (new, or `out`). Off the root `array` is any array
        of the dtype (not read), or None with `out=` receiving the block. One
        fcclAlltoAllv with every count but the root's zero."""
        root = _rank_arg(root, "root", "scatter_v", self._size, whole_range=True)
        n, r = self._size, self._rank
        _, vals = _sizes(counts, n, "scatter_v", "counts")
        if array is None:
            if out is None:
                raise ValueError("scatter_v: off the root pass an array of the dtype (its contents are not read) "
                                 "or out=")
            d = _writable(_resolve(out, "scatter_v out", stream), "scatter_v")
            a = d
        else:
            a = _resolve(array, "scatter_v", stream)
            d = _new_out(a, (vals[r],), "scatter_v") if out is None else _resolve_out(out, a, vals[r], "scatter_v")
        if d.count != vals[r]:
            raise ValueError(f"scatter_v: out has {d.count} elements, counts[{r}] is {vals[r]}")
        send = vals if r == root else [0] * n
        if r == root and sum(vals) > a.count:
            raise ValueError(f"scatter_v: counts add up to {sum(vals)} elements, the array has {a.count}")
        recv = [vals[r] if p == root else 0 for p in range(n)]
        return self._v_call("scatter_v", a if r == root else None, send, recv, d, d.obj, async_op, code=d.code,
                            stream=d.stream)

    def _v_call(self, what, a, send, recv, d, result, async_op, code=None, stream=None):
        code = a.code if code is None else code
        sc, sd = _c_counts(code, send)
        rc, rd = _c_counts(code, recv)
        stream = a.stream if stream is None and a is not None else stream
        return self._run("fcclAlltoAllv", (a.ptr if a else None, sc, sd, d.ptr if d else None, rc, rd, _cc(code),
                                           self._h, stream), result, (a, d, sc, sd, rc, rd), async_op)

    def scatter(self, array, root=0, out=None, *, stream=None, async_op=False):
        """Sends block r of the root's `array` (size equal blocks along axis 0) to rank r.
        Every rank passes an array of the root's shape and dtype (only the root's is
        read), or None with `out` giving the block's size and dtype."""
        root = _rank_arg(root, "root", "fcclScatter", self._size)
        if array is None:
            if out is None:
                raise ValueError("scatter: pass the array (any contents off the root) or out=")
            d = _writable(_resolve(out, "scatter out", stream), "scatter")
            a, aptr, count = None, None, d.count
        else:
            a = _resolve(array, "scatter", stream)
            shape = _blocks(a, self._size, "scatter")
            count = a.count // self._size
            d = _new_out(a, shape, "scatter") if out is None else _resolve_out(out, a, count, "scatter")
            aptr = a.ptr
        return self._run("fcclScatter", (aptr, d.ptr, _cn(d.code, count), _cc(d.code), root, self._h, d.stream),
                         d.obj, (a, d), async_op)

    def send(self, array, peer, *, stream=None, async_op=False):
        """Sends `array` to rank `peer`, which posts a matching recv (same size and dtype).
        Outside a group it returns once the peer has received it."""
        peer = _rank_arg(peer, "peer", "fcclSend", self._size)
        a = _resolve(array, "send", stream)
        return self._run("fcclSend", (a.ptr, _cn(a.code, a.count), _cc(a.code), peer, self._h, a.stream), None, (a,),
                         async_op)

    def recv(self, out, peer, *, stream=None, async_op=False):
        """Receives from rank `peer` into `out` (a C-contiguous writeable array of the
        sent size and dtype) and returns it."""
        peer = _rank_arg(peer, "peer", "fcclRecv", self._size)
        d = _writable(_resolve(out, "recv", stream), "recv")
        return self._run("fcclRecv", (d.ptr, _cn(d.code, d.count), _cc(d.code), peer, self._h, d.stream), d.obj,
                         (d,), async_op)

    def barrier(self, *, stream=None, async_op=False):
        """Returns once every rank has called barrier."""
        return self._run("fcclBarrier", (self._h, _stream_arg(stream)), None, None, async_op)

    def all_reduce_coalesced(self, arrays, op="sum", bucket_bytes=0, *, stream=None, async_op=False):
        """fcclAllReduceCoalesced: all-reduces every array of the list (one dtype) in
        place, packed into buckets of at most `bucket_bytes` (0: 25 MiB). Returns the
        list."""
        infos = [_writable(_resolve(x, "all_reduce_coalesced", stream), "all_reduce_coalesced") for x in arrays]
        code, strm = _one_type(infos, "all_reduce_coalesced")
        ra = _red_args("fcclAllReduceCoalesced", infos[0], op) if infos else (code, _fccl_op(op))
        if ra is None:
            def run():
                wides = [_widen(i, "all_reduce_coalesced") for i in infos]
                self.all_reduce_coalesced(wides, op, bucket_bytes, stream=stream)
                for i, w in zip(infos, wides):
                    _narrow_into(i, w)
                return list(arrays)

            return self._int16("fcclAllReduceCoalesced", async_op, run)
        code, o = ra
        n = len(infos)
        ptrs = (c_void_p * max(n, 1))(*[i.ptr for i in infos])
        counts = (c_size_t * max(n, 1))(*[i.count for i in infos])
        return self._run("fcclAllReduceCoalesced", (ptrs, ptrs, counts, n, code, o, int(bucket_bytes), self._h, strm),
                         list(arrays), (infos, ptrs, counts), async_op)

    def broadcast_coalesced(self, arrays, root=0, bucket_bytes=0, *, stream=None, async_op=False):
        """fcclBroadcastCoalesced: broadcasts every array of the list (one dtype) from
        `root` in place, packed into buckets. Returns the list."""
        root = _rank_arg(root, "root", "fcclBroadcastCoalesced", self._size)
        infos = [_writable(_resolve(x, "broadcast_coalesced", stream), "broadcast_coalesced") for x in arrays]
        code, strm = _one_type(infos, "broadcast_coalesced")
        n = len(infos)
        ptrs = (c_void_p * max(n, 1))(*[i.ptr for i in infos])
        counts = (c_size_t * max(n, 1))(*[_cn(code, i.count) for i in infos])
        return self._run("fcclBroadcastCoalesced", (ptrs, counts, n, _cc(code), root, int(bucket_bytes), self._h,
                                                    strm), list(arrays), (infos, ptrs, counts), async_op)

    def all_reduce_wire(self, array, wire_dtype, op="sum", out=None, *, stream=None, async_op=False):
        """fcclAllReduceWire: all_reduce whose partial results travel in `wire_dtype`
        (e.g. float32 data over a "bfloat16" wire); in place unless `out`."""
        a = _resolve(array, "all_reduce_wire", stream)
        o, w = _fccl_op(op), _wire_code(wire_dtype)
        for c in (a.code, w):
            if c in _C_TYPE:
                raise FcclError("fcclAllReduceWire", 4, f"fcclAllReduceWire: {_buf.TYPE_NAMES[c]} has no "
                                                        "library type; the wire all_reduce takes float32 or "
                                                        "float64 data over a float wire type")
        d = _writable(a, "all_reduce_wire") if out is None else _resolve_out(out, a, a.count, "all_reduce_wire")
        return self._run("fcclAllReduceWire", (a.ptr, d.ptr, a.count, a.code, o, w, self._h, a.stream), d.obj,
                         (a, d), async_op)


def _axis(axis, ndim, what):
    ax = int(axis)
    if ax < 0:
        ax += ndim
    if not 0 <= ax < max(ndim, 1):
        raise ValueError(f"{what}: axis {axis} is out of range for {ndim} dimensions")
    return ax


def _one_type(infos, what):
    if not infos:
        return 0, None
    codes = {i.code for i in infos}
    if len(codes) > 1:
        raise TypeError(f"{what}: the arrays have dtypes {sorted(_buf.TYPE_NAMES[c] for c in codes)}; "
                        "one call takes one dtype")
    return infos[0].code, infos[0].stream
