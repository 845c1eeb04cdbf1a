//! Virtual memory management: physical allocations, address reservations, mappings, access
//! and POSIX file descriptor handles (see [`crate::vmm`]). Like the real driver's, these
//! calls need `cuInit` but no current context.

use super::{non_null, out};
use crate::error::bail;
use crate::state::{api, lock};
use crate::vmm::{self, AccessDesc, Location, Prop};
use cudarc::driver::sys::{CUdeviceptr, CUresult};
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

/// Reads a CUmemAllocationProp (CUDA_ERROR_INVALID_VALUE if NULL).
///
/// # Safety
/// `p` is NULL or points at a CUmemAllocationProp.
unsafe fn prop(p: *const c_void) -> crate::error::Result<Prop> {
    non_null(p, "prop")?;
    // SAFETY: a CUmemAllocationProp (caller); its fields are read as raw integers.
    Ok(unsafe { (p as *const Prop).read_unaligned() })
}

/// The allocation granularity for `prop`: 2 MiB, minimum and recommended alike (a Hopper
/// GPU's). `option` must be CU_MEM_ALLOC_GRANULARITY_MINIMUM (0) or _RECOMMENDED (1).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    p: *const c_void,
    option: c_int,
) -> CUresult {
    api("cuMemGetAllocationGranularity", || {
        non_null(granularity, "granularity")?;
        // SAFETY: per the caller.
        let pr = unsafe { prop(p)? };
        if !(0..=1).contains(&option) {
            bail!(CUDA_ERROR_INVALID_VALUE, "option {option} is not a CUmemAllocationGranularity_flags value");
        }
        vmm::check_prop(&lock(), &pr)?;
        // SAFETY: checked non-NULL.
        unsafe { out(granularity, vmm::GRANULARITY, "granularity") }
    })
}

/// A physical allocation of `size` bytes (a multiple of the granularity) on the device of
/// `prop`, pinned, with the requested handle types (POSIX file descriptors only).
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut c_ulonglong,
    size: usize,
    p: *const c_void,
    flags: c_ulonglong,
) -> CUresult {
    api("cuMemCreate", || {
        non_null(handle, "handle")?;
        // SAFETY: per the caller.
        let pr = unsafe { prop(p)? };
        let h = vmm::create(&mut lock(), size, &pr, flags)?;
        // SAFETY: checked non-NULL.
        unsafe { out(handle, h, "handle") }
    })
}

/// Drops one reference to a handle; the memory goes once it is also unmapped everywhere.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: c_ulonglong) -> CUresult {
    api("cuMemRelease", || vmm::release(&mut lock(), handle))
}

/// Reserves `size` bytes of device addresses (a multiple of the page size); `addr` is a hint
/// the simulator ignores.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    _addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    api("cuMemAddressReserve", || {
        non_null(ptr, "ptr")?;
        let p = vmm::reserve(&mut lock(), size, alignment, flags)?;
        // SAFETY: checked non-NULL.
        unsafe { out(ptr, p, "ptr") }
    })
}

/// Frees a whole reservation, once nothing is mapped in it.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    api("cuMemAddressFree", || vmm::address_free(&mut lock(), ptr, size))
}

/// Maps `size` bytes of `handle` (offset 0) at `ptr`, inside a reservation, aligned to the
/// granularity; inaccessible until cuMemSetAccess.
#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: c_ulonglong,
    flags: c_ulonglong,
) -> CUresult {
    api("cuMemMap", || vmm::map(&mut lock(), ptr, size, offset, handle, flags))
}

/// Unmaps whole mappings; work still queued on them fails when it runs.
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    api("cuMemUnmap", || vmm::unmap(&mut lock(), ptr, size))
}

/// Sets each device's access (none, read, read-write) to whole mappings.
#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const c_void, count: usize) -> CUresult {
    api("cuMemSetAccess", || {
        if count == 0 {
            bail!(CUDA_ERROR_INVALID_VALUE, "count is 0");
        }
        non_null(desc, "desc")?;
        // SAFETY: `count` CUmemAccessDesc at `desc` (caller).
        let descs: Vec<AccessDesc> =
            (0..count).map(|i| unsafe { (desc as *const AccessDesc).add(i).read_unaligned() }).collect();
        vmm::set_access(&mut lock(), ptr, size, &descs)
    })
}

/// A device's access to the mapping holding `ptr` (CUmemAccess_flags).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut c_ulonglong,
    location: *const c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    api("cuMemGetAccess", || {
        non_null(flags, "flags")?;
        non_null(location, "location")?;
        // SAFETY: a CUmemLocation (caller).
        let loc = unsafe { (location as *const Location).read_unaligned() };
        let f = vmm::get_access(&lock(), ptr, loc)?;
        // SAFETY: checked non-NULL.
        unsafe { out(flags, u64::from(f), "flags") }
    })
}

/// The handle of the allocation mapped at `addr` (one more reference). Memory not mapped by
/// cuMemMap (cuMemAlloc memory included) is CUDA_ERROR_INVALID_VALUE.
#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(handle: *mut c_ulonglong, addr: *mut c_void) -> CUresult {
    api("cuMemRetainAllocationHandle", || {
        non_null(handle, "handle")?;
        let h = vmm::retain(&mut lock(), addr as u64)?;
        // SAFETY: checked non-NULL.
        unsafe { out(handle, h, "handle") }
    })
}

/// The properties an allocation was created with.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(p: *mut c_void, handle: c_ulonglong) -> CUresult {
    api("cuMemGetAllocationPropertiesFromHandle", || {
        non_null(p, "prop")?;
        let v = vmm::properties(&lock(), handle)?;
        // SAFETY: points at a CUmemAllocationProp (caller).
        unsafe { out(p as *mut Prop, v, "prop") }
    })
}

/// A new POSIX file descriptor (written as an int) for an allocation created with
/// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested; the caller closes it.
#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: c_ulonglong,
    handle_type: c_uint,
    flags: c_ulonglong,
) -> CUresult {
    api("cuMemExportToShareableHandle", || {
        non_null(shareable, "shareableHandle")?;
        let fd = vmm::export(&lock(), handle, handle_type, flags)?;
        // SAFETY: points at an int (caller).
        unsafe { out(shareable as *mut c_int, fd, "shareableHandle") }
    })
}

/// A handle of the allocation another process exported: `os_handle` is the file descriptor
/// itself (cast to a pointer), which the caller still owns.
#[no_mangle]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut c_ulonglong,
    os_handle: *mut c_void,
    handle_type: c_uint,
) -> CUresult {
    api("cuMemImportFromShareableHandle", || {
        non_null(handle, "handle")?;
        let h = vmm::import(&mut lock(), os_handle as usize as i32, handle_type)?;
        // SAFETY: checked non-NULL.
        unsafe { out(handle, h, "handle") }
    })
}
