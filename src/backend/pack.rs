//! Rearranging a call's input so a backend can serve it as a plain collective: a
//! reduce_scatter along an axis > 0 becomes a reduce_scatter of a rank-major copy.

use crate::coll::Coll;
use crate::error::{Error, Result};
use crate::mem::{cuda, fallible, pool::PooledBuf, Placement};
use std::sync::Arc;

/// `c`, a reduce_scatter along an axis (see `coll::ext::reduce_scatter_axis_strided`),
/// as a plain reduce_scatter of a packed copy of its input: made on the CPU for host
/// memory, with strided copies on its stream for device memory.
pub fn pack_reduce_scatter(c: &Coll, nranks: usize) -> Result<Coll> {
    // SAFETY: a validated call's sendbuff holds the whole tensor in its memory.
    unsafe { pack_reduce_scatter_at(c, nranks, None) }
}

/// [`pack_reduce_scatter`] for a call that is not validated yet, along `axis` when
/// the caller knows it (for the error when there is no memory for the copy).
///
/// # Safety
/// `c.send` holds the whole tensor (`c.count * nranks` elements) in `c.placement`.
pub unsafe fn pack_reduce_scatter_at(c: &Coll, nranks: usize, axis: Option<usize>) -> Result<Coll> {
    let st = c.strided.ok_or_else(|| Error::internal("packing a reduce_scatter that is not along an axis"))?;
    let (es, send) = (c.dtype.size(), c.send);
    let (share, row, total) = (st.block, st.block * nranks, st.outer * st.block * nranks);
    let mut out = Coll { strided: None, ..c.clone() };
    // Rank r's block of outer row o moves from (o * row + r * share) to
    // (r * outer + o) * share: nranks strided copies of `outer` rows.
    match c.placement {
        Placement::Host => {
            let mut buf = PooledBuf::try_take(total * es).ok_or_else(|| {
                let along = axis.map_or("an axis > 0".to_string(), |a| format!("axis {a}"));
                fallible::out_of_memory(
                    total * es,
                    format_args!("scratch for packing the blocks along {along} (a copy of the input)"),
                    "use a smaller count, or reduce-scatter along axis 0, which needs no copy",
                )
            })?;
            let packed = &mut buf.as_mut_slice()[..total * es];
            for r in 0..nranks {
                for o in 0..st.outer {
                    let from = (o * row + r * share) * es;
                    let to = (r * st.outer * share + o * share) * es;
                    // SAFETY: sendbuff holds the whole tensor (the caller's contract);
                    // `from..from + share*es` lies inside it.
                    let src = unsafe { std::slice::from_raw_parts(send.add(from), share * es) };
                    packed[to..to + share * es].copy_from_slice(src);
                }
            }
            out.send = buf.as_ptr();
            out.keep = Some(Arc::new(buf));
        }
        Placement::Device { ctx, .. } => {
            let packed = cuda::Scratch::new(total * es, ctx, c.stream)?;
            let _g = cuda::CtxGuard::enter(ctx)?;
            for r in 0..nranks {
                // SAFETY: sendbuff holds the whole tensor on the device (caller's contract)
                // and the scratch as many bytes; every row below lies inside each.
                unsafe {
                    cuda::copy_2d_dtod_async(
                        packed.ptr().add(r * st.outer * share * es),
                        share * es,
                        send.add(r * share * es),
                        row * es,
                        share * es,
                        st.outer,
                        c.stream,
                    )?
                };
            }
            out.send = packed.ptr();
            out.keep = Some(Arc::new(packed));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::ext::{reduce_scatter_axis_strided, AxisLayout};
    use crate::mem::fallible::FAIL_ABOVE;
    use crate::types::{DataType, RedOp};

    /// No memory for the packed copy: fcclSystemError naming its size and the axis.
    #[test]
    fn no_memory_for_the_packed_copy_is_an_error_naming_size_and_axis() {
        let l = AxisLayout { outer: 2, along: 4, inner: 40 << 20 };
        let send = std::ptr::NonNull::<u8>::dangling().as_ptr();
        let c = reduce_scatter_axis_strided(send, send, l, DataType::Float32, RedOp::Sum, 2).expect("valid");
        FAIL_ABOVE.with(|f| f.set(1 << 20));
        // SAFETY: the copy is refused before the (dangling) input is read.
        let e = unsafe { pack_reduce_scatter_at(&c, 2, Some(1)) }.expect_err("no memory");
        FAIL_ABOVE.with(|f| f.set(usize::MAX));
        assert_eq!(e.code, crate::error::Code::SystemError);
        let bytes = l.total() * 4;
        assert!(e.msg.contains(&format!("cannot allocate {bytes} bytes")), "{}", e.msg);
        assert!(e.msg.contains("along axis 1") && e.msg.contains("axis 0"), "{}", e.msg);
    }
}
