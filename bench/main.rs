//! ferroccl-bench: nccl-tests-style sweeps of ferroccl's collectives, through the C API.
//!
//! `--nranks N` starts N local ranks of this same binary through
//! [`ferroccl::launch`]; otherwise each process is one rank of an external launch
//! (or a single rank). Every rank times each size out of place and in place, checks
//! its results outside the timed loop, and rank 0 prints the table and writes the
//! JSON, CSV and SVG outputs. `--compare-coalesced` and `--compare-wire` replace the
//! sweep with side-by-side timings (see compare.rs), `--soak N` with N random checked
//! calls and resource counts (see soak.rs). See `ferroccl-bench --help`.

/// Writes `ferroccl-bench: ` and the formatted line to stderr in one write: rank 0 shares
/// stderr with the launcher's relayed lines of the other ranks, and `eprintln!` writes
/// each piece of its format separately, so a relayed line could land mid-line.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say_line(&format!($($arg)*))
    };
}

mod cli;
mod coll;
mod comm;
mod compare;
mod data;
mod opts;
mod plot;
mod report;
mod soak;

use coll::{Case, Collective};
use comm::{Buf, Comm, Fail};
use ferroccl::ffi::{fcclMax, fcclMin, fcclSum};
use opts::{Average, Mem, Opts};
use report::{RankInfo, Record, RunInfo};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// See [`say!`].
fn say_line(msg: &str) {
    let line = format!("ferroccl-bench: {msg}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Environment switch of the corruption test hook (see --help).
const CORRUPT_VAR: &str = "FERROCCL_BENCH_CORRUPT";
/// Sweeps longer than this show a progress line.
const PROGRESS_AFTER: Duration = Duration::from_secs(2);

fn main() {
    let raw: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let opts = match cli::parse(&raw) {
        Ok(o) => o,
        Err(e) => {
            // --help prints to stdout and exits 0; an error prints clap's message (with
            // its "did you mean" tip and the usage) and exits 2.
            let _ = e.print();
            std::process::exit(if e.use_stderr() { comm::EXIT_USAGE } else { 0 });
        }
    };
    if let Some(n) = opts.nranks {
        std::process::exit(launch(&opts, n));
    }
    match run_rank(&opts) {
        Ok(code) => std::process::exit(code),
        Err(f) => {
            let rank = std::env::var("FERROCCL_RANK").ok().map(|r| format!("rank {r}: ")).unwrap_or_default();
            say!("{rank}{}", f.msg);
            std::process::exit(f.exit);
        }
    }
}

/// Starts `n` ranks of this binary with the same arguments minus `--nranks`.
fn launch(o: &Opts, n: usize) -> i32 {
    if o.root as usize >= n {
        say!("-r {}: the root must be a rank, 0..{}", o.root, n - 1);
        return comm::EXIT_USAGE;
    }
    // Refuse an unavailable memory kind once, here, rather than in every rank.
    if o.mem == Mem::Cuda {
        if let Err(f) = comm::cuda_available() {
            say!("{}", f.msg);
            return f.exit;
        }
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            say!("cannot find this program to start its ranks: {e}");
            return comm::EXIT_RUNTIME;
        }
    };
    let mut argv = vec![exe.into_os_string()];
    argv.extend(o.child_args.iter().cloned());
    let mut l = ferroccl::launch::Launch::new(n, argv);
    l.inherit_rank0 = true;
    l.bind = o.bind;
    l.name = "ferroccl-bench".into();
    l.run()
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: valid buffer of the given length.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if r != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Peak resident set size of this process (VmHWM), in KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Every rank's pid, host and peak memory, gathered to all ranks.
fn rank_infos(comm: &Comm) -> Result<Vec<RankInfo>, Fail> {
    const REC: usize = 80;
    let mut mine = [0u8; REC];
    mine[0..4].copy_from_slice(&std::process::id().to_le_bytes());
    mine[4..12].copy_from_slice(&peak_rss_kib().to_le_bytes());
    mine[12..16].copy_from_slice(&comm::comm_device(comm).to_le_bytes());
    let h = hostname();
    let hb = &h.as_bytes()[..h.len().min(REC - 16)];
    mine[16..16 + hb.len()].copy_from_slice(hb);
    let all = comm.allgather_bytes(&mine)?;
    Ok(all
        .chunks(REC)
        .map(|c| {
            let host = &c[16..];
            let end = host.iter().position(|&b| b == 0).unwrap_or(host.len());
            RankInfo {
                pid: u32::from_le_bytes(c[0..4].try_into().unwrap()),
                peak_rss_kib: u64::from_le_bytes(c[4..12].try_into().unwrap()),
                device: i32::from_le_bytes(c[12..16].try_into().unwrap()),
                host: String::from_utf8_lossy(&host[..end]).into_owned(),
            }
        })
        .collect())
}

/// Rank 0's progress line on stderr, shown once a sweep has run for a while.
struct Progress {
    on: bool,
    tty: bool,
    start: Instant,
    shown: bool,
}

impl Progress {
    fn new(rank0: bool) -> Progress {
        Progress { on: rank0, tty: std::io::stderr().is_terminal(), start: Instant::now(), shown: false }
    }
    fn update(&mut self, what: &str) {
        if !self.on || self.start.elapsed() < PROGRESS_AFTER {
            return;
        }
        let mut e = std::io::stderr().lock();
        if self.tty {
            let _ = e.write_all(format!("\r\x1b[Kferroccl-bench: {what}").as_bytes());
        } else {
            let _ = e.write_all(format!("ferroccl-bench: {what}\n").as_bytes());
        }
        let _ = e.flush();
        self.shown = true;
    }
    /// Clears a `\r` progress line before stdout prints over it.
    fn clear(&mut self) {
        if self.on && self.tty && self.shown {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[K");
            self.shown = false;
        }
    }
}

fn out(s: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(s.as_bytes());
    let _ = o.flush();
}

struct Ctx<'a> {
    o: &'a Opts,
    comm: &'a Comm,
    corrupt: bool,
    progress: Progress,
}

fn run_rank(o: &Opts) -> Result<i32, Fail> {
    let started = Instant::now();
    if o.mem == Mem::Cuda {
        // Without CUDA: a clear message and exit 2 on every rank.
        comm::select_device()?;
        Buf::device(1)?;
    }
    let comm = Comm::init()?;
    let n = comm.nranks;
    if o.root as usize >= n {
        return Err(Fail::usage(format!("-r {}: the root must be a rank, 0..{}", o.root, n - 1)));
    }
    let rank0 = comm.rank == 0;
    let version_code = comm::version();
    let infos = rank_infos(&comm)?;
    let corrupt = std::env::var(CORRUPT_VAR).is_ok_and(|v| !v.is_empty() && v != "0");
    let mut ctx = Ctx { o, comm: &comm, corrupt, progress: Progress::new(rank0) };
    if o.soak.is_some() {
        let code = soak::run(&mut ctx, version_code, &infos)?;
        drop(comm);
        return Ok(code);
    }
    if rank0 {
        out(&report::header_lines(o, n, version_code, &infos));
    }
    if o.compare_coalesced || o.compare_wire {
        let mut failed = 0;
        if o.compare_coalesced {
            failed += compare::coalesced(&mut ctx)?;
        }
        if o.compare_wire {
            failed += compare::wire(&mut ctx)?;
        }
        ctx.progress.clear();
        let infos = rank_infos(&comm)?;
        let peak = infos.iter().map(|i| i.peak_rss_kib).max().unwrap_or(0);
        if rank0 {
            out(&compare::footer(failed, peak));
        }
        drop(comm);
        return Ok(if failed > 0 { 1 } else { 0 });
    }
    let mut records: Vec<Record> = Vec::new();
    for &c in &o.colls {
        let recs = bench_collective(&mut ctx, c)?;
        if rank0 && o.colls.len() > 1 {
            out(&format!("# Avg bus bandwidth    : {} ({})\n", report::fmt_g(report::avg_busbw(&recs)), c.name()));
        }
        records.extend(recs);
    }
    ctx.progress.clear();
    // Peak memory after the sweep (every buffer has been live by now).
    let infos = rank_infos(&comm)?;
    let peak = infos.iter().map(|i| i.peak_rss_kib).max().unwrap_or(0);
    // Wrong results and rows whose ranks disagreed on the backend fail the run.
    let failed = report::failures(&records) + report::mixed(&records);
    if rank0 {
        out(&report::footer(&records, peak));
        if infos.len() > 1 {
            let each: Vec<String> =
                infos.iter().enumerate().map(|(r, i)| format!("{r}: {:.1}", i.peak_rss_kib as f64 / 1024.0)).collect();
            out(&format!("# Peak resident memory per rank (MiB) : {}\n", each.join(", ")));
        }
        let info = RunInfo {
            opts: o,
            nranks: n,
            version_code,
            host: hostname(),
            date: report::utc_now(),
            ranks: infos,
            duration_s: started.elapsed().as_secs_f64(),
        };
        let write = |p: &std::path::Path, text: String| {
            std::fs::write(p, text).map_err(|e| Fail::runtime(format!("cannot write {}: {e}", p.display())))
        };
        if let Some(p) = &o.json {
            write(p, report::json(&info, &records))?;
        }
        if let Some(p) = &o.csv {
            write(p, report::csv(&records))?;
        }
        if let Some(p) = &o.plot {
            let host = &info.host;
            let title = format!("ferroccl-bench busbw, {n} ranks, {}, {} memory, {host}", o.ty.name(), o.mem.name());
            write(p, plot::svg(&records, &title))?;
        }
    }
    drop(comm);
    Ok(if failed > 0 { 1 } else { 0 })
}

fn bench_collective(ctx: &mut Ctx, coll: Collective) -> Result<Vec<Record>, Fail> {
    let o = ctx.o;
    let comm = ctx.comm;
    let n = comm.nranks;
    let esize = o.ty.size();
    let sizes = o.sizes();
    let buf_bytes = max_buf_bytes(o, &[coll], n);
    let send = Buf::host(buf_bytes)?;
    let recv = Buf::host(buf_bytes)?;
    // --mem cuda: the calls use device memory; send/recv above are the host mirrors
    // that inputs are written to and results checked in.
    let dev = if o.mem == Mem::Cuda { Some((Buf::device(buf_bytes)?, Buf::device(buf_bytes)?)) } else { None };
    if comm.rank == 0 {
        ctx.progress.clear();
        out(&report::table_header(coll.name(), coll.note(&o.ext, o.ty).as_deref()));
    }
    let (has_out, has_in) = coll.placements(&o.ext);
    let mut recs = Vec::with_capacity(sizes.len() * 2);
    for (i, &size) in sizes.iter().enumerate() {
        ctx.progress.update(&format!("{} {} B ({}/{})", coll.name(), size, i + 1, sizes.len()));
        let count = (size / esize as u64) as usize;
        let root = if coll.has_root() { o.root as usize } else { 0 };
        let mut case = Case::new(comm, coll, o.ty, o.op, root, count, send.ptr, recv.ptr, buf_bytes, o.rotate, o.ext);
        case.device = dev.as_ref().map(|(s, r)| (s.ptr, r.ptr));
        let outp = if has_out { Some(measure(ctx, &case, false)?) } else { None };
        let inp = if has_in { Some(measure(ctx, &case, true)?) } else { None };
        if comm.rank == 0 {
            ctx.progress.clear();
            out(&format!("{}\n", report::row(outp.as_ref(), inp.as_ref())));
            for note in outp.iter().chain(inp.iter()).filter_map(report::mixed_note) {
                out(&format!("{note}\n"));
            }
        }
        recs.extend(outp);
        recs.extend(inp);
    }
    if comm.rank == 0 && o.mem == Mem::Cuda {
        if let Some(note) = report::device_path_note(&recs) {
            out(&format!("{note}\n"));
        }
    }
    Ok(recs)
}

/// Bytes of each of the send and receive allocations: enough for the largest size of
/// the sweep of any of `colls`.
fn max_buf_bytes(o: &Opts, colls: &[Collective], n: usize) -> usize {
    let esize = o.ty.size();
    o.sizes()
        .iter()
        .flat_map(|&s| {
            colls.iter().map(move |c| {
                let l = c.layout((s / esize as u64) as usize, n, &o.ext);
                l.send.max(l.recv) * esize
            })
        })
        .max()
        .unwrap_or(0)
}

/// One rank's time combined across ranks as `-a` says.
fn combine(comm: &Comm, o: &Opts, local: f64) -> Result<f64, Fail> {
    Ok(match o.average {
        Average::Rank0 => local,
        Average::Avg => comm.allreduce_f64(local, fcclSum)? / comm.nranks as f64,
        Average::Min => comm.allreduce_f64(local, fcclMin)?,
        Average::Max => comm.allreduce_f64(local, fcclMax)?,
    })
}

/// Warmups, the timed loop and the checks of one size and placement.
fn measure(ctx: &Ctx, case: &Case, inplace: bool) -> Result<Record, Fail> {
    let o = ctx.o;
    let comm = ctx.comm;
    let n = comm.nranks;
    let coll = case.coll;
    case.fill(0, inplace)?;

    // Warmups; the last of the first two estimates the time of one call.
    let first = o.warmup.min(2);
    let mut est = 0.0;
    for it in 0..first {
        let t = Instant::now();
        case.run(it, inplace)?;
        case.wait()?;
        est = t.elapsed().as_secs_f64();
    }
    let (iters, more_warmups) = if o.max_time > 0.0 && first > 0 {
        // Every rank must run the same number of calls: agree on the slowest estimate.
        let est = comm.allreduce_f64(est, fcclMax)?;
        let fit = |budget: f64| if est > 0.0 { (budget / est) as usize } else { usize::MAX };
        (fit(o.max_time).clamp(1, o.iters), (o.warmup - first).min(fit(o.max_time / 4.0)))
    } else {
        (o.iters, o.warmup - first)
    };
    for it in first..first + more_warmups {
        case.run(it, inplace)?;
    }
    case.wait()?;

    comm.barrier()?;
    // Device memory: what the calling thread spends in each call (enqueueing it) too;
    // host calls return when done, and two clock reads a call would show in their times.
    let on_device = case.device.is_some();
    let mut in_calls = 0.0;
    let t0 = Instant::now();
    for it in 0..iters {
        if on_device {
            let t = Instant::now();
            case.run(it, inplace)?;
            in_calls += t.elapsed().as_secs_f64();
        } else {
            case.run(it, inplace)?;
        }
    }
    // Device memory: calls are stream-ordered; the time ends when the stream is done.
    case.wait()?;
    let local = t0.elapsed().as_secs_f64() / iters as f64;
    // What served the timed calls, before the bookkeeping collectives below replace it.
    let paths = comm.last_paths()?;
    let secs = combine(comm, o, local)?;
    let host_us = if on_device { Some(combine(comm, o, in_calls / iters as f64)? * 1e6) } else { None };

    let checked = o.check > 0 && (!inplace || coll.inplace_checked());
    let wrong =
        if checked { Some(check_results(ctx, case, inplace, coll.name(), |it| case.run(it, inplace))?) } else { None };

    let l = &case.layout;
    let esize = o.ty.size();
    let algbw = if secs > 0.0 { coll.alg_bytes(l, esize, n) / secs / 1e9 } else { 0.0 };
    Ok(Record {
        collective: coll.name(),
        nranks: n,
        ty: o.ty.name(),
        redop: if coll.reduces() { o.op.name() } else { "none" },
        root: if coll.has_root() { o.root } else { -1 },
        size_bytes: l.size_bytes(esize),
        count: l.param,
        placement: if inplace { "in" } else { "out" },
        time_us: secs * 1e6,
        host_us,
        algbw,
        busbw: algbw * coll.bus_factor(n),
        wrong,
        iters,
        warmups: first + more_warmups,
        paths,
    })
}

/// The `-c` checks of one size and placement: fresh inputs, one call of `run`, the
/// check; returns the wrong elements summed over ranks (stops at the first failing
/// check). `what` names the call in the message on stderr.
fn check_results(
    ctx: &Ctx,
    case: &Case,
    inplace: bool,
    what: &str,
    run: impl Fn(usize) -> Result<(), Fail>,
) -> Result<u64, Fail> {
    let (o, comm) = (ctx.o, ctx.comm);
    let mut total = 0;
    for c in 0..o.check {
        let seed = 1 + c as u64;
        case.fill(seed, inplace)?;
        run(0)?;
        let w = case.check(seed, inplace, ctx.corrupt && comm.rank == 0)?;
        if let Some((k, want, got)) = w.first {
            let show = |v: Option<u64>| v.map_or_else(|| "no integer / sentinel".to_string(), |v| v.to_string());
            say!(
                "rank {}: {what} {} B {}: {} wrong elements; first: element {k} expected {} got {}",
                comm.rank,
                case.layout.size_bytes(o.ty.size()),
                if inplace { "in-place" } else { "out-of-place" },
                w.count,
                match want {
                    Some(v) => v.to_string(),
                    None => "untouched (sentinel)".into(),
                },
                show(got)
            );
        }
        total = comm.allreduce_u64(w.count, fcclSum)?;
        if total > 0 {
            break;
        }
    }
    Ok(total)
}
