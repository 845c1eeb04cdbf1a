//! What a run is made of: steps (sends, receives, copies, local work, exchanges
//! between two ranks' buffers), each waiting for earlier ones, and where incoming
//! bytes go ([`Sink`]). The algorithms (`algo`) build a [`Schedule`]; the run loop
//! (`run`) drives it. See docs/design/host.md, "Schedules".

use super::exchange::{Exchange, Offer, PeerInput};
use crate::coll::counts::P2pCall;
use crate::error::Result;
use crate::mem::{copy, reduce};
use crate::types::{DataType, RedOp};

/// Where incoming payload bytes go.
#[derive(Clone, Copy)]
pub enum Sink {
    /// Copy to `dst`.
    Copy(*mut u8),
    /// Copy to `dst` with streaming stores: for large results that leave the
    /// caches before anyone reads them (see `mem::copy`).
    Stream(*mut u8),
    /// `acc op= incoming` in the accumulator type of `dtype` (acc holds acc_size() per element).
    Reduce { acc: *mut u8, dtype: DataType, op: RedOp },
    /// `acc = widen(other) op widen(incoming)`; `acc` must not overlap `other`.
    ReduceInit { acc: *mut u8, other: *const u8, dtype: DataType, op: RedOp },
    /// `acc = widen(incoming)`: the first contribution of a reduction.
    Init { acc: *mut u8, dtype: DataType },
    /// Copy blocks of `block` bytes to `dst`, `stride` bytes apart (axis-aware gather).
    Strided { dst: *mut u8, block: usize, stride: usize },
    /// Incoming elements of type `wire` are widened to `acc_type` and reduced into
    /// `acc` (all_reduce over a narrower wire type).
    ReduceConv { acc: *mut u8, acc_type: DataType, wire: DataType, op: RedOp },
    /// Read and drop (used to skip a payload nobody wants).
    Discard,
}

impl Sink {
    /// Consumes `data`, which starts `off` bytes into the message payload.
    ///
    /// # Safety
    /// The destination regions named by the sink must be valid for the message's
    /// length and not accessed by anyone else while the step runs.
    pub(super) unsafe fn consume(&self, off: usize, data: &[u8]) {
        match *self {
            Sink::Copy(dst) => {
                // SAFETY: caller guarantees dst is valid for the message length.
                unsafe { copy::copy(dst.add(off), data.as_ptr(), data.len()) }
            }
            Sink::Stream(dst) => {
                // SAFETY: as for Copy; the ring and the destination never overlap.
                unsafe { copy::copy_streaming(dst.add(off), data.as_ptr(), data.len()) }
            }
            Sink::Reduce { acc, dtype, op } => {
                let (es, acs) = (dtype.size(), dtype.acc_size());
                // SAFETY: as above; acc has acc_size() bytes per element of the message.
                let acc = unsafe { std::slice::from_raw_parts_mut(acc.add(off / es * acs), data.len() / es * acs) };
                reduce::acc_reduce(dtype, op, acc, data);
            }
            Sink::ReduceInit { acc, other, dtype, op } => {
                let (es, acs) = (dtype.size(), dtype.acc_size());
                // SAFETY: as above; other is valid for the message length and disjoint from acc.
                let (acc, other) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(acc.add(off / es * acs), data.len() / es * acs),
                        std::slice::from_raw_parts(other.add(off), data.len()),
                    )
                };
                reduce::acc_init2(dtype, op, acc, other, data);
            }
            Sink::Init { acc, dtype } => {
                let (es, acs) = (dtype.size(), dtype.acc_size());
                // SAFETY: acc has acc_size() bytes per element of the message.
                let acc = unsafe { std::slice::from_raw_parts_mut(acc.add(off / es * acs), data.len() / es * acs) };
                reduce::acc_init(dtype, acc, data);
            }
            Sink::Strided { dst, block, stride } => {
                let (mut off, mut data) = (off, data);
                while !data.is_empty() {
                    let (blk, within) = (off / block, off % block);
                    let take = (block - within).min(data.len());
                    // SAFETY: dst covers every block of the message at its stride.
                    unsafe { copy::copy(dst.add(blk * stride + within), data.as_ptr(), take) };
                    off += take;
                    data = &data[take..];
                }
            }
            Sink::ReduceConv { acc, acc_type, wire, op } => {
                const PIECE: usize = 2048;
                let (ws, acs) = (wire.size(), acc_type.size());
                let mut tmp = [0u8; PIECE * 8];
                for (i, piece) in data.chunks(PIECE * ws).enumerate() {
                    let m = piece.len() / ws;
                    let first = off / ws + i * PIECE;
                    reduce::convert(wire, piece, acc_type, &mut tmp[..m * acs]);
                    // SAFETY: acc holds acc_type elements for the whole message.
                    let accs = unsafe { std::slice::from_raw_parts_mut(acc.add(first * acs), m * acs) };
                    reduce::reduce_inplace(acc_type, op, accs, &tmp[..m * acs]);
                }
            }
            Sink::Discard => {}
        }
    }
}

/// A local step: runs once its dependencies are done.
pub type LocalFn<'a> = Box<dyn FnMut() -> Result<()> + Send + 'a>;

/// How a collective message leaves.
#[derive(Clone, Copy)]
pub enum Via {
    /// Through the stream, or a large one by address where the link allows (single
    /// copy): it is then done only once the peer has read it.
    Any,
    /// Through the stream only: done once written, so a step may depend on it
    /// without waiting for the peer (in-place all_to_all, scratch reuse).
    Stream,
    /// Through the stream, each piece also copied to `dst` while it is in cache
    /// (`stream`: with streaming stores): a broadcast root's own recvbuff, so the
    /// source is read from memory once.
    Tee { dst: *mut u8, stream: bool },
}

/// What a step does.
pub enum Action<'a> {
    /// A collective message of `len` bytes from `src`.
    Send {
        peer: usize,
        src: *const u8,
        len: usize,
        via: Via,
    },
    /// A collective message of exactly `len` bytes.
    Recv {
        peer: usize,
        len: usize,
        sink: Sink,
    },
    /// fcclSend: the count (with the payload when small), the receiver's count back,
    /// then the payload if it did not go with the count.
    P2pSend {
        peer: usize,
        src: *const u8,
        len: usize,
        what: P2pCall,
    },
    /// fcclRecv.
    P2pRecv {
        peer: usize,
        dst: *mut u8,
        len: usize,
        what: P2pCall,
    },
    /// This rank's offer (see [`Exchange`]).
    SwapSend(Offer),
    /// The peer's offer, then the exchange in place; otherwise the steps
    /// `apart.0..apart.1` when both ranks are out of place, else those of
    /// `fallback` (see [`Schedule::swap`]). The steps not taken are skipped.
    SwapRecv {
        offer: Offer,
        apart: (usize, usize),
        fallback: (usize, usize),
    },
    /// A local copy of `len` bytes, made in pieces between transfers so that both
    /// proceed together; `stream` writes with streaming stores (see `mem::copy`).
    Copy {
        src: *const u8,
        dst: *mut u8,
        len: usize,
        stream: bool,
    },
    Local(LocalFn<'a>),
}

pub struct Step<'a> {
    pub action: Action<'a>,
    pub deps: Vec<usize>,
    /// Sequence number of the collective the step belongs to (checked on receipt).
    pub tag: u32,
}

/// The block of an exchange in place (`Schedule::swap`): this rank's block `at`,
/// its input `src` (the same address in place), `len` bytes.
#[derive(Clone, Copy)]
pub struct Block {
    pub at: *mut u8,
    pub src: *const u8,
    pub len: usize,
}

/// Steps in an order in which every rank agrees on per-peer message order.
#[derive(Default)]
pub struct Schedule<'a> {
    pub steps: Vec<Step<'a>>,
    /// Tag given to the steps added next.
    pub tag: u32,
}

// SAFETY: raw pointers in steps point at user or scratch buffers that the caller
// keeps valid and otherwise untouched until the run ends; a schedule moves to a
// group thread as a whole and is used by one thread at a time.
unsafe impl Send for Schedule<'_> {}

impl<'a> Schedule<'a> {
    pub fn new(tag: u32) -> Self {
        Schedule { steps: Vec::new(), tag }
    }
    fn push(&mut self, action: Action<'a>, deps: &[usize]) -> usize {
        self.steps.push(Step { action, deps: deps.to_vec(), tag: self.tag });
        self.steps.len() - 1
    }
    pub fn send(&mut self, peer: usize, src: *const u8, len: usize, deps: &[usize]) -> usize {
        self.push(Action::Send { peer, src, len, via: Via::Any }, deps)
    }
    /// A send that is done once written to the stream, never sent by address.
    pub fn send_staged(&mut self, peer: usize, src: *const u8, len: usize, deps: &[usize]) -> usize {
        self.push(Action::Send { peer, src, len, via: Via::Stream }, deps)
    }
    /// A send through the stream that also copies `src` to `dst` on the way (see `Via::Tee`).
    pub fn send_tee(&mut self, peer: usize, src: *const u8, len: usize, dst: *mut u8, stream: bool) -> usize {
        self.push(Action::Send { peer, src, len, via: Via::Tee { dst, stream } }, &[])
    }
    /// Copies `len` bytes from `src` to `dst` (ranges that overlap are copied whole,
    /// as by memmove).
    pub fn copy(&mut self, src: *const u8, dst: *mut u8, len: usize, stream: bool, deps: &[usize]) -> usize {
        self.push(Action::Copy { src, dst, len, stream }, deps)
    }
    pub fn recv(&mut self, peer: usize, len: usize, sink: Sink, deps: &[usize]) -> usize {
        self.push(Action::Recv { peer, len, sink }, deps)
    }
    pub fn local(&mut self, f: impl FnMut() -> Result<()> + Send + 'a, deps: &[usize]) -> usize {
        self.push(Action::Local(Box::new(f)), deps)
    }
    pub fn p2p_send(&mut self, peer: usize, src: *const u8, len: usize, what: P2pCall) -> usize {
        self.push(Action::P2pSend { peer, src, len, what }, &[])
    }
    pub fn p2p_recv(&mut self, peer: usize, dst: *mut u8, len: usize, what: P2pCall) -> usize {
        self.push(Action::P2pRecv { peer, dst, len, what }, &[])
    }
    /// Exchanges (`how`) the `len` bytes of `block` at `at`, whose input is at `src`
    /// (`at` itself in place), with the peer's block of the same size, between the two buffers,
    /// when both ranks can map each other's and, for a swap, both are in place
    /// (see [`Exchange`]). Otherwise, as the offers tell both ranks alike: the steps
    /// `apart` adds when both are out of place (if it adds any), else those
    /// `fallback` adds, which must pair up with the peer's whatever its placement.
    /// Those steps run after the offers; the ones not taken are skipped.
    pub fn swap(
        &mut self,
        peer: usize,
        block: Block,
        how: Exchange,
        apart: impl FnOnce(&mut Self),
        fallback: impl FnOnce(&mut Self),
    ) {
        let Block { at, src, len } = block;
        let in_place = std::ptr::eq(src, at);
        // A swap has no inputs. A reduction out of place writes blocks that are not
        // its inputs: only worth it with streaming stores, which skip reading them
        // first, and while the pipelined path cannot read its results back from the
        // L3 either (plan::Plan::fuse_out_max).
        let fuse_out_max = super::super::plan::get().fuse_out_max;
        let capable = in_place || (matches!(how, Exchange::Reduce { stream: true, .. }) && len <= fuse_out_max);
        let offer = Offer { peer, at, src, len, how, in_place, capable, peer_input: PeerInput::Unknown };
        self.push(Action::SwapSend(offer), &[]);
        let rv = self.push(Action::SwapRecv { offer, apart: (0, 0), fallback: (0, 0) }, &[]);
        let a = self.after(rv, apart);
        let f = self.after(rv, fallback);
        if let Action::SwapRecv { apart, fallback, .. } = &mut self.steps[rv].action {
            *apart = if a.0 == a.1 { f } else { a };
            *fallback = f;
        }
    }
    /// The steps `add` pushes, made to wait for step `first` where they wait for
    /// nothing else (the others wait for those): their range.
    fn after(&mut self, first: usize, add: impl FnOnce(&mut Self)) -> (usize, usize) {
        let start = self.steps.len();
        add(self);
        for st in &mut self.steps[start..] {
            if st.deps.is_empty() {
                st.deps.push(first);
            }
        }
        (start, self.steps.len())
    }
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}
