//! Each collective as a schedule of sends, receives and local steps.
//!
//! Reductions use "owners": the element range is split into one chunk per rank;
//! every rank streams its part of chunk `o` to rank `o`, which reduces the
//! contributions in a fixed order (its own first, then ranks o+1, o+2, ... mod n)
//! straight out of the transport into the result, and then hands the result on
//! (to everyone for all_reduce, to the root for reduce, nowhere for
//! reduce_scatter). Every rank reduces 1/n of the data at the same time, the
//! order is fixed so results are identical on every rank and from run to run, and
//! narrow floats accumulate in float32 and are rounded once. Chunks are pipelined
//! in segments so scratch memory stays bounded whatever the message size.

use super::engine::{Exchange, P2pCall, RunCtl, Schedule, Sink};
use super::plan;
use crate::coll::{Coll, CollKind};
use crate::error::{Error, Result};
use crate::mem::pool::PooledBuf;
use crate::mem::reduce;
use crate::transport::Transport;
use crate::types::{DataType, RedOp};

/// Bytes `co` writes into this rank's recvbuff.
pub fn recv_bytes(co: &Coll, n: usize) -> usize {
    let bytes = co.count * co.dtype.size();
    match co.kind {
        CollKind::AllGather | CollKind::Gather | CollKind::AlltoAll => n * bytes,
        CollKind::AlltoAllv | CollKind::AllGatherV => {
            co.v.as_ref().map_or(0, |v| v.recvcounts().iter().sum::<usize>() * co.dtype.size())
        }
        _ => bytes,
    }
}

/// How data received into user buffers is written: streaming for large calls.
fn out_sink(dst: *mut u8, stream: bool) -> Sink {
    if stream {
        Sink::Stream(dst)
    } else {
        Sink::Copy(dst)
    }
}

/// Scratch buffers that must outlive a schedule's run (pooled: see `mem::pool`).
#[derive(Default)]
pub struct Scratch {
    bufs: Vec<PooledBuf>,
}

impl Scratch {
    /// A buffer of at least `bytes` whose address stays fixed until the scratch is
    /// dropped. Its contents are unspecified: every user writes before reading.
    pub fn alloc(&mut self, bytes: usize) -> *mut u8 {
        let mut b = PooledBuf::take(bytes);
        let p = b.as_mut_ptr();
        self.bufs.push(b);
        p
    }
}

/// A raw pointer that a local step may carry to the thread that runs it.
#[derive(Clone, Copy)]
struct P(*mut u8);
// SAFETY: the buffers behind these pointers are owned by the caller of the
// collective (or by Scratch) and outlive the run; steps touch them in dependency order.
unsafe impl Send for P {}

/// Balanced split of `count` elements into `n` parts: (start, len) of part `i`.
pub fn part(count: usize, n: usize, i: usize) -> (usize, usize) {
    let (base, rem) = (count / n, count % n);
    (i * base + i.min(rem), base + usize::from(i < rem))
}

/// Segments of a chunk of `len` elements: (offset, len) pairs.
fn segments(len: usize, dtype: DataType) -> impl Iterator<Item = (usize, usize)> {
    let seg = (plan::get().seg_bytes / dtype.size()).max(1);
    (0..len.div_ceil(seg)).map(move |k| (k * seg, seg.min(len - k * seg)))
}

/// Adds the steps of one collective (count > 0, validated) to `s`.
///
/// `recv_by_address`: this rank's peers read its recvbuff in place (single copy),
/// so a result written there is read again soon.
pub fn build(
    s: &mut Schedule<'_>,
    co: &Coll,
    rank: usize,
    n: usize,
    scratch: &mut Scratch,
    recv_by_address: bool,
    shares_memory: &dyn Fn(usize) -> bool,
) -> Result<()> {
    let es = co.dtype.size();
    let send = co.send as *mut u8;
    let recv = co.recv;
    let bytes = co.count * es;
    // Large results are written with streaming stores (FERROCCL_STREAM_MIN, see
    // `mem::copy`): they leave the caches before the caller reads them anyway.
    // Not in place where this rank reads the lines it then overwrites (all_to_all
    // sends each block before its replacement lands there): they are in cache, and
    // streaming stores would write them out to memory (1.2-1.6x without).
    let stream = recv_bytes(co, n) >= crate::env::stream_min() && !(co.kind == CollKind::AlltoAll && send == recv);
    // Copies into a recvbuff that the previous call wrote, and that is small enough
    // to be in the caches still, keep ordinary stores (`reuse`). Reductions keep
    // `stream`, which also shapes their schedule.
    let copies_stream = stream && !super::reuse::cached(recv, recv_bytes(co, n));
    let sink = |dst: *mut u8| out_sink(dst, copies_stream);
    // Results that stay with their owner (reduce_scatter).
    let keep = Results { dest: Dest::Keep, stream, by_address: false };
    let plan = plan::get();
    match co.kind {
        CollKind::AllReduce if co.wire.is_some_and(|w| w != co.dtype) => allreduce_wire(s, co, rank, n, scratch),
        CollKind::AllReduce
            if n == 2
                && bytes >= plan.fuse_min
                && shares_memory(1 - rank)
                && !(co.dtype.is_narrow_float() && co.op == RedOp::Avg) =>
        {
            // Where both ranks map each other's buffers, both reduce pieces of the
            // whole vector from both inputs and write each result into both
            // recvbuffs at once (engine::Exchange::Reduce): every byte read once and
            // written once. Out of place only where results are streamed, up to
            // 16 MiB (see Schedule::swap). The pipelined reduction below is the
            // fallback, which the offers choose for both ranks when either cannot.
            // Not over TCP, where it could never happen and the offers cost
            // 1.0-1.2x (2 ranks, 4 alternating runs).
            let mut res = Ok(());
            let how = Exchange::Reduce { dtype: co.dtype, op: co.op, stream };
            s.swap(
                1 - rank,
                recv,
                send,
                bytes,
                how,
                |_| {},
                |s| {
                    let chunks = |o: usize| part(co.count, n, o);
                    let results = Results { dest: Dest::All, stream, by_address: recv_by_address };
                    res = reduce_phase(s, co, rank, n, scratch, &chunks, &|o| chunks(o).0, results);
                },
            );
            res
        }
        CollKind::AllReduce => {
            let chunks = |o: usize| part(co.count, n, o);
            let results = Results { dest: Dest::All, stream, by_address: recv_by_address };
            reduce_phase(s, co, rank, n, scratch, &chunks, &|o| chunks(o).0, results)
        }
        CollKind::ReduceScatter => {
            let chunks = |o: usize| (o * co.count, co.count);
            reduce_phase(s, co, rank, n, scratch, &chunks, &|_| 0, keep)
        }
        CollKind::ReduceScatterV => {
            let v = co.v.as_ref().ok_or_else(|| Error::internal("reduce_scatter_v without counts"))?;
            let chunks = |o: usize| (v.sdispls()[o], v.recvcounts()[o]);
            reduce_phase(s, co, rank, n, scratch, &chunks, &|_| 0, keep)
        }
        CollKind::Reduce => {
            let chunks = |o: usize| part(co.count, n, o);
            let results = Results { dest: Dest::Root(co.root), stream, by_address: false };
            reduce_phase(s, co, rank, n, scratch, &chunks, &|o| chunks(o).0, results)
        }
        CollKind::Broadcast => {
            if rank == co.root {
                // Out of place, the first send also copies each piece to recvbuff
                // while it is in cache: the source is read from memory once.
                let mut tee = (send != recv).then_some(recv);
                for p in (0..n).filter(|&p| p != rank) {
                    match tee.take() {
                        Some(dst) => s.send_tee(p, send, bytes, dst, copies_stream),
                        None => s.send(p, send, bytes, &[]),
                    };
                }
                if let Some(dst) = tee {
                    copy_local(s, send, dst, bytes, copies_stream);
                }
            } else {
                s.recv(co.root, bytes, sink(recv), &[]);
            }
            Ok(())
        }
        CollKind::AllGather if co.strided.is_some() => {
            let st = co.strided.expect("checked");
            let (block, stride) = (st.block * es, n * st.block * es);
            // SAFETY (offsets below): recvbuff holds n*bytes (validated), laid out as
            // `outer` rows of n blocks.
            let (src, dst) = (P(send), P(unsafe { recv.add(rank * block) }));
            s.local(
                move || {
                    let (src, dst) = (src, dst);
                    for j in 0..st.outer {
                        // SAFETY: row j of the source and of the destination are in bounds.
                        unsafe { std::ptr::copy(src.0.add(j * block), dst.0.add(j * stride), block) };
                    }
                    Ok(())
                },
                &[],
            );
            for p in (0..n).filter(|&p| p != rank) {
                s.send(p, send, bytes, &[]);
            }
            for p in (0..n).filter(|&p| p != rank) {
                s.recv(p, bytes, Sink::Strided { dst: unsafe { recv.add(p * block) }, block, stride }, &[]);
            }
            Ok(())
        }
        CollKind::AllGather => {
            // SAFETY (offsets below): recvbuff holds n*bytes (validated).
            let mine = unsafe { recv.add(rank * bytes) };
            copy_local(s, send, mine, bytes, copies_stream);
            for p in (0..n).filter(|&p| p != rank) {
                s.send(p, send, bytes, &[]);
            }
            for p in (0..n).filter(|&p| p != rank) {
                s.recv(p, bytes, sink(unsafe { recv.add(p * bytes) }), &[]);
            }
            Ok(())
        }
        CollKind::AlltoAll => {
            // Block p goes to rank p, and p's block for us lands in its place in
            // recvbuff. Large blocks first exchange offers (engine::K_SWAP): when
            // both ranks are in place and map each other's buffer, the pair swaps
            // its blocks between the two buffers, both ranks taking pieces; when
            // both are out of place, each block goes whole (by address where it
            // can); otherwise (one in place, or no mapping) piece by piece through
            // the rings. A rank in place must not lose a piece before sending it:
            // receiving a piece waits until the same piece has been written to p's
            // stream (never sent by address), and p does the same, so neither waits
            // for the other's reads and no copy of the input is needed. Small blocks
            // are one piece, which pairs up with a whole block.
            let in_place = send == recv;
            // SAFETY (offsets below): both buffers hold n*bytes (validated).
            copy_local(s, unsafe { send.add(rank * bytes) }, unsafe { recv.add(rank * bytes) }, bytes, copies_stream);
            for p in (0..n).filter(|&p| p != rank) {
                let (from, to) = unsafe { (send.add(p * bytes), recv.add(p * bytes)) };
                let whole = |s: &mut Schedule<'_>| {
                    s.send(p, from, bytes, &[]);
                    s.recv(p, bytes, sink(to), &[]);
                };
                let staged = |s: &mut Schedule<'_>| {
                    let mut a = 0;
                    while a < bytes {
                        let m = plan.inplace_piece.min(bytes - a);
                        // SAFETY: inside block p of both buffers.
                        let (f, t) = unsafe { (from.add(a), to.add(a)) };
                        let sent = s.send_staged(p, f, m, &[]);
                        s.recv(p, m, sink(t), &[sent]);
                        a += m;
                    }
                };
                // Offers on links where nothing goes by address (TCP) too: they choose
                // whole blocks for two ranks out of place, which measured 1.1-1.2x
                // the pieces there (2 ranks, 4 alternating runs, 256 KiB-16 MiB).
                if bytes >= plan.swap_min {
                    s.swap(p, to, from, bytes, Exchange::Swap, whole, staged);
                } else if in_place {
                    staged(s);
                } else {
                    whole(s);
                }
            }
            Ok(())
        }
        CollKind::Gather => {
            if rank == co.root {
                for p in (0..n).filter(|&p| p != rank) {
                    s.recv(p, bytes, sink(unsafe { recv.add(p * bytes) }), &[]);
                }
                copy_local(s, send, unsafe { recv.add(rank * bytes) }, bytes, copies_stream);
            } else {
                s.send(co.root, send, bytes, &[]);
            }
            Ok(())
        }
        CollKind::Scatter => {
            if rank == co.root {
                for p in (0..n).filter(|&p| p != rank) {
                    s.send(p, unsafe { send.add(p * bytes) }, bytes, &[]);
                }
                copy_local(s, unsafe { send.add(rank * bytes) }, recv, bytes, copies_stream);
            } else {
                s.recv(co.root, bytes, sink(recv), &[]);
            }
            Ok(())
        }
        CollKind::AlltoAllv | CollKind::AllGatherV => {
            let v = co.v.as_ref().ok_or_else(|| Error::internal("all_to_allv without counts"))?;
            let mine_s = unsafe { send.add(v.sdispls()[rank] * es) };
            let mine_r = unsafe { recv.add(v.rdispls()[rank] * es) };
            for p in (0..n).filter(|&p| p != rank) {
                s.send(p, unsafe { send.add(v.sdispls()[p] * es) }, v.sendcounts()[p] * es, &[]);
            }
            for p in (0..n).filter(|&p| p != rank) {
                s.recv(p, v.recvcounts()[p] * es, sink(unsafe { recv.add(v.rdispls()[p] * es) }), &[]);
            }
            copy_local(s, mine_s, mine_r, v.sendcounts()[rank].min(v.recvcounts()[rank]) * es, copies_stream);
            Ok(())
        }
        CollKind::Barrier => {
            for p in (0..n).filter(|&p| p != rank) {
                s.send(p, std::ptr::null(), 0, &[]);
            }
            for p in (0..n).filter(|&p| p != rank) {
                s.recv(p, 0, Sink::Discard, &[]);
            }
            Ok(())
        }
        CollKind::Send => {
            s.p2p_send(co.root, send, bytes, P2pCall::of(co));
            Ok(())
        }
        CollKind::Recv => {
            s.p2p_recv(co.root, recv, bytes, P2pCall::of(co));
            Ok(())
        }
    }
}

/// A local copy step (made in pieces between transfers) unless source and
/// destination are the same.
fn copy_local(s: &mut Schedule<'_>, src: *mut u8, dst: *mut u8, bytes: usize, stream: bool) {
    if src != dst && bytes > 0 {
        s.copy(src, dst, bytes, stream, &[]);
    }
}

/// Where the results of a reduction go, and how they are written.
#[derive(Clone, Copy)]
struct Results {
    dest: Dest,
    /// Large results: written with streaming stores where nobody reads them soon.
    stream: bool,
    /// Peers read this rank's recvbuff by address.
    by_address: bool,
}

/// Where an owner's reduced chunk goes.
#[derive(Clone, Copy, PartialEq)]
enum Dest {
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
#[allow(clippy::too_many_arguments)]
fn reduce_phase(
    s: &mut Schedule<'_>,
    co: &Coll,
    rank: usize,
    n: usize,
    scratch: &mut Scratch,
    chunk: &dyn Fn(usize) -> (usize, usize),
    res_off: &dyn Fn(usize) -> usize,
    results: Results,
) -> Result<()> {
    let Results { dest, stream, by_address } = results;
    let (dtype, op) = (co.dtype, co.op);
    let (es, acs) = (dtype.size(), dtype.acc_size());
    let narrow = dtype.is_narrow_float();
    let send = co.send as *mut u8;
    let recv = co.recv;
    // The result lands in this rank's recvbuff unless reduce's owner is not the root.
    let result_in_recv = match dest {
        Dest::Root(root) => rank == root,
        _ => true,
    };

    if n == 1 {
        let (off, len) = chunk(0);
        // SAFETY: offsets within validated buffers.
        let (src, dst) = unsafe { (send.add(off * es), recv.add(res_off(0) * es)) };
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
    // the scratch segment would go through the rings instead (1.6x in place,
    // 1.0-1.2x out of place without, for all_reduce 2-32 MiB).
    // SAFETY: offsets within validated buffers (only compared, never dereferenced here).
    let own_in_place =
        result_in_recv && std::ptr::eq(unsafe { send.add(my_off * es) }, unsafe { recv.add(res_off(rank) * es) });
    let stream_out = stream && result_in_recv && !narrow && !own_in_place && !(by_address && dest == Dest::All);
    let needs_scratch_acc = narrow || !result_in_recv || stream_out;
    let slots =
        |bytes: usize, scratch: &mut Scratch| -> [*mut u8; SLOTS] { std::array::from_fn(|_| scratch.alloc(bytes)) };
    let acc_slots = if needs_scratch_acc { slots(seg_elems * acs, scratch) } else { [std::ptr::null_mut(); SLOTS] };
    // Narrow results for the root are rounded into their own buffer before sending.
    let out_slots =
        if narrow && !result_in_recv { slots(seg_elems * es, scratch) } else { [std::ptr::null_mut(); SLOTS] };
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
    // SAFETY: offsets within validated buffers (only compared, never dereferenced here).
    let chunk_in_place = result_in_recv
        && !needs_scratch_acc
        && std::ptr::eq(unsafe { send.add(my_off * es) }, unsafe { recv.add(res_off(rank) * es) });
    let save_slots =
        if order[0] != rank && chunk_in_place { slots(seg_elems * es, scratch) } else { [std::ptr::null_mut(); SLOTS] };
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
                // SAFETY: within sendbuff (validated size).
                s.send(o, unsafe { send.add((chunk(o).0 + a) * es) }, m * es, &[]);
            }
        }

        // b. Reduce segment t of my chunk in a fixed order of contributors.
        if let Some((a, m)) = seg_of(rank, t) {
            let slot = t % SLOTS;
            // SAFETY: offsets within validated buffers.
            let own = unsafe { send.add((my_off + a) * es) } as *const u8;
            let res = if result_in_recv { unsafe { recv.add((res_off(rank) + a) * es) } } else { out_slots[slot] };
            let acc = if needs_scratch_acc { acc_slots[slot] } else { res };
            let mut prev: Vec<usize> = std::mem::take(&mut slot_free[slot]);
            // In place, my contribution sits where the accumulator starts; if it is
            // not first in the order it is saved before the accumulator overwrites it.
            let in_place = std::ptr::eq(acc, own);
            let mut own = own;
            if in_place && order[0] != rank {
                let saved = save_slots[slot];
                prev = vec![s.copy(own, saved, m * es, false, &prev)];
                own = saved;
            }
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
                        let (accp, ownp, first) = (P(acc), P(own as *mut u8), !started);
                        s.local(
                            move || {
                                let (accp, ownp) = (accp, ownp);
                                // SAFETY: m accumulators and m of my elements, exclusive to this step.
                                let (accs, mine) = unsafe {
                                    (
                                        std::slice::from_raw_parts_mut(accp.0, m * acs),
                                        std::slice::from_raw_parts(ownp.0, m * es),
                                    )
                                };
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
                let (accp, resp) = (P(acc), P(res));
                s.local(
                    move || {
                        let (accp, resp) = (accp, resp);
                        // SAFETY: acc holds m accumulators, res m elements; both exclusive to this step now.
                        let (accs, out) = unsafe {
                            (
                                std::slice::from_raw_parts(accp.0, m * acs),
                                std::slice::from_raw_parts_mut(resp.0, m * es),
                            )
                        };
                        reduce::acc_finish(dtype, op, n, accs, out);
                        Ok(())
                    },
                    &prev,
                )
            } else if op == RedOp::Avg {
                let accp = P(acc);
                s.local(
                    move || {
                        let accp = accp;
                        // SAFETY: as above.
                        let buf = unsafe { std::slice::from_raw_parts_mut(accp.0, m * es) };
                        reduce::finish_inplace(dtype, op, n, buf);
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
            let res = if result_in_recv { unsafe { recv.add((res_off(rank) + a) * es) } } else { out_slots[slot] };
            let acc = if needs_scratch_acc { acc_slots[slot] } else { res };
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
                    // SAFETY: within recvbuff (validated size).
                    let dst = unsafe { recv.add((res_off(o) + a) * es) };
                    s.recv(o, m * es, out_sink(dst, stream), &[]);
                }
            }
        }
    }
    Ok(())
}

/// Elements of one window of a wire all_reduce whose wire type is `wire` (at most the
/// count): the device kernels split windows among owners the same way.
pub(crate) fn wire_window_elems(wire: DataType) -> usize {
    (plan::get().wire_window / wire.size()).max(1)
}

/// all_reduce whose data crosses the transport in `co.wire`, a narrower float type:
/// each contribution is rounded to the wire type once, the owner accumulates in the
/// data type (float32 or float64), and the reduced result is rounded to the wire
/// type once more for the trip back. Every rank, the owner included, takes the
/// wire-rounded result, so all ranks end with identical values. The message goes in
/// windows of `wire_window` wire bytes (`plan::Plan`) over two scratch slots that alternate.
fn allreduce_wire(s: &mut Schedule<'_>, co: &Coll, rank: usize, n: usize, scratch: &mut Scratch) -> Result<()> {
    let (dt, wire) = (co.dtype, co.wire.expect("wire type set"));
    let (es, ws) = (dt.size(), wire.size());
    let win = wire_window_elems(wire).min(co.count);
    if n == 1 {
        // One rank: nothing travels, but the result still goes through the wire type
        // so that it does not depend on the number of ranks.
        let (src, dst, count) = (P(co.send as *mut u8), P(co.recv), co.count);
        s.local(
            move || {
                let (src, dst) = (src, dst);
                let mut tmp = vec![0u8; win * ws];
                for first in (0..count).step_by(win) {
                    let m = win.min(count - first);
                    // SAFETY: both buffers hold count elements (validated); tmp is separate.
                    let (a, b) = unsafe {
                        (
                            std::slice::from_raw_parts(src.0.add(first * es), m * es),
                            std::slice::from_raw_parts_mut(dst.0.add(first * es), m * es),
                        )
                    };
                    reduce::convert(dt, a, wire, &mut tmp[..m * ws]);
                    reduce::convert(wire, &tmp[..m * ws], dt, b);
                }
                Ok(())
            },
            &[],
        );
        return Ok(());
    }
    let slot = |scratch: &mut Scratch| WireSlot {
        out: scratch.alloc(win * ws),
        res: scratch.alloc(win * ws),
        acc: scratch.alloc(win.div_ceil(n) * es + es),
    };
    let slots = [slot(scratch), slot(scratch)];
    // Steps that use each slot, which its next window waits for.
    let mut users: [Vec<usize>; 2] = Default::default();
    for (k, first) in (0..co.count).step_by(win).enumerate() {
        let after = std::mem::take(&mut users[k % 2]);
        users[k % 2] = wire_window(s, co, rank, n, first, win.min(co.count - first), &slots[k % 2], &after);
    }
    Ok(())
}

/// Scratch of one window of a wire all_reduce: outgoing contributions and results in
/// wire form, and this rank's accumulator.
struct WireSlot {
    out: *mut u8,
    res: *mut u8,
    acc: *mut u8,
}

/// Elements `first..first + count` of a wire all_reduce, split among the owners like a
/// whole message; `after`: steps that must finish before `slot` is written. Returns
/// the steps that use the slot.
#[allow(clippy::too_many_arguments)]
fn wire_window(
    s: &mut Schedule<'_>,
    co: &Coll,
    rank: usize,
    n: usize,
    first: usize,
    count: usize,
    slot: &WireSlot,
    after: &[usize],
) -> Vec<usize> {
    let (dt, wire, op) = (co.dtype, co.wire.expect("wire type set"), co.op);
    let (es, ws) = (dt.size(), wire.size());
    // SAFETY (pointer arithmetic): the window lies inside both validated buffers.
    let (send, recv) = unsafe { (co.send.add(first * es) as *mut u8, co.recv.add(first * es)) };
    let (out_wire, res_wire) = (slot.out, slot.res);
    let (out_w, res_w, accp) = (P(out_wire), P(res_wire), P(slot.acc));
    let mut users = Vec::new();
    // 1. Contributions to the other owners, rounded to the wire type.
    for o in (0..n).filter(|&o| o != rank) {
        let (off, len) = part(count, n, o);
        for (a, m) in segments(len, wire) {
            let (srcp, outp) = (P(send), out_w);
            let at = off + a;
            let conv = s.local(
                move || {
                    let (srcp, outp) = (srcp, outp);
                    // SAFETY: in bounds of the window of sendbuff and of the slot.
                    let (x, y) = unsafe {
                        (
                            std::slice::from_raw_parts(srcp.0.add(at * es), m * es),
                            std::slice::from_raw_parts_mut(outp.0.add(at * ws), m * ws),
                        )
                    };
                    reduce::convert(dt, x, wire, y);
                    Ok(())
                },
                after,
            );
            // SAFETY: in bounds of the slot.
            users.push(s.send(o, unsafe { out_wire.add(at * ws) }, m * ws, &[conv]));
        }
    }
    // 2. My chunk: accumulate in the data type, round once to the wire type.
    let (my_off, my_len) = part(count, n, rank);
    for (a, m) in segments(my_len, wire) {
        let at = my_off + a;
        let srcp = P(send);
        let init = s.local(
            move || {
                let (srcp, accp) = (srcp, accp);
                // SAFETY: in bounds of the window of sendbuff and of the accumulator.
                unsafe { std::ptr::copy_nonoverlapping(srcp.0.add(at * es), accp.0.add(a * es), m * es) };
                Ok(())
            },
            after,
        );
        let mut prev = init;
        for j in 1..n {
            let peer = (rank + j) % n;
            // SAFETY: in bounds of the accumulator.
            let sink = Sink::ReduceConv { acc: unsafe { slot.acc.add(a * es) }, acc_type: dt, wire, op };
            prev = s.recv(peer, m * ws, sink, &[prev]);
        }
        let (resp, recvp) = (res_w, P(recv));
        let ready = s.local(
            move || {
                let (accp, resp, recvp) = (accp, resp, recvp);
                // SAFETY: in bounds of the accumulator, the slot and the window of recvbuff.
                let (accs, w, out) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(accp.0.add(a * es), m * es),
                        std::slice::from_raw_parts_mut(resp.0.add(at * ws), m * ws),
                        std::slice::from_raw_parts_mut(recvp.0.add(at * es), m * es),
                    )
                };
                reduce::finish_inplace(dt, op, n, accs);
                reduce::convert(dt, accs, wire, w);
                reduce::convert(wire, w, dt, out);
                Ok(())
            },
            &[prev],
        );
        users.push(ready);
        for p in (0..n).filter(|&p| p != rank) {
            // SAFETY: in bounds of the slot.
            users.push(s.send(p, unsafe { res_wire.add(at * ws) }, m * ws, &[ready]));
        }
    }
    // 3. The other owners' results, widened back to the data type.
    for o in (0..n).filter(|&o| o != rank) {
        let (off, len) = part(count, n, o);
        for (a, m) in segments(len, wire) {
            let at = off + a;
            // SAFETY: in bounds of the slot.
            let got = s.recv(o, m * ws, Sink::Copy(unsafe { res_wire.add(at * ws) }), after);
            let (resp, recvp) = (res_w, P(recv));
            users.push(s.local(
                move || {
                    let (resp, recvp) = (resp, recvp);
                    // SAFETY: in bounds of the slot and the window of recvbuff.
                    let (w, out) = unsafe {
                        (
                            std::slice::from_raw_parts(resp.0.add(at * ws), m * ws),
                            std::slice::from_raw_parts_mut(recvp.0.add(at * es), m * es),
                        )
                    };
                    reduce::convert(wire, w, dt, out);
                    Ok(())
                },
                &[got],
            ));
        }
    }
    users
}

/// The two numbers a rank tells peer `p` about a call with per-rank counts, so that
/// both sides can check each other: (what I send you, what I expect from you).
/// reduce_scatter_v's counts must be identical everywhere, so it sends a digest of
/// the whole array both ways.
pub(crate) fn pair_values(co: &Coll, p: usize) -> (u64, u64) {
    let v = co.v.as_ref().expect("v-call has counts");
    match co.kind {
        CollKind::ReduceScatterV => {
            let h = v
                .recvcounts()
                .iter()
                .fold(0xcbf2_9ce4_8422_2325u64, |h, &c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3).rotate_left(7));
            (h, h)
        }
        _ => (v.sendcounts()[p] as u64, v.recvcounts()[p] as u64),
    }
}

/// Describes a disagreement between this rank `me` and `p` for a v-call.
pub(crate) fn describe_pair(co: &Coll, me: usize, p: usize, mine: (u64, u64), theirs: (u64, u64)) -> Option<String> {
    let v = co.v.as_ref().expect("v-call has counts");
    match co.kind {
        CollKind::ReduceScatterV => (mine.0 != theirs.0).then(|| {
            format!(
                "rank {me} and rank {p} passed different recvcounts arrays (rank {me}: {:?}); every rank must pass the same recvcounts",
                &v.recvcounts()[..v.recvcounts().len().min(16)]
            )
        }),
        CollKind::AllGatherV => {
            if mine.0 != theirs.1 {
                Some(format!(
                    "rank {me} sends sendcount = {} elements, but rank {p} expects recvcounts[{me}] = {}",
                    mine.0, theirs.1
                ))
            } else if theirs.0 != mine.1 {
                Some(format!(
                    "rank {p} sends sendcount = {} elements, but rank {me} expects recvcounts[{p}] = {}",
                    theirs.0, mine.1
                ))
            } else {
                None
            }
        }
        _ => {
            if mine.0 != theirs.1 {
                Some(format!(
                    "rank {me} sends sendcounts[{p}] = {} elements to rank {p}, but rank {p} expects recvcounts[{me}] = {}",
                    mine.0, theirs.1
                ))
            } else if theirs.0 != mine.1 {
                Some(format!(
                    "rank {p} sends sendcounts[{me}] = {} elements to rank {me}, but rank {me} expects recvcounts[{p}] = {}",
                    theirs.0, mine.1
                ))
            } else {
                None
            }
        }
    }
}

/// Describes a rank whose own counts disagree: it sends itself a different number
/// of elements than it expects from itself (`mine` = its pair values for itself).
pub(crate) fn describe_self(co: &Coll, me: usize, mine: (u64, u64)) -> Option<String> {
    (matches!(co.kind, CollKind::AlltoAllv | CollKind::AllGatherV) && mine.0 != mine.1)
        .then(|| format!("rank {me} sends {} elements to itself but expects recvcounts[{me}] = {}", mine.0, mine.1))
}

/// The error of a call with per-rank counts once every rank knows who found a
/// mismatch: this rank's own finding if it has one, else the names of the ranks
/// that did; None when nobody did.
pub(crate) fn counts_error(found: Option<String>, reporters: &[usize]) -> Option<Error> {
    if reporters.is_empty() {
        return None;
    }
    Some(Error::mismatch(match found {
        Some(d) => format!("{d}; no data was moved, the communicator is still usable"),
        None => format!(
            "ranks {} found mismatched counts with their peers (see their errors); no data was moved, the communicator is still usable",
            reporters.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
        ),
    }))
}

/// For every call with per-rank counts (all_to_allv, all_gather_v,
/// reduce_scatter_v): exchange counts with each peer, then let every rank know who
/// found a mismatch, so all ranks fail together without moving data.
/// Returns (seq, error if the call must fail) per call.
pub fn alltoallv_agree(
    t: &mut Transport,
    calls: &[&super::Call],
    ctl: &RunCtl<'_>,
) -> Result<Vec<(u64, Option<Error>)>> {
    let (me, n) = (t.rank, t.nranks);
    let nc = calls.len();
    let mut scratch = Scratch::default();
    let mine_out: Vec<Vec<u64>> = (0..n)
        .map(|p| {
            calls
                .iter()
                .flat_map(|c| {
                    let (a, b) = pair_values(&c.coll, p);
                    [a, b]
                })
                .collect()
        })
        .collect();
    let inbox: Vec<*mut u8> = (0..n).map(|_| scratch.alloc(nc * 16)).collect();
    let mut s = Schedule::new(calls[0].seq as u32);
    for p in (0..n).filter(|&p| p != me) {
        s.send(p, mine_out[p].as_ptr() as *const u8, nc * 16, &[]);
    }
    for p in (0..n).filter(|&p| p != me) {
        s.recv(p, nc * 16, Sink::Copy(inbox[p]), &[]);
    }
    if let Some(e) = super::engine::run(t, &mut s, ctl)? {
        return Err(e);
    }
    let read = |p: usize, i: usize| -> u64 {
        // SAFETY: inbox[p] holds nc*16 bytes written by the run above.
        let b = unsafe { std::slice::from_raw_parts(inbox[p].add(i * 8), 8) };
        u64::from_le_bytes(b.try_into().unwrap())
    };
    // My findings per call: first mismatch description.
    let mut found: Vec<Option<String>> = vec![None; nc];
    for (ci, c) in calls.iter().enumerate() {
        for p in (0..n).filter(|&p| p != me) {
            let theirs = (read(p, ci * 2), read(p, ci * 2 + 1));
            if let Some(d) = describe_pair(&c.coll, me, p, pair_values(&c.coll, p), theirs) {
                found[ci].get_or_insert(d);
            }
        }
        if let Some(d) = describe_self(&c.coll, me, pair_values(&c.coll, me)) {
            found[ci].get_or_insert(d);
        }
    }
    // Agreement: everyone learns which ranks found a mismatch in which call.
    let flags: Vec<u64> = found.iter().map(|f| u64::from(f.is_some())).collect();
    let flag_in: Vec<*mut u8> = (0..n).map(|_| scratch.alloc(nc * 8)).collect();
    let mut s = Schedule::new(calls[0].seq as u32);
    for p in (0..n).filter(|&p| p != me) {
        s.send(p, flags.as_ptr() as *const u8, nc * 8, &[]);
    }
    for p in (0..n).filter(|&p| p != me) {
        s.recv(p, nc * 8, Sink::Copy(flag_in[p]), &[]);
    }
    if let Some(e) = super::engine::run(t, &mut s, ctl)? {
        return Err(e);
    }
    Ok(calls
        .iter()
        .enumerate()
        .map(|(ci, c)| {
            let reporters: Vec<usize> = (0..n)
                .filter(|&p| {
                    if p == me {
                        return flags[ci] != 0;
                    }
                    // SAFETY: flag_in[p] holds nc*8 bytes written by the run above.
                    let b = unsafe { std::slice::from_raw_parts(flag_in[p].add(ci * 8), 8) };
                    u64::from_le_bytes(b.try_into().unwrap()) != 0
                })
                .collect();
            let err = counts_error(found[ci].take(), &reporters);
            (c.seq, err)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_range_exactly() {
        for count in [0usize, 1, 7, 1000003] {
            for n in 1..9 {
                let mut next = 0;
                for i in 0..n {
                    let (s, l) = part(count, n, i);
                    assert_eq!(s, next);
                    next += l;
                }
                assert_eq!(next, count);
            }
        }
    }
}
