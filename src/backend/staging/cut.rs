//! How a call is cut into chunks that every rank cuts alike, and what each chunk
//! copies between the device buffers and a staging buffer.

use crate::coll::{Coll, CollKind, VCounts};
use crate::error::{Error, Result};
use crate::mem::{cuda, Placement};

/// How a call is cut into chunks: elements `[k * cols, (k + 1) * cols)` of each of its
/// blocks (the whole buffer, or each rank's block) make chunk k. Made from what every
/// rank passes alike, so every rank cuts alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    /// Elements of each block per chunk.
    pub cols: usize,
    pub chunks: usize,
    /// Bytes of host buffer a chunk needs at most, on any rank.
    pub slot: usize,
    /// Elements of the longest block.
    pub len: usize,
}

impl Cut {
    /// The plan for `c` on `n` ranks with chunks of about `chunk` bytes of host buffer;
    /// None for calls staged whole (see the module's documentation).
    pub fn new(c: &Coll, n: usize, chunk: usize) -> Option<Cut> {
        use CollKind::*;
        // A wire all_reduce rounds partial results where the host algorithm's windows
        // and owners cut the vector, so its bits depend on the call's size: whole.
        if chunk == 0 || c.strided.is_some() || c.wire.is_some() {
            return None;
        }
        // Host elements per column of a chunk on the rank that holds the most:
        // input and output, or one block of each rank and one's own.
        let width = match c.kind {
            AllReduce | Reduce | Broadcast => 2,
            AllGather | Gather | ReduceScatter | Scatter | AllGatherV | ReduceScatterV => n + 1,
            AlltoAll => 2 * n,
            AlltoAllv | Send | Recv | Barrier => return None,
        };
        let len = match c.kind {
            AllGatherV | ReduceScatterV => c.v.as_ref()?.recvcounts().iter().copied().max().unwrap_or(0),
            _ => c.count,
        };
        let es = c.dtype.size();
        let cols = (chunk / (width * es)).max(1);
        Some(Cut { cols, chunks: len.div_ceil(cols).max(1), slot: width * cols * es, len })
    }
}

/// One range copied between device buffers and a staging buffer: `rows` rows of
/// `width` bytes, `dev_pitch` apart from device address `dev` and `host_pitch` apart
/// from offset `host` of the staging buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub dev: usize,
    pub host: usize,
    pub width: usize,
    pub rows: usize,
    pub dev_pitch: usize,
    pub host_pitch: usize,
}

impl Span {
    fn flat(dev: usize, host: usize, bytes: usize) -> Span {
        Span { dev, host, width: bytes, rows: 1, dev_pitch: bytes, host_pitch: bytes }
    }

    /// One block of `bytes` from each of `rows` blocks `pitch` apart on the device,
    /// packed in the staging buffer.
    fn blocks(dev: usize, host: usize, bytes: usize, rows: usize, pitch: usize) -> Span {
        Span { dev, host, width: bytes, rows, dev_pitch: pitch, host_pitch: bytes }
    }
}

/// One chunk of a call on one rank: the host call on a staging buffer, and what is
/// copied into the buffer before it and out after it. Only what the call reads is
/// copied in and only what it writes is copied out, so device bytes it does not
/// write (gaps between v-blocks) stay as they were.
pub struct Piece {
    /// The host call; its buffers are placed by [`Piece::bind`].
    coll: Coll,
    /// Offsets of its send and receive buffers in the staging buffer (None: unused here).
    send: Option<usize>,
    recv: Option<usize>,
    /// Bytes of staging buffer it uses.
    pub bytes: usize,
    pub ins: Vec<Span>,
    pub outs: Vec<Span>,
}

impl Piece {
    /// The host call on the staging buffer at `base`.
    pub fn bind(&self, base: *mut u8) -> Coll {
        let mut c = self.coll.clone();
        if let Some(o) = self.send {
            c.send = base.wrapping_add(o);
        }
        if let Some(o) = self.recv {
            c.recv = base.wrapping_add(o);
        }
        c
    }

    /// Queues the copies into the staging buffer at `base` on `stream`.
    ///
    /// # Safety
    /// `base` holds `self.bytes` of page-locked host memory and the device ranges are
    /// valid, both until the stream has run the copies; a context is current.
    pub(super) unsafe fn copy_in(&self, base: *mut u8, stream: cuda::Stream) -> Result<()> {
        for s in &self.ins {
            let dst = cuda::Side { ptr: base as usize + s.host, pitch: s.host_pitch, host: true };
            let src = cuda::Side { ptr: s.dev, pitch: s.dev_pitch, host: false };
            // SAFETY: per the caller.
            unsafe { cuda::copy_2d_async(dst, src, s.width, s.rows, stream)? };
        }
        Ok(())
    }

    /// Queues the copies out of the staging buffer at `base` on `stream`.
    ///
    /// # Safety
    /// As [`Piece::copy_in`].
    pub(super) unsafe fn copy_out(&self, base: *mut u8, stream: cuda::Stream) -> Result<()> {
        for s in &self.outs {
            let dst = cuda::Side { ptr: s.dev, pitch: s.dev_pitch, host: false };
            let src = cuda::Side { ptr: base as usize + s.host, pitch: s.host_pitch, host: true };
            // SAFETY: per the caller.
            unsafe { cuda::copy_2d_async(dst, src, s.width, s.rows, stream)? };
        }
        Ok(())
    }
}

/// (offset, bytes) of a send or receive buffer in a staging buffer; None where unused.
type Region = Option<(usize, usize)>;

/// Chunk `k` of `c` (of `cut`) on `rank`. The staging buffer mirrors the call's
/// layout with each block cut to the chunk: in place where the call is in place
/// (validation allows only the exact in-place layouts, so overlapping buffers are one).
pub fn piece(c: &Coll, rank: usize, n: usize, cut: &Cut, k: usize) -> Result<Piece> {
    use CollKind::*;
    let es = c.dtype.size();
    let (sb, rb) = c.extents(rank, n)?;
    let (s, r) = (c.send as usize, c.recv as usize);
    let (has_s, has_r) = (sb > 0, rb > 0);
    let in_place = has_s && has_r && s < r + rb && r < s + sb;
    let a = k * cut.cols;
    // Elements of a block of `len` in this chunk: the last chunk takes the rest, so a
    // lone chunk is the whole call, counts as passed (the host then checks them).
    let last = k + 1 == cut.chunks;
    let clip = |len: usize| if last { len.saturating_sub(a) } else { len.saturating_sub(a).min(cut.cols) };
    let mut coll = c.clone();
    coll.placement = Placement::Host;
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    let (send, recv): (Region, Region);
    match c.kind {
        AllReduce | Reduce | Broadcast => {
            let wb = clip(c.count) * es;
            coll.count = clip(c.count);
            send = has_s.then_some((0, wb));
            recv = has_r.then_some((if in_place || !has_s { 0 } else { wb }, wb));
            if has_s {
                ins.push(Span::flat(s + a * es, 0, wb));
            }
            if let Some((off, _)) = recv {
                outs.push(Span::flat(r + a * es, off, wb));
            }
        }
        AllGather | Gather => {
            let wb = clip(c.count) * es;
            coll.count = clip(c.count);
            recv = has_r.then_some((0, n * wb));
            let nrecv = recv.map_or(0, |(_, b)| b);
            send = has_s.then_some((if in_place { rank * wb } else { nrecv }, wb));
            if let Some((off, _)) = send {
                ins.push(Span::flat(s + a * es, off, wb));
            }
            if has_r {
                outs.push(Span::blocks(r + a * es, 0, wb, n, c.count * es));
            }
        }
        ReduceScatter | Scatter => {
            let wb = clip(c.count) * es;
            coll.count = clip(c.count);
            send = has_s.then_some((0, n * wb));
            let nsend = send.map_or(0, |(_, b)| b);
            recv = has_r.then_some((if in_place { rank * wb } else { nsend }, wb));
            if has_s {
                ins.push(Span::blocks(s + a * es, 0, wb, n, c.count * es));
            }
            if let Some((off, _)) = recv {
                outs.push(Span::flat(r + a * es, off, wb));
            }
        }
        AlltoAll => {
            let wb = clip(c.count) * es;
            coll.count = clip(c.count);
            send = Some((0, n * wb));
            recv = Some((if in_place { 0 } else { n * wb }, n * wb));
            ins.push(Span::blocks(s + a * es, 0, wb, n, c.count * es));
            outs.push(Span::blocks(r + a * es, recv.map_or(0, |(o, _)| o), wb, n, c.count * es));
        }
        AllGatherV | ReduceScatterV => {
            let v = c.v.as_ref().ok_or_else(|| Error::internal(format!("{} without counts", c.kind.c_name())))?;
            // Each rank's block cut to the chunk, packed in rank order.
            let w: Vec<usize> = v.recvcounts().iter().map(|&x| clip(x)).collect();
            let at: Vec<usize> = w.iter().scan(0, |acc, &x| Some(std::mem::replace(acc, *acc + x))).collect();
            let total = w.iter().sum::<usize>() * es;
            let mine = clip(c.count);
            coll.count = mine;
            if c.kind == AllGatherV {
                coll.v = Some(VCounts::gather_v(mine, n, &w, &at));
                recv = has_r.then_some((0, total));
                let nrecv = recv.map_or(0, |(_, b)| b);
                send = has_s.then_some((if in_place { at[rank] * es } else { nrecv }, mine * es));
                if let Some((off, b)) = send {
                    ins.push(Span::flat(s + a * es, off, b));
                }
                if has_r {
                    let d = v.rdispls();
                    outs.extend(
                        (0..n).filter(|&q| w[q] > 0).map(|q| Span::flat(r + (d[q] + a) * es, at[q] * es, w[q] * es)),
                    );
                }
            } else {
                coll.v = Some(VCounts::new(&[], &at, &w, &[]));
                send = has_s.then_some((0, total));
                let nsend = send.map_or(0, |(_, b)| b);
                recv = has_r.then_some((if in_place { at[rank] * es } else { nsend }, mine * es));
                if has_s {
                    let d = v.sdispls();
                    ins.extend(
                        (0..n).filter(|&q| w[q] > 0).map(|q| Span::flat(s + (d[q] + a) * es, at[q] * es, w[q] * es)),
                    );
                }
                if let Some((off, b)) = recv {
                    outs.push(Span::flat(r + a * es, off, b));
                }
            }
        }
        AlltoAllv | Send | Recv | Barrier => {
            return Err(Error::internal(format!("{} is staged whole, not in chunks", c.kind.c_name())))
        }
    }
    ins.retain(|s| s.width > 0);
    outs.retain(|s| s.width > 0);
    let end = |r: Region| r.map_or(0, |(o, b)| o + b);
    Ok(Piece {
        coll,
        send: send.map(|(o, _)| o),
        recv: recv.map(|(o, _)| o),
        bytes: end(send).max(end(recv)),
        ins,
        outs,
    })
}
