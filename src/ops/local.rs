//! Copies between buffers of one process (fcclLocal*): broadcast to several
//! buffers, scatter a tensor into chunks along a dimension, gather chunks back.
//! Device ids other than -1 need CUDA; copies that involve a device go through
//! the driver (cuMemcpy), the others are plain memory copies.

use crate::coll::ext::AxisLayout;
use crate::error::{Error, Result};
use crate::mem::cuda;

/// Checks device ids (-1 is host memory) and returns the first CUDA device among
/// them, if any; a device id needs CUDA (fcclUnavailable without it).
pub fn check_devices(devs: &[i32], what: &str) -> Result<Option<i32>> {
    let mut first = None;
    for (i, &d) in devs.iter().enumerate() {
        if d == -1 {
            continue;
        }
        if d < -1 {
            return Err(Error::invalid_arg(format!("{what}[{i}] = {d}; use -1 for host memory or a CUDA device id")));
        }
        if !cuda::active() {
            return Err(Error::unavailable(format!(
                "{what}[{i}] = {d} is a CUDA device, but CUDA is not available; use -1 for host memory"
            )));
        }
        let n = cuda::device_count();
        if d as usize >= n {
            return Err(Error::invalid_arg(format!("{what}[{i}] = {d}, but this process sees {n} CUDA device(s)")));
        }
        first.get_or_insert(d);
    }
    Ok(first)
}

/// How the fcclLocal* calls copy bytes: memcpy on the host, cuMemcpy when a device
/// is involved (in that device's primary context).
pub enum Copier {
    Host,
    Cuda { ctx: cuda::Ctx },
}

impl Copier {
    /// The copier for calls whose first CUDA device (if any) is `dev`.
    pub fn for_device(dev: Option<i32>) -> Result<Copier> {
        Ok(match dev {
            None => Copier::Host,
            Some(d) => Copier::Cuda { ctx: cuda::primary_context(d)? },
        })
    }

    /// Copies `bytes` from `src` to `dst`.
    ///
    /// # Safety
    /// Both ranges are valid for `bytes` (host memory for `Copier::Host`).
    pub unsafe fn copy(&self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
        match self {
            // SAFETY: guaranteed by the caller; ptr::copy tolerates overlap.
            Copier::Host => unsafe { std::ptr::copy(src, dst, bytes) },
            // SAFETY: guaranteed by the caller.
            Copier::Cuda { ctx } => unsafe { cuda::copy_sync(dst, src, bytes, *ctx)? },
        }
        Ok(())
    }
}

/// Chunk sizes along the split dimension: given, or as even as possible (the first
/// `along % n` chunks get one more).
pub fn chunk_sizes(along: usize, n: usize, given: Option<&[usize]>) -> Result<Vec<usize>> {
    match given {
        Some(g) => {
            let sum = g.iter().try_fold(0usize, |a, &c| a.checked_add(c));
            if sum != Some(along) {
                return Err(Error::invalid_arg(format!(
                    "chunkSizes {:?} sum to {}, but shape[dim] is {along}; they must add up to it",
                    &g[..g.len().min(16)],
                    sum.map_or("more than size_t".to_string(), |s| s.to_string())
                )));
            }
            Ok(g.to_vec())
        }
        None => Ok((0..n).map(|i| crate::coll::part(along, n, i).1).collect()),
    }
}

/// Copies chunk i (rows `start..start+len` along the dimension) of `src` (layout `l`)
/// to the contiguous `dst`, or the reverse when `gather`.
///
/// # Safety
/// `src` holds the whole tensor of layout `l` (element size `es`), `dst` holds
/// `l.outer * len * l.inner` elements, and they do not overlap.
#[allow(clippy::too_many_arguments)]
pub unsafe fn copy_chunk(
    src: *mut u8,
    dst: *mut u8,
    l: AxisLayout,
    es: usize,
    start: usize,
    len: usize,
    gather: bool,
    copier: &Copier,
) -> Result<()> {
    let row = len * l.inner * es;
    for o in 0..l.outer {
        let big = (o * l.along + start) * l.inner * es;
        let small = o * row;
        // SAFETY: both ranges lie inside their buffers (caller's contract).
        unsafe {
            if gather {
                copier.copy(src.add(big), dst.add(small), row)?;
            } else {
                copier.copy(dst.add(small), src.add(big), row)?;
            }
        }
    }
    Ok(())
}
