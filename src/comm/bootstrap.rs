//! Unique ids and the rendezvous point.
//!
//! A rendezvous point is a small TCP server ([`server`]) in the process that called
//! `fcclGetUniqueId`, in `ferroccl-run`, or in rank 0 under FERROCCL_ROOT_ADDR. Its id
//! carries its address and the job's 32-byte key. Ranks connect, prove they hold the
//! key, and then run "rounds": each rank sends a blob, and once every rank's blob for
//! that round is in, each gets all of them. Communicator set-up is a few rounds
//! (wire-up, then devices). The point is built to face hostile networks: see
//! docs/robustness.md, "Rendezvous and set-up".
//!
//! Protocol (every frame is a little-endian u32 length, then that many bytes):
//! 1. point -> client, [`Challenge`]: "FCRS", version, a fresh random 32-byte nonce.
//! 2. client -> point, [`Hello`] (exactly [`HELLO_BYTES`]): "FCRV", version, job id
//!    (a hash of the key, so two jobs on one port are told apart), nranks, rank, the
//!    client's remaining timeout, pid and host (for messages), its own nonce, and an
//!    HMAC-SHA-256 over all that and the point's nonce. The key never travels.
//! 3. point -> client: `0, session nonce, HMAC` (admitted; the HMAC proves the point
//!    holds the key too), or `1, text` (refused), or `2, text` (timed out waiting).
//! 4. rounds: client sends `round, timeout ms, blob`; the point answers `0, blobs`
//!    or `1, text` (the set-up failed: a rank died, was refused, ...) or `2, text` (the
//!    wait timed out; the text names the ranks that did not arrive). The point may
//!    send `1`/`2` at any time to tell a rank the set-up failed elsewhere.
//! 5. `u32::MAX` as the round number: this rank is done (BYE).

mod server;
pub(crate) mod sha256;

use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

pub use server::{Server, ServerOptions};

/// Size of `fcclUniqueId`.
pub(crate) const UNIQUE_ID_BYTES: usize = 128;
const ID_MAGIC: &[u8; 4] = b"FCID";
/// Version 2: the key is a job key (with its source) for the authenticated protocol.
const ID_VERSION: u8 = 2;
const CHALLENGE_MAGIC: &[u8; 4] = b"FCRS";
const HELLO_MAGIC: &[u8; 4] = b"FCRV";
/// Version 1 sent the secret in the clear and had no job id.
pub const PROTO_VERSION: u32 = 2;
/// Size of a hello's body.
pub const HELLO_BYTES: usize = 112;
/// Size of a challenge's body.
pub const CHALLENGE_BYTES: usize = 40;
/// Size of an admission (status 0) reply's body.
const WELCOME_BYTES: usize = 41;
/// The most ranks a communicator may have: the rendezvous point keeps a few bytes per
/// rank per round and each round's reply (all ranks' blobs) must fit in a frame.
pub const MAX_RANKS: usize = 1 << 16;
/// Largest frame a client may send (a blob of rank information).
pub(crate) const MAX_CLIENT_FRAME: usize = 64 << 10;
/// Largest frame the point sends (all ranks' blobs of one round).
pub(crate) const MAX_SERVER_FRAME: usize = 256 << 20;
/// Largest refusal or failure text either side accepts.
const MAX_TEXT: usize = 4 << 10;
/// The most rounds one set-up may have.
const MAX_ROUNDS: u32 = 64;
const BYE_ROUND: u32 = u32::MAX;
/// Domain separation of the handshake's HMACs.
const HELLO_LABEL: &[u8] = b"ferroccl rendezvous v2 hello";
const WELCOME_LABEL: &[u8] = b"ferroccl rendezvous v2 welcome";

/// Reply status bytes.
const ST_OK: u8 = 0;
const ST_FAILED: u8 = 1;
const ST_TIMEOUT: u8 = 2;

/// Where a job's key comes from (stored in the id, named in messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum KeySource {
    /// 32 random bytes (fcclGetUniqueId, ferroccl-run).
    Random = 0,
    Secret = 1,
    TorchRunId = 2,
    PmixNamespace = 3,
    OmpiJobId = 4,
    Slurm = 5,
}

impl KeySource {
    fn from_u8(v: u8) -> KeySource {
        match v {
            1 => KeySource::Secret,
            2 => KeySource::TorchRunId,
            3 => KeySource::PmixNamespace,
            4 => KeySource::OmpiJobId,
            5 => KeySource::Slurm,
            _ => KeySource::Random,
        }
    }

    /// Where the key came from, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            KeySource::Random => "a random key in the unique id",
            KeySource::Secret => "FERROCCL_SECRET",
            KeySource::TorchRunId => "TORCHELASTIC_RUN_ID (torchrun)",
            KeySource::PmixNamespace => "PMIX_NAMESPACE (mpirun/srun with PMIx)",
            KeySource::OmpiJobId => "OMPI_MCA_orte_ess_jobid (Open MPI)",
            KeySource::Slurm => "SLURM_JOB_ID and SLURM_STEP_ID (srun)",
        }
    }
}

/// The key that admits a rank to its job's rendezvous, and where it came from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct JobKey {
    pub key: [u8; 32],
    pub source: KeySource,
}

impl std::fmt::Debug for JobKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        write!(f, "JobKey(job {}, from {:?})", hex(&job_id(&self.key)), self.source)
    }
}

impl JobKey {
    /// A key derived from a string every rank of one job shares.
    pub fn derive(source: KeySource, value: &str) -> JobKey {
        let key = sha256::sha256(&[b"ferroccl job key v2\0", &[source as u8], b"\0", value.as_bytes()]);
        JobKey { key, source }
    }

    /// The key of a FERROCCL_ROOT_ADDR / MASTER_ADDR rendezvous: FERROCCL_SECRET, else
    /// derived from the launcher's job identity, else an error saying what to set.
    pub fn from_env() -> Result<JobKey> {
        use crate::env;
        if let Some(s) = env::SECRET.get() {
            return Ok(JobKey::derive(KeySource::Secret, &s));
        }
        // torchrun's default run id is the literal "none": shared by every job.
        if let Some(v) = env::TORCHELASTIC_RUN_ID.get().filter(|v| !v.trim().eq_ignore_ascii_case("none")) {
            return Ok(JobKey::derive(KeySource::TorchRunId, v.trim()));
        }
        if let Some(v) = env::PMIX_NAMESPACE.get() {
            return Ok(JobKey::derive(KeySource::PmixNamespace, v.trim()));
        }
        if let Some(v) = env::OMPI_JOBID.get() {
            return Ok(JobKey::derive(KeySource::OmpiJobId, v.trim()));
        }
        if let Some(job) = env::SLURM_JOB_ID.get() {
            let step = env::SLURM_STEP_ID.get().unwrap_or_default();
            return Ok(JobKey::derive(KeySource::Slurm, &format!("{}.{}", job.trim(), step.trim())));
        }
        Err(Error::invalid_usage(format!(
            "a rendezvous at a fixed address ({} or {}/{}) needs a secret that this job's ranks share and no one else has, and none was found: set {} to the same random string on every rank (e.g. export {}=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \\n')), or start the ranks with ferroccl-run, torchrun ({}), mpirun ({}) or srun ({}), whose job id serves as one",
            env::ROOT_ADDR.name,
            env::TORCH_MASTER_ADDR.name,
            env::TORCH_MASTER_PORT.name,
            env::SECRET.name,
            env::SECRET.name,
            env::TORCHELASTIC_RUN_ID.name,
            env::PMIX_NAMESPACE.name,
            env::SLURM_JOB_ID.name,
        )))
    }
}

/// The public name of a job: the first 16 bytes of a hash of its key.
pub fn job_id(key: &[u8; 32]) -> [u8; 16] {
    let h = sha256::sha256(&[b"ferroccl job id v2\0", key]);
    h[..16].try_into().expect("16 of 32 bytes")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The opaque id of ABI.md: address of the rendezvous point and the job's key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        match self.addr() {
            Ok(a) => write!(f, "UniqueId({a})"),
            Err(_) => f.write_str("UniqueId(invalid)"),
        }
    }
}

impl UniqueId {
    fn build(addr: SocketAddr, key: &JobKey) -> UniqueId {
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
        b[24..56].copy_from_slice(&key.key);
        b[56] = key.source as u8;
        UniqueId(b)
    }

    /// Starts a rendezvous point in this process (listening on the address it
    /// advertises) and returns its id. It serves one communicator set-up.
    pub fn generate() -> Result<UniqueId> {
        Ok(Server::start(ServerOptions::default())?.0)
    }

    /// Starts a rendezvous point with `opts`; the handle reports processes that ended.
    pub fn serve(opts: ServerOptions) -> Result<(UniqueId, Server)> {
        Server::start(opts)
    }

    /// The id of a rendezvous point at a known address (FERROCCL_ROOT_ADDR).
    pub fn from_addr(addr: SocketAddr, key: JobKey) -> UniqueId {
        UniqueId::build(addr, &key)
    }

    /// Serves the rendezvous for this id at its own address (rank 0 under
    /// FERROCCL_ROOT_ADDR) for one set-up of `nranks` ranks. `exact_ip`: the address
    /// was given as an IP literal, so listen on it alone where this host has it.
    pub fn serve_here(&self, nranks: usize, exact_ip: bool) -> Result<()> {
        let addr = self.addr()?;
        let any = if addr.is_ipv4() { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) };
        let bind_err = |e: std::io::Error| {
            Error::system(format!(
                "rank 0 cannot serve the rendezvous on port {} (FERROCCL_ROOT_ADDR / MASTER_PORT): {e}; {}",
                addr.port(),
                if e.kind() == std::io::ErrorKind::AddrInUse {
                    "another job or program uses that port: give each job its own port"
                } else {
                    "use a free port of this host"
                }
            ))
        };
        // A name resolves differently on different hosts (127.0.1.1 here, the real
        // address elsewhere), so only a literal address is trusted for binding.
        let listener = if exact_ip {
            match TcpListener::bind(addr) {
                Ok(l) => l,
                Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
                    TcpListener::bind(SocketAddr::new(any, addr.port())).map_err(bind_err)?
                }
                Err(e) => return Err(bind_err(e)),
            }
        } else {
            TcpListener::bind(SocketAddr::new(any, addr.port())).map_err(bind_err)?
        };
        let opts = ServerOptions { nranks: Some(nranks), ..ServerOptions::default() };
        Server::spawn(listener, self.job_key(), opts).map(drop)
    }

    /// The rendezvous point's address.
    pub fn addr(&self) -> Result<SocketAddr> {
        let b = &self.0;
        if &b[0..4] != ID_MAGIC {
            return Err(Error::invalid_arg(
                "the unique id is not one made by fcclGetUniqueId (bad magic); pass the id unchanged from the process that created it",
            ));
        }
        if b[4] != ID_VERSION {
            return Err(Error::invalid_arg(format!(
                "the unique id has version {}, this library reads version {ID_VERSION}: it was made by another ferroccl build; use the same build in every process of a job",
                b[4]
            )));
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

    /// The job's key (secret: never print or send it).
    pub fn secret(&self) -> [u8; 32] {
        self.0[24..56].try_into().expect("32 bytes")
    }

    /// The key with its source.
    pub fn job_key(&self) -> JobKey {
        JobKey { key: self.secret(), source: KeySource::from_u8(self.0[56]) }
    }

    /// 256 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
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

/// This host's id as hellos and wire-up descriptions carry it (hostname and boot id, hashed).
pub fn host_id() -> u64 {
    super::wireup::host_id()
}

/// The address fcclGetUniqueId's rendezvous point listens on and puts in the id:
/// FERROCCL_HOST_ADDR, else the interface selection, else this host's first interface
/// other than loopback (see [`super::addr::choose`]).
pub(crate) fn advertised_ip() -> Result<IpAddr> {
    super::addr::choose(None, true).map(|(ip, _)| ip)
}

// ---------------------------------------------------------------- framing

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
enum ReadErr {
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
}

impl std::fmt::Display for ReadErr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadErr::Timeout { .. } => f.write_str("timed out"),
            ReadErr::Closed { got: 0 } => f.write_str("connection closed"),
            ReadErr::Closed { got } => write!(f, "connection closed after {got} bytes of a frame"),
            ReadErr::Io(e) => write!(f, "{e}"),
            ReadErr::TooLong(n) => write!(f, "a frame of {n} bytes, more than the protocol allows"),
        }
    }
}

/// Waits until `s` has something to read (or EOF) or `deadline` passes. poll(2)
/// sleeps on a high-resolution timer; a socket's receive timeout is rounded to the
/// kernel's coarse timer wheel, which fired long waits over 100 ms late.
fn readable_by(s: &TcpStream, deadline: Instant) -> std::io::Result<bool> {
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
        if !readable_by(s, deadline).map_err(ReadErr::Io)? {
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
fn read_frame_by(s: &mut TcpStream, max: usize, deadline: Instant) -> std::result::Result<Vec<u8>, ReadErr> {
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
fn write_all_by(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    s.set_write_timeout(Some(left))?;
    s.write_all(buf)
}

// ---------------------------------------------------------------- messages

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

fn check_ranks(nranks: u64, rank: u64) -> std::result::Result<(), String> {
    if nranks == 0 || nranks > MAX_RANKS as u64 {
        return Err(format!("a communicator of {nranks} ranks: a communicator has 1 to {MAX_RANKS} ranks"));
    }
    if rank >= nranks {
        return Err(format!("rank {rank} of {nranks} is out of range (valid: 0..{})", nranks - 1));
    }
    Ok(())
}

/// The point's proof in an admission reply.
fn welcome_mac(key: &[u8; 32], hello: &Hello, challenge: &[u8; 32], session: u64) -> [u8; 32] {
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
fn welcome(key: &[u8; 32], hello: &Hello, challenge: &[u8; 32], session: u64) -> Vec<u8> {
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

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(MAX_TEXT)]).into_owned()
}

/// Milliseconds for messages.
fn ms(d: Duration) -> u128 {
    d.as_millis()
}

// ---------------------------------------------------------------- client

/// A rank's connection to the rendezvous point during communicator set-up.
pub struct Client {
    conn: TcpStream,
    addr: SocketAddr,
    round: u32,
    /// How long past its own deadline a rank waits for the point's answer, which
    /// names the ranks that did not arrive (the point answers at the deadline).
    grace: Duration,
    started: Instant,
    pub nranks: usize,
    pub rank: usize,
    /// Random per set-up: names shared-memory segments so jobs never collide.
    pub nonce: u64,
}

/// Why one attempt to join failed.
enum Attempt {
    /// Try again (the point closed the connection: busy, or restarting).
    Retry(String),
    Fatal(Error),
}

impl Client {
    /// The local address of the connection to the point: the kernel routed it over the
    /// interface that reaches the point's host, which peers elsewhere can likely reach too.
    pub fn local_ip(&self) -> Option<IpAddr> {
        self.conn.local_addr().ok().map(|a| a.ip())
    }

    /// Connects (retrying until `deadline`, the point may not be up yet) and joins.
    pub fn join(id: &UniqueId, nranks: usize, rank: usize, deadline: Instant) -> Result<Client> {
        let addr = id.addr()?;
        check_ranks(nranks as u64, rank as u64).map_err(Error::invalid_arg)?;
        let started = Instant::now();
        let total = deadline.saturating_duration_since(started);
        let grace = (total / 20).clamp(Duration::from_millis(50), Duration::from_secs(2));
        let who = format!("rank {rank} of {nranks}");
        let mut last = String::from("no attempt finished");
        let mut waiting_for = "to reach it";
        let mut backoff = Duration::from_millis(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::timeout(format!(
                    "{who}: timed out after {} ms waiting {waiting_for} at the rendezvous point {addr} ({last}); the process serving it (ferroccl-run, the caller of fcclGetUniqueId, or rank 0 under FERROCCL_ROOT_ADDR) must be running and stay alive until every rank has joined",
                    ms(started.elapsed())
                )));
            }
            let conn = match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(2))) {
                Ok(c) => c,
                Err(e) => {
                    last = format!("last connection attempt: {e}");
                    std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                    continue;
                }
            };
            let mut client = Client { conn, addr, round: 0, grace, started, nranks, rank, nonce: 0 };
            match client.handshake(id, &mut waiting_for, deadline) {
                Ok(()) => return Ok(client),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(why)) => {
                    last = why;
                    std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    fn handshake(
        &mut self,
        id: &UniqueId,
        waiting_for: &mut &'static str,
        deadline: Instant,
    ) -> std::result::Result<(), Attempt> {
        let (addr, who) = (self.addr, format!("rank {} of {}", self.rank, self.nranks));
        let fatal_timeout = |what: &str| {
            Attempt::Fatal(Error::timeout(format!(
                "{who}: timed out after {} ms waiting for the rendezvous point at {addr} {what}",
                ms(self.started.elapsed())
            )))
        };
        let conn = &mut self.conn;
        conn.set_nodelay(true).map_err(|e| Attempt::Retry(e.to_string()))?;
        *waiting_for = "for a greeting";
        let challenge = match read_frame_by(conn, 64, deadline) {
            Ok(b) => Challenge::decode(&b).map_err(|why| {
                Attempt::Fatal(Error::invalid_usage(format!(
                    "{who}: the process listening at {addr} is not a ferroccl rendezvous point of this version: {why}"
                )))
            })?,
            Err(ReadErr::Timeout { got: 0 }) => {
                return Err(fatal_timeout(
                    "to greet it (it accepted the connection but sent nothing: is a ferroccl rendezvous point of this version serving there, and is its process responsive?)",
                ))
            }
            Err(ReadErr::Timeout { .. }) => return Err(fatal_timeout("to finish its greeting")),
            Err(e) => return Err(Attempt::Retry(format!("the point closed the connection before greeting ({e})"))),
        };
        let left_ms = deadline.saturating_duration_since(Instant::now()).as_millis().min(u32::MAX as u128) as u32;
        let key = id.secret();
        let hello = Hello::new(&key, &challenge.nonce, self.nranks as u32, self.rank as u32, left_ms)
            .map_err(Attempt::Fatal)?;
        if let Err(e) = write_all_by(conn, &frame(&hello.encode()), deadline) {
            return Err(Attempt::Retry(format!("the point closed the connection during the hello ({e})")));
        }
        *waiting_for = "to be admitted";
        let reply = match read_frame_by(conn, WELCOME_BYTES.max(1 + MAX_TEXT), deadline + self.grace) {
            Ok(r) => r,
            Err(ReadErr::Timeout { .. }) => {
                return Err(fatal_timeout(&format!("to admit {who} (it never answered the hello)")))
            }
            Err(e) => return Err(Attempt::Retry(format!("the point closed the connection after the hello ({e})"))),
        };
        match reply.first() {
            Some(&ST_OK) if reply.len() == WELCOME_BYTES => {
                let nonce = u64::from_le_bytes(reply[1..9].try_into().unwrap());
                if !ct_eq(&reply[9..41], &welcome_mac(&key, &hello, &challenge.nonce, nonce)) {
                    return Err(Attempt::Fatal(Error::invalid_usage(format!(
                        "{who}: the rendezvous point at {addr} admitted this rank but could not prove it holds this job's key: it belongs to another job or program; give each job its own address"
                    ))));
                }
                self.nonce = nonce;
                Ok(())
            }
            Some(&ST_FAILED) => Err(Attempt::Fatal(Error::invalid_usage(format!(
                "{who}: the rendezvous point at {addr} refused it: {}",
                text(&reply[1..])
            )))),
            Some(&ST_TIMEOUT) => Err(Attempt::Fatal(Error::timeout(format!(
                "{who}: the rendezvous point at {addr} did not admit it in time: {}",
                text(&reply[1..])
            )))),
            _ => Err(Attempt::Fatal(Error::remote(format!(
                "{who}: the rendezvous point at {addr} sent a malformed reply to the hello"
            )))),
        }
    }

    /// Sends this rank's blob for the next round and returns every rank's blob.
    pub fn allgather(&mut self, blob: &[u8], deadline: Instant) -> Result<Vec<Vec<u8>>> {
        let (addr, round, rank) = (self.addr, self.round, self.rank);
        if blob.len() + 8 > MAX_CLIENT_FRAME {
            return Err(Error::internal(format!("a set-up blob of {} bytes exceeds the frame limit", blob.len())));
        }
        let tmo = deadline.saturating_duration_since(Instant::now()).as_millis().min(u32::MAX as u128 - 1) as u32;
        let mut f = Vec::with_capacity(12 + blob.len());
        f.extend_from_slice(&((8 + blob.len()) as u32).to_le_bytes());
        f.extend_from_slice(&self.round.to_le_bytes());
        f.extend_from_slice(&tmo.to_le_bytes());
        f.extend_from_slice(blob);
        self.round += 1;
        // A failed write is not the story: the point's reason is read below.
        let _ = write_all_by(&mut self.conn, &f, deadline + self.grace);
        let reply = match read_frame_by(&mut self.conn, MAX_SERVER_FRAME, deadline + self.grace) {
            Ok(r) => r,
            Err(ReadErr::Timeout { .. }) => {
                return Err(Error::timeout(format!(
                    "rank {rank}: communicator set-up timed out after {} ms in round {round} waiting for the rendezvous point at {addr}, which never answered (it names the ranks that did not arrive when it can; is its process responsive?)",
                    ms(self.started.elapsed())
                )))
            }
            Err(e) => {
                return Err(Error::remote(format!(
                    "rank {rank}: lost the rendezvous point at {addr} during set-up round {round} ({e}); the process serving it (ferroccl-run, the caller of fcclGetUniqueId, or rank 0 under FERROCCL_ROOT_ADDR) may have died"
                )))
            }
        };
        match reply.first() {
            Some(&ST_OK) => {
                let mut out = Vec::with_capacity(self.nranks);
                let mut p = &reply[1..];
                for _ in 0..self.nranks {
                    if p.len() < 4 {
                        return Err(Error::remote("the rendezvous point sent a truncated reply"));
                    }
                    let n = u32::from_le_bytes(p[0..4].try_into().unwrap()) as usize;
                    if p.len() - 4 < n {
                        return Err(Error::remote("the rendezvous point sent a truncated reply"));
                    }
                    out.push(p[4..4 + n].to_vec());
                    p = &p[4 + n..];
                }
                Ok(out)
            }
            Some(&ST_TIMEOUT) => Err(Error::timeout(format!(
                "rank {rank}: communicator set-up timed out in round {round} after {} ms: {}",
                ms(self.started.elapsed()),
                text(&reply[1..])
            ))),
            Some(&ST_FAILED) => Err(Error::remote(format!(
                "rank {rank}: communicator set-up failed in round {round}: {}",
                text(&reply[1..])
            ))),
            _ => Err(Error::remote("the rendezvous point sent a malformed reply")),
        }
    }

    /// Tells the point this rank is done with set-up.
    pub fn finish(mut self) {
        let mut f = Vec::with_capacity(12);
        f.extend_from_slice(&8u32.to_le_bytes());
        f.extend_from_slice(&BYE_ROUND.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        let _ = write_all_by(&mut self.conn, &f, Instant::now() + Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> JobKey {
        JobKey::derive(KeySource::Secret, s)
    }

    #[test]
    fn hex_round_trip_and_rejects_garbage() {
        let id = UniqueId::from_addr("127.0.0.1:5000".parse().unwrap(), key("s"));
        let h = id.to_hex();
        assert_eq!(h.len(), 256);
        assert_eq!(UniqueId::from_hex(&h).unwrap(), id);
        assert_eq!(id.job_key(), key("s"));
        assert!(UniqueId::from_hex("abc").is_err());
        assert!(UniqueId::from_hex(&"zz".repeat(128)).is_err());
        assert!(UniqueId::from_hex(&"00".repeat(128)).is_err());
        // An id of the previous version is refused with a reason.
        let mut old = id;
        old.0[4] = 1;
        let e = UniqueId::from_hex(&old.to_hex()).unwrap_err();
        assert!(e.msg.contains("version 1"), "{}", e.msg);
        // The key never shows in Debug output.
        assert!(!format!("{id:?} {:?}", id.job_key()).contains(&hex(&id.secret())));
    }

    #[test]
    fn job_keys_differ_by_source_and_value() {
        assert_ne!(key("a").key, key("b").key);
        assert_ne!(JobKey::derive(KeySource::Slurm, "1.0").key, JobKey::derive(KeySource::TorchRunId, "1.0").key);
        assert_eq!(job_id(&key("a").key), job_id(&key("a").key));
        assert_ne!(job_id(&key("a").key), job_id(&key("b").key));
    }

    #[test]
    fn hello_proof_and_decoder() {
        let k = key("job").key;
        let ch = [9u8; 32];
        let h = Hello::new(&k, &ch, 4, 3, 1000).unwrap();
        let d = Hello::decode(&h.encode()).unwrap();
        assert_eq!(d, h);
        assert!(d.verify(&k, &ch));
        assert!(!d.verify(&key("other").key, &ch));
        assert!(!d.verify(&k, &[8u8; 32]));
        let mut forged = d.clone();
        forged.rank = 2;
        assert!(!forged.verify(&k, &ch));
        assert!(Hello::decode(&[]).is_err());
        assert!(Hello::decode(&h.encode()[..HELLO_BYTES - 1]).is_err());
        let mut wrong_magic = h.encode();
        wrong_magic[0] = b'X';
        assert!(Hello::decode(&wrong_magic).is_err());
        let mut v1 = h.encode();
        v1[4] = 1;
        assert!(Hello::decode(&v1).unwrap_err().contains("protocol 1"));
        assert!(decode_round(&[1, 2, 3]).is_err());
        let absurd = Hello { nranks: u32::MAX, ..h.clone() };
        assert!(absurd.check_ranks().unwrap_err().contains(&MAX_RANKS.to_string()));
        assert!(Hello { rank: 4, ..h }.check_ranks().is_err());
    }

    #[test]
    fn challenge_round_trip() {
        let c = Challenge { nonce: [3; 32] };
        assert_eq!(Challenge::decode(&c.encode()).unwrap(), c);
        assert!(Challenge::decode(&c.encode()[1..]).is_err());
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
    fn rendezvous_exchanges_blobs_and_is_reusable_when_asked() {
        let (id, _srv) = UniqueId::serve(ServerOptions { reusable: true, ..ServerOptions::default() }).unwrap();
        for a in rounds(id, 3) {
            assert_eq!(a, vec![vec![0u8; 3], vec![1u8; 3], vec![2u8; 3]]);
        }
        // Reusable: a second set-up on the same id works.
        assert_eq!(rounds(id, 2).len(), 2);
    }

    #[test]
    fn missing_ranks_time_out_with_names() {
        let id = UniqueId::generate().unwrap();
        let dl = Instant::now() + Duration::from_millis(300);
        let mut c = Client::join(&id, 3, 1, dl).unwrap();
        let e = c.allgather(b"x", dl).unwrap_err();
        assert_eq!(e.code, crate::error::Code::Timeout);
        assert!(e.msg.contains("never arrived: 0, 2"), "{}", e.msg);
    }
}
