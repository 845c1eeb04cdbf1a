//! Pointer attributes (cuPointerGetAttribute/s), exact for any address inside any
//! allocation, each written with its documented C size.

use crate::error::{bail, Result};
use crate::mem::alloc::{Alloc, Kind};
use crate::mem::HostRegion;
use crate::state::State;
use cudarc::driver::sys::CUpointer_attribute as P;
use std::ffi::c_void;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// What the simulator knows about an address.
pub enum Info {
    Dev(Arc<Alloc>),
    Host(HostRegion),
    Unknown,
}

pub fn info(st: &State, ptr: u64) -> Info {
    if let Some(a) = st.mem.find_dev(ptr) {
        if a.state() <= crate::mem::alloc::LIVE {
            return Info::Dev(a.clone());
        }
        return Info::Unknown;
    }
    match st.mem.find_host(ptr as usize) {
        Some(r) => Info::Host(r.clone()),
        None => Info::Unknown,
    }
}

/// An attribute's value: 4-byte (CUmemorytype, booleans, int ordinal) or 8-byte (pointers,
/// CUdeviceptr, size_t, unsigned long long).
enum Value {
    U32(u32),
    U64(u64),
}

/// The attribute value for `ptr`. Where there is none, the singular call (`singular`) fails
/// with CUDA_ERROR_INVALID_VALUE and the plural one gets the documented default.
fn value(st: &State, attr: i32, ptr: u64, info: &Info, singular: bool) -> Result<Value> {
    if !(1..=P::CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE as i32).contains(&attr) {
        bail!(CUDA_ERROR_INVALID_VALUE, "{attr} is not a pointer attribute");
    }
    // SAFETY: CUpointer_attribute is a `repr(u32)` enum with exactly the contiguous values
    // 1..=CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE (checked above).
    let a: P = unsafe { std::mem::transmute::<u32, P>(attr as u32) };
    use Value::{U32, U64};
    if a == P::CU_POINTER_ATTRIBUTE_P2P_TOKENS {
        bail!(CUDA_ERROR_INVALID_VALUE, "CU_POINTER_ATTRIBUTE_P2P_TOKENS is not supported (GPUDirect RDMA)");
    }
    let unknown = || {
        if singular {
            bail!(CUDA_ERROR_INVALID_VALUE, "{ptr:#x} is not memory the driver knows (pageable host memory?)");
        }
        Ok(match a {
            P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => U32(-2i32 as u32),
            P::CU_POINTER_ATTRIBUTE_CONTEXT
            | P::CU_POINTER_ATTRIBUTE_DEVICE_POINTER
            | P::CU_POINTER_ATTRIBUTE_HOST_POINTER
            | P::CU_POINTER_ATTRIBUTE_BUFFER_ID
            | P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
            | P::CU_POINTER_ATTRIBUTE_RANGE_SIZE
            | P::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
            | P::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
            | P::CU_POINTER_ATTRIBUTE_MAPPING_SIZE
            | P::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR
            | P::CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID => U64(0),
            _ => U32(0),
        })
    };
    let (ctx, mtype, id, device, start, size, managed, ipc_capable, host_ok, pool) = match info {
        Info::Dev(al) => (
            al.ctx,
            2u32, // CU_MEMORYTYPE_DEVICE, managed memory included (as the real driver reports)
            al.id,
            al.device,
            al.base,
            al.size as u64,
            al.kind == Kind::Managed,
            al.kind == Kind::Device,
            al.kind == Kind::Managed,
            if al.kind == Kind::Async { st.pools[al.device as usize] } else { 0 },
        ),
        Info::Host(r) => (r.ctx, 1u32, r.id, r.device, r.start as u64, r.size as u64, false, false, true, 0),
        Info::Unknown => return unknown(),
    };
    let vmm = match info {
        Info::Dev(al) => al.vmm.as_ref(),
        _ => None,
    };
    let sync = matches!(info, Info::Dev(al) if al.sync_memops.load(std::sync::atomic::Ordering::Relaxed));
    Ok(match a {
        P::CU_POINTER_ATTRIBUTE_CONTEXT => U64(ctx),
        P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE => U32(mtype),
        P::CU_POINTER_ATTRIBUTE_DEVICE_POINTER => U64(ptr),
        P::CU_POINTER_ATTRIBUTE_HOST_POINTER if host_ok => U64(ptr),
        P::CU_POINTER_ATTRIBUTE_HOST_POINTER if singular => {
            bail!(CUDA_ERROR_INVALID_VALUE, "{ptr:#x} is device memory: the host cannot access it")
        }
        P::CU_POINTER_ATTRIBUTE_HOST_POINTER => U64(0),
        P::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS => U32(sync as u32),
        P::CU_POINTER_ATTRIBUTE_BUFFER_ID | P::CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID => U64(id),
        P::CU_POINTER_ATTRIBUTE_IS_MANAGED => U32(managed as u32),
        P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => U32(device as u32),
        P::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE => U32(ipc_capable as u32),
        P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR | P::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR => U64(start),
        P::CU_POINTER_ATTRIBUTE_RANGE_SIZE | P::CU_POINTER_ATTRIBUTE_MAPPING_SIZE => U64(size),
        P::CU_POINTER_ATTRIBUTE_MAPPED => U32(1),
        // A mapping's flags as cuMemSetAccess set them for its device (READWRITE 3, READ 1).
        P::CU_POINTER_ATTRIBUTE_ACCESS_FLAGS => U32(vmm.map_or(3, |v| {
            let bit = 1u64 << device;
            let (r, w) = (v.read.load(Relaxed) & bit != 0, v.write.load(Relaxed) & bit != 0);
            if w {
                3
            } else {
                r as u32
            }
        })),
        P::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => U64(pool),
        P::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES => U64(vmm.map_or(0, |v| u64::from(v.handle_types))),
        _ => U32(0), // IS_GPU_DIRECT_RDMA_CAPABLE, IS_HW_DECOMPRESS_CAPABLE
    })
}

/// Writes attribute `attr` of `ptr` to `data`.
///
/// # Safety
/// `data` is NULL or points at writable memory of the attribute's documented size.
pub unsafe fn write(st: &State, attr: i32, ptr: u64, info: &Info, singular: bool, data: *mut c_void) -> Result<()> {
    if data.is_null() {
        bail!(CUDA_ERROR_INVALID_VALUE, "data pointer for attribute {attr} is NULL");
    }
    match value(st, attr, ptr, info, singular)? {
        // SAFETY: `data` points at the attribute's documented size (caller); unaligned is fine.
        Value::U32(v) => unsafe { (data as *mut u32).write_unaligned(v) },
        // SAFETY: as above.
        Value::U64(v) => unsafe { (data as *mut u64).write_unaligned(v) },
    }
    Ok(())
}
