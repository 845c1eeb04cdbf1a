//! Device allocations: each is backed by its own memfd, mapped read-write at a private
//! alias address that only the simulator uses (copies, memsets, kernels, memory operations).

use crate::error::{bail, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use super::space::PAGE;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// cuMemAlloc.
    Device,
    /// cuMemAllocAsync / cuMemAllocFromPoolAsync.
    Async,
    /// cuMemAllocManaged: also mapped at its device address for the host.
    Managed,
    /// Another process's allocation opened with cuIpcOpenMemHandle.
    Ipc,
    /// A mapping of a physical allocation (cuMemCreate or imported) made with cuMemMap.
    Vmm,
}

/// Allocation states, in order. Work that runs on the executor needs `LIVE`.
pub const PENDING: u8 = 0; // cuMemAllocAsync: the stream has not reached the allocation yet
pub const LIVE: u8 = 1;
pub const FREEING: u8 = 2; // cuMemFreeAsync: freed for the host, the stream has not reached it
pub const FREED: u8 = 3;

/// A memfd and its alias mapping.
pub struct Backing {
    pub alias: *mut u8,
    pub map_len: usize,
    /// Kept open while an allocation may be exported (cuMemAlloc memory, IPC events).
    pub fd: Option<OwnedFd>,
}

// SAFETY: the alias is a process-wide shared mapping; every access through it goes through
// raw pointers whose bounds were checked against the allocation.
unsafe impl Send for Backing {}
// SAFETY: as above.
unsafe impl Sync for Backing {}

impl Drop for Backing {
    fn drop(&mut self) {
        // SAFETY: alias/map_len are exactly the mapping made in `create`/`open`, unmapped once.
        unsafe { libc::munmap(self.alias.cast(), self.map_len) };
    }
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// Raises the soft limit on open files to the hard one (memfds of many allocations).
fn raise_fd_limit() -> bool {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid out-parameter.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 || r.rlim_cur >= r.rlim_max {
        return false;
    }
    r.rlim_cur = r.rlim_max;
    // SAFETY: `r` is a valid in-parameter.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) == 0 }
}

impl Backing {
    /// A new memfd named `name` of at least `size` bytes, mapped at a fresh alias address.
    pub fn create(name: &str, size: usize, keep_fd: bool) -> Result<Backing> {
        let cname = std::ffi::CString::new(name).expect("memfd names have no NUL");
        let mut fd;
        loop {
            // SAFETY: a NUL-terminated name; the flags are valid.
            fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
            let e = std::io::Error::last_os_error().raw_os_error();
            if fd >= 0 || e != Some(libc::EMFILE) || !raise_fd_limit() {
                break;
            }
        }
        if fd < 0 {
            bail!(CUDA_ERROR_OUT_OF_MEMORY, "{}", os_err("memfd_create"));
        }
        // SAFETY: fd was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let map_len = super::space::round_up(size.max(1), PAGE).unwrap_or(usize::MAX);
        // SAFETY: a valid fd; the length is checked by the kernel.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), map_len as libc::off_t) } != 0 {
            bail!(CUDA_ERROR_OUT_OF_MEMORY, "{}", os_err("ftruncate"));
        }
        let b = Backing::map(fd, map_len)?;
        Ok(if keep_fd { b } else { b.without_fd() })
    }

    /// Maps `map_len` bytes of `fd` read-write at an address the kernel chooses.
    pub fn map(fd: OwnedFd, map_len: usize) -> Result<Backing> {
        // SAFETY: a fresh shared mapping of a valid fd at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!(CUDA_ERROR_OUT_OF_MEMORY, "{}", os_err("mmap of the allocation's memfd"));
        }
        Ok(Backing { alias: p.cast(), map_len, fd: Some(fd) })
    }

    /// Closes the fd (the mapping stays).
    pub fn without_fd(mut self) -> Backing {
        self.fd = None;
        self
    }

    /// Also maps the memfd at `addr` (inside the device reservation) for host access.
    pub fn map_fixed_at(&self, addr: usize) -> Result<()> {
        let Some(fd) = &self.fd else { bail!(CUDA_ERROR_UNKNOWN, "no fd to map") };
        // SAFETY: `addr..addr+map_len` is a range of our own PROT_NONE reservation that no
        // other allocation uses; MAP_FIXED replaces only that.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                self.map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!(CUDA_ERROR_OUT_OF_MEMORY, "{}", os_err("mmap of managed memory"));
        }
        Ok(())
    }
}

/// Maps `a`'s memory also at `start` (its pages in the device reservation) for a kernel.
pub fn map_alias_at(a: &Alloc, start: usize) -> std::result::Result<(), String> {
    // SAFETY: old size 0 on a shared mapping makes a second mapping of the same pages;
    // `start..start + map_len` is `a`'s own range of the reservation, which MAP_FIXED
    // replaces (unmap_fixed puts PROT_NONE back).
    let p = unsafe {
        libc::mremap(
            a.backing.alias.cast(),
            0,
            a.backing.map_len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            start as *mut libc::c_void,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!(
            "cannot map allocation {:#x}+{} for the kernel: {}",
            a.base,
            a.size,
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Puts `PROT_NONE` back over `addr..addr+len` of the reservation (after managed memory).
pub fn unmap_fixed(addr: usize, len: usize) {
    // SAFETY: the range belongs to our reservation and to the allocation being freed.
    unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
}

/// Identity of an allocation opened by IPC: (exporter pid, exporter's allocation id).
pub type IpcKey = (u32, u64);

pub struct Alloc {
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`: unique in the process.
    pub id: u64,
    /// Device address and size asked for.
    pub base: u64,
    pub size: usize,
    /// Address range taken from the reservation (its pages and a guard page after them).
    pub reserved: usize,
    /// Offset of `base` in its first page (and of the data in the memfd): allocations end
    /// at the end of their pages, so that a kernel running past one faults.
    pub lead: usize,
    pub kind: Kind,
    pub ctx: u64,
    /// Visible device ordinal.
    pub device: i32,
    pub backing: Backing,
    pub state: AtomicU8,
    pub sync_memops: AtomicBool,
    /// The memfd name (checked by importers) for exported allocations.
    pub name: String,
    pub ipc: Option<IpcKey>,
    /// Kind::Vmm: the mapping's physical allocation and who may access it.
    pub vmm: Option<VmmMap>,
}

/// What a cuMemMap mapping adds to an allocation.
pub struct VmmMap {
    /// The physical allocation's handle in this process (cuMemRetainAllocationHandle).
    pub handle: u64,
    /// Bit d: visible device d may read (cuMemSetAccess READ or READWRITE).
    pub read: std::sync::atomic::AtomicU64,
    /// Bit d: visible device d may write (READWRITE).
    pub write: std::sync::atomic::AtomicU64,
    /// CU_MEM_HANDLE_TYPE_* bits the allocation was created with.
    pub handle_types: u32,
    /// Keeps the physical memory alive while mapped (cuMemRelease may come first).
    pub _phys: Arc<crate::vmm::Phys>,
}

impl Alloc {
    pub fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    pub fn set_state(&self, s: u8) {
        self.state.store(s, Ordering::Release);
    }

    /// The alias address of byte `off` (bounds checked by the caller).
    pub fn ptr(&self, off: usize) -> *mut u8 {
        debug_assert!(off <= self.size);
        self.backing.alias.wrapping_add(self.lead + off)
    }

    /// The allocation's pages in the device reservation: (start, length).
    pub fn pages(&self) -> (usize, usize) {
        (self.base as usize - self.lead, self.backing.map_len)
    }

    pub fn end(&self) -> u64 {
        self.base + self.size as u64
    }

    /// Why work of visible `device` may not touch this allocation (a mapping whose
    /// access was not set for it), or None.
    pub fn denied(&self, device: Option<i32>, write: bool) -> Option<String> {
        let v = self.vmm.as_ref()?;
        let mask = if write { v.write.load(Ordering::Acquire) } else { v.read.load(Ordering::Acquire) };
        let ok = match device {
            Some(d) => mask & (1u64 << d) != 0,
            None => mask != 0,
        };
        (!ok).then(|| {
            format!(
                "mapping {:#x}+{} is not accessible{} (cuMemSetAccess was not called for it)",
                self.base,
                self.size,
                device.map_or(String::new(), |d| format!(" to device {d}"))
            )
        })
    }
}
