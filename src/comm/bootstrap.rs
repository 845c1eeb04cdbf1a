//! Unique ids and the rendezvous point.
//!
//! `fcclGetUniqueId` starts a small TCP server in the calling process and returns an
//! id carrying its reachable address and a random secret. Ranks connect, prove the
//! secret, and then run "rounds": each rank sends a blob, and once every rank's blob
//! for that round is in, each gets all of them. Communicator set-up is three rounds
//! (exchange addresses, segments created, segments mapped). The server never trusts
//! a client: frames are length-limited, reads time out, a wrong secret or a malformed
//! frame closes that one connection and nothing else.

use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Size of `fcclUniqueId`.
pub(crate) const UNIQUE_ID_BYTES: usize = 128;
const ID_MAGIC: &[u8; 4] = b"FCID";
const ID_VERSION: u8 = 1;
const HELLO_MAGIC: &[u8; 4] = b"FCRV";
const PROTO_VERSION: u32 = 1;
/// Largest frame a client may send (a blob of rank information).
pub(crate) const MAX_CLIENT_FRAME: usize = 64 << 10;
/// Largest frame the server sends (all ranks' blobs).
const MAX_SERVER_FRAME: usize = 256 << 20;
const BYE_ROUND: u32 = u32::MAX;
const HELLO_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The opaque id of ABI.md: address of the rendezvous point and a secret.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        match self.addr() {
            Ok(a) => write!(f, "UniqueId({a})"),
            Err(_) => f.write_str("UniqueId(invalid)"),
        }
    }
}

impl UniqueId {
    fn build(addr: SocketAddr, secret: &[u8; 32]) -> UniqueId {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[0..4].copy_from_slice(ID_MAGIC);
        b[4] = ID_VERSION;
        match addr.ip() {
            IpAddr::V4(ip) => {
                b[5] = 4;
                b[8..12].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                b[5] = 6;
                b[8..24].copy_from_slice(&ip.octets());
            }
        }
        b[6..8].copy_from_slice(&addr.port().to_be_bytes());
        b[24..56].copy_from_slice(secret);
        UniqueId(b)
    }

    /// Starts a rendezvous point in this process and returns its id. The point
    /// serves one communicator set-up (or several in a row when `reusable`).
    pub fn generate(reusable: bool) -> Result<UniqueId> {
        let secret = random_secret()?;
        let bind_ip = crate::env::HOST_ADDR
            .get()
            .and_then(|s| s.parse::<IpAddr>().ok())
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let listener = TcpListener::bind(SocketAddr::new(bind_ip, 0))
            .map_err(|e| Error::system(format!("cannot open the rendezvous port: {e}")))?;
        let port = listener.local_addr()?.port();
        let adv = advertised_ip(bind_ip);
        Server::spawn(listener, secret, reusable)?;
        Ok(UniqueId::build(SocketAddr::new(adv, port), &secret))
    }

    /// The id of a rendezvous point at a known address (FERROCCL_ROOT_ADDR), with a
    /// secret derived from a shared string (empty: all zeros).
    pub fn from_addr(addr: SocketAddr, shared_secret: &str) -> UniqueId {
        UniqueId::build(addr, &secret_from_string(shared_secret))
    }

    /// Serves the rendezvous for this id at its own address (rank 0 under FERROCCL_ROOT_ADDR).
    pub fn serve_here(&self) -> Result<()> {
        let addr = self.addr()?;
        let bind = SocketAddr::new(
            if addr.is_ipv4() { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) },
            addr.port(),
        );
        let listener = TcpListener::bind(bind).map_err(|e| {
            Error::system(format!(
                "rank 0 cannot serve the rendezvous on port {} (FERROCCL_ROOT_ADDR): {e}",
                addr.port()
            ))
        })?;
        Server::spawn(listener, self.secret(), false)
    }

    /// The rendezvous point's address.
    pub fn addr(&self) -> Result<SocketAddr> {
        let b = &self.0;
        if &b[0..4] != ID_MAGIC || b[4] != ID_VERSION {
            return Err(Error::invalid_arg(
                "the unique id is not one made by fcclGetUniqueId (bad magic or version); pass the id unchanged from the process that created it",
            ));
        }
        let port = u16::from_be_bytes([b[6], b[7]]);
        let ip = match b[5] {
            4 => IpAddr::V4(Ipv4Addr::new(b[8], b[9], b[10], b[11])),
            6 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(&b[8..24]);
                IpAddr::V6(Ipv6Addr::from(o))
            }
            f => return Err(Error::invalid_arg(format!("the unique id has an unknown address family {f}"))),
        };
        if port == 0 {
            return Err(Error::invalid_arg("the unique id has port 0"));
        }
        Ok(SocketAddr::new(ip, port))
    }

    pub fn secret(&self) -> [u8; 32] {
        let mut s = [0u8; 32];
        s.copy_from_slice(&self.0[24..56]);
        s
    }

    /// 256 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(s: &str) -> Result<UniqueId> {
        let s = s.trim();
        if s.len() != 2 * UNIQUE_ID_BYTES || !s.is_ascii() {
            return Err(Error::invalid_arg(format!(
                "a unique id in hex has {} digits, got {} characters",
                2 * UNIQUE_ID_BYTES,
                s.len()
            )));
        }
        let mut b = [0u8; UNIQUE_ID_BYTES];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| {
                Error::invalid_arg(format!("unique id hex has a non-hex digit near position {}", 2 * i))
            })?;
        }
        let id = UniqueId(b);
        id.addr()?;
        Ok(id)
    }
}

/// 32 random bytes from the kernel.
pub fn random_secret() -> Result<[u8; 32]> {
    let mut s = [0u8; 32];
    let mut got = 0;
    while got < s.len() {
        // SAFETY: writes at most len-got bytes into s[got..].
        let n = unsafe { libc::getrandom(s[got..].as_mut_ptr() as *mut libc::c_void, s.len() - got, 0) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(Error::os("getrandom for the rendezvous secret"));
        }
        got += n as usize;
    }
    Ok(s)
}

/// A random 64-bit value (segment names, session nonces).
pub fn random_u64() -> Result<u64> {
    let s = random_secret()?;
    Ok(u64::from_le_bytes(s[0..8].try_into().expect("8 bytes")))
}

fn secret_from_string(s: &str) -> [u8; 32] {
    // Not a cryptographic KDF: the FERROCCL_ROOT_ADDR path is for trusted clusters;
    // ferroccl-run and fcclGetUniqueId use random secrets.
    let mut out = [0u8; 32];
    if s.is_empty() {
        return out;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, o) in out.iter_mut().enumerate() {
        for &c in s.as_bytes() {
            h = (h ^ c as u64 ^ i as u64).wrapping_mul(0x100_0000_01b3);
        }
        *o = (h >> 24) as u8;
    }
    out
}

fn advertised_ip(bind: IpAddr) -> IpAddr {
    if !bind.is_unspecified() {
        return bind;
    }
    first_interface_ipv4().map(IpAddr::V4).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// The first up, non-loopback IPv4 address of this host, if any.
fn first_interface_ipv4() -> Option<Ipv4Addr> {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills ifap with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        let up = ifa.ifa_flags & (libc::IFF_UP as u32) != 0;
        let lo = ifa.ifa_flags & (libc::IFF_LOOPBACK as u32) != 0;
        // SAFETY: ifa_addr, when non-null, points to a sockaddr of the family it names.
        if up && !lo && !ifa.ifa_addr.is_null() && unsafe { (*ifa.ifa_addr).sa_family } as i32 == libc::AF_INET {
            // SAFETY: family is AF_INET, so the sockaddr is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            found = Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            break;
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: ifap came from getifaddrs.
    unsafe { libc::freeifaddrs(ifap) };
    found
}

// ---------------------------------------------------------------- framing

fn write_frame(s: &mut TcpStream, body: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(body);
    s.write_all(&buf)
}

/// Reads one frame of at most `max` bytes; a longer length is refused unread.
pub fn read_frame(s: &mut impl Read, max: usize) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {max}"),
        ));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok(body)
}

/// A client's hello, decoded. Public so the decoder can be fuzzed.
#[derive(Debug, PartialEq, Eq)]
pub struct Hello {
    pub secret: [u8; 32],
    pub nranks: u32,
    pub rank: u32,
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(48);
        b.extend_from_slice(HELLO_MAGIC);
        b.extend_from_slice(&PROTO_VERSION.to_le_bytes());
        b.extend_from_slice(&self.secret);
        b.extend_from_slice(&self.nranks.to_le_bytes());
        b.extend_from_slice(&self.rank.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> std::result::Result<Hello, String> {
        if b.len() != 48 {
            return Err(format!("hello of {} bytes, expected 48", b.len()));
        }
        if &b[0..4] != HELLO_MAGIC {
            return Err("not a ferroccl rendezvous hello".into());
        }
        let ver = u32::from_le_bytes(b[4..8].try_into().unwrap());
        if ver != PROTO_VERSION {
            return Err(format!("protocol version {ver}, this library speaks {PROTO_VERSION}"));
        }
        let mut secret = [0u8; 32];
        secret.copy_from_slice(&b[8..40]);
        let nranks = u32::from_le_bytes(b[40..44].try_into().unwrap());
        let rank = u32::from_le_bytes(b[44..48].try_into().unwrap());
        if nranks == 0 || rank >= nranks {
            return Err(format!("rank {rank} of {nranks} is not valid"));
        }
        Ok(Hello { secret, nranks, rank })
    }
}

/// A round request: (round number, client's remaining timeout in ms, blob).
pub fn decode_round(b: &[u8]) -> std::result::Result<(u32, u32, &[u8]), String> {
    if b.len() < 8 {
        return Err(format!("round frame of {} bytes, expected at least 8", b.len()));
    }
    let round = u32::from_le_bytes(b[0..4].try_into().unwrap());
    let tmo = u32::from_le_bytes(b[4..8].try_into().unwrap());
    Ok((round, tmo, &b[8..]))
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

// ---------------------------------------------------------------- server

#[derive(Default)]
struct Session {
    nranks: usize,
    nonce: u64,
    joined: Vec<bool>,
    finished: Vec<bool>,
    rounds: Vec<Vec<Option<Vec<u8>>>>,
    failed: Option<String>,
}

impl Session {
    fn active(&self) -> bool {
        self.nranks > 0
    }
    fn missing(&self, round: usize) -> Vec<usize> {
        (0..self.nranks)
            .filter(|&r| !self.joined[r] || self.rounds.get(round).and_then(|v| v[r].as_ref()).is_none())
            .collect()
    }
}

struct Server {
    secret: [u8; 32],
    reusable: bool,
    state: Mutex<Session>,
    cv: Condvar,
    stop: AtomicBool,
}

impl Server {
    fn spawn(listener: TcpListener, secret: [u8; 32], reusable: bool) -> Result<()> {
        let srv = Arc::new(Server {
            secret,
            reusable,
            state: Mutex::new(Session::default()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let local = listener.local_addr()?;
        std::thread::Builder::new()
            .name("fccl-rendezvous".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if srv.stop.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let s = srv.clone();
                    let _ = std::thread::Builder::new().name("fccl-rdv-conn".into()).spawn(move || {
                        let finished_session = s.serve(conn);
                        if finished_session && !s.reusable {
                            s.stop.store(true, Ordering::Release);
                            // Unblock accept() so the thread and the port go away.
                            let mut wake = local;
                            if wake.ip().is_unspecified() {
                                wake.set_ip(if wake.is_ipv4() {
                                    IpAddr::V4(Ipv4Addr::LOCALHOST)
                                } else {
                                    IpAddr::V6(Ipv6Addr::LOCALHOST)
                                });
                            }
                            let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
                        }
                    });
                }
            })
            .map_err(|e| Error::system(format!("cannot start the rendezvous thread: {e}")))?;
        Ok(())
    }

    fn refuse(conn: &mut TcpStream, why: &str) {
        let mut b = vec![1u8];
        b.extend_from_slice(why.as_bytes());
        let _ = write_frame(conn, &b);
        let _ = conn.shutdown(Shutdown::Both);
    }

    /// Serves one connection; true when it completed the session it belonged to.
    fn serve(&self, mut conn: TcpStream) -> bool {
        let _ = conn.set_read_timeout(Some(HELLO_READ_TIMEOUT));
        let _ = conn.set_nodelay(true);
        let hello =
            match read_frame(&mut conn, MAX_CLIENT_FRAME).map_err(|e| e.to_string()).and_then(|b| Hello::decode(&b)) {
                Ok(h) => h,
                Err(why) => {
                    Self::refuse(&mut conn, &format!("rendezvous refused: {why}"));
                    return false;
                }
            };
        if !ct_eq(&hello.secret, &self.secret) {
            Self::refuse(&mut conn, "rendezvous refused: wrong secret (use the unique id of this job)");
            return false;
        }
        let (nranks, rank) = (hello.nranks as usize, hello.rank as usize);
        // Join the current session, or wait for it to finish if this rank is already
        // in it (a rank that starts its next communicator early).
        let nonce = {
            let mut st = self.state.lock().unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            while st.active() && st.joined.get(rank).copied().unwrap_or(false) {
                let now = Instant::now();
                if now >= deadline {
                    drop(st);
                    Self::refuse(&mut conn, &format!("rendezvous refused: rank {rank} already joined"));
                    return false;
                }
                st = self.cv.wait_timeout(st, deadline - now).unwrap().0;
            }
            if !st.active() {
                *st = Session {
                    nranks,
                    nonce: random_u64().unwrap_or(0x5eed),
                    joined: vec![false; nranks],
                    finished: vec![false; nranks],
                    rounds: Vec::new(),
                    failed: None,
                };
            } else if st.nranks != nranks {
                let n = st.nranks;
                drop(st);
                Self::refuse(
                    &mut conn,
                    &format!("rendezvous refused: rank {rank} says the job has {nranks} ranks, others said {n}"),
                );
                return false;
            }
            st.joined[rank] = true;
            self.cv.notify_all();
            st.nonce
        };
        let mut ok = vec![0u8];
        ok.extend_from_slice(&nonce.to_le_bytes());
        if write_frame(&mut conn, &ok).is_err() {
            return self.lose(rank, nonce, "its connection broke");
        }
        let _ = conn.set_read_timeout(None);
        loop {
            let frame = match read_frame(&mut conn, MAX_CLIENT_FRAME) {
                Ok(f) => f,
                Err(e) => return self.lose(rank, nonce, &format!("its connection broke ({e})")),
            };
            let (round, tmo_ms, blob) = match decode_round(&frame) {
                Ok(r) => r,
                Err(why) => return self.lose(rank, nonce, &why),
            };
            if round == BYE_ROUND {
                let mut st = self.state.lock().unwrap();
                if st.nonce != nonce {
                    return false;
                }
                st.finished[rank] = true;
                let all = st.finished.iter().all(|&f| f);
                if all {
                    *st = Session::default();
                }
                self.cv.notify_all();
                return all;
            }
            let round = round as usize;
            let reply = {
                let mut st = self.state.lock().unwrap();
                if round > st.rounds.len() || round > 64 {
                    drop(st);
                    return self.lose(rank, nonce, "it skipped a round");
                }
                if round == st.rounds.len() {
                    st.rounds.push(vec![None; nranks]);
                }
                st.rounds[round][rank] = Some(blob.to_vec());
                self.cv.notify_all();
                let deadline = Instant::now() + Duration::from_millis(tmo_ms as u64);
                loop {
                    if let Some(f) = &st.failed {
                        let mut b = vec![1u8];
                        b.extend_from_slice(f.as_bytes());
                        break b;
                    }
                    let missing = st.missing(round);
                    if missing.is_empty() {
                        let mut b = vec![0u8];
                        for r in 0..nranks {
                            let v = st.rounds[round][r].as_ref().unwrap();
                            b.extend_from_slice(&(v.len() as u32).to_le_bytes());
                            b.extend_from_slice(v);
                        }
                        break b;
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        let mut b = vec![2u8];
                        b.extend_from_slice(describe_missing(&missing, nranks).as_bytes());
                        break b;
                    }
                    st = self.cv.wait_timeout(st, deadline - now).unwrap().0;
                }
            };
            if write_frame(&mut conn, &reply).is_err() {
                return self.lose(rank, nonce, "its connection broke");
            }
            if reply[0] != 0 {
                return false;
            }
        }
    }

    fn lose(&self, rank: usize, nonce: u64, why: &str) -> bool {
        let mut st = self.state.lock().unwrap();
        if st.nonce == nonce && st.active() {
            st.failed.get_or_insert_with(|| format!("rank {rank} left the rendezvous: {why}"));
            // Let the others see the failure, then start afresh.
            st.joined[rank] = true;
            st.finished[rank] = true;
            if st.finished.iter().all(|&f| f) {
                *st = Session::default();
            }
        }
        self.cv.notify_all();
        false
    }
}

fn describe_missing(missing: &[usize], nranks: usize) -> String {
    let list: Vec<String> = missing.iter().take(32).map(|r| r.to_string()).collect();
    let more = if missing.len() > 32 { format!(" and {} more", missing.len() - 32) } else { String::new() };
    format!("{} of {nranks} ranks never arrived: {}{more}", missing.len(), list.join(", "))
}

// ---------------------------------------------------------------- client

/// A rank's connection to the rendezvous point during communicator set-up.
pub struct Client {
    conn: TcpStream,
    round: u32,
    pub nranks: usize,
    pub rank: usize,
    /// Random per set-up: names shared-memory segments so jobs never collide.
    pub nonce: u64,
}

impl Client {
    /// Connects (retrying until `deadline`, the point may not be up yet) and joins.
    pub fn join(id: &UniqueId, nranks: usize, rank: usize, deadline: Instant) -> Result<Client> {
        let addr = id.addr()?;
        let mut last_err = String::new();
        let mut conn = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::timeout(format!(
                    "rank {rank} could not reach the rendezvous point at {addr} ({last_err}); the process that called fcclGetUniqueId must stay alive until every rank has joined"
                )));
            }
            match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(2))) {
                Ok(c) => break c,
                Err(e) => {
                    last_err = e.to_string();
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        conn.set_nodelay(true)?;
        let hello = Hello { secret: id.secret(), nranks: nranks as u32, rank: rank as u32 };
        write_frame(&mut conn, &hello.encode())?;
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        conn.set_read_timeout(Some(left + Duration::from_secs(65)))?;
        let reply = read_frame(&mut conn, MAX_SERVER_FRAME).map_err(|e| {
            Error::remote(format!("the rendezvous point at {addr} did not answer rank {rank}'s hello: {e}"))
        })?;
        match reply.first() {
            Some(0) if reply.len() == 9 => {
                let nonce = u64::from_le_bytes(reply[1..9].try_into().unwrap());
                Ok(Client { conn, round: 0, nranks, rank, nonce })
            }
            Some(1) => Err(Error::invalid_usage(String::from_utf8_lossy(&reply[1..]).into_owned())),
            _ => Err(Error::remote(format!("the rendezvous point at {addr} sent a malformed reply"))),
        }
    }

    /// Sends this rank's blob for the next round and returns every rank's blob.
    pub fn allgather(&mut self, blob: &[u8], deadline: Instant) -> Result<Vec<Vec<u8>>> {
        let left = deadline.saturating_duration_since(Instant::now());
        let tmo = left.as_millis().min(u32::MAX as u128 - 1) as u32;
        let mut f = Vec::with_capacity(8 + blob.len());
        f.extend_from_slice(&self.round.to_le_bytes());
        f.extend_from_slice(&tmo.to_le_bytes());
        f.extend_from_slice(blob);
        self.round += 1;
        write_frame(&mut self.conn, &f)?;
        self.conn.set_read_timeout(Some(left + Duration::from_secs(10)))?;
        let reply = read_frame(&mut self.conn, MAX_SERVER_FRAME)
            .map_err(|e| Error::remote(format!("lost the rendezvous point during communicator set-up: {e}")))?;
        match reply.first() {
            Some(0) => {
                let mut out = Vec::with_capacity(self.nranks);
                let mut p = &reply[1..];
                for _ in 0..self.nranks {
                    if p.len() < 4 {
                        return Err(Error::remote("the rendezvous point sent a truncated reply"));
                    }
                    let n = u32::from_le_bytes(p[0..4].try_into().unwrap()) as usize;
                    if p.len() < 4 + n {
                        return Err(Error::remote("the rendezvous point sent a truncated reply"));
                    }
                    out.push(p[4..4 + n].to_vec());
                    p = &p[4 + n..];
                }
                Ok(out)
            }
            Some(2) => Err(Error::timeout(format!(
                "communicator set-up timed out after the rendezvous wait: {}",
                String::from_utf8_lossy(&reply[1..])
            ))),
            Some(1) => Err(Error::remote(String::from_utf8_lossy(&reply[1..]).into_owned())),
            _ => Err(Error::remote("the rendezvous point sent a malformed reply")),
        }
    }

    /// Tells the point this rank is done with set-up.
    pub fn finish(mut self) {
        let mut f = Vec::with_capacity(8);
        f.extend_from_slice(&BYE_ROUND.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        let _ = write_frame(&mut self.conn, &f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_rejects_garbage() {
        let id = UniqueId::from_addr("127.0.0.1:5000".parse().unwrap(), "s");
        let h = id.to_hex();
        assert_eq!(h.len(), 256);
        assert_eq!(UniqueId::from_hex(&h).unwrap(), id);
        assert!(UniqueId::from_hex("abc").is_err());
        assert!(UniqueId::from_hex(&"zz".repeat(128)).is_err());
        assert!(UniqueId::from_hex(&"00".repeat(128)).is_err());
    }

    #[test]
    fn hello_decoder_rejects_bad_frames() {
        let h = Hello { secret: [7; 32], nranks: 4, rank: 3 };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        assert!(Hello::decode(&[]).is_err());
        assert!(Hello::decode(&h.encode()[..47]).is_err());
        let bad = Hello { secret: [7; 32], nranks: 4, rank: 4 };
        assert!(Hello::decode(&bad.encode()).is_err());
        let mut wrong_magic = h.encode();
        wrong_magic[0] = b'X';
        assert!(Hello::decode(&wrong_magic).is_err());
        assert!(decode_round(&[1, 2, 3]).is_err());
    }

    fn rounds(id: UniqueId, n: usize) -> Vec<Vec<Vec<u8>>> {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                std::thread::spawn(move || {
                    let dl = Instant::now() + Duration::from_secs(20);
                    let mut c = Client::join(&id, n, r, dl).unwrap();
                    let a = c.allgather(&[r as u8; 3], dl).unwrap();
                    let b = c.allgather(&[], dl).unwrap();
                    assert!(b.iter().all(|x| x.is_empty()));
                    c.finish();
                    a
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn rendezvous_exchanges_blobs_and_refuses_rogues() {
        let id = UniqueId::generate(true).unwrap();
        // A rogue with the wrong secret and one sending garbage do not disturb the job.
        let addr = id.addr().unwrap();
        let mut rogue = TcpStream::connect(addr).unwrap();
        write_frame(&mut rogue, &Hello { secret: [0; 32], nranks: 2, rank: 0 }.encode()).unwrap();
        let reply = read_frame(&mut rogue, 1 << 20).unwrap();
        assert_eq!(reply[0], 1);
        assert!(String::from_utf8_lossy(&reply[1..]).contains("wrong secret"));
        let mut garbage = TcpStream::connect(addr).unwrap();
        garbage.write_all(&[0xff; 64]).unwrap();
        // Oversized: a length prefix far beyond the limit is refused unread.
        let mut huge = TcpStream::connect(addr).unwrap();
        huge.write_all(&u32::MAX.to_le_bytes()).unwrap();
        // Truncated: half a hello, then the rogue goes away.
        let mut trunc = TcpStream::connect(addr).unwrap();
        trunc.write_all(&48u32.to_le_bytes()).unwrap();
        trunc.write_all(&Hello { secret: id.secret(), nranks: 3, rank: 0 }.encode()[..20]).unwrap();
        drop(trunc);
        // Silent: connects and says nothing (the job must not wait for it).
        let _silent = TcpStream::connect(addr).unwrap();
        for a in rounds(id, 3) {
            assert_eq!(a, vec![vec![0u8; 3], vec![1u8; 3], vec![2u8; 3]]);
        }
        // Reusable: a second set-up on the same id works.
        assert_eq!(rounds(id, 2).len(), 2);
    }

    #[test]
    fn missing_ranks_time_out_with_names() {
        let id = UniqueId::generate(false).unwrap();
        let dl = Instant::now() + Duration::from_millis(300);
        let mut c = Client::join(&id, 3, 1, dl).unwrap();
        let e = c.allgather(b"x", dl).unwrap_err();
        assert_eq!(e.code, crate::error::Code::Timeout);
        assert!(e.msg.contains("2 of 3 ranks never arrived: 0, 2"), "{}", e.msg);
    }
}
