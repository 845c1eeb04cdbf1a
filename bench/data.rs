//! Element types, the inputs every rank writes and the results it expects.
//!
//! Every input is a small non-negative integer chosen so that the exact result of the
//! collective is representable in the element type, whatever the order of the
//! reduction: sums stay within the type's exactly representable integers (and within
//! float32's for half, bfloat16 and fp8, which accumulate in float32), prod multiplies
//! 1s and a few 2s, avg averages values whose sum is a multiple of the rank count.
//! So results are compared for equality, for floats too. The encoders and decoders
//! here are the benchmark's own, independent of the library's conversion code.

use ferroccl::ffi::*;
// Inputs are a counter-based hash of (seed, rank, index): any element in any order.
use ferroccl_testutil::{below_of, mix};

/// Element types (`-d`), with nccl-tests' names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    Int8,
    Uint8,
    Int32,
    Uint32,
    Int64,
    Uint64,
    Half,
    Float,
    Double,
    Bfloat16,
    F8e4m3,
    F8e5m2,
}

impl Ty {
    pub const ALL: [Ty; 12] = [
        Ty::Int8,
        Ty::Uint8,
        Ty::Int32,
        Ty::Uint32,
        Ty::Int64,
        Ty::Uint64,
        Ty::Half,
        Ty::Float,
        Ty::Double,
        Ty::Bfloat16,
        Ty::F8e4m3,
        Ty::F8e5m2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Ty::Int8 => "int8",
            Ty::Uint8 => "uint8",
            Ty::Int32 => "int32",
            Ty::Uint32 => "uint32",
            Ty::Int64 => "int64",
            Ty::Uint64 => "uint64",
            Ty::Half => "half",
            Ty::Float => "float",
            Ty::Double => "double",
            Ty::Bfloat16 => "bfloat16",
            Ty::F8e4m3 => "f8e4m3",
            Ty::F8e5m2 => "f8e5m2",
        }
    }

    pub fn parse(s: &str) -> Option<Ty> {
        let s = s.to_ascii_lowercase();
        let alias = match s.as_str() {
            "char" => "int8",
            "int" => "int32",
            "float16" | "fp16" | "f16" => "half",
            "float32" | "fp32" | "f32" => "float",
            "float64" | "fp64" | "f64" => "double",
            "bf16" => "bfloat16",
            "e4m3" | "fp8_e4m3" | "float8e4m3" => "f8e4m3",
            "e5m2" | "fp8_e5m2" | "float8e5m2" => "f8e5m2",
            other => other,
        };
        Ty::ALL.iter().copied().find(|t| t.name() == alias)
    }

    pub fn size(self) -> usize {
        match self {
            Ty::Int8 | Ty::Uint8 | Ty::F8e4m3 | Ty::F8e5m2 => 1,
            Ty::Half | Ty::Bfloat16 => 2,
            Ty::Int32 | Ty::Uint32 | Ty::Float => 4,
            Ty::Int64 | Ty::Uint64 | Ty::Double => 8,
        }
    }

    /// Floating-point types (the ones a wire type may be).
    pub fn is_float(self) -> bool {
        matches!(self, Ty::Half | Ty::Float | Ty::Double | Ty::Bfloat16 | Ty::F8e4m3 | Ty::F8e5m2)
    }

    pub fn c_value(self) -> fcclDataType_t {
        match self {
            Ty::Int8 => fcclInt8,
            Ty::Uint8 => fcclUint8,
            Ty::Int32 => fcclInt32,
            Ty::Uint32 => fcclUint32,
            Ty::Int64 => fcclInt64,
            Ty::Uint64 => fcclUint64,
            Ty::Half => fcclFloat16,
            Ty::Float => fcclFloat32,
            Ty::Double => fcclFloat64,
            Ty::Bfloat16 => fcclBfloat16,
            Ty::F8e4m3 => fcclFloat8e4m3,
            Ty::F8e5m2 => fcclFloat8e5m2,
        }
    }

    /// Largest value used as data, and the bound on every sum: every integer in
    /// 0..=limit is exact in the type (and in the accumulator).
    pub fn limit(self) -> u64 {
        match self {
            Ty::Int8 | Ty::Uint8 => 127,
            Ty::Int32 | Ty::Uint32 => 1 << 20,
            Ty::Int64 | Ty::Uint64 => 1 << 40,
            Ty::Half => 2048,
            Ty::Float => 1 << 24,
            Ty::Double => 1 << 40,
            Ty::Bfloat16 => 256,
            Ty::F8e4m3 => 16,
            Ty::F8e5m2 => 8,
        }
    }

    /// Largest k such that 2^k is exact in the type (bounded by 60).
    fn max_pow2(self) -> u64 {
        match self {
            Ty::Int8 => 6,
            Ty::Uint8 => 7,
            Ty::Int32 => 30,
            Ty::Uint32 => 31,
            Ty::Int64 => 62,
            Ty::Uint64 => 63,
            Ty::Half => 15,
            Ty::F8e4m3 => 8,
            Ty::F8e5m2 => 15,
            Ty::Float | Ty::Double | Ty::Bfloat16 => 60,
        }
    }
}

/// One element type in memory.
pub trait Elem: Copy + 'static {
    /// `v`, which the generators keep exactly representable.
    fn from_int(v: u64) -> Self;
    /// The value if it is a non-negative integer (anything else is never expected).
    fn to_int(self) -> Option<u64>;
    /// What unwritten results hold: a value no result can have.
    fn sentinel() -> Self;
    /// The element with its lowest bit flipped (the corruption test hook).
    fn flip(self) -> Self;
}

macro_rules! int_elem {
    ($t:ty, $sentinel:expr) => {
        impl Elem for $t {
            #[inline]
            fn from_int(v: u64) -> Self {
                v as $t
            }
            #[inline]
            fn to_int(self) -> Option<u64> {
                #[allow(unused_comparisons)]
                if self >= 0 {
                    Some(self as u64)
                } else {
                    None
                }
            }
            fn sentinel() -> Self {
                $sentinel
            }
            fn flip(self) -> Self {
                self ^ 1
            }
        }
    };
}
int_elem!(i8, -1);
int_elem!(u8, u8::MAX);
int_elem!(i32, -1);
int_elem!(u32, u32::MAX);
int_elem!(i64, -1);
int_elem!(u64, u64::MAX);

#[inline]
fn float_to_int(v: f64) -> Option<u64> {
    (v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 18446744073709551616.0).then_some(v as u64)
}

impl Elem for f32 {
    #[inline]
    fn from_int(v: u64) -> Self {
        v as f32
    }
    #[inline]
    fn to_int(self) -> Option<u64> {
        float_to_int(self as f64)
    }
    fn sentinel() -> Self {
        -1.0
    }
    fn flip(self) -> Self {
        f32::from_bits(self.to_bits() ^ 1)
    }
}

impl Elem for f64 {
    #[inline]
    fn from_int(v: u64) -> Self {
        v as f64
    }
    #[inline]
    fn to_int(self) -> Option<u64> {
        float_to_int(self)
    }
    fn sentinel() -> Self {
        -1.0
    }
    fn flip(self) -> Self {
        f64::from_bits(self.to_bits() ^ 1)
    }
}

/// A small binary float format: `E` exponent bits, `M` mantissa bits, bias `B`;
/// `IEEE` = the all-ones exponent means infinity/NaN (otherwise, as in OCP E4M3, only
/// the all-ones pattern is NaN).
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(transparent)]
pub struct Mini<T, const E: u32, const M: u32, const B: i32, const IEEE: bool>(pub T);

pub type Half = Mini<u16, 5, 10, 15, true>;
pub type Bf16 = Mini<u16, 8, 7, 127, true>;
pub type E4m3 = Mini<u8, 4, 3, 7, false>;
pub type E5m2 = Mini<u8, 5, 2, 15, true>;

/// Decodes a small float from its bits.
pub fn mini_decode(bits: u64, e: u32, m: u32, bias: i32, ieee: bool) -> f64 {
    let sign = (bits >> (e + m)) & 1;
    let exp = ((bits >> m) & ((1 << e) - 1)) as i32;
    let man = bits & ((1 << m) - 1);
    let all_ones = (1 << e) - 1;
    let v = if ieee && exp == all_ones {
        if man == 0 {
            f64::INFINITY
        } else {
            f64::NAN
        }
    } else if !ieee && exp == all_ones && man == (1 << m) - 1 {
        f64::NAN
    } else if exp == 0 {
        man as f64 * 2f64.powi(1 - bias - m as i32)
    } else {
        (1.0 + man as f64 / (1u64 << m) as f64) * 2f64.powi(exp - bias)
    };
    if sign == 1 {
        -v
    } else {
        v
    }
}

/// Encodes a non-negative integer that the format represents exactly.
pub fn mini_encode(v: u64, m: u32, bias: i32) -> u64 {
    if v == 0 {
        return 0;
    }
    let e = 63 - v.leading_zeros();
    let frac = v - (1u64 << e);
    // frac / 2^e in units of 2^-m; exact for the values the generators produce.
    let man = if e >= m { frac >> (e - m) } else { frac << (m - e) };
    debug_assert!(e < m || frac & ((1u64 << (e - m)) - 1) == 0, "{v} is not exact with {m} mantissa bits");
    (((e as i32 + bias) as u64) << m) | man
}

macro_rules! mini_elem {
    ($raw:ty) => {
        impl<const E: u32, const M: u32, const B: i32, const IEEE: bool> Elem for Mini<$raw, E, M, B, IEEE> {
            #[inline]
            fn from_int(v: u64) -> Self {
                Mini(mini_encode(v, M, B) as $raw)
            }
            #[inline]
            fn to_int(self) -> Option<u64> {
                float_to_int(mini_decode(self.0 as u64, E, M, B, IEEE))
            }
            fn sentinel() -> Self {
                // -1.0: sign bit and the exponent of 1.0.
                Mini(((1u64 << (E + M)) | ((B as u64) << M)) as $raw)
            }
            fn flip(self) -> Self {
                Mini(self.0 ^ 1)
            }
        }
    };
}
mini_elem!(u16);
mini_elem!(u8);

/// Calls `$body` with `$T` bound to the Rust element type of `$ty`.
#[macro_export]
macro_rules! with_elem {
    ($ty:expr, $T:ident => $body:expr) => {{
        use $crate::data::{Bf16, E4m3, E5m2, Half, Ty};
        match $ty {
            Ty::Int8 => {
                type $T = i8;
                $body
            }
            Ty::Uint8 => {
                type $T = u8;
                $body
            }
            Ty::Int32 => {
                type $T = i32;
                $body
            }
            Ty::Uint32 => {
                type $T = u32;
                $body
            }
            Ty::Int64 => {
                type $T = i64;
                $body
            }
            Ty::Uint64 => {
                type $T = u64;
                $body
            }
            Ty::Half => {
                type $T = Half;
                $body
            }
            Ty::Float => {
                type $T = f32;
                $body
            }
            Ty::Double => {
                type $T = f64;
                $body
            }
            Ty::Bfloat16 => {
                type $T = Bf16;
                $body
            }
            Ty::F8e4m3 => {
                type $T = E4m3;
                $body
            }
            Ty::F8e5m2 => {
                type $T = E5m2;
                $body
            }
        }
    }};
}

/// Which reduction the inputs are built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedKind {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

/// The inputs of one check (or of the timed runs): a function of (seed, rank, index).
#[derive(Clone, Copy, Debug)]
pub struct Gen {
    seed: u64,
    n: u64,
    red: RedKind,
    /// Data values are in 0..=limit.
    limit: u64,
    /// Sum: each rank's value is in 0..=q (q*n <= limit); q == 0: 0/1 values, at most limit ones.
    q: u64,
    /// Prod: at most kmax 2s per element.
    kmax: u64,
    /// Avg: the average is in 0..=amax.
    amax: u64,
}

const SALT_ELEM: u64 = 0x5eed_0000_0000_0001;
const SALT_ELEM2: u64 = 0x5eed_0000_0000_0002;

impl Gen {
    pub fn new(ty: Ty, red: RedKind, nranks: usize, seed: u64) -> Gen {
        let n = nranks as u64;
        let limit = ty.limit();
        // Avg sums n values of up to 2*amax: keep the sum exact in the accumulator
        // (float32 for the narrow floats) and free of integer overflow.
        let acc_limit: u64 = match ty {
            Ty::Int8 | Ty::Uint8 => 127,
            Ty::Int32 | Ty::Uint32 => 1 << 30,
            Ty::Int64 | Ty::Uint64 => 1 << 62,
            Ty::Double => 1 << 53,
            _ => 1 << 24,
        };
        Gen {
            seed: mix(seed.wrapping_add(0x9e37_79b9_7f4a_7c15)),
            n,
            red,
            limit,
            q: limit / n,
            kmax: ty.max_pow2().min(n),
            amax: (limit / 2).min(acc_limit / (2 * n)),
        }
    }

    /// Inputs whose contributions, partial results (in any order) and result are all
    /// exact in `ty` as well, for a reduction that moves them in `ty` (all_reduce_wire's
    /// wire type): as [`Gen::new`] for `ty`, with avg's values bounded so that any
    /// partial sum, not only the total, stays within ty's exact integers. Every value
    /// is a non-negative integer no larger than ty's limit, so it is exact in any wider
    /// float type too.
    pub fn exact_partials(ty: Ty, red: RedKind, nranks: usize, seed: u64) -> Gen {
        let mut g = Gen::new(ty, red, nranks, seed);
        g.amax = g.amax.min(g.limit / (2 * g.n));
        g
    }

    #[inline]
    fn h(&self, a: u64, b: u64) -> u64 {
        mix(self.seed ^ a.wrapping_mul(0xd6e8_feb8_6659_fd93) ^ b.wrapping_mul(0xa076_1d64_78bd_642f))
    }

    /// Data element `j` that rank `r` contributes (non-reducing collectives).
    #[inline]
    pub fn data(&self, r: usize, j: usize) -> u64 {
        below_of(self.h(r as u64 + 1, j as u64), self.limit + 1)
    }

    /// Input element `j` of rank `r` for the reduction.
    #[inline]
    pub fn red_input(&self, r: usize, j: usize) -> u64 {
        let (r, j) = (r as u64, j as u64);
        match self.red {
            RedKind::Max | RedKind::Min => below_of(self.h(r + 1, j), self.limit + 1),
            RedKind::Sum => {
                if self.q >= 1 {
                    below_of(self.h(r + 1, j), self.q + 1)
                } else {
                    let k = below_of(self.h(SALT_ELEM, j), self.limit + 1);
                    u64::from((r + j) % self.n < k)
                }
            }
            RedKind::Prod => {
                let k = below_of(self.h(SALT_ELEM, j), self.kmax + 1);
                1 + u64::from((r + j) % self.n < k)
            }
            RedKind::Avg => {
                let a = below_of(self.h(SALT_ELEM, j), self.amax + 1);
                let s = below_of(self.h(SALT_ELEM2, j), a + 1);
                if r % 2 == 1 {
                    a - s
                } else if r + 1 < self.n {
                    a + s
                } else {
                    a
                }
            }
        }
    }

    /// The exact reduction of element `j` over all ranks.
    #[inline]
    pub fn red_expected(&self, j: usize) -> u64 {
        let mut acc = self.red_input(0, j);
        for r in 1..self.n as usize {
            let v = self.red_input(r, j);
            acc = match self.red {
                RedKind::Sum | RedKind::Avg => acc + v,
                RedKind::Prod => acc * v,
                RedKind::Max => acc.max(v),
                RedKind::Min => acc.min(v),
            };
        }
        if self.red == RedKind::Avg {
            acc / self.n
        } else {
            acc
        }
    }
}

/// A typed view of `len` elements at `p` (which is aligned for T).
///
/// # Safety
/// `p` points to `len` initialised elements of T, valid and unaliased while the slice lives.
pub unsafe fn slice<'a, T>(p: *mut u8, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(p as *mut T, len) }
}

/// Reduction operator named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

impl Op {
    pub const ALL: [Op; 5] = [Op::Sum, Op::Prod, Op::Max, Op::Min, Op::Avg];
    pub fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Max => "max",
            Op::Min => "min",
            Op::Avg => "avg",
        }
    }
    /// The fcclRedOp_t value.
    pub fn c_value(self) -> ferroccl::ffi::fcclRedOp_t {
        use ferroccl::ffi::*;
        match self {
            Op::Sum => fcclSum,
            Op::Prod => fcclProd,
            Op::Max => fcclMax,
            Op::Min => fcclMin,
            Op::Avg => fcclAvg,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minifloats_round_trip_and_decode() {
        for v in 0..=16u64 {
            assert_eq!(E4m3::from_int(v).to_int(), Some(v));
        }
        for v in 0..=8u64 {
            assert_eq!(E5m2::from_int(v).to_int(), Some(v));
        }
        for v in 0..=2048u64 {
            assert_eq!(Half::from_int(v).to_int(), Some(v));
        }
        for v in 0..=256u64 {
            assert_eq!(Bf16::from_int(v).to_int(), Some(v));
            assert_eq!(Bf16::from_int(v).0, ((v as f32).to_bits() >> 16) as u16);
        }
        assert_eq!(E4m3::from_int(256).to_int(), Some(256));
        assert_eq!(E5m2::from_int(1 << 15).to_int(), Some(1 << 15));
        assert_eq!(mini_decode(0x7e, 4, 3, 7, false), 448.0);
        assert!(mini_decode(0x7f, 4, 3, 7, false).is_nan());
        assert_eq!(mini_decode(0x7b, 5, 2, 15, true), 57344.0);
        assert_eq!(mini_decode(0x7c, 5, 2, 15, true), f64::INFINITY);
        assert_eq!(Half::sentinel().0, 0xbc00);
        assert_eq!(Half::sentinel().to_int(), None);
        assert_eq!(E4m3::sentinel().to_int(), None);
        assert_ne!(E4m3::from_int(0).flip().to_int(), Some(0));
    }

    #[test]
    fn exact_partials_keep_every_partial_sum_in_range() {
        for ty in [Ty::Bfloat16, Ty::Half, Ty::F8e4m3, Ty::F8e5m2] {
            for red in [RedKind::Sum, RedKind::Prod, RedKind::Max, RedKind::Min, RedKind::Avg] {
                for n in [1usize, 2, 3, 4, 7, 16, 33] {
                    let g = Gen::exact_partials(ty, red, n, 5);
                    for j in 0..200 {
                        let vals: Vec<u64> = (0..n).map(|r| g.red_input(r, j)).collect();
                        match red {
                            // Inputs are >= 0, so every partial sum is at most the total.
                            RedKind::Sum | RedKind::Avg => {
                                assert!(vals.iter().sum::<u64>() <= ty.limit(), "{ty:?} {red:?} n={n}")
                            }
                            RedKind::Prod => {
                                let e = g.red_expected(j);
                                assert!(e.is_power_of_two() && e.trailing_zeros() as u64 <= ty.max_pow2());
                            }
                            RedKind::Max | RedKind::Min => assert!(vals.iter().all(|&v| v <= ty.limit())),
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn expected_results_stay_exact() {
        for ty in Ty::ALL {
            for red in [RedKind::Sum, RedKind::Prod, RedKind::Max, RedKind::Min, RedKind::Avg] {
                for n in [1usize, 2, 3, 4, 7, 16, 33] {
                    let g = Gen::new(ty, red, n, 3);
                    for j in 0..200 {
                        let mut sum = 0;
                        for r in 0..n {
                            let v = g.red_input(r, j);
                            sum += v;
                            let max_in = if red == RedKind::Prod { 2 } else { ty.limit() };
                            assert!(v <= max_in, "{ty:?} {red:?} n={n} input {v}");
                        }
                        let e = g.red_expected(j);
                        if red == RedKind::Avg {
                            assert_eq!(sum % n as u64, 0, "{ty:?} n={n}");
                        }
                        if red != RedKind::Prod {
                            assert!(e <= ty.limit(), "{ty:?} {red:?} n={n}: {e}");
                        } else {
                            assert!(e.is_power_of_two() && e.trailing_zeros() as u64 <= ty.max_pow2());
                        }
                    }
                }
            }
        }
    }
}
