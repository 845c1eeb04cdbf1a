//! Allocations whose size a call decides (scratch, packed copies, buckets, copies of
//! the caller's arrays): made so that they can fail. A call the process cannot find
//! the memory for returns fcclSystemError naming the size, what it was for and what
//! to do, instead of aborting the process as Rust's infallible allocations do.
//! docs/robustness.md, "Out of memory", lists which allocations go through here.

use crate::error::Error;
use std::fmt::Display;

#[cfg(test)]
thread_local! {
    /// Tests: allocations through here of more than this many bytes fail on this thread.
    pub static FAIL_ABOVE: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// Whether the test knob refuses `bytes` (never outside tests).
#[inline]
fn refused(bytes: usize) -> bool {
    #[cfg(test)]
    if bytes > FAIL_ABOVE.with(|c| c.get()) {
        return true;
    }
    let _ = bytes;
    false
}

/// `bytes` zeroed bytes (the allocator's `calloc`: fresh pages are not touched), or
/// None when the allocator has none to give.
pub fn zeroed(bytes: usize) -> Option<Box<[u8]>> {
    if bytes == 0 {
        return Some(Box::default());
    }
    if refused(bytes) {
        return None;
    }
    let layout = std::alloc::Layout::array::<u8>(bytes).ok()?;
    // SAFETY: the layout's size is not zero.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return None;
    }
    // SAFETY: p is a fresh allocation of `bytes` initialised bytes, made with the
    // layout a Box<[u8]> of that length frees with.
    Some(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, bytes)) })
}

/// An empty vector with room for `n` elements, or None when the allocator has none.
pub fn with_capacity<T>(n: usize) -> Option<Vec<T>> {
    if refused(n.saturating_mul(std::mem::size_of::<T>())) {
        return None;
    }
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    Some(v)
}

/// A copy of `items`, or None when the allocator has no room for it.
pub fn to_vec<T: Copy>(items: &[T]) -> Option<Vec<T>> {
    let mut v = with_capacity(items.len())?;
    v.extend_from_slice(items);
    Some(v)
}

/// The error of an allocation of `bytes` for `what` that failed; `fix`: what the
/// caller can do about it. The entry point puts the call's name in front.
pub fn out_of_memory(bytes: usize, what: impl Display, fix: impl Display) -> Error {
    Error::system(format!(
        "cannot allocate {bytes} bytes of {what}: out of memory (or over the process's address-space limit, RLIMIT_AS / ulimit -v); {fix}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_fail_with_none_not_an_abort() {
        assert!(zeroed(usize::MAX / 2).is_none(), "more than the address space");
        assert!(with_capacity::<u64>(usize::MAX / 16).is_none());
        let z = zeroed(1 << 20).expect("1 MiB");
        assert!(z.len() == 1 << 20 && z.iter().all(|&b| b == 0));
        assert_eq!(zeroed(0).expect("empty").len(), 0);
        assert_eq!(to_vec(&[1u32, 2, 3]).expect("three"), [1, 2, 3]);
        FAIL_ABOVE.with(|c| c.set(4096));
        assert!(zeroed(4097).is_none() && zeroed(4096).is_some());
        FAIL_ABOVE.with(|c| c.set(usize::MAX));
        let e = out_of_memory(1 << 30, "scratch for packing", "use a smaller count");
        assert_eq!(e.code, crate::error::Code::SystemError);
        assert!(
            e.msg.starts_with("cannot allocate 1073741824 bytes of scratch for packing: out of memory"),
            "{}",
            e.msg
        );
        assert!(e.msg.ends_with("; use a smaller count"), "{}", e.msg);
    }
}
