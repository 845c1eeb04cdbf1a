//! Names in the environment that look meant for ferroccl but mean nothing to it: a
//! FERROCCL_ name that is no variable (a slip: the closest known name is given), and
//! NCCL's tuning variables, which ferroccl has nothing to tune with.

use super::{Var, ALL, NCCL_NSOCKS_PERTHREAD, NCCL_SOCKET_NTHREADS, NSOCKS};

/// Variables of ferroccl's tools and tests (the simulated GPU, the benchmark, the
/// Python package, the test suites), which the library does not read but which are
/// no mistake in its environment: names, and prefixes ending in `_`.
const TOOL_VARS: &[&str] = &[
    "FERROCCL_LIB",
    "FERROCCL_RUN",
    "FERROCCL_SIMGPU",
    "FERROCCL_SIM_",
    "FERROCCL_BENCH_",
    "FERROCCL_TEST_",
    "FERROCCL_TORCH_",
    "FERROCCL_LEASE_",
    "FERROCCL_FUZZ_ITERS",
    "FERROCCL_BLESS",
    "FERROCCL_COMMIT",
    "FERROCCL_FAKE_MPS_DIR",
    "FERROCCL_LIB_DIR",
    "FERROCCL_C_TESTS_DIR",
    "FERROCCL_NCCL_REFERENCE",
    "FERROCCL_NVRTC_DIR",
];

/// NCCL's variables that tune or select what NCCL's own kernels, transports and
/// plug-ins do (and NCCL_COMM_ID, NCCL_COMM_BLOCKING, NCCL_DEBUG_SUBSYS, which
/// ferroccl does not read either: docs/nccl.md): nothing in ferroccl answers to them.
pub const NCCL_NO_EFFECT: &str = "NCCL_ALGO NCCL_PROTO NCCL_P2P_DISABLE NCCL_P2P_LEVEL \
    NCCL_P2P_NET_CHUNKSIZE NCCL_P2P_NVL_CHUNKSIZE NCCL_P2P_PCI_CHUNKSIZE NCCL_SHM_DISABLE \
    NCCL_SHM_USE_CUDA_MEMCPY NCCL_IB_DISABLE NCCL_IB_HCA NCCL_IB_GID_INDEX NCCL_IB_TIMEOUT \
    NCCL_IB_RETRY_CNT NCCL_IB_SL NCCL_IB_TC NCCL_IB_QPS_PER_CONNECTION NCCL_NET NCCL_NET_PLUGIN \
    NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_NET_SHARED_BUFFERS NCCL_BUFFSIZE NCCL_NTHREADS \
    NCCL_MAX_NCHANNELS NCCL_MIN_NCHANNELS NCCL_MAX_CTAS NCCL_MIN_CTAS NCCL_CGA_CLUSTER_SIZE \
    NCCL_NCHANNELS_PER_NET_PEER NCCL_MIN_P2P_NCHANNELS NCCL_MAX_P2P_NCHANNELS NCCL_LAUNCH_MODE \
    NCCL_CUMEM_ENABLE NCCL_CUMEM_HOST_ENABLE NCCL_NVLS_ENABLE NCCL_MNNVL_ENABLE \
    NCCL_COLLNET_ENABLE NCCL_CROSS_NIC NCCL_PXN_DISABLE NCCL_NVB_DISABLE NCCL_GDRCOPY_ENABLE \
    NCCL_TOPO_FILE NCCL_TOPO_DUMP_FILE NCCL_GRAPH_FILE NCCL_GRAPH_DUMP_FILE NCCL_LL_THRESHOLD \
    NCCL_LL128_ENABLE NCCL_TREE_THRESHOLD NCCL_SINGLE_RING_THRESHOLD NCCL_CHECKS_DISABLE \
    NCCL_CHECK_POINTERS NCCL_IGNORE_CPU_AFFINITY NCCL_RUNTIME_CONNECT NCCL_WORK_FIFO_DEPTH \
    NCCL_SOCKET_FAMILY NCCL_DEBUG_SUBSYS NCCL_COMM_BLOCKING NCCL_COMM_ID";

/// The known name closest to `name` (any case), where one is close enough to be a slip.
fn closest(name: &str) -> Option<&'static str> {
    let up = name.to_ascii_uppercase();
    let known = ALL.iter().map(|v| v.name).filter(|n| n.starts_with("FERROCCL_"));
    let (d, best) = known.map(|k| (levenshtein(&up, k), k)).min()?;
    let tail = up.len().saturating_sub("FERROCCL_".len());
    (d <= (tail / 3).max(2)).then_some(best)
}

/// The word of `known` closest to `word`, where one is close enough to be a slip (a
/// third of its length, at least 2 edits): for "did you mean" in command lines.
pub fn closest_word<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    let (d, best) = known.iter().map(|&k| (levenshtein(word, k), k)).min()?;
    (d <= (word.len() / 3).max(2)).then_some(best)
}

/// Edits (insertions, deletions, substitutions of one byte) that turn `a` into `b`.
fn levenshtein(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = (diag + usize::from(ca != cb)).min(row[j] + 1).min(up + 1);
            diag = up;
        }
    }
    row[b.len()]
}

/// What to say about `name` in this process's environment, if anything: (true for a
/// warning, false for an INFO line, the line). `nccl_aliases`: this is libnccl.so.2,
/// where NCCL's socket counts stand in for FERROCCL_NSOCKS.
fn remark(name: &str, nccl_aliases: bool) -> Option<(bool, String)> {
    if name.to_ascii_uppercase().starts_with("FERROCCL_") {
        let tool = |t: &&str| if t.ends_with('_') { name.starts_with(t) } else { name == *t };
        if ALL.iter().any(|v| v.name == name) || TOOL_VARS.iter().any(tool) {
            return None;
        }
        let line = match closest(name) {
            Some(k) => format!("{name} is not a ferroccl variable; did you mean {k}?"),
            None => format!("{name} is not a ferroccl variable and has no effect (ferroccl-run --help-env lists them)"),
        };
        return Some((true, line));
    }
    if NCCL_NO_EFFECT.split_whitespace().any(|n| n == name) {
        return Some((false, format!("{name} has no effect in ferroccl: it tunes NCCL's own kernels and transports")));
    }
    let sockets: [&Var; 2] = [&NCCL_NSOCKS_PERTHREAD, &NCCL_SOCKET_NTHREADS];
    if !nccl_aliases && sockets.iter().any(|v| v.name == name) {
        let line = format!(
            "{name} has no effect in libferroccl (it has, through libferroccl_nccl.so as libnccl.so.2); set {} instead",
            NSOCKS.name
        );
        return Some((false, line));
    }
    None
}

/// What to say about this process's environment (see [`remark`]), in name order:
/// the caller (a communicator's first creation) logs each line once per process.
pub fn remarks() -> Vec<(bool, String)> {
    let aliases = super::NCCL_ALIASES.load(std::sync::atomic::Ordering::Relaxed);
    let mut names: Vec<String> = std::env::vars_os().map(|(k, _)| k.to_string_lossy().into_owned()).collect();
    names.sort();
    names.iter().filter_map(|n| remark(n, aliases)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_get_the_closest_known_one() {
        assert_eq!(closest("FERROCCL_TIMOUT_MS"), Some("FERROCCL_TIMEOUT_MS"));
        assert_eq!(closest("ferroccl_debug"), Some("FERROCCL_DEBUG"));
        assert_eq!(closest("FERROCCL_NSOCK"), Some("FERROCCL_NSOCKS"));
        assert_eq!(closest("FERROCCL_ZZZ"), None);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        let opts = ["-n", "--nranks", "--bind", "--grace", "--no-prefix"];
        assert_eq!(closest_word("--nrank", &opts), Some("--nranks"));
        assert_eq!(closest_word("--noprefix", &opts), Some("--no-prefix"));
        assert_eq!(closest_word("--verbose", &opts), None, "no near word: no guess");
        let (warn, line) = remark("FERROCCL_TIMOUT_MS", false).unwrap();
        assert!(warn);
        assert_eq!(line, "FERROCCL_TIMOUT_MS is not a ferroccl variable; did you mean FERROCCL_TIMEOUT_MS?");
        assert!(remark("FERROCCL_ZZZ", false).unwrap().1.contains("ferroccl-run --help-env"));
        // Known variables, and those of ferroccl's tools, are no mistake.
        for ok in ["FERROCCL_TIMEOUT_MS", "FERROCCL_LOCAL_SIZE", "FERROCCL_SIM_DEVICES", "FERROCCL_LIB", "PATH"] {
            assert_eq!(remark(ok, false), None, "{ok}");
        }
    }

    #[test]
    fn nccl_tuning_variables_have_no_effect() {
        for name in ["NCCL_ALGO", "NCCL_PROTO", "NCCL_P2P_DISABLE", "NCCL_BUFFSIZE", "NCCL_COMM_ID"] {
            let (warn, line) = remark(name, false).unwrap();
            assert!(!warn && line.starts_with(&format!("{name} has no effect in ferroccl")), "{line}");
        }
        assert!(remark("NCCL_NSOCKS_PERTHREAD", false).unwrap().1.contains("FERROCCL_NSOCKS"));
        assert_eq!(remark("NCCL_NSOCKS_PERTHREAD", true), None);
        // Those ferroccl reads.
        for name in ["NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_SOCKET_IFNAME", "NCCL_ALGORITHM"] {
            assert_eq!(remark(name, false), None, "{name}");
        }
    }
}
