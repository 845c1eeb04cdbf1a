//! Exchanges of two equal blocks, one in each of two ranks' buffers: swapped
//! (in-place all_to_all, an fcclSend/fcclRecv pair over one buffer) or both set to
//! their reduction (2-rank all_reduce), piece by piece by both ranks, each byte read
//! once and written once. Each rank offers its block in a [`K_SWAP`](super::msg::K_SWAP) message; when
//! both can, one of them publishes its block as for a split copy. See
//! docs/design/host.md, "Exchanges between two buffers".
//!
//! [`K_SWAP`]: super::msg::K_SWAP

use crate::mem::{copy, reduce};
use crate::transport::Link;
use crate::types::{DataType, RedOp};

/// What a pair of ranks does to a pair of equal blocks, one in each rank's buffer,
/// piece by piece (see [`K_SWAP`](super::msg::K_SWAP)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Exchange {
    /// Each block takes the other's contents (in-place all_to_all).
    Swap,
    /// Both blocks take the reduction of the two ranks' inputs, rank 0's the first
    /// operand (all_reduce of 2 ranks; an input is the block itself in place).
    /// `stream`: a block out of place is written with streaming stores (see
    /// `mem::copy`), for results as large as FERROCCL_STREAM_MIN.
    Reduce { dtype: DataType, op: RedOp, stream: bool },
}

/// One rank's side of a piece of an exchange: the block it ends in (`dst`) and the
/// input it starts from (`src`: `dst` itself in place).
#[derive(Clone, Copy)]
pub(super) struct Side {
    pub(super) dst: *mut u8,
    pub(super) src: *const u8,
}

impl Side {
    /// The side `off` bytes further on.
    ///
    /// # Safety
    /// Both blocks extend at least that far.
    pub(super) unsafe fn at(self, off: usize) -> Side {
        // SAFETY: the caller's contract.
        unsafe { Side { dst: self.dst.add(off), src: self.src.add(off) } }
    }
}

impl Exchange {
    /// Applies the exchange to `n` bytes of `own` (this rank's, `me`) and of
    /// `other` (rank `peer`'s): each input read once, each block written once.
    ///
    /// # Safety
    /// Every range holds `n` bytes (whole elements); the two ranks' ranges do not
    /// overlap, a rank's input is its block or disjoint from it, and nobody else
    /// touches them meanwhile. A swap is in place on both sides.
    pub(super) unsafe fn apply(self, me: usize, peer: usize, own: Side, other: Side, n: usize) {
        match self {
            // SAFETY: the caller's contract.
            Exchange::Swap => unsafe { copy::swap(own.dst, other.dst, n) },
            Exchange::Reduce { dtype, op, stream } => {
                let (x0, x1) = if me < peer { (own, other) } else { (other, own) };
                let (out0, out1) = (!std::ptr::eq(x0.src, x0.dst), !std::ptr::eq(x1.src, x1.dst));
                if !out0 && !out1 {
                    // SAFETY: the caller's contract.
                    unsafe {
                        let (a, b) = (std::slice::from_raw_parts_mut(x0.dst, n), std::slice::from_raw_parts(x1.src, n));
                        reduce::reduce_inplace(dtype, op, a, b);
                        reduce::finish_inplace(dtype, op, 2, a);
                        // Rank 1's input has been read: its block takes the result.
                        copy::copy(x1.dst, x0.dst, n);
                    }
                    return;
                }
                // Out of place, through a piece in cache: each input read once, each
                // block written once (streaming, where it is not also an input,
                // skips reading its lines first).
                const CHUNK: usize = 16 << 10;
                let mut tmp = [0u8; CHUNK];
                for c in (0..n).step_by(CHUNK) {
                    let m = CHUNK.min(n - c);
                    let t = &mut tmp[..m];
                    // SAFETY: the caller's contract; offsets c..c+m lie in every range,
                    // and each block is written after its own input is read.
                    unsafe {
                        t.copy_from_slice(std::slice::from_raw_parts(x0.src.add(c), m));
                        reduce::reduce_inplace(dtype, op, t, std::slice::from_raw_parts(x1.src.add(c), m));
                        reduce::finish_inplace(dtype, op, 2, t);
                        copy::copy_stores(x0.dst.add(c), t.as_ptr(), m, stream && out0);
                        copy::copy_stores(x1.dst.add(c), t.as_ptr(), m, stream && out1);
                    }
                }
            }
        }
    }
}

/// One rank's side of an exchange between the ranks' buffers: `how` on `len`
/// bytes at `at` (from the input at `src`, `at` itself in place) with the peer's
/// block (see [`K_SWAP`](super::msg::K_SWAP)).
#[derive(Clone, Copy)]
pub struct Offer {
    pub(super) peer: usize,
    pub(super) at: *mut u8,
    pub(super) src: *const u8,
    pub(super) len: usize,
    pub(super) how: Exchange,
    /// Whether this rank's call is in place.
    pub(super) in_place: bool,
    /// Whether this side can exchange in place: decided once when the run starts
    /// and kept with both steps, so that what the offer says and what this side
    /// then does cannot differ.
    pub(super) capable: bool,
    /// The peer's input, where this rank helps the peer exchange (set on the
    /// offer step when the peer's offer has been read).
    pub(super) peer_input: PeerInput,
}

/// Where a peer's input to an exchange is, as this rank reads it.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum PeerInput {
    /// Its offer has not been read yet.
    Unknown,
    /// Its block itself (in place).
    Block,
    /// Mapped here.
    At(*const u8),
}

impl PeerInput {
    /// The peer's side of an exchange whose block is mapped here at `block`.
    pub(super) fn side(self, block: *mut u8) -> Side {
        Side { dst: block, src: if let PeerInput::At(q) = self { q } else { block } }
    }
}

/// Whether this rank offers its block of a swap with `peer` (and swaps as the
/// receiver), or helps the peer swap (as the sender): alternating with the pair's
/// parity, so that every rank offers about half of its swaps.
pub(super) fn swap_offers(me: usize, peer: usize) -> bool {
    (me > peer) == ((me + peer) % 2 == 1)
}

/// Whether this rank can swap `len` bytes at `at` with the peer of `link` (see
/// `PeerMemory::can_write`; tests make a rank refuse).
pub(super) fn swap_capable(link: &mut dyn Link, at: *const u8, len: usize) -> bool {
    #[cfg(test)]
    if super::tests::SWAP_REFUSED.with(|c| c.get()) {
        return false;
    }
    link.memory().is_some_and(|m| m.can_write(at, len))
}
