//! Collectives that are not agreed on the host. Once every rank of a communicator
//! ordered on the streams by the executor (ranks in separate processes, no MPS) runs
//! with FERROCCL_CHECK=0, the descriptor exchange (`negotiate`) stops: each rank
//! writes its descriptor of a call into its ring in the control region
//! (`Ctl::post`) and goes on, and only the executor reads them, to enqueue the call.
//! No rank waits for another's answer: the others never wait on the host (unless
//! they are `ctl::POSTS` calls ahead of the executor), and the executor waits only
//! until the peers' posts of the call are there.
//!
//! What the exchange decided on every rank before anything was enqueued (different
//! collectives or counts, a captured stream, a rank that cannot take the call GPU to
//! GPU) the executor now finds after the other ranks' calls returned: it fails the
//! communicator and writes why into the region, the kernels and waits already queued
//! are released without moving data, and every rank's next call and
//! `fcclCommGetAsyncError` return that error (as NCCL's asynchronous errors; the
//! communicator must then be destroyed or aborted). Nothing is ever staged.

use super::ctl::{self, Ctl};
use super::desc::{Desc, Part};
use super::fallback::Fallback;
use super::negotiate::Agreed;
use super::{Inner, Ipc, Mode, EXECUTOR};
use crate::backend::{capture, Algo, Exec, Outcome};
use crate::coll::{counts, fingerprint, Call, VCounts};
use crate::error::{Error, Result};
use crate::mem::cuda;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What every error found this way adds: the communicator is over, and how to avoid it.
const FAILED: &str = "found by the executor (rank 0) after the other ranks' calls returned, as FERROCCL_CHECK=0 \
    does not agree on device calls before enqueuing them; no data was moved for it, and the communicator's \
    device calls now fail: destroy or abort it. Run with FERROCCL_CHECK=1 to have such a call fail alone \
    on every rank and the communicator stay usable";

impl Ipc {
    /// Runs one eligible collective by posting this rank's descriptor (the executor:
    /// reading every rank's and enqueuing the call); buffers in `ctx` on `device`.
    pub(super) fn run_posted(
        &self,
        x: &mut Exec<'_>,
        call: &Call,
        inner: &mut Inner,
        ctx: cuda::Ctx,
        device: i32,
    ) -> Result<Outcome> {
        let ctl = self.ctl.as_ref().map_err(|m| Error::internal(format!("posting without a control region: {m}")))?;
        let what = format!("{} (collective #{})", call.coll.kind.c_name(), call.seq);
        if let Some(e) = self.watch.failed_elsewhere(ctl, &what) {
            return Err(e);
        }
        let (rank, n) = (self.rank, self.nranks);
        let c = &call.coll;
        let fp = fingerprint::one(call);
        let (mut mine, why) = if capture::capturing(c.stream)? {
            (Desc::new(Part::Captured, fp, c.v.clone()), None)
        } else {
            let prepared = match self.stream_mode(inner, ctx, device) {
                Mode::Stream(_) => {
                    inner.close_finished(ctl);
                    self.prepare(call, ctx, device, inner, true)
                }
                Mode::Synced => Err(Fallback::new("its ranks share a process", "")),
                Mode::Off(f) => Err(f),
            };
            match prepared {
                Ok(d) => (d, None),
                Err(f) => (Desc::new(Part::Cannot, fp, c.v.clone()), Some(f)),
            }
        };
        mine.posts = true;
        let p = inner.posts + 1;
        inner.posts = p;
        let descs = if rank == EXECUTOR {
            let all = self.gather(x, ctl, p, mine, &what);
            ctl.consumed().store(p, Ordering::Release);
            match all {
                Ok(d) => d,
                Err(e) => {
                    self.watch.fail(ctl, rank, &e);
                    return Err(e);
                }
            }
        } else {
            if let Err(e) = self.free_slot(x, ctl, p, &what).and_then(|_| ctl.post(rank, p, &mine.encode(n))) {
                inner.detour = None;
                self.watch.fail(ctl, rank, &e);
                return Err(e);
            }
            match mine.part {
                Part::Takes => return self.run_agreed(x, call, inner, Agreed::default(), (ctx, device)),
                Part::Captured => {
                    inner.k = inner.k.wrapping_add(1);
                    x.algo = Algo::Refused;
                    return Ok(Outcome::Failed(capture::refusal(c.kind.c_name(), rank, c.stream, &[rank])));
                }
                Part::Cannot => {
                    inner.k = inner.k.wrapping_add(1);
                    let e = cannot(&what, rank, why);
                    self.watch.fail(ctl, rank, &e);
                    return Ok(Outcome::Failed(e));
                }
            }
        };
        self.verdict(x, call, inner, descs, why, (ctx, device))
    }

    /// The executor's verdict on every rank's post of `call` (`descs`, its own first;
    /// `why`: what kept it from taking part, if anything), and the call run on it.
    fn verdict(
        &self,
        x: &mut Exec<'_>,
        call: &Call,
        inner: &mut Inner,
        mut descs: Vec<Desc>,
        why: Option<Fallback>,
        (ctx, device): (cuda::Ctx, i32),
    ) -> Result<Outcome> {
        let (rank, n) = (self.rank, self.nranks);
        let c = &call.coll;
        let ctl = self.ctl.as_ref().map_err(|m| Error::internal(m.clone()))?;
        let fail = |inner: &mut Inner, e: Error| {
            inner.k = inner.k.wrapping_add(1);
            inner.detour = None;
            self.watch.fail(ctl, rank, &e);
            Ok(Outcome::Failed(e))
        };
        let who: Vec<usize> = (0..n).filter(|&q| descs[q].part == Part::Captured).collect();
        if !who.is_empty() {
            x.algo = Algo::Refused;
            let e = capture::refusal(c.kind.c_name(), rank, c.stream, &who);
            if who.len() == n {
                // Every rank refused it alike, and nothing was enqueued anywhere.
                inner.k = inner.k.wrapping_add(1);
                inner.detour = None;
                return Ok(Outcome::Failed(e));
            }
            return fail(inner, Error { msg: format!("{}; {FAILED}", e.msg), ..e });
        }
        let mut gone = Vec::new();
        inner.freed.apply(ctl, rank, &self.pids, ctx, &mut inner.maps, &mut gone);
        self.defer_close(inner, std::mem::take(&mut gone));
        if let Some(d) = fingerprint::disagreement(rank, 1..n, &descs[rank].fp, |q| &descs[q].fp) {
            x.algo = Algo::Mismatch;
            return fail(inner, Error::mismatch(format!("ranks called different collectives: {d}; {FAILED}")));
        }
        let unable: Vec<usize> = (0..n).filter(|&q| descs[q].part != Part::Takes).collect();
        if !unable.is_empty() {
            let mine =
                why.map(|f| format!(" (rank {rank}: {}{}{})", f.why, if f.fix.is_empty() { "" } else { "; " }, f.fix));
            let list = unable.iter().map(|q| q.to_string()).collect::<Vec<_>>().join(", ");
            return fail(
                inner,
                Error::unavailable(format!(
                    "{} of collective #{}: rank(s) {list} could not take it GPU to GPU{}; it cannot be staged \
                     through host memory instead, as that needs every rank to agree first; {FAILED}",
                    c.kind.c_name(),
                    call.seq,
                    mine.unwrap_or_default()
                )),
            );
        }
        let counts: Vec<VCounts> = descs.iter_mut().filter_map(|d| d.counts.take()).collect();
        if counts.len() == n {
            if let Some(d) = counts::first_finding(c, &counts) {
                return fail(inner, Error::mismatch(format!("{d}; {FAILED}")));
            }
        }
        self.run_agreed(x, call, inner, Agreed { descs, counts, gone, posts: true }, (ctx, device))
    }

    /// `run_streamed` on the registration of this rank's stream mode.
    fn run_agreed(
        &self,
        x: &mut Exec<'_>,
        call: &Call,
        inner: &mut Inner,
        agreed: Agreed,
        (ctx, device): (cuda::Ctx, i32),
    ) -> Result<Outcome> {
        let (ctl, a) = match self.stream_mode(inner, ctx, device) {
            Mode::Stream(reg) => (reg.ctl.clone(), reg.addrs()),
            _ => return Err(Error::internal("a posted call without stream memory operations")),
        };
        let ctl: Arc<Ctl> = ctl;
        let out = self.run_streamed(x, call, inner, agreed, (&ctl, a), (ctx, device));
        if let Err(e) = &out {
            // Peers may already wait on the streams for this rank's part.
            self.watch.fail(&ctl, self.rank, e);
        }
        out
    }

    /// The executor's wait for every peer's post of call `p`: every rank's descriptor,
    /// `mine` first. Counts as this call's one host exchange (it depends on the peers'
    /// arrival, though it answers nothing).
    fn gather(&self, x: &mut Exec<'_>, ctl: &Ctl, p: u64, mine: Desc, what: &str) -> Result<Vec<Desc>> {
        let n = self.nranks;
        x.exchanges += 1;
        let mut descs: Vec<Option<Desc>> = (0..n).map(|_| None).collect();
        descs[EXECUTOR] = Some(mine);
        let mut wait = Waiting::new(self.timeout);
        loop {
            for (q, slot) in descs.iter_mut().enumerate() {
                if slot.is_none() {
                    if let Some(b) = ctl.posted(q, p) {
                        let per_rank = b.len() != Desc::size(n, false);
                        let d =
                            Desc::decode(&b, n, per_rank).map_err(|e| e.context(format_args!("rank {q}'s post")))?;
                        *slot = Some(d);
                    }
                }
            }
            let missing: Vec<usize> = (0..n).filter(|&q| descs[q].is_none()).collect();
            if missing.is_empty() {
                return Ok(descs.into_iter().flatten().collect());
            }
            wait.step(self, ctl, &missing, || format!("{what}: waiting for the posts of rank(s) {missing:?}"))?;
        }
    }

    /// Waits until the executor has read call `p - POSTS`, whose slot `p` reuses.
    fn free_slot(&self, x: &mut Exec<'_>, ctl: &Ctl, p: u64, what: &str) -> Result<()> {
        let reached = || ctl.consumed().load(Ordering::Acquire) + ctl::POSTS >= p;
        if reached() {
            return Ok(());
        }
        x.exchanges += 1;
        let mut wait = Waiting::new(self.timeout);
        while !reached() {
            wait.step(self, ctl, &[EXECUTOR], || {
                format!("{what}: {} calls ahead of the executor (rank 0), waiting for it to read them", ctl::POSTS)
            })?;
        }
        Ok(())
    }
}

/// A host wait for other ranks: spins, then yields, then sleeps; Err once it cannot
/// end (the communicator failed or was aborted, a rank it waits for died, the
/// timeout passed).
struct Waiting {
    rounds: u32,
    deadline: Instant,
}

impl Waiting {
    fn new(timeout: Duration) -> Waiting {
        Waiting { rounds: 0, deadline: Instant::now() + timeout }
    }

    fn step(&mut self, ipc: &Ipc, ctl: &Ctl, on: &[usize], what: impl Fn() -> String) -> Result<()> {
        self.rounds += 1;
        if self.rounds < 200 {
            std::hint::spin_loop();
            return Ok(());
        }
        if self.rounds < 2000 {
            std::thread::yield_now();
            return Ok(());
        }
        if ctl.failed().load(Ordering::Acquire) != 0 {
            return Err(super::watch::gave_up(ctl, &what()));
        }
        if ipc.watch.aborted.load(Ordering::Acquire) {
            return Err(Error::remote(format!("{}: the communicator was aborted", what())));
        }
        let me = std::process::id();
        if let Some(&q) = on.iter().find(|&&q| ipc.pids[q] != me && crate::sys::process_gone(ipc.pids[q])) {
            return Err(Error::remote_rank(q, format!("{}: rank {q} (pid {}) died", what(), ipc.pids[q])));
        }
        if Instant::now() >= self.deadline {
            return Err(Error::timeout_blaming(on.first().copied(), format!("{} for longer than the timeout", what())));
        }
        std::thread::sleep(Duration::from_micros(50));
        Ok(())
    }
}

/// The error of a rank that cannot take a posted call GPU to GPU (`why`).
fn cannot(what: &str, rank: usize, why: Option<Fallback>) -> Error {
    let (reason, fix) = why.map(|f| (f.why, f.fix)).unwrap_or_default();
    Error::unavailable(format!(
        "{what} on rank {rank}: it cannot take the call GPU to GPU ({reason}){}{fix}; with FERROCCL_CHECK=0 the \
         ranks do not agree on device calls first, so it cannot be staged through host memory instead, and the \
         communicator's device calls now fail: destroy or abort it, and run with FERROCCL_CHECK=1 to have such \
         calls staged",
        if fix.is_empty() { "" } else { "; " }
    ))
}
