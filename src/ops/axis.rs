//! Calls along a tensor axis that need more than a descriptor: reduce_scatter along
//! an axis > 0 packs its input first, so each rank's share is contiguous.

use crate::backend::pack::pack_reduce_scatter_at;
use crate::coll::ext::{reduce_scatter_axis_strided, AxisLayout};
use crate::coll::Coll;
use crate::error::Result;
use crate::mem::Placement;
use crate::types::{DataType, RedOp};

/// The reduce_scatter that gives rank r block r along `axis` of the reduced tensor.
/// Axis 0 is a plain reduce_scatter; otherwise the input is first packed rank-major
/// (one copy of the input, owned by the call) so each rank's share is contiguous:
/// on the CPU for host memory, with strided copies on `stream` for device memory.
/// Fails, with nothing counted or sent, when there is no memory for the copy.
///
/// # Safety
/// `send` is NULL or holds the whole tensor of layout `l`, in memory of `place`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn reduce_scatter_axis(
    send: *const u8,
    recv: *mut u8,
    l: AxisLayout,
    axis: usize,
    dtype: DataType,
    op: RedOp,
    nranks: usize,
    place: Placement,
    stream: crate::mem::cuda::Stream,
) -> Result<Coll> {
    let mut c = reduce_scatter_axis_strided(send, recv, l, dtype, op, nranks)?;
    if c.strided.is_none() || send.is_null() {
        c.strided = None;
        return Ok(c);
    }
    c.placement = place;
    c.stream = stream;
    // SAFETY: forwarded contract.
    unsafe { pack_reduce_scatter_at(&c, nranks, Some(axis)) }
}
