//! The kernels of all_reduce over a narrower wire type (`Reduction::wire`): the host's
//! owner order per window, on the same head / 16-byte vector / tail split as the plain
//! reductions.

use super::{combine_fn, float_parts, head_params, prologue, tables, unroll, ROW_SPLIT};
use crate::types::{DataType, RedOp};

/// all_reduce over a wire type, as the host runs it: in each window of `win`
/// elements, element `l` belongs to the owner whose balanced part of the window holds
/// it; the owner's own value (unrounded) comes first, then every other rank's value
/// rounded to the wire type, in rank order after the owner's; `Avg` divides by `n`;
/// the result is rounded to the wire type and widened back. `ranks` as for
/// [`reduce_kernel`]. Elements move one at a time (each reads its own owner's input first).
pub(super) fn wire_kernel(dt: DataType, wire: DataType, op: RedOp, name: &str, ranks: usize) -> Option<String> {
    let (t, acc) = if dt == DataType::Float64 { ("double", "f64") } else { ("float", "f32") };
    let round = match (dt, wire) {
        (DataType::Float64, DataType::Float32) => "fccl_f32_to_f64(fccl_f64_to_f32(x))".to_string(),
        (DataType::Float64, w) => {
            let (_, _, widen, narrow) = float_parts(w).expect("a narrow float wire");
            format!("fccl_f32_to_f64({widen}({narrow}(fccl_f64_to_f32_odd(x))))")
        }
        (_, w) => {
            let (_, _, widen, narrow) = float_parts(w).expect("a narrow float wire");
            format!("{widen}({narrow}(x))")
        }
    };
    let avg = if op == RedOp::Avg { format!("fccl_div_{acc}") } else { String::new() };
    let body = WIRE_BODY
        .replace("SPLIT", ROW_SPLIT)
        .replace("COMBINE", &combine_fn(op, acc)?)
        .replace("FINISH(", &format!("{avg}("))
        .replace("NAME", name)
        .replace("UNROLL", unroll(ranks));
    // Avg divides by the rank count; the others pass the accumulator through.
    let body = if avg.is_empty() { body.replace(", (T)nn)", ")") } else { body };
    Some(format!(
        "#define T {t}\n{}\
         __device__ __forceinline__ T {name}_round(T x) {{ return {round}; }}\n\
         union {name}_v {{ fccl_u4 u; T e[16 / sizeof(T)]; }};\n\
         extern \"C\" __global__ void {name}({},\n    \
         unsigned long long win, const volatile unsigned int* failed) {{\n{}{body}#undef T\n",
        tables(name),
        head_params(name),
        prologue(ranks),
    ))
}

/// The body of a wire all_reduce kernel after [`prologue`], over `NAME_round` (an element
/// through the wire type and back), COMBINE and FINISH(acc, (T)nn) (Avg's division; else
/// the accumulator). Element `i` of window `w0 = i - i % win` is owned by rank `o` (the
/// host's split of the window into nn near-equal parts): it starts from input `o`'s
/// value and adds every other input's, rounded through the wire, in rank order after
/// `o` (`NAME_ELEM`). After [`ROW_SPLIT`], where every input and output lies at the same offset in 16 bytes,
/// a 16-byte vector whose elements share one window and owner moves in 16-byte loads and
/// stores, its elements combined one by one in that order; other vectors, and the
/// elements before the first boundary and after the last whole vector (all of them where
/// the offsets differ), go element by element. Either way each element gets the same bits.
const WIRE_BODY: &str = r#"#define NAME_OWNER(i, o) do { \
    unsigned long long w0_ = (i) - (i) % win, wc_ = count - w0_ < win ? count - w0_ : win, l_ = (i) - w0_; \
    unsigned long long part_ = wc_ / (unsigned long long)nn, rem_ = wc_ % (unsigned long long)nn, big_ = rem_ * (part_ + 1); \
    o = (int)(l_ < big_ ? l_ / (part_ + 1) : rem_ + (l_ - big_) / part_); \
  } while (0)
#define NAME_ELEM(i, v) do { \
    int o_; \
    NAME_OWNER(i, o_); \
    T acc_ = ins.p[i0 + o_][base + (i)]; \
    for (int j_ = 1; j_ < nn; j_++) { \
      int p_ = o_ + j_ < nn ? o_ + j_ : o_ + j_ - nn; \
      acc_ = COMBINE(acc_, NAME_round(ins.p[i0 + p_][base + (i)])); \
    } \
    v = NAME_round(FINISH(acc_, (T)nn)); \
  } while (0)
SPLIT  for (unsigned long long j = first; j < vecs; j += stride) {
    const unsigned long long i = head + j * V;
    int o, oz;
    NAME_OWNER(i, o);
    NAME_OWNER(i + V - 1, oz);
    union NAME_v r;
    if (o == oz && i / win == (i + V - 1) / win) {
      union NAME_v x;
      T acc[16 / sizeof(T)];
      x.u = ((const fccl_u4*)(ins.p[i0 + o] + base + head))[j];
      for (int l = 0; l < V; l++) acc[l] = x.e[l];
      for (int k = 1; k < nn; k++) {
        int p = o + k < nn ? o + k : o + k - nn;
        x.u = ((const fccl_u4*)(ins.p[i0 + p] + base + head))[j];
        for (int l = 0; l < V; l++) acc[l] = COMBINE(acc[l], NAME_round(x.e[l]));
      }
      for (int l = 0; l < V; l++) r.e[l] = NAME_round(FINISH(acc[l], (T)nn));
    } else {
      // Unrolled: lanes indexed by a constant stay in registers.
#pragma unroll
      for (int l = 0; l < V; l++) NAME_ELEM(i + l, r.e[l]);
    }
    for (int k = 0; k < nout; k++) ((fccl_u4*)(outs.p[o0 + k] + head))[j] = r.u;
  }
  for (unsigned long long j = first; j < head + (count - tail); j += stride) {
    const unsigned long long i = j < head ? j : tail + (j - head);
    T v;
    NAME_ELEM(i, v);
    for (int k = 0; k < nout; k++) outs.p[o0 + k][i] = v;
  }
#undef NAME_ELEM
#undef NAME_OWNER
}
"#;
