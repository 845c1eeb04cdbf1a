//! The soak's buffers: one allocation per kind and direction, reused from call to
//! call as programs reuse tensors.

use super::call::Kind;
use crate::comm::{Buf, Fail};

/// An allocation of one kind; freed on drop.
pub enum Block {
    Malloc(*mut u8),
    Lib(Buf),
}

impl Block {
    pub fn ptr(&self) -> *mut u8 {
        match self {
            Block::Malloc(p) => *p,
            Block::Lib(b) => b.ptr,
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Block::Malloc(p) = self {
            // SAFETY: allocated by malloc below, freed once.
            unsafe { libc::free(*p as *mut libc::c_void) };
        }
    }
}

/// Per kind, a send and a receive allocation, kept from call to call (so recvbuffs
/// are reused as programs reuse tensors) and allocated anew when too small or drawn
/// fresh; the host mirrors of device buffers.
pub struct Pool {
    pub slots: [[Option<(Block, usize)>; 2]; 3],
    pub mirrors: [Vec<u64>; 2],
    pub allocations: u64,
}

impl Pool {
    pub fn new() -> Pool {
        Pool { slots: Default::default(), mirrors: [Vec::new(), Vec::new()], allocations: 0 }
    }

    /// The allocation `which` (0 send, 1 recv) of `kind`, at least `bytes` long.
    pub fn get(&mut self, kind: Kind, which: usize, bytes: usize, fresh: bool) -> Result<*mut u8, Fail> {
        let slot = &mut self.slots[kind as usize][which];
        let small = match slot {
            Some((_, cap)) => *cap < bytes,
            None => true,
        };
        if fresh || small {
            // Free first, so the new allocation may reuse the address (a stale mapping
            // of the old one must not serve it).
            *slot = None;
            let b = match kind {
                Kind::Malloc => {
                    // SAFETY: plain allocation, checked for NULL.
                    let p = unsafe { libc::malloc(bytes.max(64)) } as *mut u8;
                    if p.is_null() {
                        return Err(Fail::runtime(format!("malloc({bytes}) failed")));
                    }
                    Block::Malloc(p)
                }
                Kind::Host => Block::Lib(Buf::host(bytes)?),
                Kind::Device => Block::Lib(Buf::device(bytes)?),
            };
            self.allocations += 1;
            *slot = Some((b, bytes));
        }
        Ok(slot.as_ref().map_or(std::ptr::null_mut(), |(b, _)| b.ptr()))
    }

    /// Host memory of at least `bytes` (8-byte aligned) that mirrors device buffer `which`.
    pub fn mirror(&mut self, which: usize, bytes: usize) -> *mut u8 {
        let m = &mut self.mirrors[which];
        let words = bytes.div_ceil(8).max(8);
        if m.len() < words {
            m.resize(words, 0);
        }
        m.as_mut_ptr() as *mut u8
    }

    /// Frees everything (before each resource count).
    pub fn clear(&mut self) {
        self.slots = Default::default();
        self.mirrors = [Vec::new(), Vec::new()];
    }
}
