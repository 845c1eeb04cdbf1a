//! Element-wise reductions over raw byte buffers.
//!
//! Every collective that combines data (all_reduce, reduce, reduce_scatter, ...) ends
//! up here, on every byte it moves, so the loops are written to be auto-vectorized:
//!
//! * Buffers are `&[u8]` because they come from C pointers with no alignment promise.
//!   Elements are read and written with `from_ne_bytes`/`to_ne_bytes` over
//!   `chunks_exact`, which LLVM turns into unaligned vector loads and stores; nothing
//!   is ever reinterpreted as `&[f32]`.
//! * The (type, operator) pair is matched once per call. Each arm calls a generic
//!   kernel monomorphized for that pair, so the per-element body is straight-line code
//!   with no dispatch. The 12 types x 8 operators come from a few traits (`Elem`,
//!   `Arith`, `Reducible`, `Combine`) and dispatch macros, not 96 hand-written loops.
//!   The bitwise operators are refused for float types before they get here.
//! * Conversions between float32 and the narrow float types (half, bfloat16, fp8) are
//!   written branch-free with integer and float arithmetic only, so that they vectorize
//!   inside the loops. (The `half` crate's per-value conversions branch on run-time CPU
//!   feature detection and stay scalar; the tests use it as an independent reference.)
//! * On x86_64 every kernel is also compiled with AVX2 enabled and chosen at run time
//!   (`kernels!`), which is the only `unsafe` here: the narrow float conversions are
//!   compute-bound, so 8 lanes beat the SSE2 baseline's 4.
//!
//! Semantics (docs/abi.md, NCCL):
//! * Integers wrap (two's complement); `Avg` is the wrapped sum divided by `nranks`,
//!   truncated toward zero like C.
//! * Half, bfloat16 and fp8 accumulate in float32 and are rounded once per output
//!   element, to nearest even. Float32 accumulates in float32, Float64 in float64.
//!   `Avg` on floats is `sum / nranks` in the accumulator type, then rounded.
//! * `Max`/`Min` on floats follow CUDA's `fmaxf`/`fminf` (and `__hmax`/`__hmin`), which
//!   NCCL uses on the GPU: if exactly one operand is NaN the other one is returned; NaN
//!   only when both are. This is IEEE 754-2008 maxNum/minNum, i.e. Rust's `f32::max`.
//!   The sign of a zero result when comparing `-0.0` with `+0.0` is unspecified.
//! * fp8 E4M3 (OCP "fn": bias 7, no infinities, NaN = S.1111.111, max 448) saturates:
//!   any finite value or infinity beyond +-448 becomes +-448, NaN stays NaN. This is
//!   CUDA's `__NV_SATFINITE`, which NCCL's fp8 kernels use.
//! * fp8 E5M2 (OCP: bias 15, IEEE-like infinities and NaNs) rounds like IEEE: values at
//!   or beyond the midpoint between the largest finite value (57344) and the next
//!   power of two (61440 and up) become +-inf, infinities stay infinities. Note that
//!   CUDA's `__nv_fp8_e5m2(float)` constructor saturates instead; this module follows
//!   the project's contract (IEEE overflow) for E5M2.
//! * Narrowing NaN gives the target's canonical quiet NaN with the input's sign.

#![deny(unsafe_code)] // except the checked AVX2 dispatch in `kernels!`

mod convert;
mod elem;
mod scale;

#[cfg(test)]
use convert::*;
pub use convert::{f32_to_f8e4m3, f32_to_f8e5m2, f8e4m3_to_f32, f8e5m2_to_f32};
use elem::*;
pub use scale::pre_multiply;

use crate::types::{DataType, RedOp};

// ---------------------------------------------------------------------------------
// Dispatch: one `match` per call binds a type alias, and the body is compiled once per
// arm.
// ---------------------------------------------------------------------------------

/// Runs `$body` with `$T` bound to the element type of a native `$dtype` (one whose
/// accumulator is itself); evaluates `$narrow` for the four narrow float types.
macro_rules! with_native {
    ($dtype:expr, $T:ident => $body:expr, narrow => $narrow:expr) => {
        match $dtype {
            DataType::Int8 => {
                type $T = i8;
                $body
            }
            DataType::Uint8 => {
                type $T = u8;
                $body
            }
            DataType::Int32 => {
                type $T = i32;
                $body
            }
            DataType::Uint32 => {
                type $T = u32;
                $body
            }
            DataType::Int64 => {
                type $T = i64;
                $body
            }
            DataType::Uint64 => {
                type $T = u64;
                $body
            }
            DataType::Float32 => {
                type $T = f32;
                $body
            }
            DataType::Float64 => {
                type $T = f64;
                $body
            }
            DataType::Float16 | DataType::Bfloat16 | DataType::Float8e4m3 | DataType::Float8e5m2 => $narrow,
        }
    };
}

/// Runs `$body` with `$T` bound to the element type of a narrow float `$dtype`;
/// evaluates `$native` for the others.
macro_rules! with_narrow {
    ($dtype:expr, $T:ident => $body:expr, native => $native:expr) => {
        match $dtype {
            DataType::Float16 => {
                type $T = F16;
                $body
            }
            DataType::Bfloat16 => {
                type $T = Bf16;
                $body
            }
            DataType::Float8e4m3 => {
                type $T = F8E4M3;
                $body
            }
            DataType::Float8e5m2 => {
                type $T = F8E5M2;
                $body
            }
            DataType::Int8
            | DataType::Uint8
            | DataType::Int32
            | DataType::Uint32
            | DataType::Int64
            | DataType::Uint64
            | DataType::Float32
            | DataType::Float64 => $native,
        }
    };
}

/// Runs `$body` with `$T` bound to the element type of any `$dtype`.
macro_rules! with_any {
    ($dtype:expr, $T:ident => $body:expr) => {
        with_native!($dtype, $T => $body, narrow => with_narrow!($dtype, $T => $body,
            native => unreachable!()))
    };
}

/// Runs `$body` with `$O` bound to the combining operator of `$op` (`Avg` sums).
macro_rules! with_op {
    ($op:expr, $O:ident => $body:expr) => {
        match $op {
            RedOp::Sum | RedOp::Avg => {
                type $O = SumOp;
                $body
            }
            RedOp::Prod => {
                type $O = ProdOp;
                $body
            }
            RedOp::Max => {
                type $O = MaxOp;
                $body
            }
            RedOp::Min => {
                type $O = MinOp;
                $body
            }
            RedOp::Band => {
                type $O = AndOp;
                $body
            }
            RedOp::Bor => {
                type $O = OrOp;
                $body
            }
            RedOp::Bxor => {
                type $O = XorOp;
                $body
            }
        }
    };
}

// ---------------------------------------------------------------------------------
// Kernels. Each is one pass of `chunks_exact` zips with a straight-line body.
// ---------------------------------------------------------------------------------

/// What `acc_finish` does to an accumulated value before narrowing it.
trait Finish {
    fn apply<A: Arith>(v: A, nranks: usize) -> A;
}
/// Every operator but `Avg`.
struct Keep;
/// `Avg`.
struct DivideByRanks;

impl Finish for Keep {
    #[inline(always)]
    fn apply<A: Arith>(v: A, _nranks: usize) -> A {
        v
    }
}
impl Finish for DivideByRanks {
    #[inline(always)]
    fn apply<A: Arith>(v: A, nranks: usize) -> A {
        v.div_ranks(nranks)
    }
}

/// Defines each kernel twice: as written (for the target's baseline, SSE2 on x86_64)
/// and, on x86_64, compiled with AVX2 enabled, picked at run time once per call.
///
/// The body is portable Rust either way; the AVX2 copy only lets LLVM auto-vectorize
/// it 8 floats wide instead of 4 and use variable blends and 32-bit min/max, which
/// speeds up the narrow float conversions (the native types are bound by
/// memory bandwidth beyond the caches either way). Both copies compute the same
/// results: Rust never contracts or reassociates float arithmetic, so the wider
/// vectors only change how many elements one instruction handles.
macro_rules! kernels {
    ($(
        $(#[$doc:meta])*
        fn $name:ident<$($g:ident: $bound:path),+>($($arg:ident: $ty:ty),+ $(,)?) $body:block
    )*) => {$(
        $(#[$doc])*
        #[inline(never)]
        fn $name<$($g: $bound),+>($($arg: $ty),+) {
            #[inline(always)]
            fn portable<$($g: $bound),+>($($arg: $ty),+) $body

            #[cfg(target_arch = "x86_64")]
            {
                #[allow(unsafe_code)] // `target_feature` needs an `unsafe fn` before Rust 1.86
                #[target_feature(enable = "avx2")]
                unsafe fn avx2<$($g: $bound),+>($($arg: $ty),+) {
                    portable::<$($g),+>($($arg),+)
                }
                if use_avx2() {
                    // SAFETY: `avx2` has no requirement besides the CPU supporting the
                    // AVX2 instructions it was compiled with, checked just above.
                    #[allow(unsafe_code)]
                    let done = unsafe { avx2::<$($g),+>($($arg),+) };
                    return done;
                }
            }
            portable::<$($g),+>($($arg),+)
        }
    )*};
}

/// Whether the AVX2 copies of the kernels can run on this CPU. (The detection is
/// cached by the standard library: one atomic load per call.)
#[cfg(target_arch = "x86_64")]
#[inline]
fn use_avx2() -> bool {
    !portable_only() && std::arch::is_x86_feature_detected!("avx2")
}

#[cfg(all(target_arch = "x86_64", not(test)))]
#[inline(always)]
fn portable_only() -> bool {
    false
}

// Tests force the portable kernels on some threads, so that an AVX2 machine checks
// both copies.
#[cfg(test)]
thread_local! {
    static PORTABLE_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(all(target_arch = "x86_64", test))]
fn portable_only() -> bool {
    PORTABLE_ONLY.with(|p| p.get())
}

kernels! {
    /// dst = narrow(op(widen(dst), widen(src))).
    fn k_inplace<T: Reducible, O: Combine>(dst: &mut [u8], src: &[u8]) {
        for (d, s) in dst.chunks_exact_mut(T::SIZE).zip(src.chunks_exact(T::SIZE)) {
            let r = O::apply(T::load(d).widen(), T::load(s).widen());
            T::narrow(r).store(d);
        }
    }

    /// acc = widen(src).
    fn k_acc_init<T: Reducible>(acc: &mut [u8], src: &[u8]) {
        let acc_size = <T::Acc as Elem>::SIZE;
        for (a, s) in acc.chunks_exact_mut(acc_size).zip(src.chunks_exact(T::SIZE)) {
            T::load(s).widen().store(a);
        }
    }

    /// acc = op(acc, widen(src)).
    fn k_acc_reduce<T: Reducible, O: Combine>(acc: &mut [u8], src: &[u8]) {
        let acc_size = <T::Acc as Elem>::SIZE;
        for (a, s) in acc.chunks_exact_mut(acc_size).zip(src.chunks_exact(T::SIZE)) {
            O::apply(T::Acc::load(a), T::load(s).widen()).store(a);
        }
    }

    /// acc = op(widen(a), widen(b)).
    fn k_acc_init2<T: Reducible, O: Combine>(acc: &mut [u8], a: &[u8], b: &[u8]) {
        let acc_size = <T::Acc as Elem>::SIZE;
        let inputs = a.chunks_exact(T::SIZE).zip(b.chunks_exact(T::SIZE));
        for (r, (x, y)) in acc.chunks_exact_mut(acc_size).zip(inputs) {
            O::apply(T::load(x).widen(), T::load(y).widen()).store(r);
        }
    }

    /// dst = narrow(finish(acc)).
    fn k_finish<T: Reducible, F: Finish>(nranks: usize, acc: &[u8], dst: &mut [u8]) {
        let acc_size = <T::Acc as Elem>::SIZE;
        for (d, a) in dst.chunks_exact_mut(T::SIZE).zip(acc.chunks_exact(acc_size)) {
            T::narrow(F::apply(T::Acc::load(a), nranks)).store(d);
        }
    }

    /// buf = narrow(widen(buf) / nranks).
    fn k_div_inplace<T: Reducible>(nranks: usize, buf: &mut [u8]) {
        for b in buf.chunks_exact_mut(T::SIZE) {
            T::narrow(T::load(b).widen().div_ranks(nranks)).store(b);
        }
    }

    /// dst = src converted from S to D.
    fn k_convert<S: Convert, D: Convert>(src: &[u8], dst: &mut [u8]) {
        for (d, s) in dst.chunks_exact_mut(D::SIZE).zip(src.chunks_exact(S::SIZE)) {
            S::load(s).convert_to::<D>().store(d);
        }
    }
}

// ---------------------------------------------------------------------------------
// Public API.
// ---------------------------------------------------------------------------------

/// Number of elements of `dtype` in `buf`; panics if `buf` holds a partial element.
fn elems(dtype: DataType, buf: &[u8]) -> usize {
    let size = dtype.size();
    assert!(buf.len() % size == 0, "{} buffer of {} bytes is not a whole number of elements", dtype, buf.len());
    buf.len() / size
}

/// Checks that `buf` holds exactly `n` elements of `elem_size` bytes. Mismatched
/// lengths are a caller bug; checking once per call keeps them from silently
/// reducing a prefix.
fn check_len(what: &str, buf: &[u8], n: usize, elem_size: usize) {
    assert_eq!(buf.len(), n * elem_size, "{what}: expected {n} elements of {elem_size} bytes");
}

fn check_avg_ranks(op: RedOp, nranks: usize) {
    assert!(op != RedOp::Avg || nranks > 0, "Avg over zero ranks");
}

/// `dst[i] = dst[i] op src[i]`, in the element type itself: narrow floats are widened
/// to float32, combined and rounded back at every call. (That equals native
/// half/bfloat16/fp8 arithmetic, rounded once: float32's 24-bit significand is at
/// least twice theirs plus two bits, which makes rounding first to float32 harmless
/// for a single addition or multiplication.)
///
/// For `Avg` this sums; the division is applied by [`finish_inplace`].
pub fn reduce_inplace(dtype: DataType, op: RedOp, dst: &mut [u8], src: &[u8]) {
    let n = elems(dtype, src);
    check_len("reduce_inplace dst", dst, n, dtype.size());
    with_any!(dtype, T => with_op!(op, O => k_inplace::<T, O>(dst, src)));
}

/// `acc[i] = widen(src[i])`; `acc` holds `dtype.acc_size()` bytes per element.
pub fn acc_init(dtype: DataType, acc: &mut [u8], src: &[u8]) {
    let n = elems(dtype, src);
    check_len("acc_init acc", acc, n, dtype.acc_size());
    with_narrow!(dtype, T => k_acc_init::<T>(acc, src), native => acc.copy_from_slice(src));
}

/// `acc[i] = acc[i] op widen(src[i])`; for `Avg` this accumulates the sum.
pub fn acc_reduce(dtype: DataType, op: RedOp, acc: &mut [u8], src: &[u8]) {
    let n = elems(dtype, src);
    check_len("acc_reduce acc", acc, n, dtype.acc_size());
    with_narrow!(dtype, T => with_op!(op, O => k_acc_reduce::<T, O>(acc, src)),
        native => reduce_inplace(dtype, op, acc, src));
}

/// `acc[i] = widen(a[i]) op widen(b[i])`: the first step of a reduction fused into one
/// pass. For `Avg` this is the sum.
pub fn acc_init2(dtype: DataType, op: RedOp, acc: &mut [u8], a: &[u8], b: &[u8]) {
    let n = elems(dtype, a);
    check_len("acc_init2 b", b, n, dtype.size());
    check_len("acc_init2 acc", acc, n, dtype.acc_size());
    with_any!(dtype, T => with_op!(op, O => k_acc_init2::<T, O>(acc, a, b)));
}

/// `dst[i] = narrow(acc[i])`, dividing by `nranks` first for `Avg` (integer division
/// truncating toward zero for integers). `acc` holds `dtype.acc_size()` bytes per
/// element. When accumulator and destination are the same memory (native types), use
/// [`finish_inplace`].
///
/// Panics if `op` is `Avg` and `nranks` is 0.
pub fn acc_finish(dtype: DataType, op: RedOp, nranks: usize, acc: &[u8], dst: &mut [u8]) {
    let n = elems(dtype, dst);
    check_len("acc_finish acc", acc, n, dtype.acc_size());
    check_avg_ranks(op, nranks);
    if op == RedOp::Avg {
        with_any!(dtype, T => k_finish::<T, DivideByRanks>(nranks, acc, dst));
    } else {
        with_narrow!(dtype, T => k_finish::<T, Keep>(nranks, acc, dst),
            native => dst.copy_from_slice(acc));
    }
}

/// Finishes a reduction whose accumulator is the destination itself (native types,
/// where `acc_size() == size()`): divides by `nranks` in place for `Avg`, nothing for
/// the other operators.
///
/// Narrow float types have a separate float32 accumulator and must use [`acc_finish`]:
/// calling this for one is a bug caught by a debug assertion. Release builds divide
/// in place in the narrow type (rounding once more) rather than leave a sum behind.
///
/// Panics if `op` is `Avg` and `nranks` is 0.
pub fn finish_inplace(dtype: DataType, op: RedOp, nranks: usize, buf: &mut [u8]) {
    debug_assert!(
        !dtype.is_narrow_float(),
        "finish_inplace called for {dtype}, which finishes from a float32 accumulator"
    );
    elems(dtype, buf); // checks for a partial element
    check_avg_ranks(op, nranks);
    // Dividing by 1 changes nothing, so a single rank skips the pass.
    if op == RedOp::Avg && nranks != 1 {
        with_any!(dtype, T => k_div_inplace::<T>(nranks, buf));
    }
}

/// `dst` = the reduction of `n` >= 2 operands `src(0)`, ..., `src(n - 1)` (each
/// `dst.len()` bytes), applied in that order and finished (`Avg` divided by `n`):
/// whoever computes it gets the same bits. Narrow floats accumulate in float32 in
/// `acc` (`dst.len() / dtype.size() * dtype.acc_size()` bytes) and are rounded
/// once; other types reduce in `dst` itself and leave `acc` alone (it may be empty).
pub fn reduce_all<'a>(
    dtype: DataType,
    op: RedOp,
    n: usize,
    src: impl Fn(usize) -> &'a [u8],
    dst: &mut [u8],
    acc: &mut [u8],
) {
    assert!(n >= 2, "reduce_all of {n} operands");
    if dtype.is_narrow_float() {
        acc_init2(dtype, op, acc, src(0), src(1));
        for p in 2..n {
            acc_reduce(dtype, op, acc, src(p));
        }
        acc_finish(dtype, op, n, acc, dst);
    } else {
        acc_init2(dtype, op, dst, src(0), src(1));
        for p in 2..n {
            reduce_inplace(dtype, op, dst, src(p));
        }
        finish_inplace(dtype, op, n, dst);
    }
}

/// Converts the elements of `src` (of type `from`) into `dst` (of type `to`), for
/// "wire type" transfers.
///
/// * Float to float: the value is widened exactly and rounded once to nearest even
///   (float64 sources narrow through round-to-odd, so they too are rounded only once).
///   Narrowing follows the same overflow rules as the reductions.
/// * Integer to integer: C value casts (keep the low bits, two's complement).
/// * Integer to float: rounded once to nearest even.
/// * Float to integer: truncation toward zero, saturating at the type's bounds, NaN
///   giving 0 (Rust's `as`; C leaves out-of-range values undefined).
pub fn convert(from: DataType, src: &[u8], to: DataType, dst: &mut [u8]) {
    let n = elems(from, src);
    check_len("convert dst", dst, n, to.size());
    if from == to {
        dst.copy_from_slice(src);
        return;
    }
    with_any!(from, S => with_any!(to, D => k_convert::<S, D>(src, dst)));
}

#[cfg(test)]
mod tests;
