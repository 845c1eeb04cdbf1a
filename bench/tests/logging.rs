//! FERROCCL_DEBUG=INFO writes one line per collective, to FERROCCL_DEBUG_FILE with
//! %h (host) and %p (pid) substituted; the default level writes nothing for
//! successful calls. The library's logging as ferroccl-bench's ranks produce it, so
//! these tests live with the bench crate (where cargo builds and names the binary).

use std::process::Command;

fn run_bench(dir: &std::path::Path, level: Option<&str>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferroccl-bench"));
    cmd.args(["--nranks", "2", "all_reduce", "-b", "64", "-e", "64", "-n", "2", "-w", "1", "--max-time", "0"]);
    cmd.env("FERROCCL_DEBUG_FILE", dir.join("log-%h-%p.txt"));
    match level {
        Some(l) => cmd.env("FERROCCL_DEBUG", l),
        None => cmd.env_remove("FERROCCL_DEBUG"),
    };
    let out = cmd.output().expect("ferroccl-bench runs");
    assert!(out.status.success(), "bench failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Held by the tests whose multi-rank runs must not share the CPUs with another's.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn logs(dir: &std::path::Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn info_logs_one_line_per_collective_to_a_file_per_process() {
    let dir = std::env::temp_dir().join(format!("fccl-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    run_bench(&dir, Some("INFO"));
    let files = logs(&dir);
    assert_eq!(files.len(), 2, "one file per rank process: {:?}", files.iter().map(|f| &f.0).collect::<Vec<_>>());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    for (name, text) in &files {
        assert!(name.starts_with(&format!("log-{host}-")), "%h and %p substituted: {name}");
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(" seq ")).collect();
        assert!(lines.len() >= 3, "a line per collective in {name}:\n{text}");
        let l =
            lines.iter().find(|l| l.contains("fcclAllReduce count 16 float")).expect("the timed all_reduce is logged");
        for field in ["rank ", "comm ", "seq ", "backend host algorithm board", " us"] {
            assert!(l.contains(field), "{field:?} missing from {l:?}");
        }
        assert!(text.contains("backends builtin)"), "the join line names the router's table:\n{text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();

    // WARN (the default) is silent when nothing goes wrong.
    std::fs::create_dir_all(&dir).unwrap();
    run_bench(&dir, None);
    assert!(logs(&dir).iter().all(|(_, t)| t.is_empty()), "no log lines at the default level");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Ranks pinned one per CPU (ferroccl-bench binds by default) are not oversubscribed:
/// each may run on one CPU, but the host's ranks share as many CPUs as there are
/// ranks, so waits spin before they sleep. The INFO log says which policy was chosen.
#[test]
fn pinned_ranks_are_not_counted_as_oversubscribed() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for bind in ["core", "none"] {
        let dir = std::env::temp_dir().join(format!("fccl-log-bind-{bind}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_ferroccl-bench"))
            .args(["--nranks", "2", "--bind", bind, "all_reduce", "-b", "8", "-e", "8", "-n", "1", "-w", "1"])
            .env("FERROCCL_DEBUG", "INFO")
            .env("FERROCCL_DEBUG_FILE", dir.join("log-%p.txt"))
            .output()
            .expect("ferroccl-bench runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let files = logs(&dir);
        // Only the ranks log: the launcher's rendezvous point is silent when all goes well.
        assert_eq!(files.len(), 2, "--bind {bind}: one file per rank, none from the launcher: {files:?}");
        for (name, text) in files {
            let line = text
                .lines()
                .find(|l| l.contains("ranks on this host share"))
                .unwrap_or_else(|| panic!("--bind {bind}: no policy line in {name}:\n{text}"));
            let want =
                if cpus >= 2 { format!("share {cpus} CPUs; waits spin 20 us") } else { "waits spin 2 us".into() };
            assert!(line.contains(&want), "--bind {bind}, {name}: {line}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Runs `ferroccl-bench` (`nranks` ranks, `coll` at `size`, checked) at INFO with
/// `FERROCCL_SPLIT_COPY=split`, asserts it succeeded, and returns the benchmark's
/// row for `size_bytes` and the (log file, line) pairs that contain `needle`.
fn logged_run(
    nranks: &str,
    coll: &str,
    size: &str,
    size_bytes: &str,
    split: &str,
    needle: &str,
) -> (String, Vec<(String, String)>) {
    let dir = std::env::temp_dir().join(format!("fccl-log-{coll}-{split}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferroccl-bench"))
        .args(["--nranks", nranks, coll, "-b", size, "-e", size, "-n", "10", "-w", "2", "-c", "2"])
        .env("FERROCCL_DEBUG", "INFO")
        .env("FERROCCL_SPLIT_COPY", split)
        .env("FERROCCL_DEBUG_FILE", dir.join("log-%p.txt"))
        .output()
        .expect("ferroccl-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let row = stdout.lines().find(|l| l.trim_start().starts_with(size_bytes)).expect("the row of the size").to_string();
    let lines = logs(&dir)
        .into_iter()
        .flat_map(|(f, t)| {
            t.lines().filter(|l| l.contains(needle)).map(|l| (f.clone(), l.to_string())).collect::<Vec<_>>()
        })
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    (row, lines)
}

/// Split copies: a broadcast root copies parts of large messages into its peers'
/// buffers (shared memory from fcclMemAllocHost), and says so once per peer it
/// copies into at INFO; with FERROCCL_SPLIT_COPY=0 it does not, and both are right.
#[test]
fn split_copies_are_logged_once_per_peer_and_can_be_turned_off() {
    // A root helps only once its own sends are out: with another test's ranks on
    // the same two cores it may never get to (seen), so these run one at a time.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // The root (whichever process it is) names a peer once, the first time it
    // copies into that peer's buffer. It copies once its own sends are out, which
    // in a run of 14 calls it need not reach for both peers (the in-place
    // broadcasts, which used to give it 14 more, now run between the buffers, whose
    // own line another test checks), nor for either where the machine's other load
    // keeps it off the cores while its peers read: up to 4 runs, each logging at
    // most once per peer, until one shows the root copying.
    let mut runs = Vec::new();
    for _ in 0..4 {
        let (row, lines) = logged_run("3", "broadcast", "8M", "8388608", "1", "split copy");
        assert_eq!(row.split_whitespace().filter(|f| *f == "0").count(), 3, "root 0, nothing wrong: {row}");
        let named: Vec<&str> =
            ["rank 1", "rank 2"].into_iter().filter(|p| lines.iter().any(|(_, l)| l.contains(p))).collect();
        assert_eq!(lines.len(), named.len(), "once per peer: {lines:?}");
        runs.push(lines.len());
        if !named.is_empty() {
            break;
        }
    }
    assert!(runs.last().is_some_and(|&n| n > 0), "the root never copied into a peer's buffer: {runs:?} lines per run");
    let (row, lines) = logged_run("3", "broadcast", "8M", "8388608", "0", "split copy");
    assert_eq!(row.split_whitespace().filter(|f| *f == "0").count(), 3, "root 0, nothing wrong: {row}");
    assert!(lines.is_empty(), "{lines:?}");
}

/// Runs `coll` at 6 MiB on `nranks` ranks with split copies on and then off (one
/// test at a time), asserts that every result is right both ways and that nothing
/// containing `needle` is logged without split copies, and returns the lines
/// containing it of the run with them.
fn split_lines(nranks: &str, coll: &str, needle: &str) -> Vec<(String, String)> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut with_split = Vec::new();
    for split in ["1", "0"] {
        let (row, lines) = logged_run(nranks, coll, "6M", "6291456", split, needle);
        // Root -1, then #wrong 0 out of place and in place.
        assert_eq!(row.split_whitespace().filter(|f| *f == "0").count(), 2, "nothing wrong: {row}");
        if split == "1" {
            with_split = lines;
        } else {
            assert!(lines.is_empty(), "{lines:?}");
        }
    }
    with_split
}

/// In-place all_to_all swaps large blocks between the ranks' buffers (the
/// benchmark's come from fcclMemAllocHost): at 3 ranks each rank offers the swap
/// in one of its pairs and logs it once; without split copies the blocks go
/// through the rings, and both ways every result is right.
#[test]
fn in_place_swaps_are_logged_once_per_pair_and_can_be_turned_off() {
    assert_one_line_per_rank(&split_lines("3", "all_to_all", "in-place swap"), 3);
}

/// An fcclSend and an fcclRecv with one peer over one buffer (the benchmark's
/// send_recv in place at 2 ranks) swap the two ranks' buffers: the offering rank
/// logs it once; without split copies the data goes through the rings, each
/// receive writing only what its send has already sent. Both ways, right.
#[test]
fn in_place_send_recv_pairs_swap_and_can_be_turned_off() {
    let lines = split_lines("2", "send_recv", "in-place swap");
    assert_eq!(lines.len(), 1, "{lines:?}");
}

/// Large all_reduce, reduce, reduce_scatter and in-place broadcast at 3 ranks and
/// more run straight between the ranks' buffers (the benchmark's come from
/// fcclMemAllocHost): each rank says so once; with FERROCCL_SPLIT_COPY=0 the calls
/// go through the rings; both ways every result is right.
#[test]
fn collectives_between_the_buffers_are_logged_once_per_rank_and_can_be_turned_off() {
    assert_one_line_per_rank(&split_lines("3", "reduce_scatter", "between the buffers:"), 3);
}

/// `lines` (file, line) are one line in each of `n` ranks' log files.
fn assert_one_line_per_rank(lines: &[(String, String)], n: usize) {
    assert_eq!(lines.len(), n, "{lines:?}");
    let files: std::collections::BTreeSet<&String> = lines.iter().map(|(f, _)| f).collect();
    assert_eq!(files.len(), n, "one line per rank: {lines:?}");
}

/// Runs `ferroccl-bench --mem cuda --nranks N ARGS` on one simulated GPU at INFO, logs
/// in `dir`, with `env` set (the one-GPU path's own variables unset otherwise), and
/// asserts it succeeded (every result checked).
fn sim_bench_logged(dir: &std::path::Path, nranks: usize, args: &[&str], env: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/sim-gpu.sh"))
        .arg(env!("CARGO_BIN_EXE_ferroccl-bench"))
        .args(["--mem", "cuda", "--nranks", &nranks.to_string()])
        .args(args)
        .env("FERROCCL_DEBUG", "INFO")
        .env("FERROCCL_DEBUG_FILE", dir.join("log-%p.txt"))
        .env("FERROCCL_SIM_DEVICES", "1")
        .env_remove("FERROCCL_BACKEND")
        .env_remove("FERROCCL_CUDA_IPC")
        .env_remove("FERROCCL_CUDA_MPS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("scripts/sim-gpu.sh runs");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// On device memory (the simulated GPU) each call's line names the backend of the
/// router that served it: the IPC path when both ranks share the GPU, staged through
/// host memory with FERROCCL_CUDA_IPC=0.
#[test]
fn device_calls_name_the_backend_and_algorithm_that_served_them() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    for (ipc, want_join, want_call) in [
        ("0", "backends builtin)", "backend staged algorithm board"),
        ("1", "backends ipc > builtin)", "backend ipc algorithm "),
    ] {
        let dir = std::env::temp_dir().join(format!("fccl-log-dev{ipc}-{}", std::process::id()));
        let args = ["all_reduce", "-b", "64", "-e", "64", "-n", "1", "-w", "0"];
        sim_bench_logged(&dir, 2, &args, &[("FERROCCL_CUDA_IPC", ipc)]);
        let files = logs(&dir);
        assert_eq!(files.len(), 2, "one log per rank: {files:?}");
        for (name, text) in files {
            assert!(text.contains(want_join), "FERROCCL_CUDA_IPC={ipc}: {name} lacks {want_join:?}:\n{text}");
            let l = text
                .lines()
                .find(|l| l.contains("fcclAllReduce count 16 float"))
                .unwrap_or_else(|| panic!("the all_reduce is logged in {name}:\n{text}"));
            assert!(l.contains(want_call), "FERROCCL_CUDA_IPC={ipc}: {want_call:?} missing from {l:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Ranks that share one GPU reduce narrow floats, over more than 8 ranks, and over a wire
/// type on the device path: each such call's line names the ipc backend on every rank.
#[test]
fn narrow_float_wire_and_many_rank_reductions_are_served_by_the_ipc_backend() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let n = 10;
    for (args, needle) in [
        (&["all_reduce", "-d", "bfloat16"][..], "fcclAllReduce count 32 bfloat16 backend "),
        (&["all_reduce", "-d", "f8e5m2", "-o", "max"][..], "fcclAllReduce count 64 f8e5m2 backend "),
        (&["reduce_scatter", "-d", "half", "-o", "avg"][..], "fcclReduceScatter count 3 half backend "),
        (
            &["all_reduce_wire", "-d", "float", "--wire", "bfloat16"][..],
            "fcclAllReduce count 16 float wire bfloat16 backend ",
        ),
    ] {
        let dir = std::env::temp_dir().join(format!("fccl-log-narrow-{}-{}", args[2], std::process::id()));
        sim_bench_logged(&dir, n, &[&["-b", "64", "-e", "64", "-n", "1", "-w", "0"][..], args].concat(), &[]);
        let files = logs(&dir);
        assert_eq!(files.len(), n, "one log per rank: {files:?}");
        for (name, text) in files {
            let lines: Vec<&str> = text.lines().filter(|l| l.contains(needle)).collect();
            assert!(!lines.is_empty(), "{args:?}: no {needle:?} in {name}:\n{text}");
            for l in lines {
                assert!(l.contains(&format!("{needle}ipc algorithm ")), "{args:?}: not served by ipc: {l}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// On one simulated GPU, send/recv and the axis forms run on the IPC path, not staged:
/// every call's line names the backend and how it moved the data, without MPS (rank 0
/// moves a collective's data, with 2D copies for the axis forms) and with it forced on
/// (every rank moves its share); the benchmark checks every result.
#[test]
fn device_send_recv_and_axis_forms_are_served_by_the_ipc_path() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    for (mps, gather, scatter) in [("0", "exec-copy2d", "exec-copy2d-reduce"), ("1", "mps-shares", "mps-shares")] {
        let dir = std::env::temp_dir().join(format!("fccl-log-p2p-mps{mps}-{}", std::process::id()));
        let args =
            ["send_recv", "all_gather_axis", "reduce_scatter_axis", "-b", "64K", "-e", "64K", "-n", "1", "-w", "0"];
        sim_bench_logged(&dir, 2, &args, &[("FERROCCL_CUDA_IPC", "1"), ("FERROCCL_CUDA_MPS", mps)]);
        let files = logs(&dir);
        assert_eq!(files.len(), 2, "one log per rank: {files:?}");
        let all: Vec<&str> = files.iter().flat_map(|(_, t)| t.lines()).collect();
        let calls = |needle: &str| -> Vec<&str> { all.iter().copied().filter(|l| l.contains(needle)).collect() };
        for (call, want) in [
            ("fcclSend count 16384 float", "backend ipc algorithm p2p-pull"),
            ("fcclRecv count 16384 float", "backend ipc algorithm p2p-pull"),
            ("fcclAllGather count 8192 float", "backend ipc algorithm "),
            ("fcclReduceScatter count 8192 float", "backend ipc algorithm "),
        ] {
            let lines = calls(call);
            assert!(!lines.is_empty(), "MPS {mps}: no {call:?} line in the logs:\n{}", all.join("\n"));
            for l in lines {
                assert!(l.contains(want), "MPS {mps}: {want:?} missing from {l:?}");
            }
        }
        for (call, how) in [("fcclAllGather count 8192 float", gather), ("fcclReduceScatter count 8192 float", scatter)]
        {
            assert!(calls(call).iter().any(|l| l.contains(how)), "MPS {mps}: no {call:?} line says {how:?}");
        }
        let setup = if mps == "1" { "every rank moves its share (MPS)" } else { "rank 0 moves the data" };
        assert_eq!(calls(&format!("ranks on one GPU: {setup}")).len(), 2, "MPS {mps}: each rank logs its set-up");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
