//! Device memory on the built-in backend, through host staging: device buffers are
//! copied to page-locked host buffers on the caller's stream (after the work queued
//! before the call), the host algorithm runs on the copies, and the results go back
//! on the same stream. Correct for every collective and every placement of ranks;
//! bounded by the copies through PCIe, so NCCL and the one-GPU path take over where
//! they can. Host buffers are kept in a pool for later calls (`mem::pinned`) (pageable memory would be
//! copied through the driver's own bounce buffers at a fraction of the speed).
//!
//! A single call whose elements can be cut alike on every rank is a pipeline ([`run`]):
//! chunk k runs as its own host collective in one of two staging buffers while the
//! stream copies chunk k+1 in and chunk k-1 out of the other, so the copies hide
//! behind the host algorithm. Every rank cuts a call alike ([`Cut`]) from what all
//! ranks pass alike (kind, count, type, the number of ranks, and the agreed counts of
//! v-calls); the host algorithms reduce each element in rank order whatever the
//! call's size, so results are bitwise those of the whole call. Everything else
//! (all_to_allv, whose counts no rank knows in full; send/recv; gathers along an
//! axis; all_reduce over a wire type, whose rounding follows the host algorithm's cut
//! of the whole vector; groups, whose calls run as one host schedule) is staged whole.

//!
//! `cut` (how a call is cut, and each chunk's copies), `agree` (every rank checks
//! that all cut alike); a call or group staged whole is [`stage_in`] here.

mod agree;
mod cut;
#[cfg(test)]
mod tests;

use super::host;
use super::{Exec, Outcome};
use crate::backend::Algo;
use crate::coll::{Call, Coll};
use crate::error::{Error, Result};
use crate::mem::pinned::{Pinned, POOL_MAX_BYTES};
use crate::mem::{cuda, Placement};
use agree::agree;
use cut::{piece, Cut, Piece};

/// Runs one call on device memory through host staging: pipelined in chunks where
/// [`Cut`] cuts it, else staged whole.
pub fn run(x: &mut Exec<'_>, call: &Call, rank: usize, n: usize) -> Result<Outcome> {
    let c = &call.coll;
    let Placement::Device { ctx, .. } = c.placement else {
        return Err(Error::internal("staging::run on host memory"));
    };
    let Some(cut) = Cut::new(c, n, chunk_bytes()) else {
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
    if cut.chunks > 1 {
        if let failed @ Outcome::Failed(_) = agree(x, call, &cut, rank, n, &mut seq)? {
            return Ok(failed);
        }
    }
    let _g = cuda::CtxGuard::enter(ctx)?;
    let stream = c.stream;
    if cut.chunks == 1 {
        let p = piece(c, rank, n, &cut, 0)?;
        let slot = Pinned::take(p.bytes.max(1), true, chunk_bytes())?;
        // SAFETY: the spans lie in the call's validated device buffers and in the slot
        // (p.bytes); the slot lives until the stream is synchronised below.
        unsafe { p.copy_in(slot.ptr(), stream)? };
        cuda::sync(stream)?;
        let s = seq(x);
        if let failed @ Outcome::Failed(_) = host::execute(x, &[Call { coll: p.bind(slot.ptr()), seq: s }])? {
            return Ok(failed);
        }
        // SAFETY: as for copy_in.
        unsafe { p.copy_out(slot.ptr(), stream)? };
        return settle(cuda::sync(stream), vec![slot]);
    }
    let pipe = Pipe {
        c,
        rank,
        n,
        cut,
        slots: [Pinned::take(cut.slot, true, chunk_bytes())?, Pinned::take(cut.slot, true, chunk_bytes())?],
        events: [cuda::Event::new()?, cuda::Event::new()?],
    };
    // The cut was agreed above (and fingerprinted in checkMode): the chunks are not.
    let check = std::mem::replace(&mut x.check, false);
    let res = pipe.run(x, &mut seq);
    x.check = check;
    x.algo = Algo::Pipelined;
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
    cut: Cut,
    slots: [Pinned; 2],
    /// events[i]: after the copies into slots[i] of its latest chunk.
    events: [cuda::Event; 2],
}

impl Pipe<'_> {
    /// Chunk k in slot k % 2: the stream copies chunk k+1 in (after chunk k-1's copy
    /// out of the same slot, in stream order) while the host runs chunk k.
    fn run(&self, x: &mut Exec<'_>, seq: &mut impl FnMut(&mut Exec<'_>) -> u64) -> Result<Outcome> {
        let mut cur = self.fetch(0)?;
        for k in 0..self.cut.chunks {
            let next = if k + 1 < self.cut.chunks { Some(self.fetch(k + 1)?) } else { None };
            self.events[k % 2].synchronize()?;
            let s = seq(x);
            let slot = self.slots[k % 2].ptr();
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
        let p = piece(self.c, self.rank, self.n, &self.cut, k)?;
        if p.bytes > self.cut.slot {
            return Err(Error::internal(format!("chunk {k} needs {} bytes, its slot has {}", p.bytes, self.cut.slot)));
        }
        // SAFETY: the spans lie in the call's validated device buffers and in the slot
        // (p.bytes <= cut.slot); the slots outlive every copy (the caller drains the
        // stream before it lets them go).
        unsafe { p.copy_in(self.slots[k % 2].ptr(), self.c.stream)? };
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
    let buf = Pinned::take(span.max(1), false, 0)?;
    let base = buf.ptr();
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
    let base = staged.buf.ptr();
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
        unsafe {
            cuda::copy_htod_async(self.dev_recv, self.buf.ptr().add(self.recv_off), self.recv_bytes, self.stream)?
        };
        cuda::sync(self.stream)
    }
}
