//! Coalesced (bucketed) calls: many small buffers packed into buckets, one
//! collective per bucket.

use crate::coll::{Coll, CollKind};
use crate::comm::{group, Comm};
use crate::error::{Error, Result};
use crate::mem::{cuda, fallible, Placement};
use crate::types::{DataType, RedOp};
use std::sync::Arc;

/// Default bucket size for coalesced calls (PyTorch DDP's default).
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Groups buffers (by byte size) into buckets of at most `bucket` bytes, in order.
/// A buffer larger than a bucket gets a bucket of its own. Returns index ranges.
pub fn buckets(sizes: &[usize], bucket: usize) -> Vec<std::ops::Range<usize>> {
    let bucket = if bucket == 0 { DEFAULT_BUCKET_BYTES } else { bucket };
    let mut out = Vec::new();
    let (mut start, mut fill) = (0, 0usize);
    for (i, &b) in sizes.iter().enumerate() {
        if i > start && fill + b > bucket {
            out.push(start..i);
            start = i;
            fill = 0;
        }
        fill += b;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// Buffers of one coalesced call.
pub struct Coalesced<'a> {
    pub sends: &'a [*const u8],
    pub recvs: &'a [*mut u8],
    pub counts: &'a [usize],
    pub dtype: DataType,
    /// Where every buffer lives, and the stream device buffers are used on.
    pub place: Placement,
    pub stream: cuda::Stream,
}

impl Coalesced<'_> {
    /// The checks every rank's call passes before anything moves (a non-blocking
    /// communicator makes them before queueing the call).
    pub fn check(&self) -> Result<()> {
        self.validate(true, true).map(drop)
    }

    fn validate(&self, send_used: bool, recv_used: bool) -> Result<Vec<usize>> {
        let es = self.dtype.size();
        let mut sizes = fallible::with_capacity(self.counts.len()).ok_or_else(|| {
            fallible::out_of_memory(
                std::mem::size_of_val(self.counts),
                format_args!("the sizes of the {} buffers", self.counts.len()),
                "pass fewer buffers per call",
            )
        })?;
        for (i, &c) in self.counts.iter().enumerate() {
            let b = c.checked_mul(es).filter(|&b| b <= isize::MAX as usize).ok_or_else(|| {
                Error::invalid_arg(format!("counts[{i}] = {c} elements of {} overflows the address space", self.dtype))
            })?;
            if b > 0 && send_used && self.sends[i].is_null() {
                return Err(Error::invalid_arg(format!("buffer {i} is NULL with counts[{i}] = {c}")));
            }
            if b > 0 && recv_used && self.recvs[i].is_null() {
                return Err(Error::invalid_arg(format!("receive buffer {i} is NULL with counts[{i}] = {c}")));
            }
            sizes.push(b);
        }
        Ok(sizes)
    }

    /// A call of this coalesced call's memory and stream.
    fn call(&self, kind: CollKind, send: *const u8, recv: *mut u8, count: usize) -> Coll {
        let mut c = Coll::new(kind, send, recv, count, self.dtype);
        c.placement = self.place;
        c.stream = self.stream;
        c
    }
}

/// fcclAllReduceCoalesced: every bucket is packed, all-reduced once, and unpacked;
/// results are identical to one all_reduce per buffer (the reduction is elementwise).
pub fn all_reduce_coalesced(comm: &Arc<Comm>, b: &Coalesced<'_>, op: RedOp, bucket: usize) -> Result<()> {
    let sizes = b.validate(true, true)?;
    let with_op = |mut c: Coll| {
        c.op = op;
        c
    };
    run_buckets(
        comm,
        b,
        &sizes,
        bucket,
        |i| with_op(b.call(CollKind::AllReduce, b.sends[i], b.recvs[i], b.counts[i])),
        |range, bk| {
            pack(b, range.clone(), &sizes, |i| b.sends[i], bk)?;
            Ok(with_op(b.call(CollKind::AllReduce, bk.ptr(), bk.ptr(), bk.len() / b.dtype.size())))
        },
        |range, bk| unpack(b, range, &sizes, |i| b.recvs[i], bk),
    )
}

/// fcclBroadcastCoalesced: the root packs each bucket, one broadcast per bucket,
/// every other rank unpacks.
pub fn broadcast_coalesced(comm: &Arc<Comm>, b: &Coalesced<'_>, root: usize, bucket: usize) -> Result<()> {
    let sizes = b.validate(true, true)?;
    let is_root = comm.rank == root;
    let rooted = |mut c: Coll| {
        c.root = root;
        c
    };
    run_buckets(
        comm,
        b,
        &sizes,
        bucket,
        |i| rooted(b.call(CollKind::Broadcast, b.sends[i], b.recvs[i], b.counts[i])),
        |range, bk| {
            if is_root {
                pack(b, range.clone(), &sizes, |i| b.sends[i], bk)?;
            }
            Ok(rooted(b.call(CollKind::Broadcast, bk.ptr(), bk.ptr(), bk.len() / b.dtype.size())))
        },
        |range, bk| if is_root { Ok(()) } else { unpack(b, range, &sizes, |i| b.recvs[i], bk) },
    )
}

/// One bucket's packed bytes: host memory, or a part of the communicator's device
/// arena (reused call after call, so the GPU-to-GPU path shares it with peers once).
enum Bucket {
    Host(Box<[u8]>),
    Device(*mut u8, usize),
}

/// Buckets of one pass start at multiples of this (the reduction kernels' vector loads).
const BUCKET_ALIGN: usize = 256;

impl Bucket {
    fn ptr(&self) -> *mut u8 {
        match self {
            Bucket::Host(v) => v.as_ptr() as *mut u8,
            Bucket::Device(p, _) => *p,
        }
    }

    fn len(&self) -> usize {
        match self {
            Bucket::Host(v) => v.len(),
            Bucket::Device(_, n) => *n,
        }
    }
}

/// Copies `bytes` between a buffer of the coalesced call and a bucket: on the CPU,
/// or on the call's stream for device memory (the context entered by the caller).
///
/// # Safety
/// Both ranges are valid for `bytes` in memory of `b.place` and do not overlap.
unsafe fn copy(b: &Coalesced<'_>, dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
    match b.place {
        // SAFETY: guaranteed by the caller.
        Placement::Host => unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) },
        // SAFETY: guaranteed by the caller; the buffer's context is current.
        Placement::Device { .. } => unsafe { cuda::copy_dtod_async(dst, src, bytes, b.stream)? },
    }
    Ok(())
}

fn device_guard(b: &Coalesced<'_>) -> Result<Option<cuda::CtxGuard>> {
    match b.place {
        Placement::Host => Ok(None),
        Placement::Device { ctx, .. } => cuda::CtxGuard::enter(ctx).map(Some),
    }
}

fn pack(
    b: &Coalesced<'_>,
    range: std::ops::Range<usize>,
    sizes: &[usize],
    src: impl Fn(usize) -> *const u8,
    out: &Bucket,
) -> Result<()> {
    let _g = device_guard(b)?;
    let mut off = 0;
    for i in range {
        if sizes[i] > 0 {
            // SAFETY: buffer i holds sizes[i] bytes (validated non-NULL, caller's
            // contract); the bucket holds the range's total and is separate memory.
            unsafe { copy(b, out.ptr().add(off), src(i), sizes[i])? };
        }
        off += sizes[i];
    }
    Ok(())
}

fn unpack(
    b: &Coalesced<'_>,
    range: std::ops::Range<usize>,
    sizes: &[usize],
    dst: impl Fn(usize) -> *mut u8,
    packed: &Bucket,
) -> Result<()> {
    let _g = device_guard(b)?;
    let mut off = 0;
    for i in range {
        if sizes[i] > 0 {
            // SAFETY: as in pack, the other way round.
            unsafe { copy(b, dst(i), packed.ptr().add(off), sizes[i])? };
        }
        off += sizes[i];
    }
    Ok(())
}

/// Runs one collective per bucket. Inside a group the buffers are queued one call
/// each (a group's calls run at its end, after this function has returned, so there
/// is no moment to unpack); outside, buckets run in passes of bounded memory, the
/// buckets of one pass together so they pipeline. Device buckets are packed and
/// unpacked on the call's stream, so the host never waits for them.
fn run_buckets(
    comm: &Arc<Comm>,
    b: &Coalesced<'_>,
    sizes: &[usize],
    bucket: usize,
    per_buffer: impl Fn(usize) -> Coll,
    make: impl Fn(&std::ops::Range<usize>, &Bucket) -> Result<Coll>,
    finish: impl Fn(std::ops::Range<usize>, &Bucket) -> Result<()>,
) -> Result<()> {
    if group::active() {
        for (i, &bytes) in sizes.iter().enumerate() {
            if bytes > 0 {
                let c = per_buffer(i);
                c.validate(comm.rank, comm.nranks)?;
                group::enqueue(comm, c)?;
            }
        }
        return Ok(());
    }
    const PASS_BYTES: usize = 64 << 20;
    let limit = if bucket == 0 { DEFAULT_BUCKET_BYTES } else { bucket };
    let all = buckets(sizes, bucket);
    let mut i = 0;
    while i < all.len() {
        // One pass: buckets up to PASS_BYTES of staging, at least one.
        let mut ranges: Vec<(std::ops::Range<usize>, usize)> = Vec::new();
        let mut direct: Vec<Coll> = Vec::new();
        let mut staged = 0usize;
        while i < all.len() && (ranges.is_empty() && direct.is_empty() || staged < PASS_BYTES) {
            let r = all[i].clone();
            let bytes: usize = sizes[r.clone()].iter().sum();
            if r.len() == 1 && bytes > limit {
                direct.push(per_buffer(r.start)); // too big for a bucket: travels alone, unstaged
            } else if bytes > 0 {
                staged += bytes.next_multiple_of(BUCKET_ALIGN);
                ranges.push((r, bytes));
            }
            i += 1;
        }
        let mut arena = match b.place {
            Placement::Device { ctx, .. } if staged > 0 => {
                let mut a = comm.buckets.lock().unwrap_or_else(|p| p.into_inner());
                let base = a.take(staged, ctx, b.stream)?;
                Some((a, base))
            }
            _ => None,
        };
        let mut at = 0;
        // Every bucket of the pass is had before any of its calls runs: when there is
        // no memory for one, this pass fails with nothing of it counted or sent.
        let pass: Vec<(std::ops::Range<usize>, Bucket)> = ranges
            .into_iter()
            .map(|(r, bytes)| {
                let bk = match &arena {
                    // The arena holds `staged` bytes: every bucket of the pass, aligned.
                    Some((_, base)) => Bucket::Device(base.wrapping_add(at), bytes),
                    None => Bucket::Host(fallible::zeroed(bytes).ok_or_else(|| {
                        fallible::out_of_memory(
                            bytes,
                            format_args!("a bucket packing buffers {}..{} in host memory", r.start, r.end),
                            "pass a smaller bucketBytes (0: 25 MiB); a buffer larger than bucketBytes travels alone, unpacked",
                        )
                    })?),
                };
                at += bytes.next_multiple_of(BUCKET_ALIGN);
                Ok((r, bk))
            })
            .collect::<Result<_>>()?;
        let mut calls: Vec<Coll> = pass.iter().map(|(r, bk)| make(r, bk)).collect::<Result<_>>()?;
        calls.extend(direct);
        for c in &calls {
            c.validate(comm.rank, comm.nranks)?;
        }
        let ran = if calls.is_empty() { Ok(()) } else { comm.run(calls) };
        let finished = ran.and_then(|_| pass.iter().try_for_each(|(r, bk)| finish(r.clone(), bk)));
        if let Some((a, _)) = arena.as_mut() {
            // Whatever happened, the next use waits for what this pass queued.
            a.used(b.stream)?;
        }
        finished?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_respect_the_limit_and_big_buffers_travel_alone() {
        assert_eq!(buckets(&[10, 10, 10, 50, 5, 5], 25), vec![0..2, 2..3, 3..4, 4..6]);
        assert_eq!(buckets(&[], 25), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(buckets(&[1; 1000], 0), vec![0..1000]);
    }
}
