//! ferroccl-bench end to end: short sweeps at 2 local ranks, the corruption test hook,
//! and the shape of the JSON, CSV and SVG outputs. No timing assertions.

use std::path::PathBuf;
use std::process::{Command, Output};

const BENCH: &str = env!("CARGO_BIN_EXE_ferroccl-bench");

fn bench(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BENCH);
    c.args(args);
    // A rank stuck in a library bug must fail the test, not hang it.
    c.env("FERROCCL_TIMEOUT_MS", "20000");
    for v in ["FERROCCL_RANK", "FERROCCL_WORLD_SIZE", "FERROCCL_UNIQUE_ID", "FERROCCL_ROOT_ADDR", "RANK", "WORLD_SIZE"]
    {
        c.env_remove(v);
    }
    c.env_remove("FERROCCL_BENCH_CORRUPT");
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().expect("run ferroccl-bench")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferroccl-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Table rows: (collective, fields) for every data line, collective taken from the
/// `# Collective:` line above it.
fn rows(stdout: &str) -> Vec<(String, Vec<String>)> {
    let mut coll = String::new();
    let mut out = Vec::new();
    for l in stdout.lines() {
        if let Some(c) = l.strip_prefix("# Collective: ") {
            coll = c.trim().to_string();
        } else if !l.starts_with('#') && !l.trim().is_empty() {
            let f: Vec<String> = l.split_whitespace().map(String::from).collect();
            assert_eq!(f.len(), 13, "table row with 13 columns: {l:?}");
            out.push((coll.clone(), f));
        }
    }
    out
}

const NOT_CHECKED_IN_PLACE: [&str; 3] = ["all_to_all", "all_to_allv", "send_recv"];

/// Asserts exit 0 and #wrong 0 (or N/A where in-place is not checked) on every row.
fn assert_all_right(o: &Output, colls: &[&str], nsizes: usize) {
    let (out, err) = text(o);
    assert_eq!(o.status.code(), Some(0), "exit 0 expected\nstdout:\n{out}\nstderr:\n{err}");
    let rows = rows(&out);
    assert_eq!(rows.len(), colls.len() * nsizes, "one row per collective and size:\n{out}");
    for (c, f) in &rows {
        assert!(colls.contains(&c.as_str()), "unexpected collective {c}");
        assert_eq!(f[8], "0", "{c} out-of-place #wrong: {f:?}");
        if NOT_CHECKED_IN_PLACE.contains(&c.as_str()) {
            assert_eq!(f[12], "N/A", "{c} in-place is not checked: {f:?}");
        } else {
            assert_eq!(f[12], "0", "{c} in-place #wrong: {f:?}");
        }
    }
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    assert!(out.contains("# Avg bus bandwidth"), "{out}");
    assert!(out.contains("# Peak resident memory"), "{out}");
}

#[test]
fn every_collective_is_right_at_2_ranks() {
    let o = bench(&["--nranks", "2", "all", "-b", "8", "-e", "256K", "-f", "8", "-n", "3", "-w", "1", "-r", "1"], &[]);
    let all = [
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "all_to_allv",
        "gather",
        "scatter",
        "send_recv",
    ];
    // 8, 64, 512, 4K, 32K, 256K
    assert_all_right(&o, &all, 6);
}

#[test]
fn narrow_types_and_ops_are_exact() {
    for (ty, op) in [("f8e5m2", "sum"), ("bfloat16", "prod"), ("half", "avg"), ("int8", "max"), ("uint64", "min")] {
        let o = bench(
            &[
                "--nranks",
                "3",
                "all_reduce",
                "reduce_scatter",
                "-b",
                "3",
                "-e",
                "48K",
                "-f",
                "16",
                "-n",
                "2",
                "-w",
                "1",
                "-d",
                ty,
                "-o",
                op,
            ],
            &[],
        );
        // 3, 48, 768, 12K (sizes round down to whole elements)
        assert_all_right(&o, &["all_reduce", "reduce_scatter"], 4);
        let (out, _) = text(&o);
        assert!(rows(&out).iter().all(|(_, f)| f[2] == ty && f[3] == op), "{out}");
    }
}

#[test]
fn corrupted_result_is_reported_and_fails_the_run() {
    let o = bench(
        &["--nranks", "2", "all_reduce", "all_gather", "-b", "64", "-e", "4K", "-f", "8", "-n", "2", "-w", "1"],
        &[("FERROCCL_BENCH_CORRUPT", "1")],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "wrong results exit 1\nstdout:\n{out}\nstderr:\n{err}");
    let rows = rows(&out);
    assert_eq!(rows.len(), 2 * 3, "{out}");
    // Every size and placement of both collectives failed.
    for (c, f) in &rows {
        for w in [&f[8], &f[12]] {
            let n: u64 = w.parse().unwrap_or_else(|_| panic!("{c}: #wrong {w:?} is a count"));
            assert!(n > 0, "{c}: the flipped element is counted: {f:?}");
        }
    }
    assert!(out.contains("# Out of bounds values : 12 FAILED"), "{out}");
    assert!(err.contains("wrong elements"), "{err}");
}

#[test]
fn json_csv_and_plot_have_their_shape() {
    let (j, c, p) = (tmp("r.json"), tmp("r.csv"), tmp("r.svg"));
    let colls = ["all_reduce", "broadcast", "all_to_allv"];
    let o = bench(
        &[
            "--nranks",
            "2",
            colls[0],
            colls[1],
            colls[2],
            "-b",
            "1K",
            "-e",
            "1M",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "1",
            "-J",
            j.to_str().unwrap(),
            "--csv",
            c.to_str().unwrap(),
            "--plot",
            p.to_str().unwrap(),
        ],
        &[],
    );
    let nsizes = 6; // 1K 4K 16K 64K 256K 1M
    assert_all_right(&o, &colls, nsizes);
    let records = colls.len() * nsizes * 2;

    let js = std::fs::read_to_string(&j).unwrap();
    let v = json::parse(&js).unwrap_or_else(|e| panic!("JSON does not parse: {e}\n{js}"));
    for key in ["library_version", "host", "date", "mem", "nranks", "params", "ranks", "peak_rss_kib", "results"] {
        assert!(v.get(key).is_some(), "JSON has {key}");
    }
    assert_eq!(v.get("nranks").unwrap().num(), Some(2.0));
    assert_eq!(v.get("mem").unwrap().str(), Some("host"));
    let res = v.get("results").unwrap().arr().unwrap();
    assert_eq!(res.len(), records, "one JSON record per size and placement");
    for r in res {
        for key in [
            "collective",
            "nranks",
            "type",
            "redop",
            "root",
            "size_bytes",
            "count",
            "placement",
            "time_us",
            "algbw_GBps",
            "busbw_GBps",
            "wrong",
        ] {
            assert!(r.get(key).is_some(), "record has {key}: {r:?}");
        }
    }
    assert_eq!(v.get("ranks").unwrap().arr().unwrap().len(), 2);

    let csv = std::fs::read_to_string(&c).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("collective,nranks,type,redop,root,size_bytes,count,placement,time_us,algbw_GBps,busbw_GBps,wrong")
    );
    let body: Vec<&str> = lines.collect();
    assert_eq!(body.len(), records, "one CSV row per size and placement");
    for l in &body {
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(f.len(), 12, "{l}");
        assert!(f[7] == "out" || f[7] == "in", "{l}");
        assert!(f[5].parse::<u64>().is_ok() && f[9].parse::<f64>().is_ok(), "{l}");
    }

    let svg = std::fs::read_to_string(&p).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), colls.len() * 2, "one polyline per collective and placement");
    for label in ["1K", "1M", "busbw"] {
        assert!(svg.contains(label), "SVG shows {label}");
    }
    let _ = std::fs::remove_dir_all(j.parent().unwrap());
}

#[test]
fn single_rank_without_a_launcher() {
    let o = bench(&["all_reduce", "all_gather", "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1"], &[]);
    assert_all_right(&o, &["all_reduce", "all_gather"], 4);
}

#[test]
fn bad_arguments_and_missing_cuda_exit_2() {
    for args in [&["-d", "float128"][..], &["-b", "1M", "-e", "1K"], &["no_such_collective"], &["-a", "7"]] {
        let o = bench(args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o).1);
    }
    let o = bench(&["--nranks", "2", "--mem", "cuda", "-b", "8", "-e", "8"], &[]);
    if o.status.code() != Some(0) {
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("CUDA not available"), "{err}");
    }
    let o = bench(&["--help"], &[]);
    assert_eq!(o.status.code(), Some(0));
    assert!(text(&o).0.contains("FERROCCL_BENCH_CORRUPT"));
}

/// Just enough JSON to check that the output parses and to look inside it.
mod json {
    #[derive(Debug)]
    pub enum V {
        Null,
        Bool,
        Num(f64),
        Str(String),
        Arr(Vec<V>),
        Obj(Vec<(String, V)>),
    }

    impl V {
        pub fn get(&self, k: &str) -> Option<&V> {
            match self {
                V::Obj(m) => m.iter().find(|(a, _)| a == k).map(|(_, v)| v),
                _ => None,
            }
        }
        pub fn arr(&self) -> Option<&[V]> {
            match self {
                V::Arr(a) => Some(a),
                _ => None,
            }
        }
        pub fn num(&self) -> Option<f64> {
            match self {
                V::Num(n) => Some(*n),
                _ => None,
            }
        }
        pub fn str(&self) -> Option<&str> {
            match self {
                V::Str(s) => Some(s),
                _ => None,
            }
        }
    }

    pub fn parse(s: &str) -> Result<V, String> {
        let b = s.as_bytes();
        let mut i = 0;
        let v = value(b, &mut i)?;
        ws(b, &mut i);
        if i != b.len() {
            return Err(format!("trailing text at byte {i}"));
        }
        Ok(v)
    }

    fn ws(b: &[u8], i: &mut usize) {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    }

    fn lit(b: &[u8], i: &mut usize, w: &str) -> Result<(), String> {
        if b[*i..].starts_with(w.as_bytes()) {
            *i += w.len();
            Ok(())
        } else {
            Err(format!("expected {w} at byte {i}"))
        }
    }

    fn string(b: &[u8], i: &mut usize) -> Result<String, String> {
        lit(b, i, "\"")?;
        let mut out = String::new();
        while *i < b.len() {
            let c = b[*i];
            *i += 1;
            match c {
                b'"' => return Ok(out),
                b'\\' => {
                    let e = *b.get(*i).ok_or("bad escape")?;
                    *i += 1;
                    match e {
                        b'"' | b'\\' | b'/' => out.push(e as char),
                        b'n' | b'r' | b't' | b'b' | b'f' => out.push(' '),
                        b'u' => {
                            let h =
                                std::str::from_utf8(b.get(*i..*i + 4).ok_or("bad \\u")?).map_err(|e| e.to_string())?;
                            u32::from_str_radix(h, 16).map_err(|e| e.to_string())?;
                            *i += 4;
                            out.push('?');
                        }
                        _ => return Err(format!("bad escape at byte {i}")),
                    }
                }
                c if c < 0x20 => return Err(format!("control character in string at byte {i}")),
                c => out.push(c as char),
            }
        }
        Err("unterminated string".into())
    }

    fn value(b: &[u8], i: &mut usize) -> Result<V, String> {
        ws(b, i);
        match b.get(*i).ok_or("unexpected end")? {
            b'{' => {
                *i += 1;
                let mut m = Vec::new();
                ws(b, i);
                if b.get(*i) == Some(&b'}') {
                    *i += 1;
                    return Ok(V::Obj(m));
                }
                loop {
                    ws(b, i);
                    let k = string(b, i)?;
                    ws(b, i);
                    lit(b, i, ":")?;
                    m.push((k, value(b, i)?));
                    ws(b, i);
                    match b.get(*i) {
                        Some(b',') => *i += 1,
                        Some(b'}') => {
                            *i += 1;
                            return Ok(V::Obj(m));
                        }
                        _ => return Err(format!("expected , or }} at byte {i}")),
                    }
                }
            }
            b'[' => {
                *i += 1;
                let mut a = Vec::new();
                ws(b, i);
                if b.get(*i) == Some(&b']') {
                    *i += 1;
                    return Ok(V::Arr(a));
                }
                loop {
                    a.push(value(b, i)?);
                    ws(b, i);
                    match b.get(*i) {
                        Some(b',') => *i += 1,
                        Some(b']') => {
                            *i += 1;
                            return Ok(V::Arr(a));
                        }
                        _ => return Err(format!("expected , or ] at byte {i}")),
                    }
                }
            }
            b'"' => Ok(V::Str(string(b, i)?)),
            b't' => lit(b, i, "true").map(|_| V::Bool),
            b'f' => lit(b, i, "false").map(|_| V::Bool),
            b'n' => lit(b, i, "null").map(|_| V::Null),
            _ => {
                let start = *i;
                while *i < b.len() && matches!(b[*i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                    *i += 1;
                }
                let t = std::str::from_utf8(&b[start..*i]).unwrap();
                t.parse::<f64>().map(V::Num).map_err(|_| format!("bad number {t:?} at byte {start}"))
            }
        }
    }
}
