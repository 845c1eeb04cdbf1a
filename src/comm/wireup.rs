//! Connecting the ranks of a new communicator: shared memory with peers on this
//! host, TCP with the others. Runs [`ROUNDS`] rounds of an allgather supplied by the
//! caller (the rendezvous point for a new communicator, the parent for a split).

use crate::error::{Error, Result};
use crate::transport::shm::{ring_bytes_for, Segment, ShmLink};
use crate::transport::tcp::TcpLink;
use crate::transport::{Link, Transport};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rounds of allgather that [`connect`] performs.
pub(crate) const ROUNDS: usize = 3;
/// Size of a rank's description in round one.
pub(crate) const BLOB_BYTES: usize = 64;

/// An allgather of one blob per rank, in rank order of the new communicator.
pub type Allgather<'a> = dyn FnMut(&[u8]) -> Result<Vec<Vec<u8>>> + 'a;

struct Info {
    host: u64,
    pid: u32,
    addr: SocketAddr,
    /// The CPUs below 256 that the rank may run on, as a bit mask, and whether it
    /// may also run on CPUs beyond those.
    cpus: [u8; 32],
    more_cpus: bool,
}

/// This process's CPUs as Info describes them (an unreadable mask counts as "more").
fn cpu_mask() -> ([u8; 32], bool) {
    let mut m = [0u8; 32];
    let cpus = crate::transport::board::allowed_cpus();
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
        b[12..14].copy_from_slice(&self.addr.port().to_le_bytes());
        match self.addr.ip() {
            IpAddr::V4(ip) => {
                b[14] = 4;
                b[16..20].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                b[14] = 6;
                b[16..32].copy_from_slice(&ip.octets());
            }
        }
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
        let port = u16::from_le_bytes(b[12..14].try_into().unwrap());
        let ip = if b[14] == 6 {
            let mut o = [0u8; 16];
            o.copy_from_slice(&b[16..32]);
            IpAddr::from(o)
        } else {
            IpAddr::V4(Ipv4Addr::new(b[16], b[17], b[18], b[19]))
        };
        let mut cpus = [0u8; 32];
        cpus.copy_from_slice(&b[32..64]);
        Ok(Info { host, pid, addr: SocketAddr::new(ip, port), cpus, more_cpus: b[15] != 0 })
    }
}

/// Identity of this host: hostname and boot id, hashed.
pub(super) fn host_id() -> u64 {
    let mut s = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    s += &std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3))
}

/// Wires up rank `rank` of `nranks`. `name` (unique per communicator) names the
/// shared-memory segments; `nonce` authenticates TCP connections between ranks.
pub fn connect(
    rank: usize,
    nranks: usize,
    name: &str,
    nonce: u64,
    deadline: Instant,
    allgather: &mut Allgather<'_>,
) -> Result<Transport> {
    let force_tcp = crate::env::TRANSPORT.get_or_default().eq_ignore_ascii_case("tcp");
    let listener = TcpListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))
        .map_err(|e| Error::system(format!("cannot open a port for peers on other hosts: {e}")))?;
    listener.set_nonblocking(true)?;
    let adv_ip =
        crate::env::HOST_ADDR.get().and_then(|s| s.parse::<IpAddr>().ok()).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let my_host = if force_tcp { host_id() ^ (std::process::id() as u64) << 1 ^ rank as u64 } else { host_id() };
    let (cpus, more_cpus) = cpu_mask();
    let me = Info {
        host: my_host,
        pid: std::process::id(),
        addr: SocketAddr::new(adv_ip, listener.local_addr()?.port()),
        cpus,
        more_cpus,
    };

    // Round 1: who is where.
    let infos: Vec<Info> = allgather(&me.encode())?.iter().map(|b| Info::decode(b)).collect::<Result<_>>()?;
    if infos.len() != nranks {
        return Err(Error::internal(format!("wire-up got {} descriptions for {nranks} ranks", infos.len())));
    }
    let local: Vec<bool> = infos.iter().map(|i| i.host == me.host).collect();
    let any_local_peer = (0..nranks).any(|p| p != rank && local[p]);
    let ring = ring_bytes_for(nranks);
    // The creator's pid in the name lets a later job remove segments of a job whose
    // ranks were all killed before they could unlink them.
    // The creator's pid in the name lets a later job remove the segments of a job
    // whose ranks were all killed before they could unlink them.
    let seg_name = |r: usize| format!("/fccl-{name}-{r}-p{}", infos[r].pid);
    let mut my_seg = if any_local_peer {
        crate::transport::shm::remove_stale_segments();
        crate::transport::shm::allow_peer_reads();
        Some(Segment::create_shared(&seg_name(rank), nranks, ring)?)
    } else {
        None
    };

    // Round 2: every segment exists; map the peers' and connect to remote peers.
    allgather(&[])?;
    let my_seg_arc = my_seg.take().map(Arc::new);
    let mut links: Vec<Option<Box<dyn Link>>> = (0..nranks).map(|_| None).collect();
    let mut segs: Vec<Option<Arc<Segment>>> = (0..nranks).map(|_| None).collect();
    segs[rank] = my_seg_arc.clone();
    for p in (0..nranks).filter(|&p| p != rank && local[p]) {
        let peer_seg = Arc::new(Segment::open_shared(&seg_name(p), nranks, ring)?);
        segs[p] = Some(peer_seg.clone());
        let mine = my_seg_arc.clone().expect("created when a local peer exists");
        let other_process = infos[p].pid != me.pid;
        links[p] = Some(Box::new(ShmLink::new(rank, p, mine, peer_seg, other_process)));
    }
    for p in (rank + 1..nranks).filter(|&p| !local[p]) {
        let mut s = connect_retry(infos[p].addr, deadline, p)?;
        let mut hello = [0u8; 16];
        hello[0..8].copy_from_slice(&nonce.to_le_bytes());
        hello[8..16].copy_from_slice(&(rank as u64).to_le_bytes());
        s.write_all(&hello)?;
        links[p] = Some(Box::new(TcpLink::new(p, s)?));
    }
    let mut waiting: Vec<usize> = (0..rank).filter(|&p| !local[p]).collect();
    while !waiting.is_empty() {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                let mut hello = [0u8; 16];
                if s.read_exact(&mut hello).is_err() {
                    continue;
                }
                let their_nonce = u64::from_le_bytes(hello[0..8].try_into().unwrap());
                let p = u64::from_le_bytes(hello[8..16].try_into().unwrap()) as usize;
                // Refuse strangers; they do not disturb the set-up.
                if their_nonce != nonce || !waiting.contains(&p) {
                    continue;
                }
                waiting.retain(|&q| q != p);
                links[p] = Some(Box::new(TcpLink::new(p, s)?));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let list: Vec<String> = waiting.iter().map(|p| p.to_string()).collect();
                    return Err(Error::timeout(format!(
                        "rank {rank}: ranks {} never connected over TCP",
                        list.join(", ")
                    )));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(Error::system(format!("accepting peer connections: {e}"))),
        }
    }

    // Round 3: everyone has mapped everything; the names can go.
    allgather(&[])?;
    if let Some(s) = &my_seg_arc {
        s.unlink();
    }
    let local_ranks = local.iter().filter(|&&l| l).count();
    // How many CPUs the ranks of this host may use together: ranks pinned one per
    // CPU (ferroccl-run --bind core) are not oversubscribed, though each may use one.
    let local_cpus = if infos.iter().zip(&local).any(|(i, &l)| l && i.more_cpus) {
        crate::transport::board::available_cpus().max(local_ranks)
    } else {
        let mut union = [0u8; 32];
        for (i, _) in infos.iter().zip(&local).filter(|(_, &l)| l) {
            union.iter_mut().zip(&i.cpus).for_each(|(u, c)| *u |= c);
        }
        union.iter().map(|b| b.count_ones() as usize).sum::<usize>().max(1)
    };
    let t = Transport::new(rank, nranks, links, my_seg_arc);
    // With every rank on this host, collectives announce themselves on the board.
    let t = match segs.into_iter().collect::<Option<Vec<_>>>() {
        Some(all) if nranks > 1 => t.with_board(all),
        _ => t,
    };
    let t = t.with_local_ranks(local_ranks, local_cpus);
    crate::log::info(format_args!(
        "rank {rank}: {local_ranks} ranks on this host share {local_cpus} CPUs; waits spin {} us, then yield until {} us, then sleep",
        t.policy.spin.as_micros(),
        t.policy.yield_until.as_micros()
    ));
    Ok(t)
}

fn connect_retry(addr: SocketAddr, deadline: Instant, peer: usize) -> Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::timeout(format!("could not connect to rank {peer} at {addr}")));
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(2))) {
            Ok(s) => return Ok(s),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}
