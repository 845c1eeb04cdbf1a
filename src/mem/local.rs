//! Copies between buffers of one process (fcclLocal*): broadcast to several
//! buffers, scatter a tensor into chunks along a dimension, gather chunks back.
//! Device ids other than -1 need CUDA.

use crate::coll::ext::AxisLayout;
use crate::error::{Error, Result};

/// Refuses device ids (the fcclLocal* copies are host-only so far); -1 is host memory.
pub fn check_devices(devs: &[i32], what: &str) -> Result<()> {
    if let Some((i, d)) = devs.iter().enumerate().find(|(_, &d)| d != -1) {
        if *d < -1 {
            return Err(Error::invalid_arg(format!("{what}[{i}] = {d}; use -1 for host memory or a CUDA device id")));
        }
        return Err(Error::unavailable(format!(
            "{what}[{i}] = {d} is a CUDA device, but CUDA is not available; use -1 for host memory"
        )));
    }
    Ok(())
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
        None => Ok((0..n).map(|i| crate::backend::host::algorithms::part(along, n, i).1).collect()),
    }
}

/// Copies chunk i (rows `start..start+len` along the dimension) of `src` (layout `l`)
/// to the contiguous `dst`, or the reverse when `gather`.
///
/// # Safety
/// `src` holds the whole tensor of layout `l` (element size `es`), `dst` holds
/// `l.outer * len * l.inner` elements, and they do not overlap.
pub unsafe fn copy_chunk(src: *mut u8, dst: *mut u8, l: AxisLayout, es: usize, start: usize, len: usize, gather: bool) {
    let row = len * l.inner * es;
    for o in 0..l.outer {
        let big = (o * l.along + start) * l.inner * es;
        let small = o * row;
        // SAFETY: both ranges lie inside their buffers (caller's contract).
        unsafe {
            if gather {
                std::ptr::copy_nonoverlapping(dst.add(small), src.add(big), row);
            } else {
                std::ptr::copy_nonoverlapping(src.add(big), dst.add(small), row);
            }
        }
    }
}
