//! fcclSend and fcclRecv: one step each; the engine's handshake matches them with
//! the peer's (`engine::p2p`). Groups of small ones take `eager` instead.

use super::Cx;
use crate::backend::host::engine::Schedule;
use crate::coll::counts::P2pCall;
use crate::coll::CollKind;
use crate::error::Result;

pub(super) fn build(s: &mut Schedule<'_>, cx: &Cx<'_>) -> Result<()> {
    let co = cx.co;
    if co.kind == CollKind::Send {
        s.p2p_send(co.peer, cx.send, cx.bytes, P2pCall::of(co));
    } else {
        s.p2p_recv(co.peer, cx.recv, cx.bytes, P2pCall::of(co));
    }
    Ok(())
}
