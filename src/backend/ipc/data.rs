//! The data movement of one call on the executor's stream: copies between the ranks'
//! mapped buffers and the reduction kernel, in one pass per call.

use super::mps;
use crate::backend::host;
use crate::backend::Algo;
use crate::coll::{Coll, CollKind, VCounts};
use crate::error::{Error, Result};
use crate::mem::cuda;
use crate::mem::cuda_reduce::{self, Fan};
use std::cell::RefCell;

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
    algo: &mut Algo,
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
            *algo = Algo::MpsIdle;
            return Ok(());
        }
        // Every rank in place, each block where its reply goes: rank q's block p and rank
        // p's block q trade places, in one launch that reads and writes each byte once.
        if let Some(pairs) = swaps(c, peers, counts, in_place.len()) {
            // SAFETY: the blocks lie in the ranks' mapped buffers (caller) and are
            // disjoint (`swaps`).
            unsafe { copiers.swap_batch(&pairs, failed, s)? };
            *algo = Algo::ExecSwap;
            return Ok(());
        }
        let total: usize = in_place.iter().map(|&(_, len)| len).sum();
        let scratch = cuda::Scratch::new(total, ctx, s)?;
        let mut moved = peers.to_vec();
        let mut to_scratch = Vec::new();
        let mut at = 0;
        for &(q, len) in &in_place {
            let dst = scratch.ptr().wrapping_add(at);
            to_scratch.push(Fan { src: peers[q].0, len, dsts: vec![dst] });
            moved[q].0 = dst;
            at += len;
        }
        // SAFETY: the in-place ranks' send extents are mapped (caller); the scratch
        // holds `total` bytes.
        unsafe { copiers.copy_batch(&to_scratch, failed, s)? };
        // SAFETY: the scratch lives on the stream until its work is done (freed in its
        // order); the rest is the caller's contract.
        unsafe { move_data(algo, c, &moved, counts, ctx, device, None, failed)? };
        *algo = Algo::ExecCopyScratch;
        return Ok(());
    }
    let recv = |q: usize| peers[q].1 as *mut u8;
    let send = |q: usize| peers[q].0;
    // The call's plain copies, launched together at the end (one launch up to the
    // table's size): none of them reads what another writes.
    let fans = RefCell::new(Vec::<Fan>::new());
    let fan = |src: *const u8, len: usize, dsts: &mut dyn Iterator<Item = *mut u8>| {
        let dsts: Vec<*mut u8> = dsts.filter(|&d| !std::ptr::eq(d, src)).collect();
        if len > 0 && !dsts.is_empty() {
            fans.borrow_mut().push(Fan { src, len, dsts });
        }
    };
    let copy = |dst: *mut u8, src: *const u8, len: usize| -> Result<()> {
        fan(src, len, &mut std::iter::once(dst));
        Ok(())
    };
    // Each of `outs` = op over the n ranks' inputs, in rank order (wire forms: the host's
    // owner order), in one launch; in rows of `nout` outputs, row y reducing `elems[y]`
    // (or `elems[0]`) elements `y * step` on of `ins` (n of them) or of its own n inputs
    // `ins[y * n ..]`.
    let red = c.reduction();
    let win = c.wire.map_or(0, host::wire_window_elems);
    let reduce_rows = |outs: &[*mut u8], nout: usize, ins: &[*const u8], elems: &[usize], step: usize| -> Result<()> {
        // The kernel unrolled for this many inputs where there is one.
        let f = cuda_reduce::kernel_for(ctx, device, red, n)?;
        // SAFETY: as above; the kernel reads each element before writing it, so an
        // output equal to one input (in place) is fine.
        unsafe { cuda_reduce::launch(f, &red, outs, nout, ins, n, elems, step, win, failed, s) }
    };
    let reduce = |outs: &[*mut u8], ins: &[*const u8], elems: usize| reduce_rows(outs, outs.len(), ins, &[elems], 0);
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
        reduce(&[recv(q)], &ins, c.count)
    };
    let flush = || -> Result<()> {
        // SAFETY: every source and destination lies in mapped buffers of this call (caller).
        unsafe { copiers.copy_batch(&fans.take(), failed, s) }
    };
    if let Some(me) = share {
        let m =
            mps::Movers { copy: &copy, fan: &fan, copy2d: &copy2d, reduce: &reduce, reduce_strided: &reduce_strided };
        // SAFETY: forwarded contract.
        *algo = unsafe { mps::share(c, me, peers, counts, &m)? };
        return flush();
    }
    *algo = Algo::ExecCopy;
    let all_recv: Vec<*mut u8> = (0..n).map(recv).collect();
    match c.kind {
        CollKind::AllReduce => {
            // Every rank's recv written by the one pass that reads the inputs.
            reduce(&all_recv, &sends_at(&|_| 0), c.count)?;
            *algo = Algo::ExecReduce;
        }
        CollKind::ReduceScatter if c.strided.is_some() => {
            for q in 0..n {
                reduce_strided(q)?;
            }
            *algo = Algo::ExecCopy2dReduce;
        }
        CollKind::ReduceScatter => {
            // Row q: block q of every input into rank q's recv.
            reduce_rows(&all_recv, 1, &sends_at(&|_| 0), &[c.count], c.count)?;
            *algo = Algo::ExecReduce;
        }
        CollKind::ReduceScatterV => {
            // Row q: rank q's block of every input, each at its rank's displacement, into
            // rank q's recv, every row in one launch; rows of no elements are left out.
            let rows: Vec<usize> = (0..n).filter(|&q| counts[q].recvcounts()[q] > 0).collect();
            let outs: Vec<*mut u8> = rows.iter().map(|&q| recv(q)).collect();
            let ins: Vec<*const u8> = rows.iter().flat_map(|&q| sends_at(&|p| counts[p].sdispls()[q] * es)).collect();
            let elems: Vec<usize> = rows.iter().map(|&q| counts[q].recvcounts()[q]).collect();
            if !rows.is_empty() {
                reduce_rows(&outs, 1, &ins, &elems, 0)?;
            }
            *algo = Algo::ExecReduce;
        }
        CollKind::Reduce => {
            reduce(&[recv(c.root)], &sends_at(&|_| 0), c.count)?;
            *algo = Algo::ExecReduce;
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
            *algo = Algo::ExecCopy2d;
        }
        CollKind::AllGather => {
            for p in 0..n {
                fan(send(p), bytes, &mut (0..n).map(|q| recv(q).wrapping_add(p * bytes)));
            }
        }
        CollKind::AllGatherV => {
            for p in 0..n {
                let len = |q: usize| counts[q].recvcounts()[p] * es;
                if (0..n).all(|q| len(q) == len(0)) {
                    fan(send(p), len(0), &mut (0..n).map(|q| recv(q).wrapping_add(counts[q].rdispls()[p] * es)));
                } else {
                    for (q, v) in counts.iter().enumerate() {
                        copy(recv(q).wrapping_add(v.rdispls()[p] * es), send(p), len(q))?;
                    }
                }
            }
        }
        CollKind::Broadcast => fan(send(c.root), bytes, &mut (0..n).map(recv)),
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
    flush()
}

/// An all_to_all(v) that every one of the `n` ranks (`in_place` of them overlap) makes
/// in place with one layout for its sends and its receives (the same buffer, block p
/// at the same place and of the same length in both): the pairs of blocks to exchange,
/// rank q's block p with rank p's block q for q < p; its own block stays where it is.
/// None when the blocks of one rank overlap or the layouts differ (then the sends go
/// through scratch).
fn swaps(
    c: &Coll,
    peers: &[(*const u8, *const u8)],
    counts: &[VCounts],
    in_place: usize,
) -> Option<Vec<(*mut u8, *mut u8, usize)>> {
    let n = peers.len();
    if in_place != n || peers.iter().any(|&(s, r)| s != r) {
        return None;
    }
    let es = c.dtype.size();
    // Rank q's block p: (byte offset, bytes).
    let block = |q: usize, p: usize| -> Option<(usize, usize)> {
        match c.kind {
            CollKind::AlltoAll => Some((p * c.count * es, c.count * es)),
            _ => {
                let v = counts.get(q)?;
                let same = v.sdispls()[p] == v.rdispls()[p] && v.sendcounts()[p] == v.recvcounts()[p];
                same.then(|| (v.sdispls()[p] * es, v.sendcounts()[p] * es))
            }
        }
    };
    let mut pairs = Vec::new();
    for q in 0..n {
        let mut mine: Vec<(usize, usize)> = (0..n).map(|p| block(q, p)).collect::<Option<_>>()?;
        for p in q + 1..n {
            let ((qo, len), (po, theirs)) = (mine[p], block(p, q)?);
            if len != theirs {
                return None;
            }
            pairs.push((peers[q].1.wrapping_add(qo) as *mut u8, peers[p].1.wrapping_add(po) as *mut u8, len));
        }
        // The blocks of one buffer must not overlap: each byte is exchanged once.
        mine.retain(|&(_, len)| len > 0);
        mine.sort_unstable();
        if mine.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
            return None;
        }
    }
    Some(pairs)
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
