//! The collectives: sizes and bandwidth as nccl-tests defines them, the C call, the
//! inputs each rank writes and the check of each rank's results.

use crate::comm::{check, Comm, Fail};
use crate::data::{slice, Elem, Gen, Op, RedKind, Ty};
use ferroccl::ffi::*;
use ferroccl::mem::cuda;
use std::cell::RefCell;
use std::os::raw::{c_int, c_void};
use std::ptr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AlltoAll,
    AlltoAllv,
    Gather,
    Scatter,
    SendRecv,
    // Extensions beyond NCCL (docs/abi.md's last section).
    AllGatherV,
    ReduceScatterV,
    AllGatherAxis,
    ReduceScatterAxis,
    AllReduceCoalesced,
    BroadcastCoalesced,
    AllReduceWire,
}

/// Parameters of the extension collectives (`--axis`, `--nbuffers`, `--bucket`, `--wire`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtParams {
    /// Axis of the 2-D tensor that the axis forms gather or scatter along (0 or 1).
    pub axis: usize,
    /// Buffers per coalesced call (fewer when the size has fewer elements).
    pub nbuffers: usize,
    /// bucketBytes of the coalesced calls; 0 = the library's default.
    pub bucket: usize,
    /// Wire type of all_reduce_wire.
    pub wire: Ty,
}

pub const DEFAULT_AXIS: usize = 1;
pub const DEFAULT_NBUFFERS: usize = 1000;

impl Default for ExtParams {
    fn default() -> Self {
        ExtParams { axis: DEFAULT_AXIS, nbuffers: DEFAULT_NBUFFERS, bucket: 0, wire: Ty::Bfloat16 }
    }
}

/// Buffer sizes and in-place offsets of one size, in elements (nccl-tests'
/// `getCollByteCount`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The count argument of the call (per rank / per peer where the call says so;
    /// all buffers together for the coalesced calls).
    pub param: usize,
    pub send: usize,
    pub recv: usize,
    /// In place: sendbuff = recvbuff + rank * send_inplace.
    pub send_inplace: usize,
    /// In place: recvbuff = (the send buffer) + rank * recv_inplace.
    pub recv_inplace: usize,
}

impl Layout {
    /// Bytes in the size column: max(send, recv) in bytes, as nccl-tests prints.
    pub fn size_bytes(&self, esize: usize) -> u64 {
        (self.send.max(self.recv) * esize) as u64
    }
}

/// How a coalesced call splits `count` elements: (buffers, elements per buffer).
/// Each buffer holds the largest power of two of elements not above count/nbuffers,
/// so 1M of float over 1000 buffers is 1000 buffers of 1 KiB; with fewer elements than
/// buffers, one element per buffer.
pub fn coalesced_split(count: usize, nbuffers: usize) -> (usize, usize) {
    let nb = nbuffers.min(count);
    if nb == 0 {
        return (0, 0);
    }
    let per = count / nb;
    (nb, 1usize << (usize::BITS - 1 - per.leading_zeros()))
}

/// Each rank's block of the axis forms, [rows, cols] with rows * cols = `per`: rows is
/// the largest divisor of per not above its square root ([1, 0] for per = 0).
pub fn block_shape(per: usize) -> [usize; 2] {
    if per == 0 {
        return [1, 0];
    }
    let mut r = (per as f64).sqrt() as usize;
    while r * r > per {
        r -= 1;
    }
    while (r + 1) * (r + 1) <= per {
        r += 1;
    }
    while per % r != 0 {
        r -= 1;
    }
    [r, per / r]
}

impl Collective {
    /// nccl-tests' set (what `all` runs).
    pub const ALL: [Collective; 10] = [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AlltoAll,
        Collective::AlltoAllv,
        Collective::Gather,
        Collective::Scatter,
        Collective::SendRecv,
    ];

    /// The extension collectives (what `ext` runs).
    pub const EXT: [Collective; 7] = [
        Collective::AllGatherV,
        Collective::ReduceScatterV,
        Collective::AllGatherAxis,
        Collective::ReduceScatterAxis,
        Collective::AllReduceCoalesced,
        Collective::BroadcastCoalesced,
        Collective::AllReduceWire,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AlltoAll => "all_to_all",
            Collective::AlltoAllv => "all_to_allv",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::SendRecv => "send_recv",
            Collective::AllGatherV => "all_gather_v",
            Collective::ReduceScatterV => "reduce_scatter_v",
            Collective::AllGatherAxis => "all_gather_axis",
            Collective::ReduceScatterAxis => "reduce_scatter_axis",
            Collective::AllReduceCoalesced => "all_reduce_coalesced",
            Collective::BroadcastCoalesced => "broadcast_coalesced",
            Collective::AllReduceWire => "all_reduce_wire",
        }
    }

    /// A name as printed, or the same without underscores (allreduce, alltoallv,
    /// allgatherv, ...); `-` counts as `_`.
    pub fn parse(s: &str) -> Option<Collective> {
        let s = s.to_ascii_lowercase().replace('-', "_");
        let squeezed = s.replace('_', "");
        Collective::ALL
            .iter()
            .chain(Collective::EXT.iter())
            .copied()
            .find(|c| c.name() == s || c.name().replace('_', "") == squeezed)
    }

    pub fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce
                | Collective::Reduce
                | Collective::ReduceScatter
                | Collective::ReduceScatterV
                | Collective::ReduceScatterAxis
                | Collective::AllReduceCoalesced
                | Collective::AllReduceWire
        )
    }

    pub fn has_root(self) -> bool {
        matches!(
            self,
            Collective::Broadcast
                | Collective::Reduce
                | Collective::Gather
                | Collective::Scatter
                | Collective::BroadcastCoalesced
        )
    }

    /// Whether in-place results are checked. In-place all_to_allv runs (sendbuff ==
    /// recvbuff) but its result is not defined (neither NCCL nor MPI has that form);
    /// ferroccl defines in-place all_to_all, and an fcclRecv into the buffer of an
    /// fcclSend of the same group (the send's data leaves first), so both are checked.
    pub fn inplace_checked(self) -> bool {
        !matches!(self, Collective::AlltoAllv)
    }

    /// Which placements exist: (out of place, in place). broadcast_coalesced has one
    /// buffer per tensor, so only in place; the axis forms along an axis other than 0
    /// have no in-place form (a rank's block is not contiguous in the result).
    pub fn placements(self, x: &ExtParams) -> (bool, bool) {
        match self {
            Collective::BroadcastCoalesced => (false, true),
            Collective::AllGatherAxis | Collective::ReduceScatterAxis if x.axis != 0 => (true, false),
            _ => (true, true),
        }
    }

    /// nccl-tests' `getCollByteCount` for `count` = size / element size; the extension
    /// forms as their plain counterparts (coalesced: all buffers together).
    pub fn layout(self, count: usize, n: usize, x: &ExtParams) -> Layout {
        let per = count / n;
        let l =
            |param, send, recv, send_inplace, recv_inplace| Layout { param, send, recv, send_inplace, recv_inplace };
        match self {
            Collective::AllReduce
            | Collective::Broadcast
            | Collective::Reduce
            | Collective::SendRecv
            | Collective::AllReduceWire => l(count, count, count, 0, 0),
            Collective::AllGather | Collective::Gather | Collective::AllGatherV | Collective::AllGatherAxis => {
                l(per, per, per * n, per, 0)
            }
            Collective::ReduceScatter
            | Collective::Scatter
            | Collective::ReduceScatterV
            | Collective::ReduceScatterAxis => l(per, per * n, per, 0, per),
            Collective::AlltoAll | Collective::AlltoAllv => l(per, per * n, per * n, 0, 0),
            Collective::AllReduceCoalesced | Collective::BroadcastCoalesced => {
                let (nb, each) = coalesced_split(count, x.nbuffers);
                l(nb * each, nb * each, nb * each, 0, 0)
            }
        }
    }

    /// Bytes per call for algbw (nccl-tests' `getBw`): count*size for all_reduce,
    /// broadcast, reduce and send_recv (and all_reduce_wire, with the data type's
    /// size, and the coalesced calls, with every buffer's count); count*nranks*size for
    /// the others.
    pub fn alg_bytes(self, l: &Layout, esize: usize, n: usize) -> f64 {
        match self {
            Collective::AllReduce
            | Collective::Broadcast
            | Collective::Reduce
            | Collective::SendRecv
            | Collective::AllReduceWire
            | Collective::AllReduceCoalesced
            | Collective::BroadcastCoalesced => (l.param * esize) as f64,
            _ => (l.param * n * esize) as f64,
        }
    }

    /// busbw = algbw * factor (nccl-tests' `getBw`; the extension forms take their
    /// plain counterpart's factor).
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Collective::AllReduce | Collective::AllReduceWire | Collective::AllReduceCoalesced => 2.0 * (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce | Collective::SendRecv | Collective::BroadcastCoalesced => 1.0,
            _ => (n - 1.0) / n,
        }
    }

    /// A comment line for the table header: how the extension forms are set up.
    pub fn note(self, x: &ExtParams, ty: Ty) -> Option<String> {
        let bucket = if x.bucket == 0 { "the library's default".to_string() } else { format!("{} B", x.bucket) };
        Some(match self {
            Collective::AllGatherV | Collective::ReduceScatterV => "# rank r's count is count*(1 - f/(2n)), \
                 f = (r+1)(r+2) mod (n+1), at displacement r*count; size and bandwidth use the full count"
                .to_string(),
            Collective::AllGatherAxis | Collective::ReduceScatterAxis => format!(
                "# each rank's block is a [rows, cols] tensor of count elements (rows = largest divisor of \
                 count <= sqrt(count)); along axis {}",
                x.axis
            ),
            Collective::AllReduceCoalesced | Collective::BroadcastCoalesced => format!(
                "# up to {} buffers per call, each the largest power-of-two count <= count/{}; bucket: {bucket}",
                x.nbuffers, x.nbuffers
            ),
            Collective::AllReduceWire => format!("# {} data over a {} wire", ty.name(), x.wire.name()),
            _ => return None,
        })
    }
}

/// Elements rank `s` sends to rank `d` in all_to_allv with `per` = the count per peer:
/// between per/2 and per, uneven across pairs, the same on every rank.
pub fn v_count(per: usize, s: usize, d: usize, n: usize) -> usize {
    let f = ((s + 1) * (d + 2)) % (n + 1);
    per - per * f / (2 * n)
}

/// Rank `r`'s count in all_gather_v and reduce_scatter_v: all_to_allv's count from r to r.
pub fn own_v_count(per: usize, r: usize, n: usize) -> usize {
    v_count(per, r, r, n)
}
/// One collective at one size, ready to run and check.
pub struct Case<'a> {
    pub comm: &'a Comm,
    pub coll: Collective,
    pub ty: Ty,
    pub op: Op,
    pub root: usize,
    pub layout: Layout,
    pub send_base: *mut u8,
    pub recv_base: *mut u8,
    /// Bytes of each of the two allocations.
    pub buf_bytes: usize,
    /// `--mem cuda`: the device allocations the calls use; `send_base`/`recv_base`
    /// are then host mirrors that fill and check work on, copied with cuMemcpy.
    pub device: Option<(*mut u8, *mut u8)>,
    pub rotate: bool,
    pub x: ExtParams,
    /// Inputs are chosen so that every contribution and partial result is exact in
    /// this type too (the wire type of all_reduce_wire).
    pub exact_in: Option<Ty>,
    sendcounts: Vec<usize>,
    sdispls: Vec<usize>,
    recvcounts: Vec<usize>,
    rdispls: Vec<usize>,
    /// Axis forms: each rank's block, [rows, cols].
    shape: [usize; 2],
    /// Coalesced forms: every buffer's count, and room for the pointer arrays.
    counts: Vec<usize>,
    ptrs: RefCell<(Vec<*const c_void>, Vec<*mut c_void>)>,
}

fn cuda_fail(e: ferroccl::error::Error) -> Fail {
    Fail::runtime(format!("--mem cuda: {}", e.msg))
}

fn red_kind(op: Op) -> RedKind {
    match op {
        Op::Sum => RedKind::Sum,
        Op::Prod => RedKind::Prod,
        Op::Max => RedKind::Max,
        Op::Min => RedKind::Min,
        Op::Avg => RedKind::Avg,
    }
}

/// The first wrong element a rank found, for the message on stderr.
#[derive(Clone, Debug)]
pub struct Wrong {
    pub count: u64,
    pub first: Option<(usize, Option<u64>, Option<u64>)>,
}

impl<'a> Case<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        comm: &'a Comm,
        coll: Collective,
        ty: Ty,
        op: Op,
        root: usize,
        count: usize,
        send: *mut u8,
        recv: *mut u8,
        buf_bytes: usize,
        rotate: bool,
        x: ExtParams,
    ) -> Case<'a> {
        let n = comm.nranks;
        let layout = coll.layout(count, n, &x);
        let mut c = Case {
            comm,
            coll,
            ty,
            op,
            root,
            layout,
            send_base: send,
            recv_base: recv,
            buf_bytes,
            device: None,
            rotate,
            x,
            exact_in: (coll == Collective::AllReduceWire).then_some(x.wire),
            sendcounts: Vec::new(),
            sdispls: Vec::new(),
            recvcounts: Vec::new(),
            rdispls: Vec::new(),
            shape: [1, 0],
            counts: Vec::new(),
            ptrs: RefCell::new((Vec::new(), Vec::new())),
        };
        let (r, per) = (comm.rank, layout.param);
        match coll {
            Collective::AlltoAllv => {
                c.sendcounts = (0..n).map(|d| v_count(per, r, d, n)).collect();
                c.recvcounts = (0..n).map(|s| v_count(per, s, r, n)).collect();
                c.sdispls = (0..n).map(|d| d * per).collect();
                c.rdispls = (0..n).map(|s| s * per).collect();
            }
            Collective::AllGatherV => {
                c.recvcounts = (0..n).map(|p| own_v_count(per, p, n)).collect();
                c.rdispls = (0..n).map(|p| p * per).collect();
            }
            Collective::ReduceScatterV => {
                c.recvcounts = (0..n).map(|p| own_v_count(per, p, n)).collect();
                c.sdispls = (0..n).map(|p| p * per).collect();
            }
            Collective::AllGatherAxis | Collective::ReduceScatterAxis => c.shape = block_shape(per),
            Collective::AllReduceCoalesced | Collective::BroadcastCoalesced => {
                let (nb, each) = coalesced_split(count, x.nbuffers);
                c.counts = vec![each; nb];
                c.ptrs = RefCell::new((vec![ptr::null(); nb], vec![ptr::null_mut(); nb]));
            }
            _ => {}
        }
        c
    }

    /// Replaces the uneven counts: all_to_allv sends `count(s, d)` elements from rank
    /// s to rank d, all_gather_v and reduce_scatter_v give rank p `count(p, p)`; each at
    /// most the count per peer (displacements stay at p * count). The soak's idle ranks
    /// and zero counts; other collectives are unchanged.
    pub fn set_v_counts(&mut self, count: impl Fn(usize, usize) -> usize) {
        let (n, r, per) = (self.comm.nranks, self.comm.rank, self.layout.param);
        let count = |s, d| count(s, d).min(per);
        match self.coll {
            Collective::AlltoAllv => {
                self.sendcounts = (0..n).map(|d| count(r, d)).collect();
                self.recvcounts = (0..n).map(|s| count(s, r)).collect();
            }
            Collective::AllGatherV | Collective::ReduceScatterV => {
                self.recvcounts = (0..n).map(|p| count(p, p)).collect()
            }
            _ => {}
        }
    }

    /// The whole tensor of the axis forms: the block with its axis times nranks.
    fn full_shape(&self) -> [usize; 2] {
        let mut f = self.shape;
        f[self.x.axis] *= self.comm.nranks;
        f
    }

    /// Element `k` of the whole tensor: (the rank whose block holds it, its index in the block).
    fn block_of(&self, k: usize) -> (usize, usize) {
        let (f, b, a) = (self.full_shape(), self.shape, self.x.axis);
        let mut idx = [k / f[1], k % f[1]];
        let p = idx[a] / b[a];
        idx[a] %= b[a];
        (p, idx[0] * b[1] + idx[1])
    }

    /// Element `m` of rank `p`'s block: its index in the whole tensor.
    fn whole_index(&self, p: usize, m: usize) -> usize {
        let (f, b, a) = (self.full_shape(), self.shape, self.x.axis);
        let mut idx = [m / b[1], m % b[1]];
        idx[a] += p * b[a];
        idx[0] * f[1] + idx[1]
    }

    /// Buffers per coalesced call and elements in each.
    pub fn coalesced(&self) -> (usize, usize) {
        (self.counts.len(), self.counts.first().copied().unwrap_or(0))
    }

    /// (sendbuff, recvbuff) of iteration `iter`: shifted along the allocation as
    /// nccl-tests does when rotating, then placed for in-place.
    fn buffers(&self, iter: usize, inplace: bool) -> (*mut u8, *mut u8) {
        let e = self.ty.size();
        let total = self.layout.send.max(self.layout.recv) * e;
        let steps = if total > 0 && self.rotate { (self.buf_bytes / total).max(1) } else { 1 };
        let shift = total * (iter % steps);
        let (sb, rb) = self.device.unwrap_or((self.send_base, self.recv_base));
        // SAFETY: (pointer arithmetic) shift + total <= buf_bytes.
        let (s, r) = unsafe { (sb.add(shift), rb.add(shift)) };
        if inplace {
            let rank = self.comm.rank;
            // SAFETY: the in-place offsets stay inside the receive (or send) region.
            unsafe { (r.add(self.layout.send_inplace * rank * e), r.add(self.layout.recv_inplace * rank * e)) }
        } else {
            (s, r)
        }
    }

    /// Runs the collective once (iteration `iter` picks the buffer offset).
    pub fn run(&self, iter: usize, inplace: bool) -> Result<(), Fail> {
        let (s, r) = self.buffers(iter, inplace);
        let (sp, rp) = (s as *const c_void, r as *mut c_void);
        let l = &self.layout;
        let ty = self.ty.c_value();
        let comm = self.comm.raw;
        let st = ptr::null_mut();
        let root = self.root as c_int;
        let op = self.op.c_value();
        let axis = self.x.axis as c_int;
        // SAFETY: every buffer is inside an allocation sized for the largest size of
        // the sweep, as the layout implies; counts, displacements, shapes and pointer
        // arrays fit it.
        unsafe {
            match self.coll {
                Collective::AllReduce => check(fcclAllReduce(sp, rp, l.param, ty, op, comm, st), "fcclAllReduce"),
                Collective::Broadcast => check(fcclBroadcast(sp, rp, l.param, ty, root, comm, st), "fcclBroadcast"),
                Collective::Reduce => check(fcclReduce(sp, rp, l.param, ty, op, root, comm, st), "fcclReduce"),
                Collective::AllGather => check(fcclAllGather(sp, rp, l.param, ty, comm, st), "fcclAllGather"),
                Collective::ReduceScatter => {
                    check(fcclReduceScatter(sp, rp, l.param, ty, op, comm, st), "fcclReduceScatter")
                }
                Collective::AlltoAll => check(fcclAlltoAll(sp, rp, l.param, ty, comm, st), "fcclAlltoAll"),
                Collective::AlltoAllv => check(
                    fcclAlltoAllv(
                        sp,
                        self.sendcounts.as_ptr(),
                        self.sdispls.as_ptr(),
                        rp,
                        self.recvcounts.as_ptr(),
                        self.rdispls.as_ptr(),
                        ty,
                        comm,
                        st,
                    ),
                    "fcclAlltoAllv",
                ),
                Collective::Gather => check(fcclGather(sp, rp, l.param, ty, root, comm, st), "fcclGather"),
                Collective::Scatter => check(fcclScatter(sp, rp, l.param, ty, root, comm, st), "fcclScatter"),
                Collective::SendRecv => {
                    let n = self.comm.nranks;
                    let me = self.comm.rank;
                    let to = ((me + 1) % n) as c_int;
                    let from = ((me + n - 1) % n) as c_int;
                    check(fcclGroupStart(), "fcclGroupStart")?;
                    let a = check(fcclSend(sp, l.param, ty, to, comm, st), "fcclSend");
                    let b = check(fcclRecv(rp, l.param, ty, from, comm, st), "fcclRecv");
                    let c = check(fcclGroupEnd(), "fcclGroupEnd");
                    a.and(b).and(c)
                }
                Collective::AllGatherV => check(
                    fcclAllGatherV(
                        sp,
                        self.recvcounts[self.comm.rank],
                        rp,
                        self.recvcounts.as_ptr(),
                        self.rdispls.as_ptr(),
                        ty,
                        comm,
                        st,
                    ),
                    "fcclAllGatherV",
                ),
                Collective::ReduceScatterV => check(
                    fcclReduceScatterV(sp, self.recvcounts.as_ptr(), self.sdispls.as_ptr(), rp, ty, op, comm, st),
                    "fcclReduceScatterV",
                ),
                Collective::AllGatherAxis => {
                    check(fcclAllGatherAxis(sp, rp, 2, self.shape.as_ptr(), axis, ty, comm, st), "fcclAllGatherAxis")
                }
                Collective::ReduceScatterAxis => {
                    let full = self.full_shape();
                    check(
                        fcclReduceScatterAxis(sp, rp, 2, full.as_ptr(), axis, ty, op, comm, st),
                        "fcclReduceScatterAxis",
                    )
                }
                Collective::AllReduceCoalesced | Collective::BroadcastCoalesced => {
                    let (nb, each) = self.coalesced();
                    let step = each * self.ty.size();
                    let mut p = self.ptrs.borrow_mut();
                    let (sends, recvs) = &mut *p;
                    for i in 0..nb {
                        sends[i] = s.add(i * step) as *const c_void;
                        recvs[i] = r.add(i * step) as *mut c_void;
                    }
                    if self.coll == Collective::AllReduceCoalesced {
                        check(
                            fcclAllReduceCoalesced(
                                sends.as_ptr(),
                                recvs.as_ptr(),
                                self.counts.as_ptr(),
                                nb as c_int,
                                ty,
                                op,
                                self.x.bucket,
                                comm,
                                st,
                            ),
                            "fcclAllReduceCoalesced",
                        )
                    } else {
                        // One buffer per tensor: always in place (recvbuff's region).
                        check(
                            fcclBroadcastCoalesced(
                                recvs.as_ptr(),
                                self.counts.as_ptr(),
                                nb as c_int,
                                ty,
                                root,
                                self.x.bucket,
                                comm,
                                st,
                            ),
                            "fcclBroadcastCoalesced",
                        )
                    }
                }
                Collective::AllReduceWire => check(
                    fcclAllReduceWire(sp, rp, l.param, ty, op, self.x.wire.c_value(), comm, st),
                    "fcclAllReduceWire",
                ),
            }
        }
    }

    /// The coalesced forms done the plain way: one fcclAllReduce (fcclBroadcast) per
    /// buffer, on the same buffers as [`Case::run`].
    pub fn run_separate(&self, iter: usize, inplace: bool) -> Result<(), Fail> {
        let (s, r) = self.buffers(iter, inplace);
        let (nb, each) = self.coalesced();
        let step = each * self.ty.size();
        let (ty, comm, st) = (self.ty.c_value(), self.comm.raw, ptr::null_mut());
        for i in 0..nb {
            // SAFETY: buffer i lies inside the region of the coalesced call.
            let (sp, rp) = unsafe { (s.add(i * step) as *const c_void, r.add(i * step) as *mut c_void) };
            // SAFETY: buffers of `each` elements.
            unsafe {
                match self.coll {
                    Collective::AllReduceCoalesced => {
                        check(fcclAllReduce(sp, rp, each, ty, self.op.c_value(), comm, st), "fcclAllReduce")?
                    }
                    Collective::BroadcastCoalesced => {
                        check(fcclBroadcast(rp, rp, each, ty, self.root as c_int, comm, st), "fcclBroadcast")?
                    }
                    c => return Err(Fail::runtime(format!("{} has no per-buffer form", c.name()))),
                }
            }
        }
        Ok(())
    }

    fn gen(&self, seed: u64) -> Gen {
        let (red, n) = (red_kind(self.op), self.comm.nranks);
        match self.exact_in {
            Some(t) => Gen::exact_partials(t, red, n, seed),
            None => Gen::new(self.ty, red, n, seed),
        }
    }

    /// Writes this rank's inputs for iteration 0's buffers (and fills what the call
    /// must write with sentinels).
    pub fn fill(&self, seed: u64, inplace: bool) -> Result<(), Fail> {
        crate::with_elem!(self.ty, T => self.fill_t::<T>(seed, inplace));
        if let Some((ds, dr)) = self.device {
            // SAFETY: mirrors and device allocations are buf_bytes each.
            unsafe {
                cuda::copy_to_device(ds, self.send_base, self.buf_bytes).map_err(cuda_fail)?;
                cuda::copy_to_device(dr, self.recv_base, self.buf_bytes).map_err(cuda_fail)?;
            }
        }
        Ok(())
    }

    /// Waits for the calls queued on the (default) stream: device memory only.
    pub fn wait(&self) -> Result<(), Fail> {
        if self.device.is_some() {
            cuda::sync(cuda::Stream::DEFAULT).map_err(cuda_fail)?;
        }
        Ok(())
    }

    /// Checks this rank's results of iteration 0's buffers; `corrupt` first flips the
    /// first element this rank checks (the FERROCCL_BENCH_CORRUPT test hook).
    pub fn check(&self, seed: u64, inplace: bool, corrupt: bool) -> Result<Wrong, Fail> {
        if let Some((_, dr)) = self.device {
            // SAFETY: mirror and device allocation are buf_bytes each.
            unsafe { cuda::copy_to_host(self.recv_base, dr, self.buf_bytes).map_err(cuda_fail)? };
        }
        Ok(crate::with_elem!(self.ty, T => self.check_t::<T>(seed, inplace, corrupt)))
    }

    fn fill_t<T: Elem>(&self, seed: u64, inplace: bool) {
        let g = self.gen(seed);
        let (me, root) = (self.comm.rank, self.root);
        let l = self.layout;
        let per = l.param;
        let (sb, rb) = (self.send_base, self.recv_base);
        let sentinel = T::sentinel();
        // SAFETY: both allocations hold at least max(send, recv) elements of T.
        let send: &mut [T] = unsafe { slice(sb, l.send) };
        // SAFETY: as above; the two allocations are distinct, so the slices do not alias.
        let recv: &mut [T] = unsafe { slice(rb, l.recv.max(l.send)) };
        let fill_data = |dst: &mut [T], r: usize, off: usize| {
            for (k, x) in dst.iter_mut().enumerate() {
                *x = T::from_int(g.data(r, off + k));
            }
        };
        let fill_red = |dst: &mut [T], off: usize| {
            for (k, x) in dst.iter_mut().enumerate() {
                *x = T::from_int(g.red_input(me, off + k));
            }
        };
        use Collective as C;
        match (self.coll, inplace) {
            (C::AllReduce | C::Reduce | C::AllReduceCoalesced | C::AllReduceWire, false) => {
                fill_red(send, 0);
                recv[..l.recv].fill(sentinel);
            }
            (C::AllReduce | C::Reduce | C::AllReduceCoalesced | C::AllReduceWire, true) => {
                fill_red(&mut recv[..l.recv], 0)
            }
            (C::Broadcast | C::BroadcastCoalesced, false) => {
                fill_data(send, me, 0);
                recv[..l.recv].fill(sentinel);
            }
            (C::Broadcast | C::BroadcastCoalesced, true) => {
                if me == root {
                    fill_data(&mut recv[..l.recv], me, 0);
                } else {
                    recv[..l.recv].fill(sentinel);
                }
            }
            (C::AllGather | C::Gather | C::AllGatherAxis, false) => {
                fill_data(send, me, 0);
                recv[..l.recv].fill(sentinel);
            }
            (C::AllGather | C::Gather | C::AllGatherAxis, true) => {
                recv[..l.recv].fill(sentinel);
                fill_data(&mut recv[me * per..(me + 1) * per], me, 0);
            }
            (C::AllGatherV, false) => {
                fill_data(send, me, 0);
                recv[..l.recv].fill(sentinel);
            }
            (C::AllGatherV, true) => {
                recv[..l.recv].fill(sentinel);
                fill_data(&mut recv[me * per..me * per + self.recvcounts[me]], me, 0);
            }
            (C::ReduceScatter | C::ReduceScatterV | C::ReduceScatterAxis, false) => {
                fill_red(send, 0);
                recv[..l.recv].fill(sentinel);
            }
            (C::ReduceScatter | C::ReduceScatterV | C::ReduceScatterAxis, true) => fill_red(&mut recv[..l.send], 0),
            (C::Scatter, false) => {
                fill_data(send, me, 0);
                recv[..l.recv].fill(sentinel);
            }
            (C::Scatter, true) => {
                if me == root {
                    fill_data(&mut recv[..l.send], me, 0);
                } else {
                    recv[..l.send].fill(sentinel);
                }
            }
            (C::AlltoAll | C::AlltoAllv, false) => {
                fill_data(send, me, 0);
                recv[..l.recv].fill(sentinel);
            }
            (C::AlltoAll | C::AlltoAllv | C::SendRecv, true) => fill_data(&mut recv[..l.send], me, 0),
            (C::SendRecv, false) => {
                fill_data(send, me, 0);
                recv[..l.recv].fill(sentinel);
            }
        }
    }

    fn check_t<T: Elem>(&self, seed: u64, inplace: bool, corrupt: bool) -> Wrong {
        let g = self.gen(seed);
        let (n, me, root) = (self.comm.nranks, self.comm.rank, self.root);
        let l = self.layout;
        let per = l.param;
        use Collective as C;
        // The region this rank checks, and the expected value of its element k.
        let (start, len): (usize, usize) = match (self.coll, inplace) {
            (C::Reduce | C::Gather, _) if me != root => (0, 0),
            (C::ReduceScatter | C::Scatter | C::ReduceScatterV | C::ReduceScatterAxis, true) => (me * per, per),
            (_, _) => (0, l.recv),
        };
        // SAFETY: the region lies inside the receive allocation (in place: the
        // send region, which is the same allocation).
        let res: &mut [T] = unsafe { slice(self.recv_base.add(start * self.ty.size()), len) };
        if corrupt && !res.is_empty() {
            res[0] = res[0].flip();
        }
        let expected = |k: usize| -> Option<u64> {
            match self.coll {
                C::AllReduce | C::Reduce | C::AllReduceCoalesced | C::AllReduceWire => Some(g.red_expected(k)),
                C::ReduceScatter => Some(g.red_expected(me * per + k)),
                C::Broadcast | C::BroadcastCoalesced => Some(g.data(root, k)),
                C::AllGather | C::Gather => Some(g.data(k / per, k % per)),
                C::Scatter => Some(g.data(root, me * per + k)),
                C::AlltoAll => Some(g.data(k / per, me * per + k % per)),
                C::AlltoAllv => {
                    let (s, i) = (k / per, k % per);
                    // Past what s sends, the buffer must be untouched (sentinel: None).
                    (i < self.recvcounts[s]).then(|| g.data(s, me * per + i))
                }
                C::SendRecv => Some(g.data((me + n - 1) % n, k)),
                C::AllGatherV => {
                    let (p, i) = (k / per, k % per);
                    // Past rank p's count, untouched (sentinel).
                    (i < self.recvcounts[p]).then(|| g.data(p, i))
                }
                C::ReduceScatterV => {
                    if k < self.recvcounts[me] {
                        Some(g.red_expected(me * per + k))
                    } else if inplace {
                        // Past my count, in place: my own input, untouched.
                        Some(g.red_input(me, me * per + k))
                    } else {
                        None
                    }
                }
                C::AllGatherAxis => {
                    let (p, m) = self.block_of(k);
                    Some(g.data(p, m))
                }
                C::ReduceScatterAxis => Some(g.red_expected(self.whole_index(me, k))),
            }
        };
        let mut w = Wrong { count: 0, first: None };
        for (k, x) in res.iter().enumerate() {
            let want = expected(k);
            let got = x.to_int();
            let ok = match want {
                Some(v) => got == Some(v),
                None => bits_eq(*x, T::sentinel()),
            };
            if !ok {
                w.count += 1;
                if w.first.is_none() {
                    w.first = Some((start + k, want, got));
                }
            }
        }
        w
    }
}

/// Bitwise equality of two elements.
fn bits_eq<T: Elem>(a: T, b: T) -> bool {
    let sz = std::mem::size_of::<T>();
    // SAFETY: reading the bytes of two plain values of the same type.
    unsafe {
        std::slice::from_raw_parts(&a as *const T as *const u8, sz)
            == std::slice::from_raw_parts(&b as *const T as *const u8, sz)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesced_split_and_block_shape() {
        // 1M of float over 1000 buffers: 1000 buffers of 256 floats (1 KiB).
        assert_eq!(coalesced_split((1 << 20) / 4, 1000), (1000, 256));
        assert_eq!(coalesced_split(2, 1000), (2, 1));
        assert_eq!(coalesced_split(0, 1000), (0, 0));
        assert_eq!(coalesced_split(3000, 1000), (1000, 2));
        assert_eq!(coalesced_split(1 << 20, 1), (1, 1 << 20));
        assert_eq!(block_shape(0), [1, 0]);
        assert_eq!(block_shape(1), [1, 1]);
        assert_eq!(block_shape(7), [1, 7]);
        assert_eq!(block_shape(12), [3, 4]);
        assert_eq!(block_shape(1 << 17), [256, 512]);
        for per in 1..2000 {
            let [r, c] = block_shape(per);
            assert_eq!(r * c, per);
            assert!(r <= c);
        }
    }

    #[test]
    fn names_parse() {
        for c in Collective::ALL.iter().chain(Collective::EXT.iter()) {
            assert_eq!(Collective::parse(c.name()), Some(*c));
        }
        assert_eq!(Collective::parse("allgatherv"), Some(Collective::AllGatherV));
        assert_eq!(Collective::parse("AllReduce-Wire"), Some(Collective::AllReduceWire));
        assert_eq!(Collective::parse("alltoallv"), Some(Collective::AlltoAllv));
        assert_eq!(Collective::parse("sendrecv"), Some(Collective::SendRecv));
        assert_eq!(Collective::parse("nope"), None);
    }
}
