//! Reading C arguments: enum values, ranks, counts and arrays, each refused with a
//! message that names the argument and its valid range.

use super::{fcclDataType_t, fcclRedOp_t};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::types::{DataType, RedOp};
use std::os::raw::c_int;

/// A fcclDataType_t value as the core's type.
pub(super) fn dtype(v: fcclDataType_t) -> Result<DataType> {
    DataType::try_from(v).map_err(|v| {
        Error::invalid_arg(format!("datatype {v} is not a fcclDataType_t (valid: 0 fcclInt8 .. 11 fcclFloat8e5m2)"))
    })
}

/// A fcclRedOp_t value as the core's operator, refused where it is not defined on
/// `dt` (the bitwise operators on float types).
pub(super) fn redop(v: fcclRedOp_t, dt: DataType) -> Result<RedOp> {
    let op = RedOp::try_from(v).map_err(|v| {
        Error::invalid_arg(format!(
            "op {v} is not a fcclRedOp_t (valid: 0 fcclSum .. 4 fcclAvg, 64 fcclBand, 65 fcclBor, 66 fcclBxor)"
        ))
    })?;
    if !op.takes(dt) {
        return Err(bitwise_on_float(op, dt));
    }
    Ok(op)
}

/// Why a bitwise operator refuses a float type, and the integer type of the same bytes.
#[cold]
fn bitwise_on_float(op: RedOp, dt: DataType) -> Error {
    let same_bits = match dt.size() {
        8 => "fcclUint64 with the same count",
        4 => "fcclUint32 with the same count",
        2 => "fcclUint8 with twice the count",
        _ => "fcclUint8 with the same count",
    };
    Error::invalid_arg(format!(
        "op {op} is bitwise and takes integer types only (fcclInt8 .. fcclUint64), not {dt}; \
         to combine the bits, pass the buffer as {same_bits}"
    ))
}

/// A rank argument (`what`: its name), in range for `comm`.
pub(super) fn rank_arg(v: c_int, what: &str, comm: &Comm) -> Result<usize> {
    usize::try_from(v).ok().filter(|&r| r < comm.nranks).ok_or_else(|| {
        Error::invalid_arg(format!(
            "{what} {v} out of range for a communicator of {} ranks (valid: 0..{})",
            comm.nranks,
            comm.nranks - 1
        ))
    })
}

/// Reads `n` entries of a C array; NULL is refused with the array's name, a copy
/// there is no memory for with fcclSystemError.
///
/// # Safety
/// `p` is NULL or valid for `n` reads.
pub(super) unsafe fn array<T: Copy>(p: *const T, n: usize, name: &str) -> Result<Vec<T>> {
    // SAFETY: as the caller promises.
    let items = unsafe { borrow_array(p, n, name) }?;
    crate::mem::fallible::to_vec(items).ok_or_else(|| {
        crate::mem::fallible::out_of_memory(
            std::mem::size_of_val(items),
            format_args!("a copy of {name} ({n} entries)"),
            "pass fewer entries per call",
        )
    })
}

/// `ptrs` (the array `name`) as read-only pointers, in a vector that there may be no
/// memory for (fcclSystemError, as for [`array`]).
pub(super) fn read_only(ptrs: &[*mut u8], name: &str) -> Result<Vec<*const u8>> {
    let mut v = crate::mem::fallible::with_capacity(ptrs.len()).ok_or_else(|| {
        crate::mem::fallible::out_of_memory(
            std::mem::size_of_val(ptrs),
            format_args!("a copy of {name} ({} entries)", ptrs.len()),
            "pass fewer entries per call",
        )
    })?;
    v.extend(ptrs.iter().map(|&p| p as *const u8));
    Ok(v)
}

/// The `n` entries of a C array in place, for the duration of the entry point that
/// received it; NULL is refused with the array's name.
///
/// # Safety
/// `p` is NULL or valid for `n` reads while the returned slice is used.
pub(super) unsafe fn borrow_array<'a, T: Copy>(p: *const T, n: usize, name: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::invalid_arg(format!("{name} is NULL; pass an array of {n} entries")));
    }
    // SAFETY: non-NULL and, by the API contract, n entries long.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// A count argument (`what`: its name) that may not be negative.
pub(super) fn count_arg(v: c_int, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::invalid_arg(format!("{what} is {v}; it cannot be negative")))
}
