//! Allocation: device, stream-ordered, managed and pinned host memory, host registration,
//! pointer attributes.

use super::{non_null, out};
use crate::attrs;
use crate::ctx;
use crate::error::{bail, err, Result};
use crate::mem::alloc::{Kind, FREEING};
use crate::mem::space::{round_up, ALIGN, PAGE};
use crate::state::{self, api, lock};
use crate::stream::{self, op::OpKind};
use cudarc::driver::sys::{CUdeviceptr, CUresult, CUstream};
use std::ffi::{c_int, c_uint, c_void};

pub const HOSTALLOC_FLAGS: u32 = 0x1 | 0x2 | 0x4; // PORTABLE | DEVICEMAP | WRITECOMBINED
pub const HOSTREGISTER_FLAGS: u32 = 0x1 | 0x2 | 0x4 | 0x8; // PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY

fn alloc(dptr: *mut CUdeviceptr, size: usize, kind: Kind) -> Result<()> {
    non_null(dptr, "dptr")?;
    let mut st = lock();
    let h = ctx::current(&st)?;
    let device = st.ctxs[&h].device;
    let limit = st.cfg.mem_bytes;
    let a = st.mem.alloc_device(h, device, size, kind, limit, state::pid())?;
    // SAFETY: checked non-NULL.
    unsafe { out(dptr, a.base, "dptr") }
}

/// Device memory in the current context: an address inside the simulator's PROT_NONE
/// reservation (host access faults), 512-byte aligned with an unmapped gap after it.
/// Size 0 is CUDA_ERROR_INVALID_VALUE; beyond FERROCCL_SIM_MEM_MB, CUDA_ERROR_OUT_OF_MEMORY.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    api("cuMemAlloc_v2", || alloc(dptr, bytesize, Kind::Device))
}

/// Pitched device memory: pitch is the width rounded up to 512 bytes; element sizes 4, 8, 16.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    api("cuMemAllocPitch_v2", || {
        non_null(pitch, "pPitch")?;
        if ![4, 8, 16].contains(&elem) || width == 0 || height == 0 {
            bail!(CUDA_ERROR_INVALID_VALUE, "width {width}, height {height}, element size {elem}");
        }
        let p = round_up(width, ALIGN).ok_or_else(|| err!(CUDA_ERROR_INVALID_VALUE, "width {width}"))?;
        let size = p.checked_mul(height).ok_or_else(|| err!(CUDA_ERROR_OUT_OF_MEMORY, "{p} x {height} bytes"))?;
        alloc(dptr, size, Kind::Device)?;
        // SAFETY: checked non-NULL.
        unsafe { out(pitch, p, "pPitch") }
    })
}

/// Managed memory: also mapped read-write at its device address, so the host may touch it.
/// Flags must be CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult {
    api("cuMemAllocManaged", || {
        if flags != 1 && flags != 2 {
            bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} must be CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST");
        }
        alloc(dptr, bytesize, Kind::Managed)
    })
}

/// Frees a device or managed allocation by its base after waiting for the current
/// context's pending work (the real driver synchronises). An interior pointer, a freed or
/// unknown address, or IPC-opened memory is CUDA_ERROR_INVALID_VALUE.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    api("cuMemFree_v2", || {
        let st = lock();
        let h = ctx::current(&st)?;
        let a = st.mem.check_free(dptr, "dptr")?;
        drop(st);
        ctx::synchronize(h)?;
        if a.ctx != h {
            // Another context's failure is not this call's error.
            let _ = ctx::synchronize(a.ctx);
        }
        let mut st = lock();
        st.mem.check_free(dptr, "dptr")?;
        st.mem.remove(dptr);
        Ok(())
    })
}

/// Free and total memory of the current context's device (this process's allocations).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    api("cuMemGetInfo_v2", || {
        let st = lock();
        let h = ctx::current(&st)?;
        let d = st.ctxs[&h].device as usize;
        non_null(total, "total")?;
        // SAFETY: `out` checks NULL.
        unsafe {
            out(free, st.cfg.mem_bytes.saturating_sub(st.mem.used[d]), "free")?;
            out(total, st.cfg.mem_bytes, "total")
        }
    })
}

/// Base and size of the allocation containing any address inside it (either output may be
/// NULL); CUDA_ERROR_NOT_FOUND for host memory and unknown addresses.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut CUdeviceptr,
    psize: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    api("cuMemGetAddressRange_v2", || {
        let st = lock();
        ctx::current(&st)?;
        let a = match st.mem.find_dev(dptr) {
            Some(a) if a.state() <= crate::mem::alloc::LIVE => a,
            _ => bail!(CUDA_ERROR_NOT_FOUND, "{dptr:#x} is not inside a device allocation"),
        };
        // SAFETY: non-NULL outputs are writable (caller).
        unsafe {
            if !pbase.is_null() {
                pbase.write_unaligned(a.base);
            }
            if !psize.is_null() {
                psize.write_unaligned(a.size);
            }
        }
        Ok(())
    })
}

fn alloc_async(dptr: *mut CUdeviceptr, size: usize, pool: Option<u64>, hstream: CUstream) -> Result<()> {
    non_null(dptr, "dptr")?;
    let mut st = lock();
    let sid = stream::resolve(&mut st, hstream as u64)?;
    crate::graph::not_capturable(&mut st, sid, "cuMemAllocAsync (a graph memory node, not simulated)")?;
    let h = st.streams[&sid].ctx;
    let device = st.ctxs[&h].device;
    if let Some(p) = pool {
        if st.pools.get(device as usize) != Some(&p) {
            bail!(CUDA_ERROR_INVALID_VALUE, "{p:#x} is not the memory pool of device {device}");
        }
    }
    let limit = st.cfg.mem_bytes;
    let a = st.mem.alloc_device(h, device, size, Kind::Async, limit, state::pid())?;
    let base = a.base;
    stream::enqueue(&mut st, sid, OpKind::AllocReady(a), Vec::new());
    // SAFETY: checked non-NULL.
    unsafe { out(dptr, base, "dptr") }
}

/// Stream-ordered allocation: the address is returned at once; the memory is usable by work
/// that runs after the stream reached the allocation (earlier use fails the context).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, hstream: CUstream) -> CUresult {
    api("cuMemAllocAsync", || alloc_async(dptr, bytesize, None, hstream))
}

/// As cuMemAllocAsync; the pool must be the stream's device's default pool.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: *mut c_void,
    hstream: CUstream,
) -> CUresult {
    api("cuMemAllocFromPoolAsync", || alloc_async(dptr, bytesize, Some(pool as u64), hstream))
}

/// Stream-ordered free of device memory (cuMemAlloc or cuMemAllocAsync): freed for the host
/// at once (later calls naming it fail), released when the stream reaches it.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, hstream: CUstream) -> CUresult {
    api("cuMemFreeAsync", || {
        let mut st = lock();
        let sid = stream::resolve(&mut st, hstream as u64)?;
        crate::graph::not_capturable(&mut st, sid, "cuMemFreeAsync (a graph memory node, not simulated)")?;
        let a = st.mem.check_free(dptr, "dptr")?;
        if a.kind == Kind::Managed {
            bail!(CUDA_ERROR_INVALID_VALUE, "{dptr:#x} is managed memory (free it with cuMemFree)");
        }
        a.set_state(FREEING);
        stream::enqueue(&mut st, sid, OpKind::Free(a), Vec::new());
        Ok(())
    })
}

fn host_alloc(pp: *mut *mut c_void, size: usize, flags: u32) -> Result<()> {
    non_null(pp, "pp")?;
    if flags & !HOSTALLOC_FLAGS != 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} are not PORTABLE, DEVICEMAP or WRITECOMBINED");
    }
    if size == 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "size is 0");
    }
    let mut st = lock();
    let h = ctx::current(&st)?;
    let device = st.ctxs[&h].device;
    let p = st.mem.alloc_host(h, device, size, flags)?;
    // SAFETY: checked non-NULL.
    unsafe { out(pp, p as *mut c_void, "pp") }
}

/// Pinned host memory. Like the real driver's sub-allocations, the pointer is never
/// page-aligned (256 bytes into a page-aligned block).
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    api("cuMemHostAlloc", || host_alloc(pp, bytesize, flags))
}

/// cuMemHostAlloc with flags 0.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    api("cuMemAllocHost_v2", || host_alloc(pp, bytesize, 0))
}

/// Forgets the host range starting at `p` once no queued work can still access it: one
/// the simulator allocated (`allocated`, cuMemFreeHost) or one the program registered
/// (cuMemHostUnregister); anything else is `refused()`.
fn release_host(p: usize, allocated: bool, refused: impl Fn() -> crate::error::Error) -> Result<()> {
    let check = |st: &crate::state::State| match st.mem.host.get(&p) {
        Some(r) if r.block.is_some() == allocated => Ok(()),
        _ => Err(refused()),
    };
    let st = lock();
    ctx::current(&st)?;
    check(&st)?;
    let size = st.mem.host[&p].size;
    stream::quiesce_host(st, p, size);
    let mut st = lock();
    check(&st)?;
    st.mem.remove_host(p);
    Ok(())
}

/// Frees cuMemHostAlloc memory by the exact pointer returned, once no queued work can still
/// read or write it.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    api("cuMemFreeHost", || {
        release_host(p as usize, true, || {
            err!(CUDA_ERROR_INVALID_VALUE, "{p:?} was not returned by cuMemHostAlloc/cuMemAllocHost")
        })
    })
}

/// The device address of pinned or registered memory: the same address (unified
/// addressing). Flags must be 0.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    api("cuMemHostGetDevicePointer_v2", || {
        let st = lock();
        ctx::current(&st)?;
        if flags != 0 {
            bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} must be 0");
        }
        if st.mem.find_host(p as usize).is_none() {
            bail!(CUDA_ERROR_INVALID_VALUE, "{p:?} is not pinned or registered host memory");
        }
        // SAFETY: `out` checks NULL.
        unsafe { out(pdptr, p as u64, "pdptr") }
    })
}

/// The flags cuMemHostAlloc was given, for any address inside such an allocation.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetFlags(pflags: *mut c_uint, p: *mut c_void) -> CUresult {
    api("cuMemHostGetFlags", || {
        let st = lock();
        ctx::current(&st)?;
        let flags = match st.mem.find_host(p as usize) {
            Some(r) if r.block.is_some() => r.flags,
            _ => bail!(CUDA_ERROR_INVALID_VALUE, "{p:?} is not memory from cuMemHostAlloc"),
        };
        // SAFETY: `out` checks NULL.
        unsafe { out(pflags, flags, "pFlags") }
    })
}

/// Records a mapped host range as pinned (the caller's address stays). Overlapping a
/// pinned or registered range is CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED; an unmapped
/// range, size 0 or device memory is CUDA_ERROR_INVALID_VALUE.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    api("cuMemHostRegister_v2", || {
        let mut st = lock();
        let h = ctx::current(&st)?;
        if p.is_null() || bytesize == 0 {
            bail!(CUDA_ERROR_INVALID_VALUE, "{bytesize} bytes at {p:?}");
        }
        if flags & !HOSTREGISTER_FLAGS != 0 {
            bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} are not valid");
        }
        if !mapped(p as usize, bytesize) {
            bail!(CUDA_ERROR_INVALID_VALUE, "{bytesize} bytes at {p:?} are not all mapped host memory");
        }
        let device = st.ctxs[&h].device;
        st.mem.register(h, device, p as usize, bytesize, flags)
    })
}

/// Whether every page of the range is mapped (mincore fails with ENOMEM otherwise).
fn mapped(start: usize, len: usize) -> bool {
    let first = start / PAGE * PAGE;
    let Some(end) = start.checked_add(len).and_then(|e| round_up(e, PAGE)) else { return false };
    let mut vec = vec![0u8; (end - first) / PAGE];
    // SAFETY: `vec` has one byte per page of the range; mincore only reads the page tables.
    unsafe { libc::mincore(first as *mut c_void, end - first, vec.as_mut_ptr()) == 0 }
}

/// Unregisters a range by its start address once no queued work can still access it;
/// anything else is CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    api("cuMemHostUnregister", || {
        release_host(p as usize, false, || {
            err!(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "{p:?} is not the start of a registered range")
        })
    })
}

/// One attribute of any address inside any allocation (docs/sim-gpu.md lists the values).
/// Unknown addresses and HOST_POINTER of device memory are CUDA_ERROR_INVALID_VALUE;
/// DEVICE_POINTER needs a current context.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) -> CUresult {
    api("cuPointerGetAttribute", || {
        let st = lock();
        if attribute == cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_POINTER as c_int {
            ctx::current(&st)?;
        }
        let info = attrs::info(&st, ptr);
        // SAFETY: `data` points at the attribute's documented size (caller); NULL is checked.
        unsafe { attrs::write(&st, attribute, ptr, &info, true, data) }
    })
}

/// Several attributes at once. An address the driver does not know gets the documented
/// defaults (MEMORY_TYPE 0, CONTEXT NULL, DEVICE_ORDINAL -2, others 0) and CUDA_SUCCESS.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    num: c_uint,
    attributes: *mut c_int,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    api("cuPointerGetAttributes", || {
        if num == 0 {
            return Ok(());
        }
        non_null(attributes, "attributes")?;
        non_null(data, "data")?;
        let st = lock();
        let info = attrs::info(&st, ptr);
        for i in 0..num as usize {
            // SAFETY: both arrays have `num` entries (caller); each data pointer is checked
            // for NULL and points at the attribute's documented size.
            unsafe { attrs::write(&st, *attributes.add(i), ptr, &info, false, *data.add(i))? };
        }
        Ok(())
    })
}

/// Only CU_POINTER_ATTRIBUTE_SYNC_MEMOPS of device memory can be set (recorded, reported).
#[no_mangle]
pub unsafe extern "C" fn cuPointerSetAttribute(value: *const c_void, attribute: c_int, ptr: CUdeviceptr) -> CUresult {
    api("cuPointerSetAttribute", || {
        non_null(value, "value")?;
        let st = lock();
        ctx::current(&st)?;
        if attribute != cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS as c_int {
            bail!(CUDA_ERROR_INVALID_VALUE, "attribute {attribute} cannot be set");
        }
        let a = st.mem.resolve_dev(ptr, 1, "ptr")?.0;
        // SAFETY: points at an unsigned int (caller).
        let v = unsafe { (value as *const c_uint).read_unaligned() };
        a.sync_memops.store(v != 0, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    })
}
