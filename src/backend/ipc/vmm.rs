//! VMM memory (cuMemCreate, as PyTorch's expandable segments allocate) shared GPU to GPU:
//! CUDA IPC cannot export it, so each physical chunk a buffer touches is exported once as a
//! POSIX file descriptor and passed to the ranks that map it (`fdpass`); they import the
//! chunks and map them side by side, so that a buffer spanning several chunks of the
//! owner's reservation is contiguous there too.

use super::fdpass::{FdSocket, Tag};
use crate::error::{Error, Result};
use crate::mem::cuda;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A descriptor's handle field for VMM memory starts with this (an IPC handle never does:
/// the simulator's and the driver's both start otherwise).
const MAGIC: [u8; 4] = *b"FVMM";
/// How long a receiver waits for descriptors its peers queued before their descriptors
/// reached it (they are already queued then; this only covers a slow sender).
const ARRIVAL: Duration = Duration::from_secs(10);
/// How long a sender retries a peer's socket that is not bound yet or full.
const SEND: Duration = Duration::from_secs(30);

/// One physical chunk of the owner's: (base address there, identity, size).
pub type Chunk = (usize, u64, usize);

/// FNV-1a over the chunks, so that a receiver knows it holds exactly the owner's chunks.
fn hash(chunks: &[Chunk]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &(b, id, s) in chunks {
        for v in [b as u64, id, s as u64] {
            for byte in v.to_le_bytes() {
                h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    h
}

/// The handle field describing `chunks` (side by side from the first one's base).
pub fn encode(chunks: &[Chunk]) -> [u8; 64] {
    let mut h = [0u8; 64];
    h[..4].copy_from_slice(&MAGIC);
    h[4..8].copy_from_slice(&(chunks.len() as u32).to_le_bytes());
    h[8..16].copy_from_slice(&(chunks.iter().map(|c| c.2).sum::<usize>() as u64).to_le_bytes());
    h[16..24].copy_from_slice(&hash(chunks).to_le_bytes());
    h
}

/// (chunks, total bytes, hash) of a VMM handle field; None for an IPC handle.
fn decode(h: &[u8; 64]) -> Option<(usize, usize, u64)> {
    let u64_at = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().expect("8 bytes"));
    (h[..4] == MAGIC)
        .then(|| (u32::from_le_bytes(h[4..8].try_into().expect("4 bytes")) as usize, u64_at(8) as usize, u64_at(16)))
}

pub fn is_vmm(h: &[u8; 64]) -> bool {
    h[..4] == MAGIC
}

/// The chunks (consecutive mappings) holding `len` bytes at `p`, each with the driver's
/// identity of it.
pub fn chunks_of(p: *const u8, len: usize) -> Result<Vec<Chunk>> {
    let end = p as usize + len.max(1);
    let mut out = Vec::new();
    let (mut base, mut size) = cuda::address_range(p)?;
    loop {
        let id = cuda::buffer_id(base as *const u8).ok_or_else(|| {
            Error::invalid_usage(format!("the driver reports no buffer id for the mapping at {base:#x}"))
        })?;
        out.push((base, id, size));
        if base + size >= end {
            return Ok(out);
        }
        let next = base + size;
        let (b, s) = cuda::address_range(next as *const u8).map_err(|e| {
            Error::invalid_usage(format!(
                "{len} bytes at {p:p} run past the mapping {base:#x}+{size} into unmapped memory ({})",
                e.msg
            ))
        })?;
        if b != next {
            return Err(Error::invalid_usage(format!("the mapping after {base:#x}+{size} starts at {b:#x}")));
        }
        (base, size) = (b, s);
    }
}

/// Exports chunk `c` (mapped at its base in this process) and queues its descriptor on
/// every rank of `to`.
pub fn send_chunk(sock: &FdSocket, c: Chunk, to: &[usize]) -> Result<()> {
    let r = cuda::Retained::at(c.0 as *const u8)?;
    let types = r.handle_types()?;
    if types & cuda::HANDLE_POSIX_FD == 0 {
        return Err(Error::invalid_usage(format!(
            "its allocation at {:#x} was created with requestedHandleTypes {types:#x}, without \
             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",
            c.0
        )));
    }
    let fd = r.export_fd()?;
    let tag = Tag { pid: std::process::id(), base: c.0, id: c.1, size: c.2 };
    let until = Instant::now() + SEND;
    for &q in to {
        sock.send(q, &[(tag, fd.as_fd())], until).map_err(Error::invalid_usage)?;
    }
    crate::log::info(format_args!(
        "exported VMM allocation {:#x}+{} (buffer id {}) as a file descriptor to rank(s) {to:?}",
        c.0, c.2, c.1
    ));
    Ok(())
}

/// Peers' chunks imported in this process: (owner pid, base) -> (identity, allocation).
#[derive(Default)]
pub struct Imports {
    map: HashMap<(u32, usize), (u64, cuda::Imported)>,
}

impl Imports {
    /// Imports what arrived on `sock` (a newer chunk at the same base replaces the older).
    fn absorb(&mut self, sock: &FdSocket) -> Result<()> {
        for (t, fd) in sock.take_all() {
            let fd: OwnedFd = fd;
            let imp = cuda::Imported::from_fd(&fd, t.size)?;
            self.map.insert((t.pid, t.base), (t.id, imp));
        }
        Ok(())
    }

    /// Drops the chunks of `pid` at `bases` (freed by their owner).
    pub fn forget(&mut self, pid: u32, bases: &[usize]) {
        for &b in bases {
            self.map.remove(&(pid, b));
        }
    }

    pub fn forget_all(&mut self, pid: u32) {
        self.map.retain(|k, _| k.0 != pid);
    }

    /// The chunks of `pid` from `base` that `h` describes, in order, if all are here.
    fn span(&self, pid: u32, base: usize, h: &[u8; 64]) -> Option<Vec<(usize, &cuda::Imported)>> {
        let (n, total, want) = decode(h)?;
        let mut got = Vec::with_capacity(n);
        let mut at = base;
        while got.len() < n && at < base + total {
            let (id, imp) = self.map.get(&(pid, at))?;
            got.push((at, *id, imp));
            at += imp.size;
        }
        let chunks: Vec<Chunk> = got.iter().map(|&(b, id, imp)| (b, id, imp.size)).collect();
        (at == base + total && hash(&chunks) == want).then(|| got.into_iter().map(|(b, _, i)| (b, i)).collect())
    }

    /// Maps `pid`'s chunks from `base` that `h` describes side by side for the current
    /// context's device: (address, bytes, the owner's chunk bases).
    pub fn map(&mut self, sock: &FdSocket, pid: u32, base: usize, h: &[u8; 64]) -> Result<(usize, usize, Vec<usize>)> {
        let until = Instant::now() + ARRIVAL;
        loop {
            self.absorb(sock)?;
            if let Some(span) = self.span(pid, base, h) {
                let device = cuda::current_device().unwrap_or(0);
                let parts: Vec<&cuda::Imported> = span.iter().map(|&(_, i)| i).collect();
                let va = cuda::map_side_by_side(&parts, device)?;
                let len = parts.iter().map(|i| i.size).sum();
                spans().lock().unwrap_or_else(|p| p.into_inner()).insert(va, len);
                return Ok((va, len, span.iter().map(|&(b, _)| b).collect()));
            }
            if Instant::now() >= until {
                return Err(Error::internal(format!(
                    "the file descriptors of process {pid}'s VMM memory at {base:#x} did not arrive within {ARRIVAL:?}"
                )));
            }
            sock.wait(until);
        }
    }
}

/// Every span this process mapped with [`Imports::map`]: address -> bytes.
fn spans() -> &'static Mutex<HashMap<usize, usize>> {
    static S: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    S.get_or_init(Default::default)
}

/// Unmaps the span at `va` if it is one (true), else leaves it to the caller (false).
///
/// # Safety
/// No queued work uses the span.
pub unsafe fn close_span(va: usize) -> Option<Result<()>> {
    let len = spans().lock().unwrap_or_else(|p| p.into_inner()).remove(&va)?;
    // SAFETY: per the caller; the span came from map_side_by_side.
    Some(unsafe { cuda::unmap_side_by_side(va, len) })
}
