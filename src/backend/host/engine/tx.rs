//! Writing a peer's stream: the next message of the run for that peer, piece by
//! piece, and the direct messages waiting for the peer's reads (which this rank
//! helps copy once nothing else is left). See docs/design/host.md, "The engine".

use super::super::msg::{
    encode_desc, header, pad8, DESC, FLAG, HDR, K_DATA, K_DIRECT, K_P2P_EAGER, K_P2P_HDR, K_P2P_SWAP, K_SKIP, K_SWAP,
    P2P_REFUSED,
};
use super::direct::{direct_desc, p2p_eager, p2p_rendezvous};
use super::exchange::Offer;
use super::run::Run;
use super::schedule::{Action, Via};
use super::split::tee_shared;
use super::state::{ring_streaming, Help, Peer, Tx};
use crate::error::Result;
use crate::mem::{copy, shared};

impl Run<'_, '_> {
    /// One visit to peer `p`'s outgoing stream: finishes the direct messages the
    /// peer has read (or, with `help`, copies a piece of one), then writes up to a
    /// piece of messages. True when anything moved.
    pub(super) fn pump_tx(&mut self, p: usize, st: &mut Peer, help: bool) -> Result<bool> {
        // Payload bytes this visit may still write (see `Plan::piece`).
        let mut budget = self.plan.piece;
        let mut progressed = self.direct_reads(p, st, help, &mut budget)?;
        while budget > 0 {
            if st.cur_tx.is_none() && !self.next_message(p, st) {
                break;
            }
            let written = self.write_message(p, st, &mut budget);
            progressed |= written.moved;
            if !written.whole {
                break;
            }
            let tx = st.cur_tx.take().expect("being written");
            if tx.awaits_read {
                // Done once the peer has read it from our buffer.
                st.direct_sent += 1;
                let how = match tx.tee {
                    _ if tx.kind == K_P2P_SWAP => Help::P2pSwap,
                    Some((dst, stream)) if tx.flag != 0 => Help::Tee { dst, stream },
                    _ => Help::Copy,
                };
                st.direct_wait.push_back((tx.step.expect("direct messages belong to steps"), st.direct_sent, how));
            } else if let Some(i) = tx.step {
                self.tally.finish(i);
            }
        }
        Ok(progressed)
    }

    /// The direct messages waiting for peer `p`'s reads: those it has read are done;
    /// otherwise, with `help`, a piece of the one it reads now is copied from here
    /// (a split copy), or an in-place send learns how far it has been read.
    fn direct_reads(&mut self, p: usize, st: &mut Peer, help: bool, budget: &mut usize) -> Result<bool> {
        let Some(&(first, want, how)) = st.direct_wait.front() else { return Ok(false) };
        let read = self.t.link(p).memory().map_or(0, |m| m.reads_done());
        if read >= want {
            while let Some(&(i, k, _)) = st.direct_wait.front() {
                if k > read {
                    break;
                }
                st.direct_wait.pop_front();
                // Receives of the run may overwrite all of it now.
                self.inplace.release(i);
                self.tally.finish(i);
            }
            return Ok(true);
        }
        if help && self.share_piece(p, st, first, want, how)? {
            // A piece of the message the peer is reading, copied into its buffer.
            *budget -= self.plan.split_piece.min(*budget);
            return Ok(true);
        }
        if let Some(sent) = self.inplace.sent.get_mut(first) {
            // A send in place: receives of the run may overwrite what the peer has
            // read so far (it reads the message it reads now in order).
            let read = self.t.link(p).memory().map_or(0, |m| m.peer_read(want));
            if read > *sent {
                *sent = read;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Starts the next message to peer `p` (a skip to the ring's start first, when
    /// the ring is empty far enough in); false when none may start now.
    fn next_message(&mut self, p: usize, st: &mut Peer) -> bool {
        loop {
            let has_next = !st.urgent.is_empty() || st.send_q.front().is_some_and(|&i| self.tally.ready(self.sched, i));
            if has_next {
                if let Some(gap) = self.t.link(p).rewind_gap(self.plan.rewind_min).filter(|&g| g >= HDR) {
                    st.cur_tx = Some(Tx::skip(gap));
                    return true;
                }
            }
            if let Some(m) = st.urgent.pop_front() {
                st.cur_tx = Some(m);
                return true;
            }
            let Some(&i) = st.send_q.front() else { return false };
            if self.tally.done[i] {
                // Exchanges through the rings that a swap made unnecessary.
                st.send_q.pop_front();
                continue;
            }
            if !self.tally.ready(self.sched, i) {
                return false;
            }
            // A send's first bytes never pass an earlier send's payload: the peer may
            // receive them in separate calls, and it reads its stream in order.
            if matches!(self.sched.steps[i].action, Action::P2pSend { .. })
                && st
                    .awaiting_reply
                    .iter()
                    .any(|&k| p2p_rendezvous(self.plan, self.t.link(p), self.sched, self.inplace, k))
            {
                return false;
            }
            st.send_q.pop_front();
            self.start_send(p, st, i);
            return true;
        }
    }

    /// Makes send step `i` (ready) the message being written to peer `p`.
    fn start_send(&mut self, p: usize, st: &mut Peer, i: usize) {
        let tag = self.sched.steps[i].tag;
        let plan = self.plan;
        let direct = match self.sched.steps[i].action {
            Action::Send { src, len, via: Via::Any | Via::Tee { .. }, .. } => {
                direct_desc(plan, self.t.link(p), src, len)
            }
            _ => None,
        };
        match self.sched.steps[i].action {
            Action::Send { src, len, via, .. } if direct.is_some() => {
                st.start_direct(self.t.link(p));
                let tee = match via {
                    Via::Tee { dst, stream } => Some((dst, stream)),
                    _ => None,
                };
                let mut tx = Tx::direct(K_DIRECT, tag, src, len, i, direct.expect("matched"), tee);
                if let Some((dst, _)) = tee.filter(|&(dst, _)| tee_shared(plan, self.t.link(p), dst, len)) {
                    // The receiver writes our copy with its pieces, we with ours.
                    tx.inline[DESC..].copy_from_slice(&encode_desc(dst, shared::lookup(dst, len)));
                    tx.payload = 2 * DESC;
                    tx.flag = 1;
                    tx.tee_done = len;
                }
                st.cur_tx = Some(tx)
            }
            Action::Send { src, len, via, .. } => {
                let mut tx = Tx::data(K_DATA, tag, src, len, Some(i));
                if let Via::Tee { dst, stream } = via {
                    tx.tee = Some((dst, stream));
                }
                st.cur_tx = Some(tx)
            }
            Action::SwapSend(Offer { at, src, len, in_place, capable, .. }) => {
                st.start_direct(self.t.link(p));
                let d = if capable {
                    encode_desc(at, shared::lookup(at, len))
                } else {
                    // Address 0: no exchange in place; the next word says
                    // whether this rank is in place.
                    let mut d = [0; DESC];
                    d[8] = u8::from(in_place);
                    d
                };
                let mut tx = Tx::direct(K_SWAP, tag, at, len, i, d, None);
                // The second descriptor names the input.
                if capable {
                    tx.inline[DESC..].copy_from_slice(&encode_desc(src, shared::lookup(src, len)));
                }
                tx.payload = 2 * DESC;
                tx.awaits_read = self.t.shares_memory(p);
                st.cur_tx = Some(tx)
            }
            Action::P2pSend { src, len, what, .. } => {
                let mut tx = if p2p_eager(plan, self.t.link(p), self.inplace, src, len) {
                    // Count and payload together; done when the receiver's count is here.
                    let mut tx = Tx::data(K_P2P_EAGER, tag, src, len, None);
                    tx.progress = self.inplace.sent.get(i).map(|_| i);
                    tx
                } else {
                    // Announce the count; the payload follows once the receiver agrees.
                    Tx::control(K_P2P_HDR, tag, len)
                };
                if what.refused {
                    tx.flag |= P2P_REFUSED;
                }
                st.cur_tx = Some(tx);
                match st.early_replies.pop_front() {
                    Some((want, flag)) => self.on_reply(p, st, i, want, flag),
                    None => st.awaiting_reply.push_back(i),
                }
            }
            _ => unreachable!("only sends are queued for sending"),
        }
    }

    /// Writes what fits of the message being written to peer `p`, within `budget`
    /// payload bytes; for a direct message with its own destination, copies that
    /// too while the peer reads.
    fn write_message(&mut self, p: usize, st: &mut Peer, budget: &mut usize) -> Written {
        let plan = self.plan;
        let link = self.t.link(p);
        let tx = st.cur_tx.as_mut().expect("set by next_message");
        let mut moved = false;
        let payload = tx.payload;
        let mut hdr = header(tx.kind, tx.tag, tx.announce);
        hdr[FLAG] = tx.flag;
        // Header and payload (padded to 8 bytes) are one stream of bytes: the ring
        // may wrap anywhere in either, including inside the header.
        let total = HDR + pad8(payload);
        while tx.written < total {
            let space = link.send_space();
            if space.is_empty() {
                break;
            }
            // A skip moves the write position without writing: never in pieces.
            let cap = if tx.kind == K_SKIP { usize::MAX } else { (*budget).max(HDR) };
            let n = space.len().min(total - tx.written).min(cap);
            let mut filled = 0;
            if tx.written < HDR {
                let k = (HDR - tx.written).min(n);
                space[..k].copy_from_slice(&hdr[tx.written..tx.written + k]);
                filled = k;
            }
            if filled < n && tx.kind == K_SKIP {
                // The skipped bytes are neither written nor read.
            } else if filled < n {
                let off = tx.written + filled - HDR;
                let data_n = (n - filled).min(payload.saturating_sub(off));
                if tx.is_direct() {
                    space[filled..filled + data_n].copy_from_slice(&tx.inline[off..off + data_n]);
                } else {
                    let dst = space[filled..].as_mut_ptr();
                    // SAFETY: src is valid for `payload` bytes (the caller's buffer or
                    // scratch, kept alive and unmodified until this step is done).
                    let from = unsafe { tx.src.add(off) };
                    // Pieces of 4 KiB and more are timed (`copy::StoreChoice`); for
                    // smaller ones a clock read would cost more than the copy.
                    let nt = data_n >= 4096 && ring_streaming(plan, &mut st.stores, payload, st.run_bytes);
                    // SAFETY: as above; the ring space holds data_n bytes, disjoint from src.
                    unsafe {
                        if data_n >= 4096 {
                            st.stores.copy(dst, from, data_n, nt)
                        } else {
                            copy::copy(dst, from, data_n)
                        }
                    };
                    if let Some((dst, stream)) = tx.tee {
                        // A piece written with streaming stores has left the caches:
                        // copy it from the source, which is.
                        let piece = if nt { from } else { space[filled..filled + data_n].as_ptr() };
                        // SAFETY: dst is valid for `payload` bytes and written by no one
                        // else until the step is done (schedule contract); the ring
                        // piece just written is disjoint from it.
                        unsafe { copy::copy_stores(dst.add(off), piece, data_n, stream) };
                    }
                }
                space[filled + data_n..n].fill(0);
            }
            link.send_commit(n);
            tx.written += n;
            if let Some(j) = tx.progress {
                // A receive of this run may now overwrite what has left.
                self.inplace.sent[j] = (tx.written - HDR.min(tx.written)).min(payload);
            }
            moved = true;
            if tx.kind != K_SKIP {
                *budget = budget.saturating_sub(n);
                if *budget == 0 {
                    break;
                }
            }
        }
        if tx.written < total {
            return Written { moved, whole: false };
        }
        if let (true, Some((dst, stream))) = (tx.is_direct(), tx.tee) {
            // The peer reads the message out of our buffer meanwhile: copy it to
            // our own destination (a broadcast root's recvbuff) in pieces.
            while tx.tee_done < tx.announce && *budget > 0 {
                let k = (*budget).min(tx.announce - tx.tee_done);
                // SAFETY: src and dst are valid for the message (schedule contract)
                // and do not overlap (a tee never copies onto its source).
                unsafe { copy::copy_stores(dst.add(tx.tee_done), tx.src.add(tx.tee_done), k, stream) };
                tx.tee_done += k;
                *budget -= k;
                moved = true;
            }
            if tx.tee_done < tx.announce {
                return Written { moved, whole: false };
            }
        }
        Written { moved, whole: true }
    }
}

/// What writing a message did: whether any byte moved, and whether all of it is out.
struct Written {
    moved: bool,
    whole: bool,
}
