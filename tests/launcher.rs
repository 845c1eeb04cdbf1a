//! Launchers: ferroccl-run's command line (the variables it sets, `-x`, `--version`,
//! short usage errors, process placement with `--bind`), and fcclCommInitFromEnv under
//! the variables of Slurm, PMI, Open MPI and torchrun, set by hand on separate
//! processes (real mpirun and torchrun run in scripts/test.sh).

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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

// ------------------------------------------------------------- command line

fn run(args: &[&str]) -> Output {
    Command::new(RUN).args(args).output().expect("run ferroccl-run")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Each rank's `NAME=value` lines for `names`, by rank, from `ferroccl-run -n 2 ARGS -- env`.
fn rank_env(args: &[&str], names: &[&str]) -> Vec<BTreeMap<String, String>> {
    let out = Command::new(RUN).args(["-n", "2"]).args(args).args(["--", "env"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut by_rank = vec![BTreeMap::new(); 2];
    for l in text(&out.stdout).lines() {
        let (rank, rest) = l.trim_start_matches('[').split_once("] ").expect("prefixed line");
        if let Some((k, v)) = rest.split_once('=') {
            if names.contains(&k) {
                by_rank[rank.parse::<usize>().unwrap()].insert(k.to_string(), v.to_string());
            }
        }
    }
    by_rank
}

#[test]
fn every_rank_gets_torchruns_variables_too() {
    let names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "FERROCCL_RANK", "FERROCCL_ROOT_ADDR"];
    let got = rank_env(&[], &names);
    for (r, m) in got.iter().enumerate() {
        assert_eq!(m["RANK"], r.to_string(), "{m:?}");
        assert_eq!(m["LOCAL_RANK"], r.to_string(), "{m:?}");
        assert_eq!(m["FERROCCL_RANK"], r.to_string(), "{m:?}");
        assert_eq!(m["WORLD_SIZE"], "2", "{m:?}");
        assert_eq!(m["LOCAL_WORLD_SIZE"], "2", "{m:?}");
    }
}

#[test]
fn master_port_is_a_free_port_kept_for_rank_0() {
    let got = Command::new(RUN)
        .env_remove("MASTER_ADDR")
        .env_remove("MASTER_PORT")
        .args(["-n", "2", "--", "sh", "-c", "echo \"$MASTER_ADDR $MASTER_PORT $FERROCCL_ROOT_ADDR\""])
        .output()
        .unwrap();
    assert!(got.status.success(), "{got:?}");
    let lines: Vec<String> = text(&got.stdout).lines().map(|l| l.split_once("] ").unwrap().1.to_string()).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0], lines[1], "every rank gets the same MASTER_ADDR/PORT");
    let f: Vec<&str> = lines[0].split(' ').collect();
    assert_eq!(f[0], "127.0.0.1");
    let port: u16 = f[1].parse().unwrap();
    assert!(!f[2].ends_with(&format!(":{port}")), "MASTER_PORT must not be the rendezvous port: {lines:?}");
    // A program in rank 0 can listen there as torch's TCPStore does (SO_REUSEADDR: std's listeners set it).
    let listen = Command::new(RUN)
        .args(["-n", "1", "--", std::env::current_exe().unwrap().to_str().unwrap()])
        .args(["--exact", "listen_on_master_port", "--nocapture", "--test-threads=1", "-q"])
        .env("LAUNCHER_LISTEN", "1")
        .output()
        .unwrap();
    assert!(text(&listen.stdout).contains("LISTENED"), "{listen:?}");
}

/// Run by `master_port_is_a_free_port_kept_for_rank_0` inside ferroccl-run.
#[test]
fn listen_on_master_port() {
    if std::env::var("LAUNCHER_LISTEN").is_err() {
        return;
    }
    let port: u16 = std::env::var("MASTER_PORT").unwrap().parse().unwrap();
    let l = TcpListener::bind(("127.0.0.1", port)).expect("listen on MASTER_PORT");
    // The launcher keeps it from everyone else: a bind without SO_REUSEADDR is refused.
    // SAFETY: plain socket calls on a fresh descriptor and a local sockaddr_in.
    let taken = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        let mut a: libc::sockaddr_in = std::mem::zeroed();
        a.sin_family = libc::AF_INET as libc::sa_family_t;
        a.sin_port = port.to_be();
        a.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let rc = libc::bind(fd, &a as *const _ as *const libc::sockaddr, std::mem::size_of_val(&a) as libc::socklen_t);
        libc::close(fd);
        rc != 0
    };
    drop(l);
    assert!(taken, "port {port} was free for anyone");
    println!("LISTENED");
}

#[test]
fn given_master_variables_are_left_alone() {
    let got = rank_env(&["-x", "MASTER_PORT=29999"], &["MASTER_ADDR", "MASTER_PORT"]);
    for m in &got {
        assert_eq!(m.get("MASTER_PORT").map(String::as_str), Some("29999"), "{m:?}");
        // Only one given: the other is not invented (torch then says what is missing).
        if std::env::var_os("MASTER_ADDR").is_none() {
            assert!(!m.contains_key("MASTER_ADDR"), "{m:?}");
        }
    }
}

#[test]
fn x_sets_or_passes_variables_like_mpirun() {
    let out = Command::new(RUN)
        .env("LAUNCHER_PASSED", "from the launcher")
        .env_remove("LAUNCHER_UNSET")
        .args(["-n", "2", "-x", "LAUNCHER_SET=a=b", "-x", "LAUNCHER_PASSED", "-x", "LAUNCHER_EMPTY=", "-x"])
        .args(["LAUNCHER_UNSET", "--", "sh", "-c"])
        .arg("echo \"$LAUNCHER_SET|$LAUNCHER_PASSED|${LAUNCHER_EMPTY-unset}|${LAUNCHER_UNSET-unset}\"")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    for l in lines {
        assert!(l.ends_with("] a=b|from the launcher||unset"), "{l}");
    }
    // As mpirun: a variable that is not set is a warning, not a failure.
    assert!(text(&out.stderr).contains("-x LAUNCHER_UNSET: LAUNCHER_UNSET is not set here"), "{out:?}");
}

#[test]
fn x_cannot_set_a_per_rank_variable() {
    for var in ["RANK=1", "FERROCCL_WORLD_SIZE=4", "LOCAL_RANK", "FERROCCL_UNIQUE_ID=00"] {
        let out = run(&["-n", "1", "-x", var, "true"]);
        assert_eq!(out.status.code(), Some(2), "{var}: {out:?}");
        let name = var.split('=').next().unwrap();
        assert!(text(&out.stderr).contains(&format!("ferroccl-run sets {name} itself")), "{out:?}");
    }
}

#[test]
fn version_prints_the_crate_version() {
    let out = run(&["--version"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), format!("ferroccl-run {}\n", env!("CARGO_PKG_VERSION")));
}

#[test]
fn usage_errors_are_three_lines_on_stderr_with_status_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["--frobnicate", "-n", "2", "true"], "unknown option --frobnicate"),
        (&["true"], "give the number of ranks with -n N"),
        (&["-n", "2"], "give the program to run"),
        (&["-n", "zero", "true"], "-n zero: give a number of ranks of at least 1"),
        (&["-n", "0", "true"], "-n 0: give a number of ranks of at least 1"),
        (&["-n"], "-n needs a number of ranks"),
        (&["-n", "1", "-x"], "-x needs VAR or VAR=VALUE"),
        (&["-n", "1", "-x", "=v", "true"], "-x =v: give a variable name"),
        (&["-n", "1", "--grace", "-1", "true"], "--grace -1: give seconds"),
        (&["-n", "1", "--grace", "inf", "true"], "--grace inf: give seconds"),
    ];
    for (args, want) in cases {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
        let err = text(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 3, "{args:?}: {err}");
        assert!(lines[0].starts_with(&format!("ferroccl-run: {want}")), "{args:?}: {err}");
        assert!(lines[1].starts_with("usage: ferroccl-run -n N "), "{err}");
        assert_eq!(lines[2], "run ferroccl-run --help for more");
    }
}

#[test]
fn help_is_one_screen_and_help_env_lists_the_variables() {
    let out = run(&["--help"]);
    assert!(out.status.success(), "{out:?}");
    let t = text(&out.stdout);
    assert!(t.starts_with("usage: ferroccl-run -n N "), "{t}");
    assert!(t.lines().count() <= 24, "--help is {} lines: keep it to a screen\n{t}", t.lines().count());
    for s in ["-x VAR[=VALUE]", "--bind core|none", "--grace", "--no-prefix", "--help-env", "--version"] {
        assert!(t.contains(s), "{s} missing from --help");
    }
    let out = run(&["--help-env"]);
    assert!(out.status.success(), "{out:?}");
    let t = text(&out.stdout);
    for s in ["LOCAL_WORLD_SIZE", "MASTER_PORT", "FERROCCL_TIMEOUT_MS", "SLURM_STEP_NUM_TASKS"] {
        assert!(t.contains(s), "{s} missing from --help-env");
    }
}

#[test]
fn a_mistyped_option_gets_the_closest_one() {
    let out = run(&["--nrank", "2", "true"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = text(&out.stderr);
    assert!(err.starts_with("ferroccl-run: unknown option --nrank; did you mean --nranks?"), "{err}");
    let out = run(&["--frobnicate", "true"]);
    let err = text(&out.stderr);
    assert!(err.starts_with("ferroccl-run: unknown option --frobnicate\n"), "no guess when none is near: {err}");
}

#[test]
fn nccl_makes_every_rank_load_ferroccls_nccl_library_by_name() {
    // What PyTorch does: dlopen("libnccl.so.2") by name; it must get ferroccl's (the shim
    // exports its marker), however LD_PRELOAD and LD_LIBRARY_PATH were before.
    let probe = "import ctypes, os; l = ctypes.CDLL('libnccl.so.2'); \
                 print('shim', hasattr(l, 'ferroccl_nccl_shim'), os.environ['LD_PRELOAD'].split(':')[0])";
    let out = Command::new(RUN)
        .args(["--nccl", "-n", "2", "python3", "-c", probe])
        .env("LD_PRELOAD", "")
        .output()
        .expect("ferroccl-run");
    assert!(out.status.success(), "{out:?}");
    let t = text(&out.stdout);
    assert_eq!(t.matches("shim True ").count(), 2, "{t}");
    let lib = t.lines().next().unwrap().rsplit(' ').next().unwrap().to_string();
    assert!(std::path::Path::new(&lib).is_file(), "{lib}");
    // Without -n: one command (a launcher such as torchrun) runs with it, as itself.
    let out = Command::new(RUN).args(["--nccl", "python3", "-c", probe]).output().expect("ferroccl-run");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), format!("shim True {lib}\n"));
    let out = run(&["--nccl=/no/such/libnccl.so.2", "true"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(text(&out.stderr).contains("--nccl=/no/such/libnccl.so.2: no such file"), "{out:?}");
}

// ------------------------------------------------ other launchers, by hand

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// This test binary as rank `r`, with `vars` (`{r}` replaced by the rank) and nothing
/// else of any launcher.
fn rank(r: usize, vars: &[(&str, &str)]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "rank_entry", "--nocapture", "--test-threads=1", "-q"]);
    // Only the test's variables count: none of the registry's come from this process.
    for v in ferroccl::env::ALL {
        c.env_remove(v.name);
    }
    for (k, v) in vars {
        c.env(k, v.replace("{r}", &r.to_string()));
    }
    c.env("LAUNCHER_RANK", "1").env("FERROCCL_TIMEOUT_MS", "30000").stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Starts `n` ranks with `vars` and returns each one's output, by rank.
fn job(n: usize, vars: &[(&str, &str)]) -> Vec<String> {
    let kids: Vec<_> = (0..n).map(|r| rank(r, vars).spawn().unwrap()).collect();
    kids.into_iter()
        .map(|k| {
            let o = k.wait_with_output().unwrap();
            format!("{}{}", text(&o.stdout), text(&o.stderr))
        })
        .collect()
}

/// Asserts every rank of `n` initialised as rank r of n and summed correctly.
fn assert_job_ok(n: usize, vars: &[(&str, &str)]) {
    let outs = job(n, vars);
    let sum = n * (n + 1) / 2;
    for (r, o) in outs.iter().enumerate() {
        assert!(o.contains(&format!("RANKED rank={r} size={n} sum={sum}")), "rank {r} of {vars:?}: {o}");
    }
}

/// The body of every rank: fcclCommInitFromEnv, then an all_reduce of rank+1.
#[test]
fn rank_entry() {
    use ferroccl::ffi::as_out;
    use ferroccl::ffi::coll::fcclAllReduce;
    use ferroccl::ffi::comm::{
        fcclCommCount, fcclCommDestroy, fcclCommInitFromEnv, fcclCommUserRank, fcclGetLastError,
    };
    if std::env::var("LAUNCHER_RANK").is_err() {
        return;
    }
    let mut comm = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let rc = unsafe { fcclCommInitFromEnv(as_out(&mut comm)) };
    if rc != 0 {
        // SAFETY: returns a NUL-terminated string.
        let msg = unsafe { std::ffi::CStr::from_ptr(fcclGetLastError(std::ptr::null_mut())) };
        println!("INITFAIL rc={rc} msg={}", msg.to_string_lossy());
        return;
    }
    let (mut r, mut n) = (-1, -1);
    // SAFETY: a live communicator and valid out-pointers and buffers.
    unsafe {
        assert_eq!(fcclCommUserRank(comm, as_out(&mut r)), 0);
        assert_eq!(fcclCommCount(comm, as_out(&mut n)), 0);
        let send = [r + 1];
        let mut recv = [0i32];
        let rc = fcclAllReduce(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            1,
            ferroccl::ffi::fcclInt32,
            ferroccl::ffi::fcclSum,
            comm,
            std::ptr::null_mut(),
        );
        assert_eq!(rc, 0);
        println!("RANKED rank={r} size={n} sum={}", recv[0]);
        fcclCommDestroy(comm);
    }
}

fn addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

#[test]
fn srun_tasks_find_each_other() {
    let a = addr();
    let vars = [
        ("SLURM_PROCID", "{r}"),
        ("SLURM_STEP_NUM_TASKS", "3"),
        ("SLURM_LOCALID", "{r}"),
        ("SLURM_NTASKS", "3"),
        ("FERROCCL_ROOT_ADDR", a.as_str()),
        ("FERROCCL_SECRET", "slurm-by-hand"),
    ];
    assert_job_ok(3, &vars);
    // Without FERROCCL_SECRET the job id and step id serve as the secret.
    let a = addr();
    let vars = [
        ("SLURM_PROCID", "{r}"),
        ("SLURM_STEP_NUM_TASKS", "2"),
        ("SLURM_JOB_ID", "4242"),
        ("SLURM_STEP_ID", "0"),
        ("FERROCCL_ROOT_ADDR", a.as_str()),
    ];
    assert_job_ok(2, &vars);
}

#[test]
fn pmi_ranks_find_each_other() {
    let a = addr();
    let vars = [
        ("PMI_RANK", "{r}"),
        ("PMI_SIZE", "2"),
        ("MPI_LOCALRANKID", "{r}"),
        ("FERROCCL_ROOT_ADDR", a.as_str()),
        ("FERROCCL_SECRET", "hydra-by-hand"),
    ];
    assert_job_ok(2, &vars);
}

#[test]
fn mpi_variables_win_over_the_allocations_slurm_variables() {
    // mpirun inside a Slurm allocation: every rank inherits mpirun's SLURM_PROCID=0.
    let a = addr();
    let vars = [
        ("OMPI_COMM_WORLD_RANK", "{r}"),
        ("OMPI_COMM_WORLD_SIZE", "3"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "{r}"),
        ("PMIX_RANK", "{r}"),
        ("PMIX_NAMESPACE", "prterun-by-hand-1"),
        ("SLURM_PROCID", "0"),
        ("SLURM_STEP_NUM_TASKS", "1"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_JOB_ID", "77"),
        ("FERROCCL_ROOT_ADDR", a.as_str()),
    ];
    assert_job_ok(3, &vars);
}

#[test]
fn torchrun_variables_without_the_agent_store_meet_at_master_port() {
    let port = free_port().to_string();
    let vars = [
        ("RANK", "{r}"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "{r}"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", port.as_str()),
        ("TORCHELASTIC_RUN_ID", "by-hand-run"),
        ("TORCHELASTIC_USE_AGENT_STORE", "False"),
    ];
    assert_job_ok(2, &vars);
}

#[test]
fn a_job_of_one_rank_needs_no_rendezvous() {
    assert_job_ok(1, &[("SLURM_PROCID", "0"), ("SLURM_STEP_NUM_TASKS", "1")]);
    assert_job_ok(1, &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1")]);
}

#[test]
fn a_slurm_batch_script_fails_at_once_instead_of_waiting() {
    let t0 = Instant::now();
    let outs = job(1, &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4"), ("SLURM_JOB_ID", "9")]);
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    let o = &outs[0];
    assert!(o.contains("INITFAIL rc=5"), "{o}");
    assert!(o.contains("SLURM_PROCID=0 without SLURM_STEP_NUM_TASKS (SLURM_NTASKS=4"), "{o}");
}

#[test]
fn a_rank_without_its_launchers_size_names_both() {
    let outs = job(1, &[("PMI_RANK", "0"), ("WORLD_SIZE", "2")]);
    assert!(
        outs[0].contains("INITFAIL rc=5") && outs[0].contains("PMI_RANK=0") && outs[0].contains("PMI_SIZE is not set"),
        "{}",
        outs[0]
    );
}

#[test]
fn mpirun_without_an_address_says_how_to_give_one() {
    let outs = job(1, &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]);
    let o = &outs[0];
    assert!(o.contains("INITFAIL rc=5") && o.contains("mpirun -x FERROCCL_ROOT_ADDR=host:port"), "{o}");
    assert!(o.contains("rank 0 of 2 from Open MPI's mpirun (OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_SIZE=2)"), "{o}");
}

#[test]
fn mpirun_variables_without_a_pmix_server_fail_naming_pmix_and_the_fix() {
    // PMIX_NAMESPACE without the server mpirun runs: PMIx cannot stand in for an address.
    let vars = [
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("PMIX_RANK", "1"),
        ("PMIX_NAMESPACE", "prterun-by-hand-2"),
    ];
    let t0 = Instant::now();
    let o = &job(1, &vars)[0];
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    assert!(o.contains("INITFAIL"), "{o}");
    // Where libpmix is installed PMIx_Init fails; where it is not, loading it does.
    assert!(o.contains("PMIx_Init failed") || o.contains("libpmix could not be loaded"), "{o}");
    assert!(o.contains("FERROCCL_ROOT_ADDR") && o.contains("mpirun -x FERROCCL_ROOT_ADDR=host:port"), "{o}");
}

#[test]
fn ranks_set_up_by_hand_are_not_said_to_come_from_ferroccl_run() {
    let outs = job(1, &[("FERROCCL_RANK", "0"), ("FERROCCL_WORLD_SIZE", "2")]);
    let o = &outs[0];
    assert!(o.contains("INITFAIL rc=5"), "{o}");
    assert!(o.contains("rank 0 of 2 from FERROCCL_ variables set by hand"), "{o}");
    assert!(!o.contains("from ferroccl-run"), "{o}");
    let outs = job(1, &[("FERROCCL_RANK", "0")]);
    assert!(outs[0].contains("FERROCCL_RANK=0 comes from FERROCCL_ variables set by hand"), "{}", outs[0]);
}

#[test]
fn a_program_started_on_its_own_is_a_job_of_one_rank() {
    // As an MPI singleton: no launcher variable at all gives rank 0 of 1, no rendezvous.
    assert_job_ok(1, &[]);
    // A launcher's size without its rank is a launch gone wrong, not a lone program.
    let outs = job(1, &[("WORLD_SIZE", "2")]);
    assert!(outs[0].contains("INITFAIL rc=5") && outs[0].contains("yet WORLD_SIZE is set"), "{}", outs[0]);
}
