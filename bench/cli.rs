//! Command line of ferroccl-bench: nccl-tests' flags plus our own.

use crate::coll::{Collective, ExtParams, DEFAULT_AXIS, DEFAULT_NBUFFERS};
use crate::data::{Op, Ty};
use crate::opts::*;
use std::ffi::OsString;
use std::path::PathBuf;

/// Flags that apply to a soak; every other one is refused there (it draws the rest).
const SOAK_FLAGS: [&str; 11] =
    ["--soak", "--seed", "--soak-first", "--nranks", "--np", "--bind", "--mem", "-e", "--maxbytes", "-J", "--json"];

pub enum Parsed {
    Run(Box<Opts>),
    Help,
}

pub fn usage() -> String {
    let colls: Vec<&str> = Collective::ALL.iter().map(|c| c.name()).collect();
    let ext: Vec<&str> = Collective::EXT.iter().map(|c| c.name()).collect();
    let types: Vec<&str> = Ty::ALL.iter().map(|t| t.name()).collect();
    format!(
        "usage: ferroccl-bench [COLLECTIVE...] [options]

Measures ferroccl's collectives over a sweep of message sizes, nccl-tests style,
calling the library through its C functions. Only rank 0 prints the table.

Collectives (default all_reduce): {colls}; all (these, nccl-tests' set);
  extensions beyond NCCL: {ext}; ext (these)

Sweep (nccl-tests' flags; sizes take the suffixes K, M, G = 2^10, 2^20, 2^30):
  -b, --minbytes SIZE      smallest size (default {dmin})
  -e, --maxbytes SIZE      largest size (default {dmax})
  -f, --stepfactor F       multiply the size by F between steps (default {dfac})
  -i, --stepbytes SIZE     add SIZE between steps instead (used when -f is 1)
  -n, --iters N            timed iterations per size (default {dit}; see --max-time)
  -w, --warmup_iters N     untimed warmup iterations per size (default {dw}; see --max-time)
  -c, --check N            check iterations per size, each on fresh inputs, outside the
                           timed loop (default 1; 0 = no check, #wrong prints N/A)
  -d, --datatype TYPE      {types} (default float)
  -o, --op OP              sum, prod, max, min, avg (default sum)
  -r, --root R             root of broadcast, reduce, gather, scatter (default 0)
  -a, --average 0|1|2|3    how ranks' times combine: 0 rank 0, 1 average, 2 min, 3 max
                           (default 1, as nccl-tests)

Ranks:
  --nranks N               start N local ranks of this benchmark (same arguments) and
                           report for all of them. Without it the benchmark joins an
                           external launch through the environment (ferroccl-run -n N,
                           torchrun, FERROCCL_RANK/FERROCCL_WORLD_SIZE/...) or, when no
                           rank is set there, runs as a single rank.
  --bind core|none         with --nranks: core (default, as mpirun) pins rank r to the
                           r-th CPU this process may use when there are at least N, so
                           ranks that wait for each other never share a CPU; none
                           leaves placement to the scheduler.
  --mem host|cuda          buffer memory (default host; cuda: fcclMemAlloc, filled and
                           checked with cuMemcpy; refused when CUDA is absent)

Extension collectives (see \"Extensions\" below for sizes and bandwidth):
  --axis 0|1               axis of the 2-D tensor the axis forms gather or scatter along
                           (default {daxis})
  --nbuffers B             buffers per coalesced call (default {dnb})
  --bucket SIZE            bucketBytes of the coalesced calls (default 0 = the library's
                           default)
  --wire TYPE              wire type of all_reduce_wire and --compare-wire: half,
                           bfloat16, f8e4m3, f8e5m2, float or double, no wider than -d
                           (default bfloat16); -d must be float or double

Comparisons (instead of a sweep; no collectives named; both may be given):
  --compare-coalesced      at each size, fcclAllReduceCoalesced over the B buffers of
                           all_reduce_coalesced (--nbuffers, --bucket) against B separate
                           fcclAllReduce calls on the same buffers; prints both times per
                           set of B buffers and the speed-up. -b 1M -e 1M --nbuffers 1000
                           is 1000 buffers of 1 KiB (float).
  --compare-wire           at each size, fcclAllReduceWire (-d over --wire) against
                           fcclAllReduce (-d) on the same data; prints both busbw and the
                           gain (wire busbw / plain busbw).
  --reps R                 repetitions of a comparison (default {dreps}). Each repetition
                           times both sides back to back after a barrier, in alternating
                           order, each for up to --max-time (at most -n calls, at least
                           1); times combine across ranks as -a says. Printed: the median
                           time of each side, and the median and range over the
                           repetitions of the ratio measured within one repetition.
                           Results of both sides are checked (-c) outside the timing.

Soak (instead of a sweep; collectives named restrict it to those):
  --soak N                 N pseudo-random calls, each checked as -c checks (fresh inputs,
                           the call, the result against values computed independently):
                           every collective and extension (or those named), a random type
                           and op valid for it, a size drawn log-uniformly from 0 to -e
                           (default {dsoak} here: bulletin board, rings, streaming stores and
                           single copy all run; count 0 included), in place or out of
                           place, a random root, --axis, --nbuffers, --bucket and --wire
                           drawn per call, uneven counts with idle ranks (every count to and
                           from a rank 0) for all_to_allv, all_gather_v and reduce_scatter_v,
                           and each rank's send and receive buffers of a random kind:
                           malloc, fcclMemAllocHost or (--mem cuda) fcclMemAlloc, at a random
                           element offset, some freed and allocated anew. In-place
                           all_to_allv runs unchecked (its result is undefined). Every rank
                           draws the same calls from the seed. Each rank counts its open file
                           descriptors (/proc/self/fd), threads (/proc/self/task), shared
                           memory (/dev/shm/fccl-*-p<pid> files and memfd descriptors),
                           memory mappings (/proc/self/maps), resident memory (VmRSS, after
                           malloc_trim) and malloc's bytes in use (mallinfo2) after W
                           warm-up calls (W = min({dwarm}, N/4)) and at the end, each time
                           with every soak buffer freed. Rank 0 prints the calls per
                           second (inputs and checks included), the calls per collective,
                           type, op and size, the wrong elements and each rank's counts.
                           Exit 1 on a wrong result, on growth of descriptors, threads or
                           shared memory, or on RSS growth beyond {drss} MiB ({dpool} MiB
                           that the library's scratch pool may keep, plus {dslack} for
                           allocators and lazily touched rings; malloc's bytes in use and
                           RSS at each tenth of the run show whether growth levels off;
                           mappings are reported, not judged). Only -e, --mem, --nranks,
                           --bind and -J apply besides these three flags.
  --seed S                 the soak's seed (decimal or 0x hex; default: rank 0 draws one
                           and tells the others); printed, so --soak N --seed S replays a run
  --soak-first I           start at call I of the seed's sequence: --soak-first I --soak 1
                           --seed S replays call I alone (on fresh buffers); a rank that
                           finds a wrong result prints the call's number and parameters

Output:
  -J, --json FILE          results as JSON: the run's parameters, library version, host,
                           date, memory kind, ranks, peak memory, one record per size and
                           placement with every column (with --soak: the soak's
                           parameters, counts and each rank's resource counts)
  --csv FILE               results as CSV, one row per size and placement, header
                           collective,nranks,type,redop,root,size_bytes,count,placement,
                           time_us,algbw_GBps,busbw_GBps,wrong,host_us,backend,algorithm
                           (wrong is empty when not checked; host_us, in JSON too: with
                           --mem cuda the time the calling thread spends in one call,
                           enqueueing it, empty on host memory, where a call returns when
                           it is done; backend, algorithm: see Paths below)
  --plot FILE.svg          busbw against size (log2 axis), one line per collective and
                           placement
  -h, --help               this text

Paths (the table's last four columns; backend and algorithm in CSV and JSON):
  After the timed calls of each size and placement every rank reads what served its
  last call (fcclCommGetLastPath) and the ranks share it. backend: host (host memory),
  staged (device memory through host memory), ipc (ranks sharing one GPU, GPU to GPU),
  nccl, mixed (a group over several); mixed(ranks) when ranks disagree, which fails the
  row (a comment line names each rank's; the footer counts them). algorithm: rank 0's
  (the rank that moves the data); JSON lists every rank's in algorithms_by_rank and
  backends_by_rank. With --mem cuda a comment line under a table names the sizes that
  staged or host calls served (calls of 0 elements excepted: they move nothing).

Differences from nccl-tests:
  --max-time SECONDS       time budget per size and placement (default {dmt}): after the
                           first warmups time one call, the ranks agree on the slowest
                           rank's time, and the remaining warmups are cut to a quarter of
                           the budget and the timed iterations to the budget (never below
                           1). Small sizes run exactly -n/-w iterations, large ones fewer,
                           so a default sweep stays short. 0 = always exactly -n and -w.
  --rotate 0|1             1 (default, as nccl-tests): iteration i uses the buffers at
                           offset (i mod k) * size inside the allocation for the largest
                           size, so small sizes do not always hit the cache; 0: always
                           offset 0.
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
  and fails the run.
",
        colls = colls.join(" "),
        types = types.join(" "),
        dmin = DEFAULT_MIN_BYTES,
        dmax = fmt_size(DEFAULT_MAX_BYTES),
        dfac = DEFAULT_FACTOR,
        dit = DEFAULT_ITERS,
        dw = DEFAULT_WARMUP,
        dmt = DEFAULT_MAX_TIME,
        ext = ext.join(" "),
        daxis = DEFAULT_AXIS,
        dnb = DEFAULT_NBUFFERS,
        dreps = DEFAULT_REPS,
        dsoak = fmt_size(DEFAULT_SOAK_MAX_BYTES),
        dwarm = crate::soak::WARMUP_CALLS,
        drss = crate::soak::RSS_BOUND_MIB,
        dpool = crate::soak::LIBRARY_POOL_MIB,
        dslack = crate::soak::RSS_SLACK_MIB,
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

fn parse_num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.trim().parse().map_err(|_| format!("{flag} {v:?}: not a valid number"))
}

/// Parses the arguments (without the program name).
pub fn parse(raw: &[OsString]) -> Result<Parsed, String> {
    let mut o = Opts {
        colls: Vec::new(),
        min_bytes: DEFAULT_MIN_BYTES,
        max_bytes: DEFAULT_MAX_BYTES,
        step_factor: DEFAULT_FACTOR,
        step_bytes: 1 << 20,
        iters: DEFAULT_ITERS,
        warmup: DEFAULT_WARMUP,
        check: 1,
        ty: Ty::Float,
        op: Op::Sum,
        root: 0,
        average: Average::Avg,
        nranks: None,
        bind: true,
        mem: Mem::Host,
        json: None,
        csv: None,
        plot: None,
        max_time: DEFAULT_MAX_TIME,
        rotate: true,
        ext: ExtParams::default(),
        compare_coalesced: false,
        compare_wire: false,
        reps: DEFAULT_REPS,
        soak: None,
        seed: None,
        soak_first: 0,
        child_args: Vec::new(),
    };
    let args: Vec<String> = raw
        .iter()
        .map(|a| a.clone().into_string().map_err(|a| format!("argument {a:?} is not valid UTF-8")))
        .collect::<Result<_, _>>()?;
    let mut step_factor_set = None;
    let mut step_bytes_set = false;
    // Every flag given, for refusing those that a soak does not use.
    let mut given: Vec<String> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let start = i;
        i += 1;
        // Split `--flag=value`, `-b8` and `-b 8` into (flag, inline value).
        let (flag, inline): (String, Option<String>) = if let Some(rest) = a.strip_prefix("--") {
            match rest.split_once('=') {
                Some((f, v)) => (format!("--{f}"), Some(v.to_string())),
                None => (a.clone(), None),
            }
        } else if a.starts_with('-') && a.len() > 2 && !a[1..].starts_with(|c: char| c.is_ascii_digit()) {
            (a[..2].to_string(), Some(a[2..].to_string()))
        } else {
            (a.clone(), None)
        };
        let takes_value = !matches!(flag.as_str(), "-h" | "--help" | "--compare-coalesced" | "--compare-wire")
            && flag.starts_with('-')
            && flag.len() > 1;
        let mut value = || -> Result<String, String> {
            if let Some(v) = &inline {
                return Ok(v.clone());
            }
            let v = args.get(i).cloned().ok_or_else(|| format!("{flag} needs a value"))?;
            i += 1;
            Ok(v)
        };
        let mut keep = true;
        if flag.starts_with('-') {
            given.push(flag.clone());
        }
        match flag.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
            "-b" | "--minbytes" => o.min_bytes = parse_size(&value()?).map_err(|e| format!("-b: {e}"))?,
            "-e" | "--maxbytes" => o.max_bytes = parse_size(&value()?).map_err(|e| format!("-e: {e}"))?,
            "-f" | "--stepfactor" => step_factor_set = Some(parse_num::<u64>("-f", &value()?)?),
            "-i" | "--stepbytes" => {
                o.step_bytes = parse_size(&value()?).map_err(|e| format!("-i: {e}"))?;
                step_bytes_set = true;
            }
            "-n" | "--iters" => o.iters = parse_num("-n", &value()?)?,
            "-w" | "--warmup_iters" => o.warmup = parse_num("-w", &value()?)?,
            "-c" | "--check" => o.check = parse_num("-c", &value()?)?,
            "-d" | "--datatype" => {
                let v = value()?;
                o.ty = Ty::parse(&v).ok_or_else(|| {
                    let all: Vec<&str> = Ty::ALL.iter().map(|t| t.name()).collect();
                    format!("-d {v}: unknown type (one of {})", all.join(" "))
                })?
            }
            "-o" | "--op" => {
                let v = value()?;
                o.op = Op::ALL
                    .iter()
                    .copied()
                    .find(|op| op.name() == v.to_ascii_lowercase())
                    .ok_or_else(|| format!("-o {v}: unknown op (one of sum prod max min avg)"))?
            }
            "-r" | "--root" => o.root = parse_num("-r", &value()?)?,
            "-a" | "--average" => {
                let v = value()?;
                o.average = match v.trim() {
                    "0" => Average::Rank0,
                    "1" => Average::Avg,
                    "2" => Average::Min,
                    "3" => Average::Max,
                    _ => return Err(format!("-a {v}: use 0 (rank 0), 1 (average), 2 (min) or 3 (max)")),
                }
            }
            "--bind" => {
                o.bind = match value()?.trim() {
                    "core" => true,
                    "none" => false,
                    v => return Err(format!("--bind {v}: use core or none")),
                };
                keep = false;
            }
            "--nranks" | "--np" => {
                let v = value()?;
                let n: usize = parse_num("--nranks", &v)?;
                if n == 0 {
                    return Err("--nranks needs at least 1 rank".into());
                }
                o.nranks = Some(n);
                keep = false;
            }
            "--mem" => {
                let v = value()?;
                o.mem = match v.to_ascii_lowercase().as_str() {
                    "host" => Mem::Host,
                    "cuda" | "device" => Mem::Cuda,
                    _ => return Err(format!("--mem {v}: use host or cuda")),
                }
            }
            "-J" | "--json" => o.json = Some(PathBuf::from(value()?)),
            "--csv" => o.csv = Some(PathBuf::from(value()?)),
            "--plot" => {
                let v = value()?;
                if !v.to_ascii_lowercase().ends_with(".svg") {
                    return Err(format!("--plot {v}: only SVG output is supported; name the file *.svg"));
                }
                o.plot = Some(PathBuf::from(v));
            }
            "--max-time" | "--max_time" => {
                let v: f64 = parse_num("--max-time", &value()?)?;
                if !v.is_finite() || v < 0.0 {
                    return Err("--max-time needs seconds >= 0".into());
                }
                o.max_time = v;
            }
            "--rotate" => {
                o.rotate = match value()?.trim() {
                    "0" => false,
                    "1" => true,
                    v => return Err(format!("--rotate {v}: use 0 or 1")),
                }
            }
            "--axis" => {
                let v = value()?;
                o.ext.axis = match v.trim() {
                    "0" => 0,
                    "1" => 1,
                    _ => return Err(format!("--axis {v}: the tensor is 2-D; use 0 or 1")),
                }
            }
            "--nbuffers" => {
                let v: usize = parse_num("--nbuffers", &value()?)?;
                if v == 0 || v > i32::MAX as usize {
                    return Err(format!("--nbuffers {v}: use 1 to {}", i32::MAX));
                }
                o.ext.nbuffers = v;
            }
            "--bucket" => {
                let v = parse_size(&value()?).map_err(|e| format!("--bucket: {e}"))?;
                o.ext.bucket = usize::try_from(v).map_err(|_| format!("--bucket {v}: too large"))?;
            }
            "--wire" => {
                let v = value()?;
                o.ext.wire = Ty::parse(&v)
                    .filter(|t| t.is_float())
                    .ok_or_else(|| format!("--wire {v}: use half, bfloat16, f8e4m3, f8e5m2, float or double"))?;
            }
            "--compare-coalesced" => o.compare_coalesced = true,
            "--compare-wire" => o.compare_wire = true,
            "--reps" => {
                o.reps = parse_num("--reps", &value()?)?;
                if o.reps == 0 {
                    return Err("--reps needs at least 1 repetition".into());
                }
            }
            "--soak" => {
                let v: u64 = parse_num("--soak", &value()?)?;
                if v == 0 {
                    return Err("--soak needs at least 1 call".into());
                }
                o.soak = Some(v);
            }
            "--seed" => {
                let v = value()?;
                let t = v.trim().to_ascii_lowercase();
                let parsed = match t.strip_prefix("0x") {
                    Some(h) => u64::from_str_radix(h, 16).ok(),
                    None => t.parse().ok(),
                };
                o.seed = Some(parsed.ok_or_else(|| format!("--seed {v:?}: not a number (decimal or 0x hex)"))?);
            }
            "--soak-first" => o.soak_first = parse_num("--soak-first", &value()?)?,
            _ if takes_value => return Err(format!("unknown option {a}")),
            name => {
                if name == "all" {
                    o.colls.extend(Collective::ALL);
                } else if name == "ext" {
                    o.colls.extend(Collective::EXT);
                } else {
                    let c = Collective::parse(name).ok_or_else(|| {
                        let v: Vec<&str> =
                            Collective::ALL.iter().chain(Collective::EXT.iter()).map(|c| c.name()).collect();
                        format!("unknown collective {name:?} (one of {}, all or ext)", v.join(" "))
                    })?;
                    o.colls.push(c);
                }
            }
        }
        if keep {
            o.child_args.extend(raw[start..i].iter().cloned());
        }
    }
    if o.soak.is_none() {
        if let Some(f) = given.iter().find(|f| matches!(f.as_str(), "--seed" | "--soak-first")) {
            return Err(format!("{f} is an option of --soak"));
        }
    } else {
        if let Some(f) = given.iter().find(|f| !SOAK_FLAGS.contains(&f.as_str())) {
            return Err(format!(
                "{f} does not apply to --soak, which draws sizes, types, ops, roots and extension parameters \
                 itself (it takes -e, --mem, --nranks, --bind, -J, --seed, --soak-first)"
            ));
        }
        if o.soak_first.checked_add(o.soak.unwrap_or(0)).is_none() {
            return Err(format!("--soak-first {}: too large", o.soak_first));
        }
        if !given.iter().any(|f| f == "-e" || f == "--maxbytes") {
            o.max_bytes = DEFAULT_SOAK_MAX_BYTES;
        }
        if o.max_bytes > isize::MAX as u64 / 4 {
            return Err(format!("-e {}: too large for a soak's buffers", o.max_bytes));
        }
        o.min_bytes = 0;
        if o.colls.is_empty() {
            o.colls.extend(Collective::ALL);
            o.colls.extend(Collective::EXT);
        }
        let mut seen = Vec::new();
        o.colls.retain(|c| {
            let new = !seen.contains(c);
            seen.push(*c);
            new
        });
        return Ok(Parsed::Run(Box::new(o)));
    }
    let comparing = o.compare_coalesced || o.compare_wire;
    if comparing {
        if !o.colls.is_empty() {
            return Err("--compare-coalesced and --compare-wire run their own calls; name no collectives".into());
        }
        if o.json.is_some() || o.csv.is_some() || o.plot.is_some() {
            return Err("-J, --csv and --plot are for sweeps, not for --compare-coalesced or --compare-wire".into());
        }
    } else if o.colls.is_empty() {
        o.colls.push(Collective::AllReduce);
    }
    if o.compare_wire || o.colls.contains(&Collective::AllReduceWire) {
        let what = if o.compare_wire { "--compare-wire" } else { "all_reduce_wire" };
        if !matches!(o.ty, Ty::Float | Ty::Double) {
            return Err(format!("{what} needs -d float or double, not {}", o.ty.name()));
        }
        if o.ext.wire.size() > o.ty.size() {
            return Err(format!(
                "--wire {}: the wire type of {what} must be no wider than the data (-d {})",
                o.ext.wire.name(),
                o.ty.name()
            ));
        }
    }
    let mut seen = Vec::new();
    o.colls.retain(|c| {
        let new = !seen.contains(c);
        seen.push(*c);
        new
    });
    match step_factor_set {
        Some(0) => return Err("-f 0: the step factor must be at least 1".into()),
        Some(1) => o.step_factor = 0,
        Some(f) => o.step_factor = f,
        None if step_bytes_set => o.step_factor = 0,
        None => {}
    }
    if o.step_factor == 0 && o.step_bytes == 0 {
        return Err("-i 0 with -f 1 would never reach the maximum size".into());
    }
    if o.min_bytes > o.max_bytes {
        return Err(format!("invalid sizes: -b {} is larger than -e {}", o.min_bytes, o.max_bytes));
    }
    if o.step_factor > 1 && o.min_bytes == 0 {
        return Err("-b 0 with a step factor would never grow; use -b 1 or more".into());
    }
    if o.iters == 0 {
        return Err("-n needs at least 1 iteration".into());
    }
    if o.root < 0 {
        return Err(format!("-r {}: the root must be a rank (>= 0)", o.root));
    }
    Ok(Parsed::Run(Box::new(o)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Opts {
        let raw: Vec<OsString> = args.iter().map(OsString::from).collect();
        match parse(&raw).unwrap() {
            Parsed::Run(o) => *o,
            Parsed::Help => panic!("help"),
        }
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
}
