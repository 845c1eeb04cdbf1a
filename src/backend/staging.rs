//! Device memory on the built-in backend, through host staging: each call's device
//! buffers are copied to host memory on the caller's stream (after the work queued
//! before the call), the host algorithm runs on the copies, and the results go back
//! on the same stream. Correct for every collective and every placement of ranks;
//! slow (two copies through PCIe), so the NCCL backend takes over where it can.

use crate::coll::Coll;
use crate::error::Result;
use crate::mem::{cuda, Placement};

/// A host copy of one call's device buffers.
pub struct Staged {
    ctx: usize,
    stream: usize,
    /// Host copy; `send`/`recv` of the call point into it while the host algorithm runs.
    buf: Vec<u8>,
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
    let mut buf = vec![0u8; span.max(1)];
    let base = buf.as_mut_ptr();
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
    let base = staged.buf.as_ptr() as *mut u8;
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
        unsafe {
            cuda::copy_htod_async(self.dev_recv, self.buf.as_ptr().add(self.recv_off), self.recv_bytes, self.stream)?
        };
        cuda::sync(self.stream)
    }
}
