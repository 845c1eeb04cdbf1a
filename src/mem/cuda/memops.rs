//! Host memory the device can reach (page-locked, mapped) and the stream memory
//! operations that wait for and write 32-bit words in it.

use super::*;

const MEMOP_SYMBOLS: &[&str] = &[
    "cuStreamWaitValue32_v2",
    "cuStreamWriteValue32_v2",
    "cuMemHostRegister_v2",
    "cuMemHostGetDevicePointer_v2",
    "cuMemHostUnregister",
    "cuIpcCloseMemHandle",
];

/// Ok when the driver and `device` support stream memory operations (waits and
/// writes of 32-bit words in host-mapped memory, ordered on a stream).
pub fn memops_ready(device: i32) -> Result<()> {
    ipc_ready()?;
    static SYMS: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    SYMS.get_or_init(|| {
        // SAFETY: the driver is present (ipc_ready); only addresses are looked up.
        let lib = unsafe { cu::culib() };
        for s in MEMOP_SYMBOLS {
            // SAFETY: as above.
            if unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err() {
                return Err(format!("the CUDA driver lacks {s}"));
            }
        }
        Ok(())
    })
    .clone()
    .map_err(|m| Error::unavailable(format!("stream memory operations are unavailable: {m}")))?;
    let mut ok = 0;
    // SAFETY: valid out-pointer; device is an ordinal from the driver.
    let rc = unsafe {
        cu::cuDeviceGetAttribute(&mut ok, cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, device)
    };
    if rc != cu::CUresult::CUDA_SUCCESS || ok == 0 {
        return Err(Error::unavailable(format!(
            "device {device} does not support stream memory operations (CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1)"
        )));
    }
    Ok(())
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
    check(rc, "cuStreamWaitValue32")
}

/// Enqueues on `stream`: store `value` at device address `addr` once the work queued
/// before it is done (its writes visible first).
///
/// # Safety
/// As [`stream_wait_geq`].
pub unsafe fn stream_write(stream: Stream, addr: DevPtr, value: u32) -> Result<()> {
    // SAFETY: per the caller; flag 0 is CU_STREAM_WRITE_VALUE_DEFAULT (with a memory barrier).
    let rc = unsafe { cu::cuStreamWriteValue32_v2(stream.raw(), addr.raw(), value, 0) };
    check(rc, "cuStreamWriteValue32")
}

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
