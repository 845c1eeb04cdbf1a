//! The announcement: every collective of ranks that all share one host first
//! announces itself on the bulletin board (`transport::board`), and small ones carry
//! their data in it.
//!
//! Every collective call first announces its fingerprint on the board, and every rank
//! compares every peer's there before it takes any data (one store and one read per
//! peer instead of a round of messages), whatever FERROCCL_CHECK says: ranks that
//! called different collectives, counts, types, ops or roots all fail the call with
//! the same verdict and nothing moves. The verdict is read before the peers' failure
//! flags, so a peer that published and then aborted does not hide it. A small call goes further: each rank publishes its whole contribution
//! in its slot and every rank reads what it needs straight from its peers' slots.
//! One copy in, one copy (or reduction) out, no message framing, no handshake: the
//! latency of a small collective is that of a cache line moving between cores.

use super::{engine, mapped, plan};
use crate::coll::{counts, fingerprint, Call, Coll, CollKind};
use crate::error::{Error, Result};
use crate::mem::{copy, reduce};
use crate::transport::board::{Board, Waiter, DATA_MAX};
use crate::transport::Transport;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Flag in a broadcast root's slot: the data goes over the links (the root's
/// sendbuff goes by address to every peer); the readers follow it there. The
/// root alone decides for broadcasts of `direct_min` bytes up to `by_links_min`
/// (`plan::Plan`).
const HANDOFF: u64 = 1;

/// What the announcement decided.
pub enum Announced {
    /// The call ran entirely on the board: its result.
    Done(Option<Error>),
    /// The call ran between the ranks' buffers (`mapped`): its result.
    Mapped(Option<Error>),
    /// Fingerprints agree (or are not checked): run the calls on the links. With
    /// per-rank counts compared on the board, their verdicts: (seq, error) per call.
    OnLinks(Option<Vec<(u64, Option<Error>)>>),
}

/// Bytes every rank agrees the call would publish at most (same on every rank), or
/// None if the call does not run on the board.
fn board_bytes(co: &Coll, n: usize) -> Option<usize> {
    if co.wire.is_some_and(|w| w != co.dtype) || co.strided.is_some() || co.v.is_some() || co.keep.is_some() {
        return None;
    }
    let b = co.count.checked_mul(co.dtype.size())?;
    let need = match co.kind {
        // A contribution of `by_links_min` bytes can go by address on the links, for
        // the peers to read it in place (one copy), rather than through a slot (two
        // copies). Smaller broadcasts go there too when the root decides so (see HANDOFF).
        CollKind::AllGather | CollKind::Gather | CollKind::Broadcast if b >= plan::get().by_links_min => return None,
        CollKind::AllReduce | CollKind::Reduce | CollKind::AllGather | CollKind::Gather | CollKind::Broadcast => b,
        CollKind::ReduceScatter | CollKind::AlltoAll | CollKind::Scatter => b.checked_mul(n)?,
        CollKind::Barrier => 0,
        _ => return None,
    };
    (need <= DATA_MAX).then_some(need)
}

/// Announces `calls` (which include a collective) on the board; runs a single small
/// collective there completely.
pub fn run(
    t: &mut Transport,
    calls: &[Call],
    timeout: Duration,
    abort: &AtomicBool,
    what: &dyn Fn() -> String,
) -> Result<Announced> {
    if mapped::may_take(calls, t.nranks) {
        if let Some(mine) = mapped::prepare(t, calls) {
            return run_mapped(t, calls, &mine, timeout, abort, what);
        }
    }
    let handoff = root_hands_off(t, calls);
    let (board, checks) = t.board_with_checks().expect("caller checked");
    let mut checker = |full: bool| if full { checks.alive() } else { checks.flags() };
    let mut w = Waiter::new(timeout, abort, &mut checker, what);
    on_board(board, &mut w, calls, handoff)
}

/// A call that may run between the ranks' buffers (`mapped`): announced with this
/// rank's record beside the fingerprint; when every rank agrees, run there, else
/// on the links. Apart from `run`'s own path, which small calls take and which
/// these steps folded in would slow.
#[inline(never)]
fn run_mapped(
    t: &mut Transport,
    calls: &[Call],
    mine: &mapped::Mine,
    timeout: Duration,
    abort: &AtomicBool,
    what: &dyn Fn() -> String,
) -> Result<Announced> {
    let (b, checks) = t.board_with_checks().expect("caller checked");
    let mut checker = |full: bool| if full { checks.alive() } else { checks.flags() };
    let mut w = Waiter::new(timeout, abort, &mut checker, what);
    let (me, n) = (b.rank, b.nranks());
    let s = b.begin(&mut w)?;
    let digest = fingerprint::message_into(calls, b.my_fp(s));
    b.set_data(s, &mine.record(n, s));
    b.publish(s, digest);
    for p in (0..n).filter(|&p| p != me) {
        b.wait_for(&mut w, p, s)?;
    }
    if let Some(e) = all_agree(b, s, digest) {
        return Ok(Announced::Done(Some(e)));
    }
    w.check_flags(b)?;
    match mapped::agree(b, s, mine) {
        Some(agreed) => Ok(Announced::Mapped(mapped::run(t, mine, agreed, timeout, abort, what)?)),
        // Fingerprints were compared (or are not checked): the links move the data.
        None => Ok(Announced::OnLinks(None)),
    }
}

/// Whether `co` is a broadcast of a size that its root may hand to the links (see
/// HANDOFF).
fn handoff_range(co: &Coll) -> bool {
    let plan = plan::get();
    co.kind == CollKind::Broadcast && (plan.direct_min..plan.by_links_min).contains(&(co.count * co.dtype.size()))
}

/// Whether `calls` are such a broadcast, this rank is its root, and it hands the
/// call to the links: its sendbuff goes by address to every peer.
fn root_hands_off(t: &mut Transport, calls: &[Call]) -> bool {
    let [c] = calls else { return false };
    let co = &c.coll;
    if !handoff_range(co) || board_bytes(co, t.nranks).is_none() || co.root != t.rank {
        return false;
    }
    engine::goes_direct_to_all(t, co.send, co.count * co.dtype.size())
}

fn on_board(b: &mut Board, w: &mut Waiter<'_>, calls: &[Call], handoff: bool) -> Result<Announced> {
    let (me, n) = (b.rank, b.nranks());
    // Peers' failure flags are checked once their slots are read (below), and by
    // every wait that does not end at once.
    let s = b.begin(w)?;
    let digest = fingerprint::message_into(calls, b.my_fp(s));
    if let [c] = calls {
        if c.coll.kind == CollKind::AlltoAllv && counts_fit(n, 1) {
            return alltoallv(b, w, c, s, digest);
        }
    }
    let fast = match calls {
        [c] if !c.coll.is_noop() || c.coll.kind == CollKind::Barrier => board_bytes(&c.coll, n).map(|b| (&c.coll, b)),
        _ => None,
    };
    let Some((co, agreed)) = fast else {
        // Per-rank counts go on the board with the fingerprint, when they fit.
        let nv = calls.iter().filter(|c| is_v(c.coll.kind)).count();
        let counted = nv > 0 && counts_fit(n, nv);
        if counted {
            write_counts(b.my_data(s), calls, n);
        }
        b.publish(s, digest);
        for p in (0..n).filter(|&p| p != me) {
            b.wait_for(w, p, s)?;
        }
        if let Some(e) = all_agree(b, s, digest) {
            return Ok(Announced::Done(Some(e)));
        }
        w.check_flags(b)?;
        if counted {
            return Ok(Announced::OnLinks(Some(counts_verdicts(b, s, calls))));
        }
        // A call of count 0 is complete once announced.
        let noop = calls.iter().all(|c| c.coll.is_noop());
        return Ok(if noop { Announced::Done(None) } else { Announced::OnLinks(None) });
    };

    let es = co.dtype.size();
    let bytes = co.count * es;
    let root = co.root;
    b.set_inline(agreed);
    let range = handoff_range(co);
    // 1. Publish this rank's contribution.
    let publish = match co.kind {
        _ if handoff => 0,
        CollKind::AllReduce | CollKind::Reduce | CollKind::AllGather | CollKind::Gather => bytes,
        CollKind::Broadcast if me == root => bytes,
        CollKind::ReduceScatter | CollKind::AlltoAll => bytes * n,
        CollKind::Scatter if me == root => bytes * n,
        _ => 0,
    };
    if publish >= plan::get().board_stores_min {
        // Large contributions go as ring pieces do (`copy::StoreChoice`): streamed
        // while the CPUs sit on different dies.
        let (dst, streaming) = (b.my_data(s), b.stores.choose());
        // SAFETY: sendbuff holds `publish` bytes (validated) and the slot DATA_MAX >= publish.
        unsafe { b.stores.copy(dst, co.send, publish, streaming) };
    } else if publish > 0 {
        // SAFETY: as above.
        unsafe { copy::copy(b.my_data(s), co.send, publish) };
    }
    if range && me == root {
        b.set_flags(s, if handoff { HANDOFF } else { 0 });
    }
    b.publish(s, digest);

    // 2. Wait for every rank's announcement, even where its data is not needed here (a
    // broadcast's readers, a reduce's senders): every rank must see a mismatch in the
    // call that made it. That costs a broadcast root about one cache-line round trip
    // per call; deferring the check to the next call would let the call return success.
    for p in (0..n).filter(|&p| p != me) {
        b.wait_for(w, p, s)?;
    }
    if let Some(e) = all_agree(b, s, digest) {
        return Ok(Announced::Done(Some(e)));
    }
    w.check_flags(b)?;
    if range && b.flags(root, s) == HANDOFF {
        // Fingerprints were compared (or are not checked): the links move the data.
        return Ok(Announced::OnLinks(None));
    }

    // 3. Take what this rank receives.
    let recv = co.recv;
    let copy_in = |src: &[u8], dst: *mut u8| {
        if !std::ptr::eq(src.as_ptr(), dst) {
            // SAFETY: dst is a validated part of recvbuff, src a published slot: disjoint.
            unsafe { copy::copy(dst, src.as_ptr(), src.len()) };
        }
    };
    match co.kind {
        CollKind::AllReduce => reduce_ranks(b, s, co, 0, bytes, recv),
        CollKind::Reduce if me == root => reduce_ranks(b, s, co, 0, bytes, recv),
        CollKind::ReduceScatter => reduce_ranks(b, s, co, me * bytes, bytes, recv),
        CollKind::Broadcast if me == root && !std::ptr::eq(co.send, recv) => copy_in(b.data(me, s, bytes), recv),
        CollKind::Broadcast if me == root => {}
        CollKind::Broadcast => copy_in(b.data(root, s, bytes), recv),
        CollKind::AllGather => (0..n).for_each(|p| {
            // SAFETY: recvbuff holds n*bytes (validated); in place, my block is already there.
            let dst = unsafe { recv.add(p * bytes) };
            if !(p == me && std::ptr::eq(co.send, dst)) {
                copy_in(b.data(p, s, bytes), dst)
            }
        }),
        CollKind::Gather if me == root => (0..n).for_each(|p| {
            // SAFETY: as for all_gather.
            let dst = unsafe { recv.add(p * bytes) };
            if !(p == me && std::ptr::eq(co.send, dst)) {
                copy_in(b.data(p, s, bytes), dst)
            }
        }),
        CollKind::AlltoAll => (0..n).for_each(|p| {
            // SAFETY: recvbuff holds n*bytes; the sources are the published copies.
            copy_in(&b.data(p, s, n * bytes)[me * bytes..(me + 1) * bytes], unsafe { recv.add(p * bytes) })
        }),
        CollKind::Scatter => {
            // SAFETY: in place, recvbuff is sendbuff + root*bytes: nothing to copy.
            let in_place = me == root && std::ptr::eq(unsafe { co.send.add(me * bytes) }, recv);
            if !in_place {
                copy_in(&b.data(root, s, n * bytes)[me * bytes..(me + 1) * bytes], recv)
            }
        }
        _ => {}
    }
    Ok(Announced::Done(None))
}

/// Compares every rank's fingerprint of call `s` (all published) with this rank's:
/// the digests first (one cache line per peer, which the wait brought already), the
/// whole fingerprints only when one differs.
fn all_agree(b: &Board, s: u64, digest: u64) -> Option<Error> {
    let me = b.rank;
    if (0..b.nranks()).all(|p| p == me || b.digest(p, s) == digest) {
        return None;
    }
    fingerprint::verdict(me, b.nranks(), b.fp(me, s), |p| b.fp(p, s))
}

/// recv[..len] = the ranks' published bytes [off, off+len) reduced in rank order, so
/// that every rank gets the same bits (and the same as the link algorithms, which
/// also reduce floating-point sums in rank order).
fn reduce_ranks(b: &Board, s: u64, co: &Coll, off: usize, len: usize, recv: *mut u8) {
    let n = b.nranks();
    let (dtype, op) = (co.dtype, co.op);
    // SAFETY: recvbuff holds len bytes (validated) and never overlaps a slot.
    let dst = unsafe { std::slice::from_raw_parts_mut(recv, len) };
    let slot = |p: usize| &b.data(p, s, off + len)[off..];
    if dtype.is_narrow_float() {
        let mut acc = vec![0u8; len / dtype.size() * dtype.acc_size()];
        reduce::acc_init2(dtype, op, &mut acc, slot(0), slot(1));
        for p in 2..n {
            reduce::acc_reduce(dtype, op, &mut acc, slot(p));
        }
        reduce::acc_finish(dtype, op, n, &acc, dst);
    } else {
        debug_assert_eq!(dtype.acc_size(), dtype.size());
        reduce::acc_init2(dtype, op, dst, slot(0), slot(1));
        for p in 2..n {
            reduce::acc_reduce(dtype, op, dst, slot(p));
        }
        reduce::finish_inplace(dtype, op, n, dst);
    }
}

// Per-rank counts on the board. A rank's data area starts with a flag (1 when its
// all_to_allv data follows), then, for each call with per-rank counts in order and
// each peer p, the pair (what I send p, what I expect from p) as u64 (see
// `counts::pair_values`); the data starts at the next 64-byte boundary. Every
// rank reads every table, so each one reaches the same verdict without a second
// round: a mismatch fails the call on every rank, before any data moves.

fn is_v(k: CollKind) -> bool {
    matches!(k, CollKind::AlltoAllv | CollKind::AllGatherV | CollKind::ReduceScatterV)
}

/// Bytes of the flag and the count tables of `nv` calls, rounded to 64.
fn counts_bytes(n: usize, nv: usize) -> usize {
    (8 + nv * n * 16).next_multiple_of(64)
}

fn counts_fit(n: usize, nv: usize) -> bool {
    counts_bytes(n, nv) <= DATA_MAX
}

/// Writes the flag (0) and this rank's count tables of the v-calls among `calls`.
fn write_counts(d: *mut u8, calls: &[Call], n: usize) {
    let words = (counts_bytes(n, calls.iter().filter(|c| is_v(c.coll.kind)).count())) / 8;
    // SAFETY: the caller checked counts_fit, so the tables lie inside our slot's data
    // area (DATA_MAX bytes, 64-byte aligned), which is ours until we publish.
    let w = unsafe { std::slice::from_raw_parts_mut(d as *mut u64, words) };
    w[0] = 0;
    let mut i = 1;
    for c in calls.iter().filter(|c| is_v(c.coll.kind)) {
        for p in 0..n {
            let (a, b) = counts::pair_values(&c.coll, p);
            w[i] = a.to_le();
            w[i + 1] = b.to_le();
            i += 2;
        }
    }
}

/// Rank `r`'s pair for peer `p` in its table of v-call `vi` of call `s`.
fn pair(b: &Board, s: u64, r: usize, vi: usize, p: usize) -> (u64, u64) {
    let n = b.nranks();
    let at = 8 + (vi * n + p) * 16;
    let d = &b.data(r, s, at + 16)[at..];
    (u64::from_le_bytes(d[..8].try_into().unwrap()), u64::from_le_bytes(d[8..16].try_into().unwrap()))
}

/// The verdict on every v-call among `calls` from the published tables (every peer
/// published call `s`).
fn counts_verdicts(b: &Board, s: u64, calls: &[Call]) -> Vec<(u64, Option<Error>)> {
    calls
        .iter()
        .filter(|c| is_v(c.coll.kind))
        .enumerate()
        .map(|(vi, c)| (c.seq, counts_verdict(b, s, vi, &c.coll)))
        .collect()
}

/// The verdict on `co`, v-call `vi` of call `s`, from the published tables.
fn counts_verdict(b: &Board, s: u64, vi: usize, co: &Coll) -> Option<Error> {
    let n = b.nranks();
    if (0..n).all(|r| (r..n).all(|p| pairs_agree(b, s, vi, r, p))) {
        return None;
    }
    counts_disagree(b, s, vi, co)
}

/// Whether ranks r and p (r == p included) agree in v-call `vi` of call `s`: what r
/// says it sends p is what p expects from r, and the other way round.
fn pairs_agree(b: &Board, s: u64, vi: usize, r: usize, p: usize) -> bool {
    let ((sends, expects), (theirs_sends, theirs_expects)) = (pair(b, s, r, vi, p), pair(b, s, p, vi, r));
    sends == theirs_expects && expects == theirs_sends
}

/// The error of a v-call whose tables disagree somewhere: this rank's own finding,
/// or the ranks that found one.
#[cold]
fn counts_disagree(b: &Board, s: u64, vi: usize, co: &Coll) -> Option<Error> {
    let (me, n) = (b.rank, b.nranks());
    let at = |r: usize, p: usize| pair(b, s, r, vi, p);
    let found = (0..n)
        .filter(|&p| p != me)
        .find_map(|p| counts::describe_pair(co, me, p, at(me, p), at(p, me)))
        .or_else(|| counts::describe_self(co, me, at(me, me)));
    let reporters: Vec<usize> = (0..n)
        .filter(|&r| {
            counts::describe_self(co, r, at(r, r)).is_some() || (0..n).any(|p| p != r && !pairs_agree(b, s, vi, r, p))
        })
        .collect();
    counts::counts_error(found, &reporters)
}

/// A single all_to_allv on the board: every rank publishes its counts and, when they
/// fit, all the data it sends; each reads its blocks straight from the peers' slots.
/// When some rank's data does not fit, the counts are still agreed here and the
/// data goes over the links.
fn alltoallv(b: &mut Board, w: &mut Waiter<'_>, c: &Call, s: u64, digest: u64) -> Result<Announced> {
    let (me, n) = (b.rank, b.nranks());
    let co = &c.coll;
    let v = co.v.as_ref().ok_or_else(|| Error::internal("all_to_allv without counts"))?;
    let es = co.dtype.size();
    let head = counts_bytes(n, 1);
    let total = v.sendcounts().iter().try_fold(0usize, |a, &k| a.checked_add(k.checked_mul(es)?));
    let included = total.is_some_and(|t| t <= DATA_MAX - head);
    let d = b.my_data(s);
    write_counts(d, std::slice::from_ref(c), n);
    if included {
        let mut off = head;
        for p in 0..n {
            let len = v.sendcounts()[p] * es;
            // SAFETY: sendbuff holds sendcounts[p] elements at sdispls[p] (validated);
            // the slot holds head + total <= DATA_MAX bytes.
            unsafe { copy::copy(d.add(off), co.send.add(v.sdispls()[p] * es), len) };
            off += len;
        }
        // SAFETY: the flag word at the start of our data area (write_counts set it to 0).
        unsafe { (d as *mut u64).write(1u64.to_le()) };
    }
    b.publish(s, digest);
    for p in (0..n).filter(|&p| p != me) {
        b.wait_for(w, p, s)?;
    }
    if let Some(e) = all_agree(b, s, digest) {
        return Ok(Announced::Done(Some(e)));
    }
    if let Some(e) = counts_verdict(b, s, 0, co) {
        return Ok(Announced::Done(Some(e)));
    }
    w.check_flags(b)?;
    let has_data = |r: usize| u64::from_le_bytes(b.data(r, s, 8).try_into().unwrap()) == 1;
    if !(0..n).all(has_data) {
        return Ok(Announced::OnLinks(Some(vec![(c.seq, None)])));
    }
    for p in 0..n {
        // p's block for me follows its blocks for ranks 0..me.
        let skip: usize = (0..me).map(|q| pair(b, s, p, 0, q).0 as usize * es).sum();
        let len = v.recvcounts()[p] * es;
        let src = &b.data(p, s, head + skip + len)[head + skip..];
        // SAFETY: recvbuff holds recvcounts[p] elements at rdispls[p] (validated); the
        // slots are shared memory, disjoint from it.
        unsafe { copy::copy(co.recv.add(v.rdispls()[p] * es), src.as_ptr(), len) };
    }
    Ok(Announced::Done(None))
}
