//! Group calls (`fcclGroupStart`/`fcclGroupEnd`), with NCCL's semantics: calls made
//! between them are queued and run together at the outermost end, so one thread can
//! drive several communicators and matched sends and receives never deadlock. A group
//! of non-blocking communicators hands each one's share to its progress thread and
//! ends at once (fcclInProgress); as in NCCL, one group holds one kind only.

use super::{Comm, Issued};
use crate::coll::Call;
use crate::coll::Coll;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// A communicator creation deferred to the end of the group.
pub type InitJob = Box<dyn FnOnce() -> Result<()> + Send>;

#[derive(Default)]
struct Group {
    depth: usize,
    queue: Queue,
    inits: Vec<InitJob>,
    /// Whether the group's communicators are blocking (set by its first call or init).
    blocking: Option<bool>,
}

impl Group {
    /// Notes a call (`call`: its name) or a creation (None) on a communicator of this
    /// kind; refuses a second kind.
    fn note(&mut self, blocking: bool, call: Option<&str>) -> Result<()> {
        let kind = |b: bool| if b { "blocking" } else { "non-blocking" };
        match self.blocking {
            Some(b) if b != blocking => Err(Error::invalid_usage(format!(
                "{} inside a group that holds work of {} communicators; as in NCCL, a group takes one kind: end the group first, or give both communicators the same config.blocking",
                match call {
                    Some(c) => format!("{c} on a {} communicator", kind(blocking)),
                    None => format!("creating a {} communicator", kind(blocking)),
                },
                kind(b)
            ))),
            _ => {
                self.blocking = Some(blocking);
                Ok(())
            }
        }
    }
}

/// A group's calls, in the order made, each ready to run in place (its sequence
/// number is set when it runs): a small group (a send/recv pair every few
/// microseconds) neither allocates nor moves its calls again.
#[derive(Default)]
struct Queue {
    /// The communicators of the calls, each once, in the order first used.
    comms: Vec<Arc<Comm>>,
    calls: Vec<Call>,
    /// By call, its communicator's index in `comms`.
    comm_of: Vec<usize>,
}

impl Queue {
    fn push(&mut self, comm: &Arc<Comm>, coll: Coll) {
        let i = match self.comms.iter().rposition(|c| Arc::ptr_eq(c, comm)) {
            Some(i) => i,
            None => {
                self.comms.push(Arc::clone(comm));
                self.comms.len() - 1
            }
        };
        self.calls.push(Call { coll, seq: 0 });
        self.comm_of.push(i);
    }

    fn clear(&mut self) {
        self.comms.clear();
        self.calls.clear();
        self.comm_of.clear();
    }
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
pub fn enqueue(comm: &Arc<Comm>, coll: Coll) -> Result<()> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.note(comm.opts.blocking, Some(coll.kind.c_name()))?;
        g.queue.push(comm, coll);
        Ok(())
    })
}

/// Queues a communicator creation; all of a group's run together at its end (each
/// blocks until its peers arrive, so they cannot run one after another). A
/// non-blocking one only starts there.
pub fn enqueue_init(blocking: bool, job: InitJob) -> Result<()> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.note(blocking, None)?;
        g.inits.push(job);
        Ok(())
    })
}

/// Closes a group; the outermost close runs every queued call, or, for non-blocking
/// communicators, hands them to their progress threads and returns InProgress.
pub fn end() -> Result<Issued> {
    let (inits, mut queue, blocking) = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage("fcclGroupEnd without a matching fcclGroupStart"));
        }
        g.depth -= 1;
        Ok(if g.depth == 0 {
            (std::mem::take(&mut g.inits), std::mem::take(&mut g.queue), g.blocking.take().unwrap_or(true))
        } else {
            (Vec::new(), Queue::default(), true)
        })
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
    if !blocking {
        return hand_over(queue).map(|()| Issued::InProgress);
    }
    if queue.calls.is_empty() {
        return Ok(Issued::Done);
    }
    let res = run(&mut queue).map(|()| Issued::Done);
    // The emptied queue goes back for the next group, so that a small group
    // allocates nothing.
    queue.clear();
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.queue.calls.is_empty() {
            g.queue = queue;
        }
    });
    res
}

/// A group of non-blocking communicators: each one's calls become one job on its
/// progress thread, so none waits for another. Nothing is handed over unless every
/// communicator takes work.
fn hand_over(mut q: Queue) -> Result<()> {
    for c in &q.comms {
        c.check_issuable().map_err(|e| e.context(format!("communicator {}", c.label())))?;
    }
    let mut per_comm: Vec<Vec<Call>> = q.comms.iter().map(|_| Vec::new()).collect();
    for (call, &i) in q.calls.drain(..).zip(&q.comm_of) {
        per_comm[i].push(call);
    }
    for (comm, mut calls) in q.comms.iter().zip(per_comm) {
        comm.enqueue("fcclGroupEnd", move |c| c.run_calls_in_place(&mut calls))?;
    }
    Ok(())
}

/// Runs a group's calls: each communicator's in the order they were made.
fn run(q: &mut Queue) -> Result<()> {
    if let [comm] = &q.comms[..] {
        return comm.run_calls_in_place(&mut q.calls);
    }
    let mut per_comm: Vec<(Arc<Comm>, Vec<Call>)> = q.comms.drain(..).map(|c| (c, Vec::new())).collect();
    for (call, &i) in q.calls.drain(..).zip(&q.comm_of) {
        per_comm[i].1.push(call);
    }
    // Several communicators (e.g. all ranks of fcclCommInitAll driven by one
    // thread): each progresses on its own thread so none waits for another.
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = per_comm
            .into_iter()
            .map(|(comm, mut calls)| s.spawn(move || comm.run_calls_in_place(&mut calls)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::internal("a group worker panicked"))))
            .collect()
    });
    results.into_iter().find(|r| r.is_err()).unwrap_or(Ok(()))
}
