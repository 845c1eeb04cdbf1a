//! fcclSend and fcclRecv steps of one run over the same bytes (a ring shift or an
//! exchange in one buffer): each send sends what its buffer held when the run
//! started, and the receives write none of it before it has left. See
//! docs/design/host.md, "Send and receive in place".

use super::exchange::swap_capable;
use super::schedule::{Action, Schedule, Step};
use crate::backend::host::plan::Plan;
use crate::mem::pool::PooledBuf;
use crate::transport::Transport;

/// The fcclSend and fcclRecv steps of one run whose buffers overlap (in place, as
/// a ring shift or an exchange in one buffer): the data each send sends is what
/// its buffer held when the run started, and the receives write none of it
/// before it has left.
///
/// A receive that starts at or below an overlapping send's buffer writes only
/// bytes below the point up to which the send's payload has left: copied into the
/// ring, or, for a send by address, reported read by its receiver
/// (`Link::report_read`). So it never needs the send to run ahead of it. In a ring
/// shift of such ranks through the rings, each send waits for ring space, which
/// its receiver frees as far as its own send has gone, and some rank can always
/// move (the one whose send is furthest behind). A gated receive of a message sent
/// by address reads up to `gated_ahead` (`plan::Plan`) bytes ahead of its gate into a buffer of
/// its own, and reports them read: the ranks of a ring shift by address all read
/// that much before any has to write. A receive that starts above an overlapping
/// send would need that send to lead by the distance, which can exceed any ring:
/// that send's payload is copied aside when the run starts instead.
///
/// The k-th send to a peer and the k-th receive from it over the same bytes, large
/// and swappable here, are offered as an exchange in place ([`K_P2P_SWAP`](super::wire::K_P2P_SWAP)).
#[derive(Default)]
pub(super) struct InPlace {
    /// (receive, send) steps whose buffers overlap, the receive starting at or
    /// below the send.
    gates: Vec<(usize, usize)>,
    /// Payload bytes each send step has copied out of its buffer, by step (empty
    /// when no receive waits for a send).
    pub(super) sent: Vec<usize>,
    /// (receive, send) exchanges in place that this rank can swap.
    pairs: Vec<(usize, usize)>,
    /// Copies of the sends that a receive overlaps above their start.
    pub(super) staged: Vec<PooledBuf>,
}

impl InPlace {
    /// Finds the run's overlapping fcclSend/fcclRecv steps (none in almost every run).
    pub(super) fn setup(&mut self, t: &mut Transport, sched: &mut Schedule<'_>, plan: &Plan) {
        self.gates.clear();
        self.sent.clear();
        self.pairs.clear();
        self.staged.clear();
        let p2p = |a: &Action<'_>| match *a {
            Action::P2pSend { peer, src, len, .. } if len > 0 => Some((true, peer, src as usize, len)),
            Action::P2pRecv { peer, dst, len, .. } if len > 0 => Some((false, peer, dst as usize, len)),
            _ => None,
        };
        let steps = &mut sched.steps;
        if !steps.iter().any(|s| matches!(p2p(&s.action), Some((false, ..)))) {
            return;
        }
        let overlap = |a: usize, al: usize, b: usize, bl: usize| a < b + bl && b < a + al;
        let calls = |steps: &[Step<'_>]| -> Vec<(usize, (bool, usize, usize, usize))> {
            steps.iter().enumerate().filter_map(|(k, s)| p2p(&s.action).map(|c| (k, c))).collect()
        };
        // Sends that a receive overlaps above their start are copied aside first.
        let before = calls(steps);
        for &(j, (_, _, src, sl)) in before.iter().filter(|c| c.1 .0) {
            let above = before.iter().any(|&(_, (send, _, dst, dl))| !send && dst > src && overlap(dst, dl, src, sl));
            if let (true, Action::P2pSend { src: at, len, .. }) = (above, &mut steps[j].action) {
                let mut copy = PooledBuf::take(*len);
                // SAFETY: the caller's buffer holds len bytes (validated) and the pooled
                // one at least as many; they are distinct allocations.
                unsafe { std::ptr::copy_nonoverlapping(*at, copy.as_mut_ptr(), *len) };
                *at = copy.as_ptr();
                self.staged.push(copy);
            }
        }
        // Every overlap left has the receive at or below the send.
        let after = calls(steps);
        for &(i, (_, _, dst, dl)) in after.iter().filter(|c| !c.1 .0) {
            for &(j, (_, _, src, sl)) in after.iter().filter(|c| c.1 .0) {
                if overlap(dst, dl, src, sl) {
                    self.gates.push((i, j));
                }
            }
        }
        if self.gates.is_empty() {
            return;
        }
        self.sent.resize(steps.len(), 0);
        // Exchanges: the k-th receive from a peer and the k-th send to it, over the
        // same bytes and overlapping nothing else.
        let alone = |i: usize, j: usize| self.gates.iter().filter(|&&(a, b)| a == i || b == j).count() == 1;
        let mut pairs = Vec::new();
        for &(i, j) in &self.gates {
            let (Some((_, peer, dst, dl)), Some((_, to, src, sl))) = (p2p(&steps[i].action), p2p(&steps[j].action))
            else {
                continue;
            };
            let nth = |send: bool, k: usize| {
                steps[..k]
                    .iter()
                    .filter(|s| match s.action {
                        Action::P2pSend { peer: q, .. } => send && q == peer,
                        Action::P2pRecv { peer: q, .. } => !send && q == peer,
                        _ => false,
                    })
                    .count()
            };
            if peer == to
                && dst == src
                && dl == sl
                && dl > plan.eager_max
                && alone(i, j)
                && nth(false, i) == nth(true, j)
                && swap_capable(t.link(peer), dst as *const u8, dl)
            {
                pairs.push((i, j));
            }
        }
        self.pairs = pairs;
    }

    /// Whether receive step `i` waits for sends to leave its buffer.
    pub(super) fn gated(&self, i: usize) -> bool {
        self.gates.iter().any(|&(r, _)| r == i)
    }

    /// Whether a receive waits for send step `j` to leave its buffer.
    pub(super) fn gated_send(&self, j: usize) -> bool {
        self.gates.iter().any(|&(_, s)| s == j)
    }

    /// How many payload bytes of receive step `i` may be written now (at least its
    /// length when nothing holds it back).
    pub(super) fn allowed(&self, sched: &Schedule<'_>, i: usize) -> usize {
        let Action::P2pRecv { dst, len, .. } = sched.steps[i].action else { return usize::MAX };
        let mut lim = usize::MAX;
        for &(_, j) in self.gates.iter().filter(|g| g.0 == i) {
            if let Action::P2pSend { src, len: sl, .. } = sched.steps[j].action {
                if self.sent[j] < sl {
                    lim = lim.min((src as usize + self.sent[j]).saturating_sub(dst as usize));
                }
            }
        }
        if lim >= len {
            usize::MAX
        } else {
            lim
        }
    }

    /// Send step `j` will never copy (more of) its payload: its buffer is free.
    pub(super) fn release(&mut self, j: usize) {
        if let Some(s) = self.sent.get_mut(j) {
            *s = usize::MAX;
        }
    }

    /// Whether send step `j` is half of an exchange in place this rank can swap.
    pub(super) fn paired_send(&self, j: usize) -> bool {
        self.pairs.iter().any(|&(_, s)| s == j)
    }

    pub(super) fn paired_recv(&self, i: usize) -> bool {
        self.pairs.iter().any(|&(r, _)| r == i)
    }
}

/// Whether `[dst, dst + len)` overlaps the source of a point-to-point send in `sched`.
pub(super) fn overlaps_a_send(sched: &Schedule<'_>, dst: *mut u8, len: usize) -> bool {
    overlaps_p2p(sched, dst, len, true)
}

/// Whether `[p, p + len)` overlaps the buffer of an fcclSend (`sends`) or of an
/// fcclRecv of `sched`.
pub(super) fn overlaps_p2p(sched: &Schedule<'_>, p: *const u8, len: usize, sends: bool) -> bool {
    let (a, b) = (p as usize, p as usize + len);
    let hits = |q: usize, n: usize| q < b && a < q + n;
    sched.steps.iter().any(|s| match s.action {
        Action::P2pSend { src, len: n, .. } if sends => hits(src as usize, n),
        Action::P2pRecv { dst, len: n, .. } if !sends => hits(dst as usize, n),
        _ => false,
    })
}
