//! The CUDA driver, loaded at run time only (through cudarc's dynamic loading).
//!
//! A process that never used CUDA pays nothing for it: the library does not load or
//! initialise the driver until the program has (no device pointer can exist before
//! somebody called `cuInit`), or until a call needs CUDA by itself (`fcclMemAlloc`, a
//! device list, the NCCL backend). [`active`] answers per call: one relaxed atomic
//! load once CUDA is in use or known unusable; before that, a glance at the loader's
//! count of loaded libraries (a few nanoseconds) and, only once libcuda is mapped, one
//! driver call that reports whether it was initialised.
//!
//! cudarc panics when its library or a symbol is missing, so nothing here calls it
//! before [`driver`] has checked that the library loads, that every symbol this
//! module uses resolves, and that `cuInit` succeeds.

use crate::error::{Code, Error, Result};
use cudarc::driver::sys as cu;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

mod copy;
mod handles;
mod ipc;
mod memops;
mod scratch;
mod vmm;
pub use copy::*;
pub use handles::{Ctx, DevPtr, Stream};
pub use ipc::*;
pub use memops::*;
pub use scratch::*;
pub use vmm::*;

/// Every driver entry point this module calls; checked once before the first call.
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorString",
    "cuPointerGetAttributes",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpy2DAsync_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxGetDevice",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetAttribute",
    "cuDeviceGetPCIBusId",
    "cuDevicePrimaryCtxRetain",
    "cuMemcpy",
    "cuCtxSynchronize",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuStreamWaitEvent",
    "cuStreamIsCapturing",
];

/// Stream-ordered allocation (CUDA 11.2+); without it scratch memory is freed after a
/// stream synchronisation instead.
const ASYNC_ALLOC_SYMBOLS: &[&str] = &["cuMemAllocAsync", "cuMemFreeAsync"];

/// Nobody in this process has initialised CUDA (yet): every buffer is host memory.
const UNUSED: u8 = 0;
/// CUDA was needed and cannot be used (no driver, no device, a driver too old).
const ABSENT: u8 = 1;
/// Initialised and usable.
const PRESENT: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNUSED);
static PROBE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
/// The loader's count of libraries loaded so far, when [`active`] last looked.
static SEEN_LOADS: AtomicU64 = AtomicU64::new(u64::MAX);
/// cuCtxGetCurrent of a libcuda this process mapped but nobody initialised yet.
static UNINIT_PROBE: AtomicUsize = AtomicUsize::new(0);

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

/// Loads and initialises the driver if nothing has yet (for calls that need CUDA by
/// themselves). Ok when it is usable; otherwise fcclUnavailable saying why.
pub fn driver() -> Result<()> {
    match PROBE.get_or_init(|| {
        let r = probe();
        STATE.store(if r.is_ok() { PRESENT } else { ABSENT }, Ordering::Release);
        r
    }) {
        Ok(()) => Ok(()),
        Err(m) => Err(Error::unavailable(format!("CUDA is not available: {m}"))),
    }
}

/// True when CUDA is in use in this process (somebody initialised the driver) and
/// usable, so buffers may be device memory. Never loads or initialises the driver.
#[inline]
pub fn active() -> bool {
    match STATE.load(Ordering::Relaxed) {
        PRESENT => true,
        ABSENT => false,
        _ => started_elsewhere(),
    }
}

/// Whether the program has started CUDA since the last look (then it is probed).
#[inline(never)]
fn started_elsewhere() -> bool {
    let mut get_current = UNINIT_PROBE.load(Ordering::Acquire);
    if get_current == 0 {
        // The driver can only have been initialised after it was loaded.
        let loads = loaded_libraries();
        if SEEN_LOADS.load(Ordering::Acquire) == loads {
            // A look at this many libraries is complete: it stored the entry first if it
            // found the driver.
            get_current = UNINIT_PROBE.load(Ordering::Acquire);
            if get_current == 0 {
                return false;
            }
        } else {
            // One thread looks at a time, and says it looked only once it has: a thread
            // told "seen" while another still probed would answer no while CUDA is in use
            // (ranks as threads creating their communicators at once).
            static LOOKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
            let _one = LOOKING.lock().unwrap_or_else(|p| p.into_inner());
            get_current = UNINIT_PROBE.load(Ordering::Acquire);
            if get_current == 0 {
                if let Some(f) = mapped_driver_entry() {
                    UNINIT_PROBE.store(f, Ordering::Release);
                    get_current = f;
                }
                SEEN_LOADS.store(loads, Ordering::Release);
                if get_current == 0 {
                    return false;
                }
            }
        }
    }
    // SAFETY: get_current is cuCtxGetCurrent of a libcuda that stays mapped (the
    // handle that found it is never closed); its signature is the driver API's.
    let f: unsafe extern "C" fn(*mut cu::CUcontext) -> cu::CUresult = unsafe { std::mem::transmute(get_current) };
    let mut ctx: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer. Before cuInit the driver answers NOT_INITIALIZED and does nothing else.
    if unsafe { f(&mut ctx) } == cu::CUresult::CUDA_ERROR_NOT_INITIALIZED {
        return false;
    }
    driver().is_ok()
}

/// The loader's running count of libraries loaded into this process.
fn loaded_libraries() -> u64 {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        out: *mut libc::c_void,
    ) -> libc::c_int {
        let have = std::mem::offset_of!(libc::dl_phdr_info, dlpi_adds) + std::mem::size_of::<u64>();
        if size >= have {
            // SAFETY: the loader passes a valid info of `size` bytes, which covers dlpi_adds;
            // out is the u64 below.
            unsafe { *(out as *mut u64) = (*info).dlpi_adds };
        }
        1 // every object carries the same counters: the first is enough
    }
    let mut adds: u64 = 0;
    // SAFETY: the callback only reads the info it is given and writes `adds`.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut adds as *mut u64).cast()) };
    adds
}

/// cuCtxGetCurrent of the CUDA driver if this process has it mapped (never maps it).
fn mapped_driver_entry() -> Option<usize> {
    // SAFETY: RTLD_NOLOAD only looks the library up among those already loaded.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if h.is_null() {
        return None;
    }
    // SAFETY: h is a live handle (kept open: the driver stays mapped); the name is NUL-terminated.
    let f = unsafe { libc::dlsym(h, c"cuCtxGetCurrent".as_ptr()) };
    (!f.is_null()).then_some(f as usize)
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
    /// The context the memory belongs to (Ctx::NONE for plain host memory).
    pub ctx: Ctx,
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
    Ok(PtrInfo { mem_type, managed: managed != 0, device, ctx: Ctx::from_raw(ctx) })
}

/// The driver's identity of the allocation holding `p` (CU_POINTER_ATTRIBUTE_BUFFER_ID:
/// never reused within a process), or None when `p` is no longer allocated.
pub fn buffer_id(p: *const u8) -> Option<u64> {
    let mut id: u64 = 0;
    // SAFETY: valid out-pointer of the attribute's size (unsigned long long).
    let rc = unsafe {
        cu::cuPointerGetAttribute(
            (&mut id as *mut u64).cast(),
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
            p as u64,
        )
    };
    (rc == cu::CUresult::CUDA_SUCCESS).then_some(id)
}

/// Pushes a context on this thread for as long as the guard lives.
pub struct CtxGuard {
    pushed: bool,
}

impl CtxGuard {
    /// Makes `ctx` current (Ctx::NONE: keep the current one, or device 0's primary context
    /// if there is none, the way the runtime API picks a device).
    pub fn enter(ctx: Ctx) -> Result<CtxGuard> {
        driver()?;
        let ctx = if !ctx.is_none() {
            ctx.raw()
        } else {
            let mut cur: cu::CUcontext = std::ptr::null_mut();
            // SAFETY: valid out-pointer; driver checked.
            check(unsafe { cu::cuCtxGetCurrent(&mut cur) }, "cuCtxGetCurrent")?;
            if !cur.is_null() {
                return Ok(CtxGuard { pushed: false });
            }
            primary_context(0)?.raw()
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
pub fn primary_context(ordinal: i32) -> Result<Ctx> {
    driver()?;
    let mut dev: cu::CUdevice = 0;
    // SAFETY: valid out-pointer.
    check(unsafe { cu::cuDeviceGet(&mut dev, ordinal) }, &format!("cuDeviceGet({ordinal})"))?;
    let mut ctx: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the retain is never released (the context lives as long as the process).
    check(unsafe { cu::cuDevicePrimaryCtxRetain(&mut ctx, dev) }, "cuDevicePrimaryCtxRetain")?;
    Ok(Ctx::from_raw(ctx))
}

/// Device `ordinal`'s compute capability (major, minor).
pub fn compute_capability(ordinal: i32) -> Result<(i32, i32)> {
    driver()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out-pointers; the driver is loaded.
    unsafe {
        check(
            cu::cuDeviceGetAttribute(
                &mut major,
                cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                ordinal,
            ),
            "cuDeviceGetAttribute",
        )?;
        check(
            cu::cuDeviceGetAttribute(
                &mut minor,
                cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                ordinal,
            ),
            "cuDeviceGetAttribute",
        )?;
    }
    Ok((major, minor))
}

/// How many blocks of `threads` threads device `ordinal` holds at once: its SMs times
/// the blocks one SM fits by threads (registers and shared memory permitting).
pub fn resident_blocks(ordinal: i32, threads: u32) -> Result<u32> {
    driver()?;
    let (mut sms, mut per_sm) = (0, 0);
    // SAFETY: valid out-pointers; the driver is loaded.
    unsafe {
        check(
            cu::cuDeviceGetAttribute(
                &mut sms,
                cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                ordinal,
            ),
            "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)",
        )?;
        check(
            cu::cuDeviceGetAttribute(
                &mut per_sm,
                cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
                ordinal,
            ),
            "cuDeviceGetAttribute(MAX_THREADS_PER_MULTIPROCESSOR)",
        )?;
    }
    Ok((sms.max(1) as u32) * (per_sm.max(threads as i32) as u32 / threads.max(1)))
}

/// Number of visible devices (0 when CUDA is absent).
pub fn device_count() -> usize {
    if !active() {
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
    if !active() {
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
pub fn alloc_device(size: usize) -> Result<(*mut u8, Ctx)> {
    let _g = CtxGuard::enter(Ctx::NONE)?;
    let ctx = current_ctx()?;
    let mut d: cu::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; a context is current.
    check(unsafe { cu::cuMemAlloc_v2(&mut d, size) }, &format!("cuMemAlloc({size} bytes)"))?;
    Ok((d as usize as *mut u8, ctx))
}

fn current_ctx() -> Result<Ctx> {
    let mut cur: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    check(unsafe { cu::cuCtxGetCurrent(&mut cur) }, "cuCtxGetCurrent")?;
    Ok(Ctx::from_raw(cur))
}

/// Frees memory from [`alloc_device`].
///
/// # Safety
/// `p` (an address) came from that function with context `ctx` and is freed once.
pub unsafe fn free_device(p: usize, ctx: Ctx) -> Result<()> {
    let _g = CtxGuard::enter(ctx)?;
    // SAFETY: guaranteed by the caller.
    check(unsafe { cu::cuMemFree_v2(p as cu::CUdeviceptr) }, "cuMemFree")
}

/// Makes `ctx` the calling thread's current context (cudaSetDevice's effect).
pub fn set_current(ctx: Ctx) -> Result<()> {
    driver()?;
    // SAFETY: ctx is a context handle from the driver (or NULL, which unsets).
    check(unsafe { cu::cuCtxSetCurrent(ctx.raw()) }, "cuCtxSetCurrent")
}

/// A CUDA event of the current context (no timing), destroyed on drop: marks a point
/// on a stream that the host can wait for.
pub struct Event(cu::CUevent);

// SAFETY: an event handle may be used from any thread of the process.
unsafe impl Send for Event {}

impl Event {
    /// A new event in the current context.
    pub fn new() -> Result<Event> {
        let mut e: cu::CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; a context is current (the caller's guard).
        let rc = unsafe { cu::cuEventCreate(&mut e, cu::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as u32) };
        check(rc, "cuEventCreate")?;
        Ok(Event(e))
    }

    /// Marks the point after everything queued on `stream` so far.
    pub fn record(&self, stream: Stream) -> Result<()> {
        // SAFETY: a live event; the stream is the caller's, of the event's context.
        check(unsafe { cu::cuEventRecord(self.0, stream.raw()) }, "cuEventRecord")
    }

    /// Makes the work queued on `stream` from now on wait for the last recorded point
    /// (on the GPU; the host does not wait).
    pub fn wait_on(&self, stream: Stream) -> Result<()> {
        // SAFETY: a live event; the stream is the caller's (flags must be 0).
        check(unsafe { cu::cuStreamWaitEvent(stream.raw(), self.0, 0) }, "cuStreamWaitEvent")
    }

    /// Waits until the stream has passed the last recorded point.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live event.
        check(unsafe { cu::cuEventSynchronize(self.0) }, "cuEventSynchronize")
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by new() and destroyed once; the driver releases it once its
        // pending record completes.
        let _ = unsafe { cu::cuEventDestroy_v2(self.0) };
    }
}
/// Whether everything queued on `stream` is done (cuStreamQuery), without waiting.
pub fn stream_done(stream: Stream) -> Result<bool> {
    // SAFETY: the stream handle is the caller's (0 = the legacy default stream).
    match unsafe { cu::cuStreamQuery(stream.raw()) } {
        cu::CUresult::CUDA_SUCCESS => Ok(true),
        cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        rc => check(rc, "cuStreamQuery").map(|_| false),
    }
}

/// Whether contexts on `device` are shared through MPS (CU_DEVICE_ATTRIBUTE_MPS_ENABLED,
/// CUDA 12.3+); None when the driver does not know the attribute.
pub fn mps_enabled(device: i32) -> Option<bool> {
    driver().ok()?;
    let mut v = 0;
    // SAFETY: valid out-pointer; device is an ordinal from the driver.
    let rc =
        unsafe { cu::cuDeviceGetAttribute(&mut v, cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED, device) };
    (rc == cu::CUresult::CUDA_SUCCESS).then_some(v != 0)
}

/// Whether work enqueued on `stream` now would be recorded into a CUDA graph (stream
/// capture, active or already invalidated) instead of running. The legacy default stream
/// while a blocking stream of its context captures counts as captured too: the driver
/// refuses any use of it then (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT).
pub fn capturing(stream: Stream) -> Result<bool> {
    let mut status: u32 = 0;
    // SAFETY: the stream handle is the caller's (0 = the legacy default stream); the
    // status is written as a 32-bit enum into an integer, so no value is invalid here.
    let rc = unsafe { cu::cuStreamIsCapturing(stream.raw(), (&mut status as *mut u32).cast()) };
    match rc {
        cu::CUresult::CUDA_SUCCESS => Ok(status != cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE as u32),
        cu::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => Ok(true),
        rc => check(rc, "cuStreamIsCapturing").map(|_| false),
    }
}

/// Waits for everything queued on `stream`.
pub fn sync(stream: Stream) -> Result<()> {
    // SAFETY: the stream handle is the caller's (0 = the legacy default stream).
    check(unsafe { cu::cuStreamSynchronize(stream.raw()) }, "cuStreamSynchronize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_driver_is_unavailable_not_a_panic() {
        // On machines without CUDA (CI) the probe reports why; with CUDA it passes.
        match driver() {
            Ok(()) => assert!(active()),
            Err(e) => {
                assert_eq!(e.code, Code::Unavailable);
                assert!(e.msg.contains("CUDA is not available"), "{}", e.msg);
                assert!(!active());
                assert_eq!(device_count(), 0);
                assert_eq!(current_device(), None);
                assert_eq!(alloc_device(64).unwrap_err().code, Code::Unavailable);
            }
        }
    }
}
