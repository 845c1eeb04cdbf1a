//! fcclMemAlloc, fcclMemAllocHost, fcclMemFree.

use super::boundary::{call, Out};
use super::fcclResult_t;
use crate::mem;
use std::mem::MaybeUninit;
use std::os::raw::c_void;

/// Allocates `size` bytes of CUDA device memory on the current device.
/// Returns fcclUnavailable when CUDA is not present (the case in this build on
/// machines without a driver); `*ptr` is then left unchanged.
#[no_mangle]
pub unsafe extern "C" fn fcclMemAlloc(ptr: Option<&mut MaybeUninit<*mut c_void>>, size: usize) -> fcclResult_t {
    call("fcclMemAlloc", || {
        let out = ptr.required("ptr")?;
        let p = mem::alloc_device(size)?;
        out.write(p as *mut c_void);
        Ok(())
    })
}

/// Allocates `size` bytes of page-aligned host memory. Allocations of 32 KiB or more
/// are shared memory (a memfd, one file descriptor each) that other ranks on this
/// host map: large messages sent out of them are copied once, straight into the
/// receiver's buffer, instead of twice through the library's rings
/// (FERROCCL_SINGLE_COPY=0 turns this off and gives private memory). Peers can read
/// such a buffer only while a call sends from it. Being shared, it is not copied on
/// write in a child after fork(): parent and child see each other's writes.
/// Allocations of 2 MiB or more are 2 MiB aligned, filled and collapsed into huge
/// pages (fewer TLB misses; MADV_COLLAPSE, Linux 6.1 and later), which costs about
/// 1 ms per MiB once, here. When the process uses CUDA (it has initialised the
/// driver), the memory is also page-locked in place for every context
/// (cuMemHostRegister, portable), so device copies from and to it are fast and
/// asynchronous; a process that never used CUDA does not start it here. Free it
/// with fcclMemFree.
#[no_mangle]
pub unsafe extern "C" fn fcclMemAllocHost(ptr: Option<&mut MaybeUninit<*mut c_void>>, size: usize) -> fcclResult_t {
    call("fcclMemAllocHost", || {
        let out = ptr.required("ptr")?;
        let p = mem::alloc_host(size)?;
        out.write(p as *mut c_void);
        Ok(())
    })
}

/// Frees memory from fcclMemAlloc or fcclMemAllocHost. NULL is a no-op; a pointer
/// that did not come from them returns fcclInvalidArgument and frees nothing.
#[no_mangle]
pub unsafe extern "C" fn fcclMemFree(ptr: *mut c_void) -> fcclResult_t {
    call("fcclMemFree", || mem::free(ptr as *mut u8))
}
