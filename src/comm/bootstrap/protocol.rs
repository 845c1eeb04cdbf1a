//! The rendezvous protocol's bytes: framing with deadlines, and the handshake's
//! messages (challenge, hello, welcome, round requests). The protocol itself is
//! described in the parent module.

use super::sha256;
use super::{
    host_id, job_id, random_secret, CHALLENGE_BYTES, CHALLENGE_MAGIC, HELLO_BYTES, HELLO_LABEL, HELLO_MAGIC, MAX_RANKS,
    MAX_TEXT, PROTO_VERSION, ST_OK, WELCOME_BYTES, WELCOME_LABEL,
};
use crate::error::Result;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// A frame: length prefix and body.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(body);
    buf
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

/// How a read by a deadline ended.
#[derive(Debug)]
pub(super) enum ReadErr {
    /// The deadline passed (`got` bytes of the frame had arrived).
    Timeout {
        got: usize,
    },
    /// The peer closed the connection (`got` bytes of the frame had arrived).
    Closed {
        got: usize,
    },
    Io(std::io::Error),
    TooLong(usize),
    /// The creation waiting here was given up (fcclCommAbort of a non-blocking init).
    Aborted,
}

impl std::fmt::Display for ReadErr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadErr::Timeout { .. } => f.write_str("timed out"),
            ReadErr::Closed { got: 0 } => f.write_str("connection closed"),
            ReadErr::Closed { got } => write!(f, "connection closed after {got} bytes of a frame"),
            ReadErr::Io(e) => write!(f, "{e}"),
            ReadErr::TooLong(n) => write!(f, "a frame of {n} bytes, more than the protocol allows"),
            ReadErr::Aborted => f.write_str(&crate::comm::creation::aborted().msg),
        }
    }
}

/// Waits until `s` has something to read (or EOF) or `deadline` passes. poll(2)
/// sleeps on a high-resolution timer; a socket's receive timeout is rounded to the
/// kernel's coarse timer wheel, which can fire a long wait far past its deadline.
/// On the thread of a non-blocking creation the wait also ends when it is given up.
fn readable_by(s: &TcpStream, deadline: Instant) -> std::result::Result<bool, ReadErr> {
    use crate::comm::creation;
    if creation::watching() {
        return creation::poll_until(s.as_raw_fd(), libc::POLLIN, deadline).map_err(|e| {
            if creation::cancelled() {
                ReadErr::Aborted
            } else {
                ReadErr::Io(std::io::Error::other(e.msg))
            }
        });
    }
    readable_plain(s, deadline).map_err(ReadErr::Io)
}

fn readable_plain(s: &TcpStream, deadline: Instant) -> std::io::Result<bool> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        let mut p = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            return Ok(true);
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Fills `buf` from `s` by `deadline` (every read waits only for what is left).
fn read_exact_by(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    before: usize,
) -> std::result::Result<(), ReadErr> {
    let mut got = 0;
    while got < buf.len() {
        if !readable_by(s, deadline)? {
            return Err(ReadErr::Timeout { got: before + got });
        }
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(ReadErr::Closed { got: before + got }),
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock) => {}
            Err(e)
                if matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted) =>
            {
                return Err(ReadErr::Closed { got: before + got })
            }
            Err(e) => return Err(ReadErr::Io(e)),
        }
    }
    Ok(())
}

/// Reads one frame of at most `max` bytes by `deadline`.
pub(super) fn read_frame_by(s: &mut TcpStream, max: usize, deadline: Instant) -> std::result::Result<Vec<u8>, ReadErr> {
    let mut len = [0u8; 4];
    read_exact_by(s, &mut len, deadline, 0)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(ReadErr::TooLong(len));
    }
    let mut body = vec![0u8; len];
    read_exact_by(s, &mut body, deadline, 4)?;
    Ok(body)
}

/// Writes all of `buf` by `deadline`.
pub(super) fn write_all_by(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    s.set_write_timeout(Some(left))?;
    s.write_all(buf)
}

/// The point's first frame: a fresh nonce the client's proof must cover.
#[derive(Debug, PartialEq, Eq)]
pub struct Challenge {
    pub nonce: [u8; 32],
}

impl Challenge {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(CHALLENGE_BYTES);
        b.extend_from_slice(CHALLENGE_MAGIC);
        b.extend_from_slice(&PROTO_VERSION.to_le_bytes());
        b.extend_from_slice(&self.nonce);
        b
    }

    pub fn decode(b: &[u8]) -> std::result::Result<Challenge, String> {
        if b.len() != CHALLENGE_BYTES || &b[0..4] != CHALLENGE_MAGIC {
            return Err(format!("{} bytes that are not a ferroccl rendezvous greeting", b.len()));
        }
        let ver = u32::from_le_bytes(b[4..8].try_into().unwrap());
        if ver != PROTO_VERSION {
            return Err(format!(
                "it speaks rendezvous protocol {ver}, this library {PROTO_VERSION}: use the same ferroccl build in every process of a job"
            ));
        }
        Ok(Challenge { nonce: b[8..40].try_into().unwrap() })
    }
}

/// A client's hello, decoded (the proof is checked by [`Hello::verify`]). Public so the
/// decoder can be fuzzed and tests can speak the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub job_id: [u8; 16],
    pub nranks: u32,
    pub rank: u32,
    /// What is left of the client's timeout: the point waits no longer for it.
    pub timeout_ms: u32,
    pub pid: u32,
    pub host: u64,
    pub nonce: [u8; 32],
    /// HMAC-SHA-256 under the job key of the point's nonce and the fields above.
    pub mac: [u8; 32],
}

impl Hello {
    /// A hello for `key`, answering `challenge`, with a fresh client nonce.
    pub fn new(key: &[u8; 32], challenge: &[u8; 32], nranks: u32, rank: u32, timeout_ms: u32) -> Result<Hello> {
        let mut h = Hello {
            job_id: job_id(key),
            nranks,
            rank,
            timeout_ms,
            pid: std::process::id(),
            host: host_id(),
            nonce: random_secret()?,
            mac: [0; 32],
        };
        h.sign(key, challenge);
        Ok(h)
    }

    /// (Re)computes the proof over the current fields.
    pub fn sign(&mut self, key: &[u8; 32], challenge: &[u8; 32]) {
        let b = self.encode();
        self.mac = sha256::hmac(key, &[HELLO_LABEL, challenge, &b[..HELLO_BYTES - 32]]);
    }

    /// Whether the proof is right for `key` and `challenge`.
    pub fn verify(&self, key: &[u8; 32], challenge: &[u8; 32]) -> bool {
        let b = self.encode();
        ct_eq(&sha256::hmac(key, &[HELLO_LABEL, challenge, &b[..HELLO_BYTES - 32]]), &self.mac)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_BYTES);
        b.extend_from_slice(HELLO_MAGIC);
        b.extend_from_slice(&PROTO_VERSION.to_le_bytes());
        b.extend_from_slice(&self.job_id);
        b.extend_from_slice(&self.nranks.to_le_bytes());
        b.extend_from_slice(&self.rank.to_le_bytes());
        b.extend_from_slice(&self.timeout_ms.to_le_bytes());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.host.to_le_bytes());
        b.extend_from_slice(&self.nonce);
        b.extend_from_slice(&self.mac);
        b
    }

    /// Decodes the fields; says what is wrong with a frame that is not a hello of this
    /// protocol. Rank counts are checked by [`Hello::check_ranks`], after the proof.
    pub fn decode(b: &[u8]) -> std::result::Result<Hello, String> {
        if b.len() >= 8 && &b[0..4] == HELLO_MAGIC {
            let ver = u32::from_le_bytes(b[4..8].try_into().unwrap());
            if ver != PROTO_VERSION {
                return Err(format!(
                    "a hello of rendezvous protocol {ver}; this point speaks {PROTO_VERSION}: use the same ferroccl build in every process of a job"
                ));
            }
        }
        if b.len() != HELLO_BYTES {
            return Err(format!("a hello of {} bytes, expected {HELLO_BYTES}", b.len()));
        }
        if &b[0..4] != HELLO_MAGIC {
            return Err("not a ferroccl rendezvous hello".into());
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        Ok(Hello {
            job_id: b[8..24].try_into().unwrap(),
            nranks: u32_at(24),
            rank: u32_at(28),
            timeout_ms: u32_at(32),
            pid: u32_at(36),
            host: u64::from_le_bytes(b[40..48].try_into().unwrap()),
            nonce: b[48..80].try_into().unwrap(),
            mac: b[80..112].try_into().unwrap(),
        })
    }

    /// Whether the rank and rank count are ones a communicator can have.
    pub fn check_ranks(&self) -> std::result::Result<(), String> {
        check_ranks(self.nranks as u64, self.rank as u64)
    }
}

pub(super) fn check_ranks(nranks: u64, rank: u64) -> std::result::Result<(), String> {
    if nranks == 0 || nranks > MAX_RANKS as u64 {
        return Err(format!("a communicator of {nranks} ranks: a communicator has 1 to {MAX_RANKS} ranks"));
    }
    if rank >= nranks {
        return Err(format!("rank {rank} of {nranks} is out of range (valid: 0..{})", nranks - 1));
    }
    Ok(())
}

/// The point's proof in an admission reply.
pub(super) fn welcome_mac(key: &[u8; 32], hello: &Hello, challenge: &[u8; 32], session: u64) -> [u8; 32] {
    sha256::hmac(
        key,
        &[
            WELCOME_LABEL,
            &hello.nonce,
            challenge,
            &session.to_le_bytes(),
            &hello.rank.to_le_bytes(),
            &hello.nranks.to_le_bytes(),
        ],
    )
}

/// An admission reply's body.
pub(super) fn welcome(key: &[u8; 32], hello: &Hello, challenge: &[u8; 32], session: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(WELCOME_BYTES);
    b.push(ST_OK);
    b.extend_from_slice(&session.to_le_bytes());
    b.extend_from_slice(&welcome_mac(key, hello, challenge, session));
    b
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

pub(super) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(super) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(MAX_TEXT)]).into_owned()
}

/// Milliseconds for messages.
pub(super) fn ms(d: Duration) -> u128 {
    d.as_millis()
}
