//! The allocation table: device allocations (by device address), pinned and registered host
//! ranges, and classifying any address the API is given.

pub mod alloc;
pub mod space;

use crate::error::{bail, err, Result};
use alloc::{Alloc, Backing, Kind, FREED, FREEING, LIVE, PENDING};
use space::{round_up, Space, ALIGN, GAP, PAGE};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU8};
use std::sync::Arc;

/// A pinned (cuMemHostAlloc) or registered (cuMemHostRegister) host range.
#[derive(Clone, Debug)]
pub struct HostRegion {
    pub start: usize,
    pub size: usize,
    /// The mapping behind a cuMemHostAlloc allocation (None for registered memory).
    pub block: Option<(usize, usize)>,
    pub flags: u32,
    pub ctx: u64,
    pub device: i32,
    pub id: u64,
}

/// Where an address points, for copies and memory operations.
#[derive(Clone)]
pub enum Loc {
    /// Device, managed or IPC-opened memory: (allocation, offset).
    Dev(Arc<Alloc>, usize),
    /// Pinned or registered host memory, accessed directly.
    Pinned(usize),
    /// Ordinary host memory.
    Pageable(usize),
}

/// Freed ranges remembered for error messages.
const FREED_HISTORY: usize = 4096;

pub struct MemTable {
    space: Option<Space>,
    pub dev: BTreeMap<u64, Arc<Alloc>>,
    pub host: BTreeMap<usize, HostRegion>,
    freed: VecDeque<(u64, usize)>,
    /// Bytes allocated on each visible device.
    pub used: Vec<usize>,
    next_id: u64,
}

impl MemTable {
    pub fn new(devices: usize) -> MemTable {
        MemTable {
            space: None,
            dev: BTreeMap::new(),
            host: BTreeMap::new(),
            freed: VecDeque::new(),
            used: vec![0; devices],
            next_id: 0,
        }
    }

    pub fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn space(&mut self) -> Result<&mut Space> {
        if self.space.is_none() {
            self.space = Some(
                Space::reserve()
                    .ok_or_else(|| err!(CUDA_ERROR_OUT_OF_MEMORY, "cannot reserve a device address range"))?,
            );
        }
        Ok(self.space.as_mut().expect("just set"))
    }

    /// Whether `addr` lies in the device address range (allocated or not).
    pub fn in_device_range(&self, addr: u64) -> bool {
        self.space.as_ref().is_some_and(|s| s.contains(addr))
    }

    /// A new device allocation of `size` bytes on `device` for context `ctx`.
    pub fn alloc_device(
        &mut self,
        ctx: u64,
        device: i32,
        size: usize,
        kind: Kind,
        limit: usize,
        pid: u32,
    ) -> Result<Arc<Alloc>> {
        if size == 0 {
            bail!(CUDA_ERROR_INVALID_VALUE, "size is 0");
        }
        let charge = round_up(size, ALIGN).ok_or_else(|| err!(CUDA_ERROR_OUT_OF_MEMORY, "{size} bytes"))?;
        let used = self.used[device as usize];
        if charge > limit.saturating_sub(used) {
            bail!(
                CUDA_ERROR_OUT_OF_MEMORY,
                "{size} bytes requested, {} of {limit} bytes of device {device} free (FERROCCL_SIM_MEM_MB)",
                limit.saturating_sub(used)
            );
        }
        let id = self.next_id();
        let name = format!("fccl-sim-{pid}-{id}");
        let managed = kind == Kind::Managed;
        let backing = Backing::create(&name, size, kind == Kind::Device || managed)?;
        // Pages of its own and a guard page; the data ends at the end of the pages.
        let reserved = backing.map_len + GAP;
        let lead = if managed { 0 } else { backing.map_len - charge };
        let start = self
            .space()?
            .take(reserved, PAGE)
            .ok_or_else(|| err!(CUDA_ERROR_OUT_OF_MEMORY, "the device address range is exhausted"))?;
        let base = start + lead;
        let mut backing = backing;
        if managed {
            if let Err(e) = backing.map_fixed_at(base) {
                self.space()?.release(start, reserved);
                return Err(e);
            }
            backing.fd = None;
        }
        let a = Arc::new(Alloc {
            id,
            base: base as u64,
            size,
            reserved,
            lead,
            kind,
            ctx,
            device,
            backing,
            state: AtomicU8::new(if kind == Kind::Async { PENDING } else { LIVE }),
            sync_memops: AtomicBool::new(false),
            name,
            ipc: None,
            vmm: None,
        });
        self.used[device as usize] += charge;
        self.dev.insert(a.base, a.clone());
        Ok(a)
    }

    /// Maps an allocation another process exported (IPC) at a fresh device address.
    pub fn insert_ipc(&mut self, ctx: u64, device: i32, size: usize, backing: Backing, key: (u32, u64)) -> Result<u64> {
        // Laid out as the exporter's: the data at the end of the memfd's pages.
        let reserved = backing.map_len + GAP;
        let lead = backing.map_len - round_up(size, ALIGN).unwrap_or(backing.map_len);
        let start = self
            .space()?
            .take(reserved, PAGE)
            .ok_or_else(|| err!(CUDA_ERROR_OUT_OF_MEMORY, "the device address range is exhausted"))?;
        let base = start + lead;
        let id = self.next_id();
        let a = Arc::new(Alloc {
            id,
            base: base as u64,
            size,
            reserved,
            lead,
            kind: Kind::Ipc,
            ctx,
            device,
            backing,
            state: AtomicU8::new(LIVE),
            sync_memops: AtomicBool::new(false),
            name: String::new(),
            ipc: Some(key),
            vmm: None,
        });
        self.dev.insert(a.base, a);
        Ok(base as u64)
    }

    /// Takes `len` bytes of the device address range aligned to `align` (a VMM reservation).
    pub fn reserve_range(&mut self, len: usize, align: usize) -> Result<usize> {
        self.space()?
            .take(len, align)
            .ok_or_else(|| err!(CUDA_ERROR_OUT_OF_MEMORY, "the device address range is exhausted ({len} bytes asked)"))
    }

    /// Gives a reservation's range back.
    pub fn release_range(&mut self, start: usize, len: usize) {
        if let Some(s) = self.space.as_mut() {
            s.release(start, len);
        }
    }

    /// Records a cuMemMap mapping (already built) in the table.
    pub fn insert_mapping(&mut self, a: Arc<Alloc>) {
        self.dev.insert(a.base, a);
    }

    /// The allocation containing `addr` in any state (None in gaps and outside).
    pub fn find_dev(&self, addr: u64) -> Option<&Arc<Alloc>> {
        let (_, a) = self.dev.range(..=addr).next_back()?;
        (addr < a.end()).then_some(a)
    }

    fn freed_at(&self, addr: u64) -> Option<(u64, usize)> {
        self.freed.iter().rev().copied().find(|&(b, s)| addr >= b && addr < b + s as u64)
    }

    /// Why `addr` is not usable device memory, in words.
    pub fn why_not_device(&self, addr: u64) -> String {
        self.not_device(addr, "address").why
    }

    /// Why `addr` is not usable device memory.
    fn not_device(&self, addr: u64, what: &str) -> crate::error::Error {
        if let Some(a) = self.dev.range(..=addr).next_back().map(|(_, a)| a) {
            if a.state() >= FREEING && addr < a.end() {
                return err!(
                    CUDA_ERROR_INVALID_VALUE,
                    "{what} {addr:#x} is in freed allocation {:#x}+{}",
                    a.base,
                    a.size
                );
            }
        }
        if let Some((b, s)) = self.freed_at(addr) {
            return err!(CUDA_ERROR_INVALID_VALUE, "{what} {addr:#x} is in freed allocation {b:#x}+{s}");
        }
        if self.in_device_range(addr) {
            return err!(
                CUDA_ERROR_INVALID_VALUE,
                "{what} {addr:#x} is not inside any allocation (a gap of the device address range)"
            );
        }
        err!(CUDA_ERROR_INVALID_VALUE, "{what} {addr:#x} is not device memory")
    }

    /// `len` bytes at `addr` wholly inside one allocation that is not freed.
    pub fn resolve_dev(&self, addr: u64, len: usize, what: &str) -> Result<(Arc<Alloc>, usize)> {
        let a = match self.find_dev(addr) {
            Some(a) if a.state() <= LIVE => a,
            _ => return Err(self.not_device(addr, what)),
        };
        let off = (addr - a.base) as usize;
        if len > a.size - off {
            bail!(
                CUDA_ERROR_INVALID_VALUE,
                "{len} bytes at {what} {addr:#x} cross the end of allocation {:#x}+{}",
                a.base,
                a.size
            );
        }
        Ok((a.clone(), off))
    }

    /// The pinned/registered host range containing `addr`.
    pub fn find_host(&self, addr: usize) -> Option<&HostRegion> {
        let (_, r) = self.host.range(..=addr).next_back()?;
        (addr < r.start + r.size).then_some(r)
    }

    /// Classifies `len` bytes at `addr`. Device-range addresses must lie wholly in one live
    /// allocation; host ranges are pinned only if wholly inside one pinned region.
    pub fn classify(&self, addr: u64, len: usize, what: &str) -> Result<Loc> {
        if addr == 0 {
            bail!(CUDA_ERROR_INVALID_VALUE, "{what} is NULL");
        }
        if self.in_device_range(addr) || self.find_dev(addr).is_some() {
            let (a, off) = self.resolve_dev(addr, len, what)?;
            return Ok(Loc::Dev(a, off));
        }
        let a = addr as usize;
        match self.find_host(a) {
            Some(r) if len <= r.start + r.size - a => Ok(Loc::Pinned(a)),
            _ => Ok(Loc::Pageable(a)),
        }
    }

    /// Removes the allocation based at `base` from the table (state FREED) and gives its
    /// address range back. Work still holding it fails when it runs.
    pub fn remove(&mut self, base: u64) -> Option<Arc<Alloc>> {
        let a = self.dev.remove(&base)?;
        a.set_state(FREED);
        if a.kind == Kind::Managed {
            alloc::unmap_fixed(a.base as usize, a.backing.map_len);
        }
        if !matches!(a.kind, Kind::Ipc | Kind::Vmm) {
            let charge = round_up(a.size, ALIGN).unwrap_or(0);
            self.used[a.device as usize] = self.used[a.device as usize].saturating_sub(charge);
        }
        if self.freed.len() == FREED_HISTORY {
            self.freed.pop_front();
        }
        self.freed.push_back((a.base, a.size));
        // A mapping's addresses stay with its reservation.
        if let (Some(s), false) = (self.space.as_mut(), a.kind == Kind::Vmm) {
            s.release(a.base as usize - a.lead, a.reserved);
        }
        Some(a)
    }

    /// The allocation `base` names for cuMemFree: its exact base, not freed, not IPC memory.
    pub fn check_free(&self, base: u64, what: &str) -> Result<Arc<Alloc>> {
        match self.dev.get(&base) {
            Some(a) if a.state() <= LIVE && !matches!(a.kind, Kind::Ipc | Kind::Vmm) => Ok(a.clone()),
            Some(a) if a.kind == Kind::Vmm => {
                bail!(CUDA_ERROR_INVALID_VALUE, "{what} {base:#x} was mapped by cuMemMap (cuMemUnmap it instead)")
            }
            Some(a) if a.kind == Kind::Ipc => {
                bail!(CUDA_ERROR_INVALID_VALUE, "{what} {base:#x} was opened by cuIpcOpenMemHandle (close it instead)")
            }
            Some(_) => bail!(CUDA_ERROR_INVALID_VALUE, "{what} {base:#x} is already freed"),
            None => match self.find_dev(base) {
                Some(a) => bail!(
                    CUDA_ERROR_INVALID_VALUE,
                    "{what} {base:#x} is inside allocation {:#x}+{}, not its base",
                    a.base,
                    a.size
                ),
                None => Err(self.not_device(base, what)),
            },
        }
    }

    /// Frees everything context `ctx` allocated (context destroyed).
    pub fn free_all_of(&mut self, ctx: u64) {
        let bases: Vec<u64> = self.dev.values().filter(|a| a.ctx == ctx).map(|a| a.base).collect();
        for b in bases {
            self.remove(b);
        }
        let hosts: Vec<usize> = self.host.values().filter(|r| r.ctx == ctx).map(|r| r.start).collect();
        for h in hosts {
            self.remove_host(h);
        }
    }

    /// Pinned host memory (cuMemHostAlloc): never page-aligned, like the real driver's
    /// sub-allocations: 256 bytes into a page-aligned block.
    pub fn alloc_host(&mut self, ctx: u64, device: i32, size: usize, flags: u32) -> Result<usize> {
        const OFFSET: usize = 256;
        let block_len = size
            .checked_add(OFFSET)
            .and_then(|n| round_up(n, PAGE))
            .ok_or_else(|| err!(CUDA_ERROR_OUT_OF_MEMORY, "{size} bytes"))?;
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                block_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!(CUDA_ERROR_OUT_OF_MEMORY, "mmap of {block_len} bytes: {}", std::io::Error::last_os_error());
        }
        let start = p as usize + OFFSET;
        let id = self.next_id();
        self.host
            .insert(start, HostRegion { start, size, block: Some((p as usize, block_len)), flags, ctx, device, id });
        Ok(start)
    }

    /// Records `size` bytes at `start` as registered (page-locked) host memory.
    pub fn register(&mut self, ctx: u64, device: i32, start: usize, size: usize, flags: u32) -> Result<()> {
        let end = start.checked_add(size).ok_or_else(|| err!(CUDA_ERROR_INVALID_VALUE, "range wraps"))?;
        if let Some((_, r)) = self.host.range(..end).next_back() {
            if r.start + r.size > start {
                bail!(
                    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                    "{size} bytes at {start:#x} overlap the pinned range {:#x}+{}",
                    r.start,
                    r.size
                );
            }
        }
        if self.in_device_range(start as u64) {
            bail!(CUDA_ERROR_INVALID_VALUE, "{start:#x} is device memory, not host memory");
        }
        let id = self.next_id();
        self.host.insert(start, HostRegion { start, size, block: None, flags, ctx, device, id });
        Ok(())
    }

    /// Forgets the host region starting at `start`, unmapping it if the simulator allocated it.
    pub fn remove_host(&mut self, start: usize) -> Option<HostRegion> {
        let r = self.host.remove(&start)?;
        if let Some((b, l)) = r.block {
            // SAFETY: the block was mapped by `alloc_host` and is unmapped once, here.
            unsafe { libc::munmap(b as *mut libc::c_void, l) };
        }
        Some(r)
    }
}
