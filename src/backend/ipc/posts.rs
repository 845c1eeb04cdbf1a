//! Collectives that are not agreed on the host. Once every rank of a communicator
//! ordered on the streams (ranks in separate processes) runs with checkMode off, or
//! unset and a call has passed device memory on every rank, the
//! descriptor exchange (`negotiate`) stops: each rank writes its descriptor of a call
//! into its ring in the control region (`Ctl::post`) and goes on. A rank that moves
//! data (the executor; under MPS every rank) marks on its caller's stream where its
//! inputs are ready (an event) and queues a wait for the call's end; its proxy thread
//! reads every rank's post as it arrives and enqueues the rank's part on its own
//! stream after that event. No rank's calling thread waits for another rank (unless it
//! runs `ctl::POSTS` calls ahead of a reader).
//!
//! What the exchange decided on every rank before anything was enqueued (different
//! collectives or counts, a captured stream, a rank that cannot take the call GPU to
//! GPU) a proxy now finds after every rank's call returned: it fails the communicator
//! and writes why into the region, the kernels and waits already queued are released
//! without moving data, and every rank's next call and `fcclCommGetAsyncError` return
//! that error (as NCCL's asynchronous errors; the communicator must then be destroyed
//! or aborted). Nothing is ever staged.

use super::ctl::{self, Ctl};
use super::desc::{Desc, Part};
use super::fallback::Fallback;
use super::negotiate::Agreed;
use super::watch::Target;
use super::{Inner, Ipc, Mode, EXECUTOR};
use crate::backend::{capture, Algo, Exec, Outcome};
use crate::coll::{counts, fingerprint, Call, VCounts};
use crate::error::{Error, Result};
use crate::log;
use crate::mem::cuda;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What every error found this way adds: the communicator is over, and how to avoid it.
const FAILED: &str = "found by a proxy thread after the ranks' calls returned, as ranks sharing one GPU \
    post their device calls without agreeing on them first (checkMode off or unset, as NCCL); no data was moved \
    for it, and the communicator's device calls now fail: destroy or abort it. Set FERROCCL_CHECK=1 (or \
    checkMode FCCL_CHECK_FINGERPRINT) to have such a call fail alone on every rank and the communicator stay \
    usable";

impl Ipc {
    /// Runs one eligible collective by posting this rank's descriptor (a rank that moves
    /// data: handing the call to its proxy thread); buffers in `ctx` on `device`.
    pub(super) fn run_posted(
        &self,
        x: &mut Exec<'_>,
        call: &Call,
        inner: &mut Inner,
        ctx: cuda::Ctx,
        device: i32,
    ) -> Result<Outcome> {
        let ctl = self.ctl.as_ref().map_err(|m| Error::internal(format!("posting without a control region: {m}")))?;
        let what = Named(call);
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
                    self.mapped().close_finished(ctl);
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
        let k = inner.k.wrapping_add(1);
        inner.k = k;
        // Every rank's posts are read by the executor; under MPS by every rank.
        let proxied = rank == EXECUTOR || self.shares();
        if rank != EXECUTOR || self.shares() {
            if let Err(e) = self.free_slot(x, ctl, p, &what).and_then(|_| ctl.post(rank, p, &mine.encode(n))) {
                inner.detour = None;
                self.watch.fail(ctl, rank, &e);
                return Err(e);
            }
        }
        match mine.part {
            Part::Takes if proxied => self.hand_over(x, call, inner, Job::new(call, mine, p, k, ctx, device)),
            Part::Takes => {
                let reg = self.registration(inner, ctx, device)?;
                let detour = inner.detour.take();
                self.run_agreed(&mut x.algo, call, detour, Agreed::default(), reg, (ctx, device), k)
            }
            Part::Captured => {
                if proxied {
                    // The proxy still reads the others' posts: if they are not all
                    // captured, their streams wait for this call.
                    self.proxy.push(self, Job::new(call, mine, p, k, ctx, device))?;
                }
                x.algo = Algo::Refused;
                Ok(Outcome::Failed(capture::refusal(c.kind.c_name(), rank, c.stream, &[rank])))
            }
            Part::Cannot => {
                let e = cannot(what, rank, why);
                self.watch.fail(ctl, rank, &e);
                Ok(Outcome::Failed(e))
            }
        }
    }

    /// The caller's part of a posted call this rank moves data for: its stream marks
    /// where the inputs are ready (an event) and waits for the call's end (`done >= k`;
    /// under MPS every rank's `fin >= k`); the proxy thread reads the posts and enqueues
    /// the rank's part after the event. The caller waits for no rank.
    fn hand_over(&self, x: &mut Exec<'_>, call: &Call, inner: &mut Inner, mut job: Job) -> Result<Outcome> {
        let (ctl, a) = self.registration(inner, job.ctx, job.device)?;
        job.reg = Some((ctl.clone(), a));
        let (s, k) = (call.coll.stream, job.k);
        let detour = inner.detour.take();
        let ev = self.proxy.event(job.ctx)?;
        // SAFETY: the control words are registered in this context and outlive the
        // stream's use of them (Drop waits for every target); the detour's copies per
        // its contract (the call's own buffers, valid until the stream has run the call).
        unsafe {
            if let Some(d) = &detour {
                d.enter(s)?;
            }
            ev.record(s)?;
            if self.shares() {
                for q in 0..self.nranks {
                    cuda::stream_wait_geq(s, a.of(ctl.fin(q)), k)?;
                }
            } else {
                cuda::stream_wait_geq(s, a.of(Ctl::DONE), k)?;
            }
        }
        let mut targets: Vec<Target> = Vec::with_capacity(2 * self.nranks);
        if self.shares() {
            for q in 0..self.nranks {
                targets.push(Target { w: ctl.ready(q), v: k, writer: q });
                targets.push(Target { w: ctl.fin(q), v: k, writer: q });
            }
        } else {
            targets.extend((0..self.nranks).filter(|&q| q != EXECUTOR).map(|q| Target {
                w: ctl.ready(q),
                v: k,
                writer: q,
            }));
            targets.push(Target { w: Ctl::DONE, v: k, writer: EXECUTOR });
        }
        let what = format!("device call #{k} (collective #{})", call.seq);
        self.watch.pending(&targets, Instant::now() + self.timeout, what);
        job.ev = Some(ev);
        // Before the copy out: into pageable memory it returns only once the call ran.
        self.proxy.push(self, job)?;
        x.algo = if self.shares() { Algo::MpsProxy } else { Algo::ExecProxy };
        if let Some(d) = &detour {
            // SAFETY: as above.
            unsafe { d.leave(s)? };
            if d.finish(s)? {
                if let Some(e) = self.watch.failure().or_else(|| self.watch.failed_elsewhere(&ctl, "the call")) {
                    // Its host buffers did not get the results.
                    return Err(e);
                }
            }
        }
        Ok(Outcome::Done)
    }

    /// The control words registered in `ctx` and their device addresses there.
    fn registration(&self, inner: &mut Inner, ctx: cuda::Ctx, device: i32) -> Result<(Arc<Ctl>, ctl::Addrs)> {
        match self.stream_mode(inner, ctx, device) {
            Mode::Stream(reg) => Ok((reg.ctl.clone(), reg.addrs())),
            _ => Err(Error::internal("a posted call without stream memory operations")),
        }
    }

    /// The proxy's part of one posted call: every rank's post read, checked, and this
    /// rank's part enqueued on the proxy's stream `s` after the caller's event. Err (a
    /// rank died, a driver call failed) fails the communicator.
    fn proxy_one(&self, job: Job, cur: &mut cuda::Ctx, s: &mut Option<(cuda::Ctx, cuda::OwnedStream)>) -> Result<()> {
        // The proxy's thread uses no other context: set once, not entered per call.
        if *cur != job.ctx {
            cuda::set_current(job.ctx)?;
            *cur = job.ctx;
        }
        let ctl = self.ctl.as_ref().map_err(|m| Error::internal(m.clone()))?;
        let all = self.gather(ctl, job.p, job.mine, &Named(&job.call));
        ctl.consumed(self.rank).store(job.p, Ordering::Release);
        let descs = all?;
        let mut call = job.call;
        if let Some(ev) = job.ev {
            if s.as_ref().map_or(true, |(c, _)| *c != job.ctx) {
                *s = Some((job.ctx, cuda::OwnedStream::new()?));
            }
            let st = s.as_ref().expect("made above").1.stream();
            ev.wait_on(st)?;
            // The wait took the event's record as of now: the event may be recorded again.
            self.proxy.give_back(job.ctx, ev);
            call.coll.stream = st;
        }
        let mut algo = Algo::None;
        if let Outcome::Done = self.verdict(&mut algo, &call, descs, job.reg, (job.ctx, job.device), job.k)? {
            // Named as the caller's line names it (seq, kind, count, type), which said exec-proxy.
            log::info(format_args!(
                "rank {} seq {} {} count {} {} device call #{} enqueued by the proxy thread: backend ipc algorithm {}",
                self.rank,
                call.seq,
                call.coll.kind.c_name(),
                call.coll.count,
                call.coll.dtype.short_name(),
                job.k,
                algo.name()
            ));
        }
        Ok(())
    }

    /// The proxy's verdict on every rank's post of call `k` (`descs`, rank by rank), and
    /// this rank's part run on it.
    fn verdict(
        &self,
        algo: &mut Algo,
        call: &Call,
        mut descs: Vec<Desc>,
        reg: Option<(Arc<Ctl>, ctl::Addrs)>,
        (ctx, device): (cuda::Ctx, i32),
        k: u32,
    ) -> Result<Outcome> {
        let (rank, n) = (self.rank, self.nranks);
        let c = &call.coll;
        let ctl = self.ctl.as_ref().map_err(|m| Error::internal(m.clone()))?;
        let fail = |e: Error| {
            self.watch.fail(ctl, rank, &e);
            Ok(Outcome::Failed(e))
        };
        let who: Vec<usize> = (0..n).filter(|&q| descs[q].part == Part::Captured).collect();
        if !who.is_empty() {
            *algo = Algo::Refused;
            let e = capture::refusal(c.kind.c_name(), rank, c.stream, &who);
            if who.len() == n {
                // Every rank refused it alike, and nothing was enqueued anywhere.
                return Ok(Outcome::Failed(e));
            }
            return fail(Error { msg: format!("{}; {FAILED}", e.msg), ..e });
        }
        let mut gone = Vec::new();
        {
            let m = &mut *self.mapped();
            m.freed.apply(ctl, rank, &self.pids, ctx, &mut m.maps, &mut gone);
        }
        self.defer_close(std::mem::take(&mut gone));
        if let Some(d) =
            fingerprint::disagreement(rank, (0..n).filter(|&q| q != rank), &descs[rank].fp, |q| &descs[q].fp)
        {
            *algo = Algo::Mismatch;
            return fail(Error::mismatch(format!("ranks called different collectives: {d}; {FAILED}")));
        }
        let unable: Vec<usize> = (0..n).filter(|&q| descs[q].part != Part::Takes).collect();
        if !unable.is_empty() {
            let list = unable.iter().map(|q| q.to_string()).collect::<Vec<_>>().join(", ");
            return fail(Error::unavailable(format!(
                "{} of collective #{}: rank(s) {list} could not take it GPU to GPU (their errors say why); it \
                 cannot be staged through host memory instead, as that needs every rank to agree first; {FAILED}",
                c.kind.c_name(),
                call.seq,
            )));
        }
        let counts: Vec<VCounts> = descs.iter_mut().filter_map(|d| d.counts.take()).collect();
        if counts.len() == n {
            if let Some(d) = counts::first_finding(c, &counts) {
                return fail(Error::mismatch(format!("{d}; {FAILED}")));
            }
        }
        let reg = reg.ok_or_else(|| Error::internal("a posted call to run without its registration"))?;
        self.run_agreed(
            algo,
            call,
            None,
            Agreed { descs, counts, gone, posts: true, proxied: true },
            reg,
            (ctx, device),
            k,
        )
    }

    /// `run_streamed` on the registration of this rank's stream mode.
    #[allow(clippy::too_many_arguments)]
    fn run_agreed(
        &self,
        algo: &mut Algo,
        call: &Call,
        detour: Option<super::negotiate::Detour>,
        agreed: Agreed,
        (ctl, a): (Arc<Ctl>, ctl::Addrs),
        (ctx, device): (cuda::Ctx, i32),
        k: u32,
    ) -> Result<Outcome> {
        let out = self.run_streamed(algo, call, detour, agreed, (&ctl, a), (ctx, device), k);
        if let Err(e) = &out {
            // Peers may already wait on the streams for this rank's part.
            self.watch.fail(&ctl, self.rank, e);
        }
        out
    }

    /// The proxy's wait for every peer's post of call `p`: every rank's descriptor, rank
    /// by rank (this rank's is `mine`).
    fn gather(&self, ctl: &Ctl, p: u64, mine: Desc, what: &Named<'_>) -> Result<Vec<Desc>> {
        let n = self.nranks;
        let mut descs: Vec<Option<Desc>> = (0..n).map(|_| None).collect();
        descs[self.rank] = Some(mine);
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

    /// Waits until every reader of this rank's posts (the executor; under MPS every
    /// other rank) has read call `p - POSTS`, whose slot `p` reuses.
    fn free_slot(&self, x: &mut Exec<'_>, ctl: &Ctl, p: u64, what: &Named<'_>) -> Result<()> {
        let reads = |q: usize| q != self.rank && (q == EXECUTOR || self.shares());
        let behind = || -> Vec<usize> {
            (0..self.nranks).filter(|&q| reads(q) && ctl.consumed(q).load(Ordering::Acquire) + ctl::POSTS < p).collect()
        };
        let mut late = behind();
        if late.is_empty() {
            return Ok(());
        }
        x.exchanges += 1;
        let mut wait = Waiting::new(self.timeout);
        while !late.is_empty() {
            wait.step(self, ctl, &late, || {
                format!("{what}: {} calls ahead of rank(s) {late:?}, waiting for them to read the posts", ctl::POSTS)
            })?;
            late = behind();
        }
        Ok(())
    }
}

/// A call as its errors name it ("fcclAllReduce (collective #3)"), formatted only
/// when one does.
struct Named<'a>(&'a Call);

impl std::fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (collective #{})", self.0.coll.kind.c_name(), self.0.seq)
    }
}

/// Calls a caller may queue ahead of its proxy thread.
const QUEUED_MAX: usize = 1024;
/// Events the proxy keeps to record again (a caller rarely runs more calls ahead).
const EVENTS_KEPT: usize = 64;

/// One posted call of a rank that moves data, handed to its proxy thread.
pub(super) struct Job {
    call: Call,
    mine: Desc,
    /// Its post number and its number on the streams.
    p: u64,
    k: u32,
    /// Recorded on the caller's stream where the inputs are ready; None when this rank
    /// does not take part (its stream is being captured).
    ev: Option<cuda::Event>,
    /// The control words and their device addresses in `ctx` (with `ev`).
    reg: Option<(Arc<Ctl>, ctl::Addrs)>,
    ctx: cuda::Ctx,
    device: i32,
}

// SAFETY: the call's buffers are device addresses the proxy never dereferences on the
// host (it passes them to kernels and copies), and its stream and context handles may
// be used from any thread of the process.
unsafe impl Send for Job {}

impl Job {
    fn new(call: &Call, mine: Desc, p: u64, k: u32, ctx: cuda::Ctx, device: i32) -> Job {
        Job { call: Call { coll: call.coll.clone(), seq: call.seq }, mine, p, k, ev: None, reg: None, ctx, device }
    }
}

/// The proxy thread of a rank that moves data (posted calls only): it reads the other
/// ranks' posts of each call as they arrive and enqueues this rank's part on its own
/// stream, so that the caller's thread waits for no rank. Started by the first posted
/// call.
#[derive(Default)]
pub(super) struct Proxy {
    jobs: Mutex<VecDeque<Job>>,
    /// Events the proxy's stream has waited for, to record again (with their context).
    events: Mutex<Vec<(cuda::Ctx, cuda::Event)>>,
    wake: Condvar,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Proxy {
    /// Queues `job` for the proxy thread of `ipc`, starting it the first time.
    fn push(&self, ipc: &Ipc, job: Job) -> Result<()> {
        let mut thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if thread.is_none() {
            let me = ipc.me.get().and_then(std::sync::Weak::upgrade).ok_or_else(|| {
                Error::internal("the device path's proxy thread needs the backend shared (Ipc::shared)")
            })?;
            let h = std::thread::Builder::new()
                .name("ferroccl-proxy".into())
                .spawn(move || proxy_loop(&me))
                .map_err(|e| Error::system(format!("no proxy thread for posted device calls: {e}")))?;
            *thread = Some(h);
        }
        drop(thread);
        let mut q = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        // A caller far ahead of its proxy waits (the proxy does not need what it holds).
        while q.len() >= QUEUED_MAX && !self.stop.load(Ordering::Acquire) {
            q = self.wake.wait_timeout(q, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()).0;
        }
        q.push_back(job);
        drop(q);
        self.wake.notify_all();
        Ok(())
    }

    /// An event of `ctx` (entered) for the next call: one the proxy gave back, else new.
    fn event(&self, ctx: cuda::Ctx) -> Result<cuda::Event> {
        let mut pool = self.events.lock().unwrap_or_else(|p| p.into_inner());
        match pool.iter().rposition(|(c, _)| *c == ctx) {
            Some(i) => Ok(pool.swap_remove(i).1),
            None => cuda::Event::new(),
        }
    }

    /// Keeps `ev` for a later call, up to the calls one caller may queue.
    fn give_back(&self, ctx: cuda::Ctx, ev: cuda::Event) {
        let mut pool = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < EVENTS_KEPT {
            pool.push((ctx, ev));
        }
    }

    /// Ends the thread once it has run every queued call, and waits for it.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify_all();
        let h = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }
}

fn proxy_loop(ipc: &Ipc) {
    let p = &ipc.proxy;
    let mut stream = None;
    let mut cur = cuda::Ctx::NONE;
    loop {
        let job = {
            let mut q = p.jobs.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(j) = q.pop_front() {
                    p.wake.notify_all();
                    break j;
                }
                if p.stop.load(Ordering::Acquire) {
                    return;
                }
                q = p.wake.wait_timeout(q, Duration::from_millis(200)).unwrap_or_else(|e| e.into_inner()).0;
            }
        };
        // A panic fails the communicator (its streams are released), not the process.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ipc.proxy_one(job, &mut cur, &mut stream)));
        let res = ran.unwrap_or_else(|_| Err(Error::internal("the device path's proxy thread panicked")));
        if let Err(e) = res {
            if let Ok(ctl) = &ipc.ctl {
                log::warn(format_args!("rank {}: the proxy thread gave up: {}", ipc.rank, e.msg));
                ipc.watch.fail(ctl, ipc.rank, &e);
            }
        }
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
fn cannot(what: Named<'_>, rank: usize, why: Option<Fallback>) -> Error {
    let (reason, fix) = why.map(|f| (f.why, f.fix)).unwrap_or_default();
    Error::unavailable(format!(
        "{what} on rank {rank}: it cannot take the call GPU to GPU ({reason}){}{fix}; posted calls (checkMode \
         off or unset) are not agreed on first, so it cannot be staged through host memory instead, and the \
         communicator's device calls now fail: destroy or abort it, and set FERROCCL_CHECK=1 (or checkMode \
         FCCL_CHECK_FINGERPRINT) to have such calls staged",
        if fix.is_empty() { "" } else { "; " }
    ))
}
