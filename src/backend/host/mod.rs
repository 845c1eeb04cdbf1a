//! The built-in backend: collectives as schedules over the transport's links.
//!
//! `algo` turns each collective into steps (a file per collective); `engine` runs them. A group of
//! calls on one communicator becomes one schedule, so matched sends and receives
//! never deadlock and independent collectives overlap.

pub mod algo;
pub mod announce;
pub mod eager;
pub mod engine;
pub mod fingerprint;
pub mod mapped;
pub mod msg;
pub mod plan;
pub mod reuse;

use super::{Exec, Outcome};
use crate::backend::Algo;
use crate::coll::{Call, Coll, CollKind};
use crate::error::{Error, Result};
use crate::transport::Transport;
use crate::types::DataType;
use engine::{RunCtl, Schedule};

/// Runs `calls` (one call, or a group's calls on this communicator) to completion.
///
/// `Err` is fatal for the communicator (timeout, dead peer, desynchronised
/// streams); `Ok(Outcome::Failed(e))` is a failed call after which the communicator
/// is fine (mismatched all_to_allv or send/recv counts detected before data moved).
/// `x.algo` says which host algorithm served them: "board" (small calls through the
/// shared announcement board), "mapped" (between the ranks' own buffers), "eager"
/// (copied ahead), or "schedule" (pieces over the links).
pub fn execute(x: &mut Exec<'_>, calls: &[Call]) -> Result<Outcome> {
    run(x, calls).map(Outcome::from)
}

fn run(x: &mut Exec<'_>, calls: &[Call]) -> Result<Option<Error>> {
    let (t, timeout, abort, check) = (&mut *x.t, x.timeout, x.abort, x.check);
    // What this run writes, for the next one's choice of stores (see `reuse`).
    let n = t.nranks;
    reuse::begin(calls.iter().filter(|c| c.coll.kind != CollKind::Send && !c.coll.is_noop()).map(|c| {
        let co = &c.coll;
        (co.recv as *const u8, algo::recv_bytes(co, n))
    }));
    let mut check = check;
    // Verdicts on per-rank counts, when the board already compared them.
    let mut agreed = None;
    let has_collective = calls.iter().any(|c| !c.coll.kind.is_p2p());
    if has_collective && t.board.is_some() {
        let rank = t.rank;
        match announce::run(t, calls, timeout, abort, &|| describe(calls, rank))? {
            announce::Announced::Done(r) => {
                x.algo = Algo::Board;
                return Ok(r);
            }
            announce::Announced::Mapped(r) => {
                x.algo = Algo::Mapped;
                return Ok(r);
            }
            // Fingerprints (and per-rank counts) were compared on the board.
            announce::Announced::OnLinks(v) => {
                check = false;
                agreed = v;
            }
        }
    }
    let rank = t.rank;
    let what = || describe(calls, rank);
    let ctl = RunCtl { timeout, abort, what: &what };
    if eager::eligible(rank, calls) {
        x.algo = Algo::Eager;
        return eager::run(t, calls, &ctl);
    }
    x.algo = Algo::Schedule;
    if check && t.nranks > 1 {
        if let Some(e) = fingerprint::agree(t, calls, &ctl)? {
            return Ok(Some(e));
        }
    }
    let mut scratch = algo::Scratch::default();
    let mut errors: Vec<Error> = Vec::new();

    // Calls with per-rank counts first agree on them: a mismatch fails every rank
    // and moves no data.
    let is_v = |k: CollKind| matches!(k, CollKind::AlltoAllv | CollKind::AllGatherV | CollKind::ReduceScatterV);
    let vcalls: Vec<&Call> = calls.iter().filter(|c| is_v(c.coll.kind) && !c.coll.is_noop()).collect();
    let mut skip = vec![false; calls.len()];
    if !vcalls.is_empty() || agreed.is_some() {
        let verdicts = match agreed {
            Some(v) => v,
            None => algo::alltoallv_agree(t, &vcalls, &ctl)?,
        };
        for (i, c) in calls.iter().enumerate() {
            if is_v(c.coll.kind) {
                if let Some(Some(e)) = verdicts.iter().find(|(s, _)| *s == c.seq).map(|(_, e)| e.clone()) {
                    errors.push(e);
                    skip[i] = true;
                }
            }
        }
    }

    let mut sched = Schedule::new(0);
    let mut self_sends: Vec<&Coll> = Vec::new();
    let mut self_recvs: Vec<&Coll> = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        if skip[i] || c.coll.is_noop() {
            continue;
        }
        let co = &c.coll;
        if co.kind.is_p2p() && co.peer == t.rank {
            if co.kind == CollKind::Send {
                self_sends.push(co)
            } else {
                self_recvs.push(co)
            }
            continue;
        }
        // Steps added from here on carry this call's tag: its sequence number and what it is.
        sched.tag = fingerprint::tag(c);
        let by_address = recv_by_address(t, co);
        let tr: &Transport = t;
        algo::build(&mut sched, co, t.rank, t.nranks, &mut scratch, by_address, &|p| tr.shares_memory(p))?;
    }
    // Sends to self match receives from self in order.
    if self_sends.len() != self_recvs.len() {
        errors.push(Error::invalid_usage(format!(
            "rank {} posted {} fcclSend to itself but {} fcclRecv from itself in this group; they must pair up",
            t.rank,
            self_sends.len(),
            self_recvs.len()
        )));
    }
    for (s, r) in self_sends.iter().zip(&self_recvs) {
        let (sb, rb) = (s.count * s.dtype.size(), r.count * r.dtype.size());
        if sb != rb {
            errors.push(Error::mismatch(format!(
                "rank {} sends {sb} bytes to itself but receives {rb} bytes from itself",
                t.rank
            )));
            continue;
        }
        // SAFETY: both buffers are valid for sb bytes (validated); ptr::copy
        // tolerates overlap.
        unsafe { std::ptr::copy(s.send, r.recv, sb) };
    }
    // A send/recv count mismatch leaves the streams aligned: not fatal.
    if let Some(e) = engine::run(t, &mut sched, &ctl)? {
        errors.push(e);
    }
    drop(scratch);
    Ok(errors.into_iter().next())
}

/// Whether every peer reads `co`'s recvbuff in place when this rank sends from it
/// (only asked of all_reduces large enough to write their results with streaming
/// stores, the one place where it changes the schedule).
fn recv_by_address(t: &mut Transport, co: &Coll) -> bool {
    let bytes = algo::recv_bytes(co, t.nranks);
    if co.kind != CollKind::AllReduce || bytes < crate::env::stream_min() {
        return false;
    }
    engine::goes_direct_to_all(t, co.recv, bytes)
}

/// Agrees the per-rank counts of `calls` (all_to_allv, all_gather_v,
/// reduce_scatter_v) with every peer over the links, for paths that move their data
/// elsewhere (staging): (seq, the error every rank returns when they do not pair up)
/// per call. `what` names the call in a timeout's message.
pub fn agree_counts(x: &mut Exec<'_>, calls: &[&Call], what: &dyn Fn() -> String) -> Result<Vec<(u64, Option<Error>)>> {
    let ctl = RunCtl { timeout: x.timeout, abort: x.abort, what };
    algo::alltoallv_agree(x.t, calls, &ctl)
}

/// Elements of one window of an all_reduce over a wire type (FERROCCL_HOST_PLAN's
/// wire_window): the device kernels split windows among owners the same way, so that
/// results are the host's bit for bit.
pub fn wire_window_elems(wire: DataType) -> usize {
    algo::wire_window_elems(wire)
}

/// Reads FERROCCL_HOST_PLAN now, so that its warnings come with the other settings'.
pub fn read_settings() {
    let _ = plan::get();
}

fn describe(calls: &[Call], rank: usize) -> String {
    match calls {
        [c] => format!("{} #{} on rank {rank}", c.coll.kind.c_name(), c.seq),
        _ => {
            let names: Vec<String> =
                calls.iter().take(4).map(|c| format!("{} #{}", c.coll.kind.c_name(), c.seq)).collect();
            let more = if calls.len() > 4 { format!(" and {} more", calls.len() - 4) } else { String::new() };
            format!("group of [{}{more}] on rank {rank}", names.join(", "))
        }
    }
}
