//! Connecting the ranks of a new communicator: shared memory with peers on this
//! host, TCP with the others. Runs [`ROUNDS`] rounds of an allgather supplied by the
//! caller (the rendezvous point for a new communicator, the parent for a split):
//! 1. who is where (host, pid, CPUs);
//! 2. every segment exists, and each rank with peers on other hosts gives the address
//!    of the port it opened for them (no port at all when every rank is local);
//! 3. every rank has mapped its local peers' segments and connected to its remote
//!    peers of higher rank. Only then does a rank accept its lower remote peers: they
//!    have all connected, so a peer that died earlier failed a round instead, and the
//!    rendezvous point told everyone at once.

use super::addr::{self, Source};
use crate::error::{Error, Result};
use crate::transport::shm::{ring_bytes_for, Segment, ShmLink};
use crate::transport::tcp::TcpLink;
use crate::transport::{Link, Transport};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rounds of allgather that [`ranks`] performs.
pub(crate) const ROUNDS: usize = 3;
/// Size of a rank's description in round one.
pub(crate) const BLOB_BYTES: usize = 64;
/// The most accepted connections that have not yet said which peer they are.
const MAX_UNIDENTIFIED: usize = 64;

/// An allgather of one blob per rank, in rank order of the new communicator.
pub use crate::backend::Allgather;

struct Info {
    host: u64,
    pid: u32,
    /// The CPUs below 256 that the rank may run on, as a bit mask, and whether it
    /// may also run on CPUs beyond those.
    cpus: [u8; 32],
    more_cpus: bool,
}

/// This process's CPUs as Info describes them (an unreadable mask counts as "more").
fn cpu_mask() -> ([u8; 32], bool) {
    let mut m = [0u8; 32];
    let cpus = crate::sys::allowed_cpus();
    let mut more = cpus.is_empty();
    for c in cpus {
        if c < 256 {
            m[c / 8] |= 1 << (c % 8);
        } else {
            more = true;
        }
    }
    (m, more)
}

impl Info {
    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOB_BYTES];
        b[0..8].copy_from_slice(&self.host.to_le_bytes());
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[15] = u8::from(self.more_cpus);
        b[32..64].copy_from_slice(&self.cpus);
        b
    }
    fn decode(b: &[u8]) -> Result<Info> {
        if b.len() < BLOB_BYTES {
            return Err(Error::internal(format!("rank description of {} bytes", b.len())));
        }
        let host = u64::from_le_bytes(b[0..8].try_into().unwrap());
        let pid = u32::from_le_bytes(b[8..12].try_into().unwrap());
        let mut cpus = [0u8; 32];
        cpus.copy_from_slice(&b[32..64]);
        Ok(Info { host, pid, cpus, more_cpus: b[15] != 0 })
    }
}

/// What a rank tells the others in round two about its port for peers on other hosts.
#[derive(Clone, Debug, PartialEq)]
struct Remote {
    addr: SocketAddr,
    /// How the rank chose the address (for the messages of peers that cannot reach it).
    source: Source,
    /// The rank's hostname, shortened to fit the blob.
    host: String,
}

/// The most bytes of a hostname round two carries.
const HOST_BYTES: usize = BLOB_BYTES - 21;

/// Round two's blob: family, port, address, source, hostname; empty without a port.
fn encode_addr(r: Option<&Remote>) -> Vec<u8> {
    let Some(r) = r else { return Vec::new() };
    let mut b = vec![0u8; 21];
    b[1..3].copy_from_slice(&r.addr.port().to_le_bytes());
    match r.addr.ip() {
        IpAddr::V4(ip) => {
            b[0] = 4;
            b[3..7].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            b[0] = 6;
            b[3..19].copy_from_slice(&ip.octets());
        }
    }
    b[19] = r.source.code();
    let mut host = r.host.as_bytes();
    host = &host[..host.len().min(HOST_BYTES)];
    b[20] = host.len() as u8;
    b.extend_from_slice(host);
    b
}

fn decode_addr(b: &[u8]) -> Option<Remote> {
    if b.len() < 21 {
        return None;
    }
    let port = u16::from_le_bytes([b[1], b[2]]);
    let ip = match b[0] {
        4 => IpAddr::V4(Ipv4Addr::new(b[3], b[4], b[5], b[6])),
        6 => IpAddr::from(<[u8; 16]>::try_from(&b[3..19]).unwrap()),
        _ => return None,
    };
    let n = (b[20] as usize).min(HOST_BYTES).min(b.len() - 21);
    Some(Remote {
        addr: SocketAddr::new(ip, port),
        source: Source::from_code(b[19]),
        host: String::from_utf8_lossy(&b[21..21 + n]).into_owned(),
    })
}

/// This host's name, for peers' messages.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Identity of this host: hostname and boot id, hashed.
pub(super) fn host_id() -> u64 {
    let mut s = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    s += &std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3))
}

/// A port for peers on other hosts, on the address this rank advertises (see
/// [`addr::choose`]), and that address.
fn open_port(nranks: usize, route: Option<IpAddr>, other_hosts: bool) -> Result<(TcpListener, Remote)> {
    let (adv, source) = addr::choose(route, other_hosts)?;
    let listener = match TcpListener::bind(SocketAddr::new(adv, 0)) {
        Ok(l) => l,
        // An address this host only receives through NAT: listen on every interface.
        Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) && source == Source::HostAddr => {
            let any = if adv.is_ipv4() { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) };
            crate::log::info(format_args!(
                "FERROCCL_HOST_ADDR {adv} is not an address of this host; the port for remote peers listens on {any}"
            ));
            TcpListener::bind(SocketAddr::new(any, 0))
                .map_err(|e| Error::system(format!("cannot open a port for peers on other hosts: {e}")))?
        }
        Err(e) => {
            return Err(Error::system(format!(
                "cannot open a port for peers on other hosts on {adv} ({}): {e}",
                source.describe()
            )))
        }
    };
    listener.set_nonblocking(true)?;
    // Every lower remote peer connects all its sockets before this rank accepts any (round three).
    let backlog = nranks.saturating_mul(crate::transport::tcp::MAX_SOCKS).min(i32::MAX as usize);
    // SAFETY: listen on a socket we own; it only raises the accept queue's length.
    unsafe { libc::listen(listener.as_raw_fd(), backlog as libc::c_int) };
    let port = listener.local_addr()?.port();
    crate::log::info(format_args!("peers on other hosts reach this rank at {adv} port {port} ({})", source.describe()));
    Ok((listener, Remote { addr: SocketAddr::new(adv, port), source, host: hostname() }))
}

/// Connects rank `rank` of `nranks`. `name` (unique per communicator) names the
/// shared-memory segments; `nonce` authenticates TCP connections between ranks.
pub fn ranks(
    rank: usize,
    nranks: usize,
    name: &str,
    nonce: u64,
    deadline: Instant,
    route: Option<IpAddr>,
    allgather: &mut Allgather<'_>,
) -> Result<Transport> {
    let force_tcp = crate::env::force_tcp()?;
    let my_host = if force_tcp { host_id() ^ (std::process::id() as u64) << 1 ^ rank as u64 } else { host_id() };
    let (cpus, more_cpus) = cpu_mask();
    let me = Info { host: my_host, pid: std::process::id(), cpus, more_cpus };

    // Round 1: who is where.
    let infos: Vec<Info> = allgather(&me.encode())?.iter().map(|b| Info::decode(b)).collect::<Result<_>>()?;
    if infos.len() != nranks {
        return Err(Error::internal(format!(
            "connecting the ranks got {} descriptions for {nranks} ranks",
            infos.len()
        )));
    }
    let local: Vec<bool> = infos.iter().map(|i| i.host == me.host).collect();
    let any_local_peer = (0..nranks).any(|p| p != rank && local[p]);
    let any_remote_peer = (0..nranks).any(|p| p != rank && !local[p]);
    let ring = ring_bytes_for(nranks);
    // The creator's pid in the name lets a later job remove the segments of a job
    // whose ranks were all killed before they could unlink them.
    let seg_name = |r: usize| format!("/fccl-{name}-{r}-p{}", infos[r].pid);
    let mut my_seg = if any_local_peer {
        crate::transport::shm::remove_stale_segments();
        let peers: Vec<u32> = (0..nranks).filter(|&p| p != rank && local[p]).map(|p| infos[p].pid).collect();
        crate::transport::shm::allow_peer_reads(&peers);
        Some(Segment::create_shared(&seg_name(rank), nranks, ring)?)
    } else {
        None
    };
    // A port only when a peer is on another host; all-local jobs open none.
    let port = if any_remote_peer { Some(open_port(nranks, route, !force_tcp)?) } else { None };
    let silence = if any_remote_peer { peer_lost()? } else { None };

    // Round 2: every segment and port exists; map the peers' segments and connect to
    // remote peers of higher rank.
    let addrs: Vec<Option<Remote>> =
        allgather(&encode_addr(port.as_ref().map(|p| &p.1)))?.iter().map(|b| decode_addr(b)).collect();
    let my_seg_arc = my_seg.take().map(Arc::new);
    let mut links: Vec<Option<Box<dyn Link>>> = (0..nranks).map(|_| None).collect();
    let mut segs: Vec<Option<Arc<Segment>>> = (0..nranks).map(|_| None).collect();
    segs[rank] = my_seg_arc.clone();
    for p in (0..nranks).filter(|&p| p != rank && local[p]) {
        let peer_seg = match open_peer_segment(&seg_name(p), rank, p, infos[p].pid, nranks, ring) {
            Ok(seg) => Arc::new(seg),
            Err(e) if !crate::sys::process_gone(infos[p].pid) => {
                // Its process runs: it most likely failed already (and removed its
                // segment) because the set-up failed elsewhere, which the next round
                // says; this error only if that round goes through.
                allgather(&[])?;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        segs[p] = Some(peer_seg.clone());
        let mine = my_seg_arc.clone().expect("created when a local peer exists");
        let other_process = infos[p].pid != me.pid;
        links[p] = Some(Box::new(ShmLink::new(rank, p, mine, peer_seg, other_process)));
    }
    for p in (rank + 1..nranks).filter(|&p| !local[p]) {
        let remote = addrs.get(p).and_then(Option::as_ref).ok_or_else(|| {
            Error::internal(format!("rank {rank}: rank {p} is on another host but gave no address for its port"))
        })?;
        // This rank, the lower of the pair, chooses how many sockets the pair uses: k
        // for the data and one more, the last, for failure notices.
        let k = crate::env::nsocks()? + 1;
        let mut socks = Vec::with_capacity(k);
        for i in 0..k {
            let mut s = connect_peer(remote, deadline, rank, p)?;
            s.write_all(&Hello { nonce, rank: rank as u64, index: i as u32, count: k as u32 }.encode())?;
            socks.push(s);
        }
        links[p] = Some(Box::new(tcp_link(p, socks, &remote.host, silence)?));
    }

    // Round 3: everyone has mapped everything and connected; the names can go.
    allgather(&[])?;
    if let Some(s) = &my_seg_arc {
        s.unlink();
    }
    if let Some((listener, _)) = port {
        let lower: Vec<usize> = (0..rank).filter(|&p| !local[p]).collect();
        for (p, s) in accept_peers(&listener, &lower, nonce, rank, deadline)? {
            let host = addrs.get(p).and_then(Option::as_ref).map_or("", |r| r.host.as_str());
            links[p] = Some(Box::new(tcp_link(p, s, host, silence)?));
        }
    }
    let local_ranks = local.iter().filter(|&&l| l).count();
    // How many CPUs the ranks of this host may use together: ranks pinned one per
    // CPU (ferroccl-run --bind core) are not oversubscribed, though each may use one.
    let local_cpus = if infos.iter().zip(&local).any(|(i, &l)| l && i.more_cpus) {
        crate::sys::available_cpus().max(local_ranks)
    } else {
        let mut union = [0u8; 32];
        for (i, _) in infos.iter().zip(&local).filter(|(_, &l)| l) {
            union.iter_mut().zip(&i.cpus).for_each(|(u, c)| *u |= c);
        }
        union.iter().map(|b| b.count_ones() as usize).sum::<usize>().max(1)
    };
    // With every rank on this host, collectives announce themselves on the board.
    let t = Transport::new(rank, nranks, links, segs).with_local_ranks(local_ranks, local_cpus);
    crate::log::info(format_args!(
        "rank {rank}: {local_ranks} ranks on this host share {local_cpus} CPUs; waits spin {} us, then yield until {} us, then sleep",
        t.policy.spin.as_micros(),
        t.policy.yield_until.as_micros()
    ));
    Ok(t)
}

/// Maps rank `peer`'s segment `name` (created by its process `pid` before round two).
/// When that fails because the peer died during set-up (the survivors then remove what
/// it left), the error names the peer rather than the missing file.
fn open_peer_segment(name: &str, rank: usize, peer: usize, pid: u32, nranks: usize, ring: usize) -> Result<Segment> {
    Segment::open_shared(name, nranks, ring).map_err(|e| {
        if crate::sys::process_gone(pid) {
            Error::remote_rank(
                peer,
                format!(
                    "rank {rank}: rank {peer} (pid {pid}) died during set-up, after it created its shared-memory segment {name} and before every rank had mapped it (the segment is gone: {})",
                    e.msg
                ),
            )
        } else if !std::path::Path::new("/dev/shm").join(name.trim_start_matches('/')).exists() {
            Error::remote_rank(
                peer,
                format!(
                    "rank {rank}: the shared-memory segment {name} of rank {peer} (pid {pid}, still running) is missing: something removed it from /dev/shm during set-up, or rank {peer} sees another /dev/shm than this rank (containers on one host must share /dev/shm, or run with FERROCCL_TRANSPORT=tcp) ({})",
                    e.msg
                ),
            )
        } else {
            e
        }
    })
}

/// How long a rank keeps trying to reach a peer on another host (FERROCCL_CONNECT_TIMEOUT_MS).
fn connect_timeout() -> Result<Duration> {
    crate::env::connect_timeout()
}

/// How long a peer's host may stay silent before the peer is reported lost
/// (FERROCCL_PEER_LOST_MS; None: 0, the kernel's own bounds).
fn peer_lost() -> Result<Option<Duration>> {
    crate::env::peer_lost()
}

#[cfg(test)]
fn parse_peer_lost(v: &str) -> Result<Option<Duration>> {
    crate::env::parse_peer_lost(v)
}

/// A TCP link to `peer` (on `host`, whose silence `silence` bounds) over a pair's
/// sockets in hello order: the data sockets, then the one that carries failure notices.
fn tcp_link(peer: usize, mut socks: Vec<TcpStream>, host: &str, silence: Option<Duration>) -> Result<TcpLink> {
    let notices = socks.pop().filter(|_| !socks.is_empty()).ok_or_else(|| {
        Error::remote_rank(peer, format!("rank {peer} opened one TCP socket; a pair needs two or more"))
    })?;
    TcpLink::new(peer, socks)?.with_notices(notices)?.watch_host(host, silence)
}

/// Connects to rank `peer`'s port. Its port was open before round two, so a refusal
/// means its process is gone, and an unreachable network or silence for
/// FERROCCL_CONNECT_TIMEOUT_MS means this host cannot reach that address: both fail
/// now, naming the peer, its host and address and what to set, not at the deadline.
fn connect_peer(remote: &Remote, deadline: Instant, rank: usize, peer: usize) -> Result<TcpStream> {
    let addr = remote.addr;
    let started = Instant::now();
    let give_up = deadline.min(started + connect_timeout()?);
    let host = if remote.host.is_empty() { String::from("its host") } else { format!("host {}", remote.host) };
    let advice = format!(
        "rank {peer} advertised that address as {}. Make the hosts' addresses reachable from each other, or choose the interface they share with FERROCCL_SOCKET_IFNAME (or NCCL_SOCKET_IFNAME) on every rank, or set FERROCCL_HOST_ADDR on rank {peer}'s host to an address this host can reach",
        remote.source.describe()
    );
    let unreachable = |why: &str| {
        Error::remote_rank(
            peer,
            format!(
                "rank {rank}: cannot reach rank {peer} on {host} at {} port {} after {} ms ({why}); {advice}",
                addr.ip(),
                addr.port(),
                started.elapsed().as_millis(),
            ),
        )
    };
    let mut last = String::from("no answer");
    loop {
        let left = give_up.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(unreachable(&last));
        }
        if super::creation::cancelled() {
            return Err(super::creation::aborted());
        }
        match super::creation::connect(&addr, left.min(Duration::from_secs(2))) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Err(Error::remote_rank(
                    peer,
                    format!(
                        "rank {rank}: the connection to rank {peer} on {host} at {} port {} was refused: its process has died, or that address is not its host's; {advice}",
                        addr.ip(),
                        addr.port()
                    ),
                ))
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENETUNREACH) | Some(libc::EHOSTUNREACH) | Some(libc::EADDRNOTAVAIL) | Some(libc::EAFNOSUPPORT)) => {
                return Err(unreachable(&e.to_string()))
            }
            Err(e) => {
                last = e.to_string();
                super::creation::sleep(Duration::from_millis(10).min(give_up.saturating_duration_since(Instant::now())));
            }
        }
    }
}

/// Bytes of the hello that opens every TCP connection between ranks.
const HELLO_BYTES: usize = 24;

/// What the connecting rank says first on each of its sockets to a peer: the
/// set-up's nonce, its rank, and which of how many sockets of the pair this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hello {
    nonce: u64,
    rank: u64,
    index: u32,
    count: u32,
}

impl Hello {
    fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..8].copy_from_slice(&self.nonce.to_le_bytes());
        b[8..16].copy_from_slice(&self.rank.to_le_bytes());
        b[16..20].copy_from_slice(&self.index.to_le_bytes());
        b[20..24].copy_from_slice(&self.count.to_le_bytes());
        b
    }
    fn decode(b: &[u8; HELLO_BYTES]) -> Hello {
        Hello {
            nonce: u64::from_le_bytes(b[0..8].try_into().unwrap()),
            rank: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            index: u32::from_le_bytes(b[16..20].try_into().unwrap()),
            count: u32::from_le_bytes(b[20..24].try_into().unwrap()),
        }
    }
}

/// The sockets of one lower peer accepted so far, by index.
struct Arriving {
    peer: usize,
    socks: Vec<Option<TcpStream>>,
}

impl Arriving {
    /// Files socket `h.index` of `h.count`; an error when the peer's hellos disagree.
    fn add(&mut self, rank: usize, h: Hello, s: TcpStream) -> Result<()> {
        let (i, k, p) = (h.index as usize, h.count as usize, self.peer);
        if !(2..=crate::transport::tcp::MAX_SOCKS + 1).contains(&k) || i >= k {
            return Err(Error::remote_rank(
                p,
                format!(
                    "rank {rank}: rank {p} opened TCP socket {i} of {k} (2 to {} sockets per peer); do all ranks run the same ferroccl?",
                    crate::transport::tcp::MAX_SOCKS + 1
                ),
            ));
        }
        if self.socks.is_empty() {
            self.socks.resize_with(k, || None);
        } else if self.socks.len() != k {
            return Err(Error::remote_rank(
                p,
                format!(
                    "rank {rank}: rank {p} opened TCP sockets of {} and of {k} sockets for one link; do all ranks run the same ferroccl?",
                    self.socks.len()
                ),
            ));
        }
        if self.socks[i].is_some() {
            return Err(Error::remote_rank(
                p,
                format!(
                    "rank {rank}: rank {p} opened TCP socket {i} of {k} twice; do all ranks run the same ferroccl?"
                ),
            ));
        }
        self.socks[i] = Some(s);
        Ok(())
    }

    fn complete(&self) -> bool {
        !self.socks.is_empty() && self.socks.iter().all(Option::is_some)
    }

    fn got(&self) -> usize {
        self.socks.iter().filter(|s| s.is_some()).count()
    }
}

/// Accepts the connections of remote peers `lower`: each opens the number of sockets
/// it chose (FERROCCL_NSOCKS) and says on each the set-up's nonce, its rank, the
/// socket's index and their number; a peer's sockets are returned in index order.
/// Strangers on the port are dropped without blocking anything: each accepted
/// connection is read without waiting, at most [`MAX_UNIDENTIFIED`] at once.
fn accept_peers(
    listener: &TcpListener,
    lower: &[usize],
    nonce: u64,
    rank: usize,
    deadline: Instant,
) -> Result<Vec<(usize, Vec<TcpStream>)>> {
    let mut waiting: Vec<Arriving> = lower.iter().map(|&peer| Arriving { peer, socks: Vec::new() }).collect();
    let mut done = Vec::with_capacity(lower.len());
    let mut unidentified: VecDeque<(TcpStream, [u8; HELLO_BYTES], usize)> = VecDeque::new();
    while !waiting.is_empty() {
        let mut progress = false;
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(true)?;
                    if unidentified.len() >= MAX_UNIDENTIFIED {
                        unidentified.pop_front();
                    }
                    unidentified.push_back((s, [0; HELLO_BYTES], 0));
                    progress = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::system(format!("rank {rank}: accepting peer connections: {e}"))),
            }
        }
        let mut i = 0;
        while i < unidentified.len() {
            let (s, buf, got) = &mut unidentified[i];
            match s.read(&mut buf[*got..]) {
                Ok(0) => {
                    unidentified.remove(i);
                    continue;
                }
                Ok(n) => {
                    *got += n;
                    progress = true;
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => {}
                Err(_) => {
                    unidentified.remove(i);
                    continue;
                }
            }
            if *got == HELLO_BYTES {
                let h = Hello::decode(buf);
                let (s, _, _) = unidentified.remove(i).expect("index in range");
                // Strangers and peers already connected are dropped; they do not disturb the set-up.
                if let Some(k) = waiting.iter().position(|a| h.nonce == nonce && a.peer as u64 == h.rank) {
                    waiting[k].add(rank, h, s)?;
                    if waiting[k].complete() {
                        let a = waiting.swap_remove(k);
                        done.push((a.peer, a.socks.into_iter().map(|s| s.expect("complete")).collect()));
                    }
                }
                continue;
            }
            i += 1;
        }
        if waiting.is_empty() {
            break;
        }
        if super::creation::cancelled() {
            return Err(super::creation::aborted());
        }
        if Instant::now() >= deadline {
            let list: Vec<String> = waiting
                .iter()
                .map(|a| match a.socks.len() {
                    0 => a.peer.to_string(),
                    k => format!("{} ({} of its {k} sockets)", a.peer, a.got()),
                })
                .collect();
            return Err(Error::timeout(format!(
                "rank {rank}: ranks {} connected over TCP (round three says so) but never identified themselves before the deadline",
                list.join(", ")
            )));
        }
        if !progress {
            // They have all connected already (round three): only packets in flight remain.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_for_remote_peers_listens_on_the_advertised_address_only() {
        if crate::env::HOST_ADDR.get().is_some() {
            return;
        }
        let (l, adv) = open_port(4, Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), false).unwrap();
        let bound = l.local_addr().unwrap();
        assert_eq!(bound.ip(), adv.addr.ip());
        assert_eq!(adv.source, Source::Route);
        assert!(!bound.ip().is_unspecified(), "bound to {bound}");
    }

    #[test]
    fn a_peer_segment_that_is_gone_names_the_peer_and_whether_it_died() {
        let name = format!("/fccl-test-{:x}-1-p1", std::process::id());
        // A process that has ended: its pid answers no signal.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let e = open_peer_segment(&name, 0, 1, dead, 2, 256 << 10).err().unwrap();
        assert_eq!(e.culprit, Some(1));
        assert!(e.msg.contains(&format!("rank 1 (pid {dead}) died during set-up")) && e.msg.contains(&name), "{e}");
        // A live peer whose segment is missing: not called dead.
        let e = open_peer_segment(&name, 0, 1, std::process::id(), 2, 256 << 10).err().unwrap();
        assert!(e.msg.contains("is missing") && !e.msg.contains("died"), "{e}");
    }

    #[test]
    fn the_silence_bound_is_whole_seconds_or_off() {
        assert_eq!(parse_peer_lost("0").unwrap(), None);
        assert_eq!(parse_peer_lost(" 2500 ").unwrap(), Some(Duration::from_millis(2500)));
        for bad in ["999", "-1", "3s", "", "99999999999"] {
            let e = parse_peer_lost(bad).unwrap_err();
            assert!(e.msg.contains("FERROCCL_PEER_LOST_MS") && e.msg.contains("1000"), "{bad:?}: {}", e.msg);
        }
    }

    #[test]
    fn round_two_addresses_survive_a_split_s_padding() {
        let r = |a: &str, host: &str| Remote { addr: a.parse().unwrap(), source: Source::Ifname, host: host.into() };
        let a = r("10.1.2.3:4567", "node-17");
        let mut padded = encode_addr(Some(&a));
        padded.resize(BLOB_BYTES, 0);
        assert_eq!(decode_addr(&padded), Some(a));
        let v6 = r("[fd00::1]:9", &"h".repeat(200));
        let got = decode_addr(&encode_addr(Some(&v6))).unwrap();
        assert_eq!((got.addr, got.host.len()), (v6.addr, HOST_BYTES));
        assert!(encode_addr(Some(&v6)).len() <= BLOB_BYTES);
        assert_eq!(decode_addr(&encode_addr(None)), None);
        assert_eq!(decode_addr(&[0u8; BLOB_BYTES]), None);
    }

    #[test]
    fn an_unreachable_peer_fails_within_the_connect_bound_naming_it() {
        // TEST-NET-1 (RFC 5737) is never routed: the connection times out or is refused by
        // the network at once; either way well before the set-up's deadline.
        if crate::env::CONNECT_TIMEOUT_MS.get().is_some() {
            return;
        }
        let remote = Remote { addr: "192.0.2.1:9".parse().unwrap(), source: Source::Route, host: "far".into() };
        let t = Instant::now();
        let e = connect_peer(&remote, Instant::now() + Duration::from_secs(600), 0, 3).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(15), "took {:?}", t.elapsed());
        let m = e.to_string();
        for want in ["rank 3", "host far", "at 192.0.2.1 port 9", "FERROCCL_SOCKET_IFNAME", "FERROCCL_HOST_ADDR"] {
            assert!(m.contains(want), "{want:?} missing from: {m}");
        }
    }

    #[test]
    fn a_peer_that_never_answers_fails_at_the_bound_naming_it() {
        // A port whose accept queue is full drops further SYNs without a word, as a
        // firewall or a vanished host does.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        // SAFETY: listen on a socket we own, with the shortest queue.
        unsafe { libc::listen(l.as_raw_fd(), 0) };
        let addr = l.local_addr().unwrap();
        let _queued: Vec<TcpStream> =
            (0..2).filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()).collect();
        let remote = Remote { addr, source: Source::Ifname, host: "quiet".into() };
        let t = Instant::now();
        let e = connect_peer(&remote, Instant::now() + Duration::from_millis(1500), 0, 1).unwrap_err();
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(1400) && took < Duration::from_secs(5), "took {took:?}: {e}");
        assert!(e.msg.contains("cannot reach rank 1 on host quiet") && e.msg.contains("FERROCCL_SOCKET_IFNAME"), "{e}");
        assert_eq!(e.culprit, Some(1));
    }

    /// Connects to `l` and says `h`, then one byte naming the socket.
    fn say(addr: SocketAddr, h: Hello, tag: u8) -> TcpStream {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&h.encode()).unwrap();
        s.write_all(&[tag]).unwrap();
        s
    }

    fn port() -> (TcpListener, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let a = l.local_addr().unwrap();
        (l, a)
    }

    #[test]
    fn a_peer_s_sockets_are_accepted_in_index_order_and_strangers_dropped() {
        let (l, addr) = port();
        let nonce = 0x1234;
        let deadline = Instant::now() + Duration::from_secs(10);
        let _keep = [
            say(addr, Hello { nonce, rank: 1, index: 2, count: 3 }, 12),
            say(addr, Hello { nonce: 99, rank: 1, index: 0, count: 3 }, 99),
            say(addr, Hello { nonce, rank: 0, index: 1, count: 2 }, 1),
            say(addr, Hello { nonce, rank: 0, index: 0, count: 2 }, 0),
            say(addr, Hello { nonce, rank: 1, index: 0, count: 3 }, 10),
            say(addr, Hello { nonce, rank: 1, index: 1, count: 3 }, 11),
        ];
        let mut got = accept_peers(&l, &[0, 1], nonce, 2, deadline).unwrap();
        got.sort_by_key(|(p, _)| *p);
        let tags: Vec<Vec<u8>> = got
            .iter_mut()
            .map(|(_, socks)| {
                socks
                    .iter_mut()
                    .map(|s| {
                        s.set_nonblocking(false).unwrap();
                        let mut b = [0u8];
                        s.read_exact(&mut b).unwrap();
                        b[0]
                    })
                    .collect()
            })
            .collect();
        assert_eq!(tags, vec![vec![0, 1], vec![10, 11, 12]]);
    }

    #[test]
    fn inconsistent_socket_counts_and_repeated_indexes_are_errors() {
        let nonce = 7;
        let cases: [(&[(u32, u32)], &str); 3] = [
            (&[(0, 2), (1, 3)], "TCP sockets of"),
            (&[(1, 3), (1, 3)], "socket 1 of 3 twice"),
            (&[(4, 4), (0, 18)], "sockets per peer"),
        ];
        for (hellos, want) in cases {
            let (l, addr) = port();
            let _keep: Vec<TcpStream> =
                hellos.iter().map(|&(index, count)| say(addr, Hello { nonce, rank: 0, index, count }, 0)).collect();
            let e = accept_peers(&l, &[0], nonce, 1, Instant::now() + Duration::from_secs(10)).unwrap_err();
            assert!(e.msg.contains(want) && e.msg.contains("rank 0"), "{e}");
            assert_eq!(e.culprit, Some(0));
        }
    }
}
