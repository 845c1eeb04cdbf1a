//! ferroccl-bench end to end: short sweeps at 2 and 3 local ranks (NCCL's collectives
//! and the extensions), the corruption test hook, the comparison modes, short soaks
//! (and the hooks that make them fail), the shape of the JSON, CSV and SVG outputs,
//! and what served each size (host memory; one simulated GPU through the GPU-to-GPU
//! path, and staged without it). No timing assertions.

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
    c.env_remove("FERROCCL_BENCH_LEAK");
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
            assert_eq!(f.len(), 17, "table row with 17 columns: {l:?}");
            out.push((coll.clone(), f));
        }
    }
    out
}

/// The host backend's algorithms (fcclCommGetLastPath on host memory).
const HOST_ALGORITHMS: [&str; 4] = ["board", "mapped", "eager", "schedule"];

const NOT_CHECKED_IN_PLACE: [&str; 1] = ["all_to_allv"];
/// Extension collectives with no in-place form along axis 1 (the default --axis).
const NO_IN_PLACE_ON_AXIS_1: [&str; 2] = ["all_gather_axis", "reduce_scatter_axis"];
/// Extension collectives with no out-of-place form.
const NO_OUT_OF_PLACE: [&str; 1] = ["broadcast_coalesced"];

const EXT: [&str; 7] = [
    "all_gather_v",
    "reduce_scatter_v",
    "all_gather_axis",
    "reduce_scatter_axis",
    "all_reduce_coalesced",
    "broadcast_coalesced",
    "all_reduce_wire",
];

/// Asserts exit 0 and #wrong 0 (or N/A where in-place is not checked) on every row.
fn assert_all_right(o: &Output, colls: &[&str], nsizes: usize) {
    assert_all_right_on_axis(o, colls, nsizes, 1)
}

/// As [`assert_all_right`], for a run with `--axis axis`; N/A in every column of a
/// placement that the collective does not have. Host memory: each placement's path
/// columns name the host backend and one of its algorithms.
fn assert_all_right_on_axis(o: &Output, colls: &[&str], nsizes: usize, axis: usize) {
    let (out, err) = text(o);
    assert_eq!(o.status.code(), Some(0), "exit 0 expected\nstdout:\n{out}\nstderr:\n{err}");
    let rows = rows(&out);
    assert_eq!(rows.len(), colls.len() * nsizes, "one row per collective and size:\n{out}");
    for (c, f) in &rows {
        let c = c.as_str();
        assert!(colls.contains(&c), "unexpected collective {c}");
        let has_out = !NO_OUT_OF_PLACE.contains(&c);
        let has_in = !(axis != 0 && NO_IN_PLACE_ON_AXIS_1.contains(&c));
        if !has_out {
            assert!(f[5..9].iter().all(|x| x == "N/A"), "{c} has no out-of-place form: {f:?}");
        } else {
            assert_eq!(f[8], "0", "{c} out-of-place #wrong: {f:?}");
        }
        if !has_in {
            assert!(f[9..13].iter().all(|x| x == "N/A"), "{c} has no in-place form on axis {axis}: {f:?}");
        } else if NOT_CHECKED_IN_PLACE.contains(&c) {
            assert_eq!(f[12], "N/A", "{c} in-place is not checked: {f:?}");
        } else {
            assert_eq!(f[12], "0", "{c} in-place #wrong: {f:?}");
        }
        for (has, path) in [(has_out, &f[13..15]), (has_in, &f[15..17])] {
            if has {
                assert_eq!(path[0], "host", "{c}: host memory is served by the host backend: {f:?}");
                assert!(HOST_ALGORITHMS.contains(&path[1].as_str()), "{c}: a host algorithm: {f:?}");
            } else {
                assert!(path.iter().all(|x| x == "N/A"), "{c}: no such placement, no path: {f:?}");
            }
        }
    }
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    assert!(out.contains("# Backend mixed(ranks) : 0 OK"), "{out}");
    assert!(!out.contains("the device path did not serve"), "host memory has no device path to miss:\n{out}");
    assert!(out.contains("# Avg bus bandwidth"), "{out}");
    assert!(out.contains("# Peak resident memory"), "{out}");
}

#[test]
fn every_collective_is_right_at_2_ranks() {
    let o = bench(&["--nranks", "2", "all", "-b", "8", "-e", "256K", "-f", "8", "-n", "3", "-w", "1", "-r", "1"], &[]);
    // 8, 64, 512, 4K, 32K, 256K
    assert_all_right(&o, &NCCL_SET, 6);
}

const NCCL_SET: [&str; 10] = [
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

/// The single-copy path (off by default): messages of 64 KiB and more are read from
/// the sender's buffer, alone and pipelined with ring messages, across repeated calls
/// (the read counters span calls), at 2 and 3 processes, every checked.
#[test]
fn single_copy_messages_are_right_at_2_and_3_ranks() {
    for n in ["2", "3"] {
        let o = bench(
            &["--nranks", n, "all", "-b", "48K", "-e", "3M", "-f", "4", "-n", "4", "-w", "2", "-c", "2"],
            &[("FERROCCL_SINGLE_COPY", "1")],
        );
        // 48K, 192K, 768K, 3M
        assert_all_right(&o, &NCCL_SET, 4);
    }
}

/// Messages several times a ring (4 MiB per peer at 2 ranks, 4 MiB at 3) go through
/// the pipelined paths: reductions in rounds whose results leave from scratch slots,
/// in-place all_to_all piece by piece without a copy of its input, broadcast copying
/// on the way; with streaming stores (the default at this size) and without, in
/// place (checked for all_to_all too) and out of place, odd counts included.
#[test]
fn messages_larger_than_the_rings_are_right() {
    for (n, d, min) in [("2", "float", "512K"), ("3", "half", "1G"), ("3", "int32", "0")] {
        let o = bench(
            &["--nranks", n, "all", "-b", "13000008", "-e", "13000008", "-n", "1", "-w", "1", "-d", d],
            &[("FERROCCL_STREAM_MIN", min)],
        );
        assert_all_right(&o, &NCCL_SET, 1);
    }
}

/// With the same buffers call after call (`--rotate 0`), results of 512 KiB and
/// 2 MiB land in a recvbuff that the previous call wrote, and are written with
/// ordinary stores (`backend::host::reuse`), while the first call of a size and
/// the checked calls after the benchmark refilled the buffers mix in streaming
/// ones: right at 2 and 3 ranks, in place and out of place.
#[test]
fn reused_recvbuffs_are_right() {
    for n in ["2", "3"] {
        let o = bench(
            &[
                "--nranks", n, "all", "-b", "512K", "-e", "2M", "-f", "4", "-n", "4", "-w", "2", "-c", "2", "--rotate",
                "0",
            ],
            &[],
        );
        assert_all_right(&o, &NCCL_SET, 2);
    }
}

/// 2-rank all_reduce from 256 KiB reduces between the two processes' mapped
/// buffers (in place; out of place at 3 MiB, from 512 KiB with streaming stores),
/// or takes the pipelined path (out of place at 256 KiB, and every call with
/// `FERROCCL_SPLIT_COPY=0`): right for every kind of type and operator, the
/// average of narrow floats (which keeps the pipelined path) included.
#[test]
fn two_rank_all_reduce_between_buffers_is_right_for_every_type_and_op() {
    for (d, op) in
        [("half", "sum"), ("bfloat16", "prod"), ("f8e4m3", "avg"), ("int8", "max"), ("double", "avg"), ("int32", "min")]
    {
        for split in ["1", "0"] {
            let o = bench(
                &[
                    "--nranks",
                    "2",
                    "all_reduce",
                    "-b",
                    "256K",
                    "-e",
                    "3M",
                    "-f",
                    "12",
                    "-n",
                    "2",
                    "-w",
                    "1",
                    "-d",
                    d,
                    "-o",
                    op,
                ],
                &[("FERROCCL_SPLIT_COPY", split)],
            );
            // 256K, 3M
            assert_all_right(&o, &["all_reduce"], 2);
        }
    }
}

/// Over TCP (`FERROCCL_TRANSPORT=tcp`: no shared memory, no read reports), every
/// collective is right, in-place all_to_all blocks large enough to be swapped
/// between mapped buffers included (their swap offers are done once written there,
/// and both ranks exchange through the link).
#[test]
fn every_collective_is_right_over_tcp() {
    let o = bench(
        &["--nranks", "2", "all", "-b", "8", "-e", "1M", "-f", "32", "-n", "2", "-w", "1"],
        &[("FERROCCL_TRANSPORT", "tcp")],
    );
    // 8, 256, 8K, 256K
    assert_all_right(&o, &NCCL_SET, 4);
}

/// The bulletin board serves calls up to 64 KiB per rank; sizes around that limit
/// run on the board or on the links, and both must be right, for narrow types too.
#[test]
fn sizes_around_the_board_limit_are_right() {
    for (n, d) in [("2", "bfloat16"), ("3", "float"), ("4", "int32")] {
        let o = bench(
            &["--nranks", n, "all", "-b", "56K", "-e", "72K", "-f", "1", "-i", "8K", "-n", "3", "-w", "1", "-d", d],
            &[],
        );
        assert_all_right(&o, &NCCL_SET, 3);
    }
}

#[test]
fn extensions_are_right_at_2_and_3_ranks() {
    for n in ["2", "3"] {
        let o =
            bench(&["--nranks", n, "ext", "-b", "8", "-e", "256K", "-f", "8", "-n", "2", "-w", "1", "-r", "1"], &[]);
        // 8, 64, 512, 4K, 32K, 256K
        assert_all_right(&o, &EXT, 6);
        let (out, _) = text(&o);
        let rows = rows(&out);
        // The coalesced calls split 256K of float into 1000 buffers of 64 floats.
        assert!(rows.iter().any(|(c, f)| c == "all_reduce_coalesced" && f[0] == "256000" && f[1] == "64000"), "{out}");
        assert!(rows.iter().any(|(c, f)| c == "broadcast_coalesced" && f[4] == "1"), "root 1: {out}");
    }
}

#[test]
fn extensions_on_axis_0_with_other_types_ops_and_buckets() {
    let colls = ["all_gather_axis", "reduce_scatter_axis", "all_reduce_coalesced", "broadcast_coalesced"];
    let mut args = vec!["--nranks", "3"];
    args.extend(colls);
    args.extend(["--axis", "0", "-d", "half", "-o", "max", "--nbuffers", "7", "--bucket", "100"]);
    args.extend(["-b", "6", "-e", "96K", "-f", "16", "-n", "2", "-w", "1"]);
    let o = bench(&args, &[]);
    // 6, 96, 1536, 24K (whole elements)
    assert_all_right_on_axis(&o, &colls, 4, 0);
    let (out, _) = text(&o);
    assert!(rows(&out).iter().all(|(_, f)| f[2] == "half"), "{out}");
}

#[test]
fn all_reduce_wire_is_exact_for_every_wire_type() {
    for (n, ty, op, wire) in [
        ("2", "float", "sum", "bfloat16"),
        ("3", "float", "avg", "half"),
        ("3", "double", "prod", "f8e4m3"),
        ("2", "float", "min", "f8e5m2"),
        ("3", "double", "sum", "float"),
    ] {
        let o = bench(
            &[
                "--nranks",
                n,
                "all_reduce_wire",
                "-d",
                ty,
                "-o",
                op,
                "--wire",
                wire,
                "-b",
                "8",
                "-e",
                "512K",
                "-f",
                "16",
                "-n",
                "2",
                "-w",
                "1",
            ],
            &[],
        );
        // 8, 128, 2K, 32K, 512K
        assert_all_right(&o, &["all_reduce_wire"], 5);
        let (out, _) = text(&o);
        assert!(out.contains(&format!("# {ty} data over a {wire} wire")), "{out}");
    }
}

#[test]
fn all_excludes_and_ext_names_the_extensions() {
    let o = bench(&["--nranks", "2", "all", "ext", "-b", "1K", "-e", "1K", "-n", "1", "-w", "1"], &[]);
    let (out, _) = text(&o);
    let names: Vec<String> = out.lines().filter_map(|l| l.strip_prefix("# Collective: ")).map(String::from).collect();
    assert_eq!(names.len(), 17, "nccl-tests' 10 and the 7 extensions: {names:?}");
    assert_eq!(&names[10..], &EXT, "{names:?}");
}

#[test]
fn corrupted_extension_results_are_reported() {
    let o = bench(
        &["--nranks", "2", "all_gather_v", "all_reduce_wire", "-b", "64", "-e", "4K", "-f", "8", "-n", "2", "-w", "1"],
        &[("FERROCCL_BENCH_CORRUPT", "1")],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "wrong results exit 1\nstdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("# Out of bounds values : 12 FAILED"), "{out}");
    assert!(err.contains("all_gather_v") && err.contains("all_reduce_wire"), "{err}");
}

/// Data rows of a comparison's table (lines that are not comments), split into fields.
fn compare_rows(stdout: &str, fields: usize) -> Vec<Vec<String>> {
    let rows: Vec<Vec<String>> = stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    for r in &rows {
        assert_eq!(r.len(), fields, "{r:?}");
    }
    rows
}

/// A ratio column: a positive number followed by x.
fn is_ratio(s: &str) -> bool {
    s.strip_suffix('x').and_then(|v| v.parse::<f64>().ok()).is_some_and(|v| v > 0.0)
}

#[test]
fn compare_coalesced_prints_the_speed_up() {
    // The issue's case: 1000 buffers of 1 KiB (kept short: 3 repetitions).
    let o = bench(
        &["--nranks", "2", "--compare-coalesced", "-b", "1M", "-e", "1M", "--nbuffers", "1000", "--reps", "3"],
        &[],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let rows = compare_rows(&out, 9);
    assert_eq!(rows.len(), 1, "{out}");
    let r = &rows[0];
    assert_eq!((r[0].as_str(), r[1].as_str(), r[2].as_str(), r[3].as_str()), ("1024000", "256000", "1000", "1024"));
    assert!(is_ratio(&r[6]), "speed-up column: {r:?}");
    assert_eq!(r[8], "0", "#wrong: {r:?}");
    let line = out.lines().find(|l| l.starts_with("# Coalesced speed-up: ")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("1000 buffers of 1 KiB") && line.contains("x over 1000 separate fcclAllReduce"), "{line}");
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
}

#[test]
fn both_comparisons_in_one_run_at_3_ranks() {
    let o = bench(
        &[
            "--nranks",
            "3",
            "--compare-coalesced",
            "--compare-wire",
            "-b",
            "64K",
            "-e",
            "1M",
            "-f",
            "4",
            "--nbuffers",
            "100",
            "--reps",
            "3",
            "-n",
            "3",
            "-w",
            "1",
        ],
        &[],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let at = out.find("# Compare: fcclAllReduceWire").unwrap_or_else(|| panic!("both tables: {out}"));
    let (co, wi) = out.split_at(at);
    let rows = compare_rows(co, 9);
    assert_eq!(rows.len(), 3, "64K 256K 1M: {co}");
    for r in &rows {
        assert!(is_ratio(&r[6]) && r[8] == "0", "{r:?}");
    }
    assert_eq!(co.matches("# Coalesced speed-up: 100 buffers of ").count(), 3, "{co}");
    let rows = compare_rows(wi, 11);
    assert_eq!(rows.len(), 3, "{wi}");
    for r in &rows {
        assert_eq!((r[2].as_str(), r[3].as_str()), ("float", "bfloat16"), "{r:?}");
        assert!(r[5].parse::<f64>().is_ok() && r[7].parse::<f64>().is_ok(), "busbw columns: {r:?}");
        assert!(is_ratio(&r[8]) && r[10] == "0", "{r:?}");
    }
    assert_eq!(wi.matches("# Wire gain at ").count(), 3, "{wi}");
}

#[test]
fn extension_arguments_are_checked() {
    for args in [
        &["--axis", "2"][..],
        &["--nbuffers", "0"],
        &["--wire", "int8"],
        &["all_reduce_wire", "-d", "int32"],
        &["all_reduce_wire", "-d", "float", "--wire", "double"],
        &["--compare-wire", "-d", "bfloat16"],
        &["--compare-coalesced", "all_reduce"],
        &["--compare-coalesced", "--csv", "x.csv"],
    ] {
        let o = bench(args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o).1);
    }
    let o = bench(&["--help"], &[]);
    let (help, _) = text(&o);
    for w in ["ext (these)", "--compare-coalesced", "--compare-wire", "--nbuffers", "--axis", "--wire", "--bucket"] {
        assert!(help.contains(w), "--help mentions {w}");
    }
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
    assert_eq!(v.get("nranks").unwrap().as_f64(), Some(2.0));
    assert_eq!(v.get("mem").unwrap().as_str(), Some("host"));
    let res = v.get("results").unwrap().as_array().unwrap();
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
            "host_us",
            "algbw_GBps",
            "busbw_GBps",
            "wrong",
            "backend",
            "algorithm",
            "algorithms_by_rank",
            "backends_by_rank",
        ] {
            assert!(r.get(key).is_some(), "record has {key}: {r:?}");
        }
        // What served it: the host backend on every rank; rank 0's algorithm first.
        let algo = r.get("algorithm").unwrap().as_str().unwrap();
        assert_eq!(r.get("backend").unwrap().as_str(), Some("host"), "{r:?}");
        assert!(HOST_ALGORITHMS.contains(&algo), "{r:?}");
        let each = |k: &str| -> Vec<String> {
            r.get(k).unwrap().as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect()
        };
        assert_eq!(each("backends_by_rank"), ["host", "host"], "{r:?}");
        let algos = each("algorithms_by_rank");
        assert_eq!(algos.len(), 2, "{r:?}");
        assert_eq!(algos[0], algo, "the algorithm shown is rank 0's: {r:?}");
        assert!(algos.iter().all(|a| HOST_ALGORITHMS.contains(&a.as_str())), "{r:?}");
    }
    assert_eq!(v.get("ranks").unwrap().as_array().unwrap().len(), 2);
    assert_eq!(v.get("backend_mixed_ranks").unwrap().as_f64(), Some(0.0));

    let csv = std::fs::read_to_string(&c).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some(
            "collective,nranks,type,redop,root,size_bytes,count,placement,time_us,algbw_GBps,busbw_GBps,wrong,host_us,\
             backend,algorithm"
        )
    );
    let body: Vec<&str> = lines.collect();
    assert_eq!(body.len(), records, "one CSV row per size and placement");
    // The table's path columns of each collective, size and placement.
    let (out, _) = text(&o);
    let mut table = std::collections::HashMap::new();
    for (c, f) in rows(&out) {
        table.insert((c.clone(), f[0].clone(), "out"), (f[13].clone(), f[14].clone()));
        table.insert((c, f[0].clone(), "in"), (f[15].clone(), f[16].clone()));
    }
    for (l, r) in body.iter().zip(res) {
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(f.len(), 15, "{l}");
        // Host memory: a call returns when done, so no separate host time.
        assert_eq!(f[12], "", "{l}");
        assert!(f[7] == "out" || f[7] == "in", "{l}");
        assert!(f[5].parse::<u64>().is_ok() && f[9].parse::<f64>().is_ok(), "{l}");
        assert_eq!(f[13], "host", "{l}");
        assert!(HOST_ALGORITHMS.contains(&f[14]), "{l}");
        // Table, CSV and JSON say the same of each size and placement.
        let shown = &table[&(f[0].to_string(), f[5].to_string(), f[7])];
        assert_eq!((shown.0.as_str(), shown.1.as_str()), (f[13], f[14]), "table and CSV: {l}");
        assert_eq!(Some(f[14]), r.get("algorithm").unwrap().as_str(), "CSV and JSON, in the same order: {l}");
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
        assert!(err.contains("CUDA is not available"), "{err}");
    }
    let o = bench(&["--help"], &[]);
    assert_eq!(o.status.code(), Some(0));
    assert!(text(&o).0.contains("FERROCCL_BENCH_CORRUPT"));
}

/// Runs a soak with a JSON output; returns the process output and the parsed JSON.
fn soak(args: &[&str], envs: &[(&str, &str)], name: &str) -> (Output, json::V) {
    let j = tmp(name);
    let mut a = args.to_vec();
    a.extend(["-J", j.to_str().unwrap()]);
    let o = bench(&a, envs);
    let js = std::fs::read_to_string(&j).unwrap_or_else(|e| panic!("no JSON ({e}): {:?}", text(&o)));
    let _ = std::fs::remove_file(&j);
    let v = json::parse(&js).unwrap_or_else(|e| panic!("JSON does not parse: {e}\n{js}"));
    (o, v)
}

fn num_at(v: &json::V, path: &[&str]) -> f64 {
    let mut x = v;
    for k in path {
        x = x.get(k).unwrap_or_else(|| panic!("JSON has {path:?}"));
    }
    x.as_f64().unwrap_or_else(|| panic!("{path:?} is a number"))
}

/// The CI soak: random checked calls of every collective and extension (count 0,
/// in place, idle ranks, malloc and fcclMemAllocHost buffers) at 2 and 3 ranks, with
/// fixed seeds so a failure replays; no wrong element and no growth of descriptors,
/// memfds, segments or threads.
#[test]
fn soak_is_right_and_grows_nothing_at_2_and_3_ranks() {
    for (n, calls, seed) in [("2", "400", "1"), ("3", "200", "2")] {
        let (o, v) = soak(&["--nranks", n, "--soak", calls, "--seed", seed], &[], "soak.json");
        let (out, err) = text(&o);
        let ctx = format!("stdout:\n{out}\nstderr:\n{err}");
        assert_eq!(o.status.code(), Some(0), "{ctx}");
        assert!(out.contains("# Soak                 : OK"), "{ctx}");
        assert!(out.contains(&format!("--soak {calls} --seed {seed} --nranks {n}")), "replay line: {ctx}");
        assert_eq!(v.get("mode").and_then(|m| m.as_str()), Some("soak"));
        assert_eq!(num_at(&v, &["nranks"]), n.parse::<f64>().unwrap());
        assert_eq!(num_at(&v, &["params", "seed"]), seed.parse::<f64>().unwrap());
        assert_eq!(num_at(&v, &["wrong"]), 0.0, "{ctx}");
        for k in ["fds", "memfds", "shm_files", "threads"] {
            assert!(num_at(&v, &["max_growth", k]) <= 0.0, "{k} grew: {ctx}");
        }
        assert!(num_at(&v, &["calls_per_s"]) > 0.0);
        let per: f64 = EXT
            .iter()
            .chain(NCCL_SET.iter())
            .map(|c| {
                let k = num_at(&v, &["calls_per_collective", c]);
                assert!(k > 0.0, "{c} ran: {ctx}");
                k
            })
            .sum();
        assert_eq!(per, calls.parse::<f64>().unwrap(), "every call is counted once");
        for k in ["in_place", "count_zero", "idle_rank_calls"] {
            assert!(num_at(&v, &[k]) > 0.0, "{k}: {ctx}");
        }
        for k in ["malloc", "fcclMemAllocHost"] {
            assert!(num_at(&v, &["buffers", k]) > 0.0, "{k} buffers: {ctx}");
        }
        assert_eq!(num_at(&v, &["buffers", "fcclMemAlloc"]), 0.0);
        let ranks = v.get("ranks").and_then(|r| r.as_array()).expect("ranks");
        assert_eq!(ranks.len(), n.parse::<usize>().unwrap());
        for r in ranks {
            assert!(num_at(r, &["end", "fds"]) > 0.0 && num_at(r, &["end", "threads"]) >= 1.0, "{r:?}");
            assert_eq!(r.get("rss_kib_steps").and_then(|s| s.as_array()).map(|s| s.len()), Some(10));
        }
    }
}

/// A soak fails on wrong results (the corruption hook flips an element of rank 0's
/// result at every check) and names the call and its replay; and on a descriptor
/// leak (the leak hook), with every result right.
#[test]
fn soak_fails_on_wrong_results_and_on_growth() {
    let (o, v) = soak(&["--nranks", "2", "--soak", "60", "--seed", "3"], &[("FERROCCL_BENCH_CORRUPT", "1")], "c.json");
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(num_at(&v, &["wrong"]) > 0.0, "{out}");
    assert!(num_at(&v, &["wrong_calls"]) > 0.0, "{out}");
    assert!(out.contains("# Soak                 : FAILED: wrong results"), "{out}");
    assert!(out.contains("--soak-first"), "replay of the first wrong call: {out}");
    assert!(err.contains("soak call #") && err.contains("of seed 3") && err.contains("wrong elements"), "{err}");

    let (o, v) = soak(&["--nranks", "2", "--soak", "100", "--seed", "4"], &[("FERROCCL_BENCH_LEAK", "1")], "l.json");
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(num_at(&v, &["wrong"]), 0.0);
    // Rank 0 leaks one descriptor per call after the 25 warm-up calls.
    assert_eq!(num_at(&v, &["max_growth", "fds"]), 75.0, "{out}");
    assert!(out.contains("FAILED: descriptors, threads or shared memory grew"), "{out}");
}

#[test]
fn soak_arguments_are_checked() {
    for args in [
        &["--soak", "0"][..],
        &["--soak", "x"],
        &["--seed", "1"],
        &["--soak-first", "3"],
        &["--soak", "10", "--seed", "nope"],
        &["--soak", "10", "-b", "8"],
        &["--soak", "10", "-d", "float"],
        &["--soak", "10", "--wire", "half"],
        &["--soak", "10", "--compare-wire"],
    ] {
        let o = bench(args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o).1);
    }
    let (help, _) = text(&bench(&["--help"], &[]));
    for w in ["--soak <N>", "--seed <S>", "--soak-first <I>", "idle ranks", "FERROCCL_BENCH_LEAK", "calls per"] {
        assert!(help.contains(w), "--help mentions {w}");
    }
}

/// The bench's JSON, read with serde_json.
mod json {
    pub use serde_json::Value as V;

    pub fn parse(s: &str) -> Result<V, String> {
        serde_json::from_str(s).map_err(|e| e.to_string())
    }
}

/// Device memory on the simulated GPU: every record has the time the calling thread
/// spent in a call, which is part of the call's whole time (it ends when the stream is
/// done), on the stream-ordered path and the staged one.
#[test]
fn device_sweeps_report_the_host_time_of_a_call() {
    for ipc in ["1", "0"] {
        let j = tmp(&format!("host-time-{ipc}.json"));
        let o = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/sim-gpu.sh"))
            .arg(BENCH)
            .args(["--nranks", "2", "--mem", "cuda", "-b", "8", "-e", "512K", "-f", "16", "-n", "3", "-w", "1"])
            .args(["all_reduce", "all_gather", "-J", j.to_str().unwrap()])
            .env("FERROCCL_TIMEOUT_MS", "60000")
            .env("FERROCCL_CUDA_IPC", ipc)
            .env("FERROCCL_SIM_DEVICES", "1")
            .env_remove("FERROCCL_BACKEND")
            .output()
            .expect("scripts/sim-gpu.sh runs");
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "stdout:\n{out}\nstderr:\n{err}");
        let v = json::parse(&std::fs::read_to_string(&j).unwrap()).unwrap();
        let res = v.get("results").unwrap().as_array().unwrap();
        assert_eq!(res.len(), 2 * 2 * 5, "2 collectives, 2 placements, 5 sizes");
        for r in res {
            let (host, total) = (num_at(r, &["host_us"]), num_at(r, &["time_us"]));
            assert!(host > 0.0 && host <= total, "FERROCCL_CUDA_IPC={ipc}: host {host} us of {total} us: {r:?}");
        }
    }
}

/// Device memory on the simulated GPU, every rank on one device, every size through
/// the IPC path: random verified calls are right, and the mappings of peers'
/// allocations are closed as their owners free them (the soak frees its buffers as it
/// goes), so the processes' mappings do not grow with the calls.
#[test]
fn device_soak_through_ipc_is_right_and_closes_mappings_of_freed_buffers() {
    // A directory of its own: other tests remove tmp()'s when they end.
    let dir = std::env::temp_dir().join(format!("ferroccl-ipc-soak-{}", std::process::id()));
    let (j, logs) = (dir.join("soak.json"), dir.join("logs"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&logs).unwrap();
    let o = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/sim-gpu.sh"))
        .arg(BENCH)
        .args(["--soak", "600", "--seed", "5", "--nranks", "3", "--mem", "cuda", "-J", j.to_str().unwrap()])
        .env("FERROCCL_TIMEOUT_MS", "60000")
        .env("FERROCCL_CUDA_IPC", "1")
        .env("FERROCCL_SIM_DEVICES", "1")
        .env("FERROCCL_DEBUG", "INFO")
        .env("FERROCCL_DEBUG_FILE", logs.join("%p.log"))
        .env_remove("FERROCCL_BACKEND")
        .output()
        .expect("scripts/sim-gpu.sh runs");
    let (out, err) = text(&o);
    let ctx = format!("stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(o.status.code(), Some(0), "{ctx}");
    let v = json::parse(&std::fs::read_to_string(&j).unwrap()).unwrap();
    assert_eq!(num_at(&v, &["wrong"]), 0.0, "{ctx}");
    // Each call may allocate fresh buffers: kept mappings of freed ones grew by more
    // than a hundred lines of /proc/self/maps over this run.
    assert!(num_at(&v, &["max_growth", "maps"]) <= 20.0, "mappings grew: {ctx}");
    let served: usize = std::fs::read_dir(&logs)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap().matches(" backend ipc algorithm ").count())
        .sum();
    assert!(served > 100, "only {served} calls went through the IPC path");
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the one-GPU path (the ipc backend) names its ways of moving data: rank 0 moves
/// a collective's data (exec-*), the others signal and wait (or, under MPS, each moves
/// its share; posted calls, the default once a call passed device memory: rank 0's, or
/// under MPS every rank's, proxy thread enqueues them); send/recv pull from the peer's
/// buffer. Not the bounce forms: those
/// stage through host memory.
const IPC_ALGORITHMS: [&str; 16] = [
    "exec-proxy",
    "mps-proxy",
    "exec-copy",
    "exec-reduce",
    "exec-copy2d",
    "exec-copy2d-reduce",
    "exec-copy-scratch",
    "exec-swap",
    "signal-wait",
    "signal-wait-copied",
    "host-wait",
    "mps-shares",
    "mps-slices",
    "mps-idle",
    "p2p-pull",
    "p2p-self",
];

/// Runs `all` at 64 KiB (one call per placement, checked) with `--mem cuda` on `n`
/// ranks of the simulated GPU, every rank on device 0 (CUDA_VISIBLE_DEVICES=0 of the
/// simulator's two), with `env`; asserts exit 0 (every result right) and returns
/// stdout, the JSON and the CSV.
fn one_gpu_all(n: usize, env: &[(&str, &str)]) -> (String, json::V, String) {
    let tag = env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    // A directory of its own: other tests remove tmp()'s when they end.
    let dir = std::env::temp_dir().join(format!("ferroccl-one-gpu-{n}-{}-{}", env.len(), std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (j, c) = (dir.join("r.json"), dir.join("r.csv"));
    let mut cmd = Command::new("bash");
    cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/sim-gpu.sh"))
        .arg(BENCH)
        .args(["--nranks", &n.to_string(), "--mem", "cuda", "all", "-b", "64K", "-e", "64K", "-n", "1", "-w", "0"])
        .args(["-c", "1", "-J", j.to_str().unwrap(), "--csv", c.to_str().unwrap()])
        .env("FERROCCL_TIMEOUT_MS", "60000")
        .env("CUDA_VISIBLE_DEVICES", "0");
    // The path the library picks by itself: none of the variables that steer it.
    for v in [
        "FERROCCL_BACKEND",
        "FERROCCL_CUDA_IPC",
        "FERROCCL_CUDA_MPS",
        "FERROCCL_SIM_DEVICES",
        "FERROCCL_RANK",
        "FERROCCL_WORLD_SIZE",
        "FERROCCL_UNIQUE_ID",
        "FERROCCL_ROOT_ADDR",
        "RANK",
        "WORLD_SIZE",
        "FERROCCL_BENCH_CORRUPT",
    ] {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("scripts/sim-gpu.sh runs");
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{n} ranks {tag}: stdout:\n{out}\nstderr:\n{err}");
    let js = std::fs::read_to_string(&j).unwrap();
    let v = json::parse(&js).unwrap_or_else(|e| panic!("JSON does not parse: {e}\n{js}"));
    let csv = std::fs::read_to_string(&c).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (out, v, csv)
}

/// Asserts that every row, record and CSV line of a one-GPU `all` run on `n` ranks
/// names `backend` for both placements, with algorithms `ok` accepts (rank 0's in the
/// table and CSV, every rank's in the JSON); `rank0` must accept rank 0's.
fn assert_served_by(
    n: usize,
    (out, v, csv): &(String, json::V, String),
    backend: &str,
    ok: &dyn Fn(&str) -> bool,
    rank0: &dyn Fn(&str) -> bool,
) {
    let rows = rows(out);
    assert_eq!(rows.len(), NCCL_SET.len(), "one row per collective:\n{out}");
    for (c, f) in &rows {
        for path in [&f[13..15], &f[15..17]] {
            assert_eq!(path[0], backend, "{n} ranks: {c} served by {}, not {backend}: {f:?}\n{out}", path[0]);
            assert!(ok(&path[1]) && rank0(&path[1]), "{n} ranks: {c}: algorithm {}: {f:?}", path[1]);
        }
    }
    assert!(out.contains("# Backend mixed(ranks) : 0 OK"), "{out}");
    let res = v.get("results").unwrap().as_array().unwrap();
    assert_eq!(res.len(), 2 * NCCL_SET.len(), "every collective in both placements");
    for r in res {
        assert_eq!(r.get("backend").unwrap().as_str(), Some(backend), "{n} ranks: {r:?}");
        let each = |k: &str| -> Vec<String> {
            r.get(k).unwrap().as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect()
        };
        assert_eq!(each("backends_by_rank"), vec![backend; n], "{n} ranks: {r:?}");
        let algos = each("algorithms_by_rank");
        assert_eq!(algos.len(), n, "{r:?}");
        assert_eq!(Some(algos[0].as_str()), r.get("algorithm").unwrap().as_str(), "rank 0's is shown: {r:?}");
        assert!(rank0(&algos[0]) && algos.iter().all(|a| ok(a)), "{n} ranks: {r:?}");
    }
    let body: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(body.len(), 2 * NCCL_SET.len(), "{csv}");
    for l in body {
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(f.len(), 15, "{l}");
        assert_eq!(f[13], backend, "{n} ranks: {l}");
        assert!(ok(f[14]) && rank0(f[14]), "{n} ranks: {l}");
    }
}

/// Device memory, every rank on one simulated GPU: at 2 and 4 ranks every collective
/// of `all`, out of place and in place, is served GPU to GPU (backend ipc; rank 0 moves
/// the data, with an exec-* or p2p-* algorithm, the others signal and wait), and no
/// table says the device path was missed. Fails if the library ever stages such a call.
#[test]
fn every_collective_on_one_gpu_is_served_by_the_ipc_path() {
    for n in [2, 4] {
        let run = one_gpu_all(n, &[]);
        let ipc = |a: &str| IPC_ALGORITHMS.contains(&a);
        let moves = |a: &str| ["exec-", "p2p-", "mps-"].iter().any(|p| a.starts_with(p));
        assert_served_by(n, &run, "ipc", &ipc, &moves);
        assert!(!run.0.contains("the device path did not serve"), "{}", run.0);
    }
}

/// The same with FERROCCL_CUDA_IPC=0: every collective and placement is staged through
/// host memory (the host algorithms, or the staging pipeline), and each of the ten
/// tables says the device path did not serve its size and how to see why.
#[test]
fn every_collective_on_one_gpu_is_staged_without_the_ipc_path() {
    for n in [2, 4] {
        let run = one_gpu_all(n, &[("FERROCCL_CUDA_IPC", "0")]);
        let staged = |a: &str| HOST_ALGORITHMS.contains(&a) || a == "pipelined";
        assert_served_by(n, &run, "staged", &staged, &|_| true);
        let notes: Vec<&str> = run.0.lines().filter(|l| l.starts_with("# the device path did not serve")).collect();
        assert_eq!(notes.len(), NCCL_SET.len(), "one note per table:\n{}", run.0);
        assert!(notes.iter().all(|l| l.contains("65536 B") && l.contains("FERROCCL_DEBUG=WARN")), "{notes:?}");
    }
}
