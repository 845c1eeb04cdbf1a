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
        if SEEN_LOADS.swap(loads, Ordering::Relaxed) == loads {
            return false;
        }
        match mapped_driver_entry() {
            Some(f) => {
                UNINIT_PROBE.store(f, Ordering::Release);
                get_current = f;
            }
            None => return false,
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
pub fn alloc_device(size: usize) -> Result<(*mut u8, usize)> {
    let _g = CtxGuard::enter(0)?;
    let ctx = current_ctx()?;
    let mut d: cu::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; a context is current.
    check(unsafe { cu::cuMemAlloc_v2(&mut d, size) }, &format!("cuMemAlloc({size} bytes)"))?;
    Ok((d as usize as *mut u8, ctx))
}

fn current_ctx() -> Result<usize> {
    let mut cur: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    check(unsafe { cu::cuCtxGetCurrent(&mut cur) }, "cuCtxGetCurrent")?;
    Ok(cur as usize)
}

/// Frees memory from [`alloc_device`].
///
/// # Safety
/// `p` (an address) came from that function with context `ctx` and is freed once.
pub unsafe fn free_device(p: usize, ctx: usize) -> Result<()> {
    let _g = CtxGuard::enter(ctx)?;
    // SAFETY: guaranteed by the caller.
    check(unsafe { cu::cuMemFree_v2(p as cu::CUdeviceptr) }, "cuMemFree")
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
pub unsafe fn register_host_mapped(p: *mut u8, bytes: usize) -> Result<usize> {
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
    Ok(d as usize)
}

/// Enqueues on `stream`: wait until the 32-bit word at device address `addr` is at
/// least `value` (compared cyclically).
///
/// # Safety
/// `addr` is host-mapped or device memory valid until the stream has passed the wait.
pub unsafe fn stream_wait_geq(stream: usize, addr: usize, value: u32) -> Result<()> {
    // SAFETY: per the caller; flag 0 is CU_STREAM_WAIT_VALUE_GEQ.
    let rc = unsafe { cu::cuStreamWaitValue32_v2(stream as cu::CUstream, addr as cu::CUdeviceptr, value, 0) };
    check(rc, "cuStreamWaitValue32")
}

/// Enqueues on `stream`: store `value` at device address `addr` once the work queued
/// before it is done (its writes visible first).
///
/// # Safety
/// As [`stream_wait_geq`].
pub unsafe fn stream_write(stream: usize, addr: usize, value: u32) -> Result<()> {
    // SAFETY: per the caller; flag 0 is CU_STREAM_WRITE_VALUE_DEFAULT (with a memory barrier).
    let rc = unsafe { cu::cuStreamWriteValue32_v2(stream as cu::CUstream, addr as cu::CUdeviceptr, value, 0) };
    check(rc, "cuStreamWriteValue32")
}

/// Makes `ctx` the calling thread's current context (cudaSetDevice's effect).
pub fn set_current(ctx: usize) -> Result<()> {
    driver()?;
    // SAFETY: ctx is a context handle from the driver (or NULL, which unsets).
    check(unsafe { cu::cuCtxSetCurrent(ctx as cu::CUcontext) }, "cuCtxSetCurrent")
}

/// Page-locks host memory for fast, asynchronous copies from and to every context
/// (CU_MEMHOSTREGISTER_PORTABLE), keeping its address.
///
/// # Safety
/// `[p, p + bytes)` is host memory of this process that stays mapped until
/// [`unregister_host`].
pub unsafe fn register_host(p: *mut u8, bytes: usize) -> Result<()> {
    let _g = CtxGuard::enter(0)?;
    // SAFETY: guaranteed by the caller; a context is current.
    let rc = unsafe { cu::cuMemHostRegister_v2(p.cast(), bytes, cu::CU_MEMHOSTREGISTER_PORTABLE) };
    check(rc, &format!("cuMemHostRegister({p:p}, {bytes} bytes)"))
}

/// Undoes [`register_host`] for the range starting at address `p`.
///
/// # Safety
/// `p` was registered by [`register_host`] and is unregistered once.
pub unsafe fn unregister_host(p: usize) -> Result<()> {
    let _g = CtxGuard::enter(0)?;
    // SAFETY: guaranteed by the caller; a context is current.
    check(unsafe { cu::cuMemHostUnregister(p as *mut std::ffi::c_void) }, "cuMemHostUnregister")
}

/// Copies `rows` rows of `width` bytes between device buffers whose rows start
/// `src_pitch` and `dst_pitch` bytes apart, ordered on `stream`.
///
/// # Safety
/// Every row lies inside device memory of the current context, valid until the
/// stream has run the copy; source and destination do not overlap.
pub unsafe fn copy_2d_dtod_async(
    dst: *mut u8,
    dst_pitch: usize,
    src: *const u8,
    src_pitch: usize,
    width: usize,
    rows: usize,
    stream: usize,
) -> Result<()> {
    let (d, s) = (
        Side { ptr: dst as usize, pitch: dst_pitch, host: false },
        Side { ptr: src as usize, pitch: src_pitch, host: false },
    );
    // SAFETY: forwarded contract.
    unsafe { copy_2d_async(d, s, width, rows, stream) }
}

/// One side of a 2D copy: where its first row starts, how far apart rows are, and
/// whether it is host memory (page-locked, or the copy is not asynchronous).
#[derive(Clone, Copy, Debug)]
pub struct Side {
    pub ptr: usize,
    pub pitch: usize,
    pub host: bool,
}

/// Copies `rows` rows of `width` bytes from `src` to `dst`, ordered on `stream`:
/// one cuMemcpy2DAsync (row by row where a pitch is too wide for it).
///
/// # Safety
/// Every row of each side lies inside memory of its kind (device memory of the
/// current context, or host memory), valid until the stream has run the copy; the
/// two sides do not overlap.
pub unsafe fn copy_2d_async(dst: Side, src: Side, width: usize, rows: usize, stream: usize) -> Result<()> {
    if width == 0 || rows == 0 {
        return Ok(());
    }
    // cuMemcpy2D takes pitches below 2^31 (CU_DEVICE_ATTRIBUTE_MAX_PITCH); wider
    // tensors go row by row.
    const MAX_PITCH: usize = i32::MAX as usize;
    if rows == 1 || src.pitch > MAX_PITCH || dst.pitch > MAX_PITCH {
        for r in 0..rows {
            let (d, s) = ((dst.ptr + r * dst.pitch) as *mut u8, (src.ptr + r * src.pitch) as *const u8);
            // SAFETY: row r of each side lies inside its buffer (caller's contract).
            unsafe {
                match (dst.host, src.host) {
                    (false, false) => copy_dtod_async(d, s, width, stream)?,
                    (true, false) => copy_dtoh_async(d, s, width, stream)?,
                    (false, true) => copy_htod_async(d, s, width, stream)?,
                    (true, true) => return Err(Error::internal("a 2D copy between two host buffers")),
                }
            }
        }
        return Ok(());
    }
    let kind =
        |host: bool| if host { cu::CUmemorytype::CU_MEMORYTYPE_HOST } else { cu::CUmemorytype::CU_MEMORYTYPE_DEVICE };
    // Written out whole: the memory-type enum has no zero value, so zeroed() is UB.
    let p = cu::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: kind(src.host),
        srcHost: if src.host { src.ptr as *const std::ffi::c_void } else { std::ptr::null() },
        srcDevice: if src.host { 0 } else { src.ptr as u64 },
        srcArray: std::ptr::null_mut(),
        srcPitch: src.pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: kind(dst.host),
        dstHost: if dst.host { dst.ptr as *mut std::ffi::c_void } else { std::ptr::null_mut() },
        dstDevice: if dst.host { 0 } else { dst.ptr as u64 },
        dstArray: std::ptr::null_mut(),
        dstPitch: dst.pitch,
        WidthInBytes: width,
        Height: rows,
    };
    // SAFETY: guaranteed by the caller; p describes the rows above.
    check(unsafe { cu::cuMemcpy2DAsync_v2(&p, stream as cu::CUstream) }, "cuMemcpy2DAsync")
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
    pub fn record(&self, stream: usize) -> Result<()> {
        // SAFETY: a live event; the stream is the caller's, of the event's context.
        check(unsafe { cu::cuEventRecord(self.0, stream as cu::CUstream) }, "cuEventRecord")
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

/// Device memory one call uses for packed data, allocated and freed in the order
/// of `stream` (cuMemAllocAsync/cuMemFreeAsync): dropping it while the stream still
/// runs work on it is safe, the free waits for that work.
pub struct Scratch {
    ptr: u64,
    ctx: usize,
    stream: usize,
    /// Allocated with cuMemAlloc (no stream-ordered allocator): freed after a sync.
    plain: bool,
}

impl Scratch {
    /// `bytes` (> 0) of device memory of context `ctx`, usable by work queued on `stream` from now on.
    pub fn new(bytes: usize, ctx: usize, stream: usize) -> Result<Scratch> {
        let _g = CtxGuard::enter(ctx)?;
        let mut ptr: cu::CUdeviceptr = 0;
        if async_alloc() {
            // SAFETY: valid out-pointer; ctx is current and the stream belongs to it.
            let rc = unsafe { cu::cuMemAllocAsync(&mut ptr, bytes, stream as cu::CUstream) };
            check(rc, &format!("cuMemAllocAsync({bytes} bytes of scratch)"))?;
            return Ok(Scratch { ptr, ctx, stream, plain: false });
        }
        // SAFETY: valid out-pointer; ctx is current.
        check(unsafe { cu::cuMemAlloc_v2(&mut ptr, bytes) }, &format!("cuMemAlloc({bytes} bytes of scratch)"))?;
        Ok(Scratch { ptr, ctx, stream, plain: true })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr as usize as *mut u8
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let Ok(_g) = CtxGuard::enter(self.ctx) else { return };
        // SAFETY: ptr came from the matching allocation in Scratch::new and is freed once,
        // after the work queued on the stream (async free, or a sync first).
        unsafe {
            if self.plain {
                let _ = cu::cuStreamSynchronize(self.stream as cu::CUstream);
                let _ = cu::cuMemFree_v2(self.ptr);
            } else {
                let _ = cu::cuMemFreeAsync(self.ptr, self.stream as cu::CUstream);
            }
        }
    }
}

/// Whether the driver has stream-ordered allocation and the current device supports memory pools.
fn async_alloc() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    let syms = *HAVE.get_or_init(|| {
        // SAFETY: the driver was checked present (CtxGuard::enter ran driver()); only addresses are looked up.
        let lib = unsafe { cu::culib() };
        // SAFETY: as above.
        ASYNC_ALLOC_SYMBOLS.iter().all(|s| unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_ok())
    });
    if !syms {
        return false;
    }
    let Some(dev) = current_device() else { return false };
    let mut pools = 0;
    // SAFETY: valid out-pointer; dev is a device ordinal from the driver.
    let rc = unsafe {
        cu::cuDeviceGetAttribute(&mut pools, cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev)
    };
    rc == cu::CUresult::CUDA_SUCCESS && pools != 0
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

/// The base and size of the device allocation holding `p`.
pub fn address_range(p: *const u8) -> Result<(usize, usize)> {
    let (mut base, mut size): (cu::CUdeviceptr, usize) = (0, 0);
    // SAFETY: valid out-pointers; a context is current (caller's guard).
    check(unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, p as usize as u64) }, "cuMemGetAddressRange")?;
    Ok((base as usize, size))
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

/// Maps a peer process's allocation (its IPC `handle`) into the current context.
/// The driver counts opens of one handle in one context: each needs an [`ipc_close`].
pub fn ipc_open(handle: &[u8; 64]) -> Result<usize> {
    ipc_ready()?;
    let h = cu::CUipcMemHandle { reserved: handle.map(|b| b as std::os::raw::c_char) };
    let mut base: cu::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; the handle came from a peer's cuIpcGetMemHandle.
    let rc = unsafe {
        cu::cuIpcOpenMemHandle_v2(&mut base, h, 1 /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */)
    };
    check(rc, "cuIpcOpenMemHandle")?;
    Ok(base as usize)
}

/// Undoes one [`ipc_open`] in the current context.
///
/// # Safety
/// `base` came from `ipc_open` in the current context and no queued work uses it.
pub unsafe fn ipc_close(base: usize) -> Result<()> {
    // SAFETY: per the caller.
    check(unsafe { cu::cuIpcCloseMemHandle(base as cu::CUdeviceptr) }, "cuIpcCloseMemHandle")
}

/// Whether everything queued on `stream` is done (cuStreamQuery), without waiting.
pub fn stream_done(stream: usize) -> Result<bool> {
    // SAFETY: the stream handle is the caller's (0 = the legacy default stream).
    match unsafe { cu::cuStreamQuery(stream as cu::CUstream) } {
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
