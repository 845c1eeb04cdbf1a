//! Per-rank counts that must pair up (all_to_allv, all_gather_v, reduce_scatter_v) and
//! send/recv sizes that must match: what each side tells the other, and the errors
//! every rank reports alike when they do not, worded the same on every path.

use super::{Coll, CollKind, VCounts};
use crate::error::Error;
use crate::types::DataType;

/// The two numbers a rank tells peer `p` about a call with per-rank counts, so that
/// both sides can check each other: (what I send you, what I expect from you).
/// reduce_scatter_v's counts must be identical everywhere, so it sends a digest of
/// the whole array both ways.
pub fn pair_values(co: &Coll, p: usize) -> (u64, u64) {
    let v = co.v.as_ref().expect("v-call has counts");
    match co.kind {
        CollKind::ReduceScatterV => {
            let h = v
                .recvcounts()
                .iter()
                .fold(0xcbf2_9ce4_8422_2325u64, |h, &c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3).rotate_left(7));
            (h, h)
        }
        _ => (v.sendcounts()[p] as u64, v.recvcounts()[p] as u64),
    }
}

/// Describes a disagreement between this rank `me` and `p` for a v-call.
pub fn describe_pair(co: &Coll, me: usize, p: usize, mine: (u64, u64), theirs: (u64, u64)) -> Option<String> {
    let v = co.v.as_ref().expect("v-call has counts");
    match co.kind {
        CollKind::ReduceScatterV => (mine.0 != theirs.0).then(|| {
            format!(
                "rank {me} and rank {p} passed different recvcounts arrays (rank {me}: {:?}); every rank must pass the same recvcounts",
                &v.recvcounts()[..v.recvcounts().len().min(16)]
            )
        }),
        CollKind::AllGatherV => {
            if mine.0 != theirs.1 {
                Some(format!(
                    "rank {me} sends sendcount = {} elements, but rank {p} expects recvcounts[{me}] = {}",
                    mine.0, theirs.1
                ))
            } else if theirs.0 != mine.1 {
                Some(format!(
                    "rank {p} sends sendcount = {} elements, but rank {me} expects recvcounts[{p}] = {}",
                    theirs.0, mine.1
                ))
            } else {
                None
            }
        }
        _ => {
            if mine.0 != theirs.1 {
                Some(format!(
                    "rank {me} sends sendcounts[{p}] = {} elements to rank {p}, but rank {p} expects recvcounts[{me}] = {}",
                    mine.0, theirs.1
                ))
            } else if theirs.0 != mine.1 {
                Some(format!(
                    "rank {p} sends sendcounts[{me}] = {} elements to rank {me}, but rank {me} expects recvcounts[{p}] = {}",
                    theirs.0, mine.1
                ))
            } else {
                None
            }
        }
    }
}

/// Describes a rank whose own counts disagree: it sends itself a different number
/// of elements than it expects from itself (`mine` = its pair values for itself).
pub fn describe_self(co: &Coll, me: usize, mine: (u64, u64)) -> Option<String> {
    (matches!(co.kind, CollKind::AlltoAllv | CollKind::AllGatherV) && mine.0 != mine.1)
        .then(|| format!("rank {me} sends {} elements to itself but expects recvcounts[{me}] = {}", mine.0, mine.1))
}

/// The error of a call with per-rank counts once every rank knows who found a
/// mismatch: this rank's own finding if it has one, else the names of the ranks
/// that did; None when nobody did.
pub fn counts_error(found: Option<String>, reporters: &[usize]) -> Option<Error> {
    if reporters.is_empty() {
        return None;
    }
    Some(Error::mismatch(match found {
        Some(d) => format!("{d}; no data was moved, the communicator is still usable"),
        None => format!(
            "ranks {} found mismatched counts with their peers (see their errors); no data was moved, the communicator is still usable",
            reporters.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
        ),
    }))
}

/// The error of a call with per-rank counts that do not pair up, from every rank's
/// counts (`counts[r]`: rank r's arrays), the same on every rank that sees them all;
/// None when they agree.
pub fn verdict(c: &Coll, me: usize, counts: &[VCounts]) -> Option<Error> {
    if counts.is_empty() {
        return None;
    }
    let findings = findings(c, counts);
    let reporters: Vec<usize> = (0..counts.len()).filter(|&r| findings[r].is_some()).collect();
    counts_error(findings[me].clone(), &reporters)
}

/// The first rank's finding about counts that do not pair up (what its error would
/// say), from every rank's counts; None when they agree.
pub fn first_finding(c: &Coll, counts: &[VCounts]) -> Option<String> {
    findings(c, counts).into_iter().flatten().next()
}

/// Each rank's finding about its own counts against its peers'.
fn findings(c: &Coll, counts: &[VCounts]) -> Vec<Option<String>> {
    let n = counts.len();
    let as_rank = |r: usize| Coll { v: Some(counts[r].clone()), ..c.clone() };
    let colls: Vec<Coll> = (0..n).map(as_rank).collect();
    let finding = |r: usize| -> Option<String> {
        let mine = &colls[r];
        (0..n)
            .filter(|&p| p != r)
            .find_map(|p| describe_pair(mine, r, p, pair_values(mine, p), pair_values(&colls[p], r)))
            .or_else(|| describe_self(mine, r, pair_values(mine, r)))
    };
    (0..n).map(finding).collect()
}

/// What a point-to-point step is, for error messages (formatted only on error).
#[derive(Clone, Copy)]
pub struct P2pCall {
    pub send: bool,
    pub count: usize,
    pub dtype: DataType,
    pub peer: usize,
    /// Its rank refused it (see `Coll::refused`).
    pub refused: bool,
}

impl P2pCall {
    /// The fcclSend or fcclRecv `co`.
    pub fn of(co: &Coll) -> P2pCall {
        P2pCall {
            send: co.kind == CollKind::Send,
            count: co.count,
            dtype: co.dtype,
            peer: co.peer,
            refused: co.refused,
        }
    }
}

impl std::fmt::Display for P2pCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, dir) = if self.send { ("fcclSend", "to") } else { ("fcclRecv", "from") };
        write!(f, "{name} of {} x {} {dir} rank {}", self.count, self.dtype, self.peer)
    }
}

/// The error of `what` on rank `me` whose peer `refuser` refused its side of the pair
/// (see `Coll::refused`): both calls fail, nothing moved.
pub fn p2p_refused(what: P2pCall, me: usize, refuser: usize) -> Error {
    Error::invalid_usage(format!(
        "{what} on rank {me}: rank {refuser} called its side of the pair on a stream being captured into a CUDA graph, \
         where send/recv staged through host memory cannot run; both calls fail and nothing moved (the communicator \
         stays usable). To fix: run the send/recv outside graph capture (capture only the compute around it), or use \
         the NCCL backend (FERROCCL_BACKEND=nccl, one GPU per rank), whose calls can be captured"
    ))
}

/// The verdict on a pair whose announcements disagree, from the side of `what` (rank
/// `me`, peer `peer`): the peer refused (`peer_refused`, its flag), this side did (the
/// caller reports its own refusal), or the sizes differ (`sent` by the sender, `received`
/// by the receiver). None: they agree.
pub fn p2p_verdict(
    what: P2pCall,
    me: usize,
    peer: usize,
    sent: usize,
    received: usize,
    peer_refused: bool,
) -> Option<Error> {
    let (sender, receiver) = if what.send { (me, peer) } else { (peer, me) };
    if peer_refused {
        Some(p2p_refused(what, me, peer))
    } else if what.refused || sent != received {
        Some(p2p_mismatch(what, sender, receiver, sent, received))
    } else {
        None
    }
}

/// The error of an fcclSend/fcclRecv pair whose sizes differ (both sides report it).
pub fn p2p_mismatch(what: P2pCall, sender: usize, receiver: usize, sent: usize, received: usize) -> Error {
    Error::mismatch(format!(
        "{what}: rank {sender} sends {sent} bytes but rank {receiver} receives {received} bytes; make the counts and types of the matching fcclSend/fcclRecv agree"
    ))
}
