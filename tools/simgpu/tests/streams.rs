//! Streams, the legacy stream's ordering, events and stream memory operations.

mod common;
use common::*;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

const NOT_READY: CUresult = CUresult::CUDA_ERROR_NOT_READY;
const INVALID: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;
const NON_BLOCKING: u32 = 1;
const GEQ: u32 = 0;
const EQ: u32 = 1;
const AND: u32 = 2;
const NOR: u32 = 3;
const FLUSH: u32 = 1 << 30;

/// A pinned host word the tests release waits with (host stores are what a peer would do).
struct Flag(*mut u8);

impl Flag {
    fn new() -> Flag {
        let p = host_alloc(64);
        // SAFETY: 64 fresh writable bytes.
        unsafe { std::ptr::write_bytes(p, 0, 64) };
        Flag(p)
    }
    fn addr(&self) -> u64 {
        self.0 as u64
    }
    fn a32(&self) -> &AtomicU32 {
        // SAFETY: 256-byte aligned pinned memory, accessed atomically by everyone.
        unsafe { &*(self.0 as *const AtomicU32) }
    }
    fn a64(&self) -> &AtomicU64 {
        // SAFETY: as above; the second 8-byte word.
        unsafe { &*(self.0.add(8) as *const AtomicU64) }
    }
}

impl Drop for Flag {
    fn drop(&mut self) {
        // After a failed assertion a stream may wait on the flag forever; freeing it would wait
        // for that stream (the failure would become a hang).
        if !std::thread::panicking() {
            // SAFETY: allocated by `new`.
            unsafe { cuMemFreeHost(self.0.cast()) };
        }
    }
}

fn query(s: CUstream) -> CUresult {
    // SAFETY: a stream of the test.
    unsafe { cuStreamQuery(s) }
}

fn sync(s: CUstream) {
    // SAFETY: a stream of the test.
    ok(unsafe { cuStreamSynchronize(s) });
}

/// Asserts that the stream is still held back after giving the executor time.
#[track_caller]
fn assert_blocked(s: CUstream) {
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(query(s), NOT_READY, "the stream should still be waiting");
}

fn wait32(s: CUstream, addr: u64, v: u32, flags: u32) {
    // SAFETY: device-accessible address of the test.
    ok(unsafe { cuStreamWaitValue32_v2(s, addr, v, flags) });
}

fn write32(s: CUstream, addr: u64, v: u32) {
    // SAFETY: as above.
    ok(unsafe { cuStreamWriteValue32_v2(s, addr, v, 0) });
}

#[test]
fn async_copies_touch_pinned_memory_when_the_stream_gets_there() {
    let t = "async_copies_touch_pinned_memory_when_the_stream_gets_there";
    if !is_child(t) {
        assert_child_ok(&run_child(t, &[("FERROCCL_SIM_LATENCY_US", "200000")]));
        return;
    }
    let _c = Ctx::new(0);
    let n = 4096;
    let d = alloc(n);
    htod(d, &vec![0x11; n]);
    let s = stream(0);
    let p = host_alloc(n);
    let mut pageable = vec![0u8; n];
    // SAFETY: buffers of n bytes, alive until synchronised.
    unsafe {
        std::ptr::write_bytes(p, 0, n);
        ok(cuMemcpyDtoHAsync_v2(p.cast(), d, n, s));
        assert_eq!(
            std::ptr::read_volatile(p),
            0,
            "an async copy into pinned memory is not visible before a synchronise"
        );
        assert_eq!(query(s), NOT_READY);
        sync(s);
        assert_eq!(std::slice::from_raw_parts(p, n), &vec![0x11; n][..]);
        // Pinned source: read when the stream runs the copy.
        std::ptr::write_bytes(p, 0x22, n);
        ok(cuMemcpyHtoDAsync_v2(d, p.cast(), n, s));
        std::ptr::write_bytes(p, 0x33, n);
        sync(s);
        assert_eq!(dtoh(d, n), vec![0x33; n]);
        // Pageable source: staged before the call returns.
        pageable.fill(0x44);
        ok(cuMemcpyHtoDAsync_v2(d, pageable.as_ptr().cast(), n, s));
        pageable.fill(0x55);
        sync(s);
        assert_eq!(dtoh(d, n), vec![0x44; n]);
        // Pageable destination: complete when the call returns.
        ok(cuMemcpyDtoHAsync_v2(pageable.as_mut_ptr().cast(), d, n, s));
        assert_eq!(pageable, vec![0x44; n]);
        ok(cuMemFreeHost(p.cast()));
        ok(cuStreamDestroy_v2(s));
    }
}

#[test]
fn legacy_stream_orders_against_blocking_streams_only() {
    let _c = Ctx::new(0);
    let flag = Flag::new();
    let d = alloc(64);
    let e = alloc(64);
    let f = alloc(64);
    htod(d, &[0; 64]);
    htod(e, &[0; 64]);
    htod(f, &[0; 64]);
    let blocking = stream(0);
    let other = stream(0);
    let nonblocking = stream(NON_BLOCKING);
    let legacy: CUstream = std::ptr::null_mut();
    // SAFETY: device ranges of the test.
    unsafe {
        // Legacy work waits for earlier work of blocking streams.
        wait32(blocking, flag.addr(), 1, EQ);
        ok(cuMemsetD8Async(d, 1, 64, blocking));
        ok(cuMemcpyDtoDAsync_v2(e, d, 64, legacy));
        ok(cuMemcpyDtoDAsync_v2(f, d, 64, nonblocking));
        sync(nonblocking);
        assert_eq!(dtoh_on(f, nonblocking), vec![0; 64], "non-blocking streams do not wait");
        assert_blocked(legacy);
        flag.a32().store(1, Ordering::SeqCst);
        sync(legacy);
        assert_eq!(dtoh(e, 64), vec![1; 64]);
        // Work on a blocking stream waits for earlier legacy work.
        wait32(legacy, flag.addr(), 2, EQ);
        ok(cuMemsetD8Async(e, 2, 64, other));
        ok(cuMemsetD8Async(f, 3, 64, nonblocking));
        sync(nonblocking);
        assert_blocked(other);
        assert_eq!(dtoh_on(f, nonblocking), vec![3; 64]);
        flag.a32().store(2, Ordering::SeqCst);
        sync(other);
        assert_eq!(dtoh_on(e, nonblocking), vec![2; 64]);
        // The per-thread default stream is blocking too.
        let per_thread = 0x2 as CUstream;
        wait32(legacy, flag.addr(), 3, EQ);
        ok(cuMemsetD8Async(e, 4, 64, per_thread));
        assert_blocked(per_thread);
        flag.a32().store(3, Ordering::SeqCst);
        sync(per_thread);
        ok(cuCtxSynchronize());
        for s in [blocking, other, nonblocking] {
            ok(cuStreamDestroy_v2(s));
        }
    }
}

/// Device to host through a non-blocking stream (does not wait for the legacy stream).
fn dtoh_on(d: CUdeviceptr, s: CUstream) -> Vec<u8> {
    let mut v = vec![0u8; 64];
    // SAFETY: 64 writable bytes; pageable, so complete on return.
    ok(unsafe { cuMemcpyDtoHAsync_v2(v.as_mut_ptr().cast(), d, 64, s) });
    v
}

#[test]
fn events_query_synchronize_wait_and_time() {
    let _c = Ctx::new(1);
    let flag = Flag::new();
    let a = stream(NON_BLOCKING);
    let b = stream(NON_BLOCKING);
    // SAFETY: handles and pointers of the test.
    unsafe {
        let (mut start, mut end, mut untimed) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
        ok(cuEventCreate(&mut start, 0));
        ok(cuEventCreate(&mut end, 1));
        ok(cuEventCreate(&mut untimed, 2));
        ok(cuEventQuery(end));
        let mut ms = 0f32;
        assert_eq!(cuEventElapsedTime_v2(&mut ms, start, end), CUresult::CUDA_ERROR_INVALID_HANDLE, "never recorded");
        ok(cuEventRecord(start, a));
        wait32(a, flag.addr(), 1, GEQ);
        ok(cuEventRecord(end, a));
        ok(cuEventRecord(untimed, a));
        ok(cuStreamWaitEvent(b, end, 0));
        write32(b, flag.addr() + 4, 7);
        assert_blocked(b);
        assert_eq!(cuEventQuery(end), NOT_READY);
        ok(cuEventSynchronize(start));
        assert_eq!(cuEventElapsedTime(&mut ms, start, end), NOT_READY);
        flag.a32().store(1, Ordering::SeqCst);
        ok(cuEventSynchronize(end));
        ok(cuEventQuery(end));
        ok(cuEventElapsedTime_v2(&mut ms, start, end));
        assert!((0.0..10_000.0).contains(&ms), "{ms}");
        assert_eq!(cuEventElapsedTime_v2(&mut ms, start, untimed), CUresult::CUDA_ERROR_INVALID_HANDLE);
        sync(b);
        assert_eq!(std::ptr::read_volatile(flag.0.add(4).cast::<u32>()), 7);
        // A wait captures the record current at the call, not later ones.
        ok(cuEventRecord(end, a));
        ok(cuStreamWaitEvent(b, end, 0));
        wait32(a, flag.addr(), 2, GEQ);
        ok(cuEventRecord(end, a));
        sync(b);
        assert_eq!(cuEventQuery(end), NOT_READY);
        flag.a32().store(2, Ordering::SeqCst);
        ok(cuEventSynchronize(end));
        assert_eq!(cuStreamWaitEvent(b, end, 4), INVALID);
        for e in [start, end, untimed] {
            ok(cuEventDestroy_v2(e));
        }
        assert_eq!(cuEventQuery(end), CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuEventRecord(end, a), CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuEventCreate(&mut start, 4), INVALID, "interprocess needs DISABLE_TIMING");
        ok(cuStreamDestroy_v2(a));
        ok(cuStreamDestroy_v2(b));
    }
}

#[test]
fn wait_value_32_with_every_condition() {
    let _c = Ctx::new(0);
    let flag = Flag::new();
    let s = stream(NON_BLOCKING);
    let writer = stream(NON_BLOCKING);
    let w = flag.a32();
    let check = |start: u32, value: u32, flags: u32, release: &dyn Fn()| {
        w.store(start, Ordering::SeqCst);
        wait32(s, flag.addr(), value, flags);
        assert_blocked(s);
        release();
        sync(s);
    };
    // GEQ, released by the host.
    check(5, 6, GEQ, &|| w.store(6, Ordering::SeqCst));
    // GEQ is cyclic: 0xffff_fff0 is "before" 0x10.
    check(0xffff_fff0, 0x10, GEQ | FLUSH, &|| w.store(0x10, Ordering::SeqCst));
    // EQ, released by a write from another stream.
    check(0, 7, EQ, &|| write32(writer, flag.addr(), 7));
    // AND: some bit of the value set.
    check(0b001, 0b100, AND, &|| w.store(0b110, Ordering::SeqCst));
    // NOR: some bit set in neither.
    check(0xff, 0xffff_ff00, NOR, &|| w.store(0x0f, Ordering::SeqCst));
    // Satisfied at once.
    w.store(9, Ordering::SeqCst);
    wait32(s, flag.addr(), 3, GEQ);
    sync(s);
    // SAFETY: streams of the test; addresses checked by the simulator.
    unsafe {
        ok(cuStreamDestroy_v2(s));
        ok(cuStreamDestroy_v2(writer));
    }
}

#[test]
fn wait_and_write_value_64_on_device_and_pinned_memory() {
    let _c = Ctx::new(0);
    let flag = Flag::new();
    let s = stream(NON_BLOCKING);
    let writer = stream(NON_BLOCKING);
    let d = alloc(64);
    let w = flag.a64();
    // SAFETY: device-accessible addresses of the test.
    unsafe {
        ok(cuMemsetD8Async(d, 0, 64, writer));
        sync(writer);
        // Device memory: released by a 64-bit write from another stream.
        ok(cuStreamWaitValue64_v2(s, d + 8, 1 << 40, GEQ));
        ok(cuStreamWriteValue64_v2(s, d + 16, 0x0123_4567_89ab_cdef, 1));
        assert_blocked(s);
        ok(cuStreamWriteValue64_v2(writer, d + 8, 1 << 40, 0));
        sync(s);
        let v = dtoh(d, 24);
        assert_eq!(u64::from_ne_bytes(v[16..24].try_into().unwrap()), 0x0123_4567_89ab_cdef);
        // Pinned memory, each condition, host stores.
        w.store(u64::MAX - 1, Ordering::SeqCst);
        ok(cuStreamWaitValue64_v2(s, flag.addr() + 8, 2, GEQ));
        assert_blocked(s);
        w.store(2, Ordering::SeqCst);
        sync(s);
        ok(cuStreamWaitValue64_v2(s, flag.addr() + 8, 1 << 63, AND));
        assert_blocked(s);
        w.store(u64::MAX, Ordering::SeqCst);
        sync(s);
        ok(cuStreamWaitValue64_v2(s, flag.addr() + 8, 0xffff_ffff, NOR));
        assert_blocked(s);
        w.store(0xffff_ffff, Ordering::SeqCst);
        sync(s);
        ok(cuStreamWaitValue64_v2(s, flag.addr() + 8, 5, EQ));
        assert_blocked(s);
        ok(cuStreamWriteValue64_v2(writer, flag.addr() + 8, 5, 0));
        sync(s);
        // The un-suffixed (V1) names are refused, as a stock driver refuses them
        // (tools/simgpu/tests/profile.rs holds the rest).
        assert_eq!(cuStreamWriteValue32(writer, d, 3, 0), CUresult::CUDA_ERROR_NOT_SUPPORTED);
        assert_eq!(cuStreamWaitValue32(s, d, 3, EQ), CUresult::CUDA_ERROR_NOT_SUPPORTED);
        sync(s);
        // What the GPU could not access, or misuse.
        let mut pageable = [0u64; 2];
        let pa = pageable.as_mut_ptr() as u64;
        assert_eq!(cuStreamWaitValue32_v2(s, pa, 0, GEQ), INVALID, "pageable host memory");
        assert_eq!(cuStreamWriteValue64_v2(s, pa, 0, 0), INVALID);
        assert_eq!(cuStreamWaitValue32_v2(s, d + 2, 0, GEQ), INVALID, "misaligned");
        assert_eq!(cuStreamWaitValue64_v2(s, d + 4, 0, GEQ), INVALID, "misaligned");
        assert_eq!(cuStreamWaitValue32_v2(s, d + 64, 0, GEQ), INVALID, "past the end");
        assert_eq!(cuStreamWaitValue32_v2(s, d, 0, 4), INVALID, "flags");
        assert_eq!(cuStreamWriteValue32_v2(s, d, 0, 2), INVALID, "flags");
        // Registered host memory is device-accessible.
        ok(cuMemHostRegister_v2(pageable.as_mut_ptr().cast(), 16, 0));
        ok(cuStreamWriteValue64_v2(s, pa + 8, 77, 0));
        sync(s);
        assert_eq!(std::ptr::read_volatile(&pageable[1]), 77);
        ok(cuMemHostUnregister(pageable.as_mut_ptr().cast()));
        ok(cuMemFree_v2(d));
        ok(cuStreamDestroy_v2(s));
        ok(cuStreamDestroy_v2(writer));
    }
}

#[test]
fn batch_memory_operations_run_in_order() {
    use cudarc::driver::sys::{
        CUstreamBatchMemOpParams, CUstreamBatchMemOpParams_union_CUstreamMemOpWaitValueParams_st as WaitP,
        CUstreamBatchMemOpParams_union_CUstreamMemOpWaitValueParams_st__bindgen_ty_1 as V,
        CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st as WriteP,
        CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st__bindgen_ty_1 as WV,
        CUstreamBatchMemOpType as T,
    };
    let _c = Ctx::new(0);
    let flag = Flag::new();
    let s = stream(NON_BLOCKING);
    let wait = CUstreamBatchMemOpParams {
        waitValue: WaitP {
            operation: T::CU_STREAM_MEM_OP_WAIT_VALUE_32,
            address: flag.addr(),
            __bindgen_anon_1: V { value: 1 },
            flags: EQ,
            alias: 0,
        },
    };
    let write = CUstreamBatchMemOpParams {
        writeValue: WriteP {
            operation: T::CU_STREAM_MEM_OP_WRITE_VALUE_64,
            address: flag.addr() + 8,
            __bindgen_anon_1: WV { value64: 99 },
            flags: 0,
            alias: 0,
        },
    };
    let mut ops = [wait, write];
    // SAFETY: a valid parameter array.
    unsafe {
        ok(cuStreamBatchMemOp_v2(s, 2, ops.as_mut_ptr(), 0));
        assert_blocked(s);
        assert_eq!(flag.a64().load(Ordering::SeqCst), 0);
        flag.a32().store(1, Ordering::SeqCst);
        sync(s);
        assert_eq!(flag.a64().load(Ordering::SeqCst), 99);
        assert_eq!(cuStreamBatchMemOp_v2(s, 2, ops.as_mut_ptr(), 1), INVALID);
        assert_eq!(cuStreamBatchMemOp_v2(s, 0, ops.as_mut_ptr(), 0), INVALID);
        ok(cuStreamDestroy_v2(s));
    }
}

/// A user-data value that is not a pointer (the functions only record it).
fn tag(n: usize) -> *mut c_void {
    std::ptr::null_mut::<u8>().wrapping_add(n).cast()
}

static CALLS: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

unsafe extern "C" fn host_fn(data: *mut c_void) {
    // SAFETY: no arguments; a CUDA call from a host function must be refused.
    let r = unsafe { cuCtxSynchronize() };
    assert_eq!(r, CUresult::CUDA_ERROR_NOT_PERMITTED);
    CALLS.lock().unwrap().push(data as usize);
}

unsafe extern "C" fn callback(_s: usize, status: u32, data: *mut c_void) {
    assert_eq!(status, 0);
    CALLS.lock().unwrap().push(data as usize);
}

#[test]
fn host_functions_run_in_stream_order_and_may_not_call_cuda() {
    let _c = Ctx::new(0);
    let s = stream(0);
    let flag = Flag::new();
    // SAFETY: the functions match the documented signatures.
    unsafe {
        wait32(s, flag.addr(), 1, EQ);
        ok(cuLaunchHostFunc(s, Some(host_fn), tag(1)));
        ok(cuStreamAddCallback(s, Some(callback), tag(2), 0));
        ok(cuLaunchHostFunc(s, Some(host_fn), tag(3)));
        assert_blocked(s);
        assert!(CALLS.lock().unwrap().is_empty());
        flag.a32().store(1, Ordering::SeqCst);
        sync(s);
        assert_eq!(*CALLS.lock().unwrap(), vec![1, 2, 3]);
        assert_eq!(cuLaunchHostFunc(s, None, std::ptr::null_mut()), INVALID);
        ok(cuStreamDestroy_v2(s));
    }
}

#[test]
fn destroyed_streams_finish_their_work_and_handles_are_checked() {
    let c = Ctx::new(0);
    let s = stream(0);
    let flag = Flag::new();
    // SAFETY: handles of the test, or garbage the simulator must reject.
    unsafe {
        wait32(s, flag.addr(), 1, EQ);
        write32(s, flag.addr() + 4, 5);
        ok(cuStreamDestroy_v2(s));
        assert_eq!(cuStreamSynchronize(s), CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuStreamDestroy_v2(s), CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuStreamQuery(0x5e00_dead_0000 as CUstream), CUresult::CUDA_ERROR_INVALID_HANDLE);
        flag.a32().store(1, Ordering::SeqCst);
        let w = &*(flag.0.add(4) as *const AtomicU32);
        let t0 = std::time::Instant::now();
        while w.load(Ordering::SeqCst) != 5 {
            assert!(t0.elapsed() < Duration::from_secs(10), "queued work of a destroyed stream must complete");
            std::thread::sleep(Duration::from_millis(1));
        }
        // A stream of another context cannot take work while this one is current.
        let other = Ctx::new(1);
        let s2 = stream(0);
        ok(cuCtxSetCurrent(c.0));
        assert_eq!(cuStreamWriteValue32_v2(s2, flag.addr(), 1, 0), CUresult::CUDA_ERROR_INVALID_HANDLE);
        sync(s2); // synchronising works from any context
        let (mut p, mut f, mut id) = (0, 7, 0);
        ok(cuStreamGetPriority(s2, &mut p));
        ok(cuStreamGetFlags(s2, &mut f));
        ok(cuStreamGetId(s2, &mut id));
        let mut sc: CUcontext = std::ptr::null_mut();
        ok(cuStreamGetCtx(s2, &mut sc));
        assert_eq!((p, f, sc), (0, 0, other.0));
        ok(cuStreamGetCtx(std::ptr::null_mut(), &mut sc));
        assert_eq!(sc, c.0, "the NULL stream is the current context's");
        let mut hi = std::ptr::null_mut();
        ok(cuStreamCreateWithPriority(&mut hi, 0, -100));
        ok(cuStreamGetPriority(hi, &mut p));
        assert_eq!(p, -5, "clamped to the greatest priority");
        assert_eq!(cuStreamCreate(&mut hi, 4), INVALID);
        ok(cuStreamDestroy_v2(s2));
    }
}

#[test]
fn a_process_may_exit_with_work_pending() {
    let t = "a_process_may_exit_with_work_pending";
    if is_child(t) {
        let _c = Ctx::new(0);
        let d = alloc(1 << 20);
        let s = stream(0);
        // SAFETY: a range of the allocation.
        ok(unsafe { cuMemsetD8Async(d, 1, 1 << 20, s) });
        std::mem::forget(_c);
        std::process::exit(0);
    }
    let t0 = std::time::Instant::now();
    assert_child_ok(&run_child(t, &[("FERROCCL_SIM_LATENCY_US", "2000000")]));
    assert!(t0.elapsed() < Duration::from_secs(2), "exit waited for the stream");
}
