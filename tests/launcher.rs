//! ferroccl-run's process placement: `--bind core` pins rank r to the r-th CPU the
//! launcher may use (when there are enough), `--bind none` (the default) pins nothing.

use std::process::Command;

const RUN: &str = env!("CARGO_BIN_EXE_ferroccl-run");

/// Each rank's `Cpus_allowed_list`, by rank, from a run of `ferroccl-run -n 2 args...`.
fn allowed(args: &[&str]) -> Vec<String> {
    let out = Command::new(RUN)
        .args(["-n", "2"])
        .args(args)
        .args(["--", "sh", "-c", "grep Cpus_allowed_list /proc/self/status"])
        .output()
        .expect("run ferroccl-run");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut by_rank = vec![String::new(); 2];
    for l in text.lines() {
        // "[r] Cpus_allowed_list:\tLIST"
        let (rank, rest) = l.trim_start_matches('[').split_once(']').expect("prefixed line");
        by_rank[rank.parse::<usize>().unwrap()] = rest.split(':').nth(1).unwrap().trim().to_string();
    }
    by_rank
}

fn my_cpus() -> Vec<usize> {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
    list.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().unwrap()..=b.parse().unwrap()).collect::<Vec<_>>(),
            None => vec![part.parse().unwrap()],
        })
        .collect()
}

#[test]
fn bind_core_pins_each_rank_to_its_own_cpu() {
    let cpus = my_cpus();
    let got = allowed(&["--bind", "core"]);
    if cpus.len() >= 2 {
        assert_eq!(got, [cpus[0].to_string(), cpus[1].to_string()]);
    } else {
        // Fewer CPUs than ranks: nothing is pinned.
        assert_eq!(got[0], got[1]);
    }
}

#[test]
fn by_default_ranks_keep_the_launchers_cpus() {
    let got = allowed(&[]);
    let mine = std::fs::read_to_string("/proc/self/status").unwrap();
    let mine = mine.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
    assert_eq!(got, [mine.clone(), mine]);
}

#[test]
fn bind_takes_core_or_none() {
    let out = Command::new(RUN).args(["-n", "1", "--bind", "socket", "--", "true"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bind socket: use core or none"), "{out:?}");
}
