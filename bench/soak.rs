//! `--soak N`: N pseudo-random calls, every one checked, and each rank's resources
//! counted after a warm-up and at the end.
//!
//! Call i is a pure function of (seed, i): every rank draws the same collective, type,
//! op, size, placement, root, extension parameters and uneven counts, and every rank's
//! buffer kinds and offsets (each rank keeps its own), so `--soak-first I --soak 1`
//! replays one call. Each call runs through [`Case`] as the sweep's `-c` checks do:
//! fresh inputs, the call, the check against values computed independently. Wrong
//! elements are counted locally at every call and summed over ranks every
//! [`AGREE_EVERY`] calls (for the progress line) and at the end.

mod call;
mod pool;
mod res;
mod summary;

use crate::coll::Case;
use crate::comm::{Comm, Fail};
use crate::opts::Opts;
use crate::report::RankInfo;
use crate::{out, peak_rss_kib, Ctx};
use call::{all_colls, Call, Kind};
use ferroccl::ffi::{fcclMax, fcclMin, fcclSum};
use ferroccl_testutil::mix;
use pool::Pool;
use res::{RankRec, Res, REC_FIELDS};
use std::fmt::Write as _;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use summary::{replay, Summary, Tally};

/// Environment switch of the leak test hook (see --help).
const LEAK_VAR: &str = "FERROCCL_BENCH_LEAK";

/// Calls before the first resource count (fewer when N/4 is smaller): every path has
/// run by then, so what the library creates once is not counted as growth.
pub const WARMUP_CALLS: u64 = 300;
/// Freed buffers the library's scratch pool keeps (docs/performance.md: "at most
/// 128 MiB"); reductions of varied sizes fill it over thousands of calls.
pub const LIBRARY_POOL_MIB: u64 = 128;
/// Page-locked buffers the library keeps for staging device memory (with --mem cuda).
pub const STAGING_POOL_MIB: u64 = (ferroccl::mem::pinned::POOL_MAX_BYTES >> 20) as u64;
/// Resident memory may grow this much beyond those pools (allocators keep freed memory,
/// shared rings are touched lazily).
pub const RSS_SLACK_MIB: u64 = 64;
/// The judged bound on resident memory growth.
pub const RSS_BOUND_MIB: u64 = LIBRARY_POOL_MIB + STAGING_POOL_MIB + RSS_SLACK_MIB;
/// Calls between the sums of wrong elements over ranks (a small all_reduce each).
const AGREE_EVERY: u64 = 256;
/// Wrong calls a rank describes on stderr (the rest are only counted).
const SHOW_WRONG: u64 = 10;
/// Resident memory is also read at this many even steps after the warm-up (the last
/// at the end), to tell memory that levels off from memory that keeps growing.
const RSS_STEPS: usize = 10;

/// The seed every rank uses: --seed, or rank 0's draw; ranks given different
/// parameters are refused (their calls would not match).
fn agree_seed(comm: &Comm, o: &Opts) -> Result<u64, Fail> {
    let drawn = if comm.rank == 0 {
        let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        mix(t ^ (u64::from(std::process::id()) << 32))
    } else {
        0
    };
    let seed = match o.seed {
        Some(s) => s,
        None => comm.allreduce_u64(drawn, fcclSum)?,
    };
    let names: String = o.colls.iter().map(|c| c.name()).collect();
    let mut h = mix(seed ^ mix(o.soak.unwrap_or(0) ^ mix(o.soak_first ^ mix(o.max_bytes))));
    for b in names.bytes() {
        h = mix(h ^ u64::from(b));
    }
    h = mix(h ^ o.mem as u64);
    if comm.allreduce_u64(h, fcclMin)? != comm.allreduce_u64(h, fcclMax)? {
        return Err(Fail::usage(
            "--soak: the ranks were given different --soak, --seed, --soak-first, -e, --mem or collectives",
        ));
    }
    Ok(seed)
}

/// Runs the soak on this rank; returns the exit status.
pub fn run(ctx: &mut Ctx, version_code: i32, infos: &[RankInfo]) -> Result<i32, Fail> {
    let (o, comm) = (ctx.o, ctx.comm);
    let (n, me, rank0) = (comm.nranks, comm.rank, comm.rank == 0);
    let total = o.soak.unwrap_or(0);
    let first = o.soak_first;
    let seed = agree_seed(comm, o)?;
    let warm = WARMUP_CALLS.min(total / 4);
    let colls = o.colls.clone();
    if rank0 {
        let mut s = crate::report::version_line(o, version_code);
        let _ = writeln!(
            s,
            "# Soak: {total} calls from seed {seed} (calls {first}..{}), {n} ranks, sizes 0-{} B log-uniform, {} collectives",
            first + total,
            o.max_bytes,
            colls.len()
        );
        s.push_str(&crate::report::rank_lines(o, infos));
        out(&s);
    }
    let order = all_colls();
    let mut tally = Tally {
        colls: vec![0; order.len()],
        types: [0; 12],
        ops: [0; 5],
        inplace: 0,
        zero: 0,
        idle: 0,
        unchecked: 0,
        sizes: [0; 5],
    };
    let mut rec = RankRec { first_wrong: u64::MAX, ..Default::default() };
    let mut pool = Pool::new();
    let corrupt = ctx.corrupt && rank0;
    let leak = rank0 && std::env::var(LEAK_VAR).is_ok_and(|v| !v.is_empty() && v != "0");
    comm.barrier()?;
    let t0 = Instant::now();
    if warm == 0 {
        rec.start = Res::now();
        (rec.rss_steps, rec.heap_steps) = ([rec.start.rss_kib; RSS_STEPS], [rec.start.heap_kib; RSS_STEPS]);
    }
    for k in 0..total {
        let i = first + k;
        let call = Call::draw(seed, i, &colls, n, o);
        tally.add(&call, n, &order);
        let [sb, rb] = call.bufs[me];
        if !call.inplace {
            rec.kinds[sb.kind as usize] += 1;
        }
        rec.kinds[rb.kind as usize] += 1;
        let w = run_call(comm, &mut pool, &call, corrupt).map_err(|f| Fail {
            exit: f.exit,
            msg: format!(
                "soak call #{i} ({}): {}\n  replay: {} (this call alone: --soak-first {i} --soak 1)",
                call.describe(n),
                f.msg,
                replay(o, n, seed)
            ),
        })?;
        if let Some((count, first_bad)) = w {
            rec.wrong += count;
            rec.wrong_calls += 1;
            rec.first_wrong = rec.first_wrong.min(i);
            if rec.wrong_calls <= SHOW_WRONG {
                let (e, want, got) = first_bad;
                let show = |v: Option<u64>| v.map_or_else(|| "no integer / sentinel".to_string(), |v| v.to_string());
                say!(
                    "rank {me}: soak call #{i} of seed {seed} ({}): {count} wrong elements; first: \
                     element {e} expected {} got {}",
                    call.describe(n),
                    match want {
                        Some(v) => v.to_string(),
                        None => "untouched (sentinel)".into(),
                    },
                    show(got)
                );
            }
        }
        if leak && k >= warm {
            // The test hook: a descriptor never closed, as a leaking library would.
            if let Ok(f) = std::fs::File::open("/dev/null") {
                let _ = std::os::fd::IntoRawFd::into_raw_fd(f);
            }
        }
        if (k + 1) % AGREE_EVERY == 0 {
            let wrong = comm.allreduce_u64(rec.wrong, fcclSum)?;
            ctx.progress.update(&format!("soak {}/{total} calls, {wrong} wrong elements", k + 1));
        }
        if k + 1 == warm {
            // Counted with every soak buffer freed, here and at the end, so the counts
            // do not depend on which buffers the pool happens to hold.
            pool.clear();
            comm.barrier()?;
            rec.start = Res::now();
            // Steps that fall on the warm-up (short runs) read as the start.
            (rec.rss_steps, rec.heap_steps) = ([rec.start.rss_kib; RSS_STEPS], [rec.start.heap_kib; RSS_STEPS]);
        }
        let steps: Vec<usize> = (0..RSS_STEPS - 1).filter(|&j| rss_step_end(j, warm, total) == k + 1).collect();
        if !steps.is_empty() && k + 1 > warm {
            pool.clear();
            let r = Res::now();
            for j in steps {
                (rec.rss_steps[j], rec.heap_steps[j]) = (r.rss_kib, r.heap_kib);
            }
        }
    }
    pool.clear();
    comm.barrier()?;
    let secs = t0.elapsed().as_secs_f64();
    rec.end = Res::now();
    (rec.rss_steps[RSS_STEPS - 1], rec.heap_steps[RSS_STEPS - 1]) = (rec.end.rss_kib, rec.end.heap_kib);
    rec.allocations = pool.allocations;
    rec.peak_rss_kib = peak_rss_kib();
    ctx.progress.clear();
    let all = comm.allgather_bytes(&rec.to_bytes())?;
    let recs: Vec<RankRec> = all.chunks(REC_FIELDS * 8).map(RankRec::from_bytes).collect();
    let s = Summary { o, n, seed, total, first, warm, secs, tally: &tally, recs: &recs, order: &order };
    if rank0 {
        out(&s.text());
        if let Some(p) = &o.json {
            let j = s.json(version_code, infos);
            std::fs::write(p, j).map_err(|e| Fail::runtime(format!("cannot write {}: {e}", p.display())))?;
        }
    }
    Ok(if s.failures().is_empty() { 0 } else { 1 })
}

/// The number of calls done when RSS step `j` (0-based) is read: the calls after
/// the warm-up cut into RSS_STEPS even parts.
fn rss_step_end(j: usize, warm: u64, total: u64) -> u64 {
    warm + (total - warm) * (j as u64 + 1) / RSS_STEPS as u64
}

/// One call: buffers, fresh inputs, the call, the check. Returns the wrong elements
/// and the first of them (None: right, or in-place all_to_allv, which is not checked).
#[allow(clippy::type_complexity)]
fn run_call(
    comm: &Comm,
    pool: &mut Pool,
    c: &Call,
    corrupt: bool,
) -> Result<Option<(u64, (usize, Option<u64>, Option<u64>))>, Fail> {
    let (n, me) = (comm.nranks, comm.rank);
    let esize = c.ty.size();
    let l = c.coll.layout(c.count, n, &c.x);
    // Case fills and checks max(send, recv) elements of both buffers.
    let need = l.send.max(l.recv) * esize;
    let [sb, rb] = c.bufs[me];
    // SAFETY: (pointer arithmetic) each allocation holds the offset plus `need`.
    let sp = unsafe { pool.get(sb.kind, 0, sb.offset * esize + need, sb.fresh)?.add(sb.offset * esize) };
    // SAFETY: as above.
    let rp = unsafe { pool.get(rb.kind, 1, rb.offset * esize + need, rb.fresh)?.add(rb.offset * esize) };
    let device = sb.kind == Kind::Device;
    let (hs, hr) = if device { (pool.mirror(0, need), pool.mirror(1, need)) } else { (sp, rp) };
    let mut case = Case::new(comm, c.coll, c.ty, c.op, c.root, c.count, hs, hr, need, false, c.x);
    if device {
        case.device = Some((sp, rp));
    }
    if let Some(v) = &c.v {
        case.set_v_counts(|s, d| v[s * n + d]);
    }
    case.fill(c.data_seed, c.inplace)?;
    case.run(0, c.inplace)?;
    case.wait()?;
    if c.inplace && !c.coll.inplace_checked() {
        return Ok(None);
    }
    let w = case.check(c.data_seed, c.inplace, corrupt)?;
    Ok(w.first.map(|f| (w.count, f)))
}
