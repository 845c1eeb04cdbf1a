//! Host memory the device can reach (page-locked, mapped) and the stream memory
//! operations that wait for and write 32-bit words in it.

use super::*;

/// The entry points the stream-ordered path calls. The memory operations are the `_v2`
/// ones, which every driver since CUDA 11.7 enables by default; the unversioned (V1)
/// ones need the nvidia module loaded with NVreg_EnableStreamMemOPs=1 and are never used.
const MEMOP_SYMBOLS: &[&str] = &[
    "cuStreamWaitValue32_v2",
    "cuStreamWriteValue32_v2",
    "cuMemHostRegister_v2",
    "cuMemHostGetDevicePointer_v2",
    "cuMemHostUnregister",
    "cuIpcCloseMemHandle",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
];

/// The device attributes the stream-ordered path needs, each with why: (attribute,
/// what it means here). CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 is not one of
/// them: it describes the V1 entry points, which a stock driver disables (it reports 0).
pub const MEMOP_ATTRIBUTES: &[(cu::CUdevice_attribute, &str)] = &[
    (
        cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
        "the control words are host memory mapped into the device's address space (cuMemHostRegister with DEVICEMAP)",
    ),
    (
        cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED,
        "the control words live in shared memory that every rank page-locks in place (cuMemHostRegister)",
    ),
    (
        cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
        "peers' buffers and the control words are named by one address space per process",
    ),
];

/// Ok when the driver and `device` have what stream memory operations (waits and
/// writes of 32-bit words in host-mapped memory, ordered on a stream) need: the `_v2`
/// entry points and the attributes of [`MEMOP_ATTRIBUTES`]. Whether they work is only
/// known once one round trip has run ([`memop_round_trip`]).
pub fn memops_ready(device: i32) -> Result<()> {
    ipc_ready()?;
    static SYMS: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    SYMS.get_or_init(|| {
        // SAFETY: the driver is present (ipc_ready); only addresses are looked up.
        let lib = unsafe { cu::culib() };
        for s in MEMOP_SYMBOLS {
            // SAFETY: as above.
            if unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err() {
                return Err(format!(
                    "the CUDA driver lacks {s} (stream memory operations V2 need a driver of CUDA 11.7 or later)"
                ));
            }
        }
        Ok(())
    })
    .clone()
    .map_err(|m| Error::unavailable(format!("stream memory operations are unavailable: {m}")))?;
    for &(attr, why) in MEMOP_ATTRIBUTES {
        let mut v = 0;
        // SAFETY: valid out-pointer; device is an ordinal from the driver.
        let rc = unsafe { cu::cuDeviceGetAttribute(&mut v, attr, device) };
        if rc != cu::CUresult::CUDA_SUCCESS || v == 0 {
            let got = if rc == cu::CUresult::CUDA_SUCCESS { "0".to_string() } else { describe(rc) };
            return Err(Error::unavailable(format!("device {device} reports {attr:?} = {got}, and {why}")));
        }
    }
    Ok(())
}

/// A stream of the current context that does not synchronise with the legacy default
/// stream, destroyed on drop (the driver frees it once its work is done).
pub struct OwnedStream(cu::CUstream);

impl OwnedStream {
    /// A new non-blocking stream in the current context.
    pub fn new() -> Result<OwnedStream> {
        let mut s: cu::CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; a context is current (the caller's guard).
        let rc = unsafe { cu::cuStreamCreate(&mut s, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) };
        check(rc, "cuStreamCreate")?;
        Ok(OwnedStream(s))
    }

    pub fn stream(&self) -> Stream {
        Stream::from_ptr(self.0 as *const std::ffi::c_void)
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // SAFETY: created in new() and destroyed once.
        let _ = unsafe { cu::cuStreamDestroy_v2(self.0) };
    }
}

/// Proves that stream memory operations work on host-mapped words: the host sets
/// `*ping` to `token`; a fresh stream waits for `ping >= token` and then writes `token`
/// to `pong`; the host waits (at most `limit`) to see it. Err names the step that
/// failed. `ping` and `pong` are the host addresses of words whose device addresses are
/// `dping` and `dpong` in the current context.
///
/// # Safety
/// The words stay mapped and registered until the stream has passed both operations;
/// on a timeout the caller must keep them so (the stream may still run them later).
pub unsafe fn memop_round_trip(
    ping: &std::sync::atomic::AtomicU32,
    pong: &std::sync::atomic::AtomicU32,
    dping: DevPtr,
    dpong: DevPtr,
    token: u32,
    limit: std::time::Duration,
) -> Result<std::time::Duration> {
    use std::sync::atomic::Ordering;
    let t0 = std::time::Instant::now();
    let s = OwnedStream::new()?;
    ping.store(token, Ordering::Release);
    // SAFETY: per the caller; the stream is ours.
    unsafe {
        stream_wait_geq(s.stream(), dping, token)?;
        stream_write(s.stream(), dpong, token)?;
    }
    while pong.load(Ordering::Acquire) != token {
        if t0.elapsed() > limit {
            return Err(Error::unavailable(format!(
                "a stream wait and write on the control words did not complete within {} ms (the device does not see host-mapped memory, or another process holds the GPU that long)",
                limit.as_millis()
            )));
        }
        std::thread::sleep(std::time::Duration::from_micros(20));
    }
    Ok(t0.elapsed())
}

/// Page-locks `[p, p + bytes)` and maps it for the device; returns its device address.
///
/// # Safety
/// The range is host memory of this process that stays mapped until [`unregister_host`];
/// `ctx` is current.
pub unsafe fn register_host_mapped(p: *mut u8, bytes: usize) -> Result<DevPtr> {
    let flags = cu::CU_MEMHOSTREGISTER_PORTABLE | cu::CU_MEMHOSTREGISTER_DEVICEMAP;
    // SAFETY: guaranteed by the caller.
    check(unsafe { cu::cuMemHostRegister_v2(p.cast(), bytes, flags) }, "cuMemHostRegister(DEVICEMAP)")?;
    let mut d: cu::CUdeviceptr = 0;
    // SAFETY: p was just registered with DEVICEMAP; valid out-pointer.
    let rc = unsafe { cu::cuMemHostGetDevicePointer_v2(&mut d, p.cast(), 0) };
    if let Err(e) = check(rc, "cuMemHostGetDevicePointer") {
        // SAFETY: registered above.
        unsafe { cu::cuMemHostUnregister(p.cast()) };
        return Err(e);
    }
    Ok(DevPtr::from_raw(d))
}

/// Enqueues on `stream`: wait until the 32-bit word at device address `addr` is at
/// least `value` (compared cyclically).
///
/// # Safety
/// `addr` is host-mapped or device memory valid until the stream has passed the wait.
pub unsafe fn stream_wait_geq(stream: Stream, addr: DevPtr, value: u32) -> Result<()> {
    // SAFETY: per the caller; flag 0 is CU_STREAM_WAIT_VALUE_GEQ.
    let rc = unsafe { cu::cuStreamWaitValue32_v2(stream.raw(), addr.raw(), value, 0) };
    check(rc, "cuStreamWaitValue32_v2")
}

/// Enqueues on `stream`: store `value` at device address `addr` once the work queued
/// before it is done (its writes visible first).
///
/// # Safety
/// As [`stream_wait_geq`].
pub unsafe fn stream_write(stream: Stream, addr: DevPtr, value: u32) -> Result<()> {
    // SAFETY: per the caller; flag 0 is CU_STREAM_WRITE_VALUE_DEFAULT (with a memory barrier).
    let rc = unsafe { cu::cuStreamWriteValue32_v2(stream.raw(), addr.raw(), value, 0) };
    check(rc, "cuStreamWriteValue32_v2")
}

/// Page-locks `[p, p + bytes)` for fast, asynchronous copies from and to every context
/// (CU_MEMHOSTREGISTER_PORTABLE), keeping its address.
///
/// # Safety
/// `[p, p + bytes)` is host memory of this process that stays mapped until
/// [`unregister_host`].
pub unsafe fn register_host(p: *mut u8, bytes: usize) -> Result<()> {
    let _g = CtxGuard::enter(Ctx::NONE)?;
    // SAFETY: guaranteed by the caller; a context is current.
    let rc = unsafe { cu::cuMemHostRegister_v2(p.cast(), bytes, cu::CU_MEMHOSTREGISTER_PORTABLE) };
    check(rc, &format!("cuMemHostRegister({p:p}, {bytes} bytes)"))
}

/// Undoes [`register_host`] for the range starting at address `p`.
///
/// # Safety
/// `p` was registered by [`register_host`] and is unregistered once.
pub unsafe fn unregister_host(p: usize) -> Result<()> {
    let _g = CtxGuard::enter(Ctx::NONE)?;
    // SAFETY: guaranteed by the caller; a context is current.
    check(unsafe { cu::cuMemHostUnregister(p as *mut std::ffi::c_void) }, "cuMemHostUnregister")
}
