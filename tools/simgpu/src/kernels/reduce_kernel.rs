//! `fccl_reduce_<type>_<op>(T* out, struct { const T* p[8]; } ins, int n, unsigned long long count)`:
//! `out[i] = op(ins.p[0][i], ..., ins.p[n-1][i])` for i < count, in input order, computed by
//! the library's own host reduction (`mem::reduce::reduce_all`), so device and host results
//! are the same bits. `out` may be one of the inputs exactly (in place).

use super::{Access, Args, Family, Param};
use crate::reduce;
use crate::types::{DataType, RedOp};

const MAX_INPUTS: usize = 8;

pub static REDUCE: Family = Family {
    prefix: "fccl_reduce_",
    params: &[
        Param { size: 8, align: 8 },
        Param { size: 8 * MAX_INPUTS, align: 8 },
        Param { size: 4, align: 4 },
        Param { size: 8, align: 8 },
    ],
    parse,
    run,
};

/// Type names of the convention, with the library's DataType.
const TYPES: [(&str, DataType); 12] = [
    ("i8", DataType::Int8),
    ("u8", DataType::Uint8),
    ("i32", DataType::Int32),
    ("u32", DataType::Uint32),
    ("i64", DataType::Int64),
    ("u64", DataType::Uint64),
    ("f16", DataType::Float16),
    ("bf16", DataType::Bfloat16),
    ("f32", DataType::Float32),
    ("f64", DataType::Float64),
    ("f8e4m3", DataType::Float8e4m3),
    ("f8e5m2", DataType::Float8e5m2),
];

const OPS: [(&str, RedOp); 5] =
    [("sum", RedOp::Sum), ("prod", RedOp::Prod), ("max", RedOp::Max), ("min", RedOp::Min), ("avg", RedOp::Avg)];

/// `<type>_<op>` -> (DataType << 8) | RedOp.
fn parse(rest: &str) -> Option<u32> {
    let (t, o) = rest.rsplit_once('_')?;
    let dt = TYPES.iter().find(|(n, _)| *n == t)?.1;
    let op = OPS.iter().find(|(n, _)| *n == o)?.1;
    Some(((dt as u32) << 8) | op as u32)
}

fn run(variant: u32, args: &Args, mem: &Access) -> Result<(), String> {
    let dt = DataType::try_from((variant >> 8) as i32).map_err(|v| format!("bad type {v}"))?;
    let op = RedOp::try_from((variant & 0xff) as i32).map_err(|v| format!("bad op {v}"))?;
    let out = args.u64(0);
    let ins: Vec<u64> = args.raw(1).chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().expect("8"))).collect();
    let n = args.i32(2);
    let count = args.u64(3);
    if !(1..=MAX_INPUTS as i32).contains(&n) {
        return Err(format!(
            "fccl_reduce: n = {n} is outside 1..={MAX_INPUTS} (the kernel would read garbage pointers)"
        ));
    }
    let n = n as usize;
    let bytes = usize::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(dt.size()))
        .ok_or_else(|| format!("fccl_reduce: count {count} is too large"))?;
    if bytes == 0 {
        return Ok(());
    }
    let dst = mem.resolve(out, bytes, "out")?;
    let mut srcs = Vec::with_capacity(n);
    for (i, &p) in ins[..n].iter().enumerate() {
        srcs.push(mem.resolve(p, bytes, &format!("ins.p[{i}]"))? as *const u8);
    }
    // Inputs equal to the output are read from a copy (in place); partial overlap is a bug
    // that a GPU would not report but whose result is unspecified, so it fails here.
    let (d0, d1) = (dst as usize, dst as usize + bytes);
    let mut copies: Vec<Option<Vec<u8>>> = Vec::with_capacity(n);
    for (i, &s) in srcs.iter().enumerate() {
        let (s0, s1) = (s as usize, s as usize + bytes);
        if s0 == d0 {
            // SAFETY: `s` was resolved for `bytes` bytes of live, mapped memory.
            copies.push(Some(unsafe { std::slice::from_raw_parts(s, bytes) }.to_vec()));
        } else if s0 < d1 && d0 < s1 {
            return Err(format!("fccl_reduce: ins.p[{i}] partially overlaps out"));
        } else {
            copies.push(None);
        }
    }
    let inputs: Vec<&[u8]> = srcs
        .iter()
        .zip(&copies)
        .map(|(&s, c)| match c {
            Some(v) => v.as_slice(),
            // SAFETY: resolved for `bytes` bytes; it does not overlap `out` (checked above), so
            // no mutable slice aliases it.
            None => unsafe { std::slice::from_raw_parts(s, bytes) },
        })
        .collect();
    // SAFETY: resolved for `bytes` writable bytes; no input slice overlaps it.
    let dst = unsafe { std::slice::from_raw_parts_mut(dst, bytes) };
    if n == 1 {
        dst.copy_from_slice(inputs[0]);
    } else {
        let mut acc = vec![0u8; if dt.is_narrow_float() { count as usize * dt.acc_size() } else { 0 }];
        reduce::reduce_all(dt, op, n, |i| inputs[i], dst, &mut acc);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_and_op_parses_to_the_library_values() {
        for (tn, dt) in TYPES {
            for (on, op) in OPS {
                let v = parse(&format!("{tn}_{on}")).expect("parses");
                assert_eq!(v >> 8, dt as u32);
                assert_eq!(v & 0xff, op as u32);
            }
        }
        assert!(parse("f32").is_none() && parse("f32_").is_none() && parse("_sum").is_none());
    }
}
