//! Memory: the one component that knows kinds of memory (UCC's `mc` idea).
//!
//! Allocation and release for `fcclMemAlloc*`/`fcclMemFree`, and the reduction
//! kernels (`reduce`). Device memory arrives with CUDA support; until then every
//! buffer is host memory and `fcclMemAlloc` reports that CUDA is unavailable.

pub mod local;
pub mod pool;
pub mod reduce;

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::Mutex;

/// Kinds of memory a buffer can be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    Host,
}

/// Allocations made by this library, so that fcclMemFree can refuse pointers it
/// did not hand out instead of corrupting the heap.
static ALLOCS: Mutex<Option<HashMap<usize, (usize, MemKind)>>> = Mutex::new(None);

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Page-aligned host memory (pinned once CUDA support lands).
pub fn alloc_host(size: usize) -> Result<*mut u8> {
    if size == 0 {
        return Err(Error::invalid_arg("size is 0; allocate at least one byte"));
    }
    if size > isize::MAX as usize {
        return Err(Error::invalid_arg(format!("size {size} is larger than the address space")));
    }
    let mut p: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: p is a valid out-pointer; alignment is a power of two multiple of sizeof(void*).
    let rc = unsafe { libc::posix_memalign(&mut p, page_size(), size) };
    if rc != 0 || p.is_null() {
        return Err(Error::system(format!("out of host memory allocating {size} bytes")));
    }
    ALLOCS.lock().unwrap().get_or_insert_with(HashMap::new).insert(p as usize, (size, MemKind::Host));
    Ok(p as *mut u8)
}

/// CUDA device memory: not available in this build's current state.
pub fn alloc_device(size: usize) -> Result<*mut u8> {
    let _ = size;
    Err(Error::unavailable(
        "CUDA is not available: ferroccl found no CUDA driver support, so device memory cannot be allocated; use fcclMemAllocHost for host memory",
    ))
}

/// Frees memory from alloc_host/alloc_device; NULL is a no-op.
pub fn free(p: *mut u8) -> Result<()> {
    if p.is_null() {
        return Ok(());
    }
    let entry = ALLOCS.lock().unwrap().get_or_insert_with(HashMap::new).remove(&(p as usize));
    match entry {
        Some((_, MemKind::Host)) => {
            // SAFETY: p came from posix_memalign above and is freed once (removed from the map).
            unsafe { libc::free(p as *mut libc::c_void) };
            Ok(())
        }
        None => Err(Error::invalid_arg(format!(
            "pointer {p:p} was not allocated by fcclMemAlloc/fcclMemAllocHost (or was already freed)"
        ))),
    }
}
