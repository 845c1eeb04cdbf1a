//! Reading a peer's stream: each header is matched to the step it is for (by the
//! order both ranks' schedules agree on), then its payload is taken out of the
//! stream, or, for a direct message, out of the sender's buffer, piece by piece.
//! See docs/design/host.md, "The engine".

use super::super::msg::{
    decode_desc, gather, pad8, parse_header, ANY_TAG, DESC, FLAG, HDR, K_DATA, K_DIRECT, K_P2P_DATA, K_P2P_DIRECT,
    K_P2P_EAGER, K_P2P_HDR, K_P2P_REPLY, K_P2P_SWAP, K_SKIP, K_SWAP, P2P_REFUSED,
};
use super::exchange::{swap_offers, Exchange, Offer, PeerInput, Side};
use super::run::Run;
use super::schedule::{Action, Sink, Step};
use super::split::{receiver_takes_pieces, rx_tee, share_pieces};
use super::state::{DirectRx, Held, Peer, Rx, RxSwap, Source};
use crate::coll::counts::p2p_verdict;
use crate::error::{Error, Result};
use crate::mem::copy;
use crate::mem::pool::PooledBuf;
use crate::transport::{Link, PeerMemory, Write};

/// What a stage of a visit leaves the visit to do.
enum Flow {
    /// Look at the stream again (the next message, or more of this one).
    Next,
    /// Nothing more now: the visit ends.
    Stop,
    /// A message has started: read its payload.
    Go,
}

/// The peer memory of a link that a direct message came through: only links to
/// peers on this host carry them.
fn mem(link: &mut dyn Link) -> Result<&mut dyn PeerMemory> {
    let peer = link.peer();
    link.memory().ok_or_else(|| {
        Error::internal(format!("rank {peer} sent a message by address over a link without shared memory"))
    })
}

impl Run<'_, '_> {
    /// One visit to peer `p`'s incoming stream: takes up to a piece of payload,
    /// starting as many messages as their steps allow. True when anything moved.
    pub(super) fn pump_rx(&mut self, p: usize, st: &mut Peer) -> Result<bool> {
        let mut progressed = false;
        // Payload bytes this visit may still take (see `Plan::piece`).
        let mut budget = self.plan.piece;
        while budget > 0 {
            if st.cur_rx.is_none() {
                match self.rx_start(p, st, &mut progressed)? {
                    Flow::Stop => break,
                    Flow::Next => continue,
                    Flow::Go => progressed = true,
                }
            }
            let direct = st.cur_rx.as_ref().expect("set above").direct.is_some();
            let flow = if direct {
                self.rx_direct(p, st, &mut budget, &mut progressed)?
            } else {
                self.rx_stream(p, st, &mut budget, &mut progressed)
            };
            if let Flow::Stop = flow {
                break;
            }
        }
        Ok(progressed)
    }

    /// Reads the next header from peer `p` and starts the message it announces for
    /// the step it belongs to; a control message (a count, a skip) is handled here.
    fn rx_start(&mut self, p: usize, st: &mut Peer, progressed: &mut bool) -> Result<Flow> {
        let me = self.t.rank;
        let (link, hdr) = self.t.link_and_header(p);
        // The rest of a skip comes first: an earlier run may have ended inside it.
        if hdr.skip > 0 {
            *progressed |= hdr.release_skip(link);
            if hdr.skip > 0 {
                return Ok(Flow::Stop);
            }
        }
        // The header may straddle the ring's wrap point: gather it first. It
        // stays pending (across runs) until the step it is for can take it.
        *progressed |= gather(link, &mut hdr.bytes, &mut hdr.got);
        if hdr.got < HDR {
            return Ok(Flow::Stop);
        }
        let (kind, tag, len) = parse_header(&hdr.bytes);
        match kind {
            K_DATA | K_DIRECT | K_SWAP => {
                // Exchanges through the rings that a swap made unnecessary.
                while st.data_rq.front().is_some_and(|&i| self.tally.done[i]) {
                    st.data_rq.pop_front();
                }
                let Some(&i) = st.data_rq.front() else { return Ok(Flow::Stop) };
                if !self.tally.ready(self.sched, i) {
                    return Ok(Flow::Stop);
                }
                // A swap offer where a message is due, or the other way round,
                // is a desynchronised stream, reported as such below.
                let (want, sink, swap) = match self.sched.steps[i].action {
                    Action::Recv { len, sink, .. } => (len, sink, None),
                    Action::SwapRecv { offer: Offer { len, at, src, how, .. }, .. } => {
                        let own = Side { dst: at, src };
                        (len, Sink::Discard, Some(RxSwap { own, how, peer_input: PeerInput::Unknown }))
                    }
                    _ => unreachable!("only receives are queued for data"),
                };
                let want_tag = self.sched.steps[i].tag;
                if (want_tag != ANY_TAG && tag != want_tag) || len != want || (kind == K_SWAP) != swap.is_some() {
                    self.t.check_flags().map_err(|e| self.context(e))?;
                    let what = if tag != want_tag {
                        "for another call (its collective, count, type, op or root differs from this one's)".to_string()
                    } else {
                        format!("of {len} bytes where this call expects {want}")
                    };
                    return Err(Error::mismatch(format!(
                        "{}: rank {p} sent a message {what}: the ranks called different collectives, counts or types. Nothing of it was taken; the communicator is unusable now: destroy it (FERROCCL_CHECK=1, the default, compares the calls before any data moves and leaves the communicator usable)",
                        (self.ctl.what)()
                    )));
                }
                st.data_rq.pop_front();
                hdr.got = 0;
                let direct = (kind != K_DATA).then(|| DirectRx::new(kind, hdr.bytes[FLAG]));
                st.cur_rx = Some(Rx { direct, swap, ..Rx::new(i, len, sink) });
                Ok(Flow::Go)
            }
            K_SKIP => {
                // Released above, as far as published; kept with the header
                // state, since this run may end before the writer publishes all.
                hdr.got = 0;
                hdr.skip = len;
                *progressed = true;
                Ok(Flow::Next)
            }
            K_P2P_HDR => {
                let Some(&i) = st.p2p_rq.front() else { return Ok(Flow::Stop) };
                st.p2p_rq.pop_front();
                hdr.got = 0;
                // Our count went to the sender when the run started: both sides
                // now know whether the payload comes.
                let Action::P2pRecv { len: want, what, .. } = self.sched.steps[i].action else { unreachable!() };
                if let Some(e) = p2p_verdict(what, me, p, len, want, hdr.bytes[FLAG] & P2P_REFUSED != 0) {
                    self.tally.fail(|| e);
                    self.tally.finish(i);
                } else if len == 0 {
                    self.tally.finish(i);
                } else {
                    st.awaiting_payload.push_back(i);
                }
                *progressed = true;
                Ok(Flow::Next)
            }
            K_P2P_EAGER => {
                let Some(&i) = st.p2p_rq.front() else { return Ok(Flow::Stop) };
                st.p2p_rq.pop_front();
                hdr.got = 0;
                let Action::P2pRecv { dst, len: want, what, .. } = self.sched.steps[i].action else { unreachable!() };
                let sink = match p2p_verdict(what, me, p, len, want, hdr.bytes[FLAG] & P2P_REFUSED != 0) {
                    None => Sink::Copy(dst),
                    Some(e) => {
                        self.tally.fail(|| e);
                        Sink::Discard
                    }
                };
                // The step is done once the payload that follows has been read.
                let gated = self.inplace.gated(i);
                st.cur_rx = Some(Rx { gated, ..Rx::new(i, len, sink) });
                Ok(Flow::Go)
            }
            K_P2P_REPLY => {
                if st.replies_read == st.p2p_sends {
                    // For a send of the peer's next run (it finished this one):
                    // stays pending until then.
                    return Ok(Flow::Stop);
                }
                st.replies_read += 1;
                hdr.got = 0;
                let flag = hdr.bytes[FLAG];
                match st.awaiting_reply.pop_front() {
                    Some(i) => self.on_reply(p, st, i, len, flag),
                    // The send it answers waits behind other steps: kept for it.
                    None => st.early_replies.push_back((len, flag)),
                }
                *progressed = true;
                Ok(Flow::Next)
            }
            K_P2P_DATA | K_P2P_DIRECT | K_P2P_SWAP => {
                let Some(i) = st.awaiting_payload.pop_front() else {
                    return Err(Error::internal(format!("{}: unexpected payload from rank {p}", (self.ctl.what)())));
                };
                let Action::P2pRecv { dst, len: want, .. } = self.sched.steps[i].action else { unreachable!() };
                if len != want || (kind == K_P2P_SWAP && !self.inplace.paired_recv(i)) {
                    return Err(Error::internal(format!(
                        "{}: payload of {len} bytes from rank {p} (kind {kind}), agreed {want}",
                        (self.ctl.what)()
                    )));
                }
                hdr.got = 0;
                // Large payloads are streamed into the user's buffer, as collectives'
                // are, unless it is also what this rank sends (in place): those lines
                // are in cache, and streaming stores would evict them.
                // Nor into a buffer the previous call wrote (`reuse`).
                let stream = len >= crate::env::stream_min()
                    && !self.inplace.overlaps_send(dst, len)
                    && !crate::backend::host::reuse::cached(dst, len);
                let sink = if stream { Sink::Stream(dst) } else { Sink::Copy(dst) };
                let direct = (kind != K_P2P_DATA).then(|| DirectRx::new(kind, 0));
                // The sender's receives wait for our read reports (see `Plan::gated_ahead`).
                let reports = kind == K_P2P_DIRECT && hdr.bytes[FLAG] != 0;
                // A swap offer: our block, which the exchange fills.
                let own = Side { dst, src: dst };
                let swap =
                    (kind == K_P2P_SWAP).then_some(RxSwap { own, how: Exchange::Swap, peer_input: PeerInput::Block });
                let gated = swap.is_none() && self.inplace.gated(i);
                st.cur_rx = Some(Rx { direct, swap, gated, reports, ..Rx::new(i, len, sink) });
                Ok(Flow::Go)
            }
            k => Err(Error::internal(format!(
                "{}: corrupt stream from rank {p} (message kind {k}); the communicator is unusable",
                (self.ctl.what)()
            ))),
        }
    }

    /// Takes up to `budget` bytes of the stream message being read from peer `p`.
    fn rx_stream(&mut self, p: usize, st: &mut Peer, budget: &mut usize, progressed: &mut bool) -> Flow {
        let rx = st.cur_rx.as_mut().expect("being read");
        let link = self.t.link(p);
        let total = pad8(rx.len);
        while rx.read < total {
            let avail = link.recv_avail();
            if avail.is_empty() {
                break;
            }
            // Dropped bytes (a payload of a mismatched size) cost no copy: released at once.
            let cap = if matches!(rx.sink, Sink::Discard) { usize::MAX } else { *budget };
            let cap =
                if rx.gated { cap.min(self.inplace.allowed(self.sched, rx.step).saturating_sub(rx.read)) } else { cap };
            if cap == 0 {
                // Waits for this rank's sends to leave the buffer.
                break;
            }
            let n = avail.len().min(total - rx.read).min(cap);
            let data_n = n.min(rx.len.saturating_sub(rx.read));
            // SAFETY: the sink's buffers are valid for the message (schedule contract).
            unsafe { rx.sink.consume(rx.read, &avail[..data_n]) };
            link.recv_commit(n);
            rx.read += n;
            *progressed = true;
            if !matches!(rx.sink, Sink::Discard) {
                *budget = budget.saturating_sub(n);
                if *budget == 0 {
                    break;
                }
            }
        }
        if rx.read < total {
            return Flow::Stop;
        }
        self.tally.finish(rx.step);
        st.cur_rx = None;
        Flow::Next
    }

    /// Takes a piece of the direct message being read from peer `p`: its
    /// descriptor first, then the bytes out of the sender's buffer (a swap offer
    /// starts or skips the exchange it offers).
    fn rx_direct(&mut self, p: usize, st: &mut Peer, budget: &mut usize, progressed: &mut bool) -> Result<Flow> {
        let me = self.t.rank;
        let rx = st.cur_rx.as_mut().expect("being read");
        let d = rx.direct.as_mut().expect("a direct message");
        let src = match d.src {
            Some(src) => src,
            None => {
                // The descriptor may wrap around the ring: gather it first.
                *progressed |= gather(self.t.link(p), &mut d.desc[..d.want], &mut d.got);
                if d.got < d.want {
                    return Ok(Flow::Stop);
                }
                if rx.swap.is_some() {
                    return self.rx_offer(p, st, progressed);
                }
                let link = self.t.link(p);
                let (addr, region) = decode_desc(d.desc[..DESC].try_into().expect("one descriptor"));
                let what = self.ctl.what;
                let src = match mem(link)?.source(addr, rx.len, region.as_ref()).map_err(|e| e.context(what()))? {
                    Some(ptr) => Source::Ptr(ptr),
                    None => Source::Remote(addr),
                };
                d.src = Some(src);
                if d.want == 2 * DESC {
                    // The sender's own copy, which our pieces write too.
                    let (taddr, tregion) = decode_desc(d.desc[DESC..].try_into().expect("one descriptor"));
                    let tee = mem(link)?.writable(taddr, rx.len, tregion.as_ref(), Write::Tee);
                    rx.tee = Some(tee.map_err(|e| e.context(what()))?);
                }
                // A large copy into a buffer the sender can write too: offered
                // to the sender to share.
                // Not where sends of the run still read (they would race the sender).
                if rx.len >= self.plan.split_min && !rx.gated {
                    if let Sink::Copy(dst) | Sink::Stream(dst) = rx.sink {
                        let stream = matches!(rx.sink, Sink::Stream(_));
                        rx.share = mem(link)?.share_offer(dst, rx.len, stream).map(|slot| (slot, false));
                    }
                }
                src
            }
        };
        let link = mem(self.t.link(p))?;
        if rx.gated && rx.reports {
            let i = rx.step;
            let gate = self.inplace.allowed(self.sched, i);
            let (w, r) = gated_piece(self.plan.gated_ahead, self.plan.direct_piece, link, gate, rx, src)
                .map_err(|e| e.context((self.ctl.what)()))?;
            let written = rx.held.as_ref().map_or(0, |h| h.written);
            if w + r > 0 {
                *budget = budget.saturating_sub(w.max(r));
                *progressed = true;
            }
            if written < rx.len {
                // Else it waits for this rank's sends to leave the buffer.
                return Ok(if w + r > 0 { Flow::Next } else { Flow::Stop });
            }
            self.tally.finish(i);
            st.cur_rx = None;
            return Ok(Flow::Next);
        }
        // One piece per visit, so that other peers progress meanwhile: the next
        // one, or in a split copy the next one nobody has taken.
        let (piece, split_piece) = (self.plan.direct_piece, self.plan.split_piece);
        let (off, k) = match rx.share.as_mut() {
            None => {
                let k = piece.min(rx.len - rx.read);
                let k =
                    if rx.gated { k.min(self.inplace.allowed(self.sched, rx.step).saturating_sub(rx.read)) } else { k };
                if k == 0 && rx.read < rx.len {
                    // Waits for this rank's sends to leave the buffer.
                    return Ok(Flow::Stop);
                }
                (rx.read, k)
            }
            Some((slot, taken_all)) => {
                let pieces = share_pieces(rx.len);
                let mine = !*taken_all && receiver_takes_pieces();
                // As much as an unshared read takes per visit: the sender, when
                // it helps, takes single pieces meanwhile.
                let most = (piece / split_piece) as u64;
                match mine.then(|| slot.take(slot.next_read(), pieces, most)).flatten() {
                    Some((c, m)) => {
                        let off = c as usize * split_piece;
                        (off, (m as usize * split_piece).min(rx.len - off))
                    }
                    None => {
                        *taken_all = mine;
                        if slot.pieces_done() < pieces {
                            // The sender is copying the last pieces it took.
                            return Ok(Flow::Stop);
                        }
                        (0, 0)
                    }
                }
            }
        };
        if k > 0 {
            let what = self.ctl.what;
            match (src, rx.sink) {
                (Source::Ptr(ptr), _) if rx.swap.is_some() => {
                    let RxSwap { own, how, peer_input } = rx.swap.expect("checked");
                    let other = peer_input.side(ptr as *mut u8);
                    // SAFETY: our block and input and the peer's (its block mapped
                    // here writable) hold rx.len bytes each, the two ranks' in
                    // different buffers; neither owner touches them until every piece
                    // is done, and this piece was taken by this rank alone (the claim
                    // word).
                    unsafe { how.apply(me, p, own.at(off), other.at(off), k) };
                }
                (Source::Ptr(ptr), sink) => {
                    // SAFETY: the sender keeps its message (rx.len bytes at ptr, mapped
                    // here) valid and unmodified until we report the read done; the
                    // sink's destination is valid for the message (schedule contract).
                    unsafe { sink.consume(off, std::slice::from_raw_parts(ptr.add(off), k)) };
                    // SAFETY: as above; the sender's copy is mapped for the message.
                    unsafe { rx_tee(rx.tee, rx.sink, off, ptr, k) };
                }
                (Source::Remote(addr), Sink::Copy(dst)) => {
                    // SAFETY: dst is valid for the message (schedule contract).
                    link.read(addr + off as u64, unsafe { dst.add(off) }, k).map_err(|e| e.context(what()))?;
                    // SAFETY: as above; the piece just read is at dst + off.
                    unsafe { rx_tee(rx.tee, rx.sink, off, dst, k) };
                }
                (Source::Remote(addr), sink) => {
                    self.bounce.resize(piece, 0);
                    link.read(addr + off as u64, self.bounce.as_mut_ptr(), k).map_err(|e| e.context(what()))?;
                    // SAFETY: as for stream data.
                    unsafe { sink.consume(off, &self.bounce[..k]) };
                    // SAFETY: the bounce piece holds the k bytes of offset off.
                    unsafe { rx_tee(rx.tee, rx.sink, off, self.bounce.as_ptr().wrapping_sub(off), k) };
                }
            }
            if let Some((slot, _)) = rx.share {
                slot.pieces_copied(k.div_ceil(split_piece) as u64);
            }
            rx.read += k;
            if rx.reports && rx.share.is_none() && rx.read < rx.len {
                // Read in order: the sender's receives may overwrite this much.
                link.report_read(rx.read);
            }
            *budget = budget.saturating_sub(k);
            *progressed = true;
            if rx.share.is_some() || rx.read < rx.len {
                // More pieces, or a split copy's end to see.
                return Ok(Flow::Next);
            }
        }
        link.read_done();
        self.tally.finish(rx.step);
        st.cur_rx = None;
        Ok(Flow::Next)
    }

    /// A swap offer from peer `p` whose descriptors have all arrived: exchanged in
    /// place when both sides can (the peer's address is 0 when it cannot),
    /// otherwise the steps for both placements run. Both sides decide alike. An
    /// fcclRecv gets an offer only when both sides agreed to swap.
    fn rx_offer(&mut self, p: usize, st: &mut Peer, progressed: &mut bool) -> Result<Flow> {
        let rx = st.cur_rx.as_mut().expect("being read");
        let d = rx.direct.as_mut().expect("a direct message");
        let Some(RxSwap { own, .. }) = rx.swap else { unreachable!("a swap offer") };
        let (addr, region) = decode_desc(d.desc[..DESC].try_into().expect("one descriptor"));
        let i = rx.step;
        let both = match self.sched.steps[i].action {
            Action::SwapRecv { offer: Offer { in_place, capable, .. }, apart, fallback } => {
                let peer_in_place = addr != 0 || d.desc[8] == 1;
                let both = addr != 0 && capable;
                let taken = if both {
                    None
                } else if !in_place && !peer_in_place {
                    Some(apart)
                } else {
                    Some(fallback)
                };
                // The steps not taken are skipped (apart may be fallback itself).
                let ranges: &[(usize, usize)] = if apart == fallback { &[fallback] } else { &[apart, fallback] };
                for &r in ranges.iter().filter(|&&r| Some(r) != taken) {
                    self.tally.skip(r);
                }
                both
            }
            Action::P2pRecv { .. } => true,
            _ => unreachable!("swap offers go to swap steps"),
        };
        let what = self.ctl.what;
        // The peer's input: its block, or (a reduction out of place) the
        // second descriptor's.
        let peer_input = if !both || d.want == DESC {
            PeerInput::Block
        } else {
            let (saddr, sregion) = decode_desc(d.desc[DESC..].try_into().expect("one descriptor"));
            if saddr == addr {
                PeerInput::Block
            } else {
                let at = mem(self.t.link(p))?.source(saddr, rx.len, sregion.as_ref());
                PeerInput::At(
                    at.map_err(|e| e.context(what()))?
                        .ok_or_else(|| Error::internal(format!("{}: rank {p}'s input could not be mapped", what())))?,
                )
            }
        };
        if both && swap_offers(self.t.rank, p) {
            let link = mem(self.t.link(p))?;
            let target = link.writable(addr, rx.len, region.as_ref(), Write::Swap).map_err(|e| e.context(what()))?;
            let slot = link
                .share_offer(own.dst, rx.len, false)
                .ok_or_else(|| Error::internal(format!("{}: a swap with rank {p} could not be offered", what())))?;
            rx.share = Some((slot, false));
            rx.swap = Some(RxSwap { peer_input, ..rx.swap.expect("matched") });
            d.src = Some(Source::Ptr(target));
            return Ok(Flow::Next);
        }
        if both {
            // The peer swaps; this rank helps with its offer step, which
            // needs the peer's input.
            if let Some(Step { action: Action::SwapSend(o), .. }) = self.sched.steps.get_mut(i.wrapping_sub(1)) {
                o.peer_input = peer_input;
            }
        }
        // The peer swaps (reporting our offer read once it has), or the
        // rings exchange: nothing more to read here. (Over TCP nobody counts
        // reads: swap offers go there too.)
        if let Some(m) = self.t.link(p).memory() {
            m.read_done();
        }
        self.tally.finish(i);
        st.cur_rx = None;
        *progressed = true;
        Ok(Flow::Next)
    }
}

/// One step of gated receive `rx` of a direct message from `src` (see
/// `Plan::gated_ahead`, here `ahead`): writes what the gate (`gate`, from
/// `InPlace::allowed`) lets it of what it has read, then reads a piece (at most
/// `piece` bytes) ahead and reports it read (the whole message read: done, as for
/// any direct message). Bytes (written, read).
fn gated_piece(
    ahead: usize,
    piece: usize,
    link: &mut dyn PeerMemory,
    gate: usize,
    rx: &mut Rx,
    src: Source,
) -> Result<(usize, usize)> {
    if rx.held.is_none() {
        let buf = PooledBuf::try_take(ahead).ok_or_else(|| {
            crate::mem::fallible::out_of_memory(
                ahead,
                "read-ahead for a receive in place (the host plan's gated_ahead)",
                "lower gated_ahead in FERROCCL_HOST_PLAN; the communicator is unusable now: destroy it",
            )
        })?;
        rx.held = Some(Held { buf, written: 0 });
    }
    let held = rx.held.as_mut().expect("set above");
    let at = |o: usize| o % ahead;
    // The bytes overwritten here were just read by the receiver of this rank's send,
    // on another core: ordinary stores would first take every line back from its
    // cache, streaming ones only invalidate it.
    let sink = match rx.sink {
        Sink::Copy(dst) => Sink::Stream(dst),
        sink => sink,
    };
    let w = (rx.read - held.written).min(gate.saturating_sub(held.written)).min(ahead - at(held.written));
    if w > 0 {
        // SAFETY: the held buffer has `ahead` bytes and w stops at its end;
        // offsets [written, read) of the message are there. The sink's destination
        // is valid for the message (schedule contract), and the gate keeps us below
        // what this rank's sends still read.
        unsafe {
            let from = std::slice::from_raw_parts(held.buf.as_ptr().add(at(held.written)), w);
            sink.consume(held.written, from);
        }
        held.written += w;
    }
    let d = gate.saturating_sub(rx.read).min(rx.len - rx.read).min(piece);
    if let (Sink::Stream(dst), true) = (sink, held.written == rx.read && w == 0 && d > 0) {
        // Nothing held, and the gate open past what has been read: straight from
        // the sender's buffer into ours.
        // SAFETY: dst is valid for the message (schedule contract) and the gate
        // lets us write [read, read + d).
        let to = unsafe { dst.add(rx.read) };
        gated_fetch(link, src, (&mut rx.read, rx.len), to, d, true)?;
        held.written += d;
        return Ok((d, d));
    }
    let r = (rx.len - rx.read).min(ahead - (rx.read - held.written)).min(ahead - at(rx.read)).min(piece);
    if r > 0 {
        // SAFETY: r stops at the held buffer's end and leaves the unwritten bytes
        // alone (at most `ahead` are held).
        let to = unsafe { held.buf.as_mut_ptr().add(at(rx.read)) };
        gated_fetch(link, src, (&mut rx.read, rx.len), to, r, false)?;
    }
    Ok((w, r))
}

/// Reads the next `n` bytes of a gated receive's message (`read` of its `len`
/// bytes read so far) from the sender's buffer `src` into `to` (`stream`: with
/// streaming stores where this rank copies), and reports them read: the whole
/// message read, done, as for any direct message.
fn gated_fetch(
    link: &mut dyn PeerMemory,
    src: Source,
    (read, len): (&mut usize, usize),
    to: *mut u8,
    n: usize,
    stream: bool,
) -> Result<()> {
    match src {
        // SAFETY: the sender keeps its message (len bytes at ptr, mapped here)
        // valid, and overwrites none of it before we report it read; the caller
        // gives `to` room for n bytes, apart from the message.
        Source::Ptr(ptr) => unsafe { copy::copy_stores(to, ptr.add(*read), n, stream) },
        Source::Remote(addr) => link.read(addr + *read as u64, to, n)?,
    }
    *read += n;
    if *read < len {
        link.report_read(*read);
    } else {
        link.read_done();
    }
    #[cfg(test)]
    super::tests::GATED_READ.with(|c| c.set(c.get() + n));
    Ok(())
}
