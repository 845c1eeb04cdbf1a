//! TCP links between ranks on different hosts.
//!
//! A link is one or more non-blocking sockets to the peer (FERROCCL_NSOCKS, chosen by
//! the connecting rank) with a staging ring each way, so the progress engine can drive
//! many peers from one thread without blocking on any of them. The byte stream is cut
//! into chunks of [`CHUNK`] bytes dealt to the sockets round robin (chunk `i` on socket
//! `i mod K`): each socket stays in order, so the receiver puts every byte in its place
//! without headers, and a message shorter than a chunk crosses at most two sockets.
//! Each socket is written and read on its own as the kernel takes and gives bytes; an
//! epoll instance per link tells the engine which of them are ready, and is the one
//! descriptor it sleeps on.

use super::{Io, Link};
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The most sockets one link may have (FERROCCL_NSOCKS's upper bound).
pub const MAX_SOCKS: usize = crate::env::NSOCKS_MAX;
/// Bytes of the stream dealt to one socket before the next takes over.
pub const CHUNK: usize = 256 << 10;
/// Staging ring each way; a multiple of [`CHUNK`], so no chunk wraps around it.
const RING: usize = 4 << 20;

/// One socket of a link and where it stands in the stream.
struct Sock {
    stream: TcpStream,
    /// Stream position of the next byte this socket sends (always inside one of its chunks).
    tx: u64,
    /// Stream position of the next byte this socket receives (likewise).
    rx: u64,
    /// Registered for writability: the kernel refused some of its bytes.
    want_out: bool,
    /// The peer closed its end (read returned 0).
    eof: bool,
}

/// A TCP link to one peer over one or more sockets (see the module's description).
pub struct TcpLink {
    peer: usize,
    socks: Vec<Sock>,
    epoll: OwnedFd,
    chunk: u64,
    /// Bytes of each ring (a multiple of `chunk`).
    ring: usize,
    tx: Vec<u8>,
    /// Stream position up to which the engine has committed bytes to send.
    produced: u64,
    rx: Vec<u8>,
    /// Stream position up to which the engine has consumed received bytes.
    consumed: u64,
    /// A send error seen where it could not be returned (`send_commit`).
    failed: Option<String>,
    /// The socket that carries failure notices (see [`Notices`]), if the pair has one.
    notices: Option<RefCell<Notices>>,
    /// The peer's host, for messages (empty: unknown).
    host: String,
    /// How long the peer's host may stay silent before the kernel ends the
    /// connections (see [`TcpLink::watch_host`]).
    silence: Option<Duration>,
}

/// Magic of a failure notice.
const NOTICE_MAGIC: u32 = 0x4c49_4146;

/// A pair's last socket: a rank that fails writes one notice there (magic and the
/// value its shared-memory failure word would hold) before it closes its sockets, so
/// a peer that sees them close can name the rank the failure started with, as peers
/// on one host read it from the failure word.
struct Notices {
    sock: TcpStream,
    got: [u8; 8],
    len: usize,
    eof: bool,
    told: bool,
}

impl Notices {
    /// Reads what has arrived; the notice's value once all of it has.
    fn poll(&mut self) -> Option<u32> {
        while !self.eof && self.len < 8 {
            match self.sock.read(&mut self.got[self.len..]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.len += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // WouldBlock: nothing yet; any other error: the peer is gone without a word.
                Err(e) => {
                    self.eof = e.kind() != ErrorKind::WouldBlock;
                    break;
                }
            }
        }
        let magic = u32::from_le_bytes(self.got[0..4].try_into().unwrap());
        (self.len == 8 && magic == NOTICE_MAGIC).then(|| u32::from_le_bytes(self.got[4..8].try_into().unwrap()))
    }

    /// [`Notices::poll`], waiting up to `wait` for the notice or the socket's end: a
    /// failing peer writes it before it closes the other sockets, but it travels apart.
    fn poll_until(&mut self, wait: Duration) -> Option<u32> {
        let until = Instant::now() + wait;
        loop {
            if let Some(v) = self.poll() {
                return Some(v);
            }
            let left = until.saturating_duration_since(Instant::now());
            if self.eof || left.is_zero() {
                return None;
            }
            let mut pfd = libc::pollfd { fd: self.sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: pfd is one valid pollfd for the duration of the call.
            unsafe { libc::poll(&mut pfd, 1, left.as_millis().clamp(1, 1000) as i32) };
        }
    }
}

const IN_EVENTS: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;

impl TcpLink {
    /// A link to `peer` over `socks`, in the order both ends agreed on (socket index
    /// of the hello); an error if there are none or more than [`MAX_SOCKS`].
    pub fn new(peer: usize, socks: Vec<TcpStream>) -> Result<TcpLink> {
        TcpLink::with_geometry(peer, socks, CHUNK, RING)
    }

    fn with_geometry(peer: usize, socks: Vec<TcpStream>, chunk: usize, ring: usize) -> Result<TcpLink> {
        if socks.is_empty() || socks.len() > MAX_SOCKS {
            return Err(Error::internal(format!(
                "a TCP link to rank {peer} over {} sockets (1 to {MAX_SOCKS})",
                socks.len()
            )));
        }
        debug_assert!(chunk % 8 == 0 && ring % chunk == 0 && ring >= chunk);
        // SAFETY: epoll_create1 takes no pointers; the result is checked before use.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(Error::system(format!(
                "cannot create an epoll instance for the TCP link to rank {peer}: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut out = Vec::with_capacity(socks.len());
        for (i, stream) in socks.into_iter().enumerate() {
            stream.set_nodelay(true)?;
            stream.set_nonblocking(true)?;
            let first = (i * chunk) as u64;
            out.push(Sock { stream, tx: first, rx: first, want_out: false, eof: false });
        }
        let link = TcpLink {
            peer,
            socks: out,
            epoll,
            chunk: chunk as u64,
            ring,
            tx: vec![0; ring],
            produced: 0,
            rx: vec![0; ring],
            consumed: 0,
            failed: None,
            notices: None,
            host: String::new(),
            silence: None,
        };
        for i in 0..link.socks.len() {
            link.epoll_ctl(libc::EPOLL_CTL_ADD, i, IN_EVENTS)?;
        }
        Ok(link)
    }

    /// Adds the pair's socket for failure notices (see [`Notices`]).
    pub fn with_notices(mut self, sock: TcpStream) -> Result<TcpLink> {
        sock.set_nonblocking(true)?;
        self.notices = Some(RefCell::new(Notices { sock, got: [0; 8], len: 0, eof: false, told: false }));
        Ok(self)
    }

    /// Names the peer's `host` in messages and, with `silence`, has the kernel end
    /// the data sockets once that host has given no sign of life for that long: no
    /// acknowledgement of data sent to it (TCP_USER_TIMEOUT), and while they are
    /// idle no answer to keepalive probes, sent from half the bound on, a tenth of
    /// it apart. A host that vanished without closing them (power loss, a cut
    /// cable) is then reported within about `silence`, naming it.
    pub fn watch_host(mut self, host: &str, silence: Option<Duration>) -> Result<TcpLink> {
        self.host = host.to_string();
        if let Some(b) = silence {
            let secs = b.as_secs().max(1);
            let ms = b.as_millis().min(i32::MAX as u128) as libc::c_int;
            let opts = [
                (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
                (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, (secs / 2).max(1) as libc::c_int),
                (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, (secs / 10).max(1) as libc::c_int),
                (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms),
            ];
            for (i, sock) in self.socks.iter().enumerate() {
                for (level, name, v) in opts {
                    // SAFETY: the socket is open; setsockopt reads one c_int from a live local.
                    let r = unsafe {
                        libc::setsockopt(
                            sock.stream.as_raw_fd(),
                            level,
                            name,
                            &v as *const libc::c_int as *const libc::c_void,
                            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                        )
                    };
                    if r != 0 {
                        return Err(Error::system(format!(
                            "cannot bound the silence of rank {}'s host on socket {i} of the TCP link (option {name}): {}; set FERROCCL_PEER_LOST_MS=0 to leave it to the kernel",
                            self.peer,
                            std::io::Error::last_os_error()
                        )));
                    }
                }
            }
            self.silence = Some(b);
        }
        Ok(self)
    }

    /// The failure the peer reported, waiting up to `wait` for its notice.
    fn reported(&self, wait: Duration) -> Result<()> {
        let Some(n) = &self.notices else { return Ok(()) };
        let mut n = n.borrow_mut();
        match if wait.is_zero() { n.poll() } else { n.poll_until(wait) } {
            Some(v) => Err(super::failure::failure(self.peer, v)),
            None => Ok(()),
        }
    }

    /// How many sockets the link has.
    pub fn sockets(&self) -> usize {
        self.socks.len()
    }

    fn epoll_ctl(&self, op: i32, i: usize, events: u32) -> Result<()> {
        let mut ev = libc::epoll_event { events, u64: i as u64 };
        // SAFETY: both descriptors are open for the link's lifetime; ev outlives the call.
        let r = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, self.socks[i].stream.as_raw_fd(), &mut ev) };
        if r < 0 {
            return Err(self.lost(&format!("epoll_ctl on socket {i}: {}", std::io::Error::last_os_error())));
        }
        Ok(())
    }

    /// Asks epoll to report socket `i` writable, or stops asking.
    fn want_out(&mut self, i: usize, on: bool) -> Result<()> {
        if self.socks[i].want_out != on {
            let ev = if on { IN_EVENTS | libc::EPOLLOUT as u32 } else { IN_EVENTS };
            self.epoll_ctl(libc::EPOLL_CTL_MOD, i, ev)?;
            self.socks[i].want_out = on;
        }
        Ok(())
    }

    fn chunk_end(&self, pos: u64) -> u64 {
        (pos / self.chunk + 1) * self.chunk
    }

    /// The position after `pos` when it reaches a chunk's end: the start of the socket's next chunk.
    fn step(&self, pos: u64) -> u64 {
        if pos % self.chunk == 0 {
            pos + (self.socks.len() as u64 - 1) * self.chunk
        } else {
            pos
        }
    }

    /// The lowest position any socket has yet to send: everything below it has left.
    fn sent(&self) -> u64 {
        self.socks.iter().map(|s| s.tx).min().expect("a link has a socket").min(self.produced)
    }

    /// The lowest position any socket has yet to receive: the stream is whole below it.
    fn received(&self) -> u64 {
        self.socks.iter().map(|s| s.rx).min().expect("a link has a socket")
    }

    /// Writes socket `i`'s share of the committed bytes until the kernel refuses more.
    fn flush(&mut self, i: usize) -> Result<bool> {
        let mut moved = false;
        loop {
            let pos = self.socks[i].tx;
            let end = self.chunk_end(pos).min(self.produced);
            if pos >= end {
                self.want_out(i, false)?;
                return Ok(moved);
            }
            let at = (pos % self.ring as u64) as usize;
            let len = (end - pos) as usize;
            match self.socks[i].stream.write(&self.tx[at..at + len]) {
                Ok(0) => return Err(self.lost(&format!("socket {i} of {} closed while sending", self.socks.len()))),
                Ok(n) => {
                    let next = self.step(pos + n as u64);
                    self.socks[i].tx = next;
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.want_out(i, true)?;
                    return Ok(moved);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.lost_io(i, &e)),
            }
        }
    }

    /// Reads socket `i`'s chunks into the ring while it has room for them.
    fn fill(&mut self, i: usize) -> Result<bool> {
        let mut moved = false;
        while !self.socks[i].eof {
            let pos = self.socks[i].rx;
            let end = self.chunk_end(pos).min(self.consumed + self.ring as u64);
            if pos >= end {
                break;
            }
            let at = (pos % self.ring as u64) as usize;
            let len = (end - pos) as usize;
            match self.socks[i].stream.read(&mut self.rx[at..at + len]) {
                Ok(0) => self.socks[i].eof = true,
                Ok(n) => {
                    let next = self.step(pos + n as u64);
                    self.socks[i].rx = next;
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.lost_io(i, &e)),
            }
        }
        Ok(moved)
    }

    fn lost(&self, why: &str) -> Error {
        let on = if self.host.is_empty() { String::new() } else { format!(" on host {}", self.host) };
        Error::remote_rank(self.peer, format!("lost the TCP connection to rank {}{on}: {why}", self.peer))
    }

    /// [`TcpLink::lost`] for an error of socket `i`: the kernel ends a connection
    /// whose host stayed silent past the bound with one of these.
    fn lost_io(&self, i: usize, e: &std::io::Error) -> Error {
        let silent = matches!(e.raw_os_error(), Some(libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ENETUNREACH));
        match self.silence {
            Some(b) if silent => self.lost(&format!(
                "its host gave no sign of life for {} ms (FERROCCL_PEER_LOST_MS; {e}): it is down, or the network to it is cut",
                b.as_millis()
            )),
            _ => self.lost(&format!("socket {i} of {}: {e}", self.socks.len())),
        }
    }

    fn progress_sockets(&mut self) -> Result<bool> {
        if let Some(why) = &self.failed {
            return Err(Error::remote_rank(self.peer, why.clone()));
        }
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; MAX_SOCKS];
        // SAFETY: events has room for MAX_SOCKS entries, the most epoll_wait writes here.
        let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), events.as_mut_ptr(), MAX_SOCKS as i32, 0) };
        let mut moved = false;
        for ev in events.iter().take(n.max(0) as usize) {
            let (bits, i) = (ev.events, ev.u64 as usize);
            if bits & libc::EPOLLOUT as u32 != 0 || bits & libc::EPOLLERR as u32 != 0 {
                moved |= self.flush(i)?;
            }
            if bits & !(libc::EPOLLOUT as u32) != 0 {
                moved |= self.fill(i)?;
            }
        }
        Ok(moved)
    }

    fn check_stream(&self) -> Result<()> {
        if let Some(why) = &self.failed {
            return Err(Error::remote_rank(self.peer, why.clone()));
        }
        // The socket that carries the next byte of the stream: once it has ended, the
        // stream cannot go on. (Another one's end proves nothing yet: a peer that
        // exits closes them all, and the others' last bytes may still be on the way.)
        let next = self.received();
        let i = self.socks.iter().position(|s| s.rx == next).expect("the lowest position is a socket's");
        if self.socks[i].eof && next - self.consumed < 8 {
            let why = if self.socks.len() == 1 {
                "the peer closed the connection (process exited or aborted)".to_string()
            } else {
                format!("the peer closed socket {i} of {} (process exited or aborted)", self.socks.len())
            };
            return Err(self.lost(&why));
        }
        Ok(())
    }
}

impl TcpLink {
    /// An error naming the peer if its stream ended or the failure it reported.
    fn check_alive(&self) -> Result<()> {
        self.check_stream().map_err(|e| self.reported(Duration::from_millis(50)).err().unwrap_or(e))
    }

    /// An error if a send failed where it could not be returned, or the peer reported
    /// a failure (no waiting).
    fn check_flag(&self) -> Result<()> {
        if let Some(why) = &self.failed {
            return Err(Error::remote_rank(self.peer, why.clone()));
        }
        self.reported(Duration::ZERO)
    }

    /// Writes this rank's failure notice `v` once (see [`Notices`]).
    fn tell_failed(&mut self, v: u32) {
        if let Some(n) = &self.notices {
            let mut n = n.borrow_mut();
            if !n.told {
                n.told = true;
                let mut b = [0u8; 8];
                b[0..4].copy_from_slice(&NOTICE_MAGIC.to_le_bytes());
                b[4..8].copy_from_slice(&v.to_le_bytes());
                // Eight bytes always fit in an unused socket's buffer; a dead peer is no loss.
                let _ = n.sock.write_all(&b);
            }
        }
    }

    /// Shuts every socket down: the peer sees the link end.
    fn shutdown(&mut self) {
        for s in &self.socks {
            let _ = s.stream.shutdown(std::net::Shutdown::Both);
        }
        if let Some(n) = &self.notices {
            let _ = n.borrow().sock.shutdown(std::net::Shutdown::Write);
        }
    }
}

impl Link for TcpLink {
    fn peer(&self) -> usize {
        self.peer
    }

    fn send_space(&mut self) -> &mut [u8] {
        let at = (self.produced % self.ring as u64) as usize;
        let free = (self.sent() + self.ring as u64 - self.produced) as usize;
        let n = free.min(self.ring - at) & !7;
        &mut self.tx[at..at + n]
    }

    fn send_commit(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let from = self.produced;
        self.produced += n as u64;
        // The sockets whose chunks the new bytes fall in, unless the kernel is full
        // there already (epoll will say when it takes more).
        let k = self.socks.len() as u64;
        let first = from / self.chunk;
        let last = (self.produced - 1) / self.chunk;
        for c in first..=last.min(first + k - 1) {
            let i = (c % k) as usize;
            if self.failed.is_none() && !self.socks[i].want_out {
                // Errors surface at the next progress().
                if let Err(e) = self.flush(i) {
                    self.failed = Some(e.msg);
                }
            }
        }
    }

    fn recv_avail(&mut self) -> &[u8] {
        let at = (self.consumed % self.ring as u64) as usize;
        let n = ((self.received() - self.consumed) as usize).min(self.ring - at) & !7;
        &self.rx[at..at + n]
    }

    fn recv_commit(&mut self, n: usize) {
        self.consumed += n as u64;
    }

    fn check(&self, deep: bool) -> Result<()> {
        if deep {
            self.check_alive()
        } else {
            self.check_flag()
        }
    }

    fn fail(&mut self, v: u32) {
        self.tell_failed(v);
        self.shutdown();
    }

    fn io(&mut self) -> Option<&mut dyn Io> {
        Some(self)
    }
}

impl Io for TcpLink {
    fn progress(&mut self) -> Result<bool> {
        // A connection reset by a peer that failed because of another rank is that rank's story.
        self.progress_sockets().map_err(|e| self.reported(Duration::from_millis(50)).err().unwrap_or(e))
    }

    fn unsent(&self) -> bool {
        self.sent() < self.produced
    }

    fn fd(&self) -> i32 {
        self.epoll.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroccl_testutil::Rng;
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    /// `k` connected socket pairs on loopback, in the same order on both ends.
    fn pairs(k: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..k {
            a.push(TcpStream::connect(addr).unwrap());
            b.push(l.accept().unwrap().0);
        }
        (a, b)
    }

    fn sockopt(s: &TcpStream, level: i32, name: i32) -> i32 {
        let mut v: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: the socket is open; getsockopt writes at most len bytes into v.
        let r = unsafe {
            libc::getsockopt(s.as_raw_fd(), level, name, &mut v as *mut libc::c_int as *mut libc::c_void, &mut len)
        };
        assert_eq!(r, 0, "getsockopt {level}/{name}");
        v
    }

    /// A bound on the peer's host's silence becomes the kernel's: keepalive from half
    /// of it (whole seconds), probes a tenth apart, and the same bound for data left
    /// unacknowledged; without one the sockets keep the kernel's defaults.
    #[test]
    fn the_silence_bound_is_set_on_every_data_socket() {
        let (a, b) = pairs(3);
        let watched = TcpLink::new(1, a).unwrap().watch_host("far", Some(Duration::from_millis(4500))).unwrap();
        for s in &watched.socks {
            assert_eq!(sockopt(&s.stream, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
            assert_eq!(sockopt(&s.stream, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 2);
            assert_eq!(sockopt(&s.stream, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), 1);
            assert_eq!(sockopt(&s.stream, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT), 4500);
        }
        assert!(watched.lost("x").msg.contains("rank 1 on host far"));
        let plain = TcpLink::new(0, b).unwrap().watch_host("", None).unwrap();
        for s in &plain.socks {
            assert_eq!(sockopt(&s.stream, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 0);
            assert_eq!(sockopt(&s.stream, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT), 0);
        }
        let e = watched.lost_io(0, &std::io::Error::from_raw_os_error(libc::ETIMEDOUT));
        assert!(e.msg.contains("no sign of life for 4500 ms (FERROCCL_PEER_LOST_MS"), "{}", e.msg);
        let e = plain.lost_io(0, &std::io::Error::from_raw_os_error(libc::ETIMEDOUT));
        assert!(e.msg.contains("socket 0 of 3") && !e.msg.contains("PEER_LOST"), "{}", e.msg);
    }

    /// A multiple of 8 from 8 to `max`.
    fn len8(r: &mut Rng, max: usize) -> usize {
        8 * (1 + r.index(max / 8))
    }

    fn pattern(n: usize, seed: u64) -> Vec<u8> {
        Rng::new(seed).bytes(n)
    }

    /// One side of a transfer: what it still has to send and what it got.
    struct End<'a> {
        link: TcpLink,
        out: &'a [u8],
        sent: usize,
        got: Vec<u8>,
    }

    impl End<'_> {
        /// Sends up to `send_len` bytes and receives up to `recv_len`; true when anything moved.
        fn step(&mut self, send_len: usize, recv_len: usize) -> bool {
            let mut moved = self.link.progress().unwrap();
            let space = self.link.send_space();
            let n = space.len().min(self.out.len() - self.sent).min(send_len);
            if n > 0 {
                space[..n].copy_from_slice(&self.out[self.sent..self.sent + n]);
                self.link.send_commit(n);
                self.sent += n;
                moved = true;
            }
            let avail = self.link.recv_avail();
            let n = avail.len().min(recv_len);
            if n > 0 {
                self.got.extend_from_slice(&avail[..n]);
                self.link.recv_commit(n);
                moved = true;
            }
            moved
        }
    }

    /// Sends `a_out` from a to b and `b_out` from b to a at once, in lengths from
    /// `lens` (sender) and random ones (receiver); checks both arrive whole.
    fn exchange(a: TcpLink, b: TcpLink, a_out: &[u8], b_out: &[u8], lens: &mut dyn FnMut() -> usize, seed: u64) {
        let mut r = Rng::new(seed);
        let mut a = End { link: a, out: a_out, sent: 0, got: Vec::new() };
        let mut b = End { link: b, out: b_out, sent: 0, got: Vec::new() };
        let deadline = Instant::now() + Duration::from_secs(60);
        while a.got.len() < b_out.len() || b.got.len() < a_out.len() {
            assert!(
                Instant::now() < deadline,
                "stalled: a got {} of {}, b got {} of {}",
                a.got.len(),
                b_out.len(),
                b.got.len(),
                a_out.len()
            );
            let (s1, s2, r1, r2) = (lens(), lens(), len8(&mut r, 1 << 20), len8(&mut r, 1 << 20));
            a.step(s1, r1);
            b.step(s2, r2);
        }
        assert!(a.got == b_out, "a received a corrupted stream");
        assert!(b.got == a_out, "b received a corrupted stream");
        a.link.check_alive().unwrap();
        b.link.check_alive().unwrap();
    }

    fn links(k: usize, chunk: usize, ring: usize) -> (TcpLink, TcpLink) {
        let (a, b) = pairs(k);
        (TcpLink::with_geometry(1, a, chunk, ring).unwrap(), TcpLink::with_geometry(0, b, chunk, ring).unwrap())
    }

    #[test]
    fn striped_streams_arrive_whole_with_random_lengths() {
        for k in 1..=3 {
            // Small chunks and ring: many chunk boundaries and wrap-arounds.
            let (a, b) = links(k, 4096, 16384);
            let (x, y) = (pattern(3 << 20, 7 + k as u64), pattern((2 << 20) + 8 * 37, 11 + k as u64));
            let mut r = Rng::new(99 + k as u64);
            exchange(a, b, &x, &y, &mut || len8(&mut r, 3 * 4096), k as u64);
        }
    }

    #[test]
    fn commits_straddling_chunk_boundaries_arrive_whole() {
        let chunk = 4096;
        for k in 1..=3 {
            let (a, b) = links(k, chunk, 4 * chunk);
            let x = pattern(1 << 20, 5);
            let y = pattern(1 << 19, 6);
            let cycle = [chunk - 8, 16, chunk, 8, 2 * chunk + 8, chunk + 8, 24];
            let mut i = 0;
            exchange(
                a,
                b,
                &x,
                &y,
                &mut || {
                    i += 1;
                    cycle[i % cycle.len()]
                },
                k as u64,
            );
        }
    }

    #[test]
    fn default_geometry_carries_large_messages() {
        let (a, b) = pairs(3);
        let (a, b) = (TcpLink::new(1, a).unwrap(), TcpLink::new(0, b).unwrap());
        assert_eq!(a.sockets(), 3);
        let x = pattern(24 << 20, 1);
        let y = pattern(8 << 20, 2);
        let mut r = Rng::new(3);
        exchange(a, b, &x, &y, &mut || len8(&mut r, 2 << 20), 4);
    }

    /// Drives `a` until check_alive fails (or `limit` passes: then None).
    fn failure(a: &mut TcpLink, limit: Duration) -> Option<Error> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            a.progress().unwrap();
            let n = a.recv_avail().len();
            a.recv_commit(n);
            if let Err(e) = a.check_alive() {
                return Some(e);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    #[test]
    fn a_peer_closing_one_socket_fails_the_link_naming_it() {
        let (a, mut b) = pairs(3);
        let mut a = TcpLink::new(5, a).unwrap();
        drop(b.remove(0));
        let e = failure(&mut a, Duration::from_secs(10)).expect("the closed socket went unnoticed");
        assert_eq!(e.culprit, Some(5), "{e}");
        assert!(e.msg.contains("rank 5") && e.msg.contains("socket 0 of 3"), "{e}");
    }

    /// Links over `k` data sockets and a notice socket each.
    fn noticed(k: usize) -> (TcpLink, TcpLink) {
        let (mut a, mut b) = pairs(k + 1);
        let (na, nb) = (a.pop().unwrap(), b.pop().unwrap());
        (TcpLink::new(1, a).unwrap().with_notices(na).unwrap(), TcpLink::new(0, b).unwrap().with_notices(nb).unwrap())
    }

    #[test]
    fn a_peer_that_failed_because_of_another_rank_is_not_blamed() {
        let (mut a, mut b) = noticed(2);
        assert!(a.check_flag().is_ok());
        // Rank 0 (b) stops because of rank 7, tells rank 1 (a), and closes everything.
        b.tell_failed(7 + 1);
        b.shutdown();
        drop(b);
        let e = failure(&mut a, Duration::from_secs(10)).expect("the closed link went unnoticed");
        assert_eq!(e.culprit, Some(7), "{e}");
        assert!(e.msg.contains("rank 7") && e.msg.contains("reported by rank 1"), "{e}");
        let f = a.check_flag().expect_err("the notice is a flag too");
        assert_eq!(f.culprit, Some(7), "{f}");
    }

    #[test]
    fn a_peer_that_exits_without_a_notice_is_the_one_named() {
        let (mut a, b) = noticed(2);
        drop(b);
        let e = failure(&mut a, Duration::from_secs(10)).expect("the closed link went unnoticed");
        assert_eq!(e.culprit, Some(1), "{e}");
        assert!(e.msg.contains("lost the TCP connection to rank 1"), "{e}");
        assert!(a.check_flag().is_ok(), "an exit without a notice is no failure flag");
    }

    #[test]
    fn a_closed_socket_fails_the_link_when_the_stream_reaches_it() {
        let (a, mut b) = pairs(3);
        let mut a = TcpLink::new(5, a).unwrap();
        drop(b.remove(1));
        // Chunk 0 is on socket 0, still open: the stream can go on until chunk 1.
        assert!(failure(&mut a, Duration::from_millis(200)).is_none(), "failed before the stream needed socket 1");
        b[0].write_all(&pattern(CHUNK, 3)).unwrap();
        let e = failure(&mut a, Duration::from_secs(10)).expect("the closed socket went unnoticed");
        assert!(e.msg.contains("rank 5") && e.msg.contains("socket 1 of 3"), "{e}");
    }

    #[test]
    fn one_slow_socket_does_not_hold_back_the_others() {
        let (chunk, ring) = (64 << 10, 4 << 20);
        let (a, mut b) = pairs(2);
        // Socket 1 holds little in the kernel, so the sender must keep its bytes.
        let small: libc::c_int = 16 << 10;
        for (s, opt) in [(&a[1], libc::SO_SNDBUF), (&b[1], libc::SO_RCVBUF)] {
            // SAFETY: setsockopt reads one int through a valid pointer.
            let r = unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    &small as *const libc::c_int as *const libc::c_void,
                    4,
                )
            };
            assert_eq!(r, 0);
        }
        let mut a = TcpLink::with_geometry(1, a, chunk, ring).unwrap();
        let data = pattern(ring, 9);
        let mut sent = 0;
        let mut on0 = Vec::new();
        b[0].set_nonblocking(true).unwrap();
        let share = ring / 2;
        let deadline = Instant::now() + Duration::from_secs(20);
        // Only socket 0 is read: it must still get every one of its chunks in the ring.
        while on0.len() < share {
            assert!(
                Instant::now() < deadline,
                "socket 0 got {} of {share} bytes while socket 1 was not read",
                on0.len()
            );
            a.progress().unwrap();
            let space = a.send_space();
            let n = space.len().min(ring - sent);
            space[..n].copy_from_slice(&data[sent..sent + n]);
            a.send_commit(n);
            sent += n;
            let mut buf = vec![0u8; 1 << 20];
            match b[0].read(&mut buf) {
                Ok(n) => on0.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(sent, ring, "the ring filled while socket 1 was stalled");
        assert!(a.sent() < ring as u64 / 2, "socket 1 was never held back ({} sent)", a.sent());
        // Now the slow socket catches up, and the stream is in its places.
        b[1].set_nonblocking(true).unwrap();
        let mut on1 = Vec::new();
        while on1.len() < share {
            assert!(Instant::now() < deadline, "socket 1 got {} of {share} bytes", on1.len());
            a.progress().unwrap();
            let mut buf = vec![0u8; 1 << 20];
            match b[1].read(&mut buf) {
                Ok(n) => on1.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("{e}"),
            }
        }
        for (c, want) in data.chunks(chunk).enumerate() {
            let mine = if c % 2 == 0 { &on0 } else { &on1 };
            let at = (c / 2) * chunk;
            assert!(&mine[at..at + chunk] == want, "chunk {c} arrived wrong");
        }
        assert_eq!(a.sent(), ring as u64);
    }
}
