//! The element types (load, store, arithmetic, conversion) and the operators the
//! reduction kernels are generic over.

use super::convert::*;

// ---------------------------------------------------------------------------------
// Element types.
// ---------------------------------------------------------------------------------

/// A value stored in a buffer as `SIZE` native-endian bytes, at any alignment.
pub(super) trait Elem: Copy {
    const SIZE: usize;
    /// `bytes.len() == SIZE` (it comes from `chunks_exact(SIZE)`).
    fn load(bytes: &[u8]) -> Self;
    fn store(self, bytes: &mut [u8]);
}

/// Arithmetic of an accumulator type (the integers, f32, f64).
pub(super) trait Arith: Elem {
    fn red_sum(self, other: Self) -> Self;
    fn red_prod(self, other: Self) -> Self;
    fn red_max(self, other: Self) -> Self;
    fn red_min(self, other: Self) -> Self;
    fn red_and(self, other: Self) -> Self;
    fn red_or(self, other: Self) -> Self;
    fn red_xor(self, other: Self) -> Self;
    /// `self / nranks` for `Avg`: truncating for integers, rounded for floats.
    fn div_ranks(self, nranks: usize) -> Self;
}

/// An element type together with the accumulator it is reduced in.
pub(super) trait Reducible: Elem {
    type Acc: Arith;
    fn widen(self) -> Self::Acc;
    fn narrow(acc: Self::Acc) -> Self;
}

/// Conversion between element types for [`convert`]. Each source type forwards its
/// value to the most exact of the three constructors.
pub(super) trait Convert: Elem {
    /// From an integer value: wraps into integer types, rounds to nearest even into
    /// float types.
    fn from_int(v: i128) -> Self;
    /// From a float32 value: rounds to nearest even into float types; into integer
    /// types truncates toward zero and saturates, NaN giving 0 (Rust's `as`; C leaves
    /// out-of-range values undefined).
    fn from_f32(v: f32) -> Self;
    /// From a float64 value, same rules as `from_f32`.
    fn from_f64(v: f64) -> Self;
    /// Calls the constructor of `T` that keeps `self` exactly.
    fn convert_to<T: Convert>(self) -> T;
}

macro_rules! impl_load_store {
    ($t:ty, $bits:ty, |$v:ident| $to_bits:expr, |$b:ident| $from_bits:expr) => {
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$bits>();
            #[inline(always)]
            fn load(bytes: &[u8]) -> Self {
                // The length is known to be SIZE, so the unwrap folds away.
                let $b = <$bits>::from_ne_bytes(bytes.try_into().unwrap());
                $from_bits
            }
            #[inline(always)]
            fn store(self, bytes: &mut [u8]) {
                let $v = self;
                bytes.copy_from_slice(&$to_bits.to_ne_bytes());
            }
        }
    };
}

/// Integer conversion for `Avg`, truncating toward zero.
///
/// For 8- and 32-bit types the division is done in float64, which vectorizes (x86 has
/// no vector integer division) and is exact after truncation: with |s| <= 2^32 and
/// q = s / n, the rounding error of the f64 quotient is at most |q| 2^-53 <=
/// 2^-21 / n, less than the 1/n gap between a non-integer q and the nearest
/// integers, so truncating the rounded quotient gives trunc(q); integer quotients are
/// exact. (For n > 2^53, where `n as f64` is inexact, |q| < 1 and both give 0.)
macro_rules! div_small_int {
    ($t:ty) => {
        #[inline(always)]
        fn div_ranks(self, nranks: usize) -> Self {
            (f64::from(self) / nranks as f64) as $t
        }
    };
}

macro_rules! impl_int {
    ($($t:ty: $div:tt),* $(,)?) => {$(
        impl_load_store!($t, $t, |v| v, |b| b);

        impl Arith for $t {
            #[inline(always)]
            fn red_sum(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            #[inline(always)]
            fn red_prod(self, other: Self) -> Self {
                self.wrapping_mul(other)
            }
            #[inline(always)]
            fn red_max(self, other: Self) -> Self {
                Ord::max(self, other)
            }
            #[inline(always)]
            fn red_min(self, other: Self) -> Self {
                Ord::min(self, other)
            }
            #[inline(always)]
            fn red_and(self, other: Self) -> Self {
                self & other
            }
            #[inline(always)]
            fn red_or(self, other: Self) -> Self {
                self | other
            }
            #[inline(always)]
            fn red_xor(self, other: Self) -> Self {
                self ^ other
            }
            impl_int!(@div $t, $div);
        }

        impl Reducible for $t {
            type Acc = $t;
            #[inline(always)]
            fn widen(self) -> $t {
                self
            }
            #[inline(always)]
            fn narrow(acc: $t) -> Self {
                acc
            }
        }

        impl Convert for $t {
            #[inline(always)]
            fn from_int(v: i128) -> Self {
                v as $t // keeps the low bits: C's conversion to unsigned, two's complement
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                v as $t
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn convert_to<T: Convert>(self) -> T {
                T::from_int(i128::from(self))
            }
        }
    )*};
    (@div $t:ty, small) => {
        div_small_int!($t);
    };
    (@div $t:ty, i64) => {
        #[inline(always)]
        fn div_ranks(self, nranks: usize) -> Self {
            match i64::try_from(nranks) {
                Ok(n) => self / n, // n >= 1, so neither overflow nor division by zero
                Err(_) => (i128::from(self) / nranks as i128) as i64,
            }
        }
    };
    (@div $t:ty, u64) => {
        #[inline(always)]
        fn div_ranks(self, nranks: usize) -> Self {
            self / nranks as u64
        }
    };
}

impl_int!(i8: small, u8: small, i32: small, u32: small, i64: i64, u64: u64);

macro_rules! impl_native_float {
    ($($t:ty),*) => {$(
        impl_load_store!($t, $t, |v| v, |b| b);

        impl Arith for $t {
            #[inline(always)]
            fn red_sum(self, other: Self) -> Self {
                self + other
            }
            #[inline(always)]
            fn red_prod(self, other: Self) -> Self {
                self * other
            }
            // fmaxf/fminf semantics (see the module docs): a NaN operand loses.
            #[inline(always)]
            fn red_max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            #[inline(always)]
            fn red_min(self, other: Self) -> Self {
                <$t>::min(self, other)
            }
            // The API refuses bitwise operators on floats (RedOp::takes); defined on
            // the bits so that every (type, operator) pair still compiles to a kernel.
            #[inline(always)]
            fn red_and(self, other: Self) -> Self {
                <$t>::from_bits(self.to_bits() & other.to_bits())
            }
            #[inline(always)]
            fn red_or(self, other: Self) -> Self {
                <$t>::from_bits(self.to_bits() | other.to_bits())
            }
            #[inline(always)]
            fn red_xor(self, other: Self) -> Self {
                <$t>::from_bits(self.to_bits() ^ other.to_bits())
            }
            #[inline(always)]
            fn div_ranks(self, nranks: usize) -> Self {
                self / nranks as $t
            }
        }

        impl Reducible for $t {
            type Acc = $t;
            #[inline(always)]
            fn widen(self) -> $t {
                self
            }
            #[inline(always)]
            fn narrow(acc: $t) -> Self {
                acc
            }
        }
    )*};
}

impl_native_float!(f32, f64);

impl Convert for f32 {
    #[inline(always)]
    fn from_int(v: i128) -> Self {
        v as f32 // Rust rounds integer -> float casts to nearest even
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn convert_to<T: Convert>(self) -> T {
        T::from_f32(self)
    }
}

impl Convert for f64 {
    #[inline(always)]
    fn from_int(v: i128) -> Self {
        v as f64
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f64::from(v)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn convert_to<T: Convert>(self) -> T {
        T::from_f64(self)
    }
}

/// IEEE half, as its bits.
#[derive(Clone, Copy)]
pub(super) struct F16(pub(super) u16);
/// bfloat16, as its bits.
#[derive(Clone, Copy)]
pub(super) struct Bf16(pub(super) u16);
/// OCP fp8 E4M3, as its bits.
#[derive(Clone, Copy)]
pub(super) struct F8E4M3(pub(super) u8);
/// OCP fp8 E5M2, as its bits.
#[derive(Clone, Copy)]
pub(super) struct F8E5M2(pub(super) u8);

macro_rules! impl_narrow_float {
    ($($t:ident($bits:ty): $to_f32:ident, $from_f32:ident);* $(;)?) => {$(
        impl_load_store!($t, $bits, |v| v.0, |b| $t(b));

        impl Reducible for $t {
            type Acc = f32;
            #[inline(always)]
            fn widen(self) -> f32 {
                $to_f32(self.0)
            }
            #[inline(always)]
            fn narrow(acc: f32) -> Self {
                $t($from_f32(acc))
            }
        }

        impl Convert for $t {
            #[inline(always)]
            fn from_int(v: i128) -> Self {
                $t($from_f32(i128_to_f32_odd(v)))
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                $t($from_f32(v))
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                $t($from_f32(f64_to_f32_odd(v)))
            }
            #[inline(always)]
            fn convert_to<T: Convert>(self) -> T {
                T::from_f32($to_f32(self.0)) // widening to f32 is exact
            }
        }
    )*};
}

impl_narrow_float! {
    F16(u16): f16_to_f32, f32_to_f16;
    Bf16(u16): bf16_to_f32, f32_to_bf16;
    F8E4M3(u8): f8e4m3_to_f32, f32_to_f8e4m3;
    F8E5M2(u8): f8e5m2_to_f32, f32_to_f8e5m2;
}

// ---------------------------------------------------------------------------------
// Operators.
// ---------------------------------------------------------------------------------

/// A binary reduction operator, as a type so that kernels monomorphize on it.
pub(super) trait Combine {
    fn apply<A: Arith>(a: A, b: A) -> A;
}

/// Also used for `Avg`, whose division happens once, when finishing.
pub(super) struct SumOp;
pub(super) struct ProdOp;
pub(super) struct MaxOp;
pub(super) struct MinOp;
pub(super) struct AndOp;
pub(super) struct OrOp;
pub(super) struct XorOp;

/// Each operator applies its `Arith` method.
macro_rules! combine {
    ($($op:ident => $m:ident),* $(,)?) => {$(
        impl Combine for $op {
            #[inline(always)]
            fn apply<A: Arith>(a: A, b: A) -> A {
                a.$m(b)
            }
        }
    )*};
}
combine!(SumOp => red_sum, ProdOp => red_prod, MaxOp => red_max, MinOp => red_min, AndOp => red_and,
    OrOp => red_or, XorOp => red_xor);
