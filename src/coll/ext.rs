//! Descriptors of the extensions beyond NCCL: tensor-axis layouts and the planning
//! helpers for frameworks. The calls that pack, bucket or copy are in `crate::ops`.

use super::{Coll, CollKind, Strided};
use crate::error::{Error, Result};
use crate::types::{DataType, RedOp};

/// A row-major tensor seen around one axis: `outer` x `along` x `inner` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AxisLayout {
    pub outer: usize,
    pub along: usize,
    pub inner: usize,
}

impl AxisLayout {
    pub fn total(&self) -> usize {
        self.outer * self.along * self.inner
    }
}

/// Checks a shape and an axis and splits the tensor around the axis.
pub fn axis_layout(shape: &[usize], axis: i32, dtype: DataType) -> Result<AxisLayout> {
    let nd = shape.len();
    if nd == 0 {
        return Err(Error::invalid_arg("ndims is 0; a tensor has at least one dimension"));
    }
    let axis = usize::try_from(axis).ok().filter(|&a| a < nd).ok_or_else(|| {
        Error::invalid_arg(format!("axis {axis} out of range for a tensor of {nd} dimensions (valid: 0..{})", nd - 1))
    })?;
    let mut total: usize = dtype.size();
    for (i, &d) in shape.iter().enumerate() {
        total = total.checked_mul(d).filter(|&t| t <= isize::MAX as usize).ok_or_else(|| {
            Error::invalid_arg(format!(
                "shape[{i}] = {d} makes the tensor's byte size overflow (shape {:?} of {dtype})",
                &shape[..nd.min(8)]
            ))
        })?;
    }
    Ok(AxisLayout {
        outer: shape[..axis].iter().product(),
        along: shape[axis],
        inner: shape[axis + 1..].iter().product(),
    })
}

/// The all_gather that gathers `shape` tensors along `axis`: rank r's block lands at
/// offset r * shape[axis] along the axis. Axis 0 (or any axis with nothing before it)
/// is a plain all_gather, with no extra copy.
pub fn all_gather_axis(send: *const u8, recv: *mut u8, l: AxisLayout, dtype: DataType) -> Coll {
    let mut c = Coll::new(CollKind::AllGather, send, recv, l.total(), dtype);
    if l.outer > 1 {
        c.strided = Some(Strided { outer: l.outer, block: l.along * l.inner });
    }
    c
}

/// The reduce_scatter that gives rank r block r along `axis` of the reduced tensor,
/// unpacked: with `strided`, each rank's input is `outer` rows of nranks blocks of
/// `block` elements and rank r gets block r of every row (the device path for ranks on
/// one GPU serves it so, with 2D copies); axis 0 is a plain reduce_scatter.
pub fn reduce_scatter_axis_strided(
    send: *const u8,
    recv: *mut u8,
    l: AxisLayout,
    dtype: DataType,
    op: RedOp,
    nranks: usize,
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
    if l.outer > 1 && l.total() > 0 {
        c.strided = Some(Strided { outer: l.outer, block: share });
    }
    Ok(c)
}

/// fcclCollectiveCounts: elements a rank must allocate for the NCCL-style call.
pub fn collective_counts(coll: i32, count: usize, nranks: usize, rank: usize, root: usize) -> Result<(usize, usize)> {
    let n = |c: usize| {
        c.checked_mul(nranks).ok_or_else(|| Error::invalid_arg(format!("count {c} * nranks {nranks} overflows size_t")))
    };
    let is_root = rank == root;
    Ok(match coll {
        0 => (count, count),
        1 => (if is_root { count } else { 0 }, count),
        2 => (count, if is_root { count } else { 0 }),
        3 => (count, n(count)?),
        4 => (n(count)?, count),
        5 => (n(count)?, n(count)?),
        6 => (count, if is_root { n(count)? } else { 0 }),
        7 => (if is_root { n(count)? } else { 0 }, count),
        c => return Err(Error::invalid_arg(format!("coll {c} is not a fcclCollective_t (valid: 0..7)"))),
    })
}

/// fcclCollectiveAdjoint: the collective that computes a collective's gradient.
pub fn collective_adjoint(coll: i32) -> Result<i32> {
    Ok(match coll {
        0 => 0,
        1 => 2,
        2 => 1,
        3 => 4,
        4 => 3,
        5 => 5,
        6 => 7,
        7 => 6,
        c => return Err(Error::invalid_arg(format!("coll {c} is not a fcclCollective_t (valid: 0..7)"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_layout_names_bad_dimensions() {
        let l = axis_layout(&[2, 3, 4], 1, DataType::Float32).unwrap();
        assert_eq!(l, AxisLayout { outer: 2, along: 3, inner: 4 });
        assert!(axis_layout(&[], 0, DataType::Float32).unwrap_err().msg.contains("ndims"));
        assert!(axis_layout(&[2, 3], 2, DataType::Float32).unwrap_err().msg.contains("axis 2 out of range"));
        assert!(axis_layout(&[2, 3], -1, DataType::Float32).is_err());
        let e = axis_layout(&[2, usize::MAX / 2, 3], 0, DataType::Float32).unwrap_err();
        assert!(e.msg.contains("shape[1]"), "{}", e.msg);
    }

    #[test]
    fn adjoints_pair_up() {
        for c in 0..8 {
            assert_eq!(collective_adjoint(collective_adjoint(c).unwrap()).unwrap(), c);
        }
        assert!(collective_adjoint(8).is_err());
        assert_eq!(collective_counts(6, 3, 4, 0, 0).unwrap(), (3, 12));
        assert_eq!(collective_counts(6, 3, 4, 1, 0).unwrap(), (3, 0));
    }
}
