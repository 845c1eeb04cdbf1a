"""Arrays of every kind a Python user has (numpy, buffer protocol, __array_interface__,
DLPack producers, torch CPU tensors of every dtype), in place and out=; the rest of the
C API (V, axis, coalesced, wire, empty); async Work. Ranks are threads
(Comm.init_all), each rank checks its own results."""

import array

import numpy as np
import pytest

import ferroccl
from checks import run_threads

N = 2


def ranks(fn, n=N):
    """Runs fn(comm) on n thread ranks; returns their results, raises the first error."""
    comms = ferroccl.Comm.init_all(n)

    def body(r):
        try:
            return fn(comms[r])
        except BaseException:
            comms[r].abort()  # the others' calls with this rank return
            raise

    try:
        return run_threads(body, n)
    finally:
        for c in comms:
            c.close()


class ArrayInterfaceOnly:
    """Exposes nothing but __array_interface__ (as many older libraries do)."""

    def __init__(self, a):
        self._a = a
        self.__array_interface__ = a.__array_interface__


class DLPackOnly:
    """A DLPack producer and nothing else."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_numpy_in_place_and_returned():
    def rank(c):
        x = np.full(6, c.rank + 1, np.float32)
        got = c.all_reduce(x)
        assert got is x
        np.testing.assert_array_equal(x, np.full(6, 3, np.float32))
        y = np.full((2, 3), c.rank, np.int64)
        out = np.empty((2, 3), np.int64)
        assert c.all_reduce(y, op="max", out=out) is out
        np.testing.assert_array_equal(out, np.ones((2, 3)))
        np.testing.assert_array_equal(y, np.full((2, 3), c.rank))  # untouched with out=

    ranks(rank)


@pytest.mark.parametrize("kind", ["array.array", "bytearray", "memoryview", "array_interface", "dlpack"])
def test_other_host_arrays_in_place(kind):
    def make(r):
        base = np.arange(5, dtype=np.float64) + 10 * r
        if kind == "array.array":
            return array.array("d", base), lambda o: np.asarray(o)
        if kind == "bytearray":
            return bytearray(bytes([r + 1] * 5)), lambda o: np.frombuffer(o, np.uint8)
        if kind == "memoryview":
            b = bytearray(base.tobytes())
            return memoryview(b).cast("d"), lambda o: np.asarray(o)
        if kind == "array_interface":
            return ArrayInterfaceOnly(base), lambda o: o._a
        return DLPackOnly(base), lambda o: o._a

    def rank(c):
        x, view = make(c.rank)
        assert c.all_reduce(x) is x
        return view(x).copy()

    results = ranks(rank)
    want = np.frombuffer(bytes([3] * 5), np.uint8) if kind == "bytearray" else np.arange(5) * 2.0 + 10
    for got in results:
        np.testing.assert_array_equal(got, want)


def test_out_of_another_kind_and_new_results_of_the_inputs_kind():
    def rank(c):
        x = array.array("i", [c.rank] * 4)
        out = np.empty(4, np.int32)
        c.all_reduce(x, out=out)
        np.testing.assert_array_equal(out, [1] * 4)
        g = c.all_gather(ArrayInterfaceOnly(np.full(3, c.rank, np.int32)))
        assert isinstance(g, np.ndarray) and g.shape == (2, 3)
        np.testing.assert_array_equal(g, [[0] * 3, [1] * 3])

    ranks(rank)


def test_refusals_name_the_fix():
    (c,) = ferroccl.Comm.init_all(1)
    try:
        with pytest.raises(ValueError, match="C-contiguous.*ascontiguousarray"):
            c.all_reduce(np.ones((4, 4), np.float32).T)
        with pytest.raises(TypeError, match="not an array"):
            c.all_reduce(object())
        with pytest.raises(TypeError, match="does not support dtype"):
            c.all_reduce(memoryview(np.ones(2, np.complex64)))
        h = array.array("h", [-2, 30000])  # int16 through the buffer protocol: widened, narrowed back
        assert c.all_reduce(h, op="max") is h and list(h) == [-2, 30000]
        with pytest.raises(ValueError, match="read-only.*out="):
            c.all_reduce(b"abcd")
        out = np.empty(4, np.uint8)
        assert c.all_reduce(b"abcd", out=out) is out  # a read-only input is fine with out=
        assert bytes(out) == b"abcd"
    finally:
        c.close()


def test_v_axis_coalesced_wire_forms():
    def rank(c):
        r, n = c.rank, c.size
        counts = [2, 3]
        # all_gather_v: rank p contributes counts[p] elements
        got = c.all_gather_v(np.full(counts[r], r + 1, np.int32), counts)
        np.testing.assert_array_equal(got, [1, 1, 2, 2, 2])
        # reduce_scatter_v: rank r gets counts[r] reduced elements
        got = c.reduce_scatter_v(np.arange(5, dtype=np.float32), counts)
        np.testing.assert_array_equal(got, (np.arange(5, dtype=np.float32) * n)[sum(counts[:r]):sum(counts[:r + 1])])
        # all_to_allv: rank r sends r+1 elements to each peer
        send = np.concatenate([np.full(r + 1, 10 * r + p, np.int64) for p in range(n)])
        got = c.all_to_allv(send, [r + 1] * n, [p + 1 for p in range(n)])
        np.testing.assert_array_equal(got, np.concatenate([np.full(p + 1, 10 * p + r) for p in range(n)]))
        # gather_v / scatter_v
        got = c.gather_v(np.full(counts[r], r, np.float64), counts, root=1)
        if r == 1:
            np.testing.assert_array_equal(got, [0, 0, 1, 1, 1])
        else:
            assert got is None
        src = np.arange(5, dtype=np.float64) if r == 0 else np.empty(5, np.float64)
        got = c.scatter_v(src, counts, root=0)
        np.testing.assert_array_equal(got, np.arange(5)[sum(counts[:r]):sum(counts[:r + 1])])
        # axis forms
        x = np.full((2, 3), r, np.float32)
        got = c.all_gather_axis(x, axis=1)
        np.testing.assert_array_equal(got, np.concatenate([np.full((2, 3), p) for p in range(n)], axis=1))
        got = c.reduce_scatter_axis(np.arange(8, dtype=np.float32).reshape(2, 4), axis=1)
        np.testing.assert_array_equal(got, (np.arange(8).reshape(2, 4) * n)[:, 2 * r:2 * r + 2])
        # coalesced: in place, several arrays
        xs = [np.full(k + 1, r + 1, np.float32) for k in range(3)]
        assert c.all_reduce_coalesced(xs, bucket_bytes=8) == xs
        for x in xs:
            np.testing.assert_array_equal(x, 3)
        bs = [np.full(4, r, np.int32), np.full(2, r + 5, np.int32)]
        c.broadcast_coalesced(bs, root=1)
        np.testing.assert_array_equal(bs[0], 1)
        np.testing.assert_array_equal(bs[1], 6)
        # wire: float32 data over a bfloat16 wire (small integers are exact there)
        w = np.arange(6, dtype=np.float32) + r
        c.all_reduce_wire(w, "bfloat16")
        np.testing.assert_array_equal(w, np.arange(6) * 2 + 1)

    ranks(rank)


def test_empty_uses_the_librarys_host_memory():
    x = ferroccl.empty((64, 1024), np.float32)  # 256 KiB: shared memory
    assert x.shape == (64, 1024) and x.dtype == np.float32
    assert x.ctypes.data % 4096 == 0
    x[:] = 1

    def rank(c):
        y = ferroccl.empty(1 << 15, np.float64)
        y[:] = c.rank + 1
        c.all_reduce(y)
        return float(y[0]), float(y[-1])

    assert ranks(rank) == [(3.0, 3.0)] * 2
    del x  # freed through fcclMemFree by its owner


def test_async_work_in_order_and_errors():
    def rank(c):
        xs = [np.full(1000, c.rank + k, np.float64) for k in range(5)]
        works = [c.all_reduce(x, async_op=True) for x in xs]
        assert all(isinstance(w, ferroccl.Work) for w in works)
        for k, (w, x) in enumerate(zip(works, xs)):
            assert w.wait(30) is x
            assert w.is_completed() and w.is_success()
            np.testing.assert_array_equal(x, 1 + 2 * k)
        # a blocking call after async ones runs after them
        y = np.full(3, 1.0)
        c.all_reduce(y, async_op=True)
        c.all_reduce(y)
        np.testing.assert_array_equal(y, 4.0)
        # the library's error comes out of wait()
        bad = c.broadcast(np.zeros(2, np.float32), root=7, async_op=True)
        with pytest.raises(ferroccl.FcclError) as ei:
            bad.wait(30)
        assert ei.value.call == "fcclBroadcast" and "root" in ei.value.message
        assert bad.is_completed() and not bad.is_success() and bad.exception() is ei.value
        c.synchronize()

    ranks(rank)


def test_async_inside_a_group_is_refused():
    (c,) = ferroccl.Comm.init_all(1)
    try:
        with pytest.raises(ValueError, match="inside ferroccl.group"):
            with ferroccl.group():
                c.all_reduce(np.ones(2), async_op=True)
    finally:
        c.close()


# ---------------------------------------------------------------- torch CPU tensors

TORCH_DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16",
                "float8_e4m3fn", "float8_e5m2", "int16"]


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_every_dtype_in_place(name):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, name, None)
    if dtype is None:
        pytest.skip(f"this torch has no {name}")

    def make(r):
        return torch.tensor([r + 1, 2, 3, 1], dtype=torch.float32).to(dtype)

    def rank(c):
        t = make(c.rank)
        assert c.all_reduce(t) is t  # in place, as torch.distributed and mpi4py do
        return t.to(torch.float64)

    want = (make(0).to(torch.float32) + make(1).to(torch.float32)).to(torch.float64)
    for got in ranks(rank):
        assert torch.equal(got, want), (name, got, want)


def test_torch_out_shapes_and_refusals():
    torch = pytest.importorskip("torch")

    def rank(c):
        t = torch.full((2, 3), float(c.rank), dtype=torch.bfloat16)
        g = c.all_gather(t)
        assert isinstance(g, torch.Tensor) and g.dtype == torch.bfloat16 and g.shape == (2, 2, 3)
        assert torch.equal(g[1], torch.ones(2, 3, dtype=torch.bfloat16))
        out = np.empty(4, np.float32)  # out= of another kind
        c.all_reduce(torch.ones(4), out=out)
        np.testing.assert_array_equal(out, 2)
        with pytest.raises(ValueError, match=r"not C-contiguous.*\.contiguous\(\)"):
            c.all_reduce(torch.ones(4, 4).t())
        with pytest.raises(TypeError, match="complex64"):
            c.all_reduce(torch.ones(2, dtype=torch.complex64))
        # bool: sum is logical or, stored as a bool (as torch's own backends give it)
        b = torch.tensor([c.rank == 0, False])
        assert c.all_reduce(b) is b and b.view(torch.uint8).tolist() == [1, 0]
        with pytest.raises(ferroccl.FcclError, match="avg of bool"):
            c.all_reduce(b, op="avg")
        # a torch tensor through DLPack alone (bfloat16: a DLPack kDLBfloat)
        d = DLPackOnly(torch.full((3,), float(c.rank + 1), dtype=torch.bfloat16))
        c.all_reduce(d)
        assert torch.equal(d._a, torch.full((3,), 3.0, dtype=torch.bfloat16))

    ranks(rank)


def test_array_interface_with_a_buffer_as_data():
    class BufferData:
        def __init__(self):
            self.buf = bytearray(np.arange(4, dtype=np.int32).tobytes())
            self.__array_interface__ = {"shape": (4,), "typestr": "<i4", "data": self.buf, "version": 3}

    def rank(c):
        x = BufferData()
        assert c.all_reduce(x) is x
        return np.frombuffer(x.buf, np.int32).copy()

    for got in ranks(rank):
        np.testing.assert_array_equal(got, np.arange(4) * 2)
