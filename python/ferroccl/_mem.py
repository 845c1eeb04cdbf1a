"""Memory from the library: ferroccl.empty (fcclMemAllocHost, or fcclMemAlloc for the
device) and DeviceArray, a minimal owner of device memory with __cuda_array_interface__."""

import ctypes
from ctypes import byref, c_void_p

import numpy as np

from . import _buf, _lib

_TYPESTR = ["|i1", "|u1", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8", "<V2", "|V1", "|V1", "|b1", "<i2"]


def _alloc(kind, nbytes):
    p = c_void_p()
    fn = "fcclMemAlloc" if kind == "device" else "fcclMemAllocHost"
    _lib.check(fn, getattr(_lib.lib(), fn)(byref(p), max(int(nbytes), 1)))
    return p.value


def _code_of(dtype):
    if isinstance(dtype, int):
        return dtype
    name = getattr(dtype, "name", None) or str(dtype).replace("torch.", "")
    if name in _buf.TYPE_NAMES:
        return _buf.TYPE_NAMES.index(name)
    d = np.dtype(dtype)
    if d in _buf.NP_CODES:
        return _buf.NP_CODES[d]
    raise TypeError(f"ferroccl has no dtype {dtype}; it has {', '.join(_buf.TYPE_NAMES)}")


class _HostOwner:
    """Frees a fcclMemAllocHost block when the last array over it goes."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __del__(self):
        ptr, self.ptr = self.ptr, None
        if ptr:
            _lib.lib().fcclMemFree(c_void_p(ptr))


class DeviceArray:
    """Device memory from fcclMemAlloc (freed when this object goes), with
    ``__cuda_array_interface__`` (version 3, NULL stream) so any collective and any
    CUDA-array consumer (CuPy, Numba, torch.as_tensor) accepts it."""

    def __init__(self, shape, dtype):
        self.shape = (shape,) if isinstance(shape, int) else tuple(int(n) for n in shape)
        self.code = _code_of(dtype)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * _buf.ITEMSIZE[self.code]
        self.ptr = _alloc("device", self.nbytes)

    @property
    def dtype(self):
        return _buf.TYPE_NAMES[self.code]

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": _TYPESTR[self.code], "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": None}

    def __del__(self):
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            _lib.lib().fcclMemFree(c_void_p(ptr))

    def __repr__(self):
        return f"<ferroccl.DeviceArray {self.dtype}{list(self.shape)} at {self.ptr:#x}>"


def empty(shape, dtype=np.float32, device=False):
    """An uninitialised array from the library's allocator: host memory from
    fcclMemAllocHost as a numpy array (page-aligned; shared memory from 32 KiB, so large
    sends from it are copied once), or with device=True CUDA memory from fcclMemAlloc as
    a :class:`DeviceArray`. Freed when the array is no longer referenced."""
    if device:
        return DeviceArray(shape, dtype)
    code = _code_of(dtype)
    npd = _buf.NP_BY_CODE.get(code)
    if npd is None:
        raise TypeError(f"empty: numpy has no {_buf.TYPE_NAMES[code]} without the ml_dtypes package")
    shape = (shape,) if isinstance(shape, int) else tuple(int(n) for n in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * npd.itemsize
    ptr = _alloc("host", nbytes)
    raw = (ctypes.c_char * max(nbytes, 1)).from_address(ptr)
    raw._owner = _HostOwner(ptr)  # the arrays over `raw` keep it, and so the block, alive
    return np.frombuffer(raw, dtype=np.uint8, count=nbytes).view(npd).reshape(shape)
