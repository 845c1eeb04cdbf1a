//! Group calls (`fcclGroupStart`/`fcclGroupEnd`), with NCCL's semantics: calls made
//! between them are queued and run together at the outermost end, so one thread can
//! drive several communicators and matched sends and receives never deadlock.

use super::Comm;
use crate::coll::Coll;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// A communicator creation deferred to the end of the group.
pub type InitJob = Box<dyn FnOnce() -> Result<()> + Send>;

#[derive(Default)]
struct Group {
    depth: usize,
    calls: Vec<(Arc<Comm>, Coll)>,
    inits: Vec<InitJob>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// Opens a (possibly nested) group on this thread.
pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// True while this thread is inside a group.
pub fn active() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Queues a validated call; it runs at the outermost `end`.
pub fn enqueue(comm: Arc<Comm>, coll: Coll) {
    GROUP.with(|g| g.borrow_mut().calls.push((comm, coll)));
}

/// Queues a communicator creation; all of a group's run together at its end (each
/// blocks until its peers arrive, so they cannot run one after another).
pub fn enqueue_init(job: InitJob) {
    GROUP.with(|g| g.borrow_mut().inits.push(job));
}

/// Closes a group; the outermost close runs every queued call.
pub fn end() -> Result<()> {
    let (inits, mut calls) = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage("fcclGroupEnd without a matching fcclGroupStart"));
        }
        g.depth -= 1;
        Ok(if g.depth == 0 { (std::mem::take(&mut g.inits), std::mem::take(&mut g.calls)) } else { Default::default() })
    })?;
    if !inits.is_empty() {
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = inits.into_iter().map(|job| s.spawn(job)).collect();
            hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::internal("a group init panicked")))).collect()
        });
        if let Some(e) = results.into_iter().find_map(|r| r.err()) {
            return Err(e);
        }
    }
    if calls.is_empty() {
        return Ok(());
    }
    let res = run(&mut calls);
    // The emptied queue goes back for the next group, so that a small group (a
    // send/recv pair every few microseconds) allocates nothing.
    calls.clear();
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.calls.is_empty() {
            g.calls = calls;
        }
    });
    res
}

/// Runs a group's calls: each communicator's in the order they were made.
fn run(calls: &mut Vec<(Arc<Comm>, Coll)>) -> Result<()> {
    let first = Arc::clone(&calls[0].0);
    if calls.iter().all(|(c, _)| Arc::ptr_eq(c, &first)) {
        return first.run(calls.drain(..).map(|(_, coll)| coll));
    }
    let mut per_comm: Vec<(Arc<Comm>, Vec<Coll>)> = Vec::new();
    for (comm, coll) in calls.drain(..) {
        match per_comm.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &comm)) {
            Some((_, v)) => v.push(coll),
            None => per_comm.push((comm, vec![coll])),
        }
    }
    // Several communicators (e.g. all ranks of fcclCommInitAll driven by one
    // thread): each progresses on its own thread so none waits for another.
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = per_comm.into_iter().map(|(comm, colls)| s.spawn(move || comm.run(colls))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::internal("a group worker panicked"))))
            .collect()
    });
    results.into_iter().find(|r| r.is_err()).unwrap_or(Ok(()))
}
