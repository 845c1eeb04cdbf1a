//! Scalar conversions between float32, float64, 64-bit integers and the narrow float
//! formats (half, bfloat16, fp8), branch-free so that the loops they sit in vectorize.

// ---------------------------------------------------------------------------------
// Scalar conversions between float32 and the narrow float formats.
//
// All of them are branch-free (the `if`s below are selects between two already
// computed values), so that LLVM can vectorize the loops they are inlined into.
// ---------------------------------------------------------------------------------

/// bfloat16 -> float32: bfloat16 is the top half of a float32, so this is exact.
#[inline(always)]
pub(super) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// float32 -> bfloat16, round to nearest even; overflow carries into the exponent and
/// becomes infinity as IEEE rounding requires. NaN keeps its sign and is made quiet
/// (truncating a NaN could otherwise clear every mantissa bit and yield infinity).
#[inline(always)]
pub(super) fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even. Only NaN
    // bit patterns can wrap here, and they take the other branch.
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let nan = (bits >> 16) | 0x0040;
    let is_nan = bits & 0x7fff_ffff > 0x7f80_0000;
    (if is_nan { nan } else { rounded }) as u16
}

/// IEEE half -> float32, exact (including subnormals, infinities and NaNs).
///
/// This is the branch-free method of Marat Dukhan's FP16 library (also used by
/// PyTorch's `c10::Half`): normal numbers are rebiased with an exponent offset and a
/// power-of-two multiply (which also maps the all-ones exponent to inf/NaN), and
/// subnormals are built as `0.5 + m * 2^-24` and then have 0.5 subtracted, exactly.
/// Comparisons are on values below 2^31, as i32, because x86 SIMD has signed
/// compares only.
#[inline(always)]
pub(super) fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let abs = u32::from(h & 0x7fff);

    // Exponent field e becomes e + 224 (so e = 31 lands on 255, inf/NaN); the multiply
    // by 2^-112 then takes the value from 2^(e+97) down to 2^(e-15).
    const EXP_OFFSET: u32 = 0xe0 << 23;
    let exp_scale = f32::from_bits(0x0780_0000); // 2^-112
    let normalized = f32::from_bits((abs << 13) + EXP_OFFSET) * exp_scale;

    // Subnormal: 0.5 has mantissa ulp 2^-24, the half-subnormal step; add m of them.
    const HALF: u32 = 126 << 23; // the bits of 0.5
    let denormalized = f32::from_bits(abs | HALF) - 0.5;

    let mag = if (abs as i32) < 0x400 { denormalized.to_bits() } else { normalized.to_bits() };
    f32::from_bits(sign | mag)
}

/// float32 -> IEEE half, round to nearest even, overflow to infinity, NaN to a quiet
/// NaN with the input's sign.
///
/// Branch-free method of the FP16 library. `4|x|` is computed as `|x| * 2^112 *
/// 2^-110`, which overflows to infinity exactly for values too big for half. Adding
/// `2^(e+15)`, where e is x's exponent clamped below at -14 (half's smallest normal
/// exponent), makes the float adder itself round `4|x|` to 2^(e-8), that is |x| to
/// half's ulp 2^(e-10) (or to the subnormal step 2^-24 for tiny x), ties to even.
/// The half encoding is then read straight out of the sum's bits; the sum's leading
/// mantissa bit carries into the exponent field to make it right.
#[inline(always)]
pub(super) fn f32_to_f16(x: f32) -> u16 {
    let w = x.to_bits();
    let sign = (w >> 16) & 0x8000;
    let abs = w & 0x7fff_ffff;

    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let base = (f32::from_bits(abs) * scale_to_inf) * scale_to_zero;

    // x's exponent field, clamped below at that of 2^-14, plus 15 (0x0780_0000).
    // (Signed max: x86 SIMD has no unsigned 32-bit max before SSE4.1.)
    let bias = ((abs & 0x7f80_0000) as i32).max(0x3880_0000) as u32;
    let base = f32::from_bits(bias + 0x0780_0000) + base;

    let bits = base.to_bits();
    let nonsign = ((bits >> 13) & 0x7c00) + (bits & 0x0fff);
    let mag = if (abs as i32) > 0x7f80_0000 {
        0x7e00 // NaN
    } else {
        nonsign
    };
    (sign | mag) as u16
}

/// Finite part of fp8 -> float32 for a format with `M` mantissa bits and exponent
/// bias `BIAS`; the callers patch in their own infinities and NaNs.
#[inline(always)]
pub(super) fn f8_to_f32_finite<const M: u32, const BIAS: u32>(b: u8) -> (u32, u32) {
    let sign = u32::from(b & 0x80) << 24;
    let abs = u32::from(b & 0x7f);
    // Normal: move exponent and mantissa under float32's and add the bias difference.
    let normal = (abs << (23 - M)) + ((127 - BIAS) << 23);
    // Subnormal: the value is the mantissa times the subnormal step 2^(1-BIAS-M). The
    // integer to float conversion and the power-of-two multiply are exact, and avoid
    // ever feeding a float32 subnormal to the FPU (slow on some CPUs).
    let step = f32::from_bits((128 - BIAS - M) << 23);
    let sub = (abs as i32 as f32 * step).to_bits();
    let mag = if abs < (1 << M) { sub } else { normal };
    (sign, mag)
}

/// Core of float32 -> fp8, round to nearest even, for a format with `M` mantissa bits
/// and exponent bias `BIAS`. Results above `MAX_CODE` (in magnitude) are clamped to it
/// and NaN becomes `NAN_CODE`; both carry the input's sign.
///
/// Normal results round in the integer domain: adding `half ulp - 1` plus the lowest
/// kept bit to float32's bits rounds to nearest even, and a mantissa carry correctly
/// bumps the exponent. Subnormal results let the float adder round: adding |x| to
/// `2^(23 + 1 - BIAS - M)`, whose ulp is the fp8 subnormal step, leaves
/// `round(|x| / step)` in the low bits of the sum (2^M means it rounded up to the
/// smallest normal, whose encoding is also 2^M).
#[inline(always)]
pub(super) fn f32_to_f8<const M: u32, const BIAS: u32, const MAX_CODE: u32, const NAN_CODE: u32>(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let abs = bits & 0x7fff_ffff;

    let shift = 23 - M;
    let rounded = abs + ((1 << (shift - 1)) - 1) + ((abs >> shift) & 1);
    // Wraps for |x| below the normal range, whose result the select below discards.
    let normal = (rounded >> shift).wrapping_sub((127 - BIAS) << M);

    let magic = f32::from_bits((151 - BIAS - M) << 23);
    let sub = (f32::from_bits(abs) + magic).to_bits() - magic.to_bits();

    // abs < 2^31, so comparing as i32 is the same and vectorizes better on SSE2.
    let min_normal = ((128 - BIAS) << 23) as i32;
    let mag = if (abs as i32) < min_normal { sub } else { normal };
    // Overflow (including infinity) clamps to MAX_CODE: +-inf for E5M2, +-448 for E4M3.
    // (mag is small here: the select discarded any wrapped value, so i32 is exact.)
    let mag = (mag as i32).min(MAX_CODE as i32) as u32;
    let mag = if (abs as i32) > 0x7f80_0000 { NAN_CODE } else { mag };
    (sign | mag) as u8
}

/// OCP fp8 E4M3 ("fn") -> float32, exact. 0x7f/0xff are NaN; there are no infinities.
#[inline(always)]
pub fn f8e4m3_to_f32(b: u8) -> f32 {
    let (sign, mag) = f8_to_f32_finite::<3, 7>(b);
    let mag = if b & 0x7f == 0x7f { 0x7fc0_0000 } else { mag };
    f32::from_bits(sign | mag)
}

/// float32 -> OCP fp8 E4M3, round to nearest even, saturating: finite values and
/// infinities beyond +-448 become +-448 (CUDA's `__NV_SATFINITE`). NaN -> NaN (0x7f
/// with the input's sign).
#[inline(always)]
pub fn f32_to_f8e4m3(x: f32) -> u8 {
    f32_to_f8::<3, 7, 0x7e, 0x7f>(x)
}

/// OCP fp8 E5M2 -> float32, exact. Exponent 31 holds +-inf (mantissa 0) and NaNs.
#[inline(always)]
pub fn f8e5m2_to_f32(b: u8) -> f32 {
    let (sign, mag) = f8_to_f32_finite::<2, 15>(b);
    let abs = b & 0x7f;
    let mag = if abs == 0x7c { 0x7f80_0000 } else { mag };
    let mag = if abs > 0x7c { 0x7fc0_0000 } else { mag };
    f32::from_bits(sign | mag)
}

/// float32 -> OCP fp8 E5M2, round to nearest even with IEEE overflow: magnitudes from
/// 61440 (the midpoint above the largest finite 57344, which rounds to the even
/// neighbour, infinity) upward become +-inf. NaN -> NaN (0x7e with the input's sign).
#[inline(always)]
pub fn f32_to_f8e5m2(x: f32) -> u8 {
    f32_to_f8::<2, 15, 0x7c, 0x7e>(x)
}

// ---------------------------------------------------------------------------------
// Correct narrowing from float64 and from 64-bit integers.
//
// Rounding twice (f64 -> f32 -> f16, each to nearest) can be wrong when the first
// rounding lands exactly on a midpoint of the second. Rounding the first step "to odd"
// instead (truncate, then set the lowest bit if anything was lost) makes the second
// rounding exact as long as the intermediate keeps two more bits than the target, and
// float32's 24 bits cover every narrow type (at most 11). Only `convert` needs this:
// the reduction paths start from values that are exact in float32.
// ---------------------------------------------------------------------------------

/// Given `t`, the round-to-nearest float32 of some exact value, and whether `t` is
/// exact, too big or too small in magnitude, return the round-to-odd float32.
#[inline(always)]
pub(super) fn round_to_odd(t: f32, ord: std::cmp::Ordering) -> f32 {
    use std::cmp::Ordering;
    let bits = t.to_bits();
    // Truncation toward zero is t itself, or its neighbour toward zero (for t = inf
    // that is f32::MAX). Of the two floats around the exact value, the odd one wins.
    let truncated = match ord {
        Ordering::Equal => return t,
        Ordering::Greater => bits - 1,
        Ordering::Less => bits,
    };
    f32::from_bits(truncated | 1)
}

/// float64 -> float32 rounded to odd (see above); NaN and infinities pass through.
#[inline(always)]
pub(super) fn f64_to_f32_odd(x: f64) -> f32 {
    let t = x as f32;
    if x.is_nan() {
        return t;
    }
    round_to_odd(t, f64::from(t).abs().total_cmp(&x.abs()))
}

/// Integer -> float32 rounded to odd.
#[inline(always)]
pub(super) fn i128_to_f32_odd(x: i128) -> f32 {
    let t = x as f32;
    // t is an integer no larger than 2^64 here (the inputs are 64-bit integers).
    let back = t as i128;
    round_to_odd(t, back.unsigned_abs().cmp(&x.unsigned_abs()))
}
