//! The watchdog of a rank's stream-ordered calls: a thread that reads the control
//! region while this rank has work on the GPU, and when that work can never finish (a
//! rank died, the timeout passed, the communicator was aborted, another rank gave up)
//! releases every wait of it from the host, marks the region failed (so every rank
//! learns it) and fails the communicator, naming the ranks it came down to.

use super::ctl::{self, Ctl, Word};
use crate::error::Error;
use crate::log;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A word that this rank's queued work waits for or writes, the value it holds once
/// that work is done, and the rank whose stream writes it.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub w: Word,
    pub v: u32,
    pub writer: usize,
}

/// Everything this rank put on the GPU that has not finished: the last value each word
/// must reach, and the latest call's deadline and name.
#[derive(Default)]
struct Outstanding {
    targets: HashMap<Word, (u32, usize)>,
    deadline: Option<Instant>,
    what: String,
}

/// What a rank's watchdog thread shares with its calls.
#[derive(Default)]
pub struct Watch {
    pub ctl: Mutex<Option<Arc<Ctl>>>,
    out: Mutex<Outstanding>,
    wake: Condvar,
    pub stop: AtomicBool,
    pub aborted: AtomicBool,
    /// Why the communicator failed on the device; every later call returns it.
    pub failure: Mutex<Option<Error>>,
}

/// How often the watchdog looks while a call is on the GPU.
const WATCH_TICK: Duration = Duration::from_millis(5);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Watch {
    /// Records work just put on this rank's streams: it is done when every target is
    /// reached; `what` names it in messages; it must be done by `deadline`.
    pub fn pending(&self, targets: &[Target], deadline: Instant, what: String) {
        let mut out = lock(&self.out);
        for t in targets {
            let e = out.targets.entry(t.w).or_insert((t.v, t.writer));
            if ctl::reached(t.v, e.0) {
                *e = (t.v, t.writer);
            }
        }
        out.deadline = Some(deadline);
        out.what = what;
        drop(out);
        self.wake.notify_all();
    }

    /// The values that mean "everything queued so far is done", for work that must
    /// wait for it (closing a mapping).
    pub fn snapshot(&self) -> Vec<(Word, u32)> {
        lock(&self.out).targets.iter().map(|(&w, &(v, _))| (w, v)).collect()
    }

    /// Wakes the thread (abort, stop).
    pub fn poke(&self) {
        self.wake.notify_all();
    }

    /// The failure that ended the communicator's device calls, if any.
    pub fn failure(&self) -> Option<Error> {
        lock(&self.failure).clone()
    }

    /// Ends the communicator's device calls with `e` (a call failed here), and tells
    /// every rank, so that streams waiting for this rank's part are released.
    pub fn fail(&self, ctl: &Ctl, rank: usize, e: &Error) {
        lock(&self.failure).get_or_insert_with(|| e.clone());
        ctl.fail_with(rank, e.code as i32, &e.msg);
        self.wake.notify_all();
    }

    /// The failure another rank marked in the region (its reason when it gave one), now
    /// this rank's too; None while the region is not failed.
    pub fn failed_elsewhere(&self, ctl: &Ctl, what: impl std::fmt::Display) -> Option<Error> {
        if ctl.failed().load(Ordering::Acquire) == 0 {
            return None;
        }
        Some(lock(&self.failure).get_or_insert_with(|| gave_up(ctl, &what.to_string())).clone())
    }

    /// Watches this rank's work on the GPU until it finishes, and releases every wait
    /// of work that cannot. `pids`: every rank's process, to notice one that died.
    pub fn run(&self, rank: usize, pids: &[u32]) {
        let Some(ctl) = lock(&self.ctl).clone() else { return };
        let mut out = lock(&self.out);
        loop {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if out.targets.is_empty() {
                out = self.wake.wait_timeout(out, Duration::from_millis(200)).unwrap_or_else(|e| e.into_inner()).0;
                continue;
            }
            let done = out.targets.iter().all(|(&w, &(v, _))| ctl.reached(w, v));
            if done && ctl.failed().load(Ordering::Acquire) == 0 {
                out.targets.clear();
                continue;
            }
            if let Some(e) = self.why_stuck(&ctl, &out, rank, pids) {
                // Failed first: the kernels the raised words release then do nothing.
                ctl.fail();
                for (&w, &(v, _)) in &out.targets {
                    ctl.raise(w, v);
                }
                let mut failure = lock(&self.failure);
                if failure.is_none() {
                    log::warn(format_args!("rank {rank}: {}", e.msg));
                    *failure = Some(e);
                }
                drop(failure);
                out.targets.clear();
                continue;
            }
            out = self.wake.wait_timeout(out, WATCH_TICK).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Why the outstanding work can never finish, if it cannot.
    fn why_stuck(&self, ctl: &Ctl, out: &Outstanding, rank: usize, pids: &[u32]) -> Option<Error> {
        let what = &out.what;
        if ctl.failed().load(Ordering::Acquire) != 0 {
            return Some(gave_up(ctl, what));
        }
        if self.aborted.load(Ordering::Acquire) {
            return Some(Error::remote(format!("{what}: the communicator was aborted")));
        }
        // The ranks whose streams have not written what this rank's work needs.
        let mut missing: Vec<usize> =
            out.targets.iter().filter(|(&w, &(v, _))| !ctl.reached(w, v)).map(|(_, &(_, r))| r).collect();
        missing.sort_unstable();
        missing.dedup();
        for &q in missing.iter().filter(|&&q| q != rank) {
            let pid = pids[q];
            // A zombie counts: a rank whose parent has not reaped it yet is as dead.
            if pid != std::process::id() && crate::sys::process_gone(pid) {
                return Some(Error::remote_rank(
                    q,
                    format!("{what}: rank {q} (pid {pid}) died before the GPU finished the call; its stream operations will never come"),
                ));
            }
        }
        if out.deadline.is_some_and(|d| Instant::now() >= d) {
            let others: Vec<usize> = missing.iter().copied().filter(|&q| q != rank).collect();
            let who = if others.is_empty() {
                format!("every rank's stream reached it, but rank {rank}'s stream did not finish it")
            } else {
                format!("the streams of rank(s) {others:?} did not reach it (their work before the call did not finish, or they stopped)")
            };
            return Some(Error::timeout_blaming(
                others.first().copied(),
                format!("{what} did not finish on the GPU within the timeout: {who}"),
            ));
        }
        None
    }
}

/// The error of a rank whose work `what` cannot finish because a rank marked the
/// region failed: that rank's own error (code and message) when it wrote one.
pub fn gave_up(ctl: &Ctl, what: &str) -> Error {
    match ctl.reason() {
        Some((who, code, msg)) => {
            let code = crate::error::Code::from_i32(code).unwrap_or(crate::error::Code::RemoteError);
            Error {
                code,
                msg: format!("{what}: rank {who} ended this communicator's device calls: {msg}"),
                culprit: Some(who),
            }
        }
        None => Error::remote(format!("{what}: another rank gave up on this communicator's device calls")),
    }
}
