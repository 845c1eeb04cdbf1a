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

/// `<type>_<op>` -> (DataType << 8) | RedOp.
fn parse(rest: &str) -> Option<u32> {
    let (t, o) = rest.rsplit_once('_')?;
    // The library's own names (types.rs): one definition of the convention for both sides.
    let dt = *DataType::ALL.iter().find(|d| d.kernel_token() == t)?;
    let op = *RedOp::ALL.iter().find(|p| p.short_name() == o)?;
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
        for dt in DataType::ALL {
            for op in RedOp::ALL {
                let v = parse(&format!("{}_{}", dt.kernel_token(), op.short_name())).expect("parses");
                assert_eq!((v >> 8, v & 0xff), (dt as u32, op as u32));
            }
        }
        // A few names as docs/sim-gpu.md spells them (tests/kernels.rs checks them all).
        for (name, dt, op) in [
            ("bf16_avg", DataType::Bfloat16, RedOp::Avg),
            ("f8e4m3_max", DataType::Float8e4m3, RedOp::Max),
            ("u64_prod", DataType::Uint64, RedOp::Prod),
        ] {
            assert_eq!(parse(name), Some(((dt as u32) << 8) | op as u32), "{name}");
        }
        assert!(parse("f32").is_none() && parse("f32_").is_none() && parse("_sum").is_none());
        assert!(parse("float_sum").is_none() && parse("f32_add").is_none());
    }
}
