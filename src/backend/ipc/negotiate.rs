//! How the ranks agree on a collective before anything is enqueued: each checks what
//! it can do (capture, the mode, its buffers), sends the others its descriptor, and
//! every rank reads the same verdict from the same descriptors.

use super::desc::{Buf, Desc, Part};
use super::fallback::{fix, Fallback};
use super::{own_seq, Inner, Ipc, Mode, EXECUTOR};
use crate::backend::{capture, Exec, Outcome};
use crate::coll::{counts, fingerprint, Call, CollKind, VCounts};
use crate::error::{Error, Result};
use crate::mem::{cuda, cuda_reduce, Placement};

/// What the descriptor exchange decided, the same on every rank.
pub(super) enum Negotiated {
    /// The exchange itself did not complete (a rank failed): its outcome.
    Unfinished(Outcome),
    /// A rank's stream is being captured into a CUDA graph: the call fails everywhere.
    Refused(Error),
    /// The ranks called different collectives: the call fails everywhere.
    Mismatch(Error),
    /// Per-rank counts that do not pair up: the call fails everywhere.
    BadCounts(Error),
    /// A rank cannot take the call GPU to GPU (this one, for this reason, or a peer):
    /// every rank stages it.
    Fallback(Fallback),
    /// Every rank takes part.
    Run(Agreed),
}

/// What the ranks agreed to run GPU to GPU.
pub(super) struct Agreed {
    /// Every rank's descriptor, rank by rank.
    pub descs: Vec<Desc>,
    /// Every rank's arrays, for calls with per-rank counts (else empty).
    pub counts: Vec<VCounts>,
    /// Mappings of freed allocations that went in this call (closed once the GPU is
    /// past the calls that used them).
    pub gone: Vec<usize>,
}

impl Ipc {
    /// The descriptor exchange of one eligible collective whose buffers live in `ctx`
    /// on `device` (entered by the caller), and its verdict.
    pub(super) fn negotiate(
        &self,
        x: &mut Exec<'_>,
        call: &Call,
        inner: &mut Inner,
        ctx: cuda::Ctx,
        device: i32,
    ) -> Result<Negotiated> {
        let (rank, n) = (self.rank, self.nranks);
        let c = &call.coll;
        // A capturing stream gets nothing (no synchronisation, registration or kernel
        // compilation either): this rank only says so in the exchange.
        let captured = capture::capturing(c.stream)?;
        let (reason, stream) = if captured {
            (Some(Fallback::new("its stream is being captured into a CUDA graph", "")), false)
        } else {
            match self.stream_mode(inner, ctx, device) {
                Mode::Off(m) => (Some(m), false),
                Mode::Stream(_) => (None, true),
                Mode::Synced => (None, false),
            }
        };
        if stream {
            if let Ok(ctl) = &self.ctl {
                inner.close_finished(ctl);
            }
        } else if reason.is_none() {
            // Synced: inputs complete before the executor reads them.
            cuda::sync(c.stream)?;
        }
        let prepared = match &reason {
            Some(f) => Err(f.clone()),
            None => self.prepare(call, ctx, device, inner),
        };
        let (mine, mut fallback) = match prepared {
            Ok(d) => (d, None),
            Err(f) => {
                let part = if captured { Part::Captured } else { Part::Cannot };
                (Desc::new(part, fingerprint::one(call), c.v.clone()), Some(f))
            }
        };
        let per_rank = c.v.is_some();
        let (all, got) = x.allgather(&mine.encode(n), own_seq(x, call))?;
        if let Outcome::Failed(_) = got {
            return Ok(Negotiated::Unfinished(got));
        }
        let mut descs = all
            .chunks(Desc::size(n, per_rank))
            .map(|b| Desc::decode(b, n, per_rank))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| e.context(format_args!("{} on rank {rank}", c.kind.c_name())))?;
        let who: Vec<usize> = (0..n).filter(|&q| descs[q].part == Part::Captured).collect();
        if !who.is_empty() {
            return Ok(Negotiated::Refused(capture::refusal(c.kind.c_name(), rank, c.stream, &who)));
        }
        let mut gone = Vec::new();
        if let Ok(ctl) = &self.ctl {
            inner.freed.apply(ctl, rank, &self.pids, ctx, &mut inner.maps, &mut gone);
        }
        // Every rank compares what every rank called, before anything is enqueued: a
        // difference fails the call on every rank alike, whatever FERROCCL_CHECK says.
        if let Some(e) = fingerprint::verdict(rank, n, &mine.fp, |p| &descs[p].fp) {
            self.defer_close(inner, gone);
            return Ok(Negotiated::Mismatch(e));
        }
        let unable: Vec<usize> = (0..n).filter(|&q| descs[q].part != Part::Takes).collect();
        if fallback.is_none() && !unable.is_empty() {
            let who = unable.iter().map(|q| q.to_string()).collect::<Vec<_>>().join(", ");
            fallback = Some(Fallback::new(format!("rank(s) {who} cannot take it GPU to GPU"), fix::PEER));
        }
        if let Some(f) = fallback {
            self.defer_close(inner, gone);
            return Ok(Negotiated::Fallback(f));
        }
        // Per-rank counts: every rank checks every pair from the same descriptors, so all
        // return the same verdict, and nothing is enqueued on a mismatch.
        let counts: Vec<VCounts> = descs.iter_mut().filter_map(|d| d.counts.take()).collect();
        if let Some(e) = counts::verdict(c, rank, &counts) {
            self.defer_close(inner, gone);
            return Ok(Negotiated::BadCounts(e));
        }
        Ok(Negotiated::Run(Agreed { descs, counts, gone }))
    }

    /// This rank's descriptor of `call`, or why it cannot take the call GPU to GPU.
    fn prepare(
        &self,
        call: &Call,
        ctx: cuda::Ctx,
        device: i32,
        inner: &mut Inner,
    ) -> std::result::Result<Desc, Fallback> {
        let c = &call.coll;
        let reduces = matches!(
            c.kind,
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter | CollKind::ReduceScatterV
        );
        if self.rank == EXECUTOR || self.shares() {
            // Compiled now, so a rank without NVRTC says so in the exchange.
            cuda_reduce::copiers(ctx, device).map_err(|e| Fallback::new(e.msg, fix::NVRTC))?;
            if reduces {
                cuda_reduce::kernel(ctx, device, c.reduction()).map_err(|e| Fallback::new(e.msg, fix::NVRTC))?;
            }
        }
        let (sb, rb) = c.extents(self.rank, self.nranks).map_err(|e| Fallback::new(e.msg, ""))?;
        if c.placement == Placement::Host && sb + rb > 0 {
            return Err(Fallback::new("this rank's buffers are host memory", fix::HOST_MEMORY));
        }
        let (s0, r0) = (c.send as usize, c.recv as usize);
        if c.strided.is_some() && c.kind == CollKind::ReduceScatter && sb > 0 && rb > 0 && s0 < r0 + rb && r0 < s0 + sb
        {
            // Its blocks are packed while the results are written.
            return Err(Fallback::new("the output of a reduce_scatter along an axis overlaps its input", fix::OVERLAP));
        }
        let mut d = Desc::new(Part::Takes, fingerprint::one(call), c.v.clone());
        // The ranks in other processes that map this rank's buffers.
        let me = std::process::id();
        let to: Vec<usize> = (0..self.nranks)
            .filter(|&q| q != self.rank && self.pids[q] != me && (q == EXECUTOR || self.shares()))
            .collect();
        for (slot, (p, bytes)) in d.bufs.iter_mut().zip([(c.send, sb), (c.recv as *const u8, rb)]) {
            if bytes > 0 {
                let (handle, off) = inner.exported.handle(p, bytes, &to).map_err(|e| {
                    Fallback::new(
                        format!("its buffer {p:p} cannot be shared with other processes ({})", e.msg),
                        fix::export(p),
                    )
                })?;
                *slot = Buf { handle, offset: off as u64, addr: p as u64 };
            }
        }
        Ok(d)
    }
}
