//! all_reduce: the owners' reduction (`reduce::reduce_phase`) with every result
//! sent to every rank; between two ranks that map each other's buffers, both
//! reduce pieces of the whole vector in place (`engine::Exchange::Reduce`); and
//! over a narrower wire type, in windows that round each value to the wire type
//! once each way. Large calls between mapped buffers take `mapped` first, small
//! ones the board (`fast`); see `plan`.

use super::reduce::{reduce_phase, Dest, Results};
use super::{part, segments, Buf, Cx, Scratch};
use crate::backend::host::engine::{Block, Exchange, Schedule, Sink};
use crate::backend::host::plan;
use crate::error::Result;
use crate::mem::reduce;
use crate::types::{DataType, RedOp};

pub(super) fn build(
    s: &mut Schedule<'_>,
    cx: &Cx<'_>,
    scratch: &mut Scratch,
    shares_memory: &dyn Fn(usize) -> bool,
) -> Result<()> {
    let (co, rank, n) = (cx.co, cx.rank, cx.n);
    if co.wire.is_some_and(|w| w != co.dtype) {
        return allreduce_wire(s, cx, scratch);
    }
    let chunks = |o: usize| part(co.count, n, o);
    let results = Results { dest: Dest::All, stream: cx.stream, by_address: cx.recv_by_address };
    let fused = n == 2
        && cx.bytes >= plan::get().fuse_min
        && shares_memory(1 - rank)
        && !(co.dtype.is_narrow_float() && co.op == RedOp::Avg);
    if !fused {
        return reduce_phase(s, cx, scratch, &chunks, &|o| chunks(o).0, results);
    }
    // Both ranks reduce pieces of the whole vector from both inputs and write each
    // result into both recvbuffs (every byte read once and written once); the
    // pipelined reduction is the fallback the offers choose when either rank
    // cannot. Not over TCP, where it could never happen.
    let mut res = Ok(());
    let how = Exchange::Reduce { dtype: co.dtype, op: co.op, stream: cx.stream };
    let block = Block { at: cx.recv, src: cx.send, len: cx.bytes };
    s.swap(1 - rank, block, how, |_| {}, |s| res = reduce_phase(s, cx, scratch, &chunks, &|o| chunks(o).0, results));
    res
}

/// Elements of one window of a wire all_reduce whose wire type is `wire` (at most the
/// count): the device kernels split windows among owners the same way.
pub fn wire_window_elems(wire: DataType) -> usize {
    (plan::get().wire_window / wire.size()).max(1)
}

/// all_reduce whose data crosses the transport in `co.wire`, a narrower float type:
/// each contribution is rounded to the wire type once, the owner accumulates in the
/// data type (float32 or float64), and the reduced result is rounded to the wire
/// type once more for the trip back. Every rank, the owner included, takes the
/// wire-rounded result, so all ranks end with identical values. The message goes in
/// windows of `wire_window` wire bytes (`plan::Plan`) over two scratch slots that alternate.
fn allreduce_wire(s: &mut Schedule<'_>, cx: &Cx<'_>, scratch: &mut Scratch) -> Result<()> {
    let Cx { co, n, .. } = *cx;
    let (dt, wire) = (co.dtype, co.wire.expect("wire type set"));
    let (es, ws) = (dt.size(), wire.size());
    let win = wire_window_elems(wire).min(co.count);
    if n == 1 {
        // One rank: nothing travels, but the result still goes through the wire type
        // so that it does not depend on the number of ranks.
        let count = co.count;
        let (src, dst) = (cx.send_buf(count * es), cx.recv_buf(count * es));
        let tmp = scratch.buf(win * ws)?;
        s.local(
            move || {
                let tmp = tmp.bytes_mut(0, win * ws);
                for first in (0..count).step_by(win) {
                    let m = win.min(count - first);
                    // Through tmp, so that sendbuff is read before recvbuff (maybe the same) is written.
                    reduce::convert(dt, src.bytes(first * es, m * es), wire, &mut tmp[..m * ws]);
                    reduce::convert(wire, &tmp[..m * ws], dt, dst.bytes_mut(first * es, m * es));
                }
                Ok(())
            },
            &[],
        );
        return Ok(());
    }
    let slot = |scratch: &mut Scratch| -> Result<WireSlot> {
        Ok(WireSlot {
            out: scratch.buf(win * ws)?,
            res: scratch.buf(win * ws)?,
            acc: scratch.buf(win.div_ceil(n) * es + es)?,
        })
    };
    let slots = [slot(scratch)?, slot(scratch)?];
    // Steps that use each slot, which its next window waits for.
    let mut users: [Vec<usize>; 2] = Default::default();
    for (k, first) in (0..co.count).step_by(win).enumerate() {
        let after = std::mem::take(&mut users[k % 2]);
        users[k % 2] = wire_window(s, cx, (first, win.min(co.count - first)), &slots[k % 2], &after);
    }
    Ok(())
}

/// Scratch of one window of a wire all_reduce: outgoing contributions and results in
/// wire form, and this rank's accumulator.
struct WireSlot {
    out: Buf,
    res: Buf,
    acc: Buf,
}

/// Elements `first..first + count` of a wire all_reduce, split among the owners like a
/// whole message; `after`: steps that must finish before `slot` is written. Returns
/// the steps that use the slot.
fn wire_window(
    s: &mut Schedule<'_>,
    cx: &Cx<'_>,
    window: (usize, usize),
    slot: &WireSlot,
    after: &[usize],
) -> Vec<usize> {
    let Cx { co, rank, n, .. } = *cx;
    let (first, count) = window;
    let (dt, wire, op) = (co.dtype, co.wire.expect("wire type set"), co.op);
    let (es, ws) = (dt.size(), wire.size());
    let whole = |b: Buf| b.sub(first * es, count * es);
    let (send, recv) = (whole(cx.send_buf(co.count * es)), whole(cx.recv_buf(co.count * es)));
    let &WireSlot { out, res, acc } = slot;
    let mut users = Vec::new();
    // 1. Contributions to the other owners, rounded to the wire type.
    for o in (0..n).filter(|&o| o != rank) {
        let (off, len) = part(count, n, o);
        for (a, m) in segments(len, wire) {
            let at = off + a;
            let conv = s.local(
                move || {
                    reduce::convert(dt, send.bytes(at * es, m * es), wire, out.bytes_mut(at * ws, m * ws));
                    Ok(())
                },
                after,
            );
            users.push(s.send(o, out.at(at * ws, m * ws), m * ws, &[conv]));
        }
    }
    // 2. My chunk: accumulate in the data type, round once to the wire type.
    let (my_off, my_len) = part(count, n, rank);
    for (a, m) in segments(my_len, wire) {
        let at = my_off + a;
        let init = s.local(
            move || {
                acc.bytes_mut(a * es, m * es).copy_from_slice(send.bytes(at * es, m * es));
                Ok(())
            },
            after,
        );
        let mut prev = init;
        for j in 1..n {
            let peer = (rank + j) % n;
            let sink = Sink::ReduceConv { acc: acc.at(a * es, m * es), acc_type: dt, wire, op };
            prev = s.recv(peer, m * ws, sink, &[prev]);
        }
        let ready = s.local(
            move || {
                let (accs, w) = (acc.bytes_mut(a * es, m * es), res.bytes_mut(at * ws, m * ws));
                reduce::finish_inplace(dt, op, n, accs);
                reduce::convert(dt, accs, wire, w);
                reduce::convert(wire, w, dt, recv.bytes_mut(at * es, m * es));
                Ok(())
            },
            &[prev],
        );
        users.push(ready);
        for p in (0..n).filter(|&p| p != rank) {
            users.push(s.send(p, res.at(at * ws, m * ws), m * ws, &[ready]));
        }
    }
    // 3. The other owners' results, widened back to the data type.
    for o in (0..n).filter(|&o| o != rank) {
        let (off, len) = part(count, n, o);
        for (a, m) in segments(len, wire) {
            let at = off + a;
            let got = s.recv(o, m * ws, Sink::Copy(res.at(at * ws, m * ws)), after);
            users.push(s.local(
                move || {
                    reduce::convert(wire, res.bytes(at * ws, m * ws), dt, recv.bytes_mut(at * es, m * es));
                    Ok(())
                },
                &[got],
            ));
        }
    }
    users
}
