//! How a run waits when a poll found nothing to do, and what a timed-out run says
//! it waited for. See docs/design/host.md, "Waiting".

use super::super::msg::HDR;
use super::schedule::Schedule;
use super::state::Peer;
use crate::error::{Error, Result};
use crate::transport::failure::{cause_of, wait_word};
use crate::transport::{Seen, Transport};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What bounds a run.
pub struct RunCtl<'a> {
    /// Bound on the run's waiting, counted from when it first has to wait.
    pub timeout: Duration,
    pub abort: &'a AtomicBool,
    /// Describes the operation for messages ("fcclAllReduce #12 on rank 0"); called
    /// only when a message is built.
    pub what: &'a dyn Fn() -> String,
}

/// How a run waits when a poll found nothing to do: spin a little (a peer is
/// usually microseconds away), then yield, then sleep, as the transport's policy
/// says (see `SpinPolicy`), until the run's timeout.
#[derive(Default)]
pub struct Idle {
    since: Option<Instant>,
    polls: u32,
    /// Set when the run first has to wait: reading the clock costs as much as a
    /// small message, so a run that never waits never reads it.
    deadline: Option<Instant>,
    last_peer_check: Option<Instant>,
    /// The next wait sleeps: the poll before it takes `Transport::seen` with activity.
    sleepy: bool,
    /// This wait has published whom it waits for (`Transport::set_waiting`), with
    /// `tick` advanced at every sleep.
    published: bool,
    tick: u32,
}

/// Whom a waiting run waits for: ranks whose data has not come (`from`), ranks that
/// do not read what it sends them (`to`), and details for the timeout message.
pub struct Waits {
    pub from: Vec<usize>,
    pub to: Vec<usize>,
    pub detail: String,
}

impl Idle {
    /// The poll made progress: the next wait starts spinning afresh.
    pub fn reset(&mut self) {
        self.since = None;
        self.polls = 0;
        self.sleepy = false;
    }

    /// As [`Idle::reset`], and the run no longer waits for anyone.
    pub fn progressed(&mut self, t: &Transport) {
        self.unpublish(t);
        self.reset();
    }

    /// Takes back what [`Idle::wait`] published about this rank's wait.
    pub fn unpublish(&mut self, t: &Transport) {
        if self.published {
            t.set_waiting(0);
            self.published = false;
        }
    }

    /// What the next poll must take before it looks for work (see `Transport::seen`).
    pub fn seen(&self, t: &Transport) -> Seen {
        t.seen(self.sleepy)
    }

    /// One poll found nothing to do. `seen` is the doorbell read before the poll;
    /// `waiting` says whom the run waits for (asked only once the wait is slow). An
    /// error when the run times out, the communicator is aborted or a peer died; a
    /// timeout names the rank(s) it comes down to (`Transport::blame`).
    pub fn wait(&mut self, t: &Transport, seen: Seen, ctl: &RunCtl<'_>, waiting: impl Fn() -> Waits) -> Result<()> {
        // The clock is read every 32 idle polls.
        self.polls += 1;
        if self.polls % 32 != 0 {
            std::hint::spin_loop();
            return Ok(());
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        let deadline = *self.deadline.get_or_insert(now + ctl.timeout);
        let last_peer_check = self.last_peer_check.get_or_insert(now);
        if ctl.abort.load(Ordering::Acquire) {
            return Err(Error::remote(format!("{}: the communicator was aborted", (ctl.what)())));
        }
        let idle = now - since;
        if idle < t.policy.spin {
            std::hint::spin_loop();
            return Ok(());
        }
        if now >= deadline {
            // A peer that already failed (this rank may have been the one stopped, and
            // resumed after its own deadline) is the story, not this timeout.
            t.check_flags().map_err(|e| e.context((ctl.what)()))?;
            let w = waiting();
            let mut start: Vec<usize> = w.from.iter().chain(&w.to).copied().collect();
            start.sort_unstable();
            start.dedup();
            let culprits = t.blame(&start);
            return Err(Error::timeout_blaming(
                culprits.first().copied(),
                format!(
                    "{}: timed out after {} ms; {}{}{}",
                    (ctl.what)(),
                    ctl.timeout.as_millis(),
                    waiting_message(t.rank, &w.from, &w.to),
                    w.detail,
                    cause_of(t.rank, &culprits, &start)
                ),
            ));
        }
        if now - *last_peer_check > Duration::from_millis(100) {
            *last_peer_check = now;
            let w = waiting();
            t.check_peers_of(&w.from).and_then(|()| t.check_peers_of(&w.to)).map_err(|e| e.context((ctl.what)()))?;
        }
        if idle < t.policy.yield_until {
            std::thread::yield_now();
            return Ok(());
        }
        // Sleeps from the next wait on, after a poll that saw the peers' activity.
        self.sleepy = true;
        // Say whom this rank waits for, for peers that time out to follow.
        let w = waiting();
        if let Some(&p) = w.from.first().or(w.to.first()) {
            self.tick = self.tick.wrapping_add(1);
            t.set_waiting(wait_word(p as u32 + 1, self.tick));
            self.published = true;
        }
        let left = deadline.saturating_duration_since(now);
        t.sleep(seen, left.min(Duration::from_millis(20)));
        Ok(())
    }
}

/// Whom a run waits for, from its peers' state (details at TRACE).
pub(super) fn describe_waiting(me: usize, peers: &[Peer], sched: &Schedule<'_>, done: &[bool]) -> Waits {
    let (mut from, mut to) = (Vec::new(), Vec::new());
    for (p, st) in peers.iter().enumerate() {
        if p == me {
            continue;
        }
        let waits_rx = st.cur_rx.is_some()
            || st.data_rq.iter().any(|&i| !done[i])
            || !st.p2p_rq.is_empty()
            || !st.awaiting_reply.is_empty()
            || !st.awaiting_payload.is_empty();
        if waits_rx {
            from.push(p);
        }
        if st.cur_tx.is_some() || !st.send_q.is_empty() || !st.urgent.is_empty() || !st.direct_wait.is_empty() {
            to.push(p);
        }
    }
    let mut s = String::new();
    if crate::log::enabled(crate::log::Level::Trace) {
        for (p, st) in peers.iter().enumerate().filter(|(p, _)| *p != me) {
            s += &format!(
                "\n  peer {p}: receiving {}, next receives {:?}, sending {}, next sends {:?}",
                st.cur_rx.as_ref().map_or("nothing".to_string(), |r| format!("{}/{} bytes", r.read, r.len)),
                st.data_rq
                    .iter()
                    .take(3)
                    .map(|&i| (
                        i,
                        sched.steps[i].tag,
                        sched.steps[i].deps.clone(),
                        sched.steps[i].deps.iter().all(|&d| done[d])
                    ))
                    .collect::<Vec<_>>(),
                st.cur_tx.as_ref().map_or("nothing".to_string(), |t| format!(
                    "{}/{} bytes (kind {})",
                    t.written,
                    t.payload + HDR,
                    t.kind
                )),
                st.send_q
                    .iter()
                    .take(3)
                    .map(|&i| (i, sched.steps[i].tag, sched.steps[i].deps.clone()))
                    .collect::<Vec<_>>(),
            );
        }
    }
    Waits { from, to, detail: s }
}

/// What a timed-out run waits for: the peers whose messages have not come (`from`)
/// and those that do not read what this rank sends them (`to`).
pub fn waiting_message(me: usize, from: &[usize], to: &[usize]) -> String {
    let list = |v: &[usize]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
    let mut s = String::new();
    if !from.is_empty() {
        s += &format!("ranks that have not arrived (this rank {me} still waits for data from): {}", list(from));
    }
    if !to.is_empty() {
        if !s.is_empty() {
            s += "; ";
        }
        s += &format!("ranks not draining what rank {me} sends them: {}", list(to));
    }
    if s.is_empty() {
        s = "waiting on local steps".into();
    }
    s
}
