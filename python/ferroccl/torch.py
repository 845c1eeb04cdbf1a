"""A torch.distributed backend named "ferroccl" (CPU and CUDA tensors).

    import torch.distributed as dist
    import ferroccl.torch  # registers the backend

    dist.init_process_group("ferroccl")        # under torchrun, or with rank=, world_size=, store=

The communicator's unique id travels through torch's store (rank 0 makes it with
fcclGetUniqueId and sets it, the others read it), so torchrun's TCPStore on
MASTER_PORT is the only listener there. Every call runs on the process group's
ferroccl worker thread, in order, and returns a torch Work whose future completes when
the call has; errors surface from ``wait()`` as ferroccl.FcclError with the library's
message.

Point-to-point: ``send``/``recv`` of one rank run in the order posted and a send
returns when the peer has received (NCCL's semantics outside a group), so two ranks
that both send first (or both receive first) deadlock where gloo would not: order
them (even ranks send first, odd ranks receive first); ``dist.batch_isend_irecv``
never deadlocks (one fcclGroupStart/End).

What serves the calls: a native c10d backend (csrc/ProcessGroupFerroccl.cpp, a
``c10d::Backend`` calling libferroccl's C functions), built with
torch.utils.cpp_extension at the first process group (cached in torch's extension
directory; needs a C++ compiler where torch is). It runs each call on the calling
thread and returns a completed Work (CUDA tensors: queued on the current stream), so
``async_op=True`` on CPU tensors returns after the call is done. Where it cannot be
built, the Python backend below serves instead, with a warning naming why.
``FERROCCL_TORCH_BACKEND=python`` forces the Python one, ``=native`` makes a failed
build an error. ``served_by()`` says which one a group has.
"""

import os
import shutil
import sys
import threading
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from . import Comm, UniqueId, _lib, get_unique_id


__all__ = ["ProcessGroupFerroccl", "BACKEND", "served_by", "native_module"]

BACKEND = "ferroccl"

_OPS = [(dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.PRODUCT, "prod"), (dist.ReduceOp.MAX, "max"),
        (dist.ReduceOp.MIN, "min"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.BAND, "band"),
        (dist.ReduceOp.BOR, "bor"), (dist.ReduceOp.BXOR, "bxor")]


class _Work(dist._Work):
    """torch's Work over a ferroccl.Work: wait() raises the call's FcclError (with the
    library's message); get_future() completes when the call has (DDP's comm hooks)."""

    def __init__(self, work, fut):
        super().__init__()
        self._work, self._fut = work, fut

    def wait(self, timeout=None):
        secs = timeout.total_seconds() if hasattr(timeout, "total_seconds") and timeout.total_seconds() > 0 else None
        self._work.wait(secs)
        return True

    def is_completed(self):
        return self._work.is_completed()

    def is_success(self):
        return self._work.is_success()

    def exception(self):
        return self._work.exception()

    def get_future(self):
        return self._fut


def _op(reduce_op):
    for t, name in _OPS:
        if reduce_op == t:
            return name
    raise ValueError(f"ferroccl backend: reduce op {reduce_op} is not supported "
                     "(SUM, PRODUCT, MAX, MIN, AVG, BAND, BOR, BXOR are)")


def _timeout_ms(timeout):
    if not isinstance(timeout, timedelta):
        return None
    # ferroccl's bound is a C int of ms: a longer timeout (over 24.8 days) is as good as
    # none, and must not wrap around into a short or negative one.
    return min(int(timeout.total_seconds() * 1000), 2**31 - 1)


def _unique_id(store, rank):
    # torch's store is already prefixed per process group: one key per group.
    if rank == 0:
        uid = get_unique_id()
        store.set("ferroccl/unique_id", bytes(uid))
        return uid
    return UniqueId(store.get("ferroccl/unique_id"))


def _split_counts(splits, total_rows, n, row, what):
    if not splits:
        if total_rows % n:
            raise ValueError(f"{what}: {total_rows} rows do not split into {n} equal parts; pass split sizes")
        return [total_rows // n * row] * n
    if len(splits) != n:
        raise ValueError(f"{what}: {len(splits)} split sizes for {n} ranks")
    return [int(s) * row for s in splits]


class ProcessGroupFerroccl(dist.ProcessGroup):
    """torch.distributed.ProcessGroup over a ferroccl communicator."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        ms = _timeout_ms(timeout)
        self._comm = Comm.init_rank(size, _unique_id(store, rank), rank, timeout_ms=ms, name=f"torch-pg-r{rank}")

    # ---------------------------------------------------------------- plumbing

    def getBackendName(self):
        return BACKEND

    @property
    def comm(self):
        """The ferroccl.Comm under this process group."""
        return self._comm

    def _submit(self, what, fn, result):
        fut = torch.futures.Future()

        def job():
            try:
                fn()
            except BaseException as e:
                fut.set_exception(e)
                raise
            fut.set_result(result)

        return _Work(self._comm._ensure_worker().submit(job, what), fut)

    # ---------------------------------------------------------------- collectives

    def allreduce(self, tensors, opts=None):
        op = _op(opts.reduceOp) if opts is not None else "sum"
        c = self._comm
        return self._submit("allreduce", lambda: [c.all_reduce(t, op=op) for t in tensors], tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op = _op(opts.reduceOp) if opts is not None else "sum"
        c = self._comm
        return self._submit("allreduce_coalesced", lambda: c.all_reduce_coalesced(tensors, op=op), tensors)

    def broadcast(self, tensors, opts):
        root = opts.rootRank
        c = self._comm
        return self._submit("broadcast", lambda: [c.broadcast(t, root=root) for t in tensors], tensors)

    def reduce(self, tensors, opts):
        op, root = _op(opts.reduceOp), opts.rootRank
        c = self._comm
        return self._submit("reduce", lambda: [c.reduce(t, op=op, root=root) for t in tensors], tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        c = self._comm

        def run():
            for outs, inp in zip(output_tensors, input_tensors):
                tmp = inp.new_empty((c.size,) + tuple(inp.shape))
                c.all_gather(inp.contiguous(), out=tmp)
                for o, t in zip(outs, tmp):
                    o.copy_(t)

        return self._submit("allgather", run, output_tensors)

    def all_gather_single(self, output, input, opts=None):
        c = self._comm
        return self._submit("all_gather_into_tensor", lambda: c.all_gather(input, out=output), [output])

    _allgather_base = all_gather_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _op(opts.reduceOp) if opts is not None else "sum"
        c = self._comm

        def run():
            for out, inps in zip(output_tensors, input_tensors):
                flat = torch.cat([t.reshape(-1) for t in inps])
                counts = [t.numel() for t in inps]
                if len(set(counts)) == 1:
                    c.reduce_scatter(flat, op=op, out=out)
                else:
                    c.reduce_scatter_v(flat, counts, op=op, out=out)

        return self._submit("reduce_scatter", run, output_tensors)

    def reduce_scatter_single(self, output, input, opts=None):
        op = _op(opts.reduceOp) if opts is not None else "sum"
        c = self._comm
        return self._submit("reduce_scatter_tensor", lambda: c.reduce_scatter(input, op=op, out=output), [output])

    _reduce_scatter_base = reduce_scatter_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        c = self._comm

        def run():
            flat = torch.cat([t.reshape(-1) for t in input_tensors])
            recv = [t.numel() for t in output_tensors]
            got = c.all_to_allv(flat, [t.numel() for t in input_tensors], recv)
            for o, part in zip(output_tensors, torch.split(got, recv)):
                o.copy_(part.view(o.shape))

        return self._submit("alltoall", run, output_tensors)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        c = self._comm
        n = c.size
        row_in = input[0].numel() if input.dim() > 0 and input.shape[0] else 1
        row_out = output[0].numel() if output.dim() > 0 and output.shape[0] else 1
        if not output_split_sizes and not input_split_sizes:
            return self._submit("all_to_all_single", lambda: c.all_to_all(input, out=output), [output])
        send = _split_counts(input_split_sizes, input.shape[0], n, row_in, "all_to_all_single")
        recv = _split_counts(output_split_sizes, output.shape[0], n, row_out, "all_to_all_single")
        return self._submit("all_to_all_single", lambda: c.all_to_allv(input, send, recv, out=output), [output])

    alltoall_base = all_to_all_single

    def gather(self, output_tensors, input_tensors, opts):
        c, root = self._comm, opts.rootRank

        def run():
            inp = input_tensors[0]
            if c.rank == root:
                tmp = inp.new_empty((c.size,) + tuple(inp.shape))
                c.gather(inp, root=root, out=tmp)
                for o, t in zip(output_tensors[0], tmp):
                    o.copy_(t)
            else:
                c.gather(inp, root=root)

        return self._submit("gather", run, output_tensors)

    def scatter(self, output_tensors, input_tensors, opts):
        c, root = self._comm, opts.rootRank

        def run():
            out = output_tensors[0]
            if c.rank == root:
                c.scatter(torch.stack([t.contiguous() for t in input_tensors[0]]), root=root, out=out)
            else:
                c.scatter(None, root=root, out=out)

        return self._submit("scatter", run, output_tensors)

    def send(self, tensors, dst, tag=0):
        c = self._comm
        return self._submit("send", lambda: [c.send(t, dst) for t in tensors], tensors)

    def recv(self, tensors, src, tag=0):
        c = self._comm
        return self._submit("recv", lambda: [c.recv(t, src) for t in tensors], tensors)

    def barrier(self, opts=None):
        c = self._comm
        return self._submit("barrier", c.barrier, [])

    def shutdown(self):
        self._comm.close()

    def abort(self):
        self._comm.abort()


_CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "ProcessGroupFerroccl.cpp")
_native_lock = threading.Lock()
_native = None  # (module or None, why not)


def native_module():
    """The compiled native backend's module, building it on first use (minutes the first
    time, cached after); None with the reason where it cannot be built or loaded."""
    global _native
    with _native_lock:
        if _native is None:
            try:
                from torch.utils import cpp_extension

                bindir = os.path.dirname(sys.executable)
                if shutil.which("ninja") is None and os.path.isfile(os.path.join(bindir, "ninja")):
                    # pip's ninja sits next to a venv's python, off PATH when the venv is not activated
                    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

                mod = cpp_extension.load(name="ferroccl_c10d", sources=[_CSRC], extra_cflags=["-O2"],
                                         verbose=os.environ.get("FERROCCL_TORCH_VERBOSE") == "1")
                _native = (mod, None)
            except Exception as e:  # noqa: BLE001 - any build failure falls back, saying why
                _native = (None, f"{type(e).__name__}: {e}")
        return _native


def served_by(group=None):
    """"native" or "python": which backend serves a "ferroccl" process group (default: the world)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(pg, ProcessGroupFerroccl):
        return "python"
    mod = _native[0] if _native else None
    if mod is not None and isinstance(pg._get_backend(torch.device("cpu")), mod.ProcessGroupFerroccl):
        return "native"
    raise ValueError(f"process group {pg} is not served by ferroccl")


def _create(store, rank, size, timeout):
    choice = os.environ.get("FERROCCL_TORCH_BACKEND", "auto")
    if choice not in ("auto", "native", "python"):
        raise ValueError(f"FERROCCL_TORCH_BACKEND={choice!r}: expected auto, native or python")
    if choice != "python":
        mod, why = native_module()
        if mod is not None:
            ms = _timeout_ms(timeout)
            uid = _unique_id(store, rank)
            return mod.ProcessGroupFerroccl(_lib.library_path(), bytes(uid), rank, size, ms or 0, f"torch-pg-r{rank}")
        if choice == "native":
            raise RuntimeError(f"ferroccl: the native torch backend could not be built ({why})")
        warnings.warn(f"ferroccl: the native torch backend could not be built, the Python one serves "
                      f"(slower, no batch_isend_irecv): {why}", RuntimeWarning, stacklevel=2)
    return ProcessGroupFerroccl(store, rank, size, timeout)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
