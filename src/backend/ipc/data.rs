//! The data movement of one call on the executor's stream: copies between the ranks'
//! mapped buffers and the reduction kernel, in one pass per call.

use super::super::Exec;
use super::mps;
use crate::backend::host::algo;
use crate::coll::{Coll, CollKind, VCounts};
use crate::error::{Error, Result};
use crate::mem::{cuda, cuda_reduce};

/// The whole call's data movement, enqueued on the executor's stream: every rank's
/// receive buffer from every rank's buffers; or, with `share` (MPS), that rank's share
/// of it. `counts[r]`: rank r's per-rank counts (calls that have them). Device
/// addresses are offset with `wrapping_add`: the host never dereferences them. Every
/// copy and reduction is a kernel that does nothing once the word at device address
/// `failed` (the control region's, 0: none) is set: work queued behind a failed
/// communicator ends at once and reads nothing of a dead peer's.
///
/// # Safety
/// `peers[q]` are rank q's (send, recv) mapped in `ctx`, valid for q's extents until
/// the stream has run the work; `failed` is 0 or a word readable on the device as long.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn move_data(
    x: &mut Exec<'_>,
    c: &Coll,
    peers: &[(*const u8, *const u8)],
    counts: &[VCounts],
    ctx: cuda::Ctx,
    device: i32,
    share: Option<usize>,
    failed: u64,
) -> Result<()> {
    let n = peers.len();
    let es = c.dtype.size();
    let bytes = c.count * es;
    let s = c.stream;
    let copiers = cuda_reduce::copiers(ctx, device)?;
    // An all_to_all in place overwrites blocks that peers still read: the sends of the
    // ranks in place are copied to scratch on this stream first and read there. Under
    // MPS rank 0 moves the whole call (the others have no share of it).
    let in_place = in_place_sends(c, peers, counts)?;
    if !in_place.is_empty() {
        if share.is_some_and(|me| me != 0) {
            x.algo = "mps-idle";
            return Ok(());
        }
        let total: usize = in_place.iter().map(|&(_, len)| len).sum();
        let scratch = cuda::Scratch::new(total, ctx, s)?;
        let mut moved = peers.to_vec();
        let mut at = 0;
        for &(q, len) in &in_place {
            let dst = scratch.ptr().wrapping_add(at);
            // SAFETY: rank q's send extent is mapped (caller); the scratch holds `total` bytes.
            unsafe { copiers.copy(dst, peers[q].0, len, failed, s)? };
            moved[q].0 = dst;
            at += len;
        }
        // SAFETY: the scratch lives on the stream until its work is done (freed in its
        // order); the rest is the caller's contract.
        unsafe { move_data(x, c, &moved, counts, ctx, device, None, failed)? };
        x.algo = "exec-copy-scratch";
        return Ok(());
    }
    let recv = |q: usize| peers[q].1 as *mut u8;
    let send = |q: usize| peers[q].0;
    let copy = |dst: *mut u8, src: *const u8, len: usize| -> Result<()> {
        if std::ptr::eq(dst, src) || len == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie in mapped buffers of this call (caller).
        unsafe { copiers.copy(dst, src, len, failed, s) }
    };
    // out = op over ins, in rank order (wire forms: the host's owner order), in one launch.
    let red = c.reduction();
    let win = c.wire.map_or(0, algo::wire_window_elems);
    let reduce = |out: *mut u8, ins: &[*const u8], elems: usize| -> Result<()> {
        let f = cuda_reduce::kernel(ctx, device, red)?;
        // SAFETY: as above; the kernel reads each element before writing it, so an
        // output equal to one input (in place) is fine.
        unsafe { cuda_reduce::launch(f, &red, out, ins, elems, win, failed, s) }
    };
    let sends_at =
        |off: &dyn Fn(usize) -> usize| -> Vec<*const u8> { (0..n).map(|p| send(p).wrapping_add(off(p))).collect() };
    // Rows of `width` bytes, `dpitch` and `spitch` apart (the axis forms).
    let copy2d = |dst: *mut u8, dpitch: usize, src: *const u8, spitch: usize, width: usize, rows: usize| {
        // SAFETY: every row lies in mapped buffers of this call (caller).
        unsafe { copiers.copy2d(dst, dpitch, src, spitch, width, rows, failed, s) }
    };
    // A reduce_scatter along an axis gives rank q block q of every row: the blocks of
    // every rank's input are packed side by side (2D copies), then reduced in one launch.
    let scratch = match c.strided {
        Some(_) if c.kind == CollKind::ReduceScatter => Some(cuda::Scratch::new(n * bytes.max(1), ctx, s)?),
        _ => None,
    };
    let reduce_strided = |q: usize| -> Result<()> {
        let (st, tmp) = (c.strided.expect("strided"), scratch.as_ref().expect("scratch").ptr());
        let w = st.block * es;
        for p in 0..n {
            copy2d(tmp.wrapping_add(p * bytes), w, send(p).wrapping_add(q * w), n * w, w, st.outer)?;
        }
        let ins: Vec<*const u8> = (0..n).map(|p| tmp.wrapping_add(p * bytes) as *const u8).collect();
        reduce(recv(q), &ins, c.count)
    };
    if let Some(me) = share {
        let m = mps::Movers { copy: &copy, copy2d: &copy2d, reduce: &reduce, reduce_strided: &reduce_strided };
        // SAFETY: forwarded contract.
        x.algo = unsafe { mps::share(c, me, peers, counts, &m)? };
        return Ok(());
    }
    x.algo = "exec-copy";
    match c.kind {
        CollKind::AllReduce => {
            // Into rank 0's recv (read in place before anything writes), then copied to
            // the others.
            reduce(recv(0), &sends_at(&|_| 0), c.count)?;
            for q in 1..n {
                copy(recv(q), recv(0), bytes)?;
            }
            x.algo = "exec-reduce-copy";
        }
        CollKind::ReduceScatter if c.strided.is_some() => {
            for q in 0..n {
                reduce_strided(q)?;
            }
            x.algo = "exec-copy2d-reduce";
        }
        CollKind::ReduceScatter => {
            for q in 0..n {
                reduce(recv(q), &sends_at(&|_| q * bytes), c.count)?;
            }
            x.algo = "exec-reduce";
        }
        CollKind::ReduceScatterV => {
            for q in 0..n {
                let elems = counts[q].recvcounts()[q];
                if elems > 0 {
                    reduce(recv(q), &sends_at(&|p| counts[p].sdispls()[q] * es), elems)?;
                }
            }
            x.algo = "exec-reduce";
        }
        CollKind::Reduce => {
            reduce(recv(c.root), &sends_at(&|_| 0), c.count)?;
            x.algo = "exec-reduce";
        }
        CollKind::AllGather if c.strided.is_some() => {
            // Rank p's block j lands at element (j * n + p) * block of every receive buffer.
            let st = c.strided.expect("checked");
            let w = st.block * es;
            for q in 0..n {
                for p in 0..n {
                    copy2d(recv(q).wrapping_add(p * w), n * w, send(p), w, w, st.outer)?;
                }
            }
            x.algo = "exec-copy2d";
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

/// The ranks of an all_to_all(v) whose send and receive extents overlap (in place), with
/// the bytes of their send extents.
fn in_place_sends(c: &Coll, peers: &[(*const u8, *const u8)], counts: &[VCounts]) -> Result<Vec<(usize, usize)>> {
    if !matches!(c.kind, CollKind::AlltoAll | CollKind::AlltoAllv) {
        return Ok(Vec::new());
    }
    let n = peers.len();
    let mut out = Vec::new();
    for (q, &(s, r)) in peers.iter().enumerate() {
        let (sb, rb) = match counts.get(q) {
            Some(v) => Coll { v: Some(v.clone()), ..c.clone() }.extents(q, n)?,
            None => c.extents(q, n)?,
        };
        let (s, r) = (s as usize, r as usize);
        if sb > 0 && rb > 0 && s < r + rb && r < s + sb {
            out.push((q, sb));
        }
    }
    Ok(out)
}
