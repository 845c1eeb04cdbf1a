//! Communicators created in the background (a non-blocking fcclCommInitRankConfig or
//! fcclCommSplit): the caller gets its handles at once, the rendezvous and wire-up run
//! elsewhere, and each handle takes its communicator once it is ready.

use super::Comm;
use crate::error::{Error, Result};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// What one handle of a creation holds.
enum Slot {
    Waiting,
    Ready(Box<Comm>),
    Failed(Error),
    /// Its handle took the communicator.
    Taken,
    /// Its handle was aborted: the communicator is aborted as soon as it exists.
    Abandoned,
}

/// Where one handle's communicator stands.
pub enum Poll {
    Pending,
    Ready(Box<Comm>),
    Failed(Error),
}

/// One background creation of one or more communicators.
pub struct Creation {
    slots: Mutex<Vec<Slot>>,
    finished: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Creation {
    /// A creation of `n` communicators, to be finished by [`Creation::start`]'s thread
    /// or by whoever calls [`Creation::finish`].
    pub fn new(n: usize) -> Arc<Creation> {
        Arc::new(Creation {
            slots: Mutex::new((0..n).map(|_| Slot::Waiting).collect()),
            finished: Condvar::new(),
            thread: Mutex::new(None),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `make` on a thread of its own; its communicators fill the slots in order.
    /// If no thread can start, the slots fail with that error too (their handles may
    /// exist already: a group's creations start at its end).
    pub fn start(self: &Arc<Self>, make: impl FnOnce() -> Result<Vec<Comm>> + Send + 'static) -> Result<()> {
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new().name("ferroccl-init".into()).spawn(move || {
            // A panic must not leave the handles pending for ever.
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(make))
                .unwrap_or_else(|_| Err(Error::internal("communicator creation panicked; please report this")));
            me.finish(res);
        });
        match spawned {
            Ok(h) => {
                *self.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
                Ok(())
            }
            Err(e) => {
                let e = Error::system(format!("cannot start a thread to create the communicator: {e}"));
                self.finish(Err(e.clone()));
                Err(e)
            }
        }
    }

    /// Fills the slots: one communicator each, or the same error for all.
    pub fn finish(&self, res: Result<Vec<Comm>>) {
        let mut orphans = Vec::new();
        {
            let mut slots = self.lock();
            let n = slots.len();
            let mut made: Vec<Result<Comm>> = match res {
                Ok(v) if v.len() == n => v.into_iter().map(Ok).collect(),
                Ok(v) => {
                    let e = Error::internal(format!("{} communicators made for {n} handles", v.len()));
                    (0..n).map(|_| Err(e.clone())).collect()
                }
                Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
            };
            for (slot, r) in slots.iter_mut().zip(made.drain(..)) {
                match (&*slot, r) {
                    (Slot::Abandoned, Ok(c)) => orphans.push(c),
                    (Slot::Abandoned, Err(_)) => {}
                    (_, Ok(c)) => *slot = Slot::Ready(Box::new(c)),
                    (_, Err(e)) => *slot = Slot::Failed(e),
                }
            }
        }
        self.finished.notify_all();
        // Outside the lock: the peers learn at once that these ranks are gone.
        for c in orphans {
            c.abort();
        }
    }

    /// Slot `i` now: its communicator (once: the caller keeps it) or its error.
    pub fn poll(&self, i: usize) -> Poll {
        let p = take(&mut self.lock()[i]);
        if !matches!(p, Poll::Pending) {
            self.join();
        }
        p
    }

    /// Slot `i` once the creation has ended (every wait in it is bounded by the timeout).
    pub fn wait(&self, i: usize) -> Poll {
        let mut slots = self.lock();
        while matches!(slots[i], Slot::Waiting) {
            slots = self.finished.wait(slots).unwrap_or_else(|p| p.into_inner());
        }
        let p = take(&mut slots[i]);
        drop(slots);
        self.join();
        p
    }

    /// Gives slot `i` up (fcclCommAbort of a handle still being created): its
    /// communicator is aborted now if it exists, else as soon as it does.
    pub fn abandon(&self, i: usize) {
        let ready = {
            let mut slots = self.lock();
            match std::mem::replace(&mut slots[i], Slot::Abandoned) {
                Slot::Ready(c) => Some(c),
                _ => None,
            }
        };
        if let Some(c) = ready {
            c.abort();
        }
    }

    /// Joins the creating thread once it has filled the slots (it ends right after).
    fn join(&self) {
        let h = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

fn take(slot: &mut Slot) -> Poll {
    match std::mem::replace(slot, Slot::Taken) {
        Slot::Waiting => {
            *slot = Slot::Waiting;
            Poll::Pending
        }
        Slot::Ready(c) => Poll::Ready(c),
        Slot::Failed(e) => {
            *slot = Slot::Failed(e.clone());
            Poll::Failed(e)
        }
        Slot::Taken | Slot::Abandoned => {
            *slot = Slot::Taken;
            Poll::Failed(Error::internal("a communicator was taken twice from its creation"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::Options;
    use crate::error::Code;
    use std::time::Duration;

    #[test]
    fn handles_take_their_communicators_once_the_thread_has_made_them() {
        let cr = Creation::new(3);
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        cr.start(move || {
            gate_rx.recv().map_err(|_| Error::internal("gate"))?;
            Comm::init_all(3, Options::default(), None)
        })
        .unwrap();
        assert!(matches!(cr.poll(1), Poll::Pending));
        gate_tx.send(()).unwrap();
        let Poll::Ready(c1) = cr.wait(1) else { panic!("slot 1 not ready") };
        assert_eq!((c1.rank, c1.nranks), (1, 3));
        let Poll::Ready(c0) = cr.poll(0) else { panic!("slot 0 not ready") };
        assert_eq!(c0.rank, 0);
        assert!(matches!(cr.poll(0), Poll::Failed(e) if e.code == Code::InternalError), "taken twice");
        cr.abandon(2); // aborted right away: it existed
        assert!(cr.thread.lock().unwrap().is_none(), "the creating thread was not joined");
    }

    #[test]
    fn an_error_reaches_every_handle_and_stays() {
        let cr = Creation::new(2);
        cr.start(|| Err(Error::timeout("rank 3 never arrived"))).unwrap();
        for i in [0, 1, 0] {
            match cr.wait(i) {
                Poll::Failed(e) => assert_eq!((e.code, e.msg.as_str()), (Code::Timeout, "rank 3 never arrived")),
                _ => panic!("slot {i} did not fail"),
            }
        }
    }

    #[test]
    fn an_abandoned_slot_is_aborted_when_its_communicator_arrives() {
        let cr = Creation::new(2);
        cr.abandon(0);
        let made = Comm::init_all(2, Options::default(), None).unwrap();
        cr.finish(Ok(made));
        // The surviving rank hears of the abort on its next call.
        let Poll::Ready(c1) = cr.poll(1) else { panic!("slot 1 not ready") };
        let mut x = [1u8; 4];
        let coll = crate::coll::Coll::new(
            crate::coll::CollKind::AllReduce,
            x.as_ptr(),
            x.as_mut_ptr(),
            4,
            crate::types::DataType::Uint8,
        );
        let t0 = std::time::Instant::now();
        let e = c1.run_one(coll).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(30), "the survivor waited for its timeout");
        assert_eq!(e.code, Code::RemoteError, "{}", e.msg);
    }
}
