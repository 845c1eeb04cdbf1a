//! How bytes move between two ranks: the transport layer under the host backend.
//!
//! A [`Link`] is a pair of byte streams with one peer, exposed as regions so that
//! algorithms copy (or reduce) straight between user buffers and the transport's
//! memory. Three transports implement it: shared-memory rings between processes of
//! one host ([`shm`]), the same rings in anonymous memory for ranks that are threads
//! of one process ([`inproc`]), and TCP between hosts ([`tcp`]). Stream positions
//! advance in multiples of 8 bytes; the framing above pads every message to that.

pub mod board;
pub mod inproc;
pub mod shm;
pub mod tcp;
pub mod wait;

use crate::error::Result;
use crate::mem::shared::Desc;
use board::{Board, SpinPolicy};
use shm::Segment;
pub use shm::{Share, ShareDest};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// One peer's pair of byte streams.
pub trait Link: Send {
    /// The peer's rank.
    fn peer(&self) -> usize;
    /// Contiguous free space in the outgoing stream, a multiple of 8 bytes (may be empty).
    fn send_space(&mut self) -> &mut [u8];
    /// Publishes the first `n` bytes (a multiple of 8) of the last `send_space`.
    fn send_commit(&mut self, n: usize);
    /// Contiguous bytes available in the incoming stream, a multiple of 8 (may be empty).
    fn recv_avail(&mut self) -> &[u8];
    /// Releases the first `n` bytes (a multiple of 8) of the last `recv_avail`.
    fn recv_commit(&mut self, n: usize);
    /// Moves buffered bytes to and from the OS (TCP); true when anything moved.
    fn progress(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// An error naming the peer if it died or failed (may make system calls).
    fn check_alive(&self) -> Result<()>;
    /// Cheap check: an error naming the peer if it has marked itself failed.
    fn check_flag(&self) -> Result<()> {
        Ok(())
    }
    /// A number that changes whenever the peer writes into our incoming stream or
    /// reads from our outgoing one (0 for transports that wake sleepers otherwise).
    fn activity(&self) -> u64 {
        0
    }
    /// Wakes the peer if it sleeps waiting for us (abort, failure).
    fn wake_peer(&self) {}
    /// The peer's wait word (see `shm::Segment::waiting`), where this rank can see it.
    fn wait_word(&self) -> Option<u64> {
        None
    }
    /// Socket to poll, for transports that have one.
    fn poll_fd(&self) -> Option<i32> {
        None
    }
    /// Tells the peer we are gone (TCP: shut the socket down).
    fn shutdown(&mut self) {}
    /// Tells the peer this rank failed, with its failure word's value `v` (see
    /// [`shm::FAILED_TIMEOUT`]), where the peer cannot read that word (TCP).
    fn tell_failed(&mut self, _v: u32) {}
    /// Whether committed bytes still wait in this process for the OS to take them
    /// (TCP): a run is not over until they are gone, or a peer waiting for them could
    /// wait for as long as this rank makes no further call.
    fn unsent(&self) -> bool {
        false
    }
    /// When the outgoing stream is empty (the peer has read everything) and its write
    /// position is at least `min` bytes into a ring, the number of bytes up to the
    /// ring's start. Skipping them makes the next message reuse the ring's first
    /// pages, which are already mapped and likely still in cache, instead of
    /// touching the whole ring. Then `send_space` offers all of them, so the skip
    /// is published at once. None for transports without a ring.
    fn rewind_gap(&mut self, min: usize) -> Option<usize> {
        let _ = min;
        None
    }
    /// True when the peer can read this rank's memory directly, so a large message
    /// may be sent as its address (single copy) instead of through the stream.
    fn peer_reads_directly(&self) -> bool {
        false
    }
    /// How many of this rank's direct messages the peer has finished reading.
    fn direct_reads_done(&self) -> u64 {
        0
    }
    /// Reads `len` bytes at `addr` of the peer's memory (a direct message) into `dst`.
    fn read_direct(&self, addr: u64, dst: *mut u8, len: usize) -> Result<()> {
        let _ = (addr, dst, len);
        Err(crate::error::Error::internal("direct read on a link that does not support it"))
    }
    /// Tells the peer that one more of its direct messages has been read.
    fn direct_read_done(&self) {}
    /// Receiver: tells the peer that the first `bytes` of the direct message it
    /// reads now (its next unfinished one) have been read, so the peer may
    /// overwrite them (an in-place fcclSend that a receive of the same run lands
    /// on, see `engine::InPlace`). Only for messages read in order, front to back.
    fn report_read(&self, bytes: usize) {
        let _ = bytes;
    }
    /// Sender: bytes of this rank's direct message `seq` (counted as
    /// [`Link::direct_reads_done`] counts) that the peer has reported read with
    /// [`Link::report_read`]; 0 when it has reported none.
    fn peer_read(&self, seq: u64) -> usize {
        let _ = seq;
        0
    }
    /// Whether the link carries the peer's read reports ([`Link::direct_read_done`]),
    /// so that a message may wait for its read: shared memory does, TCP does not
    /// (it never sends by address, and its swap offers are done once written).
    fn counts_reads(&self) -> bool {
        false
    }
    /// True when the peer can map this rank's shared allocations (`mem::shared`),
    /// so a large message out of one may be sent by its place in it.
    fn peer_maps(&self) -> bool {
        false
    }
    /// Where this rank reads, with ordinary loads, the `len` bytes of a direct
    /// message at `addr` of the peer (inside its shared allocation `shared`, when
    /// the message names one): None when only `read_direct` reaches them.
    fn direct_source(&mut self, addr: u64, len: usize, shared: Option<&Desc>) -> Result<Option<*const u8>> {
        let _ = (addr, len, shared);
        Ok(None)
    }
    /// Receiver: offers the peer a share in copying the next direct message it
    /// reads from the peer, `len` bytes into `dst` (`stream`: with streaming
    /// stores), when the peer can write there (see [`Share`]); the slot both take
    /// pieces from. None when the peer cannot, or split copies are off.
    fn share_offer(&mut self, dst: *mut u8, len: usize, stream: bool) -> Option<Share> {
        let _ = (dst, len, stream);
        None
    }
    /// Sender: the slot in which the peer offers shares of this rank's direct messages.
    fn share_slot(&self) -> Option<Share> {
        None
    }
    /// Sender: where this process writes the destination the peer offered; None
    /// when it cannot (then the peer copies alone).
    fn share_target(&mut self, dest: &ShareDest) -> Result<Option<*mut u8>> {
        let _ = dest;
        Ok(None)
    }
    /// Whether `len` bytes of ours at `at` can be swapped in place with a buffer of
    /// the peer's (an in-place all_to_all): the peer can map them writable, and
    /// this side has not failed to map the peer's buffers writable. Both sides
    /// say so in their swap offers; the pair swaps only when both do.
    fn swap_capable(&self, at: *const u8, len: usize) -> bool {
        let _ = (at, len);
        false
    }
    /// Where this process writes the `len` bytes at `addr` of the peer (inside its
    /// shared allocation `shared`, when the peer named one) that a swap exchanges
    /// with ours. Only asked after both sides said they can (`swap_capable`), so a
    /// failure is an error.
    fn swap_target(&mut self, addr: u64, len: usize, shared: Option<&Desc>) -> Result<*mut u8> {
        let _ = (addr, len, shared);
        Err(crate::error::Error::internal("swap on a link that does not support it"))
    }
    /// Where this process writes the `len` bytes at `addr` of the peer that a
    /// broadcast root sending to this rank wants as its own copy of the message
    /// (see `engine::K_DIRECT`). Only asked when the peer said it can be written
    /// (`swap_capable` on its side), so a failure is an error.
    fn tee_target(&mut self, addr: u64, len: usize, shared: Option<&Desc>) -> Result<*mut u8> {
        let _ = (addr, len, shared);
        Err(crate::error::Error::internal("a shared copy on a link that does not support it"))
    }
    /// Where this process reads (and, when `write`, writes) the peer's `len`
    /// bytes at `addr` (inside its shared allocation `shared`, when the peer named
    /// one) in a collective that every rank runs on every rank's buffers (see
    /// `backend::host::mapped`). None where they cannot be mapped here: then this
    /// rank leaves the work to the others, and `swap_capable` says no from then on,
    /// so later calls keep off that path. Err only for a descriptor that does not
    /// fit its allocation.
    fn peer_buffer(&mut self, addr: u64, len: usize, shared: Option<&Desc>, write: bool) -> Result<Option<*mut u8>> {
        let _ = (addr, len, shared, write);
        Ok(None)
    }
}

/// What a rank saw before it last looked for work (see [`Transport::seen`]).
#[derive(Clone, Copy)]
pub struct Seen {
    doorbell: u32,
    activity: Option<u64>,
}

/// A message header read from a peer's stream but not yet handed to a step: it
/// may arrive in two pieces (the ring wraps inside it) and it may belong to a later
/// call, so it outlives one engine run.
#[derive(Default, Clone, Copy)]
pub struct PendingHeader {
    pub bytes: [u8; 16],
    pub got: usize,
    /// Bytes of a skip to the ring's start (see [`Link::rewind_gap`]) still to
    /// release. A skip is no step's, so a run that read its header may end before
    /// the writer has published all of it: the rest is released by the next run.
    pub skip: usize,
}

impl PendingHeader {
    /// Releases what `link` has published of the skip in progress; true when
    /// anything was released. The skip is over when `skip` is 0.
    pub fn release_skip(&mut self, link: &mut dyn Link) -> bool {
        let start = self.skip;
        while self.skip > 0 {
            let n = link.recv_avail().len().min(self.skip);
            if n == 0 {
                break;
            }
            link.recv_commit(n);
            self.skip -= n;
        }
        self.skip < start
    }
}

/// The end of a timeout message: the ranks the wait comes down to, when they are not
/// simply the ones it waited for.
pub fn cause_of(me: usize, culprits: &[usize], waited: &[usize]) -> String {
    let list = |v: &[usize]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
    match culprits {
        [] => String::new(),
        [c] if waited == [*c] => format!(
            "; rank {c} stopped making progress (it is stopped, hung, or slower than FERROCCL_TIMEOUT_MS allows)"
        ),
        [c] if waited.is_empty() => {
            format!("; rank {c} stopped making progress while the others wait for it (it is stopped, hung, or slow)")
        }
        [c] => format!(
            "; this comes down to rank {c}, which stopped making progress while the others wait for it (rank {me} waited for {})",
            list(waited)
        ),
        cs => format!("; this comes down to ranks {}, which stopped making progress", list(cs)),
    }
}

/// How long a timed-out rank watches the others' wait words: longer than a waiter's
/// longest sleep between two ticks (20 ms).
pub const BLAME_GAP: Duration = Duration::from_millis(60);

/// All links of one rank of one communicator.
pub struct Transport {
    pub rank: usize,
    pub nranks: usize,
    links: Vec<Option<Box<dyn Link>>>,
    pending: Vec<PendingHeader>,
    /// This rank's segment when any peer is reached through shared memory.
    my_seg: Option<Arc<Segment>>,
    /// The bulletin board, when every peer shares this host.
    pub board: Option<Board>,
    /// How waits spin, yield and sleep (depends on ranks per core).
    pub policy: SpinPolicy,
}

/// The peers' failure checks of a [`Transport`].
pub struct PeerChecks<'a> {
    links: &'a [Option<Box<dyn Link>>],
}

impl PeerChecks<'_> {
    /// First error among peers that died or failed (may make system calls).
    pub fn alive(&self) -> Result<()> {
        for l in self.links.iter().flatten() {
            l.check_alive()?;
        }
        Ok(())
    }

    /// First error among peers that marked themselves failed (no system calls).
    pub fn flags(&self) -> Result<()> {
        for l in self.links.iter().flatten() {
            l.check_flag()?;
        }
        Ok(())
    }
}

impl Transport {
    pub fn new(rank: usize, nranks: usize, links: Vec<Option<Box<dyn Link>>>, my_seg: Option<Arc<Segment>>) -> Self {
        debug_assert_eq!(links.len(), nranks);
        let policy = SpinPolicy::for_ranks(nranks, board::available_cpus());
        Transport { rank, nranks, links, my_seg, pending: vec![PendingHeader::default(); nranks], board: None, policy }
    }

    /// Adds the bulletin board over every rank's segment (all ranks on this host).
    pub fn with_board(mut self, segs: Vec<Arc<Segment>>) -> Self {
        debug_assert_eq!(segs.len(), self.nranks);
        self.board = (self.nranks > 1).then(|| Board::new(self.rank, segs, self.policy));
        self
    }

    /// Sets how waits behave given `local_ranks` ranks on this host, which may run
    /// on `cpus` CPUs together.
    pub fn with_local_ranks(mut self, local_ranks: usize, cpus: usize) -> Self {
        self.policy = SpinPolicy::for_ranks(local_ranks, cpus);
        if let Some(b) = &mut self.board {
            b.policy = self.policy;
        }
        self
    }

    /// Whether the link to `peer` reports reads (shared memory): where it does not
    /// (TCP), nothing goes by address, so schedules need not offer exchanges in
    /// place. The same on both ends of a link.
    pub fn counts_reads(&self, peer: usize) -> bool {
        self.links[peer].as_deref().is_some_and(|l| l.counts_reads())
    }

    /// The link to `peer` (never self).
    pub fn link(&mut self, peer: usize) -> &mut dyn Link {
        self.links[peer].as_deref_mut().expect("no link to self")
    }

    /// The link to `peer` and the header pending from it.
    pub fn link_and_header(&mut self, peer: usize) -> (&mut dyn Link, &mut PendingHeader) {
        (self.links[peer].as_deref_mut().expect("no link to self"), &mut self.pending[peer])
    }

    /// TCP progress on every link; true when anything moved.
    pub fn progress_io(&mut self) -> Result<bool> {
        let mut moved = false;
        for l in self.links.iter_mut().flatten() {
            moved |= l.progress()?;
        }
        Ok(moved)
    }

    /// Whether a link holds committed bytes the OS has not taken yet ([`Link::unsent`]).
    pub fn unsent(&self) -> bool {
        self.links.iter().flatten().any(|l| l.unsent())
    }

    /// What to pass to [`Transport::sleep`], read before checking for work: the
    /// doorbell, and with `activity` (only a rank about to sleep needs it: loading
    /// the peers' ring positions on every poll would take their cache lines) the
    /// links' [`Link::activity`].
    pub fn seen(&self, activity: bool) -> Seen {
        Seen {
            doorbell: self.my_seg.as_ref().map_or(0, |s| s.doorbell().load(Ordering::SeqCst)),
            activity: activity.then(|| self.activity()),
        }
    }

    fn activity(&self) -> u64 {
        self.links.iter().flatten().fold(0u64, |a, l| a.wrapping_add(l.activity()))
    }

    /// Sleeps until a peer signals progress, at most `timeout`; `seen` must have
    /// been taken with activity (without it this only yields).
    pub fn sleep(&self, seen: Seen, timeout: Duration) {
        let Some(activity) = seen.activity else {
            std::thread::yield_now();
            return;
        };
        let seen = seen.doorbell;
        let fds: Vec<libc::pollfd> = self
            .links
            .iter()
            .flatten()
            .filter_map(|l| l.poll_fd())
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN | libc::POLLOUT, revents: 0 })
            .collect();
        if fds.is_empty() {
            if let Some(s) = &self.my_seg {
                s.sleep(seen, || self.activity() != activity, timeout);
            } else {
                std::thread::sleep(timeout.min(Duration::from_millis(1)));
            }
            return;
        }
        // With both kinds of links, poll briefly so shared-memory peers are not starved.
        let ms = if self.my_seg.is_some() { 1 } else { timeout.as_millis().clamp(1, 50) as i32 };
        let mut fds = fds;
        // SAFETY: fds is a valid array of pollfd for the duration of the call.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    }

    /// First error among `peers` that died or failed: a call checks only the peers it
    /// still waits for, since one that finished its part may exit before this rank does.
    pub fn check_peers_of(&self, peers: &[usize]) -> Result<()> {
        for &p in peers {
            if let Some(l) = self.links.get(p).and_then(Option::as_ref) {
                l.check_alive()?;
            }
        }
        Ok(())
    }

    /// Cheap check of the peers' failure flags (no system calls).
    pub fn check_flags(&self) -> Result<()> {
        PeerChecks { links: &self.links }.flags()
    }

    /// The bulletin board, if any, with the peers' failure checks borrowed beside it
    /// (a small collective on the board checks its peers while it writes its slot).
    pub fn board_with_checks(&mut self) -> Option<(&mut Board, PeerChecks<'_>)> {
        let checks = PeerChecks { links: &self.links };
        self.board.as_mut().map(|b| (b, checks))
    }

    /// Wakes this rank if it sleeps in [`Transport::sleep`] (abort from another thread).
    pub fn wake_self(&self) {
        if let Some(s) = &self.my_seg {
            s.ring();
        }
    }

    /// Publishes whom a slow wait of this rank waits for (`shm::wait_word`; 0 when it
    /// ends), for peers that time out to follow (see [`Transport::blame`]).
    pub fn set_waiting(&self, word: u64) {
        if let Some(s) = &self.my_seg {
            s.waiting().store(word, Ordering::Release);
        }
    }

    /// The ranks a timed-out wait for `start` (the whole team when empty) comes down
    /// to (see `shm::blame`); takes about 60 ms.
    pub fn blame(&self, start: &[usize]) -> Vec<usize> {
        let word = |p: usize| self.links.get(p).and_then(|l| l.as_deref()).and_then(|l| l.wait_word());
        shm::blame(self.rank, self.nranks, word, self.my_seg.as_deref().map(|s| s.waiting()), start, BLAME_GAP)
    }

    /// A handle that can wake this rank from any thread.
    pub fn waker(&self) -> Option<Arc<Segment>> {
        self.my_seg.clone()
    }

    /// Marks this rank failed so that peers stop waiting for it, and wakes them.
    /// `culprit` is the rank the failure started with (this rank if None);
    /// `timed_out`: this rank timed out waiting for it (peers then say so).
    pub fn mark_failed(&mut self, culprit: Option<usize>, timed_out: bool) {
        let mut v = culprit.unwrap_or(self.rank) as u32 + 1;
        if timed_out && culprit.is_some_and(|c| c != self.rank) {
            v |= shm::FAILED_TIMEOUT;
        }
        if let Some(s) = &self.my_seg {
            let _ = s.failed().compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire);
        }
        for l in self.links.iter_mut().flatten() {
            l.tell_failed(v);
            l.wake_peer();
            l.shutdown();
        }
    }
}
