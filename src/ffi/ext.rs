//! Extensions beyond NCCL (docs/abi.md's last section): uneven, axis-aware, coalesced,
//! narrow-wire and local collectives, and planning helpers.

use super::args::{array, borrow_array, count_arg, dtype, rank_arg, read_only, redop};
use super::boundary::{call, Out};
use super::coll::submit;
use super::handle;
use super::*;
use crate::coll::ext::{self as cx, AxisLayout};
use crate::coll::{Coll, CollKind, VCounts};
use crate::comm::{group, Comm, Issued};
use crate::error::{Error, Result};
use crate::mem;
use crate::ops::coalesced::{self, Coalesced};
use crate::ops::{axis, local};
use crate::types::DataType;
use std::mem::MaybeUninit;
use std::os::raw::{c_int, c_void};
use std::sync::Arc;

/// The planning helpers' collective ids (fcclCollectiveCounts and fcclCollectiveAdjoint
/// take and give them as `int`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum fcclCollective {
    fcclCollAllReduce = 0,
    fcclCollBroadcast = 1,
    fcclCollReduce = 2,
    fcclCollAllGather = 3,
    fcclCollReduceScatter = 4,
    fcclCollAlltoAll = 5,
    fcclCollGather = 6,
    fcclCollScatter = 7,
}

/// A collective id as an integer (a [`fcclCollective`] value).
/// cbindgen:no-export
pub type fcclCollective_t = c_int;
int_values!(fcclCollective_t = fcclCollective::{
    fcclCollAllReduce, fcclCollBroadcast, fcclCollReduce, fcclCollAllGather, fcclCollReduceScatter,
    fcclCollAlltoAll, fcclCollGather, fcclCollScatter,
});

/// Gathers `sendcount` elements from every rank: rank p's `recvcounts[p]` elements land
/// at `rdispls[p]` of `recvbuff` (arrays of nranks entries, in elements). Counts may be
/// 0. If a rank's sendcount differs from what the others pass in recvcounts, every rank
/// returns fcclCollectiveMismatch and no data moves. In place when
/// `sendbuff == recvbuff + rdispls[rank]`.
#[no_mangle]
pub unsafe extern "C" fn fcclAllGatherV(
    sendbuff: *const c_void,
    sendcount: usize,
    recvbuff: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    datatype: fcclDataType_t,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclAllGatherV", || {
        submit(comm, stream, |cm| {
            let n = cm.nranks;
            // SAFETY: arrays are NULL (refused) or nranks long (API contract).
            let (recvcounts, rdispls) =
                unsafe { (borrow_array(recvcounts, n, "recvcounts")?, borrow_array(rdispls, n, "rdispls")?) };
            let mut c = Coll::new(CollKind::AllGatherV, sendbuff as _, recvbuff as _, sendcount, dtype(datatype)?);
            c.v = Some(VCounts::gather_v(sendcount, n, recvcounts, rdispls));
            Ok(c)
        })
    })
}

/// Reduces across ranks; rank r receives `recvcounts[r]` elements reduced from
/// `sendbuff + sdispls[r]` of every rank. Every rank passes the same recvcounts
/// (else fcclCollectiveMismatch everywhere, no data moved); counts may be 0.
#[no_mangle]
pub unsafe extern "C" fn fcclReduceScatterV(
    sendbuff: *const c_void,
    recvcounts: *const usize,
    sdispls: *const usize,
    recvbuff: *mut c_void,
    datatype: fcclDataType_t,
    op: fcclRedOp_t,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclReduceScatterV", || {
        submit(comm, stream, |cm| {
            let n = cm.nranks;
            // SAFETY: arrays are NULL (refused) or nranks long (API contract).
            let (recvcounts, sdispls) =
                unsafe { (borrow_array(recvcounts, n, "recvcounts")?, borrow_array(sdispls, n, "sdispls")?) };
            let mine = recvcounts[cm.rank];
            let mut c = Coll::new(CollKind::ReduceScatterV, sendbuff as _, recvbuff as _, mine, dtype(datatype)?);
            c.op = redop(op, c.dtype)?;
            c.v = Some(VCounts::new(&[], sdispls, recvcounts, &[]));
            Ok(c)
        })
    })
}

/// Reads a shape of `ndims` dimensions and splits it around `axis`.
///
/// # Safety
/// `shape` is NULL or valid for `ndims` reads.
unsafe fn layout(ndims: c_int, shape: *const usize, axis: c_int, dt: DataType) -> Result<AxisLayout> {
    if ndims <= 0 {
        return Err(Error::invalid_arg(format!("ndims is {ndims}; a tensor has at least one dimension")));
    }
    // SAFETY: forwarded contract.
    let shape = unsafe { array(shape, ndims as usize, "shape") }?;
    cx::axis_layout(&shape, axis, dt)
}

/// Gathers a row-major tensor of `shape` from every rank along `axis`: the result has
/// shape[axis]*nranks along the axis, rank r's block at offset r*shape[axis]. Axis 0
/// is a plain all_gather with no extra copy.
#[no_mangle]
pub unsafe extern "C" fn fcclAllGatherAxis(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    ndims: c_int,
    shape: *const usize,
    axis: c_int,
    datatype: fcclDataType_t,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclAllGatherAxis", || {
        submit(comm, stream, |cm| {
            let dt = dtype(datatype)?;
            // SAFETY: shape is NULL (refused) or ndims long (API contract).
            let l = unsafe { layout(ndims, shape, axis, dt) }?;
            // The result is nranks times larger along the axis: name the axis if that overflows.
            l.total()
                .checked_mul(cm.nranks)
                .and_then(|t| t.checked_mul(dt.size()))
                .filter(|&b| b <= isize::MAX as usize)
                .ok_or_else(|| {
                    Error::invalid_arg(format!(
                        "shape[{axis}] = {} gathered from {} ranks makes the result's byte size overflow",
                        l.along, cm.nranks
                    ))
                })?;
            Ok(cx::all_gather_axis(sendbuff as _, recvbuff as _, l, dt))
        })
    })
}

/// Reduces a row-major tensor of `shape` (the input's) across ranks; rank r gets block
/// r along `axis` (shape[axis]/nranks wide; shape[axis] must divide by nranks). Along
/// an axis > 0 the input is first packed into a copy owned by the call (on `stream`
/// for device memory), except where the ranks share one GPU: that path reads the
/// blocks where they lie.
#[no_mangle]
pub unsafe extern "C" fn fcclReduceScatterAxis(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    ndims: c_int,
    shape: *const usize,
    axis: c_int,
    datatype: fcclDataType_t,
    op: fcclRedOp_t,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclReduceScatterAxis", || {
        submit(comm, stream, |cm| {
            let dt = dtype(datatype)?;
            let op = redop(op, dt)?;
            // SAFETY: shape is NULL (refused) or ndims long (API contract).
            let l = unsafe { layout(ndims, shape, axis, dt) }?;
            if l.total() > 0 && sendbuff.is_null() {
                return Err(Error::invalid_arg("sendbuff is NULL for a non-empty tensor"));
            }
            // The input is packed first (axis > 0): on the CPU or on the stream, as it lives.
            let place = if l.outer > 1 {
                mem::placement(&[("sendbuff", sendbuff as *const u8), ("recvbuff", recvbuff as *const u8)])?
            } else {
                mem::Placement::Host
            };
            // Unless the device path of ranks on one GPU takes it unpacked (2D copies there).
            let mut c = cx::reduce_scatter_axis_strided(sendbuff as _, recvbuff as _, l, dt, op, cm.nranks)?;
            let (sb, rb) = (l.total() * dt.size(), l.total() / cm.nranks * dt.size());
            let (s0, r0) = (sendbuff as usize, recvbuff as usize);
            let apart = s0.saturating_add(sb) <= r0 || r0.saturating_add(rb) <= s0;
            c.placement = place;
            if c.strided.is_some() && apart && matches!(place, mem::Placement::Device { .. }) && cm.ipc_takes(&c) {
                return Ok(c);
            }
            // SAFETY: sendbuff holds the tensor in memory of `place` (API contract; NULL refused above).
            unsafe {
                axis::reduce_scatter_axis(
                    sendbuff as _,
                    recvbuff as _,
                    l,
                    axis as usize,
                    dt,
                    op,
                    cm.nranks,
                    place,
                    crate::mem::cuda::Stream::from_ptr(stream as _),
                )
            }
        })
    })
}

/// The one placement of a coalesced call's non-empty buffers (arrays named as in C):
/// all host memory or all device memory of one context, else fcclInvalidArgument
/// naming two buffers of different kinds.
fn coalesced_placement(arrays: &[(&str, &[*const u8])], counts: &[usize]) -> Result<mem::Placement> {
    if !mem::cuda::active() {
        return Ok(mem::Placement::Host);
    }
    let names: Vec<(String, *const u8)> = arrays
        .iter()
        .flat_map(|(name, ptrs)| {
            ptrs.iter().enumerate().filter(|(i, _)| counts[*i] > 0).map(move |(i, &p)| (format!("{name}[{i}]"), p))
        })
        .collect();
    let named: Vec<(&str, *const u8)> = names.iter().map(|(n, p)| (n.as_str(), *p)).collect();
    mem::placement(&named)
}

/// A coalesced call's arrays, owned: a non-blocking communicator runs the call later.
struct Arrays {
    sends: Vec<*const u8>,
    recvs: Vec<*mut u8>,
    counts: Vec<usize>,
    dtype: DataType,
    place: mem::Placement,
    stream: crate::mem::cuda::Stream,
}

// SAFETY: the pointers are the caller's buffers, used by the communicator's progress
// thread only while the call is pending, which the C contract allows.
unsafe impl Send for Arrays {}

impl Arrays {
    fn view(&self) -> Coalesced<'_> {
        Coalesced {
            sends: &self.sends,
            recvs: &self.recvs,
            counts: &self.counts,
            dtype: self.dtype,
            place: self.place,
            stream: self.stream,
        }
    }
}

/// Runs a coalesced call now (a blocking communicator, or inside a group, where it
/// queues one call per buffer), or checks it and queues it whole on a non-blocking
/// communicator's progress thread.
fn issue_coalesced(
    c: &Arc<Comm>,
    what: &'static str,
    a: Arrays,
    run: impl FnOnce(&Arc<Comm>, &Coalesced<'_>) -> Result<()> + Send + 'static,
) -> Result<Issued> {
    if c.opts.blocking || group::active() {
        return run(c, &a.view()).map(|()| Issued::Done);
    }
    a.view().check()?;
    c.enqueue(what, move |c| run(c, &a.view()))
}

/// All-reduces `nbuffers` buffers packed into buckets of at most `bucketBytes` (0 =
/// 25 MiB): one all_reduce per bucket, results identical to one fcclAllReduce per
/// buffer. A buffer larger than a bucket travels alone. In place when
/// recvbuffs[i] == sendbuffs[i]. Inside a group, the buffers are queued one call each.
/// The buffers are all host memory or all device memory of one device (else
/// fcclInvalidArgument naming two of them); device buckets are packed, reduced and
/// unpacked in order on `stream`, like any device call.
#[no_mangle]
pub unsafe extern "C" fn fcclAllReduceCoalesced(
    sendbuffs: *const *const c_void,
    recvbuffs: *const *mut c_void,
    counts: *const usize,
    nbuffers: c_int,
    datatype: fcclDataType_t,
    op: fcclRedOp_t,
    bucketBytes: usize,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclAllReduceCoalesced", || {
        let c = handle::get(comm)?;
        let nb = count_arg(nbuffers, "nbuffers")?;
        let dt = dtype(datatype)?;
        let op = redop(op, dt)?;
        // SAFETY: arrays are NULL (refused) or nbuffers long (API contract).
        let (sends, recvs, counts) = unsafe {
            (
                array(sendbuffs as *const *const u8, nb, "sendbuffs")?,
                array(recvbuffs as *const *mut u8, nb, "recvbuffs")?,
                array(counts, nb, "counts")?,
            )
        };
        let recv_ptrs = read_only(&recvs, "recvbuffs")?;
        let place = coalesced_placement(&[("sendbuffs", &sends), ("recvbuffs", &recv_ptrs)], &counts)?;
        let a =
            Arrays { sends, recvs, counts, dtype: dt, place, stream: crate::mem::cuda::Stream::from_ptr(stream as _) };
        issue_coalesced(&c, "fcclAllReduceCoalesced", a, move |c, b| {
            coalesced::all_reduce_coalesced(c, b, op, bucketBytes)
        })
    })
}

/// Broadcasts `nbuffers` buffers from `root`, packed into buckets of at most
/// `bucketBytes` (0 = 25 MiB), one broadcast per bucket. Host or device memory, as
/// fcclAllReduceCoalesced.
#[no_mangle]
pub unsafe extern "C" fn fcclBroadcastCoalesced(
    buffs: *const *mut c_void,
    counts: *const usize,
    nbuffers: c_int,
    datatype: fcclDataType_t,
    root: c_int,
    bucketBytes: usize,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclBroadcastCoalesced", || {
        let c = handle::get(comm)?;
        let nb = count_arg(nbuffers, "nbuffers")?;
        let dt = dtype(datatype)?;
        let root = rank_arg(root, "root", &c)?;
        // SAFETY: arrays are NULL (refused) or nbuffers long (API contract).
        let (bufs, counts) = unsafe { (array(buffs as *const *mut u8, nb, "buffs")?, array(counts, nb, "counts")?) };
        let sends = read_only(&bufs, "buffs")?;
        let place = coalesced_placement(&[("buffs", &sends)], &counts)?;
        let a = Arrays {
            sends,
            recvs: bufs,
            counts,
            dtype: dt,
            place,
            stream: crate::mem::cuda::Stream::from_ptr(stream as _),
        };
        issue_coalesced(&c, "fcclBroadcastCoalesced", a, move |c, b| {
            coalesced::broadcast_coalesced(c, b, root, bucketBytes)
        })
    })
}

/// All-reduce whose partial results cross between ranks in `wireType` (e.g. float32
/// data over a bfloat16 wire): each contribution is rounded to the wire type once,
/// reduced in the data type, and the result rounded to the wire type once more, so
/// for a sum |error| <= (nranks + 1) * u * sum_i |x_i| with u the wire type's unit
/// roundoff (2^-8 bfloat16, 2^-11 float16). Every rank gets identical results.
/// Data: float32 or float64; wire: a float type no wider than the data.
#[no_mangle]
pub unsafe extern "C" fn fcclAllReduceWire(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: fcclDataType_t,
    op: fcclRedOp_t,
    wireType: fcclDataType_t,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclAllReduceWire", || {
        submit(comm, stream, |_| {
            let (dt, wire) = (dtype(datatype)?, dtype(wireType)?);
            if !matches!(dt, DataType::Float32 | DataType::Float64) {
                return Err(Error::invalid_arg(format!(
                    "datatype {dt} is not supported: the wire-type all_reduce takes fcclFloat32 or fcclFloat64 data"
                )));
            }
            let wire_is_float = wire.is_narrow_float() || matches!(wire, DataType::Float32 | DataType::Float64);
            if !wire_is_float || wire.size() > dt.size() {
                return Err(Error::invalid_arg(format!(
                    "wireType {wire} must be a floating-point type no wider than the data ({dt})"
                )));
            }
            let mut c = Coll::new(CollKind::AllReduce, sendbuff as _, recvbuff as _, count, dt);
            c.op = redop(op, dt)?;
            c.wire = (wire != dt).then_some(wire);
            Ok(c)
        })
    })
}

/// Copies `bytes` from `src` to each of the `ndst` buffers `dsts` (one process; device
/// -1 = host memory, others need CUDA). Complete when it returns.
#[no_mangle]
pub unsafe extern "C" fn fcclLocalBroadcast(
    src: *const c_void,
    srcDevice: c_int,
    bytes: usize,
    dsts: *const *mut c_void,
    dstDevices: *const c_int,
    ndst: c_int,
) -> fcclResult_t {
    call("fcclLocalBroadcast", || {
        let n = count_arg(ndst, "ndst")?;
        // SAFETY: arrays are NULL (refused) or ndst long (API contract).
        let (dsts, devs) = unsafe { (array(dsts as *const *mut u8, n, "dsts")?, array(dstDevices, n, "dstDevices")?) };
        let first = local::check_devices(&[srcDevice], "srcDevice")?;
        let copier = local::Copier::for_device(first.or(local::check_devices(&devs, "dstDevices")?))?;
        if matches!(copier, local::Copier::Host) {
            // Device ids say host: refuse device pointers rather than crash on them.
            let named: Vec<(&str, *const u8)> = std::iter::once(("src", src as *const u8))
                .chain(dsts.iter().map(|&p| ("dsts[i]", p as *const u8)))
                .collect();
            mem::require_host(&named, "fcclLocalBroadcast")?;
        }
        if bytes == 0 {
            return Ok(());
        }
        if src.is_null() {
            return Err(Error::invalid_arg(format!("src is NULL with bytes = {bytes}")));
        }
        if let Some(i) = dsts.iter().position(|p| p.is_null()) {
            return Err(Error::invalid_arg(format!("dsts[{i}] is NULL with bytes = {bytes}")));
        }
        for d in dsts {
            // SAFETY: src and every dst hold `bytes` bytes (API contract).
            unsafe { copier.copy(d, src as *const u8, bytes)? };
        }
        Ok(())
    })
}

/// Splits a row-major tensor of `shape` into `ndst` chunks along `dim` and copies chunk
/// i, a contiguous tensor, to `dsts[i]`. `chunkSizes` (along dim) must add up to
/// shape[dim]; NULL splits as evenly as possible (the first shape[dim] % ndst chunks
/// get one more).
#[no_mangle]
pub unsafe extern "C" fn fcclLocalScatter(
    src: *const c_void,
    srcDevice: c_int,
    ndims: c_int,
    shape: *const usize,
    dim: c_int,
    datatype: fcclDataType_t,
    chunkSizes: *const usize,
    dsts: *const *mut c_void,
    dstDevices: *const c_int,
    ndst: c_int,
) -> fcclResult_t {
    call("fcclLocalScatter", || {
        let dt = dtype(datatype)?;
        let n = count_arg(ndst, "ndst")?;
        if n == 0 {
            return Err(Error::invalid_arg("ndst is 0; scatter to at least one buffer"));
        }
        // SAFETY: arrays are NULL (refused where required) or of the stated lengths.
        let (l, dsts, devs) = unsafe {
            (
                layout(ndims, shape, dim, dt)?,
                array(dsts as *const *mut u8, n, "dsts")?,
                array(dstDevices, n, "dstDevices")?,
            )
        };
        // SAFETY: chunkSizes is non-NULL here, and holds ndst sizes per the contract.
        let given = if chunkSizes.is_null() { None } else { Some(unsafe { array(chunkSizes, n, "chunkSizes")? }) };
        let sizes = local::chunk_sizes(l.along, n, given.as_deref())?;
        let first = local::check_devices(&[srcDevice], "srcDevice")?;
        let copier = local::Copier::for_device(first.or(local::check_devices(&devs, "dstDevices")?))?;
        if matches!(copier, local::Copier::Host) {
            let named: Vec<(&str, *const u8)> = std::iter::once(("src", src as *const u8))
                .chain(dsts.iter().map(|&p| ("dsts[i]", p as *const u8)))
                .collect();
            mem::require_host(&named, "fcclLocalScatter")?;
        }
        if l.total() > 0 && src.is_null() {
            return Err(Error::invalid_arg("src is NULL for a non-empty tensor"));
        }
        // Check every destination before writing any.
        let nonempty = |len: usize| len > 0 && l.outer * l.inner > 0;
        if let Some(i) = (0..n).find(|&i| nonempty(sizes[i]) && dsts[i].is_null()) {
            return Err(Error::invalid_arg(format!("dsts[{i}] is NULL for a non-empty chunk")));
        }
        let mut start = 0;
        for (i, &len) in sizes.iter().enumerate() {
            if nonempty(len) {
                // SAFETY: src holds the tensor, dsts[i] the chunk (API contract).
                unsafe { local::copy_chunk(src as *mut u8, dsts[i], l, dt.size(), start, len, false, &copier)? };
            }
            start += len;
        }
        Ok(())
    })
}

/// Concatenates `nsrc` row-major tensors along `dim` into `dst`: source i has `shape`
/// with shape[dim] replaced by dimSizes[i].
#[no_mangle]
pub unsafe extern "C" fn fcclLocalGather(
    srcs: *const *const c_void,
    srcDevices: *const c_int,
    dimSizes: *const usize,
    nsrc: c_int,
    ndims: c_int,
    shape: *const usize,
    dim: c_int,
    datatype: fcclDataType_t,
    dst: *mut c_void,
    dstDevice: c_int,
) -> fcclResult_t {
    call("fcclLocalGather", || {
        let dt = dtype(datatype)?;
        let n = count_arg(nsrc, "nsrc")?;
        if ndims <= 0 {
            return Err(Error::invalid_arg(format!("ndims is {ndims}; a tensor has at least one dimension")));
        }
        // SAFETY: arrays are NULL (refused) or of the stated lengths (API contract).
        let (mut dims, srcs, devs, sizes) = unsafe {
            (
                array(shape, ndims as usize, "shape")?,
                array(srcs as *const *const u8, n, "srcs")?,
                array(srcDevices, n, "srcDevices")?,
                array(dimSizes, n, "dimSizes")?,
            )
        };
        let d = usize::try_from(dim)
            .ok()
            .filter(|&d| d < dims.len())
            .ok_or_else(|| Error::invalid_arg(format!("dim {dim} out of range for a tensor of {ndims} dimensions")))?;
        dims[d] = sizes
            .iter()
            .try_fold(0usize, |a, &c| a.checked_add(c))
            .ok_or_else(|| Error::invalid_arg("dimSizes add up to more than size_t"))?;
        let l = cx::axis_layout(&dims, dim, dt)?;
        let first = local::check_devices(&devs, "srcDevices")?;
        let copier = local::Copier::for_device(first.or(local::check_devices(&[dstDevice], "dstDevice")?))?;
        if matches!(copier, local::Copier::Host) {
            let named: Vec<(&str, *const u8)> =
                std::iter::once(("dst", dst as *const u8)).chain(srcs.iter().map(|&p| ("srcs[i]", p))).collect();
            mem::require_host(&named, "fcclLocalGather")?;
        }
        if l.total() > 0 && dst.is_null() {
            return Err(Error::invalid_arg("dst is NULL for a non-empty result"));
        }
        // Check every source before writing anything.
        let nonempty = |len: usize| len > 0 && l.outer * l.inner > 0;
        if let Some(i) = (0..n).find(|&i| nonempty(sizes[i]) && srcs[i].is_null()) {
            return Err(Error::invalid_arg(format!("srcs[{i}] is NULL with dimSizes[{i}] = {}", sizes[i])));
        }
        let mut start = 0;
        for (i, &len) in sizes.iter().enumerate() {
            if nonempty(len) {
                // SAFETY: dst holds the result, srcs[i] its chunk (API contract).
                unsafe {
                    local::copy_chunk(dst as *mut u8, srcs[i] as *mut u8, l, dt.size(), start, len, true, &copier)?
                };
            }
            start += len;
        }
        Ok(())
    })
}

/// Writes the number of elements a rank must allocate for the send and receive
/// buffers of the NCCL-style call `coll` (a fcclCollective_t) with `count`.
#[no_mangle]
pub unsafe extern "C" fn fcclCollectiveCounts(
    coll: c_int,
    count: usize,
    nranks: c_int,
    rank: c_int,
    root: c_int,
    sendcount: Option<&mut MaybeUninit<usize>>,
    recvcount: Option<&mut MaybeUninit<usize>>,
) -> fcclResult_t {
    call("fcclCollectiveCounts", || {
        let (sendcount, recvcount) = (sendcount.required("sendcount")?, recvcount.required("recvcount")?);
        if nranks <= 0 {
            return Err(Error::invalid_arg(format!("nranks is {nranks}; it must be at least 1")));
        }
        let check = |v: c_int, what: &str| {
            usize::try_from(v)
                .ok()
                .filter(|&r| r < nranks as usize)
                .ok_or_else(|| Error::invalid_arg(format!("{what} {v} out of range for {nranks} ranks")))
        };
        let (rank, root) = (check(rank, "rank")?, check(root, "root")?);
        let (s, r) = cx::collective_counts(coll, count, nranks as usize, rank, root)?;
        sendcount.write(s);
        recvcount.write(r);
        Ok(())
    })
}

/// Writes the collective whose call computes `coll`'s gradient: AllGather <->
/// ReduceScatter, Broadcast <-> Reduce, Gather <-> Scatter, AllReduce and AlltoAll to
/// themselves.
#[no_mangle]
pub unsafe extern "C" fn fcclCollectiveAdjoint(coll: c_int, adjoint: Option<&mut MaybeUninit<c_int>>) -> fcclResult_t {
    call("fcclCollectiveAdjoint", || {
        let adjoint = adjoint.required("adjoint")?;
        adjoint.write(cx::collective_adjoint(coll)?);
        Ok(())
    })
}
