//! Shared-memory rings between ranks on one host.
//!
//! Every rank owns one segment: a header (doorbell, sleep flag, failure flag, pid)
//! followed by one single-producer/single-consumer ring per peer, into which that
//! peer writes and from which the owner reads. A ring's `head` (bytes written) and
//! `tail` (bytes read) only grow; both are multiples of 8 so that elements of up to
//! 8 bytes never straddle the wrap point. Between processes the segment is a POSIX
//! shared-memory object that its owner unlinks once every peer has mapped it; for
//! thread ranks (see `inproc`) it is anonymous memory.

use super::wait::{futex_wait, futex_wake_all};
use super::Link;
use crate::env::SingleCopy;
use crate::error::{Error, Result};
use crate::mem::shared::{Desc, PeerMapping};
use std::ffi::CString;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MAGIC: u64 = 0x4643_434c_5345_4731; // "FCCLSEG1"
const HEADER_BYTES: usize = 4096;
const RING_CTRL_BYTES: usize = 4096;
const OFF_MAGIC: usize = 0;
const OFF_DOORBELL: usize = 64;
const OFF_SLEEPING: usize = 128;
const OFF_FAILED: usize = 192;
const OFF_PID: usize = 256;
/// The segment's address in its owner's address space (for the single-copy probe).
const OFF_SELF_ADDR: usize = 320;
/// Whom the owner waits for while one of its waits is slow, and a tick it advances
/// while it waits (see [`Segment::waiting`] and [`blame`]).
const OFF_WAITING: usize = 384;
const OFF_HEAD: usize = 0;
const OFF_TAIL: usize = 128;
/// Ring control: direct messages of the writer that the reader has finished reading.
const OFF_READS_DONE: usize = 256;
/// Ring control: 1 when the reader can read the writer's memory directly.
const OFF_CAN_READ: usize = 384;
/// Ring control: 1 when the reader can map the writer's shared allocations.
const OFF_CAN_MAP: usize = 512;
/// Ring control: a split copy's claim word, seq << 32 | next piece (see [`Share`]).
const OFF_SHARE_CLAIM: usize = 640;
/// Ring control: pieces of the split copy copied so far.
const OFF_SHARE_DONE: usize = 768;
/// Ring control: the split copy's destination: address, length, streaming stores,
/// then the shared allocation (serial, 0 for none; length; offset; fd | epoch << 32).
const OFF_SHARE_DEST: usize = 896;
/// Ring control: how far the reader has read the direct message it reads now,
/// in order (see `Link::report_read`): the message's number, then (the next word)
/// the bytes read. The reader writes the bytes first, then the number.
const OFF_READ_PROGRESS: usize = 1024;
/// Claim word while the receiver rewrites the destination.
const SHARE_BUSY: u64 = u64::MAX;
/// Peers' shared allocations a link keeps mapped at most, for reading and again for
/// writing (the oldest goes first).
const MAPS_MAX: usize = 64;

/// Bytes of ring per peer for a communicator of `nranks` ranks: large enough to
/// stream, small enough that a rank's segment stays bounded (32 MiB of rings at
/// most, touched lazily).
pub fn ring_bytes_for(nranks: usize) -> usize {
    let per_peer = (32usize << 20) / nranks.saturating_sub(1).max(1);
    per_peer.clamp(256 << 10, 4 << 20) & !4095
}

/// Total size of a segment for `nranks` ranks with rings of `ring_bytes`, followed
/// by the rank's bulletin board (see `board`), whose pages are touched only when used.
pub fn segment_bytes(nranks: usize, ring_bytes: usize) -> usize {
    HEADER_BYTES + nranks * (RING_CTRL_BYTES + ring_bytes) + super::board::BOARD_BYTES
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
        // SAFETY: a fresh anonymous mapping; arguments are valid constants.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::os(format!("mmap of {len} bytes for an in-process segment")));
        }
        let seg = Segment { base: p as *mut u8, len, nranks, ring_bytes, shm_name: std::sync::Mutex::new(None) };
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
        // Mapped lazily: each rank populates only the parts it uses (`populate`).
        // SAFETY: fd refers to an object of at least `len` bytes (ftruncated by its owner).
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(Error::os(format!("mmap of shared-memory segment {name} ({len} bytes)")));
        }
        Ok(Segment { base: p as *mut u8, len, nranks: 0, ring_bytes: 0, shm_name: std::sync::Mutex::new(None) })
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

    fn word64(&self, off: usize) -> &AtomicU64 {
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

    /// The owner's wait word: whom it waits for (high 32 bits: 0 nobody, [`WAIT_TEAM`]
    /// the whole team, else 1 + the rank) and a tick (low 32) it advances every poll of
    /// a slow wait, so a stopped waiter can be told from a live one.
    pub fn waiting(&self) -> &AtomicU64 {
        self.word64(OFF_WAITING)
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

    /// Start of this segment's bulletin board (page aligned, `board::BOARD_BYTES` long).
    pub(super) fn board_base(&self) -> *mut u8 {
        let off = HEADER_BYTES + self.nranks * (RING_CTRL_BYTES + self.ring_bytes);
        debug_assert!(off + super::board::BOARD_BYTES <= self.len);
        // SAFETY: in bounds of the mapping (segment_bytes includes the board).
        unsafe { self.base.add(off) }
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

    /// Maps the pages of `[off, off + len)` of the segment now, so that no call pays
    /// page faults later: without it, the first calls of each new size faulted once
    /// per ring and board page in both the writer and the reader (a process maps
    /// shared memory page by page as it touches it), which made the first sizes of
    /// a fresh process 2-8x slower. Best effort.
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
    pub(super) fn populate_board(&self) {
        let off = self.board_base() as usize - self.base as usize;
        self.populate(off, super::board::BOARD_BYTES);
    }

    fn ring_base(&self, slot: usize) -> usize {
        assert!(slot < self.nranks);
        HEADER_BYTES + slot * (RING_CTRL_BYTES + self.ring_bytes)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: base/len describe a mapping we own; nothing borrows it past
        // drop because links hold an Arc to the segment.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// One end of a ring: either the writer or the reader.
struct RingEnd {
    /// Keeps the mapping alive while the raw pointers below are in use.
    _seg: Arc<Segment>,
    ctrl: *mut u8,
    head: *const AtomicU64,
    tail: *const AtomicU64,
    data: *mut u8,
    size: usize,
}

// SAFETY: the pointers point into `seg`, which the Arc keeps alive; the SPSC
// protocol gives each end exclusive use of the regions it touches.
unsafe impl Send for RingEnd {}

impl RingEnd {
    fn new(seg: Arc<Segment>, slot: usize) -> RingEnd {
        let base = seg.ring_base(slot);
        // SAFETY: ring_base(slot) + control + data is inside the mapping (segment_bytes).
        let (head, tail, data) = unsafe {
            let b = seg.base.add(base);
            (b.add(OFF_HEAD) as *const AtomicU64, b.add(OFF_TAIL) as *const AtomicU64, b.add(RING_CTRL_BYTES))
        };
        let size = seg.ring_bytes;
        // SAFETY: as above.
        let ctrl = unsafe { seg.base.add(base) };
        RingEnd { _seg: seg, ctrl, head, tail, data, size }
    }
    fn ctrl_word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= RING_CTRL_BYTES && off % 8 == 0);
        // SAFETY: inside the ring's control page, aligned, only accessed atomically.
        unsafe { &*(self.ctrl.add(off) as *const AtomicU64) }
    }
    fn head(&self) -> &AtomicU64 {
        // SAFETY: valid for the life of seg; only accessed atomically.
        unsafe { &*self.head }
    }
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: as above.
        unsafe { &*self.tail }
    }
}

/// A split copy: the receiver of a large direct message and its sender copy it
/// together. The receiver publishes where the message goes (its destination, in
/// memory the sender can write: a shared allocation or, between threads, any
/// address) in the control page of the ring the message came through; both then
/// take pieces from one counter and copy them, the sender out of its own buffer
/// into the destination, the receiver as it reads any direct message. The read is
/// done, as always, when the receiver reports it (`direct_read_done`), which it
/// does once every piece is copied.
///
/// The claim word carries the message's number (the receiver's count of direct
/// reads done, plus one) beside the next piece, so a sender can only take pieces
/// of the message it sent: once every piece is taken, the number changes only
/// after the last copy is done. The destination is read as a sequence lock:
/// the receiver marks the claim word busy before it rewrites the destination.
#[derive(Clone, Copy)]
pub struct Share {
    ctrl: *mut u8,
}

/// Where a split copy writes (read from the receiver's offer).
#[derive(Clone, Copy, Debug)]
pub struct ShareDest {
    pub addr: u64,
    pub len: usize,
    /// Write with streaming stores (the receiver's choice for its buffer).
    pub stream: bool,
    /// The receiver's shared allocation holding it (None between threads).
    pub shared: Option<Desc>,
}

impl Share {
    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= RING_CTRL_BYTES && off % 8 == 0);
        // SAFETY: inside a ring's control page, which the link's segments keep
        // mapped while the link lives; aligned; only accessed atomically.
        unsafe { &*(self.ctrl.add(off) as *const AtomicU64) }
    }

    /// Receiver: offers the message it reads next from this ring (`dest`).
    fn publish(&self, dest: &ShareDest) {
        let seq = self.word(OFF_READS_DONE).load(Ordering::Relaxed) + 1;
        self.word(OFF_SHARE_CLAIM).store(SHARE_BUSY, Ordering::Relaxed);
        fence(Ordering::Release);
        let d = dest.shared.unwrap_or(Desc { serial: 0, fd: 0, region_len: 0, offset: 0, epoch: 0 });
        let fields = [
            dest.addr,
            dest.len as u64,
            dest.stream as u64,
            d.serial,
            d.region_len,
            d.offset,
            (d.fd as u32 as u64) | (d.epoch as u64) << 32,
        ];
        for (k, v) in fields.into_iter().enumerate() {
            self.word(OFF_SHARE_DEST + 8 * k).store(v, Ordering::Relaxed);
        }
        self.word(OFF_SHARE_DONE).store(0, Ordering::Relaxed);
        self.word(OFF_SHARE_CLAIM).store(seq << 32, Ordering::Release);
    }

    /// Sender: the destination of direct message `seq`, if its receiver offered it.
    pub fn offer(&self, seq: u64) -> Option<ShareDest> {
        let claim = self.word(OFF_SHARE_CLAIM);
        let w = claim.load(Ordering::Acquire);
        if w == SHARE_BUSY || w >> 32 != seq {
            return None;
        }
        let f: [u64; 7] = std::array::from_fn(|k| self.word(OFF_SHARE_DEST + 8 * k).load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        // Unchanged since the first look: the fields are those of message `seq`.
        if claim.load(Ordering::Relaxed) >> 32 != seq {
            return None;
        }
        let shared = (f[3] != 0).then(|| Desc {
            serial: f[3],
            region_len: f[4],
            offset: f[5],
            fd: f[6] as u32 as i32,
            epoch: (f[6] >> 32) as u32,
        });
        Some(ShareDest { addr: f[0], len: f[1] as usize, stream: f[2] != 0, shared })
    }

    /// Takes the next pieces of message `seq`, at most `most` of them, of the
    /// `pieces` it has: (first, how many); None when all are taken (or the message
    /// is no longer the one offered).
    pub fn take(&self, seq: u64, pieces: u64, most: u64) -> Option<(u64, u64)> {
        let claim = self.word(OFF_SHARE_CLAIM);
        let mut w = claim.load(Ordering::Acquire);
        loop {
            let next = w & 0xffff_ffff;
            if w == SHARE_BUSY || w >> 32 != seq || next >= pieces {
                return None;
            }
            let n = most.min(pieces - next);
            match claim.compare_exchange_weak(w, w + n, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some((next, n)),
                Err(now) => w = now,
            }
        }
    }

    /// Receiver: takes back an offer whose read failed (the run ends in an error),
    /// so the sender takes no more pieces of it; a piece it is copying right now
    /// (64 KiB) still lands.
    pub fn withdraw(&self) {
        self.word(OFF_SHARE_CLAIM).store(SHARE_BUSY, Ordering::Release);
    }

    /// `n` pieces taken with `take` have been copied.
    pub fn pieces_copied(&self, n: u64) {
        self.word(OFF_SHARE_DONE).fetch_add(n, Ordering::AcqRel);
    }

    /// Pieces copied so far, by both sides.
    pub fn pieces_done(&self) -> u64 {
        self.word(OFF_SHARE_DONE).load(Ordering::Acquire)
    }

    /// The number of the message this rank reads next through this ring (the
    /// receiver's side), for `take`.
    pub fn next_read(&self) -> u64 {
        self.word(OFF_READS_DONE).load(Ordering::Relaxed) + 1
    }
}

/// False once `pid` has exited, including while it waits to be reaped (a zombie
/// still answers kill(pid, 0) but will never write to a ring again).
fn process_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if rc != 0 {
        return std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => {
            !matches!(stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()), Some('Z' | 'X'))
        }
        Err(_) => true,
    }
}

/// Failure flags: 1 + the rank the failure started with in the low 24 bits, and why
/// in the high 8 (0: it died or failed; this: the flag's owner timed out waiting for
/// it); u32::MAX: an abort.
pub const FAILED_TIMEOUT: u32 = 1 << 24;
const FAILED_RANK: u32 = FAILED_TIMEOUT - 1;

/// The error for a peer whose failure flag holds `v` (see [`FAILED_TIMEOUT`]).
#[cold]
pub(crate) fn failure(peer: usize, v: u32) -> Error {
    let culprit = ((v & FAILED_RANK) - 1) as usize;
    if v == u32::MAX {
        Error::remote_rank(peer, format!("rank {peer} failed or aborted its communicator"))
    } else if v & FAILED_TIMEOUT != 0 {
        Error::remote_rank(
            culprit,
            format!(
                "rank {culprit} stopped making progress: rank {peer} timed out waiting for it (it is stopped, hung, or slower than FERROCCL_TIMEOUT_MS allows)"
            ),
        )
    } else if culprit == peer {
        Error::remote_rank(peer, format!("rank {peer} failed or aborted its communicator"))
    } else {
        Error::remote_rank(
            culprit,
            format!("rank {culprit} died or failed (reported by rank {peer}, which stopped because of it)"),
        )
    }
}

/// In a wait word (high 32 bits): waiting for the whole team, no rank in particular.
pub const WAIT_TEAM: u32 = u32::MAX;

/// A wait word of whom `target` says (0, [`WAIT_TEAM`] or 1 + rank) at `tick`.
pub fn wait_word(target: u32, tick: u32) -> u64 {
    (u64::from(target) << 32) | u64::from(tick)
}

/// The ranks that a timed-out wait of rank `me` for `start` (for the whole team when
/// empty) comes down to: the ranks that are not live waiters (a live waiter waits for
/// someone and advances its tick), among those `me` waits for if any, else among all;
/// when every rank waits (a deadlock of mismatched calls), the ones `me` waits for.
/// `word(p)` reads rank p's wait word (None where it cannot be seen: a peer on another
/// host, which counts as not waiting). The words are sampled twice, `gap` apart
/// (longer than a waiter's sleep between ticks), while `me` keeps ticking its own
/// (`own`), so that ranks timing out together see each other wait.
pub fn blame(
    me: usize,
    n: usize,
    word: impl Fn(usize) -> Option<u64>,
    own: Option<&AtomicU64>,
    start: &[usize],
    gap: Duration,
) -> Vec<usize> {
    let first: Vec<Option<u64>> = (0..n).map(&word).collect();
    let tick_own = || {
        if let Some(w) = own {
            let v = w.load(Ordering::Relaxed);
            let target = if v >> 32 != 0 { (v >> 32) as u32 } else { WAIT_TEAM };
            w.store(wait_word(target, (v as u32).wrapping_add(1)), Ordering::Release);
        }
    };
    let step = Duration::from_millis(5);
    let t0 = std::time::Instant::now();
    while t0.elapsed() < gap {
        tick_own();
        std::thread::sleep(step);
    }
    let live = |p: usize| match (first[p], word(p)) {
        (Some(a), Some(b)) => b >> 32 != 0 && a != b && a >> 32 == b >> 32,
        _ => false,
    };
    let stuck_of = |ranks: &mut dyn Iterator<Item = usize>| ranks.filter(|&p| p != me && !live(p)).collect::<Vec<_>>();
    let direct = stuck_of(&mut start.iter().copied());
    if !direct.is_empty() {
        return direct;
    }
    let anyone = stuck_of(&mut (0..n));
    if !anyone.is_empty() {
        return anyone;
    }
    start.iter().copied().filter(|&p| p != me).collect()
}

/// A bidirectional link to one peer through two rings.
pub struct ShmLink {
    peer: usize,
    tx: RingEnd,
    rx: RingEnd,
    /// Segment of the peer (its doorbell, failure flag and pid).
    peer_seg: Arc<Segment>,
    /// Cached positions: we are the only writer of tx.head and of rx.tail.
    tx_head: u64,
    rx_tail: u64,
    /// The peer's read position in our ring as last loaded: it only grows, so the
    /// free space it implies is a lower bound. While that bound is at least half
    /// the ring, `send_space` does not load the position again: the peer writes it
    /// at every read, and loading it took that cache line back from the peer's
    /// core on every small message.
    tx_tail: u64,
    check_pid: bool,
    /// The peer is a thread of this process: its addresses are ours.
    same_process: bool,
    /// The peer's shared allocations mapped here to read its direct messages, and
    /// (writable) to copy parts of ours into its buffers. Two caches, so that
    /// neither evicts or drops the mapping the other's current message uses: each
    /// is consulted only when a message starts, one message at a time per link.
    reads: Mappings,
    writes: Mappings,
    /// The peer's buffers mapped writable to swap blocks with ours (in-place
    /// all_to_all, as the side that offers): a third cache, used by incoming
    /// messages while the outgoing ones use `writes`.
    swaps: Mappings,
    /// Set when the peer's buffers could not be mapped writable: no split copies
    /// into them from then on.
    no_share_writes: bool,
    /// Whether the first split copy to this peer has been logged.
    share_logged: bool,
    /// Whether the first swap offered to this peer has been logged.
    swap_logged: bool,
}

/// Reads `len` bytes at `addr` in process `pid` into `dst` (cross-memory attach), or
/// copies them when `pid` is this process.
fn read_process(pid: u32, addr: u64, dst: *mut u8, len: usize) -> std::io::Result<()> {
    if pid == std::process::id() {
        // SAFETY: same address space; the peer keeps [addr, addr+len) valid and
        // unmodified until we report the read done, and dst is ours for len bytes.
        unsafe { std::ptr::copy_nonoverlapping(addr as usize as *const u8, dst, len) };
        return Ok(());
    }
    let mut done = 0usize;
    while done < len {
        // SAFETY: done < len, so dst + done stays inside the destination.
        let local = libc::iovec { iov_base: unsafe { dst.add(done) } as *mut libc::c_void, iov_len: len - done };
        let remote = libc::iovec { iov_base: (addr as usize + done) as *mut libc::c_void, iov_len: len - done };
        // SAFETY: local describes memory we own; the kernel checks the remote range.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            let e = std::io::Error::last_os_error();
            if n < 0 && e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(if n == 0 { std::io::Error::from(std::io::ErrorKind::UnexpectedEof) } else { e });
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether this process may read `peer`'s memory: reads the word at the peer
/// segment's self address and compares it with the magic that starts it.
fn probe_read(peer: &Segment) -> bool {
    let pid = peer.pid();
    let addr = peer.word64(OFF_SELF_ADDR).load(Ordering::Relaxed);
    let mut v = 0u64;
    read_process(pid, addr + OFF_MAGIC as u64, &mut v as *mut u64 as *mut u8, 8).is_ok() && v == MAGIC
}

/// Whether this process may open process `pid`'s file descriptors (to map its
/// shared allocations): the kernel checks the same permission for the directory.
fn probe_map(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok()
}

/// Lets this job's peers on this host read this process's memory where Yama needs
/// it, and no one else. Only cross-memory attach (`process_vm_readv`, used by
/// FERROCCL_SINGLE_COPY=cma) needs ptrace-attach rights; mapped single copy opens
/// `/proc/<pid>/fd/<n>`, a read-mode check that Yama leaves alone, and the rings are
/// shared memory. Yama's ptrace_scope 1 lets a process attach only to descendants and
/// to processes that declared it (or an ancestor of it) their tracer, one pid each:
/// the declared pid is the nearest common ancestor of this rank and its `peers`
/// (ferroccl-run, torchrun's agent, slurmstepd, a test's parent), so that the job's
/// ranks and that launcher's other descendants qualify, not every process of the user
/// (PR_SET_PTRACER_ANY). Without such an ancestor nothing is declared and `probe_read`
/// fails, so peers use the rings. Scope 0 restricts nothing; 2 and 3 ignore declarations.
/// See docs/robustness.md, "Rendezvous and set-up".
pub fn allow_peer_reads(peers: &[u32]) {
    if crate::env::single_copy() != SingleCopy::Cma || peers.is_empty() || yama_scope() != Some(1) {
        return;
    }
    static DECLARED: std::sync::Mutex<Option<u32>> = std::sync::Mutex::new(None);
    let mut declared = DECLARED.lock().unwrap_or_else(|p| p.into_inner());
    let mine = ancestors(std::process::id());
    let chains: Vec<Vec<u32>> = peers.iter().map(|&p| ancestors(p)).collect();
    let Some(tracer) = tracer_for(&mine, &chains, *declared) else {
        crate::log::info(format_args!(
            "ptrace_scope is 1 and this rank's peers (pids {peers:?}) have no close common ancestor to declare as their tracer; cross-memory attach stays off and large messages go through the shared rings"
        ));
        return;
    };
    if *declared != Some(tracer) {
        // SAFETY: prctl with these arguments only changes who may ptrace-attach to us.
        let rc = unsafe { libc::prctl(libc::PR_SET_PTRACER, tracer as libc::c_ulong, 0, 0, 0) };
        if rc == 0 {
            *declared = Some(tracer);
        }
    }
}

/// The tracer to declare: the nearest common ancestor of this process (`mine`, its
/// ancestor chain from itself up), every peer (their chains) and an earlier
/// declaration, unless that is this process, pid 1, or more than
/// [`MAX_TRACER_GENERATIONS`] above this process.
fn tracer_for(mine: &[u32], peers: &[Vec<u32>], declared: Option<u32>) -> Option<u32> {
    let mut top = declared.map_or(Some(0), |t| mine.iter().position(|&a| a == t))?;
    for chain in peers {
        top = top.max(chain.iter().find_map(|a| mine.iter().position(|m| m == a))?);
    }
    let tracer = *mine.get(top)?;
    // pid 1 (or a far ancestor such as a login shell) is every process's ancestor.
    (top > 0 && top <= MAX_TRACER_GENERATIONS && tracer > 1).then_some(tracer)
}

/// How far up a declared tracer may be: a launcher, or a launcher's shell wrapper.
const MAX_TRACER_GENERATIONS: usize = 3;

/// `/proc/sys/kernel/yama/ptrace_scope`, or None without Yama.
fn yama_scope() -> Option<u8> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok()?.trim().parse().ok()
}

/// `pid`, its parent, grandparent, ... up to pid 1 (empty if `pid` is not visible).
fn ancestors(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut p = pid;
    while p > 0 && out.len() < 256 {
        out.push(p);
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { break };
        // "pid (comm) state ppid ...": the command name may hold spaces and parentheses.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        match ppid {
            Some(pp) if pp != p => p = pp,
            _ => break,
        }
    }
    out
}

impl ShmLink {
    /// Link between `me` and `peer`, where `segs[r]` is rank r's segment.
    pub fn new(me: usize, peer: usize, my_seg: Arc<Segment>, peer_seg: Arc<Segment>, check_pid: bool) -> ShmLink {
        peer_seg.populate_ring(me);
        my_seg.populate_ring(peer);
        let tx = RingEnd::new(peer_seg.clone(), me);
        let rx = RingEnd::new(my_seg, peer);
        let tx_head = tx.head().load(Ordering::Acquire);
        let rx_tail = rx.tail().load(Ordering::Acquire);
        // Tell the peer whether it may hand us large messages by address: any
        // memory when it is a thread of this process or when cross-memory attach
        // is asked for and works, its shared allocations when we may open its fds.
        let mode = crate::env::single_copy();
        let pid = peer_seg.pid();
        let same_process = pid == std::process::id();
        let can_read = match mode {
            SingleCopy::Off => false,
            SingleCopy::Mapped => same_process,
            SingleCopy::Cma => same_process || probe_read(&peer_seg),
        };
        let can_map = mode != SingleCopy::Off && (same_process || probe_map(pid));
        rx.ctrl_word(OFF_CAN_READ).store(u64::from(can_read), Ordering::Release);
        rx.ctrl_word(OFF_CAN_MAP).store(u64::from(can_map), Ordering::Release);
        let tx_tail = tx.tail().load(Ordering::Acquire);
        ShmLink {
            peer,
            tx,
            rx,
            peer_seg,
            tx_head,
            rx_tail,
            tx_tail,
            check_pid,
            same_process,
            reads: Mappings::default(),
            writes: Mappings::default(),
            swaps: Mappings::default(),
            no_share_writes: false,
            share_logged: false,
            swap_logged: false,
        }
    }
}

impl Link for ShmLink {
    fn peer(&self) -> usize {
        self.peer
    }

    fn send_space(&mut self) -> &mut [u8] {
        if ((self.tx_head - self.tx_tail) as usize) > self.tx.size / 2 {
            self.tx_tail = self.tx.tail().load(Ordering::Acquire);
        }
        let used = (self.tx_head - self.tx_tail) as usize;
        let free = self.tx.size - used;
        let pos = (self.tx_head % self.tx.size as u64) as usize;
        let n = free.min(self.tx.size - pos);
        // SAFETY: [pos, pos+n) is free ring space that the reader does not touch
        // until we publish a head past it.
        unsafe { std::slice::from_raw_parts_mut(self.tx.data.add(pos), n) }
    }

    fn send_commit(&mut self, n: usize) {
        debug_assert!(n % 8 == 0);
        if n == 0 {
            return;
        }
        self.tx_head += n as u64;
        self.tx.head().store(self.tx_head, Ordering::Release);
        // The peer is woken only if it sleeps (see `Segment::sleep`): ringing its
        // doorbell every time took the doorbell's cache line from a peer that polls
        // it, a transfer between cores on every message.
        fence(Ordering::SeqCst);
        self.peer_seg.notify();
    }

    fn rewind_gap(&mut self, min: usize) -> Option<usize> {
        let pos = (self.tx_head % self.tx.size as u64) as usize;
        if pos < min.max(1) || self.tx.tail().load(Ordering::Acquire) != self.tx_head {
            return None;
        }
        // The tail just read: a cached one from before the last wrap would make
        // `send_space` offer less than the gap, and the skip go out in two pieces.
        self.tx_tail = self.tx_head;
        Some(self.tx.size - pos)
    }

    fn recv_avail(&mut self) -> &[u8] {
        let head = self.rx.head().load(Ordering::Acquire);
        let avail = (head - self.rx_tail) as usize;
        let pos = (self.rx_tail % self.rx.size as u64) as usize;
        let n = avail.min(self.rx.size - pos);
        // SAFETY: [pos, pos+n) was published by the writer (Acquire on head) and
        // is not rewritten until we publish a tail past it.
        unsafe { std::slice::from_raw_parts(self.rx.data.add(pos), n) }
    }

    fn recv_commit(&mut self, n: usize) {
        debug_assert!(n % 8 == 0);
        if n == 0 {
            return;
        }
        self.rx_tail += n as u64;
        self.rx.tail().store(self.rx_tail, Ordering::Release);
        // The peer may be waiting for ring space (asleep: see send_commit).
        fence(Ordering::SeqCst);
        self.peer_seg.notify();
    }

    fn check_flag(&self) -> Result<()> {
        self.peer_seg.check_failed(self.peer)
    }

    fn wait_word(&self) -> Option<u64> {
        Some(self.peer_seg.waiting().load(Ordering::Acquire))
    }

    fn check_alive(&self) -> Result<()> {
        self.check_flag()?;
        if self.check_pid {
            let pid = self.peer_seg.pid();
            if !process_alive(pid) {
                // A peer that failed because of another rank marks itself so before it
                // exits, possibly just after the look above: that rank is the origin.
                self.check_flag()?;
                return Err(Error::remote_rank(self.peer, format!("rank {} (pid {pid}) died", self.peer)));
            }
        }
        Ok(())
    }

    fn activity(&self) -> u64 {
        let head = self.rx.head().load(Ordering::Acquire);
        head.wrapping_add(self.tx.tail().load(Ordering::Acquire))
    }

    fn wake_peer(&self) {
        self.peer_seg.ring();
    }

    fn peer_reads_directly(&self) -> bool {
        self.tx.ctrl_word(OFF_CAN_READ).load(Ordering::Acquire) == 1
    }

    fn direct_reads_done(&self) -> u64 {
        self.tx.ctrl_word(OFF_READS_DONE).load(Ordering::Acquire)
    }

    fn read_direct(&self, addr: u64, dst: *mut u8, len: usize) -> Result<()> {
        read_process(self.peer_seg.pid(), addr, dst, len).map_err(|e| {
            self.check_alive().err().unwrap_or_else(|| {
                Error::system(format!(
                    "reading {len} bytes directly from rank {} failed: {e}; set FERROCCL_SINGLE_COPY=0 to move data through shared memory only",
                    self.peer
                ))
            })
        })
    }

    fn counts_reads(&self) -> bool {
        true
    }

    fn direct_read_done(&self) {
        self.rx.ctrl_word(OFF_READS_DONE).fetch_add(1, Ordering::AcqRel);
        self.peer_seg.ring();
    }

    fn report_read(&self, bytes: usize) {
        let seq = self.rx.ctrl_word(OFF_READS_DONE).load(Ordering::Relaxed) + 1;
        self.rx.ctrl_word(OFF_READ_PROGRESS + 8).store(bytes as u64, Ordering::Relaxed);
        self.rx.ctrl_word(OFF_READ_PROGRESS).store(seq, Ordering::Release);
        self.peer_seg.ring();
    }

    fn peer_read(&self, seq: u64) -> usize {
        if self.tx.ctrl_word(OFF_READ_PROGRESS).load(Ordering::Acquire) != seq {
            return 0;
        }
        // Written before the number was: this message's count or a later one's,
        // which the reader writes only once this message is read (the sender then
        // sees it done through OFF_READS_DONE and no longer asks).
        self.tx.ctrl_word(OFF_READ_PROGRESS + 8).load(Ordering::Relaxed) as usize
    }

    fn peer_maps(&self) -> bool {
        self.tx.ctrl_word(OFF_CAN_MAP).load(Ordering::Acquire) == 1
    }

    fn direct_source(&mut self, addr: u64, len: usize, shared: Option<&Desc>) -> Result<Option<*const u8>> {
        if self.same_process {
            return Ok(Some(addr as usize as *const u8));
        }
        let Some(d) = shared else { return Ok(None) };
        match self.reads.get(self.peer, self.peer_seg.pid(), d, len, false)? {
            Ok(p) => Ok(Some(p as *const u8)),
            // Cross-memory attach, where it works, still reaches the bytes.
            Err(_) if self.rx.ctrl_word(OFF_CAN_READ).load(Ordering::Relaxed) == 1 => Ok(None),
            Err(e) => {
                self.check_alive()?;
                Err(Error::system(format!(
                    "reading {len} bytes straight from rank {}'s buffer failed ({}); set FERROCCL_SINGLE_COPY=0 to move data through shared memory only",
                    self.peer, e.msg
                )))
            }
        }
    }

    fn share_offer(&mut self, dst: *mut u8, len: usize, stream: bool) -> Option<Share> {
        if !crate::env::split_copy() {
            return None;
        }
        // The peer writes there: any address of ours when it is a thread of this
        // process, otherwise only a shared allocation that it maps.
        let shared = if self.same_process {
            None
        } else if self.peer_maps() {
            Some(crate::mem::shared::lookup(dst, len)?)
        } else {
            return None;
        };
        let slot = Share { ctrl: self.rx.ctrl };
        slot.publish(&ShareDest { addr: dst as usize as u64, len, stream, shared });
        Some(slot)
    }

    fn share_slot(&self) -> Option<Share> {
        crate::env::split_copy().then_some(Share { ctrl: self.tx.ctrl })
    }

    fn share_target(&mut self, dest: &ShareDest) -> Result<Option<*mut u8>> {
        let p = if self.same_process {
            dest.addr as usize as *mut u8
        } else {
            let Some(d) = dest.shared.as_ref() else { return Ok(None) };
            if self.no_share_writes {
                return Ok(None);
            }
            match self.writes.get(self.peer, self.peer_seg.pid(), d, dest.len, true)? {
                Ok(p) => p,
                Err(e) => {
                    // Copies into this peer's buffers stay with the peer from now on.
                    crate::log::info(format_args!(
                        "rank {}'s buffers cannot be mapped writable here ({}); it copies what it receives from this rank alone",
                        self.peer, e.msg
                    ));
                    self.no_share_writes = true;
                    return Ok(None);
                }
            }
        };
        if !self.share_logged {
            self.share_logged = true;
            crate::log::info(format_args!(
                "split copy: this rank copies parts of its large messages to rank {} straight into rank {}'s buffers",
                self.peer, self.peer
            ));
        }
        Ok(Some(p))
    }

    fn swap_capable(&self, at: *const u8, len: usize) -> bool {
        if !crate::env::split_copy() || self.no_share_writes {
            return false;
        }
        self.same_process || (self.peer_maps() && crate::mem::shared::lookup(at, len).is_some())
    }

    fn swap_target(&mut self, addr: u64, len: usize, shared: Option<&Desc>) -> Result<*mut u8> {
        if !self.swap_logged {
            self.swap_logged = true;
            crate::log::info(format_args!(
                "in-place swap: this rank and rank {} swap blocks of in-place calls (all_to_all, all_reduce, send/recv pairs) between their buffers, this rank offering",
                self.peer
            ));
        }
        self.peer_writable(addr, len, shared, "swapping")
    }

    fn tee_target(&mut self, addr: u64, len: usize, shared: Option<&Desc>) -> Result<*mut u8> {
        self.peer_writable(addr, len, shared, "writing the sender's own copy of")
    }

    fn peer_buffer(&mut self, addr: u64, len: usize, shared: Option<&Desc>, write: bool) -> Result<Option<*mut u8>> {
        if self.same_process {
            return Ok(Some(addr as usize as *mut u8));
        }
        let Some(d) = shared else { return Ok(None) };
        // Writable mappings are the swaps' (the same buffers, mapped once).
        let maps = if write { &mut self.swaps } else { &mut self.reads };
        match maps.get(self.peer, self.peer_seg.pid(), d, len, write)? {
            Ok(p) => Ok(Some(p)),
            Err(e) => {
                self.check_alive()?;
                crate::log::info(format_args!(
                    "rank {}'s buffer ({len} bytes) cannot be mapped here ({}); this rank leaves the work on it to the others, and later calls keep to the links",
                    self.peer, e.msg
                ));
                self.no_share_writes = true;
                Ok(None)
            }
        }
    }
}

impl ShmLink {
    /// The peer's `len` bytes at `addr` (in its shared allocation `shared`), mapped
    /// writable here for `what` (the error names it): see `Link::swap_target`.
    fn peer_writable(&mut self, addr: u64, len: usize, shared: Option<&Desc>, what: &str) -> Result<*mut u8> {
        if self.same_process {
            return Ok(addr as usize as *mut u8);
        }
        let Some(d) = shared else {
            return Err(Error::internal(format!(
                "rank {} asked for {what} {len} bytes of a buffer it does not share",
                self.peer
            )));
        };
        match self.swaps.get(self.peer, self.peer_seg.pid(), d, len, true)? {
            Ok(p) => Ok(p),
            Err(e) => {
                self.check_alive()?;
                // Later calls keep to this side's own buffers with this peer.
                self.no_share_writes = true;
                Err(Error::system(format!(
                    "{what} {len} bytes in rank {}'s buffer failed: it cannot be mapped writable here ({}); set FERROCCL_SPLIT_COPY=0 to keep every rank to its own buffers",
                    self.peer, e.msg
                )))
            }
        }
    }
}

/// A peer's shared allocations mapped here, oldest first, and the peer's free
/// counter when they were checked last (see `mem::shared::Desc::epoch`).
#[derive(Default)]
struct Mappings {
    maps: Vec<(u64, PeerMapping)>,
    epoch: u32,
}

impl Mappings {
    /// Where `len` bytes at `d` (a shared allocation of `peer`, process `pid`) are
    /// mapped here, writable when `write`: from these mappings, or mapped now. Err
    /// when `d` does not hold them (a corrupt message: fatal); Ok(Err) when mapping
    /// failed.
    fn get(
        &mut self,
        peer: usize,
        pid: u32,
        d: &Desc,
        len: usize,
        write: bool,
    ) -> Result<std::result::Result<*mut u8, Error>> {
        if d.offset.checked_add(len as u64).map_or(true, |end| end > d.region_len) {
            return Err(Error::internal(format!(
                "rank {peer} named {len} bytes at offset {} of a shared buffer of {} bytes",
                d.offset, d.region_len
            )));
        }
        if d.epoch != self.epoch {
            // The peer freed shared buffers since we last looked: drop our mappings
            // (some may be of those), so their memory goes back to the system.
            self.maps.clear();
            self.epoch = d.epoch;
        }
        let fits = |(s, m): &&(u64, PeerMapping)| {
            *s == d.serial && m.mapped_bytes() == d.region_len as usize && m.writable() == write
        };
        if let Some((_, m)) = self.maps.iter().find(fits) {
            return Ok(Ok(m.at(d.offset) as *mut u8));
        }
        match PeerMapping::open(pid, d, write) {
            Ok(m) => {
                if self.maps.len() >= MAPS_MAX {
                    self.maps.remove(0);
                }
                let p = m.at(d.offset) as *mut u8;
                self.maps.push((d.serial, m));
                Ok(Ok(p))
            }
            Err(e) => Ok(Err(e)),
        }
    }
}

#[cfg(test)]
mod ptracer_tests {
    use super::*;

    #[test]
    fn the_declared_tracer_is_the_nearest_common_ancestor() {
        // Ranks 200, 201 and 202 are children of launcher 100, under shell 50, under init.
        let me = [200, 100, 50, 1];
        let sibling = |p| vec![p, 100, 50, 1];
        assert_eq!(tracer_for(&me, &[sibling(201), sibling(202)], None), Some(100));
        // A rank behind a shell wrapper: the launcher is two generations up from it.
        assert_eq!(tracer_for(&me, &[vec![300, 299, 100, 50, 1]], None), Some(100));
        // An earlier communicator's tracer further up stays declared.
        assert_eq!(tracer_for(&me, &[sibling(201)], Some(50)), Some(50));
        // Only init in common, or a peer this process cannot see: nothing is declared.
        assert_eq!(tracer_for(&me, &[vec![400, 1]], None), None);
        assert_eq!(tracer_for(&me, &[vec![]], None), None);
        // A far ancestor (a login session) is not declared.
        assert_eq!(tracer_for(&[9, 8, 7, 6, 5, 1], &[vec![10, 5, 1]], None), None);
        // Peers descended from this process: nothing to declare.
        assert_eq!(tracer_for(&me, &[vec![500, 200, 100, 50, 1]], None), None);
    }

    #[test]
    fn ancestors_walk_up_from_this_process() {
        let a = ancestors(std::process::id());
        assert_eq!(a[0], std::process::id());
        // SAFETY: getppid has no preconditions.
        assert_eq!(a.get(1).copied(), Some(unsafe { libc::getppid() } as u32));
    }
}

#[cfg(test)]
mod ring_tests {
    use super::*;

    /// A rewind offers the whole gap to the ring's start at once, also when the
    /// writer's cached tail dates from before the ring last wrapped: a skip that
    /// goes out in two pieces can be cut in the middle by a reader's call ending.
    #[test]
    fn a_rewind_is_published_in_one_piece() {
        let ring = 64 << 10;
        let segs: Vec<Arc<Segment>> = (0..2).map(|_| Arc::new(Segment::anonymous(2, ring).expect("segment"))).collect();
        let mut tx = ShmLink::new(0, 1, segs[0].clone(), segs[1].clone(), false);
        let mut rx = ShmLink::new(1, 0, segs[1].clone(), segs[0].clone(), false);
        // Messages the reader takes at once, until the ring has wrapped a few times.
        let mut rewinds = 0;
        for k in 0..200usize {
            if let Some(gap) = tx.rewind_gap(8) {
                assert_eq!(tx.send_space().len(), gap, "message {k}: the whole gap is free");
                rewinds += 1;
            }
            let n = (k * 5273 % (ring / 3)).next_multiple_of(8).max(8);
            let n = n.min(tx.send_space().len());
            tx.send_commit(n);
            let got = rx.recv_avail().len();
            rx.recv_commit(got);
        }
        assert!(rewinds > 100, "{rewinds} rewinds checked");
    }
}
