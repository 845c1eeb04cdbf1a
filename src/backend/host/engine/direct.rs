//! Which messages go by address (the peer reads them in place) rather than through
//! the stream: decided alike when a send starts and when a receiver's count arrives.
//! See docs/design/host.md, "The engine".

use super::super::msg::{encode_desc, DESC};
use super::inplace::InPlace;
use super::schedule::{Action, Schedule};
use crate::backend::host::plan::{self, Plan};
use crate::mem::shared;
use crate::transport::{Link, Transport};

/// The descriptor of a direct message of `len` bytes at `src` to the peer of
/// `link`, when the link lets the peer read it in place: the peer reads any of
/// our memory (a thread of this process, or cross-memory attach), or it maps our
/// shared allocations and the message lies in one.
pub(super) fn direct_desc(plan: &Plan, link: &mut dyn Link, src: *const u8, len: usize) -> Option<[u8; DESC]> {
    if len < plan.direct_min {
        return None;
    }
    #[cfg(test)]
    if super::tests::DIRECT_REFUSED.with(|c| c.get()) {
        return None;
    }
    let m = link.memory()?;
    let shared = if m.peer_maps() { shared::lookup(src, len) } else { None };
    if shared.is_none() && !m.peer_reads() {
        return None;
    }
    Some(encode_desc(src, shared))
}

/// Whether a message of `len` bytes at `src` would go by address to every peer.
pub fn goes_direct_to_all(t: &mut Transport, src: *const u8, len: usize) -> bool {
    let (me, plan) = (t.rank, plan::get());
    (0..t.nranks).filter(|&p| p != me).all(|p| direct_desc(plan, t.link(p), src, len).is_some())
}

/// The descriptor of an fcclSend's payload when it goes by address: not when this
/// run also receives into that buffer (in place), which would overwrite it while
/// the peer reads it, unless `shares_cores` (ranks share cores) and it has at
/// least `gated_min` bytes: then the receive writes only what the peer has
/// reported read (see `inplace::InPlace`).
pub(super) fn p2p_direct(
    plan: &Plan,
    link: &mut dyn Link,
    inplace: &InPlace,
    src: *const u8,
    len: usize,
    shares_cores: bool,
) -> Option<[u8; DESC]> {
    direct_desc(plan, link, src, len)
        .filter(|_| (shares_cores && len >= plan.gated_min) || !inplace.overlaps_recv(src, len))
}

/// Whether an fcclSend goes eagerly (count and payload in one message): small, and
/// not a payload the peer could read by address. Decided the same way when the
/// send starts and when the receiver's count arrives.
pub(super) fn p2p_eager(plan: &Plan, link: &mut dyn Link, inplace: &InPlace, src: *const u8, len: usize) -> bool {
    len <= plan.eager_max && p2p_direct(plan, link, inplace, src, len, false).is_none()
}

/// Whether send step `i` announces its count and sends its payload only once the
/// receiver's count is here.
pub(super) fn p2p_rendezvous(
    plan: &Plan,
    link: &mut dyn Link,
    sched: &Schedule<'_>,
    inplace: &InPlace,
    i: usize,
) -> bool {
    matches!(sched.steps[i].action, Action::P2pSend { src, len, .. } if !p2p_eager(plan, link, inplace, src, len))
}
