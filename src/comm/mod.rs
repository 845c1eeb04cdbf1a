//! Communicators: creation (rendezvous, threads, split), execution of calls, abort.

pub mod addr;
pub mod bootstrap;
mod connect;
pub mod creation;
pub mod device;
pub mod from_env;
pub mod group;
pub mod pmix;
pub mod progress;
pub mod torchstore;

use crate::backend::builtin::Builtin;
use crate::backend::ipc::{self, Ipc};
use crate::backend::nccl::{Nccl, NcclBackend};
use crate::backend::Algo;
use crate::backend::{Exec, Posting, Router};
use crate::coll::{Call, Coll};
use crate::error::{Code, Error, Result};
use crate::log;
use crate::mem::{cuda, Placement};
use crate::transport::shm::Segment;
use crate::transport::{inproc, Transport};
use bootstrap::{Client, UniqueId};
use progress::{Progress, Status};
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Which backend serves a communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Auto,
    Host,
    Nccl,
}

/// Communicator options (the core's view of `fcclConfig_t`).
#[derive(Clone, Debug)]
pub struct Options {
    /// false: the C calls on the communicator return fcclInProgress and run on its
    /// progress thread (see [`progress`]); the core runs calls the same either way.
    pub blocking: bool,
    pub timeout: Duration,
    pub backend: Backend,
    pub name: String,
    /// checkMode: Some(true) fingerprint, Some(false) off, None unset (fingerprint,
    /// except device calls of ranks sharing one GPU: [`Posting::Device`]).
    pub check_mode: Option<bool>,
    /// CUDA device of the rank; None: the device of the context current on the
    /// creating thread (captured at the C call, before a group defers the work).
    pub device: Option<i32>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            blocking: true,
            timeout: crate::env::default_timeout(),
            backend: Backend::Auto,
            name: String::new(),
            check_mode: crate::env::check_mode().unwrap_or(None),
            device: None,
        }
    }
}

struct State {
    transport: Transport,
    /// Calls issued so far; every rank numbers its calls the same way.
    seq: u64,
    /// Set by a fatal error: the communicator only accepts destroy/abort now.
    broken: Option<Error>,
    finalized: bool,
    /// What served the last run of calls: (backend, algorithm), ("none", "none") before any.
    last_path: (&'static str, &'static str),
    /// Host exchanges with the other ranks that run made besides its data.
    last_exchanges: u32,
}

/// One rank's communicator.
pub struct Comm {
    pub rank: usize,
    pub nranks: usize,
    pub opts: Options,
    /// Shared by every rank of the communicator; names split children's segments.
    nonce: u64,
    splits: AtomicU64,
    abort: AtomicBool,
    /// The error that broke the communicator (fcclCommGetAsyncError).
    async_err: Mutex<Option<Error>>,
    /// Work of a non-blocking communicator (and a non-blocking split of any), in order.
    progress: Progress,
    /// Non-blocking splits of this communicator not done with it yet: calls from other
    /// threads than the progress thread are refused meanwhile.
    splitting: AtomicUsize,
    /// Wakes this rank's waits from another thread (abort).
    waker: Option<Arc<Segment>>,
    state: Mutex<State>,
    /// CUDA device of the rank (fcclCommCuDevice), -1 for a host rank.
    pub device: i32,
    /// The backends that serve this communicator's calls, in order of preference.
    router: Router,
    /// Set once the first device call on a rank without a device was logged.
    told_no_device: AtomicBool,
    /// Why device memory is staged though the ranks have GPUs (neither NCCL nor the
    /// one-GPU path serves it), and what to do: said once, at the first device call.
    staged_why: Option<(String, &'static str)>,
    told_staged: AtomicBool,
    /// Device memory the coalesced calls pack their buckets into, reused call after call.
    pub buckets: Mutex<cuda::Arena>,
    /// Device memory the PreMulSum products go into, lent call by call.
    pub products: Arc<cuda::Arenas>,
    /// The local address of the connection to the rendezvous point, for connecting the ranks of splits.
    route: Option<std::net::IpAddr>,
}

impl Comm {
    fn new(rank: usize, nranks: usize, opts: Options, nonce: u64, transport: Transport) -> Comm {
        let waker = transport.waker();
        // A blocking communicator's only jobs are its non-blocking splits: no thread idles.
        let progress = Progress::new(!opts.blocking);
        Comm {
            rank,
            nranks,
            opts,
            nonce,
            splits: AtomicU64::new(0),
            abort: AtomicBool::new(false),
            async_err: Mutex::new(None),
            progress,
            splitting: AtomicUsize::new(0),
            waker,
            state: Mutex::new(State {
                transport,
                seq: 0,
                broken: None,
                finalized: false,
                last_path: ("none", "none"),
                last_exchanges: 0,
            }),
            device: -1,
            router: Router::new(vec![Box::new(Builtin { rank, nranks })]),
            told_no_device: AtomicBool::new(false),
            staged_why: None,
            told_staged: AtomicBool::new(false),
            buckets: Mutex::new(cuda::Arena::default()),
            products: Arc::default(),
            route: None,
        }
    }

    /// The router's table: NCCL when it serves this rank's device memory, the IPC path
    /// when every rank shares one GPU and it is enabled (`one_gpu`: what every rank
    /// learned for it at set-up), the built-in backend last.
    fn set_backends(&mut self, nccl: Option<Nccl>, one_gpu: Option<ipc::Setup>) {
        let (rank, nranks) = (self.rank, self.nranks);
        let mut table: Vec<Box<dyn crate::backend::Backend>> = Vec::new();
        if let Some(nccl) = nccl {
            table.push(Box::new(NcclBackend { nccl, rank, nranks }));
        } else if let (Some(min_bytes), Some(setup)) = (ipc::min_bytes(), one_gpu) {
            table.push(Box::new(Ipc::new(rank, nranks, self.device, min_bytes, self.opts.timeout, setup).shared()));
        }
        table.push(Box::new(Builtin { rank, nranks }));
        self.router = Router::new(table);
    }

    /// The name of the backend serving this communicator's device memory.
    pub fn backend_name(&self) -> &'static str {
        self.router.device_backend()
    }

    /// Whether the device path of ranks on one GPU serves `c` (for calls it takes in
    /// a form of its own).
    pub fn ipc_takes(&self, c: &Coll) -> bool {
        self.router.name_of(c) == "ipc"
    }

    /// What [`Comm::init_rank`] checks before it meets anyone: a non-blocking init
    /// reports these errors from the call itself.
    pub fn check_init(nranks: usize, id: &UniqueId, rank: usize, opts: &Options) -> Result<Backend> {
        if nranks == 0 {
            return Err(Error::invalid_arg("nranks is 0; a communicator has at least one rank"));
        }
        if rank >= nranks {
            return Err(Error::invalid_arg(format!(
                "rank {rank} out of range for a communicator of {nranks} ranks (valid: 0..{})",
                nranks - 1
            )));
        }
        id.addr()?;
        device::requested(opts)
    }

    /// One rank of a communicator whose ranks meet at `id`'s rendezvous point.
    pub fn init_rank(nranks: usize, id: &UniqueId, rank: usize, opts: Options) -> Result<Comm> {
        let req = Self::check_init(nranks, id, rank, &opts)?;
        let deadline = Instant::now() + opts.timeout;
        let mut client = Client::join(id, nranks, rank, deadline)?;
        let nonce = client.nonce;
        // Whatever ends this set-up early, the names of ranks that died in it go too.
        let sweep = crate::transport::shm::SweepOnFailure::new(format!("{nonce:016x}"));
        let route = client.local_ip();
        let connected = connect::ranks(rank, nranks, &format!("{nonce:016x}"), nonce, deadline, route, &mut |blob| {
            client.allgather(blob, deadline)
        });
        let transport = match connected {
            Ok(t) => t,
            Err(e) => {
                // The others learn why at once (this rank's process may serve the point).
                client.fail(&e.msg);
                return Err(e);
            }
        };
        // One more round: every rank's device, so all choose the same backend.
        let me = device::RankInfo::local(connect::host_id(), opts.device);
        let blobs = client.allgather(&me.encode(), deadline)?;
        // No rank has CUDA (the common case): nothing to decide, nothing to decode.
        let all: Vec<device::RankInfo> = if req != Backend::Nccl && blobs.iter().all(|b| !device::RankInfo::has_cuda(b))
        {
            Vec::new()
        } else {
            blobs.iter().map(|b| device::RankInfo::decode(b)).collect::<Result<_>>()?
        };
        let decision = if all.is_empty() { Ok(false) } else { device::use_nccl(req, &all, rank) };
        let mut one_gpu = None;
        let nccl_id = match decision {
            Err(e) => {
                client.finish();
                return Err(e);
            }
            Ok(false) => {
                let setup = if device::one_gpu(&all) && ipc::min_bytes().is_some() {
                    ipc::Setup::processes(rank, nranks, nonce, me.device, &mut |blob| client.allgather(blob, deadline))
                } else {
                    Ok(None)
                };
                client.finish();
                one_gpu = setup?;
                None
            }
            Ok(true) => {
                // Rank 0's NCCL unique id travels through our rendezvous.
                let blob = if rank == 0 {
                    match crate::backend::nccl::unique_id() {
                        Ok(id) => [&[1u8][..], &id[..]].concat(),
                        Err(e) => [&[0u8][..], e.msg.as_bytes()].concat(),
                    }
                } else {
                    Vec::new()
                };
                let got = client.allgather(&blob, deadline);
                client.finish();
                let got = got?;
                let b = &got[0];
                if b.first() != Some(&1) || b.len() != 129 {
                    return Err(Error::unavailable(format!(
                        "rank 0 could not create an NCCL unique id: {}",
                        String::from_utf8_lossy(b.get(1..).unwrap_or_default())
                    )));
                }
                Some(<[u8; 128]>::try_from(&b[1..]).expect("129 bytes"))
            }
        };
        let mut c = Comm::new(rank, nranks, opts, nonce, transport);
        c.route = route;
        c.device = me.device;
        let nccl = match nccl_id {
            Some(id) => Some(Nccl::init_rank(nranks, &id, rank, me.device)?),
            None => None,
        };
        let staged = nccl.is_none() && one_gpu.is_none();
        c.set_backends(nccl, one_gpu);
        if staged && c.device >= 0 {
            c.staged_why = device::staging_reason(req, &all, ipc::min_bytes().is_some());
        }
        log::info(format_args!(
            "rank {rank}/{nranks} joined communicator {} (device {}, backends {})",
            c.label(),
            c.device,
            c.router.describe()
        ));
        sweep.disarm();
        Ok(c)
    }

    /// `n` ranks as threads of this process: host-memory ranks (`devs` None) or one
    /// rank per entry of `devs` (CUDA devices, repeats allowed: those ranks share a
    /// GPU and use the built-in backend).
    pub fn init_all(n: usize, opts: Options, devs: Option<&[i32]>) -> Result<Vec<Comm>> {
        if n == 0 {
            return Err(Error::invalid_arg("ndev is 0; create at least one rank"));
        }
        let req = device::requested(&opts)?;
        let host = connect::host_id();
        let infos: Vec<device::RankInfo> = match devs {
            None => {
                (0..n).map(|_| device::RankInfo { device: -1, ..device::RankInfo::local(host, Some(-1)) }).collect()
            }
            Some(d) => {
                cuda::driver().map_err(|e| e.context("devlist names CUDA devices"))?;
                let count = cuda::device_count();
                if let Some((i, &bad)) = d.iter().enumerate().find(|(_, &x)| x < 0 || x as usize >= count) {
                    return Err(Error::invalid_arg(format!(
                        "devlist[{i}] = {bad} is not a CUDA device (this process sees {count}: 0..{})",
                        count as i64 - 1
                    )));
                }
                d.iter().map(|&x| device::RankInfo::local(host, Some(x))).collect()
            }
        };
        let nccl = device::use_nccl(req, &infos, 0)?;
        let nonce = bootstrap::random_u64()?;
        let mut comms: Vec<Comm> =
            inproc::build(n)?.into_iter().enumerate().map(|(r, t)| Comm::new(r, n, opts.clone(), nonce, t)).collect();
        let one_gpu = device::one_gpu(&infos);
        let mut nccls: Vec<Option<Nccl>> = (0..n).map(|_| None).collect();
        if nccl {
            let devs: Vec<i32> = infos.iter().map(|i| i.device).collect();
            nccls = Nccl::init_all(&devs)?.into_iter().map(Some).collect();
        }
        // Ranks of one process share the control region (their send/recv mailboxes).
        let one = (one_gpu && !nccl && ipc::min_bytes().is_some()).then(|| ipc::Setup::threads(nonce, n));
        for ((c, i), nc) in comms.iter_mut().zip(&infos).zip(nccls) {
            c.device = i.device;
            let setup = one.clone();
            let staged = nc.is_none() && setup.is_none();
            c.set_backends(nc, setup);
            if staged && c.device >= 0 {
                c.staged_why = device::staging_reason(req, &infos, ipc::min_bytes().is_some());
            }
        }
        Ok(comms)
    }

    /// A name for logs and messages.
    pub fn label(&self) -> String {
        if self.opts.name.is_empty() {
            format!("{:08x}", self.nonce as u32)
        } else {
            self.opts.name.clone()
        }
    }

    fn usable(&self, st: &State) -> Result<()> {
        if self.abort.load(Ordering::Acquire) {
            return Err(Error::invalid_usage("the communicator was aborted; destroy it"));
        }
        if let Some(e) = &st.broken {
            return Err(Error::invalid_usage(format!(
                "the communicator is unusable after an earlier error ({}); destroy or abort it and create a new one",
                e.msg
            )));
        }
        if st.finalized {
            return Err(Error::invalid_usage("the communicator was finalized; only fcclCommDestroy may follow"));
        }
        Ok(())
    }

    /// Runs calls (validated by the caller) as one unit: a single call, or this
    /// communicator's share of a group.
    pub fn run(&self, colls: impl IntoIterator<Item = Coll>) -> Result<()> {
        let mut calls: Vec<Call> = colls.into_iter().map(|coll| Call { coll, seq: 0 }).collect();
        self.run_calls_in_place(&mut calls)
    }

    /// As [`Comm::run`], for calls already made (a group's queue): each gets its
    /// sequence number where it lies.
    pub fn run_calls_in_place(&self, calls: &mut [Call]) -> Result<()> {
        let mut st = self.enter(|| match calls {
            [c] => c.coll.kind.c_name().to_string(),
            _ => format!("a group of {} calls", calls.len()),
        })?;
        self.usable(&st)?;
        for c in calls.iter_mut() {
            c.seq = Self::next_seq(&mut st, &c.coll);
        }
        self.run_calls(&mut st, calls)
    }

    /// Runs one call (validated by the caller), without allocating.
    pub fn run_one(&self, coll: Coll) -> Result<()> {
        let mut st = self.enter(|| coll.kind.c_name().to_string())?;
        self.usable(&st)?;
        let seq = Self::next_seq(&mut st, &coll);
        self.run_calls(&mut st, &mut [Call { coll, seq }])
    }

    /// The communicator's state for one call. A call of another thread holding it now
    /// means two threads use the communicator at once, which NCCL forbids too: their
    /// calls would pair up differently on different ranks and mix data silently, so the
    /// later one is refused instead (nothing counted, nothing sent). An abort from
    /// another thread holds it briefly too; then the call reports the abort.
    /// Work queued on the progress thread (a non-blocking split of a blocking
    /// communicator) is refused from any other thread in the same way, whether or not
    /// it holds the state at this instant: the two would pair up differently on
    /// different ranks.
    fn enter(&self, what: impl FnOnce() -> String) -> Result<std::sync::MutexGuard<'_, State>> {
        if self.splitting.load(Ordering::Acquire) > 0 && !self.progress.on_worker() {
            return Err(Error::invalid_usage(format!(
                "{} on communicator {} while work issued on it without blocking (fcclInProgress) is still pending; poll fcclCommGetAsyncError (on the new communicator of a non-blocking fcclCommSplit) until it returns fcclSuccess first",
                what(),
                self.label()
            )));
        }
        match self.state.try_lock() {
            Ok(st) => Ok(st),
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if self.abort.load(Ordering::Acquire) => {
                Err(Error::invalid_usage("the communicator was aborted; destroy it"))
            }
            Err(std::sync::TryLockError::WouldBlock) => Err(Error::invalid_usage(format!(
                "{} on communicator {} while another thread is in the middle of a call on it; a communicator serves one thread at a time (as in NCCL): give each thread its own communicator (fcclCommSplit) or serialise the calls",
                what(),
                self.label()
            ))),
        }
    }

    /// The sequence number of the next call. Only collectives take a new one: a
    /// send/recv involves two ranks, so counting it would put the others out of step.
    fn next_seq(st: &mut State, coll: &Coll) -> u64 {
        if !coll.kind.is_p2p() {
            st.seq += 1;
        }
        st.seq
    }

    fn run_calls(&self, st: &mut State, calls: &mut [Call]) -> Result<()> {
        let t0 = log::enabled(log::Level::Info).then(Instant::now);
        let st = &mut *st;
        // Without CUDA every buffer is host memory: one relaxed load, then the host path.
        let cuda = cuda::active();
        let mut x = Exec {
            t: &mut st.transport,
            seq: &mut st.seq,
            timeout: self.opts.timeout,
            abort: &self.abort,
            check: self.opts.check_mode != Some(false),
            posting: Posting::of(self.opts.check_mode),
            cuda,
            backend: "host",
            algo: Algo::None,
            exchanges: 0,
        };
        // A call that a device backend claims whatever its memory (per-rank counts on one
        // GPU) goes through the router too.
        let res = if cuda && (calls.iter().any(|c| c.coll.placement != Placement::Host) || self.router.claims(calls)) {
            self.warn_no_device();
            self.warn_staged();
            self.router.run(&mut x, calls)
        } else {
            self.router.run_host(&mut x, calls)
        };
        let (served, algo) = (x.backend, x.algo.name());
        st.last_path = (served, algo);
        st.last_exchanges = x.exchanges;
        if let Some(t0) = t0 {
            let us = t0.elapsed().as_secs_f64() * 1e6;
            for (c, routed) in calls.iter().zip(self.router.names(calls)) {
                // A group over several backends: each call's own.
                let backend = if served == "mixed" { routed } else { served };
                log::info(format_args!(
                    "rank {} comm {} seq {} {} count {} {}{} backend {backend} algorithm {algo} {:.1} us, host exchanges {}",
                    self.rank,
                    self.label(),
                    c.seq,
                    c.coll.kind.c_name(),
                    c.coll.count,
                    c.coll.dtype.short_name(),
                    c.coll.wire.map_or(String::new(), |w| format!(" wire {}", w.short_name())),
                    us,
                    x.exchanges
                ));
            }
        }
        match res {
            Ok(outcome) => outcome.into_result(),
            Err(e) => {
                log::warn(format_args!("rank {} comm {}: {}", self.rank, self.label(), e.msg));
                *self.async_err.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
                st.broken = Some(e.clone());
                st.transport.mark_failed(e.culprit, e.code);
                Err(e)
            }
        }
    }

    /// What served the last run of calls on this communicator: (backend, algorithm) as
    /// the INFO log line names them; ("none", "none") before the first. Waits while
    /// another thread is in a call on it.
    pub fn last_path(&self) -> (&'static str, &'static str) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).last_path
    }

    /// How many host exchanges with the other ranks the last run of calls made besides
    /// its data (0 before the first). Waits while another thread is in a call on it.
    pub fn last_exchanges(&self) -> u32 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).last_exchanges
    }

    /// Device memory staged because neither NCCL nor the one-GPU path serves it: say so once.
    fn warn_staged(&self) {
        if let Some((why, fix)) = &self.staged_why {
            if !self.told_staged.swap(true, Ordering::Relaxed) {
                log::warn(format_args!(
                    "rank {} comm {}: device memory goes through host staging, not GPU to GPU: {why}. To fix: {fix} (said once per communicator)",
                    self.rank,
                    self.label()
                ));
            }
        }
    }

    /// Device memory on a rank created without a current device is staged: say so once.
    fn warn_no_device(&self) {
        if self.device < 0 && !self.told_no_device.swap(true, Ordering::Relaxed) {
            log::warn(format_args!(
                "rank {} comm {}: device memory on a communicator created with no current CUDA device; its device calls are staged through host memory. Make the device current (cudaSetDevice) before creating the communicator.",
                self.rank,
                self.label()
            ));
        }
    }

    /// A split colour is >= 0 or FCCL_SPLIT_NOCOLOR (-1).
    pub fn check_color(color: i32) -> Result<()> {
        if color < -1 {
            return Err(Error::invalid_arg(format!(
                "color {color} is negative; use a colour >= 0, or FCCL_SPLIT_NOCOLOR (-1) to opt out"
            )));
        }
        Ok(())
    }

    /// `fcclCommSplit`: every rank of this communicator calls it; ranks with the
    /// same colour form a communicator, ordered by key then by rank here.
    pub fn split(&self, color: i32, key: i32, opts: Options) -> Result<Option<Comm>> {
        Self::check_color(color)?;
        let k = self.splits.fetch_add(1, Ordering::AcqRel);
        let n = self.nranks;
        let deadline = Instant::now() + opts.timeout;
        // Everyone learns everyone's (colour, key).
        let mut mine = [0u8; 8];
        mine[0..4].copy_from_slice(&color.to_le_bytes());
        mine[4..8].copy_from_slice(&key.to_le_bytes());
        let all = self.allgather_bytes(&mine)?;
        let ck = |r: usize| {
            let b = &all[r * 8..r * 8 + 8];
            (i32::from_le_bytes(b[0..4].try_into().unwrap()), i32::from_le_bytes(b[4..8].try_into().unwrap()))
        };
        let mut members: Vec<usize> = (0..n).filter(|&r| color >= 0 && ck(r).0 == color).collect();
        members.sort_by_key(|&r| (ck(r).1, r));
        // Wiring rounds run over this communicator; non-members take part and leave.
        let mut rounds = |blob: &[u8]| -> Result<Vec<Vec<u8>>> {
            let mut padded = vec![0u8; connect::BLOB_BYTES];
            padded[..blob.len()].copy_from_slice(blob);
            let all = self.allgather_bytes(&padded)?;
            Ok(members.iter().map(|&r| all[r * connect::BLOB_BYTES..(r + 1) * connect::BLOB_BYTES].to_vec()).collect())
        };
        // Ranks sharing one GPU set up the child's GPU-to-GPU path in rounds of their own
        // (every rank's parent serves device memory alike, so all run the same rounds).
        let device_backend = self.router.device_backend();
        let one_gpu = device_backend == "ipc";
        if color < 0 {
            for _ in 0..connect::ROUNDS + if one_gpu { ipc::Setup::ROUNDS } else { 0 } {
                rounds(&[])?;
            }
            return Ok(None);
        }
        let new_rank = members.iter().position(|&r| r == self.rank).expect("a rank is a member of its colour");
        let nonce = self.nonce ^ (k + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (color as u64).rotate_left(32);
        let name = format!("{:016x}-s{k}-c{color}", self.nonce);
        let sweep = crate::transport::shm::SweepOnFailure::new(name.clone());
        let t = connect::ranks(new_rank, members.len(), &name, nonce, deadline, self.route, &mut rounds)?;
        let setup = if one_gpu {
            ipc::Setup::processes(new_rank, members.len(), nonce, self.device, &mut rounds)?
        } else {
            None
        };
        sweep.disarm();
        let mut opts = opts;
        if opts.name.is_empty() && !self.opts.name.is_empty() {
            opts.name = format!("{}.{color}", self.opts.name);
        }
        // The child keeps the parent's device, and ranks on one GPU their GPU-to-GPU path.
        let mut child = Comm::new(new_rank, members.len(), opts, nonce, t);
        child.route = self.route;
        child.device = self.device;
        if setup.is_some() {
            child.set_backends(None, setup);
        } else if device_backend == "nccl" {
            child.staged_why = Some((
                "it was made by fcclCommSplit, and split children do not get the NCCL backend".into(),
                "create the communicator with fcclCommInitRank (a unique id from fcclGetUniqueId) to have NCCL serve it",
            ));
        }
        log::info(format_args!(
            "rank {new_rank}/{} split from communicator {} (colour {color}): backends {}",
            members.len(),
            self.label(),
            child.router.describe()
        ));
        Ok(Some(child))
    }

    /// All ranks' `mine` (equal sizes), concatenated in rank order.
    fn allgather_bytes(&self, mine: &[u8]) -> Result<Vec<u8>> {
        let mut all = vec![0u8; mine.len() * self.nranks];
        let c = Coll::new(
            crate::coll::CollKind::AllGather,
            mine.as_ptr(),
            all.as_mut_ptr(),
            mine.len(),
            crate::types::DataType::Uint8,
        );
        self.run(vec![c])?;
        Ok(all)
    }

    /// fcclCommSplit into a non-blocking communicator: runs on the progress thread
    /// after the queued calls and fills `made` (None: this rank's colour is NOCOLOR).
    /// Calls on this communicator from other threads are refused until the split is
    /// done with it, which is before the new communicator is ready.
    pub fn split_later(
        self: &Arc<Self>,
        color: i32,
        key: i32,
        opts: Options,
        made: Option<Arc<creation::Creation>>,
    ) -> Result<Issued> {
        self.splitting.fetch_add(1, Ordering::AcqRel);
        let mut hold = SplitHold { parent: Arc::clone(self), made, released: false };
        self.enqueue("fcclCommSplit", move |p| {
            let res = p.split(color, key, opts);
            hold.release();
            match (res, hold.made.take()) {
                (Ok(child), Some(cr)) => cr.finish(Ok(child.into_iter().collect())),
                (Err(e), Some(cr)) => {
                    cr.finish(Err(e.clone().context("fcclCommSplit")));
                    return Err(e);
                }
                (res, None) => return res.map(drop),
            }
            Ok(())
        })
    }

    /// `fcclCommFinalize`: no more calls; queued work finishes first (on host memory
    /// a call is complete when it has run).
    pub fn finalize(&self) -> Result<()> {
        self.progress.wait_idle();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.usable(&st)?;
        st.finalized = true;
        Ok(())
    }

    /// `fcclCommFinalize` of a non-blocking communicator: runs behind its queued work;
    /// calls made after it are refused.
    pub fn finalize_later(self: &Arc<Self>) -> Result<Issued> {
        let issued = self.enqueue("fcclCommFinalize", |c| c.finalize())?;
        self.progress.seal("the communicator was finalized; only fcclCommDestroy may follow");
        Ok(issued)
    }

    /// `fcclCommAbort` from any thread: blocked calls return, peers are told, queued
    /// work is dropped unrun; returns once no call of it runs any more.
    pub fn abort(&self) {
        self.abort.store(true, Ordering::Release);
        self.router.abort();
        if let Some(w) = &self.waker {
            let _ = w.failed().compare_exchange(0, self.rank as u32 + 1, Ordering::AcqRel, Ordering::Acquire);
            w.ring();
        }
        // If no call is running, tell peers right away.
        if let Ok(mut st) = self.state.try_lock() {
            st.transport.mark_failed(None, Code::RemoteError);
        }
        self.progress.cancel(Error::remote("fcclCommAbort ended the communicator with this call pending"));
    }

    /// Waits until no work of this communicator is queued or running (fcclCommDestroy).
    pub fn wait_idle(&self) {
        self.progress.wait_idle();
    }

    /// fcclCommGetAsyncError: the error that broke the communicator (a non-blocking
    /// communicator's first failed call, named in the message), else whether work is
    /// still queued or running.
    pub fn async_status(&self) -> Result<Issued> {
        let pending = match self.progress.status() {
            Status::Failed(e) => return Err(e),
            Status::Busy => true,
            Status::Idle => false,
        };
        if let Some(e) = self.async_err.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(e);
        }
        if let Some(e) = self.router.async_error() {
            return Err(e);
        }
        if self.abort.load(Ordering::Acquire) {
            return Err(Error::remote("the communicator was aborted"));
        }
        Ok(if pending { Issued::InProgress } else { Issued::Done })
    }

    /// Refuses work now, with the reason, if [`Comm::enqueue`] would.
    pub fn check_issuable(&self) -> Result<()> {
        if self.abort.load(Ordering::Acquire) {
            return Err(Error::invalid_usage("the communicator was aborted; destroy it"));
        }
        self.progress.check()
    }

    /// Queues `job` on this communicator's progress thread behind its queued work (a
    /// non-blocking communicator's call, validated by the caller); its error becomes
    /// the communicator's, with `what` (the C call) in front of its message.
    pub fn enqueue(
        self: &Arc<Self>,
        what: impl Into<Cow<'static, str>>,
        job: impl FnOnce(&Arc<Comm>) -> Result<()> + Send + 'static,
    ) -> Result<Issued> {
        self.check_issuable()?;
        let me = Arc::clone(self);
        self.progress.push(what, Box::new(move || job(&me)))?;
        Ok(if self.progress.status() == Status::Idle { Issued::Done } else { Issued::InProgress })
    }
}

/// A queued non-blocking split's hold on its parent (see [`Comm::split_later`]). If
/// the split never runs (dropped behind an earlier error, or by an abort), dropping
/// the hold lets the parent go and fails the new communicator's creation.
struct SplitHold {
    parent: Arc<Comm>,
    made: Option<Arc<creation::Creation>>,
    released: bool,
}

impl SplitHold {
    fn release(&mut self) {
        if !std::mem::replace(&mut self.released, true) {
            self.parent.splitting.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for SplitHold {
    fn drop(&mut self) {
        self.release();
        if let Some(cr) = self.made.take() {
            cr.finish(Err(Error::invalid_usage(
                "fcclCommSplit: the split never ran: a call queued before it on the parent failed, or the parent was aborted",
            )));
        }
    }
}

/// How a C call left: complete, or still running on the communicator's progress
/// thread (fcclInProgress: poll fcclCommGetAsyncError).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Issued {
    Done,
    InProgress,
}
