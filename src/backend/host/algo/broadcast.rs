//! broadcast: the root sends its buffer to every peer (by address where the peer
//! can read it); out of place, its first send also copies each piece into its own
//! recvbuff while it is in cache. Small broadcasts and those between mapped
//! buffers take `fast` (board) or `mapped` first (see `plan`).

use super::Cx;
use crate::backend::host::engine::Schedule;
use crate::error::Result;

pub(super) fn build(s: &mut Schedule<'_>, cx: &Cx<'_>) -> Result<()> {
    let (co, bytes) = (cx.co, cx.bytes);
    if cx.rank != co.root {
        s.recv(co.root, bytes, cx.sink(cx.recv_buf(bytes).at(0, bytes)), &[]);
        return Ok(());
    }
    let (send, recv) = (cx.send_buf(bytes).at(0, bytes), cx.recv);
    let mut tee = (send != recv).then_some(recv);
    for p in cx.peers() {
        match tee.take() {
            Some(dst) => s.send_tee(p, send, bytes, dst, cx.copies_stream),
            None => s.send(p, send, bytes, &[]),
        };
    }
    if let Some(dst) = tee {
        cx.copy_local(s, send, dst, bytes);
    }
    Ok(())
}
