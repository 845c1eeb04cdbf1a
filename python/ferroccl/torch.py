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
them (even ranks send first, odd ranks receive first). ``dist.batch_isend_irecv``
needs a C++ backend object per device, which torch does not give Python process
groups: it raises "No backend type associated with device type cpu".
"""

from datetime import timedelta

import torch
import torch.distributed as dist

from . import Comm, UniqueId, get_unique_id


__all__ = ["ProcessGroupFerroccl", "BACKEND"]

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
        ms = int(timeout.total_seconds() * 1000) if isinstance(timeout, timedelta) else None
        if ms is not None:
            # ferroccl's bound is a C int of ms: a longer timeout (over 24.8 days) is as
            # good as none, and must not wrap around into a short or negative one.
            ms = min(ms, 2**31 - 1)
        # torch's store is already prefixed per process group: one key per group.
        if rank == 0:
            uid = get_unique_id()
            store.set("ferroccl/unique_id", bytes(uid))
        else:
            uid = UniqueId(store.get("ferroccl/unique_id"))
        self._comm = Comm.init_rank(size, uid, rank, timeout_ms=ms, name=f"torch-pg-r{rank}")

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


def _create(store, rank, size, timeout):
    return ProcessGroupFerroccl(store, rank, size, timeout)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
