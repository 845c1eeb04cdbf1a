//! Split copies: a direct message into a buffer its sender can write is copied by
//! sender and receiver together, both taking pieces from one claim word (see
//! `transport::Share`). The receiver offers when it starts reading; the sender
//! helps once nothing but its peers' reads is left in its run. A broadcast root's
//! own copy and a swap's pieces go the same way. See docs/design/host.md, "Split
//! copies".

use super::exchange::{Exchange, Offer, PeerInput, Side};
use super::run::Run;
use super::schedule::{Action, Sink};
use super::state::{Help, Peer, TxShare};
use crate::backend::host::plan::{self, Plan};
use crate::error::{Error, Result};
use crate::mem::copy;
use crate::transport::Link;

/// Whether the sender of a direct message of `len` bytes with its own destination
/// `dst` (a broadcast root's recvbuff) leaves that copy to whoever copies each
/// piece, itself or the receiver: large enough for a split copy, which has both
/// cores take pieces, and a destination the receiver can write.
pub(super) fn tee_shared(plan: &Plan, link: &mut dyn Link, dst: *mut u8, len: usize) -> bool {
    len >= plan.split_min && link.memory().is_some_and(|m| m.can_write(dst, len))
}

/// The pieces of a split copy of `len` bytes.
pub(super) fn share_pieces(len: usize) -> u64 {
    len.div_ceil(plan::get().split_piece) as u64
}

impl Run<'_, '_> {
    /// Copies one piece of direct message `seq` (step `i`, being read by peer `p`) into
    /// the receiver's buffer, when the receiver offered a split copy and a piece is
    /// left; true when it did.
    pub(super) fn share_piece(&mut self, p: usize, st: &mut Peer, i: usize, seq: u64, help: Help) -> Result<bool> {
        let (me, split_min, split_piece) = (self.t.rank, self.plan.split_min, self.plan.split_piece);
        let p2p_swap = matches!(help, Help::P2pSwap);
        // A swap's own side, and where the peer's input is.
        let (src, len, swap) = match self.sched.steps[i].action {
            Action::P2pSend { src, len, .. } if p2p_swap => {
                (src, len, Some((Side { dst: src as *mut u8, src }, Exchange::Swap, PeerInput::Block)))
            }
            Action::Send { src, len, .. } | Action::P2pSend { src, len, .. } => (src, len, None),
            // Not before the peer's offer has said where its input is.
            Action::SwapSend(Offer { peer_input: PeerInput::Unknown, .. }) => return Ok(false),
            Action::SwapSend(Offer { at, src, len, how, peer_input, .. }) => {
                (src, len, Some((Side { dst: at, src }, how, peer_input)))
            }
            _ => return Ok(false),
        };
        // Smaller messages are never offered (a swap is offered at any size).
        if len < split_min && swap.is_none() {
            return Ok(false);
        }
        let link = self.t.link(p);
        let peer = p;
        let Some(m) = link.memory() else { return Ok(false) };
        let Some(slot) = m.share_slot() else { return Ok(false) };
        let sh = match st.share {
            Some(sh) if sh.seq == seq => sh,
            _ => {
                // Not offered (yet): the receiver publishes when it starts reading.
                let Some(dest) = slot.offer(seq) else { return Ok(false) };
                if dest.len != len {
                    return Err(Error::internal(format!(
                        "rank {} offered to share a direct message of {} bytes, sent {len}",
                        peer, dest.len
                    )));
                }
                let Some(dst) = m.share_target(&dest)? else { return Ok(false) };
                let sh = TxShare { seq, dst, stream: dest.stream };
                st.share = Some(sh);
                sh
            }
        };
        let Some((k, _)) = slot.take(seq, share_pieces(len), 1) else { return Ok(false) };
        let off = k as usize * split_piece;
        let n = split_piece.min(len - off);
        // SAFETY: src holds the message (len bytes), kept unmodified until the peer
        // reports the read; dst is the receiver's destination for it, mapped here, which
        // the receiver leaves alone until every piece is done, and this piece was taken
        // by this rank alone (the claim word). A swap's sides are our block and input
        // and the peer's, which nobody else touches until the peer reports every piece
        // done either.
        unsafe {
            if let Some((own, how, peer_input)) = swap {
                how.apply(me, peer, own.at(off), peer_input.side(sh.dst).at(off), n)
            } else {
                copy::copy_stores(sh.dst.add(off), src.add(off), n, sh.stream);
                if let Help::Tee { dst, stream } = help {
                    // Our own copy of the piece, read once for both.
                    copy::copy_stores(dst.add(off), src.add(off), n, stream);
                }
            }
        };
        slot.pieces_copied(1);
        #[cfg(test)]
        super::tests::SENDER_PIECES.with(|c| c.set(c.get() + 1));
        Ok(true)
    }
}

/// Copies `k` bytes of a direct message at payload offset `off` (read from
/// `from + off`) to the sender's own destination `tee`, if the sender left it to
/// the pieces (see [`K_DIRECT`](super::msg::K_DIRECT)); with streaming stores where the sink streams.
///
/// # Safety
/// `from + off` holds the k bytes; `tee` is the sender's destination, mapped here
/// for the whole message, whose piece at `off` nobody else writes (this rank took
/// it: the claim word, or the whole message unshared).
pub(super) unsafe fn rx_tee(tee: Option<*mut u8>, sink: Sink, off: usize, from: *const u8, k: usize) {
    if let Some(tee) = tee {
        // SAFETY: the caller's contract.
        unsafe { copy::copy_stores(tee.add(off), from.wrapping_add(off), k, matches!(sink, Sink::Stream(_))) };
    }
}

/// Whether the receiver of a split copy takes pieces itself (tests make it leave
/// them all to the sender).
pub(super) fn receiver_takes_pieces() -> bool {
    #[cfg(test)]
    if super::tests::RECEIVER_IDLE.with(|c| c.get()) {
        return false;
    }
    true
}
