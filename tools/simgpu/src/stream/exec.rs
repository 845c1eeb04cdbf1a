//! The executor: the one thread `cuInit` starts. It runs every stream's operations, each
//! stream in order and streams independently; an operation that cannot proceed (latency not
//! elapsed, a dependency, a wait on a value) holds back only its own stream.

use super::op::{Op, OpKind};
use crate::ctx;
use crate::state::{self, State};
use cudarc::driver::sys::CUresult;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// Polling interval for waits nothing notifies (values written by the host or another
/// process): starts short, doubles up to the maximum while nothing happens.
const POLL_MIN: Duration = Duration::from_micros(20);
const POLL_MAX: Duration = Duration::from_millis(1);
/// Sleep when nothing at all is queued (new work notifies).
const IDLE: Duration = Duration::from_secs(1);

/// What one pass over the streams found.
struct Scan {
    batch: Vec<(u64, Op)>,
    /// Earliest time an operation held back by latency becomes eligible.
    next: Option<Instant>,
    /// Some head waits for a condition that must be polled.
    polling: bool,
    /// Operations of failed contexts were dropped (waiters must be told).
    dropped: bool,
}

/// Pops the head of every stream that may run now.
fn scan(st: &mut State, now: Instant) -> Scan {
    let mut out = Scan { batch: Vec::new(), next: None, polling: false, dropped: false };
    let ids: Vec<u64> = st.streams.keys().copied().collect();
    for id in ids {
        let s = &st.streams[&id];
        if s.running {
            continue;
        }
        if s.queue.is_empty() {
            if s.destroyed {
                st.streams.remove(&id);
            }
            continue;
        }
        // Work of a failed context never runs: a GPU context is unusable after a fault.
        if st.ctxs.get(&s.ctx).is_none_or(|c| c.sticky.is_some()) {
            let s = st.streams.get_mut(&id).expect("listed");
            s.queue.clear();
            s.completed = s.enqueued;
            out.dropped = true;
            continue;
        }
        let head = s.queue.front().expect("non-empty");
        if head.ready_at > now {
            out.next = Some(out.next.map_or(head.ready_at, |n| n.min(head.ready_at)));
            continue;
        }
        if !super::reached(st, &head.deps) {
            continue; // the executor itself completes dependencies; no polling needed
        }
        if !head.kind.ready() {
            out.polling = true;
            continue;
        }
        let s = st.streams.get_mut(&id).expect("listed");
        let op = s.queue.pop_front().expect("non-empty");
        s.running = true;
        out.batch.push((id, op));
    }
    out
}

/// Runs one operation, turning a panic into a failure.
fn run_op(kind: OpKind) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(|| kind.run())) {
        Ok(r) => r,
        Err(_) => Err("internal error (simulator bug) while running the operation".into()),
    }
}

/// The executor thread's body: [`serve`], restarted if the simulator has a bug that panics
/// there (every stream would hang without it).
pub fn run() {
    state::mark_executor_thread();
    loop {
        if catch_unwind(serve).is_err() {
            eprintln!("simgpu: internal error (simulator bug) in the executor; continuing");
        }
    }
}

fn serve() {
    let g = state::global();
    let mut poll = POLL_MIN;
    let mut st = state::lock();
    loop {
        let now = Instant::now();
        let found = scan(&mut st, now);
        if found.dropped {
            g.done.notify_all();
        }
        if !found.batch.is_empty() {
            drop(st);
            let results: Vec<(u64, u64, Result<(), String>)> =
                found.batch.into_iter().map(|(id, op)| (id, op.seq, run_op(op.kind))).collect();
            st = state::lock();
            for (id, seq, r) in results {
                let Some(s) = st.streams.get_mut(&id) else { continue };
                s.running = false;
                s.completed = s.completed.max(seq);
                let ctx = s.ctx;
                if let Err(why) = r {
                    if crate::config::trace() != crate::config::Trace::Off {
                        eprintln!("simgpu: work on stream {id:#x} failed: {why}");
                    }
                    ctx::set_sticky(&mut st, ctx, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, &why);
                }
            }
            g.done.notify_all();
            poll = POLL_MIN;
            continue;
        }
        let mut timeout = IDLE;
        if let Some(next) = found.next {
            timeout = timeout.min(next.saturating_duration_since(now));
        }
        if found.polling {
            timeout = timeout.min(poll);
            poll = (poll * 2).min(POLL_MAX);
            // Host threads polling on the same conditions (event queries) get a chance too.
            g.done.notify_all();
        }
        st = g.work.wait_timeout(st, timeout).unwrap_or_else(std::sync::PoisonError::into_inner).0;
    }
}
