//! Device memory of ranks that share one GPU (the built-in backend's case NCCL
//! refuses), moved GPU to GPU and ordered on the callers' streams: the host never
//! waits for the GPU.
//!
//! Without MPS a GPU time-slices between processes' contexts, so one executor (rank 0)
//! does a whole call's data movement, on its caller's stream, through IPC mappings of
//! every rank's buffers; the others only signal and wait on theirs. Per call `k`:
//! - every rank sends the others a descriptor of its buffers (host memory, through
//!   the transport; an IPC handle is made once per allocation);
//! - rank r > 0 enqueues `ready[r] = k` (its inputs are ready: the work queued before
//!   is done) and `wait done >= k` (nothing after the call runs before it is done);
//! - rank 0 enqueues `wait ready[r] >= k` for every r, the copies and reduction
//!   kernels that fill every rank's receive buffer, then `done = k`.
//!
//! The words live on the communicator's control page (`ctl`), host memory that every
//! rank maps: a watchdog thread per rank reads it to know when the GPU finished a call,
//! and when a call cannot finish (a rank died, the timeout passed, an abort) it
//! releases every wait, marks the page failed and fails the communicator, naming the
//! ranks that did not arrive. Every rank decides to take this path from the same facts
//! (communicator on one GPU, the call, FERROCCL_CUDA_IPC); a rank that cannot (memory
//! IPC cannot share, no NVRTC or stream memory operations) says so in the descriptor
//! exchange, and then every rank stages the call through host memory instead.

use super::ctl::{self, Ctl};
use super::host::{self, Call};
use super::{staging, Backend, Exec};
use crate::backend::host::algorithms as algo;
use crate::coll::{Coll, CollKind, VCounts};
use crate::error::{Error, Result};
use crate::log;
use crate::mem::{cuda, cuda_reduce, Placement};
use crate::types::DataType;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A descriptor: can this rank take part, its pid, its two buffers (handle, offset in
/// the allocation, address), and the bases of up to [`DEAD_MAX`] of its allocations
/// that peers mapped and that it has freed since.
const BLOB: usize = 1 + 4 + 2 * (64 + 8 + 8) + 1 + 8 * DEAD_MAX;
const DEAD_AT: usize = 1 + 4 + 2 * (64 + 8 + 8);
/// Freed allocations reported per call (more wait for the next call).
const DEAD_MAX: usize = 8;
/// The rank that moves the data.
const EXECUTOR: usize = 0;

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
    *ON.get_or_init(|| match crate::env::CUDA_IPC.get_or_default().trim() {
        "0" | "off" => None,
        _ => Some(0),
    })
}

/// True when this call takes the path on a communicator whose ranks share one GPU:
/// decided from what every rank passes alike (kind, count, type, op), so all ranks
/// agree. Calls with per-rank counts come whatever their memory: a rank with nothing
/// to send or receive passes no device buffer, yet must meet the others here; the
/// descriptors then tell whether every rank with data has it on the device.
pub fn eligible(c: &Coll, nranks: usize, min: usize) -> bool {
    let kind_ok = match c.kind {
        // One launch reduces every rank's input (the kernel takes up to MAX_INPUTS), so
        // results are those of the host's rank order, Avg included.
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter | CollKind::ReduceScatterV => {
            cuda_reduce::supported(c.dtype) && nranks <= cuda_reduce::MAX_INPUTS
        }
        CollKind::AllGather
        | CollKind::AllGatherV
        | CollKind::Broadcast
        | CollKind::Gather
        | CollKind::Scatter
        | CollKind::AlltoAll
        | CollKind::AlltoAllv => true,
        _ => false,
    };
    kind_ok
        && (2..=ctl::MAX_RANKS).contains(&nranks)
        && (c.v.is_some() || matches!(c.placement, Placement::Device { .. }))
        && c.wire.is_none()
        && c.strided.is_none()
        && !c.is_noop()
        && (c.v.is_some() || c.count.saturating_mul(c.dtype.size()) >= min)
}

/// The path as a router entry: calls of device memory (alone or in a group) on a
/// communicator whose ranks all share one GPU, unless FERROCCL_CUDA_IPC=0.
pub struct Ipc {
    rank: usize,
    nranks: usize,
    device: i32,
    min_bytes: usize,
    /// Names the control page (the communicator's nonce).
    nonce: u64,
    timeout: Duration,
    inner: Mutex<Inner>,
    watch: Arc<Watch>,
}

/// What calls keep between them.
#[derive(Default)]
struct Inner {
    /// Executor: mappings of peers' allocations.
    maps: Mappings,
    /// This rank's allocations whose handles peers received: base -> (the driver's
    /// identity of the allocation, its handle).
    exported: HashMap<usize, (u64, [u8; 64])>,
    /// How calls run, once the first call decided it.
    mode: Option<Mode>,
    /// The last call put on the streams.
    k: u32,
    /// Executor: mappings to close once the GPU finished the call numbered with them.
    closing: Vec<(u32, usize)>,
    /// The context the mappings and the page belong to.
    ctx: usize,
    watchdog: Option<std::thread::JoinHandle<()>>,
}

impl Ipc {
    /// `device`: the rank's device, whose primary context serves calls without device
    /// buffers on this rank.
    pub fn new(rank: usize, nranks: usize, device: i32, min_bytes: usize, nonce: u64, timeout: Duration) -> Ipc {
        Ipc {
            rank,
            nranks,
            device,
            min_bytes,
            nonce,
            timeout,
            inner: Mutex::new(Inner::default()),
            watch: Arc::new(Watch::default()),
        }
    }
}

impl Backend for Ipc {
    fn id(&self) -> &'static str {
        "ipc"
    }

    fn accepts(&self, c: &Coll, _alone: bool) -> bool {
        eligible(c, self.nranks, self.min_bytes)
    }

    fn run(&self, x: &mut Exec<'_>, calls: &[Call]) -> Result<Option<Error>> {
        // A group's collectives run one after the other, in the order every rank gave
        // them (its send/recv and other calls go to the built-in backend).
        let mut first_err = None;
        for call in calls {
            if let Some(e) = self.watch.failure.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                return Err(e);
            }
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(e) = self.run_one(x, call, &mut inner)? {
                first_err.get_or_insert(e);
            }
        }
        Ok(first_err)
    }

    fn abort(&self) {
        self.watch.aborted.store(true, Ordering::Release);
        self.watch.wake.notify_all();
    }

    fn async_error(&self) -> Option<Error> {
        self.watch.failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// How a communicator's calls run on this path (the same on every rank).
#[derive(Clone)]
enum Mode {
    /// Ordered on the streams through the control page: ranks in separate processes.
    Stream(Arc<Ctl>),
    /// Ranks that share a process may share a stream (or the legacy default stream,
    /// which orders every blocking stream of the context), where a wait for a peer
    /// would sit before the peer's own write: the executor runs the call and the host
    /// waits for it, as the callers' streams cannot order each other.
    Synced,
    /// Every call stages, for this reason.
    Off(String),
}

/// A peer's allocation: the owner's pid and the allocation's base address there.
type Owner = (u32, usize);

/// Most of this rank's allocations tracked for peers: past it, one is forgotten
/// (peers close its mapping when they need room).
const EXPORTED_MAX: usize = 4096;

impl Inner {
    /// Writes into `blob` the bases of allocations that peers mapped and that are freed
    /// now (or hold another allocation), and forgets them.
    fn report_dead(&mut self, blob: &mut [u8]) {
        let dead: Vec<usize> = self
            .exported
            .iter()
            .filter(|(&base, &(id, _))| cuda::buffer_id(base as *const u8) != Some(id))
            .map(|(&base, _)| base)
            .take(DEAD_MAX)
            .collect();
        blob[DEAD_AT] = dead.len() as u8;
        for (i, base) in dead.iter().enumerate() {
            self.exported.remove(base);
            let at = DEAD_AT + 1 + 8 * i;
            blob[at..at + 8].copy_from_slice(&(*base as u64).to_le_bytes());
        }
    }

    /// The IPC handle of the allocation holding `p` and `p`'s offset in it: made once
    /// per allocation (cuIpcGetMemHandle is slow), remembered to report its freeing.
    fn handle(&mut self, p: *const u8) -> Result<([u8; 64], usize)> {
        let (base, _) = cuda::address_range(p)?;
        let id = cuda::buffer_id(base as *const u8);
        if let Some(&(known, h)) = self.exported.get(&base) {
            if Some(known) == id {
                return Ok((h, p as usize - base));
            }
        }
        let (h, off) = cuda::ipc_handle(p)?;
        if self.exported.len() >= EXPORTED_MAX {
            if let Some(&k) = self.exported.keys().next() {
                self.exported.remove(&k);
            }
        }
        if let Some(id) = id {
            self.exported.insert(base, (id, h));
        }
        Ok((h, off))
    }

    /// Closes the mappings whose last use the GPU has finished.
    fn close_finished(&mut self, ctl: &Ctl) {
        let done = ctl.done().load(Ordering::Acquire);
        self.closing.retain(|&(k, base)| {
            if ctl::reached(done, k) {
                close(base);
                false
            } else {
                true
            }
        });
    }
}

/// The executor's mappings of peers' allocations, one per (context, owner's
/// allocation): opening costs far more than a collective, so a buffer used again is
/// not opened again. A new handle for the same owner and base means the old
/// allocation was freed and another took its place; an owner also reports the
/// allocations it freed. Past [`MAPPINGS_MAX`] the least recently used one goes.
/// Mappings that go are closed once the GPU finished the calls that used them; all
/// are closed with the communicator.
#[derive(Default)]
struct Mappings {
    map: HashMap<(usize, Owner), Mapped>,
    tick: u64,
}

struct Mapped {
    handle: [u8; 64],
    base: usize,
    used: u64,
}

/// The most peer allocations one rank keeps mapped.
pub const MAPPINGS_MAX: usize = 1024;

impl Mappings {
    /// Drops the mappings of `pid`'s allocations that it reported freed; returns them.
    fn forget(&mut self, ctx: usize, pid: u32, blob: &[u8], gone: &mut Vec<usize>) {
        let n = (blob[DEAD_AT] as usize).min(DEAD_MAX);
        for i in 0..n {
            let at = DEAD_AT + 1 + 8 * i;
            let base = u64::from_le_bytes(blob[at..at + 8].try_into().expect("8 bytes")) as usize;
            if let Some(m) = self.map.remove(&(ctx, (pid, base))) {
                gone.push(m.base);
            }
        }
    }

    /// `owner`'s allocation (its IPC `handle`) mapped in context `ctx` (current).
    /// Mappings it replaces go to `gone`.
    fn open(&mut self, ctx: usize, owner: Owner, handle: &[u8; 64], gone: &mut Vec<usize>) -> Result<usize> {
        self.tick += 1;
        let tick = self.tick;
        if let Some(e) = self.map.get_mut(&(ctx, owner)) {
            if e.handle == *handle {
                e.used = tick;
                return Ok(e.base);
            }
            gone.push(self.map.remove(&(ctx, owner)).expect("present").base);
        }
        if self.map.len() >= MAPPINGS_MAX {
            let oldest = self.map.iter().filter(|(k, _)| k.0 == ctx).min_by_key(|(_, e)| e.used).map(|(&k, _)| k);
            if let Some(k) = oldest {
                gone.push(self.map.remove(&k).expect("present").base);
            }
        }
        let base = cuda::ipc_open(handle)?;
        self.map.insert((ctx, owner), Mapped { handle: *handle, base, used: tick });
        Ok(base)
    }
}

fn close(base: usize) {
    // SAFETY: base came from ipc_open in the current context, and the GPU finished
    // every call that used it (see Mappings).
    if let Err(e) = unsafe { cuda::ipc_close(base) } {
        log::warn(format_args!("closing a mapping of a peer's allocation: {}", e.msg));
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
    /// Runs `coll` on the host backend at sequence number `seq`, or at the
    /// communicator's next one (None), as every rank does; `x.algo` keeps what this path
    /// set.
    fn on_host(x: &mut Exec<'_>, coll: Coll, seq: Option<u64>) -> Result<Option<Error>> {
        let seq = seq.unwrap_or_else(|| {
            *x.seq += 1;
            *x.seq
        });
        let algo = x.algo;
        let r = host::execute(x, &[Call { coll, seq }]);
        x.algo = algo;
        r
    }

    /// A host-memory exchange of this path's own, at the communicator's next sequence
    /// number.
    fn exchange(x: &mut Exec<'_>, coll: Coll) -> Result<Option<Error>> {
        Self::on_host(x, coll, None)
    }

    /// All ranks' `mine` (BLOB bytes each), at sequence number `seq` (the call's own
    /// for the first exchange of a call).
    fn allgather(x: &mut Exec<'_>, mine: &[u8], n: usize, seq: Option<u64>) -> Result<(Vec<u8>, Option<Error>)> {
        let mut all = vec![0u8; mine.len() * n];
        let ex = Coll::new(CollKind::AllGather, mine.as_ptr(), all.as_mut_ptr(), mine.len(), DataType::Uint8);
        let r = Self::on_host(x, ex, seq)?;
        Ok((all, r))
    }

    /// Decides at the first call how this communicator's calls run: ranks in separate
    /// processes set up the control page (rank 0 creates it, the others map it), ranks
    /// that share a process run synchronised. Every rank reaches the same mode.
    fn set_up(
        &self,
        x: &mut Exec<'_>,
        call: &Call,
        ctx: usize,
        device: i32,
        inner: &mut Inner,
    ) -> Result<Option<Error>> {
        let n = self.nranks;
        let pid = std::process::id();
        let (all, err) = Self::allgather(x, &pid.to_le_bytes(), n, own_seq(x, call))?;
        if let Some(e) = err {
            return Ok(Some(e));
        }
        let pids: Vec<u32> = all.chunks(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
        let mut sorted = pids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() < n {
            inner.mode = Some(Mode::Synced);
            inner.ctx = ctx;
            return Ok(None);
        }
        // Rank 0 creates the page; everyone learns whether that worked.
        let made = if self.rank == EXECUTOR {
            Some(cuda::memops_ready(device).and_then(|_| Ctl::create(&Ctl::name(self.nonce, pid), ctx).map(Arc::new)))
        } else {
            None
        };
        let ok = [made.as_ref().map_or(true, |m| m.is_ok()) as u8];
        let (oks, err) = Self::allgather(x, &ok, n, None)?;
        if let Some(e) = err {
            return Ok(Some(e));
        }
        let opened = match made {
            Some(m) => m.map_err(|e| e.msg),
            None if oks[EXECUTOR] == 1 => cuda::memops_ready(device)
                .and_then(|_| Ctl::open(&Ctl::name(self.nonce, pids[EXECUTOR]), ctx).map(Arc::new))
                .map_err(|e| e.msg),
            None => Err("rank 0 could not create the device control page".to_string()),
        };
        // Everyone learns whether everyone has the page.
        let ok = [opened.is_ok() as u8];
        let (oks, err) = Self::allgather(x, &ok, n, None)?;
        if let Some(e) = err {
            return Ok(Some(e));
        }
        let mode = match (opened, oks.iter().position(|&o| o != 1)) {
            (Ok(c), None) => Mode::Stream(c),
            (Err(m), _) => Mode::Off(m),
            (Ok(_), Some(r)) => Mode::Off(format!("rank {r} could not map the device control page")),
        };
        match &mode {
            Mode::Off(m) => log::info(format_args!(
                "rank {}: device calls through host staging: the stream-ordered path is unavailable: {m}",
                self.rank
            )),
            Mode::Stream(c) => {
                *self.watch.ctl.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
                let watch = self.watch.clone();
                let (rank, nranks) = (self.rank, self.nranks);
                inner.watchdog = std::thread::Builder::new()
                    .name("ferroccl-watch".into())
                    .spawn(move || watch.run(rank, nranks))
                    .map_err(|e| log::warn(format_args!("no device watchdog thread: {e}")))
                    .ok();
            }
            Mode::Synced => {}
        }
        inner.ctx = ctx;
        inner.mode = Some(mode);
        Ok(None)
    }

    fn prepare(&self, c: &Coll, ctx: usize, device: i32, inner: &mut Inner) -> Result<Vec<u8>> {
        let reduces = matches!(
            c.kind,
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter | CollKind::ReduceScatterV
        );
        if self.rank == EXECUTOR && reduces {
            // Compiled now, so an executor without NVRTC says so in the exchange.
            cuda_reduce::kernel(ctx, device, c.dtype, c.op)?;
        }
        if matches!(c.kind, CollKind::AlltoAll | CollKind::AlltoAllv) && std::ptr::eq(c.send, c.recv) {
            return Err(Error::unavailable("an in-place all_to_all overwrites blocks that peers still read"));
        }
        let (sb, rb) = c.extents(self.rank, self.nranks)?;
        if c.placement == Placement::Host && sb + rb > 0 {
            return Err(Error::unavailable("this rank's buffers are host memory"));
        }
        let mut b = vec![0u8; desc_bytes(c, self.nranks)];
        if let Some(v) = &c.v {
            put_counts(v, self.nranks, &mut b);
        }
        b[0] = 1;
        b[1..5].copy_from_slice(&std::process::id().to_le_bytes());
        let mut at = 5;
        for (p, bytes) in [(c.send, sb), (c.recv as *const u8, rb)] {
            if bytes > 0 {
                let (h, off) = inner.handle(p)?;
                b[at..at + 64].copy_from_slice(&h);
                b[at + 64..at + 72].copy_from_slice(&(off as u64).to_le_bytes());
                b[at + 72..at + 80].copy_from_slice(&(p as u64).to_le_bytes());
            }
            at += 80;
        }
        Ok(b)
    }

    /// Runs one eligible call: the descriptor exchange on the host, then stream
    /// operations only.
    fn run_one(&self, x: &mut Exec<'_>, call: &Call, inner: &mut Inner) -> Result<Option<Error>> {
        let (rank, n) = (self.rank, self.nranks);
        let c = &call.coll;
        let (device, ctx) = match c.placement {
            Placement::Device { device, ctx } => (device, ctx),
            Placement::Host => (self.device, cuda::primary_context(self.device)?),
        };
        let guard = cuda::CtxGuard::enter(ctx)?;
        let first = inner.mode.is_none();
        if first {
            if let Some(e) = self.set_up(x, call, ctx, device, inner)? {
                return Ok(Some(e));
            }
        }
        // Buffers of another context than the first call's stage: the mappings and the
        // page belong to that one.
        let mode = match inner.mode.clone().expect("set up") {
            Mode::Stream(_) | Mode::Synced if inner.ctx != ctx => {
                Mode::Off("buffers of another context than the communicator's first device call".to_string())
            }
            m => m,
        };
        if let Mode::Stream(ctl) = &mode {
            inner.close_finished(ctl);
        }
        if matches!(mode, Mode::Synced) {
            // Inputs complete before the executor reads them.
            cuda::sync(c.stream)?;
        }
        let prepared = match &mode {
            Mode::Off(m) => Err(Error::unavailable(m.clone())),
            _ => self.prepare(c, ctx, device, inner),
        };
        let mut mine = match prepared {
            Ok(b) => b,
            Err(e) => {
                if !matches!(mode, Mode::Off(_)) {
                    log::info(format_args!("rank {rank}: {} through host staging: {}", c.kind.c_name(), e.msg));
                }
                let mut b = vec![0u8; desc_bytes(c, n)];
                b[1..5].copy_from_slice(&std::process::id().to_le_bytes());
                b
            }
        };
        inner.report_dead(&mut mine);
        let db = mine.len();
        let (all, err) = Self::allgather(x, &mine, n, if first { None } else { own_seq(x, call) })?;
        if let Some(e) = err {
            return Ok(Some(e));
        }
        let mut gone = Vec::new();
        for b in all.chunks(db) {
            if pid_of(b) != std::process::id() {
                inner.maps.forget(ctx, pid_of(b), b, &mut gone);
            }
        }
        if matches!(mode, Mode::Off(_)) || all.chunks(db).any(|b| b[0] != 1) {
            // Somebody cannot: everyone runs the call on the built-in backend, device
            // buffers staged (after the calls before it on the stream).
            drop(guard);
            self.defer_close(inner, gone);
            if c.placement == Placement::Host {
                x.algo = "host (a rank's buffers are not all on the device)";
                return Self::on_host(x, c.clone(), None);
            }
            let mut coll = c.clone();
            let st = staging::stage_in(&mut coll, c.placement, rank, n)?;
            x.algo = "staged (a rank cannot share this call's memory through IPC)";
            let res = Self::on_host(x, coll, None)?;
            st.stage_out()?;
            return Ok(res);
        }
        // Per-rank counts: every rank checks every pair from the same descriptors, so all
        // return the same verdict, and nothing is enqueued on a mismatch.
        let counts: Vec<VCounts> =
            if c.v.is_some() { all.chunks(db).map(|b| get_counts(b, n)).collect() } else { Vec::new() };
        if let Some(e) = counts_verdict(c, rank, &counts) {
            self.defer_close(inner, gone);
            return Ok(Some(e));
        }
        let s = c.stream;
        let Mode::Stream(ctl) = mode else {
            // Synced: the executor moves the data and waits for it; then everyone returns.
            if rank == EXECUTOR {
                let peers = map_peers(&all, db, ctx, &mut inner.maps, &mut gone)?;
                // SAFETY: the peers' buffers are mapped (or this process's own) and held by
                // their ranks until the barrier below; the stream is synchronised before it.
                unsafe { move_data(x, c, &peers, &counts, ctx, device)? };
                cuda::sync(s)?;
            } else {
                x.algo = "the host waits while rank 0 moves the data";
            }
            for base in gone {
                close(base);
            }
            let b = Coll::new(CollKind::Barrier, std::ptr::null(), std::ptr::null_mut(), 0, DataType::Uint8);
            return Self::exchange(x, b);
        };
        let k = inner.k.wrapping_add(1);
        if rank == EXECUTOR {
            let peers = map_peers(&all, db, ctx, &mut inner.maps, &mut gone)?;
            // SAFETY: the page is registered in this context and outlives the stream's use
            // of it (Drop waits for the last call); the peers' buffers are mapped until the
            // GPU finished this call (closing waits for `done`), and their owners keep
            // them until their streams passed `done >= k`.
            unsafe {
                for q in (0..n).filter(|&q| q != EXECUTOR) {
                    cuda::stream_wait_geq(s, ctl.dev_ready(q), k)?;
                }
                move_data(x, c, &peers, &counts, ctx, device)?;
                cuda::stream_write(s, ctl.dev_done(), k)?;
            }
        } else {
            // SAFETY: as above for the page.
            unsafe {
                cuda::stream_write(s, ctl.dev_ready(rank), k)?;
                cuda::stream_wait_geq(s, ctl.dev_done(), k)?;
            }
            x.algo = "signal and wait on the stream; rank 0 moves the data";
        }
        inner.k = k;
        self.defer_close(inner, gone);
        let pids: Vec<u32> = all.chunks(db).map(pid_of).collect();
        self.watch.pending(Pending { k, deadline: Instant::now() + self.timeout, pids, seq: call.seq });
        Ok(None)
    }

    /// Mappings that went in this call close once the GPU finished the calls so far.
    fn defer_close(&self, inner: &mut Inner, gone: Vec<usize>) {
        let k = inner.k;
        inner.closing.extend(gone.into_iter().map(|b| (k, b)));
    }
}

/// Every rank's (send, recv) pointers from the descriptors (`db` bytes each).
fn map_peers(
    all: &[u8],
    db: usize,
    ctx: usize,
    maps: &mut Mappings,
    gone: &mut Vec<usize>,
) -> Result<Vec<(*const u8, *const u8)>> {
    all.chunks(db).map(|b| map_peer(b, ctx, maps, gone)).collect()
}

/// A peer's (send, recv) pointers, usable in this process's context `ctx` (null
/// where the peer's extent is empty).
fn map_peer(b: &[u8], ctx: usize, maps: &mut Mappings, gone: &mut Vec<usize>) -> Result<(*const u8, *const u8)> {
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

/// The error of a call with per-rank counts that do not pair up, the same on every
/// rank (and worded as the host backend's check words it); None when they agree.
fn counts_verdict(c: &Coll, me: usize, counts: &[VCounts]) -> Option<Error> {
    if counts.is_empty() {
        return None;
    }
    let n = counts.len();
    let as_rank = |r: usize| Coll { v: Some(counts[r].clone()), ..c.clone() };
    let colls: Vec<Coll> = (0..n).map(as_rank).collect();
    let finding = |r: usize| -> Option<String> {
        let mine = &colls[r];
        (0..n)
            .filter(|&p| p != r)
            .find_map(|p| algo::describe_pair(mine, r, p, algo::pair_values(mine, p), algo::pair_values(&colls[p], r)))
            .or_else(|| algo::describe_self(mine, r, algo::pair_values(mine, r)))
    };
    let findings: Vec<Option<String>> = (0..n).map(finding).collect();
    let reporters: Vec<usize> = (0..n).filter(|&r| findings[r].is_some()).collect();
    algo::counts_error(findings[me].clone(), &reporters)
}

/// The whole call's data movement, enqueued on the executor's stream: every rank's
/// receive buffer from every rank's buffers. `counts[r]`: rank r's per-rank counts
/// (calls that have them). Device addresses are offset with `wrapping_add`: the host
/// never dereferences them.
///
/// # Safety
/// `peers[q]` are rank q's (send, recv) mapped in `ctx`, valid for q's extents until
/// the stream has run the work.
unsafe fn move_data(
    x: &mut Exec<'_>,
    c: &Coll,
    peers: &[(*const u8, *const u8)],
    counts: &[VCounts],
    ctx: usize,
    device: i32,
) -> Result<()> {
    let n = peers.len();
    let es = c.dtype.size();
    let bytes = c.count * es;
    let s = c.stream;
    let recv = |q: usize| peers[q].1 as *mut u8;
    let send = |q: usize| peers[q].0;
    let copy = |dst: *mut u8, src: *const u8, len: usize| -> Result<()> {
        if std::ptr::eq(dst, src) || len == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie in mapped buffers of this call (caller).
        unsafe { cuda::copy_dtod_async(dst, src, len, s) }
    };
    // out = op over ins, in rank order, in one launch (eligible() bounds the ranks).
    let reduce = |out: *mut u8, ins: &[*const u8], elems: usize| -> Result<()> {
        let f = cuda_reduce::kernel(ctx, device, c.dtype, c.op)?;
        // SAFETY: as above; the kernel reads each element before writing it, so an
        // output equal to one input (in place) is fine.
        unsafe { cuda_reduce::launch(f, out, ins, elems, s) }
    };
    let sends_at =
        |off: &dyn Fn(usize) -> usize| -> Vec<*const u8> { (0..n).map(|p| send(p).wrapping_add(off(p))).collect() };
    x.algo = "copies on rank 0's stream through IPC mappings";
    match c.kind {
        CollKind::AllReduce => {
            // Into rank 0's recv (read in place before anything writes), then copied to
            // the others.
            reduce(recv(0), &sends_at(&|_| 0), c.count)?;
            for q in 1..n {
                copy(recv(q), recv(0), bytes)?;
            }
            x.algo = "reduce, then copies, on rank 0's stream through IPC mappings";
        }
        CollKind::ReduceScatter => {
            for q in 0..n {
                reduce(recv(q), &sends_at(&|_| q * bytes), c.count)?;
            }
            x.algo = "reductions on rank 0's stream through IPC mappings";
        }
        CollKind::ReduceScatterV => {
            for q in 0..n {
                let elems = counts[q].recvcounts()[q];
                if elems > 0 {
                    reduce(recv(q), &sends_at(&|p| counts[p].sdispls()[q] * es), elems)?;
                }
            }
            x.algo = "reductions on rank 0's stream through IPC mappings";
        }
        CollKind::Reduce => {
            reduce(recv(c.root), &sends_at(&|_| 0), c.count)?;
            x.algo = "reduction on rank 0's stream through IPC mappings";
        }
        CollKind::AllGather => {
            for q in 0..n {
                for p in 0..n {
                    copy(recv(q).wrapping_add(p * bytes), send(p), bytes)?;
                }
            }
        }
        CollKind::AllGatherV => {
            for (q, v) in counts.iter().enumerate() {
                for p in 0..n {
                    copy(recv(q).wrapping_add(v.rdispls()[p] * es), send(p), v.recvcounts()[p] * es)?;
                }
            }
        }
        CollKind::Broadcast => {
            for q in 0..n {
                copy(recv(q), send(c.root), bytes)?;
            }
        }
        CollKind::Gather => {
            for p in 0..n {
                copy(recv(c.root).wrapping_add(p * bytes), send(p), bytes)?;
            }
        }
        CollKind::Scatter => {
            for q in 0..n {
                copy(recv(q), send(c.root).wrapping_add(q * bytes), bytes)?;
            }
        }
        CollKind::AlltoAll => {
            for q in 0..n {
                for p in 0..n {
                    copy(recv(q).wrapping_add(p * bytes), send(p).wrapping_add(q * bytes), bytes)?;
                }
            }
        }
        CollKind::AlltoAllv => {
            for (q, v) in counts.iter().enumerate() {
                for (p, theirs) in counts.iter().enumerate() {
                    let from = send(p).wrapping_add(theirs.sdispls()[q] * es);
                    copy(recv(q).wrapping_add(v.rdispls()[p] * es), from, v.recvcounts()[p] * es)?;
                }
            }
        }
        k => return Err(Error::internal(format!("{} on the IPC path", k.c_name()))),
    }
    Ok(())
}

/// The last call a rank put on its stream, for the watchdog.
#[derive(Clone)]
struct Pending {
    k: u32,
    deadline: Instant,
    /// Every rank's pid, to notice one that died.
    pids: Vec<u32>,
    /// The call's sequence number on the communicator, for messages.
    seq: u64,
}

/// What a rank's watchdog thread shares with its calls.
#[derive(Default)]
struct Watch {
    ctl: Mutex<Option<Arc<Ctl>>>,
    pending: Mutex<Option<Pending>>,
    wake: Condvar,
    stop: AtomicBool,
    aborted: AtomicBool,
    /// Why the communicator failed on the device; every later call returns it.
    failure: Mutex<Option<Error>>,
}

/// How often the watchdog looks while a call is on the GPU.
const WATCH_TICK: Duration = Duration::from_millis(5);

impl Watch {
    fn pending(&self, p: Pending) {
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        self.wake.notify_all();
    }

    /// Watches the last call on the GPU until it finishes, and releases every wait of a
    /// call that cannot.
    fn run(&self, rank: usize, nranks: usize) {
        let Some(ctl) = self.ctl.lock().unwrap_or_else(|e| e.into_inner()).clone() else { return };
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let Some(p) = pending.clone() else {
                pending =
                    self.wake.wait_timeout(pending, Duration::from_millis(200)).unwrap_or_else(|e| e.into_inner()).0;
                continue;
            };
            if ctl.finished(p.k) && ctl.failed().load(Ordering::Acquire) == 0 {
                *pending = None;
                continue;
            }
            if let Some(e) = self.why_stuck(&ctl, &p, rank, nranks) {
                ctl.release(p.k, nranks);
                log::warn(format_args!("rank {rank}: {}", e.msg));
                self.failure.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                *pending = None;
                continue;
            }
            pending = self.wake.wait_timeout(pending, WATCH_TICK).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Why call `p` can never finish, if it cannot.
    fn why_stuck(&self, ctl: &Ctl, p: &Pending, rank: usize, nranks: usize) -> Option<Error> {
        let missing = || -> Vec<usize> {
            (0..nranks).filter(|&q| q != EXECUTOR && !ctl::reached(ctl.ready(q).load(Ordering::Acquire), p.k)).collect()
        };
        let what = format!("device call #{} (collective #{})", p.k, p.seq);
        if ctl.failed().load(Ordering::Acquire) != 0 {
            return Some(Error::remote(format!("{what}: another rank gave up on this communicator's device calls")));
        }
        if self.aborted.load(Ordering::Acquire) {
            return Some(Error::remote(format!("{what}: the communicator was aborted")));
        }
        for (q, &pid) in p.pids.iter().enumerate() {
            // SAFETY: signal 0 only checks whether the process exists.
            let gone = pid != std::process::id()
                && unsafe { libc::kill(pid as i32, 0) } != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            if gone {
                return Some(Error::remote_rank(
                    q,
                    format!("{what}: rank {q} (pid {pid}) died before the GPU finished the call; its stream operations will never come"),
                ));
            }
        }
        if Instant::now() >= p.deadline {
            let m = missing();
            let who = if m.is_empty() {
                format!("every rank's stream reached it, but rank {EXECUTOR}'s stream did not finish it")
            } else {
                format!("the streams of rank(s) {m:?} did not reach it (their work before the call did not finish, or they stopped)")
            };
            let culprit = m.first().copied().or((rank != EXECUTOR).then_some(EXECUTOR));
            return Some(Error::timeout_blaming(
                culprit,
                format!("{what} did not finish on the GPU within the timeout: {who}"),
            ));
        }
        None
    }
}

impl Drop for Ipc {
    fn drop(&mut self) {
        self.watch.stop.store(true, Ordering::Release);
        self.watch.wake.notify_all();
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = inner.watchdog.take() {
            let _ = h.join();
        }
        let ctl = match inner.mode.take() {
            Some(Mode::Stream(ctl)) => ctl,
            Some(Mode::Synced) => {
                if let Ok(_g) = cuda::CtxGuard::enter(inner.ctx) {
                    for (_, m) in inner.maps.map.drain() {
                        close(m.base);
                    }
                }
                return;
            }
            _ => return,
        };
        // Nothing is unmapped while the GPU may still run a call that uses it.
        let until = Instant::now() + self.timeout.min(Duration::from_secs(30));
        while !ctl.finished(inner.k) && ctl.failed().load(Ordering::Acquire) == 0 {
            if Instant::now() >= until {
                log::warn(format_args!(
                    "rank {}: destroying a communicator whose device call #{} has not finished on the GPU; its mappings and control page stay",
                    self.rank, inner.k
                ));
                std::mem::forget(ctl);
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        *self.watch.ctl.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if let Ok(_g) = cuda::CtxGuard::enter(inner.ctx) {
            for (_, base) in inner.closing.drain(..) {
                close(base);
            }
            for (_, m) in inner.maps.map.drain() {
                close(m.base);
            }
        }
        drop(ctl);
    }
}
