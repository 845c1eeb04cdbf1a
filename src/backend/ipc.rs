//! Device memory of ranks that share one GPU (the built-in backend's case NCCL
//! refuses), moved GPU to GPU without host staging: peers' buffers are mapped through
//! CUDA IPC (mapped once per allocation and kept, see `Mappings`), and each rank pulls
//! what its own receive buffer needs with copies and NVRTC reduction kernels on the
//! caller's stream. all_reduce reduces this rank's share of every input, then copies
//! the other shares from the ranks that reduced them.
//!
//! Host messages only order the phases (they carry the IPC handles and act as
//! barriers); the data stays on the GPU. Every rank writes only its own receive
//! buffer, so no two ranks write one byte. Every rank decides to take this path from
//! the same facts (communicator on one GPU, the call, FERROCCL_CUDA_IPC), and a rank
//! that cannot (memory IPC cannot share, no NVRTC, an in-place all_to_all) says so in
//! the first exchange: then all ranks stage the call through host memory instead.

use super::host::{self, Call};
use super::{staging, Backend, Exec};
use crate::coll::{Coll, CollKind};
use crate::error::{Error, Result};
use crate::log;
use crate::mem::{cuda, cuda_reduce, Placement};
use crate::types::DataType;

/// What one rank shares: can it take part, its pid, its two buffers (handle, offset
/// in the allocation, address), and the bases of up to [`DEAD_MAX`] of its allocations
/// that peers mapped and that it has freed since.
const BLOB: usize = 1 + 4 + 2 * (64 + 8 + 8) + 1 + 8 * DEAD_MAX;
const DEAD_AT: usize = 1 + 4 + 2 * (64 + 8 + 8);
/// Freed allocations reported per call (more wait for the next call).
const DEAD_MAX: usize = 8;

/// Calls of at least this many bytes per rank buffer take the path under
/// FERROCCL_CUDA_IPC=auto: below it, host staging's lower fixed cost wins.
pub const AUTO_MIN_BYTES: usize = 256 << 10;

/// FERROCCL_CUDA_IPC: the smallest call (bytes of `count` elements) that takes the
/// path, or None when it is off (read once).
pub fn min_bytes() -> Option<usize> {
    static ON: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match crate::env::CUDA_IPC.get_or_default().trim() {
        "0" | "off" => None,
        "1" | "on" => Some(0),
        _ => Some(AUTO_MIN_BYTES),
    })
}

/// True when this call can take the path on a communicator whose ranks share one
/// GPU: decided from what every rank passes alike (kind, count, type, op), so all
/// ranks agree.
pub fn eligible(c: &Coll, nranks: usize, min: usize) -> bool {
    let kind_ok = match c.kind {
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter => {
            cuda_reduce::supported(c.dtype) && nranks <= cuda_reduce::MAX_INPUTS
        }
        CollKind::AllGather | CollKind::Broadcast | CollKind::Gather | CollKind::Scatter | CollKind::AlltoAll => true,
        _ => false,
    };
    kind_ok
        && nranks >= 2
        && matches!(c.placement, Placement::Device { .. })
        && c.wire.is_none()
        && c.strided.is_none()
        && c.v.is_none()
        && !c.is_noop()
        && c.count.saturating_mul(c.dtype.size()) >= min
}

/// The IPC path as a router entry: single calls of device memory on a communicator
/// whose ranks all share one GPU, unless FERROCCL_CUDA_IPC=0.
pub struct Ipc {
    rank: usize,
    nranks: usize,
    min_bytes: usize,
    maps: std::sync::Mutex<Mappings>,
    /// This rank's allocations whose handles peers received: base -> the driver's
    /// identity of the allocation, to notice when it is freed.
    exported: std::sync::Mutex<std::collections::HashMap<usize, u64>>,
}

impl Ipc {
    pub fn new(rank: usize, nranks: usize, min_bytes: usize) -> Ipc {
        Ipc { rank, nranks, min_bytes, maps: std::sync::Mutex::new(Mappings::default()), exported: Default::default() }
    }

    /// How many peer allocations this rank has mapped now.
    pub fn mapped(&self) -> usize {
        self.maps.lock().unwrap_or_else(|p| p.into_inner()).map.len()
    }
}

/// A peer's allocation: the owner's pid and the allocation's base address there.
type Owner = (u32, usize);

/// What one call of the path keeps between calls.
struct State<'a> {
    maps: &'a mut Mappings,
    exported: &'a mut std::collections::HashMap<usize, u64>,
}

/// Most of this rank's allocations tracked for peers: past it, the oldest-looking is
/// forgotten (peers close its mapping when they need room).
const EXPORTED_MAX: usize = 4096;

impl State<'_> {
    /// Writes into `blob` the bases of allocations that peers mapped and that are freed
    /// now (or hold another allocation), and forgets them.
    fn report_dead(&mut self, blob: &mut [u8; BLOB]) {
        let dead: Vec<usize> = self
            .exported
            .iter()
            .filter(|(&base, &id)| cuda::buffer_id(base as *const u8) != Some(id))
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

    /// Records that peers will map the allocation at `base`.
    fn exported(&mut self, base: usize) {
        if self.exported.contains_key(&base) {
            return;
        }
        if self.exported.len() >= EXPORTED_MAX {
            if let Some(&k) = self.exported.keys().next() {
                self.exported.remove(&k);
            }
        }
        if let Some(id) = cuda::buffer_id(base as *const u8) {
            self.exported.insert(base, id);
        }
    }
}

/// This communicator's mappings of peers' allocations, one per (context, owner's
/// allocation): opening costs far more than a collective, so a buffer used again is
/// not opened again. A new handle for the same owner and base means the old
/// allocation was freed and another took its place: the stale mapping is closed.
/// Past [`MAPPINGS_MAX`] the least recently used one is closed. All are closed with
/// the communicator. Mappings change only inside this communicator's calls, which
/// synchronise their stream before they return, so none is closed under queued work.
#[derive(Default)]
struct Mappings {
    map: std::collections::HashMap<(usize, Owner), Mapped>,
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
    /// Closes this process's mappings of `pid`'s allocations that it reported freed.
    fn forget(&mut self, ctx: usize, pid: u32, blob: &[u8]) {
        let n = (blob[DEAD_AT] as usize).min(DEAD_MAX);
        for i in 0..n {
            let at = DEAD_AT + 1 + 8 * i;
            let base = u64::from_le_bytes(blob[at..at + 8].try_into().expect("8 bytes")) as usize;
            if let Some(m) = self.map.remove(&(ctx, (pid, base))) {
                close(m.base);
            }
        }
    }

    /// `owner`'s allocation (its IPC `handle`) mapped in context `ctx` (current).
    fn open(&mut self, ctx: usize, owner: Owner, handle: &[u8; 64]) -> Result<usize> {
        self.tick += 1;
        let tick = self.tick;
        if let Some(e) = self.map.get_mut(&(ctx, owner)) {
            if e.handle == *handle {
                e.used = tick;
                return Ok(e.base);
            }
            let stale = self.map.remove(&(ctx, owner)).expect("present");
            close(stale.base);
        }
        if self.map.len() >= MAPPINGS_MAX {
            let oldest = self.map.iter().filter(|(k, _)| k.0 == ctx).min_by_key(|(_, e)| e.used).map(|(&k, _)| k);
            if let Some(k) = oldest {
                close(self.map.remove(&k).expect("present").base);
            }
        }
        let base = cuda::ipc_open(handle)?;
        self.map.insert((ctx, owner), Mapped { handle: *handle, base, used: tick });
        Ok(base)
    }
}

fn close(base: usize) {
    // SAFETY: base came from ipc_open in the current context; no queued work uses it
    // (see Mappings).
    if let Err(e) = unsafe { cuda::ipc_close(base) } {
        log::warn(format_args!("closing a mapping of a peer's allocation: {}", e.msg));
    }
}

impl Drop for Ipc {
    fn drop(&mut self) {
        let maps = self.maps.get_mut().unwrap_or_else(|p| p.into_inner());
        for ((ctx, _), m) in maps.map.drain() {
            match cuda::CtxGuard::enter(ctx) {
                Ok(_g) => close(m.base),
                Err(e) => log::warn(format_args!("a peer's allocation stays mapped: {}", e.msg)),
            }
        }
    }
}

impl Backend for Ipc {
    fn id(&self) -> &'static str {
        "ipc"
    }

    fn accepts(&self, c: &Coll, alone: bool) -> bool {
        alone && eligible(c, self.nranks, self.min_bytes)
    }

    fn run(&self, x: &mut Exec<'_>, calls: &[Call]) -> Result<Option<Error>> {
        let [call] = calls else { return Err(Error::internal("the IPC path runs one call at a time")) };
        let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        let mut exported = self.exported.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = State { maps: &mut maps, exported: &mut exported };
        run_one(x, call, self.rank, self.nranks, &mut st)
    }
}

/// Runs a host-memory exchange of this path's own (handles, barriers) with the
/// communicator's next sequence number, as every rank does.
fn exchange(x: &mut Exec<'_>, coll: Coll, seq: u64) -> Result<Option<Error>> {
    let algo = x.algo;
    let r = host::execute(x, &[Call { coll, seq }]);
    x.algo = algo;
    r
}

fn barrier(x: &mut Exec<'_>) -> Result<Option<Error>> {
    *x.seq += 1;
    let b = Coll::new(CollKind::Barrier, std::ptr::null(), std::ptr::null_mut(), 0, DataType::Uint8);
    exchange(x, b, *x.seq)
}

fn prepare(c: &Coll, ctx: usize, device: i32, rank: usize, n: usize, st: &mut State<'_>) -> Result<[u8; BLOB]> {
    if matches!(c.kind, CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter) {
        // Compiled now, so a rank without NVRTC says so in the exchange.
        cuda_reduce::kernel(ctx, device, c.dtype, c.op)?;
    }
    if c.kind == CollKind::AlltoAll && std::ptr::eq(c.send, c.recv) {
        return Err(Error::unavailable("an in-place all_to_all overwrites blocks that peers still read"));
    }
    let (sb, rb) = c.extents(rank, n)?;
    let mut b = [0u8; BLOB];
    b[0] = 1;
    b[1..5].copy_from_slice(&std::process::id().to_le_bytes());
    let mut at = 5;
    for (p, bytes) in [(c.send, sb), (c.recv as *const u8, rb)] {
        if bytes > 0 {
            let (h, off) = cuda::ipc_handle(p)?;
            st.exported(p as usize - off);
            b[at..at + 64].copy_from_slice(&h);
            b[at + 64..at + 72].copy_from_slice(&(off as u64).to_le_bytes());
            b[at + 72..at + 80].copy_from_slice(&(p as u64).to_le_bytes());
        }
        at += 80;
    }
    Ok(b)
}

/// A peer's (send, recv) pointers, usable in this process's context `ctx` (null
/// where the peer's extent is empty).
fn map_peer(b: &[u8], ctx: usize, maps: &mut Mappings) -> Result<(*const u8, *const u8)> {
    let pid = u32::from_le_bytes(b[1..5].try_into().expect("4 bytes"));
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
            maps.open(ctx, (pid, ptr - off), &h)? + off
        };
    }
    Ok((out[0] as *const u8, out[1] as *const u8))
}

/// Runs one eligible call (`call`'s sequence number and the next ones are used).
fn run_one(x: &mut Exec<'_>, call: &Call, rank: usize, n: usize, st: &mut State<'_>) -> Result<Option<Error>> {
    let c = &call.coll;
    let Placement::Device { device, ctx } = c.placement else {
        return Err(Error::internal("IPC path on host memory"));
    };
    let guard = cuda::CtxGuard::enter(ctx)?;
    // Inputs complete before peers may read them.
    cuda::sync(c.stream)?;
    let mut mine = match prepare(c, ctx, device, rank, n, st) {
        Ok(b) => b,
        Err(e) => {
            log::info(format_args!("rank {rank}: {} through host staging: {}", c.kind.c_name(), e.msg));
            let mut b = [0u8; BLOB];
            b[1..5].copy_from_slice(&std::process::id().to_le_bytes());
            b
        }
    };
    st.report_dead(&mut mine);
    let mut all = vec![0u8; BLOB * n];
    let ex = Coll::new(CollKind::AllGather, mine.as_ptr(), all.as_mut_ptr(), BLOB, DataType::Uint8);
    if let Some(e) = exchange(x, ex, call.seq)? {
        return Ok(Some(e));
    }
    for b in all.chunks(BLOB) {
        let pid = u32::from_le_bytes(b[1..5].try_into().expect("4 bytes"));
        if pid != std::process::id() {
            st.maps.forget(ctx, pid, b);
        }
    }
    if all.chunks(BLOB).any(|b| b[0] != 1) {
        // Somebody cannot: everyone stages this call.
        drop(guard);
        *x.seq += 1;
        let mut coll = c.clone();
        let st = staging::stage_in(&mut coll, c.placement, rank, n)?;
        x.algo = "staged (a rank cannot share this call's memory through IPC)";
        let res = exchange(x, coll, *x.seq)?;
        st.stage_out()?;
        return Ok(res);
    }
    let peers: Vec<(*const u8, *const u8)> =
        all.chunks(BLOB).map(|b| map_peer(b, ctx, st.maps)).collect::<Result<_>>()?;
    // SAFETY: every peer pointer is mapped in this context for its extent of this call
    // (validated on its rank), and held by that rank until the last barrier below.
    if let Some(e) = unsafe { move_data(x, c, &peers, rank, n, ctx, device)? } {
        return Ok(Some(e));
    }
    cuda::sync(c.stream)?;
    // Nobody may reuse its buffers while a peer still reads them.
    barrier(x)
}

/// The data movement of one call: this rank's receive buffer from the peers' buffers.
///
/// Device addresses are offset with `wrapping_add`: the host never dereferences them.
///
/// # Safety
/// `peers[q]` are rank q's (send, recv) mapped here, valid for q's extents.
unsafe fn move_data(
    x: &mut Exec<'_>,
    c: &Coll,
    peers: &[(*const u8, *const u8)],
    rank: usize,
    n: usize,
    ctx: usize,
    device: i32,
) -> Result<Option<Error>> {
    let es = c.dtype.size();
    let bytes = c.count * es;
    let s = c.stream;
    let copy = |dst: *mut u8, src: *const u8, len: usize| -> Result<()> {
        if std::ptr::eq(dst, src) || len == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie in mapped buffers of this call (caller).
        unsafe { cuda::copy_dtod_async(dst, src, len, s) }
    };
    let reduce = |out: *mut u8, ins: &[*const u8], elems: usize| -> Result<()> {
        let f = cuda_reduce::kernel(ctx, device, c.dtype, c.op)?;
        // SAFETY: as above; the kernel reads each element before writing it, so an
        // output equal to one input (in place) is fine.
        unsafe { cuda_reduce::launch(f, out, ins, elems, s) }
    };
    let sends = |off: usize| -> Vec<*const u8> { peers.iter().map(|(p, _)| p.wrapping_add(off)).collect() };
    match c.kind {
        CollKind::AllReduce => {
            // This rank's share of every input into its own recv; no rank reads another's
            // share of a recv buffer in this phase, so in place is safe.
            let share = |q: usize| (c.count * q / n, c.count * (q + 1) / n);
            let (lo, hi) = share(rank);
            reduce(c.recv.wrapping_add(lo * es), &sends(lo * es), hi - lo)?;
            cuda::sync(s)?;
            if let Some(e) = barrier(x)? {
                return Ok(Some(e));
            }
            for (q, &(_, peer_recv)) in peers.iter().enumerate() {
                let (lo, hi) = share(q);
                if q != rank {
                    copy(c.recv.wrapping_add(lo * es), peer_recv.wrapping_add(lo * es), (hi - lo) * es)?;
                }
            }
            x.algo = "reduce-scatter + all-gather through IPC mappings";
        }
        CollKind::ReduceScatter => {
            reduce(c.recv, &sends(rank * bytes), c.count)?;
            x.algo = "reduce through IPC mappings";
        }
        CollKind::Reduce => {
            if rank == c.root {
                reduce(c.recv, &sends(0), c.count)?;
            }
            x.algo = "reduce at the root through IPC mappings";
        }
        CollKind::AllGather => {
            for (q, &(peer_send, _)) in peers.iter().enumerate() {
                copy(c.recv.wrapping_add(q * bytes), peer_send, bytes)?;
            }
            x.algo = "copies through IPC mappings";
        }
        CollKind::Broadcast => {
            copy(c.recv, peers[c.root].0, bytes)?;
            x.algo = "copy from the root through IPC mappings";
        }
        CollKind::Gather => {
            if rank == c.root {
                for (q, &(peer_send, _)) in peers.iter().enumerate() {
                    copy(c.recv.wrapping_add(q * bytes), peer_send, bytes)?;
                }
            }
            x.algo = "copies to the root through IPC mappings";
        }
        CollKind::Scatter => {
            copy(c.recv, peers[c.root].0.wrapping_add(rank * bytes), bytes)?;
            x.algo = "copy from the root through IPC mappings";
        }
        CollKind::AlltoAll => {
            for (q, &(peer_send, _)) in peers.iter().enumerate() {
                copy(c.recv.wrapping_add(q * bytes), peer_send.wrapping_add(rank * bytes), bytes)?;
            }
            x.algo = "copies through IPC mappings";
        }
        k => return Err(Error::internal(format!("{} on the IPC path", k.c_name()))),
    }
    Ok(None)
}
