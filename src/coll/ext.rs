//! Extensions beyond NCCL built from the core collectives: tensor-axis layouts,
//! coalesced (bucketed) calls, and planning helpers for frameworks.

use super::{Coll, CollKind, Strided};
use crate::comm::{group, Comm};
use crate::error::{Error, Result};
use crate::mem::{cuda, Placement};
use crate::types::{DataType, RedOp};
use std::sync::Arc;

/// A row-major tensor seen around one axis: `outer` x `along` x `inner` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AxisLayout {
    pub outer: usize,
    pub along: usize,
    pub inner: usize,
}

impl AxisLayout {
    pub fn total(&self) -> usize {
        self.outer * self.along * self.inner
    }
}

/// Checks a shape and an axis and splits the tensor around the axis.
pub fn axis_layout(shape: &[usize], axis: i32, dtype: DataType) -> Result<AxisLayout> {
    let nd = shape.len();
    if nd == 0 {
        return Err(Error::invalid_arg("ndims is 0; a tensor has at least one dimension"));
    }
    let axis = usize::try_from(axis).ok().filter(|&a| a < nd).ok_or_else(|| {
        Error::invalid_arg(format!("axis {axis} out of range for a tensor of {nd} dimensions (valid: 0..{})", nd - 1))
    })?;
    let mut total: usize = dtype.size();
    for (i, &d) in shape.iter().enumerate() {
        total = total.checked_mul(d).filter(|&t| t <= isize::MAX as usize).ok_or_else(|| {
            Error::invalid_arg(format!(
                "shape[{i}] = {d} makes the tensor's byte size overflow (shape {:?} of {dtype})",
                &shape[..nd.min(8)]
            ))
        })?;
    }
    Ok(AxisLayout {
        outer: shape[..axis].iter().product(),
        along: shape[axis],
        inner: shape[axis + 1..].iter().product(),
    })
}

/// The all_gather that gathers `shape` tensors along `axis`: rank r's block lands at
/// offset r * shape[axis] along the axis. Axis 0 (or any axis with nothing before it)
/// is a plain all_gather, with no extra copy.
pub fn all_gather_axis(send: *const u8, recv: *mut u8, l: AxisLayout, dtype: DataType) -> Coll {
    let mut c = Coll::new(CollKind::AllGather, send, recv, l.total(), dtype);
    if l.outer > 1 {
        c.strided = Some(Strided { outer: l.outer, block: l.along * l.inner });
    }
    c
}

/// The reduce_scatter that gives rank r block r along `axis` of the reduced tensor,
/// unpacked: with `strided`, each rank's input is `outer` rows of nranks blocks of
/// `block` elements and rank r gets block r of every row (the device path for ranks on
/// one GPU serves it so, with 2D copies); axis 0 is a plain reduce_scatter.
pub fn reduce_scatter_axis_strided(
    send: *const u8,
    recv: *mut u8,
    l: AxisLayout,
    dtype: DataType,
    op: RedOp,
    nranks: usize,
) -> Result<Coll> {
    if l.along % nranks != 0 {
        return Err(Error::invalid_arg(format!(
            "shape[axis] = {} does not divide by the {nranks} ranks of the communicator; each rank gets shape[axis]/nranks",
            l.along
        )));
    }
    let share = l.along / nranks * l.inner; // elements of one rank's block per outer row
    let mut c = Coll::new(CollKind::ReduceScatter, send, recv, l.outer * share, dtype);
    c.op = op;
    if l.outer > 1 && l.total() > 0 {
        c.strided = Some(Strided { outer: l.outer, block: share });
    }
    Ok(c)
}

/// The reduce_scatter that gives rank r block r along `axis` of the reduced tensor.
/// Axis 0 is a plain reduce_scatter; otherwise the input is first packed rank-major
/// (one copy of the input, owned by the call) so each rank's share is contiguous:
/// on the CPU for host memory, with strided copies on `stream` for device memory.
///
/// # Safety
/// `send` is NULL or holds the whole tensor of layout `l`, in memory of `place`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn reduce_scatter_axis(
    send: *const u8,
    recv: *mut u8,
    l: AxisLayout,
    dtype: DataType,
    op: RedOp,
    nranks: usize,
    place: Placement,
    stream: usize,
) -> Result<Coll> {
    let mut c = reduce_scatter_axis_strided(send, recv, l, dtype, op, nranks)?;
    if c.strided.is_none() || send.is_null() {
        c.strided = None;
        return Ok(c);
    }
    c.placement = place;
    c.stream = stream;
    // SAFETY: forwarded contract.
    unsafe { pack_reduce_scatter_at(&c, nranks) }
}

/// `c`, a reduce_scatter along an axis (device memory, see
/// [`reduce_scatter_axis_strided`]), as a plain reduce_scatter of a packed copy of its
/// input, made with strided copies on its stream.
pub fn pack_reduce_scatter(c: &Coll, nranks: usize) -> Result<Coll> {
    // SAFETY: a validated call's sendbuff holds the whole tensor in its memory.
    unsafe { pack_reduce_scatter_at(c, nranks) }
}

/// # Safety
/// `c.send` holds the whole tensor (`c.count * nranks` elements) in `c.placement`.
unsafe fn pack_reduce_scatter_at(c: &Coll, nranks: usize) -> Result<Coll> {
    let st = c.strided.ok_or_else(|| Error::internal("packing a reduce_scatter that is not along an axis"))?;
    let (es, send) = (c.dtype.size(), c.send);
    let (share, row, total) = (st.block, st.block * nranks, st.outer * st.block * nranks);
    let mut out = Coll { strided: None, ..c.clone() };
    // Rank r's block of outer row o moves from (o * row + r * share) to
    // (r * outer + o) * share: nranks strided copies of `outer` rows.
    match c.placement {
        Placement::Host => {
            let mut buf = crate::mem::pool::PooledBuf::take(total * es);
            let packed = &mut buf.as_mut_slice()[..total * es];
            for r in 0..nranks {
                for o in 0..st.outer {
                    let from = (o * row + r * share) * es;
                    let to = (r * st.outer * share + o * share) * es;
                    // SAFETY: sendbuff holds the whole tensor (the caller's contract);
                    // `from..from + share*es` lies inside it.
                    let src = unsafe { std::slice::from_raw_parts(send.add(from), share * es) };
                    packed[to..to + share * es].copy_from_slice(src);
                }
            }
            out.send = buf.as_ptr();
            out.keep = Some(Arc::new(buf));
        }
        Placement::Device { ctx, .. } => {
            let packed = cuda::Scratch::new(total * es, ctx, c.stream)?;
            let _g = cuda::CtxGuard::enter(ctx)?;
            for r in 0..nranks {
                // SAFETY: sendbuff holds the whole tensor on the device (caller's contract)
                // and the scratch as many bytes; every row below lies inside each.
                unsafe {
                    cuda::copy_2d_dtod_async(
                        packed.ptr().add(r * st.outer * share * es),
                        share * es,
                        send.add(r * share * es),
                        row * es,
                        share * es,
                        st.outer,
                        c.stream,
                    )?
                };
            }
            out.send = packed.ptr();
            out.keep = Some(Arc::new(packed));
        }
    }
    Ok(out)
}

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
    pub stream: usize,
}

impl Coalesced<'_> {
    /// The checks every rank's call passes before anything moves (a non-blocking
    /// communicator makes them before queueing the call).
    pub fn check(&self) -> Result<()> {
        self.validate(true, true).map(drop)
    }

    fn validate(&self, send_used: bool, recv_used: bool) -> Result<Vec<usize>> {
        let es = self.dtype.size();
        let mut sizes = Vec::with_capacity(self.counts.len());
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

/// One bucket's packed bytes: host memory, or device memory freed in stream order.
enum Bucket {
    Host(Vec<u8>),
    Device(Arc<cuda::Scratch>, usize),
}

impl Bucket {
    fn new(bytes: usize, b: &Coalesced<'_>) -> Result<Bucket> {
        Ok(match b.place {
            Placement::Host => Bucket::Host(vec![0u8; bytes]),
            Placement::Device { ctx, .. } => Bucket::Device(Arc::new(cuda::Scratch::new(bytes, ctx, b.stream)?), bytes),
        })
    }

    fn ptr(&self) -> *mut u8 {
        match self {
            Bucket::Host(v) => v.as_ptr() as *mut u8,
            Bucket::Device(s, _) => s.ptr(),
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
        let mut pass: Vec<(std::ops::Range<usize>, Bucket)> = Vec::new();
        let mut direct: Vec<Coll> = Vec::new();
        let mut staged = 0usize;
        while i < all.len() && (pass.is_empty() && direct.is_empty() || staged < PASS_BYTES) {
            let r = all[i].clone();
            let bytes: usize = sizes[r.clone()].iter().sum();
            if r.len() == 1 && bytes > limit {
                direct.push(per_buffer(r.start)); // too big for a bucket: travels alone, unstaged
            } else if bytes > 0 {
                staged += bytes;
                pass.push((r, Bucket::new(bytes, b)?));
            }
            i += 1;
        }
        let mut calls: Vec<Coll> = pass.iter().map(|(r, bk)| make(r, bk)).collect::<Result<_>>()?;
        calls.extend(direct);
        for c in &calls {
            c.validate(comm.rank, comm.nranks)?;
        }
        if !calls.is_empty() {
            comm.run(calls)?;
        }
        for (r, bk) in &pass {
            finish(r.clone(), bk)?;
        }
    }
    Ok(())
}

/// fcclCollectiveCounts: elements a rank must allocate for the NCCL-style call.
pub fn collective_counts(coll: i32, count: usize, nranks: usize, rank: usize, root: usize) -> Result<(usize, usize)> {
    let n = |c: usize| {
        c.checked_mul(nranks).ok_or_else(|| Error::invalid_arg(format!("count {c} * nranks {nranks} overflows size_t")))
    };
    let is_root = rank == root;
    Ok(match coll {
        0 => (count, count),
        1 => (if is_root { count } else { 0 }, count),
        2 => (count, if is_root { count } else { 0 }),
        3 => (count, n(count)?),
        4 => (n(count)?, count),
        5 => (n(count)?, n(count)?),
        6 => (count, if is_root { n(count)? } else { 0 }),
        7 => (if is_root { n(count)? } else { 0 }, count),
        c => return Err(Error::invalid_arg(format!("coll {c} is not a fcclCollective_t (valid: 0..7)"))),
    })
}

/// fcclCollectiveAdjoint: the collective that computes a collective's gradient.
pub fn collective_adjoint(coll: i32) -> Result<i32> {
    Ok(match coll {
        0 => 0,
        1 => 2,
        2 => 1,
        3 => 4,
        4 => 3,
        5 => 5,
        6 => 7,
        7 => 6,
        c => return Err(Error::invalid_arg(format!("coll {c} is not a fcclCollective_t (valid: 0..7)"))),
    })
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

    #[test]
    fn axis_layout_names_bad_dimensions() {
        let l = axis_layout(&[2, 3, 4], 1, DataType::Float32).unwrap();
        assert_eq!(l, AxisLayout { outer: 2, along: 3, inner: 4 });
        assert!(axis_layout(&[], 0, DataType::Float32).unwrap_err().msg.contains("ndims"));
        assert!(axis_layout(&[2, 3], 2, DataType::Float32).unwrap_err().msg.contains("axis 2 out of range"));
        assert!(axis_layout(&[2, 3], -1, DataType::Float32).is_err());
        let e = axis_layout(&[2, usize::MAX / 2, 3], 0, DataType::Float32).unwrap_err();
        assert!(e.msg.contains("shape[1]"), "{}", e.msg);
    }

    #[test]
    fn adjoints_pair_up() {
        for c in 0..8 {
            assert_eq!(collective_adjoint(collective_adjoint(c).unwrap()).unwrap(), c);
        }
        assert!(collective_adjoint(8).is_err());
        assert_eq!(collective_counts(6, 3, 4, 0, 0).unwrap(), (3, 12));
        assert_eq!(collective_counts(6, 3, 4, 1, 0).unwrap(), (3, 0));
    }
}
