//! Rank 0's report of a finished soak: the counts of the calls, each rank's resources,
//! the verdict, as text and JSON.

use super::call::{all_colls, Call, Kind};
use super::res::{grow, RankRec, Res};
use super::{LIBRARY_POOL_MIB, RSS_BOUND_MIB, RSS_SLACK_MIB, RSS_STEPS, STAGING_POOL_MIB};
use crate::coll::Collective;
use crate::data::{Op, Ty};
use crate::hostname;
use crate::opts::{Mem, Opts, DEFAULT_SOAK_MAX_BYTES};
use crate::report::{to_json, JsonHead, JsonRank, RankInfo};
use serde::ser::SerializeMap;
use serde::Serialize;
use std::fmt::Write as _;

/// Counts of the calls, the same on every rank (they follow the seed).
pub struct Tally {
    pub colls: Vec<u64>,
    pub types: [u64; 12],
    pub ops: [u64; 5],
    pub inplace: u64,
    pub zero: u64,
    pub idle: u64,
    pub unchecked: u64,
    /// By the size column: 0, up to 4 KiB, 64 KiB, 1 MiB, more.
    pub sizes: [u64; 5],
}

pub const SIZE_CLASSES: [&str; 5] = ["0 B", "1 B-4 KiB", "4-64 KiB", "64 KiB-1 MiB", "over 1 MiB"];

impl Tally {
    pub fn add(&mut self, c: &Call, n: usize, colls: &[Collective]) {
        if let Some(k) = colls.iter().position(|x| *x == c.coll) {
            self.colls[k] += 1;
        }
        if let Some(k) = Ty::ALL.iter().position(|t| *t == c.ty) {
            self.types[k] += 1;
        }
        if c.coll.reduces() {
            if let Some(k) = Op::ALL.iter().position(|o| *o == c.op) {
                self.ops[k] += 1;
            }
        }
        self.inplace += u64::from(c.inplace);
        let l = c.coll.layout(c.count, n, &c.x);
        self.zero += u64::from(l.param == 0);
        self.idle += u64::from(!c.idle.is_empty());
        self.unchecked += u64::from(c.inplace && !c.coll.inplace_checked());
        let b = l.size_bytes(c.ty.size());
        let class = match b {
            0 => 0,
            1..=4096 => 1,
            4097..=65536 => 2,
            65537..=1048576 => 3,
            _ => 4,
        };
        self.sizes[class] += 1;
    }
}

/// The command line that replays this soak.
pub fn replay(o: &Opts, n: usize, seed: u64) -> String {
    let mut s = String::from("ferroccl-bench");
    let all = all_colls();
    if o.colls != all {
        for c in &o.colls {
            let _ = write!(s, " {}", c.name());
        }
    }
    let _ = write!(s, " --soak {} --seed {seed} --nranks {n}", o.soak.unwrap_or(0));
    if o.soak_first > 0 {
        let _ = write!(s, " --soak-first {}", o.soak_first);
    }
    if o.max_bytes != DEFAULT_SOAK_MAX_BYTES {
        let _ = write!(s, " -e {}", o.max_bytes);
    }
    if o.mem == Mem::Cuda {
        s.push_str(" --mem cuda");
    }
    s
}

/// Rank 0's report of a finished soak.
pub struct Summary<'a> {
    pub o: &'a Opts,
    pub n: usize,
    pub seed: u64,
    pub total: u64,
    pub first: u64,
    pub warm: u64,
    pub secs: f64,
    pub tally: &'a Tally,
    pub recs: &'a [RankRec],
    pub order: &'a [Collective],
}

impl Summary<'_> {
    /// The names the per-category counts are listed by: collectives in this run's
    /// order, types, ops, buffer kinds.
    pub fn names(&self) -> [Vec<&'static str>; 4] {
        [
            self.order.iter().map(|c| c.name()).collect(),
            Ty::ALL.iter().map(|t| t.name()).collect(),
            Op::ALL.iter().map(|o| o.name()).collect(),
            Kind::ALL.iter().map(|k| k.name()).collect(),
        ]
    }

    /// Buffers the calls used, by kind, summed over ranks.
    pub fn kinds(&self) -> [u64; 3] {
        std::array::from_fn(|k| self.recs.iter().map(|r| r.kinds[k]).sum())
    }
    pub fn wrong(&self) -> u64 {
        self.recs.iter().map(|r| r.wrong).sum()
    }
    /// Most RSS growth over ranks, KiB.
    pub fn rss_growth(&self) -> i64 {
        self.recs.iter().map(|r| r.rss_growth_kib()).max().unwrap_or(0)
    }
    /// Why the soak failed; empty when it passed.
    pub fn failures(&self) -> Vec<&'static str> {
        let mut why = Vec::new();
        if self.wrong() > 0 {
            why.push("wrong results");
        }
        if self.recs.iter().any(|r| r.leaks()) {
            why.push("descriptors, threads or shared memory grew");
        }
        if self.rss_growth() > (RSS_BOUND_MIB * 1024) as i64 {
            why.push("resident memory grew beyond the bound");
        }
        why
    }
    pub fn rate(&self) -> f64 {
        if self.secs > 0.0 {
            self.total as f64 / self.secs
        } else {
            0.0
        }
    }
    /// Most growth over ranks from the middle step to the end, KiB.
    pub fn last_half(&self, f: impl Fn(&RankRec) -> &[u64; RSS_STEPS]) -> i64 {
        self.recs.iter().map(|r| grow(f(r)[RSS_STEPS / 2 - 1], f(r)[RSS_STEPS - 1])).max().unwrap_or(0)
    }
    pub fn max_growth(&self, f: impl Fn(&Res) -> u64) -> i64 {
        self.recs.iter().map(|r| grow(f(&r.start), f(&r.end))).max().unwrap_or(0)
    }

    pub fn text(&self) -> String {
        let (t, recs) = (self.tally, self.recs);
        let mut s = String::new();
        let list = |names: &[&str], counts: &[u64]| -> String {
            let v: Vec<String> =
                names.iter().zip(counts).filter(|(_, c)| **c > 0).map(|(n, c)| format!("{n} {c}")).collect();
            if v.is_empty() {
                "none".into()
            } else {
                v.join(", ")
            }
        };
        let [cn, tn, on, kn] = self.names();
        let kinds = self.kinds();
        let wrong = self.wrong();
        let _ = writeln!(s, "#");
        let _ = writeln!(s, "# Calls per collective : {}", list(&cn, &t.colls));
        let _ = writeln!(s, "# Calls per type       : {}", list(&tn, &t.types));
        let _ = writeln!(s, "# Reductions per op    : {}", list(&on, &t.ops));
        let _ = writeln!(s, "# Calls per size       : {}", list(&SIZE_CLASSES, &t.sizes));
        let _ = writeln!(
            s,
            "# Calls                : {} in place, {} of count 0, {} with idle ranks, {} unchecked (in-place all_to_allv)",
            t.inplace, t.zero, t.idle, t.unchecked
        );
        let allocs: u64 = recs.iter().map(|r| r.allocations).sum();
        let _ = writeln!(s, "# Buffers (all ranks)  : {}; {allocs} allocations", list(&kn, &kinds));
        let _ =
            writeln!(s, "# Resources per rank, after {} warm-up calls -> at the end (soak buffers freed):", self.warm);
        let _ = writeln!(
            s,
            "#  {:>4}  {:>14}  {:>14}  {:>14}  {:>14}  {:>16}  {:>24}",
            "rank", "fds", "memfds", "shm files", "threads", "maps", "RSS (MiB)"
        );
        let pair = |a: u64, b: u64| format!("{a}->{b} ({:+})", grow(a, b));
        for (r, x) in recs.iter().enumerate() {
            let (a, b) = (x.start, x.end);
            let _ = writeln!(
                s,
                "#  {r:>4}  {:>14}  {:>14}  {:>14}  {:>14}  {:>16}  {:>24}",
                pair(a.fds, b.fds),
                pair(a.memfds, b.memfds),
                pair(a.shm, b.shm),
                pair(a.threads, b.threads),
                pair(a.maps, b.maps),
                format!(
                    "{:.1}->{:.1} ({:+.1})",
                    a.rss_kib as f64 / 1024.0,
                    b.rss_kib as f64 / 1024.0,
                    x.rss_growth_kib() as f64 / 1024.0
                )
            );
        }
        let _ = writeln!(s, "# RSS / malloc in use (MiB) at each tenth of the calls after the warm-up, per rank:");
        for (r, x) in recs.iter().enumerate() {
            let v: Vec<String> = x
                .rss_steps
                .iter()
                .zip(x.heap_steps)
                .map(|(a, b)| format!("{:.1}/{:.1}", *a as f64 / 1024.0, b as f64 / 1024.0))
                .collect();
            let _ = writeln!(s, "#  {r:>4}  {}", v.join(" "));
        }
        let rss = self.rss_growth();
        let _ = writeln!(
            s,
            "# Max growth           : fds {:+}, memfds {:+}, shm files {:+}, threads {:+}, maps {:+} (not judged), \
             RSS {:+.1} MiB (bound {RSS_BOUND_MIB} MiB: the library's scratch pool may keep \
             {LIBRARY_POOL_MIB}, its staging pool {STAGING_POOL_MIB}, plus {RSS_SLACK_MIB})",
            self.max_growth(|r| r.fds),
            self.max_growth(|r| r.memfds),
            self.max_growth(|r| r.shm),
            self.max_growth(|r| r.threads),
            self.max_growth(|r| r.maps),
            rss as f64 / 1024.0
        );
        let _ = writeln!(
            s,
            "# Last half of the run : RSS {:+.1} MiB, malloc in use {:+.1} MiB (most over ranks)",
            self.last_half(|r| &r.rss_steps) as f64 / 1024.0,
            self.last_half(|r| &r.heap_steps) as f64 / 1024.0
        );
        let peak = recs.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0);
        let _ = writeln!(s, "# Peak resident memory : {:.1} MiB (largest rank, VmHWM)", peak as f64 / 1024.0);
        let wrong_calls: Vec<String> = recs.iter().map(|r| r.wrong_calls.to_string()).collect();
        let first_wrong = recs.iter().map(|r| r.first_wrong).min().unwrap_or(u64::MAX);
        let _ = writeln!(
            s,
            "# Wrong elements       : {wrong} {}{}",
            if wrong > 0 { "FAILED" } else { "OK" },
            if wrong > 0 {
                format!(" (calls with wrong results per rank: {}; first: call #{first_wrong})", wrong_calls.join(", "))
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            s,
            "# Rate                 : {:.1} calls/s ({} calls in {:.2} s, inputs and checks included)",
            self.rate(),
            self.total,
            self.secs
        );
        let why = self.failures();
        let verdict = if why.is_empty() { "OK".to_string() } else { format!("FAILED: {}", why.join(", ")) };
        let _ = writeln!(s, "# Soak                 : {verdict}");
        let _ = writeln!(s, "# Replay               : {}", replay(self.o, self.n, self.seed));
        if first_wrong != u64::MAX {
            let _ = writeln!(s, "# First wrong call     : add --soak-first {first_wrong} --soak 1 to replay it alone");
        }
        let _ = writeln!(s, "#");
        s
    }

    pub fn json(&self, version_code: i32, infos: &[RankInfo]) -> String {
        let (o, t, recs) = (self.o, self.tally, self.recs);
        let [cn, tn, on, kn] = self.names();
        let kinds = self.kinds();
        let host = hostname();
        let replay = replay(o, self.n, self.seed);
        let growth = |a: &Res, b: &Res| JsonGrowth {
            fds: grow(a.fds, b.fds),
            memfds: grow(a.memfds, b.memfds),
            shm_files: grow(a.shm, b.shm),
            threads: grow(a.threads, b.threads),
            maps: grow(a.maps, b.maps),
            rss_kib: grow(a.rss_kib, b.rss_kib),
            malloc_in_use_kib: Some(grow(a.heap_kib, b.heap_kib)),
        };
        let first_wrong = recs.iter().map(|r| r.first_wrong).min().unwrap_or(u64::MAX);
        to_json(&JsonSoak {
            head: JsonHead::new(Some("soak"), version_code, &host, crate::report::utc_now(), o, self.n),
            params: JsonSoakParams {
                calls: self.total,
                seed: self.seed,
                first_call: self.first,
                max_bytes: o.max_bytes,
                collectives: o.colls.iter().map(|c| c.name()).collect(),
                warmup_calls: self.warm,
                rss_bound_mib: RSS_BOUND_MIB,
            },
            replay: &replay,
            duration_s: self.secs,
            calls_per_s: self.rate(),
            calls_per_collective: Counts(&cn, &t.colls),
            calls_per_type: Counts(&tn, &t.types),
            reductions_per_op: Counts(&on, &t.ops),
            calls_per_size: Counts(&SIZE_CLASSES, &t.sizes),
            in_place: t.inplace,
            count_zero: t.zero,
            idle_rank_calls: t.idle,
            unchecked: t.unchecked,
            buffers: Counts(&kn, &kinds),
            allocations: recs.iter().map(|r| r.allocations).sum(),
            wrong: self.wrong(),
            wrong_calls: recs.iter().map(|r| r.wrong_calls).sum(),
            first_wrong_call: (first_wrong != u64::MAX).then_some(first_wrong),
            ranks: recs
                .iter()
                .enumerate()
                .map(|(r, x)| {
                    let info = infos.get(r);
                    JsonSoakRank {
                        rank: JsonRank {
                            rank: r,
                            pid: info.map_or(0, |i| i.pid),
                            host: info.map_or("", |i| i.host.as_str()),
                            device: info.map_or(-1, |i| i.device),
                            peak_rss_kib: x.peak_rss_kib,
                        },
                        wrong: x.wrong,
                        wrong_calls: x.wrong_calls,
                        allocations: x.allocations,
                        start: JsonRes::new(&x.start),
                        end: JsonRes::new(&x.end),
                        growth: growth(&x.start, &x.end),
                        rss_kib_steps: x.rss_steps,
                        malloc_in_use_kib_steps: x.heap_steps,
                    }
                })
                .collect(),
            max_growth: JsonGrowth {
                fds: self.max_growth(|r| r.fds),
                memfds: self.max_growth(|r| r.memfds),
                shm_files: self.max_growth(|r| r.shm),
                threads: self.max_growth(|r| r.threads),
                maps: self.max_growth(|r| r.maps),
                rss_kib: self.rss_growth(),
                malloc_in_use_kib: None,
            },
            last_half_growth: JsonLastHalf {
                rss_kib: self.last_half(|r| &r.rss_steps),
                malloc_in_use_kib: self.last_half(|r| &r.heap_steps),
            },
            ok: self.failures().is_empty(),
        })
    }
}

/// A soak's JSON (-J).
#[derive(Serialize)]
struct JsonSoak<'a> {
    #[serde(flatten)]
    head: JsonHead<'a>,
    params: JsonSoakParams,
    replay: &'a str,
    duration_s: f64,
    calls_per_s: f64,
    calls_per_collective: Counts<'a>,
    calls_per_type: Counts<'a>,
    reductions_per_op: Counts<'a>,
    calls_per_size: Counts<'a>,
    in_place: u64,
    count_zero: u64,
    idle_rank_calls: u64,
    unchecked: u64,
    buffers: Counts<'a>,
    allocations: u64,
    wrong: u64,
    wrong_calls: u64,
    first_wrong_call: Option<u64>,
    ranks: Vec<JsonSoakRank<'a>>,
    max_growth: JsonGrowth,
    last_half_growth: JsonLastHalf,
    ok: bool,
}

#[derive(Serialize)]
struct JsonSoakParams {
    calls: u64,
    seed: u64,
    first_call: u64,
    max_bytes: u64,
    collectives: Vec<&'static str>,
    warmup_calls: u64,
    rss_bound_mib: u64,
}

#[derive(Serialize)]
struct JsonSoakRank<'a> {
    #[serde(flatten)]
    rank: JsonRank<'a>,
    wrong: u64,
    wrong_calls: u64,
    allocations: u64,
    start: JsonRes,
    end: JsonRes,
    growth: JsonGrowth,
    rss_kib_steps: [u64; RSS_STEPS],
    malloc_in_use_kib_steps: [u64; RSS_STEPS],
}

/// One rank's resource counts.
#[derive(Serialize)]
struct JsonRes {
    fds: u64,
    memfds: u64,
    shm_files: u64,
    threads: u64,
    maps: u64,
    rss_kib: u64,
    malloc_in_use_kib: u64,
}

impl JsonRes {
    fn new(r: &Res) -> Self {
        JsonRes {
            fds: r.fds,
            memfds: r.memfds,
            shm_files: r.shm,
            threads: r.threads,
            maps: r.maps,
            rss_kib: r.rss_kib,
            malloc_in_use_kib: r.heap_kib,
        }
    }
}

/// Growth of the counts, end - start (max_growth has no malloc_in_use_kib).
#[derive(Serialize)]
struct JsonGrowth {
    fds: i64,
    memfds: i64,
    shm_files: i64,
    threads: i64,
    maps: i64,
    rss_kib: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    malloc_in_use_kib: Option<i64>,
}

#[derive(Serialize)]
struct JsonLastHalf {
    rss_kib: i64,
    malloc_in_use_kib: i64,
}

/// Counts by name, as a JSON object in the order of the names.
struct Counts<'a>(&'a [&'a str], &'a [u64]);

impl Serialize for Counts<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (n, c) in self.0.iter().zip(self.1) {
            m.serialize_entry(n, c)?;
        }
        m.end()
    }
}
