//! What a run is: the options the command line sets (cli.rs parses them), shared by
//! the sweep, the comparisons, the soak and the outputs.

use crate::coll::{Collective, ExtParams};
use crate::data::{Op, Ty};
use std::ffi::OsString;
use std::path::PathBuf;

/// Where the buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mem {
    Host,
    Cuda,
}

impl Mem {
    pub fn name(self) -> &'static str {
        match self {
            Mem::Host => "host",
            Mem::Cuda => "cuda",
        }
    }
}

/// How ranks' times are combined (`-a`), nccl-tests' numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Average {
    Rank0 = 0,
    Avg = 1,
    Min = 2,
    Max = 3,
}

impl Average {
    pub fn name(self) -> &'static str {
        match self {
            Average::Rank0 => "rank0",
            Average::Avg => "avg",
            Average::Min => "min",
            Average::Max => "max",
        }
    }
}

/// Default sweep; see the help text for why these values.
pub const DEFAULT_MIN_BYTES: u64 = 8;
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
pub const DEFAULT_FACTOR: u64 = 2;
pub const DEFAULT_ITERS: usize = 20;
pub const DEFAULT_WARMUP: usize = 5;
pub const DEFAULT_MAX_TIME: f64 = 0.25;
pub const DEFAULT_REPS: usize = 7;
/// -e of a soak: large enough that calls reach every path (bulletin board, rings,
/// streaming stores, single copy), small enough that 20,000 calls take minutes.
pub const DEFAULT_SOAK_MAX_BYTES: u64 = 4 << 20;

/// Everything the command line sets.
#[derive(Clone, Debug)]
pub struct Opts {
    pub colls: Vec<Collective>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// Multiply by this between sizes (> 1), or 0 to add `step_bytes`.
    pub step_factor: u64,
    pub step_bytes: u64,
    pub iters: usize,
    pub warmup: usize,
    pub check: usize,
    pub ty: Ty,
    pub op: Op,
    pub root: i64,
    pub average: Average,
    pub nranks: Option<usize>,
    /// With --nranks: pin each rank to its own CPU (`--bind core`, the default).
    pub bind: bool,
    pub mem: Mem,
    pub json: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    /// Seconds per size and placement that the warmups and timed iterations may take
    /// (iterations are reduced to fit, never below 1); 0 = always exactly -n and -w.
    pub max_time: f64,
    /// Move the buffers along the allocation between iterations, as nccl-tests does.
    pub rotate: bool,
    /// Parameters of the extension collectives.
    pub ext: ExtParams,
    /// Compare fcclAllReduceCoalesced with one fcclAllReduce per buffer instead of a sweep.
    pub compare_coalesced: bool,
    /// Compare fcclAllReduceWire with fcclAllReduce instead of a sweep.
    pub compare_wire: bool,
    /// Alternating repetitions of the comparisons (the median is reported).
    pub reps: usize,
    /// `--soak N`: N random checked calls instead of a sweep (see soak.rs).
    pub soak: Option<u64>,
    /// `--seed S` of the soak; None: rank 0 draws one.
    pub seed: Option<u64>,
    /// `--soak-first I`: the soak starts at call I of the seed's sequence.
    pub soak_first: u64,
    /// The command line without `--nranks N`, for the ranks it starts.
    pub child_args: Vec<OsString>,
}

impl Opts {
    /// The sizes of the sweep, in bytes as given (before rounding to elements).
    pub fn sizes(&self) -> Vec<u64> {
        let mut v = Vec::new();
        let mut s = self.min_bytes;
        while s <= self.max_bytes {
            v.push(s);
            let next = if self.step_factor > 1 { s.saturating_mul(self.step_factor) } else { s + self.step_bytes };
            if next == s {
                break;
            }
            s = next;
        }
        v
    }
}

/// 8, 1K, 64M: the short size form used in help and plots.
pub fn fmt_size(b: u64) -> String {
    for (s, u) in [(30, "G"), (20, "M"), (10, "K")] {
        if b >= 1 << s && b % (1 << s) == 0 {
            return format!("{}{u}", b >> s);
        }
    }
    b.to_string()
}
