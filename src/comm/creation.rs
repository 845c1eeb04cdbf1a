//! Communicators created in the background (a non-blocking fcclCommInitRankConfig or
//! fcclCommSplit): the caller gets its handles at once, the rendezvous and the ranks' connection run
//! elsewhere, and each handle takes its communicator once it is ready.

use super::Comm;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// Set once every handle was aborted: the creating thread's waits end at once.
    cancel: Arc<Cancel>,
}

impl Creation {
    /// A creation of `n` communicators, to be finished by [`Creation::start`]'s thread
    /// or by whoever calls [`Creation::finish`].
    pub fn new(n: usize) -> Arc<Creation> {
        Arc::new(Creation {
            slots: Mutex::new((0..n).map(|_| Slot::Waiting).collect()),
            finished: Condvar::new(),
            thread: Mutex::new(None),
            cancel: Arc::new(Cancel::new()),
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
            // The rendezvous and the ranks' connection on this thread watch the creation's cancellation.
            CURRENT.with(|c| *c.borrow_mut() = Some(Arc::clone(&me.cancel)));
            // A panic must not leave the handles pending for ever.
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(make))
                .unwrap_or_else(|_| Err(Error::internal("communicator creation panicked; please report this")));
            CURRENT.with(|c| c.borrow_mut().take());
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
    /// communicator is aborted now if it exists, else as soon as it does. Once every
    /// slot is given up the creation is cancelled: its thread stops waiting for the
    /// rendezvous (telling the other ranks why), closes its sockets and ends, within
    /// one wake-up rather than at the timeout (docs/robustness.md, "Abort").
    pub fn abandon(&self, i: usize) {
        let ready = {
            let mut slots = self.lock();
            let was = std::mem::replace(&mut slots[i], Slot::Abandoned);
            if slots.iter().all(|s| matches!(s, Slot::Abandoned)) {
                self.cancel.cancel();
            }
            match was {
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

/// The cancellation of one creation: a flag, and an eventfd that becomes readable
/// with it, so that waits in poll(2) wake at once.
pub struct Cancel {
    flag: AtomicBool,
    fd: Option<OwnedFd>,
}

impl Cancel {
    fn new() -> Cancel {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        // SAFETY: fd is a fresh descriptor that nothing else owns. Without one (out of
        // descriptors) waits see the flag at their next wake-up only.
        Cancel { flag: AtomicBool::new(false), fd: (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) }) }
    }

    fn cancel(&self) {
        if !self.flag.swap(true, Ordering::AcqRel) {
            if let Some(fd) = &self.fd {
                let one = 1u64.to_ne_bytes();
                // SAFETY: writes 8 bytes from a live buffer to our eventfd.
                let _ = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr() as *const libc::c_void, 8) };
            }
        }
    }
}

thread_local! {
    /// The cancellation of the creation running on this thread (set by [`Creation::start`]).
    static CURRENT: RefCell<Option<Arc<Cancel>>> = const { RefCell::new(None) };
}

/// Whether this thread runs a creation that can be given up (see [`Creation::start`]).
pub fn watching() -> bool {
    CURRENT.with(|c| c.borrow().is_some())
}

/// Whether the creation running on this thread was given up (fcclCommAbort of its
/// handle). False on any other thread.
pub fn cancelled() -> bool {
    CURRENT.with(|c| c.borrow().as_ref().is_some_and(|c| c.flag.load(Ordering::Acquire)))
}

/// A descriptor that becomes readable when the creation running on this thread is
/// given up: waits in poll(2) add it to their set.
pub fn cancel_fd() -> Option<RawFd> {
    CURRENT.with(|c| c.borrow().as_ref().and_then(|c| c.fd.as_ref().map(|f| f.as_raw_fd())))
}

/// The error of a creation given up while it waited.
pub fn aborted() -> Error {
    Error::invalid_usage("fcclCommAbort gave the communicator up while it was being created")
}

/// Waits for `events` on `fd` until `deadline`, or until the creation running on this
/// thread is given up: Ok(true) when the socket is ready, Ok(false) at the deadline,
/// Err([`aborted`]) on cancellation.
pub fn poll_until(fd: RawFd, events: libc::c_short, deadline: Instant) -> std::result::Result<bool, Error> {
    let cfd = cancel_fd();
    loop {
        if cancelled() {
            return Err(aborted());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        let mut p = [
            libc::pollfd { fd, events, revents: 0 },
            libc::pollfd { fd: cfd.unwrap_or(-1), events: libc::POLLIN, revents: 0 },
        ];
        let n = if cfd.is_some() { 2 } else { 1 };
        // Without a descriptor to watch, the flag is looked at every 50 ms.
        let ms = if cfd.is_none() && watching() { ms.min(50) } else { ms };
        // SAFETY: n live pollfd structures.
        let rc = unsafe { libc::poll(p.as_mut_ptr(), n, ms) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::system(format!("poll: {e}")));
            }
            continue;
        }
        if p[1].revents != 0 || cancelled() {
            return Err(aborted());
        }
        if p[0].revents != 0 {
            return Ok(true);
        }
    }
}

/// Sleeps `d`, less if the creation running on this thread is given up meanwhile
/// (the caller looks at [`cancelled`] afterwards).
pub fn sleep(d: Duration) {
    if !watching() {
        return std::thread::sleep(d);
    }
    let until = Instant::now() + d;
    while !cancelled() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        match cancel_fd() {
            Some(fd) => {
                let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
                // SAFETY: one live pollfd.
                unsafe { libc::poll(&mut p, 1, ms) };
            }
            None => std::thread::sleep(left.min(Duration::from_millis(50))),
        }
    }
}

/// TcpStream::connect_timeout that ends early, with [`aborted`], when the creation
/// running on this thread is given up.
pub fn connect(addr: &SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    if !watching() {
        return TcpStream::connect_timeout(addr, timeout);
    }
    let abort_io = || std::io::Error::new(std::io::ErrorKind::Interrupted, aborted().msg);
    if cancelled() {
        return Err(abort_io());
    }
    let (family, sa, len) = sockaddr(addr);
    // SAFETY: socket(2) returns a new descriptor or -1.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sa holds a sockaddr of `len` bytes for this family.
    let rc = unsafe { libc::connect(fd, &sa as *const libc::sockaddr_storage as *const libc::sockaddr, len) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
        match poll_until(fd, libc::POLLOUT, Instant::now() + timeout) {
            Err(_) => return Err(abort_io()),
            Ok(false) => return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connection timed out")),
            Ok(true) => {}
        }
        let mut err: libc::c_int = 0;
        let mut l = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: reads an int option into err.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                &mut err as *mut libc::c_int as *mut libc::c_void,
                &mut l,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if err != 0 {
            return Err(std::io::Error::from_raw_os_error(err));
        }
    }
    let s = TcpStream::from(sock);
    s.set_nonblocking(false)?;
    Ok(s)
}

fn sockaddr(addr: &SocketAddr) -> (libc::c_int, libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned.
            unsafe { std::ptr::write(&mut ss as *mut libc::sockaddr_storage as *mut libc::sockaddr_in, sin) };
            (libc::AF_INET, ss, std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in6 and suitably aligned.
            unsafe { std::ptr::write(&mut ss as *mut libc::sockaddr_storage as *mut libc::sockaddr_in6, sin6) };
            (libc::AF_INET6, ss, std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t)
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

    /// Whether the creating thread of `cr` has ended, polled for at most `most`.
    fn ended_within(cr: &Creation, most: Duration) -> Option<Duration> {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < most {
            if cr.thread.lock().unwrap().as_ref().is_some_and(|h| h.is_finished()) {
                return Some(t0.elapsed());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    #[test]
    fn abandoning_every_handle_ends_the_creating_thread_s_waits_at_once() {
        // A "point" that accepts (the kernel does) and never greets: the rank waits in
        // the greeting, with a 30 s timeout.
        let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let key = crate::comm::bootstrap::JobKey::derive(crate::comm::bootstrap::KeySource::Secret, "mute");
        let id = crate::comm::bootstrap::UniqueId::from_addr(mute.local_addr().unwrap(), key);
        let opts = Options { timeout: Duration::from_secs(30), ..Options::default() };
        let cr = Creation::new(1);
        cr.start(move || Comm::init_rank(2, &id, 1, opts).map(|c| vec![c])).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(!cr.thread.lock().unwrap().as_ref().is_some_and(|h| h.is_finished()), "the creation ended on its own");
        let t0 = std::time::Instant::now();
        cr.abandon(0);
        assert!(t0.elapsed() < Duration::from_millis(20), "abandon blocked for {:?}", t0.elapsed());
        let took = ended_within(&cr, Duration::from_secs(5)).expect("the creating thread still runs 5 s after");
        assert!(took < Duration::from_millis(100), "the creating thread ended {took:?} after the abort");
        // A sleep of the retry loop ends at once too.
        let cr = Creation::new(1);
        cr.start(|| {
            sleep(Duration::from_secs(30));
            Err(if cancelled() { aborted() } else { Error::internal("slept 30 s") })
        })
        .unwrap();
        cr.abandon(0);
        assert!(ended_within(&cr, Duration::from_millis(500)).is_some(), "the sleep was not cut short");
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
