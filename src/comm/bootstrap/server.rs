//! The rendezvous point's server: one thread, poll(2) over non-blocking sockets.
//!
//! Every connection is a small state machine. Before it has proved the job's key it
//! holds a fixed-size buffer, must complete its hello by one deadline from accept,
//! and counts against a cap of pending connections (the oldest is closed to make
//! room, so clients that trickle bytes cannot keep ranks out). Allocation grows only
//! with an authenticated, validated rank count. The thread sleeps in poll until a
//! socket or the nearest deadline needs it. See docs/robustness.md, "Rendezvous and
//! set-up".

use super::*;
use crate::log;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

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
        Ok((UniqueId::build(SocketAddr::new(ip, port), &key), srv))
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
        let shared = Arc::new(Shared { events: Mutex::new(Vec::new()), wake, stopped: AtomicBool::new(false) });
        let max_pending = if opts.max_pending > 0 { opts.max_pending } else { (fd_soft_limit() / 4).clamp(16, 1024) };
        Ok(Loop {
            local: listener.local_addr()?,
            host: super::super::wireup::host_id(),
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
        while self.step(&mut fds, &mut slots, None) {}
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

    // ------------------------------------------------------------ connections

    fn accept_some(&mut self) {
        // A bounded batch: connections already accepted get their turn to say hello
        // before a flood can push them out of the pending cap.
        for _ in 0..(self.max_pending / 4).max(1) {
            let Some(l) = &self.listener else { return };
            match l.accept() {
                Ok((s, peer)) => self.add_conn(s, peer),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(e.kind(), std::io::ErrorKind::Interrupted | std::io::ErrorKind::ConnectionAborted) => {}
                Err(e)
                    if !matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    ) =>
                {
                    // Some other failure of one connection (EPROTO, ...): rest briefly in
                    // case it persists, rather than spin on a readable listener.
                    self.paused_until = Some(Instant::now() + EMFILE_REST / 10);
                    return;
                }
                Err(e) => {
                    // Out of descriptors (or buffers): make room, or rest instead of
                    // spinning on a listener that stays readable.
                    if !self.evict_oldest() {
                        self.paused_until = Some(Instant::now() + EMFILE_REST);
                        let m = format!(
                            "rendezvous point {}: cannot accept connections ({e}); raise the file descriptor limit (ulimit -n)",
                            self.local
                        );
                        self.warn(&m);
                    }
                    return;
                }
            }
        }
    }

    fn add_conn(&mut self, sock: TcpStream, peer: SocketAddr) {
        if self.npending >= self.max_pending {
            self.evict_oldest();
        }
        let Ok(challenge) = random_secret() else { return };
        if sock.set_nonblocking(true).is_err() {
            return;
        }
        let _ = sock.set_nodelay(true);
        self.serial += 1;
        let c = Conn {
            sock,
            peer,
            serial: self.serial,
            st: St::Greeting { challenge, buf: Box::new([0; 4 + HELLO_BYTES]), got: 0 },
            deadline: Some(Instant::now() + self.opts.hello_deadline),
            wq: VecDeque::new(),
            woff: 0,
            close_after_flush: false,
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.conns[s] = Some(c);
                s
            }
            None => {
                self.conns.push(Some(c));
                self.conns.len() - 1
            }
        };
        self.npending += 1;
        self.pending.push_back((slot, self.serial));
        self.queue(slot, frame(&Challenge { nonce: challenge }.encode()));
    }

    /// Closes the connection that has been pending longest; false if there is none.
    fn evict_oldest(&mut self) -> bool {
        while let Some((slot, serial)) = self.pending.pop_front() {
            if self.alive(slot, serial) && self.conns[slot].as_ref().is_some_and(|c| c.st.pending()) {
                self.close(slot);
                return true;
            }
        }
        false
    }

    fn set_state(&mut self, slot: usize, st: St) {
        let serial = self.conns[slot].as_ref().map_or(0, |c| c.serial);
        let c = self.conn(slot);
        let (was, now) = (c.st.pending(), st.pending());
        c.st = st;
        if was && !now {
            self.npending -= 1;
        } else if !was && now {
            self.npending += 1;
            self.pending.push_back((slot, serial));
        }
    }

    fn close(&mut self, slot: usize) {
        if let Some(c) = self.conns[slot].take() {
            if c.st.pending() {
                self.npending -= 1;
            }
            self.free.push(slot);
            // Forget it in the session so a later event does not touch a reused slot.
            if let (St::Member { rank, .. }, Some(s)) = (&c.st, &mut self.session) {
                if let Some(m) = s.members.get_mut(*rank).and_then(|m| m.as_mut()) {
                    if m.slot == slot && m.serial == c.serial {
                        m.slot = usize::MAX;
                    }
                }
            }
        }
    }

    fn queue(&mut self, slot: usize, frame: Vec<u8>) {
        self.queue_rc(slot, Arc::new(frame));
    }

    fn queue_rc(&mut self, slot: usize, frame: Arc<Vec<u8>>) {
        self.conn(slot).wq.push_back(frame);
        self.flush(slot);
    }

    /// Writes what the socket takes now.
    fn flush(&mut self, slot: usize) {
        let c = self.conn(slot);
        while let Some(f) = c.wq.front() {
            match c.sock.write(&f[c.woff..]) {
                Ok(n) => {
                    c.woff += n;
                    if c.woff == f.len() {
                        c.wq.pop_front();
                        c.woff = 0;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => return self.lost(slot, "closed its connection"),
            }
        }
        if c.close_after_flush {
            c.close_after_flush = false;
            let _ = c.sock.shutdown(std::net::Shutdown::Write);
            c.deadline = Some(Instant::now() + LINGER);
        }
    }

    /// Queues a last frame (status and text) and closes after it.
    fn send_last(&mut self, slot: usize, status: u8, msg: &str) {
        let mut b = Vec::with_capacity(1 + msg.len().min(MAX_TEXT));
        b.push(status);
        b.extend_from_slice(&msg.as_bytes()[..msg.len().min(MAX_TEXT)]);
        self.set_state(slot, St::Closing);
        let c = self.conn(slot);
        c.close_after_flush = true;
        c.deadline = Some(Instant::now() + LINGER);
        self.queue(slot, frame(&b));
    }

    fn refuse(&mut self, slot: usize, status: u8, msg: &str) {
        self.send_last(slot, status, msg);
    }

    fn readable(&mut self, slot: usize) {
        self.read_input(slot, true)
    }

    /// Reads and handles what the connection on `slot` holds; a rank's connection
    /// that ends is lost when `eof_is_loss` (else left for the caller's verdict).
    fn read_input(&mut self, slot: usize, eof_is_loss: bool) {
        let serial = self.conn(slot).serial;
        loop {
            if !self.alive(slot, serial) {
                return;
            }
            let c = self.conns[slot].as_mut().expect("alive");
            match &mut c.st {
                St::Greeting { buf, got, .. } => {
                    let want = if *got < 4 {
                        4
                    } else {
                        let len = u32::from_le_bytes(buf[0..4].try_into().unwrap()) as usize;
                        if len != HELLO_BYTES {
                            let why = if len == 48 {
                                "a hello of rendezvous protocol 1 (an older ferroccl); use the same ferroccl build in every process of a job".to_string()
                            } else {
                                format!("a first frame of {len} bytes is not a hello (a hello has {HELLO_BYTES})")
                            };
                            return self.refuse(slot, ST_FAILED, &format!("refused: {why}"));
                        }
                        4 + HELLO_BYTES
                    };
                    match read_some(&mut c.sock, &mut buf[*got..want]) {
                        Io::Data(n) => *got += n,
                        Io::Eof => return self.close(slot),
                        Io::Again => return,
                    }
                    if *got == 4 + HELLO_BYTES {
                        // Still pending (it counts against the cap) until admitted or refused.
                        let body: [u8; HELLO_BYTES] = buf[4..].try_into().expect("a whole hello");
                        let St::Greeting { challenge, .. } = c.st else { unreachable!() };
                        return self.on_hello(slot, &body, challenge);
                    }
                }
                St::Member { rank, hdr, hdr_got, body, body_got } => {
                    let rank = *rank;
                    if *hdr_got < 4 {
                        match read_some(&mut c.sock, &mut hdr[*hdr_got..]) {
                            Io::Data(n) => *hdr_got += n,
                            Io::Eof if eof_is_loss => return self.lost(slot, "closed its connection"),
                            Io::Eof | Io::Again => return,
                        }
                        if *hdr_got == 4 {
                            let len = u32::from_le_bytes(*hdr) as usize;
                            if len > MAX_CLIENT_FRAME {
                                return self.lost(
                                    slot,
                                    &format!("sent a frame of {len} bytes (the limit is {MAX_CLIENT_FRAME})"),
                                );
                            }
                            *body = vec![0; len];
                            *body_got = 0;
                        }
                    }
                    if *hdr_got == 4 {
                        if *body_got < body.len() {
                            match read_some(&mut c.sock, &mut body[*body_got..]) {
                                Io::Data(n) => *body_got += n,
                                Io::Eof if eof_is_loss => return self.lost(slot, "closed its connection"),
                                Io::Eof | Io::Again => return,
                            }
                        }
                        if *body_got == body.len() {
                            let f = std::mem::take(body);
                            *hdr_got = 0;
                            self.on_frame(slot, rank, &f);
                        }
                    }
                }
                St::Parked { .. } | St::Done | St::Closing => {
                    let parked = matches!(c.st, St::Parked { .. });
                    let mut scratch = [0u8; 256];
                    match read_some(&mut c.sock, &mut scratch) {
                        // A parked rank that speaks or leaves gave up waiting.
                        Io::Data(_) if parked => return self.close(slot),
                        Io::Data(_) => {}
                        Io::Eof => return self.close(slot),
                        Io::Again => return,
                    }
                }
            }
        }
    }

    /// A connection broke or misbehaved; `why` completes "rank r (pid p) ...".
    fn lost(&mut self, slot: usize, why: &str) {
        let c = self.conns[slot].as_ref().expect("alive");
        let St::Member { rank, .. } = c.st else { return self.close(slot) };
        self.close(slot);
        let Some(s) = &self.session else { return };
        let Some(m) = s.members[rank].as_ref() else { return };
        if m.finished {
            return;
        }
        let msg = format!(
            "rank {rank} (pid {} at {}) {why} during set-up round {}: its process died, was killed, or its init failed (see its own error)",
            m.pid,
            m.peer.ip(),
            s.round
        );
        self.fail_session(ST_FAILED, &msg);
    }

    // ------------------------------------------------------------ protocol

    fn warn(&mut self, msg: &str) {
        // At most one line a second: a flood of strangers must not flood the log.
        let now = Instant::now();
        if self.last_warn.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.suppressed += 1;
            return;
        }
        let more = if self.suppressed > 0 {
            format!(" ({} similar messages suppressed)", std::mem::take(&mut self.suppressed))
        } else {
            String::new()
        };
        self.last_warn = Some(now);
        log::warn(format_args!("{msg}{more}"));
    }

    fn on_hello(&mut self, slot: usize, body: &[u8], challenge: [u8; 32]) {
        let peer = self.conn(slot).peer;
        let hello = match Hello::decode(body) {
            Ok(h) => h,
            Err(why) => return self.refuse(slot, ST_FAILED, &format!("refused: {why}")),
        };
        if hello.job_id != self.job_id {
            let (ours, theirs) = (hex(&self.job_id[..6]), hex(&hello.job_id[..6]));
            let m = format!(
                "rendezvous point {}: refused {peer}, which claims rank {} of {} of another job (its job id {theirs}, this point serves job {ours}, keyed by {}): is a second job using this address?",
                self.local,
                hello.rank,
                hello.nranks,
                self.key.source.describe()
            );
            self.warn(&m);
            let msg = format!(
                "refused: this rendezvous point serves another job (job id {ours}; this rank's job id is {theirs}). Two jobs were given the same address: give each its own port (FERROCCL_ROOT_ADDR or MASTER_PORT); if these ranks are one job, give every rank the same FERROCCL_SECRET"
            );
            return self.refuse(slot, ST_FAILED, &msg);
        }
        if !hello.verify(&self.key.key, &challenge) {
            let m = format!(
                "rendezvous point {}: refused {peer}: its hello has this job's id but a wrong proof of the job's key",
                self.local
            );
            self.warn(&m);
            return self.refuse(
                slot,
                ST_FAILED,
                "refused: the hello carries this job's id but not a valid proof of its key; use the unique id (or FERROCCL_SECRET) of this job",
            );
        }
        if let Err(why) = hello.check_ranks() {
            return self.refuse(slot, ST_FAILED, &format!("refused: {why}"));
        }
        if let Some(n) = self.opts.nranks.filter(|&n| n != hello.nranks as usize) {
            let msg = format!(
                "rank {} (pid {} at {}) was refused: it says the communicator has {} ranks, but this job has {n} (rank 0's world size)",
                hello.rank,
                hello.pid,
                peer.ip(),
                hello.nranks
            );
            self.refuse(slot, ST_FAILED, &msg);
            return self.fail_session(ST_FAILED, &msg);
        }
        self.admit(slot, hello, challenge);
    }

    /// Joins `hello`'s rank to the set-up in progress (starting one if none), parks
    /// it until that set-up ends, or refuses it.
    fn admit(&mut self, slot: usize, hello: Hello, challenge: [u8; 32]) {
        let now = Instant::now();
        let peer = self.conn(slot).peer;
        if let Some((status, why, _)) = &self.tombstone {
            let msg =
                format!("the set-up of this unique id already failed: {why}; create a new unique id and start again");
            return self.refuse(slot, *status, &msg);
        }
        if self.finished {
            return self.refuse(
                slot,
                ST_FAILED,
                "this unique id's set-up already completed; every communicator needs its own unique id (fcclGetUniqueId)",
            );
        }
        let (rank, nranks) = (hello.rank as usize, hello.nranks as usize);
        let hello_deadline = now + Duration::from_millis(hello.timeout_ms as u64);
        enum Then {
            Join,
            Park,
            Refuse(String),
            Fail(String),
        }
        let then = match &self.session {
            None => Then::Join,
            Some(s) => {
                let mine = |m: &Member| m.pid == hello.pid && m.host == hello.host;
                let taken = s.members[rank].as_ref();
                let done_here = s.members.iter().flatten().any(|m| mine(m) && m.finished);
                if done_here || taken.is_some_and(|m| m.finished || mine(m)) {
                    // The rank's next communicator, started before the others finished
                    // this one: it waits, within its own timeout.
                    Then::Park
                } else if let Some(m) = taken {
                    Then::Refuse(format!(
                        "refused: rank {rank} is already taken in the set-up in progress by pid {} at {}; this process (pid {} at {}) claims it too. Every process needs its own rank (check FERROCCL_RANK or RANK)",
                        m.pid,
                        m.peer.ip(),
                        hello.pid,
                        peer.ip()
                    ))
                } else if nranks != s.nranks {
                    Then::Fail(format!(
                        "rank {rank} (pid {} at {}) was refused: it says the communicator has {nranks} ranks, but the set-up in progress has {} (said first by rank {}, pid {}); every rank must be given the same world size",
                        hello.pid,
                        peer.ip(),
                        s.nranks,
                        s.first.0,
                        s.first.1
                    ))
                } else {
                    Then::Join
                }
            }
        };
        match then {
            Then::Join => {}
            Then::Park => {
                if self.parked.len() >= MAX_RANKS {
                    return self.refuse(slot, ST_FAILED, "refused: too many ranks wait for the next set-up");
                }
                self.set_state(slot, St::Parked { hello, challenge, since: now });
                self.conn(slot).deadline = Some(hello_deadline);
                let serial = self.conn(slot).serial;
                self.parked.push_back((slot, serial));
                return;
            }
            Then::Refuse(msg) => return self.refuse(slot, ST_FAILED, &msg),
            Then::Fail(msg) => {
                self.refuse(slot, ST_FAILED, &msg);
                return self.fail_session(ST_FAILED, &msg);
            }
        }
        if self.session.is_none() {
            let nonce = random_u64().unwrap_or(0x5eed ^ self.serial);
            self.session = Some(Session {
                nranks,
                nonce,
                first: (rank, hello.pid),
                members: (0..nranks).map(|_| None).collect(),
                round: 0,
                blobs: Vec::new(),
                blob_bytes: 0,
                submitted: 0,
                finished: 0,
                latest: now,
            });
        }
        let serial = self.conn(slot).serial;
        let s = self.session.as_mut().expect("a session");
        s.latest = s.latest.max(hello_deadline);
        s.members[rank] = Some(Member {
            slot,
            serial,
            pid: hello.pid,
            host: hello.host,
            peer,
            finished: false,
            submitted: false,
            waiting_since: None,
        });
        let welcome = welcome(&self.key.key, &hello, &challenge, s.nonce);
        self.set_state(slot, St::Member { rank, hdr: [0; 4], hdr_got: 0, body: Vec::new(), body_got: 0 });
        self.conn(slot).deadline = None;
        self.queue(slot, frame(&welcome));
        self.check_dead();
    }

    fn on_frame(&mut self, slot: usize, rank: usize, f: &[u8]) {
        let (round, tmo, blob) = match decode_round(f) {
            Ok(x) => x,
            Err(why) => return self.lost(slot, &format!("sent a malformed frame ({why})")),
        };
        let serial = self.conn(slot).serial;
        let Some(s) = self.session.as_mut() else { return self.close(slot) };
        let ours = |m: &Option<Member>| m.as_ref().is_some_and(|m| m.slot == slot && m.serial == serial);
        if !s.members.get(rank).is_some_and(ours) {
            return self.close(slot);
        }
        if round == FAIL_ROUND {
            let msg = format!("rank {rank} failed its set-up: {}", text(blob));
            return self.fail_session_reported_by(ST_FAILED, &msg, Some(slot));
        }
        if round == BYE_ROUND {
            let m = s.members[rank].as_mut().expect("a member");
            if !m.finished {
                m.finished = true;
                s.finished += 1;
            }
            let all = s.finished == s.nranks;
            self.set_state(slot, St::Done);
            self.conn(slot).deadline = Some(Instant::now() + DONE_LINGER);
            if all {
                self.end_session();
            }
            return;
        }
        let m = s.members[rank].as_ref().expect("a member");
        if round != s.round || m.submitted || m.finished {
            let cur = s.round;
            return self.lost(slot, &format!("sent round {round} while the set-up is at round {cur}"));
        }
        if round >= MAX_ROUNDS {
            return self.lost(slot, &format!("asked for round {round}; a set-up has at most {MAX_ROUNDS}"));
        }
        if s.blob_bytes + 4 + blob.len() >= MAX_SERVER_FRAME {
            let msg = format!(
                "round {round}'s blobs exceed {} MiB together (rank {rank} sent {} bytes)",
                MAX_SERVER_FRAME >> 20,
                blob.len()
            );
            return self.fail_session(ST_FAILED, &msg);
        }
        if s.blobs.is_empty() {
            s.blobs = (0..s.nranks).map(|_| None).collect();
        }
        s.blobs[rank] = Some(blob.to_vec());
        s.blob_bytes += 4 + blob.len();
        s.submitted += 1;
        let now = Instant::now();
        let m = s.members[rank].as_mut().expect("a member");
        m.submitted = true;
        m.waiting_since = Some(now);
        let done = s.submitted == s.nranks;
        self.conn(slot).deadline = Some(now + Duration::from_millis(tmo as u64));
        if done {
            self.complete_round();
        }
    }

    fn complete_round(&mut self) {
        let s = self.session.as_mut().expect("a session");
        let mut b = Vec::with_capacity(5 + s.blob_bytes);
        b.extend_from_slice(&((1 + s.blob_bytes) as u32).to_le_bytes());
        b.push(ST_OK);
        for blob in s.blobs.drain(..) {
            let blob = blob.unwrap_or_default();
            b.extend_from_slice(&(blob.len() as u32).to_le_bytes());
            b.extend_from_slice(&blob);
        }
        s.blob_bytes = 0;
        s.submitted = 0;
        s.round += 1;
        let reply = Arc::new(b);
        let mut to = Vec::with_capacity(s.nranks);
        for m in s.members.iter_mut().flatten() {
            m.submitted = false;
            m.waiting_since = None;
            to.push((m.slot, m.serial));
        }
        for (slot, serial) in to {
            if self.alive(slot, serial) {
                self.conn(slot).deadline = None;
                self.queue_rc(slot, reply.clone());
            }
        }
    }

    /// Every rank said BYE.
    fn end_session(&mut self) {
        self.session = None;
        if !self.opts.reusable {
            self.finished = true;
            self.listener = None;
        }
        self.unpark();
    }

    /// Tells every rank of the set-up in progress that it failed (`msg`), at once.
    fn fail_session(&mut self, status: u8, msg: &str) {
        self.fail_session_reported_by(status, msg, None)
    }

    /// Fails the set-up; the rank on `reporter` (which reported the failure) is told
    /// last, so its confirmation means every other rank's notice was written.
    fn fail_session_reported_by(&mut self, status: u8, msg: &str, reporter: Option<usize>) {
        let Some(s) = self.session.take() else {
            if !self.opts.reusable && self.tombstone.is_none() {
                self.tombstone = Some((status, msg.to_string(), Instant::now() + self.opts.hello_deadline));
            }
            return;
        };
        log::warn(format_args!("rendezvous point {}: the set-up of {} ranks failed: {msg}", self.local, s.nranks));
        let last = reporter.and_then(|r| s.members.iter().flatten().find(|m| m.slot == r));
        for m in s.members.iter().flatten().filter(|m| Some(m.slot) != reporter).chain(last) {
            let closing = self.conns.get(m.slot).and_then(|c| c.as_ref()).is_some_and(|c| matches!(c.st, St::Closing));
            if !m.finished && !closing && self.alive(m.slot, m.serial) {
                self.send_last(m.slot, status, msg);
            }
        }
        if !self.opts.reusable {
            // Ranks that arrive later are told too, as long as any could still wait.
            let until = s.latest.max(Instant::now() + self.opts.hello_deadline);
            self.tombstone = Some((status, msg.to_string(), until));
        }
        self.unpark();
    }

    /// A failed one-shot point stops once its failure is no longer news.
    fn finish_one_shot(&mut self) {
        if !self.opts.reusable && self.session.is_none() {
            self.finished = true;
            self.listener = None;
            self.unpark();
        }
    }

    /// Ranks parked behind the set-up that just ended get their turn, in order.
    fn unpark(&mut self) {
        let parked = std::mem::take(&mut self.parked);
        for (slot, serial) in parked {
            if !self.alive(slot, serial) {
                continue;
            }
            let c = self.conn(slot);
            if !matches!(c.st, St::Parked { .. }) {
                continue;
            }
            let St::Parked { hello, challenge, .. } = std::mem::replace(&mut c.st, St::Done) else { unreachable!() };
            self.admit(slot, hello, challenge);
        }
    }

    /// Fails the set-up in progress if the launcher saw a process of it end.
    fn check_dead(&mut self) {
        let Some(s) = &self.session else { return };
        // A process that ended has written all it ever will, maybe its BYE, which
        // this thread may not have read yet: read it first (the launcher's account
        // of how the process ended is the better one if it said nothing more).
        let unread: Vec<(usize, u64)> = s
            .members
            .iter()
            .flatten()
            .filter(|m| !m.finished && m.host == self.host && self.dead.iter().any(|d| d.2 == m.pid))
            .map(|m| (m.slot, m.serial))
            .collect();
        for (slot, serial) in unread {
            if self.alive(slot, serial) {
                self.read_input(slot, false);
            }
        }
        let Some(s) = &self.session else { return };
        let mut why = None;
        for (rank, world, pid, how) in &self.dead {
            let member = s
                .members
                .iter()
                .enumerate()
                .find_map(|(r, m)| m.as_ref().filter(|m| m.pid == *pid && m.host == self.host).map(|m| (r, m)));
            if let Some((r, m)) = member {
                if !m.finished {
                    why = Some(format!("rank {r} (pid {pid}) {how} during set-up round {}", s.round));
                    break;
                }
            } else if *world == s.nranks && s.members[*rank].is_none() {
                why = Some(format!(
                    "rank {rank}'s process (pid {pid}, started by the launcher as rank {rank} of {world}) {how} before it joined the set-up"
                ));
                break;
            }
        }
        if let Some(w) = why {
            self.fail_session(ST_FAILED, &w);
        }
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
