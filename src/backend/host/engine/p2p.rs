//! fcclSend and fcclRecv: the handshake that makes a count mismatch fail both
//! sides and leave the streams aligned. The receiver announces its count when its
//! run starts ([`K_P2P_REPLY`]); the sender announces its count in its header,
//! with the payload when the send is small ([`K_P2P_EAGER`]); a larger payload
//! follows once the counts agree: through the stream, by address, or as a swap
//! offer when both ranks exchange in place. See docs/design/host.md, "Send and
//! receive".

use super::inplace::overlaps_p2p;
use super::run::Run;
use super::schedule::{Action, Schedule};
use super::state::{Peer, Tx};
use super::tx::direct_desc;
use super::wire::{encode_desc, DESC, K_P2P_DATA, K_P2P_DIRECT, K_P2P_SWAP};
#[cfg(doc)]
use super::wire::{K_P2P_EAGER, K_P2P_REPLY};
use crate::backend::host::plan::Plan;
use crate::error::Error;
use crate::mem::shared;
use crate::transport::Link;
use crate::types::DataType;

/// What a point-to-point step is, for error messages (formatted only on error).
#[derive(Clone, Copy)]
pub struct P2pCall {
    pub send: bool,
    pub count: usize,
    pub dtype: DataType,
    pub peer: usize,
}

impl P2pCall {
    /// The fcclSend or fcclRecv `co`.
    pub fn of(co: &crate::coll::Coll) -> P2pCall {
        P2pCall { send: co.kind == crate::coll::CollKind::Send, count: co.count, dtype: co.dtype, peer: co.root }
    }
}

impl std::fmt::Display for P2pCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, dir) = if self.send { ("fcclSend", "to") } else { ("fcclRecv", "from") };
        write!(f, "{name} of {} x {} {dir} rank {}", self.count, self.dtype, self.peer)
    }
}

/// The descriptor of an fcclSend's payload when it goes by address: not when this
/// run also receives into that buffer (in place), which would overwrite it while
/// the peer reads it, unless `shares_cores` (ranks share cores) and it has at
/// least `gated_min` bytes: then the receive writes only what the peer has
/// reported read (see `inplace::InPlace`).
pub(super) fn p2p_direct(
    plan: &Plan,
    link: &mut dyn Link,
    sched: &Schedule<'_>,
    src: *const u8,
    len: usize,
    shares_cores: bool,
) -> Option<[u8; DESC]> {
    direct_desc(plan, link, src, len)
        .filter(|_| (shares_cores && len >= plan.gated_min) || !overlaps_p2p(sched, src, len, false))
}

/// Whether an fcclSend goes eagerly (count and payload in one message): small, and
/// not a payload the peer could read by address. Decided the same way when the
/// send starts and when the receiver's count arrives.
pub(super) fn p2p_eager(plan: &Plan, link: &mut dyn Link, sched: &Schedule<'_>, src: *const u8, len: usize) -> bool {
    len <= plan.eager_max && p2p_direct(plan, link, sched, src, len, false).is_none()
}

/// The error of an fcclSend/fcclRecv pair whose sizes differ (both sides report it).
pub fn p2p_mismatch(what: P2pCall, sender: usize, receiver: usize, sent: usize, received: usize) -> Error {
    Error::mismatch(format!(
        "{what}: rank {sender} sends {sent} bytes but rank {receiver} receives {received} bytes; make the counts and types of the matching fcclSend/fcclRecv agree"
    ))
}

impl Run<'_, '_> {
    /// The receiver's count `want` for fcclSend step `i` (already started) to peer
    /// `p`: an eager send is done (its payload went with its count); a large one
    /// sends its payload when the counts agree, as a swap offer when the receive is
    /// half of an exchange in place there (`pair`, see [`K_P2P_SWAP`]) and the send
    /// here. A mismatch fails the step here, and the receiver's step there, when it
    /// reads our count.
    pub(super) fn on_reply(&mut self, p: usize, st: &mut Peer, i: usize, want: usize, pair: bool) {
        let Action::P2pSend { src, len: mine, what, .. } = self.sched.steps[i].action else { unreachable!() };
        let tag = self.sched.steps[i].tag;
        let eager = p2p_eager(self.plan, self.t.link(p), self.sched, src, mine);
        let shares_cores = self.t.policy.shares_cores;
        let me = self.t.rank;
        if want != mine || eager {
            if want != mine {
                self.tally.fail(|| p2p_mismatch(what, me, p, mine, want));
                if !eager {
                    // No payload follows: the buffer is free for receives.
                    self.inplace.release(i);
                }
            }
            self.tally.finish(i);
        } else if pair && self.inplace.paired_send(i) {
            // Both ranks are in place: the payload is an offer of our block, which the
            // peer's receive swaps with its own (both sides decided alike).
            st.start_direct(self.t.link(p));
            let d = encode_desc(src, shared::lookup(src, mine));
            st.urgent.push_back(Tx::direct(K_P2P_SWAP, tag, src, mine, i, d, None));
        } else if let Some(d) = p2p_direct(self.plan, self.t.link(p), self.sched, src, mine, shares_cores) {
            st.start_direct(self.t.link(p));
            let mut tx = Tx::direct(K_P2P_DIRECT, tag, src, mine, i, d, None);
            // Receives of this run wait for the peer's read reports (see `Plan::gated_ahead`).
            tx.flag = u8::from(self.inplace.gated_send(i));
            st.urgent.push_back(tx);
        } else {
            let mut tx = Tx::data(K_P2P_DATA, tag, src, mine, Some(i));
            tx.progress = self.inplace.sent.get(i).map(|_| i);
            st.urgent.push_back(tx);
        }
    }
}
