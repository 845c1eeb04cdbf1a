//! Multiplying every element by a scalar of its type: the first half of NCCL's
//! PreMulSum operator (each rank's input times the scalar, then summed).

use super::convert::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use super::{f32_to_f8e4m3, f32_to_f8e5m2, f8e4m3_to_f32, f8e5m2_to_f32};
use crate::types::DataType;

/// Writes `src * scalar` element by element into `dst` (same length as `src`);
/// `scalar` is one element of `dt` in native byte order. Integers wrap (two's
/// complement), float32 and float64 multiply in their own precision, half, bfloat16
/// and fp8 in float32, where their product is exact, and are rounded once, to nearest
/// even: the correctly rounded product that NCCL's `__hmul` gives.
pub fn pre_multiply(dt: DataType, scalar: &[u8], src: &[u8], dst: &mut [u8]) {
    assert_eq!(scalar.len(), dt.size(), "pre_multiply: the scalar is one {dt} element");
    assert_eq!(src.len(), dst.len(), "pre_multiply: src and dst differ in length");
    macro_rules! ints {
        ($t:ty) => {{
            let s = <$t>::from_ne_bytes(scalar.try_into().expect("checked length"));
            let n = std::mem::size_of::<$t>();
            for (d, x) in dst.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
                let x = <$t>::from_ne_bytes(x.try_into().expect("chunk length"));
                d.copy_from_slice(&x.wrapping_mul(s).to_ne_bytes());
            }
        }};
    }
    macro_rules! narrow {
        ($bits:ty, $to_f32:expr, $from_f32:expr) => {{
            let s: f32 = $to_f32(<$bits>::from_ne_bytes(scalar.try_into().expect("checked length")));
            let n = std::mem::size_of::<$bits>();
            for (d, x) in dst.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
                let x: f32 = $to_f32(<$bits>::from_ne_bytes(x.try_into().expect("chunk length")));
                let y: $bits = $from_f32(x * s);
                d.copy_from_slice(&y.to_ne_bytes());
            }
        }};
    }
    match dt {
        DataType::Int8 => ints!(i8),
        DataType::Uint8 => ints!(u8),
        DataType::Int32 => ints!(i32),
        DataType::Uint32 => ints!(u32),
        DataType::Int64 => ints!(i64),
        DataType::Uint64 => ints!(u64),
        DataType::Float32 => {
            let s = f32::from_ne_bytes(scalar.try_into().expect("checked length"));
            for (d, x) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
                let x = f32::from_ne_bytes(x.try_into().expect("chunk length"));
                d.copy_from_slice(&(x * s).to_ne_bytes());
            }
        }
        DataType::Float64 => {
            let s = f64::from_ne_bytes(scalar.try_into().expect("checked length"));
            for (d, x) in dst.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
                let x = f64::from_ne_bytes(x.try_into().expect("chunk length"));
                d.copy_from_slice(&(x * s).to_ne_bytes());
            }
        }
        DataType::Float16 => narrow!(u16, f16_to_f32, f32_to_f16),
        DataType::Bfloat16 => narrow!(u16, bf16_to_f32, f32_to_bf16),
        DataType::Float8e4m3 => narrow!(u8, f8e4m3_to_f32, f32_to_f8e4m3),
        DataType::Float8e5m2 => narrow!(u8, f8e5m2_to_f32, f32_to_f8e5m2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dt: DataType, scalar: &[u8], src: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; src.len()];
        pre_multiply(dt, scalar, src, &mut out);
        out
    }

    #[test]
    fn integers_wrap_and_floats_round_in_their_own_type() {
        let src: Vec<u8> = [1i32, -7, i32::MAX].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let got = run(DataType::Int32, &3i32.to_ne_bytes(), &src);
        let want: Vec<u8> = [3i32, -21, i32::MAX.wrapping_mul(3)].iter().flat_map(|x| x.to_ne_bytes()).collect();
        assert_eq!(got, want);
        let src: Vec<u8> = [200u8, 3].to_vec();
        assert_eq!(run(DataType::Uint8, &[2], &src), vec![144, 6]);
        let src: Vec<u8> = [1.5f64, -0.1].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let want: Vec<u8> = [1.5f64 * 0.3, -0.1 * 0.3].iter().flat_map(|x| x.to_ne_bytes()).collect();
        assert_eq!(run(DataType::Float64, &0.3f64.to_ne_bytes(), &src), want);
        let src: Vec<u8> = [3.0f32, 1e38].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let want: Vec<u8> = [15.0f32, f32::INFINITY].iter().flat_map(|x| x.to_ne_bytes()).collect();
        assert_eq!(run(DataType::Float32, &5.0f32.to_ne_bytes(), &src), want);
    }

    #[test]
    fn narrow_floats_multiply_in_float32() {
        // half: 1.0 * 0.5 and 3.0 * 0.5; bfloat16: 1.0 * 3.0.
        let src: Vec<u8> = [0x3c00u16, 0x4200].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let want: Vec<u8> = [0x3800u16, 0x3e00].iter().flat_map(|x| x.to_ne_bytes()).collect();
        assert_eq!(run(DataType::Float16, &0x3800u16.to_ne_bytes(), &src), want);
        let src: Vec<u8> = 0x3f80u16.to_ne_bytes().to_vec();
        assert_eq!(run(DataType::Bfloat16, &0x4040u16.to_ne_bytes(), &src), 0x4040u16.to_ne_bytes().to_vec());
        // fp8 E4M3 saturates: 448 * 2 stays 448 (0x7e).
        assert_eq!(run(DataType::Float8e4m3, &[0x40], &[0x7e]), vec![0x7e]);
    }
}
