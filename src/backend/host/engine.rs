//! The progress engine: runs a schedule of sends, receives and local steps over the
//! links of one rank until every step is done.
//!
//! A collective is compiled into a [`Schedule`] (a small DAG: each step may wait for
//! earlier ones); the engine drives all of it at once, so sends to one peer, receives
//! from another and local reductions overlap, and rings never deadlock as long as
//! the ranks' schedules agree. Messages to a peer are written in schedule order and
//! read in schedule order; point-to-point messages have their own handshake (the
//! receiver announces its count when it posts the receive, the sender its count in
//! the header; large payloads follow once the counts agree) so that a count mismatch
//! is reported on both sides and leaves the streams aligned.

use crate::error::{Error, Result};
use crate::mem::pool::PooledBuf;
use crate::mem::{copy, reduce, shared};
use crate::transport::{Seen, Share, Transport};
use crate::types::{DataType, RedOp};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub(super) const HDR: usize = 16;
/// Tag of steps whose messages may belong to any collective (call fingerprints):
/// the receiver checks the content instead of the tag.
pub const ANY_TAG: u32 = u32::MAX;
pub(super) const K_DATA: u8 = 1;
pub(super) const K_P2P_HDR: u8 = 2;
/// The receiver's count for its next fcclRecv from the peer, sent when the run that
/// receives starts (not when the sender's header arrives): in an exchange, where both
/// ranks send and receive, it travels while the data does, so the sender learns the
/// verdict without a round trip of its own.
pub(super) const K_P2P_REPLY: u8 = 3;
pub(super) const K_P2P_DATA: u8 = 4;
/// fcclSend of at most EAGER_MAX bytes that cannot go by address: the count and the
/// payload in one message. The send is done when the receiver's count has come too
/// (K_P2P_REPLY), so a mismatch fails both sides, but the data does not wait for it.
pub(super) const K_P2P_EAGER: u8 = 7;
/// Largest fcclSend sent eagerly: well below the smallest ring (256 KiB), so an eager
/// message never needs the receiver to free space before it is complete.
const EAGER_MAX: usize = 64 << 10;
/// A collective message sent by address: the receiver reads it straight from the
/// sender's buffer (single copy) and reports the read done through the link. The
/// payload is a [`DESC`]-byte descriptor (see `direct_desc`). With the header flag
/// ([`HDR_FLAG`]) set, a second descriptor follows: the sender's own destination
/// for the message (a broadcast root's recvbuff out of place), which whoever copies
/// a piece of the message writes too, so each piece is read once for both
/// destinations and both cores share all of it (see [`tee_shared`]).
pub(super) const K_DIRECT: u8 = 5;
/// The payload of a large fcclSend, sent by address as K_DIRECT is.
pub(super) const K_P2P_DIRECT: u8 = 8;
/// An exchange of two blocks between the ranks' buffers ([`Exchange`]: in-place
/// all_to_all, 2-rank all_reduce): each side's offer, sent as a direct message whose
/// two descriptors name its block and its input (the block itself in place; address
/// 0 when this side cannot exchange, the next word then saying whether it is in
/// place). When both can, the side that
/// [`swap_offers`] publishes its block as for a split copy and both take pieces
/// (every byte read once and written once, on both cores); each reports the
/// peer's offer read, the offerer only once every piece is done. Otherwise both run
/// the steps the offers choose (see [`Schedule::swap`]).
pub(super) const K_SWAP: u8 = 9;
/// The payload of a large fcclSend whose buffer is also where the matching
/// fcclRecv from the same peer lands (an exchange in place), when both ranks of the
/// pair are in place and can swap: an offer as [`K_SWAP`]'s, which the peer's
/// fcclRecv takes as its payload. Both ranks learn that both are in place from the
/// receivers' counts ([`K_P2P_REPLY`], whose header flag says so), so both send
/// it or neither does; the blocks are then swapped as an all_to_all's are.
pub(super) const K_P2P_SWAP: u8 = 10;
/// Header byte of a [`K_P2P_REPLY`]: set when the receive it answers is half of an
/// exchange in place that this rank can swap (see [`K_P2P_SWAP`]).
const HDR_FLAG: usize = 1;
/// Largest 2-rank reduction exchanged between the buffers out of place (see
/// [`Schedule::swap`]).
const FUSE_OUT_MAX: usize = 16 << 20;
/// Bytes of a direct message's descriptor: the address in the sender, and where
/// it lies in one of the sender's shared allocations (serial 0: none).
pub(super) const DESC: usize = 40;
/// Messages at least this large go by address when the link allows it: below it,
/// announcing the message and waiting for its read cost more than the copy saved
/// (and a cross-memory read's system call and page pinning more still). Measured
/// side by side against 64 KiB: broadcast 32 KiB 1.9-3.3x, all_gather and gather
/// 64 KiB 2.1-3.7x, send_recv 32-64 KiB out of place 2.3-3.5x; reductions unchanged.
pub const DIRECT_MIN: usize = 32 << 10;
/// A direct message is read in pieces of this size, so other peers progress meanwhile
/// and reductions read a piece that is still in cache.
const DIRECT_PIECE: usize = 256 << 10;
/// Bytes a gated receive of a direct message reads ahead of what it may write
/// (see [`InPlace`]) into a buffer of its own: the sender may overwrite what has
/// been read, so a ring shift in place whose every rank sends by address moves as
/// soon as each rank has read this much. Where the gate is already open, bytes go
/// straight from the sender's buffer into the receiver's. At 4 ranks on 2 cores,
/// against the rings (before the writes streamed): 1 MiB 1.07-1.36x at 4-64 MiB (7
/// alternating runs), 2 MiB 1.05-1.27x; 4 MiB and 16 MiB were slower than 1 MiB,
/// 256 KiB too (3 runs).
const GATED_AHEAD: usize = 1 << 20;
/// Smallest fcclSend in place (its buffer also receives in the run) that goes by
/// address, and only where ranks share cores: there the rings hand every byte
/// from one core's cache to another's, while a receive that reads ahead keeps its
/// bytes in its own. Side by side in one binary (this path on and off, 5-7
/// alternating runs): 4 ranks on 2 cores 1.26-1.65x at 4-64 MiB, 3 ranks 1.24-1.52x.
/// With a core per rank the rings copy on both cores at once and this path (before
/// its writes streamed) measured 0.53-0.89x (2 ranks that do not swap, 128 KiB-64
/// MiB); at 4 ranks below 4 MiB it was 0.76-1.23x.
const GATED_MIN: usize = 4 << 20;
/// Direct messages at least this large into a buffer their sender can write are
/// copied by sender and receiver together (a split copy, see `transport::Share`):
/// the receiver offers, and both take pieces of SHARE_PIECE bytes.
const SHARE_MIN: usize = 256 << 10;
/// Piece of a split copy: the sender takes one at a time, the receiver up to
/// DIRECT_PIECE at once (as it reads when it reads alone); small enough that the
/// two finish close together, large enough that taking one (a line that moves
/// between the cores) costs little beside it.
const SHARE_PIECE: usize = 64 << 10;
/// Messages of these sizes, in runs that send less than its end to the peer in
/// all, are written into the ring with streaming stores. A reader that follows
/// close behind the writer would otherwise take every line from the writer's
/// private cache, and the writer must first take each line back from the reader's
/// cache where the ring was last read: both transfers between cores are slower
/// than memory on the measured machines (5.5 GB/s between cores against 8-10 GB/s
/// through memory; under 2 GB/s when the two CPUs sit on different dies, which the
/// VM's host decides and changes at run time). Larger transfers keep ordinary
/// stores while those stay fast ([`copy::StoreChoice`]): the writer runs far
/// enough ahead that lines reach the shared cache before they are read, and
/// streaming them through memory would double the traffic. Measured per size in
/// docs/results/2026-11-24-host-performance.md ("Ring stores").
const RING_STREAM: std::ops::Range<usize> = (32 << 10)..(512 << 10);
/// Skips the rest of the ring, unread and unwritten: the next message starts at the
/// ring's beginning (see `Link::rewind_gap`). Its length field is the gap after the header.
pub(super) const K_SKIP: u8 = 6;
/// A sender rewinds its ring once it has written this far into it and the peer has
/// read everything. Messages of calls that do not overlap then cycle through the
/// first pages of the ring: they stay mapped and in cache, where walking the whole
/// ring (4 MiB at 2 ranks) page-faulted shared memory for dozens of calls (each
/// 128 KiB all_reduce took ~150 us instead of ~15 until the ring had been touched
/// once) and pushed other data out of the cache.
pub(super) const REWIND_MIN: usize = 64 << 10;
/// Most payload bytes one visit writes into a ring, reads out of one, or copies
/// locally before the engine turns to the next peer or step. Writer and reader then
/// work on consecutive pieces at once (each piece is published as soon as it is
/// written), where whole messages made one wait for the other; a piece stays in the
/// writer's L2 cache until the reader takes it.
const PIECE: usize = 64 << 10;

pub(super) const fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// A message header: its kind, the tag of the call it belongs to, and its length
/// field (the payload's size, or the count a handshake announces).
pub(super) fn header(kind: u8, tag: u32, len: usize) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[0] = kind;
    h[4..8].copy_from_slice(&tag.to_le_bytes());
    h[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    h
}

/// The kind, tag and length field of a header (see [`header`]).
pub(super) fn parse_header(h: &[u8; HDR]) -> (u8, u32, usize) {
    let tag = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
    (h[0], tag, u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")) as usize)
}

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
    unsafe fn consume(&self, off: usize, data: &[u8]) {
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

/// What a point-to-point step is, for error messages (formatted only on error).
#[derive(Clone, Copy)]
pub struct P2pCall {
    pub send: bool,
    pub count: usize,
    pub dtype: DataType,
    pub peer: usize,
}

impl P2pCall {
    /// The fcclSend or fcclRecv `co`.
    pub fn of(co: &crate::coll::Coll) -> P2pCall {
        P2pCall { send: co.kind == crate::coll::CollKind::Send, count: co.count, dtype: co.dtype, peer: co.root }
    }
}

impl std::fmt::Display for P2pCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, dir) = if self.send { ("fcclSend", "to") } else { ("fcclRecv", "from") };
        write!(f, "{name} of {} x {} {dir} rank {}", self.count, self.dtype, self.peer)
    }
}

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

/// What a pair of ranks does to a pair of equal blocks, one in each rank's buffer,
/// piece by piece (see [`K_SWAP`]).
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
    dst: *mut u8,
    src: *const u8,
}

impl Side {
    /// The side `off` bytes further on.
    ///
    /// # Safety
    /// Both blocks extend at least that far.
    unsafe fn at(self, off: usize) -> Side {
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
    unsafe fn apply(self, me: usize, peer: usize, own: Side, other: Side, n: usize) {
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
/// block (see [`K_SWAP`]).
#[derive(Clone, Copy)]
pub struct Offer {
    peer: usize,
    at: *mut u8,
    src: *const u8,
    len: usize,
    how: Exchange,
    /// Whether this rank's call is in place.
    in_place: bool,
    /// Whether this side can exchange in place: decided once when the run starts
    /// and kept with both steps, so that what the offer says and what this side
    /// then does cannot differ.
    capable: bool,
    /// The peer's input, where this rank helps the peer exchange (set on the
    /// offer step when the peer's offer has been read).
    peer_input: PeerInput,
}

/// Where a peer's input to an exchange is, as this rank reads it.
#[derive(Clone, Copy, PartialEq)]
enum PeerInput {
    /// Its offer has not been read yet.
    Unknown,
    /// Its block itself (in place).
    Block,
    /// Mapped here.
    At(*const u8),
}

impl PeerInput {
    /// The peer's side of an exchange whose block is mapped here at `block`.
    fn side(self, block: *mut u8) -> Side {
        Side { dst: block, src: if let PeerInput::At(q) = self { q } else { block } }
    }
}

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
    /// This rank's offer (see [`K_SWAP`]).
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
    /// Exchanges (`how`) `len` bytes at `at`, whose input is at `src` (`at` itself
    /// in place), with the peer's block of the same size, between the two buffers,
    /// when both ranks can map each other's and, for a swap, both are in place
    /// (see [`K_SWAP`]). Otherwise, as the offers tell both ranks alike: the steps
    /// `apart` adds when both are out of place (if it adds any), else those
    /// `fallback` adds, which must pair up with the peer's whatever its placement.
    /// Those steps run after the offers; the ones not taken are skipped.
    #[allow(clippy::too_many_arguments)]
    pub fn swap(
        &mut self,
        peer: usize,
        at: *mut u8,
        src: *const u8,
        len: usize,
        how: Exchange,
        apart: impl FnOnce(&mut Self),
        fallback: impl FnOnce(&mut Self),
    ) {
        let in_place = std::ptr::eq(src, at);
        // A swap has no inputs. A reduction out of place writes blocks that are not
        // its inputs: only worth it with streaming stores, which skip reading them
        // first, and while the pipelined path cannot read its results back from the
        // L3 either (2 ranks against that path, alternating: 0.65x at 256 KiB
        // without streaming stores; with them, 6 runs, 1.07-1.53x at 512 KiB-16 MiB,
        // 0.99x at 32 MiB, 0.91x at 64 MiB).
        let capable = in_place || (matches!(how, Exchange::Reduce { stream: true, .. }) && len <= FUSE_OUT_MAX);
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

/// What bounds a run.
pub struct RunCtl<'a> {
    /// Bound on the run's waiting, counted from when it first has to wait.
    pub timeout: Duration,
    pub abort: &'a AtomicBool,
    /// Describes the operation for messages ("fcclAllReduce #12 on rank 0"); called
    /// only when a message is built.
    pub what: &'a dyn Fn() -> String,
}

/// An outgoing message being written.
struct Tx {
    kind: u8,
    tag: u32,
    /// The header's length field: the payload's size, or for a handshake the count announced.
    announce: usize,
    src: *const u8,
    /// Payload bytes that follow the header.
    payload: usize,
    step: Option<usize>,
    written: usize,
    /// Payload carried in the message itself (a direct message's descriptor; a
    /// [`K_SWAP`] offer's two).
    inline: [u8; 2 * DESC],
    /// Where the payload is copied as well, and whether with streaming stores.
    tee: Option<(*mut u8, bool)>,
    /// Bytes of a direct message copied to `tee` so far (after the descriptor went).
    tee_done: usize,
    /// A direct message: done once the peer reports it read (else once written: a
    /// swap offer on a link without read reports, which can never lead to a swap).
    awaits_read: bool,
    /// The header's flag byte (see [`HDR_FLAG`]).
    flag: u8,
    /// The fcclSend step whose payload this is, when a receive of the run waits
    /// for it to leave its buffer ([`InPlace`]): its progress is recorded there.
    progress: Option<usize>,
}

impl Tx {
    fn data(kind: u8, tag: u32, src: *const u8, len: usize, step: Option<usize>) -> Tx {
        Tx {
            kind,
            tag,
            announce: len,
            src,
            payload: len,
            step,
            written: 0,
            inline: [0; 2 * DESC],
            tee: None,
            tee_done: 0,
            awaits_read: false,
            flag: 0,
            progress: None,
        }
    }
    fn control(kind: u8, tag: u32, announce: usize) -> Tx {
        Tx { announce, payload: 0, ..Tx::data(kind, tag, std::ptr::null(), 0, None) }
    }
    /// Header of a skip over `gap` bytes (header included) to the ring's start.
    fn skip(gap: usize) -> Tx {
        Tx::data(K_SKIP, 0, std::ptr::null(), gap - HDR, None)
    }
    /// A message of `len` bytes at `src` sent by address (`desc`); `tee`: also
    /// copied there by the sender while the peer reads it.
    fn direct(
        kind: u8,
        tag: u32,
        src: *const u8,
        len: usize,
        step: usize,
        desc: [u8; DESC],
        tee: Option<(*mut u8, bool)>,
    ) -> Tx {
        let mut inline = [0; 2 * DESC];
        inline[..DESC].copy_from_slice(&desc);
        Tx { payload: DESC, step: Some(step), inline, tee, awaits_read: true, ..Tx::data(kind, tag, src, len, None) }
    }
    fn is_direct(&self) -> bool {
        matches!(self.kind, K_DIRECT | K_P2P_DIRECT | K_SWAP | K_P2P_SWAP)
    }
}

/// The descriptor of a direct message of `len` bytes at `src` to the peer of
/// `link`, when the link lets the peer read it in place: the peer reads any of
/// our memory (a thread of this process, or cross-memory attach), or it maps our
/// shared allocations and the message lies in one.
fn direct_desc(link: &dyn crate::transport::Link, src: *const u8, len: usize) -> Option<[u8; DESC]> {
    if len < DIRECT_MIN {
        return None;
    }
    #[cfg(test)]
    if tests::DIRECT_REFUSED.with(|c| c.get()) {
        return None;
    }
    let shared = if link.peer_maps() { shared::lookup(src, len) } else { None };
    if shared.is_none() && !link.peer_reads_directly() {
        return None;
    }
    Some(encode_desc(src, shared))
}

/// Whether this rank can swap `len` bytes at `at` with the peer of `link` (see
/// `Link::swap_capable`; tests make a rank refuse).
fn swap_capable(link: &dyn crate::transport::Link, at: *const u8, len: usize) -> bool {
    #[cfg(test)]
    if tests::SWAP_REFUSED.with(|c| c.get()) {
        return false;
    }
    link.swap_capable(at, len)
}

/// Whether this rank offers its block of a swap with `peer` (and swaps as the
/// receiver), or helps the peer swap (as the sender): alternating with the pair's
/// parity, so that every rank offers about half of its swaps.
fn swap_offers(me: usize, peer: usize) -> bool {
    (me > peer) == ((me + peer) % 2 == 1)
}

/// The fcclSend and fcclRecv steps of one run whose buffers overlap (in place, as
/// a ring shift or an exchange in one buffer): the data each send sends is what
/// its buffer held when the run started, and the receives write none of it
/// before it has left.
///
/// A receive that starts at or below an overlapping send's buffer writes only
/// bytes below the point up to which the send's payload has left: copied into the
/// ring, or, for a send by address, reported read by its receiver
/// (`Link::report_read`). So it never needs the send to run ahead of it. In a ring
/// shift of such ranks through the rings, each send waits for ring space, which
/// its receiver frees as far as its own send has gone, and some rank can always
/// move (the one whose send is furthest behind). A gated receive of a message sent
/// by address reads up to [`GATED_AHEAD`] bytes ahead of its gate into a buffer of
/// its own, and reports them read: the ranks of a ring shift by address all read
/// that much before any has to write. A receive that starts above an overlapping
/// send would need that send to lead by the distance, which can exceed any ring:
/// that send's payload is copied aside when the run starts instead.
///
/// The k-th send to a peer and the k-th receive from it over the same bytes, large
/// and swappable here, are offered as an exchange in place ([`K_P2P_SWAP`]).
#[derive(Default)]
struct InPlace {
    /// (receive, send) steps whose buffers overlap, the receive starting at or
    /// below the send.
    gates: Vec<(usize, usize)>,
    /// Payload bytes each send step has copied out of its buffer, by step (empty
    /// when no receive waits for a send).
    sent: Vec<usize>,
    /// (receive, send) exchanges in place that this rank can swap.
    pairs: Vec<(usize, usize)>,
    /// Copies of the sends that a receive overlaps above their start.
    staged: Vec<PooledBuf>,
}

impl InPlace {
    /// Finds the run's overlapping fcclSend/fcclRecv steps (none in almost every run).
    fn setup(&mut self, t: &mut Transport, sched: &mut Schedule<'_>) {
        self.gates.clear();
        self.sent.clear();
        self.pairs.clear();
        self.staged.clear();
        let p2p = |a: &Action<'_>| match *a {
            Action::P2pSend { peer, src, len, .. } if len > 0 => Some((true, peer, src as usize, len)),
            Action::P2pRecv { peer, dst, len, .. } if len > 0 => Some((false, peer, dst as usize, len)),
            _ => None,
        };
        let steps = &mut sched.steps;
        if !steps.iter().any(|s| matches!(p2p(&s.action), Some((false, ..)))) {
            return;
        }
        let overlap = |a: usize, al: usize, b: usize, bl: usize| a < b + bl && b < a + al;
        let calls = |steps: &[Step<'_>]| -> Vec<(usize, (bool, usize, usize, usize))> {
            steps.iter().enumerate().filter_map(|(k, s)| p2p(&s.action).map(|c| (k, c))).collect()
        };
        // Sends that a receive overlaps above their start are copied aside first.
        let before = calls(steps);
        for &(j, (_, _, src, sl)) in before.iter().filter(|c| c.1 .0) {
            let above = before.iter().any(|&(_, (send, _, dst, dl))| !send && dst > src && overlap(dst, dl, src, sl));
            if let (true, Action::P2pSend { src: at, len, .. }) = (above, &mut steps[j].action) {
                let mut copy = PooledBuf::take(*len);
                // SAFETY: the caller's buffer holds len bytes (validated) and the pooled
                // one at least as many; they are distinct allocations.
                unsafe { std::ptr::copy_nonoverlapping(*at, copy.as_mut_ptr(), *len) };
                *at = copy.as_ptr();
                self.staged.push(copy);
            }
        }
        // Every overlap left has the receive at or below the send.
        let after = calls(steps);
        for &(i, (_, _, dst, dl)) in after.iter().filter(|c| !c.1 .0) {
            for &(j, (_, _, src, sl)) in after.iter().filter(|c| c.1 .0) {
                if overlap(dst, dl, src, sl) {
                    self.gates.push((i, j));
                }
            }
        }
        if self.gates.is_empty() {
            return;
        }
        self.sent.resize(steps.len(), 0);
        // Exchanges: the k-th receive from a peer and the k-th send to it, over the
        // same bytes and overlapping nothing else.
        let alone = |i: usize, j: usize| self.gates.iter().filter(|&&(a, b)| a == i || b == j).count() == 1;
        let mut pairs = Vec::new();
        for &(i, j) in &self.gates {
            let (Some((_, peer, dst, dl)), Some((_, to, src, sl))) = (p2p(&steps[i].action), p2p(&steps[j].action))
            else {
                continue;
            };
            let nth = |send: bool, k: usize| {
                steps[..k]
                    .iter()
                    .filter(|s| match s.action {
                        Action::P2pSend { peer: q, .. } => send && q == peer,
                        Action::P2pRecv { peer: q, .. } => !send && q == peer,
                        _ => false,
                    })
                    .count()
            };
            if peer == to
                && dst == src
                && dl == sl
                && dl > EAGER_MAX
                && alone(i, j)
                && nth(false, i) == nth(true, j)
                && swap_capable(t.link(peer), dst as *const u8, dl)
            {
                pairs.push((i, j));
            }
        }
        self.pairs = pairs;
    }

    /// Whether receive step `i` waits for sends to leave its buffer.
    fn gated(&self, i: usize) -> bool {
        self.gates.iter().any(|&(r, _)| r == i)
    }

    /// Whether a receive waits for send step `j` to leave its buffer.
    fn gated_send(&self, j: usize) -> bool {
        self.gates.iter().any(|&(_, s)| s == j)
    }

    /// How many payload bytes of receive step `i` may be written now (at least its
    /// length when nothing holds it back).
    fn allowed(&self, sched: &Schedule<'_>, i: usize) -> usize {
        let Action::P2pRecv { dst, len, .. } = sched.steps[i].action else { return usize::MAX };
        let mut lim = usize::MAX;
        for &(_, j) in self.gates.iter().filter(|g| g.0 == i) {
            if let Action::P2pSend { src, len: sl, .. } = sched.steps[j].action {
                if self.sent[j] < sl {
                    lim = lim.min((src as usize + self.sent[j]).saturating_sub(dst as usize));
                }
            }
        }
        if lim >= len {
            usize::MAX
        } else {
            lim
        }
    }

    /// Send step `j` will never copy (more of) its payload: its buffer is free.
    fn release(&mut self, j: usize) {
        if let Some(s) = self.sent.get_mut(j) {
            *s = usize::MAX;
        }
    }

    /// Whether send step `j` is half of an exchange in place this rank can swap.
    fn paired_send(&self, j: usize) -> bool {
        self.pairs.iter().any(|&(_, s)| s == j)
    }

    fn paired_recv(&self, i: usize) -> bool {
        self.pairs.iter().any(|&(r, _)| r == i)
    }
}

/// A descriptor naming `src`, in the shared allocation `shared` if any.
pub(super) fn encode_desc(src: *const u8, shared: Option<shared::Desc>) -> [u8; DESC] {
    let mut d = [0u8; DESC];
    d[0..8].copy_from_slice(&(src as usize as u64).to_le_bytes());
    if let Some(r) = shared {
        d[8..16].copy_from_slice(&r.serial.to_le_bytes());
        d[16..24].copy_from_slice(&r.region_len.to_le_bytes());
        d[24..32].copy_from_slice(&r.offset.to_le_bytes());
        d[32..36].copy_from_slice(&r.fd.to_le_bytes());
        d[36..40].copy_from_slice(&r.epoch.to_le_bytes());
    }
    d
}

/// Whether a message of `len` bytes at `src` would go by address to every peer.
pub fn goes_direct_to_all(t: &mut Transport, src: *const u8, len: usize) -> bool {
    let me = t.rank;
    (0..t.nranks).filter(|&p| p != me).all(|p| direct_desc(t.link(p), src, len).is_some())
}

/// The sender's address and shared allocation named by a descriptor.
pub(super) fn decode_desc(d: &[u8; DESC]) -> (u64, Option<shared::Desc>) {
    let word = |i: usize| u64::from_le_bytes(d[i..i + 8].try_into().unwrap());
    let serial = word(8);
    let desc = (serial != 0).then(|| shared::Desc {
        serial,
        region_len: word(16),
        offset: word(24),
        fd: i32::from_le_bytes(d[32..36].try_into().unwrap()),
        epoch: u32::from_le_bytes(d[36..40].try_into().unwrap()),
    });
    (word(0), desc)
}

/// Reads the incoming stream into `buf` from `*got` on, as far as bytes have
/// arrived (a fixed-size record may straddle the ring's wrap point); true when
/// any byte was taken.
pub(super) fn gather(link: &mut dyn crate::transport::Link, buf: &mut [u8], got: &mut usize) -> bool {
    let start = *got;
    while *got < buf.len() {
        let avail = link.recv_avail();
        if avail.is_empty() {
            break;
        }
        let k = avail.len().min(buf.len() - *got);
        buf[*got..*got + k].copy_from_slice(&avail[..k]);
        link.recv_commit(k);
        *got += k;
    }
    *got > start
}

/// Where a direct message's bytes are read from.
#[derive(Clone, Copy)]
enum Source {
    /// Mapped here: ordinary loads.
    Ptr(*const u8),
    /// The sender's address, read with `Link::read_direct`.
    Remote(u64),
}

/// A direct message's descriptor as it arrives (it may wrap around the ring),
/// then where its bytes are.
struct DirectRx {
    /// One descriptor, or a [`K_SWAP`] offer's two (its block's, then its input's).
    desc: [u8; 2 * DESC],
    want: usize,
    got: usize,
    src: Option<Source>,
}

impl DirectRx {
    /// For a message of `kind` whose header flag is `flag`.
    fn new(kind: u8, flag: u8) -> DirectRx {
        let want = if kind == K_SWAP || (kind == K_DIRECT && flag != 0) { 2 * DESC } else { DESC };
        DirectRx { desc: [0; 2 * DESC], want, got: 0, src: None }
    }
}

/// This rank's side of an exchange that it reads the peer's offer for: its block
/// and input, and once the offer is read the peer's input.
#[derive(Clone, Copy)]
struct RxSwap {
    own: Side,
    how: Exchange,
    peer_input: PeerInput,
}

/// An incoming message being read, for step `step`.
struct Rx {
    step: usize,
    len: usize,
    sink: Sink,
    read: usize,
    /// A direct message: its descriptor and source.
    direct: Option<DirectRx>,
    /// A direct message copied with its sender: the slot, and whether every piece has been taken.
    share: Option<(Share, bool)>,
    /// A swap offer: this rank's side of the exchange.
    swap: Option<RxSwap>,
    /// An fcclRecv into a buffer that sends of the run read (see [`InPlace`]).
    gated: bool,
    /// A direct fcclSend whose sender's receives wait for this rank's reads
    /// (`Link::report_read`), so this rank reports them piece by piece.
    reports: bool,
    /// A gated receive of such a message: the bytes read ahead of the gate.
    held: Option<Held>,
    /// The sender's own destination for the message, mapped here: each piece this
    /// rank copies goes there too (see [`K_DIRECT`]).
    tee: Option<*mut u8>,
}

impl Rx {
    /// A message of `len` bytes for step `step` into `sink`, read from the stream;
    /// the other fields as the message kind needs them.
    fn new(step: usize, len: usize, sink: Sink) -> Rx {
        Rx {
            step,
            len,
            sink,
            read: 0,
            direct: None,
            share: None,
            swap: None,
            gated: false,
            reports: false,
            held: None,
            tee: None,
        }
    }
}

/// The bytes of a gated direct message read out of the sender's buffer and not
/// yet written (see [`GATED_AHEAD`]): offset `o` of the message is at
/// `o % GATED_AHEAD` here.
struct Held {
    buf: PooledBuf,
    /// Bytes of the message written into the destination (all those below
    /// `Rx::read` are here or written).
    written: usize,
}

/// How a sender helps copy its direct message into the receiver's buffer, once the
/// receiver offers a split copy (see [`share_piece`]).
#[derive(Clone, Copy)]
enum Help {
    /// Each piece copied into the receiver's destination.
    Copy,
    /// Each piece also into this rank's own destination (`stream`: with streaming
    /// stores), which the receiver writes with its pieces too ([`tee_shared`]).
    Tee { dst: *mut u8, stream: bool },
    /// A [`K_P2P_SWAP`] offer: pieces swapped.
    P2pSwap,
}

/// Whether the sender of a direct message of `len` bytes with its own destination
/// `dst` (a broadcast root's recvbuff) leaves that copy to whoever copies each
/// piece, itself or the receiver: large enough for a split copy, which has both
/// cores take pieces, and a destination the receiver can write.
fn tee_shared(link: &dyn crate::transport::Link, dst: *mut u8, len: usize) -> bool {
    len >= SHARE_MIN && link.swap_capable(dst, len)
}

/// The pieces of a split copy of `len` bytes.
fn share_pieces(len: usize) -> u64 {
    len.div_ceil(SHARE_PIECE) as u64
}

/// A direct message of ours that this rank helps copy into the receiver's buffer.
#[derive(Clone, Copy)]
struct TxShare {
    /// The message's number on the link.
    seq: u64,
    /// Where its receiver wants it, as written from here.
    dst: *mut u8,
    stream: bool,
}

#[derive(Default)]
struct Peer {
    cur_tx: Option<Tx>,
    urgent: VecDeque<Tx>,
    send_q: VecDeque<usize>,
    data_rq: VecDeque<usize>,
    p2p_rq: VecDeque<usize>,
    awaiting_reply: VecDeque<usize>,
    /// Receivers' counts (K_P2P_REPLY) that came before this run started the send
    /// they answer.
    /// (count, whether flagged: see HDR_FLAG).
    early_replies: VecDeque<(usize, bool)>,
    /// fcclSends to this peer in this run, and receivers' counts read for them.
    p2p_sends: usize,
    replies_read: usize,
    awaiting_payload: VecDeque<usize>,
    cur_rx: Option<Rx>,
    /// Direct messages sent so far, and the steps that wait for their reads.
    direct_sent: u64,
    /// (step, message number, how this rank helps copy it).
    direct_wait: VecDeque<(usize, u64, Help)>,
    /// Whether `direct_sent` has been read from the link in this run.
    direct_started: bool,
    /// The split copy of our direct message that the peer offered, once looked up.
    share: Option<TxShare>,
    /// How pieces are written into this peer's ring; kept across runs.
    stores: copy::StoreChoice,
    /// Bytes this run sends to this peer, all messages together.
    run_bytes: usize,
}

impl Peer {
    /// Before this run's first direct message: the link's read counter spans runs,
    /// and every earlier run waited for the reads of its own direct messages, so its
    /// value now is where this run's messages are counted from.
    fn start_direct(&mut self, link: &dyn crate::transport::Link) {
        if !self.direct_started {
            self.direct_sent = link.direct_reads_done();
            self.direct_started = true;
        }
    }

    /// Empties the queues (keeping their memory) for the next run, also after a run
    /// that ended in an error.
    fn reset(&mut self) {
        self.cur_tx = None;
        self.cur_rx = None;
        self.urgent.clear();
        self.send_q.clear();
        self.data_rq.clear();
        self.p2p_rq.clear();
        self.awaiting_reply.clear();
        self.early_replies.clear();
        self.p2p_sends = 0;
        self.replies_read = 0;
        self.awaiting_payload.clear();
        self.direct_sent = 0;
        self.direct_wait.clear();
        self.direct_started = false;
        self.share = None;
        self.run_bytes = 0;
    }
}

/// How pieces of a message of `payload` bytes are written into a peer's ring when
/// the run sends `run_bytes` to that peer in all: where that is above
/// [`RING_STREAM`], whichever [`copy::StoreChoice`] finds right for the peer now
/// (the writer runs far ahead: a large message, or the many 256 KiB segments of a
/// large reduction, which measured 0.63-0.76x streamed at 2-32 MiB); otherwise
/// streaming stores for messages inside it and ordinary ones below it.
fn ring_streaming(stores: &mut copy::StoreChoice, payload: usize, run_bytes: usize) -> bool {
    if run_bytes >= RING_STREAM.end {
        stores.choose()
    } else {
        payload >= RING_STREAM.start
    }
}

/// Runs `sched` to completion. Fatal errors (timeout, dead peer, desynchronised
/// streams) return `Err` at once; a step-level error (a point-to-point count
/// mismatch, which leaves the streams aligned) comes back as `Ok(Some(e))` after
/// every other step finished.
pub fn run(t: &mut Transport, sched: &mut Schedule<'_>, ctl: &RunCtl<'_>) -> Result<Option<Error>> {
    if sched.steps.is_empty() {
        return Ok(None);
    }
    // The run's bookkeeping is kept between the runs of a thread, so that a small
    // call allocates nothing (its queues used to cost a quarter of an 8-byte send).
    let mut sc = SCRATCH.with(|c| c.take());
    let res = run_with(t, sched, ctl, &mut sc);
    // Copies of sends go back to the pool.
    sc.inplace.staged.clear();
    if res.is_err() {
        // The caller gets its buffers back: senders must stop writing into them.
        for st in &sc.peers {
            if let Some((slot, _)) = st.cur_rx.as_ref().and_then(|rx| rx.share) {
                slot.withdraw();
            }
        }
    }
    SCRATCH.with(|c| c.replace(sc));
    res
}

/// Buffers of an engine run.
#[derive(Default)]
struct RunScratch {
    done: Vec<bool>,
    peers: Vec<Peer>,
    locals: Vec<usize>,
    /// Copies in progress: (step, bytes copied).
    copies: Vec<(usize, usize)>,
    bounce: Vec<u8>,
    inplace: InPlace,
}

thread_local! {
    static SCRATCH: std::cell::Cell<RunScratch> = std::cell::Cell::new(RunScratch::default());
}

fn run_with(
    t: &mut Transport,
    sched: &mut Schedule<'_>,
    ctl: &RunCtl<'_>,
    sc: &mut RunScratch,
) -> Result<Option<Error>> {
    let n = sched.steps.len();
    // A peer that failed or aborted earlier is reported as such, not as whatever
    // its half-sent messages would look like.
    t.check_flags().map_err(|e| e.context((ctl.what)()))?;
    let RunScratch { done, peers, locals, copies, bounce, inplace } = sc;
    done.clear();
    done.resize(n, false);
    let mut remaining = n;
    peers.resize_with(t.nranks, Peer::default);
    peers.iter_mut().for_each(Peer::reset);
    locals.clear();
    copies.clear();
    let mut step_err: Option<Error> = None;
    for s in sched.steps.iter_mut() {
        if let Action::SwapSend(o) | Action::SwapRecv { offer: o, .. } = &mut s.action {
            let link = t.link(o.peer);
            o.capable = o.capable
                && swap_capable(link, o.at, o.len)
                && (std::ptr::eq(o.src, o.at) || swap_capable(link, o.src, o.len));
        }
    }
    inplace.setup(t, sched);
    for (i, s) in sched.steps.iter().enumerate() {
        match &s.action {
            Action::Send { peer, len, .. } => {
                peers[*peer].send_q.push_back(i);
                peers[*peer].run_bytes += len;
            }
            Action::P2pSend { peer, len, .. } => {
                peers[*peer].send_q.push_back(i);
                peers[*peer].run_bytes += len;
                peers[*peer].p2p_sends += 1;
            }
            Action::Recv { peer, .. } | Action::SwapRecv { offer: Offer { peer, .. }, .. } => {
                peers[*peer].data_rq.push_back(i)
            }
            Action::SwapSend(o) => peers[o.peer].send_q.push_back(i),
            Action::P2pRecv { peer, len, .. } => {
                // Announce our count now: it reaches the sender while its data comes.
                peers[*peer].p2p_rq.push_back(i);
                let mut reply = Tx::control(K_P2P_REPLY, s.tag, *len);
                reply.flag = u8::from(inplace.paired_recv(i));
                peers[*peer].urgent.push_back(reply);
            }
            Action::Local(_) => locals.push(i),
            Action::Copy { .. } => copies.push((i, 0)),
        }
    }
    let ready = |done: &[bool], steps: &[Step<'_>], i: usize| steps[i].deps.iter().all(|&d| done[d]);

    let mut idle = Idle::default();
    loop {
        let seen = idle.seen(t);
        let mut progressed = t.progress_io()?;

        // Local steps whose inputs are ready.
        let mut k = 0;
        while k < locals.len() {
            let i = locals[k];
            if done[i] {
                // A fallback that an in-place exchange made unnecessary.
                locals.swap_remove(k);
            } else if ready(done, &sched.steps, i) {
                if let Action::Local(f) = &mut sched.steps[i].action {
                    f()?;
                }
                done[i] = true;
                remaining -= 1;
                locals.swap_remove(k);
                progressed = true;
            } else {
                k += 1;
            }
        }

        let me = t.rank;
        // Only sends that peers are reading are left: this rank helps copy them
        // (split copies). Not before: a rank that still receives or copies would
        // only trade its own work for its peer's; with both sides of an exchange
        // doing so, all_gather, all_to_allv and send_recv at 2 ranks measured
        // 0.7-0.9x (5 alternating runs), and about 1.0x with this rule.
        let help = remaining == peers.iter().map(|st| st.direct_wait.len()).sum::<usize>();
        for (p, st) in peers.iter_mut().enumerate() {
            if p == me {
                continue;
            }
            progressed |= pump_tx(t, p, st, sched, done, &mut remaining, &mut step_err, inplace, &ready, help)?;
            progressed |= pump_rx(t, p, st, sched, done, &mut remaining, &mut step_err, inplace, &ready, ctl, bounce)?;
        }

        // A piece of every local copy that may run: after the links, whose peers wait.
        let mut k = 0;
        while k < copies.len() {
            let (i, off) = copies[k];
            if done[i] {
                // A fallback that an in-place exchange made unnecessary.
                copies.swap_remove(k);
                continue;
            }
            if !ready(done, &sched.steps, i) {
                k += 1;
                continue;
            }
            let Action::Copy { src, dst, len, stream } = sched.steps[i].action else { unreachable!() };
            let overlap = (src as usize) < dst as usize + len && (dst as usize) < src as usize + len;
            let n = if overlap { len } else { PIECE.min(len - off) };
            // SAFETY: the schedule's contract: src and dst are valid for len bytes and
            // untouched by others until this step is done; overlapping ranges are
            // copied in one memmove.
            unsafe {
                if overlap {
                    std::ptr::copy(src, dst, len);
                } else {
                    copy::copy_stores(dst.add(off), src.add(off), n, stream);
                }
            }
            progressed = true;
            if off + n == len {
                done[i] = true;
                remaining -= 1;
                copies.swap_remove(k);
            } else {
                copies[k].1 = off + n;
                k += 1;
            }
        }

        // Done when every step is, and replies owed to peers have been written (and,
        // over TCP, handed to the OS).
        if remaining == 0 && peers.iter().all(|st| st.cur_tx.is_none() && st.urgent.is_empty()) && !t.unsent() {
            idle.unpublish(t);
            return Ok(step_err);
        }
        if progressed {
            idle.progressed(t);
            continue;
        }
        idle.wait(t, seen, ctl, || describe_waiting(t.rank, peers, sched, done))?;
    }
}

/// How a run waits when a poll found nothing to do: spin a little (a peer is
/// usually microseconds away), then yield, then sleep, as the transport's policy
/// says (see `SpinPolicy`), until the run's timeout.
#[derive(Default)]
pub(super) struct Idle {
    since: Option<Instant>,
    polls: u32,
    /// Set when the run first has to wait: reading the clock costs as much as a
    /// small message, so a run that never waits never reads it.
    deadline: Option<Instant>,
    last_peer_check: Option<Instant>,
    /// The next wait sleeps: the poll before it takes `Transport::seen` with activity.
    sleepy: bool,
    /// This wait has published whom it waits for (`Transport::set_waiting`), with
    /// `tick` advanced at every sleep.
    published: bool,
    tick: u32,
}

/// Whom a waiting run waits for: ranks whose data has not come (`from`), ranks that
/// do not read what it sends them (`to`), and details for the timeout message.
pub(super) struct Waits {
    pub from: Vec<usize>,
    pub to: Vec<usize>,
    pub detail: String,
}

impl Idle {
    /// The poll made progress: the next wait starts spinning afresh.
    pub(super) fn reset(&mut self) {
        self.since = None;
        self.polls = 0;
        self.sleepy = false;
    }

    /// As [`Idle::reset`], and the run no longer waits for anyone.
    pub(super) fn progressed(&mut self, t: &Transport) {
        self.unpublish(t);
        self.reset();
    }

    /// Takes back what [`Idle::wait`] published about this rank's wait.
    pub(super) fn unpublish(&mut self, t: &Transport) {
        if self.published {
            t.set_waiting(0);
            self.published = false;
        }
    }

    /// What the next poll must take before it looks for work (see `Transport::seen`).
    pub(super) fn seen(&self, t: &Transport) -> Seen {
        t.seen(self.sleepy)
    }

    /// One poll found nothing to do. `seen` is the doorbell read before the poll;
    /// `waiting` says whom the run waits for (asked only once the wait is slow). An
    /// error when the run times out, the communicator is aborted or a peer died; a
    /// timeout names the rank(s) it comes down to (`Transport::blame`).
    pub(super) fn wait(
        &mut self,
        t: &Transport,
        seen: Seen,
        ctl: &RunCtl<'_>,
        waiting: impl Fn() -> Waits,
    ) -> Result<()> {
        // The clock is read every 32 idle polls.
        self.polls += 1;
        if self.polls % 32 != 0 {
            std::hint::spin_loop();
            return Ok(());
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        let deadline = *self.deadline.get_or_insert(now + ctl.timeout);
        let last_peer_check = self.last_peer_check.get_or_insert(now);
        if ctl.abort.load(Ordering::Acquire) {
            return Err(Error::remote(format!("{}: the communicator was aborted", (ctl.what)())));
        }
        let idle = now - since;
        if idle < t.policy.spin {
            std::hint::spin_loop();
            return Ok(());
        }
        if now >= deadline {
            // A peer that already failed (this rank may have been the one stopped, and
            // resumed after its own deadline) is the story, not this timeout.
            t.check_flags().map_err(|e| e.context((ctl.what)()))?;
            let w = waiting();
            let mut start: Vec<usize> = w.from.iter().chain(&w.to).copied().collect();
            start.sort_unstable();
            start.dedup();
            let culprits = t.blame(&start);
            return Err(Error::timeout_blaming(
                culprits.first().copied(),
                format!(
                    "{}: timed out after {} ms; {}{}{}",
                    (ctl.what)(),
                    ctl.timeout.as_millis(),
                    waiting_message(t.rank, &w.from, &w.to),
                    w.detail,
                    crate::transport::cause_of(t.rank, &culprits, &start)
                ),
            ));
        }
        if now - *last_peer_check > Duration::from_millis(100) {
            *last_peer_check = now;
            let w = waiting();
            t.check_peers_of(&w.from).and_then(|()| t.check_peers_of(&w.to)).map_err(|e| e.context((ctl.what)()))?;
        }
        if idle < t.policy.yield_until {
            std::thread::yield_now();
            return Ok(());
        }
        // Sleeps from the next wait on, after a poll that saw the peers' activity.
        self.sleepy = true;
        // Say whom this rank waits for, for peers that time out to follow.
        let w = waiting();
        if let Some(&p) = w.from.first().or(w.to.first()) {
            self.tick = self.tick.wrapping_add(1);
            t.set_waiting(crate::transport::shm::wait_word(p as u32 + 1, self.tick));
            self.published = true;
        }
        let left = deadline.saturating_duration_since(now);
        t.sleep(seen, left.min(Duration::from_millis(20)));
        Ok(())
    }
}

/// Whether `[dst, dst + len)` overlaps the source of a point-to-point send in `sched`.
fn overlaps_a_send(sched: &Schedule<'_>, dst: *mut u8, len: usize) -> bool {
    overlaps_p2p(sched, dst, len, true)
}

/// Whether `[p, p + len)` overlaps the buffer of an fcclSend (`sends`) or of an
/// fcclRecv of `sched`.
fn overlaps_p2p(sched: &Schedule<'_>, p: *const u8, len: usize, sends: bool) -> bool {
    let (a, b) = (p as usize, p as usize + len);
    let hits = |q: usize, n: usize| q < b && a < q + n;
    sched.steps.iter().any(|s| match s.action {
        Action::P2pSend { src, len: n, .. } if sends => hits(src as usize, n),
        Action::P2pRecv { dst, len: n, .. } if !sends => hits(dst as usize, n),
        _ => false,
    })
}

fn describe_waiting(me: usize, peers: &[Peer], sched: &Schedule<'_>, done: &[bool]) -> Waits {
    let (mut from, mut to) = (Vec::new(), Vec::new());
    for (p, st) in peers.iter().enumerate() {
        if p == me {
            continue;
        }
        let waits_rx = st.cur_rx.is_some()
            || st.data_rq.iter().any(|&i| !done[i])
            || !st.p2p_rq.is_empty()
            || !st.awaiting_reply.is_empty()
            || !st.awaiting_payload.is_empty();
        if waits_rx {
            from.push(p);
        }
        if st.cur_tx.is_some() || !st.send_q.is_empty() || !st.urgent.is_empty() || !st.direct_wait.is_empty() {
            to.push(p);
        }
    }
    let mut s = String::new();
    if crate::log::enabled(crate::log::Level::Trace) {
        for (p, st) in peers.iter().enumerate().filter(|(p, _)| *p != me) {
            s += &format!(
                "\n  peer {p}: receiving {}, next receives {:?}, sending {}, next sends {:?}",
                st.cur_rx.as_ref().map_or("nothing".to_string(), |r| format!("{}/{} bytes", r.read, r.len)),
                st.data_rq
                    .iter()
                    .take(3)
                    .map(|&i| (
                        i,
                        sched.steps[i].tag,
                        sched.steps[i].deps.clone(),
                        sched.steps[i].deps.iter().all(|&d| done[d])
                    ))
                    .collect::<Vec<_>>(),
                st.cur_tx.as_ref().map_or("nothing".to_string(), |t| format!(
                    "{}/{} bytes (kind {})",
                    t.written,
                    t.payload + HDR,
                    t.kind
                )),
                st.send_q
                    .iter()
                    .take(3)
                    .map(|&i| (i, sched.steps[i].tag, sched.steps[i].deps.clone()))
                    .collect::<Vec<_>>(),
            );
        }
    }
    Waits { from, to, detail: s }
}

/// What a timed-out run waits for: the peers whose messages have not come (`from`)
/// and those that do not read what this rank sends them (`to`).
pub(super) fn waiting_message(me: usize, from: &[usize], to: &[usize]) -> String {
    let list = |v: &[usize]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
    let mut s = String::new();
    if !from.is_empty() {
        s += &format!("ranks that have not arrived (this rank {me} still waits for data from): {}", list(from));
    }
    if !to.is_empty() {
        if !s.is_empty() {
            s += "; ";
        }
        s += &format!("ranks not draining what rank {me} sends them: {}", list(to));
    }
    if s.is_empty() {
        s = "waiting on local steps".into();
    }
    s
}

#[allow(clippy::too_many_arguments)]
fn pump_tx(
    t: &mut Transport,
    p: usize,
    st: &mut Peer,
    sched: &mut Schedule<'_>,
    done: &mut [bool],
    remaining: &mut usize,
    step_err: &mut Option<Error>,
    inplace: &mut InPlace,
    ready: &impl Fn(&[bool], &[Step<'_>], usize) -> bool,
    help: bool,
) -> Result<bool> {
    let mut progressed = false;
    // Payload bytes this visit may still write (see PIECE).
    let mut budget = PIECE;
    if let Some(&(first, want, how)) = st.direct_wait.front() {
        let read = t.link(p).direct_reads_done();
        if read >= want {
            while let Some(&(i, k, _)) = st.direct_wait.front() {
                if k > read {
                    break;
                }
                st.direct_wait.pop_front();
                // Receives of the run may overwrite all of it now.
                inplace.release(i);
                done[i] = true;
                *remaining -= 1;
            }
            progressed = true;
        } else if help && share_piece(t.rank, t.link(p), st, sched, first, want, how)? {
            // A piece of the message the peer is reading, copied into its buffer.
            budget -= SHARE_PIECE.min(budget);
            progressed = true;
        } else if let Some(sent) = inplace.sent.get_mut(first) {
            // A send in place: receives of the run may overwrite what the peer has
            // read so far (it reads the message it reads now in order).
            let read = t.link(p).peer_read(want);
            if read > *sent {
                *sent = read;
                progressed = true;
            }
        }
    }
    while budget > 0 {
        if st.cur_tx.is_none() {
            let has_next = !st.urgent.is_empty() || st.send_q.front().is_some_and(|&i| ready(done, &sched.steps, i));
            if has_next {
                if let Some(gap) = t.link(p).rewind_gap(REWIND_MIN).filter(|&g| g >= HDR) {
                    st.cur_tx = Some(Tx::skip(gap));
                }
            }
        }
        if st.cur_tx.is_none() {
            if let Some(m) = st.urgent.pop_front() {
                st.cur_tx = Some(m);
            } else if let Some(&i) = st.send_q.front() {
                if done[i] {
                    // Exchanges through the rings that a swap made unnecessary.
                    st.send_q.pop_front();
                    continue;
                }
                if !ready(done, &sched.steps, i) {
                    break;
                }
                st.send_q.pop_front();
                let tag = sched.steps[i].tag;
                let direct = match sched.steps[i].action {
                    Action::Send { src, len, via: Via::Any | Via::Tee { .. }, .. } => direct_desc(t.link(p), src, len),
                    _ => None,
                };
                match sched.steps[i].action {
                    Action::Send { src, len, via, .. } if direct.is_some() => {
                        st.start_direct(t.link(p));
                        let tee = match via {
                            Via::Tee { dst, stream } => Some((dst, stream)),
                            _ => None,
                        };
                        let mut tx = Tx::direct(K_DIRECT, tag, src, len, i, direct.expect("matched"), tee);
                        if let Some((dst, _)) = tee.filter(|&(dst, _)| tee_shared(t.link(p), dst, len)) {
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
                        st.start_direct(t.link(p));
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
                        tx.awaits_read = t.link(p).counts_reads();
                        st.cur_tx = Some(tx)
                    }
                    Action::P2pSend { src, len, .. } => {
                        st.cur_tx = Some(if p2p_eager(t.link(p), sched, src, len) {
                            // Count and payload together; done when the receiver's count is here.
                            let mut tx = Tx::data(K_P2P_EAGER, tag, src, len, None);
                            tx.progress = inplace.sent.get(i).map(|_| i);
                            tx
                        } else {
                            // Announce the count; the payload follows once the receiver agrees.
                            Tx::control(K_P2P_HDR, tag, len)
                        });
                        match st.early_replies.pop_front() {
                            Some((want, pair)) => {
                                on_reply(t, p, st, sched, i, want, pair, done, remaining, step_err, inplace)
                            }
                            None => st.awaiting_reply.push_back(i),
                        }
                    }
                    _ => unreachable!("only sends are queued for sending"),
                }
            } else {
                break;
            }
        }
        let link = t.link(p);
        let tx = st.cur_tx.as_mut().expect("set above");
        let payload = tx.payload;
        let mut hdr = header(tx.kind, tx.tag, tx.announce);
        hdr[HDR_FLAG] = tx.flag;
        // Header and payload (padded to 8 bytes) are one stream of bytes: the ring
        // may wrap anywhere in either, including inside the header.
        let total = HDR + pad8(payload);
        while tx.written < total {
            let space = link.send_space();
            if space.is_empty() {
                break;
            }
            // A skip moves the write position without writing: never in pieces.
            let cap = if tx.kind == K_SKIP { usize::MAX } else { budget.max(HDR) };
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
                    let nt = data_n >= 4096 && ring_streaming(&mut st.stores, payload, st.run_bytes);
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
                inplace.sent[j] = (tx.written - HDR.min(tx.written)).min(payload);
            }
            progressed = true;
            if tx.kind != K_SKIP {
                budget = budget.saturating_sub(n);
                if budget == 0 {
                    break;
                }
            }
        }
        if tx.written < total {
            break;
        }
        if let (true, Some((dst, stream))) = (tx.is_direct(), tx.tee) {
            // The peer reads the message out of our buffer meanwhile: copy it to
            // our own destination (a broadcast root's recvbuff) in pieces.
            while tx.tee_done < tx.announce && budget > 0 {
                let k = budget.min(tx.announce - tx.tee_done);
                // SAFETY: src and dst are valid for the message (schedule contract)
                // and do not overlap (a tee never copies onto its source).
                unsafe { copy::copy_stores(dst.add(tx.tee_done), tx.src.add(tx.tee_done), k, stream) };
                tx.tee_done += k;
                budget -= k;
                progressed = true;
            }
            if tx.tee_done < tx.announce {
                break;
            }
        }
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
            done[i] = true;
            *remaining -= 1;
        }
        st.cur_tx = None;
    }
    Ok(progressed)
}

/// Copies one piece of direct message `seq` (step `i`, being read by the peer of
/// `link`) into the receiver's buffer, when the receiver offered a split copy and a
/// piece is left; true when it did.
fn share_piece(
    me: usize,
    link: &mut dyn crate::transport::Link,
    st: &mut Peer,
    sched: &Schedule<'_>,
    i: usize,
    seq: u64,
    help: Help,
) -> Result<bool> {
    let p2p_swap = matches!(help, Help::P2pSwap);
    // A swap's own side, and where the peer's input is.
    let (src, len, swap) = match sched.steps[i].action {
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
    if len < SHARE_MIN && swap.is_none() {
        return Ok(false);
    }
    let Some(slot) = link.share_slot() else { return Ok(false) };
    let sh = match st.share {
        Some(sh) if sh.seq == seq => sh,
        _ => {
            // Not offered (yet): the receiver publishes when it starts reading.
            let Some(dest) = slot.offer(seq) else { return Ok(false) };
            if dest.len != len {
                return Err(Error::internal(format!(
                    "rank {} offered to share a direct message of {} bytes, sent {len}",
                    link.peer(),
                    dest.len
                )));
            }
            let Some(dst) = link.share_target(&dest)? else { return Ok(false) };
            let sh = TxShare { seq, dst, stream: dest.stream };
            st.share = Some(sh);
            sh
        }
    };
    let Some((k, _)) = slot.take(seq, share_pieces(len), 1) else { return Ok(false) };
    let off = k as usize * SHARE_PIECE;
    let n = SHARE_PIECE.min(len - off);
    // SAFETY: src holds the message (len bytes), kept unmodified until the peer
    // reports the read; dst is the receiver's destination for it, mapped here, which
    // the receiver leaves alone until every piece is done, and this piece was taken
    // by this rank alone (the claim word). A swap's sides are our block and input
    // and the peer's, which nobody else touches until the peer reports every piece
    // done either.
    unsafe {
        if let Some((own, how, peer_input)) = swap {
            how.apply(me, link.peer(), own.at(off), peer_input.side(sh.dst).at(off), n)
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
    tests::SENDER_PIECES.with(|c| c.set(c.get() + 1));
    Ok(true)
}

/// Copies `k` bytes of a direct message at payload offset `off` (read from
/// `from + off`) to the sender's own destination `tee`, if the sender left it to
/// the pieces (see [`K_DIRECT`]); with streaming stores where the sink streams.
///
/// # Safety
/// `from + off` holds the k bytes; `tee` is the sender's destination, mapped here
/// for the whole message, whose piece at `off` nobody else writes (this rank took
/// it: the claim word, or the whole message unshared).
unsafe fn rx_tee(tee: Option<*mut u8>, sink: Sink, off: usize, from: *const u8, k: usize) {
    if let Some(tee) = tee {
        // SAFETY: the caller's contract.
        unsafe { copy::copy_stores(tee.add(off), from.wrapping_add(off), k, matches!(sink, Sink::Stream(_))) };
    }
}

/// One step of gated receive `rx` of a direct message from `src` (see
/// [`GATED_AHEAD`]): writes what the gate (`gate`, from [`InPlace::allowed`]) lets
/// it of what it has read, then reads a piece ahead and reports it read (the
/// whole message read: done, as for any direct message). Bytes (written, read).
fn gated_piece(link: &mut dyn crate::transport::Link, gate: usize, rx: &mut Rx, src: Source) -> Result<(usize, usize)> {
    let held = rx.held.get_or_insert_with(|| Held { buf: PooledBuf::take(GATED_AHEAD), written: 0 });
    let at = |o: usize| o % GATED_AHEAD;
    // The bytes overwritten here were just read by the receiver of this rank's send,
    // on another core: ordinary stores would first take every line back from its
    // cache, streaming ones only invalidate it. Side by side (4 ranks on 2 cores,
    // 32 MiB, 30 alternating runs): median 4.43 against 3.90 GB/s, and none of the
    // runs at 1.0-2.6 GB/s that ordinary stores had in 5 of 30 (the VM's state in
    // which lines cross between its CPUs slowly).
    let sink = match rx.sink {
        Sink::Copy(dst) => Sink::Stream(dst),
        sink => sink,
    };
    let w = (rx.read - held.written).min(gate.saturating_sub(held.written)).min(GATED_AHEAD - at(held.written));
    if w > 0 {
        // SAFETY: the held buffer has GATED_AHEAD bytes and w stops at its end;
        // offsets [written, read) of the message are there. The sink's destination
        // is valid for the message (schedule contract), and the gate keeps us below
        // what this rank's sends still read.
        unsafe {
            let from = std::slice::from_raw_parts(held.buf.as_ptr().add(at(held.written)), w);
            sink.consume(held.written, from);
        }
        held.written += w;
    }
    let d = gate.saturating_sub(rx.read).min(rx.len - rx.read).min(DIRECT_PIECE);
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
    let r =
        (rx.len - rx.read).min(GATED_AHEAD - (rx.read - held.written)).min(GATED_AHEAD - at(rx.read)).min(DIRECT_PIECE);
    if r > 0 {
        // SAFETY: r stops at the held buffer's end and leaves the unwritten bytes
        // alone (at most GATED_AHEAD are held).
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
    link: &mut dyn crate::transport::Link,
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
        Source::Remote(addr) => link.read_direct(addr + *read as u64, to, n)?,
    }
    *read += n;
    if *read < len {
        link.report_read(*read);
    } else {
        link.direct_read_done();
    }
    #[cfg(test)]
    tests::GATED_READ.with(|c| c.set(c.get() + n));
    Ok(())
}

/// Bytes gated receive `rx` may take now (see [`InPlace`]); unbounded once every
/// byte it may still write is free.
fn gate_room(inplace: &InPlace, sched: &Schedule<'_>, rx: &Rx) -> usize {
    let allowed = inplace.allowed(sched, rx.step);
    allowed.saturating_sub(rx.read)
}

/// Whether the receiver of a split copy takes pieces itself (tests make it leave
/// them all to the sender).
fn receiver_takes_pieces() -> bool {
    #[cfg(test)]
    if tests::RECEIVER_IDLE.with(|c| c.get()) {
        return false;
    }
    true
}

/// The descriptor of an fcclSend's payload when it goes by address: not when this
/// run also receives into that buffer (in place), which would overwrite it while
/// the peer reads it, unless `shares_cores` (ranks share cores) and it has at
/// least [`GATED_MIN`] bytes: then the receive writes only what the peer has
/// reported read (see [`InPlace`]).
fn p2p_direct(
    link: &dyn crate::transport::Link,
    sched: &Schedule<'_>,
    src: *const u8,
    len: usize,
    shares_cores: bool,
) -> Option<[u8; DESC]> {
    direct_desc(link, src, len).filter(|_| (shares_cores && len >= GATED_MIN) || !overlaps_p2p(sched, src, len, false))
}

/// Whether an fcclSend goes eagerly (count and payload in one message): small, and
/// not a payload the peer could read by address. Decided the same way when the
/// send starts and when the receiver's count arrives.
fn p2p_eager(link: &dyn crate::transport::Link, sched: &Schedule<'_>, src: *const u8, len: usize) -> bool {
    len <= EAGER_MAX && p2p_direct(link, sched, src, len, false).is_none()
}

/// The error of an fcclSend/fcclRecv pair whose sizes differ (both sides report it).
pub fn p2p_mismatch(what: P2pCall, sender: usize, receiver: usize, sent: usize, received: usize) -> Error {
    Error::mismatch(format!(
        "{what}: rank {sender} sends {sent} bytes but rank {receiver} receives {received} bytes; make the counts and types of the matching fcclSend/fcclRecv agree"
    ))
}

/// The receiver's count `want` for fcclSend step `i` (already started) to peer `p`:
/// an eager send is done (its payload went with its count); a large one sends its
/// payload when the counts agree, as a swap offer when the receive is half of an
/// exchange in place there (`pair`, see [`K_P2P_SWAP`]) and the send here. A
/// mismatch fails the step here, and the receiver's step there, when it reads our
/// count.
#[allow(clippy::too_many_arguments)]
fn on_reply(
    t: &mut Transport,
    p: usize,
    st: &mut Peer,
    sched: &Schedule<'_>,
    i: usize,
    want: usize,
    pair: bool,
    done: &mut [bool],
    remaining: &mut usize,
    step_err: &mut Option<Error>,
    inplace: &mut InPlace,
) {
    let Action::P2pSend { src, len: mine, what, .. } = sched.steps[i].action else { unreachable!() };
    let tag = sched.steps[i].tag;
    let eager = p2p_eager(t.link(p), sched, src, mine);
    let shares_cores = t.policy.shares_cores;
    if want != mine || eager {
        if want != mine {
            step_err.get_or_insert_with(|| p2p_mismatch(what, t.rank, p, mine, want));
            if !eager {
                // No payload follows: the buffer is free for receives.
                inplace.release(i);
            }
        }
        done[i] = true;
        *remaining -= 1;
    } else if pair && inplace.paired_send(i) {
        // Both ranks are in place: the payload is an offer of our block, which the
        // peer's receive swaps with its own (both sides decided alike).
        st.start_direct(t.link(p));
        let d = encode_desc(src, shared::lookup(src, mine));
        st.urgent.push_back(Tx::direct(K_P2P_SWAP, tag, src, mine, i, d, None));
    } else if let Some(d) = p2p_direct(t.link(p), sched, src, mine, shares_cores) {
        st.start_direct(t.link(p));
        let mut tx = Tx::direct(K_P2P_DIRECT, tag, src, mine, i, d, None);
        // Receives of this run wait for the peer's read reports (see GATED_AHEAD).
        tx.flag = u8::from(inplace.gated_send(i));
        st.urgent.push_back(tx);
    } else {
        let mut tx = Tx::data(K_P2P_DATA, tag, src, mine, Some(i));
        tx.progress = inplace.sent.get(i).map(|_| i);
        st.urgent.push_back(tx);
    }
}

#[allow(clippy::too_many_arguments)]
fn pump_rx(
    t: &mut Transport,
    p: usize,
    st: &mut Peer,
    sched: &mut Schedule<'_>,
    done: &mut [bool],
    remaining: &mut usize,
    step_err: &mut Option<Error>,
    inplace: &mut InPlace,
    ready: &impl Fn(&[bool], &[Step<'_>], usize) -> bool,
    ctl: &RunCtl<'_>,
    bounce: &mut Vec<u8>,
) -> Result<bool> {
    let mut progressed = false;
    // Payload bytes this visit may still take (see PIECE).
    let mut budget = PIECE;
    while budget > 0 {
        if st.cur_rx.is_none() {
            let (link, hdr) = t.link_and_header(p);
            // The rest of a skip comes first: an earlier run may have ended inside it.
            if hdr.skip > 0 {
                progressed |= hdr.release_skip(link);
                if hdr.skip > 0 {
                    break;
                }
            }
            // The header may straddle the ring's wrap point: gather it first. It
            // stays pending (across runs) until the step it is for can take it.
            progressed |= gather(link, &mut hdr.bytes, &mut hdr.got);
            if hdr.got < HDR {
                break;
            }
            let (kind, tag, len) = parse_header(&hdr.bytes);
            match kind {
                K_DATA | K_DIRECT | K_SWAP => {
                    // Exchanges through the rings that a swap made unnecessary.
                    while st.data_rq.front().is_some_and(|&i| done[i]) {
                        st.data_rq.pop_front();
                    }
                    let Some(&i) = st.data_rq.front() else { break };
                    if !ready(done, &sched.steps, i) {
                        break;
                    }
                    // A swap offer where a message is due, or the other way round,
                    // is a desynchronised stream, reported as such below.
                    let (want, sink, swap) = match sched.steps[i].action {
                        Action::Recv { len, sink, .. } => (len, sink, None),
                        Action::SwapRecv { offer: Offer { len, at, src, how, .. }, .. } => {
                            let own = Side { dst: at, src };
                            (len, Sink::Discard, Some(RxSwap { own, how, peer_input: PeerInput::Unknown }))
                        }
                        _ => unreachable!("only receives are queued for data"),
                    };
                    let want_tag = sched.steps[i].tag;
                    if (want_tag != ANY_TAG && tag != want_tag) || len != want || (kind == K_SWAP) != swap.is_some() {
                        t.check_flags().map_err(|e| e.context((ctl.what)()))?;
                        return Err(Error::mismatch(format!(
                            "{}: rank {p} sent a message for its collective #{tag} of {len} bytes while rank {} expected collective #{want_tag} with {want} bytes: the ranks called different collectives, counts or types. The communicator is unusable now; destroy it (checkMode, on unless FERROCCL_CHECK=0, detects this before any data moves)",
                            (ctl.what)(), t.rank
                        )));
                    }
                    st.data_rq.pop_front();
                    hdr.got = 0;
                    let direct = (kind != K_DATA).then(|| DirectRx::new(kind, hdr.bytes[HDR_FLAG]));
                    st.cur_rx = Some(Rx { direct, swap, ..Rx::new(i, len, sink) });
                }
                K_SKIP => {
                    // Released above, as far as published; kept with the header
                    // state, since this run may end before the writer publishes all.
                    hdr.got = 0;
                    hdr.skip = len;
                    progressed = true;
                    continue;
                }
                K_P2P_HDR => {
                    let Some(&i) = st.p2p_rq.front() else { break };
                    st.p2p_rq.pop_front();
                    hdr.got = 0;
                    // Our count went to the sender when the run started: both sides
                    // now know whether the payload comes.
                    let Action::P2pRecv { len: want, what, .. } = sched.steps[i].action else { unreachable!() };
                    if len != want {
                        step_err.get_or_insert_with(|| p2p_mismatch(what, p, t.rank, len, want));
                        done[i] = true;
                        *remaining -= 1;
                    } else if len == 0 {
                        done[i] = true;
                        *remaining -= 1;
                    } else {
                        st.awaiting_payload.push_back(i);
                    }
                    progressed = true;
                    continue;
                }
                K_P2P_EAGER => {
                    let Some(&i) = st.p2p_rq.front() else { break };
                    st.p2p_rq.pop_front();
                    hdr.got = 0;
                    let Action::P2pRecv { dst, len: want, what, .. } = sched.steps[i].action else { unreachable!() };
                    let sink = if len == want {
                        Sink::Copy(dst)
                    } else {
                        step_err.get_or_insert_with(|| p2p_mismatch(what, p, t.rank, len, want));
                        Sink::Discard
                    };
                    // The step is done once the payload that follows has been read.
                    let gated = inplace.gated(i);
                    st.cur_rx = Some(Rx { gated, ..Rx::new(i, len, sink) });
                }
                K_P2P_REPLY => {
                    if st.replies_read == st.p2p_sends {
                        // For a send of the peer's next run (it finished this one):
                        // stays pending until then.
                        break;
                    }
                    st.replies_read += 1;
                    hdr.got = 0;
                    let pair = hdr.bytes[HDR_FLAG] != 0;
                    match st.awaiting_reply.pop_front() {
                        Some(i) => on_reply(t, p, st, sched, i, len, pair, done, remaining, step_err, inplace),
                        // The send it answers waits behind other steps: kept for it.
                        None => st.early_replies.push_back((len, pair)),
                    }
                    progressed = true;
                    continue;
                }
                K_P2P_DATA | K_P2P_DIRECT | K_P2P_SWAP => {
                    let Some(i) = st.awaiting_payload.pop_front() else {
                        return Err(Error::internal(format!("{}: unexpected payload from rank {p}", (ctl.what)())));
                    };
                    let Action::P2pRecv { dst, len: want, .. } = sched.steps[i].action else { unreachable!() };
                    if len != want || (kind == K_P2P_SWAP && !inplace.paired_recv(i)) {
                        return Err(Error::internal(format!(
                            "{}: payload of {len} bytes from rank {p} (kind {kind}), agreed {want}",
                            (ctl.what)()
                        )));
                    }
                    hdr.got = 0;
                    // Large payloads are streamed into the user's buffer, as collectives'
                    // are, unless it is also what this rank sends (in place): those lines
                    // are in cache, and streaming stores would evict them.
                    // Nor into a buffer the previous call wrote (`reuse`).
                    let stream = len >= crate::env::stream_min()
                        && !overlaps_a_send(sched, dst, len)
                        && !super::reuse::cached(dst, len);
                    let sink = if stream { Sink::Stream(dst) } else { Sink::Copy(dst) };
                    let direct = (kind != K_P2P_DATA).then(|| DirectRx::new(kind, 0));
                    // The sender's receives wait for our read reports (see GATED_AHEAD).
                    let reports = kind == K_P2P_DIRECT && hdr.bytes[HDR_FLAG] != 0;
                    // A swap offer: our block, which the exchange fills.
                    let own = Side { dst, src: dst };
                    let swap = (kind == K_P2P_SWAP).then_some(RxSwap {
                        own,
                        how: Exchange::Swap,
                        peer_input: PeerInput::Block,
                    });
                    let gated = swap.is_none() && inplace.gated(i);
                    st.cur_rx = Some(Rx { direct, swap, gated, reports, ..Rx::new(i, len, sink) });
                }
                k => {
                    return Err(Error::internal(format!(
                        "{}: corrupt stream from rank {p} (message kind {k}); the communicator is unusable",
                        (ctl.what)()
                    )))
                }
            }
            progressed = true;
        }
        let rx = st.cur_rx.as_mut().expect("set above");
        let me = t.rank;
        let link = t.link(p);
        if let Some(d) = rx.direct.as_mut() {
            let src = match d.src {
                Some(src) => src,
                None => {
                    // The descriptor may wrap around the ring: gather it first.
                    progressed |= gather(link, &mut d.desc[..d.want], &mut d.got);
                    if d.got < d.want {
                        break;
                    }
                    let (addr, region) = decode_desc(d.desc[..DESC].try_into().expect("one descriptor"));
                    if let Some(RxSwap { own, .. }) = rx.swap {
                        let i = rx.step;
                        // A swap offer: exchanged in place when both sides can (the
                        // peer's address is 0 when it cannot); otherwise the steps
                        // for both placements. Both sides decide alike. An fcclRecv
                        // gets an offer only when both sides agreed to swap.
                        let both = match sched.steps[i].action {
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
                                let ranges: &[(usize, usize)] =
                                    if apart == fallback { &[fallback] } else { &[apart, fallback] };
                                for &(a, b) in ranges.iter().filter(|&&r| Some(r) != taken) {
                                    done[a..b].fill(true);
                                    *remaining -= b - a;
                                }
                                both
                            }
                            Action::P2pRecv { .. } => true,
                            _ => unreachable!("swap offers go to swap steps"),
                        };
                        // The peer's input: its block, or (a reduction out of place) the
                        // second descriptor's.
                        let peer_input = if !both || d.want == DESC {
                            PeerInput::Block
                        } else {
                            let (saddr, sregion) = decode_desc(d.desc[DESC..].try_into().expect("one descriptor"));
                            if saddr == addr {
                                PeerInput::Block
                            } else {
                                let at = t.link(p).direct_source(saddr, rx.len, sregion.as_ref());
                                PeerInput::At(at.map_err(|e| e.context((ctl.what)()))?.ok_or_else(|| {
                                    Error::internal(format!("{}: rank {p}'s input could not be mapped", (ctl.what)()))
                                })?)
                            }
                        };
                        if both && swap_offers(t.rank, p) {
                            let link = t.link(p);
                            let target =
                                link.swap_target(addr, rx.len, region.as_ref()).map_err(|e| e.context((ctl.what)()))?;
                            let slot = link.share_offer(own.dst, rx.len, false).ok_or_else(|| {
                                Error::internal(format!("{}: a swap with rank {p} could not be offered", (ctl.what)()))
                            })?;
                            rx.share = Some((slot, false));
                            rx.swap = Some(RxSwap { peer_input, ..rx.swap.expect("matched") });
                            d.src = Some(Source::Ptr(target));
                            continue;
                        }
                        if both {
                            // The peer swaps; this rank helps with its offer step, which
                            // needs the peer's input.
                            if let Some(Step { action: Action::SwapSend(o), .. }) =
                                sched.steps.get_mut(i.wrapping_sub(1))
                            {
                                o.peer_input = peer_input;
                            }
                        }
                        // The peer swaps (reporting our offer read once it has), or the
                        // rings exchange: nothing more to read here.
                        t.link(p).direct_read_done();
                        done[i] = true;
                        *remaining -= 1;
                        st.cur_rx = None;
                        progressed = true;
                        continue;
                    }
                    let src =
                        match link.direct_source(addr, rx.len, region.as_ref()).map_err(|e| e.context((ctl.what)()))? {
                            Some(ptr) => Source::Ptr(ptr),
                            None => Source::Remote(addr),
                        };
                    d.src = Some(src);
                    if d.want == 2 * DESC {
                        // The sender's own copy, which our pieces write too.
                        let (taddr, tregion) = decode_desc(d.desc[DESC..].try_into().expect("one descriptor"));
                        let tee = link.tee_target(taddr, rx.len, tregion.as_ref());
                        rx.tee = Some(tee.map_err(|e| e.context((ctl.what)()))?);
                    }
                    // A large copy into a buffer the sender can write too: offered
                    // to the sender to share.
                    // Not where sends of the run still read (they would race the sender).
                    if rx.len >= SHARE_MIN && !rx.gated {
                        if let Sink::Copy(dst) | Sink::Stream(dst) = rx.sink {
                            let stream = matches!(rx.sink, Sink::Stream(_));
                            rx.share = link.share_offer(dst, rx.len, stream).map(|slot| (slot, false));
                        }
                    }
                    src
                }
            };
            if rx.gated && rx.reports {
                let i = rx.step;
                let (w, r) =
                    gated_piece(link, inplace.allowed(sched, i), rx, src).map_err(|e| e.context((ctl.what)()))?;
                let written = rx.held.as_ref().map_or(0, |h| h.written);
                if w + r > 0 {
                    budget = budget.saturating_sub(w.max(r));
                    progressed = true;
                }
                if written < rx.len {
                    if w + r > 0 {
                        continue;
                    }
                    // Waits for this rank's sends to leave the buffer.
                    break;
                }
                done[i] = true;
                *remaining -= 1;
                st.cur_rx = None;
                continue;
            }
            // One piece per visit, so that other peers progress meanwhile: the next
            // one, or in a split copy the next one nobody has taken.
            let (off, k) = match rx.share.as_mut() {
                None => {
                    let k = DIRECT_PIECE.min(rx.len - rx.read);
                    let k = if rx.gated { k.min(gate_room(inplace, sched, rx)) } else { k };
                    if k == 0 && rx.read < rx.len {
                        // Waits for this rank's sends to leave the buffer.
                        break;
                    }
                    (rx.read, k)
                }
                Some((slot, taken_all)) => {
                    let pieces = share_pieces(rx.len);
                    let mine = !*taken_all && receiver_takes_pieces();
                    // As much as an unshared read takes per visit: the sender, when
                    // it helps, takes single pieces meanwhile.
                    let most = (DIRECT_PIECE / SHARE_PIECE) as u64;
                    match mine.then(|| slot.take(slot.next_read(), pieces, most)).flatten() {
                        Some((c, m)) => {
                            let off = c as usize * SHARE_PIECE;
                            (off, (m as usize * SHARE_PIECE).min(rx.len - off))
                        }
                        None => {
                            *taken_all = mine;
                            if slot.pieces_done() < pieces {
                                // The sender is copying the last pieces it took.
                                break;
                            }
                            (0, 0)
                        }
                    }
                }
            };
            if k > 0 {
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
                        link.read_direct(addr + off as u64, unsafe { dst.add(off) }, k)
                            .map_err(|e| e.context((ctl.what)()))?;
                        // SAFETY: as above; the piece just read is at dst + off.
                        unsafe { rx_tee(rx.tee, rx.sink, off, dst, k) };
                    }
                    (Source::Remote(addr), sink) => {
                        bounce.resize(DIRECT_PIECE, 0);
                        link.read_direct(addr + off as u64, bounce.as_mut_ptr(), k)
                            .map_err(|e| e.context((ctl.what)()))?;
                        // SAFETY: as for stream data.
                        unsafe { sink.consume(off, &bounce[..k]) };
                        // SAFETY: the bounce piece holds the k bytes of offset off.
                        unsafe { rx_tee(rx.tee, rx.sink, off, bounce.as_ptr().wrapping_sub(off), k) };
                    }
                }
                if let Some((slot, _)) = rx.share {
                    slot.pieces_copied(k.div_ceil(SHARE_PIECE) as u64);
                }
                rx.read += k;
                if rx.reports && rx.share.is_none() && rx.read < rx.len {
                    // Read in order: the sender's receives may overwrite this much.
                    link.report_read(rx.read);
                }
                budget = budget.saturating_sub(k);
                progressed = true;
                if rx.share.is_some() || rx.read < rx.len {
                    // More pieces, or a split copy's end to see.
                    continue;
                }
            }
            link.direct_read_done();
            done[rx.step] = true;
            *remaining -= 1;
            st.cur_rx = None;
            continue;
        }
        let total = pad8(rx.len);
        while rx.read < total {
            let avail = link.recv_avail();
            if avail.is_empty() {
                break;
            }
            // Dropped bytes (a payload of a mismatched size) cost no copy: released at once.
            let cap = if matches!(rx.sink, Sink::Discard) { usize::MAX } else { budget };
            let cap = if rx.gated { cap.min(gate_room(inplace, sched, rx)) } else { cap };
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
            progressed = true;
            if !matches!(rx.sink, Sink::Discard) {
                budget = budget.saturating_sub(n);
                if budget == 0 {
                    break;
                }
            }
        }
        if rx.read < total {
            break;
        }
        done[rx.step] = true;
        *remaining -= 1;
        st.cur_rx = None;
    }
    Ok(progressed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::inproc;
    use std::cell::Cell;

    thread_local! {
        /// Pieces of split copies this thread copied as the sender.
        pub(super) static SENDER_PIECES: Cell<u64> = const { Cell::new(0) };
        /// The receiver leaves every piece of a split copy to the sender.
        pub(super) static RECEIVER_IDLE: Cell<bool> = const { Cell::new(false) };
        /// This thread's rank says it cannot swap (its offers carry address 0).
        pub(super) static SWAP_REFUSED: Cell<bool> = const { Cell::new(false) };
        /// This thread's rank sends nothing by address (as over links without
        /// single copy).
        pub(super) static DIRECT_REFUSED: Cell<bool> = const { Cell::new(false) };
        /// Bytes this thread's gated receives of messages sent by address read
        /// (see [`gated_piece`]).
        pub(super) static GATED_READ: Cell<usize> = const { Cell::new(0) };
    }

    /// One direct message of `len` bytes from rank 0 to rank 1 of a thread pair,
    /// into a sink of `kind` (0 copy, 1 streaming copy, 2 sum reduction); the bytes
    /// rank 1 ends with and the pieces rank 0 copied.
    fn one_message(len: usize, kind: u8, idle: bool) -> (Vec<u8>, Vec<u8>, u64) {
        let (src, dst, _, pieces) = one_message_tee(len, kind, idle, false);
        (src, dst, pieces)
    }

    /// As [`one_message`]; with `tee`, the sender also wants the message in a
    /// buffer of its own (a broadcast root out of place), which comes back fourth.
    fn one_message_tee(len: usize, kind: u8, idle: bool, tee: bool) -> (Vec<u8>, Vec<u8>, Vec<u8>, u64) {
        let ts = inproc::build(2).expect("links");
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 65536) as u8).collect();
        let mut dst = vec![1u8; len];
        let mut own = vec![2u8; if tee { len } else { 0 }];
        let abort = AtomicBool::new(false);
        let pieces = std::thread::scope(|s| {
            let mut it = ts.into_iter();
            let (mut t0, mut t1) = (it.next().unwrap(), it.next().unwrap());
            let (src, dst, own, abort) = (&src, &mut dst, &mut own, &abort);
            let ctl = move || RunCtl { timeout: Duration::from_secs(20), abort, what: &|| "test".to_string() };
            let sender = s.spawn(move || {
                SENDER_PIECES.with(|c| c.set(0));
                let mut sched = Schedule::new(1);
                if tee {
                    sched.send_tee(1, src.as_ptr(), len, own.as_mut_ptr(), kind == 1);
                } else {
                    sched.send(1, src.as_ptr(), len, &[]);
                }
                assert!(run(&mut t0, &mut sched, &ctl()).expect("send").is_none());
                SENDER_PIECES.with(|c| c.get())
            });
            s.spawn(move || {
                RECEIVER_IDLE.with(|c| c.set(idle));
                let p = dst.as_mut_ptr();
                let sink = match kind {
                    0 => Sink::Copy(p),
                    1 => Sink::Stream(p),
                    _ => Sink::Reduce { acc: p, dtype: DataType::Uint8, op: RedOp::Sum },
                };
                let mut sched = Schedule::new(1);
                sched.recv(0, len, sink, &[]);
                assert!(run(&mut t1, &mut sched, &ctl()).expect("recv").is_none());
            });
            sender.join().expect("sender")
        });
        (src, dst, own, pieces)
    }

    /// A receiver that leaves every piece to the sender gets the whole message,
    /// the last piece short included, copied by the sender alone.
    #[test]
    fn the_sender_can_copy_every_piece() {
        for (len, kind) in [(SHARE_MIN, 0), (5 * SHARE_PIECE + 12_344, 1), (3 << 20, 0)] {
            let (src, dst, pieces) = one_message(len, kind, true);
            assert!(dst == src, "{len} bytes, sink {kind}");
            assert_eq!(pieces, share_pieces(len), "{len} bytes: the sender copied every piece");
        }
    }

    /// A sender that wants its own copy of a large message (a broadcast root out of
    /// place) leaves it to the pieces: whoever copies a piece writes both
    /// destinations, the sender alone when the receiver is idle; both exact.
    #[test]
    fn the_senders_own_copy_is_written_with_the_pieces() {
        for (len, kind, idle) in [(SHARE_MIN, 0, true), (5 * SHARE_PIECE + 12_344, 1, false), (6 << 20, 0, false)] {
            let (src, dst, own, pieces) = one_message_tee(len, kind, idle, true);
            assert!(dst == src && own == src, "{len} bytes, sink {kind}, idle {idle}");
            if idle {
                assert_eq!(pieces, share_pieces(len), "{len} bytes: the sender copied every piece");
            }
        }
        // Below a split copy's size the sender copies its own alone, as before.
        let (src, dst, own, pieces) = one_message_tee(SHARE_MIN - 8, 0, true, true);
        assert!(dst == src && own == src);
        assert_eq!(pieces, 0);
    }

    /// Both sides take pieces: the result is exact whoever copied what.
    #[test]
    fn sender_and_receiver_split_a_copy_exactly() {
        for len in [SHARE_MIN + 8, 16 << 20] {
            for _ in 0..5 {
                let (src, dst, pieces) = one_message(len, 0, false);
                assert!(dst == src, "{len} bytes");
                assert!(pieces <= share_pieces(len));
            }
        }
    }

    /// One in-place exchange of `len` bytes between the blocks of a thread pair
    /// (`Schedule::swap`, with the exchange through the rings as the fallback).
    /// Rank 1 offers (it leaves every piece to rank 0 when `idle`); rank `refuse`
    /// says it cannot swap. Whether each rank ends with the other's block, and the
    /// pieces rank 0 swapped.
    fn one_swap(len: usize, idle: bool, refuse: Option<usize>) -> (bool, u64) {
        let pattern = |r: usize| -> Vec<u8> { (0..len).map(|i| (i * (3 + 4 * r) + i / 4099 + r) as u8).collect() };
        let (bufs, pieces) = one_exchange(len, Exchange::Swap, idle, refuse, pattern, false, [false; 2]);
        (bufs[0] == pattern(1) && bufs[1] == pattern(0), pieces)
    }

    /// As [`one_swap`], for an fcclSend and an fcclRecv of each rank with the other
    /// over its one buffer (rank 0 posts the receive first).
    fn one_p2p_swap(len: usize, idle: bool, refuse: Option<usize>) -> (bool, u64) {
        let pattern = |r: usize| -> Vec<u8> { (0..len).map(|i| (i * (5 + 2 * r) + i / 4093 + r) as u8).collect() };
        let (bufs, pieces) = one_exchange(len, Exchange::Swap, idle, refuse, pattern, true, [false; 2]);
        (bufs[0] == pattern(1) && bufs[1] == pattern(0), pieces)
    }

    /// One in-place exchange `how` of `len` bytes between the blocks of a thread
    /// pair, which start as `pattern(rank)`: both blocks after it, and the pieces
    /// rank 0 took. As for [`one_swap`] otherwise.
    fn one_exchange(
        len: usize,
        how: Exchange,
        idle: bool,
        refuse: Option<usize>,
        pattern: impl Fn(usize) -> Vec<u8>,
        p2p: bool,
        apart: [bool; 2],
    ) -> ([Vec<u8>; 2], u64) {
        assert!(swap_offers(1, 0) && !swap_offers(0, 1));
        let ts = inproc::build(2).expect("links");
        // A rank `apart` (out of place) starts with its input in a buffer of its own
        // and junk in its block.
        let inputs: Vec<Vec<u8>> = (0..2).map(|r| if apart[r] { pattern(r) } else { Vec::new() }).collect();
        let mut bufs = [0, 1].map(|r| if apart[r] { vec![0xA5; len] } else { pattern(r) });
        let inputs = &inputs;
        let abort = AtomicBool::new(false);
        let pieces = std::thread::scope(|s| {
            let abort = &abort;
            let ctl = move || RunCtl { timeout: Duration::from_secs(20), abort, what: &|| "test".to_string() };
            let handles: Vec<_> = ts
                .into_iter()
                .zip(bufs.iter_mut())
                .enumerate()
                .map(|(r, (mut t, buf))| {
                    s.spawn(move || {
                        SENDER_PIECES.with(|c| c.set(0));
                        RECEIVER_IDLE.with(|c| c.set(idle && r == 1));
                        SWAP_REFUSED.with(|c| c.set(refuse == Some(r)));
                        let (peer, at) = (1 - r, buf.as_mut_ptr());
                        let src = if apart[r] { inputs[r].as_ptr() } else { at as *const u8 };
                        let mut sched = Schedule::new(1);
                        if p2p {
                            let what = |send| P2pCall { send, count: len, dtype: DataType::Uint8, peer };
                            if r == 0 {
                                sched.p2p_recv(peer, at, len, what(false));
                            }
                            sched.p2p_send(peer, at, len, what(true));
                            if r == 1 {
                                sched.p2p_recv(peer, at, len, what(false));
                            }
                            assert!(run(&mut t, &mut sched, &ctl()).expect("exchange").is_none());
                            return SENDER_PIECES.with(|c| c.get());
                        }
                        sched.swap(
                            peer,
                            at,
                            src,
                            len,
                            how,
                            |_| {},
                            |s| {
                                for a in (0..len).step_by(64 << 10) {
                                    let m = (64 << 10).min(len - a);
                                    // SAFETY: inside the block.
                                    let p = unsafe { at.add(a) };
                                    let sent = s.send_staged(peer, p, m, &[]);
                                    s.recv(peer, m, Sink::Copy(p), &[sent]);
                                }
                            },
                        );
                        assert!(run(&mut t, &mut sched, &ctl()).expect("swap").is_none());
                        SENDER_PIECES.with(|c| c.get())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("rank")).next().expect("rank 0")
        });
        (bufs, pieces)
    }

    /// A reducing exchange leaves the reduction in both blocks, whoever reduced
    /// which piece, the helper alone included (int32 max, float32 sum, float64 avg).
    #[test]
    fn reducing_exchanges_leave_the_result_in_both_blocks() {
        let ints = |r: usize, n: usize| -> Vec<i64> {
            (0..n as i64).map(|i| (i * 7919 + r as i64 * 104_729) % 100_003 - 50_000).collect()
        };
        for (dtype, op, es) in
            [(DataType::Int32, RedOp::Max, 4), (DataType::Float32, RedOp::Sum, 4), (DataType::Float64, RedOp::Avg, 8)]
        {
            for (len, idle) in [(SHARE_MIN + 8, false), (5 << 20, false), (3 * SHARE_PIECE + 16, true)] {
                let n = len / es;
                let bytes = |r: usize| -> Vec<u8> {
                    ints(r, n)
                        .into_iter()
                        .flat_map(|v| match dtype {
                            DataType::Int32 => (v as i32).to_le_bytes().to_vec(),
                            DataType::Float32 => (v as f32 * 0.25).to_le_bytes().to_vec(),
                            _ => (v as f64 * 0.5).to_le_bytes().to_vec(),
                        })
                        .collect()
                };
                let (bufs, pieces) = one_exchange(
                    len,
                    Exchange::Reduce { dtype, op, stream: false },
                    idle,
                    None,
                    bytes,
                    false,
                    [false; 2],
                );
                let mut want = bytes(0);
                reduce::reduce_inplace(dtype, op, &mut want, &bytes(1));
                reduce::finish_inplace(dtype, op, 2, &mut want);
                assert!(bufs[0] == want && bufs[1] == want, "{dtype} {op:?}, {len} bytes, idle offerer {idle}");
                if idle {
                    assert_eq!(pieces, share_pieces(len), "the helper reduced every piece");
                }
            }
        }
    }

    /// Out of place on either rank or both, a reducing exchange reads each input
    /// where it is and leaves the reduction in both blocks, whoever reduced which
    /// piece (the helper alone included).
    #[test]
    fn reductions_out_of_place_leave_the_result_in_both_blocks() {
        let (dtype, op) = (DataType::Int32, RedOp::Sum);
        let ints = |r: usize, len: usize| -> Vec<u8> {
            (0..len / 4).flat_map(|i| ((i as i32).wrapping_mul(7919) ^ (r as i32 * 104_729)).to_le_bytes()).collect()
        };
        for apart in [[true, true], [true, false], [false, true]] {
            for (len, idle) in [(SHARE_MIN + 8, false), (3 << 20, false), (3 * SHARE_PIECE + 16, true)] {
                let how = Exchange::Reduce { dtype, op, stream: true };
                let (bufs, pieces) = one_exchange(len, how, idle, None, |r| ints(r, len), false, apart);
                let mut want = ints(0, len);
                reduce::reduce_inplace(dtype, op, &mut want, &ints(1, len));
                assert!(bufs[0] == want && bufs[1] == want, "out of place {apart:?}, {len} bytes, idle {idle}");
                if idle {
                    assert_eq!(pieces, share_pieces(len), "the helper reduced every piece");
                }
            }
        }
    }

    /// Both ranks swap pieces of the pair of blocks: exact whoever swapped what,
    /// over and over, the last piece short included.
    #[test]
    fn swaps_exchange_blocks_exactly() {
        for len in [SHARE_MIN, 5 * SHARE_PIECE + 12_344, 16 << 20] {
            for _ in 0..3 {
                let (exact, pieces) = one_swap(len, false, None);
                assert!(exact, "{len} bytes");
                assert!(pieces <= share_pieces(len));
            }
        }
    }

    /// An offerer that leaves every piece to its peer still ends with the peer's
    /// block: the peer swapped them all, into both buffers.
    #[test]
    fn the_helper_can_swap_every_piece() {
        for len in [SHARE_MIN, 3 * SHARE_PIECE + 8] {
            let (exact, pieces) = one_swap(len, true, None);
            assert!(exact, "{len} bytes");
            assert_eq!(pieces, share_pieces(len), "{len} bytes: rank 0 swapped every piece");
        }
    }

    /// When either rank cannot swap, both exchange through the rings instead (the
    /// offerer's idleness, which would stall a swap, does not matter then).
    #[test]
    fn a_rank_that_cannot_swap_makes_both_exchange_through_the_rings() {
        for refuse in [0, 1] {
            for len in [SHARE_MIN, 3 << 20] {
                let (exact, pieces) = one_swap(len, true, Some(refuse));
                assert!(exact, "{len} bytes, rank {refuse} refusing");
                assert_eq!(pieces, 0, "no swap");
            }
        }
    }

    /// An fcclSend and an fcclRecv with one peer over one buffer, on both ranks,
    /// swap the two buffers: exactly, whoever swapped which piece (the helper alone
    /// included); when either rank cannot swap, through the rings, each receive
    /// writing only what its own send has sent, still exactly.
    #[test]
    fn in_place_send_recv_pairs_swap_or_go_through_the_rings() {
        for len in [EAGER_MAX + 1, 5 * SHARE_PIECE + 12_344, 9 << 20] {
            let (exact, pieces) = one_p2p_swap(len, false, None);
            assert!(exact, "{len} bytes");
            assert!(pieces <= share_pieces(len));
            let (exact, pieces) = one_p2p_swap(len, true, None);
            assert!(exact, "{len} bytes, idle offerer");
            assert_eq!(pieces, share_pieces(len), "{len} bytes: rank 0 swapped every piece");
            for refuse in [0, 1] {
                let (exact, pieces) = one_p2p_swap(len, true, Some(refuse));
                assert!(exact, "{len} bytes, rank {refuse} refusing");
                assert_eq!(pieces, 0, "no swap");
            }
        }
    }

    /// A ring of thread ranks shifts messages several times larger than the rings
    /// (256 KiB) and than a gated receive reads ahead (GATED_AHEAD) through one
    /// buffer each, the receive at or below the send (which waits for the send's
    /// progress) or above it (the send's payload is copied aside): never
    /// deadlocks, and every rank ends with its predecessor's message and the rest
    /// of its buffer untouched. Thread ranks could swap, but at 3 and 4 ranks nobody
    /// exchanges with one peer. Sent by address (the receive at or below the send
    /// then reads ahead of its gate, and reads every byte that way), by address on
    /// some ranks only, and through the rings.
    #[test]
    fn in_place_ring_shifts_larger_than_the_rings_finish_right() {
        let len = GATED_MIN + (1 << 20) + 4;
        let fill = |r: usize| -> Vec<u8> { (0..len + 8192).map(|i| (i % 253 + 31 * r + i / 9973) as u8).collect() };
        for (n, refused) in [(3usize, 0b000), (4, 0b0000), (3, 0b111), (4, 0b1111), (4, 0b0101), (3, 0b001)] {
            for (send_at, recv_at) in [(0, 0), (8192, 0), (4096, 1000), (0, 5000)] {
                let ts = inproc::build_with_ring(n, 256 << 10).expect("links");
                let mut bufs: Vec<Vec<u8>> = (0..n).map(fill).collect();
                let abort = AtomicBool::new(false);
                std::thread::scope(|s| {
                    let abort = &abort;
                    for ((r, mut t), buf) in ts.into_iter().enumerate().zip(bufs.iter_mut()) {
                        // Ranks that share cores, as where in-place sends go by address.
                        t.policy = crate::transport::board::SpinPolicy::for_ranks(n, 1);
                        s.spawn(move || {
                            let ctl = RunCtl { timeout: Duration::from_secs(20), abort, what: &|| "test".to_string() };
                            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                            let what = |send, peer| P2pCall { send, count: len, dtype: DataType::Uint8, peer };
                            let base = buf.as_mut_ptr();
                            let mut sched = Schedule::new(1);
                            // SAFETY: both ranges lie inside the buffer (len + 8192 bytes).
                            unsafe {
                                sched.p2p_recv(prev, base.add(recv_at), len, what(false, prev));
                                sched.p2p_send(next, base.add(send_at), len, what(true, next));
                            }
                            DIRECT_REFUSED.with(|c| c.set(refused & (1 << r) != 0));
                            GATED_READ.with(|c| c.set(0));
                            assert!(run(&mut t, &mut sched, &ctl).expect("ring shift").is_none());
                            // A gated receive of a message sent by address reads all of it.
                            let by_address = refused & (1 << prev) == 0 && recv_at <= send_at;
                            let gated = GATED_READ.with(|c| c.get());
                            assert_eq!(gated, if by_address { len } else { 0 }, "{n} ranks, rank {r}");
                            DIRECT_REFUSED.with(|c| c.set(false));
                        });
                    }
                });
                for (r, buf) in bufs.iter().enumerate() {
                    let (own, theirs) = (fill(r), fill((r + n - 1) % n));
                    let what = format!("{n} ranks, send at {send_at}, receive at {recv_at}, rank {r}");
                    assert!(buf[recv_at..recv_at + len] == theirs[send_at..send_at + len], "{what}: received");
                    assert!(buf[..recv_at] == own[..recv_at], "{what}: before");
                    assert!(buf[recv_at + len..] == own[recv_at + len..], "{what}: after");
                }
            }
        }
    }

    /// Below SHARE_MIN, and into reductions, the receiver reads alone (no offer is
    /// made, so an idle receiver still finishes).
    #[test]
    fn small_messages_and_reductions_are_not_shared() {
        let (src, dst, pieces) = one_message(SHARE_MIN - 8, 0, true);
        assert!(dst == src);
        assert_eq!(pieces, 0);
        let (src, dst, pieces) = one_message(SHARE_MIN * 2, 2, true);
        assert!(dst.iter().zip(&src).all(|(d, s)| *d == s.wrapping_add(1)), "1 + src");
        assert_eq!(pieces, 0);
    }
}
