//! fcclSend and fcclRecv: the handshake that makes a count mismatch fail both
//! sides and leave the streams aligned. The receiver announces its count when its
//! run starts ([`K_P2P_REPLY`]); the sender announces its count in its header,
//! with the payload when the send is small ([`K_P2P_EAGER`]); a larger payload
//! follows once the counts agree: through the stream, by address, or as a swap
//! offer when both ranks exchange in place. See docs/design/host.md, "Send and
//! receive".

use super::super::msg::{encode_desc, K_P2P_DATA, K_P2P_DIRECT, K_P2P_SWAP, P2P_PAIR, P2P_REFUSED};
#[cfg(doc)]
use super::super::msg::{K_P2P_EAGER, K_P2P_REPLY};
use super::direct::{p2p_direct, p2p_eager};
use super::run::Run;
use super::schedule::Action;
use super::state::{Peer, Tx};
use crate::coll::counts::p2p_verdict;
use crate::mem::shared;

impl Run<'_, '_> {
    /// The receiver's count `want` for fcclSend step `i` (already started) to peer
    /// `p`: an eager send is done (its payload went with its count); a large one
    /// sends its payload when the counts agree, as a swap offer when the receive is
    /// half of an exchange in place there (`pair`, see [`K_P2P_SWAP`]) and the send
    /// here. A mismatch fails the step here, and the receiver's step there, when it
    /// reads our count.
    /// `flag`: the reply's flag byte ([`P2P_PAIR`], [`P2P_REFUSED`]).
    pub(super) fn on_reply(&mut self, p: usize, st: &mut Peer, i: usize, want: usize, flag: u8) {
        let pair = flag & P2P_PAIR != 0;
        let Action::P2pSend { src, len: mine, what, .. } = self.sched.steps[i].action else { unreachable!() };
        let tag = self.sched.steps[i].tag;
        let eager = p2p_eager(self.plan, self.t.link(p), self.inplace, src, mine);
        let shares_cores = self.t.policy.shares_cores;
        let me = self.t.rank;
        let verdict = p2p_verdict(what, me, p, mine, want, flag & P2P_REFUSED != 0);
        if verdict.is_some() || eager {
            if let Some(e) = verdict {
                self.tally.fail(|| e);
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
        } else if let Some(d) = p2p_direct(self.plan, self.t.link(p), self.inplace, src, mine, shares_cores) {
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
