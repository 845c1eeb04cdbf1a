//! CUDA C source of the device reductions (compiled at run time by `cuda_reduce`, and by
//! the simulated GPU, which compiles this very module's output: docs/sim-gpu.md).
//!
//! A kernel computes, for every element, what `mem::reduce` computes on the host, to
//! the bit: integers wrap and `Avg` truncates toward zero; half, bfloat16 and fp8
//! accumulate in float32 and are rounded once; conversions, rounding, saturation and
//! NaN codes are `reduce`'s, written with integer and float operations that give the
//! same bits on a GPU as on the CPU (no `cuda_fp16.h`, no intrinsics that round
//! differently). Float arithmetic follows x86-64's NaN rules, as the host's does: a
//! NaN operand comes out quiet, the accumulator's when both are NaN, and an invalid
//! operation (inf - inf, 0 * inf) gives the negative default NaN; `Max`/`Min` return
//! the other operand of a NaN accumulator and keep the accumulator on ties (so
//! `max(-0, +0)` is -0, as the host's `f32::max` compiles on x86-64). A GPU's own
//! arithmetic would give its canonical NaN instead, so the kernels test for NaN first.
//!
//! This file depends on `crate::types` only.

use crate::types::{DataType, RedOp};

mod params;
mod wire;
use params::{head_params, tables};
pub use params::{own_rows, reduce_param_bytes, IN_TABLE, MAX_INPUTS, MAX_ROWS, PARAM_LIMIT};
use wire::wire_kernel;

/// The input counts with kernels of their own, whose loops over the inputs are unrolled at
/// compile time; every other count takes the kernel that loops over a run-time count.
pub const RANKS: [usize; 3] = [2, 4, 8];

/// The kernel variants of every reduction: 0 (any count), then [`RANKS`].
const VARIANTS: [usize; 4] = [0, RANKS[0], RANKS[1], RANKS[2]];

/// The variant of a launch over `n` inputs: `n` where it has a kernel of its own, else 0.
#[inline]
pub fn variant(n: usize) -> usize {
    if RANKS.contains(&n) {
        n
    } else {
        0
    }
}

/// What a reduction kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reduction {
    pub dtype: DataType,
    pub op: RedOp,
    /// all_reduce over a narrower wire type (float32 or float64 data): the host's
    /// wire semantics (`backend::host::algo::allreduce_wire`).
    pub wire: Option<DataType>,
}

impl Reduction {
    pub fn new(dtype: DataType, op: RedOp) -> Reduction {
        Reduction { dtype, op, wire: None }
    }

    pub fn wire(dtype: DataType, wire: DataType, op: RedOp) -> Reduction {
        Reduction { dtype, op, wire: Some(wire) }
    }

    /// Whether a kernel exists: every type for plain reductions (the bitwise operators:
    /// integer types only, as the API takes them); float32 data over a narrow float
    /// wire, float64 data over float32 or a narrow float wire.
    pub fn supported(&self) -> bool {
        if !self.op.takes(self.dtype) {
            return false;
        }
        match self.wire {
            None => true,
            Some(w) => match self.dtype {
                DataType::Float32 => w.is_narrow_float(),
                DataType::Float64 => w.is_narrow_float() || w == DataType::Float32,
                _ => false,
            },
        }
    }

    /// The kernel's entry name: `fccl_reduce_<type>_<op>`, or
    /// `fccl_reduce_wire_<type>_<wire>_<op>`.
    pub fn entry(&self) -> String {
        match self.wire {
            None => format!("fccl_reduce_{}_{}", self.dtype.kernel_token(), self.op.short_name()),
            Some(w) => {
                format!("fccl_reduce_wire_{}_{}_{}", self.dtype.kernel_token(), w.kernel_token(), self.op.short_name())
            }
        }
    }

    /// The entry name of its kernel for `ranks` inputs ([`variant`]: 2, 4 or 8, or 0 for
    /// any count): [`Reduction::entry`], then `_n<ranks>` for a specialised kernel.
    pub fn entry_for(&self, ranks: usize) -> String {
        match ranks {
            0 => self.entry(),
            k => format!("{}_n{k}", self.entry()),
        }
    }

    /// The kernel's CUDA C source; None where no kernel exists.
    ///
    /// Parameters: `(struct <entry>_outs outs, struct <entry>_ins ins, struct
    /// <entry>_counts counts, int n, int nout, int ip, unsigned long long step)`, with
    /// `struct <entry>_outs { T* p[MAX_INPUTS]; }`, `_ins { const T* p[IN_TABLE]; }` and
    /// `_counts { unsigned long long c[MAX_ROWS]; }`, for wire kernels one more, `unsigned
    /// long long win` (the host's window, in elements), and last `const volatile unsigned
    /// int* failed` (the kernel does nothing when it points at a non-zero word; null:
    /// never); [`reduce_param_bytes`] in all. Block row `y` (blockIdx.y) reduces
    /// `counts.c[y]` elements from `y * step` on of its `n` inputs `ins.p[y * ip ..]` (`ip`
    /// 0: every row reads the same inputs; `n`: each row has its own) and writes the
    /// result to its `nout` outputs `outs.p[y * nout ..]`: an all_reduce writes every
    /// rank's buffer in one pass (one row, n outputs), a reduce_scatter gives each rank
    /// its block (n rows of one output, shared inputs `step` apart), a reduce_scatter_v
    /// each rank its block of its own count (n rows, each with the n inputs at the
    /// ranks' displacements). An output may be one of the inputs exactly: each element is
    /// read from every input before it is written.
    ///
    /// Every reduction has one kernel for any count of inputs ([`Reduction::entry`]) and
    /// one per count of [`RANKS`] ([`Reduction::entry_for`]), whose loops over the inputs
    /// are unrolled at compile time; those take the same parameters, with `n` equal to
    /// their count. The source holds all of them.
    pub fn source(&self) -> Option<String> {
        if !self.supported() {
            return None;
        }
        Some(format!("{HELPERS}{}", self.kernels()?))
    }

    /// Its kernel for `ranks` inputs (see [`Reduction::entry_for`]) alone (after HELPERS);
    /// None where no kernel exists.
    fn kernel(&self, ranks: usize) -> Option<String> {
        let name = self.entry_for(ranks);
        match self.wire {
            None => reduce_kernel(self.dtype, self.op, &name, ranks),
            Some(w) => wire_kernel(self.dtype, w, self.op, &name, ranks),
        }
    }

    /// All its kernels: any count, then each of [`RANKS`].
    fn kernels(&self) -> Option<String> {
        let mut s = String::new();
        for k in VARIANTS {
            s.push_str(&self.kernel(k)?);
        }
        Some(s)
    }

    /// The reductions compiled with this one into one program (one NVRTC run, one
    /// module): those of its data type, plain or over a wire.
    pub fn group(&self) -> Vec<Reduction> {
        let wire = self.wire.is_some();
        Reduction::all().into_iter().filter(|r| r.dtype == self.dtype && r.wire.is_some() == wire).collect()
    }

    /// The name of its group's program: `fccl_reduce_<type>.cu`, `fccl_reduce_wire_<type>.cu`.
    pub fn program_name(&self) -> String {
        let wire = if self.wire.is_some() { "wire_" } else { "" };
        format!("fccl_reduce_{wire}{}.cu", self.dtype.kernel_token())
    }

    /// Every program the library compiles: (name, source).
    pub fn programs() -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = Vec::new();
        for r in Reduction::all() {
            if !v.iter().any(|(n, _)| *n == r.program_name()) {
                v.push((r.program_name(), Reduction::program(&r.group())));
            }
        }
        v
    }

    /// One program with the kernels of `rs`, every rank-count variant of each (each
    /// kernel's names are its own): a call's first reduction compiles the program of its
    /// type once, whatever its rank count.
    pub fn program(rs: &[Reduction]) -> String {
        let mut s = String::from(HELPERS);
        for k in rs.iter().filter(|r| r.supported()).filter_map(|r| r.kernels()) {
            s.push_str(&k);
        }
        // A type's plain program also holds its PreMulSum scaling.
        if let Some(r) = rs.first().filter(|r| r.wire.is_none()) {
            s.push_str(&scale_kernel(r.dtype));
        }
        s
    }

    /// Every kernel the library can generate.
    pub fn all() -> Vec<Reduction> {
        let mut v = Vec::new();
        for dt in DataType::ALL {
            for op in RedOp::ALL {
                let r = Reduction::new(dt, op);
                if r.supported() {
                    v.push(r);
                }
                for w in DataType::ALL {
                    let r = Reduction::wire(dt, w, op);
                    if r.supported() {
                        v.push(r);
                    }
                }
            }
        }
        v
    }
}

/// Device functions every kernel uses: bit casts, the host's float arithmetic, and the
/// conversions of `reduce` (see there for why each step is exact or rounds once).
const HELPERS: &str = r#"// ferroccl device reductions: the host's arithmetic (kernels/src/reduce/), bit for bit.
// 16 bytes that load and store as one vector.
struct alignas(16) fccl_u4 { unsigned int x, y, z, w; };
__device__ __forceinline__ float fccl_f32(unsigned int b) { return __uint_as_float(b); }
__device__ __forceinline__ unsigned int fccl_b32(float x) { return __float_as_uint(x); }
__device__ __forceinline__ double fccl_f64(unsigned long long b) { return __longlong_as_double((long long)b); }
__device__ __forceinline__ unsigned long long fccl_b64(double x) { return (unsigned long long)__double_as_longlong(x); }
__device__ __forceinline__ bool fccl_nan32(unsigned int b) { return (b & 0x7fffffffu) > 0x7f800000u; }
__device__ __forceinline__ bool fccl_nan64(unsigned long long b) {
  return (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
}

// x86-64's NaN rules: a NaN operand comes out quiet (the first if both are), an invalid
// operation gives the negative default NaN.
__device__ __forceinline__ float fccl_add_f32(float a, float b) {
  unsigned int x = fccl_b32(a), y = fccl_b32(b);
  if (fccl_nan32(x)) return fccl_f32(x | 0x400000u);
  if (fccl_nan32(y)) return fccl_f32(y | 0x400000u);
  float r = a + b;
  return fccl_nan32(fccl_b32(r)) ? fccl_f32(0xffc00000u) : r;
}
__device__ __forceinline__ float fccl_mul_f32(float a, float b) {
  unsigned int x = fccl_b32(a), y = fccl_b32(b);
  if (fccl_nan32(x)) return fccl_f32(x | 0x400000u);
  if (fccl_nan32(y)) return fccl_f32(y | 0x400000u);
  float r = a * b;
  return fccl_nan32(fccl_b32(r)) ? fccl_f32(0xffc00000u) : r;
}
__device__ __forceinline__ float fccl_div_f32(float a, float n) {
  unsigned int x = fccl_b32(a);
  return fccl_nan32(x) ? fccl_f32(x | 0x400000u) : a / n;
}
__device__ __forceinline__ float fccl_max_f32(float a, float b) { return fccl_nan32(fccl_b32(a)) ? b : (b > a ? b : a); }
__device__ __forceinline__ float fccl_min_f32(float a, float b) { return fccl_nan32(fccl_b32(a)) ? b : (b < a ? b : a); }
__device__ __forceinline__ double fccl_add_f64(double a, double b) {
  unsigned long long x = fccl_b64(a), y = fccl_b64(b);
  if (fccl_nan64(x)) return fccl_f64(x | 0x8000000000000ull);
  if (fccl_nan64(y)) return fccl_f64(y | 0x8000000000000ull);
  double r = a + b;
  return fccl_nan64(fccl_b64(r)) ? fccl_f64(0xfff8000000000000ull) : r;
}
__device__ __forceinline__ double fccl_mul_f64(double a, double b) {
  unsigned long long x = fccl_b64(a), y = fccl_b64(b);
  if (fccl_nan64(x)) return fccl_f64(x | 0x8000000000000ull);
  if (fccl_nan64(y)) return fccl_f64(y | 0x8000000000000ull);
  double r = a * b;
  return fccl_nan64(fccl_b64(r)) ? fccl_f64(0xfff8000000000000ull) : r;
}
__device__ __forceinline__ double fccl_div_f64(double a, double n) {
  unsigned long long x = fccl_b64(a);
  return fccl_nan64(x) ? fccl_f64(x | 0x8000000000000ull) : a / n;
}
__device__ __forceinline__ double fccl_max_f64(double a, double b) { return fccl_nan64(fccl_b64(a)) ? b : (b > a ? b : a); }
__device__ __forceinline__ double fccl_min_f64(double a, double b) { return fccl_nan64(fccl_b64(a)) ? b : (b < a ? b : a); }

// float32 <-> float64 as x86-64 converts: NaN payloads move with the value, made quiet.
__device__ __forceinline__ float fccl_f64_to_f32(double x) {
  unsigned long long b = fccl_b64(x);
  if (fccl_nan64(b))
    return fccl_f32(((unsigned int)(b >> 32) & 0x80000000u) | 0x7fc00000u | ((unsigned int)(b >> 29) & 0x3fffffu));
  return (float)x;
}
__device__ __forceinline__ double fccl_f32_to_f64(float x) {
  unsigned int b = fccl_b32(x);
  if (fccl_nan32(b))
    return fccl_f64(((unsigned long long)(b & 0x80000000u) << 32) | 0x7ff8000000000000ull |
                    ((unsigned long long)(b & 0x7fffffu) << 29));
  return (double)x;
}
// float64 -> float32 rounded to odd, so that rounding on to a narrow type rounds once.
__device__ __forceinline__ float fccl_f64_to_f32_odd(double x) {
  float t = fccl_f64_to_f32(x);
  unsigned int tb = fccl_b32(t);
  if (fccl_nan32(tb)) return t;
  double at = fccl_f64(fccl_b64((double)t) & 0x7fffffffffffffffull);
  double ax = fccl_f64(fccl_b64(x) & 0x7fffffffffffffffull);
  if (at == ax) return t;
  return fccl_f32(at > ax ? (tb - 1u) | 1u : tb | 1u);
}

__device__ __forceinline__ float fccl_bf16_to_f32(unsigned short h) { return fccl_f32((unsigned int)h << 16); }
__device__ __forceinline__ unsigned short fccl_f32_to_bf16(float x) {
  unsigned int b = fccl_b32(x);
  if (fccl_nan32(b)) return (unsigned short)((b >> 16) | 0x40u);
  return (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float fccl_f16_to_f32(unsigned short h) {
  unsigned int sign = (unsigned int)(h & 0x8000u) << 16, abs = h & 0x7fffu, mag;
  if (abs < 0x400u)  // subnormal: 0.5 + m * 2^-24, minus 0.5 (exact)
    mag = fccl_b32(fccl_f32(abs | 0x3f000000u) - 0.5f);
  else if (abs < 0x7c00u)  // normal: rebias the exponent
    mag = (abs << 13) + 0x38000000u;
  else  // infinity, or NaN made quiet
    mag = 0x7f800000u | ((abs & 0x3ffu) << 13) | (abs > 0x7c00u ? 0x400000u : 0u);
  return fccl_f32(sign | mag);
}
__device__ __forceinline__ unsigned short fccl_f32_to_f16(float x) {
  unsigned int w = fccl_b32(x), sign = (w >> 16) & 0x8000u, abs = w & 0x7fffffffu;
  if (abs > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
  // 4|x| (infinity when too big for half) plus 2^(e+15) makes the adder round |x| to
  // half's step, ties to even; the half's bits are then read out of the sum.
  float base = (fccl_f32(abs) * fccl_f32(0x77800000u)) * fccl_f32(0x08800000u);
  unsigned int bias = abs & 0x7f800000u;
  if (bias < 0x38800000u) bias = 0x38800000u;
  unsigned int b = fccl_b32(fccl_f32(bias + 0x07800000u) + base);
  return (unsigned short)(sign | (((b >> 13) & 0x7c00u) + (b & 0x0fffu)));
}

// fp8 with M mantissa bits and exponent bias BIAS: the finite part of the decoding.
__device__ __forceinline__ unsigned int fccl_f8_mag(unsigned int abs, unsigned int m, unsigned int bias) {
  if (abs < (1u << m)) return fccl_b32((float)(int)abs * fccl_f32((128u - bias - m) << 23));
  return (abs << (23u - m)) + ((127u - bias) << 23);
}
// float32 -> fp8, round to nearest even; magnitudes clamp at max_code, NaN gives nan_code.
__device__ __forceinline__ unsigned char fccl_f32_to_f8(float x, unsigned int m, unsigned int bias,
                                                        unsigned int max_code, unsigned int nan_code) {
  unsigned int b = fccl_b32(x), sign = (b >> 24) & 0x80u, abs = b & 0x7fffffffu, mag;
  if (abs > 0x7f800000u) return (unsigned char)(sign | nan_code);
  if (abs < ((128u - bias) << 23)) {  // subnormal result: the adder rounds to the fp8 step
    float magic = fccl_f32((151u - bias - m) << 23);
    mag = fccl_b32(fccl_f32(abs) + magic) - fccl_b32(magic);
  } else {
    unsigned int shift = 23u - m;
    unsigned int rounded = abs + ((1u << (shift - 1u)) - 1u) + ((abs >> shift) & 1u);
    mag = (rounded >> shift) - ((127u - bias) << m);
  }
  if (mag > max_code) mag = max_code;
  return (unsigned char)(sign | mag);
}
__device__ __forceinline__ float fccl_f8e4m3_to_f32(unsigned char v) {
  unsigned int abs = v & 0x7fu;
  unsigned int mag = abs == 0x7fu ? 0x7fc00000u : fccl_f8_mag(abs, 3u, 7u);
  return fccl_f32(((unsigned int)(v & 0x80u) << 24) | mag);
}
__device__ __forceinline__ unsigned char fccl_f32_to_f8e4m3(float x) { return fccl_f32_to_f8(x, 3u, 7u, 0x7eu, 0x7fu); }
__device__ __forceinline__ float fccl_f8e5m2_to_f32(unsigned char v) {
  unsigned int abs = v & 0x7fu;
  unsigned int mag = abs > 0x7cu ? 0x7fc00000u : abs == 0x7cu ? 0x7f800000u : fccl_f8_mag(abs, 2u, 15u);
  return fccl_f32(((unsigned int)(v & 0x80u) << 24) | mag);
}
__device__ __forceinline__ unsigned char fccl_f32_to_f8e5m2(float x) { return fccl_f32_to_f8(x, 2u, 15u, 0x7cu, 0x7eu); }

"#;

/// The copy kernels' program, compiled like the reductions': `fccl_copy(dst, src,
/// units, w, failed)` copies `units` units of `w` bytes (16, 8, 4, 2 or 1: the largest
/// that divides both addresses and the length; where both addresses are at the same
/// offset in 16 bytes, the bytes from the first 16-byte boundary to the last move in
/// 16-byte loads and stores, and units of `w` only before and after), and `fccl_copy2d(dst, dpitch, src, spitch, width, rows, w,
/// failed)` copies `rows` rows of `width` bytes (pitches and width in units of `w`),
/// and `fccl_copy_batch(batch, groups, failed)` a whole call's copies in one launch:
/// block row `g` reads `len[g]` bytes at `src[g]` once and writes them to each of
/// `dst[first[g]..first[g + 1]]` (one source to many destinations: a broadcast reads
/// its root's buffer once), in the largest unit that divides the group's addresses
/// and length, and in 16-byte vectors between the first and last 16-byte boundaries
/// where the source and every destination are at the same offset in 16 bytes.
/// `fccl_swap_batch(pairs, n, failed)` exchanges, in block row `g`, the `len[g]` bytes
/// at `a[g]` with those at `b[g]` (an all_to_all in place: each element read once and
/// written once, no scratch).
/// All do nothing when `failed` points at a non-zero word (null: never): the device
/// path's copies between ranks' buffers are these kernels, not the driver's copies,
/// so that work queued behind a failed communicator ends at once and reads no memory
/// of a peer that died.
pub const COPY_PROGRAM: &str = r#"
struct alignas(16) fccl_v16 { unsigned long long a, b; };
// Runs op.unit<T>(o) on the units of `len` bytes at byte offsets o, thread `first` of
// `stride`: 16-byte vectors (T = fccl_v16) from the first 16-byte boundary of `base` to
// the last when `vec` (every buffer at the same offset in 16 bytes as `base`), units of
// U (which divides every address and the length) before and after them, or throughout.
template <typename U, typename Op>
__device__ __forceinline__ void fccl_split(const unsigned char* base, bool vec, unsigned long long len,
                                           unsigned long long first, unsigned long long stride, const Op& op) {
  unsigned long long head = vec ? (16u - ((unsigned long long)base & 15u)) % 16u : len;
  if (head > len) head = len;
  const unsigned long long vecs = (len - head) / 16, tail = head + vecs * 16;
  for (unsigned long long i = first; i < vecs; i += stride) op.template unit<fccl_v16>(head + i * 16);
  const unsigned long long hu = head / sizeof(U), rest = hu + (len - tail) / sizeof(U);
  for (unsigned long long i = first; i < rest; i += stride)
    op.template unit<U>(i < hu ? i * sizeof(U) : tail + (i - hu) * sizeof(U));
}
// fccl_split in the largest unit that divides `all` (every address and the length, or'ed).
template <typename Op>
__device__ __forceinline__ void fccl_split_any(unsigned long long all, const unsigned char* base, bool vec,
                                               unsigned long long len, unsigned long long first,
                                               unsigned long long stride, const Op& op) {
  if (all % 16 == 0) fccl_split<fccl_v16>(base, vec, len, first, stride, op);
  else if (all % 8 == 0) fccl_split<unsigned long long>(base, vec, len, first, stride, op);
  else if (all % 4 == 0) fccl_split<unsigned int>(base, vec, len, first, stride, op);
  else if (all % 2 == 0) fccl_split<unsigned short>(base, vec, len, first, stride, op);
  else fccl_split<unsigned char>(base, vec, len, first, stride, op);
}
// A unit copied from `src` to `dst`.
struct fccl_copy_op {
  unsigned char* dst;
  const unsigned char* src;
  template <typename T> __device__ __forceinline__ void unit(unsigned long long o) const {
    *(T*)(dst + o) = *(const T*)(src + o);
  }
};
extern "C" __global__ void fccl_copy(unsigned char* dst, const unsigned char* src, unsigned long long units,
                                     unsigned int w, const volatile unsigned int* failed) {
  if (failed && *failed) return;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const bool vec = (((unsigned long long)dst ^ (unsigned long long)src) & 15u) == 0;
  const fccl_copy_op op = {dst, src};
  switch (w) {
  case 16: fccl_split<fccl_v16>(src, vec, units * 16, first, stride, op); break;
  case 8: fccl_split<unsigned long long>(src, vec, units * 8, first, stride, op); break;
  case 4: fccl_split<unsigned int>(src, vec, units * 4, first, stride, op); break;
  case 2: fccl_split<unsigned short>(src, vec, units * 2, first, stride, op); break;
  default: fccl_split<unsigned char>(src, vec, units, first, stride, op); break;
  }
}
template <typename U>
__device__ __forceinline__ void fccl_copy2d_units(unsigned char* dst, unsigned long long dpitch, const unsigned char* src,
                                                  unsigned long long spitch, unsigned long long width,
                                                  unsigned long long rows, unsigned long long first,
                                                  unsigned long long stride) {
  for (unsigned long long i = first; i < width * rows; i += stride) {
    unsigned long long r = i / width, c = i % width;
    ((U*)dst)[r * dpitch + c] = ((const U*)src)[r * spitch + c];
  }
}
extern "C" __global__ void fccl_copy2d(unsigned char* dst, unsigned long long dpitch, const unsigned char* src,
                                       unsigned long long spitch, unsigned long long width, unsigned long long rows,
                                       unsigned int w, const volatile unsigned int* failed) {
  if (failed && *failed) return;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  switch (w) {
  case 16: fccl_copy2d_units<fccl_v16>(dst, dpitch, src, spitch, width, rows, first, stride); break;
  case 8: fccl_copy2d_units<unsigned long long>(dst, dpitch, src, spitch, width, rows, first, stride); break;
  case 4: fccl_copy2d_units<unsigned int>(dst, dpitch, src, spitch, width, rows, first, stride); break;
  case 2: fccl_copy2d_units<unsigned short>(dst, dpitch, src, spitch, width, rows, first, stride); break;
  default: fccl_copy2d_units<unsigned char>(dst, dpitch, src, spitch, width, rows, first, stride); break;
  }
}
#define FCCL_BATCH 128
struct fccl_batch {
  const unsigned char* src[FCCL_BATCH];
  unsigned long long len[FCCL_BATCH];
  unsigned char* dst[FCCL_BATCH];
  unsigned short first[FCCL_BATCH + 1];
};
// A unit read from `src` once and written to each of `dst[lo..hi]`.
struct fccl_fan_op {
  const unsigned char* src;
  unsigned char* const* dst;
  unsigned int lo, hi;
  template <typename T> __device__ __forceinline__ void unit(unsigned long long o) const {
    T v = *(const T*)(src + o);
    for (unsigned int k = lo; k < hi; k++) *(T*)(dst[k] + o) = v;
  }
};
extern "C" __global__ void fccl_copy_batch(struct fccl_batch b, unsigned int groups, const volatile unsigned int* failed) {
  if (failed && *failed) return;
  unsigned int g = blockIdx.y;
  if (g >= groups) return;
  const unsigned char* src = b.src[g];
  unsigned long long len = b.len[g];
  unsigned int lo = b.first[g], hi = b.first[g + 1];
  unsigned long long all = (unsigned long long)src | len, apart = 0;
  for (unsigned int k = lo; k < hi; k++) {
    all |= (unsigned long long)b.dst[k];
    apart |= ((unsigned long long)b.dst[k] ^ (unsigned long long)src) & 15u;
  }
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long at = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const fccl_fan_op op = {src, b.dst, lo, hi};
  fccl_split_any(all, src, apart == 0, len, at, stride, op);
}
struct fccl_pairs {
  unsigned char* a[FCCL_BATCH];
  unsigned char* b[FCCL_BATCH];
  unsigned long long len[FCCL_BATCH];
};
// A unit exchanged between `a` and `b` (each read once and written once).
struct fccl_swap_op {
  unsigned char* a;
  unsigned char* b;
  template <typename T> __device__ __forceinline__ void unit(unsigned long long o) const {
    T* x = (T*)(a + o);
    T* y = (T*)(b + o);
    T t = *x;
    *x = *y;
    *y = t;
  }
};
extern "C" __global__ void fccl_swap_batch(struct fccl_pairs p, unsigned int pairs, const volatile unsigned int* failed) {
  if (failed && *failed) return;
  unsigned int g = blockIdx.y;
  if (g >= pairs) return;
  unsigned char* a = p.a[g];
  unsigned char* b = p.b[g];
  unsigned long long len = p.len[g];
  unsigned long long all = (unsigned long long)a | (unsigned long long)b | len;
  const bool vec = (((unsigned long long)a ^ (unsigned long long)b) & 15u) == 0;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long at = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const fccl_swap_op op = {a, b};
  fccl_split_any(all, a, vec, len, at, stride, op);
}
"#;

/// Most sources, and most destinations, one `fccl_copy_batch` launch takes (its table
/// travels in the kernel's arguments: 3,336 bytes, under the 4 KiB every driver takes).
pub const BATCH: usize = 128;

/// The copy program's name (for NVRTC and its logs).
pub const COPY_PROGRAM_NAME: &str = "fccl_copy.cu";

/// The largest unit (16, 8, 4, 2 or 1 bytes) that divides every one of `vals` (addresses,
/// pitches, lengths): what the copy kernels move at a time.
#[inline]
pub fn copy_unit(vals: &[usize]) -> usize {
    let all = vals.iter().fold(0usize, |a, &v| a | v);
    [16, 8, 4, 2].into_iter().find(|&w| all % w == 0).unwrap_or(1)
}

/// The start of every kernel's body: a kernel whose communicator failed (a non-zero
/// word at `failed`; null: none) returns at once, so that work queued behind a failure
/// ends without touching a dead peer's memory. `nn` is the number of inputs: the
/// run-time `n`, or the constant of a kernel specialised for it (`n` equals it); the
/// row's inputs are `ins.p[i0 ..]`, its outputs `outs.p[o0 ..]`, its `count` elements
/// from `base` on.
fn prologue(ranks: usize) -> String {
    let nn = if ranks == 0 { "n".to_string() } else { ranks.to_string() };
    format!(
        "  if (failed && *failed) return;\n  const int nn = {nn};\n  \
         const unsigned long long count = counts.c[blockIdx.y];\n  \
         const unsigned long long base = (unsigned long long)blockIdx.y * step;\n  \
         const int i0 = (int)blockIdx.y * ip, o0 = (int)blockIdx.y * nout;\n  \
         const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;\n  \
         const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    )
}

/// `#pragma unroll` before the loops over the inputs of a specialised kernel (their
/// count is a constant there); nothing for the run-time count.
fn unroll(ranks: usize) -> &'static str {
    if ranks == 0 {
        ""
    } else {
        "\n#pragma unroll\n  "
    }
}

/// The body of a plain reduction kernel after [`prologue`], over the functions `NAME_w`
/// (widen an element to the accumulator type `A`), `NAME_c` (combine an element into the
/// accumulator) and `NAME_f` (the result from the accumulator and the input count), and
/// `union NAME_v` (16 bytes as `fccl_u4` or as elements; indexed as `fccl_u4*` from the
/// first boundary, so that NVRTC knows the alignment and emits 128-bit accesses). Where element 0 of every input
/// and output of the row lies at the same offset in 16 bytes, the elements from the first
/// 16-byte boundary move in 16-byte loads and stores, each vector's elements reduced one
/// by one in input order; the elements before it and after the last whole vector (all of
/// them where the offsets differ) move one at a time. Either way each element is
/// `f(c(...c(w(in0), in1)..., in[nn-1]), nn)`, read from every input before any output
/// gets it (so an output may be an input), and one input is a copy.
/// A row's split, at the start of every reduction body: `head` elements before the first
/// 16-byte boundary (all `count` where the row's inputs and outputs lie at different
/// offsets in 16 bytes), `vecs` whole vectors of `V` elements, the rest from `tail`.
pub(super) const ROW_SPLIT: &str = r#"  const unsigned long long a0 = (unsigned long long)(ins.p[i0] + base);
  unsigned long long diff = a0 % sizeof(T);
  UNROLLfor (int k = 1; k < nn; k++) diff |= ((unsigned long long)(ins.p[i0 + k] + base) ^ a0) & 15u;
  for (int k = 0; k < nout; k++) diff |= ((unsigned long long)outs.p[o0 + k] ^ a0) & 15u;
  const int V = (int)(16 / sizeof(T));
  unsigned long long head = diff ? count : (16u - (a0 & 15u)) % 16u / sizeof(T);
  if (head > count) head = count;
  const unsigned long long vecs = (count - head) / V, tail = head + vecs * V;
"#;

const REDUCE_BODY: &str = r#"SPLIT  for (unsigned long long j = first; j < vecs; j += stride) {
    union NAME_v x, r;
    x.u = ((const fccl_u4*)(ins.p[i0] + base + head))[j];
    if (nn == 1) {
      r = x;
    } else {
      A acc[16 / sizeof(T)];
      for (int l = 0; l < V; l++) acc[l] = NAME_w(x.e[l]);
      UNROLLfor (int k = 1; k < nn; k++) {
        x.u = ((const fccl_u4*)(ins.p[i0 + k] + base + head))[j];
        for (int l = 0; l < V; l++) acc[l] = NAME_c(acc[l], x.e[l]);
      }
      for (int l = 0; l < V; l++) r.e[l] = NAME_f(acc[l], nn);
    }
    for (int k = 0; k < nout; k++) ((fccl_u4*)(outs.p[o0 + k] + head))[j] = r.u;
  }
  for (unsigned long long j = first; j < head + (count - tail); j += stride) {
    const unsigned long long i = j < head ? j : tail + (j - head);
    T v;
    if (nn == 1) {
      v = ins.p[i0][base + i];
    } else {
      A acc = NAME_w(ins.p[i0][base + i]);
      UNROLLfor (int k = 1; k < nn; k++) acc = NAME_c(acc, ins.p[i0 + k][base + i]);
      v = NAME_f(acc, nn);
    }
    for (int k = 0; k < nout; k++) outs.p[o0 + k][i] = v;
  }
}
"#;

/// Storage type, accumulator type, widening and narrowing of a float type (None for
/// integers).
fn float_parts(dt: DataType) -> Option<(&'static str, &'static str, &'static str, &'static str)> {
    Some(match dt {
        DataType::Float32 => ("float", "f32", "", ""),
        DataType::Float64 => ("double", "f64", "", ""),
        DataType::Float16 => ("unsigned short", "f32", "fccl_f16_to_f32", "fccl_f32_to_f16"),
        DataType::Bfloat16 => ("unsigned short", "f32", "fccl_bf16_to_f32", "fccl_f32_to_bf16"),
        DataType::Float8e4m3 => ("unsigned char", "f32", "fccl_f8e4m3_to_f32", "fccl_f32_to_f8e4m3"),
        DataType::Float8e5m2 => ("unsigned char", "f32", "fccl_f8e5m2_to_f32", "fccl_f32_to_f8e5m2"),
        _ => return None,
    })
}

/// The accumulator's C type for a float accumulator token.
fn acc_c(acc: &str) -> &'static str {
    if acc == "f64" {
        "double"
    } else {
        "float"
    }
}

/// The combining function on a float accumulator (`Avg` sums); None for the bitwise
/// operators, which take no float type.
fn combine_fn(op: RedOp, acc: &str) -> Option<String> {
    let f = match op {
        RedOp::Sum | RedOp::Avg => "add",
        RedOp::Prod => "mul",
        RedOp::Max => "max",
        RedOp::Min => "min",
        RedOp::Band | RedOp::Bor | RedOp::Bxor => return None,
    };
    Some(format!("fccl_{f}_{acc}"))
}

/// `out[i] = op(ins.p[0][i], ..., ins.p[n-1][i])`; one input is a copy. `ranks`: the
/// input count the kernel is specialised for (0: any, from `n`).
fn reduce_kernel(dt: DataType, op: RedOp, name: &str, ranks: usize) -> Option<String> {
    // (element type, accumulator type, widen, combine, finish) over `x`, `acc` and `n`.
    let (t, a, widen, combine, finish) = match float_parts(dt) {
        None => {
            // Integers: wrapping arithmetic in the unsigned type of the same width.
            let (t, u) = match dt {
                DataType::Int8 => ("signed char", "unsigned char"),
                DataType::Uint8 => ("unsigned char", "unsigned char"),
                DataType::Int32 => ("int", "unsigned int"),
                DataType::Uint32 => ("unsigned int", "unsigned int"),
                DataType::Int64 => ("long long", "unsigned long long"),
                _ => ("unsigned long long", "unsigned long long"),
            };
            let combine = match op {
                RedOp::Sum | RedOp::Avg => "(A)(acc + (A)x)",
                RedOp::Prod => "(A)(acc * (A)x)",
                RedOp::Max => "x > (T)acc ? (A)x : acc",
                RedOp::Min => "x < (T)acc ? (A)x : acc",
                RedOp::Band => "(A)(acc & (A)x)",
                RedOp::Bor => "(A)(acc | (A)x)",
                RedOp::Bxor => "(A)(acc ^ (A)x)",
            };
            // Signed division truncates toward zero, as the host's does.
            let finish = if op == RedOp::Avg { "(T)((T)acc / (T)n)" } else { "(T)acc" };
            (t, u, "(A)x".to_string(), combine.to_string(), finish.to_string())
        }
        Some((t, acc, widen, narrow)) => {
            let a = acc_c(acc);
            let w = if widen.is_empty() { "x".to_string() } else { format!("{widen}(x)") };
            let combine = format!("{}(acc, {w})", combine_fn(op, acc)?);
            let fin = if op == RedOp::Avg { format!("fccl_div_{acc}(acc, (A)n)") } else { "acc".into() };
            let finish = if narrow.is_empty() { fin } else { format!("{narrow}({fin})") };
            (t, a, w, combine, finish)
        }
    };
    let body = REDUCE_BODY.replace("SPLIT", ROW_SPLIT).replace("NAME", name).replace("UNROLL", unroll(ranks));
    Some(format!(
        "#define T {t}\n#define A {a}\n{tables}\
         __device__ __forceinline__ A {name}_w(T x) {{ return {widen}; }}\n\
         __device__ __forceinline__ A {name}_c(A acc, T x) {{ return {combine}; }}\n\
         __device__ __forceinline__ T {name}_f(A acc, int n) {{ return {finish}; }}\n\
         union {name}_v {{ fccl_u4 u; T e[16 / sizeof(T)]; }};\n\
         extern \"C\" __global__ void {name}({params},\n    const volatile unsigned int* failed) {{\n{pro}{body}\
         #undef T\n#undef A\n",
        tables = tables(name),
        params = head_params(name),
        pro = prologue(ranks),
    ))
}

/// The PreMulSum scaling kernel of `dt` (in the type's plain program, [`Reduction::program`]).
pub fn scale_entry(dt: DataType) -> String {
    format!("fccl_scale_{}", dt.kernel_token())
}

/// `out[i] = in[i] * s` for `count` elements of `dt`, the first half of NCCL's PreMulSum,
/// bit for bit as the host's `reduce::pre_multiply`: integers wrap, float32 and float64
/// multiply in their precision (the host's NaN rules), narrow floats in float32 and
/// round once. Parameters: `(T* out, const T* in, unsigned long long count, const T* sp,
/// unsigned long long sbits, const volatile unsigned int* failed)`: the scalar is `*sp`
/// (device memory, read when the kernel runs) or, where `sp` is null, the low bytes of
/// `sbits`. `out` may be `in`.
fn scale_kernel(dt: DataType) -> String {
    let name = scale_entry(dt);
    let (t, mul) = match float_parts(dt) {
        Some((t, "f64", _, _)) => (t, "fccl_mul_f64(x, s)".to_string()),
        Some((t, _, "", _)) => (t, "fccl_mul_f32(x, s)".to_string()),
        Some((t, _, widen, narrow)) => (t, format!("{narrow}(fccl_mul_f32({widen}(x), {widen}(s)))")),
        None => {
            let (t, u) = match dt {
                DataType::Int8 => ("signed char", "unsigned char"),
                DataType::Uint8 => ("unsigned char", "unsigned char"),
                DataType::Int32 => ("int", "unsigned int"),
                DataType::Uint32 => ("unsigned int", "unsigned int"),
                DataType::Int64 => ("long long", "unsigned long long"),
                _ => ("unsigned long long", "unsigned long long"),
            };
            (t, format!("({t})(({u})x * ({u})s)"))
        }
    };
    format!(
        "extern \"C\" __global__ void {name}({t}* out, const {t}* in, unsigned long long count, const {t}* sp,\n    \
         unsigned long long sbits, const volatile unsigned int* failed) {{\n  \
         if (failed && *failed) return;\n  \
         union {{ unsigned long long u; {t} v; }} b;\n  b.u = sbits;\n  const {t} s = sp ? *sp : b.v;\n  \
         const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;\n  \
         for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {{\n    \
         const {t} x = in[i];\n    out[i] = {mul};\n  }}\n}}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_op_and_wire_has_its_kernels_named_by_the_convention() {
        let all = Reduction::all();
        // 12 types x 5 ops, 6 integer types x 3 bitwise ops, plus float32 over 4 narrow
        // wires and float64 over 5 wires.
        assert_eq!(all.len(), 60 + 18 + 5 * (4 + 5));
        let names: std::collections::HashSet<String> = all.iter().map(|r| r.entry()).collect();
        assert_eq!(names.len(), all.len());
        for r in &all {
            let s = r.source().expect("supported");
            // The kernel for any count and those unrolled for 2, 4 and 8 inputs.
            for k in [0, 2, 4, 8] {
                assert!(s.contains(&format!("extern \"C\" __global__ void {}(", r.entry_for(k))), "{s}");
            }
            assert_eq!(s.matches("__global__").count(), 4, "{s}");
            assert_eq!(s.matches("const int nn = n;").count(), 1, "{s}");
            for k in RANKS {
                assert!(
                    s.contains(&format!("void {}_n{k}(", r.entry())) && s.contains(&format!("const int nn = {k};"))
                );
            }
        }
        assert_eq!(Reduction::new(DataType::Int8, RedOp::Sum).entry_for(4), "fccl_reduce_i8_sum_n4");
        assert_eq!(Reduction::new(DataType::Int8, RedOp::Sum).entry_for(0), "fccl_reduce_i8_sum");
        assert_eq!((1..=10).map(variant).collect::<Vec<_>>(), [0, 2, 0, 4, 0, 0, 0, 8, 0, 0]);
        let s = Reduction::new(DataType::Float32, RedOp::Sum).source().unwrap();
        assert!(s.contains(&format!("struct fccl_reduce_f32_sum_ins {{ const T* p[{IN_TABLE}]; }};")), "{s}");
        assert!(s.contains(&format!("struct fccl_reduce_f32_sum_counts {{ unsigned long long c[{MAX_ROWS}]; }};")));
        assert!(s.contains("int nout, int ip,\n    unsigned long long step,\n    const volatile unsigned int* failed)"));
        assert_eq!(
            Reduction::wire(DataType::Float32, DataType::Bfloat16, RedOp::Sum).entry(),
            "fccl_reduce_wire_f32_bf16_sum"
        );
        assert!(!Reduction::wire(DataType::Int32, DataType::Bfloat16, RedOp::Sum).supported());
        assert!(!Reduction::wire(DataType::Float32, DataType::Float64, RedOp::Sum).supported());
        assert!(Reduction::wire(DataType::Float16, DataType::Float8e4m3, RedOp::Sum).source().is_none());
        let progs = Reduction::programs();
        assert_eq!(progs.len(), 12 + 2, "one per type, and the wire forms of float32 and float64");
        let f64w = Reduction::wire(DataType::Float64, DataType::Float16, RedOp::Min);
        assert_eq!(f64w.group().len(), 25);
        let (_, src) = progs.iter().find(|(n, _)| *n == f64w.program_name()).unwrap();
        assert_eq!(src.matches("__global__").count(), 4 * 25);
        assert!(!src.contains("fccl_scale_"), "no scaling in a wire program");
        for dt in DataType::ALL {
            let plain = Reduction::new(dt, RedOp::Sum);
            let (_, src) = progs.iter().find(|(n, _)| *n == plain.program_name()).unwrap();
            assert_eq!(src.matches(&format!("void {}(", scale_entry(dt))).count(), 1, "{dt}");
            assert_eq!(src.matches("fccl_scale_").count(), 1, "{dt}: only its own type's scaling");
        }
        assert!(src.contains(&format!("void {}(", f64w.entry())));
        let s = Reduction::new(DataType::Int32, RedOp::Avg).source().unwrap();
        assert!(s.contains("#define T int\n") && s.contains("#define A unsigned int\n"), "{s}");
        let s = Reduction::new(DataType::Bfloat16, RedOp::Avg).source().unwrap();
        assert!(s.contains("fccl_f32_to_bf16(fccl_div_f32(acc, (A)n))") && s.contains("#define A float\n"), "{s}");
        let s = Reduction::new(DataType::Int8, RedOp::Bxor).source().unwrap();
        assert!(s.contains("void fccl_reduce_i8_bxor(") && s.contains("return (A)(acc ^ (A)x);"), "{s}");
        for op in [RedOp::Band, RedOp::Bor, RedOp::Bxor] {
            assert!(Reduction::new(DataType::Float32, op).source().is_none(), "{op}");
            assert!(Reduction::new(DataType::Bfloat16, op).source().is_none(), "{op}");
            assert!(Reduction::wire(DataType::Float32, DataType::Bfloat16, op).source().is_none(), "{op}");
        }
    }
}
