//! The NCCL backend: device-memory collectives of communicators whose ranks each
//! have their own GPU. Calls are enqueued on the caller's stream (stream-ordered,
//! like NCCL itself); a group of calls is one ncclGroupStart/End.

pub mod lib;

use crate::backend::Algo;
use crate::coll::{Coll, CollKind};
use crate::error::{Error, Result};
use crate::mem::cuda;
use crate::types::{DataType, RedOp};
use lib::{check, Api, NcclComm, NcclUniqueId};
use std::ffi::c_void;
use std::os::raw::c_int;

/// One rank's NCCL communicator, destroyed with it.
pub struct Nccl {
    api: &'static Api,
    comm: NcclComm,
    /// The device's primary context, made current around every NCCL call.
    ctx: cuda::Ctx,
    /// Set by ncclCommAbort, which frees the communicator: no destroy after it.
    aborted: std::sync::atomic::AtomicBool,
    /// NCCL reduces fp8 only on sm90 and later ("FP8 reduction support begins with sm90").
    fp8_reduce: bool,
}

// SAFETY: an ncclComm_t may be used from any thread as long as calls on it do not
// overlap, which the owning Comm's state lock guarantees.
unsafe impl Send for Nccl {}
// SAFETY: as above; shared references only reach NCCL under that lock.
unsafe impl Sync for Nccl {}

/// Whether NCCL can be loaded in this process (`libnccl.so.2` found and new enough),
/// or why not.
pub fn loadable() -> Result<()> {
    lib::nccl().map(|_| ())
}

/// A fresh NCCL unique id (rank 0 creates it; the rendezvous carries it to the others).
pub fn unique_id() -> Result<[u8; 128]> {
    let api = lib::nccl()?;
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: id is a valid out-struct of NCCL's layout.
    check(api, unsafe { (api.get_unique_id)(&mut id) }, "ncclGetUniqueId")?;
    Ok(id.internal.map(|c| c as u8))
}

impl Nccl {
    /// Rank `rank` of `nranks` on `device` (ncclCommInitRank; blocks until all join).
    pub fn init_rank(nranks: usize, id: &[u8; 128], rank: usize, device: i32) -> Result<Nccl> {
        let api = lib::nccl()?;
        let ctx = cuda::primary_context(device)?;
        let _g = cuda::CtxGuard::enter(ctx)?;
        let uid = NcclUniqueId { internal: id.map(|b| b as std::os::raw::c_char) };
        let mut comm: NcclComm = std::ptr::null_mut();
        check(
            api,
            // SAFETY: comm is a valid out-pointer; the device's context is current.
            unsafe { (api.comm_init_rank)(&mut comm, nranks as c_int, uid, rank as c_int) },
            "ncclCommInitRank",
        )?;
        Ok(Nccl { api, comm, ctx, aborted: Default::default(), fp8_reduce: fp8_reduce(device) })
    }

    /// One communicator per device of `devs` in this process (ncclCommInitAll).
    pub fn init_all(devs: &[i32]) -> Result<Vec<Nccl>> {
        let api = lib::nccl()?;
        let mut comms: Vec<NcclComm> = vec![std::ptr::null_mut(); devs.len()];
        check(
            api,
            // SAFETY: comms has room for devs.len() handles; devs is that long.
            unsafe { (api.comm_init_all)(comms.as_mut_ptr(), devs.len() as c_int, devs.as_ptr()) },
            "ncclCommInitAll",
        )?;
        devs.iter()
            .zip(comms)
            .map(|(&d, comm)| {
                let ctx = cuda::primary_context(d)?;
                Ok(Nccl { api, comm, ctx, aborted: Default::default(), fp8_reduce: fp8_reduce(d) })
            })
            .collect()
    }

    /// True when NCCL can run this call directly (the rest goes through staging).
    pub fn supports(&self, c: &Coll) -> bool {
        c.strided.is_none()
            && c.wire.is_none()
            && type_op_ok(c.kind, c.dtype, c.op, self.fp8_reduce)
            && matches!(
                c.kind,
                CollKind::AllReduce
                    | CollKind::Broadcast
                    | CollKind::Reduce
                    | CollKind::AllGather
                    | CollKind::ReduceScatter
                    | CollKind::AlltoAll
                    | CollKind::Gather
                    | CollKind::Scatter
                    | CollKind::AlltoAllv
                    | CollKind::Send
                    | CollKind::Recv
            )
    }

    /// Enqueues `calls` (all supported, validated, device memory) as one NCCL group.
    pub fn run(&self, calls: &[&Coll], rank: usize, nranks: usize) -> Result<()> {
        let _g = cuda::CtxGuard::enter(self.ctx)?;
        let a = self.api;
        // SAFETY: no preconditions.
        check(a, unsafe { (a.group_start)() }, "ncclGroupStart")?;
        let mut first_err = None;
        for c in calls {
            if c.is_noop() {
                continue;
            }
            // SAFETY: buffers were validated for these counts and are device memory of
            // this communicator's device; the stream is the caller's.
            if let Err(e) = unsafe { self.enqueue(c, rank, nranks) } {
                first_err.get_or_insert(e);
            }
        }
        // SAFETY: closes the group opened above.
        let end = check(a, unsafe { (a.group_end)() }, "ncclGroupEnd");
        match first_err {
            Some(e) => Err(e),
            None => end,
        }
    }

    /// # Safety
    /// As [`Nccl::run`].
    unsafe fn enqueue(&self, c: &Coll, rank: usize, nranks: usize) -> Result<()> {
        let a = self.api;
        let (s, r) = (c.send as *const c_void, c.recv as *mut c_void);
        // Moving fp8 is moving bytes: NCCL refuses fp8 before sm90, but never uint8.
        let moved_type = nccl_type(c.kind, c.dtype);
        let (n, dt, op, root, peer) = (c.count, moved_type as c_int, c.op as c_int, c.root as c_int, c.peer as c_int);
        let st = c.stream.as_ptr();
        let comm = self.comm;
        let es = c.dtype.size();
        let name = c.kind.c_name();
        // SAFETY: (whole block) guaranteed by the caller; NCCL's signatures as in lib.rs.
        let rc = unsafe {
            match c.kind {
                CollKind::AllReduce => (a.all_reduce)(s, r, n, dt, op, comm, st),
                CollKind::ReduceScatter => (a.reduce_scatter)(s, r, n, dt, op, comm, st),
                CollKind::Reduce => (a.reduce)(s, r, n, dt, op, root, comm, st),
                CollKind::Broadcast => (a.broadcast)(s, r, n, dt, root, comm, st),
                CollKind::AllGather => (a.all_gather)(s, r, n, dt, comm, st),
                CollKind::Send => (a.send)(s as *mut c_void, n, dt, peer, comm, st),
                CollKind::Recv => (a.recv)(r, n, dt, peer, comm, st),
                CollKind::AlltoAll => match a.all_to_all {
                    Some(f) => f(s, r, n, dt, comm, st),
                    None => {
                        // Before 2.28: one send and one receive per peer, in this group.
                        for p in 0..nranks {
                            let off = p * n * es;
                            check(a, (a.send)(s.byte_add(off) as *mut c_void, n, dt, p as c_int, comm, st), name)?;
                            check(a, (a.recv)(r.byte_add(off), n, dt, p as c_int, comm, st), name)?;
                        }
                        0
                    }
                },
                CollKind::Gather => match a.gather {
                    Some(f) => f(s, r, n, dt, root, comm, st),
                    None => {
                        if rank == c.root {
                            for p in 0..nranks {
                                check(a, (a.recv)(r.byte_add(p * n * es), n, dt, p as c_int, comm, st), name)?;
                            }
                        }
                        (a.send)(s as *mut c_void, n, dt, root, comm, st)
                    }
                },
                CollKind::Scatter => match a.scatter {
                    Some(f) => f(s, r, n, dt, root, comm, st),
                    None => {
                        if rank == c.root {
                            for p in 0..nranks {
                                let src = s.byte_add(p * n * es) as *mut c_void;
                                check(a, (a.send)(src, n, dt, p as c_int, comm, st), name)?;
                            }
                        }
                        (a.recv)(r, n, dt, root, comm, st)
                    }
                },
                CollKind::AlltoAllv => {
                    let v = c.v.as_ref().ok_or_else(|| Error::internal("all_to_allv without counts"))?;
                    for p in 0..nranks {
                        if v.sendcounts()[p] > 0 {
                            let src = s.byte_add(v.sdispls()[p] * es) as *mut c_void;
                            check(a, (a.send)(src, v.sendcounts()[p], dt, p as c_int, comm, st), name)?;
                        }
                        if v.recvcounts()[p] > 0 {
                            check(
                                a,
                                (a.recv)(r.byte_add(v.rdispls()[p] * es), v.recvcounts()[p], dt, p as c_int, comm, st),
                                name,
                            )?;
                        }
                    }
                    0
                }
                _ => return Err(Error::internal(format!("{name} is not an NCCL call"))),
            }
        };
        check(a, rc, name)
    }
}

fn is_fp8(t: DataType) -> bool {
    matches!(t, DataType::Float8e4m3 | DataType::Float8e5m2)
}

fn reduces(k: CollKind) -> bool {
    matches!(k, CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce)
}

/// Whether NCCL takes `dtype` with `op` for `kind`: it reduces fp8 only where
/// `fp8_reduce` (sm90 and later) and never averages it; it has no bitwise operators
/// (ferroccl's own, served by the built-in backend).
fn type_op_ok(kind: CollKind, dtype: DataType, op: RedOp, fp8_reduce: bool) -> bool {
    if !reduces(kind) {
        return true;
    }
    !op.is_bitwise() && (!is_fp8(dtype) || (fp8_reduce && op != RedOp::Avg))
}

/// The type NCCL is given: fp8 that is only moved travels as uint8 (same bytes).
fn nccl_type(kind: CollKind, dtype: DataType) -> DataType {
    if is_fp8(dtype) && !reduces(kind) {
        DataType::Uint8
    } else {
        dtype
    }
}

/// Whether NCCL reduces fp8 on `device` (sm90 and later); NCCL refuses ncclAvg of fp8 on any device.
fn fp8_reduce(device: i32) -> bool {
    cuda::compute_capability(device).is_ok_and(|(major, _)| major >= 9)
}

impl Drop for Nccl {
    fn drop(&mut self) {
        if self.aborted.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        if let Ok(_g) = cuda::CtxGuard::enter(self.ctx) {
            // SAFETY: the communicator is live and destroyed once.
            let _ = unsafe { (self.api.comm_destroy)(self.comm) };
        }
    }
}

impl Nccl {
    /// ncclCommAbort: for fcclCommAbort while calls may be in flight.
    pub fn abort(&self) {
        if self.aborted.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        // SAFETY: the communicator is live (aborted once); NCCL allows abort from another thread.
        let _ = unsafe { (self.api.comm_abort)(self.comm) };
    }
}

/// NCCL as a router entry: the device calls it supports, on one communicator's rank.
pub struct NcclBackend {
    pub nccl: Nccl,
    pub rank: usize,
    pub nranks: usize,
}

impl super::Backend for NcclBackend {
    fn id(&self) -> &'static str {
        "nccl"
    }

    fn accepts(&self, c: &Coll, _: bool) -> bool {
        matches!(c.placement, crate::mem::Placement::Device { .. }) && self.nccl.supports(c)
    }

    fn run(&self, x: &mut super::Exec<'_>, calls: &[crate::coll::Call]) -> Result<super::Outcome> {
        x.algo = Algo::Enqueued;
        let colls: Vec<&Coll> = calls.iter().map(|c| &c.coll).collect();
        self.nccl.run(&colls, self.rank, self.nranks)?;
        Ok(super::Outcome::Done)
    }

    fn abort(&self) {
        self.nccl.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_reductions_reach_nccl_only_where_it_takes_them() {
        for t in [DataType::Float8e4m3, DataType::Float8e5m2] {
            for k in [CollKind::AllReduce, CollKind::ReduceScatter, CollKind::Reduce] {
                assert!(type_op_ok(k, t, RedOp::Sum, true));
                assert!(type_op_ok(k, t, RedOp::Max, true));
                assert!(!type_op_ok(k, t, RedOp::Avg, true), "{k:?} {t:?} avg");
                assert!(!type_op_ok(k, t, RedOp::Sum, false), "{k:?} {t:?} before sm90");
                assert_eq!(nccl_type(k, t), t);
            }
            for k in [CollKind::AllGather, CollKind::Broadcast, CollKind::AlltoAll, CollKind::Send] {
                assert!(type_op_ok(k, t, RedOp::Avg, false));
                assert_eq!(nccl_type(k, t), DataType::Uint8);
            }
        }
        for t in [DataType::Float32, DataType::Bfloat16, DataType::Int8] {
            assert!(type_op_ok(CollKind::AllReduce, t, RedOp::Avg, false));
            assert_eq!(nccl_type(CollKind::AllGather, t), t);
        }
        for op in [RedOp::Band, RedOp::Bor, RedOp::Bxor] {
            for k in [CollKind::AllReduce, CollKind::ReduceScatter, CollKind::Reduce] {
                assert!(!type_op_ok(k, DataType::Int32, op, true), "{k:?} {op}");
            }
            assert!(type_op_ok(CollKind::AllGather, DataType::Int32, op, true));
        }
    }
}
