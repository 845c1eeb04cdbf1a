//! FERROCCL_DEBUG=INFO writes one line per collective, to FERROCCL_DEBUG_FILE with
//! %h (host) and %p (pid) substituted; the default level writes nothing for
//! successful calls.

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
        for field in ["rank ", "comm ", "seq ", "backend host", " us"] {
            assert!(l.contains(field), "{field:?} missing from {l:?}");
        }
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
        for (name, text) in logs(&dir) {
            let line = text.lines().find(|l| l.contains("ranks on this host share")).expect("policy logged");
            let want =
                if cpus >= 2 { format!("share {cpus} CPUs; waits spin 20 us") } else { "waits spin 2 us".into() };
            assert!(line.contains(&want), "--bind {bind}, {name}: {line}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
