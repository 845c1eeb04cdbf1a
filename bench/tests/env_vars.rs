//! Settings that would silently mean something else are refused or warned about, in
//! real ranks (two processes of ferroccl-bench, which create their communicators with
//! fcclCommInitFromEnv): a wrong value of a variable that changes what the program does
//! fails the creation naming the variable, the value and the form; a wrong tuning or
//! log value and a misspelt FERROCCL_ name warn once per process; NCCL_DEBUG is
//! honoured by libferroccl where FERROCCL_DEBUG is unset, and NCCL's tuning variables
//! get an INFO line saying they have no effect. These tests live with the bench crate,
//! where cargo builds and names the binary they run.

use std::process::{Command, Output};

/// The variables of the log and the ones these tests set, removed from what the
/// ranks inherit so that the suite's environment cannot change the outcome.
const CLEARED: &[&str] = &[
    "FERROCCL_DEBUG",
    "FERROCCL_DEBUG_FILE",
    "NCCL_DEBUG",
    "NCCL_DEBUG_FILE",
    "FERROCCL_TRANSPORT",
    "FERROCCL_CHECK",
    "NCCL_ALGO",
];

/// Runs a small all_reduce on 2 ranks with `env` set.
fn bench(env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferroccl-bench"));
    cmd.args(["--nranks", "2", "all_reduce", "-b", "64", "-e", "64", "-n", "1", "-w", "1", "--max-time", "0"]);
    for v in CLEARED {
        cmd.env_remove(v);
    }
    cmd.env("FERROCCL_TIMEOUT_MS", "60000");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("ferroccl-bench runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The lines of `text` that contain `needle`, each rank's (rank 1's are prefixed `[1] `).
fn per_rank(text: &str, needle: &str) -> [usize; 2] {
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(needle)).collect();
    let one = lines.iter().filter(|l| l.starts_with("[1] ")).count();
    [lines.len() - one, one]
}

#[test]
fn a_timeout_with_a_unit_fails_the_creation_naming_the_variable_value_and_form() {
    let o = bench(&[("FERROCCL_TIMEOUT_MS", "3000ms")]);
    let err = stderr(&o);
    assert!(!o.status.success(), "the ranks ran with FERROCCL_TIMEOUT_MS=3000ms:\n{err}");
    let want = "fcclCommInitFromEnv: FERROCCL_TIMEOUT_MS is \"3000ms\": give a whole number of milliseconds from 1 to 2^53 (e.g. 30000)";
    assert_eq!(per_rank(&err, want), [1, 1], "each rank's creation fails with {want:?}:\n{err}");
    assert!(err.contains("invalid argument"), "fcclInvalidArgument:\n{err}");
}

#[test]
fn an_unknown_transport_and_check_mode_fail_the_creation_naming_both() {
    let o = bench(&[("FERROCCL_TRANSPORT", "carrier-pigeon"), ("FERROCCL_CHECK", "maybe")]);
    let err = stderr(&o);
    assert!(!o.status.success(), "the ranks ran:\n{err}");
    for want in [
        "FERROCCL_TRANSPORT is \"carrier-pigeon\": give one of auto or tcp",
        "FERROCCL_CHECK is \"maybe\": give 0 or 1",
    ] {
        assert_eq!(per_rank(&err, want), [1, 1], "{want:?} from each rank:\n{err}");
    }
}

#[test]
fn a_misspelt_variable_is_warned_about_once_per_process_with_the_closest_name() {
    let o = bench(&[("FERROCCL_TIMOUT_MS", "5000")]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let want = "FERROCCL_TIMOUT_MS is not a ferroccl variable; did you mean FERROCCL_TIMEOUT_MS?";
    assert_eq!(per_rank(&err, want), [1, 1], "one warning per rank process:\n{err}");
}

#[test]
fn a_wrong_log_level_warns_and_logs_at_warn() {
    let o = bench(&[("FERROCCL_DEBUG", "LOUD")]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let want = "FERROCCL_DEBUG is \"LOUD\": give one of WARN, INFO or TRACE; ignored, WARN is used";
    assert_eq!(per_rank(&err, want), [1, 1], "one warning per rank process:\n{err}");
    assert!(!err.contains(" Info: "), "no INFO lines at WARN:\n{err}");
}

#[test]
fn an_unwritable_log_file_warns_and_logs_to_stderr() {
    let o = bench(&[("FERROCCL_DEBUG_FILE", "/nonexistent-dir/ferroccl-%p.log"), ("FERROCCL_DEBUG", "INFO")]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(per_rank(&err, "FERROCCL_DEBUG_FILE names \"/nonexistent-dir/ferroccl-"), [1, 1], "{err}");
    assert!(err.contains("joined communicator"), "the INFO lines go to stderr instead:\n{err}");
}

#[test]
fn nccl_debug_is_honoured_where_ferroccl_debug_is_unset() {
    let o = bench(&[("NCCL_DEBUG", "INFO")]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(per_rank(&err, "joined communicator"), [1, 1], "INFO lines from libferroccl:\n{err}");
    // FERROCCL_DEBUG wins over NCCL_DEBUG.
    let o = bench(&[("NCCL_DEBUG", "INFO"), ("FERROCCL_DEBUG", "WARN")]);
    let err = stderr(&o);
    assert!(o.status.success() && !err.contains(" Info: "), "{err}");
}

#[test]
fn nccl_tuning_variables_are_said_to_have_no_effect() {
    let o = bench(&[("NCCL_ALGO", "ring"), ("FERROCCL_DEBUG", "INFO")]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let want = "Info: NCCL_ALGO has no effect in ferroccl";
    assert_eq!(per_rank(&err, want), [1, 1], "one INFO line per rank process:\n{err}");
}
