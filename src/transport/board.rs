//! The bulletin board: a small per-rank area of the shared segment through which the
//! ranks of one host announce each collective (its fingerprint) and, for small
//! messages, publish their whole contribution, which peers then read in place.
//!
//! Each rank owns [`SLOTS`] slots and writes only its own; everyone reads everyone's.
//! The board's sequence number counts the collective calls of the communicator (every
//! rank the same). Call `s` uses slot `s % SLOTS`; its header holds `s` once its
//! fingerprint and data are complete. A rank reuses a slot only after every peer has
//! *arrived* at `s - SLOTS + 1` or later (published it: that slot's header holds that
//! number or a later one): arriving there means it finished call `s - SLOTS` and so
//! stopped reading the slot. That lets a broadcast's root run up to `SLOTS - 1` calls
//! ahead of its slowest reader without any acknowledgement.
//!
//! A slot's first cache line holds its sequence number, a digest of its fingerprint
//! and, for contributions of at most [`INLINE_MAX`] bytes, the data: the line a reader
//! waits on brings everything a small call needs, and the full fingerprint is read
//! only when digests differ. Latency is counted in cache lines moving between cores.
//!
//! Waiting spins briefly, then sleeps on the waiter's own doorbell; a publisher wakes
//! peers only when they announced that they sleep (no system call otherwise).

use super::failure::{blame, cause_of, wait_word, BLAME_GAP, WAIT_TEAM};
use super::shm::segment::{self, Segment};
use super::wait::SpinPolicy;
use crate::error::{Error, Result};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Slots per rank: how many calls a rank may run ahead of its slowest reader.
pub const SLOTS: usize = 4;
/// Largest contribution a rank publishes on the board (bytes).
pub const DATA_MAX: usize = 64 << 10;
/// Bytes reserved for a call's fingerprint in a slot.
pub const FP_MAX: usize = 512;
const SLOT_HDR: usize = 64 + FP_MAX;
/// Largest contribution carried in the slot's first cache line.
pub const INLINE_MAX: usize = 48;
const OFF_DIGEST: usize = 8;
const OFF_INLINE: usize = 16;
/// When the data is not inline, the word after the digest holds the publisher's
/// flags for the call (see [`Board::set_flags`]).
const OFF_FLAGS: usize = OFF_INLINE;
const SLOT_BYTES: usize = SLOT_HDR + DATA_MAX;
const BOARD_HDR: usize = 4096;
/// Words of rank 0's board header that all ranks share (see [`Board::team_word`]).
pub const TEAM_WORDS: usize = 4;
const _: () = assert!(TEAM_WORDS * 64 <= BOARD_HDR);
// The segment's layout (`shm::segment`) owns the board's size; the slots fill it.
const _: () = assert!(BOARD_HDR + SLOTS * SLOT_BYTES == segment::BOARD_BYTES);

/// One rank's view of the boards of all ranks of a communicator on one host.
pub struct Board {
    pub rank: usize,
    /// Every rank's segment (this rank's included), by rank.
    segs: Vec<Arc<Segment>>,
    /// Every rank's first slot, by rank (the segments stay mapped while `segs` holds them).
    slots: Vec<*mut u8>,
    /// Sequence number of the last call announced here (0 = none yet).
    seq: u64,
    /// By rank, the latest call this rank saw that rank publish (its own: unused).
    /// `begin` need not look at a peer's slot again when that peer is known to
    /// have arrived far enough.
    seen: Vec<u64>,
    /// The current call's contributions are in the slots' first lines.
    inline: bool,
    pub policy: SpinPolicy,
    /// How large contributions are written into this rank's slots.
    pub stores: crate::mem::copy::StoreChoice,
}

// SAFETY: the segments are shared memory accessed through atomics (headers) or
// through slots that the protocol above gives to one writer at a time.
unsafe impl Send for Board {}

impl Board {
    pub fn new(rank: usize, segs: Vec<Arc<Segment>>, policy: SpinPolicy) -> Board {
        for s in &segs {
            s.populate_board();
        }
        // SAFETY: BOARD_HDR is inside every board.
        let slots = segs.iter().map(|s| unsafe { s.board_base().add(BOARD_HDR) }).collect();
        let seen = vec![0; segs.len()];
        Board { rank, segs, slots, seq: 0, seen, inline: false, policy, stores: Default::default() }
    }

    #[inline]
    pub fn nranks(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    fn slot(&self, r: usize, s: u64) -> *mut u8 {
        // SAFETY: slot index < SLOTS, inside the board.
        unsafe { self.slots[r].add((s as usize % SLOTS) * SLOT_BYTES) }
    }

    fn slot_seq(&self, r: usize, s: u64) -> &AtomicU64 {
        // SAFETY: first word of the slot header, aligned, only accessed atomically.
        unsafe { &*(self.slot(r, s) as *const AtomicU64) }
    }

    /// Starts the next call: waits until this rank may reuse its slot, returns the
    /// call's board sequence number.
    #[inline]
    pub fn begin(&mut self, w: &mut Waiter<'_>) -> Result<u64> {
        let s = self.seq + 1;
        if s > SLOTS as u64 {
            let need = s - SLOTS as u64 + 1;
            // A peer seen at `need` or later (with checkMode: at the last call) needs
            // no look.
            if self.seen.iter().enumerate().any(|(p, &seen)| seen < need && p != self.rank) {
                self.wait_arrived(w, need)?;
            }
        }
        self.seq = s;
        self.inline = false;
        Ok(s)
    }

    /// Waits until every peer has arrived at call `need`.
    fn wait_arrived(&mut self, w: &mut Waiter<'_>, need: u64) -> Result<()> {
        for p in 0..self.nranks() {
            if p == self.rank || self.seen[p] >= need {
                continue;
            }
            // Usually a line this rank read when it took call `need`'s data.
            w.wait(self, p, |b| b.slot_seq(p, need).load(Ordering::Acquire) >= need)?;
            self.seen[p] = need;
        }
        Ok(())
    }

    /// Says that every rank's contribution to the current call fits the slot's first
    /// line (`bytes <= INLINE_MAX`, the same on every rank), before `my_data`.
    pub fn set_inline(&mut self, bytes: usize) {
        self.inline = bytes <= INLINE_MAX;
    }

    fn data_off(&self) -> usize {
        if self.inline {
            OFF_INLINE
        } else {
            SLOT_HDR
        }
    }

    /// Where this rank writes call `s`'s fingerprint and data.
    pub fn my_fp(&mut self, s: u64) -> &mut [u8] {
        // SAFETY: the slot is ours until we publish, and no peer reads it (begin()).
        unsafe { std::slice::from_raw_parts_mut(self.slot(self.rank, s).add(64), FP_MAX) }
    }

    /// This rank's data area for call `s` (DATA_MAX bytes, or INLINE_MAX after set_inline).
    pub fn my_data(&mut self, s: u64) -> *mut u8 {
        // SAFETY: inside our own slot.
        unsafe { self.slot(self.rank, s).add(self.data_off()) }
    }

    /// Writes `bytes` (at most DATA_MAX, not inline) at the start of this rank's
    /// data area for call `s`, before `publish`.
    pub fn set_data(&mut self, s: u64, bytes: &[u8]) {
        assert!(!self.inline && bytes.len() <= DATA_MAX);
        // SAFETY: inside our own slot's data area (DATA_MAX bytes), ours until we
        // publish; `bytes` is our memory, not the slot.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.my_data(s), bytes.len()) };
    }

    /// Sets this rank's flags word of call `s`, before `publish`: the data must
    /// not be inline (`set_inline` said so), where the word belongs to the data.
    pub fn set_flags(&mut self, s: u64, flags: u64) {
        debug_assert!(!self.inline);
        // SAFETY: the flags word of our own slot's first line, ours until we publish.
        unsafe { (self.slot(self.rank, s).add(OFF_FLAGS) as *mut u64).write(flags) };
    }

    /// Rank `p`'s flags word of call `s` (after `wait_for`; data not inline).
    pub fn flags(&self, p: usize, s: u64) -> u64 {
        debug_assert!(!self.inline);
        // SAFETY: published (Acquire in wait_for), not rewritten before we arrive at a
        // later call.
        unsafe { (self.slot(p, s).add(OFF_FLAGS) as *const u64).read() }
    }

    /// Publishes call `s` with the digest of its fingerprint: fingerprint and data
    /// are complete.
    pub fn publish(&self, s: u64, digest: u64) {
        // SAFETY: the digest word of our own slot's first line, not read by peers
        // before the Release store of the sequence number below.
        unsafe { (self.slot(self.rank, s).add(OFF_DIGEST) as *mut u64).write(digest) };
        self.slot_seq(self.rank, s).store(s, Ordering::Release);
        // Pairs with sleep_unless: either a sleeping peer is seen and woken, or the
        // peer sees the new sequence number before it sleeps.
        fence(Ordering::SeqCst);
        for p in (0..self.nranks()).filter(|&p| p != self.rank) {
            self.segs[p].notify();
        }
    }

    /// Wakes the peers that sleep in a wait (after a store they wait for), as
    /// `publish` does. `publish` keeps its own copy of these lines, so that the code
    /// of every small call stays as it was measured.
    pub fn notify_peers(&self) {
        // Pairs with sleep_unless: either a sleeping peer is seen and woken, or the
        // peer sees the store before it sleeps.
        fence(Ordering::SeqCst);
        for p in (0..self.nranks()).filter(|&p| p != self.rank) {
            self.segs[p].notify();
        }
    }

    /// Word `i` (< [`TEAM_WORDS`]) of the area that every rank of the board updates
    /// together, each on its own cache line: rank 0's board header, zero when the
    /// segment is created. `backend::host::mapped` counts pieces of work there.
    pub fn team_word(&self, i: usize) -> &AtomicU64 {
        assert!(i < TEAM_WORDS);
        // SAFETY: rank 0's board header holds BOARD_HDR bytes (TEAM_WORDS lines of
        // 64 bytes fit), is mapped while `segs` holds the segment, and these words
        // are only accessed atomically.
        unsafe { &*(self.segs[0].board_base().add(i * 64) as *const AtomicU64) }
    }

    /// Waits until rank `p` has published call `s`.
    #[inline]
    pub fn wait_for(&mut self, w: &mut Waiter<'_>, p: usize, s: u64) -> Result<()> {
        if self.slot_seq(p, s).load(Ordering::Acquire) != s {
            w.wait(self, p, |b| b.slot_seq(p, s).load(Ordering::Acquire) == s)?;
        }
        self.seen[p] = s;
        Ok(())
    }

    /// The ranks a timed-out wait for `waited` (the whole team when empty) comes down
    /// to (see `failure::blame`).
    pub fn blame(&self, waited: &[usize]) -> Vec<usize> {
        let word = |p: usize| self.segs.get(p).map(|s| s.waiting().load(Ordering::Acquire));
        let own = Some(self.segs[self.rank].waiting());
        blame(self.rank, self.segs.len(), word, own, waited, BLAME_GAP)
    }

    /// An error if a peer has marked itself failed or aborted (the failure flags in
    /// the segments; the same check as the links', without going through them).
    #[inline]
    pub fn check_failed(&self) -> Result<()> {
        for (p, seg) in self.segs.iter().enumerate() {
            if p != self.rank {
                seg.check_failed(p)?;
            }
        }
        Ok(())
    }

    /// Rank `p`'s fingerprint digest of call `s` (after `wait_for`).
    pub fn digest(&self, p: usize, s: u64) -> u64 {
        // SAFETY: published (Acquire in wait_for) and not rewritten until we arrive at
        // a later call.
        unsafe { (self.slot(p, s).add(OFF_DIGEST) as *const u64).read() }
    }

    /// Rank `p`'s fingerprint of call `s` (after `wait_for`).
    pub fn fp(&self, p: usize, s: u64) -> &[u8] {
        // SAFETY: published (Acquire in wait_for) and not rewritten until we arrive
        // at a later call.
        unsafe { std::slice::from_raw_parts(self.slot(p, s).add(64), FP_MAX) }
    }

    /// Rank `p`'s data of call `s` (after `wait_for`), `len` <= DATA_MAX bytes
    /// (INLINE_MAX after set_inline).
    pub fn data(&self, p: usize, s: u64, len: usize) -> &[u8] {
        assert!(len <= if self.inline { INLINE_MAX } else { DATA_MAX });
        // SAFETY: as for fp().
        unsafe { std::slice::from_raw_parts(self.slot(p, s).add(self.data_off()), len) }
    }
}

/// Bounds and failure checks of one wait: deadline, abort, peers that died.
pub struct Waiter<'a> {
    /// Set at the first wait that does not succeed at once (reading the clock costs
    /// as much as a whole small collective).
    deadline: Option<Instant>,
    pub timeout: Duration,
    pub abort: &'a AtomicBool,
    /// Checks peers' failure flags and (`full`) whether their processes live.
    pub check: &'a mut dyn FnMut(bool) -> Result<()>,
    /// Describes the call for error messages (built only on error).
    pub what: &'a dyn Fn() -> String,
    last_full_check: Option<Instant>,
    /// Ticks of the wait word this waiter publishes while it sleeps (see
    /// `Segment::waiting`).
    tick: u32,
}

impl<'a> Waiter<'a> {
    pub fn new(
        timeout: Duration,
        abort: &'a AtomicBool,
        check: &'a mut dyn FnMut(bool) -> Result<()>,
        what: &'a dyn Fn() -> String,
    ) -> Waiter<'a> {
        Waiter { deadline: None, timeout, abort, check, what, last_full_check: None, tick: 0 }
    }

    /// Fails if a peer has marked itself failed or aborted: what it published on the
    /// board may belong to a call it never finished.
    #[inline]
    pub fn check_flags(&mut self, b: &Board) -> Result<()> {
        b.check_failed().map_err(|e| e.context((self.what)()))
    }

    /// Waits until `ready` (a sign of rank `p`) holds: see `wait_until`.
    #[inline(never)]
    fn wait(&mut self, b: &Board, p: usize, ready: impl Fn(&Board) -> bool) -> Result<()> {
        self.wait_until(b, Some(p), || format!("rank {p} has not arrived"), ready)
    }

    /// Waits until `ready` holds, spinning, then yielding, then sleeping (as the
    /// board's policy says) until a peer's `Board::publish` or `notify_peers`; on
    /// timeout the error says `missing` (what has not happened). Inlined into
    /// `wait`, whose code small calls run as it was before this one was split off.
    #[inline(always)]
    pub fn wait_until(
        &mut self,
        b: &Board,
        peer: Option<usize>,
        missing: impl Fn() -> String,
        ready: impl Fn(&Board) -> bool,
    ) -> Result<()> {
        // Most waits end within a cache-line round trip: poll a while before reading
        // the clock, which costs as much as a small collective's own work.
        for _ in 0..128 {
            if ready(b) {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        let start = Instant::now();
        let deadline = *self.deadline.get_or_insert(start + self.timeout);
        let last_full_check = self.last_full_check.get_or_insert(start);
        let mut spins = 0u32;
        loop {
            for _ in 0..64 {
                if ready(b) {
                    return Ok(());
                }
                std::hint::spin_loop();
            }
            spins += 1;
            let now = Instant::now();
            let idle = now - start;
            if spins % 16 == 0 || idle > b.policy.spin {
                if self.abort.load(Ordering::Acquire) {
                    return Err(Error::remote(format!("{}: the communicator was aborted", (self.what)())));
                }
                (self.check)(false).map_err(|e| e.context((self.what)()))?;
            }
            if idle < b.policy.spin {
                continue;
            }
            if now >= deadline {
                // A peer that already failed is the story, not this timeout (see the engine).
                (self.check)(false).map_err(|e| e.context((self.what)()))?;
                let waited: Vec<usize> = peer.into_iter().collect();
                let culprits = b.blame(&waited);
                return Err(Error::timeout_blaming(
                    culprits.first().copied(),
                    format!(
                        "{}: timed out after {} ms; {} (this rank {} waits for it){}",
                        (self.what)(),
                        self.timeout.as_millis(),
                        missing(),
                        b.rank,
                        cause_of(b.rank, &culprits, &waited)
                    ),
                ));
            }
            if now - *last_full_check > Duration::from_millis(100) {
                *last_full_check = now;
                (self.check)(true).map_err(|e| e.context((self.what)()))?;
            }
            if idle < b.policy.yield_until {
                std::thread::yield_now();
                continue;
            }
            let left = deadline.saturating_duration_since(now).min(Duration::from_millis(20));
            let me = &b.segs[b.rank];
            // Say whom this rank waits for, for peers that time out to follow.
            self.tick = self.tick.wrapping_add(1);
            let target = peer.map_or(WAIT_TEAM, |p| p as u32 + 1);
            me.waiting().store(wait_word(target, self.tick), Ordering::Release);
            me.sleep_unless(|| ready(b) || self.abort.load(Ordering::Acquire), left);
            if ready(b) {
                self.unpublish(b);
                return Ok(());
            }
        }
    }

    /// Takes back the wait word a slow wait published (only slow waits write it).
    fn unpublish(&mut self, b: &Board) {
        if self.tick != 0 {
            b.segs[b.rank].waiting().store(0, Ordering::Release);
            self.tick = 0;
        }
    }
}
