"""One rank of the device-memory check, written against the CUDA driver API through
ctypes (what a Python program without CUDA bindings does): device 0 made current,
buffers from fcclMemAlloc filled and read with cuMemcpyHtoD/DtoH, results compared
with numpy. Process mode under ferroccl-run; `--threads N` runs N ranks as threads
of one process on devices given by --devlist (default all 0).

Prints "rank R: device checks, OK" per rank; exits 1 on any mismatch, 77 without a
driver or device.
"""

import argparse
import ctypes
import os
import sys
import threading
from ctypes import byref, c_int, c_size_t, c_uint, c_void_p

import numpy as np

import ferroccl_ctypes as f

CUDA_SUCCESS = 0


def driver():
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    cu.cuInit.argtypes = [c_uint]
    cu.cuDeviceGetCount.argtypes = [ctypes.POINTER(c_int)]
    cu.cuDeviceGet.argtypes = [ctypes.POINTER(c_int), c_int]
    cu.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(c_void_p), c_int]
    cu.cuCtxSetCurrent.argtypes = [c_void_p]
    cu.cuCtxSynchronize.argtypes = []
    cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, c_void_p, c_size_t]
    cu.cuMemcpyDtoH_v2.argtypes = [c_void_p, ctypes.c_uint64, c_size_t]
    cu.cuStreamCreate.argtypes = [ctypes.POINTER(c_void_p), c_uint]
    cu.cuStreamSynchronize.argtypes = [c_void_p]
    cu.cuStreamDestroy_v2.argtypes = [c_void_p]
    cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, c_void_p, c_size_t, c_void_p]
    cu.cuMemcpyDtoHAsync_v2.argtypes = [c_void_p, ctypes.c_uint64, c_size_t, c_void_p]
    cu.cuStreamWaitValue32_v2.argtypes = [c_void_p, ctypes.c_uint64, c_uint, c_uint]
    return cu


def ok(rc, what):
    if rc != CUDA_SUCCESS:
        raise RuntimeError(f"{what} returned CUresult {rc}")


def make_current(cu, dev):
    d, ctx = c_int(), c_void_p()
    ok(cu.cuDeviceGet(byref(d), dev), "cuDeviceGet")
    ok(cu.cuDevicePrimaryCtxRetain(byref(ctx), d), "cuDevicePrimaryCtxRetain")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def dev_alloc(nbytes):
    p = c_void_p()
    f.call("fcclMemAlloc", byref(p), max(nbytes, 1))
    return p.value


def put(cu, d, a):
    ok(cu.cuMemcpyHtoD_v2(d, a.ctypes.data, a.nbytes), "cuMemcpyHtoD")


def get(cu, d, a):
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    ok(cu.cuMemcpyDtoH_v2(a.ctypes.data, d, a.nbytes), "cuMemcpyDtoH")
    return a


def body(cu, comm, expect_dev):
    rank, n = f.comm_user_rank(comm), f.comm_count(comm)
    dev = f.comm_cu_device(comm)
    assert dev == expect_dev, f"fcclCommCuDevice = {dev}, expected {expect_dev}"
    make_current(cu, dev)
    count = 1001
    x = (np.arange(count, dtype=np.float32) + 1000 * rank)
    s, r = dev_alloc(x.nbytes * n), dev_alloc(x.nbytes * n)
    checks = 0
    # all_reduce out of place
    put(cu, s, x)
    f.call("fcclAllReduce", c_void_p(s), c_void_p(r), count, f.fcclFloat32, f.fcclSum, comm, None)
    want = sum(np.arange(count, dtype=np.float32) + 1000 * p for p in range(n))
    got = get(cu, r, np.zeros(count, np.float32))
    assert np.array_equal(got, want), f"rank {rank}: all_reduce {got[:4]} != {want[:4]}"
    checks += 1
    # all_to_all: block q of rank p holds p*1000 + q*count + i (the staged all_to_all of issue 29)
    big = np.arange(count * n, dtype=np.float32) + 1000 * rank
    put(cu, s, big)
    f.call("fcclAlltoAll", c_void_p(s), c_void_p(r), count, f.fcclFloat32, comm, None)
    want = np.concatenate([np.arange(rank * count, (rank + 1) * count, dtype=np.float32) + 1000 * p
                           for p in range(n)])
    got = get(cu, r, np.zeros(count * n, np.float32))
    assert np.array_equal(got, want), f"rank {rank}: all_to_all block mismatch"
    checks += 1
    # all_gather, stream-ordered: upload, collective and download queued on one stream, one sync
    st = c_void_p()
    ok(cu.cuStreamCreate(byref(st), 0), "cuStreamCreate")
    # Separate pinned buffers up and down: the call returns before the stream has run
    # the upload (as with NCCL), so its source must stay untouched until the sync.
    pin_up, pin_down = c_void_p(), c_void_p()
    f.call("fcclMemAllocHost", byref(pin_up), x.nbytes)
    f.call("fcclMemAllocHost", byref(pin_down), x.nbytes * n)
    up = np.frombuffer((ctypes.c_char * x.nbytes).from_address(pin_up.value), dtype=np.float32)
    host = np.frombuffer((ctypes.c_char * (x.nbytes * n)).from_address(pin_down.value), dtype=np.float32)
    up[:] = x
    host[:] = -1
    ok(cu.cuMemcpyHtoDAsync_v2(s, pin_up, x.nbytes, st), "cuMemcpyHtoDAsync")
    f.call("fcclAllGather", c_void_p(s), c_void_p(r), count, f.fcclFloat32, comm, st)
    ok(cu.cuMemcpyDtoHAsync_v2(pin_down, r, x.nbytes * n, st), "cuMemcpyDtoHAsync")
    ok(cu.cuStreamSynchronize(st), "cuStreamSynchronize")
    want = np.concatenate([np.arange(count, dtype=np.float32) + 1000 * p for p in range(n)])
    assert np.array_equal(host, want), f"rank {rank}: stream-ordered all_gather mismatch"
    checks += 1
    del host, up
    f.call("fcclMemFree", pin_up)
    f.call("fcclMemFree", pin_down)
    ok(cu.cuStreamDestroy_v2(st), "cuStreamDestroy")
    f.call("fcclMemFree", c_void_p(s))
    f.call("fcclMemFree", c_void_p(r))
    print(f"rank {rank}: {checks} device checks, OK", flush=True)


def fault(cu, comm, mode, op="all_reduce"):
    """Rank 1's stream never gets to its part of an all_reduce, or of a send/recv from
    rank 0 to rank 1 (`op` "send_recv"; it waits on a word nobody writes), then rank 1
    dies (`kill`) or stops (`stop`). Rank 0's call returns at once (stream-ordered); its
    stream must still end, released by the watchdog, and its next call fail naming
    rank 1. Prints "rank 0: released after S s: <message>"."""
    import os
    import signal
    import time
    rank = f.comm_user_rank(comm)
    make_current(cu, 0)
    count = 1 << 18  # 1 MiB of float32: the IPC path under its default threshold
    s, r = dev_alloc(count * 4), dev_alloc(count * 4)
    st = c_void_p()
    ok(cu.cuStreamCreate(byref(st), 0), "cuStreamCreate")
    # Once normally, so the path is set up (and pids exchanged for the stop case).
    pids = np.zeros(2, np.int32)
    me = np.array([os.getpid()], np.int32)
    f.call("fcclAllGather", me.ctypes.data_as(c_void_p), pids.ctypes.data_as(c_void_p), 1, f.fcclInt32, comm, None)
    def the_call():
        if op == "send_recv":
            if rank == 0:
                f.call("fcclSend", c_void_p(s), count, f.fcclFloat32, 1, comm, st)
            else:
                f.call("fcclRecv", c_void_p(r), count, f.fcclFloat32, 0, comm, st)
        else:
            f.call("fcclAllReduce", c_void_p(s), c_void_p(r), count, f.fcclFloat32, f.fcclSum, comm, st)

    the_call()
    ok(cu.cuStreamSynchronize(st), "cuStreamSynchronize")
    if mode == "vanish":
        # Rank 1 dies before it posts its receive: rank 0's send fails on the host.
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        rc = f.load().fcclSend(c_void_p(s), count, f.fcclFloat32, 1, comm, st)
        print(f"rank 0: send returned {f.error_string(rc)} after {time.monotonic() - t0:.3f} s: "
              f"{f.last_error(comm)}", flush=True)
        return 0 if rc != 0 else 1
    if rank == 1:
        never = c_void_p()
        f.call("fcclMemAllocHost", byref(never), 64)
        ctypes.memset(never, 0, 64)
        ok(cu.cuStreamWaitValue32_v2(st, never.value, 1, 0), "cuStreamWaitValue32")
        the_call()
        print("rank 1: enqueued behind a wait that never ends", flush=True)
        os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
        return 1
    t0 = time.monotonic()
    the_call()
    enqueue = time.monotonic() - t0
    ok(cu.cuStreamSynchronize(st), "cuStreamSynchronize")
    took = time.monotonic() - t0
    rc = load_rc = f.load().fcclAllReduce(c_void_p(s), c_void_p(r), count, f.fcclFloat32, f.fcclSum, comm, st)
    msg = f.last_error(comm)
    asyncerr = c_int()
    f.load().fcclCommGetAsyncError(comm, byref(asyncerr))
    print(f"rank 0: enqueued in {enqueue:.3f} s; released after {took:.3f} s; next call {f.error_string(load_rc)}; "
          f"async error {f.error_string(asyncerr.value)}: {msg}", flush=True)
    if mode == "stop":
        os.kill(int(pids[1]), signal.SIGKILL)
    return 0 if rc != 0 else 1


def staged_fault(cu, comm):
    """Every call staged through host memory in many chunks (the test sets
    FERROCCL_CUDA_IPC=0, a small FERROCCL_STAGING_CHUNK and a slow simulated stream):
    rank 1 dies in the middle of a pipelined all_reduce. Rank 0's call must return the
    host's error naming rank 1, with nothing of the call left on its stream (it
    synchronises, and a copy on it still runs). Prints "rank 0: staged call ..."."""
    import os
    import signal
    import time
    rank = f.comm_user_rank(comm)
    make_current(cu, 0)
    count = 1 << 20
    s, r = dev_alloc(count * 4), dev_alloc(count * 4)
    st = c_void_p()
    ok(cu.cuStreamCreate(byref(st), 0), "cuStreamCreate")
    f.call("fcclAllReduce", c_void_p(s), c_void_p(r), 1024, f.fcclFloat32, f.fcclSum, comm, st)
    ok(cu.cuStreamSynchronize(st), "cuStreamSynchronize")
    if rank == 1:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        f.load().fcclAllReduce(c_void_p(s), c_void_p(r), count, f.fcclFloat32, f.fcclSum, comm, st)
        print("rank 1: the call ended before the kill (make it longer)", flush=True)
        return 1
    t0 = time.monotonic()
    rc = f.load().fcclAllReduce(c_void_p(s), c_void_p(r), count, f.fcclFloat32, f.fcclSum, comm, st)
    took = time.monotonic() - t0
    msg = f.last_error(comm)
    sync = cu.cuStreamSynchronize(st)
    back = np.zeros(count, np.float32)
    copy = cu.cuMemcpyDtoHAsync_v2(back.ctypes.data_as(c_void_p), r, count * 4, st)
    copy_sync = cu.cuStreamSynchronize(st)
    print(f"rank 0: staged call returned {f.error_string(rc)} after {took:.3f} s; stream sync {sync}; "
          f"copy after it {copy}/{copy_sync}: {msg}", flush=True)
    return 0 if rc != 0 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--devlist", default="")
    ap.add_argument("--fault", choices=["kill", "stop", "staged-kill", "vanish"])
    ap.add_argument("--op", choices=["all_reduce", "send_recv"], default="all_reduce")
    a = ap.parse_args()
    cu = driver()
    if cu is None or cu.cuInit(0) != CUDA_SUCCESS:
        print("skipped: no CUDA driver")
        return 77
    ndev = c_int()
    if cu.cuDeviceGetCount(byref(ndev)) != CUDA_SUCCESS or ndev.value == 0:
        print("skipped: no CUDA device")
        return 77
    if a.threads:
        devs = [int(d) % ndev.value for d in a.devlist.split(",")] if a.devlist else [0] * a.threads
        arr = (c_int * a.threads)(*devs)
        comms = (f.fcclComm_t * a.threads)()
        f.call("fcclCommInitAll", comms, a.threads, arr)
        errs = []

        def run(i):
            try:
                body(cu, f.fcclComm_t(comms[i]), devs[i])
            except Exception as e:  # reported below, after every thread ended
                errs.append(e)

        ts = [threading.Thread(target=run, args=(i,)) for i in range(a.threads)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        for i in range(a.threads):
            f.call("fcclCommDestroy", f.fcclComm_t(comms[i]))
        for e in errs:
            print(f"FAIL: {e}", flush=True)
        return 1 if errs else 0
    make_current(cu, 0)  # as a CUDA program does before it creates its communicator
    comm = f.comm_init_from_env()
    if a.fault == "staged-kill":
        return staged_fault(cu, comm)
    if a.fault:
        return fault(cu, comm, a.fault, a.op)
    try:
        body(cu, comm, 0)
    except AssertionError as e:
        print(f"FAIL: {e}", flush=True)
        return 1
    finally:
        f.call("fcclCommDestroy", comm)
    compiles = nvrtc_compilations(cu)
    if compiles is not None:
        print(f"rank {os.environ.get('FERROCCL_RANK', '0')}: {compiles} NVRTC compilations", flush=True)
    return 0


def nvrtc_compilations(cu):
    """NVRTC compilations of this process so far, from the simulated GPU's cost model
    (simgpuGetCosts, counter 9); None on a real driver, which has no such export."""
    get = getattr(cu, "simgpuGetCosts", None)
    if get is None:
        return None
    costs = (ctypes.c_ulonglong * 16)()
    get.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), c_uint]
    get.restype = c_uint
    n = get(costs, 16)
    return costs[9] if n > 9 else None


if __name__ == "__main__":
    sys.exit(main())
