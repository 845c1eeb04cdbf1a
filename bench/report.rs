//! Results: the nccl-tests table, JSON and CSV.

use crate::opts::Opts;
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

pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// A JSON number (finite; JSON has no NaN or infinity).
pub fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

pub fn json(info: &RunInfo, records: &[Record]) -> String {
    let o = info.opts;
    let mut s = String::new();
    let colls: Vec<String> = o.colls.iter().map(|c| esc(c.name())).collect();
    let peak = info.ranks.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0);
    let _ = writeln!(s, "{{");
    let _ = writeln!(s, "  \"tool\": \"ferroccl-bench\",");
    let _ = writeln!(s, "  \"tool_version\": {},", esc(env!("CARGO_PKG_VERSION")));
    let _ = writeln!(s, "  \"library_version\": {},", esc(&crate::comm::version_string(info.version_code)));
    let _ = writeln!(s, "  \"library_version_code\": {},", info.version_code);
    let _ = writeln!(s, "  \"host\": {},", esc(&info.host));
    let _ = writeln!(s, "  \"date\": {},", esc(&info.date));
    let _ = writeln!(s, "  \"mem\": {},", esc(o.mem.name()));
    let _ = writeln!(s, "  \"nranks\": {},", info.nranks);
    let _ = writeln!(s, "  \"params\": {{");
    let _ = writeln!(s, "    \"collectives\": [{}],", colls.join(", "));
    let _ = writeln!(s, "    \"min_bytes\": {},", o.min_bytes);
    let _ = writeln!(s, "    \"max_bytes\": {},", o.max_bytes);
    let _ = writeln!(s, "    \"step_factor\": {},", o.step_factor);
    let _ = writeln!(s, "    \"step_bytes\": {},", o.step_bytes);
    let _ = writeln!(s, "    \"iters\": {},", o.iters);
    let _ = writeln!(s, "    \"warmup_iters\": {},", o.warmup);
    let _ = writeln!(s, "    \"check_iters\": {},", o.check);
    let _ = writeln!(s, "    \"datatype\": {},", esc(o.ty.name()));
    let _ = writeln!(s, "    \"op\": {},", esc(o.op.name()));
    let _ = writeln!(s, "    \"root\": {},", o.root);
    let _ = writeln!(s, "    \"average\": {},", o.average as u8);
    let _ = writeln!(s, "    \"max_time_s\": {},", num(o.max_time));
    let _ = writeln!(s, "    \"rotate\": {},", o.rotate);
    let _ = writeln!(s, "    \"axis\": {},", o.ext.axis);
    let _ = writeln!(s, "    \"nbuffers\": {},", o.ext.nbuffers);
    let _ = writeln!(s, "    \"bucket_bytes\": {},", o.ext.bucket);
    let _ = writeln!(s, "    \"wire\": {}", esc(o.ext.wire.name()));
    let _ = writeln!(s, "  }},");
    let _ = writeln!(s, "  \"ranks\": [");
    for (r, i) in info.ranks.iter().enumerate() {
        let _ = writeln!(
            s,
            "    {{\"rank\": {r}, \"pid\": {}, \"host\": {}, \"device\": {}, \"peak_rss_kib\": {}}}{}",
            i.pid,
            esc(&i.host),
            i.device,
            i.peak_rss_kib,
            if r + 1 < info.ranks.len() { "," } else { "" }
        );
    }
    let _ = writeln!(s, "  ],");
    let _ = writeln!(s, "  \"peak_rss_kib\": {peak},");
    let _ = writeln!(s, "  \"out_of_bounds\": {},", failures(records));
    let _ = writeln!(s, "  \"backend_mixed_ranks\": {},", mixed(records));
    let _ = writeln!(s, "  \"avg_busbw_GBps\": {},", num(avg_busbw(records)));
    let _ = writeln!(s, "  \"duration_s\": {},", num(info.duration_s));
    let _ = writeln!(s, "  \"results\": [");
    for (i, r) in records.iter().enumerate() {
        let _ = writeln!(s, "    {}{}", json_record(r), if i + 1 < records.len() { "," } else { "" });
    }
    let _ = writeln!(s, "  ]");
    let _ = writeln!(s, "}}");
    s
}

/// One record of the JSON's results, on one line.
fn json_record(r: &Record) -> String {
    let list = |f: &dyn Fn(&(String, String)) -> &str| r.paths.iter().map(|p| esc(f(p))).collect::<Vec<_>>().join(", ");
    format!(
        "{{\"collective\": {}, \"nranks\": {}, \"type\": {}, \"redop\": {}, \"root\": {}, \"size_bytes\": {}, \"count\": {}, \"placement\": {}, \"time_us\": {}, \"host_us\": {}, \"algbw_GBps\": {}, \"busbw_GBps\": {}, \"wrong\": {}, \"iters\": {}, \"warmup_iters\": {}, \"backend\": {}, \"algorithm\": {}, \"algorithms_by_rank\": [{}], \"backends_by_rank\": [{}]}}",
        esc(r.collective),
        r.nranks,
        esc(r.ty),
        esc(r.redop),
        r.root,
        r.size_bytes,
        r.count,
        esc(r.placement),
        num(r.time_us),
        r.host_us.map_or_else(|| "null".to_string(), num),
        num(r.algbw),
        num(r.busbw),
        r.wrong.map_or_else(|| "null".to_string(), |w| w.to_string()),
        r.iters,
        r.warmups,
        esc(r.backend()),
        esc(r.algorithm()),
        list(&|p| &p.1),
        list(&|p| &p.0)
    )
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
        assert_eq!(esc("a\"b\\"), "\"a\\\"b\\\\\"");
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
        assert!(json_record(&split).contains("\"algorithms_by_rank\": [\"exec-copy\", \"board\"]"));
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
