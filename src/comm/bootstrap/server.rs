//! The rendezvous point's server: one thread, poll(2) over non-blocking sockets.
//!
//! Every connection is a small state machine. Before it has proved the job's key it
//! holds a fixed-size buffer, must complete its hello by one deadline from accept,
//! and counts against a cap of pending connections (the oldest is closed to make
//! room, so clients that trickle bytes cannot keep ranks out). Allocation grows only
//! with an authenticated, validated rank count. The thread sleeps in poll until a
//! socket or the nearest deadline needs it. See docs/robustness.md, "Rendezvous and
//! set-up".

mod conn;
mod session;

use super::protocol::ms;
use super::*;
use crate::log;
use std::collections::VecDeque;
use std::io::Read;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a rendezvous point is run.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Serve set-ups one after another (ferroccl-run's id), not just one.
    pub reusable: bool,
    /// Listen on loopback only: every rank runs on this host (ferroccl-run).
    pub loopback: bool,
    /// The only rank count admitted (None: the first admitted rank's count).
    pub nranks: Option<usize>,
    /// How long a connection may take from accept to a complete hello.
    pub hello_deadline: Duration,
    /// The most connections that have not completed a hello (0: a quarter of the
    /// file descriptor limit, between 16 and 1024).
    pub max_pending: usize,
    /// The job's key (None: a random one).
    pub key: Option<JobKey>,
    /// The address to listen on and put in the id (None: loopback when `loopback`,
    /// else the one [`advertised_ip`] gives).
    pub ip: Option<IpAddr>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            reusable: false,
            loopback: false,
            nranks: None,
            hello_deadline: Duration::from_secs(5),
            max_pending: 0,
            key: None,
            ip: None,
        }
    }
}

/// How long a refused or failed connection may take to read its last frame.
const LINGER: Duration = Duration::from_secs(2);
/// How long a rank that said BYE may keep its connection open.
const DONE_LINGER: Duration = Duration::from_secs(5);
/// How long the listener rests when the process is out of file descriptors.
const EMFILE_REST: Duration = Duration::from_millis(100);

/// Something the owner of the point tells its thread.
enum Event {
    /// A process started as rank `rank` of `world` ranks ended (ferroccl-run).
    Ended {
        rank: usize,
        world: usize,
        pid: u32,
        how: String,
    },
    Stop,
}

struct Shared {
    events: Mutex<Vec<Event>>,
    wake: OwnedFd,
    stopped: AtomicBool,
    /// A set-up is in progress or a reply is still to be written (see [`Server::wait_flushed`]).
    busy: AtomicBool,
}

impl Shared {
    fn send(&self, e: Event) {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).push(e);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd.
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr() as *const libc::c_void, 8) };
    }
}

/// A handle on a running rendezvous point.
pub struct Server {
    shared: Arc<Shared>,
}

impl Server {
    /// Starts a point on this host with `opts` and returns its id.
    pub(super) fn start(opts: ServerOptions) -> Result<(UniqueId, Server)> {
        let key = match opts.key {
            Some(k) => k,
            None => JobKey { key: random_secret()?, source: KeySource::Random },
        };
        let ip = match opts.ip {
            Some(ip) => ip,
            None if opts.loopback => IpAddr::V4(Ipv4Addr::LOCALHOST),
            None => advertised_ip()?,
        };
        let listener = match TcpListener::bind(SocketAddr::new(ip, 0)) {
            Ok(l) => l,
            // FERROCCL_HOST_ADDR may name an address this host only receives through NAT.
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
                let any =
                    if ip.is_ipv4() { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) };
                TcpListener::bind(SocketAddr::new(any, 0))
                    .map_err(|e| Error::system(format!("cannot open the rendezvous port: {e}")))?
            }
            Err(e) => return Err(Error::system(format!("cannot open the rendezvous port on {ip}: {e}"))),
        };
        let port = listener.local_addr()?.port();
        let srv = Server::spawn(listener, key, opts)?;
        Ok((UniqueId::build(SocketAddr::new(ip, port), &key).served_here(), srv))
    }

    /// Serves `listener` on a new thread.
    pub(super) fn spawn(listener: TcpListener, key: JobKey, opts: ServerOptions) -> Result<Server> {
        let lp = Loop::new(listener, key, opts)?;
        let shared = lp.shared.clone();
        std::thread::Builder::new()
            .name("fccl-rendezvous".into())
            .spawn(move || {
                // A bug here must not pass silently: ranks would only see the point go away.
                let local = lp.local;
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lp.run())).is_err() {
                    log::warn(format_args!(
                        "rendezvous point {local}: internal error, the point stopped; please report this to the ferroccl developers"
                    ));
                }
            })
            .map_err(|e| Error::system(format!("cannot start the rendezvous thread: {e}")))?;
        Ok(Server { shared })
    }

    /// Tells the point that the process started as rank `rank` of `world` (pid `pid`)
    /// ended, `how` (e.g. "was killed by signal 9"): a set-up waiting for it fails at
    /// once instead of at its timeout.
    pub fn process_ended(&self, rank: usize, world: usize, pid: u32, how: &str) {
        self.shared.send(Event::Ended { rank, world, pid, how: how.to_string() });
    }

    /// Waits, at most `most`, until no set-up is in progress and every reply is written:
    /// a process that serves the point and whose own rank failed calls this before it
    /// returns, so that its exit does not cut off the other ranks' failure notices.
    pub fn wait_flushed(&self, most: Duration) -> bool {
        let until = Instant::now() + most;
        while self.shared.busy.load(Ordering::Acquire) {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    /// Stops the point: its thread closes every connection and the port.
    pub fn stop(&self) {
        if !self.shared.stopped.swap(true, Ordering::AcqRel) {
            self.shared.send(Event::Stop);
        }
    }
}

fn fd_soft_limit() -> usize {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into r.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    usize::try_from(r.rlim_cur).unwrap_or(usize::MAX)
}

// ---------------------------------------------------------------- state

enum St {
    /// Accepted; challenge sent; reading the hello (`buf` holds header and body).
    Greeting { challenge: [u8; 32], buf: Box<[u8; 4 + HELLO_BYTES]>, got: usize },
    /// Authenticated; waits for the set-up in progress to finish (its rank is taken).
    Parked { hello: Hello, challenge: [u8; 32], since: Instant },
    /// A rank of the session.
    Member { rank: usize, hdr: [u8; 4], hdr_got: usize, body: Vec<u8>, body_got: usize },
    /// Said BYE; its EOF is awaited.
    Done,
    /// A last frame is queued; closed once sent and the peer has gone (or at the deadline).
    Closing,
}

impl St {
    /// Counts against the cap of pending connections.
    fn pending(&self) -> bool {
        matches!(self, St::Greeting { .. } | St::Closing)
    }
}

struct Conn {
    sock: TcpStream,
    peer: SocketAddr,
    serial: u64,
    st: St,
    deadline: Option<Instant>,
    wq: VecDeque<Arc<Vec<u8>>>,
    woff: usize,
    close_after_flush: bool,
}

struct Member {
    slot: usize,
    serial: u64,
    pid: u32,
    host: u64,
    peer: SocketAddr,
    finished: bool,
    submitted: bool,
    waiting_since: Option<Instant>,
}

struct Session {
    nranks: usize,
    nonce: u64,
    /// Who fixed the rank count.
    first: (usize, u32),
    members: Vec<Option<Member>>,
    round: u32,
    blobs: Vec<Option<Vec<u8>>>,
    blob_bytes: usize,
    submitted: usize,
    finished: usize,
    /// The latest deadline a member announced (how long a failure is remembered).
    latest: Instant,
}

impl Session {
    fn describe_missing(&self) -> String {
        let never: Vec<usize> = (0..self.nranks).filter(|&r| self.members[r].is_none()).collect();
        let behind: Vec<String> = (0..self.nranks)
            .filter_map(|r| self.members[r].as_ref().filter(|m| !m.submitted && !m.finished).map(|m| (r, m)))
            .map(|(r, m)| format!("{r} (pid {} at {})", m.pid, m.peer.ip()))
            .collect();
        let mut s = String::new();
        if !never.is_empty() {
            s += &format!("{} of {} ranks never arrived: {}", never.len(), self.nranks, list(&never));
        }
        if !behind.is_empty() {
            if !s.is_empty() {
                s += "; ";
            }
            s += &format!(
                "{} of {} ranks joined but did not reach round {}: {}",
                behind.len(),
                self.nranks,
                self.round,
                list(&behind)
            );
        }
        if s.is_empty() {
            s = "every rank arrived".into();
        }
        s
    }
}

fn list<T: std::fmt::Display>(v: &[T]) -> String {
    let shown: Vec<String> = v.iter().take(32).map(|x| x.to_string()).collect();
    let more = if v.len() > 32 { format!(" and {} more", v.len() - 32) } else { String::new() };
    format!("{}{more}", shown.join(", "))
}

struct Loop {
    local: SocketAddr,
    /// This host's id: the launcher's processes are on it.
    host: u64,
    listener: Option<TcpListener>,
    paused_until: Option<Instant>,
    key: JobKey,
    job_id: [u8; 16],
    max_pending: usize,
    opts: ServerOptions,
    shared: Arc<Shared>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    serial: u64,
    npending: usize,
    /// Pending connections in accept order, for eviction (stale entries are skipped).
    pending: VecDeque<(usize, u64)>,
    parked: VecDeque<(usize, u64)>,
    session: Option<Session>,
    /// A failed one-shot set-up: what to tell latecomers, and until when.
    tombstone: Option<(u8, String, Instant)>,
    /// A one-shot point whose set-up is over: it stops once its connections are gone.
    finished: bool,
    /// Processes the launcher saw end: (rank, world, pid, how).
    dead: Vec<(usize, usize, u32, String)>,
    last_warn: Option<Instant>,
    suppressed: u64,
}

enum Io {
    Data(usize),
    Eof,
    Again,
}

fn read_some(s: &mut TcpStream, buf: &mut [u8]) -> Io {
    loop {
        match s.read(buf) {
            Ok(0) => return Io::Eof,
            Ok(n) => return Io::Data(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Io::Again,
            Err(_) => return Io::Eof,
        }
    }
}

impl Loop {
    /// The state of a point serving `listener` (not yet running).
    fn new(listener: TcpListener, key: JobKey, opts: ServerOptions) -> Result<Loop> {
        listener.set_nonblocking(true)?;
        // A deeper accept queue than std's, for many ranks connecting at once.
        // SAFETY: listen on a socket we own; raising the backlog is all it does.
        unsafe { libc::listen(listener.as_raw_fd(), 4096) };
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::os("eventfd for the rendezvous thread"));
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        let shared = Arc::new(Shared {
            events: Mutex::new(Vec::new()),
            wake,
            stopped: AtomicBool::new(false),
            busy: AtomicBool::new(true),
        });
        let max_pending = if opts.max_pending > 0 { opts.max_pending } else { (fd_soft_limit() / 4).clamp(16, 1024) };
        Ok(Loop {
            local: listener.local_addr()?,
            host: super::super::connect::host_id(),
            listener: Some(listener),
            paused_until: None,
            job_id: job_id(&key.key),
            key,
            max_pending,
            opts,
            shared,
            conns: Vec::new(),
            free: Vec::new(),
            serial: 0,
            npending: 0,
            pending: VecDeque::new(),
            parked: VecDeque::new(),
            session: None,
            tombstone: None,
            finished: false,
            dead: Vec::new(),
            last_warn: None,
            suppressed: 0,
        })
    }

    fn run(mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut slots: Vec<(usize, u64)> = Vec::new();
        while self.step(&mut fds, &mut slots, None) {
            let busy = self.session.is_some() || self.conns.iter().flatten().any(|c| !c.wq.is_empty());
            self.shared.busy.store(busy, Ordering::Release);
        }
        self.shared.busy.store(false, Ordering::Release);
    }

    /// One wait in poll and what it found (`fds` and `slots` are scratch), sleeping
    /// at most `most` (tests) or until the nearest deadline; false once the point stops.
    fn step(&mut self, fds: &mut Vec<libc::pollfd>, slots: &mut Vec<(usize, u64)>, most: Option<Duration>) -> bool {
        self.expire(Instant::now());
        if self.shared.stopped.load(Ordering::Acquire)
            || (self.finished && self.listener.is_none() && self.conns.iter().all(Option::is_none))
        {
            return false;
        }
        fds.clear();
        slots.clear();
        fds.push(libc::pollfd { fd: self.shared.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        let listening = self.listener.is_some() && self.paused_until.is_none();
        if let (true, Some(l)) = (listening, &self.listener) {
            fds.push(libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        }
        let base = fds.len();
        for (i, c) in self.conns.iter().enumerate() {
            if let Some(c) = c {
                let mut ev = libc::POLLIN;
                if !c.wq.is_empty() {
                    ev |= libc::POLLOUT;
                }
                fds.push(libc::pollfd { fd: c.sock.as_raw_fd(), events: ev, revents: 0 });
                slots.push((i, c.serial));
            }
        }
        let wake_at = match (self.next_deadline(), most) {
            (d, None) => d,
            (d, Some(m)) => Some(d.map_or(Instant::now() + m, |d| d.min(Instant::now() + m))),
        };
        let timeout = match wake_at {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Round up: waking a little late is fine, early spins.
                (left.as_micros().div_ceil(1000)).min(i32::MAX as u128) as i32
            }
        };
        // SAFETY: fds is a live array of fds.len() pollfd structures.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                std::thread::sleep(Duration::from_millis(10));
            }
            return true;
        }
        if fds[0].revents != 0 {
            self.drain_events();
        }
        if listening && fds[1].revents != 0 {
            self.accept_some();
        }
        for (k, &(slot, serial)) in slots.iter().enumerate() {
            let re = fds[base + k].revents;
            if re == 0 || !self.alive(slot, serial) {
                continue;
            }
            if re & libc::POLLOUT != 0 {
                self.flush(slot);
            }
            if re & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 && self.alive(slot, serial) {
                self.readable(slot);
            }
        }
        true
    }

    fn alive(&self, slot: usize, serial: u64) -> bool {
        self.conns.get(slot).and_then(|c| c.as_ref()).is_some_and(|c| c.serial == serial)
    }

    fn conn(&mut self, slot: usize) -> &mut Conn {
        self.conns[slot].as_mut().expect("a live connection")
    }

    fn next_deadline(&self) -> Option<Instant> {
        let conns = self.conns.iter().flatten().filter_map(|c| c.deadline);
        let others = [self.paused_until, self.tombstone.as_ref().map(|t| t.2)];
        conns.chain(others.into_iter().flatten()).min()
    }

    fn drain_events(&mut self) {
        let mut b = [0u8; 8];
        // SAFETY: reads at most 8 bytes into b from our eventfd.
        let _ = unsafe { libc::read(self.shared.wake.as_raw_fd(), b.as_mut_ptr() as *mut libc::c_void, 8) };
        let events = std::mem::take(&mut *self.shared.events.lock().unwrap_or_else(|p| p.into_inner()));
        for e in events {
            match e {
                Event::Stop => {
                    self.listener = None;
                    for slot in 0..self.conns.len() {
                        if self.conns[slot].is_some() {
                            self.close(slot);
                        }
                    }
                }
                Event::Ended { rank, world, pid, how } => {
                    self.dead.push((rank, world, pid, how));
                    self.check_dead();
                }
            }
        }
    }

    // ------------------------------------------------------------ timers

    fn expire(&mut self, now: Instant) {
        if self.paused_until.is_some_and(|t| t <= now) {
            self.paused_until = None;
        }
        if self.tombstone.as_ref().is_some_and(|t| t.2 <= now) {
            self.tombstone = None;
            self.finish_one_shot();
        }
        for slot in 0..self.conns.len() {
            let Some(c) = &self.conns[slot] else { continue };
            if c.deadline.is_some_and(|d| d <= now) {
                self.on_deadline(slot, now);
            }
        }
    }

    fn on_deadline(&mut self, slot: usize, now: Instant) {
        let c = self.conn(slot);
        c.deadline = None;
        match &c.st {
            // Slow or silent: no message, the client is not a rank of ours yet.
            St::Greeting { .. } | St::Done | St::Closing => self.close(slot),
            St::Parked { hello, since, .. } => {
                let (rank, waited) = (hello.rank as usize, now.duration_since(*since));
                let msg = self.parked_too_long(rank, waited);
                self.refuse(slot, ST_TIMEOUT, &msg);
            }
            St::Member { rank, .. } => {
                let rank = *rank;
                let Some(s) = &self.session else { return self.close(slot) };
                let waited = s.members[rank].as_ref().and_then(|m| m.waiting_since).map_or(0, |t| ms(now - t));
                let (round, desc) = (s.round, s.describe_missing());
                let msg = format!("waited {waited} ms in round {round}: {desc}");
                self.send_last(slot, ST_TIMEOUT, &msg);
                let why = format!("rank {rank} gave up after waiting {waited} ms in round {round}: {desc}");
                self.fail_session(ST_TIMEOUT, &why);
            }
        }
    }

    fn parked_too_long(&self, rank: usize, waited: Duration) -> String {
        let what = match &self.session {
            Some(s) => {
                let holder = s.members.get(rank).and_then(|m| m.as_ref()).map_or(String::new(), |m| {
                    format!(" (pid {} at {}{})", m.pid, m.peer.ip(), if m.finished { ", done" } else { "" })
                });
                format!(
                    "the set-up in progress already has rank {rank}{holder} and has not finished ({})",
                    s.describe_missing()
                )
            }
            None => "the set-up in progress did not finish".into(),
        };
        format!(
            "waited {} ms to join: {what}; either two processes claim rank {rank} (check the rank each is given), or this rank began its next communicator while the others were still setting up the previous one",
            ms(waited)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A one-rank set-up on a point driven step by step here: the rank joins and
    /// runs one round, then (with `bye`) says BYE, and only then does the point
    /// hear from the launcher that its process ended. What the point remembers of
    /// a failure comes back (None: the set-up ended well).
    fn ended_after(bye: bool) -> Option<String> {
        let key = JobKey::derive(KeySource::Secret, "ended-after-bye");
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let mut lp = Loop::new(listener, key, ServerOptions { loopback: true, ..ServerOptions::default() }).unwrap();
        let id = UniqueId::build(lp.local, &key);
        let (ready_tx, ready_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel();
        let rank = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut c = Client::join(&id, 1, 0, deadline).expect("joins");
            c.allgather(b"round one", deadline).expect("round one");
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            if bye {
                c.finish();
                done_tx.send(None).unwrap();
            } else {
                // Still connected, never said BYE: as a process that died in set-up.
                done_tx.send(Some(c)).unwrap();
            }
        });
        let (mut fds, mut slots) = (Vec::new(), Vec::new());
        while ready_rx.try_recv().is_err() {
            assert!(lp.step(&mut fds, &mut slots, Some(Duration::from_millis(10))));
        }
        // The point does not run while the rank says BYE (if it does) and its
        // process ends: the launcher's news and the BYE wait for it together.
        go_tx.send(()).unwrap();
        let client = done_rx.recv().unwrap();
        rank.join().unwrap();
        lp.shared.send(Event::Ended { rank: 0, world: 1, pid: std::process::id(), how: "exited with status 0".into() });
        for _ in 0..3 {
            lp.step(&mut fds, &mut slots, Some(Duration::from_millis(10)));
        }
        drop(client);
        lp.tombstone.map(|t| t.1)
    }

    /// A rank whose process ends just after its BYE finished its set-up: the
    /// launcher may report the end before the point has read the BYE, which must
    /// not fail the set-up (nor log a warning that it failed).
    #[test]
    fn a_rank_that_ends_right_after_its_bye_did_not_fail() {
        assert_eq!(ended_after(true), None);
    }

    /// A rank whose process ends before its BYE fails the set-up, naming how it ended.
    #[test]
    fn a_rank_that_ends_before_its_bye_fails_the_set_up() {
        let why = ended_after(false).expect("the set-up failed");
        assert!(why.contains("rank 0 (pid") && why.contains("exited with status 0 during set-up round"), "{why}");
    }
}
