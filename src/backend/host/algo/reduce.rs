//! The owners' reduction shared by all_reduce, reduce and reduce_scatter, and
//! reduce itself (its results go to the root).
//!
//! The element range is split into one chunk per rank; every rank streams its
//! part of chunk `o` to rank `o`, which reduces the contributions in a fixed order
//! (its own first, then ranks o+1, o+2, ... mod n) straight out of the transport
//! into the result, and then hands the result on (to everyone for all_reduce, to
//! the root for reduce, nowhere for reduce_scatter). Every rank reduces 1/n of the
//! data at the same time, the order is fixed so results are identical on every
//! rank and from run to run, and narrow floats accumulate in float32 and are
//! rounded once. Chunks are pipelined in segments so scratch memory stays bounded
//! whatever the message size. See docs/design/host.md, "Reductions".

use super::{copy_local, out_sink, part, Buf, Cx, Scratch};
use crate::backend::host::engine::{Schedule, Sink};
use crate::backend::host::plan;
use crate::error::Result;
use crate::mem::reduce;
use crate::types::{DataType, RedOp};

/// reduce: the owners' chunks as for all_reduce, the results to the root.
pub(super) fn build(s: &mut Schedule<'_>, cx: &Cx<'_>, scratch: &mut Scratch) -> Result<()> {
    let (co, n) = (cx.co, cx.n);
    let chunks = |o: usize| part(co.count, n, o);
    let results = Results { dest: Dest::Root(co.root), stream: cx.stream, by_address: false };
    reduce_phase(s, cx, scratch, &chunks, &|o| chunks(o).0, results)
}

/// Where the results of a reduction go, and how they are written.
#[derive(Clone, Copy)]
pub(super) struct Results {
    pub(super) dest: Dest,
    /// Large results: written with streaming stores where nobody reads them soon.
    pub(super) stream: bool,
    /// Peers read this rank's recvbuff by address.
    pub(super) by_address: bool,
}

/// Where an owner's reduced chunk goes.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Dest {
    /// To every rank (all_reduce); it lands in recvbuff at the chunk's offset.
    All,
    /// Stays with the owner (reduce_scatter): recvbuff holds exactly the chunk.
    Keep,
    /// To the root (reduce), into its recvbuff at the chunk's offset.
    Root(usize),
}

/// How many rounds an owner's results trail its contributions on a link (see
/// `reduce_phase`): contributions this far ahead stream while a segment is reduced.
const LOOKAHEAD: usize = 2;
/// Scratch slots per owner: a segment's slot is reused once the segment LOOKAHEAD+1
/// rounds earlier has been sent, which the message order guarantees can happen.
const SLOTS: usize = LOOKAHEAD + 1;

/// The reduction phase shared by all_reduce, reduce_scatter and reduce.
/// `chunk(o)` = (element offset in sendbuff, length) of owner o's chunk;
/// `res_off(o)` = element offset of its result in the receiving rank's recvbuff.
///
/// Chunks are cut into segments and handled in rounds: in round t a rank sends
/// segment t of its part of every other owner's chunk (a contribution), reduces
/// segment t of its own chunk as the contributions arrive, and sends the result
/// of segment t - LOOKAHEAD. Every rank builds the same rounds, so the messages on
/// each link come in the same order on both sides, and a round only waits for
/// earlier rounds: the schedule cannot deadlock, whatever the ring size, even
/// when a result leaves from a scratch slot that a later segment reuses.
pub(super) fn reduce_phase(
    s: &mut Schedule<'_>,
    cx: &Cx<'_>,
    scratch: &mut Scratch,
    chunk: &dyn Fn(usize) -> (usize, usize),
    res_off: &dyn Fn(usize) -> usize,
    results: Results,
) -> Result<()> {
    let Cx { co, rank, n, .. } = *cx;
    let Results { dest, stream, by_address } = results;
    let (dtype, op) = (co.dtype, co.op);
    let (es, acs) = (dtype.size(), dtype.acc_size());
    let narrow = dtype.is_narrow_float();
    // The bytes the chunks span in sendbuff, and the results in recvbuff.
    let span = |off: &dyn Fn(usize) -> usize, o: usize| (off(o) + chunk(o).1) * es;
    let send = cx.send_buf((0..n).map(|o| span(&|o| chunk(o).0, o)).max().unwrap_or(0));
    let recv_len = match dest {
        Dest::Keep => span(res_off, rank),
        _ => (0..n).map(|o| span(res_off, o)).max().unwrap_or(0),
    };
    let recv = cx.recv_buf(recv_len);
    // The result lands in this rank's recvbuff unless reduce's owner is not the root.
    let result_in_recv = match dest {
        Dest::Root(root) => rank == root,
        _ => true,
    };

    if n == 1 {
        let (off, len) = chunk(0);
        let (src, dst) = (send.at(off * es, len * es), recv.at(res_off(0) * es, len * es));
        copy_local(s, src, dst, len * es, stream);
        return Ok(());
    }

    // Segment t of owner o's chunk: (element offset in the chunk, length).
    let seg_bytes = plan::get().seg_bytes;
    let seg = (seg_bytes / es).max(1);
    let seg_of = |o: usize, t: usize| {
        let len = chunk(o).1;
        (t * seg < len).then(|| (t * seg, seg.min(len - t * seg)))
    };
    let rounds = (0..n).map(|o| chunk(o).1.div_ceil(seg)).max().unwrap_or(0);
    let (my_off, my_len) = chunk(rank);
    let seg_elems = (seg_bytes / es).max(1).min(my_len.max(1));
    // A large result is reduced into a scratch segment that stays in cache, sent to
    // the peers from there and streamed into recvbuff (`mem::copy`): reducing
    // straight into recvbuff would read every destination line from memory first,
    // and sending from it would read the result back. Not when the result lands
    // on this rank's own contribution (in place: those lines were just read, and
    // are in cache), nor when peers read results from recvbuff by address, where
    // the scratch segment would go through the rings instead (docs/design/host.md,
    // "Reductions").
    let mine_at = || (send.at(my_off * es, my_len * es), recv.at(res_off(rank) * es, my_len * es));
    let own_in_place = result_in_recv && {
        let (a, b) = mine_at();
        a == b
    };
    let stream_out = stream && result_in_recv && !narrow && !own_in_place && !(by_address && dest == Dest::All);
    let needs_scratch_acc = narrow || !result_in_recv || stream_out;
    let slots = |bytes: usize, scratch: &mut Scratch| -> Result<[Buf; SLOTS]> {
        let mut b = [Buf::empty(); SLOTS];
        for slot in &mut b {
            *slot = scratch.buf(bytes)?;
        }
        Ok(b)
    };
    let acc_slots = if needs_scratch_acc { slots(seg_elems * acs, scratch)? } else { [Buf::empty(); SLOTS] };
    // Narrow results for the root are rounded into their own buffer before sending.
    let out_slots = if narrow && !result_in_recv { slots(seg_elems * es, scratch)? } else { [Buf::empty(); SLOTS] };
    // Floating-point sums and products depend on the order of the operands: reduce
    // in rank order, so results do not depend on how elements are split among owners
    // (a coalesced call matches per-buffer calls bit for bit). Integer ops and
    // max/min are exact in any order: start with my own data, one pass fewer.
    // The first two operands commute (a + b and b + a are the same float, as are
    // a * b and b * a), so rank 1 starts with its own data too: in place that saves
    // copying it aside, and otherwise a pass over the segment.
    let is_float = narrow || matches!(dtype, DataType::Float32 | DataType::Float64);
    let order: Vec<usize> = if is_float && matches!(op, RedOp::Sum | RedOp::Prod | RedOp::Avg) {
        let mut o: Vec<usize> = (0..n).collect();
        o.swap(0, 1.min(rank));
        o
    } else {
        (0..n).map(|j| (rank + j) % n).collect()
    };
    let chunk_in_place = result_in_recv && !needs_scratch_acc && {
        let (a, b) = mine_at();
        a == b
    };
    let save_slots =
        if order[0] != rank && chunk_in_place { slots(seg_elems * es, scratch)? } else { [Buf::empty(); SLOTS] };
    // Steps that must be done before a slot's buffers are written again.
    let mut slot_free: [Vec<usize>; SLOTS] = Default::default();
    // Per segment of my chunk: the step after which its result is complete.
    let mut ready_of: Vec<usize> = Vec::new();
    let receives_results = match dest {
        Dest::All => true,
        Dest::Keep => false,
        Dest::Root(root) => rank == root,
    };

    for t in 0..rounds + LOOKAHEAD {
        // a. Contributions of segment t to every other owner.
        for o in (0..n).filter(|&o| o != rank) {
            if let Some((a, m)) = seg_of(o, t) {
                s.send(o, send.at((chunk(o).0 + a) * es, m * es), m * es, &[]);
            }
        }

        // b. Reduce segment t of my chunk in a fixed order of contributors.
        if let Some((a, m)) = seg_of(rank, t) {
            let slot = t % SLOTS;
            let mut own_b = send.sub((my_off + a) * es, m * es);
            let res_b = if result_in_recv { recv.sub((res_off(rank) + a) * es, m * es) } else { out_slots[slot] };
            let acc_b = if needs_scratch_acc { acc_slots[slot] } else { res_b };
            let acc = acc_b.at(0, m * acs);
            let mut prev: Vec<usize> = std::mem::take(&mut slot_free[slot]);
            // In place, my contribution sits where the accumulator starts; if it is
            // not first in the order it is saved before the accumulator overwrites it.
            let in_place = std::ptr::eq(acc, own_b.at(0, m * es));
            if in_place && order[0] != rank {
                let saved = save_slots[slot];
                prev = vec![s.copy(own_b.at(0, m * es), saved.at(0, m * es), m * es, false, &prev)];
                own_b = saved;
            }
            let own = own_b.at(0, m * es) as *const u8;
            let mut started = false;
            let mut i = 0;
            while i < n {
                let c = order[i];
                let step = if c == rank {
                    if !started && in_place {
                        // Already in the accumulator: nothing to do.
                        i += 1;
                        started = true;
                        continue;
                    } else if !started && i + 1 < n {
                        // Fuse "take mine" with the next contribution.
                        i += 1;
                        s.recv(order[i], m * es, Sink::ReduceInit { acc, other: own, dtype, op }, &prev)
                    } else {
                        let first = !started;
                        s.local(
                            move || {
                                // Not in place here (see above): two regions.
                                let (accs, mine) = (acc_b.bytes_mut(0, m * acs), own_b.bytes(0, m * es));
                                if first {
                                    reduce::acc_init(dtype, accs, mine);
                                } else {
                                    reduce::acc_reduce(dtype, op, accs, mine);
                                }
                                Ok(())
                            },
                            &prev,
                        )
                    }
                } else if !started {
                    s.recv(c, m * es, Sink::Init { acc, dtype }, &prev)
                } else {
                    s.recv(c, m * es, Sink::Reduce { acc, dtype, op }, &prev)
                };
                started = true;
                prev = vec![step];
                i += 1;
            }
            // Round (narrow types) or divide (avg) once all contributions are in.
            let ready = if narrow {
                s.local(
                    move || {
                        reduce::acc_finish(dtype, op, n, acc_b.bytes(0, m * acs), res_b.bytes_mut(0, m * es));
                        Ok(())
                    },
                    &prev,
                )
            } else if op == RedOp::Avg {
                s.local(
                    move || {
                        reduce::finish_inplace(dtype, op, n, acc_b.bytes_mut(0, m * es));
                        Ok(())
                    },
                    &prev,
                )
            } else {
                prev[0]
            };
            ready_of.push(ready);
        }

        // c. Results of segment t - LOOKAHEAD: mine out, the other owners' in.
        let Some(j) = t.checked_sub(LOOKAHEAD) else { continue };
        if let Some((a, m)) = seg_of(rank, j) {
            let slot = j % SLOTS;
            let ready = ready_of[j];
            // Only narrow results for another rank use an out slot; other results
            // for another rank leave from the accumulator (`out` below).
            let res = if result_in_recv {
                recv.at((res_off(rank) + a) * es, m * es)
            } else if narrow {
                out_slots[slot].at(0, m * es)
            } else {
                std::ptr::null_mut()
            };
            let acc = if needs_scratch_acc { acc_slots[slot].at(0, m * acs) } else { res };
            let out = if needs_scratch_acc && !narrow { acc } else { res };
            let frees = &mut slot_free[slot];
            frees.push(ready);
            if stream_out {
                frees.push(s.copy(acc, res, m * es, true, &[ready]));
            }
            match dest {
                // Sends from a scratch slot are done once written to the stream, so
                // the slot is free again without waiting for a peer's direct read.
                Dest::All if stream_out => {
                    frees.extend((0..n).filter(|&p| p != rank).map(|p| s.send_staged(p, out, m * es, &[ready])))
                }
                Dest::All => (0..n).filter(|&p| p != rank).for_each(|p| {
                    s.send(p, out, m * es, &[ready]);
                }),
                Dest::Keep => {}
                Dest::Root(root) if root == rank => {}
                Dest::Root(root) => frees.push(s.send(root, out, m * es, &[ready])),
            }
        }
        if receives_results {
            for o in (0..n).filter(|&o| o != rank) {
                if let Some((a, m)) = seg_of(o, j) {
                    let dst = recv.at((res_off(o) + a) * es, m * es);
                    s.recv(o, m * es, out_sink(dst, stream), &[]);
                }
            }
        }
    }
    Ok(())
}
