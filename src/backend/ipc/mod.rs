//! Device memory of ranks that share one GPU (the built-in backend's case NCCL
//! refuses), moved GPU to GPU and ordered on the callers' streams: the host never
//! waits for the GPU.
//!
//! Without MPS a GPU time-slices between processes' contexts, so one executor (rank 0)
//! does a whole collective's data movement, on its caller's stream, through IPC
//! mappings of every rank's buffers; the others only signal and wait on theirs. Per
//! collective `k`:
//! - every rank sends the others a descriptor of its buffers (host memory, through
//!   the transport; an IPC handle is made once per allocation);
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
mod fallback;
mod fdpass;
mod mappings;
mod mps;
mod p2p;
mod setup;
mod vmm;
mod watch;

use super::{host, staging, Backend, Exec, Outcome};
use crate::backend::Algo;
use crate::coll::{counts, fingerprint, Call, Coll, CollKind, VCounts};
use crate::error::{Error, Result};
use crate::log;
use crate::mem::{cuda, cuda_reduce, Placement};
use ctl::{Ctl, Registered};
use data::move_data;
use fallback::{fix, Fallback};
use mappings::{close, Exported, FreedSeen, Mappings};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use watch::{Target, Watch};

pub use mappings::MAPPINGS_MAX;

/// A descriptor: can this rank take part (or its stream is being captured), its pid, its
/// two buffers (handle, offset in the allocation, address), then the call's fingerprint
/// (what this rank called).
const BLOB: usize = FP + fingerprint::ONE_BYTES;
/// Where a descriptor's fingerprint starts.
const FP: usize = 1 + 4 + 2 * (64 + 8 + 8);
/// The rank that moves the data.
const EXECUTOR: usize = 0;
/// A descriptor's first byte: this rank takes part; its stream is being captured into a
/// CUDA graph (the call fails on every rank, see `capture`).
const TAKES_PART: u8 = 1;
const CAPTURED: u8 = 2;
/// How long the one round trip that proves stream memory operations may take: a GPU
/// busy with other processes' work answers within a few time slices.
const PROBE_LIMIT: Duration = Duration::from_secs(5);

/// Bytes of a descriptor for `c`: the fixed part, then for calls with per-rank counts
/// the rank's four arrays (sendcounts, sdispls, recvcounts, rdispls), `n` u64 each.
fn desc_bytes(c: &Coll, n: usize) -> usize {
    BLOB + if c.v.is_some() { 32 * n } else { 0 }
}

/// Writes `v`'s arrays after the fixed part (missing entries as 0).
fn put_counts(v: &VCounts, n: usize, b: &mut [u8]) {
    for (i, a) in [v.sendcounts(), v.sdispls(), v.recvcounts(), v.rdispls()].iter().enumerate() {
        for r in 0..n {
            let at = BLOB + 8 * (i * n + r);
            b[at..at + 8].copy_from_slice(&(a.get(r).copied().unwrap_or(0) as u64).to_le_bytes());
        }
    }
}

/// A peer's four arrays from its descriptor.
fn get_counts(b: &[u8], n: usize) -> VCounts {
    let a = |i: usize| -> Vec<usize> {
        (0..n)
            .map(|r| {
                let at = BLOB + 8 * (i * n + r);
                u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes")) as usize
            })
            .collect()
    };
    VCounts::new(&a(0), &a(1), &a(2), &a(3))
}

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
    watch: Arc<Watch>,
    /// The remedies this communicator has warned about (each fallback's WARN is said once).
    warned: Mutex<Vec<&'static str>>,
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
    /// Mappings of peers' allocations.
    maps: Mappings,
    /// This rank's allocations whose handles peers received.
    exported: Exported,
    /// What this rank read of the peers' logs of freed allocations.
    freed: FreedSeen,
    /// The control region's words registered in `ctx` (ranks in separate processes),
    /// once the first call tried; else why not.
    reg: Option<std::result::Result<Registered, String>>,
    /// The last collective put on the streams.
    k: u32,
    /// send/recv: the slot of the next send to and receive from each rank.
    next_send: Vec<u64>,
    next_recv: Vec<u64>,
    /// Mappings to close once the GPU has reached these values (what was queued when
    /// they went).
    closing: Vec<(Vec<(ctl::Word, u32)>, usize)>,
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
        if sorted.len() > 1 {
            // Ranks in other processes: VMM memory goes by file descriptor over a socket,
            // bound now so that a peer's first send finds it.
            let sock = match &setup.ctl {
                Ok(c) => fdpass::FdSocket::bind(&c.region_name(), rank).map(Arc::new),
                Err(m) => Err(format!("no control region ({m})")),
            };
            inner.maps.sock = Some(sock.clone());
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
            watch: Arc::new(Watch::default()),
            warned: Mutex::new(Vec::new()),
        }
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
        let pending = if p2p.is_empty() { None } else { Some(self.p2p_start(&p2p, &mut inner)?) };
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
                        self.watch.fail(ctl, &e);
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
        self.watch.failure()
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

impl Inner {
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

/// A descriptor's fields.
fn pid_of(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[1..5].try_into().expect("4 bytes"))
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

    /// This rank's descriptor of `c`, or why it cannot take the call GPU to GPU.
    fn prepare(
        &self,
        call: &Call,
        ctx: cuda::Ctx,
        device: i32,
        inner: &mut Inner,
    ) -> std::result::Result<Vec<u8>, Fallback> {
        let c = &call.coll;
        let reduces = matches!(
            c.kind,
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter | CollKind::ReduceScatterV
        );
        if self.rank == EXECUTOR || self.shares() {
            // Compiled now, so a rank without NVRTC says so in the exchange.
            cuda_reduce::copiers(ctx, device).map_err(|e| Fallback::new(e.msg, fix::NVRTC))?;
            if reduces {
                cuda_reduce::kernel(ctx, device, c.reduction()).map_err(|e| Fallback::new(e.msg, fix::NVRTC))?;
            }
        }
        let (sb, rb) = c.extents(self.rank, self.nranks).map_err(|e| Fallback::new(e.msg, ""))?;
        if c.placement == Placement::Host && sb + rb > 0 {
            return Err(Fallback::new("this rank's buffers are host memory", fix::HOST_MEMORY));
        }
        let (s0, r0) = (c.send as usize, c.recv as usize);
        if c.strided.is_some() && c.kind == CollKind::ReduceScatter && sb > 0 && rb > 0 && s0 < r0 + rb && r0 < s0 + sb
        {
            // Its blocks are packed while the results are written.
            return Err(Fallback::new("the output of a reduce_scatter along an axis overlaps its input", fix::OVERLAP));
        }
        let mut b = vec![0u8; desc_bytes(c, self.nranks)];
        if let Some(v) = &c.v {
            put_counts(v, self.nranks, &mut b);
        }
        b[0] = TAKES_PART;
        b[1..5].copy_from_slice(&std::process::id().to_le_bytes());
        b[FP..BLOB].copy_from_slice(&fingerprint::one(call));
        // The ranks in other processes that map this rank's buffers.
        let me = std::process::id();
        let to: Vec<usize> = (0..self.nranks)
            .filter(|&q| q != self.rank && self.pids[q] != me && (q == EXECUTOR || self.shares()))
            .collect();
        let mut at = 5;
        for (p, bytes) in [(c.send, sb), (c.recv as *const u8, rb)] {
            if bytes > 0 {
                let (h, off) = inner.exported.handle(p, bytes, &to).map_err(|e| {
                    Fallback::new(
                        format!("its buffer {p:p} cannot be shared with other processes ({})", e.msg),
                        fix::export(p),
                    )
                })?;
                b[at..at + 64].copy_from_slice(&h);
                b[at + 64..at + 72].copy_from_slice(&(off as u64).to_le_bytes());
                b[at + 72..at + 80].copy_from_slice(&(p as u64).to_le_bytes());
            }
            at += 80;
        }
        Ok(b)
    }

    /// Whether every rank moves its own share (MPS, ranks in separate processes).
    fn shares(&self) -> bool {
        self.mps && !self.synced
    }

    /// Runs one eligible collective: the descriptor exchange on the host, then stream
    /// operations only.
    fn run_one(&self, x: &mut Exec<'_>, call: &Call, inner: &mut Inner) -> Result<Outcome> {
        let (rank, n) = (self.rank, self.nranks);
        let c = &call.coll;
        let (device, ctx) = match c.placement {
            Placement::Device { device, ctx } => (device, ctx),
            Placement::Host => (self.device, cuda::primary_context(self.device)?),
        };
        let guard = cuda::CtxGuard::enter(ctx)?;
        // A capturing stream gets nothing (no synchronisation, registration or kernel
        // compilation either): this rank only says so in the exchange.
        let captured = super::capture::capturing(c.stream)?;
        let (reason, stream) = if captured {
            (Some(Fallback::new("its stream is being captured into a CUDA graph", "")), false)
        } else {
            match self.stream_mode(inner, ctx, device) {
                Mode::Off(m) => (Some(m), false),
                Mode::Stream(_) => (None, true),
                Mode::Synced => (None, false),
            }
        };
        if stream {
            if let Ok(ctl) = &self.ctl {
                inner.close_finished(ctl);
            }
        } else if reason.is_none() {
            // Synced: inputs complete before the executor reads them.
            cuda::sync(c.stream)?;
        }
        let prepared = match &reason {
            Some(f) => Err(f.clone()),
            None => self.prepare(call, ctx, device, inner),
        };
        let (mine, mut fallback) = match prepared {
            Ok(b) => (b, None),
            Err(f) => {
                let mut b = vec![0u8; desc_bytes(c, n)];
                if captured {
                    b[0] = CAPTURED;
                }
                b[1..5].copy_from_slice(&std::process::id().to_le_bytes());
                b[FP..BLOB].copy_from_slice(&fingerprint::one(call));
                (b, Some(f))
            }
        };
        let db = mine.len();
        let (all, got) = x.allgather(&mine, own_seq(x, call))?;
        if let Outcome::Failed(_) = got {
            return Ok(got);
        }
        let who: Vec<usize> = all.chunks(db).enumerate().filter(|(_, b)| b[0] == CAPTURED).map(|(q, _)| q).collect();
        if !who.is_empty() {
            x.algo = Algo::Refused;
            return Ok(Outcome::Failed(super::capture::refusal(c.kind.c_name(), rank, c.stream, &who)));
        }
        let mut gone = Vec::new();
        if let Ok(ctl) = &self.ctl {
            inner.freed.apply(ctl, rank, &self.pids, ctx, &mut inner.maps, &mut gone);
        }
        // Every rank compares what every rank called, before anything is enqueued: a
        // difference fails the call on every rank alike, whatever FERROCCL_CHECK says.
        if let Some(e) = fingerprint::verdict(rank, n, &mine[FP..BLOB], |p| &all[p * db + FP..p * db + BLOB]) {
            self.defer_close(inner, gone);
            x.algo = Algo::Mismatch;
            return Ok(Outcome::Failed(e));
        }
        let unable: Vec<usize> =
            all.chunks(db).enumerate().filter(|(_, b)| b[0] != TAKES_PART).map(|(q, _)| q).collect();
        if fallback.is_none() && !unable.is_empty() {
            let who = unable.iter().map(|q| q.to_string()).collect::<Vec<_>>().join(", ");
            fallback = Some(Fallback::new(format!("rank(s) {who} cannot take it GPU to GPU"), fix::PEER));
        }
        if let Some(f) = fallback {
            // Somebody cannot: everyone runs the call on the built-in backend, device
            // buffers staged (after the calls before it on the stream).
            drop(guard);
            self.defer_close(inner, gone);
            self.fell_back(c.kind.c_name(), &f);
            if c.placement == Placement::Host {
                // This rank's buffers are host memory: the host algorithms serve it.
                x.backend = "host";
                *x.seq += 1;
                return host::execute(x, &[Call { coll: c.clone(), seq: *x.seq }]);
            }
            // A reduce_scatter along an axis is packed first (the host has no strided form).
            let coll = match c.strided {
                Some(_) if c.kind == CollKind::ReduceScatter => super::pack::pack_reduce_scatter(c, n)?,
                _ => c.clone(),
            };
            // A fresh sequence number: the descriptor exchange used the call's own.
            *x.seq += 1;
            let staged = Call { coll, seq: *x.seq };
            let res = staging::run(x, &staged, rank, n)?;
            x.backend = "staged";
            return Ok(res);
        }
        // Per-rank counts: every rank checks every pair from the same descriptors, so all
        // return the same verdict, and nothing is enqueued on a mismatch.
        let counts: Vec<VCounts> =
            if c.v.is_some() { all.chunks(db).map(|b| get_counts(b, n)).collect() } else { Vec::new() };
        if let Some(e) = counts::verdict(c, rank, &counts) {
            self.defer_close(inner, gone);
            return Ok(Outcome::Failed(e));
        }
        let s = c.stream;
        let Mode::Stream(reg) = self.stream_mode(inner, ctx, device) else {
            // Synced: the executor moves the data and waits for it; then everyone returns.
            if rank == EXECUTOR {
                let peers = map_peers(&all, db, ctx, &mut inner.maps, &mut gone)?;
                // SAFETY: the peers' buffers are mapped (or this process's own) and held by
                // their ranks until the barrier below; the stream is synchronised before it.
                unsafe { move_data(x, c, &peers, &counts, ctx, device, None, 0)? };
                cuda::sync(s)?;
            } else {
                x.algo = Algo::HostWait;
            }
            for base in gone {
                close(base);
            }
            return x.barrier();
        };
        let (ctl, a) = (reg.ctl.clone(), reg.addrs());
        let k = inner.k.wrapping_add(1);
        let (dev_ready, dev_fin, dev_done) = (|q| a.of(ctl.ready(q)), |q| a.of(ctl.fin(q)), a.of(Ctl::DONE));
        // Kernels queued behind a failure do nothing (see `move_data`).
        let failed = a.of(Ctl::FAILED).raw();
        let mut targets: Vec<Target> = Vec::with_capacity(2 * n + 1);
        if self.shares() {
            let peers = map_peers(&all, db, ctx, &mut inner.maps, &mut gone)?;
            // SAFETY: the words are registered in this context and outlive the stream's
            // use of them (Drop waits for every target); the peers' buffers are mapped
            // until the GPU finished this call (closing waits for it), and their owners
            // keep them until their streams passed every `fin >= k`.
            unsafe {
                cuda::stream_write(s, dev_ready(rank), k)?;
                for q in (0..n).filter(|&q| q != rank) {
                    cuda::stream_wait_geq(s, dev_ready(q), k)?;
                }
                move_data(x, c, &peers, &counts, ctx, device, Some(rank), failed)?;
                cuda::stream_write(s, dev_fin(rank), k)?;
                for q in (0..n).filter(|&q| q != rank) {
                    cuda::stream_wait_geq(s, dev_fin(q), k)?;
                }
            }
            for q in 0..n {
                targets.push(Target { w: ctl.ready(q), v: k, writer: q });
                targets.push(Target { w: ctl.fin(q), v: k, writer: q });
            }
        } else if rank == EXECUTOR {
            let peers = map_peers(&all, db, ctx, &mut inner.maps, &mut gone)?;
            // SAFETY: as above; the owners keep their buffers until their streams passed
            // `done >= k`.
            unsafe {
                for q in (0..n).filter(|&q| q != EXECUTOR) {
                    cuda::stream_wait_geq(s, dev_ready(q), k)?;
                }
                move_data(x, c, &peers, &counts, ctx, device, None, failed)?;
                cuda::stream_write(s, dev_done, k)?;
            }
        } else {
            // SAFETY: as above for the words.
            unsafe {
                cuda::stream_write(s, dev_ready(rank), k)?;
                cuda::stream_wait_geq(s, dev_done, k)?;
            }
            x.algo = Algo::SignalWait;
        }
        if !self.shares() {
            targets.extend((0..n).filter(|&q| q != EXECUTOR).map(|q| Target { w: ctl.ready(q), v: k, writer: q }));
            targets.push(Target { w: Ctl::DONE, v: k, writer: EXECUTOR });
        }
        inner.k = k;
        self.defer_close(inner, gone);
        let what = format!("device call #{k} (collective #{})", call.seq);
        self.watch.pending(&targets, Instant::now() + self.timeout, what);
        Ok(Outcome::Done)
    }

    /// Mappings that went in this call close once the GPU finished the calls so far.
    fn defer_close(&self, inner: &mut Inner, gone: Vec<usize>) {
        if gone.is_empty() {
            return;
        }
        let upto = self.watch.snapshot();
        inner.closing.extend(gone.into_iter().map(|b| (upto.clone(), b)));
    }
}

/// Every rank's (send, recv) pointers from the descriptors (`db` bytes each).
fn map_peers(
    all: &[u8],
    db: usize,
    ctx: cuda::Ctx,
    maps: &mut Mappings,
    gone: &mut Vec<usize>,
) -> Result<Vec<(*const u8, *const u8)>> {
    all.chunks(db).map(|b| map_peer(b, ctx, maps, gone)).collect()
}

/// A peer's (send, recv) pointers, usable in this process's context `ctx` (null
/// where the peer's extent is empty).
fn map_peer(b: &[u8], ctx: cuda::Ctx, maps: &mut Mappings, gone: &mut Vec<usize>) -> Result<(*const u8, *const u8)> {
    let pid = pid_of(b);
    let mut out = [0usize; 2];
    for (i, o) in out.iter_mut().enumerate() {
        let at = 5 + i * 80;
        let off = u64::from_le_bytes(b[at + 64..at + 72].try_into().expect("8 bytes")) as usize;
        let ptr = u64::from_le_bytes(b[at + 72..at + 80].try_into().expect("8 bytes")) as usize;
        *o = if ptr == 0 {
            0
        } else if pid == std::process::id() {
            // A thread rank of this process: its pointer is valid here as it is.
            ptr
        } else {
            let h: [u8; 64] = b[at..at + 64].try_into().expect("64 bytes");
            maps.open(ctx, (pid, ptr - off), &h, gone)? + off
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
        if inner.maps.map.is_empty() && !matches!(reg, Some(Ok(_))) {
            return;
        }
        let _g = cuda::CtxGuard::enter(inner.ctx);
        let Some(Ok(reg)) = reg else {
            // Synced (or never on the streams): every call was waited for.
            for (_, m) in inner.maps.map.drain() {
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
        for (_, base) in inner.closing.drain(..) {
            close(base);
        }
        for (_, m) in inner.maps.map.drain() {
            close(m.base);
        }
        drop(reg);
    }
}
