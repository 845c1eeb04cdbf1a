//! fcclCommInitFromEnv: this process's rank, world size and local rank from the
//! variables of the launcher that started it, and the rendezvous that goes with it
//! (docs/launchers.md says how to start ranks with each launcher).

use super::bootstrap::{JobKey, Server, ServerOptions, UniqueId, UNIQUE_ID_BYTES};
use super::pmix;
use super::torchstore::Store;
use super::{Comm, Options};
use crate::env::{self, Var};
use crate::error::{Code, Error, Result};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The launchers whose variables fcclCommInitFromEnv understands, in the order tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// FERROCCL_RANK/FERROCCL_WORLD_SIZE: ferroccl-run, or set by hand.
    Ferroccl,
    /// RANK/WORLD_SIZE: torchrun (ferroccl-run sets them too, but FERROCCL_RANK wins).
    Torchrun,
    /// OMPI_COMM_WORLD_*: Open MPI's mpirun.
    OpenMpi,
    /// PMIX_RANK: a PMIx launcher (PRRTE, srun --mpi=pmix).
    Pmix,
    /// PMI_RANK/PMI_SIZE: MPICH's or Intel MPI's mpiexec (Hydra), Cray PALS.
    Pmi,
    /// SLURM_PROCID/SLURM_STEP_NUM_TASKS: a task of srun.
    Slurm,
    /// None of them: a program started on its own is a job of one rank (as an MPI
    /// singleton, or torch.distributed with world size 1).
    Alone,
}

impl Launcher {
    /// A name for messages. FERROCCL_RANK without the unique id ferroccl-run also
    /// gives is not ferroccl-run's.
    pub fn describe(self) -> &'static str {
        match self {
            Launcher::Ferroccl if std::env::var_os(env::UNIQUE_ID.name).is_none() => {
                "FERROCCL_ variables set by hand (or by a launcher ferroccl does not know)"
            }
            Launcher::Ferroccl => "ferroccl-run",
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "Open MPI's mpirun",
            Launcher::Pmix => "a PMIx launcher",
            Launcher::Pmi => "a PMI launcher such as MPICH's or Intel MPI's mpiexec",
            Launcher::Slurm => "Slurm's srun",
            Launcher::Alone => "no launcher: a program started on its own is a job of one rank",
        }
    }
}

/// Where this process stands in its job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub rank: usize,
    pub size: usize,
    /// Rank among the job's ranks on this host, where the launcher says.
    pub local_rank: Option<usize>,
    pub launcher: Launcher,
    /// The variables it came from, as `NAME=value, ...` for messages and logs.
    pub vars: String,
}

/// One launcher's variables.
struct Source {
    launcher: Launcher,
    rank: &'static Var,
    /// Where the size may come from, each with the local-rank variables of the same
    /// launcher; the first one set is used.
    sizes: &'static [(&'static Var, &'static [&'static Var])],
    /// The rank variable is also set where no launch is (Slurm gives a batch script
    /// SLURM_PROCID=0): only a size variable marks a task.
    needs_size: bool,
}

/// Launchers in precedence order. MPI's variables come before Slurm's because mpirun
/// inside a Slurm allocation leaves the mpirun process's SLURM_* to every rank.
const SOURCES: &[Source] = &[
    Source {
        launcher: Launcher::Ferroccl,
        rank: &env::RANK,
        sizes: &[(&env::WORLD_SIZE, &[&env::LOCAL_RANK])],
        needs_size: false,
    },
    Source {
        launcher: Launcher::Torchrun,
        rank: &env::TORCH_RANK,
        sizes: &[(&env::TORCH_WORLD_SIZE, &[&env::TORCH_LOCAL_RANK])],
        needs_size: false,
    },
    Source {
        launcher: Launcher::OpenMpi,
        rank: &env::OMPI_RANK,
        sizes: &[(&env::OMPI_SIZE, &[&env::OMPI_LOCAL_RANK])],
        needs_size: false,
    },
    // PMIx puts only the rank and namespace in the environment; the size comes from
    // the personality or resource manager that started the PMIx server.
    Source {
        launcher: Launcher::Pmix,
        rank: &env::PMIX_RANK,
        sizes: &[
            (&env::OMPI_SIZE, &[&env::OMPI_LOCAL_RANK]),
            (&env::PMI_SIZE, &[&env::MPI_LOCALRANKID, &env::PMI_LOCAL_RANK]),
            (&env::SLURM_STEP_NUM_TASKS, &[&env::SLURM_LOCALID]),
        ],
        needs_size: false,
    },
    Source {
        launcher: Launcher::Pmi,
        rank: &env::PMI_RANK,
        sizes: &[(&env::PMI_SIZE, &[&env::MPI_LOCALRANKID, &env::PMI_LOCAL_RANK])],
        needs_size: false,
    },
    Source {
        launcher: Launcher::Slurm,
        rank: &env::SLURM_PROCID,
        sizes: &[(&env::SLURM_STEP_NUM_TASKS, &[&env::SLURM_LOCALID])],
        needs_size: true,
    },
];

/// A rank, size or local rank: a whole number (how it relates to the others is
/// checked by [`place`]).
fn parse(var: &Var, v: &str) -> Result<usize> {
    let n = var.parse_int(v, env::Int::new(0, u64::MAX, "", 1))?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// This process's place from the first launcher whose variables are set, read through
/// `get` (a variable's value if set and non-empty).
pub fn place(get: &dyn Fn(&Var) -> Option<String>) -> Result<Place> {
    for s in SOURCES {
        let Some(rank_v) = get(s.rank) else { continue };
        let Some((size_var, locals, size_v)) = s.sizes.iter().find_map(|(v, l)| get(v).map(|x| (*v, *l, x))) else {
            if s.needs_size {
                continue;
            }
            let names: Vec<&str> = s.sizes.iter().map(|(v, _)| v.name).collect();
            return Err(Error::invalid_usage(format!(
                "{}={} comes from {}, but {} is not set: the world size must come from the same launcher as the rank. Set {}, or FERROCCL_RANK and FERROCCL_WORLD_SIZE",
                s.rank.name,
                rank_v.trim(),
                s.launcher.describe(),
                names.join(" or "),
                names[0],
            )));
        };
        let rank = parse(s.rank, &rank_v)?;
        let size = parse(size_var, &size_v)?;
        let mut vars = format!("{}={rank}, {}={size}", s.rank.name, size_var.name);
        if size == 0 || size > i32::MAX as usize {
            return Err(Error::invalid_arg(format!("{}={size}: a world size is 1 to {}", size_var.name, i32::MAX)));
        }
        if rank >= size {
            return Err(Error::invalid_arg(format!(
                "{}={rank} is out of range for {}={size} (valid ranks 0..{})",
                s.rank.name,
                size_var.name,
                size - 1
            )));
        }
        let mut local_rank = None;
        if let Some((lv, l)) = locals.iter().find_map(|v| get(v).map(|x| (*v, x))) {
            let l = parse(lv, &l)?;
            if l >= size {
                return Err(Error::invalid_arg(format!(
                    "{}={l} is not below {}={size}: a local rank is the rank among the job's ranks on this host",
                    lv.name, size_var.name
                )));
            }
            vars += &format!(", {}={l}", lv.name);
            local_rank = Some(l);
        }
        return Ok(Place { rank, size, local_rank, launcher: s.launcher, vars });
    }
    // A launcher's size without its rank, or a Slurm batch script (SLURM_PROCID without
    // a task count): a launch gone wrong, not a program started on its own.
    let sizes = SOURCES.iter().flat_map(|s| s.sizes.iter().map(|(v, _)| *v));
    let mut stray: Vec<&str> = Vec::new();
    for v in sizes.filter(|v| get(v).is_some()) {
        if !stray.contains(&v.name) {
            stray.push(v.name);
        }
    }
    if !stray.is_empty() || get(&env::SLURM_PROCID).is_some() {
        let mut msg = format!(
            "this process was not started by a launcher ferroccl knows{}: none of FERROCCL_RANK (ferroccl-run), RANK (torchrun), OMPI_COMM_WORLD_RANK (Open MPI's mpirun), PMIX_RANK (PMIx), PMI_RANK (MPICH's or Intel MPI's mpiexec) or SLURM_PROCID with SLURM_STEP_NUM_TASKS (srun) is set. Start N ranks with ferroccl-run -n N program, torchrun --nproc-per-node N --no-python program, or mpirun/mpiexec/srun with FERROCCL_ROOT_ADDR=host:port (rank 0's host, a free port) and FERROCCL_SECRET given to every rank (docs/launchers.md); a program started with none of these variables is a job of one rank",
            match stray.len() {
                0 => String::new(),
                1 => format!(", yet {} is set", stray[0]),
                _ => format!(", yet {} are set", stray.join(", ")),
            }
        );
        if let Some(p) = get(&env::SLURM_PROCID) {
            msg += &format!(
                ". SLURM_PROCID={} without SLURM_STEP_NUM_TASKS{}: that is a Slurm batch script or its child, not a task of srun; start the ranks with srun",
                p.trim(),
                get(&env::SLURM_NTASKS).map(|n| format!(" (SLURM_NTASKS={} is the allocation's)", n.trim())).unwrap_or_default()
            );
        }
        return Err(Error::invalid_usage(msg));
    }
    Ok(Place {
        rank: 0,
        size: 1,
        local_rank: Some(0),
        launcher: Launcher::Alone,
        vars: "no launcher variable set".into(),
    })
}

/// A rendezvous at a fixed `host:port`; rank 0 serves it.
fn at_addr(addr: &str, sock: SocketAddr, place: &Place) -> Result<Found> {
    // No default secret: a stranger must not join, nor two jobs on one port merge.
    let key = JobKey::from_env()?;
    let id = UniqueId::from_addr(sock, key);
    let literal = place.rank == 0
        && addr
            .rsplit_once(':')
            .is_some_and(|(h, _)| h.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>().is_ok());
    let point = if place.rank == 0 { Some(id.serve_here(place.size, literal)?) } else { None };
    Ok((id, format!("the rendezvous at {addr} with the secret from {}", key.source.describe()), point))
}

/// The n-th fcclCommInitFromEnv of this process under torchrun; every rank calls it
/// in the same order, so the n-th calls of all ranks share a store key.
static STORE_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Rank 0 makes a unique id (a random key, its own port) and puts it in torchrun's
/// store; the others read it from there.
fn through_torch_store(place: &Place, host: &str, port: &str) -> Result<Found> {
    let port = env::TORCH_MASTER_PORT.parse_int(port, PORT)? as u16;
    let run = env::TORCHELASTIC_RUN_ID.get_or_default();
    let restart = env::TORCHELASTIC_RESTART_COUNT.int(env::Int::new(0, u64::MAX, "", 0))?.unwrap_or(0);
    let n = STORE_CALLS.fetch_add(1, Ordering::Relaxed);
    // torch's clients put "/" before their keys; so does this one, so that torch sees the same key.
    let key = format!("/ferroccl/fcclCommInitFromEnv/{}/{restart}/{n}", run.trim());
    let deadline = Instant::now() + env::timeout()?;
    let mut store = Store::connect(host, port, deadline)?;
    let (id, point) = if place.rank == 0 {
        // Serve where the other hosts reach this one: the route to the store's host.
        let (ip, _) = super::addr::choose(store.local_ip(), true)?;
        let (id, point) = UniqueId::serve(ServerOptions { ip: Some(ip), ..ServerOptions::default() })?;
        store.set(&key, &id.0)?;
        (id, Some(point))
    } else {
        let v = store.get(&key).map_err(|e| {
            e.context(format!(
                "waiting for rank 0 to publish the unique id under {key}; rank 0 must call fcclCommInitFromEnv too"
            ))
        })?;
        let b: [u8; UNIQUE_ID_BYTES] = v.as_slice().try_into().map_err(|_| {
            Error::system(format!(
                "{key} in torch's store at {host}:{port} holds {} bytes, not a {UNIQUE_ID_BYTES}-byte unique id: another program uses this key",
                v.len()
            ))
        })?;
        let id = UniqueId(b);
        id.addr()?;
        (id, None)
    };
    Ok((id, format!("a unique id passed through torchrun's store at {host}:{port} under {key}"), point))
}

/// Says how to give the rendezvous address with this launcher.
fn how_to_give_addr(l: Launcher) -> &'static str {
    match l {
        Launcher::OpenMpi => "mpirun -x FERROCCL_ROOT_ADDR=host:port",
        Launcher::Pmix => "mpirun -x FERROCCL_ROOT_ADDR=host:port, or export it before srun",
        Launcher::Pmi => "mpiexec -genv FERROCCL_ROOT_ADDR host:port -genv FERROCCL_SECRET ...",
        Launcher::Slurm => "export FERROCCL_ROOT_ADDR=host:port before srun (srun passes the environment on)",
        Launcher::Ferroccl | Launcher::Torchrun | Launcher::Alone => {
            "export FERROCCL_ROOT_ADDR=host:port on every rank"
        }
    }
}

/// The n-th rendezvous of this process through PMIx; every rank makes them in the
/// same order, so the n-th of all ranks share a key.
static PMIX_CALLS: AtomicUsize = AtomicUsize::new(0);

/// What rank 0 publishes in place of an id when it cannot serve the rendezvous, so
/// the others fail with its reason instead of waiting.
const PMIX_FAILED: &str = "failed: ";

/// Under mpirun or srun --mpi=pmix: rank 0 makes a unique id (a random key, its own
/// port) and publishes it with PMIx; after a fence of the job, the others read it.
fn through_pmix(place: &Place, pmix: &pmix::Client) -> Result<Found> {
    let ns = pmix.namespace();
    if pmix.rank() as usize != place.rank {
        return Err(Error::invalid_usage(format!(
            "PMIx_Init gave rank {} of namespace {ns}, but {} gives rank {}: the launcher's variables do not belong to this PMIx job",
            pmix.rank(),
            place.vars,
            place.rank
        )));
    }
    let key = format!("ferroccl.fcclCommInitFromEnv.{}", PMIX_CALLS.fetch_add(1, Ordering::Relaxed));
    let timeout = env::timeout()?;
    if place.rank == 0 {
        let served = UniqueId::serve(ServerOptions { nranks: Some(place.size), ..ServerOptions::default() });
        let value = match &served {
            Ok((id, _)) => id.to_hex(),
            Err(e) => format!("{PMIX_FAILED}{}", e.msg),
        };
        pmix.put(&key, &value)?;
        pmix.fence(timeout)?;
        let (id, point) = served?;
        return Ok((id, format!("a unique id rank 0 passed through PMIx (namespace {ns}, key {key})"), Some(point)));
    }
    pmix.fence(timeout)?;
    let id =
        id_from_pmix(&pmix.get(0, &key)?).map_err(|e| e.context(format!("{key} of rank 0 in PMIx namespace {ns}")))?;
    Ok((id, format!("a unique id rank 0 passed through PMIx (namespace {ns}, key {key})"), None))
}

/// The unique id in what rank 0 published, or rank 0's reason for having none.
fn id_from_pmix(value: &str) -> Result<UniqueId> {
    if let Some(why) = value.strip_prefix(PMIX_FAILED) {
        return Err(Error::remote_rank(0, format!("rank 0 could not serve the rendezvous: {why}")));
    }
    let id = UniqueId::from_hex(value)?;
    id.addr()?;
    Ok(id)
}

/// True when the ranks may meet through PMIx: the rank comes from mpirun or a PMIx
/// launcher, and a PMIx server started this process (it sets PMIX_NAMESPACE).
fn pmix_applies(launcher: Launcher, namespace: Option<&str>) -> bool {
    matches!(launcher, Launcher::OpenMpi | Launcher::Pmix) && namespace.is_some()
}

/// The error when no rendezvous is given; `pmix` says why PMIx did not stand in.
fn no_rendezvous(l: Launcher, pmix: Option<&str>) -> Error {
    let mut msg = format!(
        "no rendezvous given: set FERROCCL_ROOT_ADDR to host:port of a free port on rank 0's host, the same on every rank ({}), or MASTER_ADDR and MASTER_PORT",
        how_to_give_addr(l)
    );
    if let Some(p) = pmix {
        msg += &format!(
            "; PMIx, through which the ranks of mpirun and srun --mpi=pmix meet when none of these is set, {p}"
        );
    }
    Error::invalid_usage(msg)
}

/// A failed rendezvous through PMIx, with the way to do without it.
fn pmix_failed(e: Error, l: Launcher) -> Error {
    Error {
        msg: format!(
            "the rendezvous through PMIx (no FERROCCL_ROOT_ADDR or MASTER_ADDR/MASTER_PORT given) failed: {}; to meet without PMIx, set FERROCCL_ROOT_ADDR=host:port ({})",
            e.msg,
            how_to_give_addr(l)
        ),
        ..e
    }
}

impl Options {
    /// The defaults the environment sets, for a communicator's creation: refuses a
    /// wrong value of a variable that changes what a communicator does (naming it, its
    /// value and the form: [`env::check`]), and once per process first warns about
    /// FERROCCL_ names that are no variable and wrong tuning values, and logs at INFO
    /// NCCL's variables that have no effect ([`first_creation`]). [`Options::default`]
    /// takes the same values but cannot fail: a wrong one gives the built-in default.
    pub fn from_env() -> Result<Options> {
        first_creation();
        env::check()?;
        Ok(Options { timeout: env::timeout()?, check_mode: env::check_mode()?, ..Options::default() })
    }
}

/// Once per process, at the first communicator's creation: the remarks about the
/// environment ([`env::remarks`]), and the tuning knobs read so that the warnings
/// about their values come now rather than at the call that first reads them.
fn first_creation() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (warn, line) in env::remarks() {
            match warn {
                true => crate::log::warn(format_args!("{line}")),
                false => crate::log::info(format_args!("{line}")),
            }
        }
        let _ = (env::single_copy(), env::stream_min(), env::reuse_max(), env::split_copy(), env::cuda_ipc());
        let _ = (env::cuda_mps(), crate::backend::staging::chunk_bytes(), crate::backend::host::read_settings());
        crate::log::flush_env_warnings();
    });
}

/// MASTER_PORT's form.
const PORT: env::Int = env::Int::new(1, 65535, "", 29500);

/// How long a failed rank 0 waits for the point it serves to tell the others.
const POINT_FLUSH: Duration = Duration::from_secs(3);

/// A job's unique id, how it was found, and the rendezvous point when this process serves it.
type Found = (UniqueId, String, Option<Server>);

/// The unique id of this process's job and how it was found.
fn rendezvous(place: &Place) -> Result<Found> {
    if let Some(hex) = env::UNIQUE_ID.get() {
        let id = UniqueId::from_hex(&hex).map_err(|e| e.context(env::UNIQUE_ID.name))?;
        return Ok((id, "FERROCCL_UNIQUE_ID".into(), None));
    }
    if let Some(addr) = env::ROOT_ADDR.get() {
        return at_addr(addr.trim(), env::ROOT_ADDR.parse_host_port(&addr)?, place);
    }
    if place.size == 1 {
        // A job of one rank meets no one: a private point on loopback.
        let opts = ServerOptions { loopback: true, nranks: Some(1), ..ServerOptions::default() };
        return Ok((UniqueId::serve(opts)?.0, "none (a job of one rank)".into(), None));
    }
    let master = (env::TORCH_MASTER_ADDR.get(), env::TORCH_MASTER_PORT.get());
    let agent_store = place.launcher == Launcher::Torchrun
        && env::TORCHELASTIC_USE_AGENT_STORE.word(&[("True", true), ("False", false)])?.unwrap_or(false);
    match master {
        (Some(h), Some(p)) if agent_store => through_torch_store(place, h.trim(), &p),
        (Some(h), Some(p)) => {
            let h = h.trim();
            // An IPv6 literal needs brackets before a port.
            let host = if h.contains(':') && !h.starts_with('[') { format!("[{h}]") } else { h.to_string() };
            let port = env::TORCH_MASTER_PORT.parse_int(&p, PORT)?;
            let addr = format!("{host}:{port}");
            let sock = env::resolve(&addr).ok_or_else(|| {
                env::TORCH_MASTER_ADDR.refuse(h, "a host name or IP address that resolves (rank 0's host)")
            })?;
            at_addr(&addr, sock, place)
        }
        (Some(_), None) | (None, Some(_)) => Err(Error::invalid_usage(format!(
            "only one of MASTER_ADDR and MASTER_PORT is set ({}); set both, or FERROCCL_ROOT_ADDR=host:port",
            [&env::TORCH_MASTER_ADDR, &env::TORCH_MASTER_PORT]
                .iter()
                .filter_map(|v| v.get().map(|x| format!("{}={}", v.name, x.trim())))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        (None, None) => {
            let ns = env::PMIX_NAMESPACE.get();
            if !pmix_applies(place.launcher, ns.as_deref()) {
                let why = matches!(place.launcher, Launcher::OpenMpi | Launcher::Pmix)
                    .then_some("was not tried: PMIX_NAMESPACE is not set, so no PMIx server started this process");
                return Err(no_rendezvous(place.launcher, why));
            }
            match pmix::client() {
                Ok(c) => through_pmix(place, c).map_err(|e| pmix_failed(e, place.launcher)),
                Err(e) if e.code == Code::Unavailable => {
                    Err(no_rendezvous(place.launcher, Some(&format!("could not be used: {}", e.msg))))
                }
                Err(e) => Err(pmix_failed(e, place.launcher)),
            }
        }
    }
}

/// Creates this process's rank as fcclCommInitFromEnv does: its place from the
/// launcher's variables ([`place`]), then the rendezvous: FERROCCL_UNIQUE_ID,
/// FERROCCL_ROOT_ADDR, none for a job of one rank, torchrun's store when its agent
/// serves MASTER_PORT, MASTER_ADDR:MASTER_PORT, else PMIx under mpirun or srun --mpi=pmix.
pub fn init() -> Result<Comm> {
    let opts = Options::from_env()?;
    let place = place(&|v: &Var| v.get())?;
    let local = place.local_rank.map_or_else(|| "unknown".to_string(), |l| l.to_string());
    crate::log::info(format_args!(
        "fcclCommInitFromEnv: rank {} of {}, local rank {local}, from {} ({})",
        place.rank,
        place.size,
        place.launcher.describe(),
        place.vars
    ));
    let who = format!("rank {} of {} from {} ({})", place.rank, place.size, place.launcher.describe(), place.vars);
    let (id, via, point) = rendezvous(&place).map_err(|e| e.context(&who))?;
    crate::log::info(format_args!("fcclCommInitFromEnv: rank {}'s rendezvous: {via}", place.rank));
    let made = Comm::init_rank(place.size, &id, place.rank, opts);
    if let (Err(_), Some(point)) = (&made, point) {
        // The other ranks learn why from the point, which lives in this process: the
        // caller may exit as soon as we return.
        point.wait_flushed(POINT_FLUSH);
    }
    made.map_err(|e| e.context(format!("{who}, {via}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    fn place_of(vars: &[(&str, &str)]) -> Result<Place> {
        let get = |v: &Var| vars.iter().find(|(n, _)| *n == v.name).map(|(_, x)| x.to_string());
        place(&get)
    }

    fn ok(vars: &[(&str, &str)]) -> (usize, usize, Option<usize>, Launcher) {
        let p = place_of(vars).unwrap_or_else(|e| panic!("{vars:?}: {}", e.msg));
        (p.rank, p.size, p.local_rank, p.launcher)
    }

    #[test]
    fn each_launcher_alone() {
        use Launcher::*;
        let ferroccl = [("FERROCCL_RANK", "1"), ("FERROCCL_WORLD_SIZE", "4"), ("FERROCCL_LOCAL_RANK", "1")];
        assert_eq!(ok(&ferroccl), (1, 4, Some(1), Ferroccl));
        assert_eq!(ok(&[("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")]), (3, 8, Some(1), Torchrun));
        let ompi = [("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "3"), ("OMPI_COMM_WORLD_LOCAL_RANK", "0")];
        assert_eq!(ok(&ompi), (2, 3, Some(0), OpenMpi));
        assert_eq!(
            ok(&[("PMIX_RANK", "5"), ("SLURM_STEP_NUM_TASKS", "6"), ("SLURM_LOCALID", "1")]),
            (5, 6, Some(1), Pmix)
        );
        assert_eq!(ok(&[("PMI_RANK", "0"), ("PMI_SIZE", "2"), ("MPI_LOCALRANKID", "0")]), (0, 2, Some(0), Pmi));
        assert_eq!(ok(&[("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("PMI_LOCAL_RANK", "1")]), (1, 2, Some(1), Pmi));
        let slurm = [("SLURM_PROCID", "3"), ("SLURM_STEP_NUM_TASKS", "4"), ("SLURM_LOCALID", "1")];
        assert_eq!(ok(&slurm), (3, 4, Some(1), Slurm));
        assert_eq!(ok(&[("SLURM_PROCID", "0"), ("SLURM_STEP_NUM_TASKS", "1")]), (0, 1, None, Slurm));
    }

    #[test]
    fn precedence_follows_the_launcher_nearest_the_process() {
        // mpirun inside a Slurm allocation: every rank inherits mpirun's SLURM_*.
        let inside_slurm = [
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_NUM_TASKS", "1"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "0"),
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("PMIX_RANK", "5"),
        ];
        assert_eq!(ok(&inside_slurm), (5, 8, Some(1), Launcher::OpenMpi));
        // Hydra under Slurm: the proxy is a task of srun, the rank is Hydra's.
        let hydra = [("SLURM_PROCID", "1"), ("SLURM_STEP_NUM_TASKS", "2"), ("PMI_RANK", "6"), ("PMI_SIZE", "8")];
        assert_eq!(ok(&hydra), (6, 8, None, Launcher::Pmi));
        // ferroccl-run sets both its own and torchrun's; its own win over anything inherited.
        let both = [
            ("FERROCCL_RANK", "1"),
            ("FERROCCL_WORLD_SIZE", "2"),
            ("RANK", "7"),
            ("WORLD_SIZE", "9"),
            ("PMI_RANK", "0"),
        ];
        assert_eq!(ok(&both), (1, 2, None, Launcher::Ferroccl));
        // torchrun under srun: RANK wins over the step's SLURM_PROCID.
        let t = [("RANK", "3"), ("WORLD_SIZE", "4"), ("SLURM_PROCID", "0"), ("SLURM_STEP_NUM_TASKS", "1")];
        assert_eq!(ok(&t), (3, 4, None, Launcher::Torchrun));
        // PMIx with Open MPI's size, or with PMI's (PMIx's MPICH personality).
        assert_eq!(ok(&[("PMIX_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "3")]), (2, 3, None, Launcher::Pmix));
        assert_eq!(
            ok(&[("PMIX_RANK", "2"), ("PMI_SIZE", "3"), ("MPI_LOCALRANKID", "2")]),
            (2, 3, Some(2), Launcher::Pmix)
        );
    }

    #[test]
    fn rank_and_size_never_mix_launchers() {
        // FERROCCL_RANK with torchrun's WORLD_SIZE is half-set, not a world of WORLD_SIZE.
        let e = place_of(&[("FERROCCL_RANK", "1"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert_eq!(e.code, Code::InvalidUsage);
        assert!(e.msg.contains("FERROCCL_RANK=1") && e.msg.contains("FERROCCL_WORLD_SIZE is not set"), "{}", e.msg);
        let e = place_of(&[("RANK", "0")]).unwrap_err();
        assert!(e.msg.contains("RANK=0") && e.msg.contains("torchrun") && e.msg.contains("WORLD_SIZE"), "{}", e.msg);
        let e = place_of(&[("OMPI_COMM_WORLD_RANK", "0"), ("PMI_SIZE", "2")]).unwrap_err();
        assert!(e.msg.contains("OMPI_COMM_WORLD_RANK=0") && e.msg.contains("OMPI_COMM_WORLD_SIZE"), "{}", e.msg);
        let e = place_of(&[("PMIX_RANK", "1"), ("SLURM_NTASKS", "4")]).unwrap_err();
        for name in ["PMIX_RANK=1", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"] {
            assert!(e.msg.contains(name), "{name}: {}", e.msg);
        }
        let e = place_of(&[("PMI_RANK", "1")]).unwrap_err();
        assert!(e.msg.contains("PMI_RANK=1") && e.msg.contains("PMI_SIZE"), "{}", e.msg);
    }

    #[test]
    fn a_slurm_batch_script_is_not_a_launch() {
        // sbatch gives its script SLURM_PROCID=0 and the allocation's SLURM_NTASKS.
        let e = place_of(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4"), ("SLURM_LOCALID", "0")]).unwrap_err();
        assert_eq!(e.code, Code::InvalidUsage);
        for s in [
            "SLURM_PROCID=0 without SLURM_STEP_NUM_TASKS",
            "SLURM_NTASKS=4",
            "batch script",
            "srun",
            "ferroccl-run -n N",
        ] {
            assert!(e.msg.contains(s), "{s}: {}", e.msg);
        }
    }

    #[test]
    fn a_program_started_on_its_own_is_a_job_of_one_rank() {
        assert_eq!(ok(&[]), (0, 1, Some(0), Launcher::Alone));
        assert_eq!(ok(&[("SLURM_NTASKS", "4"), ("LOCAL_RANK", "3")]), (0, 1, Some(0), Launcher::Alone));
    }

    #[test]
    fn a_size_without_a_rank_says_what_was_looked_for_and_how_to_start() {
        let e = place_of(&[("WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_SIZE", "4")]).unwrap_err();
        assert!(e.msg.contains("yet WORLD_SIZE, OMPI_COMM_WORLD_SIZE are set:"), "{}", e.msg);
        assert_eq!(e.code, Code::InvalidUsage);
        for s in [
            "FERROCCL_RANK",
            "RANK (torchrun)",
            "OMPI_COMM_WORLD_RANK",
            "PMIX_RANK",
            "PMI_RANK",
            "SLURM_PROCID",
            "ferroccl-run -n N",
            "torchrun",
            "FERROCCL_ROOT_ADDR",
        ] {
            assert!(e.msg.contains(s), "{s}: {}", e.msg);
        }
        assert!(!e.msg.contains("batch script"), "{}", e.msg);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = place_of(&[("OMPI_COMM_WORLD_RANK", "one"), ("OMPI_COMM_WORLD_SIZE", "2")]).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.msg.contains("OMPI_COMM_WORLD_RANK is \"one\""), "{}", e.msg);
        let e = place_of(&[("PMI_RANK", "2"), ("PMI_SIZE", "2")]).unwrap_err();
        assert!(e.msg.contains("PMI_RANK=2 is out of range for PMI_SIZE=2"), "{}", e.msg);
        let e = place_of(&[("RANK", "0"), ("WORLD_SIZE", "0")]).unwrap_err();
        assert!(e.msg.contains("WORLD_SIZE=0"), "{}", e.msg);
        let e = place_of(&[("RANK", "0"), ("WORLD_SIZE", "4294967296")]).unwrap_err();
        assert!(e.msg.contains("WORLD_SIZE=4294967296"), "{}", e.msg);
        let e = place_of(&[("SLURM_PROCID", "1"), ("SLURM_STEP_NUM_TASKS", "2"), ("SLURM_LOCALID", "2")]).unwrap_err();
        assert!(e.msg.contains("SLURM_LOCALID=2 is not below SLURM_STEP_NUM_TASKS=2"), "{}", e.msg);
        let e = place_of(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "-1")]).unwrap_err();
        assert!(e.msg.contains("LOCAL_RANK is \"-1\""), "{}", e.msg);
    }

    #[test]
    fn pmix_stands_in_only_for_mpirun_and_pmix_launchers_it_started() {
        use Launcher::*;
        assert!(pmix_applies(OpenMpi, Some("prterun-host-1@1")));
        assert!(pmix_applies(Pmix, Some("slurm.pmix.7.0")));
        // OMPI_* set by hand without a PMIx server: PMIx_Init would make a singleton.
        assert!(!pmix_applies(OpenMpi, None));
        // Ranks set by hand need not be PMIx's ranks, even under mpirun.
        for l in [Ferroccl, Torchrun, Pmi, Slurm, Alone] {
            assert!(!pmix_applies(l, Some("ns")), "{l:?}");
        }
    }

    #[test]
    fn without_a_rendezvous_the_message_says_how_to_give_one_and_why_not_pmix() {
        let e =
            no_rendezvous(Launcher::OpenMpi, Some("could not be used: libpmix could not be loaded (libpmix.so.2: x)"));
        assert_eq!(e.code, Code::InvalidUsage);
        for s in [
            "no rendezvous given: set FERROCCL_ROOT_ADDR",
            "mpirun -x FERROCCL_ROOT_ADDR=host:port",
            "PMIx",
            "libpmix.so.2: x",
        ] {
            assert!(e.msg.contains(s), "{s}: {}", e.msg);
        }
        let e = no_rendezvous(Launcher::Pmi, None);
        assert!(e.msg.contains("mpiexec -genv FERROCCL_ROOT_ADDR") && !e.msg.contains("PMIx"), "{}", e.msg);
        let e = pmix_failed(Error::system("PMIx_Fence of namespace ns failed: TIMEOUT"), Launcher::Pmix);
        assert_eq!(e.code, Code::SystemError);
        for s in ["through PMIx", "PMIx_Fence of namespace ns failed", "set FERROCCL_ROOT_ADDR=host:port", "srun"] {
            assert!(e.msg.contains(s), "{s}: {}", e.msg);
        }
    }

    #[test]
    fn what_rank_0_publishes_through_pmix() {
        let key = JobKey::derive(super::super::bootstrap::KeySource::Secret, "s");
        let id = UniqueId::from_addr("127.0.0.1:5000".parse().unwrap(), key);
        assert_eq!(id_from_pmix(&id.to_hex()).unwrap(), id);
        let e = id_from_pmix(&format!("{PMIX_FAILED}cannot open the rendezvous port: no address")).unwrap_err();
        assert_eq!((e.code, e.culprit), (Code::RemoteError, Some(0)));
        assert!(e.msg.contains("rank 0 could not serve the rendezvous: cannot open the rendezvous port"), "{}", e.msg);
        assert!(id_from_pmix("hello").is_err());
    }

    #[test]
    fn values_are_trimmed_and_vars_listed() {
        let p = place_of(&[("PMI_RANK", " 1\n"), ("PMI_SIZE", "2 "), ("MPI_LOCALRANKID", "1")]).unwrap();
        assert_eq!(p.vars, "PMI_RANK=1, PMI_SIZE=2, MPI_LOCALRANKID=1");
    }
}
