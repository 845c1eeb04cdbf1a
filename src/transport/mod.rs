//! How bytes move between two ranks: the transport layer under the host backend.
//!
//! A [`Link`] is a pair of byte streams with one peer, read and written in place
//! so that the layer above copies (or reduces) straight between user buffers and the
//! transport's memory. Links to peers of the same host offer more through
//! [`PeerMemory`]: reading and writing the peer's buffers directly. Links whose bytes
//! the kernel carries offer [`Io`]. Three transports implement them: shared-memory
//! rings between processes of one host ([`shm`]), the same rings in anonymous memory
//! for ranks that are threads of one process ([`inproc`]), and TCP between hosts
//! ([`tcp`]). Stream positions advance in multiples of 8 bytes; the framing above
//! pads every message to that. See docs/design/host.md.

pub mod board;
pub mod failure;
pub mod inproc;
pub mod shm;
pub mod tcp;
pub mod wait;

use crate::error::{Code, Result};
use crate::mem::shared::Desc;
use board::Board;
use shm::Segment;
pub use shm::{Share, ShareDest};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use wait::SpinPolicy;

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
    /// An error naming the peer if it has marked itself failed; with `deep`, also
    /// if it died or the connection broke (may make system calls).
    fn check(&self, deep: bool) -> Result<()>;
    /// Tells the peer that this rank failed, with its failure word's value `v` (see
    /// [`failure::FAILED_TIMEOUT`]), wakes it if it sleeps, and closes what the peer
    /// would otherwise wait on.
    fn fail(&mut self, v: u32);
    /// The kernel's side of the link, for links whose bytes the kernel carries (TCP).
    fn io(&mut self) -> Option<&mut dyn Io> {
        None
    }
    /// What this rank can do with the peer's memory, for a peer on this host.
    fn memory(&mut self) -> Option<&mut dyn PeerMemory> {
        None
    }
}

/// A link whose bytes the kernel carries: buffered in this process until the kernel
/// takes them, and waited for on a descriptor.
pub trait Io {
    /// Moves buffered bytes to and from the kernel; true when anything moved.
    fn progress(&mut self) -> Result<bool>;
    /// Whether committed bytes still wait in this process for the kernel to take
    /// them: a run is not over until they are gone, or a peer waiting for them could
    /// wait for as long as this rank makes no further call.
    fn unsent(&self) -> bool;
    /// The descriptor that becomes ready when the link can move bytes.
    fn fd(&self) -> i32;
}

/// Why a rank writes into a peer's buffer (see [`PeerMemory::writable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// Swapping blocks of an exchange in place with the peer's.
    Swap,
    /// Writing a broadcast root's own copy of the message it sends this rank.
    Tee,
}

/// A peer on this host whose memory this rank can reach: a large message may then go
/// by its address (single copy) instead of through the stream, and both ranks may
/// work on each other's buffers. "Direct messages" are messages sent by address:
/// their sender's step is done once the receiver reports them read. See
/// docs/design/host.md, "Single copy" and "Split copies".
pub trait PeerMemory {
    /// Sender: whether the peer can read any of this rank's memory directly.
    fn peer_reads(&self) -> bool;
    /// Sender: whether the peer can map this rank's shared allocations (`mem::shared`),
    /// so a large message out of one may be sent by its place in it.
    fn peer_maps(&self) -> bool;
    /// Sender: how many of this rank's direct messages the peer has finished reading.
    fn reads_done(&self) -> u64;
    /// Sender: bytes of this rank's direct message `seq` (counted as
    /// [`PeerMemory::reads_done`] counts) that the peer has reported read with
    /// [`PeerMemory::report_read`]; 0 when it has reported none.
    fn peer_read(&self, seq: u64) -> usize;
    /// Receiver: where this rank reads, with ordinary loads, the `len` bytes of a
    /// direct message at `addr` of the peer (inside its shared allocation `shared`,
    /// when the message names one): None when only [`PeerMemory::read`] reaches them.
    fn source(&mut self, addr: u64, len: usize, shared: Option<&Desc>) -> Result<Option<*const u8>>;
    /// Receiver: reads `len` bytes at `addr` of the peer's memory into `dst`.
    fn read(&self, addr: u64, dst: *mut u8, len: usize) -> Result<()>;
    /// Receiver: tells the peer that one more of its direct messages has been read.
    fn read_done(&self);
    /// Receiver: tells the peer that the first `bytes` of the direct message it
    /// reads now (its next unfinished one) have been read, so the peer may overwrite
    /// them (an in-place fcclSend that a receive of the same run lands on). Only for
    /// messages read in order, front to back.
    fn report_read(&self, bytes: usize);
    /// Receiver: offers the peer a share in copying the next direct message it
    /// reads from the peer, `len` bytes into `dst` (`stream`: with streaming
    /// stores), when the peer can write there (see [`Share`]); the slot both take
    /// pieces from. None when the peer cannot, or split copies are off.
    fn share_offer(&mut self, dst: *mut u8, len: usize, stream: bool) -> Option<Share>;
    /// Sender: the slot in which the peer offers shares of this rank's direct messages.
    fn share_slot(&self) -> Option<Share>;
    /// Sender: where this process writes the destination the peer offered; None
    /// when it cannot (then the peer copies alone).
    fn share_target(&mut self, dest: &ShareDest) -> Result<Option<*mut u8>>;
    /// Whether the peer can write `len` bytes of ours at `at` (and this side has not
    /// failed to map the peer's buffers writable): the condition of swaps and of a
    /// broadcast root's copy written by its receiver. Both sides of a swap say so in
    /// their offers; the pair swaps only when both do.
    fn can_write(&self, at: *const u8, len: usize) -> bool;
    /// Where this process writes the `len` bytes at `addr` of the peer (inside its
    /// shared allocation `shared`, when the peer named one), for `why`. Only asked
    /// after the peer said it can be written ([`PeerMemory::can_write`] on its side),
    /// so a failure is an error.
    fn writable(&mut self, addr: u64, len: usize, shared: Option<&Desc>, why: Write) -> Result<*mut u8>;
    /// Where this process reads (and, when `write`, writes) the peer's `len` bytes
    /// at `addr` (inside its shared allocation `shared`, when the peer named one) in
    /// a collective that every rank runs on every rank's buffers (see
    /// `backend::host::proto::mapped`). None where they cannot be mapped here: then
    /// this rank leaves the work to the others, and `can_write` says no from then on,
    /// so later calls keep off that path. Err only for a descriptor that does not fit
    /// its allocation.
    fn buffer(&mut self, addr: u64, len: usize, shared: Option<&Desc>, write: bool) -> Result<Option<*mut u8>>;
}

/// What a rank saw before it last looked for work (see [`Transport::seen`]).
#[derive(Clone, Copy)]
pub struct Seen {
    doorbell: u32,
    activity: Option<u64>,
}

/// A message header read from a peer's stream but not yet handed to a step: it
/// may arrive in two pieces (the ring wraps inside it) and it may belong to a later
/// call, so it outlives one run of the layer above.
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

/// All links of one rank of one communicator.
pub struct Transport {
    pub rank: usize,
    pub nranks: usize,
    links: Vec<Option<Box<dyn Link>>>,
    pending: Vec<PendingHeader>,
    /// Every rank's segment where it is reached through shared memory, by rank
    /// (this rank's when any peer is).
    segs: Vec<Option<Arc<Segment>>>,
    /// This rank's segment when any peer is reached through shared memory.
    my_seg: Option<Arc<Segment>>,
    /// Peers whose links the kernel carries ([`Link::io`]), and their descriptors.
    io: Vec<usize>,
    fds: Vec<i32>,
    /// Peers whose links offer [`PeerMemory`].
    memory: Vec<bool>,
    /// The bulletin board, when every peer shares this host.
    pub board: Option<Board>,
    /// How waits spin, yield and sleep (depends on ranks per core).
    pub policy: SpinPolicy,
}

/// A transport dropped is a communicator destroyed (or a set-up given up): peers that
/// still wait for this rank, and find its process gone, say so instead of "died".
impl Drop for Transport {
    fn drop(&mut self) {
        if let Some(s) = &self.my_seg {
            s.mark_destroyed();
        }
    }
}

/// The peers' failure checks of a [`Transport`].
pub struct PeerChecks<'a> {
    links: &'a [Option<Box<dyn Link>>],
}

impl PeerChecks<'_> {
    /// First error among peers that died or failed (may make system calls).
    pub fn alive(&self) -> Result<()> {
        for l in self.links.iter().flatten() {
            l.check(true)?;
        }
        Ok(())
    }

    /// First error among peers that marked themselves failed (no system calls).
    pub fn flags(&self) -> Result<()> {
        for l in self.links.iter().flatten() {
            l.check(false)?;
        }
        Ok(())
    }
}

impl Transport {
    /// A rank's transport over `links` (by peer, None for itself). `segs` holds, by
    /// rank, the segment of every rank reached through shared memory, this rank's
    /// included when any peer is; when every rank has one, collectives announce
    /// themselves on the bulletin board over them.
    pub fn new(
        rank: usize,
        nranks: usize,
        mut links: Vec<Option<Box<dyn Link>>>,
        segs: Vec<Option<Arc<Segment>>>,
    ) -> Self {
        debug_assert_eq!(links.len(), nranks);
        debug_assert_eq!(segs.len(), nranks);
        let policy = SpinPolicy::for_ranks(nranks, crate::sys::available_cpus());
        let my_seg = segs[rank].clone().filter(|_| nranks > 1);
        let (mut io, mut fds, mut memory) = (Vec::new(), Vec::new(), vec![false; nranks]);
        for (p, l) in links.iter_mut().enumerate() {
            let Some(l) = l else { continue };
            if let Some(k) = l.io() {
                io.push(p);
                fds.push(k.fd());
            }
            memory[p] = l.memory().is_some();
        }
        let board = match segs.iter().cloned().collect::<Option<Vec<_>>>() {
            Some(all) if nranks > 1 => Some(Board::new(rank, all, policy)),
            _ => None,
        };
        Transport {
            rank,
            nranks,
            links,
            pending: vec![PendingHeader::default(); nranks],
            segs,
            my_seg,
            io,
            fds,
            memory,
            board,
            policy,
        }
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

    /// Whether the link to `peer` offers [`PeerMemory`] (shared memory): where it
    /// does not (TCP), nothing goes by address, so schedules need not offer exchanges
    /// in place. The same on both ends of a link.
    pub fn shares_memory(&self, peer: usize) -> bool {
        self.memory[peer]
    }

    /// The link to `peer` (never self).
    pub fn link(&mut self, peer: usize) -> &mut dyn Link {
        self.links[peer].as_deref_mut().expect("no link to self")
    }

    /// The link to `peer` and the header pending from it.
    pub fn link_and_header(&mut self, peer: usize) -> (&mut dyn Link, &mut PendingHeader) {
        (self.links[peer].as_deref_mut().expect("no link to self"), &mut self.pending[peer])
    }

    /// The kernel's progress on every link it carries; true when anything moved.
    pub fn progress_io(&mut self) -> Result<bool> {
        let mut moved = false;
        for &p in &self.io {
            if let Some(io) = self.links[p].as_deref_mut().and_then(|l| l.io()) {
                moved |= io.progress()?;
            }
        }
        Ok(moved)
    }

    /// Whether a link holds committed bytes the kernel has not taken yet ([`Io::unsent`]).
    pub fn unsent(&mut self) -> bool {
        let Transport { io, links, .. } = self;
        io.iter().any(|&p| links[p].as_deref_mut().and_then(|l| l.io()).is_some_and(|io| io.unsent()))
    }

    /// What to pass to [`Transport::sleep`], read before checking for work: the
    /// doorbell, and with `activity` (only a rank about to sleep needs it: loading
    /// the peers' ring positions on every poll would take their cache lines) the
    /// rings' positions.
    pub fn seen(&self, activity: bool) -> Seen {
        Seen {
            doorbell: self.my_seg.as_ref().map_or(0, |s| s.doorbell().load(Ordering::SeqCst)),
            activity: activity.then(|| self.activity()),
        }
    }

    /// A number that changes whenever a peer writes into one of this rank's
    /// incoming rings or reads from one of its outgoing ones.
    fn activity(&self) -> u64 {
        let Some(mine) = &self.my_seg else { return 0 };
        let me = self.rank;
        let peers = self.segs.iter().enumerate().filter(|&(p, _)| p != me);
        peers.filter_map(|(p, s)| s.as_ref().map(|s| (p, s))).fold(0u64, |a, (p, s)| {
            let head = mine.ring_head(p).load(Ordering::Acquire);
            a.wrapping_add(head.wrapping_add(s.ring_tail(me).load(Ordering::Acquire)))
        })
    }

    /// Sleeps until a peer signals progress, at most `timeout`; `seen` must have
    /// been taken with activity (without it this only yields).
    pub fn sleep(&self, seen: Seen, timeout: Duration) {
        let Some(activity) = seen.activity else {
            std::thread::yield_now();
            return;
        };
        let seen = seen.doorbell;
        if self.fds.is_empty() {
            if let Some(s) = &self.my_seg {
                s.sleep(seen, || self.activity() != activity, timeout);
            } else {
                std::thread::sleep(timeout.min(Duration::from_millis(1)));
            }
            return;
        }
        let mut fds: Vec<libc::pollfd> =
            self.fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN | libc::POLLOUT, revents: 0 }).collect();
        // With both kinds of links, poll briefly so shared-memory peers are not starved.
        let ms = if self.my_seg.is_some() { 1 } else { timeout.as_millis().clamp(1, 50) as i32 };
        // SAFETY: fds is a valid array of pollfd for the duration of the call.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    }

    /// First error among `peers` that died or failed: a call checks only the peers it
    /// still waits for, since one that finished its part may exit before this rank does.
    pub fn check_peers_of(&self, peers: &[usize]) -> Result<()> {
        for &p in peers {
            if let Some(l) = self.links.get(p).and_then(Option::as_ref) {
                l.check(true)?;
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

    /// Publishes whom a slow wait of this rank waits for (`failure::wait_word`; 0
    /// when it ends), for peers that time out to follow (see [`Transport::blame`]).
    pub fn set_waiting(&self, word: u64) {
        if let Some(s) = &self.my_seg {
            s.waiting().store(word, Ordering::Release);
        }
    }

    /// The ranks a timed-out wait for `start` (the whole team when empty) comes down
    /// to (see `failure::blame`); takes about 60 ms.
    pub fn blame(&self, start: &[usize]) -> Vec<usize> {
        let me = self.rank;
        let word = |p: usize| {
            let seg = self.segs.get(p).and_then(Option::as_ref).filter(|_| p != me);
            seg.map(|s| s.waiting().load(Ordering::Acquire))
        };
        let own = self.my_seg.as_deref().map(|s| s.waiting());
        failure::blame(me, self.nranks, word, own, start, failure::BLAME_GAP)
    }

    /// A handle that can wake this rank from any thread.
    pub fn waker(&self) -> Option<Arc<Segment>> {
        self.my_seg.clone()
    }

    /// Marks this rank failed so that peers stop waiting for it, and wakes them.
    /// `culprit` is the rank the failure started with (this rank if None); `why`: the
    /// failure's code, which peers learn where it is a timeout waiting for the culprit
    /// or ranks that called different collectives (so they fail with the same verdict).
    pub fn mark_failed(&mut self, culprit: Option<usize>, why: Code) {
        let mut v = culprit.unwrap_or(self.rank) as u32 + 1;
        if why == Code::Timeout && culprit.is_some_and(|c| c != self.rank) {
            v |= failure::FAILED_TIMEOUT;
        } else if why == Code::CollectiveMismatch {
            v |= failure::FAILED_MISMATCH;
        }
        if let Some(s) = &self.my_seg {
            let _ = s.failed().compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire);
        }
        for l in self.links.iter_mut().flatten() {
            l.fail(v);
        }
    }
}
