//! Device memory of ranks that share one GPU (the built-in backend's case NCCL
//! refuses), moved GPU to GPU and ordered on the callers' streams: the host never
//! waits for the GPU.
//!
//! Without MPS a GPU time-slices between processes' contexts, so one executor (rank 0)
//! does a whole collective's data movement, on its caller's stream, through IPC
//! mappings of every rank's buffers; the others only signal and wait on theirs. Per
//! collective `k`:
//! - every rank sends the others a descriptor of its buffers (host memory, through
//!   the transport; an IPC handle is made once per allocation), or, with checkMode
//!   off or unset on every rank (unset: from a call on device memory), posts it in the
//!   control region for rank 0's proxy thread (under MPS: for every rank's) (`posts`);
//! - rank r > 0 enqueues `ready[r] = k` (its inputs are ready: the work queued before
//!   is done) and `wait done >= k` (nothing after the call runs before it is done);
//! - rank 0 enqueues `wait ready[r] >= k` for every r, the copies and reduction
//!   kernels that fill every rank's receive buffer, then `done = k`.
//!
//! Under MPS (`mps`) every rank moves its own share at once instead. Send/recv involve
//! only their pair, which orders itself through the pair's mailbox (`p2p`).
//!
//! The words live in the communicator's control region (`ctl`), host memory that every
//! rank maps, made when the communicator is: a watchdog thread per rank (`watch`)
//! reads it to know when the GPU finished a call, and when a call cannot finish (a
//! rank died, the timeout passed, an abort) it releases every wait, marks the region
//! failed and fails the communicator, naming the ranks that did not arrive. Every rank
//! decides to take this path from the same facts (communicator on one GPU, the call,
//! FERROCCL_CUDA_IPC); a rank that cannot (memory IPC cannot share, no NVRTC or stream
//! memory operations) says so in the descriptor exchange, and then every rank stages
//! the call through host memory instead.

pub mod ctl;
mod data;
mod desc;
mod fallback;
mod fdpass;
mod mappings;
mod mps;
mod negotiate;
mod p2p;
mod posts;
mod setup;
mod vmm;
mod watch;

use super::{Backend, Exec, Outcome};
use crate::backend::Algo;
use crate::coll::{Call, Coll, CollKind};
use crate::error::{Error, Result};
use crate::log;
use crate::mem::{cuda, cuda_reduce, Placement};
use ctl::{Ctl, Registered};
use data::move_data;
use desc::Desc;
use fallback::{fix, Fallback};
use mappings::{close, Exported, FreedSeen, Mappings};
use negotiate::{Agreed, Negotiated};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use watch::{Target, Watch};

pub use mappings::MAPPINGS_MAX;

/// The rank that moves the data.
const EXECUTOR: usize = 0;
/// How long the one round trip that proves stream memory operations may take: a GPU
/// busy with other processes' work answers within a few time slices.
const PROBE_LIMIT: Duration = Duration::from_secs(5);

/// FERROCCL_CUDA_IPC: the smallest call (bytes of `count` elements) that takes the
/// path, or None when it is off (read once). On by default for every size: stream
/// ordering costs no host wait, and staging costs two copies and two waits per call.
pub fn min_bytes() -> Option<usize> {
    static ON: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::env::cuda_ipc().then_some(0))
}

/// True when this call takes the path on a communicator whose ranks share one GPU:
/// decided from what every rank passes alike (kind, count, type, op), so all ranks
/// agree. Calls with per-rank counts come whatever their memory: a rank with nothing
/// to send or receive passes no device buffer, yet must meet the others here; the
/// descriptors then tell whether every rank with data has it on the device.
pub fn eligible(c: &Coll, nranks: usize, min: usize) -> bool {
    let kind_ok = match c.kind {
        // Every type, and all_reduce over a wire type: one launch reduces every rank's
        // input, so results are those of the host's rank order (owner order for wire
        // forms), Avg included.
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter | CollKind::ReduceScatterV => {
            c.reduction().supported() && (c.wire.is_none() || c.kind == CollKind::AllReduce)
        }
        CollKind::AllGather
        | CollKind::AllGatherV
        | CollKind::Broadcast
        | CollKind::Gather
        | CollKind::Scatter
        | CollKind::AlltoAll
        | CollKind::AlltoAllv => true,
        // Whatever their memory: the pair learns from its records how to move the data,
        // and both its calls must come here.
        CollKind::Send | CollKind::Recv => true,
        _ => false,
    };
    // Axis forms: all_gather, and reduce_scatter (made strided only for this path).
    let strided_ok = c.strided.is_none() || matches!(c.kind, CollKind::AllGather | CollKind::ReduceScatter);
    let any_memory = c.v.is_some() || c.kind.is_p2p();
    kind_ok
        && (2..=ctl::MAX_RANKS).contains(&nranks)
        && (any_memory || matches!(c.placement, Placement::Device { .. }))
        && strided_ok
        && !c.is_noop()
        && (any_memory || c.count.saturating_mul(c.dtype.size()) >= min)
}

// One launch takes every rank's buffer.
const _: () = assert!(cuda_reduce::MAX_INPUTS >= ctl::MAX_RANKS);

/// The path as a router entry: calls of device memory (alone or in a group) on a
/// communicator whose ranks all share one GPU, unless FERROCCL_CUDA_IPC=0.
pub struct Ipc {
    rank: usize,
    nranks: usize,
    device: i32,
    min_bytes: usize,
    timeout: Duration,
    /// Every rank's process.
    pids: Vec<u32>,
    /// Some ranks share a process: calls are synchronised on the host (see [`Mode`]).
    synced: bool,
    /// Every rank runs under MPS: each moves its share of a collective.
    mps: bool,
    /// The communicator's control region, or why there is none (then every call stages).
    ctl: std::result::Result<Arc<Ctl>, String>,
    inner: Mutex<Inner>,
    /// Locked after `inner` where both are.
    mapped: Mutex<Mapped>,
    watch: Arc<Watch>,
    /// The remedies this communicator has warned about (each fallback's WARN is said once).
    warned: Mutex<Vec<&'static str>>,
    /// Device memory lent to calls whose buffers cannot be shared (`negotiate::Detour`).
    bounce: Arc<cuda::Arenas>,
    /// Every rank posts its collectives' descriptors instead of agreeing on them (`posts`).
    posting: AtomicBool,
    /// The executor's proxy thread of posted calls.
    proxy: posts::Proxy,
    /// This backend, shared with the proxy thread (set by [`Ipc::shared`]).
    me: std::sync::OnceLock<std::sync::Weak<Ipc>>,
}

/// What every rank of a communicator on one GPU learns when it is created.
#[derive(Clone)]
pub struct Setup {
    /// Every rank's process id.
    pub pids: Vec<u32>,
    /// Every rank runs under MPS.
    pub mps: bool,
    /// The control region, mapped by every rank (else why not, the same everywhere).
    pub ctl: std::result::Result<Arc<Ctl>, String>,
}

impl Setup {
    /// The rounds of `allgather` that [`Setup::processes`] runs on every rank.
    pub const ROUNDS: usize = setup::ROUNDS;

    /// Set-up of ranks in separate processes, through the rendezvous's `allgather`
    /// (every rank's blob, rank by rank): see `setup::processes`.
    pub fn processes(
        rank: usize,
        nranks: usize,
        nonce: u64,
        device: i32,
        allgather: &mut super::Allgather<'_>,
    ) -> Result<Option<Setup>> {
        setup::processes(rank, nranks, nonce, device, allgather)
    }

    /// Set-up of the `n` ranks of one process.
    pub fn threads(nonce: u64, n: usize) -> Setup {
        setup::threads(nonce, n)
    }
}

/// What calls keep between them.
#[derive(Default)]
struct Inner {
    /// This rank's allocations whose handles peers received.
    exported: Exported,
    /// The control region's words registered in `ctx` (ranks in separate processes),
    /// once the first call tried; else why not.
    reg: Option<std::result::Result<Registered, String>>,
    /// The last collective put on the streams (or, posting, the last posted).
    k: u32,
    /// The last collective this rank posted (`posts`).
    posts: u64,
    /// This rank's buffers of the call being agreed, through lent device memory.
    detour: Option<negotiate::Detour>,
    /// send/recv: the slot of the next send to and receive from each rank.
    next_send: Vec<u64>,
    next_recv: Vec<u64>,
    /// The context the mappings and the registration belong to (the first call's).
    ctx: cuda::Ctx,
    watchdog: Option<std::thread::JoinHandle<()>>,
}

impl Ipc {
    /// `device`: the rank's device, whose primary context serves calls without device
    /// buffers on this rank.
    pub fn new(rank: usize, nranks: usize, device: i32, min_bytes: usize, timeout: Duration, setup: Setup) -> Ipc {
        let mut sorted = setup.pids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let mut inner = Inner::default();
        let mut mapped = Mapped::default();
        if sorted.len() > 1 {
            // Ranks in other processes: VMM memory goes by file descriptor over a socket,
            // bound now so that a peer's first send finds it.
            let sock = match &setup.ctl {
                Ok(c) => fdpass::FdSocket::bind(&c.region_name(), rank).map(Arc::new),
                Err(m) => Err(format!("no control region ({m})")),
            };
            mapped.maps.sock = Some(sock.clone());
            inner.exported.sock = Some(sock);
        }
        Ipc {
            rank,
            nranks,
            device,
            min_bytes,
            timeout,
            synced: sorted.len() < setup.pids.len(),
            pids: setup.pids,
            mps: setup.mps,
            ctl: setup.ctl,
            inner: Mutex::new(inner),
            mapped: Mutex::new(mapped),
            watch: Arc::new(Watch::default()),
            warned: Mutex::new(Vec::new()),
            bounce: Arc::default(),
            posting: AtomicBool::new(false),
            proxy: posts::Proxy::default(),
            me: std::sync::OnceLock::new(),
        }
    }

    /// This path as a router entry, shared with its proxy thread.
    pub fn shared(self) -> Shared {
        let me = Arc::new(self);
        let _ = me.me.set(Arc::downgrade(&me));
        Shared(me)
    }
}

/// The path as a router entry: an [`Ipc`] that its proxy thread shares. Dropping it
/// ends the proxy (once its queued calls ran), then the path.
pub struct Shared(Arc<Ipc>);

impl Backend for Shared {
    fn id(&self) -> &'static str {
        self.0.id()
    }
    fn accepts(&self, c: &Coll, alone: bool) -> bool {
        self.0.accepts(c, alone)
    }
    fn run(&self, x: &mut Exec<'_>, calls: &[Call]) -> Result<Outcome> {
        self.0.run(x, calls)
    }
    fn abort(&self) {
        self.0.abort()
    }
    fn async_error(&self) -> Option<Error> {
        self.0.async_error()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.0.proxy.stop();
    }
}

impl Backend for Ipc {
    fn id(&self) -> &'static str {
        "ipc"
    }

    fn accepts(&self, c: &Coll, _alone: bool) -> bool {
        // send/recv need the mailboxes of the control region (every rank knows whether
        // it exists).
        eligible(c, self.nranks, self.min_bytes) && (!c.kind.is_p2p() || self.ctl.is_ok())
    }

    fn run(&self, x: &mut Exec<'_>, calls: &[Call]) -> Result<Outcome> {
        // A group's collectives run one after the other, in the order every rank gave
        // them; its send/recv are posted before them and finished after them, so that
        // a peer waiting for one of them is not held up by this rank's collectives.
        if let Some(e) = self.watch.failure() {
            return Err(e);
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        self.report_freed(&mut inner);
        let p2p: Vec<&Call> = calls.iter().filter(|c| c.coll.kind.is_p2p()).collect();
        let pending = if p2p.is_empty() {
            None
        } else {
            match self.p2p_start(&p2p, &mut inner) {
                Ok(run) => Some(run),
                Err(e) => {
                    // Peers may already wait for this rank's records: they learn it gave up.
                    let e = Error {
                        msg: format!(
                            "{}. This rank posted none of the group's send/recv; the communicator is unusable now: destroy it",
                            e.msg
                        ),
                        ..e
                    };
                    if let Ok(ctl) = &self.ctl {
                        self.watch.fail(ctl, self.rank, &e);
                    }
                    return Err(e);
                }
            }
        };
        let mut first_err = None;
        for call in calls.iter().filter(|c| !c.coll.kind.is_p2p()) {
            let res = match self.watch.failure() {
                Some(e) => Err(e),
                None => self.run_one(x, call, &mut inner),
            };
            match res {
                Ok(Outcome::Failed(e)) => {
                    first_err.get_or_insert(e);
                }
                Ok(Outcome::Done) => {}
                Err(e) => {
                    if let (Some(_), Ok(ctl)) = (&pending, &self.ctl) {
                        // Peers may have paired this run's send/recv records already.
                        self.watch.fail(ctl, self.rank, &e);
                    }
                    return Err(e);
                }
            }
        }
        if let Some(run) = pending {
            let algo = x.algo;
            if let Outcome::Failed(e) = self.p2p_finish(x, run, &mut inner)? {
                first_err.get_or_insert(e);
            }
            if p2p.len() < calls.len() {
                x.algo = if algo == x.algo { algo } else { Algo::Group };
            }
        }
        Ok(first_err.into())
    }

    fn abort(&self) {
        self.watch.aborted.store(true, Ordering::Release);
        self.watch.poke();
    }

    fn async_error(&self) -> Option<Error> {
        self.watch.failure().or_else(|| match (&self.ctl, self.posting.load(Ordering::Acquire)) {
            // Found by the executor after this rank's calls returned (`posts`).
            (Ok(ctl), true) => self.watch.failed_elsewhere(ctl, "an earlier device call"),
            _ => None,
        })
    }
}

/// How a call runs on this path.
enum Mode<'a> {
    /// Ordered on the streams through the control region: ranks in separate processes.
    Stream(&'a Registered),
    /// Ranks that share a process may share a stream (or the legacy default stream,
    /// which orders every blocking stream of the context), where a wait for a peer
    /// would sit before the peer's own write: the executor runs the call and the host
    /// waits for it, as the callers' streams cannot order each other.
    Synced,
    /// This rank cannot take part, for this reason: the call stages.
    Off(Fallback),
}

/// The peers' allocations this rank mapped: apart from [`Inner`], which a caller
/// holds for its whole call, so that the proxy thread (`posts`) maps while a caller
/// waits for it.
#[derive(Default)]
struct Mapped {
    /// Mappings of peers' allocations.
    maps: Mappings,
    /// What this rank read of the peers' logs of freed allocations.
    freed: FreedSeen,
    /// Mappings to close once the GPU has reached these values (what was queued when
    /// they went).
    closing: Vec<(Vec<(ctl::Word, u32)>, usize)>,
}

impl Mapped {
    /// Closes the mappings whose last use the GPU has finished.
    fn close_finished(&mut self, ctl: &Ctl) {
        self.closing.retain(|(upto, base)| {
            if upto.iter().all(|&(w, v)| ctl.reached(w, v)) {
                close(*base);
                false
            } else {
                true
            }
        });
    }
}

/// The sequence number a call's first exchange may use: its own when it is the
/// communicator's latest (a call alone); in a group, whose calls took numbers before
/// any ran, a fresh one (None), so that no number is used twice.
fn own_seq(x: &Exec<'_>, call: &Call) -> Option<u64> {
    (call.seq == *x.seq).then_some(call.seq)
}

impl Ipc {
    /// How this rank takes part in a call whose buffers live in `ctx` on `device`:
    /// ranks in separate processes register the control region's words in the first
    /// call's context (and start the watchdog) the first time.
    fn stream_mode<'a>(&self, inner: &'a mut Inner, ctx: cuda::Ctx, device: i32) -> Mode<'a> {
        let ctl = match &self.ctl {
            Ok(c) => c,
            Err(m) => return Mode::Off(Fallback::new(format!("no device control region ({m})"), fix::REGION)),
        };
        if inner.ctx.is_none() {
            inner.ctx = ctx;
        }
        if inner.ctx != ctx {
            return Mode::Off(Fallback::new(
                "its buffers belong to another context than the communicator's first device call",
                fix::CONTEXT,
            ));
        }
        if self.synced {
            return Mode::Synced;
        }
        if inner.reg.is_none() {
            let reg = self.register(ctl, ctx, device);
            match &reg {
                Ok(_) => self.start_watchdog(ctl, inner),
                Err(m) => {
                    log::info(format_args!("rank {}: the stream-ordered device path is unavailable: {m}", self.rank))
                }
            }
            inner.reg = Some(reg);
        }
        match inner.reg.as_ref().expect("tried") {
            Ok(r) => Mode::Stream(r),
            Err(m) => Mode::Off(Fallback::new(m.clone(), fix::MEMOPS)),
        }
    }

    /// The stream-ordered path's prerequisites, each checked with its own reason: the
    /// driver's `_v2` memory operations and the device attributes they rely on
    /// (`memops_ready`), the control words registered in `ctx`, then one real round
    /// trip on them (the host writes, the stream waits and writes, the host reads).
    fn register(&self, ctl: &Arc<Ctl>, ctx: cuda::Ctx, device: i32) -> std::result::Result<Registered, String> {
        cuda::memops_ready(device).map_err(|e| e.msg)?;
        let reg = ctl.register(ctx).map_err(|e| e.msg)?;
        match reg.prove(self.rank, PROBE_LIMIT) {
            Ok(took) => {
                log::info(format_args!(
                    "rank {}: stream memory operations on the control words work (one round trip: {:.1} us)",
                    self.rank,
                    took.as_secs_f64() * 1e6
                ));
                Ok(reg)
            }
            Err(e) => {
                // The stream may still hold the round trip's operations: the words stay
                // registered and mapped for the life of the process.
                std::mem::forget(reg);
                Err(e.msg)
            }
        }
    }

    fn start_watchdog(&self, ctl: &Arc<Ctl>, inner: &mut Inner) {
        *self.watch.ctl.lock().unwrap_or_else(|p| p.into_inner()) = Some(ctl.clone());
        let watch = self.watch.clone();
        let (rank, pids) = (self.rank, self.pids.clone());
        inner.watchdog = std::thread::Builder::new()
            .name("ferroccl-watch".into())
            .spawn(move || watch.run(rank, &pids))
            .map_err(|e| log::warn(format_args!("no device watchdog thread: {e}")))
            .ok();
    }

    /// Logs this rank's allocations that peers may have mapped and that are freed now.
    fn report_freed(&self, inner: &mut Inner) {
        if let Ok(ctl) = &self.ctl {
            inner.exported.report_dead(ctl, self.rank);
        }
    }

    /// Whether every rank moves its own share (MPS, ranks in separate processes).
    fn shares(&self) -> bool {
        self.mps && !self.synced
    }

    /// Runs one eligible collective: the descriptor exchange on the host
    /// ([`Ipc::negotiate`]), then what it decided: a failure on every rank, host
    /// staging, or stream operations only.
    fn run_one(&self, x: &mut Exec<'_>, call: &Call, inner: &mut Inner) -> Result<Outcome> {
        let c = &call.coll;
        let (device, ctx) = match c.placement {
            Placement::Device { device, ctx } => (device, ctx),
            Placement::Host => (self.device, cuda::primary_context(self.device)?),
        };
        let guard = cuda::CtxGuard::enter(ctx)?;
        if self.posting.load(Ordering::Relaxed) {
            return self.run_posted(x, call, inner, ctx, device);
        }
        let verdict = self.negotiate(x, call, inner, ctx, device);
        if !matches!(verdict, Ok(Negotiated::Run(_))) {
            // Back to the arenas now, while the call's stream surely lives.
            inner.detour = None;
        }
        match verdict? {
            Negotiated::Unfinished(got) => Ok(got),
            Negotiated::Refused(e) => {
                x.algo = Algo::Refused;
                Ok(Outcome::Failed(e))
            }
            Negotiated::Mismatch(e) => {
                x.algo = Algo::Mismatch;
                Ok(Outcome::Failed(e))
            }
            Negotiated::BadCounts(e) => Ok(Outcome::Failed(e)),
            Negotiated::Fallback(f) => {
                // Somebody cannot: everyone runs the call on the built-in backend.
                drop(guard);
                self.stage(x, call, &f)
            }
            Negotiated::Run(agreed) => match self.stream_mode(inner, ctx, device) {
                Mode::Stream(reg) => {
                    let (ctl, a) = (reg.ctl.clone(), reg.addrs());
                    let posts = agreed.posts;
                    let k = inner.k.wrapping_add(1);
                    let detour = inner.detour.take();
                    let out = self.run_streamed(&mut x.algo, call, detour, agreed, (&ctl, a), (ctx, device), k)?;
                    inner.k = k;
                    if posts && !self.posting.swap(true, Ordering::AcqRel) {
                        log::info(format_args!(
                            "rank {}: checkMode off or unset on every rank: later device collectives post their descriptors instead of agreeing on them (FERROCCL_CHECK=1 agrees on each)",
                            self.rank
                        ));
                    }
                    Ok(out)
                }
                // Synced (the negotiation's own mode check left nothing else).
                Mode::Synced | Mode::Off(_) => self.run_synced(x, &call.coll, agreed, (ctx, device)),
            },
        }
    }

    /// Ranks that share a process: the executor moves the data and waits for it; then
    /// everyone returns.
    fn run_synced(
        &self,
        x: &mut Exec<'_>,
        c: &Coll,
        agreed: Agreed,
        (ctx, device): (cuda::Ctx, i32),
    ) -> Result<Outcome> {
        let Agreed { descs, counts, mut gone, .. } = agreed;
        if self.rank == EXECUTOR {
            let peers = map_peers(&descs, ctx, &mut self.mapped().maps, &mut gone)?;
            // SAFETY: the peers' buffers are mapped (or this process's own) and held by
            // their ranks until the barrier below; the stream is synchronised before it.
            unsafe { move_data(&mut x.algo, c, &peers, &counts, ctx, device, None, 0)? };
            cuda::sync(c.stream)?;
        } else {
            x.algo = Algo::HostWait;
        }
        for base in gone {
            close(base);
        }
        x.barrier()
    }

    /// Ranks in separate processes: ordered on the streams through the control words
    /// `ctl` (at `a` on the device); the host waits for nothing, the watchdog does.
    #[allow(clippy::too_many_arguments)]
    fn run_streamed(
        &self,
        algo: &mut Algo,
        call: &Call,
        detour: Option<negotiate::Detour>,
        agreed: Agreed,
        (ctl, a): (&Arc<Ctl>, ctl::Addrs),
        (ctx, device): (cuda::Ctx, i32),
        k: u32,
    ) -> Result<Outcome> {
        let (rank, n) = (self.rank, self.nranks);
        let c = &call.coll;
        let Agreed { descs, counts, mut gone, proxied, .. } = agreed;
        let s = c.stream;
        let (dev_ready, dev_fin, dev_done) = (|q| a.of(ctl.ready(q)), |q| a.of(ctl.fin(q)), a.of(Ctl::DONE));
        // Kernels queued behind a failure do nothing (see `move_data`).
        let failed = a.of(Ctl::FAILED).raw();
        let mut targets: Vec<Target> = Vec::with_capacity(2 * n + 1);
        // `detour`: buffers that cannot be shared, copied in before this rank signals, out after.
        if self.shares() {
            let peers = map_peers(&descs, ctx, &mut self.mapped().maps, &mut gone)?;
            // SAFETY: the words are registered in this context and outlive the stream's
            // use of them (Drop waits for every target); the peers' buffers are mapped
            // until the GPU finished this call (closing waits for it), and their owners
            // keep them until their streams passed every `fin >= k`.
            unsafe {
                if let Some(d) = &detour {
                    d.enter(s)?;
                }
                cuda::stream_write(s, dev_ready(rank), k)?;
                for q in (0..n).filter(|&q| q != rank) {
                    cuda::stream_wait_geq(s, dev_ready(q), k)?;
                }
                move_data(algo, c, &peers, &counts, ctx, device, Some(rank), failed)?;
                cuda::stream_write(s, dev_fin(rank), k)?;
                // A proxy's caller's stream waits for every `fin` itself (`posts`).
                for q in (0..n).filter(|&q| q != rank && !proxied) {
                    cuda::stream_wait_geq(s, dev_fin(q), k)?;
                }
                if let Some(d) = &detour {
                    d.leave(s)?;
                }
            }
            for q in 0..n {
                targets.push(Target { w: ctl.ready(q), v: k, writer: q });
                targets.push(Target { w: ctl.fin(q), v: k, writer: q });
            }
        } else if rank == EXECUTOR {
            let peers = map_peers(&descs, ctx, &mut self.mapped().maps, &mut gone)?;
            // SAFETY: as above; the owners keep their buffers until their streams passed
            // `done >= k`; the detour's copies as below.
            unsafe {
                if let Some(d) = &detour {
                    d.enter(s)?;
                }
                for q in (0..n).filter(|&q| q != EXECUTOR) {
                    cuda::stream_wait_geq(s, dev_ready(q), k)?;
                }
                move_data(algo, c, &peers, &counts, ctx, device, None, failed)?;
                cuda::stream_write(s, dev_done, k)?;
                if let Some(d) = &detour {
                    d.leave(s)?;
                }
            }
        } else {
            // SAFETY: as above for the words; the detour's copies per its contract (the
            // call's own buffers, valid until the stream has run the call).
            unsafe {
                if let Some(d) = &detour {
                    d.enter(s)?;
                }
                cuda::stream_write(s, dev_ready(rank), k)?;
                cuda::stream_wait_geq(s, dev_done, k)?;
                if let Some(d) = &detour {
                    d.leave(s)?;
                }
            }
            *algo = if detour.is_some() { Algo::SignalWaitCopied } else { Algo::SignalWait };
        }
        if !self.shares() {
            targets.extend((0..n).filter(|&q| q != EXECUTOR).map(|q| Target { w: ctl.ready(q), v: k, writer: q }));
            targets.push(Target { w: Ctl::DONE, v: k, writer: EXECUTOR });
        }
        self.defer_close(gone);
        let what = format!("device call #{k} (collective #{})", call.seq);
        self.watch.pending(&targets, Instant::now() + self.timeout, what);
        if let Some(d) = &detour {
            let waited = d.finish(s)?;
            let failure = || self.watch.failure().or_else(|| self.watch.failed_elsewhere(ctl, "the call"));
            if let Some(e) = waited.then(failure).flatten() {
                // Its host buffers did not get the results.
                return Err(e);
            }
        }
        Ok(Outcome::Done)
    }

    /// Mappings that went in this call close once the GPU finished the calls so far.
    fn defer_close(&self, gone: Vec<usize>) {
        if gone.is_empty() {
            return;
        }
        let upto = self.watch.snapshot();
        self.mapped().closing.extend(gone.into_iter().map(|b| (upto.clone(), b)));
    }

    fn mapped(&self) -> std::sync::MutexGuard<'_, Mapped> {
        self.mapped.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Every rank's (send, recv) pointers from its descriptor.
fn map_peers(
    descs: &[Desc],
    ctx: cuda::Ctx,
    maps: &mut Mappings,
    gone: &mut Vec<usize>,
) -> Result<Vec<(*const u8, *const u8)>> {
    descs.iter().map(|d| map_peer(d, ctx, maps, gone)).collect()
}

/// A peer's (send, recv) pointers, usable in this process's context `ctx` (null
/// where the peer's extent is empty).
fn map_peer(d: &Desc, ctx: cuda::Ctx, maps: &mut Mappings, gone: &mut Vec<usize>) -> Result<(*const u8, *const u8)> {
    let mut out = [0usize; 2];
    for (o, b) in out.iter_mut().zip(&d.bufs) {
        let (off, ptr) = (b.offset as usize, b.addr as usize);
        *o = if ptr == 0 {
            0
        } else if d.pid == std::process::id() {
            // A thread rank of this process: its pointer is valid here as it is.
            ptr
        } else {
            maps.open(ctx, (d.pid, ptr - off), &b.handle, gone)? + off
        };
    }
    Ok((out[0] as *const u8, out[1] as *const u8))
}

impl Drop for Ipc {
    fn drop(&mut self) {
        self.watch.stop.store(true, Ordering::Release);
        self.watch.poke();
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = inner.watchdog.take() {
            let _ = h.join();
        }
        let reg = inner.reg.take();
        let mapped = self.mapped.get_mut().unwrap_or_else(|p| p.into_inner());
        if mapped.maps.map.is_empty() && !matches!(reg, Some(Ok(_))) {
            return;
        }
        let _g = cuda::CtxGuard::enter(inner.ctx);
        let Some(Ok(reg)) = reg else {
            // Synced (or never on the streams): every call was waited for.
            for (_, m) in mapped.maps.map.drain() {
                close(m.base);
            }
            return;
        };
        // Nothing is unmapped while the GPU may still run a call that uses it.
        let until = Instant::now() + self.timeout.min(Duration::from_secs(30));
        let ctl = reg.ctl.clone();
        let queued = self.watch.snapshot();
        while !queued.iter().all(|&(w, v)| ctl.reached(w, v)) && ctl.failed().load(Ordering::Acquire) == 0 {
            if Instant::now() >= until {
                log::warn(format_args!(
                    "rank {}: destroying a communicator whose device calls have not finished on the GPU; its mappings and control region stay",
                    self.rank
                ));
                std::mem::forget(reg);
                if let Ok(c) = &self.ctl {
                    std::mem::forget(c.clone());
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        *self.watch.ctl.lock().unwrap_or_else(|p| p.into_inner()) = None;
        for (_, base) in mapped.closing.drain(..) {
            close(base);
        }
        for (_, m) in mapped.maps.map.drain() {
            close(m.base);
        }
        drop(reg);
    }
}
