//! Peers' allocations mapped into this process (CUDA IPC), and this rank's own
//! allocations that peers map: handles made once per allocation, frees published in
//! the control region's log so that every rank that mapped them lets them go.

use super::ctl::Ctl;
use crate::error::Result;
use crate::log;
use crate::mem::cuda;
use std::collections::{BTreeMap, HashMap};

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
}

pub struct Mapped {
    handle: [u8; 64],
    pub base: usize,
    used: u64,
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
    }

    /// Drops every mapping of `pid`'s allocations (its log overran what we read).
    pub fn forget_all(&mut self, pid: u32, gone: &mut Vec<usize>) {
        let keys: Vec<(cuda::Ctx, Owner)> = self.map.keys().filter(|k| k.1 .0 == pid).copied().collect();
        for k in keys {
            gone.push(self.map.remove(&k).expect("present").base);
        }
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
        let base = cuda::ipc_open(handle)?;
        self.map.insert((ctx, owner), Mapped { handle: *handle, base, used: tick });
        Ok(base)
    }
}

pub fn close(base: usize) {
    // SAFETY: base came from ipc_open in the current context, and the GPU finished
    // every call that used it (see Mappings).
    if let Err(e) = unsafe { cuda::ipc_close(base) } {
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
/// identity of the allocation, its handle), and where the next check for frees starts.
#[derive(Default)]
pub struct Exported {
    map: BTreeMap<usize, (u64, [u8; 64])>,
    cursor: usize,
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

    /// The IPC handle of the allocation holding `p` and `p`'s offset in it: made once
    /// per allocation (cuIpcGetMemHandle is slow), remembered to report its freeing.
    pub fn handle(&mut self, p: *const u8) -> Result<([u8; 64], usize)> {
        let (base, _) = cuda::address_range(p)?;
        let id = cuda::buffer_id(base as *const u8);
        if let Some(&(known, h)) = self.map.get(&base) {
            if Some(known) == id {
                return Ok((h, p as usize - base));
            }
        }
        let (h, off) = cuda::ipc_handle(p)?;
        if self.map.len() >= EXPORTED_MAX {
            if let Some(&k) = self.map.keys().next() {
                self.map.remove(&k);
            }
        }
        if let Some(id) = id {
            self.map.insert(base, (id, h));
        }
        Ok((h, off))
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
