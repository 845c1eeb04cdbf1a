//! Data types and reduction operators as the core sees them.
//!
//! Values cross the C ABI as plain integers (docs/abi.md fixes them); `TryFrom<i32>`
//! is the only way in, so an unknown value is an error, never UB.

use std::fmt;

/// Element types of docs/abi.md, with NCCL's numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
    Float8e4m3 = 10,
    Float8e5m2 = 11,
}

// The small queries are `#[inline]`: the library calls them per chunk, across the crate edge.
impl DataType {
    /// Every data type, in numbering order.
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    /// Bytes per element.
    #[inline]
    pub const fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8e4m3 | DataType::Float8e5m2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// Int8 .. Uint64: the types bitwise operators take.
    #[inline]
    pub const fn is_integer(self) -> bool {
        matches!(
            self,
            DataType::Int8 | DataType::Uint8 | DataType::Int32 | DataType::Uint32 | DataType::Int64 | DataType::Uint64
        )
    }

    /// Types that are reduced in a wider accumulator (float32) and rounded once.
    #[inline]
    pub const fn is_narrow_float(self) -> bool {
        matches!(self, DataType::Float16 | DataType::Bfloat16 | DataType::Float8e4m3 | DataType::Float8e5m2)
    }

    /// Bytes per element of the accumulator used while reducing this type.
    #[inline]
    pub const fn acc_size(self) -> usize {
        if self.is_narrow_float() {
            4
        } else {
            self.size()
        }
    }

    /// The C name, as used in messages.
    pub const fn c_name(self) -> &'static str {
        match self {
            DataType::Int8 => "fcclInt8",
            DataType::Uint8 => "fcclUint8",
            DataType::Int32 => "fcclInt32",
            DataType::Uint32 => "fcclUint32",
            DataType::Int64 => "fcclInt64",
            DataType::Uint64 => "fcclUint64",
            DataType::Float16 => "fcclFloat16",
            DataType::Float32 => "fcclFloat32",
            DataType::Float64 => "fcclFloat64",
            DataType::Bfloat16 => "fcclBfloat16",
            DataType::Float8e4m3 => "fcclFloat8e4m3",
            DataType::Float8e5m2 => "fcclFloat8e5m2",
        }
    }

    /// Short lower-case name (benchmarks, logs): int8, float32, bfloat16, ...
    pub const fn short_name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float8e4m3 => "f8e4m3",
            DataType::Float8e5m2 => "f8e5m2",
        }
    }
}

impl DataType {
    /// The type's token in device kernel names (`fccl_reduce_f32_sum`): the
    /// convention the simulated GPU runs kernels by (docs/sim-gpu.md).
    pub const fn kernel_token(self) -> &'static str {
        match self {
            DataType::Int8 => "i8",
            DataType::Uint8 => "u8",
            DataType::Int32 => "i32",
            DataType::Uint32 => "u32",
            DataType::Int64 => "i64",
            DataType::Uint64 => "u64",
            DataType::Float16 => "f16",
            DataType::Float32 => "f32",
            DataType::Float64 => "f64",
            DataType::Bfloat16 => "bf16",
            DataType::Float8e4m3 => "f8e4m3",
            DataType::Float8e5m2 => "f8e5m2",
        }
    }
}

impl TryFrom<i32> for DataType {
    type Error = i32;
    #[inline]
    fn try_from(v: i32) -> Result<Self, i32> {
        DataType::ALL.get(usize::try_from(v).map_err(|_| v)?).copied().ok_or(v)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.c_name())
    }
}

/// Reduction operators of docs/abi.md, with NCCL's numbering; the bitwise ones are
/// ferroccl's own (as Gloo and MPI have), numbered from 64 so NCCL's never reach them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
    Band = 64,
    Bor = 65,
    Bxor = 66,
}

impl RedOp {
    /// Every operator, in numbering order.
    pub const ALL: [RedOp; 8] =
        [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg, RedOp::Band, RedOp::Bor, RedOp::Bxor];

    /// Bitwise and/or/xor: defined on integer types only.
    #[inline]
    pub const fn is_bitwise(self) -> bool {
        matches!(self, RedOp::Band | RedOp::Bor | RedOp::Bxor)
    }

    /// Whether the operator is defined on `dtype` (bitwise ones on integers only).
    #[inline]
    pub const fn takes(self, dtype: DataType) -> bool {
        !self.is_bitwise() || dtype.is_integer()
    }

    /// The C name, as used in messages.
    pub const fn c_name(self) -> &'static str {
        match self {
            RedOp::Sum => "fcclSum",
            RedOp::Prod => "fcclProd",
            RedOp::Max => "fcclMax",
            RedOp::Min => "fcclMin",
            RedOp::Avg => "fcclAvg",
            RedOp::Band => "fcclBand",
            RedOp::Bor => "fcclBor",
            RedOp::Bxor => "fcclBxor",
        }
    }

    /// Short lower-case name (benchmarks, logs).
    pub const fn short_name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
            RedOp::Band => "band",
            RedOp::Bor => "bor",
            RedOp::Bxor => "bxor",
        }
    }
}

impl TryFrom<i32> for RedOp {
    type Error = i32;
    #[inline]
    fn try_from(v: i32) -> Result<Self, i32> {
        RedOp::ALL.into_iter().find(|op| *op as i32 == v).ok_or(v)
    }
}

impl fmt::Display for RedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.c_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_values_round_trip_and_reject_unknown() {
        for (i, t) in DataType::ALL.iter().enumerate() {
            assert_eq!(DataType::try_from(i as i32), Ok(*t));
            assert_eq!(*t as i32, i as i32);
        }
        assert!(DataType::try_from(12).is_err());
        assert!(DataType::try_from(-1).is_err());
        for op in RedOp::ALL {
            assert_eq!(RedOp::try_from(op as i32), Ok(op));
        }
        assert_eq!(RedOp::try_from(4), Ok(RedOp::Avg));
        assert_eq!(RedOp::try_from(64), Ok(RedOp::Band));
        assert_eq!(RedOp::try_from(66), Ok(RedOp::Bxor));
        for v in [5, 63, 67, -1, i32::MIN] {
            assert!(RedOp::try_from(v).is_err(), "{v}");
        }
        let ints = DataType::ALL.iter().filter(|t| t.is_integer()).count();
        assert_eq!(ints, 6);
        for t in DataType::ALL {
            assert_eq!(RedOp::Bxor.takes(t), t.is_integer(), "{t}");
            assert!(RedOp::Sum.takes(t) && RedOp::Avg.takes(t));
        }
    }
}
