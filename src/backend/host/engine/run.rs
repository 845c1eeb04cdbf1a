//! The run loop: drives every step of a schedule at once until all are done.
//!
//! Each pass runs the local steps whose inputs are ready, visits every peer (its
//! outgoing stream, then its incoming one: `tx`, `rx`), and copies a piece of every
//! local copy that may run; a pass that moves nothing waits (`idle`). A visit
//! moves at most `Plan::piece` bytes, so every peer and copy progresses together.
//! See docs/design/host.md, "The engine".

use super::super::msg::{K_P2P_REPLY, P2P_PAIR, P2P_REFUSED};
use super::exchange::{swap_capable, Offer};
use super::idle::{describe_waiting, Idle, RunCtl};
use super::inplace::InPlace;
use super::schedule::{Action, Schedule};
use super::state::{Peer, Tx};
use crate::backend::host::plan::{self, Plan};
use crate::error::{Error, Result};
use crate::mem::copy;
use crate::transport::Transport;

/// Runs `sched` to completion. Fatal errors (timeout, dead peer, desynchronised
/// streams) return `Err` at once; a step-level error (a point-to-point count
/// mismatch, which leaves the streams aligned) comes back as `Ok(Some(e))` after
/// every other step finished.
pub fn run(t: &mut Transport, sched: &mut Schedule<'_>, ctl: &RunCtl<'_>) -> Result<Option<Error>> {
    if sched.steps.is_empty() {
        return Ok(None);
    }
    // The run's bookkeeping is kept between the runs of a thread, so that a small
    // call allocates nothing.
    let mut sc = SCRATCH.with(|c| c.take());
    let res = run_with(t, sched, ctl, &mut sc);
    // Copies of sends go back to the pool.
    sc.inplace.staged.clear();
    if res.is_err() {
        // The caller gets its buffers back: senders must stop writing into them.
        for st in &sc.peers {
            if let Some((slot, _)) = st.cur_rx.as_ref().and_then(|rx| rx.share) {
                slot.withdraw();
            }
        }
    }
    SCRATCH.with(|c| c.replace(sc));
    res
}

/// Buffers of an engine run.
#[derive(Default)]
struct RunScratch {
    done: Vec<bool>,
    peers: Vec<Peer>,
    locals: Vec<usize>,
    /// Copies in progress: (step, bytes copied).
    copies: Vec<(usize, usize)>,
    bounce: Vec<u8>,
    inplace: InPlace,
}

thread_local! {
    static SCRATCH: std::cell::Cell<RunScratch> = std::cell::Cell::new(RunScratch::default());
}

/// Which steps are done, how many are left, and the first step-level error.
pub(super) struct Tally<'r> {
    pub(super) done: &'r mut [bool],
    pub(super) remaining: usize,
    pub(super) err: Option<Error>,
}

impl Tally<'_> {
    /// Step `i` is done.
    #[inline]
    pub(super) fn finish(&mut self, i: usize) {
        self.done[i] = true;
        self.remaining -= 1;
    }

    /// Steps `a..b` will not run (an exchange in place made them unnecessary).
    pub(super) fn skip(&mut self, (a, b): (usize, usize)) {
        self.done[a..b].fill(true);
        self.remaining -= b - a;
    }

    /// Whether every step that step `i` waits for is done.
    #[inline]
    pub(super) fn ready(&self, sched: &Schedule<'_>, i: usize) -> bool {
        sched.steps[i].deps.iter().all(|&d| self.done[d])
    }

    /// Records a step's error (the first one is returned).
    pub(super) fn fail(&mut self, e: impl FnOnce() -> Error) {
        self.err.get_or_insert_with(e);
    }
}

/// One run: the schedule, the transport it runs over, and what the steps share.
/// The per-peer state is apart (`Peer`), so that a visit holds one peer's state
/// beside the run.
pub(super) struct Run<'r, 's> {
    pub(super) t: &'r mut Transport,
    pub(super) sched: &'r mut Schedule<'s>,
    pub(super) ctl: &'r RunCtl<'r>,
    pub(super) tally: Tally<'r>,
    pub(super) inplace: &'r mut InPlace,
    /// A piece of a direct message read with `PeerMemory::read` into a sink that
    /// cannot take it in place.
    pub(super) bounce: &'r mut Vec<u8>,
    pub(super) plan: &'static Plan,
}

impl Run<'_, '_> {
    /// `e` with the call's description in front.
    pub(super) fn context(&self, e: Error) -> Error {
        e.context((self.ctl.what)())
    }
}

fn run_with(
    t: &mut Transport,
    sched: &mut Schedule<'_>,
    ctl: &RunCtl<'_>,
    sc: &mut RunScratch,
) -> Result<Option<Error>> {
    let n = sched.steps.len();
    // A peer that failed or aborted earlier is reported as such, not as whatever
    // its half-sent messages would look like.
    t.check_flags().map_err(|e| e.context((ctl.what)()))?;
    let plan = plan::get();
    let RunScratch { done, peers, locals, copies, bounce, inplace } = sc;
    done.clear();
    done.resize(n, false);
    peers.resize_with(t.nranks, Peer::default);
    peers.iter_mut().for_each(Peer::reset);
    locals.clear();
    copies.clear();
    for s in sched.steps.iter_mut() {
        if let Action::SwapSend(o) | Action::SwapRecv { offer: o, .. } = &mut s.action {
            let link = t.link(o.peer);
            o.capable = o.capable
                && swap_capable(link, o.at, o.len)
                && (std::ptr::eq(o.src, o.at) || swap_capable(link, o.src, o.len));
        }
    }
    inplace.setup(t, sched, plan).map_err(|e| {
        // Peers may have begun the run: their messages would be taken for the next call's.
        let e = e.context((ctl.what)());
        Error {
            msg: format!("{}. This rank sent nothing of the call; the communicator is unusable now: destroy it", e.msg),
            ..e
        }
    })?;
    for (i, s) in sched.steps.iter().enumerate() {
        match &s.action {
            Action::Send { peer, len, .. } => {
                peers[*peer].send_q.push_back(i);
                peers[*peer].run_bytes += len;
            }
            Action::P2pSend { peer, len, .. } => {
                peers[*peer].send_q.push_back(i);
                peers[*peer].run_bytes += len;
                peers[*peer].p2p_sends += 1;
            }
            Action::Recv { peer, .. } | Action::SwapRecv { offer: Offer { peer, .. }, .. } => {
                peers[*peer].data_rq.push_back(i)
            }
            Action::SwapSend(o) => peers[o.peer].send_q.push_back(i),
            Action::P2pRecv { peer, len, what, .. } => {
                // Announce our count now: it reaches the sender while its data comes.
                peers[*peer].p2p_rq.push_back(i);
                let mut reply = Tx::control(K_P2P_REPLY, s.tag, *len);
                reply.flag = if inplace.paired_recv(i) { P2P_PAIR } else { 0 };
                if what.refused {
                    reply.flag |= P2P_REFUSED;
                }
                peers[*peer].urgent.push_back(reply);
            }
            Action::Local(_) => locals.push(i),
            Action::Copy { .. } => copies.push((i, 0)),
        }
    }
    let mut run =
        Run { t, sched, ctl, tally: Tally { done: &mut done[..], remaining: n, err: None }, inplace, bounce, plan };

    let mut idle = Idle::default();
    loop {
        let seen = idle.seen(run.t);
        let mut progressed = run.t.progress_io()?;
        progressed |= run.locals(locals)?;

        // Only sends that peers are reading are left: this rank helps copy them
        // (split copies). Not before: a rank that still receives or copies would
        // only trade its own work for its peer's.
        let help = run.tally.remaining == peers.iter().map(|st| st.direct_wait.len()).sum::<usize>();
        let me = run.t.rank;
        for (p, st) in peers.iter_mut().enumerate() {
            if p == me {
                continue;
            }
            progressed |= run.pump_tx(p, st, help)?;
            progressed |= run.pump_rx(p, st)?;
        }

        // A piece of every local copy that may run: after the links, whose peers wait.
        progressed |= run.copies(copies);

        // Done when every step is, and replies owed to peers have been written (and,
        // over TCP, handed to the kernel).
        if run.tally.remaining == 0
            && peers.iter().all(|st| st.cur_tx.is_none() && st.urgent.is_empty())
            && !run.t.unsent()
        {
            idle.unpublish(run.t);
            return Ok(run.tally.err);
        }
        if progressed {
            idle.progressed(run.t);
            continue;
        }
        let Run { t, sched, tally, .. } = &run;
        idle.wait(t, seen, ctl, || describe_waiting(t.rank, peers, sched, tally.done))?;
    }
}

impl Run<'_, '_> {
    /// Runs the local steps whose inputs are ready; true when any ran.
    fn locals(&mut self, locals: &mut Vec<usize>) -> Result<bool> {
        let mut progressed = false;
        let mut k = 0;
        while k < locals.len() {
            let i = locals[k];
            if self.tally.done[i] {
                // A fallback that an in-place exchange made unnecessary.
                locals.swap_remove(k);
            } else if self.tally.ready(self.sched, i) {
                if let Action::Local(f) = &mut self.sched.steps[i].action {
                    f()?;
                }
                self.tally.finish(i);
                locals.swap_remove(k);
                progressed = true;
            } else {
                k += 1;
            }
        }
        Ok(progressed)
    }

    /// Copies a piece of every local copy that may run; true when any did.
    fn copies(&mut self, copies: &mut Vec<(usize, usize)>) -> bool {
        let mut progressed = false;
        let mut k = 0;
        while k < copies.len() {
            let (i, off) = copies[k];
            if self.tally.done[i] {
                // A fallback that an in-place exchange made unnecessary.
                copies.swap_remove(k);
                continue;
            }
            if !self.tally.ready(self.sched, i) {
                k += 1;
                continue;
            }
            let Action::Copy { src, dst, len, stream } = self.sched.steps[i].action else { unreachable!() };
            let overlap = (src as usize) < dst as usize + len && (dst as usize) < src as usize + len;
            let n = if overlap { len } else { self.plan.piece.min(len - off) };
            // SAFETY: the schedule's contract: src and dst are valid for len bytes and
            // untouched by others until this step is done; overlapping ranges are
            // copied in one memmove.
            unsafe {
                if overlap {
                    std::ptr::copy(src, dst, len);
                } else {
                    copy::copy_stores(dst.add(off), src.add(off), n, stream);
                }
            }
            progressed = true;
            if off + n == len {
                self.tally.finish(i);
                copies.swap_remove(k);
            } else {
                copies[k].1 = off + n;
                k += 1;
            }
        }
        progressed
    }
}
