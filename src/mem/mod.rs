//! Memory: the one component that knows kinds of memory (UCC's `mc` idea).
//!
//! Allocation and release for `fcclMemAlloc*`/`fcclMemFree`, the kind of each
//! buffer ([`placement`]), the CUDA driver ([`cuda`], loaded at run time) and the
//! reduction kernels ([`reduce`], [`cuda_kernels`]: the `ferroccl-kernels` crate, which
//! the simulated GPU shares). Without CUDA every buffer is host memory.

pub mod copy;
pub mod cuda;
pub mod cuda_reduce;
pub mod fallible;
pub mod kernel_cache;
pub mod pinned;
pub mod pool;
pub mod shared;

/// The host reduction kernels and the CUDA sources of the device ones.
pub use ferroccl_kernels::{cuda_kernels, reduce};

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::Mutex;

/// Kinds of memory a buffer can be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Pageable host memory (anything the CUDA driver does not know).
    Host,
    /// Page-locked host memory registered with CUDA: the CPU uses it like Host.
    PinnedHost,
    /// CUDA device memory: only reachable through the driver.
    Device,
    /// CUDA managed memory: migrates; treated like device memory (stream-ordered).
    Managed,
}

impl MemKind {
    /// True for kinds the CPU may read and write directly.
    pub fn host_accessible(self) -> bool {
        matches!(self, MemKind::Host | MemKind::PinnedHost)
    }
}

/// Where one call's buffers live: all on the host, or all on one CUDA context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Host,
    /// Device or managed memory of context `ctx` on `device`.
    Device {
        device: i32,
        ctx: cuda::Ctx,
    },
}

/// The kind of one buffer. Free (one relaxed atomic load) when CUDA is absent.
#[inline]
pub fn kind_of(p: *const u8) -> Result<(MemKind, i32, cuda::Ctx)> {
    if p.is_null() || !cuda::active() {
        return Ok((MemKind::Host, -1, cuda::Ctx::NONE));
    }
    let mut i = cuda::pointer_info(p)?;
    if matches!(i.mem_type, 2 | 4) && i.ctx.is_none() && i.device >= 0 {
        // Memory mapped with cuMemMap (e.g. PyTorch's expandable segments) names no
        // context: use its device's primary context, as the runtime API does.
        i.ctx = cuda::primary_context(i.device)?;
    }
    Ok(match i.mem_type {
        2 if i.managed => (MemKind::Managed, i.device, i.ctx),
        2 => (MemKind::Device, i.device, i.ctx),
        1 => (MemKind::PinnedHost, -1, cuda::Ctx::NONE),
        // Unified (managed) memory may also report CU_MEMORYTYPE_UNIFIED (4).
        4 => (MemKind::Managed, i.device, i.ctx),
        _ => (MemKind::Host, -1, cuda::Ctx::NONE),
    })
}

/// The placement of one call's buffers (`(name, pointer)`, NULL ones ignored): all
/// host memory (pageable or pinned) or all device memory of one context, else
/// fcclInvalidArgument naming the buffers.
pub fn placement(bufs: &[(&str, *const u8)]) -> Result<Placement> {
    if !cuda::active() {
        return Ok(Placement::Host);
    }
    let mut first: Option<(&str, MemKind, Placement)> = None;
    for &(name, p) in bufs {
        if p.is_null() {
            continue;
        }
        let (kind, device, ctx) = kind_of(p)?;
        let pl = if kind.host_accessible() { Placement::Host } else { Placement::Device { device, ctx } };
        match first {
            None => first = Some((name, kind, pl)),
            Some((n0, k0, p0)) if p0 != pl => {
                return Err(Error::invalid_arg(format!(
                    "{n0} is {} but {name} is {}; one call's buffers must all be host memory or all device memory of one device",
                    describe(k0, p0),
                    describe(kind, pl)
                )))
            }
            Some(_) => {}
        }
    }
    Ok(first.map_or(Placement::Host, |f| f.2))
}

/// Refuses device memory for calls that only handle host memory so far (they
/// touch the bytes on the CPU). Free when CUDA is absent.
pub fn require_host(bufs: &[(&str, *const u8)], what: &str) -> Result<()> {
    if !cuda::active() {
        return Ok(());
    }
    for &(name, p) in bufs {
        let (kind, device, _) = kind_of(p)?;
        if !kind.host_accessible() {
            return Err(Error::unavailable(format!(
                "{name} is CUDA memory on device {device}, which {what} does not support yet; pass host memory"
            )));
        }
    }
    Ok(())
}

fn describe(k: MemKind, p: Placement) -> String {
    match (k, p) {
        (MemKind::Host, _) => "host memory".into(),
        (MemKind::PinnedHost, _) => "pinned host memory".into(),
        (MemKind::Device, Placement::Device { device, .. }) => format!("device memory on device {device}"),
        (_, Placement::Device { device, .. }) => format!("managed memory on device {device}"),
        _ => format!("{k:?}"),
    }
}

/// Allocations made by this library, so that fcclMemFree can refuse pointers it
/// did not hand out instead of corrupting the heap.
#[derive(Clone, Copy)]
enum Alloc {
    /// fcclMemAllocHost: page-locked with cuMemHostRegister when `registered`.
    Host { registered: bool },
    /// fcclMemAlloc, in CUDA context `ctx`.
    Device { ctx: cuda::Ctx },
}
static ALLOCS: Mutex<Option<HashMap<usize, Alloc>>> = Mutex::new(None);

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

fn check_size(size: usize) -> Result<()> {
    if size == 0 {
        return Err(Error::invalid_arg("size is 0; allocate at least one byte"));
    }
    if size > isize::MAX as usize {
        return Err(Error::invalid_arg(format!("size {size} is larger than the address space")));
    }
    Ok(())
}

fn record(p: *mut u8, a: Alloc) {
    ALLOCS.lock().unwrap().get_or_insert_with(HashMap::new).insert(p as usize, a);
}

/// Host allocations of at least this size are aligned to it and advised for
/// transparent huge pages: collectives stream through user buffers, and with 4 KiB
/// pages every 4 KiB is a TLB miss (a two-level walk under a hypervisor).
const HUGE_PAGE: usize = 2 << 20;

/// Page-aligned host memory; huge pages where the kernel gives them for 2 MiB and
/// more (see HUGE_PAGE); allocations of `shared::SHARE_MIN` and more are shared
/// memory that peers on this host read directly (single copy, see `shared`). When
/// the process uses CUDA the memory is also page-locked in place (cuMemHostRegister),
/// so device copies from and to it are fast and asynchronous; a process that never
/// used CUDA does not start it here.
pub fn alloc_host(size: usize) -> Result<*mut u8> {
    check_size(size)?;
    let huge = size >= HUGE_PAGE;
    let align = if huge { HUGE_PAGE } else { page_size() };
    let mut p: *mut u8 = std::ptr::null_mut();
    if size >= shared::SHARE_MIN && crate::env::single_copy() != crate::env::SingleCopy::Off {
        // Peers on this host read large messages straight out of it (mem::shared).
        if let Some(s) = shared::alloc(size, align, huge) {
            p = s;
        }
    }
    if p.is_null() {
        let mut raw: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: raw is a valid out-pointer; alignment is a power of two multiple of sizeof(void*).
        let rc = unsafe { libc::posix_memalign(&mut raw, align, size) };
        if rc != 0 || raw.is_null() {
            return Err(Error::system(format!("out of host memory allocating {size} bytes")));
        }
        if huge {
            // SAFETY: [raw, raw + size) is our fresh allocation; the advice changes no data.
            unsafe { libc::madvise(raw, size, libc::MADV_HUGEPAGE) };
        }
        p = raw as *mut u8;
    }
    let registered = cuda::active() && pin(p, size);
    record(p, Alloc::Host { registered });
    Ok(p)
}

/// Page-locks a fresh host allocation; a failure (a memlock limit, say) leaves it
/// pageable, which only makes device copies slower, and is logged once.
fn pin(p: *mut u8, size: usize) -> bool {
    // SAFETY: [p, p + size) is a fresh host allocation that stays mapped until free().
    match unsafe { cuda::register_host(p, size) } {
        Ok(()) => true,
        Err(e) => {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                crate::log::warn(format_args!(
                    "fcclMemAllocHost: {}; the memory stays pageable (device copies from it are slower)",
                    e.msg
                ))
            });
            false
        }
    }
}

/// CUDA device memory on the current device (fcclUnavailable without CUDA).
pub fn alloc_device(size: usize) -> Result<*mut u8> {
    cuda::driver().map_err(|e| {
        Error::unavailable(format!("{}; device memory cannot be allocated (fcclMemAllocHost gives host memory)", e.msg))
    })?;
    check_size(size)?;
    let (p, ctx) = cuda::alloc_device(size)?;
    record(p, Alloc::Device { ctx });
    Ok(p)
}

/// Frees memory from alloc_host/alloc_device; NULL is a no-op.
pub fn free(p: *mut u8) -> Result<()> {
    if p.is_null() {
        return Ok(());
    }
    let entry = ALLOCS.lock().unwrap().get_or_insert_with(HashMap::new).remove(&(p as usize));
    match entry {
        Some(Alloc::Host { registered }) => {
            if registered {
                // SAFETY: registered by alloc_host, unregistered once (removed from the map)
                // while still mapped. A failure leaves the pages locked until exit.
                if let Err(e) = unsafe { cuda::unregister_host(p as usize) } {
                    crate::log::warn(format_args!("fcclMemFree({p:p}): {}", e.msg));
                }
            }
            if !shared::free(p) {
                // SAFETY: p came from posix_memalign in alloc_host and is freed once (removed from the map).
                unsafe { libc::free(p as *mut libc::c_void) };
            }
            Ok(())
        }
        // SAFETY: p came from cuda::alloc_device with this context and is freed once (removed from the map).
        Some(Alloc::Device { ctx }) => unsafe { cuda::free_device(p as usize, ctx) },
        None => Err(Error::invalid_arg(format!(
            "pointer {p:p} was not allocated by fcclMemAlloc/fcclMemAllocHost (or was already freed)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_allocations_are_page_aligned_and_large_ones_huge_page_aligned() {
        for (size, align) in
            [(1usize, page_size()), (100_000, page_size()), (HUGE_PAGE, HUGE_PAGE), (3 << 20, HUGE_PAGE)]
        {
            let p = alloc_host(size).unwrap();
            assert_eq!(p as usize % align, 0, "{size} bytes at {p:p}");
            // SAFETY: p holds size bytes, just allocated.
            unsafe { std::ptr::write_bytes(p, 0xA5, size) };
            free(p).unwrap();
        }
    }
}
