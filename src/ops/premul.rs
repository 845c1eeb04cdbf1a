//! NCCL's PreMulSum operator: the sum over ranks of each rank's input times a scalar.
//! The product is taken when the call is made, into a copy the call owns, so the sum
//! then runs, queues in a group or goes to the progress thread like any sum.

use crate::coll::Coll;
use crate::comm::Comm;
use crate::error::Result;
use crate::mem::{cuda, cuda_reduce, Placement};
use std::sync::Arc;

/// A PreMulSum operator's scalar: its bytes (one element, native byte order), or the
/// address of host or device memory to read them from when the call is made.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    Bytes([u8; 8]),
    At(*const u8),
}

/// Replaces the input of `c` (a validated sum of `comm`, queued on `stream`) by its
/// product with `scalar`, which the call keeps alive (`c.keep`). Host memory is
/// multiplied on the CPU; device memory by a kernel on `stream`, into device memory
/// the communicator lends call by call (plain cuMemAlloc memory, so the GPU-to-GPU
/// path shares it with peers once and keeps the mapping), with a scalar in device
/// memory read by that kernel: the host waits for nothing.
///
/// # Safety
/// The buffers of `c` keep the matching collective's contract (its input readable for
/// the call's extent); a `Scalar::At` points to one element of `c.dtype`.
pub unsafe fn multiply(c: &mut Coll, comm: &Comm, scalar: Scalar, stream: cuda::Stream) -> Result<()> {
    let size = c.dtype.size();
    let (bytes, _) = c.extents(comm.rank, comm.nranks)?;
    let place = crate::mem::placement(&c.buffers(comm.rank, comm.nranks)?)?;
    let mut sc = [0u8; 8];
    let mut on_device = None;
    match scalar {
        Scalar::Bytes(b) => sc = b,
        Scalar::At(p) => match crate::mem::kind_of(p)? {
            (k, _, _) if k.host_accessible() => {
                // SAFETY: host memory holding one element (the caller's contract).
                unsafe { std::ptr::copy_nonoverlapping(p, sc.as_mut_ptr(), size) }
            }
            // The scaling kernel reads it where it lies.
            (_, _, ctx) if matches!(place, Placement::Device { ctx: c, .. } if c == ctx) => on_device = Some(p),
            (_, _, ctx) => {
                let _g = cuda::CtxGuard::enter(ctx)?;
                // SAFETY: one element of device memory; `sc` is waited for below.
                unsafe { cuda::copy_dtoh_async(sc.as_mut_ptr(), p, size, stream)? };
                cuda::sync(stream)?;
            }
        },
    }
    // u64 words: the copies are aligned for every element type.
    let mut scaled = vec![0u64; bytes.div_ceil(8)];
    if bytes == 0 {
        // Nothing to read: the call moves no input.
    } else if place == Placement::Host {
        // SAFETY: validate() checked the input non-NULL for `bytes` > 0, and the caller's
        // contract makes it readable for the call's extent (host memory).
        let src = unsafe { std::slice::from_raw_parts(c.send, bytes) };
        // SAFETY: `scaled` holds at least `bytes` bytes; u8 has no alignment.
        let dst = unsafe { std::slice::from_raw_parts_mut(scaled.as_mut_ptr().cast::<u8>(), bytes) };
        crate::mem::reduce::pre_multiply(c.dtype, &sc[..size], src, dst);
    } else if let Placement::Device { ctx, device } = place {
        let lease = comm.products.take(bytes, ctx, stream)?;
        let s = match on_device {
            Some(p) => cuda_reduce::Scalar::At(p),
            None => cuda_reduce::Scalar::Bits(u64::from_ne_bytes(sc)),
        };
        // SAFETY: the input is device memory of `bytes` in `ctx` (the caller's contract;
        // placement() found it there), the lease as many, lent until the call's work is
        // queued; an `At` scalar is one element in `ctx`.
        unsafe { cuda_reduce::scale(ctx, device, c.dtype, lease.ptr(), c.send, bytes / size, s, stream)? };
        c.send = lease.ptr();
        c.keep = Some(Arc::new(lease));
        return Ok(());
    }
    // The heap buffer does not move when the Vec moves into the Arc.
    c.send = scaled.as_ptr().cast();
    c.keep = Some(Arc::new(scaled));
    Ok(())
}
