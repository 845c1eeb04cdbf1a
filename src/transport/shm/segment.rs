//! A rank's shared-memory segment, and where everything in it lies.
//!
//! Every rank owns one segment: a header page (doorbell, sleep flag, failure flag,
//! pid, wait word), then one ring per peer into which that peer writes and from which
//! the owner reads (a control page, then the ring's bytes), then the rank's bulletin
//! board (`transport::board`). This file owns that layout: every other part of the
//! transport reaches the segment's words through the accessors here. Between
//! processes the segment is a POSIX shared-memory object that its owner unlinks once
//! every peer has mapped it; for thread ranks (see `inproc`) it is anonymous memory.
//! See docs/design/host.md, "Shared memory".

use crate::error::{Error, Result};
use crate::transport::failure::failure;
use crate::transport::wait::{futex_wait, futex_wake_all};
use std::ffi::CString;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

pub(super) const MAGIC: u64 = 0x4643_434c_5345_4731; // "FCCLSEG1"
const HEADER_BYTES: usize = 4096;
/// Bytes of a ring's control page, before its data.
pub(super) const RING_CTRL_BYTES: usize = 4096;
pub(super) const OFF_MAGIC: usize = 0;
const OFF_DOORBELL: usize = 64;
const OFF_SLEEPING: usize = 128;
const OFF_FAILED: usize = 192;
const OFF_PID: usize = 256;
/// The segment's address in its owner's address space (for the single-copy probe).
pub(super) const OFF_SELF_ADDR: usize = 320;
/// Whom the owner waits for while one of its waits is slow, and a tick it advances
/// while it waits (see [`Segment::waiting`] and `failure::blame`).
const OFF_WAITING: usize = 384;
/// How the owner left, once it has: [`LEFT_DESTROYED`] or [`LEFT_EXITED`] (0: it has
/// not, or it died), so that peers still waiting for it say so rather than "died".
const OFF_LEFT: usize = 448;
/// The owner destroyed its communicator.
pub const LEFT_DESTROYED: u32 = 1;
/// The owner's process exited (exit or a return from main) with the communicator open.
pub const LEFT_EXITED: u32 = 2;

// A ring's control page: one word per cache line, each written by one side.
/// Bytes written into the ring (the writer's).
pub(super) const OFF_HEAD: usize = 0;
/// Bytes read out of it (the reader's).
pub(super) const OFF_TAIL: usize = 128;
/// Direct messages of the writer that the reader has finished reading.
pub(super) const OFF_READS_DONE: usize = 256;
/// 1 when the reader can read the writer's memory directly.
pub(super) const OFF_CAN_READ: usize = 384;
/// 1 when the reader can map the writer's shared allocations.
pub(super) const OFF_CAN_MAP: usize = 512;
/// A split copy's claim word, seq << 32 | next piece (see `peer_mem::Share`).
pub(super) const OFF_SHARE_CLAIM: usize = 640;
/// Pieces of the split copy copied so far.
pub(super) const OFF_SHARE_DONE: usize = 768;
/// The split copy's destination: address, length, streaming stores, then the shared
/// allocation (serial, 0 for none; length; offset; fd | epoch << 32).
pub(super) const OFF_SHARE_DEST: usize = 896;
/// How far the reader has read the direct message it reads now, in order (see
/// `PeerMemory::report_read`): the message's number, then (the next word) the bytes
/// read. The reader writes the bytes first, then the number.
pub(super) const OFF_READ_PROGRESS: usize = 1024;

/// Bytes of the bulletin board at the end of every segment (`transport::board`
/// lays out its slots inside it), touched only when used.
pub const BOARD_BYTES: usize = 4096 + 4 * (64 + 512 + (64 << 10));

/// Bytes of ring per peer for a communicator of `nranks` ranks: large enough to
/// stream, small enough that a rank's segment stays bounded (32 MiB of rings at
/// most, touched lazily).
pub fn ring_bytes_for(nranks: usize) -> usize {
    let per_peer = (32usize << 20) / nranks.saturating_sub(1).max(1);
    per_peer.clamp(256 << 10, 4 << 20) & !4095
}

/// Total size of a segment for `nranks` ranks with rings of `ring_bytes`.
pub fn segment_bytes(nranks: usize, ring_bytes: usize) -> usize {
    HEADER_BYTES + nranks * (RING_CTRL_BYTES + ring_bytes) + BOARD_BYTES
}

/// Removes segments left in /dev/shm by processes that died before unlinking them
/// (names end in `-p<pid>`). Runs once per process.
pub fn remove_stale_segments() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(dir) = std::fs::read_dir("/dev/shm") else { return };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) =
                name.strip_prefix("fccl-").and_then(|n| n.rsplit_once("-p")).and_then(|(_, p)| p.parse::<i32>().ok())
            else {
                continue;
            };
            // SAFETY: signal 0 only checks whether the process exists.
            let gone = unsafe { libc::kill(pid, 0) } != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            if gone {
                if let Ok(c) = CString::new(format!("/{name}")) {
                    // SAFETY: c is a valid C string.
                    unsafe { libc::shm_unlink(c.as_ptr()) };
                }
            }
        }
    });
}

/// Removes the shared-memory names of the set-up `tag` (segments
/// `/fccl-<tag>-<rank>-p<pid>`, control regions `/fccl-ctl-<tag>-p<pid>`) whose creating
/// process has ended or is ending: a rank that died during set-up, before its names were
/// unlinked, leaves them, and its peers know the set-up's tag (a later process would
/// otherwise remove them only when it makes its first segment). A live process's names
/// are its own to remove. Returns the names removed.
pub fn remove_dead_of(tag: &str) -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return removed };
    let (seg, ctl) = (format!("fccl-{tag}-"), format!("fccl-ctl-{tag}-p"));
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&seg) && !name.starts_with(&ctl) {
            continue;
        }
        let Some(pid) = name.rsplit_once("-p").and_then(|(_, p)| p.parse::<u32>().ok()) else { continue };
        if crate::sys::process_gone(pid) {
            if let Ok(c) = CString::new(format!("/{name}")) {
                // SAFETY: c is a valid C string.
                if unsafe { libc::shm_unlink(c.as_ptr()) } == 0 {
                    removed.push(name);
                }
            }
        }
    }
    removed
}

/// Sweeps the names of ranks that died ([`remove_dead_of`]) when dropped, unless
/// disarmed: held over a set-up so that every way it fails sweeps.
pub struct SweepOnFailure {
    tag: Option<String>,
}

impl SweepOnFailure {
    pub fn new(tag: String) -> SweepOnFailure {
        SweepOnFailure { tag: Some(tag) }
    }

    /// The set-up succeeded: nothing to sweep.
    pub fn disarm(mut self) {
        self.tag = None;
    }
}

impl Drop for SweepOnFailure {
    fn drop(&mut self) {
        if let Some(tag) = self.tag.take() {
            let gone = remove_dead_of(&tag);
            if !gone.is_empty() {
                crate::log::info(format_args!(
                    "removed what ranks that died during set-up left in /dev/shm: {}",
                    gone.join(", ")
                ));
            }
        }
    }
}

/// Base addresses of the shared segments this process created and has mapped: at
/// exit each is marked [`LEFT_EXITED`] (see [`Segment::left`]).
static OWN: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

extern "C" fn mark_own_exited() {
    // Another thread may hold the lock as the process exits: then say nothing.
    if let Ok(own) = OWN.try_lock() {
        let me = std::process::id();
        for &base in own.iter() {
            // SAFETY: as below; a child forked after the segment was made is not its owner.
            if unsafe { ((base + OFF_PID) as *const u32).read_volatile() } != me {
                continue;
            }
            // SAFETY: a registered segment is mapped (it is removed before its unmap,
            // under this lock); OFF_LEFT is an aligned header word used atomically.
            let w = unsafe { &*((base + OFF_LEFT) as *const AtomicU32) };
            let _ = w.compare_exchange(0, LEFT_EXITED, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

fn register_own(base: usize) {
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a function that takes no arguments and never unwinds.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(mark_own_exited);
    });
    OWN.lock().unwrap_or_else(|p| p.into_inner()).push(base);
}

fn deregister_own(base: usize) {
    OWN.lock().unwrap_or_else(|p| p.into_inner()).retain(|&b| b != base);
}

/// A mapped segment; unmapped on drop.
pub struct Segment {
    base: *mut u8,
    len: usize,
    nranks: usize,
    ring_bytes: usize,
    /// Name of the shared-memory object while it still exists (owner only).
    shm_name: std::sync::Mutex<Option<CString>>,
}

// SAFETY: the mapping is plain memory; every concurrent access goes through
// atomics (header words, ring head/tail) or through ring regions that the SPSC
// protocol hands to exactly one side at a time.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Segment {
    /// Anonymous memory, for ranks that are threads of one process.
    pub fn anonymous(nranks: usize, ring_bytes: usize) -> Result<Segment> {
        let len = segment_bytes(nranks, ring_bytes);
        let p = crate::sys::map_private(len, "an in-process segment")?;
        let seg = Segment { base: p, len, nranks, ring_bytes, shm_name: std::sync::Mutex::new(None) };
        seg.init_header();
        Ok(seg)
    }

    /// Creates the named shared-memory object `name` and maps it.
    pub fn create_shared(name: &str, nranks: usize, ring_bytes: usize) -> Result<Segment> {
        let len = segment_bytes(nranks, ring_bytes);
        let cname = CString::new(name).map_err(|_| Error::internal("segment name with NUL"))?;
        // SAFETY: cname is a valid C string.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600) };
        if fd < 0 {
            return Err(Error::os(format!("shm_open({name}) to create the rank's segment")));
        }
        // SAFETY: fd is an open shared-memory object we own.
        let rc = unsafe { libc::ftruncate(fd, len as libc::off_t) };
        if rc != 0 {
            let e = Error::os(format!("ftruncate of shared-memory segment {name} to {len} bytes (is /dev/shm full?)"));
            // SAFETY: fd is open; cname valid.
            unsafe {
                libc::close(fd);
                libc::shm_unlink(cname.as_ptr());
            }
            return Err(e);
        }
        let seg = Self::map_fd(fd, len, name);
        // SAFETY: the mapping (if any) keeps its own reference; fd is ours to close.
        unsafe { libc::close(fd) };
        match seg {
            Ok(mut s) => {
                s.nranks = nranks;
                s.ring_bytes = ring_bytes;
                *s.shm_name.get_mut().unwrap() = Some(cname);
                s.init_header();
                register_own(s.base as usize);
                Ok(s)
            }
            Err(e) => {
                // SAFETY: cname valid.
                unsafe { libc::shm_unlink(cname.as_ptr()) };
                Err(e)
            }
        }
    }

    /// Maps a peer's existing segment.
    pub fn open_shared(name: &str, nranks: usize, ring_bytes: usize) -> Result<Segment> {
        let len = segment_bytes(nranks, ring_bytes);
        let cname = CString::new(name).map_err(|_| Error::internal("segment name with NUL"))?;
        // SAFETY: cname is a valid C string.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(Error::os(format!("shm_open({name}) to map a peer's segment")));
        }
        let seg = Self::map_fd(fd, len, name);
        // SAFETY: fd is ours to close.
        unsafe { libc::close(fd) };
        let mut seg = seg?;
        seg.nranks = nranks;
        seg.ring_bytes = ring_bytes;
        if seg.word64(OFF_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(Error::internal(format!("segment {name} has no valid header")));
        }
        Ok(seg)
    }

    fn map_fd(fd: i32, len: usize, name: &str) -> Result<Segment> {
        // Mapped lazily: each rank populates only the parts it uses (`populate`); the
        // object is at least `len` bytes (ftruncated by its owner).
        let p = crate::sys::map_shared(fd, len, &format!("shared-memory segment {name}"))?;
        Ok(Segment { base: p, len, nranks: 0, ring_bytes: 0, shm_name: std::sync::Mutex::new(None) })
    }

    fn init_header(&self) {
        // SAFETY: OFF_PID is inside the header page and 4-byte aligned.
        unsafe { (self.base.add(OFF_PID) as *mut u32).write_volatile(std::process::id()) };
        self.word64(OFF_SELF_ADDR).store(self.base as u64, Ordering::Relaxed);
        self.word64(OFF_MAGIC).store(MAGIC, Ordering::Release);
    }

    /// Removes the shared-memory name (the mapping stays valid). Idempotent.
    pub fn unlink(&self) {
        if let Some(n) = self.shm_name.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // SAFETY: n is a valid C string.
            unsafe { libc::shm_unlink(n.as_ptr()) };
        }
    }

    fn word32(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= self.len && off % 4 == 0);
        // SAFETY: in bounds, aligned, and only ever accessed atomically.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    /// The header word at `off` (one of this file's `OFF_` constants).
    pub(super) fn word64(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= self.len && off % 8 == 0);
        // SAFETY: in bounds, aligned, and only ever accessed atomically.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    /// Pid of the process that created the segment.
    pub fn pid(&self) -> u32 {
        // SAFETY: in-bounds header word written once before the magic was published.
        unsafe { (self.base.add(OFF_PID) as *const u32).read_volatile() }
    }

    /// The word its owner sleeps on; bumped by anyone who makes progress possible for it.
    pub fn doorbell(&self) -> &AtomicU32 {
        self.word32(OFF_DOORBELL)
    }

    fn sleeping(&self) -> &AtomicU32 {
        self.word32(OFF_SLEEPING)
    }

    /// Non-zero once the owner has failed or aborted: peers stop waiting for it.
    pub fn failed(&self) -> &AtomicU32 {
        self.word32(OFF_FAILED)
    }

    /// The owner's wait word: whom it waits for (high 32 bits: 0 nobody,
    /// `failure::WAIT_TEAM` the whole team, else 1 + the rank) and a tick (low 32) it
    /// advances every poll of a slow wait, so a stopped waiter can be told from a live one.
    pub fn waiting(&self) -> &AtomicU64 {
        self.word64(OFF_WAITING)
    }

    /// How the owner left ([`LEFT_DESTROYED`], [`LEFT_EXITED`]; 0 while it has not, or
    /// if it died). Peers read it only once the owner's process is gone, for the message.
    pub fn left(&self) -> &AtomicU32 {
        self.word32(OFF_LEFT)
    }

    /// Records that the owner destroyed its communicator (unless something was recorded).
    pub fn mark_destroyed(&self) {
        let _ = self.left().compare_exchange(0, LEFT_DESTROYED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// An error if the owner, rank `owner`, has marked itself failed (see `failed`).
    #[inline]
    pub fn check_failed(&self, owner: usize) -> Result<()> {
        match self.failed().load(Ordering::Acquire) {
            0 => Ok(()),
            v => Err(failure(owner, v)),
        }
    }

    /// Rings the owner's doorbell, waking it if it sleeps.
    pub fn ring(&self) {
        self.doorbell().fetch_add(1, Ordering::SeqCst);
        if self.sleeping().load(Ordering::SeqCst) != 0 {
            futex_wake_all(self.doorbell());
        }
    }

    /// Owner side: sleep until the doorbell moves past `seen` or `timeout` passes,
    /// unless `moved()` says that a peer wrote into a ring meanwhile. `seen` must
    /// have been read before the caller last checked its conditions. Peers that
    /// publish ring positions only [`Segment::notify`] (they ring only a sleeper):
    /// `moved()`, checked after announcing the sleep, catches what they published
    /// before they could see it.
    pub fn sleep(&self, seen: u32, moved: impl Fn() -> bool, timeout: Duration) {
        self.sleeping().store(1, Ordering::SeqCst);
        if self.doorbell().load(Ordering::SeqCst) == seen && !moved() {
            futex_wait(self.doorbell(), seen, timeout);
        }
        self.sleeping().store(0, Ordering::SeqCst);
    }

    /// Wakes the owner only if it sleeps. The caller must have published what the
    /// owner waits for with a SeqCst store (or fence) first; the owner re-checks its
    /// condition after announcing that it sleeps (see [`Segment::sleep_unless`]).
    pub fn notify(&self) {
        if self.sleeping().load(Ordering::SeqCst) != 0 {
            self.ring();
        }
    }

    /// Owner side: announces that it sleeps, then sleeps at most `timeout` unless
    /// `ready()` already holds. Pairs with [`Segment::notify`].
    pub fn sleep_unless(&self, ready: impl Fn() -> bool, timeout: Duration) {
        self.sleeping().store(1, Ordering::SeqCst);
        let seen = self.doorbell().load(Ordering::SeqCst);
        if !ready() {
            futex_wait(self.doorbell(), seen, timeout);
        }
        self.sleeping().store(0, Ordering::SeqCst);
    }

    /// Start of this segment's bulletin board (page aligned, [`BOARD_BYTES`] long).
    pub fn board_base(&self) -> *mut u8 {
        let off = self.board_off();
        debug_assert!(off + BOARD_BYTES <= self.len);
        // SAFETY: in bounds of the mapping (segment_bytes includes the board).
        unsafe { self.base.add(off) }
    }

    fn board_off(&self) -> usize {
        HEADER_BYTES + self.nranks * (RING_CTRL_BYTES + self.ring_bytes)
    }

    /// Bytes of each ring's data.
    pub(super) fn ring_bytes(&self) -> usize {
        self.ring_bytes
    }

    /// Start of the control page of the ring that rank `slot` writes into this
    /// segment (its data follows the page).
    pub(super) fn ring_ctrl(&self, slot: usize) -> *mut u8 {
        let off = self.ring_base(slot);
        // SAFETY: ring_base(slot) and the ring after it lie inside the mapping (segment_bytes).
        unsafe { self.base.add(off) }
    }

    /// Word `off` of the control page of ring `slot` (one of the ring `OFF_` constants).
    pub fn ring_word(&self, slot: usize, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= RING_CTRL_BYTES && off % 8 == 0);
        // SAFETY: inside the ring's control page, aligned, only ever accessed atomically.
        unsafe { &*(self.ring_ctrl(slot).add(off) as *const AtomicU64) }
    }

    /// Bytes rank `slot` has written into its ring here (the ring's head).
    pub fn ring_head(&self, slot: usize) -> &AtomicU64 {
        self.ring_word(slot, OFF_HEAD)
    }

    /// Bytes the owner has read out of rank `slot`'s ring here (the ring's tail).
    pub fn ring_tail(&self, slot: usize) -> &AtomicU64 {
        self.ring_word(slot, OFF_TAIL)
    }

    /// Maps the pages of `[off, off + len)` of the segment now, so that no call pays
    /// page faults later: a process maps shared memory page by page as it touches it,
    /// and the first calls of each size would otherwise fault once per ring and board
    /// page in both the writer and the reader. Best effort.
    fn populate(&self, off: usize, len: usize) {
        let page = 4096;
        let start = off & !(page - 1);
        let end = (off + len).min(self.len).next_multiple_of(page).min(self.len);
        if start >= end {
            return;
        }
        // SAFETY: [start, end) is inside the mapping; MADV_POPULATE_WRITE only faults
        // pages in (Linux 5.14+), it changes no data.
        let rc =
            unsafe { libc::madvise(self.base.add(start) as *mut libc::c_void, end - start, libc::MADV_POPULATE_WRITE) };
        if rc != 0 {
            // Older kernels: a read of every page faults it in (tmpfs and anonymous
            // shared pages are then mapped writable).
            for p in (start..end).step_by(page) {
                // SAFETY: in bounds of the mapping; a volatile read of one byte.
                unsafe { std::ptr::read_volatile(self.base.add(p)) };
            }
        }
    }

    /// Populates the ring that rank `slot` writes into this segment.
    pub fn populate_ring(&self, slot: usize) {
        self.populate(self.ring_base(slot), RING_CTRL_BYTES + self.ring_bytes);
    }

    /// Populates this segment's bulletin board.
    pub fn populate_board(&self) {
        self.populate(self.board_off(), BOARD_BYTES);
    }

    fn ring_base(&self, slot: usize) -> usize {
        assert!(slot < self.nranks);
        HEADER_BYTES + slot * (RING_CTRL_BYTES + self.ring_bytes)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        deregister_own(self.base as usize);
        self.unlink();
        // SAFETY: base/len describe a mapping we own; nothing borrows it past
        // drop because links hold an Arc to the segment.
        unsafe { crate::sys::unmap(self.base, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make(name: &str) {
        let c = CString::new(name).unwrap();
        // SAFETY: c is a valid C string; the descriptor is closed at once.
        unsafe {
            let fd = libc::shm_open(c.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o600);
            assert!(fd >= 0, "shm_open({name})");
            libc::close(fd);
        }
    }

    fn exists(name: &str) -> bool {
        std::path::Path::new("/dev/shm").join(name.trim_start_matches('/')).exists()
    }

    #[test]
    fn a_set_up_s_names_whose_creator_is_gone_are_swept_and_no_others() {
        let tag = format!("{:016x}", crate::comm::bootstrap::random_u64().unwrap());
        let other = format!("{:016x}", crate::comm::bootstrap::random_u64().unwrap());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let live = std::process::id();
        let gone = [
            format!("/fccl-{tag}-1-p{dead}"),
            format!("/fccl-ctl-{tag}-p{dead}"),
            format!("/fccl-{tag}-s0-c1-2-p{dead}"),
        ];
        let kept = [format!("/fccl-{tag}-0-p{live}"), format!("/fccl-{other}-1-p{dead}")];
        for n in gone.iter().chain(&kept) {
            make(n);
        }
        let mut removed = remove_dead_of(&tag);
        removed.sort();
        let mut want: Vec<String> = gone.iter().map(|n| n.trim_start_matches('/').to_string()).collect();
        want.sort();
        assert_eq!(removed, want);
        for n in &gone {
            assert!(!exists(n), "{n} is left");
        }
        for n in &kept {
            assert!(exists(n), "{n} was removed");
            let c = CString::new(n.as_str()).unwrap();
            // SAFETY: c is a valid C string.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
    }

    #[test]
    fn a_zombie_or_a_process_that_is_gone_counts_as_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not reaped yet: a zombie once it has exited.
        let t0 = std::time::Instant::now();
        while !crate::sys::process_gone(pid) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(crate::sys::process_gone(pid), "a zombie is not gone");
        child.wait().unwrap();
        assert!(crate::sys::process_gone(pid));
        assert!(!crate::sys::process_gone(std::process::id()));
    }
}
