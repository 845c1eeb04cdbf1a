//! The CUDA driver, loaded at run time only (through cudarc's dynamic loading).
//!
//! cudarc panics when its library or a symbol is missing, so nothing here calls it
//! before [`driver`] has checked that the library loads, that every symbol this
//! module uses resolves, and that `cuInit` succeeds. The verdict is cached: on a
//! machine without CUDA, [`present`] costs one relaxed atomic load per call.

use crate::error::{Code, Error, Result};
use cudarc::driver::sys as cu;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// Every driver entry point this module calls; checked once before the first call.
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorString",
    "cuPointerGetAttributes",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuStreamSynchronize",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetPCIBusId",
    "cuDevicePrimaryCtxRetain",
    "cuMemcpy",
    "cuCtxSynchronize",
];

const UNKNOWN: u8 = 0;
const ABSENT: u8 = 1;
const PRESENT: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static PROBE: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// Checks (once) that the driver library, its symbols and a device are there.
fn probe() -> std::result::Result<(), String> {
    // The driver installs libcuda.so.1; two dlopen attempts, not cudarc's thirty-odd
    // candidates, keep the probe cheap where there is no CUDA. The handle stays open
    // so cudarc's own load below finds the library already mapped.
    static LIB: OnceLock<libloading::Library> = OnceLock::new();
    for name in ["libcuda.so.1", "libcuda.so"] {
        // SAFETY: loading the driver library runs its initialisers, which have no preconditions.
        if let Ok(l) = unsafe { libloading::Library::new(name) } {
            let _ = LIB.set(l);
            break;
        }
    }
    // SAFETY: is_culib_present only tries to dlopen candidate names; it never panics.
    if LIB.get().is_none() || !unsafe { cu::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so.1) could be loaded".into());
    }
    // SAFETY: the library is present, so culib() finds it instead of panicking.
    let lib = unsafe { cu::culib() };
    for s in SYMBOLS {
        // SAFETY: only the symbol's address is looked up; nothing is called.
        if unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err() {
            return Err(format!("the CUDA driver library lacks {s}; the driver is too old"));
        }
    }
    // SAFETY: cuInit resolved above; flags must be 0.
    let rc = unsafe { cu::cuInit(0) };
    if rc != cu::CUresult::CUDA_SUCCESS {
        return Err(format!("cuInit failed: {} (no usable GPU or driver)", describe(rc)));
    }
    Ok(())
}

/// Ok when the CUDA driver is usable; otherwise fcclUnavailable saying why.
pub fn driver() -> Result<()> {
    match PROBE.get_or_init(|| {
        let r = probe();
        STATE.store(if r.is_ok() { PRESENT } else { ABSENT }, Ordering::Relaxed);
        r
    }) {
        Ok(()) => Ok(()),
        Err(m) => Err(Error::unavailable(format!("CUDA is not available: {m}"))),
    }
}

/// True when the CUDA driver is usable. After the first call, one relaxed load.
#[inline]
pub fn present() -> bool {
    match STATE.load(Ordering::Relaxed) {
        PRESENT => true,
        ABSENT => false,
        _ => driver().is_ok(),
    }
}

fn describe(rc: cu::CUresult) -> String {
    let mut s: *const std::os::raw::c_char = std::ptr::null();
    // SAFETY: only called once the probe found cuGetErrorString (or from probe after
    // the symbol check); s is a valid out-pointer.
    let ok = unsafe { cu::cuGetErrorString(rc, &mut s) } == cu::CUresult::CUDA_SUCCESS;
    if ok && !s.is_null() {
        // SAFETY: the driver returns a static NUL-terminated string.
        let m = unsafe { std::ffi::CStr::from_ptr(s) }.to_string_lossy();
        format!("{m} ({rc:?})")
    } else {
        format!("{rc:?}")
    }
}

/// Maps a driver result to ours, naming the call.
fn check(rc: cu::CUresult, what: &str) -> Result<()> {
    if rc == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(Code::UnhandledCudaError, format!("{what} failed: {}", describe(rc))))
    }
}

/// What the driver says about one pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtrInfo {
    /// CU_MEMORYTYPE_* (0 when the driver does not know the pointer: plain host memory).
    pub mem_type: u32,
    pub managed: bool,
    pub device: i32,
    /// The context the memory belongs to (as an integer; 0 for plain host memory).
    pub ctx: usize,
}

/// Asks the driver about `p`. Unknown pointers are not an error: they are host memory.
pub fn pointer_info(p: *const u8) -> Result<PtrInfo> {
    driver()?;
    let mut mem_type: u32 = 0;
    // IS_MANAGED is a boolean the driver may write as 1 or 4 bytes: zeroed 4 bytes read right either way.
    let mut managed: u32 = 0;
    let mut device: i32 = -1;
    let mut ctx: cu::CUcontext = std::ptr::null_mut();
    let mut attrs = [
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
    ];
    // The driver writes each attribute's value through these.
    let mut data: [*mut std::ffi::c_void; 4] = [
        (&mut mem_type as *mut u32).cast(),
        (&mut managed as *mut u32).cast(),
        (&mut device as *mut i32).cast(),
        (&mut ctx as *mut cu::CUcontext).cast(),
    ];
    // SAFETY: the driver is loaded; attrs and data have 4 entries, each data slot is
    // large enough for its attribute's value.
    let rc = unsafe { cu::cuPointerGetAttributes(4, attrs.as_mut_ptr(), data.as_mut_ptr(), p as u64) };
    check(rc, "cuPointerGetAttributes")?;
    Ok(PtrInfo { mem_type, managed: managed != 0, device, ctx: ctx as usize })
}

/// Pushes a context on this thread for as long as the guard lives.
pub struct CtxGuard {
    pushed: bool,
}

impl CtxGuard {
    /// Makes `ctx` current (0: keep the current one, or device 0's primary context
    /// if there is none, the way the runtime API picks a device).
    pub fn enter(ctx: usize) -> Result<CtxGuard> {
        driver()?;
        let ctx = if ctx != 0 {
            ctx as cu::CUcontext
        } else {
            let mut cur: cu::CUcontext = std::ptr::null_mut();
            // SAFETY: valid out-pointer; driver checked.
            check(unsafe { cu::cuCtxGetCurrent(&mut cur) }, "cuCtxGetCurrent")?;
            if !cur.is_null() {
                return Ok(CtxGuard { pushed: false });
            }
            primary_context(0)? as cu::CUcontext
        };
        // SAFETY: ctx is a live context (from the driver); popped in drop.
        check(unsafe { cu::cuCtxPushCurrent_v2(ctx) }, "cuCtxPushCurrent")?;
        Ok(CtxGuard { pushed: true })
    }
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if self.pushed {
            let mut old: cu::CUcontext = std::ptr::null_mut();
            // SAFETY: pops the context pushed in enter, on the same thread.
            let _ = unsafe { cu::cuCtxPopCurrent_v2(&mut old) };
        }
    }
}

/// Device `ordinal`'s primary context, retained for the life of the process.
pub fn primary_context(ordinal: i32) -> Result<usize> {
    driver()?;
    let mut dev: cu::CUdevice = 0;
    // SAFETY: valid out-pointer.
    check(unsafe { cu::cuDeviceGet(&mut dev, ordinal) }, &format!("cuDeviceGet({ordinal})"))?;
    let mut ctx: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the retain is never released (the context lives as long as the process).
    check(unsafe { cu::cuDevicePrimaryCtxRetain(&mut ctx, dev) }, "cuDevicePrimaryCtxRetain")?;
    Ok(ctx as usize)
}

/// Number of visible devices (0 when CUDA is absent).
pub fn device_count() -> usize {
    if !present() {
        return 0;
    }
    let mut n = 0;
    // SAFETY: valid out-pointer; driver present.
    if unsafe { cu::cuDeviceGetCount(&mut n) } != cu::CUresult::CUDA_SUCCESS {
        return 0;
    }
    n.max(0) as usize
}

/// The device of the calling thread's current context, if it has one.
pub fn current_device() -> Option<i32> {
    if !present() {
        return None;
    }
    let mut cur: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointers; driver present.
    unsafe {
        if cu::cuCtxGetCurrent(&mut cur) != cu::CUresult::CUDA_SUCCESS || cur.is_null() {
            return None;
        }
        let mut dev: cu::CUdevice = -1;
        if cu::cuCtxGetDevice(&mut dev) != cu::CUresult::CUDA_SUCCESS {
            return None;
        }
        Some(dev)
    }
}

/// A device's PCI bus id ("0000:3b:00.0"), the same in every process whatever
/// CUDA_VISIBLE_DEVICES says, so ranks can tell whether they share a GPU.
pub fn bus_id(ordinal: i32) -> Result<String> {
    driver()?;
    let mut dev: cu::CUdevice = 0;
    // SAFETY: valid out-pointer.
    check(unsafe { cu::cuDeviceGet(&mut dev, ordinal) }, "cuDeviceGet")?;
    let mut buf = [0 as std::os::raw::c_char; 32];
    // SAFETY: buf has room for len bytes.
    check(unsafe { cu::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) }, "cuDeviceGetPCIBusId")?;
    // SAFETY: the driver wrote a NUL-terminated string into buf.
    Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// Device memory on the current context (device 0's primary context if none).
pub fn alloc_device(size: usize) -> Result<(*mut u8, usize)> {
    let _g = CtxGuard::enter(0)?;
    let ctx = current_ctx()?;
    let mut d: cu::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; a context is current.
    check(unsafe { cu::cuMemAlloc_v2(&mut d, size) }, &format!("cuMemAlloc({size} bytes)"))?;
    Ok((d as usize as *mut u8, ctx))
}

/// Pinned (page-locked, portable) host memory.
pub fn alloc_pinned(size: usize) -> Result<(*mut u8, usize)> {
    let _g = CtxGuard::enter(0)?;
    let ctx = current_ctx()?;
    let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; a context is current.
    let rc = unsafe { cu::cuMemHostAlloc(&mut p, size, cu::CU_MEMHOSTALLOC_PORTABLE) };
    check(rc, &format!("cuMemHostAlloc({size} bytes)"))?;
    Ok((p as *mut u8, ctx))
}

fn current_ctx() -> Result<usize> {
    let mut cur: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    check(unsafe { cu::cuCtxGetCurrent(&mut cur) }, "cuCtxGetCurrent")?;
    Ok(cur as usize)
}

/// Frees memory from [`alloc_device`] (device) or [`alloc_pinned`] (!device).
///
/// # Safety
/// `p` (an address) came from that function with context `ctx` and is freed once.
pub unsafe fn free(p: usize, ctx: usize, device: bool) -> Result<()> {
    let _g = CtxGuard::enter(ctx)?;
    // SAFETY: guaranteed by the caller.
    let rc = unsafe {
        if device {
            cu::cuMemFree_v2(p as cu::CUdeviceptr)
        } else {
            cu::cuMemFreeHost(p as *mut std::ffi::c_void)
        }
    };
    check(rc, if device { "cuMemFree" } else { "cuMemFreeHost" })
}

/// Copies device (or managed) memory to host memory, ordered on `stream`.
///
/// # Safety
/// `src` is device-accessible for `bytes`, `dst` host memory writable for `bytes`
/// until the stream has passed the copy; a context is current.
pub unsafe fn copy_dtoh_async(dst: *mut u8, src: *const u8, bytes: usize, stream: usize) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    let rc = unsafe { cu::cuMemcpyDtoHAsync_v2(dst.cast(), src as usize as u64, bytes, stream as cu::CUstream) };
    check(rc, "cuMemcpyDtoHAsync")
}

/// Copies host memory to device memory, ordered on `stream`.
///
/// # Safety
/// As [`copy_dtoh_async`], the other way round.
pub unsafe fn copy_htod_async(dst: *mut u8, src: *const u8, bytes: usize, stream: usize) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    let rc = unsafe { cu::cuMemcpyHtoDAsync_v2(dst as usize as u64, src.cast(), bytes, stream as cu::CUstream) };
    check(rc, "cuMemcpyHtoDAsync")
}

/// Copies `bytes` from host to device memory and waits (on the current context, or
/// device 0's primary context if none; ordered after the legacy default stream).
///
/// # Safety
/// `dst` is device memory and `src` host memory, each valid for `bytes`.
pub unsafe fn copy_to_device(dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
    let _g = CtxGuard::enter(0)?;
    // SAFETY: guaranteed by the caller; synchronised before returning.
    unsafe { copy_htod_async(dst, src, bytes, 0)? };
    sync(0)
}

/// Copies `bytes` from device to host memory and waits (as [`copy_to_device`]).
///
/// # Safety
/// `src` is device memory and `dst` host memory, each valid for `bytes`.
pub unsafe fn copy_to_host(dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
    let _g = CtxGuard::enter(0)?;
    // SAFETY: guaranteed by the caller; synchronised before returning.
    unsafe { copy_dtoh_async(dst, src, bytes, 0)? };
    sync(0)
}

/// Copies `bytes` between any two buffers of this process (host or device: the
/// driver tells them apart by address) in context `ctx`, and returns when done.
///
/// # Safety
/// Both ranges are valid for `bytes` and do not overlap.
pub unsafe fn copy_sync(dst: *mut u8, src: *const u8, bytes: usize, ctx: usize) -> Result<()> {
    let _g = CtxGuard::enter(ctx)?;
    // SAFETY: guaranteed by the caller; with unified addressing cuMemcpy infers the
    // direction from the pointers and completes before returning for these copies.
    check(unsafe { cu::cuMemcpy(dst as usize as u64, src as usize as u64, bytes) }, "cuMemcpy")?;
    // Host-to-device copies from pageable memory may return before the DMA ends.
    // SAFETY: the legacy default stream of the context pushed above.
    check(unsafe { cu::cuCtxSynchronize() }, "cuCtxSynchronize")
}

/// Device-to-device copy ordered on `stream`.
///
/// # Safety
/// Both ranges are device memory valid for `bytes` in the current context until the
/// stream has run the copy; [`ipc_ready`] succeeded.
pub unsafe fn copy_dtod_async(dst: *mut u8, src: *const u8, bytes: usize, stream: usize) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    let rc =
        unsafe { cu::cuMemcpyDtoDAsync_v2(dst as usize as u64, src as usize as u64, bytes, stream as cu::CUstream) };
    check(rc, "cuMemcpyDtoDAsync")
}

const IPC_SYMBOLS: &[&str] =
    &["cuIpcGetMemHandle", "cuIpcOpenMemHandle_v2", "cuMemGetAddressRange_v2", "cuMemcpyDtoDAsync_v2"];

/// Ok when the driver has what CUDA IPC between processes needs.
pub fn ipc_ready() -> Result<()> {
    static R: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    R.get_or_init(|| {
        driver().map_err(|e| e.msg)?;
        // SAFETY: the driver is present; only addresses are looked up.
        let lib = unsafe { cu::culib() };
        for s in IPC_SYMBOLS {
            // SAFETY: as above.
            if unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err() {
                return Err(format!("the CUDA driver lacks {s}"));
            }
        }
        Ok(())
    })
    .clone()
    .map_err(|m| Error::unavailable(format!("CUDA IPC is unavailable: {m}")))
}

/// The IPC handle of the allocation holding `p`, and `p`'s offset in it. Fails for
/// memory IPC cannot share (managed, cuMemMap, pinned host).
pub fn ipc_handle(p: *const u8) -> Result<([u8; 64], usize)> {
    ipc_ready()?;
    let (mut base, mut size): (cu::CUdeviceptr, usize) = (0, 0);
    // SAFETY: valid out-pointers; a context is current (caller's guard).
    check(unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, p as usize as u64) }, "cuMemGetAddressRange")?;
    let mut h = cu::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: base is the start of a device allocation (from the driver).
    check(unsafe { cu::cuIpcGetMemHandle(&mut h, base) }, "cuIpcGetMemHandle")?;
    Ok((h.reserved.map(|c| c as u8), p as usize - base as usize))
}

/// Mappings of peers' allocations in this process: (context, handle) -> base.
/// Kept open: opening costs far more than a collective, and a freed and reused
/// allocation comes with a new handle.
type IpcKey = (usize, [u8; 64]);
static IPC_OPEN: std::sync::Mutex<Option<std::collections::HashMap<IpcKey, usize>>> = std::sync::Mutex::new(None);

/// Maps a peer process's allocation into the current context (cached).
pub fn ipc_open(ctx: usize, handle: &[u8; 64]) -> Result<usize> {
    ipc_ready()?;
    let mut map = IPC_OPEN.lock().unwrap_or_else(|p| p.into_inner());
    let map = map.get_or_insert_with(Default::default);
    if let Some(&b) = map.get(&(ctx, *handle)) {
        return Ok(b);
    }
    let h = cu::CUipcMemHandle { reserved: handle.map(|b| b as std::os::raw::c_char) };
    let mut base: cu::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; the handle came from a peer's cuIpcGetMemHandle.
    let rc = unsafe {
        cu::cuIpcOpenMemHandle_v2(&mut base, h, 1 /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */)
    };
    check(rc, "cuIpcOpenMemHandle")?;
    map.insert((ctx, *handle), base as usize);
    Ok(base as usize)
}

/// Waits for everything queued on `stream`.
pub fn sync(stream: usize) -> Result<()> {
    // SAFETY: the stream handle is the caller's (0 = the legacy default stream).
    check(unsafe { cu::cuStreamSynchronize(stream as cu::CUstream) }, "cuStreamSynchronize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_driver_is_unavailable_not_a_panic() {
        // On machines without CUDA (CI) the probe reports why; with CUDA it passes.
        match driver() {
            Ok(()) => assert!(present()),
            Err(e) => {
                assert_eq!(e.code, Code::Unavailable);
                assert!(e.msg.contains("CUDA is not available"), "{}", e.msg);
                assert!(!present());
                assert_eq!(device_count(), 0);
                assert_eq!(current_device(), None);
                assert_eq!(alloc_device(64).unwrap_err().code, Code::Unavailable);
            }
        }
    }
}
