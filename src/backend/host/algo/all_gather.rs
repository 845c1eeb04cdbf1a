//! all_gather: every rank sends its block to every peer and receives theirs into
//! their places in recvbuff; the strided form (`fcclAllGatherAxis`) lays the blocks
//! out as rows. all_gather_v moves per-rank counts like all_to_allv and is built
//! there (`all_to_allv::build`). Small calls take the board first (`fast`).

use super::Cx;
use crate::backend::host::engine::{Schedule, Sink};
use crate::error::Result;

pub(super) fn build(s: &mut Schedule<'_>, cx: &Cx<'_>) -> Result<()> {
    let (co, bytes, n) = (cx.co, cx.bytes, cx.n);
    let recv = cx.recv_buf(n * bytes);
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
    let rows = |p: usize| recv.sub(p * block, (st.outer - 1) * stride + block);
    let (src, dst) = (cx.send_buf(st.outer * block), rows(cx.rank));
    s.local(
        move || {
            for j in 0..st.outer {
                let (from, to) = (src.at(j * block, block), dst.at(j * stride, block));
                // SAFETY: row j of each (checked by at); memmove, as in place they may overlap.
                unsafe { std::ptr::copy(from, to, block) };
            }
            Ok(())
        },
        &[],
    );
    for p in cx.peers() {
        s.send(p, cx.send, bytes, &[]);
    }
    for p in cx.peers() {
        s.recv(p, bytes, Sink::Strided { dst: rows(p).at(0, block), block, stride }, &[]);
    }
    Ok(())
}
