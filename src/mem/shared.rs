//! Host buffers that peers on the same host can map: the single-copy path.
//!
//! `fcclMemAllocHost` places buffers of [`SHARE_MIN`] bytes and more in a memfd
//! (shared memory with a file descriptor) instead of private memory. A rank that
//! sends a large message out of such a buffer names it — (serial, fd, offset) — and
//! the receiving rank maps the sender's memfd once (through `/proc/<pid>/fd/<fd>`,
//! which the kernel allows to processes that may read the sender's memory) and
//! copies or reduces straight out of the sender's buffer with ordinary loads. Each
//! byte then crosses memory once, at user-space copy speed, where moving it through
//! the shared rings costs two copies and the kernel's cross-memory attach runs at
//! half the speed of a user-space copy on the machines measured
//! (docs/results/2026-11-24-host-performance.md).
//!
//! Serial numbers are never reused within a process, so a receiver's cached mapping
//! can never stand for a different buffer; the free counter ([`Desc::epoch`]) tells
//! receivers when to drop mappings of buffers that may be gone.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::RwLock;

/// Allocations at least this large are shared: smaller messages go through the
/// rings anyway (below the engine's single-copy threshold), and each shared buffer
/// holds a file descriptor open.
pub const SHARE_MIN: usize = 32 << 10;
/// Peers' allocations this large are mapped at this alignment (a huge page).
const HUGE: usize = 2 << 20;

/// One shared allocation of this process.
#[derive(Clone, Copy)]
struct Region {
    base: usize,
    len: usize,
    fd: i32,
    serial: u64,
}

/// Live shared allocations, sorted by base address.
static REGIONS: RwLock<Vec<Region>> = RwLock::new(Vec::new());
/// Source of serial numbers (0 means "no region").
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);
/// Shared allocations freed so far.
static FREES: AtomicU32 = AtomicU32::new(0);

/// Where a peer finds a message inside a shared allocation of its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    /// Serial number of the allocation in its process (never reused).
    pub serial: u64,
    /// The allocation's file descriptor in its process.
    pub fd: i32,
    /// Bytes of the whole allocation (what the peer maps).
    pub region_len: u64,
    /// The message's offset inside the allocation.
    pub offset: u64,
    /// How many shared allocations the sender had freed when it sent this: a peer
    /// that sees it change drops its mappings (some may be of freed allocations).
    pub epoch: u32,
}

/// The shared allocation holding all of `[p, p + len)`, if any.
pub fn lookup(p: *const u8, len: usize) -> Option<Desc> {
    let addr = p as usize;
    let regions = REGIONS.read().unwrap_or_else(|e| e.into_inner());
    let i = regions.partition_point(|r| r.base <= addr).checked_sub(1)?;
    let r = regions[i];
    (addr + len <= r.base + r.len).then(|| Desc {
        serial: r.serial,
        fd: r.fd,
        region_len: r.len as u64,
        offset: (addr - r.base) as u64,
        epoch: FREES.load(Ordering::Acquire),
    })
}

/// `size` bytes of shared memory aligned to `align` (a power of two, at least a
/// page), advised for huge pages when `huge`; None when the system refuses a memfd
/// (then the caller allocates private memory: no single copy for this buffer).
pub fn alloc(size: usize, align: usize, huge: bool) -> Option<*mut u8> {
    // SAFETY: a constant NUL-terminated name; flags are valid.
    let fd = unsafe { libc::memfd_create(c"ferroccl-host".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let len = size.next_multiple_of(super::page_size());
    // SAFETY: fd is a fresh memfd.
    let p = if unsafe { libc::ftruncate(fd, len as libc::off_t) } == 0 {
        map_aligned(fd, len, align, libc::PROT_READ | libc::PROT_WRITE)
    } else {
        None
    };
    let Some(p) = p else {
        // SAFETY: fd is ours and not used after this.
        unsafe { libc::close(fd) };
        return None;
    };
    if huge {
        make_huge(fd, p, len);
    }
    let start = p as usize;
    let serial = NEXT_SERIAL.fetch_add(1, Ordering::Relaxed);
    let mut regions = REGIONS.write().unwrap_or_else(|e| e.into_inner());
    let at = regions.partition_point(|r| r.base < start);
    regions.insert(at, Region { base: start, len, fd, serial });
    Some(start as *mut u8)
}

/// Maps `len` bytes of `fd` shared, at an address aligned to `align` (so that a
/// huge page can be mapped whole).
fn map_aligned(fd: i32, len: usize, align: usize, prot: i32) -> Option<*mut u8> {
    // Reserve room to align, then map the file over the aligned part of it.
    let span = len + align;
    // SAFETY: a fresh anonymous reservation; no existing mapping is touched.
    let res = unsafe {
        libc::mmap(std::ptr::null_mut(), span, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    if res == libc::MAP_FAILED {
        return None;
    }
    let start = (res as usize).next_multiple_of(align);
    // SAFETY: [start, start + len) lies inside the reservation, which MAP_FIXED replaces.
    let p = unsafe { libc::mmap(start as *mut libc::c_void, len, prot, libc::MAP_SHARED | libc::MAP_FIXED, fd, 0) };
    // SAFETY: the parts of the reservation outside [start, start + len) are ours
    // and unused (the whole reservation on failure).
    unsafe {
        if p == libc::MAP_FAILED {
            libc::munmap(res, span);
            return None;
        }
        if start > res as usize {
            libc::munmap(res, start - res as usize);
        }
        let (end, res_end) = (start + len, res as usize + span);
        if res_end > end {
            libc::munmap(end as *mut libc::c_void, res_end - end);
        }
    }
    Some(p as *mut u8)
}

/// Backs `[p, p + len)` (all of memfd `fd`) with huge pages where the kernel
/// allows. Shared memory gets transparent huge pages only when
/// transparent_hugepage/shmem_enabled says so, which it often does not ("never"
/// on the machines measured), while private memory gets them on request; without
/// them every 4 KiB of a buffer is a TLB miss, which cost steps that stream
/// through user buffers 10-20% (docs/results/2026-11-24-host-performance.md). MADV_COLLAPSE (Linux 6.1)
/// builds them regardless of that setting from pages that exist, so the memfd is
/// filled first: about 1 ms per MiB, once, at allocation. Best effort: on older
/// kernels the buffer keeps 4 KiB pages.
fn make_huge(fd: i32, p: *mut u8, len: usize) {
    const MADV_COLLAPSE: i32 = 25;
    // SAFETY: p..p+len is our fresh mapping of fd; neither call changes its contents
    // (both fill with zeros, which a fresh memfd reads as anyway).
    unsafe {
        libc::madvise(p as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        if libc::fallocate(fd, 0, 0, len as libc::off_t) == 0 {
            libc::madvise(p as *mut libc::c_void, len, MADV_COLLAPSE);
        }
    }
}

/// Releases `p` if it is a shared allocation of this module; false otherwise.
pub fn free(p: *mut u8) -> bool {
    let mut regions = REGIONS.write().unwrap_or_else(|e| e.into_inner());
    let Ok(i) = regions.binary_search_by_key(&(p as usize), |r| r.base) else {
        return false;
    };
    let r = regions.remove(i);
    FREES.fetch_add(1, Ordering::Release);
    drop(regions);
    // SAFETY: the mapping and fd were created by `alloc` and are released once
    // (the region is gone from the table). Peers that mapped the memfd keep their
    // own mappings until they see the free counter move.
    unsafe {
        libc::munmap(r.base as *mut libc::c_void, r.len);
        libc::close(r.fd);
    }
    true
}

/// A peer's shared allocation mapped into this process: read only, or writable
/// for a rank that copies part of a message into its receiver's buffer (see
/// `transport::shm`'s shared reads).
pub struct PeerMapping {
    base: *const u8,
    len: usize,
    writable: bool,
}

// SAFETY: a mapping owned by this value; its address may be used from any thread.
unsafe impl Send for PeerMapping {}

impl PeerMapping {
    /// Maps allocation `d` of process `pid`, writable when `write`.
    pub fn open(pid: u32, d: &Desc, write: bool) -> Result<PeerMapping> {
        let path = format!("/proc/{pid}/fd/{}\0", d.fd);
        let (flags, prot) =
            if write { (libc::O_RDWR, libc::PROT_READ | libc::PROT_WRITE) } else { (libc::O_RDONLY, libc::PROT_READ) };
        // SAFETY: path is NUL-terminated.
        let fd = unsafe { libc::open(path.as_ptr() as *const libc::c_char, flags | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(Error::system(format!("opening {} failed: {}", &path[..path.len() - 1], last_err())));
        }
        let len = d.region_len as usize;
        // Aligned as the owner's mapping, so that its huge pages map whole here too.
        let align = if len >= HUGE { HUGE } else { super::page_size() };
        let p = map_aligned(fd, len, align, prot);
        let e = last_err();
        // SAFETY: our fd; the mapping (if any) keeps the memory.
        unsafe { libc::close(fd) };
        let Some(p) = p else {
            return Err(Error::system(format!("mapping {len} bytes of process {pid}'s buffer failed: {e}")));
        };
        Ok(PeerMapping { base: p as *const u8, len, writable: write })
    }
    /// Whether this mapping may be written.
    pub fn writable(&self) -> bool {
        self.writable
    }
    /// Bytes mapped.
    pub fn mapped_bytes(&self) -> usize {
        self.len
    }
    /// The mapped address of byte `offset` of the allocation.
    pub fn at(&self, offset: u64) -> *const u8 {
        debug_assert!((offset as usize) <= self.len);
        // SAFETY: offset is inside the mapping (checked by the caller against region_len).
        unsafe { self.base.add(offset as usize) }
    }
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

fn last_err() -> std::io::Error {
    std::io::Error::last_os_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_finds_the_region_of_a_range_and_nothing_outside() {
        let a = alloc(1 << 20, 2 << 20, true).expect("memfd");
        let b = alloc(SHARE_MIN, 4096, false).expect("memfd");
        assert_eq!(a as usize % (2 << 20), 0);
        let d = lookup(a.wrapping_add(4096), 8192).expect("inside a");
        assert_eq!((d.offset, d.region_len), (4096, 1 << 20));
        assert!(lookup(a.wrapping_add((1 << 20) - 8), 16).is_none(), "runs past the end");
        assert!(lookup(a.wrapping_sub(8), 8).is_none());
        let db = lookup(b, SHARE_MIN).expect("b");
        assert_ne!(d.serial, db.serial);
        // The memory is usable and visible through a second mapping of the fd.
        // SAFETY: a holds 1 MiB.
        unsafe { std::ptr::write_bytes(a, 0x5A, 1 << 20) };
        let m = PeerMapping::open(std::process::id(), &d, false).expect("map own fd");
        // SAFETY: the mapping holds region_len bytes.
        assert_eq!(unsafe { *m.at(12345) }, 0x5A);
        assert!(!m.writable());
        // A writable mapping (split copies write into a receiver's buffer) writes
        // the owner's memory.
        let w = PeerMapping::open(std::process::id(), &d, true).expect("map own fd writable");
        assert!(w.writable());
        // SAFETY: the mapping and `a` hold the same region_len bytes (offsets from the allocation's start).
        unsafe { *(w.at(100) as *mut u8) = 0xA5 };
        // SAFETY: `a` is valid for region_len bytes, of which 100 is one.
        assert_eq!(unsafe { *a.add(100) }, 0xA5);
        drop(w);
        let epoch = d.epoch;
        assert!(free(a));
        assert!(!free(a), "freed twice");
        assert!(lookup(a, 8).is_none());
        assert!(lookup(b, 8).unwrap().epoch > epoch);
        assert!(free(b));
    }
}
