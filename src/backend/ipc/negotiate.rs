//! How the ranks agree on a collective before anything is enqueued: each checks what
//! it can do (capture, the mode, its buffers), sends the others its descriptor, and
//! every rank reads the same verdict from the same descriptors.

use super::desc::{Buf, Desc, Part};
use super::fallback::{fix, Fallback};
use super::{own_seq, Inner, Ipc, Mode, EXECUTOR};
use crate::backend::{capture, Exec, Outcome, Posting};
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
#[derive(Default)]
pub(super) struct Agreed {
    /// Every rank's descriptor, rank by rank.
    pub descs: Vec<Desc>,
    /// Every rank's arrays, for calls with per-rank counts (else empty).
    pub counts: Vec<VCounts>,
    /// Mappings of freed allocations that went in this call (closed once the GPU is
    /// past the calls that used them).
    pub gone: Vec<usize>,
    /// Every rank posts its descriptors of the next calls instead (`posts`).
    pub posts: bool,
    /// Run by this rank's proxy thread (`posts`), whose caller's stream waits for the
    /// call's end itself.
    pub proxied: bool,
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
                self.mapped().close_finished(ctl);
            }
        } else if reason.is_none() {
            // Synced: inputs complete before the executor reads them.
            cuda::sync(c.stream)?;
        }
        let prepared = match &reason {
            Some(f) => Err(f.clone()),
            None => self.prepare(call, ctx, device, inner, stream),
        };
        let (mut mine, mut fallback) = match prepared {
            Ok(d) => (d, None),
            Err(f) => {
                let part = if captured { Part::Captured } else { Part::Cannot };
                (Desc::new(part, fingerprint::one(call), c.v.clone()), Some(f))
            }
        };
        // Unless every call must be agreed, ranks ordered on the streams stop agreeing
        // on the host once every rank can (see `posts`); checkMode unset waits for a
        // call on device memory, so host-memory programs keep their per-call verdicts.
        mine.posts = stream
            && match x.posting {
                Posting::Never => false,
                Posting::Device => c.placement != Placement::Host,
                Posting::Always => true,
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
            let m = &mut *self.mapped();
            m.freed.apply(ctl, rank, &self.pids, ctx, &mut m.maps, &mut gone);
        }
        // Every rank compares what every rank called, before anything is enqueued: a
        // difference fails the call on every rank alike, whatever FERROCCL_CHECK says.
        if let Some(e) = fingerprint::verdict(rank, n, &mine.fp, |p| &descs[p].fp) {
            self.defer_close(gone);
            return Ok(Negotiated::Mismatch(e));
        }
        let unable: Vec<usize> = (0..n).filter(|&q| descs[q].part != Part::Takes).collect();
        if fallback.is_none() && !unable.is_empty() {
            let who = unable.iter().map(|q| q.to_string()).collect::<Vec<_>>().join(", ");
            fallback = Some(Fallback::new(format!("rank(s) {who} cannot take it GPU to GPU"), fix::PEER));
        }
        if let Some(f) = fallback {
            self.defer_close(gone);
            return Ok(Negotiated::Fallback(f));
        }
        // Per-rank counts: every rank checks every pair from the same descriptors, so all
        // return the same verdict, and nothing is enqueued on a mismatch.
        let counts: Vec<VCounts> = descs.iter_mut().filter_map(|d| d.counts.take()).collect();
        if let Some(e) = counts::verdict(c, rank, &counts) {
            self.defer_close(gone);
            return Ok(Negotiated::BadCounts(e));
        }
        let posts = descs.iter().all(|d| d.posts);
        Ok(Negotiated::Run(Agreed { descs, counts, gone, posts, proxied: false }))
    }

    /// This rank's descriptor of `call`, or why it cannot take the call GPU to GPU.
    /// `streamed`: the call is ordered on the streams, so buffers that cannot be shared
    /// can go through lent device memory instead (`detour`).
    pub(super) fn prepare(
        &self,
        call: &Call,
        ctx: cuda::Ctx,
        device: i32,
        inner: &mut Inner,
        streamed: bool,
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
        // The ranks in other processes that map this rank's buffers.
        let me = std::process::id();
        let to: Vec<usize> = (0..self.nranks)
            .filter(|&q| q != self.rank && self.pids[q] != me && (q == EXECUTOR || self.shares()))
            .collect();
        if c.placement == Placement::Host && sb + rb > 0 {
            if !(streamed && self.posting.load(std::sync::atomic::Ordering::Relaxed)) {
                return Err(Fallback::new("this rank's buffers are host memory", fix::HOST_MEMORY));
            }
            let why = Fallback::new("this rank's buffers are host memory", fix::HOST_MEMORY_POSTED);
            // A posted call cannot be staged (the ranks did not agree on it): its host
            // buffers go through lent device memory instead.
            let d = Desc::new(Part::Takes, fingerprint::one(call), c.v.clone());
            return self.detour(c, (sb, rb), ctx, inner, &to, d, why, true);
        }
        let (s0, r0) = (c.send as usize, c.recv as usize);
        if c.strided.is_some() && c.kind == CollKind::ReduceScatter && sb > 0 && rb > 0 && s0 < r0 + rb && r0 < s0 + sb
        {
            // Its blocks are packed while the results are written.
            return Err(Fallback::new("the output of a reduce_scatter along an axis overlaps its input", fix::OVERLAP));
        }
        let mut d = Desc::new(Part::Takes, fingerprint::one(call), c.v.clone());
        let bufs = [(c.send, sb), (c.recv as *const u8, rb)];
        if to.is_empty() {
            // Only ranks of this process read them (the executor's own, threads): their
            // addresses serve, whatever memory they are.
            for (slot, (p, bytes)) in d.bufs.iter_mut().zip(bufs) {
                if bytes > 0 {
                    *slot = Buf { handle: [0; 64], offset: 0, addr: p as u64 };
                }
            }
            return Ok(d);
        }
        for (slot, (p, bytes)) in d.bufs.iter_mut().zip(bufs) {
            if bytes > 0 {
                match inner.exported.handle(p, bytes, &to) {
                    Ok((handle, off)) => *slot = Buf { handle, offset: off as u64, addr: p as u64 },
                    Err(e) => {
                        let why = Fallback::new(
                            format!("its buffer {p:p} cannot be shared with other processes ({})", e.msg),
                            fix::export(p),
                        );
                        if !streamed {
                            return Err(why);
                        }
                        return self.detour(c, (sb, rb), ctx, inner, &to, d, why, false);
                    }
                }
            }
        }
        Ok(d)
    }

    /// `d` with this rank's buffers replaced by device memory the communicator lends
    /// (shared with the ranks `to`), for buffers that cannot be shared themselves or are
    /// `host` memory (`why`): the stream copies the inputs in before it signals and the
    /// results out after the call ([`Detour`], kept in `inner` for `run_streamed`;
    /// from host memory, the call then waits for its stream). Send and receive extents that
    /// overlap keep their overlap (in place stays in place); each keeps its address
    /// modulo 256, so the executor's 16-byte vector path applies as it would have.
    #[allow(clippy::too_many_arguments)]
    fn detour(
        &self,
        c: &crate::coll::Coll,
        (sb, rb): (usize, usize),
        ctx: cuda::Ctx,
        inner: &mut Inner,
        to: &[usize],
        mut d: Desc,
        why: Fallback,
        host: bool,
    ) -> std::result::Result<Desc, Fallback> {
        const ALIGN: usize = 256;
        let (s0, r0) = (c.send as usize, c.recv as usize);
        let overlap = sb > 0 && rb > 0 && s0 < r0 + rb && r0 < s0 + sb;
        let (span, s_at, r_at) = if overlap {
            let lo = s0.min(r0);
            let at = lo % ALIGN;
            (at + (s0 + sb).max(r0 + rb) - lo, at + s0 - lo, at + r0 - lo)
        } else {
            let s_at = s0 % ALIGN;
            let r_at = (s_at + sb).div_ceil(ALIGN) * ALIGN + r0 % ALIGN;
            (r_at + rb, s_at, r_at)
        };
        let lease = self.bounce.take(span, ctx, c.stream).map_err(|e| Fallback::new(e.msg, why.fix))?;
        let base = lease.ptr();
        for (slot, (at, bytes)) in d.bufs.iter_mut().zip([(s_at, sb), (r_at, rb)]) {
            if bytes > 0 {
                let p = base.wrapping_add(at);
                let (handle, off) = if to.is_empty() {
                    ([0; 64], 0)
                } else {
                    inner.exported.handle(p, bytes, to).map_err(|e| {
                        Fallback::new(
                            format!("{}; nor can the device memory lent for it ({})", why.why, e.msg),
                            why.fix,
                        )
                    })?
                };
                *slot = Buf { handle, offset: off as u64, addr: p as u64 };
            }
        }
        let mut copy_in = Vec::new();
        if sb > 0 {
            copy_in.push((base as usize + s_at, c.send as usize, sb));
        }
        // Calls with per-rank counts leave gaps in the receive extent that the results
        // do not cover: they go in too, so that copying the results out keeps them.
        if rb > 0 && c.v.is_some() {
            copy_in.push((base as usize + r_at, c.recv as usize, rb));
        }
        let copy_out = (rb > 0).then(|| (c.recv as usize, base as usize + r_at, rb));
        self.detoured(c.kind.c_name(), &why);
        inner.detour = Some(Detour { _lease: lease, copy_in, copy_out, host });
        Ok(d)
    }
}

/// A call's buffers moved through lent device memory on this rank's stream: copied in
/// (destination, source, bytes; device addresses, never dereferenced on the host) before
/// it signals, the results out after the call.
pub(super) struct Detour {
    /// Lent until dropped, once the copies are queued.
    _lease: cuda::Lease,
    copy_in: Vec<(usize, usize, usize)>,
    copy_out: Option<(usize, usize, usize)>,
    /// The call's buffers are host memory.
    host: bool,
}

impl Detour {
    /// Queues the copies in on `s`.
    ///
    /// # Safety
    /// The call's buffers are valid for their extents in the current context until the
    /// stream has run the copies.
    pub unsafe fn enter(&self, s: cuda::Stream) -> Result<()> {
        for &(dst, src, len) in &self.copy_in {
            // SAFETY: the lease holds the extents (made for them); the caller's contract.
            unsafe {
                if self.host {
                    cuda::copy_htod_async(dst as *mut u8, src as *const u8, len, s)?;
                } else {
                    cuda::copy_dtod_async(dst as *mut u8, src as *const u8, len, s)?;
                }
            }
        }
        Ok(())
    }

    /// Queues the copy of the results out on `s`.
    ///
    /// # Safety
    /// As [`Detour::enter`].
    pub unsafe fn leave(&self, s: cuda::Stream) -> Result<()> {
        if let Some((dst, src, len)) = self.copy_out {
            // SAFETY: as in `enter`.
            unsafe {
                if self.host {
                    cuda::copy_dtoh_async(dst as *mut u8, src as *const u8, len, s)?;
                } else {
                    cuda::copy_dtod_async(dst as *mut u8, src as *const u8, len, s)?;
                }
            }
        }
        Ok(())
    }

    /// Host memory holds its results when the call returns (pinned memory included):
    /// waits for `s` (after the watchdog knows the call, so that the wait ends).
    /// Whether it waited.
    pub fn finish(&self, s: cuda::Stream) -> Result<bool> {
        if self.host {
            cuda::sync(s)?;
        }
        Ok(self.host)
    }
}
