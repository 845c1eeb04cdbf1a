//! Calls along a tensor axis that need more than a descriptor: reduce_scatter along
//! an axis > 0 packs its input first, so each rank's share is contiguous.

use crate::coll::ext::AxisLayout;
use crate::coll::{Coll, CollKind};
use crate::error::{Error, Result};
use crate::mem::{cuda, Placement};
use crate::types::{DataType, RedOp};
use std::sync::Arc;

/// The reduce_scatter that gives rank r block r along `axis` of the reduced tensor.
/// Axis 0 is a plain reduce_scatter; otherwise the input is first packed rank-major
/// (one copy of the input, owned by the call) so each rank's share is contiguous:
/// on the CPU for host memory, with strided copies on `stream` for device memory.
///
/// # Safety
/// `send` is NULL or holds the whole tensor of layout `l`, in memory of `place`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn reduce_scatter_axis(
    send: *const u8,
    recv: *mut u8,
    l: AxisLayout,
    dtype: DataType,
    op: RedOp,
    nranks: usize,
    place: Placement,
    stream: usize,
) -> Result<Coll> {
    if l.along % nranks != 0 {
        return Err(Error::invalid_arg(format!(
            "shape[axis] = {} does not divide by the {nranks} ranks of the communicator; each rank gets shape[axis]/nranks",
            l.along
        )));
    }
    let share = l.along / nranks * l.inner; // elements of one rank's block per outer row
    let mut c = Coll::new(CollKind::ReduceScatter, send, recv, l.outer * share, dtype);
    c.op = op;
    if l.outer <= 1 || l.total() == 0 || send.is_null() {
        return Ok(c);
    }
    let es = dtype.size();
    let row = l.along * l.inner;
    // Rank r's block of outer row o moves from (o * row + r * share) to
    // (r * outer + o) * share: nranks strided copies of `outer` rows.
    match place {
        Placement::Host => {
            let mut buf = crate::mem::pool::PooledBuf::take(l.total() * es);
            let packed = &mut buf.as_mut_slice()[..l.total() * es];
            for r in 0..nranks {
                for o in 0..l.outer {
                    let from = (o * row + r * share) * es;
                    let to = (r * l.outer * share + o * share) * es;
                    // SAFETY: sendbuff holds the whole tensor (the caller's contract);
                    // `from..from + share*es` lies inside it.
                    let src = unsafe { std::slice::from_raw_parts(send.add(from), share * es) };
                    packed[to..to + share * es].copy_from_slice(src);
                }
            }
            c.send = buf.as_ptr();
            c.keep = Some(Arc::new(buf));
        }
        Placement::Device { ctx, .. } => {
            let packed = cuda::Scratch::new(l.total() * es, ctx, stream)?;
            let _g = cuda::CtxGuard::enter(ctx)?;
            for r in 0..nranks {
                // SAFETY: sendbuff holds the whole tensor on the device (caller's contract)
                // and the scratch as many bytes; every row below lies inside each.
                unsafe {
                    cuda::copy_2d_dtod_async(
                        packed.ptr().add(r * l.outer * share * es),
                        share * es,
                        send.add(r * share * es),
                        row * es,
                        share * es,
                        l.outer,
                        stream,
                    )?
                };
            }
            c.send = packed.ptr();
            c.keep = Some(Arc::new(packed));
        }
    }
    Ok(c)
}
