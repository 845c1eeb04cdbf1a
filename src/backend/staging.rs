//! Device memory on the built-in backend, through host staging: each call's device
//! buffers are copied to host memory on the caller's stream (after the work queued
//! before the call), the host algorithm runs on the copies, and the results go back
//! on the same stream. Correct for every collective and every placement of ranks;
//! slow (two copies through PCIe), so NCCL and the one-GPU path take over where they
//! can. The host copies live in page-locked buffers kept for later calls (pageable
//! memory would be copied through the driver's own bounce buffers at a fraction of
//! the speed).

use crate::coll::Coll;
use crate::error::Result;
use crate::mem::{cuda, Placement};

/// A host copy of one call's device buffers.
pub struct Staged {
    ctx: usize,
    stream: usize,
    /// Host copy; `send`/`recv` of the call point into it while the host algorithm runs.
    buf: Pinned,
    /// Device range that `buf[recv_off..recv_off + recv_bytes]` mirrors.
    dev_recv: *mut u8,
    recv_off: usize,
    recv_bytes: usize,
}

/// Copies `c`'s device buffers to host memory and points `c` at the copies.
/// Buffers that overlap (in-place calls) share one copy, so aliasing is kept.
pub fn stage_in(c: &mut Coll, place: Placement, rank: usize, nranks: usize) -> Result<Staged> {
    let Placement::Device { ctx, .. } = place else {
        return Err(crate::error::Error::internal("stage_in on host memory"));
    };
    let (sb, rb) = c.extents(rank, nranks)?;
    let (s0, r0) = (c.send as usize, c.recv as usize);
    // One host range covering both buffers when they overlap, else two back to back.
    let overlap = sb > 0 && rb > 0 && s0 < r0 + rb && r0 < s0 + sb;
    let (lo, span) = if overlap {
        let lo = s0.min(r0);
        (lo, (s0 + sb).max(r0 + rb) - lo)
    } else {
        (0, sb + rb)
    };
    let _g = cuda::CtxGuard::enter(ctx)?;
    let buf = Pinned::take(span.max(1))?;
    let base = buf.ptr;
    let (send_off, recv_off) = if overlap { (s0 - lo, r0 - lo) } else { (0, sb) };
    // The receive buffer is copied in too: parts of it that the call does not write
    // (and in-place inputs) must come back unchanged.
    // SAFETY: the device ranges were validated for these sizes; buf holds span bytes
    // and lives until the copies are synchronised below.
    unsafe {
        if overlap {
            cuda::copy_dtoh_async(base, lo as *const u8, span, c.stream)?;
        } else {
            if sb > 0 {
                cuda::copy_dtoh_async(base.add(send_off), c.send, sb, c.stream)?;
            }
            if rb > 0 {
                cuda::copy_dtoh_async(base.add(recv_off), c.recv, rb, c.stream)?;
            }
        }
    }
    cuda::sync(c.stream)?;
    let staged = Staged { ctx, stream: c.stream, buf, dev_recv: c.recv, recv_off, recv_bytes: rb };
    let base = staged.buf.ptr;
    // SAFETY: offsets are within buf (computed from the extents above).
    unsafe {
        if sb > 0 {
            c.send = base.add(send_off);
        }
        if rb > 0 {
            c.recv = base.add(recv_off);
        }
    }
    Ok(staged)
}

impl Staged {
    /// Copies the result back to the device and waits for it (the host copy dies here).
    pub fn stage_out(self) -> Result<()> {
        if self.recv_bytes == 0 {
            return Ok(());
        }
        let _g = cuda::CtxGuard::enter(self.ctx)?;
        // SAFETY: dev_recv was validated for recv_bytes; buf is alive until the sync.
        unsafe { cuda::copy_htod_async(self.dev_recv, self.buf.ptr.add(self.recv_off), self.recv_bytes, self.stream)? };
        cuda::sync(self.stream)
    }
}

/// A page-aligned host buffer, page-locked where the driver allows (else plain
/// memory, which still works), returned to a pool on drop.
struct Pinned {
    ptr: *mut u8,
    len: usize,
    registered: bool,
}

// SAFETY: the buffer is owned memory; whoever holds the Pinned uses it alone.
unsafe impl Send for Pinned {}

/// Buffers kept for later calls: at most this many bytes together.
pub const POOL_MAX_BYTES: usize = 64 << 20;
static POOL: std::sync::Mutex<Vec<Pinned>> = std::sync::Mutex::new(Vec::new());

impl Pinned {
    /// A buffer of at least `len` bytes: the smallest kept one that fits, else a new one.
    fn take(len: usize) -> Result<Pinned> {
        {
            let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
            let best = pool.iter().enumerate().filter(|(_, b)| b.len >= len).min_by_key(|(_, b)| b.len).map(|(i, _)| i);
            if let Some(i) = best {
                return Ok(pool.swap_remove(i));
            }
        }
        // Rounded up so that slightly larger calls reuse it.
        let len = len.next_power_of_two().max(64 << 10);
        // SAFETY: a fresh anonymous private mapping; unmapped in free().
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(crate::error::Error::os(format!("mmap of {len} bytes for staging device memory")));
        }
        let ptr = p as *mut u8;
        // SAFETY: the range is this mapping, which stays until free() unregisters it.
        let registered = unsafe { cuda::register_host(ptr, len) }.is_ok();
        Ok(Pinned { ptr, len, registered })
    }

    fn free(self) {
        if self.registered {
            // SAFETY: registered in take(); no copy uses it any more (the stream was synchronised).
            let _ = unsafe { cuda::unregister_host(self.ptr as usize) };
        }
        // SAFETY: mapped in take(), unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
        std::mem::forget(self);
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let mine = Pinned { ptr: self.ptr, len: self.len, registered: self.registered };
        let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
        let kept: usize = pool.iter().map(|b| b.len).sum();
        if kept + mine.len <= POOL_MAX_BYTES {
            pool.push(mine);
        } else {
            drop(pool);
            mine.free();
        }
    }
}
