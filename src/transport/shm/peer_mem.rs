//! What a rank can do with a peer's memory on one host, beyond the rings: read its
//! buffers (single copy), write into them (split copies, swaps, a broadcast root's
//! own copy), and map its shared allocations (`mem::shared`). `link::ShmLink` offers
//! these through `transport::PeerMemory`; the words both sides coordinate through
//! lie in the control page of each ring (see `segment`). See docs/design/host.md,
//! "Single copy" and "Split copies".

use super::segment::{
    Segment, MAGIC, OFF_MAGIC, OFF_READS_DONE, OFF_SELF_ADDR, OFF_SHARE_CLAIM, OFF_SHARE_DEST, OFF_SHARE_DONE,
    RING_CTRL_BYTES,
};
use crate::env::SingleCopy;
use crate::error::{Error, Result};
use crate::mem::shared::{Desc, PeerMapping};
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Claim word while the receiver rewrites the destination.
const SHARE_BUSY: u64 = u64::MAX;
/// Peers' shared allocations a link keeps mapped at most, for reading and again for
/// writing (the oldest goes first).
const MAPS_MAX: usize = 64;

/// A split copy: the receiver of a large direct message and its sender copy it
/// together. The receiver publishes where the message goes (its destination, in
/// memory the sender can write: a shared allocation or, between threads, any
/// address) in the control page of the ring the message came through; both then
/// take pieces from one counter and copy them, the sender out of its own buffer
/// into the destination, the receiver as it reads any direct message. The read is
/// done, as always, when the receiver reports it (`PeerMemory::read_done`), which it
/// does once every piece is copied.
///
/// The claim word carries the message's number (the receiver's count of direct
/// reads done, plus one) beside the next piece, so a sender can only take pieces
/// of the message it sent: once every piece is taken, the number changes only
/// after the last copy is done. The destination is read as a sequence lock:
/// the receiver marks the claim word busy before it rewrites the destination.
#[derive(Clone, Copy)]
pub struct Share {
    pub(super) ctrl: *mut u8,
}

/// Where a split copy writes (read from the receiver's offer).
#[derive(Clone, Copy, Debug)]
pub struct ShareDest {
    pub addr: u64,
    pub len: usize,
    /// Write with streaming stores (the receiver's choice for its buffer).
    pub stream: bool,
    /// The receiver's shared allocation holding it (None between threads).
    pub shared: Option<Desc>,
}

impl Share {
    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= RING_CTRL_BYTES && off % 8 == 0);
        // SAFETY: inside a ring's control page, which the link's segments keep
        // mapped while the link lives; aligned; only accessed atomically.
        unsafe { &*(self.ctrl.add(off) as *const AtomicU64) }
    }

    /// Receiver: offers the message it reads next from this ring (`dest`).
    pub(super) fn publish(&self, dest: &ShareDest) {
        let seq = self.word(OFF_READS_DONE).load(Ordering::Relaxed) + 1;
        self.word(OFF_SHARE_CLAIM).store(SHARE_BUSY, Ordering::Relaxed);
        fence(Ordering::Release);
        let d = dest.shared.unwrap_or(Desc { serial: 0, fd: 0, region_len: 0, offset: 0, epoch: 0 });
        let fields = [
            dest.addr,
            dest.len as u64,
            dest.stream as u64,
            d.serial,
            d.region_len,
            d.offset,
            (d.fd as u32 as u64) | (d.epoch as u64) << 32,
        ];
        for (k, v) in fields.into_iter().enumerate() {
            self.word(OFF_SHARE_DEST + 8 * k).store(v, Ordering::Relaxed);
        }
        self.word(OFF_SHARE_DONE).store(0, Ordering::Relaxed);
        self.word(OFF_SHARE_CLAIM).store(seq << 32, Ordering::Release);
    }

    /// Sender: the destination of direct message `seq`, if its receiver offered it.
    pub fn offer(&self, seq: u64) -> Option<ShareDest> {
        let claim = self.word(OFF_SHARE_CLAIM);
        let w = claim.load(Ordering::Acquire);
        if w == SHARE_BUSY || w >> 32 != seq {
            return None;
        }
        let f: [u64; 7] = std::array::from_fn(|k| self.word(OFF_SHARE_DEST + 8 * k).load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        // Unchanged since the first look: the fields are those of message `seq`.
        if claim.load(Ordering::Relaxed) >> 32 != seq {
            return None;
        }
        let shared = (f[3] != 0).then(|| Desc {
            serial: f[3],
            region_len: f[4],
            offset: f[5],
            fd: f[6] as u32 as i32,
            epoch: (f[6] >> 32) as u32,
        });
        Some(ShareDest { addr: f[0], len: f[1] as usize, stream: f[2] != 0, shared })
    }

    /// Takes the next pieces of message `seq`, at most `most` of them, of the
    /// `pieces` it has: (first, how many); None when all are taken (or the message
    /// is no longer the one offered).
    pub fn take(&self, seq: u64, pieces: u64, most: u64) -> Option<(u64, u64)> {
        let claim = self.word(OFF_SHARE_CLAIM);
        let mut w = claim.load(Ordering::Acquire);
        loop {
            let next = w & 0xffff_ffff;
            if w == SHARE_BUSY || w >> 32 != seq || next >= pieces {
                return None;
            }
            let n = most.min(pieces - next);
            match claim.compare_exchange_weak(w, w + n, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some((next, n)),
                Err(now) => w = now,
            }
        }
    }

    /// Receiver: takes back an offer whose read failed (the run ends in an error),
    /// so the sender takes no more pieces of it; a piece it is copying right now
    /// (64 KiB) still lands.
    pub fn withdraw(&self) {
        self.word(OFF_SHARE_CLAIM).store(SHARE_BUSY, Ordering::Release);
    }

    /// `n` pieces taken with `take` have been copied.
    pub fn pieces_copied(&self, n: u64) {
        self.word(OFF_SHARE_DONE).fetch_add(n, Ordering::AcqRel);
    }

    /// Pieces copied so far, by both sides.
    pub fn pieces_done(&self) -> u64 {
        self.word(OFF_SHARE_DONE).load(Ordering::Acquire)
    }

    /// The number of the message this rank reads next through this ring (the
    /// receiver's side), for `take`.
    pub fn next_read(&self) -> u64 {
        self.word(OFF_READS_DONE).load(Ordering::Relaxed) + 1
    }
}

/// A peer's shared allocations mapped here, oldest first, and the peer's free
/// counter when they were checked last (see `mem::shared::Desc::epoch`).
#[derive(Default)]
pub(super) struct Mappings {
    maps: Vec<(u64, PeerMapping)>,
    epoch: u32,
}

impl Mappings {
    /// Where `len` bytes at `d` (a shared allocation of `peer`, process `pid`) are
    /// mapped here, writable when `write`: from these mappings, or mapped now. Err
    /// when `d` does not hold them (a corrupt message: fatal); Ok(Err) when mapping
    /// failed.
    pub(super) fn get(
        &mut self,
        peer: usize,
        pid: u32,
        d: &Desc,
        len: usize,
        write: bool,
    ) -> Result<std::result::Result<*mut u8, Error>> {
        if d.offset.checked_add(len as u64).map_or(true, |end| end > d.region_len) {
            return Err(Error::internal(format!(
                "rank {peer} named {len} bytes at offset {} of a shared buffer of {} bytes",
                d.offset, d.region_len
            )));
        }
        if d.epoch != self.epoch {
            // The peer freed shared buffers since we last looked: drop our mappings
            // (some may be of those), so their memory goes back to the system.
            self.maps.clear();
            self.epoch = d.epoch;
        }
        let fits = |(s, m): &&(u64, PeerMapping)| {
            *s == d.serial && m.mapped_bytes() == d.region_len as usize && m.writable() == write
        };
        if let Some((_, m)) = self.maps.iter().find(fits) {
            return Ok(Ok(m.at(d.offset) as *mut u8));
        }
        match PeerMapping::open(pid, d, write) {
            Ok(m) => {
                if self.maps.len() >= MAPS_MAX {
                    self.maps.remove(0);
                }
                let p = m.at(d.offset) as *mut u8;
                self.maps.push((d.serial, m));
                Ok(Ok(p))
            }
            Err(e) => Ok(Err(e)),
        }
    }
}

/// Reads `len` bytes at `addr` in process `pid` into `dst` (cross-memory attach), or
/// copies them when `pid` is this process.
pub(super) fn read_process(pid: u32, addr: u64, dst: *mut u8, len: usize) -> std::io::Result<()> {
    if pid == std::process::id() {
        // SAFETY: same address space; the peer keeps [addr, addr+len) valid and
        // unmodified until we report the read done, and dst is ours for len bytes.
        unsafe { std::ptr::copy_nonoverlapping(addr as usize as *const u8, dst, len) };
        return Ok(());
    }
    let mut done = 0usize;
    while done < len {
        // SAFETY: done < len, so dst + done stays inside the destination.
        let local = libc::iovec { iov_base: unsafe { dst.add(done) } as *mut libc::c_void, iov_len: len - done };
        let remote = libc::iovec { iov_base: (addr as usize + done) as *mut libc::c_void, iov_len: len - done };
        // SAFETY: local describes memory we own; the kernel checks the remote range.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            let e = std::io::Error::last_os_error();
            if n < 0 && e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(if n == 0 { std::io::Error::from(std::io::ErrorKind::UnexpectedEof) } else { e });
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether this process may read `peer`'s memory: reads the word at the peer
/// segment's self address and compares it with the magic that starts it.
pub(super) fn probe_read(peer: &Segment) -> bool {
    let pid = peer.pid();
    let addr = peer.word64(OFF_SELF_ADDR).load(Ordering::Relaxed);
    let mut v = 0u64;
    read_process(pid, addr + OFF_MAGIC as u64, &mut v as *mut u64 as *mut u8, 8).is_ok() && v == MAGIC
}

/// Whether this process may open process `pid`'s file descriptors (to map its
/// shared allocations): the kernel checks the same permission for the directory.
pub(super) fn probe_map(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok()
}

/// Lets this job's peers on this host read this process's memory where Yama needs
/// it, and no one else. Only cross-memory attach (`process_vm_readv`, used by
/// FERROCCL_SINGLE_COPY=cma) needs ptrace-attach rights; mapped single copy opens
/// `/proc/<pid>/fd/<n>`, a read-mode check that Yama leaves alone, and the rings are
/// shared memory. Yama's ptrace_scope 1 lets a process attach only to descendants and
/// to processes that declared it (or an ancestor of it) their tracer, one pid each:
/// the declared pid is the nearest common ancestor of this rank and its `peers`
/// (ferroccl-run, torchrun's agent, slurmstepd, a test's parent), so that the job's
/// ranks and that launcher's other descendants qualify, not every process of the user
/// (PR_SET_PTRACER_ANY). Without such an ancestor nothing is declared and `probe_read`
/// fails, so peers use the rings. Scope 0 restricts nothing; 2 and 3 ignore declarations.
/// See docs/robustness.md, "Rendezvous and set-up".
pub fn allow_peer_reads(peers: &[u32]) {
    if crate::env::single_copy() != SingleCopy::Cma || peers.is_empty() || yama_scope() != Some(1) {
        return;
    }
    static DECLARED: std::sync::Mutex<Option<u32>> = std::sync::Mutex::new(None);
    let mut declared = DECLARED.lock().unwrap_or_else(|p| p.into_inner());
    let mine = ancestors(std::process::id());
    let chains: Vec<Vec<u32>> = peers.iter().map(|&p| ancestors(p)).collect();
    let Some(tracer) = tracer_for(&mine, &chains, *declared) else {
        crate::log::info(format_args!(
            "ptrace_scope is 1 and this rank's peers (pids {peers:?}) have no close common ancestor to declare as their tracer; cross-memory attach stays off and large messages go through the shared rings"
        ));
        return;
    };
    if *declared != Some(tracer) {
        // SAFETY: prctl with these arguments only changes who may ptrace-attach to us.
        let rc = unsafe { libc::prctl(libc::PR_SET_PTRACER, tracer as libc::c_ulong, 0, 0, 0) };
        if rc == 0 {
            *declared = Some(tracer);
        }
    }
}

/// The tracer to declare: the nearest common ancestor of this process (`mine`, its
/// ancestor chain from itself up), every peer (their chains) and an earlier
/// declaration, unless that is this process, pid 1, or more than
/// [`MAX_TRACER_GENERATIONS`] above this process.
fn tracer_for(mine: &[u32], peers: &[Vec<u32>], declared: Option<u32>) -> Option<u32> {
    let mut top = declared.map_or(Some(0), |t| mine.iter().position(|&a| a == t))?;
    for chain in peers {
        top = top.max(chain.iter().find_map(|a| mine.iter().position(|m| m == a))?);
    }
    let tracer = *mine.get(top)?;
    // pid 1 (or a far ancestor such as a login shell) is every process's ancestor.
    (top > 0 && top <= MAX_TRACER_GENERATIONS && tracer > 1).then_some(tracer)
}

/// How far up a declared tracer may be: a launcher, or a launcher's shell wrapper.
const MAX_TRACER_GENERATIONS: usize = 3;

/// `/proc/sys/kernel/yama/ptrace_scope`, or None without Yama.
fn yama_scope() -> Option<u8> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok()?.trim().parse().ok()
}

/// `pid`, its parent, grandparent, ... up to pid 1 (empty if `pid` is not visible).
fn ancestors(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut p = pid;
    while p > 0 && out.len() < 256 {
        out.push(p);
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { break };
        // "pid (comm) state ppid ...": the command name may hold spaces and parentheses.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        match ppid {
            Some(pp) if pp != p => p = pp,
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declared_tracer_is_the_nearest_common_ancestor() {
        // Ranks 200, 201 and 202 are children of launcher 100, under shell 50, under init.
        let me = [200, 100, 50, 1];
        let sibling = |p| vec![p, 100, 50, 1];
        assert_eq!(tracer_for(&me, &[sibling(201), sibling(202)], None), Some(100));
        // A rank behind a shell wrapper: the launcher is two generations up from it.
        assert_eq!(tracer_for(&me, &[vec![300, 299, 100, 50, 1]], None), Some(100));
        // An earlier communicator's tracer further up stays declared.
        assert_eq!(tracer_for(&me, &[sibling(201)], Some(50)), Some(50));
        // Only init in common, or a peer this process cannot see: nothing is declared.
        assert_eq!(tracer_for(&me, &[vec![400, 1]], None), None);
        assert_eq!(tracer_for(&me, &[vec![]], None), None);
        // A far ancestor (a login session) is not declared.
        assert_eq!(tracer_for(&[9, 8, 7, 6, 5, 1], &[vec![10, 5, 1]], None), None);
        // Peers descended from this process: nothing to declare.
        assert_eq!(tracer_for(&me, &[vec![500, 200, 100, 50, 1]], None), None);
    }

    #[test]
    fn ancestors_walk_up_from_this_process() {
        let a = ancestors(std::process::id());
        assert_eq!(a[0], std::process::id());
        // SAFETY: getppid has no preconditions.
        assert_eq!(a.get(1).copied(), Some(unsafe { libc::getppid() } as u32));
    }
}
