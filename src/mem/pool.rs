//! Reusable host buffers for scratch memory and packed copies.
//!
//! Fresh large allocations cost a page fault per page on every call, often more than
//! the work they hold; buffers taken here go back to a process-wide pool (at most
//! [`POOL_BYTES`] kept) when dropped.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Most bytes the pool keeps between calls.
pub const POOL_BYTES: usize = 128 << 20;
static POOL: Mutex<Pool> = Mutex::new(Pool { held: 0, by_len: BTreeMap::new() });

/// The buffers kept, by length, and their bytes together: taking and giving back
/// cost O(log n) however many small buffers a group's copies left here.
struct Pool {
    held: usize,
    by_len: BTreeMap<usize, Vec<Box<[u8]>>>,
}

/// A buffer from the pool; its contents are unspecified (write before reading).
pub struct PooledBuf(Box<[u8]>);

impl PooledBuf {
    /// A buffer of at least `bytes` (and at least 8), or None when there is no
    /// memory for a new one (see `mem::fallible`): what every buffer whose size a
    /// call decides is taken with.
    pub fn try_take(bytes: usize) -> Option<PooledBuf> {
        let bytes = bytes.max(8);
        let reused = {
            let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
            // The smallest pooled buffer that fits without wasting more than half.
            let len = pool.by_len.range(bytes..=bytes.saturating_mul(2)).next().map(|(&len, _)| len);
            let b = len.and_then(|len| {
                let bufs = pool.by_len.get_mut(&len)?;
                let b = bufs.pop();
                if bufs.is_empty() {
                    pool.by_len.remove(&len);
                }
                b
            });
            if let Some(b) = &b {
                pool.held -= b.len();
            }
            b
        };
        match reused {
            Some(b) => Some(PooledBuf(b)),
            None => crate::mem::fallible::zeroed(bytes).map(PooledBuf),
        }
    }

    /// [`PooledBuf::try_take`] for a buffer of a size fixed by the host plan, not by a
    /// call; the process aborts when there is no memory for it, as on any failed Rust
    /// allocation.
    pub fn take(bytes: usize) -> PooledBuf {
        PooledBuf::try_take(bytes).unwrap_or_else(|| {
            std::alloc::handle_alloc_error(std::alloc::Layout::array::<u8>(bytes.max(8)).expect("a plan's size"))
        })
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
        if pool.held + b.len() <= POOL_BYTES {
            pool.held += b.len();
            pool.by_len.entry(b.len()).or_default().push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::fallible::FAIL_ABOVE;

    /// A buffer the allocator refuses is None, not an abort; the pool takes back
    /// what fits it and gives out the smallest that fits without wasting half.
    #[test]
    fn a_refused_buffer_is_none_and_kept_ones_fit() {
        // More than the pool keeps: never served from it.
        FAIL_ABOVE.with(|c| c.set(1 << 20));
        assert!(PooledBuf::try_take(POOL_BYTES + 4096).is_none());
        FAIL_ABOVE.with(|c| c.set(usize::MAX));
        let b = PooledBuf::try_take(1_234_567).expect("memory");
        assert!(b.0.len() >= 1_234_567 && b.0.len() <= 2 * 1_234_567);
        let mut pool = Pool { held: 0, by_len: BTreeMap::new() };
        for len in [100, 300, 1000] {
            pool.held += len;
            pool.by_len.entry(len).or_default().push(vec![0u8; len].into_boxed_slice());
        }
        let fits = |pool: &Pool, bytes: usize| pool.by_len.range(bytes..=bytes * 2).next().map(|(&l, _)| l);
        assert_eq!(fits(&pool, 90), Some(100));
        assert_eq!(fits(&pool, 160), Some(300));
        assert_eq!(fits(&pool, 400), None, "1000 would waste more than half");
    }
}
