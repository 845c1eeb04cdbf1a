//! Every exported C function of the simulated driver and NVRTC, grouped by concern. Each
//! body runs inside [`crate::state::api`] (initialisation check, panics caught, tracing).
//!
//! The functions are `unsafe extern "C"`: their contract is the CUDA documentation of the
//! same name (pointers valid for what the call reads or writes); hence no `# Safety`
//! section on each.
#![allow(clippy::missing_safety_doc)]

pub mod copy;
pub mod ctx;
pub mod device;
pub mod event;
pub mod graph;
pub mod init;
pub mod ipc;
pub mod mem;
pub mod memop;
pub mod module;
pub mod nvrtc;
pub mod procaddr;
pub mod stream;
pub mod vmm;

pub use copy::*;
pub use ctx::*;
pub use device::*;
pub use event::*;
pub use graph::*;
pub use init::*;
pub use ipc::*;
pub use mem::*;
pub use memop::*;
pub use module::*;
pub use nvrtc::*;
pub use procaddr::*;
pub use stream::*;
pub use vmm::*;

use crate::error::{bail, Result};

/// CUDA_ERROR_INVALID_VALUE for a NULL pointer argument.
pub(crate) fn non_null<T>(p: *const T, what: &str) -> Result<()> {
    if p.is_null() {
        bail!(CUDA_ERROR_INVALID_VALUE, "{what} is NULL");
    }
    Ok(())
}

/// Writes an output parameter (CUDA_ERROR_INVALID_VALUE if it is NULL).
///
/// # Safety
/// `p` is NULL or valid for a write of `T` (alignment not required).
pub(crate) unsafe fn out<T>(p: *mut T, v: T, what: &str) -> Result<()> {
    non_null(p, what)?;
    // SAFETY: non-NULL and writable (caller).
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Copies `s` NUL-terminated into a C buffer of `len` bytes, truncating like the driver.
///
/// # Safety
/// `buf` is NULL or valid for `len` bytes of writes.
pub(crate) unsafe fn out_str(buf: *mut std::ffi::c_char, len: i32, s: &str, what: &str) -> Result<()> {
    non_null(buf, what)?;
    if len <= 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "{what} length {len} must be > 0");
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: `n + 1 <= len` bytes are writable (caller).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    Ok(())
}
