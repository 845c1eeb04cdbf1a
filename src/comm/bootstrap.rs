//! Unique ids and the rendezvous point.
//!
//! A rendezvous point is a small TCP server ([`server`]) in the process that called
//! `fcclGetUniqueId`, in `ferroccl-run`, or in rank 0 under FERROCCL_ROOT_ADDR. Its id
//! carries its address and the job's 32-byte key. Ranks connect, prove they hold the
//! key, and then run "rounds": each rank sends a blob, and once every rank's blob for
//! that round is in, each gets all of them. Communicator set-up is a few rounds
//! (connecting the ranks, then devices). The point is built to face hostile networks: see
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

mod client;
mod protocol;
mod server;
pub(crate) mod sha256;

use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};

pub use client::Client;
pub use protocol::{decode_round, frame, read_frame, Challenge, Hello};
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
/// A rank's report that its set-up failed; the blob is its error, told to every rank.
const FAIL_ROUND: u32 = u32::MAX - 1;
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

/// The opaque id of docs/abi.md: address of the rendezvous point and the job's key.
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
    pub fn serve_here(&self, nranks: usize, exact_ip: bool) -> Result<Server> {
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
        Server::spawn(listener, self.job_key(), opts)
    }

    /// The id of a point that this process serves: it carries this process's pid and
    /// host (bytes 60..72, zero in ids from older builds), so that ranks that find the
    /// point gone can say whose process ended.
    fn served_here(mut self) -> UniqueId {
        self.0[60..64].copy_from_slice(&std::process::id().to_le_bytes());
        self.0[64..72].copy_from_slice(&host_id().to_le_bytes());
        self
    }

    /// The process that serves this id's rendezvous point, (pid, host id), if the id
    /// says: ids of fcclGetUniqueId and ferroccl-run (whose point existed before the
    /// id did), not those built from an address.
    pub fn server_process(&self) -> Option<(u32, u64)> {
        let pid = u32::from_le_bytes(self.0[60..64].try_into().expect("4 bytes"));
        let host = u64::from_le_bytes(self.0[64..72].try_into().expect("8 bytes"));
        (pid != 0).then_some((pid, host))
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

/// This host's id as hellos and the descriptions of connecting the ranks carry it (hostname and boot id, hashed).
pub fn host_id() -> u64 {
    super::connect::host_id()
}

/// The address fcclGetUniqueId's rendezvous point listens on and puts in the id:
/// FERROCCL_HOST_ADDR, else the interface selection, else this host's first interface
/// other than loopback (see [`super::addr::choose`]).
pub(crate) fn advertised_ip() -> Result<IpAddr> {
    super::addr::choose(None, true).map(|(ip, _)| ip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

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
