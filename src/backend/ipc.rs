//! all_reduce of device memory among ranks that share one GPU (the built-in
//! backend's case NCCL refuses), without host staging: peers' buffers are mapped
//! through CUDA IPC, each rank reduces its share with an NVRTC kernel
//! (reduce-scatter), then copies the other shares from their owners (all-gather).
//!
//! Host messages only order the phases (they carry the IPC handles and act as
//! barriers); the data stays on the GPU. Every rank decides to take this path from
//! the same facts (communicator on one GPU, the call, FERROCCL_CUDA_IPC), and a rank
//! that cannot (memory IPC cannot share, no NVRTC) says so in the first exchange:
//! then all ranks stage the call through host memory instead.

use super::host::{self, Call};
use super::{staging, Backend, Exec};
use crate::coll::{Coll, CollKind};
use crate::error::{Error, Result};
use crate::log;
use crate::mem::{cuda, cuda_reduce, Placement};
use crate::types::DataType;

/// What one rank shares: can it take part, and its two buffers.
const BLOB: usize = 1 + 4 + 2 * (64 + 8 + 8);

/// Is FERROCCL_CUDA_IPC on (read once).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::env::CUDA_IPC.get_or_default().trim() == "1")
}

/// True when this call takes the IPC path on a communicator whose ranks share one GPU.
pub fn eligible(c: &Coll, nranks: usize) -> bool {
    c.kind == CollKind::AllReduce
        && matches!(c.placement, Placement::Device { .. })
        && c.wire.is_none()
        && c.strided.is_none()
        && !c.is_noop()
        && cuda_reduce::supported(c.dtype)
        && (2..=cuda_reduce::MAX_INPUTS).contains(&nranks)
}

/// The IPC path as a router entry: single all_reduces of device memory on a
/// communicator whose ranks all share one GPU, when FERROCCL_CUDA_IPC=1.
pub struct Ipc {
    pub rank: usize,
    pub nranks: usize,
}

impl Backend for Ipc {
    fn id(&self) -> &'static str {
        "ipc"
    }

    fn accepts(&self, c: &Coll, alone: bool) -> bool {
        alone && eligible(c, self.nranks)
    }

    fn run(&self, x: &mut Exec<'_>, calls: &[Call]) -> Result<Option<Error>> {
        let [call] = calls else { return Err(Error::internal("the IPC path runs one call at a time")) };
        x.algo = "reduce-scatter + all-gather through IPC mappings";
        all_reduce(x, call, self.rank, self.nranks)
    }
}

/// Runs a host-memory call of this path's own (handles, barriers) with the next
/// sequence number.
fn exchange(x: &mut Exec<'_>, coll: Coll, seq: u64) -> Result<Option<Error>> {
    let algo = x.algo;
    let r = host::execute(x, &[Call { coll, seq }]);
    x.algo = algo;
    r
}

fn prepare(c: &Coll, ctx: usize, device: i32) -> Result<[u8; BLOB]> {
    // Compiled now, so a rank without NVRTC says so in the exchange.
    cuda_reduce::kernel(ctx, device, c.dtype, c.op)?;
    let (sh, so) = cuda::ipc_handle(c.send)?;
    let (rh, ro) = cuda::ipc_handle(c.recv)?;
    let mut b = [0u8; BLOB];
    b[0] = 1;
    b[1..5].copy_from_slice(&std::process::id().to_le_bytes());
    let mut at = 5;
    for (h, off, p) in [(sh, so, c.send as u64), (rh, ro, c.recv as u64)] {
        b[at..at + 64].copy_from_slice(&h);
        b[at + 64..at + 72].copy_from_slice(&(off as u64).to_le_bytes());
        b[at + 72..at + 80].copy_from_slice(&p.to_le_bytes());
        at += 80;
    }
    Ok(b)
}

/// A peer's (send, recv) pointers, usable in this process's context `ctx`.
fn map_peer(b: &[u8], ctx: usize) -> Result<(*const u8, *mut u8)> {
    let pid = u32::from_le_bytes(b[1..5].try_into().unwrap());
    let mut out = [0usize; 2];
    for (i, o) in out.iter_mut().enumerate() {
        let at = 5 + i * 80;
        let off = u64::from_le_bytes(b[at + 64..at + 72].try_into().unwrap()) as usize;
        let ptr = u64::from_le_bytes(b[at + 72..at + 80].try_into().unwrap()) as usize;
        *o = if pid == std::process::id() {
            // A thread rank of this process: its pointer is valid here as it is.
            ptr
        } else {
            let h: [u8; 64] = b[at..at + 64].try_into().unwrap();
            cuda::ipc_open(ctx, &h)? + off
        };
    }
    Ok((out[0] as *const u8, out[1] as *mut u8))
}

/// Runs one eligible all_reduce (`call`'s sequence number and the next two are used).
fn all_reduce(x: &mut Exec<'_>, call: &Call, rank: usize, n: usize) -> Result<Option<Error>> {
    let c = &call.coll;
    let Placement::Device { device, ctx } = c.placement else {
        return Err(Error::internal("IPC all_reduce on host memory"));
    };
    let guard = cuda::CtxGuard::enter(ctx)?;
    // Inputs complete before peers may read them.
    cuda::sync(c.stream)?;
    let mine = match prepare(c, ctx, device) {
        Ok(b) => b,
        Err(e) => {
            log::info(format_args!("rank {rank}: device all_reduce through host staging: {}", e.msg));
            [0u8; BLOB]
        }
    };
    let mut all = vec![0u8; BLOB * n];
    let ex = Coll::new(CollKind::AllGather, mine.as_ptr(), all.as_mut_ptr(), BLOB, DataType::Uint8);
    if let Some(e) = exchange(x, ex, call.seq)? {
        return Ok(Some(e));
    }
    *x.seq += 1;
    if all.chunks(BLOB).any(|b| b[0] != 1) {
        // Somebody cannot: everyone stages this call.
        drop(guard);
        let mut coll = c.clone();
        let st = staging::stage_in(&mut coll, c.placement, rank, n)?;
        x.algo = "staged (a rank cannot map device memory through IPC)";
        let res = exchange(x, coll, *x.seq)?;
        st.stage_out()?;
        return Ok(res);
    }
    let peers: Vec<(*const u8, *mut u8)> = all.chunks(BLOB).map(|b| map_peer(b, ctx)).collect::<Result<_>>()?;
    let es = c.dtype.size();
    let share = |q: usize| (c.count * q / n, c.count * (q + 1) / n);

    // Reduce-scatter: this rank's share of every input into its own recv. No rank
    // reads another's share of a recv buffer in this phase, so in-place is safe.
    let (lo, hi) = share(rank);
    let f = cuda_reduce::kernel(ctx, device, c.dtype, c.op)?;
    // SAFETY: inputs are every rank's send buffer (count elements, mapped above),
    // offset to this share; the output is this rank's recv buffer at the same offset.
    unsafe {
        let ins: Vec<*const u8> = peers.iter().map(|(s, _)| s.add(lo * es)).collect();
        cuda_reduce::launch(f, c.recv.add(lo * es), &ins, hi - lo, c.stream)?;
    }
    cuda::sync(c.stream)?;
    let barrier = || Coll::new(CollKind::Barrier, std::ptr::null(), std::ptr::null_mut(), 0, DataType::Uint8);
    if let Some(e) = exchange(x, barrier(), *x.seq)? {
        return Ok(Some(e));
    }
    *x.seq += 1;

    // All-gather: every other share from the rank that reduced it.
    for (q, &(_, peer_recv)) in peers.iter().enumerate() {
        let (lo, hi) = share(q);
        if q == rank || hi == lo {
            continue;
        }
        // SAFETY: peer q's recv buffer holds its reduced share [lo, hi) (barrier above);
        // ours has room for count elements.
        unsafe { cuda::copy_dtod_async(c.recv.add(lo * es), peer_recv.add(lo * es), (hi - lo) * es, c.stream)? };
    }
    cuda::sync(c.stream)?;
    // Nobody may reuse its buffers while a peer still reads them.
    exchange(x, barrier(), *x.seq)
}
