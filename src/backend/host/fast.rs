//! Collectives on the bulletin board (`transport::board`), for ranks that all share
//! one host.
//!
//! Every collective call first announces its fingerprint on the board; checkMode
//! compares them there (one store and one read per peer instead of a round of
//! messages). A small call goes further: each rank publishes its whole contribution
//! in its slot and every rank reads what it needs straight from its peers' slots.
//! One copy in, one copy (or reduction) out, no message framing, no handshake: the
//! latency of a small collective is that of a cache line moving between cores.

use super::fingerprint;
use super::Call;
use crate::coll::{Coll, CollKind};
use crate::error::{Error, Result};
use crate::mem::reduce;
use crate::transport::board::{Board, Waiter, DATA_MAX};
use crate::transport::Transport;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// What the board step decided.
pub enum Board1 {
    /// The call ran entirely on the board: its result.
    Done(Option<Error>),
    /// Fingerprints agree (or are not checked): run the calls on the links.
    Continue,
}

/// Bytes every rank agrees the call would publish at most (same on every rank), or
/// None if the call does not run on the board.
fn board_bytes(co: &Coll, n: usize) -> Option<usize> {
    if co.wire.is_some_and(|w| w != co.dtype) || co.strided.is_some() || co.v.is_some() || co.keep.is_some() {
        return None;
    }
    let b = co.count.checked_mul(co.dtype.size())?;
    let need = match co.kind {
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
    check: bool,
    what: &dyn Fn() -> String,
) -> Result<Board1> {
    let mut board = t.board.take().expect("caller checked");
    let res = {
        let t = &*t;
        let mut checker = |full: bool| if full { t.check_peers() } else { t.check_flags() };
        let mut w = Waiter::new(timeout, abort, &mut checker, what);
        on_board(&mut board, &mut w, calls, check)
    };
    t.board = Some(board);
    res
}

fn on_board(b: &mut Board, w: &mut Waiter<'_>, calls: &[Call], check: bool) -> Result<Board1> {
    let (me, n) = (b.rank, b.nranks());
    w.check_flags()?;
    let s = b.begin(w)?;
    fingerprint::message_into(calls, b.my_fp(s));
    let fast = match calls {
        [c] if !c.coll.is_noop() || c.coll.kind == CollKind::Barrier => board_bytes(&c.coll, n).map(|_| &c.coll),
        _ => None,
    };
    let Some(co) = fast else {
        b.publish(s);
        if check {
            for p in (0..n).filter(|&p| p != me) {
                b.wait_for(w, p, s)?;
            }
            w.check_flags()?;
            if let Some(e) = fingerprint::verdict(me, n, b.fp(me, s), |p| b.fp(p, s)) {
                return Ok(Board1::Done(Some(e)));
            }
        }
        // A call of count 0 is complete once announced.
        let noop = calls.iter().all(|c| c.coll.is_noop());
        return Ok(if noop { Board1::Done(None) } else { Board1::Continue });
    };

    let es = co.dtype.size();
    let bytes = co.count * es;
    let root = co.root;
    // 1. Publish this rank's contribution.
    let publish = match co.kind {
        CollKind::AllReduce | CollKind::Reduce | CollKind::AllGather | CollKind::Gather => bytes,
        CollKind::Broadcast if me == root => bytes,
        CollKind::ReduceScatter | CollKind::AlltoAll => bytes * n,
        CollKind::Scatter if me == root => bytes * n,
        _ => 0,
    };
    if publish > 0 {
        // SAFETY: sendbuff holds `publish` bytes (validated) and the slot DATA_MAX >= publish.
        unsafe { std::ptr::copy_nonoverlapping(co.send, b.my_data(s), publish) };
    }
    b.publish(s);

    // 2. Wait for the ranks whose data (or, with checkMode, fingerprint) we need.
    let needs: &dyn Fn(usize) -> bool = match co.kind {
        _ if check => &|_| true,
        CollKind::Broadcast | CollKind::Scatter => &|p| p == root,
        CollKind::Reduce | CollKind::Gather => &|_| me == root,
        _ => &|_| true,
    };
    for p in (0..n).filter(|&p| p != me && needs(p)) {
        b.wait_for(w, p, s)?;
    }
    w.check_flags()?;
    if check {
        if let Some(e) = fingerprint::verdict(me, n, b.fp(me, s), |p| b.fp(p, s)) {
            return Ok(Board1::Done(Some(e)));
        }
    }

    // 3. Take what this rank receives.
    let recv = co.recv;
    let copy_in = |src: &[u8], dst: *mut u8| {
        if !std::ptr::eq(src.as_ptr(), dst) {
            // SAFETY: dst is a validated part of recvbuff, src a published slot: disjoint.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
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
    Ok(Board1::Done(None))
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
