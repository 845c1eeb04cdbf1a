//! all_gather: every rank sends its block to every peer and receives theirs into
//! their places in recvbuff; the strided form (`fcclAllGatherAxis`) lays the blocks
//! out as rows. all_gather_v moves per-rank counts like all_to_allv and is built
//! there (`all_to_allv::build`). Small calls take the board first (`fast`).

use super::{Buf, Cx, P};
use crate::backend::host::engine::{Schedule, Sink};
use crate::error::Result;

pub(super) fn build(s: &mut Schedule<'_>, cx: &Cx<'_>) -> Result<()> {
    let (co, bytes, n) = (cx.co, cx.bytes, cx.n);
    let recv = Buf::new(cx.recv, n * bytes);
    let Some(st) = co.strided else {
        cx.copy_local(s, cx.send, recv.at(cx.rank * bytes, bytes), bytes);
        for p in cx.peers() {
            s.send(p, cx.send, bytes, &[]);
        }
        for p in cx.peers() {
            s.recv(p, bytes, cx.sink(recv.at(p * bytes, bytes)), &[]);
        }
        return Ok(());
    };
    // recvbuff holds `outer` rows of n blocks; block p of every row is rank p's.
    let es = co.dtype.size();
    let (block, stride) = (st.block * es, n * st.block * es);
    let rows = |p: usize| recv.at(p * block, (st.outer - 1) * stride + block);
    let (src, dst) = (P(cx.send), P(rows(cx.rank)));
    s.local(
        move || {
            let (src, dst) = (src, dst);
            for j in 0..st.outer {
                // SAFETY: row j of the source and of the destination (checked above).
                unsafe { std::ptr::copy(src.0.add(j * block), dst.0.add(j * stride), block) };
            }
            Ok(())
        },
        &[],
    );
    for p in cx.peers() {
        s.send(p, cx.send, bytes, &[]);
    }
    for p in cx.peers() {
        s.recv(p, bytes, Sink::Strided { dst: rows(p), block, stride }, &[]);
    }
    Ok(())
}
