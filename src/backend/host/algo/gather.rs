//! gather: every rank sends its block to the root, which receives each into its
//! place in recvbuff. Small calls take the board first (`fast`).

use super::Cx;
use crate::backend::host::engine::Schedule;
use crate::error::Result;

pub(super) fn build(s: &mut Schedule<'_>, cx: &Cx<'_>) -> Result<()> {
    let (co, bytes) = (cx.co, cx.bytes);
    if cx.rank != co.root {
        s.send(co.root, cx.send, bytes, &[]);
        return Ok(());
    }
    let recv = cx.recv_buf(cx.n * bytes);
    for p in cx.peers() {
        s.recv(p, bytes, cx.sink(recv.at(p * bytes, bytes)), &[]);
    }
    cx.copy_local(s, cx.send, recv.at(cx.rank * bytes, bytes), bytes);
    Ok(())
}
