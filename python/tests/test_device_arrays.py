"""Device arrays through the package: objects with only __cuda_array_interface__ over
device memory (fcclMemAlloc) take the device path on the stream the interface names,
in place. Runs where a CUDA driver loads: a GPU host, or CI under the simulated GPU
(scripts/sim-gpu.sh); skips elsewhere."""

import ctypes
import threading
from ctypes import byref, c_int, c_size_t, c_uint, c_void_p

import numpy as np
import pytest

import ferroccl
from ferroccl import _buf


def _driver():
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    cu.cuInit.argtypes = [c_uint]
    cu.cuDeviceGet.argtypes = [ctypes.POINTER(c_int), c_int]
    cu.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(c_void_p), c_int]
    cu.cuCtxSetCurrent.argtypes = [c_void_p]
    cu.cuStreamCreate.argtypes = [ctypes.POINTER(c_void_p), c_uint]
    cu.cuStreamSynchronize.argtypes = [c_void_p]
    cu.cuStreamDestroy_v2.argtypes = [c_void_p]
    cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, c_void_p, c_size_t]
    cu.cuMemcpyDtoH_v2.argtypes = [c_void_p, ctypes.c_uint64, c_size_t]
    return cu


CU = _driver()
pytestmark = pytest.mark.skipif(CU is None, reason="no CUDA driver (libcuda.so.1): run under scripts/sim-gpu.sh "
                                                    "or on a GPU host")


def ok(rc, what):
    assert rc == 0, f"{what} returned CUresult {rc}"


def make_current(dev=0):
    ok(CU.cuInit(0), "cuInit")
    d, ctx = c_int(), c_void_p()
    ok(CU.cuDeviceGet(byref(d), dev), "cuDeviceGet")
    ok(CU.cuDevicePrimaryCtxRetain(byref(ctx), d), "cuDevicePrimaryCtxRetain")
    ok(CU.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


class CudaArray:
    """What CuPy or Numba hand over: only __cuda_array_interface__ (v3, with a stream)."""

    def __init__(self, mem, stream):
        self.mem, self.stream = mem, stream

    @property
    def __cuda_array_interface__(self):
        i = dict(self.mem.__cuda_array_interface__)
        i["stream"] = self.stream
        return i


def to_device(host, stream):
    mem = ferroccl.DeviceArray(host.shape, host.dtype)
    ok(CU.cuMemcpyHtoD_v2(mem.ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
    return CudaArray(mem, stream)


def to_host(arr, dtype):
    out = np.empty(arr.mem.shape, dtype)
    ok(CU.cuMemcpyDtoH_v2(out.ctypes.data, arr.mem.ptr, out.nbytes), "cuMemcpyDtoH")
    return out


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "non-blocking"])
def test_cuda_array_interface_takes_the_device_path_on_its_stream(blocking):
    n = 2
    comms = ferroccl.Comm.init_all(n, devices=[0] * n)
    results, errors = [None] * n, []

    def rank(r):
        try:
            make_current(0)
            # Non-blocking: a split with blocking=False; its Works finish once the
            # library has enqueued the work on x's stream (then the stream is synced).
            c = comms[r] if blocking else comms[r].split(0, blocking=False)
            s = c_void_p()
            ok(CU.cuStreamCreate(byref(s), 0), "cuStreamCreate")
            x = to_device(np.arange(6, dtype=np.float32) + 10 * r, s.value)
            info = _buf.resolve(x, "test")
            assert info.device and info.stream == s.value
            if blocking:
                assert c.all_reduce(x) is x  # in place, queued on x's stream
                g = c.all_gather(x)          # a new DeviceArray
            else:
                w1, w2 = c.all_reduce(x, async_op=True), c.all_gather(x, async_op=True)
                assert w1.wait(60) is x
                g = w2.wait(60)
            assert isinstance(g, ferroccl.DeviceArray) and g.shape == (n, 6)
            ok(CU.cuStreamSynchronize(s), "cuStreamSynchronize")
            results[r] = (to_host(x, np.float32), to_host(CudaArray(g, None), np.float32))
            ok(CU.cuStreamDestroy_v2(s), "cuStreamDestroy")
            if not blocking:
                c.close()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            comms[r].abort()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    for c in comms:
        c.close()
    if errors:
        raise errors[0]
    want = sum(np.arange(6, dtype=np.float32) + 10 * r for r in range(n))
    for x, g in results:
        np.testing.assert_array_equal(x, want)
        np.testing.assert_array_equal(g, np.stack([want] * n))
