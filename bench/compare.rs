//! Side-by-side comparisons, measured in one run because the machine is noisy:
//! `--compare-coalesced` (fcclAllReduceCoalesced against one fcclAllReduce per
//! buffer) and `--compare-wire` (fcclAllReduceWire against fcclAllReduce).
//!
//! Each repetition times both sides back to back after a barrier, in alternating
//! order; the ratio is taken within each repetition and its median reported, so slow
//! drifts of the machine cancel.

use crate::coll::{Case, Collective};
use crate::comm::{Buf, Fail};
use crate::report::{fmt_g, fmt_time};
use crate::{check_results, combine, max_buf_bytes, out, Ctx};
use ferroccl::ffi::fcclMax;
use std::fmt::Write as _;
use std::time::Instant;

/// A side of a comparison: one call of it at iteration `it`.
type Side<'a> = &'a dyn Fn(usize) -> Result<(), Fail>;

/// Per-call times (seconds, combined across ranks) of two sides, one per repetition.
struct Paired {
    a: Vec<f64>,
    b: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

impl Paired {
    /// b's time over a's, per repetition (repetitions where a took no time are left out).
    fn ratios(&self) -> Vec<f64> {
        self.a.iter().zip(&self.b).filter(|(a, _)| **a > 0.0).map(|(a, b)| b / a).collect()
    }

    /// (median, min, max) of the ratios; None when there are none.
    fn ratio(&self) -> Option<(f64, f64, f64)> {
        let r = self.ratios();
        if r.is_empty() {
            return None;
        }
        let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.iter().copied().fold(0.0, f64::max);
        Some((median(&r), lo, hi))
    }
}

/// Warms both sides up, fits the iterations to --max-time, then runs --reps
/// repetitions timing a and b back to back, in alternating order.
fn alternate(ctx: &Ctx, a: Side, b: Side) -> Result<Paired, Fail> {
    let (o, comm) = (ctx.o, ctx.comm);
    // Warmups, alternating; the last call of each side estimates its time.
    let (mut est_a, mut est_b) = (0.0, 0.0);
    for it in 0..o.warmup.max(1) {
        let t = Instant::now();
        a(it)?;
        est_a = t.elapsed().as_secs_f64();
        let t = Instant::now();
        b(it)?;
        est_b = t.elapsed().as_secs_f64();
    }
    // Every rank must run the same number of calls: agree on the slowest estimate.
    let fit = |est: f64| -> Result<usize, Fail> {
        if o.max_time <= 0.0 {
            return Ok(o.iters);
        }
        let est = comm.allreduce_f64(est, fcclMax)?;
        Ok(if est > 0.0 { ((o.max_time / est) as usize).clamp(1, o.iters) } else { o.iters })
    };
    let (ia, ib) = (fit(est_a)?, fit(est_b)?);
    let mut p = Paired { a: Vec::with_capacity(o.reps), b: Vec::with_capacity(o.reps) };
    for rep in 0..o.reps {
        let order = if rep % 2 == 0 { [true, false] } else { [false, true] };
        for first_side in order {
            let (f, iters) = if first_side { (a, ia) } else { (b, ib) };
            comm.barrier()?;
            let t0 = Instant::now();
            for it in 0..iters {
                f(it)?;
            }
            let t = combine(comm, o, t0.elapsed().as_secs_f64() / iters as f64)?;
            if first_side {
                p.a.push(t);
            } else {
                p.b.push(t);
            }
        }
    }
    Ok(p)
}

/// 1024 -> "1 KiB", 3000 -> "3000 B".
fn human(b: usize) -> String {
    for (s, u) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if b >= 1 << s && b % (1 << s) == 0 {
            return format!("{} {u}", b >> s);
        }
    }
    format!("{b} B")
}

fn ratio_cols(r: Option<(f64, f64, f64)>) -> (String, String) {
    match r {
        Some((m, lo, hi)) => (format!("{m:.2}x"), format!("{lo:.2}x-{hi:.2}x")),
        None => ("N/A".into(), "N/A".into()),
    }
}

fn wrong_col(w: Option<u64>) -> String {
    w.map_or_else(|| "N/A".into(), |w| w.to_string())
}

/// --compare-coalesced. Returns the number of sizes and calls with wrong results.
pub fn coalesced(ctx: &mut Ctx) -> Result<usize, Fail> {
    let (o, comm) = (ctx.o, ctx.comm);
    let n = comm.nranks;
    let rank0 = comm.rank == 0;
    let coll = Collective::AllReduceCoalesced;
    let esize = o.ty.size();
    let buf_bytes = max_buf_bytes(o, &[coll], n);
    let send = Buf::host(buf_bytes)?;
    let recv = Buf::host(buf_bytes)?;
    let bucket = if o.ext.bucket == 0 { "library default".to_string() } else { format!("{} B", o.ext.bucket) };
    if rank0 {
        ctx.progress.clear();
        let mut s = String::new();
        let _ = writeln!(s, "#");
        let _ = writeln!(
            s,
            "# Compare: fcclAllReduceCoalesced over B buffers vs B separate fcclAllReduce calls (same buffers, \
             out of place), {} {}, bucket {bucket}",
            o.ty.name(),
            o.op.name()
        );
        let _ = writeln!(
            s,
            "# times per set of B buffers; median of {} alternating repetitions; speed-up = separate/coalesced \
             within a repetition (median, range)",
            o.reps
        );
        let _ = writeln!(
            s,
            "# {:>10}  {:>12}  {:>8}  {:>8}  {:>10}  {:>10}  {:>8}  {:>15}  {:>6}",
            "size", "count", "buffers", "buffer", "coalesced", "separate", "speed-up", "range", "#wrong"
        );
        let _ = writeln!(
            s,
            "# {:>10}  {:>12}  {:>8}  {:>8}  {:>10}  {:>10}  {:>8}  {:>15}  {:>6}",
            "(B)", "(elements)", "", "(B)", "(us)", "(us)", "", "", ""
        );
        out(&s);
    }
    let mut failed = 0;
    let mut summary = String::new();
    let sizes = o.sizes();
    for (i, &size) in sizes.iter().enumerate() {
        ctx.progress.update(&format!("compare coalesced {size} B ({}/{})", i + 1, sizes.len()));
        let count = (size / esize as u64) as usize;
        let case = Case::new(comm, coll, o.ty, o.op, 0, count, send.ptr, recv.ptr, buf_bytes, o.rotate, o.ext);
        let (nb, each) = case.coalesced();
        let wrong = check_both(
            ctx,
            o.check,
            &mut failed,
            (&case, "all_reduce_coalesced", &|it| case.run(it, false)),
            (&case, "all_reduce per buffer", &|it| case.run_separate(it, false)),
        )?;
        case.fill(0, false)?;
        let p = alternate(ctx, &|it| case.run(it, false), &|it| case.run_separate(it, false))?;
        let (tc, ts) = (median(&p.a), median(&p.b));
        let r = p.ratio();
        let (ratio, range) = ratio_cols(r);
        if rank0 {
            ctx.progress.clear();
            out(&format!(
                "{:>12}  {:>12}  {:>8}  {:>8}  {:>10}  {:>10}  {:>8}  {:>15}  {:>6}\n",
                case.layout.size_bytes(esize),
                case.layout.param,
                nb,
                each * esize,
                fmt_time(tc * 1e6).trim(),
                fmt_time(ts * 1e6).trim(),
                ratio,
                range,
                wrong_col(wrong)
            ));
            if let Some((m, lo, hi)) = r {
                let _ = writeln!(
                    summary,
                    "# Coalesced speed-up: {nb} buffers of {} ({} {}, {n} ranks): {m:.2}x over {nb} separate \
                     fcclAllReduce calls ({} us vs {} us; median of {} alternating repetitions, range \
                     {lo:.2}x-{hi:.2}x)",
                    human(each * esize),
                    o.ty.name(),
                    o.op.name(),
                    fmt_g(tc * 1e6),
                    fmt_g(ts * 1e6),
                    o.reps
                );
            }
        }
    }
    if rank0 {
        out(&summary);
    }
    Ok(failed)
}

/// --compare-wire. Returns the number of sizes and calls with wrong results.
pub fn wire(ctx: &mut Ctx) -> Result<usize, Fail> {
    let (o, comm) = (ctx.o, ctx.comm);
    let n = comm.nranks;
    let rank0 = comm.rank == 0;
    let esize = o.ty.size();
    let wire = o.ext.wire;
    let buf_bytes = max_buf_bytes(o, &[Collective::AllReduce, Collective::AllReduceWire], n);
    let send = Buf::host(buf_bytes)?;
    let recv = Buf::host(buf_bytes)?;
    let factor = Collective::AllReduce.bus_factor(n);
    if rank0 {
        ctx.progress.clear();
        let mut s = String::new();
        let _ = writeln!(s, "#");
        let _ = writeln!(
            s,
            "# Compare: fcclAllReduceWire ({} data over a {} wire) vs fcclAllReduce ({}), {}, same data, out of place",
            o.ty.name(),
            wire.name(),
            o.ty.name(),
            o.op.name()
        );
        let _ = writeln!(
            s,
            "# busbw = count*{esize} B / time * 2(n-1)/n for both; median of {} alternating repetitions; \
             gain = plain time / wire time within a repetition (median, range)",
            o.reps
        );
        let _ = writeln!(
            s,
            "# {:>10}  {:>12}  {:>8}  {:>8}  {:>9}  {:>8}  {:>9}  {:>8}  {:>7}  {:>13}  {:>6}",
            "size", "count", "type", "wire", "plain", "plain", "wire", "wire", "gain", "range", "#wrong"
        );
        let _ = writeln!(
            s,
            "# {:>10}  {:>12}  {:>8}  {:>8}  {:>9}  {:>8}  {:>9}  {:>8}  {:>7}  {:>13}  {:>6}",
            "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(us)", "(GB/s)", "", "", ""
        );
        out(&s);
    }
    let mut failed = 0;
    let mut summary = String::new();
    let sizes = o.sizes();
    for (i, &size) in sizes.iter().enumerate() {
        ctx.progress.update(&format!("compare wire {size} B ({}/{})", i + 1, sizes.len()));
        let count = (size / esize as u64) as usize;
        let mk = |c| Case::new(comm, c, o.ty, o.op, 0, count, send.ptr, recv.ptr, buf_bytes, o.rotate, o.ext);
        let wcase = mk(Collective::AllReduceWire);
        let mut pcase = mk(Collective::AllReduce);
        // The same inputs for both: exact in the wire type.
        pcase.exact_in = Some(wire);
        let wrong = check_both(
            ctx,
            o.check,
            &mut failed,
            (&wcase, "all_reduce_wire", &|it| wcase.run(it, false)),
            (&pcase, "all_reduce", &|it| pcase.run(it, false)),
        )?;
        wcase.fill(0, false)?;
        let p = alternate(ctx, &|it| wcase.run(it, false), &|it| pcase.run(it, false))?;
        let (tw, tp) = (median(&p.a), median(&p.b));
        let bytes = (count * esize) as f64;
        let busbw = |t: f64| if t > 0.0 { bytes / t / 1e9 * factor } else { 0.0 };
        let r = p.ratio();
        let (ratio, range) = ratio_cols(r);
        if rank0 {
            ctx.progress.clear();
            out(&format!(
                "{:>12}  {:>12}  {:>8}  {:>8}  {:>9}  {:>8.2}  {:>9}  {:>8.2}  {:>7}  {:>13}  {:>6}\n",
                count * esize,
                count,
                o.ty.name(),
                wire.name(),
                fmt_time(tp * 1e6).trim(),
                busbw(tp),
                fmt_time(tw * 1e6).trim(),
                busbw(tw),
                ratio,
                range,
                wrong_col(wrong)
            ));
            if let Some((m, lo, hi)) = r {
                let _ = writeln!(
                    summary,
                    "# Wire gain at {}: {} over {} {:.2} GB/s vs {} {:.2} GB/s busbw: {m:.2}x (median of {} \
                     alternating repetitions, range {lo:.2}x-{hi:.2}x)",
                    human(count * esize),
                    o.ty.name(),
                    wire.name(),
                    busbw(tw),
                    o.ty.name(),
                    busbw(tp),
                    o.reps
                );
            }
        }
    }
    if rank0 {
        out(&summary);
    }
    Ok(failed)
}

/// The end of a comparison's output.
pub fn footer(failed: usize, peak_rss_kib: u64) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Out of bounds values : {failed} {}", if failed > 0 { "FAILED" } else { "OK" });
    let _ = writeln!(s, "# Peak resident memory : {:.1} MiB (largest rank, VmHWM)", peak_rss_kib as f64 / 1024.0);
    let _ = writeln!(s, "#");
    s
}

/// One side of a checked comparison: the case, its name, and how to run iteration `it`.
type CheckedSide<'a> = (&'a Case<'a>, &'a str, Side<'a>);

/// Checks the results of both sides of a comparison (None when checking is off),
/// counting each side with wrong elements in `failed`.
fn check_both(
    ctx: &Ctx,
    check: usize,
    failed: &mut usize,
    a: CheckedSide<'_>,
    b: CheckedSide<'_>,
) -> Result<Option<u64>, Fail> {
    if check == 0 {
        return Ok(None);
    }
    let wa = check_results(ctx, a.0, false, a.1, a.2)?;
    let wb = check_results(ctx, b.0, false, b.1, b.2)?;
    *failed += usize::from(wa > 0) + usize::from(wb > 0);
    Ok(Some(wa + wb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        let p = Paired { a: vec![1.0, 2.0, 0.0, 1.0], b: vec![3.0, 2.0, 5.0, 2.0] };
        assert_eq!(p.ratios(), vec![3.0, 1.0, 2.0]);
        assert_eq!(p.ratio(), Some((2.0, 1.0, 3.0)));
        assert_eq!(human(1024), "1 KiB");
        assert_eq!(human(3000), "3000 B");
    }
}
