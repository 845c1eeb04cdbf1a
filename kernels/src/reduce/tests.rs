//! Every path is checked against an independent scalar reference: integers in
//! i128 then wrapped, floats exactly in f64 then rounded by a generic
//! round-to-nearest-even routine (itself checked against the `half` crate), and
//! fp8 decoded from its definition.

use super::*;
use ferroccl_testutil::Rng;
use half::{bf16, f16};

// ---- reference formats ----

const NATIVE_FLOATS: [DataType; 2] = [DataType::Float32, DataType::Float64];

fn is_int(dt: DataType) -> bool {
    !dt.is_narrow_float() && !NATIVE_FLOATS.contains(&dt)
}

fn is_signed(dt: DataType) -> bool {
    matches!(dt, DataType::Int8 | DataType::Int32 | DataType::Int64)
}

/// Reduces an integer to `dt`'s range the way two's complement hardware does.
fn wrap(dt: DataType, v: i128) -> i128 {
    let bits = 8 * dt.size() as u32;
    let low = v & ((1i128 << bits) - 1);
    if is_signed(dt) && low >= 1i128 << (bits - 1) {
        low - (1i128 << bits)
    } else {
        low
    }
}

fn dec_int(dt: DataType, b: &[u8]) -> i128 {
    // Native byte order, like the module: read the bytes as the type itself.
    let v = match dt.size() {
        1 => i128::from(b[0]),
        4 => i128::from(u32::from_ne_bytes(b.try_into().unwrap())),
        8 => i128::from(u64::from_ne_bytes(b.try_into().unwrap())),
        _ => unreachable!(),
    };
    wrap(dt, v)
}

fn enc_int(dt: DataType, v: i128) -> Vec<u8> {
    let v = wrap(dt, v);
    match dt.size() {
        1 => vec![v as u8],
        4 => (v as u32).to_ne_bytes().to_vec(),
        8 => (v as u64).to_ne_bytes().to_vec(),
        _ => unreachable!(),
    }
}

/// Parameters of a binary float format, for the reference rounding.
#[derive(Clone, Copy)]
struct Fmt {
    mant: i32,
    emin: i32,
    max: f64,
    saturate: bool,
}

fn fmt_of(dt: DataType) -> Fmt {
    let (mant, emin, max, saturate) = match dt {
        DataType::Float16 => (10, -14, 65504.0, false),
        DataType::Bfloat16 => (7, -126, f64::from(bf16::MAX.to_f32()), false),
        DataType::Float32 => (23, -126, f64::from(f32::MAX), false),
        DataType::Float8e4m3 => (3, -6, 448.0, true),
        DataType::Float8e5m2 => (2, -14, 57344.0, false),
        _ => unreachable!("no reference format for {dt}"),
    };
    Fmt { mant, emin, max, saturate }
}

fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// Rounds `x` (exact) to nearest even in `fmt`, with its overflow rule.
fn ref_round(fmt: Fmt, x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    let overflow = if fmt.saturate { fmt.max } else { f64::INFINITY };
    let a = x.abs();
    if a == 0.0 {
        return x;
    }
    if a.is_infinite() {
        return overflow.copysign(x);
    }
    let biased = (a.to_bits() >> 52) as i32;
    let e = if biased == 0 { -1075 } else { biased - 1023 };
    let quantum = pow2(e.max(fmt.emin) - fmt.mant);
    let r = (a / quantum).round_ties_even() * quantum;
    let r = if r > fmt.max { overflow } else { r };
    r.copysign(x)
}

/// fp8 decoding straight from the format's definition.
fn ref_f8_decode(e4m3: bool, b: u8) -> f64 {
    let (mant_bits, bias) = if e4m3 { (3, 7) } else { (2, 15) };
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((b & 0x7f) >> mant_bits);
    let mant = f64::from(b & ((1 << mant_bits) - 1));
    let max_exp = (1 << (7 - mant_bits)) - 1;
    if e4m3 && b & 0x7f == 0x7f {
        return f64::NAN;
    }
    if !e4m3 && exp == max_exp {
        return if mant == 0.0 { sign * f64::INFINITY } else { f64::NAN };
    }
    let frac = mant / f64::from(1 << mant_bits);
    sign * if exp == 0 { frac * pow2(1 - bias) } else { (1.0 + frac) * pow2(exp - bias) }
}

/// Encodes a value that is exactly representable in fp8.
fn ref_f8_encode(e4m3: bool, v: f64) -> u8 {
    if v.is_nan() {
        return if e4m3 { 0x7f } else { 0x7e };
    }
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let code =
        (0u8..0x80).find(|&c| ref_f8_decode(e4m3, c) == v.abs()).unwrap_or_else(|| panic!("{v} is not an fp8 value"));
    sign | code
}

fn dec_float(dt: DataType, b: &[u8]) -> f64 {
    match dt {
        DataType::Float16 => f16::from_bits(u16::from_ne_bytes(b.try_into().unwrap())).to_f64(),
        DataType::Bfloat16 => bf16::from_bits(u16::from_ne_bytes(b.try_into().unwrap())).to_f64(),
        DataType::Float32 => f64::from(f32::from_ne_bytes(b.try_into().unwrap())),
        DataType::Float64 => f64::from_ne_bytes(b.try_into().unwrap()),
        DataType::Float8e4m3 => ref_f8_decode(true, b[0]),
        DataType::Float8e5m2 => ref_f8_decode(false, b[0]),
        _ => unreachable!(),
    }
}

/// Rounds `x` (exact) into `dt` and encodes it.
fn enc_float(dt: DataType, x: f64) -> Vec<u8> {
    if dt == DataType::Float64 {
        return x.to_ne_bytes().to_vec();
    }
    let r = ref_round(fmt_of(dt), x);
    match dt {
        // r is representable, so any conversion path is exact.
        DataType::Float16 => f16::from_f64(r).to_bits().to_ne_bytes().to_vec(),
        DataType::Bfloat16 => bf16::from_f64(r).to_bits().to_ne_bytes().to_vec(),
        DataType::Float32 => (r as f32).to_ne_bytes().to_vec(),
        DataType::Float8e4m3 => vec![ref_f8_encode(true, r)],
        DataType::Float8e5m2 => vec![ref_f8_encode(false, r)],
        _ => unreachable!(),
    }
}

/// Rounding of an exact value to the accumulator of `dt`.
fn round_acc(dt: DataType, x: f64) -> f64 {
    if dt == DataType::Float64 {
        x
    } else {
        ref_round(fmt_of(DataType::Float32), x)
    }
}

/// Compares buffers of `dt` elements: integers bit for bit, floats bit for bit
/// except that any NaN equals any NaN and, for Max/Min, +0 equals -0.
fn assert_same(dt: DataType, op: RedOp, got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let size = dt.size();
    for (i, (g, w)) in got.chunks(size).zip(want.chunks(size)).enumerate() {
        if g == w {
            continue;
        }
        if !is_int(dt) {
            let (gv, wv) = (dec_float(dt, g), dec_float(dt, w));
            if gv.is_nan() && wv.is_nan() {
                continue;
            }
            if matches!(op, RedOp::Max | RedOp::Min) && gv == 0.0 && wv == 0.0 {
                continue;
            }
            panic!("{what}: {dt} {op} element {i}: got {gv:e} ({g:02x?}), want {wv:e} ({w:02x?})");
        }
        panic!("{what}: {dt} {op} element {i}: got {g:02x?}, want {w:02x?}");
    }
}

// ---- reference reductions ----

fn ref_op_int(dt: DataType, op: RedOp, a: i128, b: i128) -> i128 {
    match op {
        RedOp::Sum | RedOp::Avg => wrap(dt, a + b),
        RedOp::Prod => wrap(dt, a.wrapping_mul(b)),
        RedOp::Max => a.max(b),
        RedOp::Min => a.min(b),
        // Sign extension commutes with the bitwise operators, so i128 gives the bits.
        RedOp::Band => a & b,
        RedOp::Bor => a | b,
        RedOp::Bxor => a ^ b,
    }
}

fn ref_op_float(op: RedOp, a: f64, b: f64) -> f64 {
    match op {
        RedOp::Sum | RedOp::Avg => a + b,
        RedOp::Prod => a * b,
        RedOp::Max => a.max(b),
        RedOp::Min => a.min(b),
        RedOp::Band | RedOp::Bor | RedOp::Bxor => unreachable!("no bitwise operator on floats"),
    }
}

/// The expected result of reducing `ranks` element-wise. `stepwise` rounds to the
/// element type after every step (what `reduce_inplace` does); otherwise values are
/// accumulated in the accumulator type and rounded once. Stepwise `Avg` on narrow
/// types is only the sum (there is no in-place finish for them).
fn reference(dt: DataType, op: RedOp, ranks: &[Vec<u8>], stepwise: bool) -> Vec<u8> {
    let size = dt.size();
    let n = ranks[0].len() / size;
    let nranks = ranks.len();
    let mut out = Vec::with_capacity(ranks[0].len());
    for i in 0..n {
        let elem = |r: usize| &ranks[r][i * size..(i + 1) * size];
        if is_int(dt) {
            let mut v = dec_int(dt, elem(0));
            for r in 1..nranks {
                v = ref_op_int(dt, op, v, dec_int(dt, elem(r)));
            }
            if op == RedOp::Avg {
                v /= nranks as i128; // i128 division truncates toward zero
            }
            out.extend(enc_int(dt, v));
        } else {
            let step = |x: f64| {
                let acc = round_acc(dt, x);
                if stepwise {
                    dec_float(dt, &enc_float(dt, acc))
                } else {
                    acc
                }
            };
            let mut v = dec_float(dt, elem(0));
            for r in 1..nranks {
                v = step(ref_op_float(op, v, dec_float(dt, elem(r))));
            }
            if op == RedOp::Avg && !(stepwise && dt.is_narrow_float()) {
                v = round_acc(dt, v / nranks as f64);
            }
            out.extend(enc_float(dt, v));
        }
    }
    out
}

// ---- test data ----

fn random_elems(dt: DataType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dt.size());
    for _ in 0..n {
        let bits = rng.next_u64();
        let choice = rng.below(10);
        match dt {
            DataType::Float32 => {
                let v = match choice {
                    0 => [f32::NAN, f32::INFINITY, -f32::INFINITY, 0.0, -0.0, f32::MAX][rng.below(6) as usize],
                    1..=4 => f32::from_bits(bits as u32),
                    _ => ((bits >> 40) as f32 - 8e6) * 2f32.powi(rng.below(40) as i32 - 20),
                };
                out.extend(v.to_ne_bytes());
            }
            DataType::Float64 => {
                let v = match choice {
                    0 => [f64::NAN, f64::INFINITY, -f64::INFINITY, 0.0, -0.0, f64::MAX][rng.below(6) as usize],
                    1..=4 => f64::from_bits(bits),
                    _ => ((bits >> 10) as f64 - 9e15) * 2f64.powi(rng.below(80) as i32 - 40),
                };
                out.extend(v.to_ne_bytes());
            }
            // Narrow floats and integers: every bit pattern is interesting, but
            // small integers exercise Prod without always wrapping to zero.
            _ if is_int(dt) && choice < 3 => {
                out.extend(enc_int(dt, (bits % 7) as i128 - 3));
            }
            _ => out.extend(&bits.to_ne_bytes()[..dt.size()]),
        }
    }
    out
}

/// A copy of `data` placed at byte `offset` of a fresh allocation, so that the
/// slice `&v[offset..]` is misaligned for every element type when offset is odd.
fn at_offset(data: &[u8], offset: usize) -> Vec<u8> {
    let mut v = vec![0xa5; offset];
    v.extend_from_slice(data);
    v
}

// ---- the pipelines against the reference ----

const LENS: [usize; 4] = [0, 1, 7, 1000];
const NRANKS: [usize; 4] = [1, 2, 3, 5];

/// Runs every (type, operator) pair through every entry point and compares.
fn check_all_pipelines(dt: DataType, op: RedOp, len: usize, nranks: usize, off: usize) {
    let case = ((dt as u64) << 32) ^ ((op as u64) << 24) ^ (len as u64) << 8 ^ (nranks as u64) << 4 ^ off as u64;
    let mut rng = Rng::new(case);
    let ranks: Vec<Vec<u8>> = (0..nranks).map(|_| random_elems(dt, len, &mut rng)).collect();
    let src: Vec<Vec<u8>> = ranks.iter().map(|r| at_offset(r, off)).collect();
    let src = |r: usize| &src[r][off..];
    let what = format!("len {len} nranks {nranks} offset {off}");
    let once = reference(dt, op, &ranks, false);
    let acc_bytes = len * dt.acc_size();

    // 1. Fused first step, acc_reduce for the rest, acc_finish into dst.
    let mut acc = at_offset(&vec![0; acc_bytes], off);
    if nranks == 1 {
        acc_init(dt, &mut acc[off..], src(0));
    } else {
        acc_init2(dt, op, &mut acc[off..], src(0), src(1));
        for r in 2..nranks {
            acc_reduce(dt, op, &mut acc[off..], src(r));
        }
    }
    let mut dst = at_offset(&vec![0; len * dt.size()], off);
    acc_finish(dt, op, nranks, &acc[off..], &mut dst[off..]);
    assert_same(dt, op, &dst[off..], &once, &format!("init2+finish {what}"));

    // 2. acc_init then acc_reduce for every other rank.
    let mut acc2 = at_offset(&vec![0; acc_bytes], off);
    acc_init(dt, &mut acc2[off..], src(0));
    for r in 1..nranks {
        acc_reduce(dt, op, &mut acc2[off..], src(r));
    }
    acc_finish(dt, op, nranks, &acc2[off..], &mut dst[off..]);
    assert_same(dt, op, &dst[off..], &once, &format!("init+finish {what}"));

    // 3. Native types: the destination is the accumulator, finished in place.
    if !dt.is_narrow_float() {
        let mut buf = at_offset(&vec![0; acc_bytes], off);
        acc_init(dt, &mut buf[off..], src(0));
        for r in 1..nranks {
            acc_reduce(dt, op, &mut buf[off..], src(r));
        }
        finish_inplace(dt, op, nranks, &mut buf[off..]);
        assert_same(dt, op, &buf[off..], &once, &format!("finish_inplace {what}"));
    }

    // 4. reduce_inplace step by step, rounding to the element type every time.
    let mut buf = at_offset(&ranks[0], off);
    for r in 1..nranks {
        reduce_inplace(dt, op, &mut buf[off..], src(r));
    }
    if !dt.is_narrow_float() {
        finish_inplace(dt, op, nranks, &mut buf[off..]);
    }
    let stepwise = reference(dt, op, &ranks, true);
    assert_same(dt, op, &buf[off..], &stepwise, &format!("reduce_inplace {what}"));
}

/// Runs `f` with the default kernels and again with the portable ones forced
/// (the same thing where the CPU has no AVX2, or off x86_64).
fn for_each_kernel_set(f: impl Fn()) {
    for portable in [false, true] {
        PORTABLE_ONLY.with(|p| p.set(portable));
        f();
    }
    PORTABLE_ONLY.with(|p| p.set(false));
}

#[test]
fn every_type_and_op_matches_reference() {
    for_each_kernel_set(every_type_and_op_matches_reference_once);
}

fn every_type_and_op_matches_reference_once() {
    for dt in DataType::ALL {
        for op in RedOp::ALL.into_iter().filter(|op| op.takes(dt)) {
            for len in LENS {
                for nranks in NRANKS {
                    for off in [0, 1] {
                        check_all_pipelines(dt, op, len, nranks, off);
                    }
                }
            }
        }
    }
}

#[test]
fn reference_rounding_agrees_with_half_crate() {
    // The generic reference rounder must itself be right for the formats `half`
    // knows: check it on every half/bfloat16 value, the midpoints and neighbours.
    let mut rng = Rng::new(7);
    for i in 0..200_000u32 {
        let x = if i < 65536 {
            let v = f16::from_bits(i as u16).to_f32();
            f32::from_bits(v.to_bits().wrapping_add((rng.below(3) as u32 * 4096).wrapping_sub(4096)))
        } else {
            f32::from_bits(rng.next_u64() as u32)
        };
        let want = f16::from_f32(x).to_f64();
        let got = ref_round(fmt_of(DataType::Float16), f64::from(x));
        assert!(got == want || got.is_nan() && want.is_nan(), "f16 {x:e}: {got} vs {want}");
        let want = bf16::from_f32(x).to_f64();
        let got = ref_round(fmt_of(DataType::Bfloat16), f64::from(x));
        assert!(got == want || got.is_nan() && want.is_nan(), "bf16 {x:e}: {got} vs {want}");
    }
}

// ---- integer semantics ----

fn reduce2(dt: DataType, op: RedOp, a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut acc = vec![0; a.len() / dt.size() * dt.acc_size()];
    acc_init2(dt, op, &mut acc, a, b);
    let mut dst = vec![0; a.len()];
    acc_finish(dt, op, 2, &acc, &mut dst);
    // reduce_inplace must agree for native types.
    if !dt.is_narrow_float() {
        let mut inplace = a.to_vec();
        reduce_inplace(dt, op, &mut inplace, b);
        finish_inplace(dt, op, 2, &mut inplace);
        assert_eq!(inplace, dst);
    }
    dst
}

#[test]
fn integers_wrap() {
    assert_eq!(reduce2(DataType::Uint8, RedOp::Sum, &[200], &[100]), [44]);
    assert_eq!(reduce2(DataType::Int8, RedOp::Sum, &[127], &[1]), [128]); // -128
    assert_eq!(reduce2(DataType::Uint8, RedOp::Prod, &[16], &[17]), [16]); // 272 - 256
    assert_eq!(reduce2(DataType::Int8, RedOp::Prod, &[0x80], &[0xff]), [0x80]); // -128 * -1
    let i32s = |v: i32| v.to_ne_bytes();
    assert_eq!(reduce2(DataType::Int32, RedOp::Sum, &i32s(i32::MAX), &i32s(1)), i32s(i32::MIN));
    assert_eq!(reduce2(DataType::Int32, RedOp::Prod, &i32s(65536), &i32s(65537)), i32s(65536));
    let u64s = |v: u64| v.to_ne_bytes();
    assert_eq!(reduce2(DataType::Uint64, RedOp::Sum, &u64s(u64::MAX), &u64s(2)), u64s(1));
    assert_eq!(reduce2(DataType::Uint64, RedOp::Prod, &u64s(1 << 63), &u64s(2)), u64s(0));
    // Signed vs unsigned comparisons.
    assert_eq!(reduce2(DataType::Int8, RedOp::Max, &[0xff], &[1]), [1]);
    assert_eq!(reduce2(DataType::Uint8, RedOp::Max, &[0xff], &[1]), [0xff]);
    assert_eq!(reduce2(DataType::Int8, RedOp::Min, &[0x80], &[0x7f]), [0x80]);
}

#[test]
fn bitwise_operators_combine_every_bit_of_every_integer_width() {
    for_each_kernel_set(|| {
        assert_eq!(reduce2(DataType::Uint8, RedOp::Band, &[0xf0], &[0x3c]), [0x30]);
        assert_eq!(reduce2(DataType::Int8, RedOp::Bor, &[0x81], &[0x42]), [0xc3]);
        assert_eq!(reduce2(DataType::Int8, RedOp::Bxor, &[0xff], &[0x0f]), [0xf0]);
        // Three operands whose bits differ in every combination: bit b of operand k
        // is bit k of b, so and/or/xor each give a known pattern in every byte.
        for dt in DataType::ALL.into_iter().filter(|t| t.is_integer()) {
            let n = dt.size();
            let operand = |k: usize| -> Vec<u8> {
                (0..n).map(|_| (0..8).fold(0u8, |a, b| a | ((((b >> k) & 1) as u8) << b))).collect()
            };
            let (a, b, c) = (operand(0), operand(1), operand(2));
            // Bit i of every byte of the result is f(bits 0, 1 and 2 of i).
            let want = |f: fn(u8, u8, u8) -> u8| -> Vec<u8> {
                vec![(0..8).fold(0u8, |acc, i| acc | (f(i & 1, (i >> 1) & 1, (i >> 2) & 1) << i)); n]
            };
            for (op, f) in [
                (RedOp::Band, (|x, y, z| x & y & z) as fn(u8, u8, u8) -> u8),
                (RedOp::Bor, |x, y, z| x | y | z),
                (RedOp::Bxor, |x, y, z| x ^ y ^ z),
            ] {
                let mut dst = vec![0; n];
                reduce_all(dt, op, 3, |k| [&a, &b, &c][k].as_slice(), &mut dst, &mut []);
                assert_eq!(dst, want(f), "{dt} {op}");
            }
        }
    });
}

#[test]
fn integer_avg_truncates_toward_zero_after_wrapping() {
    for_each_kernel_set(integer_avg_truncates_toward_zero_after_wrapping_once);
}

fn integer_avg_truncates_toward_zero_after_wrapping_once() {
    // -3 + -4 = -7, / 2 = -3 (C truncation; flooring would give -4).
    assert_eq!(reduce2(DataType::Int8, RedOp::Avg, &[(-3i8) as u8], &[(-4i8) as u8]), [(-3i8) as u8]);
    let i32s = |v: i32| v.to_ne_bytes();
    assert_eq!(reduce2(DataType::Int32, RedOp::Avg, &i32s(-7), &i32s(0)), i32s(-3));
    assert_eq!(reduce2(DataType::Int32, RedOp::Avg, &i32s(7), &i32s(0)), i32s(3));
    // The sum wraps first: MAX + 1 = MIN, / 2.
    assert_eq!(reduce2(DataType::Int32, RedOp::Avg, &i32s(i32::MAX), &i32s(1)), i32s(i32::MIN / 2));
    assert_eq!(reduce2(DataType::Uint8, RedOp::Avg, &[200], &[100]), [22]); // 44 / 2
    let i64s = |v: i64| v.to_ne_bytes();
    assert_eq!(reduce2(DataType::Int64, RedOp::Avg, &i64s(-9), &i64s(0)), i64s(-4));
    let u64s = |v: u64| v.to_ne_bytes();
    assert_eq!(
        reduce2(DataType::Uint64, RedOp::Avg, &u64s(u64::MAX), &u64s(u64::MAX)),
        u64s(u64::MAX / 2) // (2^64 - 2) / 2
    );

    // Many ranks: more than the type can count, and every 32-bit quotient exact.
    let mut buf = [(-128i8) as u8];
    finish_inplace(DataType::Int8, RedOp::Avg, 200, &mut buf);
    assert_eq!(buf, [0]);
    let mut rng = Rng::new(3);
    for _ in 0..20_000 {
        let s = rng.next_u64() as i32;
        let range = if rng.below(2) == 0 { 10 } else { 1 << 33 };
        let n = 1 + rng.below(range) as usize;
        let mut b = s.to_ne_bytes();
        finish_inplace(DataType::Int32, RedOp::Avg, n, &mut b);
        assert_eq!(i32::from_ne_bytes(b) as i64, s as i64 / n as i64, "{s} / {n}");
        let u = s as u32;
        let mut b = u.to_ne_bytes();
        finish_inplace(DataType::Uint32, RedOp::Avg, n, &mut b);
        assert_eq!(u32::from_ne_bytes(b) as u64, u as u64 / n as u64, "{u} / {n}");
    }
    // Exhaustive for 8-bit values over the small rank counts.
    for n in 1..=300 {
        for v in 0..=255u8 {
            let mut b = [v];
            finish_inplace(DataType::Int8, RedOp::Avg, n, &mut b);
            assert_eq!(b[0] as i8 as i32, v as i8 as i32 / n as i32);
            let mut b = [v];
            finish_inplace(DataType::Uint8, RedOp::Avg, n, &mut b);
            assert_eq!(b[0] as usize, v as usize / n);
        }
    }
    if let Ok(n) = usize::try_from(1u64 << 63) {
        let mut b = i64::MIN.to_ne_bytes();
        finish_inplace(DataType::Int64, RedOp::Avg, n, &mut b);
        assert_eq!(i64::from_ne_bytes(b), -1);
    }
}

#[test]
#[should_panic(expected = "Avg over zero ranks")]
fn avg_over_zero_ranks_panics() {
    let mut b = [0u8; 4];
    finish_inplace(DataType::Int32, RedOp::Avg, 0, &mut b);
}

#[test]
#[should_panic(expected = "expected 2 elements")]
fn mismatched_lengths_panic() {
    reduce_inplace(DataType::Float32, RedOp::Sum, &mut [0; 4], &[0; 8]);
}

#[test]
#[should_panic(expected = "not a whole number of elements")]
fn partial_elements_panic() {
    reduce_inplace(DataType::Float32, RedOp::Sum, &mut [0; 6], &[0; 6]);
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "finish_inplace called")]
fn finish_inplace_rejects_narrow_types() {
    finish_inplace(DataType::Bfloat16, RedOp::Avg, 2, &mut [0; 2]);
}

// ---- float semantics ----

fn f16s(vals: &[f32]) -> Vec<u8> {
    vals.iter().flat_map(|&v| f16::from_f32(v).to_bits().to_ne_bytes()).collect()
}

fn bf16s(vals: &[f32]) -> Vec<u8> {
    vals.iter().flat_map(|&v| bf16::from_f32(v).to_bits().to_ne_bytes()).collect()
}

/// Reduces rank buffers through the accumulator (rounding once) and through
/// reduce_inplace (rounding every step); returns both results decoded.
fn once_and_stepwise(dt: DataType, op: RedOp, ranks: &[Vec<u8>]) -> (f64, f64) {
    let mut acc = vec![0; dt.acc_size()];
    acc_init2(dt, op, &mut acc, &ranks[0], &ranks[1]);
    for r in &ranks[2..] {
        acc_reduce(dt, op, &mut acc, r);
    }
    let mut once = vec![0; dt.size()];
    acc_finish(dt, op, ranks.len(), &acc, &mut once);
    let mut step = ranks[0].clone();
    for r in &ranks[1..] {
        reduce_inplace(dt, op, &mut step, r);
    }
    (dec_float(dt, &once), dec_float(dt, &step))
}

#[test]
fn narrow_floats_round_once() {
    for_each_kernel_set(narrow_floats_round_once_once);
}

fn narrow_floats_round_once_once() {
    // 1 + 2^-11 is a tie in half (ulp 2^-10 at 1) that rounds to even, 1.0; doing
    // it twice stays at 1.0. Accumulated in float32, 1 + 2^-11 + 2^-11 = 1 + 2^-10
    // is exact and representable.
    let h = 2f32.powi(-11);
    let ranks = [f16s(&[1.0]), f16s(&[h]), f16s(&[h])];
    let (once, step) = once_and_stepwise(DataType::Float16, RedOp::Sum, &ranks);
    assert_eq!(once, 1.0 + 2f64.powi(-10));
    assert_eq!(step, 1.0);
    // Avg: (1 + 2^-10 + ... ) / 3 rounded once, vs the reference.
    let (once, _) = once_and_stepwise(DataType::Float16, RedOp::Avg, &ranks);
    assert_eq!(once, f16::from_f32((1.0 + 2.0 * h) / 3.0).to_f64());

    // bfloat16: ulp 2^-7 at 1.
    let h = 2f32.powi(-8);
    let ranks = [bf16s(&[1.0]), bf16s(&[h]), bf16s(&[h])];
    let (once, step) = once_and_stepwise(DataType::Bfloat16, RedOp::Sum, &ranks);
    assert_eq!(once, 1.0 + 2f64.powi(-7));
    assert_eq!(step, 1.0);

    // fp8: ulp 2^-3 (E4M3) and 2^-2 (E5M2) at 1.
    for (dt, h) in [(DataType::Float8e4m3, 2f32.powi(-4)), (DataType::Float8e5m2, 2f32.powi(-3))] {
        let enc = |v: f32| vec![if dt == DataType::Float8e4m3 { f32_to_f8e4m3(v) } else { f32_to_f8e5m2(v) }];
        let ranks = [enc(1.0), enc(h), enc(h)];
        let (once, step) = once_and_stepwise(dt, RedOp::Sum, &ranks);
        assert_eq!(once, 1.0 + 2.0 * f64::from(h), "{dt}");
        assert_eq!(step, 1.0, "{dt}");
    }
}

#[test]
fn max_min_ignore_a_single_nan() {
    for_each_kernel_set(max_min_ignore_a_single_nan_once);
}

fn max_min_ignore_a_single_nan_once() {
    let nan_and = |dt: DataType, x: f64| -> [Vec<u8>; 3] {
        let nan = enc_float(dt, f64::NAN);
        [nan.clone(), enc_float(dt, x), nan]
    };
    for dt in [
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ] {
        let [nan, one, _] = nan_and(dt, 1.0);
        for op in [RedOp::Max, RedOp::Min] {
            for (a, b) in [(&nan, &one), (&one, &nan)] {
                let mut acc = vec![0; dt.acc_size()];
                acc_init2(dt, op, &mut acc, a, b);
                let mut out = vec![0; dt.size()];
                acc_finish(dt, op, 2, &acc, &mut out);
                assert_eq!(dec_float(dt, &out), 1.0, "{dt} {op} acc_init2");

                acc_init(dt, &mut acc, a);
                acc_reduce(dt, op, &mut acc, b);
                acc_finish(dt, op, 2, &acc, &mut out);
                assert_eq!(dec_float(dt, &out), 1.0, "{dt} {op} acc_reduce");

                let mut d = a.clone();
                reduce_inplace(dt, op, &mut d, b);
                assert_eq!(dec_float(dt, &d), 1.0, "{dt} {op} reduce_inplace");
            }
            let mut d = nan.clone();
            reduce_inplace(dt, op, &mut d, &nan);
            assert!(dec_float(dt, &d).is_nan(), "{dt} {op} NaN, NaN");
        }
        // Sum and Prod propagate NaN.
        for op in [RedOp::Sum, RedOp::Prod, RedOp::Avg] {
            let mut d = one.clone();
            reduce_inplace(dt, op, &mut d, &nan);
            assert!(dec_float(dt, &d).is_nan(), "{dt} {op}");
        }
    }
}

#[test]
fn fp8_overflow_in_reductions() {
    for_each_kernel_set(fp8_overflow_in_reductions_once);
}

fn fp8_overflow_in_reductions_once() {
    // E4M3 saturates, E5M2 overflows to infinity.
    let e4 = [f32_to_f8e4m3(448.0)];
    let mut d = e4;
    reduce_inplace(DataType::Float8e4m3, RedOp::Sum, &mut d, &e4);
    assert_eq!(d, [0x7e]);
    let mut d = [f32_to_f8e4m3(-448.0)];
    reduce_inplace(DataType::Float8e4m3, RedOp::Prod, &mut d, &e4);
    assert_eq!(d, [0xfe]);
    let e5 = [f32_to_f8e5m2(57344.0)];
    let mut d = e5;
    reduce_inplace(DataType::Float8e5m2, RedOp::Sum, &mut d, &e5);
    assert_eq!(d, [0x7c]);
    // ... and inf - inf is NaN.
    let mut d = [0xfc];
    reduce_inplace(DataType::Float8e5m2, RedOp::Sum, &mut d, &[0x7c]);
    assert!(f8e5m2_to_f32(d[0]).is_nan());
}

#[test]
fn float_avg_divides_in_accumulator() {
    // float32: (1 + 2 + 4) / 3 rounded once in float32.
    let ranks: Vec<Vec<u8>> = [1f32, 2.0, 4.0].iter().map(|v| v.to_ne_bytes().to_vec()).collect();
    let mut acc = vec![0; 4];
    acc_init2(DataType::Float32, RedOp::Avg, &mut acc, &ranks[0], &ranks[1]);
    acc_reduce(DataType::Float32, RedOp::Avg, &mut acc, &ranks[2]);
    finish_inplace(DataType::Float32, RedOp::Avg, 3, &mut acc);
    assert_eq!(f32::from_ne_bytes(acc.try_into().unwrap()), 7.0f32 / 3.0);
    // bfloat16 keeps float32's sum: 256 + 1 + 1 is 258 in float32 but would be
    // 256 in bfloat16 steps; / 3 = 86.
    let ranks = [bf16s(&[256.0]), bf16s(&[1.0]), bf16s(&[1.0])];
    let (once, _) = once_and_stepwise(DataType::Bfloat16, RedOp::Avg, &ranks);
    assert_eq!(once, 86.0);
}

// ---- half and bfloat16 conversions ----

#[test]
fn f16_and_bf16_decode_every_value() {
    for bits in 0..=u16::MAX {
        let want = f16::from_bits(bits).to_f32();
        let got = f16_to_f32(bits);
        assert!(got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(), "{bits:04x}");
        let want = bf16::from_bits(bits).to_f32();
        let got = bf16_to_f32(bits);
        assert!(got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(), "{bits:04x}");
    }
}

fn check_f16_bf16_encode(x: f32) {
    let (got, want) = (f32_to_f16(x), f16::from_f32(x));
    assert!(got == want.to_bits() || x.is_nan() && f16::from_bits(got).is_nan(), "f16 {x:e}");
    let (got, want) = (f32_to_bf16(x), bf16::from_f32(x));
    assert!(got == want.to_bits() || x.is_nan() && bf16::from_bits(got).is_nan(), "bf16 {x:e}");
}

#[test]
fn f16_and_bf16_encode_round_to_nearest_even() {
    // Every value, midpoint and midpoint neighbour of both formats, in f32 terms.
    for bits in 0..=u16::MAX {
        for v in [f16_to_f32(bits), bf16_to_f32(bits)] {
            let next = f32::from_bits(v.to_bits() + 1); // toward larger magnitude
            for probe in [v, next] {
                check_f16_bf16_encode(probe);
            }
        }
        let (h0, h1) = (f16::from_bits(bits), f16::from_bits(bits.wrapping_add(1)));
        if h0.is_finite() && h1.is_finite() && (bits & 0x7fff) != 0x7fff {
            let mid = (h0.to_f64() + h1.to_f64()) / 2.0;
            let mid = mid as f32; // exact: one more bit than half
            for probe in [mid, f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1)] {
                check_f16_bf16_encode(probe);
            }
        }
        let mid_bf = f32::from_bits((u32::from(bits) << 16) | 0x8000);
        for probe in [mid_bf, f32::from_bits(mid_bf.to_bits() - 1), f32::from_bits(mid_bf.to_bits() + 1)] {
            check_f16_bf16_encode(probe);
        }
    }
    // A stride through all of float32.
    for i in 0..(1u64 << 20) {
        check_f16_bf16_encode(f32::from_bits((i * 4093) as u32));
    }
    // The overflow thresholds.
    assert_eq!(f32_to_f16(65519.99), 0x7bff);
    assert_eq!(f32_to_f16(65520.0), 0x7c00);
    assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
    assert_eq!(f32_to_bf16(f32::NAN) & 0x7fc0, 0x7fc0);
    // A NaN whose payload sits only in the low bits must stay NaN.
    assert!(bf16::from_bits(f32_to_bf16(f32::from_bits(0x7f80_0001))).is_nan());
}

/// Exhaustive over all 2^32 float32 values; minutes in debug, seconds in release.
#[test]
#[ignore]
fn f16_and_bf16_encode_exhaustive() {
    for bits in 0..=u32::MAX {
        check_f16_bf16_encode(f32::from_bits(bits));
    }
}

// ---- fp8 conversions ----

type F8Fns = (bool, fn(u8) -> f32, fn(f32) -> u8, DataType);
const FP8: [F8Fns; 2] = [
    (true, f8e4m3_to_f32, f32_to_f8e4m3, DataType::Float8e4m3),
    (false, f8e5m2_to_f32, f32_to_f8e5m2, DataType::Float8e5m2),
];

#[test]
fn fp8_decode_and_round_trip_every_value() {
    for (e4m3, to_f32, from_f32, _) in FP8 {
        for b in 0..=255u8 {
            let v = to_f32(b);
            let want = ref_f8_decode(e4m3, b);
            if want.is_nan() {
                assert!(v.is_nan(), "{b:02x}");
                assert!(to_f32(from_f32(v)).is_nan(), "{b:02x} NaN round trip");
            } else {
                assert_eq!(f64::from(v), want, "{b:02x}");
                assert_eq!(v.is_sign_negative(), b & 0x80 != 0, "{b:02x} sign");
                assert_eq!(from_f32(v), b, "{b:02x} round trip");
            }
        }
    }
    // Landmarks of the formats.
    assert_eq!(f8e4m3_to_f32(0x7e), 448.0);
    assert_eq!(f8e4m3_to_f32(0x01), 2f32.powi(-9));
    assert_eq!(f8e4m3_to_f32(0x08), 2f32.powi(-6));
    assert_eq!(f8e5m2_to_f32(0x7b), 57344.0);
    assert_eq!(f8e5m2_to_f32(0x7c), f32::INFINITY);
    assert_eq!(f8e5m2_to_f32(0xfc), f32::NEG_INFINITY);
    assert_eq!(f8e5m2_to_f32(0x01), 2f32.powi(-16));
    assert_eq!(f8e5m2_to_f32(0x04), 2f32.powi(-14));
}

#[test]
fn fp8_midpoints_round_to_even() {
    for (e4m3, to_f32, from_f32, _) in FP8 {
        let max_code = if e4m3 { 0x7e } else { 0x7b };
        for code in 0..max_code {
            for sign in [0u8, 0x80] {
                let (lo, hi) = (sign | code, sign | (code + 1));
                let (lv, hv) = (to_f32(lo), to_f32(hi));
                let mid = ((f64::from(lv) + f64::from(hv)) / 2.0) as f32; // exact
                let even = if code & 1 == 0 { lo } else { hi };
                assert_eq!(from_f32(mid), even, "mid of {lo:02x} {hi:02x}");
                // Just inside either side of the midpoint.
                let toward_lo = f32::from_bits(mid.to_bits() - 1);
                let toward_hi = f32::from_bits(mid.to_bits() + 1);
                assert_eq!(from_f32(toward_lo), lo, "below mid of {lo:02x}");
                assert_eq!(from_f32(toward_hi), hi, "above mid of {lo:02x}");
            }
        }
        // Below the smallest subnormal: the tie goes to (signed) zero.
        let min_sub = to_f32(1);
        assert_eq!(from_f32(min_sub / 2.0), 0);
        assert_eq!(from_f32(-min_sub / 2.0), 0x80);
        assert_eq!(from_f32(f32::from_bits((min_sub / 2.0).to_bits() + 1)), 1);
        assert_eq!(from_f32(f32::from_bits(1)), 0); // float32 subnormal
    }
    // Overflow: E4M3 saturates (finite and infinite), E5M2 rounds to infinity from
    // the midpoint 61440 (a tie between odd 0x7b and even 0x7c, i.e. infinity).
    for x in [448.0, 449.0, 463.99, 464.0, 480.0, 1e9, f32::MAX, f32::INFINITY] {
        assert_eq!(f32_to_f8e4m3(x), 0x7e, "{x}");
        assert_eq!(f32_to_f8e4m3(-x), 0xfe, "{x}");
    }
    for x in [57344.0, 61439.996] {
        assert_eq!(f32_to_f8e5m2(x), 0x7b, "{x}");
    }
    for x in [61440.0, 65536.0, 1e9, f32::MAX, f32::INFINITY] {
        assert_eq!(f32_to_f8e5m2(x), 0x7c, "{x}");
        assert_eq!(f32_to_f8e5m2(-x), 0xfc, "{x}");
    }
    for nan in [f32::NAN, -f32::NAN, f32::from_bits(0x7f80_0001)] {
        assert_eq!(f32_to_f8e4m3(nan) & 0x7f, 0x7f);
        assert_eq!(f32_to_f8e5m2(nan) & 0x7f, 0x7e);
    }
}

/// Exhaustive over all 2^32 float32 values against the reference rounding; about
/// a minute in release.
#[test]
#[ignore]
fn fp8_encode_exhaustive() {
    for (_, to_f32, from_f32, dt) in FP8 {
        let fmt = fmt_of(dt);
        for bits in 0..=u32::MAX {
            let x = f32::from_bits(bits);
            let got = to_f32(from_f32(x));
            let want = ref_round(fmt, f64::from(x));
            assert!(
                f64::from(got) == want && got.is_sign_negative() == want.is_sign_negative()
                    || got.is_nan() && want.is_nan(),
                "{dt} {x:e}: got {got:e}, want {want:e}"
            );
        }
    }
}

#[test]
fn fp8_encode_matches_reference_sweep() {
    let mut rng = Rng::new(11);
    for (_, to_f32, from_f32, dt) in FP8 {
        let fmt = fmt_of(dt);
        let check = |x: f32| {
            let got = to_f32(from_f32(x));
            let want = ref_round(fmt, f64::from(x));
            assert!(
                f64::from(got) == want && got.is_sign_negative() == want.is_sign_negative()
                    || got.is_nan() && want.is_nan(),
                "{dt} {x:e}: got {got:e}, want {want:e}"
            );
        };
        // A stride through all of float32, and dense random values in fp8 range.
        for i in 0..(1u64 << 18) {
            check(f32::from_bits((i * 16411) as u32));
        }
        for _ in 0..(1 << 18) {
            let e = rng.below(40) as i32 - 22;
            let x = (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2f32.powi(e);
            check(if rng.below(2) == 0 { x } else { -x });
        }
    }
}

// ---- convert ----

/// Reference conversion of one element, through the exact value.
fn ref_convert(from: DataType, src: &[u8], to: DataType) -> Vec<u8> {
    if is_int(from) {
        let v = dec_int(from, src);
        if is_int(to) {
            enc_int(to, v)
        } else {
            assert!(v.unsigned_abs() <= 1 << 53, "reference needs an exact f64");
            enc_float(to, v as f64)
        }
    } else {
        let v = dec_float(from, src);
        if is_int(to) {
            // Truncate and saturate, NaN -> 0.
            let (lo, hi) = if is_signed(to) {
                (-(1i128 << (8 * to.size() - 1)), (1i128 << (8 * to.size() - 1)) - 1)
            } else {
                (0, (1i128 << (8 * to.size())) - 1)
            };
            let t = if v.is_nan() { 0 } else { (v.trunc().clamp(lo as f64, hi as f64)) as i128 };
            enc_int(to, t.clamp(lo, hi))
        } else {
            enc_float(to, v)
        }
    }
}

#[test]
fn convert_all_pairs_matches_reference() {
    for_each_kernel_set(convert_all_pairs_matches_reference_once);
}

fn convert_all_pairs_matches_reference_once() {
    let mut rng = Rng::new(5);
    for from in DataType::ALL {
        for to in DataType::ALL {
            for off in [0, 1] {
                let n = 500;
                let mut data = random_elems(from, n, &mut rng);
                if matches!(from, DataType::Int64 | DataType::Uint64) {
                    // Keep 64-bit integers exact in f64 for the reference.
                    for c in data.chunks_mut(8) {
                        let v = u64::from_ne_bytes((&*c).try_into().unwrap()) >> 11;
                        c.copy_from_slice(&v.to_ne_bytes());
                    }
                }
                let src = at_offset(&data, off);
                let mut dst = at_offset(&vec![0; n * to.size()], off);
                convert(from, &src[off..], to, &mut dst[off..]);
                let want: Vec<u8> = data.chunks(from.size()).flat_map(|e| ref_convert(from, e, to)).collect();
                assert_same(to, RedOp::Sum, &dst[off..], &want, &format!("{from} -> {to}"));
            }
        }
    }
}

fn convert1(from: DataType, src: &[u8], to: DataType) -> Vec<u8> {
    let mut dst = vec![0; to.size()];
    convert(from, src, to, &mut dst);
    dst
}

#[test]
fn convert_rounds_only_once() {
    // 1 + 2^-11 + 2^-40: above the half tie at 1 + 2^-11, so it rounds up to
    // 1 + 2^-10. Through float32 by nearest it would first become the tie itself
    // and then round to even, 1.0.
    let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
    let h = convert1(DataType::Float64, &x.to_ne_bytes(), DataType::Float16);
    assert_eq!(dec_float(DataType::Float16, &h), 1.0 + 2f64.powi(-10));
    let h = convert1(DataType::Float64, &(-x).to_ne_bytes(), DataType::Float16);
    assert_eq!(dec_float(DataType::Float16, &h), -(1.0 + 2f64.powi(-10)));
    // The same for an integer into bfloat16: 2^24 + 2^16 + 1 is just above the
    // bfloat16 tie 2^24 + 2^16 (ulp 2^17), but float32 rounds it onto the tie.
    let v = (1i64 << 24) + (1 << 16) + 1;
    let b = convert1(DataType::Int64, &v.to_ne_bytes(), DataType::Bfloat16);
    assert_eq!(dec_float(DataType::Bfloat16, &b), f64::from((1 << 24) + (1 << 17)));
    // Exact ties still go to even, and large values are rounded right.
    let b = convert1(DataType::Int64, &((1i64 << 24) + (1 << 16)).to_ne_bytes(), DataType::Bfloat16);
    assert_eq!(dec_float(DataType::Bfloat16, &b), f64::from(1 << 24));
    let f = convert1(DataType::Uint64, &u64::MAX.to_ne_bytes(), DataType::Float32);
    assert_eq!(f32::from_ne_bytes(f.try_into().unwrap()), 2f32.powi(64));
    let f = convert1(DataType::Uint64, &u64::MAX.to_ne_bytes(), DataType::Float16);
    assert_eq!(dec_float(DataType::Float16, &f), f64::INFINITY);
    let f = convert1(DataType::Int64, &i64::MIN.to_ne_bytes(), DataType::Bfloat16);
    assert_eq!(dec_float(DataType::Bfloat16, &f), -(2f64.powi(63)));
    let f = convert1(DataType::Int64, &i64::MAX.to_ne_bytes(), DataType::Float8e4m3);
    assert_eq!(f, [0x7e]);
    // Float64 beyond float32's range still saturates or overflows correctly.
    let f = convert1(DataType::Float64, &1e300f64.to_ne_bytes(), DataType::Float8e5m2);
    assert_eq!(f, [0x7c]);
    let f = convert1(DataType::Float64, &(-1e300f64).to_ne_bytes(), DataType::Float8e4m3);
    assert_eq!(f, [0xfe]);
    let f = convert1(DataType::Float64, &1e-300f64.to_ne_bytes(), DataType::Float16);
    assert_eq!(f, [0, 0]);
}

#[test]
fn convert_value_casts() {
    assert_eq!(convert1(DataType::Int32, &(-1i32).to_ne_bytes(), DataType::Uint8), [0xff]);
    assert_eq!(convert1(DataType::Uint32, &300u32.to_ne_bytes(), DataType::Int8), [44]);
    assert_eq!(convert1(DataType::Int8, &[0x80], DataType::Uint64), (-128i64 as u64).to_ne_bytes());
    assert_eq!(convert1(DataType::Float32, &(-2.9f32).to_ne_bytes(), DataType::Int8), [0xfe]);
    assert_eq!(convert1(DataType::Float32, &1e10f32.to_ne_bytes(), DataType::Uint8), [255]);
    assert_eq!(convert1(DataType::Float32, &f32::NAN.to_ne_bytes(), DataType::Int32), [0; 4]);
    let mut empty: [u8; 0] = [];
    convert(DataType::Float64, &[], DataType::Float8e4m3, &mut empty);
}

// ---- micro-benchmark ----

/// Throughput of the hot loops. Run with
/// `cargo test --release -- --ignored --nocapture bench`.
#[test]
#[ignore]
fn bench_reduce_throughput() {
    use std::time::Instant;
    fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    }
    for (bytes, portable) in [(64usize << 20, false), (256 << 10, false), (64 << 20, true), (256 << 10, true)] {
        PORTABLE_ONLY.with(|p| p.set(portable));
        let reps = if bytes > 1 << 20 { 10 } else { 2000 };
        let kernels = if portable { "portable kernels" } else { "default kernels (AVX2 if the CPU has it)" };
        println!("-- buffers of {} KiB, best of {reps}, {kernels}", bytes >> 10);
        for dt in DataType::ALL {
            let n = bytes / dt.size();
            let src = vec![0x3c; bytes];
            let mut dst = vec![0x3c; bytes];
            let mut acc = vec![0; n * dt.acc_size()];
            acc_init(dt, &mut acc, &src);
            let t = best_of(reps, || reduce_inplace(dt, RedOp::Sum, &mut dst, &src));
            let t_acc = best_of(reps, || acc_reduce(dt, RedOp::Sum, &mut acc, &src));
            let t_fin = best_of(reps, || acc_finish(dt, RedOp::Sum, 2, &acc, &mut dst));
            // GB/s of element data consumed (the size of src), as NCCL counts.
            let gbs = |t: f64| bytes as f64 / t / 1e9;
            println!(
                "{:>8} sum: reduce_inplace {:6.2} GB/s  acc_reduce {:6.2} GB/s  acc_finish {:6.2} GB/s",
                dt.short_name(),
                gbs(t),
                gbs(t_acc),
                gbs(t_fin)
            );
        }
    }
}
