//! One soak call drawn from (seed, call number): collective, type, op, size,
//! placement, extension parameters, uneven counts and every rank's buffers.

use crate::coll::{Collective, ExtParams};
use crate::data::{Op, Ty};
use crate::opts::{Mem, Opts, DEFAULT_SOAK_MAX_BYTES};
// The draws of one call: stream (call number) of the soak's seed, so one call redraws alone.
use ferroccl_testutil::Rng;
use std::fmt::Write as _;

/// Every collective in the order of the tallies.
pub fn all_colls() -> Vec<Collective> {
    Collective::ALL.iter().chain(Collective::EXT.iter()).copied().collect()
}

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// malloc: private memory peers cannot map.
    Malloc,
    /// fcclMemAllocHost: shared memory peers map from 32 KiB (single copy).
    Host,
    /// fcclMemAlloc (--mem cuda).
    Device,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Malloc, Kind::Host, Kind::Device];
    pub fn name(self) -> &'static str {
        match self {
            Kind::Malloc => "malloc",
            Kind::Host => "fcclMemAllocHost",
            Kind::Device => "fcclMemAlloc",
        }
    }
    pub fn short(self) -> &'static str {
        match self {
            Kind::Malloc => "malloc",
            Kind::Host => "host",
            Kind::Device => "dev",
        }
    }
}

/// One buffer of one rank in one call.
#[derive(Clone, Copy, Debug)]
pub struct BufSpec {
    pub kind: Kind,
    /// Elements between the allocation's start and the buffer.
    pub offset: usize,
    /// Free the allocation and allocate it anew before the call.
    pub fresh: bool,
}

/// One call, the same on every rank.
pub struct Call {
    pub coll: Collective,
    pub ty: Ty,
    pub op: Op,
    pub root: usize,
    /// The size drawn in bytes over the element size (as -b/-e make counts).
    pub count: usize,
    pub inplace: bool,
    pub x: ExtParams,
    /// Uneven counts, n x n: all_to_allv sends v[s*n+d] from s to d; all_gather_v and
    /// reduce_scatter_v give rank p v[p*n+p]. None: the sweep's pattern.
    pub v: Option<Vec<usize>>,
    /// Ranks whose counts are all 0 (v forms).
    pub idle: Vec<usize>,
    pub data_seed: u64,
    /// Every rank's (send, recv) buffers.
    pub bufs: Vec<[BufSpec; 2]>,
}

impl Call {
    pub fn draw(seed: u64, index: u64, colls: &[Collective], n: usize, o: &Opts) -> Call {
        let mut g = Rng::stream(seed, index);
        let coll = g.pick(colls);
        let (ty, wire) = if coll == Collective::AllReduceWire {
            let ty = g.pick(&[Ty::Float, Ty::Double]);
            let wires: Vec<Ty> = Ty::ALL.iter().copied().filter(|w| w.is_float() && w.size() <= ty.size()).collect();
            (ty, g.pick(&wires))
        } else {
            (g.pick(&Ty::ALL), g.pick(&[Ty::Bfloat16, Ty::Half]))
        };
        let op = if coll.reduces() { g.pick(&Op::ALL) } else { Op::Sum };
        // One call in 16 of size 0; the others log-uniform, so every decade is hit.
        let bytes = if o.max_bytes == 0 || g.chance(1, 16) { 0 } else { g.log_uniform(o.max_bytes) };
        let count = (bytes / ty.size() as u64) as usize;
        let root = g.below(n as u64) as usize;
        let nbuffers = g.log_uniform(1024) as usize;
        let bucket = if g.chance(1, 2) { 0 } else { g.log_uniform(DEFAULT_SOAK_MAX_BYTES) as usize };
        let x = ExtParams { axis: g.below(2) as usize, nbuffers, bucket, wire };
        let inplace = match coll.placements(&x) {
            (true, true) => g.chance(1, 2),
            (_, has_in) => has_in,
        };
        let data_seed = g.next_u64();
        let per = coll.layout(count, n, &x).param;
        let uneven = matches!(coll, Collective::AlltoAllv | Collective::AllGatherV | Collective::ReduceScatterV);
        let (mut v, mut idle) = (None, Vec::new());
        // Two calls in three of the v forms: random counts (0, full or between) with
        // idle ranks; the third keeps the sweep's pattern.
        if uneven && g.below(3) != 0 {
            let is_idle: Vec<bool> = (0..n).map(|_| g.chance(1, 3)).collect();
            let mut m = vec![0; n * n];
            for s in 0..n {
                for d in 0..n {
                    let c = match g.below(4) {
                        0 => 0,
                        1 => per,
                        _ => g.below(per as u64 + 1) as usize,
                    };
                    m[s * n + d] = if is_idle[s] || is_idle[d] { 0 } else { c };
                }
            }
            idle = (0..n).filter(|&r| is_idle[r]).collect();
            v = Some(m);
        }
        // Device memory for every rank or none: one backend must serve a call.
        let device = o.mem == Mem::Cuda && g.chance(1, 2);
        let bufs = (0..n)
            .map(|_| {
                let mut b = || BufSpec {
                    kind: if device {
                        Kind::Device
                    } else if g.chance(1, 2) {
                        Kind::Malloc
                    } else {
                        Kind::Host
                    },
                    offset: if g.chance(1, 2) { 0 } else { g.below(64) as usize },
                    fresh: g.chance(1, 16),
                };
                [b(), b()]
            })
            .collect();
        Call { coll, ty, op, root, count, inplace, x, v, idle, data_seed, bufs }
    }

    /// The call's parameters for messages: everything needed to recognise it.
    pub fn describe(&self, n: usize) -> String {
        let l = self.coll.layout(self.count, n, &self.x);
        let mut s = format!(
            "{} {} count {} ({} B), {}",
            self.coll.name(),
            self.ty.name(),
            l.param,
            l.size_bytes(self.ty.size()),
            if self.inplace { "in place" } else { "out of place" }
        );
        if self.coll.reduces() {
            let _ = write!(s, ", op {}", self.op.name());
        }
        if self.coll.has_root() {
            let _ = write!(s, ", root {}", self.root);
        }
        match self.coll {
            Collective::AllGatherAxis | Collective::ReduceScatterAxis => {
                let _ = write!(s, ", axis {}", self.x.axis);
            }
            Collective::AllReduceCoalesced | Collective::BroadcastCoalesced => {
                let _ = write!(s, ", nbuffers {}, bucket {} B", self.x.nbuffers, self.x.bucket);
            }
            Collective::AllReduceWire => {
                let _ = write!(s, ", wire {}", self.x.wire.name());
            }
            _ => {}
        }
        if let Some(v) = &self.v {
            let rows: Vec<String> =
                v.chunks(n).map(|r| r.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(" ")).collect();
            let _ = write!(s, ", counts [{}], idle ranks {:?}", rows.join("; "), self.idle);
        }
        let bufs: Vec<String> = self
            .bufs
            .iter()
            .enumerate()
            .map(|(r, [a, b])| {
                let one = |b: &BufSpec| format!("{}+{}{}", b.kind.short(), b.offset, if b.fresh { " new" } else { "" });
                format!("{r}: {} / {}", one(a), one(b))
            })
            .collect();
        let _ = write!(s, ", buffers send / recv (kind+element offset) {}", bufs.join(", "));
        s
    }
}
