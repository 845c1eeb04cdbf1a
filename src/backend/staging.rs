//! Device memory on the built-in backend, through host staging: device buffers are
//! copied to page-locked host buffers on the caller's stream (after the work queued
//! before the call), the host algorithm runs on the copies, and the results go back
//! on the same stream. Correct for every collective and every placement of ranks;
//! bounded by the copies through PCIe, so NCCL and the one-GPU path take over where
//! they can. Host buffers are kept in a pool for later calls (pageable memory would be
//! copied through the driver's own bounce buffers at a fraction of the speed).
//!
//! A single call whose elements can be cut alike on every rank is a pipeline ([`run`]):
//! chunk k runs as its own host collective in one of two staging buffers while the
//! stream copies chunk k+1 in and chunk k-1 out of the other, so the copies hide
//! behind the host algorithm. Every rank cuts a call alike ([`Plan`]) from what all
//! ranks pass alike (kind, count, type, the number of ranks, and the agreed counts of
//! v-calls); the host algorithms reduce each element in rank order whatever the
//! call's size, so results are bitwise those of the whole call. Everything else
//! (all_to_allv, whose counts no rank knows in full; send/recv; gathers along an
//! axis; all_reduce over a wire type, whose rounding follows the host algorithm's cut
//! of the whole vector; groups, whose calls run as one host schedule) is staged whole.

use super::host;
use super::{Exec, Outcome};
use crate::coll::{Call, Coll, CollKind, VCounts};
use crate::error::{Error, Result};
use crate::mem::{cuda, Placement};

/// Runs one call on device memory through host staging: pipelined in chunks where
/// [`Plan`] cuts it, else staged whole.
pub fn run(x: &mut Exec<'_>, call: &Call, rank: usize, n: usize) -> Result<Outcome> {
    let c = &call.coll;
    let Placement::Device { ctx, .. } = c.placement else {
        return Err(Error::internal("staging::run on host memory"));
    };
    let Some(plan) = Plan::new(c, n, chunk_bytes()) else {
        let mut coll = c.clone();
        let st = stage_in(&mut coll, c.placement, rank, n)?;
        let res = host::execute(x, &[Call { coll, seq: call.seq }])?;
        st.stage_out()?;
        return Ok(res);
    };
    // The call's own sequence number for its first exchange when it is the
    // communicator's latest; every further exchange takes the next one, as every rank does.
    let mut first = (call.seq == *x.seq).then_some(call.seq);
    let mut seq = move |x: &mut Exec<'_>| {
        first.take().unwrap_or_else(|| {
            *x.seq += 1;
            *x.seq
        })
    };
    if plan.chunks > 1 {
        if let failed @ Outcome::Failed(_) = agree(x, call, &plan, rank, n, &mut seq)? {
            return Ok(failed);
        }
    }
    let _g = cuda::CtxGuard::enter(ctx)?;
    let stream = c.stream;
    if plan.chunks == 1 {
        let p = piece(c, rank, n, &plan, 0)?;
        let slot = Pinned::take(p.bytes.max(1), true)?;
        // SAFETY: the spans lie in the call's validated device buffers and in the slot
        // (p.bytes); the slot lives until the stream is synchronised below.
        unsafe { p.copy_in(slot.ptr, stream)? };
        cuda::sync(stream)?;
        let s = seq(x);
        if let failed @ Outcome::Failed(_) = host::execute(x, &[Call { coll: p.bind(slot.ptr), seq: s }])? {
            return Ok(failed);
        }
        // SAFETY: as for copy_in.
        unsafe { p.copy_out(slot.ptr, stream)? };
        return settle(cuda::sync(stream), vec![slot]);
    }
    let pipe = Pipe {
        c,
        rank,
        n,
        plan,
        slots: [Pinned::take(plan.slot, true)?, Pinned::take(plan.slot, true)?],
        events: [cuda::Event::new()?, cuda::Event::new()?],
    };
    // The plan was agreed above (and fingerprinted in checkMode): the chunks are not.
    let check = std::mem::replace(&mut x.check, false);
    let res = pipe.run(x, &mut seq);
    x.check = check;
    x.algo = "pipelined";
    // Every copy queued above reads or writes a slot: all must be done before the
    // slots return to the pool, whatever happened (the host's error comes first).
    let drained = pipe.events[0].record(stream).and_then(|()| pipe.events[0].synchronize());
    let settled = settle(drained, pipe.slots.into());
    match res {
        Ok(Outcome::Done) => settled,
        failed => failed,
    }
}

/// The host's result once the stream's copies are done: slots back to the pool, or
/// kept forever when the stream could not be waited for (a copy may still touch them).
fn settle(drained: Result<()>, slots: Vec<Pinned>) -> Result<Outcome> {
    match drained {
        Ok(()) => Ok(Outcome::Done),
        Err(e) => {
            slots.into_iter().for_each(std::mem::forget);
            Err(e)
        }
    }
}

/// One call in flight through two staging buffers.
struct Pipe<'a> {
    c: &'a Coll,
    rank: usize,
    n: usize,
    plan: Plan,
    slots: [Pinned; 2],
    /// events[i]: after the copies into slots[i] of its latest chunk.
    events: [cuda::Event; 2],
}

impl Pipe<'_> {
    /// Chunk k in slot k % 2: the stream copies chunk k+1 in (after chunk k-1's copy
    /// out of the same slot, in stream order) while the host runs chunk k.
    fn run(&self, x: &mut Exec<'_>, seq: &mut impl FnMut(&mut Exec<'_>) -> u64) -> Result<Outcome> {
        let mut cur = self.fetch(0)?;
        for k in 0..self.plan.chunks {
            let next = if k + 1 < self.plan.chunks { Some(self.fetch(k + 1)?) } else { None };
            self.events[k % 2].synchronize()?;
            let s = seq(x);
            let slot = self.slots[k % 2].ptr;
            if let failed @ Outcome::Failed(_) = host::execute(x, &[Call { coll: cur.bind(slot), seq: s }])? {
                return Ok(failed);
            }
            // SAFETY: as in fetch.
            unsafe { cur.copy_out(slot, self.c.stream)? };
            match next {
                Some(p) => cur = p,
                None => break,
            }
        }
        Ok(Outcome::Done)
    }

    /// Queues chunk k's copies into its slot and marks their end.
    fn fetch(&self, k: usize) -> Result<Piece> {
        let p = piece(self.c, self.rank, self.n, &self.plan, k)?;
        if p.bytes > self.plan.slot {
            return Err(Error::internal(format!("chunk {k} needs {} bytes, its slot has {}", p.bytes, self.plan.slot)));
        }
        // SAFETY: the spans lie in the call's validated device buffers and in the slot
        // (p.bytes <= plan.slot); the slots outlive every copy (the caller drains the
        // stream before it lets them go).
        unsafe { p.copy_in(self.slots[k % 2].ptr, self.c.stream)? };
        self.events[k % 2].record(self.c.stream)?;
        Ok(p)
    }
}

/// Bytes of host buffer per chunk (`FERROCCL_STAGING_CHUNK`, read once; 0: every
/// call staged whole), at most half the pool so that both slots stay in it.
pub fn chunk_bytes() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| crate::env::staging_chunk().min(POOL_MAX_BYTES / 2))
}

// FERROCCL_STAGING_CHUNK's documented bound is half the pool.
const _: () = assert!(crate::env::STAGING_CHUNK_MAX == POOL_MAX_BYTES / 2);

/// How a call is cut into chunks: elements `[k * cols, (k + 1) * cols)` of each of its
/// blocks (the whole buffer, or each rank's block) make chunk k. Made from what every
/// rank passes alike, so every rank cuts alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Elements of each block per chunk.
    pub cols: usize,
    pub chunks: usize,
    /// Bytes of host buffer a chunk needs at most, on any rank.
    pub slot: usize,
    /// Elements of the longest block.
    len: usize,
}

impl Plan {
    /// The plan for `c` on `n` ranks with chunks of about `chunk` bytes of host buffer;
    /// None for calls staged whole (see the module's documentation).
    pub fn new(c: &Coll, n: usize, chunk: usize) -> Option<Plan> {
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
        Some(Plan { cols, chunks: len.div_ceil(cols).max(1), slot: width * cols * es, len })
    }
}

/// Before a call is cut, every rank makes sure that all cut it alike: they exchange
/// what the plan is made of (and, for v-calls, agree on the counts as the host
/// algorithms do), so a mismatch fails every rank before any data moves instead of
/// leaving them in different chunks.
fn agree(
    x: &mut Exec<'_>,
    call: &Call,
    plan: &Plan,
    rank: usize,
    n: usize,
    seq: &mut impl FnMut(&mut Exec<'_>) -> u64,
) -> Result<Outcome> {
    let c = &call.coll;
    let mine = plan_record(c);
    let mut all = vec![[0u64; RECORD]; n];
    let ex = Coll::new(
        CollKind::AllGather,
        mine.as_ptr().cast(),
        all.as_mut_ptr().cast(),
        std::mem::size_of_val(&mine),
        crate::types::DataType::Uint8,
    );
    let s = seq(x);
    if let failed @ Outcome::Failed(_) = host::execute(x, &[Call { coll: ex, seq: s }])? {
        return Ok(failed);
    }
    if all.iter().any(|r| *r != mine) {
        let each: Vec<String> = all.iter().enumerate().map(|(p, r)| format!("rank {p}: {}", describe(r))).collect();
        return Ok(Outcome::Failed(Error::mismatch(format!(
            "ranks cut a staged device call differently ({}): they called different collectives, or FERROCCL_STAGING_CHUNK differs between them (it must be the same on every rank); no data was moved, the communicator is still usable",
            each.join("; ")
        ))));
    }
    if matches!(c.kind, CollKind::AllGatherV | CollKind::ReduceScatterV) {
        let whole = Call { coll: c.clone(), seq: seq(x) };
        let what = || format!("{} #{} on rank {rank}", c.kind.c_name(), call.seq);
        if let Some((_, Some(e))) = host::agree_counts(x, &[&whole], &what)?.pop() {
            return Ok(Outcome::Failed(e));
        }
    }
    debug_assert!(plan.chunks > 1 && plan.len > plan.cols);
    Ok(Outcome::Done)
}

const RECORD: usize = 6;

/// What a call's plan is made of: kind, count (0 for v-calls: their counts are agreed
/// on their own), type, op and root where they matter, and the chunk size.
fn plan_record(c: &Coll) -> [u64; RECORD] {
    use CollKind::*;
    let v = matches!(c.kind, AllGatherV | ReduceScatterV);
    let reduces = matches!(c.kind, AllReduce | Reduce | ReduceScatter | ReduceScatterV);
    let rooted = matches!(c.kind, Broadcast | Reduce | Gather | Scatter);
    let wire = c.wire.map_or(0, |w| (w as u64 + 1) << 8);
    [
        c.kind as u64,
        if v { 0 } else { c.count as u64 },
        c.dtype as u64,
        if reduces { c.op as u64 | wire } else { 0 },
        if rooted { c.root as u64 } else { 0 },
        chunk_bytes() as u64,
    ]
}

fn describe(r: &[u64; RECORD]) -> String {
    let kind = KINDS.iter().find(|k| **k as u64 == r[0]).map_or("an unknown call", |k| k.c_name());
    let dt = crate::types::DataType::try_from(r[2] as i32).map_or("?", |d| d.c_name());
    format!("{kind}(count {}, {dt}, op {}, root {}) in chunks of {} bytes", r[1], r[3], r[4], r[5])
}

const KINDS: [CollKind; 8] = [
    CollKind::AllReduce,
    CollKind::Reduce,
    CollKind::Broadcast,
    CollKind::AllGather,
    CollKind::Gather,
    CollKind::ReduceScatter,
    CollKind::Scatter,
    CollKind::AlltoAll,
];

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
    unsafe fn copy_in(&self, base: *mut u8, stream: cuda::Stream) -> Result<()> {
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
    unsafe fn copy_out(&self, base: *mut u8, stream: cuda::Stream) -> Result<()> {
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

/// Chunk `k` of `c` (of `plan`) on `rank`. The staging buffer mirrors the call's
/// layout with each block cut to the chunk: in place where the call is in place
/// (validation allows only the exact in-place layouts, so overlapping buffers are one).
pub fn piece(c: &Coll, rank: usize, n: usize, plan: &Plan, k: usize) -> Result<Piece> {
    use CollKind::*;
    let es = c.dtype.size();
    let (sb, rb) = c.extents(rank, n)?;
    let (s, r) = (c.send as usize, c.recv as usize);
    let (has_s, has_r) = (sb > 0, rb > 0);
    let in_place = has_s && has_r && s < r + rb && r < s + sb;
    let a = k * plan.cols;
    // Elements of a block of `len` in this chunk: the last chunk takes the rest, so a
    // lone chunk is the whole call, counts as passed (the host then checks them).
    let last = k + 1 == plan.chunks;
    let clip = |len: usize| if last { len.saturating_sub(a) } else { len.saturating_sub(a).min(plan.cols) };
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

/// A host copy of one call's device buffers.
pub struct Staged {
    ctx: cuda::Ctx,
    stream: cuda::Stream,
    /// Host copy; `send`/`recv` of the call point into it while the host algorithm runs.
    buf: Pinned,
    /// Device range that `buf[recv_off..recv_off + recv_bytes]` mirrors.
    dev_recv: *mut u8,
    recv_off: usize,
    recv_bytes: usize,
}

/// Copies `c`'s device buffers to host memory and points `c` at the copies.
/// Buffers that overlap (in-place calls) share one copy, so aliasing is kept.
pub fn stage_in(c: &mut Coll, place: Placement, rank: usize, nranks: usize) -> Result<Staged> {
    let Placement::Device { ctx, .. } = place else {
        return Err(crate::error::Error::internal("stage_in on host memory"));
    };
    let (sb, rb) = c.extents(rank, nranks)?;
    let (s0, r0) = (c.send as usize, c.recv as usize);
    // One host range covering both buffers when they overlap, else two back to back.
    let overlap = sb > 0 && rb > 0 && s0 < r0 + rb && r0 < s0 + sb;
    let (lo, span) = if overlap {
        let lo = s0.min(r0);
        (lo, (s0 + sb).max(r0 + rb) - lo)
    } else {
        (0, sb + rb)
    };
    let _g = cuda::CtxGuard::enter(ctx)?;
    let buf = Pinned::take(span.max(1), false)?;
    let base = buf.ptr;
    let (send_off, recv_off) = if overlap { (s0 - lo, r0 - lo) } else { (0, sb) };
    // The receive buffer is copied in too: parts of it that the call does not write
    // (and in-place inputs) must come back unchanged.
    // SAFETY: the device ranges were validated for these sizes; buf holds span bytes
    // and lives until the copies are synchronised below.
    unsafe {
        if overlap {
            cuda::copy_dtoh_async(base, lo as *const u8, span, c.stream)?;
        } else {
            if sb > 0 {
                cuda::copy_dtoh_async(base.add(send_off), c.send, sb, c.stream)?;
            }
            if rb > 0 {
                cuda::copy_dtoh_async(base.add(recv_off), c.recv, rb, c.stream)?;
            }
        }
    }
    cuda::sync(c.stream)?;
    let staged = Staged { ctx, stream: c.stream, buf, dev_recv: c.recv, recv_off, recv_bytes: rb };
    let base = staged.buf.ptr;
    // SAFETY: offsets are within buf (computed from the extents above).
    unsafe {
        if sb > 0 {
            c.send = base.add(send_off);
        }
        if rb > 0 {
            c.recv = base.add(recv_off);
        }
    }
    Ok(staged)
}

impl Staged {
    /// Copies the result back to the device and waits for it (the host copy dies here).
    pub fn stage_out(self) -> Result<()> {
        if self.recv_bytes == 0 {
            return Ok(());
        }
        let _g = cuda::CtxGuard::enter(self.ctx)?;
        // SAFETY: dev_recv was validated for recv_bytes; buf is alive until the sync.
        unsafe { cuda::copy_htod_async(self.dev_recv, self.buf.ptr.add(self.recv_off), self.recv_bytes, self.stream)? };
        cuda::sync(self.stream)
    }
}

/// A page-aligned host buffer, page-locked where the driver allows (else plain
/// memory, which still works), returned to a pool on drop.
struct Pinned {
    ptr: *mut u8,
    len: usize,
    /// From `mem::alloc_host` (page-locked by it, and shared memory that peers on this
    /// host read in place, as fcclMemAllocHost's), else a private mapping.
    shared: bool,
    registered: bool,
}

// SAFETY: the buffer is owned memory; whoever holds the Pinned uses it alone.
unsafe impl Send for Pinned {}

/// Buffers kept for later calls: at most this many bytes together.
pub const POOL_MAX_BYTES: usize = 64 << 20;
static POOL: std::sync::Mutex<Vec<Pinned>> = std::sync::Mutex::new(Vec::new());

impl Pinned {
    /// A buffer of at least `len` bytes: the smallest kept one of its kind that fits,
    /// else a new one. Chunks take shared buffers: the host algorithms then move
    /// their bytes once, peer to peer, instead of through the shared rings. A call
    /// staged whole takes a private one (a shared buffer costs more to make, and one
    /// larger than the pool is made again on every call).
    fn take(len: usize, shared: bool) -> Result<Pinned> {
        {
            let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
            let fits = |b: &&Pinned| b.shared == shared && b.len >= len;
            let best = pool.iter().enumerate().filter(|(_, b)| fits(b)).min_by_key(|(_, b)| b.len).map(|(i, _)| i);
            if let Some(i) = best {
                return Ok(pool.swap_remove(i));
            }
        }
        if shared {
            // Chunk slots are all one size and come in pairs (a pipeline holds two), so
            // the first staged call leaves the pool with what every later one needs.
            let len = len.max(chunk_bytes()).next_power_of_two().max(64 << 10);
            let spare = Pinned { ptr: crate::mem::alloc_host(len)?, len, shared, registered: false };
            drop(spare);
            let ptr = crate::mem::alloc_host(len)?;
            return Ok(Pinned { ptr, len, shared, registered: false });
        }
        // Rounded up so that slightly larger calls reuse it.
        let len = len.next_power_of_two().max(64 << 10);
        // SAFETY: a fresh anonymous private mapping; unmapped in free().
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(crate::error::Error::os(format!("mmap of {len} bytes for staging device memory")));
        }
        let ptr = p as *mut u8;
        // SAFETY: the range is this mapping, which stays until free() unregisters it.
        let registered = unsafe { cuda::register_host(ptr, len) }.is_ok();
        Ok(Pinned { ptr, len, shared, registered })
    }

    fn free(self) {
        if self.shared {
            if let Err(e) = crate::mem::free(self.ptr) {
                crate::log::warn(format_args!("freeing a staging buffer: {}", e.msg));
            }
        } else {
            if self.registered {
                // SAFETY: registered in take(); no copy uses it any more (the stream was synchronised).
                let _ = unsafe { cuda::unregister_host(self.ptr as usize) };
            }
            // SAFETY: mapped in take(), unmapped once.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
        std::mem::forget(self);
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let mine = Pinned { ptr: self.ptr, len: self.len, shared: self.shared, registered: self.registered };
        let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
        let kept: usize = pool.iter().map(|b| b.len).sum();
        if kept + mine.len <= POOL_MAX_BYTES {
            pool.push(mine);
        } else {
            drop(pool);
            mine.free();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::Strided;
    use crate::types::DataType;
    use CollKind::*;

    #[test]
    fn plans_cut_by_shared_arguments_only() {
        let call = |kind, count, dt| Coll::new(kind, 0x1000 as *const u8, 0x9000 as *mut u8, count, dt);
        // Input and output of 4 bytes per element: 375 elements in 3000 bytes.
        let p = Plan::new(&call(AllReduce, 1001, DataType::Float32), 4, 3000).unwrap();
        assert_eq!((p.cols, p.chunks, p.slot), (375, 3, 3000));
        // One block of each of 4 ranks and one's own: 150 elements per block.
        let p = Plan::new(&call(AllGather, 1001, DataType::Float32), 4, 3000).unwrap();
        assert_eq!((p.cols, p.chunks, p.slot), (150, 7, 3000));
        let p = Plan::new(&call(AlltoAll, 10, DataType::Float64), 3, 96).unwrap();
        assert_eq!((p.cols, p.chunks, p.slot), (2, 5, 96));
        // A chunk smaller than one column still moves one element per block.
        let p = Plan::new(&call(ReduceScatter, 5, DataType::Int64), 2, 1).unwrap();
        assert_eq!((p.cols, p.chunks, p.slot), (1, 5, 24));
        // Exactly one chunk, and no chunk but one for a v-call whose counts are all 0.
        assert_eq!(Plan::new(&call(Broadcast, 375, DataType::Float32), 2, 3000).unwrap().chunks, 1);
        let mut v = call(AllGatherV, 0, DataType::Int8);
        v.v = Some(VCounts::gather_v(0, 2, &[0, 0], &[0, 0]));
        assert_eq!(Plan::new(&v, 2, 64).unwrap().chunks, 1);
        // v-calls are cut by the longest block, which every rank knows alike.
        v.v = Some(VCounts::gather_v(0, 3, &[0, 100, 7], &[0, 0, 100]));
        assert_eq!(Plan::new(&v, 3, 64).unwrap(), Plan { cols: 16, chunks: 7, slot: 64, len: 100 });
        // Root, op, pointers and in-place layout (which ranks pass differently) change nothing.
        let base = call(Reduce, 777, DataType::Bfloat16);
        let mut other = call(Reduce, 777, DataType::Bfloat16);
        other.root = 1;
        other.op = crate::types::RedOp::Max;
        other.send = other.recv;
        assert_eq!(Plan::new(&base, 2, 1000), Plan::new(&other, 2, 1000));
        // Staged whole: per-pair counts no rank knows in full, p2p, axis gathers, wire
        // all_reduce, or chunks of 0.
        assert_eq!(Plan::new(&call(AlltoAllv, 10, DataType::Int8), 2, 64), None);
        assert_eq!(Plan::new(&call(Send, 10, DataType::Int8), 2, 64), None);
        let mut axis = call(AllGather, 10, DataType::Int8);
        axis.strided = Some(Strided { outer: 2, block: 5 });
        assert_eq!(Plan::new(&axis, 2, 64), None);
        let mut wire = call(AllReduce, 10, DataType::Float32);
        wire.wire = Some(DataType::Bfloat16);
        assert_eq!(Plan::new(&wire, 2, 64), None);
        assert_eq!(Plan::new(&call(AllReduce, 10, DataType::Int8), 2, 0), None);
    }

    /// xorshift64* (as reduce.rs's tests, which tools/simgpu also compiles alone, so
    /// they cannot share a module of this crate).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    fn below(rng: &mut Rng, n: usize) -> usize {
        (rng.next() % n as u64) as usize
    }

    /// What each collective computes, over every rank's host buffers at once (elements
    /// as little-endian integers of the type's size, summed with wraparound): every
    /// input is read before any output is written, as in-place calls need.
    fn reference(cs: &[Coll]) {
        let n = cs.len();
        let (c0, es) = (&cs[0], cs[0].dtype.size());
        let mask = if es == 8 { u64::MAX } else { (1u64 << (8 * es)) - 1 };
        let get = |p: *const u8, i: usize| -> u64 {
            let mut b = [0u8; 8];
            // SAFETY: the callers name elements inside the calls' buffers.
            unsafe { std::ptr::copy_nonoverlapping(p.add(i * es), b.as_mut_ptr(), es) };
            u64::from_le_bytes(b)
        };
        let sum = |f: &dyn Fn(usize) -> u64| (0..n).fold(0u64, |a, p| a.wrapping_add(f(p))) & mask;
        let (cnt, root) = (c0.count, c0.root);
        let mut out: Vec<(usize, usize, u64)> = Vec::new();
        for r in 0..n {
            let c = &cs[r];
            match c0.kind {
                AllReduce => out.extend((0..c.count).map(|i| (r, i, sum(&|p| get(cs[p].send, i))))),
                Reduce if r == root => out.extend((0..cnt).map(|i| (r, i, sum(&|p| get(cs[p].send, i))))),
                Broadcast => out.extend((0..cnt).map(|i| (r, i, get(cs[root].send, i)))),
                AllGather => out.extend(
                    (0..n)
                        .flat_map(|p| (0..cnt).map(move |i| (p, i)))
                        .map(|(p, i)| (r, p * cnt + i, get(cs[p].send, i))),
                ),
                Gather if r == root => out.extend(
                    (0..n)
                        .flat_map(|p| (0..cnt).map(move |i| (p, i)))
                        .map(|(p, i)| (r, p * cnt + i, get(cs[p].send, i))),
                ),
                ReduceScatter => out.extend((0..cnt).map(|i| (r, i, sum(&|p| get(cs[p].send, r * cnt + i))))),
                Scatter => out.extend((0..cnt).map(|i| (r, i, get(cs[root].send, r * cnt + i)))),
                AlltoAll => out.extend(
                    (0..n)
                        .flat_map(|p| (0..cnt).map(move |i| (p, i)))
                        .map(|(p, i)| (r, p * cnt + i, get(cs[p].send, r * cnt + i))),
                ),
                AllGatherV => {
                    let v = c.v.as_ref().unwrap();
                    for (p, q) in cs.iter().enumerate() {
                        out.extend((0..v.recvcounts()[p]).map(|i| (r, v.rdispls()[p] + i, get(q.send, i))));
                    }
                }
                ReduceScatterV => {
                    let at = |p: usize| cs[p].v.as_ref().unwrap().sdispls()[r];
                    out.extend((0..c.count).map(|i| (r, i, sum(&|p| get(cs[p].send, at(p) + i)))));
                }
                _ => {}
            }
        }
        for (r, i, v) in out {
            // SAFETY: i is inside rank r's receive buffer (the collective's own layout).
            unsafe { std::ptr::copy_nonoverlapping(v.to_le_bytes().as_ptr(), cs[r].recv.add(i * es), es) };
        }
    }

    /// Applies one span between "device" memory (plain host memory here) and a slot.
    fn apply(s: &Span, slot: *mut u8, to_slot: bool) {
        for row in 0..s.rows {
            let (d, h) = ((s.dev + row * s.dev_pitch) as *mut u8, slot.wrapping_add(s.host + row * s.host_pitch));
            let (from, to) = if to_slot { (d as *const u8, h) } else { (h as *const u8, d) };
            // SAFETY: the spans name bytes inside the simulated buffers and the slot.
            unsafe { std::ptr::copy_nonoverlapping(from, to, s.width) };
        }
    }

    /// One case of the simulation: the call every rank makes, and the chunk size.
    struct Case {
        kind: CollKind,
        dt: DataType,
        n: usize,
        cnt: usize,
        root: usize,
        ip: bool,
        /// v-calls: recvcounts, rdispls, then each rank's sdispls.
        v: Vec<Vec<usize>>,
        chunk: usize,
    }

    /// Rank r's call on its arena: buffers between random guard bytes, in place as
    /// the collective defines it when asked.
    fn make(case: &Case, r: usize, arena: &mut [u8]) -> Coll {
        let Case { kind, dt, n, cnt, root, ip, ref v, .. } = *case;
        let es = dt.size();
        let g = 40; // guard bytes before each buffer
        let half = arena.len() / 2;
        let (s, rb) = (arena.as_mut_ptr().wrapping_add(g), arena.as_mut_ptr().wrapping_add(half + g));
        let mut c = Coll::new(kind, s, rb, cnt, dt);
        c.root = root;
        match kind {
            AllGatherV => {
                c.count = v[0][r];
                c.v = Some(VCounts::gather_v(c.count, n, &v[0], &v[1]));
            }
            ReduceScatterV => {
                c.count = v[0][r];
                // Each rank lays its send blocks out its own way.
                c.v = Some(VCounts::new(&[], &v[2 + r], &v[0], &[]));
            }
            _ => {}
        }
        if ip {
            let sd = c.v.as_ref().map(|v| v.sdispls().get(r).copied().unwrap_or(0)).unwrap_or(0);
            match kind {
                AllReduce | Reduce | Broadcast | AlltoAll => c.send = c.recv,
                AllGather | Gather => c.send = c.recv.wrapping_add(r * cnt * es),
                ReduceScatter | Scatter => c.recv = (c.send as *mut u8).wrapping_add(r * cnt * es),
                AllGatherV => c.send = c.recv.wrapping_add(v[1][r] * es),
                ReduceScatterV => c.recv = (c.send as *mut u8).wrapping_add(sd * es),
                _ => unreachable!(),
            }
        }
        c.validate(r, n).unwrap_or_else(|e| panic!("{kind:?} rank {r} in place {ip}: {}", e.msg));
        c
    }

    /// Cutting a call into chunks and running each on its staging buffers gives every
    /// rank's device buffers exactly what the whole call gives, guard bytes and gaps
    /// between v-blocks untouched: every kind, 1-4 ranks, element sizes 1, 2 and 8,
    /// in and out of place, every root, chunks of one element per block up to one chunk.
    #[test]
    fn chunks_give_the_whole_call_byte_for_byte() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let kinds = [
            AllReduce,
            Reduce,
            Broadcast,
            AllGather,
            Gather,
            ReduceScatter,
            Scatter,
            AlltoAll,
            AllGatherV,
            ReduceScatterV,
        ];
        let mut cases = 0;
        for kind in kinds {
            for n in 1..=4 {
                for dt in [DataType::Int8, DataType::Float16, DataType::Int64] {
                    for ip in [false, true] {
                        for cnt in [1, 7, 37] {
                            for chunk in [1, 24, 100, 4096] {
                                let root = if matches!(kind, Reduce | Broadcast | Gather | Scatter) {
                                    below(&mut rng, n)
                                } else {
                                    0
                                };
                                // v-calls: counts up to 2*cnt (some 0), receive displacements in
                                // reverse order with gaps, each rank's send displacements likewise.
                                let rc: Vec<usize> = (0..n)
                                    .map(|_| if below(&mut rng, 4) == 0 { 0 } else { below(&mut rng, 2 * cnt + 1) })
                                    .collect();
                                let layout = |rng: &mut Rng| {
                                    let mut d = vec![0; n];
                                    let mut at = 0;
                                    for q in (0..n).rev() {
                                        d[q] = at;
                                        at += rc[q] + below(rng, 3);
                                    }
                                    d
                                };
                                let mut v = vec![rc.clone(), layout(&mut rng)];
                                v.extend((0..n).map(|_| layout(&mut rng)));
                                if ip && matches!(kind, AllGatherV | ReduceScatterV) && v[0].iter().all(|&c| c == 0) {
                                    continue;
                                }
                                run_case(&Case { kind, dt, n, cnt, root, ip, v, chunk }, &mut rng);
                                cases += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(cases > 2500, "{cases} cases");
    }

    fn run_case(case: &Case, rng: &mut Rng) {
        let Case { kind, dt, n, cnt, root, ip, ref v, chunk } = *case;
        let es = dt.size();
        let size = 2 * (40 + 4 * 4 * 2 * 37 * 8 + 40);
        let fill = |rng: &mut Rng| (0..size).map(|_| rng.next() as u8).collect::<Vec<u8>>();
        let mut want: Vec<Vec<u8>> = (0..n).map(|_| fill(rng)).collect();
        let mut got = want.clone();
        let whole: Vec<Coll> = (0..n).map(|r| make(case, r, &mut want[r])).collect();
        reference(&whole);
        let calls: Vec<Coll> = (0..n).map(|r| make(case, r, &mut got[r])).collect();
        let plan = Plan::new(&calls[0], n, chunk).unwrap();
        for c in &calls {
            assert_eq!(Plan::new(c, n, chunk), Some(plan), "every rank cuts alike");
        }
        let what = || format!("{kind:?} {dt:?} n {n} count {cnt} root {root} in place {ip} v {v:?} chunk {chunk}");
        let mut moved = vec![0usize; n];
        for k in 0..plan.chunks {
            let pieces: Vec<Piece> = (0..n).map(|r| piece(&calls[r], r, n, &plan, k).unwrap()).collect();
            let mut slots: Vec<Vec<u8>> = pieces.iter().map(|p| vec![0xa5u8; p.bytes.max(1)]).collect();
            let mut host = Vec::new();
            for (r, p) in pieces.iter().enumerate() {
                if plan.chunks > 1 {
                    assert!(
                        p.bytes <= plan.slot,
                        "chunk {k} of rank {r} needs {} > {} bytes: {}",
                        p.bytes,
                        plan.slot,
                        what()
                    );
                }
                let base = slots[r].as_mut_ptr();
                p.ins.iter().for_each(|s| apply(s, base, true));
                let h = p.bind(base);
                h.validate(r, n).unwrap_or_else(|e| panic!("chunk {k} rank {r}: {}: {}", e.msg, what()));
                host.push(h);
                moved[r] += p.outs.iter().map(|s| s.width * s.rows).sum::<usize>();
            }
            reference(&host);
            for (r, p) in pieces.iter().enumerate() {
                p.outs.iter().for_each(|s| apply(s, slots[r].as_mut_ptr(), false));
            }
        }
        for r in 0..n {
            assert!(got[r] == want[r], "rank {r}: {}", what());
            // Each output byte is copied out once.
            let (_, rb) = whole[r].extents(r, n).unwrap();
            let written = match kind {
                AllGatherV => v[0].iter().sum::<usize>() * es,
                _ => rb,
            };
            assert_eq!(moved[r], if rb == 0 { 0 } else { written }, "rank {r}: {}", what());
        }
    }
}
