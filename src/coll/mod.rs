//! Collective descriptors and the one validator every call goes through.
//!
//! The FFI layer turns a C call into a [`Coll`]; [`Coll::validate`] checks it
//! against the communicator before any byte moves (NCCL's `ncclEnqueueCheck`
//! idea); the backend then executes it.

pub mod counts;
pub mod ext;
pub mod fingerprint;

use crate::error::{Error, Result};
use crate::types::{DataType, RedOp};

/// One call to execute, with its sequence number on the communicator.
pub struct Call {
    pub coll: Coll,
    pub seq: u64,
}

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollKind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AlltoAll,
    Gather,
    Scatter,
    AlltoAllv,
    Send,
    Recv,
    Barrier,
    /// Uneven all_gather: `v.recvcounts()`/`v.rdispls()` place each rank's `count` elements.
    AllGatherV,
    /// Uneven reduce_scatter: rank r gets `v.recvcounts()[r]` elements reduced from `v.sdispls()[r]`.
    ReduceScatterV,
}

impl CollKind {
    pub const fn c_name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "fcclAllReduce",
            CollKind::Broadcast => "fcclBroadcast",
            CollKind::Reduce => "fcclReduce",
            CollKind::AllGather => "fcclAllGather",
            CollKind::ReduceScatter => "fcclReduceScatter",
            CollKind::AlltoAll => "fcclAlltoAll",
            CollKind::Gather => "fcclGather",
            CollKind::Scatter => "fcclScatter",
            CollKind::AlltoAllv => "fcclAlltoAllv",
            CollKind::Send => "fcclSend",
            CollKind::Recv => "fcclRecv",
            CollKind::Barrier => "fcclBarrier",
            CollKind::AllGatherV => "fcclAllGatherV",
            CollKind::ReduceScatterV => "fcclReduceScatterV",
        }
    }
    fn has_root(self) -> bool {
        matches!(self, CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter)
    }
    /// fcclSend/fcclRecv: involve two ranks, not the whole communicator.
    pub fn is_p2p(self) -> bool {
        matches!(self, CollKind::Send | CollKind::Recv)
    }
}

/// Per-peer counts and displacements of a v-collective, in elements: sendcounts,
/// sdispls, recvcounts and rdispls, each nranks long or empty where the collective
/// has no use for it. All four live in one allocation (their lengths first), so a
/// call copies the caller's arrays with one `malloc`: a small all_to_allv's cost is
/// counted in allocations (each a few hundred instructions with its `free`).
#[derive(Clone)]
pub struct VCounts {
    all: Box<[usize]>,
}

impl std::fmt::Debug for VCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VCounts")
            .field("sendcounts", &self.sendcounts())
            .field("sdispls", &self.sdispls())
            .field("recvcounts", &self.recvcounts())
            .field("rdispls", &self.rdispls())
            .finish()
    }
}

impl VCounts {
    /// Copies the four arrays.
    pub fn new(sendcounts: &[usize], sdispls: &[usize], recvcounts: &[usize], rdispls: &[usize]) -> VCounts {
        let parts = [sendcounts, sdispls, recvcounts, rdispls];
        let mut all = Vec::with_capacity(4 + parts.iter().map(|a| a.len()).sum::<usize>());
        all.extend(parts.iter().map(|a| a.len()));
        parts.iter().for_each(|a| all.extend_from_slice(a));
        VCounts { all: all.into_boxed_slice() }
    }

    /// For all_gather_v: every rank sends `sendcount` elements from displacement
    /// 0 to each of the `n` ranks; one allocation, as [`VCounts::new`] makes.
    pub fn gather_v(sendcount: usize, n: usize, recvcounts: &[usize], rdispls: &[usize]) -> VCounts {
        let mut all = Vec::with_capacity(4 + 2 * n + recvcounts.len() + rdispls.len());
        all.extend([n, n, recvcounts.len(), rdispls.len()]);
        all.extend(std::iter::repeat(sendcount).take(n));
        all.extend(std::iter::repeat(0).take(n));
        all.extend_from_slice(recvcounts);
        all.extend_from_slice(rdispls);
        VCounts { all: all.into_boxed_slice() }
    }

    /// Array `i` of the four (in the order of [`VCounts::new`]).
    #[inline]
    fn part(&self, i: usize) -> &[usize] {
        let start = 4 + self.all[..i].iter().sum::<usize>();
        &self.all[start..start + self.all[i]]
    }

    #[inline]
    pub fn sendcounts(&self) -> &[usize] {
        self.part(0)
    }

    #[inline]
    pub fn sdispls(&self) -> &[usize] {
        self.part(1)
    }

    #[inline]
    pub fn recvcounts(&self) -> &[usize] {
        self.part(2)
    }

    #[inline]
    pub fn rdispls(&self) -> &[usize] {
        self.part(3)
    }
}

/// One collective call. Buffers are the caller's raw pointers: the C contract
/// makes them valid for the sizes the arguments imply until the call completes.
#[derive(Clone, Debug)]
pub struct Coll {
    pub kind: CollKind,
    pub send: *const u8,
    pub recv: *mut u8,
    /// Elements: total for all_reduce/broadcast/reduce, per rank for all_gather,
    /// reduce_scatter, all_to_all, gather and scatter, message size for send/recv.
    pub count: usize,
    pub dtype: DataType,
    pub op: RedOp,
    /// The root of a rooted collective (broadcast, reduce, gather, scatter).
    pub root: usize,
    /// The rank a send goes to or a receive comes from.
    pub peer: usize,
    pub v: Option<VCounts>,
    /// all_gather along an axis: each rank's buffer is `outer` blocks of `block`
    /// elements, and rank p's block j lands at element (j * nranks + p) * block;
    /// reduce_scatter along an axis (the one-GPU device path only): each rank's input
    /// is `outer` rows of nranks blocks of `block` elements, rank r gets block r of
    /// every row.
    pub strided: Option<Strided>,
    /// all_reduce whose partial results travel in this (narrower) type.
    pub wire: Option<DataType>,
    /// Memory the call owns (a packed copy of the input, on the host or, freed in
    /// stream order, on the device), released with the call.
    pub keep: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
    /// The caller's CUDA stream (a `CUstream` as an integer; 0 = the default
    /// stream). Device-memory calls are ordered on it; host calls ignore it.
    pub stream: crate::mem::cuda::Stream,
    /// Where the buffers live (set by the C entry points; internal calls are host).
    pub placement: crate::mem::Placement,
    /// An fcclSend/fcclRecv its rank refused before anything moved (its stream is being
    /// captured into a CUDA graph): the host runs its handshake alone, with no buffers,
    /// flagged so that the peer's matching call fails at once instead of waiting.
    pub refused: bool,
}

/// Layout of an axis-aware all_gather (see [`Coll::strided`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    pub outer: usize,
    pub block: usize,
}

// SAFETY: the pointers are only dereferenced by the rank's executing thread while
// the call is in progress (or, in a group, until fcclGroupEnd returns), which the
// C contract allows.
unsafe impl Send for Coll {}

impl Coll {
    pub fn new(kind: CollKind, send: *const u8, recv: *mut u8, count: usize, dtype: DataType) -> Coll {
        Coll {
            kind,
            send,
            recv,
            count,
            dtype,
            op: RedOp::Sum,
            root: 0,
            peer: 0,
            v: None,
            strided: None,
            wire: None,
            keep: None,
            stream: crate::mem::cuda::Stream::DEFAULT,
            placement: crate::mem::Placement::Host,
            refused: false,
        }
    }

    /// The device reduction this call needs: its type, operation and wire type.
    pub fn reduction(&self) -> crate::mem::cuda_kernels::Reduction {
        crate::mem::cuda_kernels::Reduction { dtype: self.dtype, op: self.op, wire: self.wire }
    }

    /// True when the call moves no data on any rank, so it completes at once. Calls
    /// with per-rank counts never are: counts that are all zero here say nothing of the
    /// others' (a rank idle in an all_to_allv while its peers exchange), and every rank
    /// must take part in agreeing on them.
    pub fn is_noop(&self) -> bool {
        match self.kind {
            CollKind::Barrier | CollKind::AlltoAllv | CollKind::AllGatherV | CollKind::ReduceScatterV => false,
            // A refused send/recv has no count, but its handshake must reach the peer.
            _ => self.count == 0 && !self.refused,
        }
    }

    /// Byte size of `elems` elements, or an error naming the argument.
    #[inline]
    pub fn bytes(&self, elems: usize, what: &str) -> Result<usize> {
        self.bytes_named(elems, || what.to_string())
    }

    /// As [`Coll::bytes`], naming the count only if it overflows (the name is built
    /// then: validation runs on every call).
    #[inline]
    fn bytes_named(&self, elems: usize, what: impl FnOnce() -> String) -> Result<usize> {
        match elems.checked_mul(self.dtype.size()) {
            Some(b) if b <= isize::MAX as usize => Ok(b),
            _ => Err(self.overflow(elems, what())),
        }
    }

    #[cold]
    fn overflow(&self, elems: usize, what: String) -> Error {
        Error::invalid_arg(format!(
            "{what} = {elems} elements of {} overflows the address space; pass a count in elements, not bytes",
            self.dtype
        ))
    }

    /// Checks arguments against a communicator of `nranks` ranks seen from `rank`.
    /// Messages name the values and what to do; the caller prefixes the C call.
    pub fn validate(&self, rank: usize, nranks: usize) -> Result<()> {
        let k = self.kind;
        if k.has_root() && self.root >= nranks {
            return Err(Error::invalid_arg(format!(
                "root {} out of range for a communicator of {nranks} ranks (valid: 0..{})",
                self.root,
                nranks - 1
            )));
        }
        if k.is_p2p() && self.peer >= nranks {
            return Err(Error::invalid_arg(format!(
                "peer {} out of range for a communicator of {nranks} ranks (valid: 0..{})",
                self.peer,
                nranks - 1
            )));
        }
        match k {
            CollKind::AlltoAllv | CollKind::AllGatherV => return self.validate_v(rank, nranks),
            CollKind::ReduceScatterV => return self.validate_rsv(rank, nranks),
            _ => {}
        }
        let (send_elems, recv_elems) = self.span(rank, nranks)?;
        let sb = self.bytes(send_elems, "count")?;
        let rb = self.bytes(recv_elems, "count")?;
        check_buf(self.send, sb, "sendbuff", self.count)?;
        check_buf(self.recv, rb, "recvbuff", self.count)?;
        self.check_overlap(rank, sb, rb)
    }

    /// Refuses send and receive ranges that overlap other than in the call's exact
    /// in-place layout: the algorithms write results while inputs are still read, so
    /// a partial overlap gives wrong results silently.
    fn check_overlap(&self, rank: usize, sb: usize, rb: usize) -> Result<()> {
        let (s, r) = (self.send as usize, self.recv as usize);
        if sb == 0 || rb == 0 || s >= r + rb || r >= s + sb {
            return Ok(());
        }
        let es = self.dtype.size();
        let v_off = |d: Option<&[usize]>| d.and_then(|d| d.get(rank)).map_or(0, |&d| d * es);
        // Where sendbuff sits in place, relative to recvbuff, and how docs/abi.md says it.
        let (at, layout): (Option<isize>, &str) = match self.kind {
            CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce | CollKind::AlltoAll | CollKind::AlltoAllv => {
                (Some(0), "sendbuff == recvbuff")
            }
            CollKind::AllGather | CollKind::Gather if self.strided.is_none() => {
                (Some((rank * self.count * es) as isize), "sendbuff == recvbuff + rank*count")
            }
            CollKind::AllGather | CollKind::Gather => (None, "none along an axis > 0"),
            CollKind::AllGatherV => {
                (Some(v_off(self.v.as_ref().map(|v| v.rdispls())) as isize), "sendbuff == recvbuff + rdispls[rank]")
            }
            CollKind::ReduceScatter if self.strided.is_some() => (None, "none along an axis > 0"),
            CollKind::ReduceScatter | CollKind::Scatter => {
                (Some(-((rank * self.count * es) as isize)), "recvbuff == sendbuff + rank*count")
            }
            CollKind::ReduceScatterV => {
                (Some(-(v_off(self.v.as_ref().map(|v| v.sdispls())) as isize)), "recvbuff == sendbuff + sdispls[rank]")
            }
            CollKind::Send | CollKind::Recv | CollKind::Barrier => (None, "none"),
        };
        if at == Some(s.wrapping_sub(r) as isize) {
            return Ok(());
        }
        Err(Error::invalid_arg(format!(
            "sendbuff {:p} ({sb} bytes) and recvbuff {:p} ({rb} bytes) overlap, but not in {}'s in-place layout ({layout}); results would be wrong: pass separate buffers or the exact in-place pointers",
            self.send,
            self.recv,
            self.kind.c_name()
        )))
    }

    /// Elements of `send` and `recv` this rank's call reads or writes, counted from
    /// each pointer; 0 for a buffer the call does not use on this rank (the root's
    /// buffers elsewhere, a send's receive buffer). The one place these sizes are
    /// computed: validation checks them and device staging copies exactly them.
    fn span(&self, rank: usize, nranks: usize) -> Result<(usize, usize)> {
        let is_root = self.root == rank;
        let n = self.count;
        let all = || self.mul(n, nranks, "count * nranks");
        Ok(match self.kind {
            CollKind::AllReduce => (n, n),
            CollKind::Broadcast => (if is_root { n } else { 0 }, n),
            CollKind::Reduce => (n, if is_root { n } else { 0 }),
            CollKind::AllGather => (n, all()?),
            CollKind::Gather => (n, if is_root { all()? } else { 0 }),
            CollKind::ReduceScatter => (all()?, n),
            CollKind::AlltoAll => (all()?, all()?),
            CollKind::Scatter => (if is_root { all()? } else { 0 }, n),
            CollKind::Send => (n, 0),
            CollKind::Recv => (0, n),
            CollKind::Barrier => (0, 0),
            CollKind::AlltoAllv | CollKind::AllGatherV | CollKind::ReduceScatterV => {
                let v =
                    self.v.as_ref().ok_or_else(|| Error::internal(format!("{} without counts", self.kind.c_name())))?;
                // End of the furthest non-empty block; empty blocks may point anywhere.
                let end = |c: &[usize], d: &[usize]| -> Result<usize> {
                    let mut e = 0usize;
                    for (&c, &d) in c.iter().zip(d).filter(|(c, _)| **c > 0) {
                        e = e.max(c.checked_add(d).ok_or_else(|| {
                            Error::invalid_arg(format!("displacement {d} + count {c} overflows size_t"))
                        })?);
                    }
                    Ok(e)
                };
                match self.kind {
                    CollKind::AlltoAllv => (end(v.sendcounts(), v.sdispls())?, end(v.recvcounts(), v.rdispls())?),
                    CollKind::AllGatherV => (n, end(v.recvcounts(), v.rdispls())?),
                    _ => (end(v.recvcounts(), v.sdispls())?, v.recvcounts().get(rank).copied().unwrap_or(0)),
                }
            }
        })
    }

    /// Bytes of `send` and `recv` this rank's call reads or writes, counted from
    /// each pointer (0 when the buffer is unused here).
    pub fn extents(&self, rank: usize, nranks: usize) -> Result<(usize, usize)> {
        let (s, r) = self.span(rank, nranks)?;
        Ok((self.bytes(s, "send extent")?, self.bytes(r, "receive extent")?))
    }

    /// The buffers this rank's call uses, named, for memory-kind checks.
    pub fn buffers(&self, rank: usize, nranks: usize) -> Result<[(&'static str, *const u8); 2]> {
        let (s, r) = self.extents(rank, nranks)?;
        Ok([
            ("sendbuff", if s > 0 { self.send } else { std::ptr::null() }),
            ("recvbuff", if r > 0 { self.recv as *const u8 } else { std::ptr::null() }),
        ])
    }

    fn validate_rsv(&self, rank: usize, nranks: usize) -> Result<()> {
        let v = self.v.as_ref().ok_or_else(|| Error::internal("reduce_scatter_v without counts"))?;
        if v.recvcounts().len() != nranks || v.sdispls().len() != nranks {
            return Err(Error::internal("reduce_scatter_v counts of the wrong length"));
        }
        let mut extent = 0usize;
        for p in 0..nranks {
            let end = v.sdispls()[p].checked_add(v.recvcounts()[p]).ok_or_else(|| {
                Error::invalid_arg(format!(
                    "sdispls[{p}] + recvcounts[{p}] = {} + {} overflows",
                    v.sdispls()[p],
                    v.recvcounts()[p]
                ))
            })?;
            self.bytes_named(end, || format!("sdispls[{p}] + recvcounts[{p}]"))?;
            if v.recvcounts()[p] > 0 {
                extent = extent.max(end);
            }
        }
        let sb = self.bytes(extent, "send extent")?;
        if extent > 0 {
            check_buf(self.send, sb, "sendbuff", extent)?;
        }
        let mine = v.recvcounts()[rank];
        let rb = self.bytes(mine, "recvcounts[rank]")?;
        check_buf(self.recv, rb, "recvbuff", mine)?;
        self.check_overlap(rank, sb, rb)
    }

    #[inline]
    fn mul(&self, a: usize, b: usize, what: &str) -> Result<usize> {
        a.checked_mul(b).ok_or_else(|| Error::invalid_arg(format!("{what} = {a} * {b} overflows size_t")))
    }

    fn validate_v(&self, rank: usize, nranks: usize) -> Result<()> {
        let v = self.v.as_ref().ok_or_else(|| Error::internal("all_to_allv without counts"))?;
        let (sc, sd, rc, rd) = (v.sendcounts(), v.sdispls(), v.recvcounts(), v.rdispls());
        for (name, arr) in [("sendcounts", sc), ("sdispls", sd), ("recvcounts", rc), ("rdispls", rd)] {
            if arr.len() != nranks {
                return Err(Error::internal(format!("{name} has {} entries for {nranks} ranks", arr.len())));
            }
        }
        let (mut send_extent, mut recv_extent) = (0usize, 0usize);
        // Whether the non-empty receive regions come in rank order, each starting at or
        // after the end of the one before: then they cannot overlap, and no sort is needed.
        let mut ordered = true;
        for p in 0..nranks {
            let s_end = sd[p].checked_add(sc[p]).ok_or_else(|| {
                Error::invalid_arg(format!("sdispls[{p}] + sendcounts[{p}] = {} + {} overflows", sd[p], sc[p]))
            })?;
            let r_end = rd[p].checked_add(rc[p]).ok_or_else(|| {
                Error::invalid_arg(format!("rdispls[{p}] + recvcounts[{p}] = {} + {} overflows", rd[p], rc[p]))
            })?;
            self.bytes_named(s_end, || format!("sdispls[{p}] + sendcounts[{p}]"))?;
            self.bytes_named(r_end, || format!("rdispls[{p}] + recvcounts[{p}]"))?;
            if sc[p] > 0 {
                send_extent = send_extent.max(s_end);
            }
            if rc[p] > 0 {
                ordered &= rd[p] >= recv_extent;
                recv_extent = recv_extent.max(r_end);
            }
        }
        if !ordered {
            overlapping_receives(rc, rd)?;
        }
        let (sb, rb) = (self.bytes(send_extent, "send extent")?, self.bytes(recv_extent, "receive extent")?);
        if send_extent > 0 {
            check_buf(self.send, sb, "sendbuff", send_extent)?;
        }
        if recv_extent > 0 {
            check_buf(self.recv, rb, "recvbuff", recv_extent)?;
        }
        self.check_overlap(rank, sb, rb)
    }
}

/// Balanced split of `count` elements into `n` parts: (start, len) of part `i`; the
/// first `count % n` parts have one more.
pub fn part(count: usize, n: usize, i: usize) -> (usize, usize) {
    let (base, rem) = (count / n, count % n);
    (i * base + i.min(rem), base + usize::from(i < rem))
}

/// Refuses receive regions of all_to_allv (counts and displacements already checked
/// for overflow) that overlap, naming two of them.
#[cold]
fn overlapping_receives(rc: &[usize], rd: &[usize]) -> Result<()> {
    let mut regions: Vec<(usize, usize, usize)> =
        (0..rc.len()).filter(|&p| rc[p] > 0).map(|p| (rd[p], rd[p] + rc[p], p)).collect();
    regions.sort_unstable();
    for w in regions.windows(2) {
        let ((a0, a1, pa), (b0, _, pb)) = (w[0], w[1]);
        if b0 < a1 {
            return Err(Error::invalid_arg(format!(
                "receive regions overlap: rank {pa}'s block [{a0}, {a1}) and rank {pb}'s block starting at {b0} (rdispls/recvcounts in elements); each element of recvbuff may be written once"
            )));
        }
    }
    Ok(())
}

#[inline]
fn check_buf(p: *const u8, bytes: usize, name: &str, count: usize) -> Result<()> {
    if bytes == 0 || (!p.is_null() && (p as usize).checked_add(bytes).is_some()) {
        return Ok(());
    }
    Err(bad_buf(p, bytes, name, count))
}

/// The error for a buffer that [`check_buf`] refused: NULL, or wrapping around.
#[cold]
fn bad_buf(p: *const u8, bytes: usize, name: &str, count: usize) -> Error {
    if p.is_null() {
        Error::invalid_arg(format!("{name} is NULL with count {count}; pass a buffer or count 0"))
    } else {
        Error::invalid_arg(format!(
            "{name} {p:p} + {bytes} bytes wraps around the address space; the count is too large"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    fn c(kind: CollKind, count: usize) -> Coll {
        let mut b = [0u8; 64];
        Coll::new(kind, b.as_ptr(), b.as_mut_ptr(), count, DataType::Float32)
    }

    #[test]
    fn a_send_or_recv_is_checked_by_its_peer_not_the_root() {
        for kind in [CollKind::Send, CollKind::Recv] {
            let mut x = c(kind, 4);
            x.peer = 5;
            let e = x.validate(0, 4).unwrap_err();
            assert!(e.msg.contains("peer 5 out of range for a communicator of 4 ranks"), "{}", e.msg);
            x.peer = 3;
            x.root = 9;
            assert!(x.validate(0, 4).is_ok(), "{kind:?}: the root plays no part in a send or recv");
            // The root of a rooted collective is not its peer either.
            let mut b = c(CollKind::Broadcast, 4);
            b.peer = 9;
            assert!(b.validate(0, 4).is_ok());
        }
    }

    #[test]
    fn validator_names_the_bad_value() {
        let mut x = c(CollKind::Broadcast, 4);
        x.root = 5;
        let e = x.validate(0, 4).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.msg.contains("root 5 out of range for a communicator of 4 ranks"), "{}", e.msg);
        let mut x = c(CollKind::AllReduce, 3);
        x.send = std::ptr::null();
        assert!(x.validate(0, 2).unwrap_err().msg.contains("sendbuff is NULL"));
        let x = c(CollKind::AllReduce, usize::MAX / 2);
        assert!(x.validate(0, 2).unwrap_err().msg.contains("overflows"));
        let x = c(CollKind::AllGather, usize::MAX / 8);
        assert!(x.validate(0, 16).is_err());
        // Buffers only the root uses may be NULL elsewhere.
        let mut x = c(CollKind::Reduce, 3);
        x.root = 1;
        x.recv = std::ptr::null_mut();
        assert!(x.validate(0, 2).is_ok());
        assert!(x.validate(1, 2).is_err());
        // Count 0 needs no buffers.
        let mut x = c(CollKind::AllReduce, 0);
        x.send = std::ptr::null();
        x.recv = std::ptr::null_mut();
        assert!(x.validate(0, 2).is_ok());
    }

    #[test]
    fn extents_are_the_bytes_each_rank_touches() {
        // Written out by hand from NCCL's buffer-size table (count 5, 3 ranks, 4-byte
        // elements, root 1), independently of span(): device staging copies exactly
        // these bytes, so an extent too small loses results and overruns the copy.
        let table = [
            (CollKind::AllReduce, (5, 5), (5, 5)),
            (CollKind::Broadcast, (5, 5), (0, 5)),
            (CollKind::Reduce, (5, 5), (5, 0)),
            (CollKind::AllGather, (5, 15), (5, 15)),
            (CollKind::Gather, (5, 15), (5, 0)),
            (CollKind::ReduceScatter, (15, 5), (15, 5)),
            (CollKind::AlltoAll, (15, 15), (15, 15)),
            (CollKind::Scatter, (15, 5), (0, 5)),
            (CollKind::Send, (5, 0), (5, 0)),
            (CollKind::Recv, (0, 5), (0, 5)),
            (CollKind::Barrier, (0, 0), (0, 0)),
        ];
        for (kind, at_root, elsewhere) in table {
            let mut x = c(kind, 5);
            x.root = 1;
            let bytes = |(s, r): (usize, usize)| (s * 4, r * 4);
            assert_eq!(x.extents(1, 3).unwrap(), bytes(at_root), "{kind:?} at the root");
            assert_eq!(x.extents(0, 3).unwrap(), bytes(elsewhere), "{kind:?} off the root");
        }
        // V forms: the end of the furthest non-empty block; empty blocks point anywhere.
        let mut x = c(CollKind::AlltoAllv, 0);
        x.v = Some(VCounts::new(&[2, 0, 1], &[0, 100, 6], &[1, 3, 0], &[9, 2, 50]));
        assert_eq!(x.extents(0, 3).unwrap(), (7 * 4, 10 * 4));
        let mut x = c(CollKind::AllGatherV, 2);
        x.v = Some(VCounts::gather_v(2, 3, &[2, 0, 4], &[0, 99, 2]));
        assert_eq!(x.extents(1, 3).unwrap(), (2 * 4, 6 * 4));
        let mut x = c(CollKind::ReduceScatterV, 3);
        x.v = Some(VCounts::new(&[], &[4, 0, 1], &[1, 3, 0], &[]));
        assert_eq!(x.extents(1, 3).unwrap(), (5 * 4, 3 * 4));
        // Sizes that overflow are errors, not wrapped extents.
        let x = c(CollKind::AlltoAll, usize::MAX / 2);
        assert!(x.extents(0, 3).is_err());
    }

    #[test]
    fn partial_overlaps_are_refused_and_exact_in_place_kept() {
        let mut buf = vec![0f32; 256];
        let base = buf.as_mut_ptr() as *mut u8;
        let at = |elems: usize| base.wrapping_add(elems * 4);
        let call = |kind: CollKind, send: usize, recv: usize, count: usize| {
            let mut x = Coll::new(kind, at(send), at(recv), count, DataType::Float32);
            x.root = 1;
            x
        };
        let refused = |x: Coll, rank: usize| {
            let e = x.validate(rank, 4).expect_err("a partial overlap is refused");
            assert_eq!(e.code, Code::InvalidArgument);
            assert!(e.msg.contains("overlap") && e.msg.contains("in-place layout"), "{}", e.msg);
        };
        // all_reduce: recvbuff = sendbuff +- 1 or 7 elements (the hostile test's cases).
        for off in [1usize, 7] {
            refused(call(CollKind::AllReduce, 16, 16 + off, 10), 0);
            refused(call(CollKind::AllReduce, 16 + off, 16, 10), 0);
        }
        assert!(call(CollKind::AllReduce, 16, 16, 10).validate(0, 4).is_ok());
        assert!(call(CollKind::AllReduce, 16, 26, 10).validate(0, 4).is_ok(), "adjacent, not overlapping");
        // all_gather: sendbuff 3 elements off its in-place position.
        assert!(call(CollKind::AllGather, 10 * 2, 0, 10).validate(2, 4).is_ok());
        refused(call(CollKind::AllGather, 10 * 2 + 3, 0, 10), 2);
        refused(call(CollKind::AllGather, 10 * 2, 0, 10), 1);
        // reduce_scatter: recvbuff = sendbuff + rank*count, and off by one.
        assert!(call(CollKind::ReduceScatter, 0, 10 * 3, 10).validate(3, 4).is_ok());
        refused(call(CollKind::ReduceScatter, 0, 10 * 3 - 1, 10), 3);
        // Rooted calls: only the root uses both buffers.
        assert!(call(CollKind::Broadcast, 0, 5, 10).validate(0, 4).is_ok(), "sendbuff unused off the root");
        refused(call(CollKind::Broadcast, 0, 5, 10), 1);
        assert!(call(CollKind::Gather, 10, 0, 10).validate(1, 4).is_ok());
        assert!(call(CollKind::Scatter, 0, 10, 10).validate(1, 4).is_ok());
        // all_to_all(v) in place is sendbuff == recvbuff only.
        assert!(call(CollKind::AlltoAll, 0, 0, 10).validate(0, 4).is_ok());
        refused(call(CollKind::AlltoAll, 0, 10, 10), 0);
        // all_gather_v: in place at rdispls[rank]; reduce_scatter_v at sdispls[rank].
        let mut x = call(CollKind::AllGatherV, 40, 0, 5);
        x.v = Some(VCounts::gather_v(5, 4, &[5, 5, 5, 5], &[0, 20, 40, 60]));
        assert!(x.validate(2, 4).is_ok());
        refused(x.clone(), 1);
        let mut x = call(CollKind::ReduceScatterV, 0, 30, 5);
        x.v = Some(VCounts::new(&[], &[0, 10, 30, 50], &[5, 5, 5, 5], &[]));
        assert!(x.validate(2, 4).is_ok());
        refused(x, 1);
    }

    #[test]
    fn vcounts_read_back_each_array() {
        let v = VCounts::new(&[1, 2], &[3, 4], &[5, 6], &[7, 8]);
        assert_eq!(
            (v.sendcounts(), v.sdispls(), v.recvcounts(), v.rdispls()),
            (&[1, 2][..], &[3, 4][..], &[5, 6][..], &[7, 8][..])
        );
        // all_gather_v's, built in one allocation, read back as if built by new().
        let g = VCounts::gather_v(5, 3, &[5, 5, 5], &[0, 9, 20]);
        let w = VCounts::new(&[5, 5, 5], &[0, 0, 0], &[5, 5, 5], &[0, 9, 20]);
        assert_eq!(format!("{g:?}"), format!("{w:?}"));
        // reduce_scatter_v leaves sendcounts and rdispls empty.
        let v = VCounts::new(&[], &[0, 2, 4], &[2, 2, 1], &[]);
        assert_eq!(
            (v.sendcounts(), v.sdispls(), v.recvcounts(), v.rdispls()),
            (&[][..], &[0, 2, 4][..], &[2, 2, 1][..], &[][..])
        );
        assert_eq!(
            format!("{v:?}"),
            "VCounts { sendcounts: [], sdispls: [0, 2, 4], recvcounts: [2, 2, 1], rdispls: [] }"
        );
    }

    #[test]
    fn alltoallv_rejects_overlapping_receive_regions() {
        let mut x = c(CollKind::AlltoAllv, 0);
        let counts = |rdispls: &[usize]| Some(VCounts::new(&[1, 1], &[0, 1], &[2, 2], rdispls));
        x.v = counts(&[0, 1]);
        let e = x.validate(0, 2).unwrap_err();
        assert!(e.msg.contains("rank 0's block [0, 2) and rank 1's block starting at 1"), "{}", e.msg);
        // Out of rank order, overlapping and not.
        x.v = counts(&[1, 0]);
        let e = x.validate(0, 2).unwrap_err();
        assert!(e.msg.contains("rank 1's block [0, 2) and rank 0's block starting at 1"), "{}", e.msg);
        x.v = counts(&[2, 0]);
        assert!(x.validate(0, 2).is_ok());
        x.v = counts(&[0, 5]);
        assert!(x.validate(0, 2).is_ok());
        // Empty blocks overlap nothing; the ones around them still count.
        x.v = Some(VCounts::new(&[1, 1, 1], &[0, 1, 2], &[2, 0, 2], &[0, 1, 1]));
        assert!(x.validate(0, 3).unwrap_err().msg.contains("rank 0's block [0, 2) and rank 2's"));
        x.v = Some(VCounts::new(&[1, 1, 1], &[0, 1, 2], &[2, 0, 2], &[0, 1, 2]));
        assert!(x.validate(0, 3).is_ok());
    }
}
