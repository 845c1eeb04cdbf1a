//! Small fcclSend/fcclRecv without a schedule.
//!
//! A group of point-to-point calls whose payloads are all smaller than
//! `direct_min` (`plan::Plan`) (pipeline stages, halo exchanges, a ping-pong) moves a few
//! hundred bytes; its time went to the engine's bookkeeping, not to the copy:
//! building steps, queueing them per peer, visiting every peer on every poll, and
//! publishing each message (and each message read) on its own. This path writes
//! exactly the messages the engine writes for such calls, in the same order per
//! peer (the receiver's count for each fcclRecv, then each fcclSend's count and
//! payload together), and reads its peers' messages by the engine's rules, so a
//! rank on this path and a peer in the engine understand each other. What it
//! skips is the machinery: the calls' state lives in a few words on the stack,
//! all messages to a peer that fit are published together, and every message that
//! has arrived from a peer is released together.

use super::engine::{self, Idle, RunCtl};
use super::msg::{
    gather, header, pad8, parse_header, FLAG, HDR, K_DATA, K_DIRECT, K_P2P_DATA, K_P2P_DIRECT, K_P2P_EAGER, K_P2P_HDR,
    K_P2P_REPLY, K_SKIP, P2P_REFUSED,
};
use super::plan;
use crate::coll::counts::{p2p_verdict, P2pCall};
use crate::coll::Call;
use crate::coll::CollKind;
use crate::error::{Error, Result};
use crate::mem::copy;
use crate::transport::{Link, Transport};

/// Most calls in a group this path takes (their state is a bit per call).
const MAX_CALLS: usize = 16;

/// Whether `calls` run here: each an fcclSend or fcclRecv with another rank (a
/// count of zero moves nothing and is ignored, as in the engine), of fewer than
/// `direct_min` (`plan::Plan`) bytes, so that every send goes eagerly (count and payload
/// in one message) whatever the peer's link offers.
pub fn eligible(rank: usize, calls: &[Call]) -> bool {
    let direct_min = plan::get().direct_min;
    !calls.is_empty()
        && calls.len() <= MAX_CALLS
        && calls.iter().all(|c| {
            let co = &c.coll;
            co.kind.is_p2p() && co.peer != rank && co.count.checked_mul(co.dtype.size()).is_some_and(|b| b < direct_min)
        })
}

/// A payload being read for call `call`: into `dst`, or dropped (`dst` null: the
/// payload of a send whose size differs).
struct Rx {
    call: usize,
    dst: *mut u8,
    len: usize,
    read: usize,
}

/// One peer of the group.
struct Slot {
    peer: usize,
    /// The calls with this peer, in the order made: receives, then sends.
    recvs: [u8; MAX_CALLS],
    nrecvs: usize,
    sends: [u8; MAX_CALLS],
    nsends: usize,
    /// Next message to write (the count of receive j for j < nrecvs, then the sends)
    /// and how many of its bytes are written.
    tx_msg: usize,
    tx_off: usize,
    /// Receives matched to a message of the peer; receivers' counts read for sends.
    matched: usize,
    replies: usize,
    rx: Option<Rx>,
}

impl Slot {
    fn new(peer: usize) -> Slot {
        Slot {
            peer,
            recvs: [0; MAX_CALLS],
            nrecvs: 0,
            sends: [0; MAX_CALLS],
            nsends: 0,
            tx_msg: 0,
            tx_off: 0,
            matched: 0,
            replies: 0,
            rx: None,
        }
    }
    fn nmsgs(&self) -> usize {
        self.nrecvs + self.nsends
    }
}

/// Progress of the group's calls, a bit per call.
#[derive(Default)]
struct Bits {
    /// Receives whose payload has been read (or refused).
    received: u32,
    /// Sends whose payload has been copied into the ring.
    written: u32,
    /// Sends whose receiver's count has come.
    replied: u32,
    /// Per receive: the sends whose buffers overlap its buffer (an in-place
    /// exchange). It takes no payload before those have been copied out.
    waits_for: [u32; MAX_CALLS],
}

fn bytes(c: &Call) -> usize {
    c.coll.count * c.coll.dtype.size()
}

/// Header `h` of call `c`'s message, flagged when its rank refused the call.
fn flagged(mut h: [u8; HDR], c: &Call) -> [u8; HDR] {
    if c.coll.refused {
        h[FLAG] |= P2P_REFUSED;
    }
    h
}

/// Runs `calls` (see [`eligible`]) to completion, with the engine's contract: `Err`
/// is fatal for the communicator, `Ok(Some(e))` a count mismatch reported on both
/// sides after every call finished.
pub fn run(t: &mut Transport, calls: &[Call], ctl: &RunCtl<'_>) -> Result<Option<Error>> {
    // A peer that failed or aborted earlier is reported as such.
    t.check_flags().map_err(|e| e.context((ctl.what)()))?;
    let mut slots = SLOTS.with(|c| c.take());
    slots.clear();
    let res = run_with(t, calls, ctl, &mut slots);
    SLOTS.with(|c| c.replace(slots));
    res
}

thread_local! {
    /// The peers of the last group, kept so that a call allocates nothing.
    static SLOTS: std::cell::Cell<Vec<Slot>> = const { std::cell::Cell::new(Vec::new()) };
}

fn run_with(t: &mut Transport, calls: &[Call], ctl: &RunCtl<'_>, slots: &mut Vec<Slot>) -> Result<Option<Error>> {
    let mut bits = Bits::default();
    let (mut recv_mask, mut send_mask) = (0u32, 0u32);
    for (i, c) in calls.iter().enumerate() {
        if c.coll.is_noop() {
            continue;
        }
        let peer = c.coll.peer;
        let k = match slots.iter().position(|s| s.peer == peer) {
            Some(k) => k,
            None => {
                slots.push(Slot::new(peer));
                slots.len() - 1
            }
        };
        let s = &mut slots[k];
        if c.coll.kind == CollKind::Send {
            s.sends[s.nsends] = i as u8;
            s.nsends += 1;
            send_mask |= 1 << i;
        } else {
            s.recvs[s.nrecvs] = i as u8;
            s.nrecvs += 1;
            recv_mask |= 1 << i;
            let (dst, len) = (c.coll.recv as usize, bytes(c));
            for (j, o) in calls.iter().enumerate().filter(|(_, o)| o.coll.kind == CollKind::Send && !o.coll.is_noop()) {
                let (src, olen) = (o.coll.send as usize, bytes(o));
                if src < dst + len && dst < src + olen {
                    bits.waits_for[i] |= 1 << j;
                }
            }
        }
    }
    let mut idle = Idle::default();
    let mut err: Option<Error> = None;
    loop {
        let seen = idle.seen(t);
        let mut moved = t.progress_io()?;
        for s in slots.iter_mut() {
            moved |= write(t.link(s.peer), calls, s, &mut bits);
        }
        for s in slots.iter_mut() {
            moved |= read(t, calls, s, &mut bits, &mut err, ctl)?;
        }
        let sent = slots.iter().all(|s| s.tx_msg == s.nmsgs());
        if sent && bits.received == recv_mask && bits.replied == send_mask && !t.unsent() {
            idle.unpublish(t);
            return Ok(err);
        }
        if moved {
            idle.progressed(t);
            continue;
        }
        idle.wait(t, seen, ctl, || {
            let from: Vec<usize> = slots
                .iter()
                .filter(|s| s.matched < s.nrecvs || s.replies < s.nsends || s.rx.is_some())
                .map(|s| s.peer)
                .collect();
            let to: Vec<usize> = slots.iter().filter(|s| s.tx_msg < s.nmsgs()).map(|s| s.peer).collect();
            engine::Waits { from, to, detail: String::new() }
        })?;
    }
}

/// Writes the messages still due to the peer of `s`, as many as the ring takes,
/// each stretch of them published at once. True when anything was written.
fn write(link: &mut dyn Link, calls: &[Call], s: &mut Slot, bits: &mut Bits) -> bool {
    let mut moved = false;
    while s.tx_msg < s.nmsgs() {
        if s.tx_off == 0 {
            // As the engine does: a ring the peer has emptied starts over at its
            // first pages (see `Link::rewind_gap`).
            if let Some(gap) = link.rewind_gap(plan::get().rewind_min).filter(|&g| g >= HDR) {
                let space = link.send_space();
                if space.len() >= gap {
                    space[..HDR].copy_from_slice(&header(K_SKIP, 0, gap - HDR));
                    link.send_commit(gap);
                    moved = true;
                }
            }
        }
        let space = link.send_space();
        if space.is_empty() {
            break;
        }
        let mut filled = 0;
        while s.tx_msg < s.nmsgs() && filled < space.len() {
            let (hdr, src, len, send) = if s.tx_msg < s.nrecvs {
                let c = &calls[s.recvs[s.tx_msg] as usize];
                (flagged(header(K_P2P_REPLY, c.seq as u32, bytes(c)), c), std::ptr::null(), 0, None)
            } else {
                let i = s.sends[s.tx_msg - s.nrecvs] as usize;
                let c = &calls[i];
                (flagged(header(K_P2P_EAGER, c.seq as u32, bytes(c)), c), c.coll.send, bytes(c), Some(i))
            };
            let n = put(&mut space[filled..], &hdr, src, len, s.tx_off);
            filled += n;
            s.tx_off += n;
            if s.tx_off < HDR + pad8(len) {
                break;
            }
            if let Some(i) = send {
                bits.written |= 1 << i;
            }
            s.tx_msg += 1;
            s.tx_off = 0;
        }
        link.send_commit(filled);
        moved = true;
    }
    moved
}

/// Writes bytes `[from, from + n)` of a message (`hdr`, then `len` bytes at `src`
/// padded with zeros to a multiple of 8) into `dst`, as many as fit; returns `n`.
fn put(dst: &mut [u8], hdr: &[u8; HDR], src: *const u8, len: usize, from: usize) -> usize {
    let n = dst.len().min(HDR + pad8(len) - from);
    let mut i = 0;
    if from < HDR {
        i = (HDR - from).min(n);
        dst[..i].copy_from_slice(&hdr[from..from + i]);
    }
    if i < n {
        let off = from + i - HDR;
        let data_n = (n - i).min(len.saturating_sub(off));
        // SAFETY: src is the caller's send buffer, valid for len bytes (validated at
        // the call) and unmodified until the call returns; the ring space is ours
        // until published and never overlaps user memory.
        unsafe { copy::copy(dst[i..].as_mut_ptr(), src.add(off), data_n) };
        dst[i + data_n..n].fill(0);
    }
    n
}

/// What a header from the peer means for this group.
enum Take {
    /// Not for this group's calls (a later call's, or one that must wait for our
    /// own send to leave the buffer): it stays in the ring.
    Later,
    /// Consumed; a payload follows when `Some`.
    Now(Option<Rx>),
    /// A skip over this many bytes to the ring's start (released through the
    /// pending header, which outlives the call).
    Skip(usize),
}

/// Reads every message from the peer of `s` that belongs to this group, releasing
/// each contiguous stretch at once. True when anything was read.
fn read(
    t: &mut Transport,
    calls: &[Call],
    s: &mut Slot,
    bits: &mut Bits,
    err: &mut Option<Error>,
    ctl: &RunCtl<'_>,
) -> Result<bool> {
    let me = t.rank;
    let mut moved = false;
    loop {
        let (link, pending) = t.link_and_header(s.peer);
        // The rest of a skip comes first: an earlier run may have ended inside it.
        if pending.skip > 0 {
            moved |= pending.release_skip(link);
            if pending.skip > 0 {
                return Ok(moved);
            }
        }
        let avail = link.recv_avail();
        let (ptr, alen) = (avail.as_ptr(), avail.len());
        // A header that arrived in two pieces (the ring wraps inside it) is gathered
        // first, kept pending across calls until one takes it.
        if s.rx.is_none() && (pending.got > 0 || alen < HDR) {
            moved |= gather(link, &mut pending.bytes, &mut pending.got);
            if pending.got < HDR {
                return Ok(moved);
            }
            match take(&pending.bytes, calls, s, bits, err, me, ctl)? {
                Take::Later => return Ok(moved),
                Take::Now(rx) => {
                    pending.got = 0;
                    s.rx = rx;
                    moved = true;
                    continue;
                }
                Take::Skip(len) => {
                    pending.got = 0;
                    pending.skip = len;
                    moved = true;
                    continue;
                }
            }
        }
        // SAFETY: these bytes were published by the peer and stay unchanged until
        // recv_commit releases them below; nothing else reads this link meanwhile.
        let avail = unsafe { std::slice::from_raw_parts(ptr, alen) };
        let mut used = 0;
        let mut later = false;
        let mut skip = 0;
        loop {
            if let Some(rx) = s.rx.as_mut() {
                let total = pad8(rx.len);
                let n = (alen - used).min(total - rx.read);
                if n == 0 {
                    break;
                }
                let data_n = n.min(rx.len.saturating_sub(rx.read));
                if !rx.dst.is_null() {
                    // SAFETY: dst is the receive's buffer, valid for rx.len bytes and not
                    // read by any send of the group still to be copied (`waits_for`).
                    unsafe { copy::copy(rx.dst.add(rx.read), avail[used..].as_ptr(), data_n) };
                }
                used += n;
                rx.read += n;
                if rx.read < total {
                    break;
                }
                bits.received |= 1 << rx.call;
                s.rx = None;
            }
            if alen - used < HDR {
                break;
            }
            let hdr: &[u8; HDR] = avail[used..used + HDR].try_into().expect("HDR bytes");
            match take(hdr, calls, s, bits, err, me, ctl)? {
                Take::Later => {
                    later = true;
                    break;
                }
                Take::Now(rx) => {
                    used += HDR;
                    s.rx = rx;
                }
                Take::Skip(len) => {
                    used += HDR;
                    skip = len;
                    break;
                }
            }
        }
        if used == 0 {
            return Ok(moved);
        }
        link.recv_commit(used);
        pending.skip = skip;
        moved = true;
        if later {
            return Ok(moved);
        }
    }
}

/// Decides on the message whose header is `hdr`, by the engine's rules (see
/// `engine::pump_rx`).
fn take(
    hdr: &[u8; HDR],
    calls: &[Call],
    s: &mut Slot,
    bits: &mut Bits,
    err: &mut Option<Error>,
    me: usize,
    ctl: &RunCtl<'_>,
) -> Result<Take> {
    let (kind, _, len) = parse_header(hdr);
    let p = s.peer;
    Ok(match kind {
        K_P2P_EAGER | K_P2P_HDR => {
            if s.matched == s.nrecvs {
                return Ok(Take::Later);
            }
            let i = s.recvs[s.matched] as usize;
            if kind == K_P2P_EAGER && bits.waits_for[i] & !bits.written != 0 {
                return Ok(Take::Later);
            }
            s.matched += 1;
            let c = &calls[i];
            let want = bytes(c);
            let verdict = p2p_verdict(P2pCall::of(&c.coll), me, p, len, want, hdr[FLAG] & P2P_REFUSED != 0);
            let agree = verdict.is_none();
            if let Some(e) = verdict {
                err.get_or_insert(e);
            }
            if kind == K_P2P_HDR {
                // A send of DIRECT_MIN bytes or more: never the size of ours.
                if agree {
                    return Err(Error::internal(format!(
                        "{}: rank {p} announced a handshake for a {len}-byte fcclSend, which goes eagerly",
                        (ctl.what)()
                    )));
                }
                bits.received |= 1 << i;
                Take::Now(None)
            } else {
                let dst = if agree { c.coll.recv } else { std::ptr::null_mut() };
                Take::Now(Some(Rx { call: i, dst, len, read: 0 }))
            }
        }
        K_P2P_REPLY => {
            if s.replies == s.nsends {
                // For a send of the peer's next call: stays pending until then.
                return Ok(Take::Later);
            }
            let i = s.sends[s.replies] as usize;
            s.replies += 1;
            let c = &calls[i];
            let mine = bytes(c);
            if let Some(e) = p2p_verdict(P2pCall::of(&c.coll), me, p, mine, len, hdr[FLAG] & P2P_REFUSED != 0) {
                err.get_or_insert(e);
            }
            bits.replied |= 1 << i;
            Take::Now(None)
        }
        K_SKIP => Take::Skip(len),
        // A collective's message: for a later call.
        K_DATA | K_DIRECT => Take::Later,
        K_P2P_DATA | K_P2P_DIRECT => {
            return Err(Error::internal(format!("{}: unexpected payload from rank {p}", (ctl.what)())))
        }
        k => {
            return Err(Error::internal(format!(
                "{}: corrupt stream from rank {p} (message kind {k}); the communicator is unusable",
                (ctl.what)()
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::engine::{self, RunCtl, Schedule, Sink};
    use super::super::msg::{header, parse_header, HDR, K_P2P_EAGER, K_P2P_REPLY, K_SKIP};
    use super::super::{execute, Call};
    use crate::coll::{Coll, CollKind};
    use crate::error::{Code, Error};
    use crate::transport::{inproc, Link, Transport};
    use crate::types::DataType;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    fn p2p(kind: CollKind, buf: *mut u8, bytes: usize, peer: usize) -> Call {
        let mut c = Coll::new(kind, buf, buf, bytes, DataType::Uint8);
        c.peer = peer;
        Call { coll: c, seq: 0 }
    }

    fn run(t: &mut Transport, calls: &[Call]) -> Option<Error> {
        let abort = AtomicBool::new(false);
        let mut seq = 0;
        let mut x = crate::backend::Exec {
            t,
            seq: &mut seq,
            timeout: Duration::from_secs(20),
            abort: &abort,
            check: true,
            posting: crate::backend::Posting::Never,
            cuda: false,
            backend: "host",
            algo: crate::backend::Algo::None,
            exchanges: 0,
        };
        execute(&mut x, calls).expect("no fatal error").into_result().err()
    }

    /// Message `k` of rank `r`: bytes that differ per message, rank and position.
    fn fill(buf: &mut [u8], r: usize, k: usize) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i * 31 + k * 7 + r * 101) as u8 ^ (i >> 8) as u8;
        }
    }

    /// Sizes that put headers and payloads at every offset of a ring of `ring`
    /// bytes (so they straddle its end), including sizes that are not multiples of 8.
    fn sizes(max: usize, rounds: usize) -> Vec<usize> {
        (0..rounds).map(|k| 1 + (k * 2654435761usize) % max).collect()
    }

    /// Rank `me` of a pair in round k: an exchange with the peer, on this path or
    /// (every third round on rank 0, where a send to itself makes the group
    /// ineligible) in the engine; every fifth round in place; every seventh round
    /// rank 1 receives in a separate call per message while rank 0 sends both in
    /// one group.
    fn rank_body(mut t: Transport, max: usize, rounds: usize) {
        let me = t.rank;
        let peer = 1 - me;
        for (k, &n) in sizes(max, rounds).iter().enumerate() {
            let mut send = vec![0u8; n];
            let mut recv = vec![0u8; n];
            let mut own = vec![0u8; 8];
            let mut own_back = vec![0u8; 8];
            fill(&mut send, me, k);
            let in_place = k % 5 == 0;
            if k % 7 == 3 {
                // Two messages; rank 1 takes them one call at a time.
                let mut send2 = vec![0u8; n / 2 + 1];
                fill(&mut send2, me, k + 1000);
                let mut recv2 = vec![0u8; n / 2 + 1];
                if me == 0 {
                    let calls = [
                        p2p(CollKind::Send, send.as_mut_ptr(), n, peer),
                        p2p(CollKind::Send, send2.as_mut_ptr(), send2.len(), peer),
                    ];
                    assert!(run(&mut t, &calls).is_none());
                } else {
                    assert!(run(&mut t, &[p2p(CollKind::Recv, recv.as_mut_ptr(), n, peer)]).is_none());
                    assert!(run(&mut t, &[p2p(CollKind::Recv, recv2.as_mut_ptr(), recv2.len(), peer)]).is_none());
                    let mut want = vec![0u8; n];
                    fill(&mut want, peer, k);
                    assert!(recv == want, "round {k}: first of two messages of {n} bytes");
                    let mut want2 = vec![0u8; recv2.len()];
                    fill(&mut want2, peer, k + 1000);
                    assert!(recv2 == want2, "round {k}: second of two messages");
                }
                continue;
            }
            let rbuf = if in_place { send.as_mut_ptr() } else { recv.as_mut_ptr() };
            let mut calls = vec![p2p(CollKind::Send, send.as_mut_ptr(), n, peer), p2p(CollKind::Recv, rbuf, n, peer)];
            if me == 0 && k % 3 == 1 {
                fill(&mut own, me, k);
                calls.push(p2p(CollKind::Send, own.as_mut_ptr(), 8, me));
                calls.push(p2p(CollKind::Recv, own_back.as_mut_ptr(), 8, me));
                assert!(!super::eligible(me, &calls), "a send to itself takes the group to the engine");
            }
            assert!(run(&mut t, &calls).is_none(), "round {k}: {n} bytes");
            let mut want = vec![0u8; n];
            fill(&mut want, peer, k);
            let got = if in_place { &send } else { &recv };
            assert!(*got == want, "round {k}: {n} bytes{}", if in_place { " in place" } else { "" });
            assert_eq!(own, own_back);
        }
        // A count mismatch fails both sides and leaves the streams aligned.
        let mut a = vec![7u8; 100];
        let mut b = vec![0u8; 200];
        let calls = if me == 0 {
            [p2p(CollKind::Send, a.as_mut_ptr(), 100, peer), p2p(CollKind::Recv, b.as_mut_ptr(), 100, peer)]
        } else {
            [p2p(CollKind::Send, a.as_mut_ptr(), 100, peer), p2p(CollKind::Recv, b.as_mut_ptr(), 200, peer)]
        };
        let e = run(&mut t, &calls).expect("both sides fail");
        assert_eq!(e.code, Code::CollectiveMismatch, "{}", e.msg);
        assert!(e.msg.contains("100 bytes") && e.msg.contains("200 bytes"), "{}", e.msg);
        // Rank 0 received rank 1's 100 bytes intact.
        if me == 0 {
            assert!(b[..100].iter().all(|&x| x == 7));
        }
        let mut s = [me as u8 + 1; 24];
        let mut r = [0u8; 24];
        let calls = [p2p(CollKind::Send, s.as_mut_ptr(), 24, peer), p2p(CollKind::Recv, r.as_mut_ptr(), 24, peer)];
        assert!(run(&mut t, &calls).is_none(), "after the mismatch");
        assert_eq!(r, [peer as u8 + 1; 24]);
    }

    /// Both ranks of a pair with rings of `ring` bytes, `rounds` rounds of messages of
    /// 1 to `max` bytes.
    fn pair(ring: usize, max: usize, rounds: usize) {
        let ts = inproc::build_with_ring(2, ring).expect("links");
        std::thread::scope(|s| {
            for t in ts {
                s.spawn(move || rank_body(t, max, rounds));
            }
        });
    }

    /// A 4 KiB ring: messages wrap around its end every few rounds.
    #[test]
    fn small_ring_wraps() {
        pair(4096, 1365, 500);
    }

    /// Tiny messages in a 4 KiB ring: headers straddle its end too (gathered in two
    /// pieces, kept pending between calls).
    #[test]
    fn headers_straddle_the_ring_end() {
        pair(4096, 64, 3000);
    }

    /// A 128 KiB ring: the writer rewinds it (a skip message) whenever it is empty
    /// past 64 KiB, on both paths.
    #[test]
    fn ring_rewinds() {
        pair(128 << 10, 30_000, 300);
    }

    /// Publishes the header and the next `first` bytes of a skip over the rest of
    /// `link`'s ring (which the peer has emptied), as a writer stopped between the
    /// skip's two pieces leaves it; returns the bytes still to publish.
    fn skip_first_piece(link: &mut dyn Link, first: usize) -> usize {
        let space = link.send_space();
        let gap = space.len();
        assert!(gap >= HDR + first + 8, "room for a skip in two pieces");
        space[..HDR].copy_from_slice(&header(K_SKIP, 0, gap - HDR));
        link.send_commit(HDR + first);
        gap - HDR - first
    }

    fn skip_rest(link: &mut dyn Link, rest: usize) {
        assert!(link.send_space().len() >= rest, "the rest of the skip is free");
        link.send_commit(rest);
    }

    /// Sends `data` from rank `from` to rank `to` of `ts` through the engine (done
    /// once written) and receives it there; the bytes received.
    fn through_engine(ts: &mut [Transport], from: usize, to: usize, data: &[u8]) -> Vec<u8> {
        let abort = AtomicBool::new(false);
        let ctl = RunCtl { timeout: Duration::from_secs(20), abort: &abort, what: &|| "test".to_string() };
        let mut s = Schedule::new(7);
        s.send(to, data.as_ptr(), data.len(), &[]);
        assert!(engine::run(&mut ts[from], &mut s, &ctl).expect("send").is_none());
        let mut got = vec![0u8; data.len()];
        let mut s = Schedule::new(7);
        s.recv(from, data.len(), Sink::Copy(got.as_mut_ptr()), &[]);
        assert!(engine::run(&mut ts[to], &mut s, &ctl).expect("receive after the skip").is_none());
        got
    }

    /// A call that ends while a skip from another peer is half published (its
    /// writer stopped between the two pieces) leaves the rest to the next call,
    /// which must release it before it reads a header: an engine run that reads
    /// the first piece, then an engine run and a call on this path that read past
    /// the skip.
    #[test]
    fn a_skip_half_published_when_a_call_ends_is_finished_by_the_next() {
        for next_on_this_path in [false, true] {
            let mut ts = inproc::build_with_ring(3, 64 << 10).expect("links");
            let rest = skip_first_piece(ts[1].link(2), 4096);
            // Rank 2 takes rank 0's message, reading the skip's first piece on the way.
            assert_eq!(through_engine(&mut ts, 0, 2, b"from rank 0 ....").as_slice(), b"from rank 0 ....");
            skip_rest(ts[1].link(2), rest);
            let data: Vec<u8> = (0..40u8).collect();
            let got = if next_on_this_path {
                let mut it = ts.into_iter();
                let (_, mut t1, mut t2) = (it.next(), it.next().unwrap(), it.next().unwrap());
                let mut send = data.clone();
                let mut got = vec![0u8; data.len()];
                std::thread::scope(|s| {
                    s.spawn(|| assert!(run(&mut t1, &[p2p(CollKind::Send, send.as_mut_ptr(), 40, 2)]).is_none()));
                    assert!(run(&mut t2, &[p2p(CollKind::Recv, got.as_mut_ptr(), 40, 1)]).is_none());
                });
                got
            } else {
                through_engine(&mut ts, 1, 2, &data)
            };
            assert_eq!(got, data, "next on this path: {next_on_this_path}");
        }
    }

    /// The same on this path: a call whose last message from a peer (its count for
    /// our send) is followed by a half-published skip.
    #[test]
    fn a_skip_half_published_after_a_reply_is_finished_by_the_next_call() {
        let mut it = inproc::build_with_ring(2, 64 << 10).expect("links").into_iter();
        let (mut t0, mut t1) = (it.next().unwrap(), it.next().unwrap());
        let mut first = *b"rank 0 to rank 1";
        // Rank 1's count for that send (as its fcclRecv announces it), then the
        // first piece of a skip.
        let link = t1.link(0);
        link.send_space()[..HDR].copy_from_slice(&header(K_P2P_REPLY, 1, first.len()));
        link.send_commit(HDR);
        let rest = skip_first_piece(link, 4096);
        assert!(run(&mut t0, &[p2p(CollKind::Send, first.as_mut_ptr(), first.len(), 1)]).is_none());
        // Rank 1 takes the message its count answered off the ring.
        let link = t1.link(0);
        let avail = link.recv_avail();
        assert_eq!(parse_header(avail[..HDR].try_into().unwrap()).0, K_P2P_EAGER);
        assert_eq!(&avail[HDR..HDR + 16], b"rank 0 to rank 1");
        link.recv_commit(HDR + 16);
        skip_rest(link, rest);
        let mut back: Vec<u8> = (100..140u8).collect();
        let mut got = vec![0u8; back.len()];
        std::thread::scope(|s| {
            s.spawn(|| assert!(run(&mut t1, &[p2p(CollKind::Send, back.as_mut_ptr(), 40, 0)]).is_none()));
            assert!(run(&mut t0, &[p2p(CollKind::Recv, got.as_mut_ptr(), 40, 1)]).is_none());
        });
        assert_eq!(got, (100..140u8).collect::<Vec<_>>());
    }
}
