"""Arrays a Python user has, as (pointer, count, fcclDataType_t, device, stream).

Accepted, tried in this order (the first two are the fast paths):

* numpy arrays (bfloat16 / fp8 through ml_dtypes);
* torch tensors, CPU or CUDA (every dtype ferroccl has: bfloat16, float8_e4m3fn,
  float8_e5m2 included); a CUDA tensor runs on torch's current stream;
* objects with ``__cuda_array_interface__`` (device memory; its ``stream`` field);
* objects with ``__dlpack__`` / ``__dlpack_device__`` (CPU, CUDA, CUDA host memory);
* objects with ``__array_interface__``;
* anything with the buffer protocol (``array.array``, ``bytearray``, ``memoryview``).

Nothing is ever copied: a collective reads and writes the caller's memory, so an input
that is not C-contiguous raises ValueError (with the fix: ``.contiguous()`` /
``np.ascontiguousarray``).
"""

import ctypes
import sys

import numpy as np

# fcclDataType_t values (include/ferroccl.h) and their names; then bool and int16, which
# the library has no type for: codes of this package only, carried as other types
# (C_TYPE) and never passed to the library as themselves.
TYPE_NAMES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
              "bfloat16", "float8_e4m3fn", "float8_e5m2", "bool", "int16"]
ITEMSIZE = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1, 1, 2]
BOOL, INT16 = 12, 13
# A carried code -> (the fcclDataType_t its bytes move as, library elements per element).
C_TYPE = {BOOL: (1, 1), INT16: (1, 2)}

NP_CODES = {np.dtype(n): i for i, n in enumerate(TYPE_NAMES[:9])}
NP_CODES[np.dtype(np.bool_)] = BOOL
NP_CODES[np.dtype(np.int16)] = INT16
try:  # bfloat16 and fp8 come from ml_dtypes (as in JAX); offered only when it is there
    import ml_dtypes as _ml

    NP_CODES[np.dtype(_ml.bfloat16)] = 9
    NP_CODES[np.dtype(_ml.float8_e4m3fn)] = 10
    NP_CODES[np.dtype(_ml.float8_e5m2)] = 11
except ImportError:  # pragma: no cover - depends on the environment
    _ml = None
NP_BY_CODE = {c: d for d, c in NP_CODES.items()}

# Array-interface type strings (little-endian machines; '|' for one byte).
_TYPESTR = {"|i1": 0, "<i1": 0, "|u1": 1, "<u1": 1, "<i4": 2, "<u4": 3, "<i8": 4, "<u8": 5, "<f2": 6,
            "<f4": 7, "<f8": 8, "|b1": BOOL, "<b1": BOOL, "<i2": INT16}
# DLPack (code, bits) -> fcclDataType_t (dlpack.h: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4,
# kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12, kDLBool 6).
_DLPACK = {(0, 8): 0, (1, 8): 1, (0, 32): 2, (1, 32): 3, (0, 64): 4, (1, 64): 5, (2, 16): 6, (2, 32): 7,
           (2, 64): 8, (4, 16): 9, (10, 8): 10, (12, 8): 11, (6, 8): BOOL, (0, 16): INT16}
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST = 1, 2, 3

_TORCH_CODES = None


def torch_codes():
    """torch dtype -> fcclDataType_t (torch imported only when the caller already has it)."""
    global _TORCH_CODES
    if _TORCH_CODES is None:
        import torch

        names = {n: i for i, n in enumerate(TYPE_NAMES)}
        _TORCH_CODES = {getattr(torch, n): c for n, c in names.items() if hasattr(torch, n)}
    return _TORCH_CODES


def torch_tensor_type():
    t = sys.modules.get("torch")
    return t.Tensor if t is not None else None


class BufferInfo:
    """One resolved buffer. `obj` is what the caller passed; `keep` holds whatever must
    stay alive while the library uses the memory (a DLPack capsule, a numpy view)."""

    __slots__ = ("ptr", "count", "code", "device", "stream", "obj", "shape", "kind", "keep", "readonly")

    def __init__(self, ptr, count, code, device, stream, obj, shape, kind, keep=None, readonly=False):
        self.ptr, self.count, self.code, self.device, self.stream = ptr, count, code, device, stream
        self.obj, self.shape, self.kind, self.keep, self.readonly = obj, shape, kind, keep, readonly

    @property
    def nbytes(self):
        return self.count * ITEMSIZE[self.code]


def _contig_error(what, obj, fix):
    return ValueError(f"{what}: the {type(obj).__name__} is not C-contiguous; collectives work in place on "
                      f"the caller's memory and never copy it: pass {fix}")


def _unsupported(what, obj, dtype):
    names = ", ".join(TYPE_NAMES)
    hint = "" if _ml is not None or not str(dtype).startswith(("bfloat16", "float8", "V")) else \
        " (numpy bfloat16/fp8 need the ml_dtypes package)"
    return TypeError(f"{what}: ferroccl does not support dtype {dtype} of the {type(obj).__name__}; "
                     f"supported: {names}{hint}")


_c_char_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


def _numpy(a, what):
    code = NP_CODES.get(a.dtype)
    if code is None:
        if not a.dtype.isnative:
            raise TypeError(f"{what}: dtype {a.dtype} is not in this machine's byte order; convert with "
                            f"a.astype(a.dtype.newbyteorder('='))")
        raise _unsupported(what, a, a.dtype)
    if not a.flags.c_contiguous:
        raise _contig_error(what, a, "np.ascontiguousarray(a) (and copy the result back)")
    try:  # 0.3 us, where a.ctypes.data costs 2 us; needs a writeable, non-empty array
        ptr = _addressof(_c_char_from_buffer(a))
    except (TypeError, ValueError):
        ptr = a.ctypes.data
        return BufferInfo(ptr, a.size, code, False, None, a, a.shape, "numpy", None, not a.flags.writeable)
    return BufferInfo(ptr, a.size, code, False, None, a, a.shape, "numpy")


def _torch(t, what, stream):
    code = torch_codes().get(t.dtype)
    if code is None:
        raise _unsupported(what, t, t.dtype)
    if not t.is_contiguous():
        raise _contig_error(what, t, "t.contiguous() (and copy the result back)")
    if t.is_cuda:
        if stream is None:
            import torch

            stream = torch.cuda.current_stream(t.device).cuda_stream
        return BufferInfo(t.data_ptr(), t.numel(), code, True, stream, t, tuple(t.shape), "torch")
    if t.device.type != "cpu":
        raise TypeError(f"{what}: torch tensors on {t.device} are not supported (CPU and CUDA are)")
    return BufferInfo(t.data_ptr(), t.numel(), code, False, None, t, tuple(t.shape), "torch")


def _c_contiguous(shape, strides, itemsize):
    if strides is None:
        return True
    want = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != want:
            return False
        want *= n
    return True


def _interface(obj, iface, what, device, stream):
    shape = tuple(iface["shape"])
    typestr = iface["typestr"]
    code = _TYPESTR.get(typestr)
    if code is None:
        raise _unsupported(what, obj, typestr)
    if not _c_contiguous(shape, iface.get("strides"), ITEMSIZE[code]):
        raise _contig_error(what, obj, "a C-contiguous array")
    data = iface.get("data")
    if not isinstance(data, tuple):  # the interface's other form: a buffer object (or None: strides into it)
        if device:
            raise TypeError(f"{what}: __cuda_array_interface__ 'data' must be (pointer, read_only), got {data!r}")
        info = _numpy(np.asarray(obj), what)  # a view of the same memory
        info.obj, info.kind = obj, "array_interface"
        return info
    ptr, readonly = data
    count = 1
    for n in shape:
        count *= n
    if device and stream is None:
        stream = iface.get("stream")  # CUDA array interface v3: 1 legacy default, 2 per-thread
        if stream == 1:
            stream = None  # the legacy default stream is NULL to the driver
    return BufferInfo(ptr or 0, count, code, device, stream, obj, shape,
                      "cuda_array_interface" if device else "array_interface", None, bool(readonly))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack(obj, what, stream):
    dev_type, _dev_id = obj.__dlpack_device__()
    device = dev_type == _DL_CUDA
    if dev_type not in (_DL_CPU, _DL_CUDA, _DL_CUDA_HOST):
        raise TypeError(f"{what}: DLPack device type {dev_type} of the {type(obj).__name__} is not supported "
                        "(CPU 1, CUDA 2, CUDA host 3 are)")
    if device:
        # The producer orders its work before `stream` (1: the legacy default stream).
        capsule = obj.__dlpack__(stream=1 if stream is None else int(stream))
    else:
        capsule = obj.__dlpack__()
    # The capsule stays unconsumed: its destructor calls the producer's deleter once we drop it.
    t = _DLTensor.from_address(_capsule_get(capsule, b"dltensor"))
    code = _DLPACK.get((t.dtype.code, t.dtype.bits))
    if code is None or t.dtype.lanes != 1:
        raise _unsupported(what, obj, f"DLPack (code {t.dtype.code}, bits {t.dtype.bits}, "
                                      f"lanes {t.dtype.lanes})")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] * ITEMSIZE[code] for i in range(t.ndim)) if t.strides else None
    if not _c_contiguous(shape, strides, ITEMSIZE[code]):
        raise _contig_error(what, obj, "a C-contiguous array")
    count = 1
    for n in shape:
        count *= n
    return BufferInfo((t.data or 0) + t.byte_offset, count, code, device, stream, obj, shape, "dlpack", capsule)


def resolve(obj, what, stream=None):
    """The BufferInfo of `obj`, or TypeError / ValueError naming `what` and the fix."""
    if type(obj) is np.ndarray:
        return _numpy(obj, what)
    tt = torch_tensor_type()
    if tt is not None and isinstance(obj, tt):
        return _torch(obj, what, stream)
    if isinstance(obj, np.ndarray):
        return _numpy(obj, what)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _interface(obj, cai, what, True, stream)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _dlpack(obj, what, stream)
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        return _interface(obj, ai, what, False, None)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(f"{what}: a {type(obj).__name__} is not an array; pass a numpy array, a torch tensor, "
                        "or an object with __array_interface__, __cuda_array_interface__, __dlpack__ or the "
                        "buffer protocol (array.array, bytearray)") from None
    if not mv.c_contiguous:
        raise _contig_error(what, obj, "a C-contiguous buffer")
    a = np.asarray(mv)  # a view: same memory, numpy's reading of the buffer's format
    info = _numpy(a, what)
    info.obj, info.kind, info.keep, info.readonly = obj, "buffer", a, mv.readonly
    return info


def new_like(info, shape, what):
    """A new array of `info`'s kind (torch for torch, numpy for host memory, a
    ferroccl.DeviceArray for other device memory) with `shape` and its dtype."""
    if info.kind == "torch":
        import torch

        return torch.empty(shape, dtype=info.obj.dtype, device=info.obj.device)
    if info.device:
        from . import _mem

        return _mem.DeviceArray(shape, info.code)
    dtype = NP_BY_CODE.get(info.code)
    if dtype is None:
        raise TypeError(f"{what}: the result would be {TYPE_NAMES[info.code]}, which numpy has only with the "
                        "ml_dtypes package: install it or pass out=")
    return np.empty(shape, dtype=dtype)
