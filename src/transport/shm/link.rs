//! A link between two ranks of one host: two rings, one in each rank's segment.
//!
//! This rank writes into the ring it owns in the peer's segment and reads the ring
//! the peer owns in its own. A writer wakes the reader only when the reader has said
//! that it sleeps (`Segment::notify`), and the other way round, so a message costs no
//! system call and no cache line beyond the ring's own. See docs/design/host.md,
//! "Shared memory".

use super::peer_mem::{probe_map, probe_read, read_process, Mappings, Share, ShareDest};
use super::ring::{Reader, RingEnd, Writer};
use super::segment::{
    Segment, LEFT_DESTROYED, LEFT_EXITED, OFF_CAN_MAP, OFF_CAN_READ, OFF_READS_DONE, OFF_READ_PROGRESS,
};
use crate::env::SingleCopy;
use crate::error::{Error, Result};
use crate::mem::shared::Desc;
use crate::transport::{Link, PeerMemory, Write};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

/// A bidirectional link to one peer through two rings.
pub struct ShmLink {
    pub(super) peer: usize,
    pub(super) tx: Writer,
    pub(super) rx: Reader,
    /// Segment of the peer (its doorbell, failure flag and pid).
    pub(super) peer_seg: Arc<Segment>,
    check_pid: bool,
    /// The peer is a thread of this process: its addresses are ours.
    pub(super) same_process: bool,
    /// The peer's shared allocations mapped here to read its direct messages, and
    /// (writable) to copy parts of ours into its buffers. Two caches, so that
    /// neither evicts or drops the mapping the other's current message uses: each
    /// is consulted only when a message starts, one message at a time per link.
    pub(super) reads: Mappings,
    pub(super) writes: Mappings,
    /// The peer's buffers mapped writable to swap blocks with ours (in-place
    /// all_to_all, as the side that offers): a third cache, used by incoming
    /// messages while the outgoing ones use `writes`.
    pub(super) swaps: Mappings,
    /// Set when the peer's buffers could not be mapped writable: no split copies
    /// into them from then on.
    pub(super) no_share_writes: bool,
    /// Whether the first split copy to this peer has been logged.
    pub(super) share_logged: bool,
    /// Whether the first swap offered to this peer has been logged.
    pub(super) swap_logged: bool,
}

impl ShmLink {
    /// Link between `me` and `peer`, where `segs[r]` is rank r's segment.
    pub fn new(me: usize, peer: usize, my_seg: Arc<Segment>, peer_seg: Arc<Segment>, check_pid: bool) -> ShmLink {
        peer_seg.populate_ring(me);
        my_seg.populate_ring(peer);
        let tx = RingEnd::new(peer_seg.clone(), me);
        let rx = RingEnd::new(my_seg, peer);
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
        rx.word(OFF_CAN_READ).store(u64::from(can_read), Ordering::Release);
        rx.word(OFF_CAN_MAP).store(u64::from(can_map), Ordering::Release);
        ShmLink {
            peer,
            tx: Writer::new(tx),
            rx: Reader::new(rx),
            peer_seg,
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

    /// An error naming the peer if it has marked itself failed.
    pub(super) fn check_flag(&self) -> Result<()> {
        self.peer_seg.check_failed(self.peer)
    }

    /// An error naming the peer if it failed, or (between processes) died.
    pub(super) fn check_alive(&self) -> Result<()> {
        self.check_flag()?;
        if self.check_pid {
            let pid = self.peer_seg.pid();
            if !crate::sys::process_alive(pid) {
                // A peer that failed because of another rank marks itself so before it
                // exits, possibly just after the look above: that rank is the origin.
                self.check_flag()?;
                let p = self.peer;
                let why = match self.peer_seg.left().load(Ordering::Acquire) {
                    LEFT_DESTROYED => format!(
                        "rank {p} (pid {pid}) destroyed its communicator and its process exited while this rank still waits for it in this call (did it make fewer calls on the communicator than this rank?)"
                    ),
                    LEFT_EXITED => format!(
                        "rank {p} (pid {pid}) exited (returned from main or called exit) without destroying its communicator, while this rank still waits for it in this call"
                    ),
                    _ => format!("rank {p} (pid {pid}) died"),
                };
                return Err(Error::remote_rank(p, why));
            }
        }
        Ok(())
    }
}

impl Link for ShmLink {
    fn peer(&self) -> usize {
        self.peer
    }

    fn send_space(&mut self) -> &mut [u8] {
        self.tx.space()
    }

    fn send_commit(&mut self, n: usize) {
        debug_assert!(n % 8 == 0);
        if n == 0 {
            return;
        }
        self.tx.commit(n);
        // The peer is woken only if it sleeps (see `Segment::sleep`): ringing its
        // doorbell every time would take the doorbell's cache line from a peer that
        // polls it, a transfer between cores on every message.
        fence(Ordering::SeqCst);
        self.peer_seg.notify();
    }

    fn rewind_gap(&mut self, min: usize) -> Option<usize> {
        self.tx.rewind_gap(min)
    }

    fn recv_avail(&mut self) -> &[u8] {
        self.rx.avail()
    }

    fn recv_commit(&mut self, n: usize) {
        debug_assert!(n % 8 == 0);
        if n == 0 {
            return;
        }
        self.rx.commit(n);
        // The peer may be waiting for ring space (asleep: see send_commit).
        fence(Ordering::SeqCst);
        self.peer_seg.notify();
    }

    fn check(&self, deep: bool) -> Result<()> {
        if deep {
            self.check_alive()
        } else {
            self.check_flag()
        }
    }

    fn fail(&mut self, _v: u32) {
        // The peer reads this rank's failure word in its segment: waking it is enough.
        self.peer_seg.ring();
    }

    fn memory(&mut self) -> Option<&mut dyn PeerMemory> {
        Some(self)
    }
}

/// The peer-memory mechanisms of `peer_mem`, over this link's rings.
impl PeerMemory for ShmLink {
    fn peer_reads(&self) -> bool {
        self.tx.ring.word(OFF_CAN_READ).load(Ordering::Acquire) == 1
    }

    fn peer_maps(&self) -> bool {
        self.tx.ring.word(OFF_CAN_MAP).load(Ordering::Acquire) == 1
    }

    fn reads_done(&self) -> u64 {
        self.tx.ring.word(OFF_READS_DONE).load(Ordering::Acquire)
    }

    fn peer_read(&self, seq: u64) -> usize {
        if self.tx.ring.word(OFF_READ_PROGRESS).load(Ordering::Acquire) != seq {
            return 0;
        }
        // Written before the number was: this message's count or a later one's,
        // which the reader writes only once this message is read (the sender then
        // sees it done through OFF_READS_DONE and no longer asks).
        self.tx.ring.word(OFF_READ_PROGRESS + 8).load(Ordering::Relaxed) as usize
    }

    fn source(&mut self, addr: u64, len: usize, shared: Option<&Desc>) -> Result<Option<*const u8>> {
        if self.same_process {
            return Ok(Some(addr as usize as *const u8));
        }
        let Some(d) = shared else { return Ok(None) };
        match self.reads.get(self.peer, self.peer_seg.pid(), d, len, false)? {
            Ok(p) => Ok(Some(p as *const u8)),
            // Cross-memory attach, where it works, still reaches the bytes.
            Err(_) if self.rx.ring.word(OFF_CAN_READ).load(Ordering::Relaxed) == 1 => Ok(None),
            Err(e) => {
                self.check_alive()?;
                Err(Error::system(format!(
                    "reading {len} bytes straight from rank {}'s buffer failed ({}); set FERROCCL_SINGLE_COPY=0 to move data through shared memory only",
                    self.peer, e.msg
                )))
            }
        }
    }

    fn read(&self, addr: u64, dst: *mut u8, len: usize) -> Result<()> {
        read_process(self.peer_seg.pid(), addr, dst, len).map_err(|e| {
            self.check_alive().err().unwrap_or_else(|| {
                Error::system(format!(
                    "reading {len} bytes directly from rank {} failed: {e}; set FERROCCL_SINGLE_COPY=0 to move data through shared memory only",
                    self.peer
                ))
            })
        })
    }

    fn read_done(&self) {
        self.rx.ring.word(OFF_READS_DONE).fetch_add(1, Ordering::AcqRel);
        self.peer_seg.ring();
    }

    fn report_read(&self, bytes: usize) {
        let seq = self.rx.ring.word(OFF_READS_DONE).load(Ordering::Relaxed) + 1;
        self.rx.ring.word(OFF_READ_PROGRESS + 8).store(bytes as u64, Ordering::Relaxed);
        self.rx.ring.word(OFF_READ_PROGRESS).store(seq, Ordering::Release);
        self.peer_seg.ring();
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
        let slot = Share { ctrl: self.rx.ring.ctrl };
        slot.publish(&ShareDest { addr: dst as usize as u64, len, stream, shared });
        Some(slot)
    }

    fn share_slot(&self) -> Option<Share> {
        crate::env::split_copy().then_some(Share { ctrl: self.tx.ring.ctrl })
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

    fn can_write(&self, at: *const u8, len: usize) -> bool {
        if !crate::env::split_copy() || self.no_share_writes {
            return false;
        }
        self.same_process || (self.peer_maps() && crate::mem::shared::lookup(at, len).is_some())
    }

    fn writable(&mut self, addr: u64, len: usize, shared: Option<&Desc>, why: Write) -> Result<*mut u8> {
        let what = match why {
            Write::Swap => {
                if !self.swap_logged {
                    self.swap_logged = true;
                    crate::log::info(format_args!(
                        "in-place swap: this rank and rank {} swap blocks of in-place calls (all_to_all, all_reduce, send/recv pairs) between their buffers, this rank offering",
                        self.peer
                    ));
                }
                "swapping"
            }
            Write::Tee => "writing the sender's own copy of",
        };
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

    fn buffer(&mut self, addr: u64, len: usize, shared: Option<&Desc>, write: bool) -> Result<Option<*mut u8>> {
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

#[cfg(test)]
mod tests {
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
