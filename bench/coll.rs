//! The collectives: sizes and bandwidth as nccl-tests defines them, the C call, the
//! inputs each rank writes and the check of each rank's results.

use crate::cli::Op;
use crate::comm::{check, Comm, Fail};
use crate::data::{slice, Elem, Gen, RedKind, Ty};
use ferroccl::ffi::*;
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
}

/// Buffer sizes and in-place offsets of one size, in elements (nccl-tests'
/// `getCollByteCount`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The count argument of the call (per rank / per peer where the call says so).
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

impl Collective {
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
        }
    }

    pub fn parse(s: &str) -> Option<Collective> {
        let s = s.to_ascii_lowercase().replace('-', "_");
        let alias = match s.as_str() {
            "allreduce" => "all_reduce",
            "allgather" => "all_gather",
            "reducescatter" => "reduce_scatter",
            "alltoall" => "all_to_all",
            "alltoallv" => "all_to_allv",
            "sendrecv" => "send_recv",
            o => o,
        };
        Collective::ALL.iter().copied().find(|c| c.name() == alias)
    }

    pub fn reduces(self) -> bool {
        matches!(self, Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter)
    }

    pub fn has_root(self) -> bool {
        matches!(self, Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter)
    }

    /// Whether in-place results are checked. As in nccl-tests, in-place all_to_all(v)
    /// and send_recv run (sendbuff == recvbuff) but their results are not defined.
    pub fn inplace_checked(self) -> bool {
        !matches!(self, Collective::AlltoAll | Collective::AlltoAllv | Collective::SendRecv)
    }

    /// nccl-tests' `getCollByteCount` for `count` = size / element size.
    pub fn layout(self, count: usize, n: usize) -> Layout {
        let per = count / n;
        let l =
            |param, send, recv, send_inplace, recv_inplace| Layout { param, send, recv, send_inplace, recv_inplace };
        match self {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce | Collective::SendRecv => {
                l(count, count, count, 0, 0)
            }
            Collective::AllGather | Collective::Gather => l(per, per, per * n, per, 0),
            Collective::ReduceScatter | Collective::Scatter => l(per, per * n, per, 0, per),
            Collective::AlltoAll | Collective::AlltoAllv => l(per, per * n, per * n, 0, 0),
        }
    }

    /// Bytes per call for algbw (nccl-tests' `getBw`): count*size for all_reduce,
    /// broadcast, reduce and send_recv; count*nranks*size for the others.
    pub fn alg_bytes(self, l: &Layout, esize: usize, n: usize) -> f64 {
        match self {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce | Collective::SendRecv => {
                (l.param * esize) as f64
            }
            _ => (l.param * n * esize) as f64,
        }
    }

    /// busbw = algbw * factor (nccl-tests' `getBw`).
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
            _ => (n - 1.0) / n,
        }
    }
}

/// Elements rank `s` sends to rank `d` in all_to_allv with `per` = the count per peer:
/// between per/2 and per, uneven across pairs, the same on every rank.
pub fn v_count(per: usize, s: usize, d: usize, n: usize) -> usize {
    let f = ((s + 1) * (d + 2)) % (n + 1);
    per - per * f / (2 * n)
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
    pub rotate: bool,
    sendcounts: Vec<usize>,
    sdispls: Vec<usize>,
    recvcounts: Vec<usize>,
    rdispls: Vec<usize>,
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
    ) -> Case<'a> {
        let n = comm.nranks;
        let layout = coll.layout(count, n);
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
            rotate,
            sendcounts: Vec::new(),
            sdispls: Vec::new(),
            recvcounts: Vec::new(),
            rdispls: Vec::new(),
        };
        if coll == Collective::AlltoAllv {
            let (r, per) = (comm.rank, layout.param);
            c.sendcounts = (0..n).map(|d| v_count(per, r, d, n)).collect();
            c.recvcounts = (0..n).map(|s| v_count(per, s, r, n)).collect();
            c.sdispls = (0..n).map(|d| d * per).collect();
            c.rdispls = (0..n).map(|s| s * per).collect();
        }
        c
    }

    /// (sendbuff, recvbuff) of iteration `iter`: shifted along the allocation as
    /// nccl-tests does when rotating, then placed for in-place.
    fn buffers(&self, iter: usize, inplace: bool) -> (*mut u8, *mut u8) {
        let e = self.ty.size();
        let total = self.layout.send.max(self.layout.recv) * e;
        let steps = if total > 0 && self.rotate { (self.buf_bytes / total).max(1) } else { 1 };
        let shift = total * (iter % steps);
        // SAFETY (pointer arithmetic): shift + total <= buf_bytes.
        let (s, r) = unsafe { (self.send_base.add(shift), self.recv_base.add(shift)) };
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
        // SAFETY: every buffer is inside an allocation sized for the largest size of
        // the sweep, as the layout implies; counts and displacements fit it.
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
            }
        }
    }

    fn gen(&self, seed: u64) -> Gen {
        Gen::new(self.ty, red_kind(self.op), self.comm.nranks, seed)
    }

    /// Writes this rank's inputs for iteration 0's buffers (and fills what the call
    /// must write with sentinels).
    pub fn fill(&self, seed: u64, inplace: bool) {
        crate::with_elem!(self.ty, T => self.fill_t::<T>(seed, inplace))
    }

    /// Checks this rank's results of iteration 0's buffers; `corrupt` first flips the
    /// first element this rank checks (the FERROCCL_BENCH_CORRUPT test hook).
    pub fn check(&self, seed: u64, inplace: bool, corrupt: bool) -> Wrong {
        crate::with_elem!(self.ty, T => self.check_t::<T>(seed, inplace, corrupt))
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
        match (self.coll, inplace) {
            (Collective::AllReduce | Collective::Reduce, false) => {
                fill_red(send, 0);
                recv[..l.recv].fill(sentinel);
            }
            (Collective::AllReduce | Collective::Reduce, true) => fill_red(&mut recv[..l.recv], 0),
            (Collective::Broadcast, false) => {
                fill_data(send, me, 0);
                recv[..l.recv].fill(sentinel);
            }
            (Collective::Broadcast, true) => {
                if me == root {
                    fill_data(&mut recv[..l.recv], me, 0);
                } else {
                    recv[..l.recv].fill(sentinel);
                }
            }
            (Collective::AllGather | Collective::Gather, false) => {
                fill_data(send, me, 0);
                recv[..l.recv].fill(sentinel);
            }
            (Collective::AllGather | Collective::Gather, true) => {
                recv[..l.recv].fill(sentinel);
                fill_data(&mut recv[me * per..(me + 1) * per], me, 0);
            }
            (Collective::ReduceScatter, false) => {
                fill_red(send, 0);
                recv[..l.recv].fill(sentinel);
            }
            (Collective::ReduceScatter, true) => fill_red(&mut recv[..l.send], 0),
            (Collective::Scatter, false) => {
                fill_data(send, me, 0);
                recv[..l.recv].fill(sentinel);
            }
            (Collective::Scatter, true) => {
                if me == root {
                    fill_data(&mut recv[..l.send], me, 0);
                } else {
                    recv[..l.send].fill(sentinel);
                }
            }
            (Collective::AlltoAll | Collective::AlltoAllv, false) => {
                fill_data(send, me, 0);
                recv[..l.recv].fill(sentinel);
            }
            (Collective::AlltoAll | Collective::AlltoAllv | Collective::SendRecv, true) => {
                fill_data(&mut recv[..l.send], me, 0)
            }
            (Collective::SendRecv, false) => {
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
        // The region this rank checks, and the expected value of its element k.
        let (start, len): (usize, usize) = match (self.coll, inplace) {
            (Collective::Reduce | Collective::Gather, _) if me != root => (0, 0),
            (Collective::ReduceScatter | Collective::Scatter, true) => (me * per, per),
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
                Collective::AllReduce | Collective::Reduce => Some(g.red_expected(k)),
                Collective::ReduceScatter => Some(g.red_expected(me * per + k)),
                Collective::Broadcast => Some(g.data(root, k)),
                Collective::AllGather | Collective::Gather => Some(g.data(k / per, k % per)),
                Collective::Scatter => Some(g.data(root, me * per + k)),
                Collective::AlltoAll => Some(g.data(k / per, me * per + k % per)),
                Collective::AlltoAllv => {
                    let (s, i) = (k / per, k % per);
                    // Past what s sends, the buffer must be untouched (sentinel: None).
                    (i < v_count(per, s, me, n)).then(|| g.data(s, me * per + i))
                }
                Collective::SendRecv => Some(g.data((me + n - 1) % n, k)),
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
