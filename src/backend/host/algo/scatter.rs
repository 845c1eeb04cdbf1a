//! scatter: the root sends block p of its buffer to rank p. Small calls take the
//! board first (`fast`).

use super::Cx;
use crate::backend::host::engine::Schedule;
use crate::error::Result;

pub(super) fn build(s: &mut Schedule<'_>, cx: &Cx<'_>) -> Result<()> {
    let (co, bytes) = (cx.co, cx.bytes);
    if cx.rank != co.root {
        s.recv(co.root, bytes, cx.sink(cx.recv), &[]);
        return Ok(());
    }
    let send = cx.send_buf(cx.n * bytes);
    for p in cx.peers() {
        s.send(p, send.at(p * bytes, bytes), bytes, &[]);
    }
    cx.copy_local(s, send.at(cx.rank * bytes, bytes), cx.recv, bytes);
    Ok(())
}
