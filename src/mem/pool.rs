//! Reusable host buffers for scratch memory and packed copies.
//!
//! Fresh large allocations cost a page fault per page on every call, often more than
//! the work they hold; buffers taken here go back to a process-wide pool (at most
//! [`POOL_BYTES`] kept) when dropped.

use std::sync::Mutex;

/// Most bytes the pool keeps between calls.
pub const POOL_BYTES: usize = 128 << 20;
static POOL: Mutex<Vec<Box<[u8]>>> = Mutex::new(Vec::new());

/// A buffer from the pool; its contents are unspecified (write before reading).
pub struct PooledBuf(Box<[u8]>);

impl PooledBuf {
    /// A buffer of at least `bytes` (and at least 8).
    pub fn take(bytes: usize) -> PooledBuf {
        let bytes = bytes.max(8);
        let reused = {
            let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
            // The smallest pooled buffer that fits without wasting more than half.
            let best = (0..pool.len())
                .filter(|&i| pool[i].len() >= bytes && pool[i].len() <= 2 * bytes)
                .min_by_key(|&i| pool[i].len());
            best.map(|i| pool.swap_remove(i))
        };
        PooledBuf(reused.unwrap_or_else(|| vec![0u8; bytes].into_boxed_slice()))
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl std::fmt::Debug for PooledBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PooledBuf({} bytes)", self.0.len())
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        let b = std::mem::take(&mut self.0);
        let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
        let held: usize = pool.iter().map(|b| b.len()).sum();
        if held + b.len() <= POOL_BYTES {
            pool.push(b);
        }
    }
}
