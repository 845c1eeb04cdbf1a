//! Every environment variable ferroccl reads, in one place, with its default and meaning.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

mod names;
mod parse;
pub use names::{closest_word, remarks, NCCL_NO_EFFECT};
pub use parse::{resolve, take_warnings, Int};

/// One documented environment variable.
pub struct Var {
    pub name: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
}

pub const RANK: Var = Var { name: "FERROCCL_RANK", default: "", doc: "rank of this process (fcclCommInitFromEnv)" };
pub const WORLD_SIZE: Var =
    Var { name: "FERROCCL_WORLD_SIZE", default: "", doc: "number of ranks (fcclCommInitFromEnv)" };
pub const ROOT_ADDR: Var = Var {
    name: "FERROCCL_ROOT_ADDR",
    default: "",
    doc: "host:port of the rendezvous point; rank 0 serves it when no unique id is given. Unset with MASTER_ADDR/MASTER_PORT unset under mpirun or srun --mpi=pmix: rank 0's unique id passes through PMIx (libpmix loaded at run time)",
};
pub const UNIQUE_ID: Var = Var {
    name: "FERROCCL_UNIQUE_ID",
    default: "",
    doc: "unique id as 256 hex digits (set by ferroccl-run); takes precedence over FERROCCL_ROOT_ADDR",
};
pub const SECRET: Var = Var {
    name: "FERROCCL_SECRET",
    default: "",
    doc: "secret (any string, the same on every rank) that admits a rank to a FERROCCL_ROOT_ADDR or MASTER_ADDR/MASTER_PORT rendezvous and tells jobs apart; never sent, only proved. Unset: derived from TORCHELASTIC_RUN_ID, PMIX_NAMESPACE, OMPI_MCA_orte_ess_jobid or SLURM_JOB_ID/SLURM_STEP_ID (the first set), else fcclCommInitFromEnv refuses (ferroccl-run needs none)",
};
pub const TIMEOUT_MS: Var =
    Var { name: "FERROCCL_TIMEOUT_MS", default: "600000", doc: "bound on every blocking wait, in ms (1 to 2^53)" };
pub const DEBUG: Var = Var { name: "FERROCCL_DEBUG", default: "WARN", doc: "log level: WARN, INFO or TRACE" };
pub const DEBUG_FILE: Var =
    Var { name: "FERROCCL_DEBUG_FILE", default: "", doc: "log file instead of stderr (%h host, %p pid)" };
pub const BACKEND: Var = Var {
    name: "FERROCCL_BACKEND",
    default: "auto",
    doc: "backend for device memory when the config says AUTO: auto (NCCL if every rank has its own GPU), host or nccl",
};
pub const NCCL_LIBRARY: Var = Var {
    name: "FERROCCL_NCCL_LIBRARY",
    default: "",
    doc: "path to libnccl.so.2, tried before an already loaded one and the loader's search path",
};
pub const CUDA_IPC: Var = Var {
    name: "FERROCCL_CUDA_IPC",
    default: "1",
    doc: "1: device memory of ranks sharing one GPU (built-in backend) moves GPU to GPU through CUDA IPC mappings, ordered on the callers' streams; 0: staged through host memory instead",
};
pub const STAGING_CHUNK: Var = Var {
    name: "FERROCCL_STAGING_CHUNK",
    default: "4M",
    doc: "device calls staged through host memory (no NCCL, no CUDA IPC between the ranks' buffers) run in chunks of about this many bytes of host buffer (suffixes K, M, G; at most 32M), in two page-locked buffers: while the host runs the collective on one chunk, the stream copies the previous chunk out of the other buffer and the next one in; 0: every call staged whole. Must be the same on every rank",
};
pub const CUDA_MPS: Var = Var {
    name: "FERROCCL_CUDA_MPS",
    default: "auto",
    doc: "ranks sharing one GPU through MPS (nvidia-cuda-mps-control -d): auto (the driver's CU_DEVICE_ATTRIBUTE_MPS_ENABLED; off where the driver does not know it), 1 (every rank moves its share of each call at once), 0 (one rank moves each call's data, the others signal and wait: right without MPS, where the GPU time-slices between processes). Every rank must say yes for every rank to work",
};
pub const KERNEL_CACHE: Var = Var {
    name: "FERROCCL_KERNEL_CACHE",
    default: "",
    doc: "directory of compiled device kernels (NVRTC's CUBIN per program, architecture and NVRTC version), kept between processes so only the first pays for compiling; 0 or off: none. Unset: $XDG_CACHE_HOME/ferroccl/kernels, else ~/.cache/ferroccl/kernels",
};
pub const TRANSPORT: Var = Var {
    name: "FERROCCL_TRANSPORT",
    default: "auto",
    doc: "auto (shared memory on one host, TCP between hosts) or tcp (TCP everywhere)",
};
/// The most sockets one TCP link may have (`transport::tcp::MAX_SOCKS`): FERROCCL_NSOCKS's upper bound.
pub const NSOCKS_MAX: usize = 16;
pub const NSOCKS: Var = Var {
    name: "FERROCCL_NSOCKS",
    default: "1",
    doc: "sockets per TCP link, 1 to 16: the stream is dealt to them in 256 KiB chunks, round robin (more than one pays where one TCP flow gets less than the path's bandwidth, as between cloud hosts; over loopback it does not, see docs/results/2026-11-25-tcp-vs-gloo.md). The lower rank of each pair (the one that connects) chooses, so ranks need not agree. As libnccl.so.2, when unset: NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS (at most 16)",
};
pub const HOST_ADDR: Var = Var {
    name: "FERROCCL_HOST_ADDR",
    default: "",
    doc: "IP address this rank advertises to peers on other hosts (and fcclGetUniqueId's rendezvous point); unset: the address this host reaches the rendezvous point from",
};
pub const SOCKET_IFNAME: Var = Var {
    name: "FERROCCL_SOCKET_IFNAME",
    default: "",
    doc: "interfaces whose address is advertised when FERROCCL_HOST_ADDR is unset, as NCCL_SOCKET_IFNAME: name prefixes, comma-separated; ^ excludes, = matches names exactly (IPv4 and IPv6)",
};
pub const CONNECT_TIMEOUT_MS: Var = Var {
    name: "FERROCCL_CONNECT_TIMEOUT_MS",
    default: "10000",
    doc: "how long a rank keeps trying to reach a peer on another host during set-up before it fails, naming the peer and its address, in ms",
};
pub const PEER_LOST_MS: Var = Var {
    name: "FERROCCL_PEER_LOST_MS",
    default: "30000",
    doc: "how long a peer on another host may go without a sign of life from its host (TCP acknowledgements of what this rank sent it; while the link is idle, answers to keepalive probes) before this rank reports it lost, naming it and its host, in ms (at least 1000): a host that vanished without closing its connections (power loss, a cut cable) is otherwise noticed only at FERROCCL_TIMEOUT_MS. A peer that is merely slow still answers. 0: the kernel's own bounds (about 15 minutes with data in flight, never while idle)",
};
pub const CHECK: Var = Var {
    name: "FERROCCL_CHECK",
    default: "",
    doc:
        "checkMode for communicators whose fcclConfig_t leaves it unset. 1 (FCCL_CHECK_FINGERPRINT): every call is compared across the ranks before data moves, and a mismatch fails that call on every rank and leaves the communicator usable. 0 (FCCL_CHECK_OFF): ranks on different hosts skip the round that compares calls (a mismatch is found from the call's first message; the communicator is then unusable), and ranks in separate processes sharing one GPU stop agreeing on device calls after the first: each posts its call and goes on, and a mismatch that a proxy thread finds then (rank 0's; under MPS every rank's) fails the communicator on every rank (fcclCommGetAsyncError names it). Unset: as 1, except that ranks in separate processes sharing one GPU post their calls as with 0 once a call has passed device memory on every rank, as NCCL enqueues calls without agreeing on them. NCCL programs on libnccl.so.2 get 0 unless this is set",
};
pub const SINGLE_COPY: Var = Var {
    name: "FERROCCL_SINGLE_COPY",
    default: "mapped",
    doc: "how large messages between ranks on one host are moved once instead of twice. mapped: buffers from fcclMemAllocHost of 64 KiB and more are shared memory that peers map and read straight out of (and write into, see FERROCCL_SPLIT_COPY), and ranks that are threads of one process read each other's buffers directly; other memory goes through the shared rings. cma: also read other memory with cross-memory attach (process_vm_readv; slower than the rings where the kernel's copy is slow, as on the VMs measured in docs/performance.md). 0: everything through the shared rings, and fcclMemAllocHost gives private memory",
};
pub const STREAM_MIN: Var = Var {
    name: "FERROCCL_STREAM_MIN",
    default: "512K",
    doc: "host calls that write at least this many bytes (suffixes K, M, G) into a rank's recvbuff write them with streaming stores, which skip reading each destination line from memory first (faster for results that leave the caches before they are read; see docs/performance.md); 0: always",
};
pub const REUSE_MAX: Var = Var {
    name: "FERROCCL_REUSE_MAX",
    default: "",
    doc: "host calls write with ordinary stores, whatever FERROCCL_STREAM_MIN says, into a recvbuff of at most this many bytes (suffixes K, M, G) that the previous call on the same thread also wrote: its lines are likely still in the caches, where streaming stores would push every byte out to memory (a program calling a collective again and again on one tensor; see docs/performance.md). Default: a quarter of the last-level cache (8M where it cannot be read); 0: off",
};
pub const SPLIT_COPY: Var = Var {
    name: "FERROCCL_SPLIT_COPY",
    default: "1",
    doc: "1: a single-copy message of 256 KiB and more whose destination the sender can write too (a buffer from fcclMemAllocHost, or any buffer of ranks that are threads of one process) is copied by the sender and the receiver together, in 64 KiB pieces that both take from a shared counter, so two cores share a copy that one did (broadcast, whose root's own copy out of place goes with the pieces, gather, scatter, send/recv); and the blocks of an in-place all_to_all of 64 KiB and more are swapped between the two ranks' buffers by both ranks where each can write the other's (every byte read and written once), as are an fcclSend and an fcclRecv with one peer over the same buffer in a group; and a 2-rank all_reduce of 256 KiB and more in place (one rank out of place: from 512 KiB to 16 MiB) has both ranks reduce pieces of the whole vector and write each result into both recvbuffs; and all_reduce, reduce and reduce_scatter of 64 KiB and more at 3 ranks and more (at 2 ranks: reduce, and all_reduce with both ranks out of place, from 512 KiB), and broadcast of 256 KiB and more with the root in place at 3 ranks and more, where every rank's buffers can be mapped by every other, have all ranks take pieces of the vector, reduce each from every rank's input (or read it from the root's) and write it straight into the recvbuffs that take it; 0: the receiver copies alone, those blocks go through the shared rings, and the reductions take their pipelined path",
};
pub const HOST_PLAN: Var = Var {
    name: "FERROCCL_HOST_PLAN",
    default: "",
    doc: "changes thresholds of the host data plane (which path a call takes, piece sizes), as name=bytes pairs separated by commas, e.g. direct_min=64K,split_min=1M; every rank must see the same values. The names, defaults and invariants are the table in src/backend/host/plan.rs (docs/design/host.md); a value that breaks an invariant is refused with a warning",
};
pub const TORCH_RANK: Var = Var {
    name: "RANK",
    default: "",
    doc: "torchrun's rank (ferroccl-run sets it too), read when FERROCCL_RANK is unset",
};
pub const TORCH_WORLD_SIZE: Var =
    Var { name: "WORLD_SIZE", default: "", doc: "torchrun's world size, read with RANK (ferroccl-run sets it too)" };
pub const TORCH_MASTER_ADDR: Var = Var {
    name: "MASTER_ADDR",
    default: "",
    doc: "host of the rendezvous when FERROCCL_ROOT_ADDR is unset (torchrun's agent store there: see TORCHELASTIC_USE_AGENT_STORE)",
};
pub const TORCH_MASTER_PORT: Var =
    Var { name: "MASTER_PORT", default: "", doc: "port of the rendezvous at MASTER_ADDR (see MASTER_ADDR)" };
// Launchers' own variables, read by fcclCommInitFromEnv in this order (docs/launchers.md).
pub const LOCAL_RANK: Var = Var {
    name: "FERROCCL_LOCAL_RANK",
    default: "",
    doc: "rank of this process among the job's ranks on its host, with FERROCCL_RANK (set by ferroccl-run; logged)",
};
pub const LOCAL_SIZE: Var = Var {
    name: "FERROCCL_LOCAL_SIZE",
    default: "",
    doc: "number of the job's ranks on this host (set by ferroccl-run for programs; ferroccl does not read it)",
};
pub const TORCH_LOCAL_RANK: Var =
    Var { name: "LOCAL_RANK", default: "", doc: "torchrun's local rank, with RANK (ferroccl-run sets it too)" };
pub const TORCHELASTIC_USE_AGENT_STORE: Var = Var {
    name: "TORCHELASTIC_USE_AGENT_STORE",
    default: "",
    doc: "True (torchrun): the agent's TCPStore listens on MASTER_PORT, so rank 0 passes a fresh unique id through it instead of listening there",
};
pub const TORCHELASTIC_RESTART_COUNT: Var = Var {
    name: "TORCHELASTIC_RESTART_COUNT",
    default: "0",
    doc: "torchrun's restart count: part of the store key, so restarted workers never read an old id",
};
pub const OMPI_RANK: Var =
    Var { name: "OMPI_COMM_WORLD_RANK", default: "", doc: "Open MPI's rank (mpirun), with OMPI_COMM_WORLD_SIZE" };
pub const OMPI_SIZE: Var = Var { name: "OMPI_COMM_WORLD_SIZE", default: "", doc: "Open MPI's world size" };
pub const OMPI_LOCAL_RANK: Var = Var { name: "OMPI_COMM_WORLD_LOCAL_RANK", default: "", doc: "Open MPI's local rank" };
pub const PMIX_RANK: Var = Var {
    name: "PMIX_RANK",
    default: "",
    doc: "PMIx rank (PRRTE, srun --mpi=pmix); PMIx sets no size, so it is taken from OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_STEP_NUM_TASKS",
};
pub const PMI_RANK: Var =
    Var { name: "PMI_RANK", default: "", doc: "PMI rank (MPICH's and Intel MPI's mpiexec, Cray PALS), with PMI_SIZE" };
pub const PMI_SIZE: Var = Var { name: "PMI_SIZE", default: "", doc: "PMI world size" };
pub const MPI_LOCALRANKID: Var =
    Var { name: "MPI_LOCALRANKID", default: "", doc: "local rank under MPICH's and Intel MPI's mpiexec (Hydra)" };
pub const PMI_LOCAL_RANK: Var = Var { name: "PMI_LOCAL_RANK", default: "", doc: "local rank under Cray PALS" };
pub const SLURM_PROCID: Var =
    Var { name: "SLURM_PROCID", default: "", doc: "Slurm's rank of a task of srun, with SLURM_STEP_NUM_TASKS" };
pub const SLURM_STEP_NUM_TASKS: Var = Var {
    name: "SLURM_STEP_NUM_TASKS",
    default: "",
    doc: "number of tasks of the srun step: Slurm's world size (set by srun only, never in a batch script)",
};
pub const SLURM_LOCALID: Var = Var { name: "SLURM_LOCALID", default: "", doc: "Slurm's local rank of a task" };
pub const SLURM_NTASKS: Var = Var {
    name: "SLURM_NTASKS",
    default: "",
    doc: "not a world size here: a batch script has it with SLURM_PROCID=0 and srun --preserve-env keeps the allocation's; only named in messages",
};
pub const TORCHELASTIC_RUN_ID: Var = Var {
    name: "TORCHELASTIC_RUN_ID",
    default: "",
    doc: "torchrun's run id: the job's rendezvous secret when FERROCCL_SECRET is unset (not its default, none)",
};
pub const PMIX_NAMESPACE: Var = Var {
    name: "PMIX_NAMESPACE",
    default: "",
    doc: "the PMIx job namespace (mpirun, srun --mpi=pmix): the job's rendezvous secret when the above are unset",
};
pub const OMPI_JOBID: Var = Var {
    name: "OMPI_MCA_orte_ess_jobid",
    default: "",
    doc: "Open MPI 4's job id: the job's rendezvous secret when the above are unset",
};
pub const SLURM_JOB_ID: Var = Var {
    name: "SLURM_JOB_ID",
    default: "",
    doc: "Slurm's job id, with SLURM_STEP_ID: the job's rendezvous secret when the above are unset",
};
pub const SLURM_STEP_ID: Var = Var { name: "SLURM_STEP_ID", default: "", doc: "Slurm's step id (see SLURM_JOB_ID)" };

/// All variables, for documentation and `ferroccl-run --help-env`.
pub const ALL: &[&Var] = &[
    &RANK,
    &WORLD_SIZE,
    &ROOT_ADDR,
    &UNIQUE_ID,
    &SECRET,
    &TIMEOUT_MS,
    &DEBUG,
    &DEBUG_FILE,
    &BACKEND,
    &NCCL_LIBRARY,
    &CUDA_IPC,
    &STAGING_CHUNK,
    &CUDA_MPS,
    &KERNEL_CACHE,
    &TRANSPORT,
    &NSOCKS,
    &HOST_ADDR,
    &SOCKET_IFNAME,
    &CONNECT_TIMEOUT_MS,
    &PEER_LOST_MS,
    &CHECK,
    &SINGLE_COPY,
    &STREAM_MIN,
    &REUSE_MAX,
    &SPLIT_COPY,
    &HOST_PLAN,
    &TORCH_RANK,
    &TORCH_WORLD_SIZE,
    &TORCH_MASTER_ADDR,
    &TORCH_MASTER_PORT,
    &LOCAL_RANK,
    &LOCAL_SIZE,
    &TORCH_LOCAL_RANK,
    &TORCHELASTIC_USE_AGENT_STORE,
    &TORCHELASTIC_RESTART_COUNT,
    &OMPI_RANK,
    &OMPI_SIZE,
    &OMPI_LOCAL_RANK,
    &PMIX_RANK,
    &PMI_RANK,
    &PMI_SIZE,
    &MPI_LOCALRANKID,
    &PMI_LOCAL_RANK,
    &SLURM_PROCID,
    &SLURM_STEP_NUM_TASKS,
    &SLURM_LOCALID,
    &SLURM_NTASKS,
    &TORCHELASTIC_RUN_ID,
    &PMIX_NAMESPACE,
    &OMPI_JOBID,
    &SLURM_JOB_ID,
    &SLURM_STEP_ID,
    &NCCL_DEBUG,
    &NCCL_DEBUG_FILE,
    &NCCL_SOCKET_IFNAME,
    &NCCL_NSOCKS_PERTHREAD,
    &NCCL_SOCKET_NTHREADS,
];

/// NCCL's variables that stand in for ferroccl's, each read only where ferroccl's own
/// is unset: the log's in every library, the socket counts only when ferroccl runs as
/// libnccl.so.2 (the ferroccl-nccl shim).
pub const NCCL_DEBUG: Var = Var {
    name: "NCCL_DEBUG",
    default: "",
    doc: "as libnccl.so.2: FERROCCL_DEBUG when that is unset (NONE, VERSION, WARN, ABORT: WARN; INFO; TRACE)",
};
pub const NCCL_DEBUG_FILE: Var =
    Var { name: "NCCL_DEBUG_FILE", default: "", doc: "as libnccl.so.2: FERROCCL_DEBUG_FILE when that is unset" };
pub const NCCL_SOCKET_IFNAME: Var = Var {
    name: "NCCL_SOCKET_IFNAME",
    default: "",
    doc: "as libnccl.so.2: FERROCCL_SOCKET_IFNAME when that is unset (read by libferroccl too)",
};
pub const NCCL_NSOCKS_PERTHREAD: Var = Var {
    name: "NCCL_NSOCKS_PERTHREAD",
    default: "",
    doc: "as libnccl.so.2, when FERROCCL_NSOCKS is unset: sockets per thread; times NCCL_SOCKET_NTHREADS (unset: 1) gives FERROCCL_NSOCKS, at most 16",
};
pub const NCCL_SOCKET_NTHREADS: Var = Var {
    name: "NCCL_SOCKET_NTHREADS",
    default: "",
    doc: "as libnccl.so.2, when FERROCCL_NSOCKS is unset: threads per link; ferroccl drives every socket from its one progress thread and takes the product with NCCL_NSOCKS_PERTHREAD (unset: 1) as its number of sockets",
};

/// Whether NCCL's socket-count variables stand in for FERROCCL_NSOCKS (set by the
/// ferroccl-nccl shim).
static NCCL_ALIASES: AtomicBool = AtomicBool::new(false);

/// Makes NCCL_NSOCKS_PERTHREAD and NCCL_SOCKET_NTHREADS stand in for FERROCCL_NSOCKS
/// where it is unset: called by the library that serves NCCL's API. (NCCL_DEBUG and
/// NCCL_DEBUG_FILE stand in for FERROCCL_DEBUG and FERROCCL_DEBUG_FILE in every
/// library, as libnccl.so.2 reads them; NCCL_SOCKET_IFNAME too.)
pub fn enable_nccl_aliases() {
    NCCL_ALIASES.store(true, Ordering::Relaxed);
}

/// The value of `name` if set and not blank; a value that is not UTF-8 is kept, with
/// its odd bytes replaced, so that it is refused as what it is rather than taken as unset.
fn raw(name: &str) -> Option<String> {
    let v = std::env::var_os(name)?.into_string().unwrap_or_else(|v| v.to_string_lossy().into_owned());
    Some(v).filter(|v| !v.trim().is_empty())
}

impl Var {
    /// The name of the variable the value comes from, and the value: this one if set
    /// and not blank, else for FERROCCL_DEBUG and FERROCCL_DEBUG_FILE NCCL_DEBUG and
    /// NCCL_DEBUG_FILE (FERROCCL_ > NCCL_, as libnccl.so.2 reads those).
    pub fn lookup(&self) -> Option<(&'static str, String)> {
        let stand_in = match self.name {
            n if n == DEBUG.name => Some(NCCL_DEBUG.name),
            n if n == DEBUG_FILE.name => Some(NCCL_DEBUG_FILE.name),
            _ => None,
        };
        match raw(self.name) {
            Some(v) => Some((self.name, v)),
            None => stand_in.and_then(|s| raw(s).map(|v| (s, v))),
        }
    }
    /// The value if set and not blank (see [`Var::lookup`] for NCCL's stand-ins).
    pub fn get(&self) -> Option<String> {
        self.lookup().map(|(_, v)| v)
    }
    /// The value, or the default.
    pub fn get_or_default(&self) -> String {
        self.get().unwrap_or_else(|| self.default.to_string())
    }
}

/// FERROCCL_TIMEOUT_MS's form: a bound beyond 2^53 ms (285 000 years) is no bound,
/// and every value up to it is exact as a double too.
pub const TIMEOUT_FORM: Int = Int::new(1, 1 << 53, "milliseconds", 30000);
/// FERROCCL_CONNECT_TIMEOUT_MS's form.
pub const CONNECT_TIMEOUT_FORM: Int = Int::new(1, 1 << 53, "milliseconds", 10000);
/// FERROCCL_PEER_LOST_MS's form: keepalive probes count whole seconds, and the socket
/// option takes an int of ms.
pub const PEER_LOST_FORM: Int =
    Int { zero: Some("to leave it to the kernel"), ..Int::new(1000, i32::MAX as u64, "milliseconds", 30000) };

/// The timeout for blocking waits (`FERROCCL_TIMEOUT_MS`; 10 minutes if unset).
pub fn timeout() -> Result<Duration> {
    Ok(TIMEOUT_MS.ms(TIMEOUT_FORM)?.unwrap_or(Duration::from_millis(600_000)))
}

/// [`timeout`], or 10 minutes where the value is refused (the default of options that
/// cannot fail; communicator creation checks the variable with [`timeout`]).
pub fn default_timeout() -> Duration {
    timeout().unwrap_or(Duration::from_millis(600_000))
}

/// `FERROCCL_CHECK`: whether collectives are fingerprinted; None when unset (see [`CHECK`]).
pub fn check_mode() -> Result<Option<bool>> {
    CHECK.flag()
}

/// `FERROCCL_TRANSPORT`: true for tcp (TCP between every pair), false for auto.
pub fn force_tcp() -> Result<bool> {
    Ok(TRANSPORT.word(&[("auto", false), ("tcp", true)])?.unwrap_or(false))
}

/// `FERROCCL_CONNECT_TIMEOUT_MS` (10 s if unset).
pub fn connect_timeout() -> Result<Duration> {
    Ok(CONNECT_TIMEOUT_MS.ms(CONNECT_TIMEOUT_FORM)?.unwrap_or(Duration::from_millis(10_000)))
}

/// `FERROCCL_PEER_LOST_MS` from its value `v`: None for 0 (the kernel's bounds).
pub fn parse_peer_lost(v: &str) -> Result<Option<Duration>> {
    Ok(Some(PEER_LOST_MS.parse_ms(v, PEER_LOST_FORM)?).filter(|d| !d.is_zero()))
}

/// `FERROCCL_PEER_LOST_MS` (30 s if unset).
pub fn peer_lost() -> Result<Option<Duration>> {
    parse_peer_lost(&PEER_LOST_MS.get_or_default())
}

/// Checks the variables every communicator's creation depends on, whether or not this
/// one reads them (a wrong one fails the first creation, not a later one that does):
/// one error naming every wrong one.
pub fn check() -> Result<()> {
    let wrong: Vec<String> = [
        timeout().err(),
        check_mode().err(),
        force_tcp().err(),
        nsocks().err(),
        connect_timeout().err(),
        peer_lost().err(),
        HOST_ADDR.ip().err(),
    ]
    .into_iter()
    .flatten()
    .map(|e| e.msg)
    .collect();
    match wrong.is_empty() {
        true => Ok(()),
        false => Err(Error::invalid_arg(wrong.join("; "))),
    }
}

/// Sockets per TCP link: `FERROCCL_NSOCKS`, else (as libnccl.so.2) NCCL_NSOCKS_PERTHREAD
/// x NCCL_SOCKET_NTHREADS capped at the most a link may have, else the default. An
/// error naming the variable when a value is not a number in range.
pub fn nsocks() -> Result<usize> {
    let nccl = NCCL_ALIASES.load(Ordering::Relaxed);
    let nccl_var = |v: &Var| if nccl { v.get() } else { None };
    nsocks_from(NSOCKS.get(), nccl_var(&NCCL_NSOCKS_PERTHREAD), nccl_var(&NCCL_SOCKET_NTHREADS))
}

/// [`nsocks`] from the values of FERROCCL_NSOCKS, NCCL_NSOCKS_PERTHREAD and NCCL_SOCKET_NTHREADS.
fn nsocks_from(own: Option<String>, per_thread: Option<String>, threads: Option<String>) -> Result<usize> {
    let socks = |hi: usize, eg: u64| Int::new(1, hi as u64, "sockets", eg);
    if let Some(v) = own {
        return Ok(NSOCKS.parse_int(&v, socks(NSOCKS_MAX, 4))? as usize);
    }
    // NCCL allows up to 64 sockets per link in all; ferroccl's links take at most NSOCKS_MAX.
    let per = per_thread.map(|v| NCCL_NSOCKS_PERTHREAD.parse_int(&v, socks(64, 4))).transpose()?;
    let threads = threads.map(|v| NCCL_SOCKET_NTHREADS.parse_int(&v, socks(16, 2))).transpose()?;
    if per.is_some() || threads.is_some() {
        return Ok((per.unwrap_or(1) * threads.unwrap_or(1)).min(NSOCKS_MAX as u64) as usize);
    }
    Ok(NSOCKS.default.parse().expect("the default is a number"))
}

/// A byte count with an optional suffix K, M or G (powers of 1024).
pub fn parse_bytes(v: &str) -> Option<usize> {
    let v = v.trim();
    let (num, mul) = match v.chars().last()?.to_ascii_uppercase() {
        'K' => (&v[..v.len() - 1], 1usize << 10),
        'M' => (&v[..v.len() - 1], 1 << 20),
        'G' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    usize::try_from(parse::whole(num)?).ok()?.checked_mul(mul)
}

/// What `FERROCCL_SINGLE_COPY` allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SingleCopy {
    Off,
    Mapped,
    Cma,
}

/// `FERROCCL_SINGLE_COPY`'s words.
const SINGLE_COPY_WORDS: &[(&str, SingleCopy)] = &[
    ("mapped", SingleCopy::Mapped),
    ("cma", SingleCopy::Cma),
    ("0", SingleCopy::Off),
    ("1", SingleCopy::Cma),
    ("off", SingleCopy::Off),
    ("on", SingleCopy::Cma),
    ("no", SingleCopy::Off),
    ("yes", SingleCopy::Cma),
    ("false", SingleCopy::Off),
    ("true", SingleCopy::Cma),
];

/// `FERROCCL_SINGLE_COPY` (read once): `0`/`off`, `mapped` (default), `1`/`cma`; any
/// other value warns and keeps the default.
pub fn single_copy() -> SingleCopy {
    static V: std::sync::OnceLock<SingleCopy> = std::sync::OnceLock::new();
    *V.get_or_init(|| SINGLE_COPY.or_default(SINGLE_COPY.word(SINGLE_COPY_WORDS), SingleCopy::Mapped))
}

/// `FERROCCL_STREAM_MIN` in bytes (read once; the default if unset, and with a
/// warning if not a byte count).
pub fn stream_min() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        let default = parse_bytes(STREAM_MIN.default).expect("a byte count");
        STREAM_MIN.or_default(STREAM_MIN.size(usize::MAX, "1M"), default)
    })
}

/// `FERROCCL_REUSE_MAX` in bytes (read once): the variable, or a quarter of the
/// last-level cache where it is unset (and with a warning where it is not a byte count).
pub fn reuse_max() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| REUSE_MAX.or_default(REUSE_MAX.size(usize::MAX, "8M"), last_level_cache() / 4))
}

/// Size of the largest cache of CPU 0 as sysfs lists it (Linux); 32 MiB otherwise.
fn last_level_cache() -> usize {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let sizes = std::fs::read_dir(dir).into_iter().flatten().flatten().filter_map(|e| {
        let s = std::fs::read_to_string(e.path().join("size")).ok()?;
        parse_bytes(s.trim())
    });
    sizes.max().unwrap_or(32 << 20)
}

/// `FERROCCL_SPLIT_COPY` (read once): 0 or 1 (default; a value of neither warns).
pub fn split_copy() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| SPLIT_COPY.or_default(SPLIT_COPY.flag(), true))
}

/// `FERROCCL_CUDA_IPC` (read once): 1 (default) or 0 (a value of neither warns).
pub fn cuda_ipc() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| CUDA_IPC.or_default(CUDA_IPC.flag(), true))
}

/// `FERROCCL_CUDA_MPS`: Some(yes or no) as 1 or 0 say, None for auto (the default; a
/// value of none of them warns).
pub fn cuda_mps() -> Option<bool> {
    let words = [("auto", None), ("1", Some(true)), ("0", Some(false)), ("on", Some(true)), ("off", Some(false))];
    CUDA_MPS.or_default(CUDA_MPS.word(&words), None)
}

/// Most bytes of host buffer a staged chunk may take (`FERROCCL_STAGING_CHUNK`; half
/// the staging pool, `mem::pinned::POOL_MAX_BYTES`).
pub const STAGING_CHUNK_MAX: usize = 32 << 20;

/// `FERROCCL_STAGING_CHUNK` in bytes (0: calls staged whole; a value that is no byte
/// count up to [`STAGING_CHUNK_MAX`] warns and keeps the default).
pub fn staging_chunk() -> usize {
    let default = parse_bytes(STAGING_CHUNK.default).expect("a byte count");
    STAGING_CHUNK.or_default(STAGING_CHUNK.size(STAGING_CHUNK_MAX, "4M"), default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_copy_values() {
        let p = |v: &str| SINGLE_COPY.parse_word(v, SINGLE_COPY_WORDS);
        assert_eq!(p("0").unwrap(), SingleCopy::Off);
        assert_eq!(p(" Mapped ").unwrap(), SingleCopy::Mapped);
        assert_eq!(p("1").unwrap(), SingleCopy::Cma);
        assert_eq!(p("cma").unwrap(), SingleCopy::Cma);
        let e = p("sometimes").unwrap_err();
        assert!(e.msg.starts_with("FERROCCL_SINGLE_COPY is \"sometimes\": give one of mapped, cma, 0,"), "{e}");
    }

    /// `var`'s parse of `v` fails with fcclInvalidArgument naming the variable, the
    /// value and `form`.
    fn refused<T: std::fmt::Debug>(var: &Var, v: &str, r: Result<T>, form: &str) {
        let e = r.expect_err(&format!("{}={v:?} is refused", var.name));
        assert_eq!(e.code, crate::error::Code::InvalidArgument);
        let want = format!("{} is {v:?}: give {form}", var.name);
        assert!(e.msg.starts_with(&want), "{v:?}: {:?} does not start with {want:?}", e.msg);
    }

    #[test]
    fn timeouts_are_whole_milliseconds_in_range() {
        let form = "a whole number of milliseconds from 1 to 2^53 (e.g. 30000)";
        for bad in ["abc", "-5", "3e3", "3000ms", "18446744073709551615", "0", "9007199254740993", " ", "+5", "1.5"] {
            refused(&TIMEOUT_MS, bad, TIMEOUT_MS.parse_ms(bad, TIMEOUT_FORM), form);
        }
        assert_eq!(TIMEOUT_MS.parse_ms(" 3000\n", TIMEOUT_FORM).unwrap(), Duration::from_millis(3000));
        assert_eq!(TIMEOUT_MS.parse_ms("1", TIMEOUT_FORM).unwrap(), Duration::from_millis(1));
        assert_eq!(TIMEOUT_MS.parse_ms("9007199254740992", TIMEOUT_FORM).unwrap(), Duration::from_millis(1 << 53));
        let form = "a whole number of milliseconds from 1 to 2^53 (e.g. 10000)";
        refused(&CONNECT_TIMEOUT_MS, "10s", CONNECT_TIMEOUT_MS.parse_ms("10s", CONNECT_TIMEOUT_FORM), form);
        // 0 is a word of its own where a variable allows it.
        assert_eq!(parse_peer_lost("0").unwrap(), None);
        assert_eq!(parse_peer_lost("1000").unwrap(), Some(Duration::from_millis(1000)));
        let form =
            "a whole number of milliseconds from 1000 to 2147483647 (e.g. 30000), or 0 to leave it to the kernel";
        for bad in ["999", "1", "2147483648", "00x"] {
            refused(&PEER_LOST_MS, bad, parse_peer_lost(bad), form);
        }
    }

    #[test]
    fn integers_name_their_range_and_unit() {
        let f = Int::new(2, 9, "", 4);
        assert_eq!(NSOCKS.parse_int("9", f).unwrap(), 9);
        assert_eq!(NSOCKS.parse_int("02", f).unwrap(), 2);
        refused(&NSOCKS, "1", NSOCKS.parse_int("1", f), "a whole number from 2 to 9 (e.g. 4)");
        refused(&NSOCKS, "10", NSOCKS.parse_int("10", f), "a whole number from 2 to 9 (e.g. 4)");
        let open = Int::new(0, u64::MAX, "", 1);
        assert_eq!(RANK.parse_int("18446744073709551615", open).unwrap(), u64::MAX);
        refused(&RANK, "-1", RANK.parse_int("-1", open), "a whole number, 0 or more (e.g. 1)");
        refused(
            &RANK,
            "18446744073709551616",
            RANK.parse_int("18446744073709551616", open),
            "a whole number, 0 or more",
        );
    }

    #[test]
    fn flags_are_0_or_1() {
        for (v, want) in [("0", false), ("1", true), (" 1 ", true), ("off", false), ("ON", true), ("false", false)] {
            assert_eq!(CHECK.parse_flag(v).unwrap(), want, "{v:?}");
        }
        for bad in ["maybe", "2", "-1", "10", "y"] {
            refused(&CHECK, bad, CHECK.parse_flag(bad), "0 or 1");
        }
    }

    #[test]
    fn words_are_listed() {
        let transport = [("auto", false), ("tcp", true)];
        assert!(TRANSPORT.parse_word(" TCP", &transport).unwrap());
        assert!(!TRANSPORT.parse_word("auto", &transport).unwrap());
        let r = TRANSPORT.parse_word("carrier-pigeon", &transport);
        refused(&TRANSPORT, "carrier-pigeon", r, "one of auto or tcp");
        let backend = [("auto", 0), ("host", 1), ("nccl", 2)];
        assert_eq!(BACKEND.parse_word("Host", &backend).unwrap(), 1);
        refused(&BACKEND, "gpu", BACKEND.parse_word("gpu", &backend), "one of auto, host or nccl");
    }

    #[test]
    fn sizes_take_suffixes_up_to_a_bound() {
        assert_eq!(STAGING_CHUNK.parse_size("0", STAGING_CHUNK_MAX, "4M").unwrap(), 0);
        assert_eq!(STAGING_CHUNK.parse_size("32m", STAGING_CHUNK_MAX, "4M").unwrap(), 32 << 20);
        assert_eq!(STAGING_CHUNK.parse_size("256", STAGING_CHUNK_MAX, "4M").unwrap(), 256);
        let form =
            "a byte count: a whole number with an optional suffix K, M or G (powers of 1024), at most 32M (e.g. 4M)";
        for bad in ["33M", "4MB", "4 MiB", "-1", "1.5M", "M", "64G"] {
            refused(&STAGING_CHUNK, bad, STAGING_CHUNK.parse_size(bad, STAGING_CHUNK_MAX, "4M"), form);
        }
        let form = "a byte count: a whole number with an optional suffix K, M or G (powers of 1024) (e.g. 1M)";
        refused(&STREAM_MIN, "lots", STREAM_MIN.parse_size("lots", usize::MAX, "1M"), form);
    }

    #[test]
    fn addresses() {
        assert_eq!(HOST_ADDR.parse_ip(" 10.0.0.5 ").unwrap().to_string(), "10.0.0.5");
        assert_eq!(HOST_ADDR.parse_ip("fd00::5").unwrap().to_string(), "fd00::5");
        for bad in ["10.0.0.5:80", "host0", "10.0.0.256"] {
            refused(&HOST_ADDR, bad, HOST_ADDR.parse_ip(bad), "an IP address");
        }
        assert_eq!(ROOT_ADDR.parse_host_port("127.0.0.1:29500").unwrap().port(), 29500);
        assert_eq!(ROOT_ADDR.parse_host_port("[::1]:7").unwrap().to_string(), "[::1]:7");
        for bad in ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:http", "[::1]"] {
            refused(&ROOT_ADDR, bad, ROOT_ADDR.parse_host_port(bad), "host:port");
        }
    }

    #[test]
    fn every_ferroccl_variable_is_listed_once() {
        let mut names: Vec<&str> = ALL.iter().map(|v| v.name).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "a name listed twice in ALL");
    }

    #[test]
    fn socket_counts_are_checked_and_nccl_s_stand_in() {
        let s = |v: &str| Some(v.to_string());
        let default: usize = NSOCKS.default.parse().unwrap();
        assert_eq!(nsocks_from(None, None, None).unwrap(), default);
        assert_eq!(nsocks_from(s(" 3 "), s("8"), None).unwrap(), 3);
        assert_eq!(nsocks_from(s("16"), None, None).unwrap(), 16);
        for bad in ["0", "17", "two", "-1"] {
            let e = nsocks_from(s(bad), None, None).unwrap_err();
            assert!(e.msg.contains("FERROCCL_NSOCKS") && e.msg.contains("1 to 16"), "{e}");
        }
        assert_eq!(nsocks_from(None, s("2"), s("3")).unwrap(), 6);
        assert_eq!(nsocks_from(None, s("4"), None).unwrap(), 4);
        assert_eq!(nsocks_from(None, s("8"), s("4")).unwrap(), 16);
        let e = nsocks_from(None, s("0"), s("2")).unwrap_err();
        assert!(e.msg.contains("NCCL_NSOCKS_PERTHREAD"), "{e}");
        let e = nsocks_from(None, None, s("x")).unwrap_err();
        assert!(e.msg.contains("NCCL_SOCKET_NTHREADS"), "{e}");
    }

    #[test]
    fn byte_counts_take_suffixes() {
        assert_eq!(parse_bytes("0"), Some(0));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("512K"), Some(512 << 10));
        assert_eq!(parse_bytes(" 8m "), Some(8 << 20));
        assert_eq!(parse_bytes("1G"), Some(1 << 30));
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("K"), None);
        assert_eq!(parse_bytes("12X"), None);
        assert_eq!(parse_bytes(&format!("{}G", usize::MAX)), None);
    }
}
