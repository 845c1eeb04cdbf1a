//! Peers' allocations mapped into this process (CUDA IPC, or VMM chunks passed as file
//! descriptors), and this rank's own allocations that peers map: handles made once per
//! allocation, frees published in the control region's log so that every rank that
//! mapped them lets them go.

use super::ctl::Ctl;
use super::fdpass::FdSocket;
use super::vmm::{self, Imports};
use crate::error::{Error, Result};
use crate::log;
use crate::mem::cuda;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A peer's allocation: the owner's pid and the allocation's base address there.
pub type Owner = (u32, usize);

/// The mappings of peers' allocations, one per (context, owner's allocation):
/// opening costs far more than a collective, so a buffer used again is not opened
/// again. A new handle for the same owner and base means the old allocation was freed
/// and another took its place; owners also log the allocations they freed. Past
/// [`MAPPINGS_MAX`] the least recently used one goes. Mappings that go are closed once
/// the GPU finished the calls that used them; all are closed with the communicator.
#[derive(Default)]
pub struct Mappings {
    pub map: HashMap<(cuda::Ctx, Owner), Mapped>,
    tick: u64,
    /// Where peers' VMM chunks arrive (ranks in other processes), or why there is none.
    pub sock: Option<std::result::Result<Arc<FdSocket>, String>>,
    /// Peers' VMM chunks imported here.
    imports: Imports,
}

pub struct Mapped {
    handle: [u8; 64],
    pub base: usize,
    used: u64,
    /// VMM: the owner's chunks mapped side by side here (their bases there).
    chunks: Vec<usize>,
}

/// The most peer allocations one rank keeps mapped.
pub const MAPPINGS_MAX: usize = 1024;

impl Mappings {
    /// Drops the mappings of `pid`'s allocations at `bases` (freed); returns them.
    pub fn forget(&mut self, ctx: cuda::Ctx, pid: u32, bases: &[usize], gone: &mut Vec<usize>) {
        for &base in bases {
            if let Some(m) = self.map.remove(&(ctx, (pid, base))) {
                gone.push(m.base);
            }
        }
        // VMM spans that hold a freed chunk anywhere.
        let keys: Vec<(cuda::Ctx, Owner)> = self
            .map
            .iter()
            .filter(|(k, m)| k.0 == ctx && k.1 .0 == pid && m.chunks.iter().any(|c| bases.contains(c)))
            .map(|(&k, _)| k)
            .collect();
        for k in keys {
            gone.push(self.map.remove(&k).expect("present").base);
        }
        self.imports.forget(pid, bases);
    }

    /// Drops every mapping of `pid`'s allocations (its log overran what we read).
    pub fn forget_all(&mut self, pid: u32, gone: &mut Vec<usize>) {
        let keys: Vec<(cuda::Ctx, Owner)> = self.map.keys().filter(|k| k.1 .0 == pid).copied().collect();
        for k in keys {
            gone.push(self.map.remove(&k).expect("present").base);
        }
        self.imports.forget_all(pid);
    }

    /// `owner`'s allocation (its IPC `handle`) mapped in context `ctx` (current).
    /// Mappings it replaces go to `gone`.
    pub fn open(&mut self, ctx: cuda::Ctx, owner: Owner, handle: &[u8; 64], gone: &mut Vec<usize>) -> Result<usize> {
        self.tick += 1;
        let tick = self.tick;
        if let Some(e) = self.map.get_mut(&(ctx, owner)) {
            if e.handle == *handle {
                e.used = tick;
                return Ok(e.base);
            }
            gone.push(self.map.remove(&(ctx, owner)).expect("present").base);
        }
        if self.map.len() >= MAPPINGS_MAX {
            let oldest = self.map.iter().filter(|(k, _)| k.0 == ctx).min_by_key(|(_, e)| e.used).map(|(&k, _)| k);
            if let Some(k) = oldest {
                gone.push(self.map.remove(&k).expect("present").base);
            }
        }
        let (base, chunks) = if vmm::is_vmm(handle) {
            let sock = match &self.sock {
                Some(Ok(s)) => s.clone(),
                Some(Err(m)) => return Err(Error::unavailable(format!("no socket to receive VMM memory on ({m})"))),
                None => return Err(Error::unavailable("no socket to receive VMM memory on")),
            };
            let (va, _, chunks) = self.imports.map(&sock, owner.0, owner.1, handle)?;
            (va, chunks)
        } else {
            (cuda::ipc_open(handle)?, Vec::new())
        };
        self.map.insert((ctx, owner), Mapped { handle: *handle, base, used: tick, chunks });
        Ok(base)
    }
}

pub fn close(base: usize) {
    // SAFETY: base came from ipc_open (or is a VMM span) in the current context, and the
    // GPU finished every call that used it (see Mappings).
    let r = unsafe { vmm::close_span(base).unwrap_or_else(|| cuda::ipc_close(base)) };
    if let Err(e) = r {
        log::warn(format_args!("closing a mapping of a peer's allocation: {}", e.msg));
    }
}

/// Most of this rank's allocations tracked for peers: past it, one is forgotten
/// (peers close its mapping when they need room).
const EXPORTED_MAX: usize = 4096;

/// How many of this rank's exported allocations one call checks for a free: the
/// check is a driver call each, so a call costs a constant however many allocations
/// peers hold mappings of; a freed one is reported within `exported / FREE_CHECKS`
/// calls (peers never use a stale mapping meanwhile: a new allocation at the same base
/// has another handle).
const FREE_CHECKS: usize = 4;

/// This rank's allocations whose handles peers received: base -> (the driver's
/// identity of the allocation, how it is shared), and where the next check for frees
/// starts.
#[derive(Default)]
pub struct Exported {
    map: BTreeMap<usize, (u64, Shared)>,
    cursor: usize,
    /// Where this rank sends its VMM chunks' descriptors, or why it cannot.
    pub sock: Option<std::result::Result<Arc<FdSocket>, String>>,
}

/// How peers reach one of this rank's allocations.
#[derive(Clone, Copy)]
enum Shared {
    /// Its CUDA IPC handle.
    Ipc([u8; 64]),
    /// A VMM chunk whose file descriptor went to the ranks of this bit set.
    Vmm(u64),
}

impl Exported {
    /// Logs (rank `me` in `ctl`) the allocations that peers may have mapped and that
    /// are freed now (or hold another allocation), and forgets them: the next
    /// [`FREE_CHECKS`] of them in address order, round the map over the calls.
    pub fn report_dead(&mut self, ctl: &Ctl, me: usize) {
        if self.map.is_empty() {
            return;
        }
        let next: Vec<(usize, u64)> = self
            .map
            .range(self.cursor..)
            .chain(self.map.range(..self.cursor))
            .take(FREE_CHECKS)
            .map(|(&base, &(id, _))| (base, id))
            .collect();
        self.cursor = next.last().map_or(0, |&(base, _)| base + 1);
        for (base, id) in next {
            if cuda::buffer_id(base as *const u8) != Some(id) {
                self.map.remove(&base);
                ctl.freed_push(me, base);
            }
        }
    }

    /// The handle field of a descriptor of `len` bytes at `p` and `p`'s offset from what
    /// it names, for ranks `to` (those in other processes that map it): the IPC handle of
    /// cuMemAlloc memory, made once per allocation (cuIpcGetMemHandle is slow); for VMM
    /// memory the chunks `p..p+len` spans, each exported and sent to a rank of `to` once.
    /// Remembered to report their freeing.
    pub fn handle(&mut self, p: *const u8, len: usize, to: &[usize]) -> Result<([u8; 64], usize)> {
        let (base, _) = cuda::address_range(p)?;
        let id = cuda::buffer_id(base as *const u8);
        match self.map.get(&base) {
            Some(&(known, Shared::Ipc(h))) if Some(known) == id => return Ok((h, p as usize - base)),
            Some(&(known, Shared::Vmm(_))) if Some(known) == id => return self.vmm(p, len, to),
            _ => {}
        }
        let (h, off) = match cuda::ipc_handle(p) {
            Ok(v) => v,
            // VMM memory (cuIpcGetMemHandle refuses it) goes by file descriptor.
            Err(e) => return if cuda::Retained::at(p).is_ok() { self.vmm(p, len, to) } else { Err(e) },
        };
        self.room();
        if let Some(id) = id {
            self.map.insert(base, (id, Shared::Ipc(h)));
        }
        Ok((h, off))
    }

    fn room(&mut self) {
        if self.map.len() >= EXPORTED_MAX {
            if let Some(&k) = self.map.keys().next() {
                self.map.remove(&k);
            }
        }
    }

    /// [`Exported::handle`] of VMM memory.
    fn vmm(&mut self, p: *const u8, len: usize, to: &[usize]) -> Result<([u8; 64], usize)> {
        if to.is_empty() {
            // Only ranks of this process (threads) use it: its address serves them.
            return Ok(([0; 64], 0));
        }
        let sock = match &self.sock {
            Some(Ok(s)) => s.clone(),
            Some(Err(m)) => return Err(Error::unavailable(format!("no socket to pass its file descriptors ({m})"))),
            None => return Err(Error::unavailable("no socket to pass its file descriptors")),
        };
        let chunks = vmm::chunks_of(p, len)?;
        let want: u64 = to.iter().fold(0, |m, &q| m | 1u64 << q);
        for &c in &chunks {
            let sent = match self.map.get(&c.0) {
                Some(&(id, Shared::Vmm(sent))) if id == c.1 => sent,
                _ => 0,
            };
            if sent & want != want {
                let missing: Vec<usize> = to.iter().copied().filter(|&q| sent & (1u64 << q) == 0).collect();
                vmm::send_chunk(&sock, c, &missing)?;
                if !self.map.contains_key(&c.0) {
                    self.room();
                }
                self.map.insert(c.0, (c.1, Shared::Vmm(sent | want)));
            }
        }
        Ok((vmm::encode(&chunks), p as usize - chunks[0].0))
    }
}

/// What this rank read of every owner's log of freed allocations.
#[derive(Default)]
pub struct FreedSeen {
    seen: Vec<u64>,
}

impl FreedSeen {
    /// Drops the mappings (in context `ctx`) of allocations that other ranks logged as
    /// freed since the last look; the mappings go to `gone`.
    pub fn apply(
        &mut self,
        ctl: &Ctl,
        me: usize,
        pids: &[u32],
        ctx: cuda::Ctx,
        maps: &mut Mappings,
        gone: &mut Vec<usize>,
    ) {
        self.seen.resize(pids.len(), 0);
        for (q, &pid) in pids.iter().enumerate() {
            if q == me || pid == std::process::id() {
                continue;
            }
            match ctl.freed_since(q, self.seen[q]) {
                (Some(bases), count) => {
                    maps.forget(ctx, pid, &bases, gone);
                    self.seen[q] = count;
                }
                (None, count) => {
                    maps.forget_all(pid, gone);
                    self.seen[q] = count;
                }
            }
        }
    }
}
