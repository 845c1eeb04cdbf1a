//! Results: the nccl-tests table, JSON and CSV.

use crate::opts::Opts;
use serde::Serialize;
use std::fmt::Write as _;

/// One size and placement of one collective.
#[derive(Clone, Debug)]
pub struct Record {
    pub collective: &'static str,
    pub nranks: usize,
    pub ty: &'static str,
    pub redop: &'static str,
    pub root: i64,
    pub size_bytes: u64,
    pub count: usize,
    /// "out" or "in".
    pub placement: &'static str,
    pub time_us: f64,
    /// Device memory: time the calling thread spent in a call (enqueueing it), combined
    /// across ranks as time_us; None on host memory, where a call returns when done.
    pub host_us: Option<f64>,
    pub algbw: f64,
    pub busbw: f64,
    /// Wrong elements over all ranks; None when not checked.
    pub wrong: Option<u64>,
    pub iters: usize,
    pub warmups: usize,
    /// What served the timed calls (fcclCommGetLastPath after the last one): every
    /// rank's (backend, algorithm), in rank order.
    pub paths: Vec<(String, String)>,
}

/// The backend of a row whose ranks reported different backends (a failed row).
pub const MIXED_RANKS: &str = "mixed(ranks)";

impl Record {
    /// The backend every rank reported, or [`MIXED_RANKS`] when they differ.
    pub fn backend(&self) -> &str {
        match self.paths.first() {
            Some((b, _)) if self.paths.iter().all(|(o, _)| o == b) => b,
            Some(_) => MIXED_RANKS,
            None => "none",
        }
    }

    /// Rank 0's algorithm: the rank that moves the data where ranks differ.
    pub fn algorithm(&self) -> &str {
        self.paths.first().map_or("none", |(_, a)| a)
    }

    /// Ranks disagreed on the backend.
    pub fn mixed(&self) -> bool {
        self.backend() == MIXED_RANKS
    }
}

/// Facts about one rank.
#[derive(Clone, Debug)]
pub struct RankInfo {
    pub pid: u32,
    pub host: String,
    pub peak_rss_kib: u64,
    /// The communicator's CUDA device (fcclCommCuDevice), -1 for host memory.
    pub device: i32,
}

/// Everything the outputs need besides the records.
pub struct RunInfo<'a> {
    pub opts: &'a Opts,
    pub nranks: usize,
    pub version_code: i32,
    pub host: String,
    pub date: String,
    pub ranks: Vec<RankInfo>,
    pub duration_s: f64,
}

/// nccl-tests' time column: 7 wide, fewer decimals for longer times.
pub fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

/// C's `%g` (6 significant digits, trailing zeros removed) for positive values.
pub fn fmt_g(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let exp = v.abs().log10().floor() as i32;
    if !(-5..6).contains(&exp) {
        return format!("{v:.5e}");
    }
    let decimals = (5 - exp).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

pub fn header_lines(o: &Opts, nranks: usize, version_code: i32, ranks: &[RankInfo]) -> String {
    let mut s = version_line(o, version_code);
    let step =
        if o.step_factor > 1 { format!("{}(factor)", o.step_factor) } else { format!("{}(bytes)", o.step_bytes) };
    let _ = writeln!(
        s,
        "# nRanks {nranks} minBytes {} maxBytes {} step: {step} warmup iters: {} iters: {} max time: {} s rotate: {} validation: {} average: {}({})",
        o.min_bytes,
        o.max_bytes,
        o.warmup,
        o.iters,
        o.max_time,
        u8::from(o.rotate),
        o.check,
        o.average as u8,
        o.average.name()
    );
    s.push_str(&rank_lines(o, ranks));
    s
}

/// The first header line: benchmark, library and memory kind.
pub fn version_line(o: &Opts, version_code: i32) -> String {
    format!(
        "# ferroccl-bench {}: libferroccl {} (fcclGetVersion {}), {} memory\n",
        env!("CARGO_PKG_VERSION"),
        crate::comm::version_string(version_code),
        version_code,
        o.mem.name()
    )
}

/// The "Using ranks" block of the header.
pub fn rank_lines(o: &Opts, ranks: &[RankInfo]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "#");
    let _ = writeln!(s, "# Using ranks");
    for (r, i) in ranks.iter().enumerate() {
        let dev = if i.device >= 0 { format!(" device {}", i.device) } else { String::new() };
        let _ = writeln!(s, "#  Rank {r:2} Pid {:6} on {:>10} memory {}{dev}", i.pid, i.host, o.mem.name());
    }
    s
}

/// The header of one collective's table; `note` (a comment line) follows its name.
pub fn table_header(collective: &str, note: Option<&str>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "#");
    let _ = writeln!(s, "# Collective: {collective}");
    if let Some(note) = note {
        let _ = writeln!(s, "{note}");
    }
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          {:^29}{:^29}",
        "", "", "", "", "", "out-of-place path", "in-place path"
    );
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}{}{}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        path_cols("backend", "algorithm"),
        path_cols("backend", "algorithm")
    );
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>5}  {:>7}  {:>6}  {:>6}  {:>5}",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
    s
}

/// A placement's columns; N/A in each where the collective has no such placement.
fn placement_cols(r: Option<&Record>) -> String {
    match r {
        Some(r) => {
            let wrong = r.wrong.map_or_else(|| "N/A".to_string(), |w| w.to_string());
            format!("  {}  {:6.2}  {:6.2}  {:>5}", fmt_time(r.time_us), r.algbw, r.busbw, wrong)
        }
        None => format!("  {:>7}  {:>6}  {:>6}  {:>5}", "N/A", "N/A", "N/A", "N/A"),
    }
}

/// A placement's backend and algorithm columns (never empty: the table splits on blanks).
fn path_cols(backend: &str, algorithm: &str) -> String {
    let word = |s: &str| if s.is_empty() { "-".to_string() } else { s.to_string() };
    format!("  {:>7}  {:>18}", word(backend), word(algorithm))
}

/// One table row: the out-of-place and in-place records of one size (at least one).
pub fn row(out: Option<&Record>, inp: Option<&Record>) -> String {
    let Some(r) = out.or(inp) else { return String::new() };
    let path =
        |r: Option<&Record>| r.map_or_else(|| path_cols("N/A", "N/A"), |r| path_cols(r.backend(), r.algorithm()));
    format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{}{}{}{}",
        r.size_bytes,
        r.count,
        r.ty,
        r.redop,
        r.root,
        placement_cols(out),
        placement_cols(inp),
        path(out),
        path(inp)
    )
}

/// A comment line naming each rank's backend where the ranks of a row disagreed.
pub fn mixed_note(r: &Record) -> Option<String> {
    if !r.mixed() {
        return None;
    }
    let each: Vec<String> = r.paths.iter().enumerate().map(|(k, (b, a))| format!("rank {k} {b}/{a}")).collect();
    Some(format!(
        "# {} B {}: ranks disagree on the backend (a failure): {}",
        r.size_bytes,
        if r.placement == "in" { "in-place" } else { "out-of-place" },
        each.join(", ")
    ))
}

/// With device memory: a comment line under a table naming the sizes that staged or
/// host calls served (not the device path). Calls of 0 elements move nothing and are
/// served on the host whatever the memory, so they are left out.
pub fn device_path_note(records: &[Record]) -> Option<String> {
    let missed: Vec<&Record> =
        records.iter().filter(|r| r.count > 0 && matches!(r.backend(), "staged" | "host")).collect();
    if missed.is_empty() {
        return None;
    }
    let mut sizes: Vec<String> = missed.iter().map(|r| format!("{} B", r.size_bytes)).collect();
    sizes.dedup();
    // A sweep of 24 sizes staged whole reads better as one word than as a list.
    let moving = records.iter().filter(|r| r.count > 0).count();
    let which = if missed.len() == moving && sizes.len() > 1 { "any size".to_string() } else { sizes.join(", ") };
    let mut by: Vec<&str> = missed.iter().map(|r| r.backend()).collect();
    by.sort_unstable();
    by.dedup();
    Some(format!(
        "# the device path did not serve {which}: {} served {} of {} measurements; rerun with FERROCCL_DEBUG=WARN to see why",
        by.join(" and "),
        missed.len(),
        records.len()
    ))
}

/// Sizes and placements with wrong elements (nccl-tests' "Out of bounds values").
pub fn failures(records: &[Record]) -> usize {
    records.iter().filter(|r| r.wrong.is_some_and(|w| w > 0)).count()
}

/// Sizes and placements whose ranks disagreed on the backend (mixed(ranks)): failures too.
pub fn mixed(records: &[Record]) -> usize {
    records.iter().filter(|r| r.mixed()).count()
}

pub fn avg_busbw(records: &[Record]) -> f64 {
    if records.is_empty() {
        return 0.0;
    }
    records.iter().map(|r| r.busbw).sum::<f64>() / records.len() as f64
}

pub fn footer(records: &[Record], peak_rss_kib: u64) -> String {
    let mut s = String::new();
    let f = failures(records);
    let _ = writeln!(s, "# Out of bounds values : {f} {}", if f > 0 { "FAILED" } else { "OK" });
    let m = mixed(records);
    let _ = writeln!(s, "# Backend mixed(ranks) : {m} {}", if m > 0 { "FAILED" } else { "OK" });
    let _ = writeln!(s, "# Avg bus bandwidth    : {} ", fmt_g(avg_busbw(records)));
    let _ = writeln!(s, "# Peak resident memory : {:.1} MiB (largest rank, VmHWM)", peak_rss_kib as f64 / 1024.0);
    let _ = writeln!(s, "#");
    s
}

/// The fields every JSON output starts with (sweep and soak).
#[derive(Serialize)]
pub struct JsonHead<'a> {
    pub tool: &'static str,
    /// "soak" for a soak; absent for a sweep.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    pub tool_version: &'static str,
    pub library_version: String,
    pub library_version_code: i32,
    pub host: &'a str,
    pub date: String,
    pub mem: &'static str,
    pub nranks: usize,
}

impl<'a> JsonHead<'a> {
    pub fn new(
        mode: Option<&'static str>,
        version_code: i32,
        host: &'a str,
        date: String,
        o: &Opts,
        nranks: usize,
    ) -> Self {
        JsonHead {
            tool: "ferroccl-bench",
            mode,
            tool_version: env!("CARGO_PKG_VERSION"),
            library_version: crate::comm::version_string(version_code),
            library_version_code: version_code,
            host,
            date,
            mem: o.mem.name(),
            nranks,
        }
    }
}

/// One rank in the JSON outputs' "ranks".
#[derive(Serialize)]
pub struct JsonRank<'a> {
    pub rank: usize,
    pub pid: u32,
    pub host: &'a str,
    pub device: i32,
    pub peak_rss_kib: u64,
}

/// A sweep's JSON (-J). Non-finite numbers are written as null (serde_json's rule:
/// JSON has no NaN or infinity).
#[derive(Serialize)]
struct JsonRun<'a> {
    #[serde(flatten)]
    head: JsonHead<'a>,
    params: JsonParams<'a>,
    ranks: Vec<JsonRank<'a>>,
    peak_rss_kib: u64,
    out_of_bounds: usize,
    backend_mixed_ranks: usize,
    #[serde(rename = "avg_busbw_GBps")]
    avg_busbw_gbps: f64,
    duration_s: f64,
    results: Vec<JsonRecord<'a>>,
}

#[derive(Serialize)]
struct JsonParams<'a> {
    collectives: Vec<&'static str>,
    min_bytes: u64,
    max_bytes: u64,
    step_factor: u64,
    step_bytes: u64,
    iters: usize,
    warmup_iters: usize,
    check_iters: usize,
    datatype: &'static str,
    op: &'static str,
    root: i64,
    average: u8,
    max_time_s: f64,
    rotate: bool,
    axis: usize,
    nbuffers: usize,
    bucket_bytes: usize,
    wire: &'a str,
}

/// One record of the JSON's results.
#[derive(Serialize)]
struct JsonRecord<'a> {
    collective: &'a str,
    nranks: usize,
    #[serde(rename = "type")]
    ty: &'a str,
    redop: &'a str,
    root: i64,
    size_bytes: u64,
    count: usize,
    placement: &'a str,
    time_us: f64,
    host_us: Option<f64>,
    #[serde(rename = "algbw_GBps")]
    algbw_gbps: f64,
    #[serde(rename = "busbw_GBps")]
    busbw_gbps: f64,
    wrong: Option<u64>,
    iters: usize,
    warmup_iters: usize,
    backend: &'a str,
    algorithm: &'a str,
    algorithms_by_rank: Vec<&'a str>,
    backends_by_rank: Vec<&'a str>,
}

impl<'a> JsonRecord<'a> {
    fn new(r: &'a Record) -> Self {
        JsonRecord {
            collective: r.collective,
            nranks: r.nranks,
            ty: r.ty,
            redop: r.redop,
            root: r.root,
            size_bytes: r.size_bytes,
            count: r.count,
            placement: r.placement,
            time_us: r.time_us,
            host_us: r.host_us,
            algbw_gbps: r.algbw,
            busbw_gbps: r.busbw,
            wrong: r.wrong,
            iters: r.iters,
            warmup_iters: r.warmups,
            backend: r.backend(),
            algorithm: r.algorithm(),
            algorithms_by_rank: r.paths.iter().map(|p| p.1.as_str()).collect(),
            backends_by_rank: r.paths.iter().map(|p| p.0.as_str()).collect(),
        }
    }
}

/// `v` as indented JSON with a final newline.
pub fn to_json<T: Serialize>(v: &T) -> String {
    // Serializing these plain structs cannot fail (no maps with non-string keys).
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

pub fn json(info: &RunInfo, records: &[Record]) -> String {
    let o = info.opts;
    to_json(&JsonRun {
        head: JsonHead::new(None, info.version_code, &info.host, info.date.clone(), o, info.nranks),
        params: JsonParams {
            collectives: o.colls.iter().map(|c| c.name()).collect(),
            min_bytes: o.min_bytes,
            max_bytes: o.max_bytes,
            step_factor: o.step_factor,
            step_bytes: o.step_bytes,
            iters: o.iters,
            warmup_iters: o.warmup,
            check_iters: o.check,
            datatype: o.ty.name(),
            op: o.op.name(),
            root: o.root,
            average: o.average as u8,
            max_time_s: o.max_time,
            rotate: o.rotate,
            axis: o.ext.axis,
            nbuffers: o.ext.nbuffers,
            bucket_bytes: o.ext.bucket,
            wire: o.ext.wire.name(),
        },
        ranks: info
            .ranks
            .iter()
            .enumerate()
            .map(|(r, i)| JsonRank {
                rank: r,
                pid: i.pid,
                host: &i.host,
                device: i.device,
                peak_rss_kib: i.peak_rss_kib,
            })
            .collect(),
        peak_rss_kib: info.ranks.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0),
        out_of_bounds: failures(records),
        backend_mixed_ranks: mixed(records),
        avg_busbw_gbps: avg_busbw(records),
        duration_s: info.duration_s,
        results: records.iter().map(JsonRecord::new).collect(),
    })
}

pub const CSV_HEADER: &str =
    "collective,nranks,type,redop,root,size_bytes,count,placement,time_us,algbw_GBps,busbw_GBps,wrong,host_us,backend,algorithm";

pub fn csv(records: &[Record]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{CSV_HEADER}");
    for r in records {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{:.3},{:.6},{:.6},{},{},{},{}",
            r.collective,
            r.nranks,
            r.ty,
            r.redop,
            r.root,
            r.size_bytes,
            r.count,
            r.placement,
            r.time_us,
            r.algbw,
            r.busbw,
            r.wrong.map_or_else(String::new, |w| w.to_string()),
            r.host_us.map_or_else(String::new, |h| format!("{h:.3}")),
            r.backend(),
            r.algorithm()
        );
    }
    s
}

/// UTC time as 2026-11-22T10:11:12Z, without a date crate.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(fmt_time(12.345), "  12.35");
        assert_eq!(fmt_time(123.45), "  123.5");
        assert_eq!(fmt_time(12345.6), "  12346");
        assert_eq!(fmt_g(1.234567), "1.23457");
        assert_eq!(fmt_g(12.5), "12.5");
        assert_eq!(fmt_g(0.0), "0");
        let d = utc_now();
        assert_eq!(d.len(), 20, "{d}");
        assert!(d.starts_with("20"));
    }

    fn rec(count: usize, placement: &'static str, paths: &[(&str, &str)]) -> Record {
        Record {
            collective: "all_reduce",
            nranks: paths.len(),
            ty: "float",
            redop: "sum",
            root: -1,
            size_bytes: count as u64 * 4,
            count,
            placement,
            time_us: 1.0,
            host_us: None,
            algbw: 0.0,
            busbw: 0.0,
            wrong: Some(0),
            iters: 1,
            warmups: 0,
            paths: paths.iter().map(|&(b, a)| (b.to_string(), a.to_string())).collect(),
        }
    }

    #[test]
    fn paths_agree_or_fail_the_row() {
        let agreed = rec(16, "out", &[("ipc", "exec-copy"), ("ipc", "signal-wait")]);
        assert_eq!((agreed.backend(), agreed.algorithm(), agreed.mixed()), ("ipc", "exec-copy", false));
        assert!(mixed_note(&agreed).is_none());
        let split = rec(16, "in", &[("ipc", "exec-copy"), ("staged", "board")]);
        assert_eq!((split.backend(), split.algorithm(), split.mixed()), (MIXED_RANKS, "exec-copy", true));
        assert_eq!(
            mixed_note(&split).as_deref(),
            Some(
                "# 64 B in-place: ranks disagree on the backend (a failure): rank 0 ipc/exec-copy, rank 1 staged/board"
            )
        );
        let recs = [agreed.clone(), split.clone()];
        assert_eq!((failures(&recs), mixed(&recs)), (0, 1));
        assert!(footer(&recs, 0).contains("# Backend mixed(ranks) : 1 FAILED"));
        let j: serde_json::Value = serde_json::to_value(JsonRecord::new(&split)).unwrap();
        assert_eq!(j["algorithms_by_rank"], serde_json::json!(["exec-copy", "board"]));
        assert_eq!(
            (&j["backend"], &j["host_us"], &j["type"]),
            (&serde_json::json!(MIXED_RANKS), &serde_json::Value::Null, &serde_json::json!("float"))
        );
        assert!(csv(&recs).lines().nth(2).unwrap().ends_with(",mixed(ranks),exec-copy"));
        // The row keeps the numeric columns where they were and adds four words.
        let row = row(Some(&agreed), Some(&split));
        let f: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(f.len(), 17, "{row}");
        assert_eq!(&f[13..], ["ipc", "exec-copy", MIXED_RANKS, "exec-copy"]);
        assert_eq!(row.find("ipc"), Some(116 + 2 + 7 - 3), "{row}");
        let only_in = super::row(None, Some(&agreed));
        assert_eq!(only_in.split_whitespace().skip(13).collect::<Vec<_>>(), ["N/A", "N/A", "ipc", "exec-copy"]);
        let head = table_header("all_reduce", None);
        let names: Vec<&str> = head.lines().nth(3).unwrap().split_whitespace().collect();
        assert_eq!(names.len(), 1 + 17, "{head}");
    }

    #[test]
    fn device_path_note_names_staged_and_host_sizes() {
        let ipc = rec(16, "out", &[("ipc", "exec-copy")]);
        assert!(device_path_note(std::slice::from_ref(&ipc)).is_none());
        // Nothing to move: served on the host whatever the memory, not a miss.
        assert!(device_path_note(&[ipc.clone(), rec(0, "out", &[("host", "board")])]).is_none());
        let recs = [ipc, rec(1024, "out", &[("staged", "board")]), rec(1024, "in", &[("host", "eager")])];
        assert_eq!(
            device_path_note(&recs).as_deref(),
            Some(
                "# the device path did not serve 4096 B: host and staged served 2 of 3 measurements; rerun with \
                 FERROCCL_DEBUG=WARN to see why"
            )
        );
        let all = [rec(4, "out", &[("staged", "board")]), rec(1024, "out", &[("staged", "schedule")])];
        assert!(device_path_note(&all)
            .unwrap()
            .starts_with("# the device path did not serve any size: staged served 2 of 2"));
    }
}
