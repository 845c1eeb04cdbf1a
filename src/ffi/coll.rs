//! Collective calls and groups. Each converts its C arguments into one `Coll`,
//! which the core validates and runs (or queues, inside a group).

use super::args::{borrow_array, dtype, rank_arg, redop};
use super::boundary::call;
use super::handle;
use super::*;
use crate::coll::{Coll, CollKind, VCounts};
use crate::comm::{group, Comm, Issued};
use crate::error::Result;
use crate::types::DataType;
use std::os::raw::{c_int, c_void};

/// Validates the call and runs it, or queues it inside a group, or, on a non-blocking
/// communicator, hands it to the communicator's progress thread.
pub(super) fn submit(
    comm: fcclComm_t,
    stream: fcclStream_t,
    make: impl FnOnce(&Comm) -> Result<Coll>,
) -> Result<Issued> {
    let c = handle::get(comm)?;
    let mut coll = make(&c)?;
    coll.stream = crate::mem::cuda::Stream::from_ptr(stream as _);
    coll.validate(c.rank, c.nranks)?;
    // One relaxed atomic load when CUDA is absent; a mixed call fails here, before
    // it is counted or queued, so no rank waits for it.
    if crate::mem::cuda::active() {
        coll.placement = crate::mem::placement(&coll.buffers(c.rank, c.nranks)?)?;
    }
    if group::active() {
        group::enqueue(&c, coll).map(|()| Issued::Done)
    } else if c.opts.blocking {
        c.run_one(coll).map(|()| Issued::Done)
    } else {
        c.enqueue(coll.kind.c_name(), move |c| c.run_one(coll))
    }
}

/// Reduces `count` elements across all ranks with `op`; every rank gets the result
/// in `recvbuff`. In place when `sendbuff == recvbuff`.
#[no_mangle]
pub unsafe extern "C" fn fcclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: fcclDataType_t,
    op: fcclRedOp_t,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclAllReduce", || {
        submit(comm, stream, |_| {
            let mut c = Coll::new(CollKind::AllReduce, sendbuff as _, recvbuff as _, count, dtype(datatype)?);
            c.op = redop(op, c.dtype)?;
            Ok(c)
        })
    })
}

/// Copies `count` elements from the root's `sendbuff` to every rank's `recvbuff`.
/// In place when `sendbuff == recvbuff`; `sendbuff` is only read on the root.
#[no_mangle]
pub unsafe extern "C" fn fcclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: fcclDataType_t,
    root: c_int,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclBroadcast", || {
        submit(comm, stream, |cm| {
            let mut c = Coll::new(CollKind::Broadcast, sendbuff as _, recvbuff as _, count, dtype(datatype)?);
            c.root = rank_arg(root, "root", cm)?;
            Ok(c)
        })
    })
}

/// Reduces `count` elements across all ranks into the root's `recvbuff` (which may be
/// NULL on other ranks). In place when `sendbuff == recvbuff`.
#[no_mangle]
pub unsafe extern "C" fn fcclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: fcclDataType_t,
    op: fcclRedOp_t,
    root: c_int,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclReduce", || {
        submit(comm, stream, |cm| {
            let mut c = Coll::new(CollKind::Reduce, sendbuff as _, recvbuff as _, count, dtype(datatype)?);
            c.op = redop(op, c.dtype)?;
            c.root = rank_arg(root, "root", cm)?;
            Ok(c)
        })
    })
}

/// Gathers `sendcount` elements from every rank into every rank's `recvbuff`, rank r's
/// block at offset r*sendcount. In place when `sendbuff == recvbuff + rank*sendcount`.
#[no_mangle]
pub unsafe extern "C" fn fcclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: fcclDataType_t,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclAllGather", || {
        submit(comm, stream, |_| {
            Ok(Coll::new(CollKind::AllGather, sendbuff as _, recvbuff as _, sendcount, dtype(datatype)?))
        })
    })
}

/// Reduces nranks*recvcount elements across ranks; rank r receives block r. In place
/// when `recvbuff == sendbuff + rank*recvcount`.
#[no_mangle]
pub unsafe extern "C" fn fcclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: fcclDataType_t,
    op: fcclRedOp_t,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclReduceScatter", || {
        submit(comm, stream, |_| {
            let mut c = Coll::new(CollKind::ReduceScatter, sendbuff as _, recvbuff as _, recvcount, dtype(datatype)?);
            c.op = redop(op, c.dtype)?;
            Ok(c)
        })
    })
}

/// Sends block p (`count` elements at offset p*count) of `sendbuff` to rank p and
/// receives rank p's block for this rank at offset p*count of `recvbuff`.
#[no_mangle]
pub unsafe extern "C" fn fcclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: fcclDataType_t,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclAlltoAll", || {
        submit(comm, stream, |_| {
            Ok(Coll::new(CollKind::AlltoAll, sendbuff as _, recvbuff as _, count, dtype(datatype)?))
        })
    })
}

/// Gathers `count` elements from every rank into the root's `recvbuff` (rank r's block
/// at offset r*count; NULL allowed on other ranks).
#[no_mangle]
pub unsafe extern "C" fn fcclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: fcclDataType_t,
    root: c_int,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclGather", || {
        submit(comm, stream, |cm| {
            let mut c = Coll::new(CollKind::Gather, sendbuff as _, recvbuff as _, count, dtype(datatype)?);
            c.root = rank_arg(root, "root", cm)?;
            Ok(c)
        })
    })
}

/// Sends block r (`count` elements at offset r*count) of the root's `sendbuff` to
/// rank r's `recvbuff` (`sendbuff` may be NULL on other ranks).
#[no_mangle]
pub unsafe extern "C" fn fcclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: fcclDataType_t,
    root: c_int,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclScatter", || {
        submit(comm, stream, |cm| {
            let mut c = Coll::new(CollKind::Scatter, sendbuff as _, recvbuff as _, count, dtype(datatype)?);
            c.root = rank_arg(root, "root", cm)?;
            Ok(c)
        })
    })
}

/// Sends `sendcounts[p]` elements at `sdispls[p]` of `sendbuff` to rank p and receives
/// `recvcounts[p]` elements from rank p at `rdispls[p]` of `recvbuff` (counts and
/// displacements in elements, arrays of nranks entries). If rank i's sendcounts[j]
/// differs from rank j's recvcounts[i], every rank returns fcclCollectiveMismatch and
/// no data moves.
#[no_mangle]
pub unsafe extern "C" fn fcclAlltoAllv(
    sendbuff: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuff: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    datatype: fcclDataType_t,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclAlltoAllv", || {
        submit(comm, stream, |cm| {
            let n = cm.nranks;
            // SAFETY: each array is NULL (refused) or nranks entries long (API contract).
            let v = unsafe {
                VCounts::new(
                    borrow_array(sendcounts, n, "sendcounts")?,
                    borrow_array(sdispls, n, "sdispls")?,
                    borrow_array(recvcounts, n, "recvcounts")?,
                    borrow_array(rdispls, n, "rdispls")?,
                )
            };
            let mut c = Coll::new(CollKind::AlltoAllv, sendbuff as _, recvbuff as _, 0, dtype(datatype)?);
            c.v = Some(v);
            Ok(c)
        })
    })
}

/// Sends `count` elements to rank `peer`, which must post a matching fcclRecv. A count
/// that differs from the receiver's returns fcclCollectiveMismatch on both sides.
#[no_mangle]
pub unsafe extern "C" fn fcclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: fcclDataType_t,
    peer: c_int,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclSend", || {
        submit(comm, stream, |cm| {
            let mut c = Coll::new(CollKind::Send, sendbuff as _, std::ptr::null_mut(), count, dtype(datatype)?);
            c.peer = rank_arg(peer, "peer", cm)?;
            Ok(c)
        })
    })
}

/// Receives `count` elements from rank `peer` into `recvbuff`.
///
/// In place, on host memory: inside one fcclGroupStart/End, `recvbuff` may overlap
/// the `sendbuff` of fcclSend calls of the same group (a ring shift or an exchange
/// in one buffer). Each send then sends what its buffer held when the group ran,
/// and each receive writes only its own `count` elements: as if every send's data
/// had left before any receive wrote. A send and a receive with the same peer over
/// exactly the same bytes may swap the two ranks' buffers directly. (NCCL does not
/// define this for device memory; nor does ferroccl there.)
#[no_mangle]
pub unsafe extern "C" fn fcclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: fcclDataType_t,
    peer: c_int,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call("fcclRecv", || {
        submit(comm, stream, |cm| {
            let mut c = Coll::new(CollKind::Recv, std::ptr::null(), recvbuff as _, count, dtype(datatype)?);
            c.peer = rank_arg(peer, "peer", cm)?;
            Ok(c)
        })
    })
}

/// Returns once every rank of `comm` has called fcclBarrier.
#[no_mangle]
pub unsafe extern "C" fn fcclBarrier(comm: fcclComm_t, stream: fcclStream_t) -> fcclResult_t {
    call("fcclBarrier", || {
        submit(comm, stream, |_| {
            Ok(Coll::new(CollKind::Barrier, std::ptr::null(), std::ptr::null_mut(), 0, DataType::Uint8))
        })
    })
}

/// Starts a group: calls on this thread are queued until the matching fcclGroupEnd.
/// Groups nest; the outermost fcclGroupEnd runs everything.
#[no_mangle]
pub extern "C" fn fcclGroupStart() -> fcclResult_t {
    call("fcclGroupStart", || {
        group::start();
        Ok(())
    })
}

/// Ends a group; the outermost end runs the queued calls together (one thread may
/// drive several communicators; matched sends and receives never deadlock) and
/// returns the first error. A group of non-blocking communicators hands each one's
/// calls to its progress thread and returns fcclInProgress: poll
/// fcclCommGetAsyncError on each. As in NCCL, one group holds calls of one kind:
/// a call on a blocking communicator in a group of non-blocking ones (or the other
/// way round) is refused with fcclInvalidUsage.
#[no_mangle]
pub extern "C" fn fcclGroupEnd() -> fcclResult_t {
    call("fcclGroupEnd", group::end)
}

/// Which reduction a pre-multiplied sum ([`premul_sum`]) is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreMulKind {
    AllReduce,
    /// To this root.
    Reduce(c_int),
    ReduceScatter,
}

/// A PreMulSum operator's scalar, as [`premul_sum`] takes it.
pub use crate::ops::premul::Scalar as PreMulScalar;

/// NCCL's PreMulSum operator (not part of ferroccl's C API; the NCCL library calls
/// it): the sum over ranks of each rank's input times the scalar, taken when the call is
/// made (see [`crate::ops::premul`]); the sum then runs like any fcclSum call.
/// `count` is the collective's count (per rank for reduce_scatter).
///
/// # Safety
/// The buffers' contract is that of the matching `fccl` collective; a `At` scalar
/// points to one `datatype` element.
#[allow(clippy::too_many_arguments)]
pub unsafe fn premul_sum(
    name: &str,
    kind: PreMulKind,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: fcclDataType_t,
    scalar: PreMulScalar,
    comm: fcclComm_t,
    stream: fcclStream_t,
) -> fcclResult_t {
    call(name, || {
        submit(comm, stream, |cm| {
            let ck = match kind {
                PreMulKind::AllReduce => CollKind::AllReduce,
                PreMulKind::Reduce(_) => CollKind::Reduce,
                PreMulKind::ReduceScatter => CollKind::ReduceScatter,
            };
            let mut c = Coll::new(ck, sendbuff as _, recvbuff as _, count, dtype(datatype)?);
            if let PreMulKind::Reduce(root) = kind {
                c.root = rank_arg(root, "root", cm)?;
            }
            c.validate(cm.rank, cm.nranks)?;
            let st = crate::mem::cuda::Stream::from_ptr(stream as _);
            // SAFETY: the buffers and the scalar are the caller's, under this function's contract.
            unsafe { crate::ops::premul::multiply(&mut c, cm, scalar, st)? };
            Ok(c)
        })
    })
}
