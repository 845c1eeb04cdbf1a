//! Page-locked host buffers for staging device memory, kept in a pool for later calls
//! (pageable memory would be copied through the driver's own bounce buffers at a
//! fraction of the speed).

use super::cuda;
use crate::error::Result;

/// A page-aligned host buffer, page-locked where the driver allows (else plain
/// memory, which still works), returned to a pool on drop.
pub struct Pinned {
    ptr: *mut u8,
    len: usize,
    /// From `mem::alloc_host` (page-locked by it, and shared memory that peers on this
    /// host read in place, as fcclMemAllocHost's), else a private mapping.
    shared: bool,
    registered: bool,
}

// SAFETY: the buffer is owned memory; whoever holds the Pinned uses it alone.
unsafe impl Send for Pinned {}

/// Buffers kept for later calls: at most this many bytes together.
pub const POOL_MAX_BYTES: usize = 64 << 20;
static POOL: std::sync::Mutex<Vec<Pinned>> = std::sync::Mutex::new(Vec::new());

impl Pinned {
    /// A buffer of at least `len` bytes: the smallest kept one of its kind that fits,
    /// else a new one (a shared one of at least `made_at_least` bytes). Chunks take shared buffers: the host algorithms then move
    /// their bytes once, peer to peer, instead of through the shared rings. A call
    /// staged whole takes a private one (a shared buffer costs more to make, and one
    /// larger than the pool is made again on every call).
    pub fn take(len: usize, shared: bool, made_at_least: usize) -> Result<Pinned> {
        {
            let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
            let fits = |b: &&Pinned| b.shared == shared && b.len >= len;
            let best = pool.iter().enumerate().filter(|(_, b)| fits(b)).min_by_key(|(_, b)| b.len).map(|(i, _)| i);
            if let Some(i) = best {
                return Ok(pool.swap_remove(i));
            }
        }
        if shared {
            // Chunk slots are all one size and come in pairs (a pipeline holds two), so
            // the first staged call leaves the pool with what every later one needs.
            let len = len.max(made_at_least).next_power_of_two().max(64 << 10);
            let spare = Pinned { ptr: crate::mem::alloc_host(len)?, len, shared, registered: false };
            drop(spare);
            let ptr = crate::mem::alloc_host(len)?;
            return Ok(Pinned { ptr, len, shared, registered: false });
        }
        // Rounded up so that slightly larger calls reuse it.
        let len = len.next_power_of_two().max(64 << 10);
        let ptr = crate::sys::map_private(len, "staging device memory")?;
        // SAFETY: the range is this mapping, which stays until free() unregisters it.
        let registered = unsafe { cuda::register_host(ptr, len) }.is_ok();
        Ok(Pinned { ptr, len, shared, registered })
    }

    /// The buffer's first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn free(self) {
        if self.shared {
            if let Err(e) = crate::mem::free(self.ptr) {
                crate::log::warn(format_args!("freeing a staging buffer: {}", e.msg));
            }
        } else {
            if self.registered {
                // SAFETY: registered in take(); no copy uses it any more (the stream was synchronised).
                let _ = unsafe { cuda::unregister_host(self.ptr as usize) };
            }
            // SAFETY: mapped in take(), unmapped once.
            unsafe { crate::sys::unmap(self.ptr, self.len) };
        }
        std::mem::forget(self);
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let mine = Pinned { ptr: self.ptr, len: self.len, shared: self.shared, registered: self.registered };
        let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
        let kept: usize = pool.iter().map(|b| b.len).sum();
        if kept + mine.len <= POOL_MAX_BYTES {
            pool.push(mine);
        } else {
            drop(pool);
            mine.free();
        }
    }
}
