//! Ranks on one GPU under MPS (the Multi-Process Service: one server context runs every
//! client process's work, with no time-slicing between them). There every rank moves
//! its own share of each call at once, through the mappings of its peers' buffers, and
//! the streams order themselves with stream memory operations only: each rank's
//! `ready` (its inputs are ready), then its share, then its `fin`, and it waits for
//! every rank's `fin` before anything after the call runs.
//!
//! Shares: a rank fills its own receive buffer where that reads each byte once (pulling
//! from its peers' inputs: scatter, all_to_all(v), reduce_scatter(_v)); it pushes its
//! own block to every rank's buffer for all_gather(_v), and its slice of the root's
//! buffer for broadcast (each byte read once, written to every rank); it reduces its
//! slice of the elements into every rank's buffer for all_reduce (into the root's for
//! reduce), and pushes its input into the root's buffer for gather. No rank writes what
//! another reads in the same call, in place included.

use crate::backend::Algo;
use crate::coll::{Coll, CollKind, VCounts};
use crate::env;
use crate::error::{Error, Result};
use crate::mem::cuda;

/// Whether this rank runs under MPS: FERROCCL_CUDA_MPS=1 or 0 say so; auto asks the
/// driver about `device` (off where it cannot tell). With the reason, for logs.
pub fn local(device: i32) -> (bool, String) {
    match env::cuda_mps() {
        Some(true) => (true, format!("{}=1", env::CUDA_MPS.name)),
        Some(false) => (false, format!("{}=0", env::CUDA_MPS.name)),
        None => match cuda::mps_enabled(device) {
            Some(true) => (true, format!("device {device} runs under MPS")),
            Some(false) => (false, format!("device {device} does not run under MPS")),
            None => (false, "the driver cannot tell whether MPS runs (CU_DEVICE_ATTRIBUTE_MPS_ENABLED)".into()),
        },
    }
}

/// Elements `[lo, hi)` of `count` that rank `r` of `n` reduces: contiguous, balanced,
/// in whole units of `unit` elements (a wire all_reduce's windows, whose reduction
/// order depends on where an element lies in its window).
pub fn slice(count: usize, unit: usize, r: usize, n: usize) -> (usize, usize) {
    let units = count.div_ceil(unit.max(1));
    let at = |i: usize| ((units as u128 * i as u128 / n as u128) as usize).saturating_mul(unit.max(1)).min(count);
    (at(r), at(r + 1))
}

/// `reduce(outs, ins, elems)`: each of outs = op over ins, in rank order, in one pass.
pub type Reduce<'a> = dyn Fn(&[*mut u8], &[*const u8], usize) -> Result<()> + 'a;

/// How a share moves bytes: `copy(dst, src, len)`, `copy2d(dst, dpitch, src, spitch,
/// width, rows)` and `reduce(outs, ins, elems)`, all on the rank's stream (plain copies
/// may be gathered into one launch after the rest).
pub struct Movers<'a> {
    pub copy: &'a dyn Fn(*mut u8, *const u8, usize) -> Result<()>,
    /// `fan(src, len, dsts)`: `len` bytes read once at `src`, written to every one of `dsts`.
    pub fan: &'a dyn Fn(*const u8, usize, &mut dyn Iterator<Item = *mut u8>),
    pub copy2d: &'a dyn Fn(*mut u8, usize, *const u8, usize, usize, usize) -> Result<()>,
    pub reduce: &'a Reduce<'a>,
    /// Packs and reduces the blocks of a reduce_scatter along an axis for one rank.
    pub reduce_strided: &'a dyn Fn(usize) -> Result<()>,
}

/// Rank `me`'s share of `c`. `peers[q]`: rank q's (send, recv) in this process;
/// `counts[q]`: rank q's per-rank counts (calls that have them).
///
/// # Safety
/// As `move_data`: every pointer is valid for its rank's extents until the stream has
/// run the work.
pub unsafe fn share(
    c: &Coll,
    me: usize,
    peers: &[(*const u8, *const u8)],
    counts: &[VCounts],
    m: &Movers<'_>,
) -> Result<Algo> {
    let n = peers.len();
    let es = c.dtype.size();
    let bytes = c.count * es;
    let recv = |q: usize| peers[q].1 as *mut u8;
    let send = |q: usize| peers[q].0;
    let sends_at =
        |off: &dyn Fn(usize) -> usize| -> Vec<*const u8> { (0..n).map(|p| send(p).wrapping_add(off(p))).collect() };
    match c.kind {
        CollKind::AllReduce | CollKind::Reduce => {
            let unit = c.wire.map_or(1, crate::backend::host::wire_window_elems);
            let (lo, hi) = slice(c.count, unit, me, n);
            if hi > lo {
                let out = |q: usize| recv(q).wrapping_add(lo * es);
                let outs: Vec<*mut u8> =
                    if c.kind == CollKind::Reduce { vec![out(c.root)] } else { (0..n).map(out).collect() };
                (m.reduce)(&outs, &sends_at(&|_| lo * es), hi - lo)?;
            }
            return Ok(Algo::MpsSlices);
        }
        CollKind::ReduceScatter if c.strided.is_some() => (m.reduce_strided)(me)?,
        CollKind::ReduceScatter => (m.reduce)(&[recv(me)], &sends_at(&|_| me * bytes), c.count)?,
        CollKind::ReduceScatterV => {
            let elems = counts[me].recvcounts()[me];
            if elems > 0 {
                (m.reduce)(&[recv(me)], &sends_at(&|p| counts[p].sdispls()[me] * es), elems)?;
            }
        }
        CollKind::AllGather if c.strided.is_some() => {
            let st = c.strided.expect("checked");
            let w = st.block * es;
            for p in 0..n {
                (m.copy2d)(recv(me).wrapping_add(p * w), n * w, send(p), w, w, st.outer)?;
            }
        }
        // Each rank pushes its own block to every receive buffer: each block read once.
        CollKind::AllGather => (m.fan)(send(me), bytes, &mut (0..n).map(|q| recv(q).wrapping_add(me * bytes))),
        CollKind::AllGatherV => {
            let len = |q: usize| counts[q].recvcounts()[me] * es;
            let at = |q: usize| recv(q).wrapping_add(counts[q].rdispls()[me] * es);
            if (0..n).all(|q| len(q) == len(0)) {
                (m.fan)(send(me), len(0), &mut (0..n).map(at));
            } else {
                for q in 0..n {
                    (m.copy)(at(q), send(me), len(q))?;
                }
            }
        }
        // Each rank reads its slice of the root's buffer once and writes it to every rank.
        CollKind::Broadcast => {
            let (lo, hi) = slice(c.count, 1, me, n);
            let src = send(c.root).wrapping_add(lo * es);
            (m.fan)(src, (hi - lo) * es, &mut (0..n).map(|q| recv(q).wrapping_add(lo * es)));
        }
        CollKind::Gather => (m.copy)(recv(c.root).wrapping_add(me * bytes), send(me), bytes)?,
        CollKind::Scatter => (m.copy)(recv(me), send(c.root).wrapping_add(me * bytes), bytes)?,
        CollKind::AlltoAll => {
            for p in 0..n {
                (m.copy)(recv(me).wrapping_add(p * bytes), send(p).wrapping_add(me * bytes), bytes)?;
            }
        }
        CollKind::AlltoAllv => {
            let v = &counts[me];
            for (p, theirs) in counts.iter().enumerate() {
                let from = send(p).wrapping_add(theirs.sdispls()[me] * es);
                (m.copy)(recv(me).wrapping_add(v.rdispls()[p] * es), from, v.recvcounts()[p] * es)?;
            }
        }
        k => return Err(Error::internal(format!("{} shared out under MPS", k.c_name()))),
    }
    Ok(Algo::MpsShares)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_count_once_in_order() {
        for (count, unit, n) in
            [(0, 1, 3), (1, 1, 4), (10, 1, 3), (1001, 1, 4), (7, 1, 8), (1001, 100, 4), (50, 100, 3)]
        {
            let mut at = 0;
            for r in 0..n {
                let (lo, hi) = slice(count, unit, r, n);
                assert_eq!(lo, at, "count {count}, unit {unit}, {n} ranks, rank {r}");
                assert!(hi >= lo && hi - lo <= (count.div_ceil(unit) / n + 1) * unit);
                assert!(lo % unit == 0, "slices start on whole units");
                at = hi;
            }
            assert_eq!(at, count);
        }
        assert_eq!(slice(usize::MAX / 2, 1, 63, 64).1, usize::MAX / 2, "no overflow");
    }
}
