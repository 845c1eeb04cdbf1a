//! fcclMemAlloc, fcclMemAllocHost, fcclMemFree.

use super::boundary::{call, write_out};
use super::fcclResult_t;
use crate::error::Error;
use crate::mem;
use std::os::raw::c_void;

/// Allocates `size` bytes of CUDA device memory on the current device.
/// Returns fcclUnavailable when CUDA is not present (the case in this build on
/// machines without a driver); `*ptr` is then left unchanged.
#[no_mangle]
pub unsafe extern "C" fn fcclMemAlloc(ptr: *mut *mut c_void, size: usize) -> fcclResult_t {
    call("fcclMemAlloc", || {
        if ptr.is_null() {
            return Err(Error::invalid_arg("ptr is NULL; pass the address of a void* to receive the allocation"));
        }
        let p = mem::alloc_device(size)?;
        // SAFETY: ptr checked non-NULL; the caller provides a writable void*.
        unsafe { write_out(ptr, p as *mut c_void) };
        Ok(())
    })
}

/// Allocates `size` bytes of page-aligned host memory (pinned when CUDA is present).
/// Without CUDA, allocations of 2 MiB or more are 2 MiB aligned and advised for
/// transparent huge pages, which makes collectives on them faster (fewer TLB misses).
/// Free it with fcclMemFree.
#[no_mangle]
pub unsafe extern "C" fn fcclMemAllocHost(ptr: *mut *mut c_void, size: usize) -> fcclResult_t {
    call("fcclMemAllocHost", || {
        if ptr.is_null() {
            return Err(Error::invalid_arg("ptr is NULL; pass the address of a void* to receive the allocation"));
        }
        let p = mem::alloc_host(size)?;
        // SAFETY: ptr checked non-NULL; the caller provides a writable void*.
        unsafe { write_out(ptr, p as *mut c_void) };
        Ok(())
    })
}

/// Frees memory from fcclMemAlloc or fcclMemAllocHost. NULL is a no-op; a pointer
/// that did not come from them returns fcclInvalidArgument and frees nothing.
#[no_mangle]
pub unsafe extern "C" fn fcclMemFree(ptr: *mut c_void) -> fcclResult_t {
    call("fcclMemFree", || mem::free(ptr as *mut u8))
}
