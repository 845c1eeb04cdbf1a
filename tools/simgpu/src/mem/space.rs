//! The device address space: one large `PROT_NONE` reservation that device addresses are
//! carved from. Nothing is ever mapped readable at a device address (except managed
//! memory), so a host load or store through a device pointer faults, as on a GPU.

use std::collections::BTreeMap;

/// Alignment of device allocations, as cuMemAlloc's (at least 256 bytes on real GPUs).
pub const ALIGN: usize = 512;
/// Unmapped bytes after every allocation's pages, so that running past its end is never
/// another allocation's memory, and faults.
pub const GAP: usize = PAGE;
pub const PAGE: usize = 4096;

pub fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|v| v / to * to)
}

pub struct Space {
    base: usize,
    len: usize,
    /// Next never-used address: fresh ranges are preferred, so that a stale pointer to freed
    /// memory keeps pointing at nothing for as long as possible.
    cursor: usize,
    /// Released ranges (start -> length), reused only once the fresh part is exhausted.
    free: BTreeMap<usize, usize>,
}

impl Space {
    /// Reserves the largest range it can, from 256 GiB down to 1 GiB.
    pub fn reserve() -> Option<Space> {
        let mut len: usize = 256 << 30;
        while len >= 1 << 30 {
            // SAFETY: a fresh anonymous PROT_NONE mapping at an address the kernel chooses;
            // it touches no existing memory.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                let base = p as usize;
                // The first 64 KiB stay unused: small offsets from the base are never valid.
                return Some(Space { base, len, cursor: base + 0x10000, free: BTreeMap::new() });
            }
            len /= 2;
        }
        None
    }

    pub fn contains(&self, addr: u64) -> bool {
        let a = addr as usize;
        a >= self.base && a < self.base + self.len
    }

    /// A range of `len` bytes (already a multiple of `align`, gap included) aligned to `align`.
    pub fn take(&mut self, len: usize, align: usize) -> Option<usize> {
        let start = round_up(self.cursor, align)?;
        if start.checked_add(len)? <= self.base + self.len {
            self.cursor = start + len;
            return Some(start);
        }
        let (&s, &l) = self.free.iter().find(|(&s, &l)| {
            let a = round_up(s, align).unwrap_or(usize::MAX);
            a.checked_add(len).is_some_and(|end| end <= s + l)
        })?;
        self.free.remove(&s);
        let a = round_up(s, align)?;
        if a > s {
            self.free.insert(s, a - s);
        }
        if a + len < s + l {
            self.free.insert(a + len, s + l - a - len);
        }
        Some(a)
    }

    /// Gives a range back (the caller has restored it to `PROT_NONE` if it mapped anything).
    pub fn release(&mut self, start: usize, len: usize) {
        self.free.insert(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_fresh_aligned_and_reused_only_when_exhausted() {
        let mut s = Space::reserve().expect("reserve");
        let a = s.take(1024, ALIGN).unwrap();
        let b = s.take(1024, PAGE).unwrap();
        assert_eq!(a % ALIGN, 0);
        assert_eq!(b % PAGE, 0);
        assert!(b >= a + 1024);
        s.release(a, 1024);
        let c = s.take(1024, ALIGN).unwrap();
        assert_ne!(c, a, "fresh space first");
        assert!(s.contains(c as u64) && !s.contains(0));
        s.cursor = s.base + s.len;
        assert_eq!(s.take(512, ALIGN), Some(a), "then released ranges");
        assert_eq!(s.take(512, ALIGN), Some(a + 512));
        assert_eq!(s.take(512, ALIGN), None);
    }
}
