//! Command line of ferroccl-bench: nccl-tests' flags plus our own, parsed with clap
//! (derive) into the run's [`Opts`], with the checks clap cannot express (flags that
//! only some modes take, sizes that must grow) reported as clap's own errors.

use crate::coll::{Collective, ExtParams, DEFAULT_AXIS, DEFAULT_NBUFFERS};
use crate::data::{Op, Ty};
use crate::opts::*;
use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};
use std::ffi::OsString;
use std::path::PathBuf;

/// Arguments that apply to a soak (by clap id); every other one is refused there (it
/// draws the rest).
const SOAK_ARGS: [&str; 9] = ["colls", "soak", "seed", "soak_first", "nranks", "bind", "mem", "max_bytes", "json"];

/// What `--help` prints after the options.
const AFTER_HELP: &str = r#"Paths (the table's last four columns; backend and algorithm in CSV and JSON):
  After the timed calls of each size and placement every rank reads what served its
  last call (fcclCommGetLastPath) and the ranks share it. backend: host (host memory),
  staged (device memory through host memory), ipc (ranks sharing one GPU, GPU to GPU),
  nccl, mixed (a group over several); mixed(ranks) when ranks disagree, which fails the
  row (a comment line names each rank's; the footer counts them). algorithm: rank 0's
  (the rank that moves the data); JSON lists every rank's in algorithms_by_rank and
  backends_by_rank. With --mem cuda a comment line under a table names the sizes that
  staged or host calls served (calls of 0 elements excepted: they move nothing).

Differences from nccl-tests:
  Every size runs its own warmups (nccl-tests warms up once per sweep).
  Inputs are small integers chosen so every result is exact in every type (sums stay
  below the type's exact range, prod multiplies 1s and a few 2s, avg averages values
  whose sum divides by the rank count), so results are compared exactly.
  In-place: all_reduce, broadcast, reduce use sendbuff == recvbuff; all_gather and
  gather sendbuff = recvbuff + rank*count; reduce_scatter and scatter recvbuff =
  sendbuff + rank*count; all_to_all, all_to_allv and send_recv run with sendbuff ==
  recvbuff; all_to_all's and send_recv's in-place results are checked (ferroccl
  defines both: a send's data leaves before the group's receives overwrite it),
  all_to_allv's are not (N/A: neither NCCL nor MPI defines it in place).
  all_to_allv sends count*(1 - f/(2n)) elements from rank s to rank d, f = (s+1)(d+2)
  mod (n+1), at displacement d*count; size and bandwidth use the full count as
  nccl-tests' alltoallv does. send_recv: rank r sends to r+1 and receives from r-1
  inside fcclGroupStart/End.
  Out of bounds values counts the sizes and placements with wrong elements (as
  nccl-tests); #wrong counts wrong elements summed over ranks. The footer also gives
  the peak resident memory (VmHWM) of the largest rank.
  Extensions (sizes, counts and bandwidth as their NCCL counterparts):
  all_gather_v, reduce_scatter_v: as all_gather, reduce_scatter (size = count*nranks
  elements, algbw over that, busbw factor (n-1)/n), with rank r's count
  count*(1 - f/(2n)), f = (r+1)(r+2) mod (n+1) (all_to_allv's count from r to r) at
  displacement r*count; what lies past a rank's count must stay untouched. In place:
  sendbuff = recvbuff + r*count (all_gather_v), recvbuff = sendbuff + r*count
  (reduce_scatter_v).
  all_gather_axis, reduce_scatter_axis: as all_gather, reduce_scatter; the size is the
  whole tensor (every rank's block): each rank's block is [rows, cols] with rows*cols =
  count, rows the largest divisor of count not above its square root, the whole
  tensor that with nranks times as much along --axis. In place only along axis 0
  (elsewhere a rank's block is not contiguous: N/A).
  all_reduce_coalesced, broadcast_coalesced: as all_reduce, broadcast over the total
  bytes of the B buffers (busbw factor 2(n-1)/n and 1): each buffer holds the largest
  power of two of elements not above count/B (with fewer elements than B, one
  buffer per element), so the size column shows the buffers times that. broadcast_coalesced takes
  one buffer per tensor, so it runs in place only (out of place: N/A).
  all_reduce_wire: algbw over the data type's bytes (count * size of -d), busbw with
  all_reduce's factor 2(n-1)/n. Its inputs are small integers chosen so that every
  contribution and every partial sum is exact in the wire type too, so results are
  still compared exactly.
  Exit status: 0 all results right, 1 wrong results or ranks that disagreed on a
  backend (--soak: wrong results or resources grew), 2 bad arguments or memory kind not
  available, 3 a library call or an output file failed.

Test hook:
  FERROCCL_BENCH_CORRUPT=1 in the environment makes rank 0 flip one element of its
  result before each check, so tests can prove that wrong results are reported and
  fail the run.
  FERROCCL_BENCH_LEAK=1 makes rank 0 of a soak open /dev/null at every call after
  the warm-up and never close it, so tests can prove that resource growth is reported
  and fails the run."#;

/// The command line as clap sees it; [`parse`] turns it into [`Opts`]. Defaults are
/// applied there, not here: some depend on the mode (-e of a soak) or on other flags
/// (-f 1 means -i), so every value is None when not given.
#[derive(Parser, Debug)]
#[command(
    name = "ferroccl-bench",
    about = "Measures ferroccl's collectives over a sweep of message sizes, nccl-tests style,\n\
             calling the library through its C functions. Only rank 0 prints the table.",
    // Not this struct's doc comment, which describes the code.
    long_about = None,
    after_help = AFTER_HELP,
    disable_help_flag = true,
    // A flag given twice takes its last value, as nccl-tests' getopt does.
    args_override_self = true,
    max_term_width = 100
)]
struct Cli {
    #[arg(value_name = "COLLECTIVE", value_parser = collective, help = colls_help())]
    colls: Vec<String>,

    // Sweep.
    #[arg(short = 'b', long = "minbytes", value_name = "SIZE", value_parser = size,
          help_heading = SWEEP, help = format!("smallest size (default {DEFAULT_MIN_BYTES})"))]
    min_bytes: Option<u64>,
    #[arg(short = 'e', long = "maxbytes", value_name = "SIZE", value_parser = size, help_heading = SWEEP,
          help = format!("largest size (default {}; --soak: {})", fmt_size(DEFAULT_MAX_BYTES), fmt_size(DEFAULT_SOAK_MAX_BYTES)))]
    max_bytes: Option<u64>,
    #[arg(short = 'f', long = "stepfactor", value_name = "F", value_parser = num::<u64>, help_heading = SWEEP,
          help = format!("multiply the size by F between steps (default {DEFAULT_FACTOR})"))]
    step_factor: Option<u64>,
    #[arg(short = 'i', long = "stepbytes", value_name = "SIZE", value_parser = size, help_heading = SWEEP,
          help = "add SIZE between steps instead (used when -f is 1)")]
    step_bytes: Option<u64>,
    #[arg(short = 'n', long = "iters", value_name = "N", value_parser = num::<usize>, help_heading = SWEEP,
          help = format!("timed iterations per size (default {DEFAULT_ITERS}; see --max-time)"))]
    iters: Option<usize>,
    #[arg(short = 'w', long = "warmup_iters", value_name = "N", value_parser = num::<usize>, help_heading = SWEEP,
          help = format!("untimed warmup iterations per size (default {DEFAULT_WARMUP}; see\n--max-time)"))]
    warmup: Option<usize>,
    #[arg(short = 'c', long = "check", value_name = "N", value_parser = num::<usize>, help_heading = SWEEP,
          help = "check iterations per size, each on fresh inputs, outside the\n\
                  timed loop (default 1; 0 = no check, #wrong prints N/A)")]
    check: Option<usize>,
    #[arg(short = 'd', long = "datatype", value_name = "TYPE", value_parser = datatype, help_heading = SWEEP,
          help = format!("{} (default float)", names(Ty::ALL.iter().map(|t| t.name()))))]
    ty: Option<Ty>,
    #[arg(short = 'o', long = "op", value_name = "OP", value_parser = op, help_heading = SWEEP,
          help = "sum, prod, max, min, avg (default sum)")]
    op: Option<Op>,
    #[arg(short = 'r', long = "root", value_name = "R", value_parser = num::<i64>, allow_negative_numbers = true,
          help_heading = SWEEP, help = "root of broadcast, reduce, gather, scatter (default 0)")]
    root: Option<i64>,
    #[arg(short = 'a', long = "average", value_name = "0|1|2|3", value_parser = average, help_heading = SWEEP,
          help = "how ranks' times combine: 0 rank 0, 1 average, 2 min, 3 max\n(default 1, as nccl-tests)")]
    average: Option<Average>,

    // Ranks.
    #[arg(long = "nranks", alias = "np", value_name = "N", value_parser = nranks, help_heading = "Ranks",
          help = "start N local ranks of this benchmark (same arguments) and\n\
                  report for all of them. Without it the benchmark joins an\n\
                  external launch through the environment (ferroccl-run -n N,\n\
                  torchrun, FERROCCL_RANK/FERROCCL_WORLD_SIZE/...) or, when no\n\
                  rank is set there, runs as a single rank.")]
    nranks: Option<usize>,
    #[arg(long = "bind", value_name = "core|none", value_parser = bind, help_heading = "Ranks",
          help = "with --nranks: core (default, as mpirun) pins rank r to the\n\
                  r-th CPU this process may use when there are at least N, so\n\
                  ranks that wait for each other never share a CPU; none\n\
                  leaves placement to the scheduler.")]
    bind: Option<bool>,
    #[arg(long = "mem", value_name = "host|cuda", value_parser = mem, help_heading = "Ranks",
          help = "buffer memory (default host; cuda: fcclMemAlloc, filled and\n\
                  checked with cuMemcpy; refused when CUDA is absent)")]
    mem: Option<Mem>,

    // Extension collectives.
    #[arg(long = "axis", value_name = "0|1", value_parser = axis, help_heading = EXT,
          help = format!("axis of the 2-D tensor the axis forms gather or scatter along\n(default {DEFAULT_AXIS})"))]
    axis: Option<usize>,
    #[arg(long = "nbuffers", value_name = "B", value_parser = nbuffers, help_heading = EXT,
          help = format!("buffers per coalesced call (default {DEFAULT_NBUFFERS})"))]
    nbuffers: Option<usize>,
    #[arg(long = "bucket", value_name = "SIZE", value_parser = bucket, help_heading = EXT,
          help = "bucketBytes of the coalesced calls (default 0 = the library's\ndefault)")]
    bucket: Option<usize>,
    #[arg(long = "wire", value_name = "TYPE", value_parser = wire, help_heading = EXT,
          help = "wire type of all_reduce_wire and --compare-wire: half,\n\
                  bfloat16, f8e4m3, f8e5m2, float or double, no wider than -d\n\
                  (default bfloat16); -d must be float or double")]
    wire: Option<Ty>,

    // Comparisons.
    #[arg(long = "compare-coalesced", action = ArgAction::SetTrue, help_heading = COMPARE,
          help = "at each size, fcclAllReduceCoalesced over the B buffers of\n\
                  all_reduce_coalesced (--nbuffers, --bucket) against B separate\n\
                  fcclAllReduce calls on the same buffers; prints both times per\n\
                  set of B buffers and the speed-up. -b 1M -e 1M --nbuffers 1000\n\
                  is 1000 buffers of 1 KiB (float).")]
    compare_coalesced: bool,
    #[arg(long = "compare-wire", action = ArgAction::SetTrue, help_heading = COMPARE,
          help = "at each size, fcclAllReduceWire (-d over --wire) against\n\
                  fcclAllReduce (-d) on the same data; prints both busbw and the\n\
                  gain (wire busbw / plain busbw).")]
    compare_wire: bool,
    #[arg(long = "reps", value_name = "R", value_parser = reps, help_heading = COMPARE, help = reps_help())]
    reps: Option<usize>,

    // Soak.
    #[arg(long = "soak", value_name = "N", value_parser = soak, help_heading = SOAK, help = soak_help())]
    soak: Option<u64>,
    #[arg(long = "seed", value_name = "S", value_parser = seed, help_heading = SOAK,
          help = "the soak's seed (decimal or 0x hex; default: rank 0 draws one\n\
                  and tells the others); printed, so --soak N --seed S replays a run")]
    seed: Option<u64>,
    #[arg(long = "soak-first", value_name = "I", value_parser = num::<u64>, help_heading = SOAK,
          help = "start at call I of the seed's sequence: --soak-first I --soak 1\n\
                  --seed S replays call I alone (on fresh buffers); a rank that\n\
                  finds a wrong result prints the call's number and parameters")]
    soak_first: Option<u64>,

    // Output.
    #[arg(short = 'J', long = "json", value_name = "FILE", help_heading = OUTPUT,
          help = "results as JSON: the run's parameters, library version, host,\n\
                  date, memory kind, ranks, peak memory, one record per size and\n\
                  placement with every column (with --soak: the soak's\n\
                  parameters, counts and each rank's resource counts)")]
    json: Option<PathBuf>,
    #[arg(long = "csv", value_name = "FILE", help_heading = OUTPUT,
          help = "results as CSV, one row per size and placement, header\n\
                  collective,nranks,type,redop,root,size_bytes,count,placement,\n\
                  time_us,algbw_GBps,busbw_GBps,wrong,host_us,backend,algorithm\n\
                  (wrong is empty when not checked; host_us, in JSON too: with\n\
                  --mem cuda the time the calling thread spends in one call,\n\
                  enqueueing it, empty on host memory, where a call returns when\n\
                  it is done; backend, algorithm: see Paths below)")]
    csv: Option<PathBuf>,
    #[arg(long = "plot", value_name = "FILE.svg", value_parser = svg, help_heading = OUTPUT,
          help = "busbw against size (log2 axis), one line per collective and\nplacement")]
    plot: Option<PathBuf>,
    #[arg(short = 'h', long = "help", action = ArgAction::Help, help_heading = OUTPUT, help = "this text")]
    help: Option<bool>,

    // Differences from nccl-tests.
    #[arg(long = "max-time", alias = "max_time", value_name = "SECONDS", value_parser = max_time, help_heading = TIMING,
          help = format!("time budget per size and placement (default {DEFAULT_MAX_TIME}): after the\n\
                          first warmups time one call, the ranks agree on the slowest\n\
                          rank's time, and the remaining warmups are cut to a quarter of\n\
                          the budget and the timed iterations to the budget (never below\n\
                          1). Small sizes run exactly -n/-w iterations, large ones fewer,\n\
                          so a default sweep stays short. 0 = always exactly -n and -w."))]
    max_time: Option<f64>,
    #[arg(long = "rotate", value_name = "0|1", value_parser = rotate, help_heading = TIMING,
          help = "1 (default, as nccl-tests): iteration i uses the buffers at\n\
                  offset (i mod k) * size inside the allocation for the largest\n\
                  size, so small sizes do not always hit the cache; 0: always\n\
                  offset 0.")]
    rotate: Option<bool>,
}

const SWEEP: &str = "Sweep (nccl-tests' flags; sizes take the suffixes K, M, G = 2^10, 2^20, 2^30)";
const EXT: &str = "Extension collectives (see \"Extensions\" below for sizes and bandwidth)";
const COMPARE: &str = "Comparisons (instead of a sweep; no collectives named; both may be given)";
const SOAK: &str = "Soak (instead of a sweep; collectives named restrict it to those)";
const OUTPUT: &str = "Output";
const TIMING: &str = "Timing (differences from nccl-tests; more below)";

fn names<'a>(v: impl Iterator<Item = &'a str>) -> String {
    v.collect::<Vec<_>>().join(" ")
}

fn colls_help() -> String {
    format!(
        "collectives to run (default all_reduce): {}; all (these, nccl-tests' set);\n\
         extensions beyond NCCL: {}; ext (these)",
        names(Collective::ALL.iter().map(|c| c.name())),
        names(Collective::EXT.iter().map(|c| c.name()))
    )
}

fn reps_help() -> String {
    format!(
        "repetitions of a comparison (default {DEFAULT_REPS}). Each repetition\n\
         times both sides back to back after a barrier, in alternating\n\
         order, each for up to --max-time (at most -n calls, at least\n\
         1); times combine across ranks as -a says. Printed: the median\n\
         time of each side, and the median and range over the\n\
         repetitions of the ratio measured within one repetition.\n\
         Results of both sides are checked (-c) outside the timing."
    )
}

fn soak_help() -> String {
    use crate::soak::{LIBRARY_POOL_MIB, RSS_BOUND_MIB, RSS_SLACK_MIB, STAGING_POOL_MIB, WARMUP_CALLS};
    format!(
        "N pseudo-random calls, each checked as -c checks (fresh inputs,\n\
         the call, the result against values computed independently):\n\
         every collective and extension (or those named), a random type\n\
         and op valid for it, a size drawn log-uniformly from 0 to -e\n\
         (default {dsoak} here: bulletin board, rings, streaming stores and\n\
         single copy all run; count 0 included), in place or out of\n\
         place, a random root, --axis, --nbuffers, --bucket and --wire\n\
         drawn per call, uneven counts with idle ranks (every count to and\n\
         from a rank 0) for all_to_allv, all_gather_v and reduce_scatter_v,\n\
         and each rank's send and receive buffers of a random kind:\n\
         malloc, fcclMemAllocHost or (--mem cuda) fcclMemAlloc, at a random\n\
         element offset, some freed and allocated anew. In-place\n\
         all_to_allv runs unchecked (its result is undefined). Every rank\n\
         draws the same calls from the seed. Each rank counts its open file\n\
         descriptors (/proc/self/fd), threads (/proc/self/task), shared\n\
         memory (/dev/shm/fccl-*-p<pid> files and memfd descriptors),\n\
         memory mappings (/proc/self/maps), resident memory (VmRSS, after\n\
         malloc_trim) and malloc's bytes in use (mallinfo2) after W\n\
         warm-up calls (W = min({WARMUP_CALLS}, N/4)) and at the end, each time\n\
         with every soak buffer freed. Rank 0 prints the calls per\n\
         second (inputs and checks included), the calls per collective,\n\
         type, op and size, the wrong elements and each rank's counts.\n\
         Exit 1 on a wrong result, on growth of descriptors, threads or\n\
         shared memory, or on RSS growth beyond {RSS_BOUND_MIB} MiB ({LIBRARY_POOL_MIB} MiB\n\
         that the library's scratch pool may keep, {STAGING_POOL_MIB} its staging pool,\n\
         plus {RSS_SLACK_MIB} for allocators and lazily touched rings; malloc's\n\
         bytes in use and\n\
         RSS at each tenth of the run show whether growth levels off;\n\
         mappings are reported, not judged). Only -e, --mem, --nranks,\n\
         --bind and -J apply besides these three flags.",
        dsoak = fmt_size(DEFAULT_SOAK_MAX_BYTES),
    )
}

/// Parses 8, 1K, 0.5M, 2G (binary units, as nccl-tests).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let stripped = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (num, unit) = match stripped.chars().last() {
        Some('k') => (&stripped[..stripped.len() - 1], 1u64 << 10),
        Some('m') => (&stripped[..stripped.len() - 1], 1u64 << 20),
        Some('g') => (&stripped[..stripped.len() - 1], 1u64 << 30),
        _ => (stripped, 1),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("{s:?} is not a size (e.g. 8, 64K, 1M, 1G)"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{s:?} is not a size (e.g. 8, 64K, 1M, 1G)"));
    }
    Ok((v * unit as f64) as u64)
}

// Value parsers: clap prints "invalid value 'V' for 'FLAG': " before their message.

fn size(s: &str) -> Result<u64, String> {
    parse_size(s)
}

fn num<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.trim().parse().map_err(|_| "not a valid number".to_string())
}

fn collective(s: &str) -> Result<String, String> {
    if s == "all" || s == "ext" || Collective::parse(s).is_some() {
        return Ok(s.to_string());
    }
    let all: Vec<&str> = Collective::ALL.iter().chain(Collective::EXT.iter()).map(|c| c.name()).collect();
    let close = all.iter().copied().chain(["all", "ext"]).find(|n| strsim::jaro(n, &s.to_ascii_lowercase()) > 0.8);
    Err(format!(
        "unknown collective (one of {}, all or ext){}",
        all.join(" "),
        close.map_or(String::new(), |c| format!("; did you mean {c}?"))
    ))
}

fn datatype(s: &str) -> Result<Ty, String> {
    Ty::parse(s).ok_or_else(|| format!("unknown type (one of {})", names(Ty::ALL.iter().map(|t| t.name()))))
}

fn op(s: &str) -> Result<Op, String> {
    let v = s.to_ascii_lowercase();
    Op::ALL.iter().copied().find(|op| op.name() == v).ok_or_else(|| "unknown op (one of sum prod max min avg)".into())
}

fn average(s: &str) -> Result<Average, String> {
    match s.trim() {
        "0" => Ok(Average::Rank0),
        "1" => Ok(Average::Avg),
        "2" => Ok(Average::Min),
        "3" => Ok(Average::Max),
        _ => Err("use 0 (rank 0), 1 (average), 2 (min) or 3 (max)".into()),
    }
}

fn nranks(s: &str) -> Result<usize, String> {
    match num(s)? {
        0 => Err("needs at least 1 rank".into()),
        n => Ok(n),
    }
}

fn bind(s: &str) -> Result<bool, String> {
    match s.trim() {
        "core" => Ok(true),
        "none" => Ok(false),
        _ => Err("use core or none".into()),
    }
}

fn mem(s: &str) -> Result<Mem, String> {
    match s.to_ascii_lowercase().as_str() {
        "host" => Ok(Mem::Host),
        "cuda" | "device" => Ok(Mem::Cuda),
        _ => Err("use host or cuda".into()),
    }
}

fn axis(s: &str) -> Result<usize, String> {
    match s.trim() {
        "0" => Ok(0),
        "1" => Ok(1),
        _ => Err("the tensor is 2-D; use 0 or 1".into()),
    }
}

fn nbuffers(s: &str) -> Result<usize, String> {
    let v: usize = num(s)?;
    if v == 0 || v > i32::MAX as usize {
        return Err(format!("use 1 to {}", i32::MAX));
    }
    Ok(v)
}

fn bucket(s: &str) -> Result<usize, String> {
    usize::try_from(parse_size(s)?).map_err(|_| "too large".into())
}

fn wire(s: &str) -> Result<Ty, String> {
    Ty::parse(s).filter(|t| t.is_float()).ok_or_else(|| "use half, bfloat16, f8e4m3, f8e5m2, float or double".into())
}

fn reps(s: &str) -> Result<usize, String> {
    match num(s)? {
        0 => Err("needs at least 1 repetition".into()),
        n => Ok(n),
    }
}

fn soak(s: &str) -> Result<u64, String> {
    match num(s)? {
        0 => Err("needs at least 1 call".into()),
        n => Ok(n),
    }
}

fn seed(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let parsed = match t.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => t.parse().ok(),
    };
    parsed.ok_or_else(|| "not a number (decimal or 0x hex)".into())
}

fn svg(s: &str) -> Result<PathBuf, String> {
    if !s.to_ascii_lowercase().ends_with(".svg") {
        return Err("only SVG output is supported; name the file *.svg".into());
    }
    Ok(PathBuf::from(s))
}

fn max_time(s: &str) -> Result<f64, String> {
    let v: f64 = num(s)?;
    if !v.is_finite() || v < 0.0 {
        return Err("needs seconds >= 0".into());
    }
    Ok(v)
}

fn rotate(s: &str) -> Result<bool, String> {
    match s.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err("use 0 or 1".into()),
    }
}

/// The arguments the ranks that --nranks starts get: all of them but --nranks
/// (--np) and --bind with their values (clap has checked that each has one).
fn child_args(raw: &[OsString]) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut it = raw.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--" {
            out.push(a.clone());
            out.extend(it.cloned());
            break;
        }
        match s.split_once('=').map_or(&*s, |(f, _)| f) {
            "--nranks" | "--np" | "--bind" => {
                if !s.contains('=') {
                    it.next();
                }
            }
            _ => out.push(a.clone()),
        }
    }
    out
}

/// Parses the arguments (without the program name). `--help` comes back as the error
/// clap uses for it (kind DisplayHelp: print it to stdout and exit 0).
pub fn parse(raw: &[OsString]) -> Result<Box<Opts>, clap::Error> {
    let mut cmd = Cli::command();
    let m =
        cmd.try_get_matches_from_mut(std::iter::once(OsString::from("ferroccl-bench")).chain(raw.iter().cloned()))?;
    let c = Cli::from_arg_matches(&m)?;
    // The arguments given (ids() also holds the struct's own group).
    let given: Vec<&str> = m
        .ids()
        .map(|id| id.as_str())
        .filter(|id| cmd.get_arguments().any(|a| a.get_id() == id))
        .filter(|id| m.value_source(id) == Some(ValueSource::CommandLine))
        .collect();
    // The flag as the help names it, for messages.
    let flag = |id: &str| {
        cmd.get_arguments().find(|a| a.get_id() == id).map_or(id.to_string(), |a| match (a.get_short(), a.get_long()) {
            (Some(s), _) => format!("-{s}"),
            (None, Some(l)) => format!("--{l}"),
            (None, None) => id.to_string(),
        })
    };
    let err = |msg: String| cmd.clone().error(ErrorKind::ArgumentConflict, msg);
    let mut colls = Vec::new();
    for name in &c.colls {
        match name.as_str() {
            "all" => colls.extend(Collective::ALL),
            "ext" => colls.extend(Collective::EXT),
            n => colls.extend(Collective::parse(n)),
        }
    }
    let mut o = Opts {
        colls,
        min_bytes: c.min_bytes.unwrap_or(DEFAULT_MIN_BYTES),
        max_bytes: c.max_bytes.unwrap_or(DEFAULT_MAX_BYTES),
        step_factor: DEFAULT_FACTOR,
        step_bytes: c.step_bytes.unwrap_or(1 << 20),
        iters: c.iters.unwrap_or(DEFAULT_ITERS),
        warmup: c.warmup.unwrap_or(DEFAULT_WARMUP),
        check: c.check.unwrap_or(1),
        ty: c.ty.unwrap_or(Ty::Float),
        op: c.op.unwrap_or(Op::Sum),
        root: c.root.unwrap_or(0),
        average: c.average.unwrap_or(Average::Avg),
        nranks: c.nranks,
        bind: c.bind.unwrap_or(true),
        mem: c.mem.unwrap_or(Mem::Host),
        json: c.json,
        csv: c.csv,
        plot: c.plot,
        max_time: c.max_time.unwrap_or(DEFAULT_MAX_TIME),
        rotate: c.rotate.unwrap_or(true),
        ext: ExtParams {
            axis: c.axis.unwrap_or(DEFAULT_AXIS),
            nbuffers: c.nbuffers.unwrap_or(DEFAULT_NBUFFERS),
            bucket: c.bucket.unwrap_or(0),
            wire: c.wire.unwrap_or(ExtParams::default().wire),
        },
        compare_coalesced: c.compare_coalesced,
        compare_wire: c.compare_wire,
        reps: c.reps.unwrap_or(DEFAULT_REPS),
        soak: c.soak,
        seed: c.seed,
        soak_first: c.soak_first.unwrap_or(0),
        child_args: child_args(raw),
    };
    let dedup = |v: &mut Vec<Collective>| {
        let mut seen = Vec::new();
        v.retain(|c| {
            let new = !seen.contains(c);
            seen.push(*c);
            new
        });
    };
    if o.soak.is_none() {
        if let Some(f) = given.iter().find(|f| matches!(**f, "seed" | "soak_first")) {
            return Err(err(format!("{} is an option of --soak", flag(f))));
        }
    } else {
        if let Some(f) = given.iter().find(|f| !SOAK_ARGS.contains(f)) {
            return Err(err(format!(
                "{} does not apply to --soak, which draws sizes, types, ops, roots and extension parameters \
                 itself (it takes -e, --mem, --nranks, --bind, -J, --seed, --soak-first)",
                flag(f)
            )));
        }
        if o.soak_first.checked_add(o.soak.unwrap_or(0)).is_none() {
            return Err(err(format!("--soak-first {}: too large", o.soak_first)));
        }
        if c.max_bytes.is_none() {
            o.max_bytes = DEFAULT_SOAK_MAX_BYTES;
        }
        if o.max_bytes > isize::MAX as u64 / 4 {
            return Err(err(format!("-e {}: too large for a soak's buffers", o.max_bytes)));
        }
        o.min_bytes = 0;
        if o.colls.is_empty() {
            o.colls.extend(Collective::ALL);
            o.colls.extend(Collective::EXT);
        }
        dedup(&mut o.colls);
        return Ok(Box::new(o));
    }
    if o.compare_coalesced || o.compare_wire {
        if !o.colls.is_empty() {
            return Err(err("--compare-coalesced and --compare-wire run their own calls; name no collectives".into()));
        }
        if o.json.is_some() || o.csv.is_some() || o.plot.is_some() {
            return Err(err(
                "-J, --csv and --plot are for sweeps, not for --compare-coalesced or --compare-wire".into()
            ));
        }
    } else if o.colls.is_empty() {
        o.colls.push(Collective::AllReduce);
    }
    if o.compare_wire || o.colls.contains(&Collective::AllReduceWire) {
        let what = if o.compare_wire { "--compare-wire" } else { "all_reduce_wire" };
        if !matches!(o.ty, Ty::Float | Ty::Double) {
            return Err(err(format!("{what} needs -d float or double, not {}", o.ty.name())));
        }
        if o.ext.wire.size() > o.ty.size() {
            return Err(err(format!(
                "--wire {}: the wire type of {what} must be no wider than the data (-d {})",
                o.ext.wire.name(),
                o.ty.name()
            )));
        }
    }
    dedup(&mut o.colls);
    match c.step_factor {
        Some(0) => return Err(err("-f 0: the step factor must be at least 1".into())),
        Some(1) => o.step_factor = 0,
        Some(f) => o.step_factor = f,
        None if c.step_bytes.is_some() => o.step_factor = 0,
        None => {}
    }
    if o.step_factor == 0 && o.step_bytes == 0 {
        return Err(err("-i 0 with -f 1 would never reach the maximum size".into()));
    }
    if o.min_bytes > o.max_bytes {
        return Err(err(format!("invalid sizes: -b {} is larger than -e {}", o.min_bytes, o.max_bytes)));
    }
    if o.step_factor > 1 && o.min_bytes == 0 {
        return Err(err("-b 0 with a step factor would never grow; use -b 1 or more".into()));
    }
    if o.iters == 0 {
        return Err(err("-n needs at least 1 iteration".into()));
    }
    if o.root < 0 {
        return Err(err(format!("-r {}: the root must be a rank (>= 0)", o.root)));
    }
    Ok(Box::new(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Opts {
        let raw: Vec<OsString> = args.iter().map(OsString::from).collect();
        *parse(&raw).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn sizes_and_flags() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("1K").unwrap(), 1024);
        assert_eq!(parse_size("64m").unwrap(), 64 << 20);
        assert_eq!(parse_size("0.5M").unwrap(), 512 << 10);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert!(parse_size("x").is_err());
        let o = p(&["all_to_all", "-b8", "-e", "1M", "-f", "8", "--nranks", "2", "-d", "half"]);
        assert_eq!(o.colls, vec![Collective::AlltoAll]);
        assert_eq!(o.sizes(), vec![8, 64, 512, 4096, 32768, 262144]);
        assert_eq!(o.nranks, Some(2));
        assert_eq!(o.ty, Ty::Half);
        let kept: Vec<String> = o.child_args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(kept, ["all_to_all", "-b8", "-e", "1M", "-f", "8", "-d", "half"]);
        let o = p(&["--nranks=3", "all"]);
        assert_eq!(o.colls.len(), Collective::ALL.len());
        assert!(o.child_args.iter().all(|a| a != "--nranks=3"));
        let o = p(&["-b", "1K", "-e", "4K", "-f", "1", "-i", "1K"]);
        assert_eq!(o.sizes(), vec![1024, 2048, 3072, 4096]);
    }

    #[test]
    fn soak_flags() {
        let o = p(&["--soak", "100", "--seed", "0x10", "--nranks", "2"]);
        assert_eq!((o.soak, o.seed, o.soak_first), (Some(100), Some(16), 0));
        assert_eq!(o.max_bytes, DEFAULT_SOAK_MAX_BYTES, "the soak's own default -e");
        assert_eq!(o.colls.len(), Collective::ALL.len() + Collective::EXT.len());
        let kept: Vec<String> = o.child_args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(kept, ["--soak", "100", "--seed", "0x10"], "the ranks get the soak and its seed");
        let o = p(&["all_to_allv", "gather", "--soak=5", "-e", "1K", "--soak-first", "7"]);
        assert_eq!(o.colls, vec![Collective::AlltoAllv, Collective::Gather]);
        assert_eq!((o.max_bytes, o.soak_first), (1024, 7));
    }

    #[test]
    fn extension_flags() {
        let o = p(&["ext"]);
        assert_eq!(o.colls, Collective::EXT.to_vec());
        assert_eq!(o.ext, ExtParams::default());
        let o = p(&["all", "ext"]);
        assert_eq!(o.colls.len(), Collective::ALL.len() + Collective::EXT.len());
        let o = p(&["all_gather_axis", "--axis", "0", "--nbuffers", "10", "--bucket", "1M", "--wire", "half"]);
        assert_eq!((o.ext.axis, o.ext.nbuffers, o.ext.bucket, o.ext.wire), (0, 10, 1 << 20, Ty::Half));
        let kept: Vec<String> = o.child_args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(kept.len(), 9, "extension flags travel to the ranks: {kept:?}");
        let o = p(&["--compare-coalesced", "--compare-wire", "-b", "1M", "-e", "1M", "--reps", "3"]);
        assert!(o.compare_coalesced && o.compare_wire && o.colls.is_empty());
        assert_eq!(o.reps, 3);
        let bad = |args: &[&str]| {
            let raw: Vec<OsString> = args.iter().map(OsString::from).collect();
            assert!(parse(&raw).is_err(), "{args:?} is refused");
        };
        bad(&["--axis", "2"]);
        bad(&["--nbuffers", "0"]);
        bad(&["--wire", "int8"]);
        bad(&["all_reduce_wire", "-d", "int32"]);
        bad(&["all_reduce_wire", "-d", "float", "--wire", "double"]);
        bad(&["--compare-wire", "-d", "half"]);
        bad(&["--compare-coalesced", "all_reduce"]);
        bad(&["--compare-coalesced", "-J", "x.json"]);
        bad(&["--reps", "0"]);
    }

    fn err(args: &[&str]) -> clap::Error {
        let raw: Vec<OsString> = args.iter().map(OsString::from).collect();
        match parse(&raw) {
            Ok(o) => panic!("{args:?} is refused, not {o:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn nccl_tests_forms_and_last_value_wins() {
        // Collectives between options, a flag given twice, nccl-tests' spellings.
        let o = p(&["all_reduce", "-b", "8", "-n", "3", "broadcast", "-n", "5", "--np", "2", "--max_time=0", "-w1"]);
        assert_eq!(o.colls, vec![Collective::AllReduce, Collective::Broadcast]);
        assert_eq!((o.iters, o.warmup, o.nranks, o.max_time), (5, 1, Some(2), 0.0));
        let kept: Vec<String> = o.child_args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(kept, ["all_reduce", "-b", "8", "-n", "3", "broadcast", "-n", "5", "--max_time=0", "-w1"]);
        let o = p(&["-d", "FP16", "-o", "MAX", "--mem", "device", "--bind", "none", "-a", "2", "-c", "0"]);
        assert_eq!(
            (o.ty, o.op, o.mem, o.bind, o.average, o.check),
            (Ty::Half, Op::Max, Mem::Cuda, false, Average::Min, 0)
        );
        let o = p(&["allreduce", "reduce-scatter"]);
        assert_eq!(o.colls, vec![Collective::AllReduce, Collective::ReduceScatter]);
    }

    #[test]
    fn errors_are_usage_errors_with_suggestions() {
        for args in [&["-d", "float128"][..], &["-b", "1M", "-e", "1K"], &["-a", "7"], &["-r", "-1"], &["-f", "0"]] {
            assert_eq!(err(args).exit_code(), 2, "{args:?}");
        }
        let e = err(&["--maxbyte", "1M"]).to_string();
        assert!(e.contains("--maxbytes"), "a misspelt flag names the right one: {e}");
        let e = err(&["all_reduc"]).to_string();
        assert!(e.contains("did you mean all_reduce?"), "{e}");
        let e = err(&["--soak", "10", "-d", "float"]).to_string();
        assert!(e.contains("-d does not apply to --soak"), "{e}");
        let h = err(&["-h"]);
        assert_eq!(h.kind(), clap::error::ErrorKind::DisplayHelp);
        assert!(!h.use_stderr(), "help goes to stdout and exits 0");
    }
}
