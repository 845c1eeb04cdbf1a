//! The control region of a communicator whose ranks share one GPU: host shared memory
//! that every rank maps. Its first part, the words, each rank registers with CUDA
//! (host-mapped), so that the ranks' streams order themselves with stream memory
//! operations (`cuStreamWriteValue32` / `cuStreamWaitValue32`) on them, and the host
//! can read them (to know what the GPU has done) and write them (to release waits
//! that would never end) without asking the GPU. The rest is for the hosts only: each
//! rank's log of freed allocations that peers may have mapped, and per ordered pair
//! of ranks the mailbox of send/recv descriptors and a bounce buffer; then why the
//! communicator failed (the first rank to give up writes it), and per rank a ring of
//! posted collective descriptors (`post`: the per-call exchange's replacement when
//! calls are not agreed on the host, see `posts`).
//!
//! Words, each on its own 64-byte line: `done` (the last collective the executor
//! finished), `failed` (non-zero once a rank gave up on the communicator; every rank
//! sees it), `ready[r]` (the last collective whose inputs rank r's stream had ready),
//! `fin[r]` (the last collective whose share rank r's stream finished, under MPS);
//! then per ordered pair (p, q) two words on one 8-byte slot: `sent` (slot of the last
//! fcclSend p -> q whose buffer p's stream had ready) and `recvd` (the last one q's
//! stream copied); then per rank a line of two words, `ping` and `pong`, on which it
//! proves once that its stream memory operations work ([`Registered::prove`]).

use crate::error::{Error, Result};
use crate::mem::cuda;
use std::ffi::CString;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

const PAGE: usize = 4096;
const LINE: usize = 64;
/// Ranks the region is laid out for.
pub const MAX_RANKS: usize = 62;
/// Descriptors in flight per ordered pair (a ring).
pub const SLOTS: u64 = 16;
/// Bytes of a mailbox slot: the sender's record (two lines), then the receiver's.
const SLOT_BYTES: usize = 3 * LINE;
/// Bytes of the bounce ring of an ordered pair (send/recv that cannot go GPU to GPU).
pub const BOUNCE: usize = 32 << 10;
/// Freed allocations an owner's log keeps.
pub const FREED_RING: u64 = 64;
const FREED_BYTES: usize = LINE + 8 * FREED_RING as usize;
/// A pair's counters (4 lines), its slots, its bounce ring.
const PAIR_BYTES: usize = 4 * LINE + SLOTS as usize * SLOT_BYTES + BOUNCE;
/// Collective descriptors a rank may post ahead of the executor's reading them.
pub const POSTS: u64 = 16;
/// Bytes of the failure's text.
const REASON_BYTES: usize = 2048;
/// Bytes a posted descriptor may take among `n` ranks (its slot less the stamp line).
pub const fn post_capacity(n: usize) -> usize {
    512 + 32 * n
}

/// A word of the registered part, by its offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Word(usize);

/// One process's mapping of a communicator's control region.
pub struct Ctl {
    host: *mut u8,
    len: usize,
    n: usize,
    /// Bytes of the words (registered with CUDA), page-rounded.
    words: usize,
    /// The shared-memory name; the creator unlinks it once every rank mapped it
    /// ([`Ctl::unlink`]), or when done.
    name: CString,
    owner: bool,
    unlinked: std::sync::atomic::AtomicBool,
}

// SAFETY: the region is shared memory accessed only through atomics (host), stream
// operations (device) and byte ranges that the mailbox protocol hands to one side at a
// time; the pointer itself is never reassigned.
unsafe impl Send for Ctl {}
// SAFETY: as above.
unsafe impl Sync for Ctl {}

fn round_up(v: usize, a: usize) -> usize {
    v.div_ceil(a) * a
}

impl Ctl {
    /// The region's shared-memory name for communicator `nonce` created by process
    /// `pid` (the `-p<pid>` suffix lets a later process remove it if `pid` dies first).
    pub fn name(nonce: u64, pid: u32) -> String {
        format!("/fccl-ctl-{nonce:016x}-p{pid}")
    }

    /// This region's shared-memory name: the same in every rank, unique to the communicator.
    pub fn region_name(&self) -> String {
        self.name.to_string_lossy().into_owned()
    }

    /// Offset of the first rank's probe line (after the pairs' words).
    fn probes(n: usize) -> usize {
        round_up(LINE * (2 + 2 * n) + 8 * n * n, LINE)
    }

    fn layout(n: usize) -> (usize, usize) {
        let words = round_up(Self::probes(n) + LINE * n, PAGE);
        let len = Self::posts_off(words, n) + n * POSTS as usize * Self::post_bytes(n);
        (words, len)
    }

    /// Where the failure's header line starts, after the pairs.
    fn reason_off(words: usize, n: usize) -> usize {
        round_up(words + round_up(n * FREED_BYTES, PAGE) + n * n * PAIR_BYTES, PAGE)
    }

    /// Where the rings of posted descriptors start, after the failure and every rank's
    /// count of posted calls read.
    fn posts_off(words: usize, n: usize) -> usize {
        Self::reason_off(words, n) + LINE + REASON_BYTES + round_up(8 * n, LINE)
    }

    /// Bytes of one posted descriptor's slot: a stamp line, then the descriptor.
    const fn post_bytes(n: usize) -> usize {
        LINE + post_capacity(n)
    }

    /// Creates the region (zeroed) for `n` ranks and maps it. No CUDA call: the words
    /// are registered by each rank that uses them ([`Ctl::register`]).
    pub fn create(name: &str, n: usize) -> Result<Ctl> {
        Self::map(name, n, true)
    }

    /// Maps the region another rank created.
    pub fn open(name: &str, n: usize) -> Result<Ctl> {
        Self::map(name, n, false)
    }

    fn map(name: &str, n: usize, create: bool) -> Result<Ctl> {
        if n > MAX_RANKS {
            return Err(Error::unavailable(format!("{n} ranks; the device control region has room for {MAX_RANKS}")));
        }
        let (words, len) = Self::layout(n);
        let cname = CString::new(name).map_err(|_| Error::internal("control region name with NUL"))?;
        let flags = if create { libc::O_CREAT | libc::O_EXCL | libc::O_RDWR } else { libc::O_RDWR };
        // SAFETY: cname is a valid C string.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(Error::os(format!("shm_open({name}) for the device control region")));
        }
        let unlink = || {
            if create {
                // SAFETY: cname valid.
                unsafe { libc::shm_unlink(cname.as_ptr()) };
            }
        };
        // SAFETY: fd is an open shared-memory object; a new one is sized here (sparse:
        // pages are only allocated where touched).
        if create && unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            let e = Error::os(format!("ftruncate of {name} to {len} bytes"));
            // SAFETY: fd open.
            unsafe { libc::close(fd) };
            unlink();
            return Err(e);
        }
        // SAFETY: maps the object; the mapping keeps its own reference.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        // SAFETY: fd is ours to close.
        unsafe { libc::close(fd) };
        if p == libc::MAP_FAILED {
            unlink();
            return Err(Error::os(format!("mmap of the device control region {name}")));
        }
        Ok(Ctl { host: p as *mut u8, len, n, words, name: cname, owner: create, unlinked: Default::default() })
    }

    /// Removes the region's name (the creator's, once every rank has mapped it: a rank
    /// killed later then leaves nothing in /dev/shm). Idempotent; a no-op elsewhere.
    pub fn unlink(&self) {
        if self.owner && !self.unlinked.swap(true, Ordering::AcqRel) {
            // SAFETY: name is a valid C string.
            unsafe { libc::shm_unlink(self.name.as_ptr()) };
        }
    }

    /// Registers the words with CUDA in context `ctx` (for stream operations there).
    pub fn register(self: &Arc<Ctl>, ctx: cuda::Ctx) -> Result<Registered> {
        let _g = cuda::CtxGuard::enter(ctx)?;
        // SAFETY: the words stay mapped while the Registered (which holds the region)
        // lives; its drop unregisters them first.
        let dev = unsafe { cuda::register_host_mapped(self.host, self.words) }
            .map_err(|e| e.context("registering the device control region"))?;
        Ok(Registered { ctl: self.clone(), dev, ctx })
    }

    /// Ranks the region is laid out for.
    pub fn nranks(&self) -> usize {
        self.n
    }

    pub fn at(&self, w: Word) -> &AtomicU32 {
        debug_assert!(w.0 + 4 <= self.words);
        // SAFETY: w is a word offset inside the mapped words; the region lives as long
        // as self and words are only accessed atomically.
        unsafe { &*(self.host.add(w.0) as *const AtomicU32) }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.len);
        // SAFETY: an 8-aligned offset inside the mapping, only accessed atomically.
        unsafe { &*(self.host.add(off) as *const AtomicU64) }
    }

    pub const DONE: Word = Word(0);
    /// Non-zero once a rank gave up (see [`Ctl::failed`]); kernels on the device path read it.
    pub const FAILED: Word = Word(LINE);

    /// The last collective whose inputs rank `r`'s stream had ready.
    pub fn ready(&self, r: usize) -> Word {
        assert!(r < self.n, "rank {r} beyond the control region");
        Word(LINE * (2 + r))
    }

    /// The last collective whose share rank `r`'s stream finished (MPS).
    pub fn fin(&self, r: usize) -> Word {
        assert!(r < self.n, "rank {r} beyond the control region");
        Word(LINE * (2 + self.n + r))
    }

    fn pair_word(&self, p: usize, q: usize) -> usize {
        assert!(p < self.n && q < self.n, "pair ({p}, {q}) beyond the control region");
        LINE * (2 + 2 * self.n) + 8 * (p * self.n + q)
    }

    /// The last fcclSend `p` -> `q` (slot + 1) whose buffer `p`'s stream had ready.
    pub fn sent(&self, p: usize, q: usize) -> Word {
        Word(self.pair_word(p, q))
    }

    /// The last fcclSend `p` -> `q` (slot + 1) that `q`'s stream copied.
    pub fn recvd(&self, p: usize, q: usize) -> Word {
        Word(self.pair_word(p, q) + 4)
    }

    /// Rank `r`'s probe words (ping, pong): only `r` uses them, once.
    pub fn probe(&self, r: usize) -> (Word, Word) {
        assert!(r < self.n, "rank {r} beyond the control region");
        let at = Self::probes(self.n) + LINE * r;
        (Word(at), Word(at + 4))
    }

    /// Non-zero once a rank gave up on the communicator.
    pub fn failed(&self) -> &AtomicU32 {
        self.at(Self::FAILED)
    }

    /// Marks the communicator failed for every rank.
    pub fn fail(&self) {
        self.failed().store(1, Ordering::Release);
    }

    /// Whether `w` is at or past `v` (cyclically).
    pub fn reached(&self, w: Word, v: u32) -> bool {
        reached(self.at(w).load(Ordering::Acquire), v)
    }

    /// Lets waits for `w >= v` go on: used when they can never be satisfied (a rank
    /// died, timed out, or the communicator was aborted).
    pub fn raise(&self, w: Word, v: u32) {
        let _ = self.at(w).fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| (!reached(x, v)).then_some(v));
    }

    /// Rank `r`'s log of freed allocations: (entries ever written, the ring).
    fn freed_off(&self, r: usize) -> usize {
        assert!(r < self.n, "rank {r} beyond the control region");
        self.words + r * FREED_BYTES
    }

    /// Appends `base` (an allocation of rank `r`, the caller, freed) to its log.
    pub fn freed_push(&self, r: usize, base: usize) {
        let off = self.freed_off(r);
        let count = self.u64_at(off);
        let i = count.load(Ordering::Relaxed);
        self.u64_at(off + LINE + 8 * (i % FREED_RING) as usize).store(base as u64, Ordering::Relaxed);
        count.store(i + 1, Ordering::Release);
    }

    /// Rank `r`'s freed allocations after the first `seen` entries of its log: the
    /// bases, and the new count; None when the log overran them (a reader that fell
    /// that far behind forgets every mapping of the owner).
    pub fn freed_since(&self, r: usize, seen: u64) -> (Option<Vec<usize>>, u64) {
        let off = self.freed_off(r);
        let count = self.u64_at(off).load(Ordering::Acquire);
        if count == seen {
            return (Some(Vec::new()), count);
        }
        if count - seen > FREED_RING {
            return (None, count);
        }
        let bases =
            (seen..count).map(|i| self.u64_at(off + LINE + 8 * (i % FREED_RING) as usize).load(Ordering::Relaxed));
        let v: Vec<usize> = bases.map(|b| b as usize).collect();
        // Entries overwritten while they were read are lost: then forget everything.
        if self.u64_at(off).load(Ordering::Acquire) - seen > FREED_RING {
            return (None, count);
        }
        (Some(v), count)
    }

    /// Marks the communicator failed for every rank, saying why (`rank`'s error `code`
    /// and `msg`): the first rank to give up writes its reason, later ones only fail.
    pub fn fail_with(&self, rank: usize, code: i32, msg: &str) {
        let at = Self::reason_off(self.words, self.n);
        let claim = self.u64_at(at);
        if claim.compare_exchange(0, rank as u64 + 1, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            let text = &msg.as_bytes()[..msg.len().min(REASON_BYTES)];
            // SAFETY: the text's bytes are inside the mapping and written only by the rank
            // that claimed them (above); readers wait for the stamp below.
            unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), self.host.add(at + LINE), text.len()) };
            self.u64_at(at + 8).store((code as u32 as u64) << 32 | text.len() as u64, Ordering::Relaxed);
            self.u64_at(at + 16).store(1, Ordering::Release);
        }
        self.fail();
    }

    /// Why the communicator failed, if a rank said so: (its rank, code, message).
    pub fn reason(&self) -> Option<(usize, i32, String)> {
        let at = Self::reason_off(self.words, self.n);
        if self.u64_at(at + 16).load(Ordering::Acquire) == 0 {
            return None;
        }
        let who = self.u64_at(at).load(Ordering::Acquire) as usize - 1;
        let w = self.u64_at(at + 8).load(Ordering::Relaxed);
        let len = (w as u32 as usize).min(REASON_BYTES);
        let mut b = vec![0u8; len];
        // SAFETY: stamped: the writer finished these bytes and never writes them again.
        unsafe { std::ptr::copy_nonoverlapping(self.host.add(at + LINE), b.as_mut_ptr(), len) };
        Some((who, (w >> 32) as u32 as i32, String::from_utf8_lossy(&b).into_owned()))
    }

    /// The last posted call rank `r` has read (every rank's post of it): the executor
    /// reads them, and under MPS every rank.
    pub fn consumed(&self, r: usize) -> &AtomicU64 {
        assert!(r < self.n, "rank {r} beyond the control region");
        self.u64_at(Self::reason_off(self.words, self.n) + LINE + REASON_BYTES + 8 * r)
    }

    fn post_slot(&self, r: usize, k: u64) -> usize {
        assert!(r < self.n, "rank {r} beyond the control region");
        let first = Self::posts_off(self.words, self.n);
        first + (r * POSTS as usize + (k % POSTS) as usize) * Self::post_bytes(self.n)
    }

    /// Writes rank `r`'s descriptor of posted call `k` (`k >= 1`; the caller checked
    /// that every reader read call `k - POSTS`, the slot's last). Err if too long.
    pub fn post(&self, r: usize, k: u64, desc: &[u8]) -> Result<()> {
        if desc.len() > post_capacity(self.n) {
            return Err(Error::internal(format!(
                "a posted descriptor of {} bytes, over the slot's {}",
                desc.len(),
                post_capacity(self.n)
            )));
        }
        let at = self.post_slot(r, k);
        self.u64_at(at + 8).store(desc.len() as u64, Ordering::Relaxed);
        // SAFETY: inside the mapping; the slot is the poster's until it stamps it, and the
        // executor reads it only once stamped with `k`.
        unsafe { std::ptr::copy_nonoverlapping(desc.as_ptr(), self.host.add(at + LINE), desc.len()) };
        self.u64_at(at).store(k, Ordering::Release);
        Ok(())
    }

    /// Rank `r`'s descriptor of posted call `k`, once it wrote it.
    pub fn posted(&self, r: usize, k: u64) -> Option<Vec<u8>> {
        let at = self.post_slot(r, k);
        if self.u64_at(at).load(Ordering::Acquire) != k {
            return None;
        }
        let len = (self.u64_at(at + 8).load(Ordering::Relaxed) as usize).min(post_capacity(self.n));
        let mut b = vec![0u8; len];
        // SAFETY: stamped with k: the poster does not write the slot again before every
        // reader (the executor, or under MPS every other rank) marks call k consumed.
        unsafe { std::ptr::copy_nonoverlapping(self.host.add(at + LINE), b.as_mut_ptr(), len) };
        Some(b)
    }

    /// The mailbox and bounce ring of sends from `p` to `q`.
    pub fn pair(&self, p: usize, q: usize) -> Pair<'_> {
        assert!(p < self.n && q < self.n && p != q, "pair ({p}, {q}) has no mailbox");
        let off = self.words + round_up(self.n * FREED_BYTES, PAGE) + (p * self.n + q) * PAIR_BYTES;
        Pair { ctl: self, off }
    }
}

/// Whether counter value `v` is at or past `k` (cyclic, as CU_STREAM_WAIT_VALUE_GEQ).
pub fn reached(v: u32, k: u32) -> bool {
    (v.wrapping_sub(k) as i32) >= 0
}

impl Drop for Ctl {
    fn drop(&mut self) {
        // SAFETY: mapped in map(), unmapped once; every registration (which holds an
        // Arc of this region) is gone.
        unsafe { libc::munmap(self.host.cast(), self.len) };
        self.unlink();
    }
}

/// The words registered in one context: their device address there.
pub struct Registered {
    pub ctl: Arc<Ctl>,
    dev: cuda::DevPtr,
    pub ctx: cuda::Ctx,
}

impl Registered {
    /// Device address of `w`, for stream operations in this registration's context.
    pub fn dev(&self, w: Word) -> cuda::DevPtr {
        self.dev.offset(w.0)
    }

    /// The device addresses, apart from this borrow.
    pub fn addrs(&self) -> Addrs {
        Addrs(self.dev)
    }

    /// Proves, with one round trip on rank `r`'s probe words, that this context's
    /// streams can wait for words the host writes and write words the host reads (what
    /// every call on this path relies on); returns how long it took. On Err the stream
    /// may still hold the operations: the caller keeps the registration (forgets it).
    pub fn prove(&self, r: usize, limit: std::time::Duration) -> Result<std::time::Duration> {
        let _g = cuda::CtxGuard::enter(self.ctx)?;
        let (ping, pong) = self.ctl.probe(r);
        let token = self.ctl.at(ping).load(Ordering::Acquire).wrapping_add(1).max(1);
        // SAFETY: the words are registered in this context (self) and stay so while self
        // lives; on a timeout the caller keeps self alive for good.
        unsafe {
            cuda::memop_round_trip(self.ctl.at(ping), self.ctl.at(pong), self.dev(ping), self.dev(pong), token, limit)
        }
        .map_err(|e| e.context("proving stream memory operations on the control words"))
    }
}

/// Device addresses of the words in one registration's context.
#[derive(Clone, Copy)]
pub struct Addrs(cuda::DevPtr);

impl Addrs {
    pub fn of(&self, w: Word) -> cuda::DevPtr {
        self.0.offset(w.0)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // The caller made sure no queued stream operation still uses the words.
        if let Ok(_g) = cuda::CtxGuard::enter(self.ctx) {
            // SAFETY: registered in Ctl::register; unregistered once.
            let _ = unsafe { cuda::unregister_host(self.ctl.host as usize) };
        }
    }
}

/// The mailbox of the sends from one rank to another. Slot `k % SLOTS` holds the k-th
/// send's record (written by the sender) and the matching receive's record (written by
/// the receiver), each stamped `k + 1` once complete. Counters: `s_done` (the receiver
/// finished with the sender's records and data before it), `r_read` (the sender read the
/// receiver's records before it), and the bounce ring's bytes written and read.
pub struct Pair<'a> {
    ctl: &'a Ctl,
    off: usize,
}

/// A sender's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendRec {
    pub bytes: u64,
    /// The data may be read on the GPU (GPU to GPU); else it goes through the bounce ring.
    pub device: bool,
    /// The sender's stream is being captured into a CUDA graph: the pair fails.
    pub captured: bool,
    pub pid: u32,
    /// The buffer's offset in its allocation, and its address in the sender's process.
    pub off: u64,
    pub ptr: u64,
    pub handle: [u8; 64],
}

impl Default for SendRec {
    fn default() -> SendRec {
        SendRec { bytes: 0, device: false, captured: false, pid: 0, off: 0, ptr: 0, handle: [0; 64] }
    }
}

/// A receiver's record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvRec {
    pub bytes: u64,
    pub device: bool,
    /// The receiver's stream is being captured into a CUDA graph: the pair fails.
    pub captured: bool,
}

impl Pair<'_> {
    pub fn s_done(&self) -> &AtomicU64 {
        self.ctl.u64_at(self.off)
    }
    pub fn r_read(&self) -> &AtomicU64 {
        self.ctl.u64_at(self.off + LINE)
    }
    pub fn written(&self) -> &AtomicU64 {
        self.ctl.u64_at(self.off + 2 * LINE)
    }
    pub fn read(&self) -> &AtomicU64 {
        self.ctl.u64_at(self.off + 3 * LINE)
    }

    fn slot(&self, k: u64) -> usize {
        self.off + 4 * LINE + (k % SLOTS) as usize * SLOT_BYTES
    }

    fn bytes_at(&self, off: usize, len: usize) -> *mut u8 {
        debug_assert!(off + len <= self.ctl.len);
        // SAFETY: inside the mapping (the layout's arithmetic).
        unsafe { self.ctl.host.add(off) }
    }

    /// Writes the k-th send's record (the caller checked the slot is free).
    pub fn put_send(&self, k: u64, r: &SendRec) {
        let at = self.slot(k);
        let mut b = [0u8; 104];
        b[8..16].copy_from_slice(&r.bytes.to_le_bytes());
        b[16] = r.device as u8;
        b[17] = r.captured as u8;
        b[20..24].copy_from_slice(&r.pid.to_le_bytes());
        b[24..32].copy_from_slice(&r.off.to_le_bytes());
        b[32..40].copy_from_slice(&r.ptr.to_le_bytes());
        b[40..104].copy_from_slice(&r.handle);
        // SAFETY: the slot's bytes after the stamp are the sender's until it stamps them
        // (the receiver reads them only after seeing the stamp).
        unsafe { std::ptr::copy_nonoverlapping(b[8..].as_ptr(), self.bytes_at(at + 8, 96), 96) };
        self.ctl.u64_at(at).store(k + 1, Ordering::Release);
    }

    /// The k-th send's record, once the sender wrote it.
    pub fn get_send(&self, k: u64) -> Option<SendRec> {
        let at = self.slot(k);
        if self.ctl.u64_at(at).load(Ordering::Acquire) != k + 1 {
            return None;
        }
        let mut b = [0u8; 104];
        // SAFETY: stamped: the sender no longer writes the slot until s_done passes it.
        unsafe { std::ptr::copy_nonoverlapping(self.bytes_at(at + 8, 96), b[8..].as_mut_ptr(), 96) };
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Some(SendRec {
            bytes: u(8),
            device: b[16] != 0,
            captured: b[17] != 0,
            pid: u32::from_le_bytes(b[20..24].try_into().expect("4 bytes")),
            off: u(24),
            ptr: u(32),
            handle: b[40..104].try_into().expect("64 bytes"),
        })
    }

    /// Writes the k-th receive's record (the caller checked the slot is free).
    pub fn put_recv(&self, k: u64, r: &RecvRec) {
        let at = self.slot(k) + 2 * LINE;
        self.ctl.u64_at(at + 8).store(r.bytes, Ordering::Relaxed);
        self.ctl.u64_at(at + 16).store(r.device as u64 | (r.captured as u64) << 1, Ordering::Relaxed);
        self.ctl.u64_at(at).store(k + 1, Ordering::Release);
    }

    /// The k-th receive's record, once the receiver wrote it.
    pub fn get_recv(&self, k: u64) -> Option<RecvRec> {
        let at = self.slot(k) + 2 * LINE;
        if self.ctl.u64_at(at).load(Ordering::Acquire) != k + 1 {
            return None;
        }
        let flags = self.ctl.u64_at(at + 16).load(Ordering::Relaxed);
        Some(RecvRec {
            bytes: self.ctl.u64_at(at + 8).load(Ordering::Relaxed),
            device: flags & 1 != 0,
            captured: flags & 2 != 0,
        })
    }

    /// Where the bounce ring's byte `pos` lies and how many bytes follow it before the
    /// ring wraps.
    pub fn bounce(&self, pos: u64) -> (*mut u8, usize) {
        let i = (pos % BOUNCE as u64) as usize;
        (self.bytes_at(self.off + 4 * LINE + SLOTS as usize * SLOT_BYTES + i, BOUNCE - i), BOUNCE - i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_compare_cyclically() {
        assert!(reached(5, 5) && reached(6, 5) && !reached(4, 5));
        assert!(reached(2, u32::MAX) && !reached(u32::MAX, 2));
    }

    #[test]
    fn records_freed_logs_and_words_round_trip_between_mappings() {
        let name = Ctl::name(0x5eed_0000 ^ std::process::id() as u64, std::process::id());
        let a = Ctl::create(&name, 3).unwrap();
        let b = Ctl::open(&name, 3).unwrap();
        // Words: the other mapping sees them; raising is monotonic and cyclic.
        a.raise(a.sent(2, 1), 7);
        assert!(b.reached(b.sent(2, 1), 7) && !b.reached(b.sent(1, 2), 1));
        b.raise(b.sent(2, 1), 3);
        assert_eq!(a.at(a.sent(2, 1)).load(Ordering::Acquire), 7, "never lowered");
        assert_ne!(a.recvd(2, 1), a.sent(2, 1));
        // Probe lines: one per rank, after every other word, inside the registered part.
        let mut words: Vec<usize> = vec![Ctl::DONE.0, Ctl::FAILED.0];
        for r in 0..3 {
            words.extend([a.ready(r).0, a.fin(r).0]);
            words.extend((0..3).flat_map(|q| [a.sent(r, q).0, a.recvd(r, q).0]));
        }
        let last = *words.iter().max().unwrap();
        for r in 0..3 {
            let (ping, pong) = a.probe(r);
            assert!(ping.0 > last && pong.0 == ping.0 + 4 && ping.0 % LINE == 0, "rank {r}: {ping:?} {pong:?}");
            assert!(pong.0 + 4 <= a.words, "rank {r}'s probe lies in the registered words");
            assert!(r == 0 || ping.0 == a.probe(r - 1).0 .0 + LINE, "a line per rank");
        }
        // Mailbox: a record is visible once stamped with its slot, and only for it.
        let s = SendRec { bytes: 40, device: true, captured: true, pid: 9, off: 16, ptr: 0xabc0, handle: [7; 64] };
        assert!(b.pair(0, 2).get_send(0).is_none());
        a.pair(0, 2).put_send(0, &s);
        assert_eq!(b.pair(0, 2).get_send(0), Some(s));
        assert!(b.pair(0, 2).get_send(SLOTS).is_none(), "slot 0 holds record 0, not SLOTS");
        assert!(b.pair(2, 0).get_send(0).is_none(), "each direction has its own mailbox");
        let r = RecvRec { bytes: 44, device: false, captured: true };
        b.pair(0, 2).put_recv(0, &r);
        assert_eq!(a.pair(0, 2).get_recv(0), Some(r));
        // Freed logs: read from where the reader stopped; overrun tells to forget all.
        a.freed_push(1, 0x1000);
        a.freed_push(1, 0x2000);
        assert_eq!(b.freed_since(1, 0), (Some(vec![0x1000, 0x2000]), 2));
        assert_eq!(b.freed_since(1, 2), (Some(vec![]), 2));
        for i in 0..FREED_RING {
            a.freed_push(1, 0x3000 + i as usize);
        }
        assert_eq!(b.freed_since(1, 1).0, None, "more than the ring since entry 1");
        assert_eq!(b.freed_since(0, 0), (Some(vec![]), 0));
        // The bounce ring wraps at its size.
        let (p0, n0) = a.pair(1, 0).bounce(0);
        let (p1, n1) = a.pair(1, 0).bounce(BOUNCE as u64 + 8);
        assert_eq!((n0, n1, p1 as usize - p0 as usize), (BOUNCE, BOUNCE - 8, 8));
        // Posted descriptors: stamped with their call, each rank its own ring.
        assert!(b.posted(2, 1).is_none());
        a.post(2, 1, &[1, 2, 3]).unwrap();
        assert_eq!(b.posted(2, 1), Some(vec![1, 2, 3]));
        assert!(b.posted(1, 1).is_none() && b.posted(2, 1 + POSTS).is_none());
        a.post(2, 1 + POSTS, &[9; 40]).unwrap();
        assert_eq!(b.posted(2, 1 + POSTS), Some(vec![9; 40]));
        assert!(b.posted(2, 1).is_none(), "slot reused by call 1 + POSTS");
        assert!(a.post(0, 2, &vec![0; post_capacity(3) + 1]).is_err());
        a.post(0, 3, &vec![5; post_capacity(3)]).unwrap();
        assert_eq!(b.posted(0, 3).unwrap().len(), post_capacity(3));
        assert!(b.posted(1, 3).is_none(), "a full slot does not spill into the next rank's ring");
        b.consumed(0).store(7, Ordering::Release);
        b.consumed(2).store(9, Ordering::Release);
        assert_eq!((a.consumed(0).load(Ordering::Acquire), a.consumed(1).load(Ordering::Acquire)), (7, 0));
        assert_eq!(a.consumed(2).load(Ordering::Acquire), 9);
        assert_eq!(a.reason(), None, "the counts lie apart from the failure");
        // The failure's reason: the first rank to give up names it.
        assert_eq!(a.reason(), None);
        b.fail_with(2, 100, "rank 2 found a mismatch");
        a.fail_with(1, 5, "too late");
        assert_eq!(a.reason(), Some((2, 100, "rank 2 found a mismatch".to_string())));
        assert_ne!(a.failed().load(Ordering::Acquire), 0);
        let (_, len) = Ctl::layout(3);
        assert!(a.post_slot(2, POSTS - 1) + Ctl::post_bytes(3) <= len, "the last slot lies in the region");
        drop(b);
        drop(a);
        assert!(Ctl::open(&name, 3).is_err(), "the creator unlinks the name");
    }
}
