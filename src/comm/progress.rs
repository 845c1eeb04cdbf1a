//! The progress thread of a communicator: the work of a non-blocking communicator
//! (`blocking = 0`, NCCL's model) runs here, one job after another in the order the
//! calls were made, while the caller polls `fcclCommGetAsyncError`. A job is one call,
//! one communicator's share of a group, a split or a finalize; it owns what it needs.
//! The thread starts with the first job and ends with the communicator, or, for a
//! blocking communicator (whose only jobs are non-blocking splits), when it runs idle.
//! docs/api.md, "Non-blocking communicators", says what callers may do meanwhile.

use crate::error::{Error, Result};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Work for the progress thread; its error is the communicator's asynchronous error.
pub type Job = Box<dyn FnOnce() -> Result<()> + Send>;

/// Where a communicator's queued work stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Nothing queued or running.
    Idle,
    /// Work queued or running.
    Busy,
    /// A job failed (the first that did; what was queued after it was dropped). The
    /// message starts with the failed call's name, as a blocking call's would.
    Failed(Error),
}

struct Queue {
    jobs: VecDeque<(Cow<'static, str>, Job)>,
    running: bool,
    failed: Option<Error>,
    /// Why new work is refused (set by finalize).
    sealed: Option<&'static str>,
    closed: bool,
    /// A thread serves the queue (set when one is started, cleared when it ends).
    alive: bool,
}

struct Shared {
    /// The thread ends when the queue runs empty instead of waiting for more.
    transient: bool,
    /// Jobs queued or running, and whether one failed: what a poll reads without
    /// taking the lock the progress thread needs between jobs.
    pending: AtomicUsize,
    failed: AtomicBool,
    q: Mutex<Queue>,
    /// Wakes the worker: a job was queued, or the communicator is going away.
    wake: Condvar,
    /// Wakes waiters: the queue ran empty.
    idle: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A job never runs under the lock, so a poisoned lock holds consistent state.
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A communicator's queue of work and the thread that runs it.
pub struct Progress {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Progress {
    /// `persistent`: the thread waits for more work once the queue is empty (a
    /// non-blocking communicator's calls); else it ends and the next job starts another.
    pub fn new(persistent: bool) -> Progress {
        let q =
            Queue { jobs: VecDeque::new(), running: false, failed: None, sealed: None, closed: false, alive: false };
        Progress {
            shared: Arc::new(Shared {
                transient: !persistent,
                pending: AtomicUsize::new(0),
                failed: AtomicBool::new(false),
                q: Mutex::new(q),
                wake: Condvar::new(),
                idle: Condvar::new(),
            }),
            worker: Mutex::new(None),
        }
    }

    /// Queues `job` behind the work queued before it. Refused, with nothing queued,
    /// after an earlier job failed or after [`Progress::seal`].
    pub fn push(&self, what: impl Into<Cow<'static, str>>, job: Job) -> Result<()> {
        let mut q = self.shared.lock();
        refusal(&q).map_or(Ok(()), Err)?;
        q.jobs.push_back((what.into(), job));
        self.shared.pending.fetch_add(1, Ordering::AcqRel);
        let start = !q.alive;
        q.alive = true;
        drop(q);
        if !start {
            self.shared.wake.notify_one();
            return Ok(());
        }
        self.start().inspect_err(|_| {
            let mut q = self.shared.lock();
            let job = q.jobs.pop_back();
            self.shared.pending.fetch_sub(1, Ordering::AcqRel);
            q.alive = false;
            drop(q);
            drop(job);
        })
    }

    /// Whether [`Progress::push`] would accept work now.
    pub fn check(&self) -> Result<()> {
        refusal(&self.shared.lock()).map_or(Ok(()), Err)
    }

    /// Refuses work from now on, with `why` (fcclInvalidUsage); queued work still runs.
    pub fn seal(&self, why: &'static str) {
        self.shared.lock().sealed.get_or_insert(why);
    }

    /// Where the queued work stands.
    pub fn status(&self) -> Status {
        // Pending first: a job's failure is marked before its end, so a poll that sees
        // the end sees the failure; Acquire: and the job's writes.
        let pending = self.shared.pending.load(Ordering::Acquire);
        if !self.shared.failed.load(Ordering::Acquire) {
            return if pending == 0 { Status::Idle } else { Status::Busy };
        }
        let q = self.shared.lock();
        match &q.failed {
            Some(e) => Status::Failed(e.clone()),
            None if q.running || !q.jobs.is_empty() => Status::Busy,
            None => Status::Idle,
        }
    }

    /// Blocks until nothing is queued or running (every job ends by itself: waits are
    /// bounded by the communicator's timeout and end at an abort).
    pub fn wait_idle(&self) {
        if self.on_worker() {
            return; // a job cannot wait for itself
        }
        let mut q = self.shared.lock();
        while q.running || !q.jobs.is_empty() {
            q = self.shared.idle.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Drops the queued jobs unrun and waits for the running one to end (the caller
    /// has made its waits return: fcclCommAbort). `why` becomes the error, unless one
    /// came first and unless nothing was pending.
    pub fn cancel(&self, why: Error) {
        let dropped = {
            let mut q = self.shared.lock();
            if q.failed.is_none() && (q.running || !q.jobs.is_empty()) {
                q.failed = Some(why);
                self.shared.failed.store(true, Ordering::Release);
            }
            self.shared.pending.fetch_sub(q.jobs.len(), Ordering::AcqRel);
            std::mem::take(&mut q.jobs)
        };
        // Outside the lock: a job may hold the last reference to its communicator.
        drop(dropped);
        self.wait_idle();
    }

    /// Whether the caller is the progress thread.
    pub fn on_worker(&self) -> bool {
        let w = self.worker.lock().unwrap_or_else(|p| p.into_inner());
        w.as_ref().is_some_and(|h| h.thread().id() == std::thread::current().id())
    }

    /// Starts the thread (the one before it, if any, has ended or is ending).
    fn start(&self) -> Result<()> {
        let mut w = self.worker.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = w.take() {
            let _ = old.join();
        }
        let shared = Arc::clone(&self.shared);
        let h = std::thread::Builder::new()
            .name("ferroccl-progress".into())
            .spawn(move || work(&shared))
            .map_err(|e| Error::system(format!("cannot start the communicator's progress thread: {e}")))?;
        *w = Some(h);
        Ok(())
    }
}

fn refusal(q: &Queue) -> Option<Error> {
    if let Some(e) = &q.failed {
        return Some(Error::invalid_usage(format!(
            "the communicator is unusable after an earlier error ({}); destroy or abort it and create a new one",
            e.msg
        )));
    }
    q.sealed.map(Error::invalid_usage)
}

/// The progress thread: runs jobs in order until the communicator goes away.
fn work(shared: &Shared) {
    let mut q = shared.lock();
    loop {
        let Some((what, job)) = q.jobs.pop_front() else {
            if q.closed || shared.transient {
                q.alive = false;
                return;
            }
            q = shared.wake.wait(q).unwrap_or_else(|p| p.into_inner());
            continue;
        };
        q.running = true;
        drop(q);
        // The job (and with it its reference to the communicator) is gone before the
        // queue says so, so whoever waits for an idle queue may free the communicator.
        let res = catch_unwind(AssertUnwindSafe(job)).unwrap_or_else(|p| {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::internal(format!("internal error ({what}); please report this to the ferroccl developers")))
        });
        let mut dropped = VecDeque::new();
        q = shared.lock();
        q.running = false;
        if let Err(e) = res {
            if q.failed.is_none() {
                q.failed = Some(Error { msg: format!("{what}: {}", e.msg), ..e });
                shared.failed.store(true, Ordering::Release);
            }
            // What was queued behind a failed call does not run: every rank stops at
            // the same call, and NCCL's communicator is unusable after an error too.
            dropped = std::mem::take(&mut q.jobs);
            shared.pending.fetch_sub(dropped.len(), Ordering::AcqRel);
        }
        // Release, after the failure if any: a poll that sees the job gone sees both.
        shared.pending.fetch_sub(1, Ordering::AcqRel);
        if q.jobs.is_empty() {
            shared.idle.notify_all();
        }
        if !dropped.is_empty() {
            drop(q);
            drop(dropped);
            q = shared.lock();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_all();
        let h = self.worker.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = h {
            // A job that held the communicator's last reference drops it on the
            // progress thread itself, which then ends by itself.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;
    use std::sync::mpsc;
    use std::time::Duration;

    fn job(f: impl FnOnce() -> Result<()> + Send + 'static) -> Job {
        Box::new(f)
    }

    #[test]
    fn jobs_run_in_order_on_one_other_thread_and_the_status_follows() {
        let p = Progress::new(true);
        assert_eq!(p.status(), Status::Idle);
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let log = Arc::new(Mutex::new(Vec::new()));
        let me = std::thread::current().id();
        let l = Arc::clone(&log);
        p.push(
            "first",
            job(move || {
                gate_rx.recv().unwrap();
                l.lock().unwrap().push((0, std::thread::current().id()));
                Ok(())
            }),
        )
        .unwrap();
        for k in 1..5 {
            let l = Arc::clone(&log);
            p.push(
                "next",
                job(move || {
                    l.lock().unwrap().push((k, std::thread::current().id()));
                    Ok(())
                }),
            )
            .unwrap();
        }
        // The first job waits for the gate: everything is still pending.
        assert_eq!(p.status(), Status::Busy);
        assert!(log.lock().unwrap().is_empty());
        gate_tx.send(()).unwrap();
        p.wait_idle();
        assert_eq!(p.status(), Status::Idle);
        let log = log.lock().unwrap();
        assert_eq!(log.iter().map(|e| e.0).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        let worker = log[0].1;
        assert!(worker != me && log.iter().all(|e| e.1 == worker), "one progress thread, not the caller's");
    }

    #[test]
    fn the_first_error_sticks_names_its_call_and_drops_what_was_queued_behind_it() {
        let p = Progress::new(true);
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let ran = Arc::new(Mutex::new(Vec::new()));
        let r = Arc::clone(&ran);
        p.push(
            "fcclAllReduce",
            job(move || {
                gate_rx.recv().unwrap();
                r.lock().unwrap().push("a");
                Err(Error::timeout("rank 1 did not arrive"))
            }),
        )
        .unwrap();
        let r = Arc::clone(&ran);
        p.push(
            "fcclBroadcast",
            job(move || {
                r.lock().unwrap().push("b");
                Err(Error::remote("later"))
            }),
        )
        .unwrap();
        gate_tx.send(()).unwrap();
        p.wait_idle();
        assert_eq!(*ran.lock().unwrap(), ["a"], "the job queued behind the failure ran");
        match p.status() {
            Status::Failed(e) => {
                assert_eq!(e.code, Code::Timeout);
                assert_eq!(e.msg, "fcclAllReduce: rank 1 did not arrive");
            }
            s => panic!("status {s:?}"),
        }
        let e = p.push("fcclBarrier", job(|| Ok(()))).unwrap_err();
        assert_eq!(e.code, Code::InvalidUsage);
        assert!(e.msg.contains("unusable after an earlier error (fcclAllReduce: rank 1"), "{}", e.msg);
    }

    #[test]
    fn a_poll_never_sees_a_failed_job_as_done() {
        // The lock-free poll reads the end of a job and its failure in the right order.
        for k in 0..300 {
            let p = Progress::new(true);
            p.push("fcclAllReduce", job(|| Ok(()))).unwrap();
            p.push("fcclAllReduce", job(|| Err(Error::mismatch("counts differ")))).unwrap();
            let st = loop {
                match p.status() {
                    Status::Busy => std::hint::spin_loop(),
                    st => break st,
                }
            };
            assert!(matches!(st, Status::Failed(_)), "poll {k}: a failed job looked done: {st:?}");
        }
    }

    #[test]
    fn a_panicking_job_becomes_an_internal_error_and_the_thread_lives_on() {
        let p = Progress::new(true);
        p.push("fcclGather", job(|| panic!("boom"))).unwrap();
        p.wait_idle();
        match p.status() {
            Status::Failed(e) => {
                assert_eq!(e.code, Code::InternalError);
                assert!(e.msg.starts_with("fcclGather: internal error (boom)"), "{}", e.msg);
            }
            s => panic!("status {s:?}"),
        }
    }

    #[test]
    fn seal_refuses_new_work_but_runs_what_was_queued() {
        let p = Progress::new(true);
        let (tx, rx) = mpsc::channel();
        p.push("fcclAllReduce", job(move || tx.send(1).map_err(|_| Error::internal("send")))).unwrap();
        p.seal("the communicator was finalized; only fcclCommDestroy may follow");
        let e = p.push("fcclAllReduce", job(|| Ok(()))).unwrap_err();
        assert!(e.msg.contains("finalized"), "{}", e.msg);
        p.wait_idle();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
        assert_eq!(p.status(), Status::Idle);
    }

    #[test]
    fn cancel_drops_queued_jobs_and_waits_for_the_running_one() {
        let p = Progress::new(true);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (started_tx, started_rx) = mpsc::channel();
        let s = Arc::clone(&stop);
        p.push(
            "fcclRecv",
            job(move || {
                started_tx.send(()).unwrap();
                while !s.load(std::sync::atomic::Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(Error::invalid_usage("the communicator was aborted; destroy it"))
            }),
        )
        .unwrap();
        let ran_later = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = Arc::clone(&ran_later);
        p.push(
            "fcclSend",
            job(move || {
                r.store(true, std::sync::atomic::Ordering::Release);
                Ok(())
            }),
        )
        .unwrap();
        started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        // What an abort does: make the running wait return, then cancel.
        stop.store(true, std::sync::atomic::Ordering::Release);
        p.cancel(Error::remote("aborted by fcclCommAbort"));
        assert!(!ran_later.load(std::sync::atomic::Ordering::Acquire), "a queued job ran after cancel");
        match p.status() {
            Status::Failed(e) => assert!(e.msg.contains("aborted"), "{}", e.msg),
            s => panic!("status {s:?}"),
        }
        // Nothing pending: cancel leaves the status alone.
        let idle = Progress::new(true);
        idle.cancel(Error::remote("aborted"));
        assert_eq!(idle.status(), Status::Idle);
    }

    #[test]
    fn a_transient_thread_ends_when_idle_and_the_next_job_starts_another() {
        let ids = |p: &Progress| {
            let (tx, rx) = mpsc::channel();
            let (gate_tx, gate_rx) = mpsc::channel::<()>();
            let t = tx.clone();
            p.push(
                "fcclCommSplit",
                job(move || {
                    gate_rx.recv().map_err(|_| Error::internal("gate"))?;
                    t.send(std::thread::current().id()).map_err(|_| Error::internal("send"))
                }),
            )
            .unwrap();
            p.push(
                "fcclCommSplit",
                job(move || tx.send(std::thread::current().id()).map_err(|_| Error::internal("send"))),
            )
            .unwrap();
            gate_tx.send(()).unwrap();
            p.wait_idle();
            let got: Vec<_> = rx.try_iter().collect();
            assert_eq!(got.len(), 2);
            assert_eq!(got[0], got[1], "two jobs queued together ran on different threads");
            got[0]
        };
        let transient = Progress::new(false);
        let first = ids(&transient);
        // Let the idle thread end; the next job needs a thread of its own.
        for _ in 0..1000 {
            if !transient.shared.lock().alive {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!transient.shared.lock().alive, "the transient thread did not end when idle");
        assert_ne!(ids(&transient), first);
        let persistent = Progress::new(true);
        let first = ids(&persistent);
        std::thread::sleep(Duration::from_millis(20));
        assert!(persistent.shared.lock().alive);
        assert_eq!(ids(&persistent), first, "a persistent thread was replaced");
    }

    #[test]
    fn dropping_ends_the_thread_even_from_the_thread_itself() {
        // Dropped by its owner: queued work finishes, then the thread is joined.
        let p = Progress::new(true);
        let (tx, rx) = mpsc::channel();
        p.push(
            "fcclBarrier",
            job(move || {
                std::thread::sleep(Duration::from_millis(20));
                tx.send(()).map_err(|_| Error::internal("send"))
            }),
        )
        .unwrap();
        drop(p);
        rx.try_recv().expect("drop returned before the queued job ran");

        // Dropped by its own job (the job held the last reference): no self-join.
        let p = Arc::new(Progress::new(true));
        let slot = Arc::new(Mutex::new(Some(Arc::clone(&p))));
        let s = Arc::clone(&slot);
        let (tx, rx) = mpsc::channel();
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        p.push(
            "fcclCommDestroy",
            job(move || {
                gate_rx.recv().map_err(|_| Error::internal("gate"))?;
                let last = s.lock().unwrap().take();
                drop(last);
                tx.send(()).map_err(|_| Error::internal("send"))
            }),
        )
        .unwrap();
        drop(p); // the job's copy is now the last
        gate_tx.send(()).unwrap();
        rx.recv_timeout(Duration::from_secs(10)).expect("the job did not finish");
    }
}
