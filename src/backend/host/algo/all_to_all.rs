//! all_to_all: block p goes to rank p, and p's block for this rank lands in its
//! place in recvbuff. Large blocks first exchange offers (`engine::Exchange::Swap`):
//! when both ranks are in place and map each other's buffer, the pair swaps its
//! blocks between the two buffers, both ranks taking pieces; when both are out of
//! place, each block goes whole (by address where it can); otherwise (one in
//! place, or no mapping) piece by piece through the rings. A rank in place must
//! not lose a piece before sending it: receiving a piece waits until the same
//! piece has been written to p's stream (never sent by address), and p does the
//! same, so neither waits for the other's reads and no copy of the input is
//! needed. Small blocks are one piece, which pairs up with a whole block. See
//! docs/design/host.md, "all_to_all in place".

use super::Cx;
use crate::backend::host::engine::{Block, Exchange, Schedule};
use crate::backend::host::plan;
use crate::error::Result;

pub(super) fn build(s: &mut Schedule<'_>, cx: &Cx<'_>) -> Result<()> {
    let (bytes, n, plan) = (cx.bytes, cx.n, plan::get());
    let in_place = cx.send == cx.recv;
    let (send, recv) = (cx.send_buf(n * bytes), cx.recv_buf(n * bytes));
    cx.copy_local(s, send.at(cx.rank * bytes, bytes), recv.at(cx.rank * bytes, bytes), bytes);
    for p in cx.peers() {
        let (from, to) = (send.sub(p * bytes, bytes), recv.sub(p * bytes, bytes));
        let whole = |s: &mut Schedule<'_>| {
            s.send(p, from.at(0, bytes), bytes, &[]);
            s.recv(p, bytes, cx.sink(to.at(0, bytes)), &[]);
        };
        let staged = |s: &mut Schedule<'_>| {
            let mut a = 0;
            while a < bytes {
                let m = plan.inplace_piece.min(bytes - a);
                let sent = s.send_staged(p, from.at(a, m), m, &[]);
                s.recv(p, m, cx.sink(to.at(a, m)), &[sent]);
                a += m;
            }
        };
        // Offers also where nothing goes by address (TCP): they choose whole
        // blocks for two ranks out of place.
        if bytes >= plan.swap_min {
            let block = Block { at: to.at(0, bytes), src: from.at(0, bytes), len: bytes };
            s.swap(p, block, Exchange::Swap, whole, staged);
        } else if in_place {
            staged(s);
        } else {
            whole(s);
        }
    }
    Ok(())
}
