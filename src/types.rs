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
    pub const fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8e4m3 | DataType::Float8e5m2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// Types that are reduced in a wider accumulator (float32) and rounded once.
    pub const fn is_narrow_float(self) -> bool {
        matches!(self, DataType::Float16 | DataType::Bfloat16 | DataType::Float8e4m3 | DataType::Float8e5m2)
    }

    /// Bytes per element of the accumulator used while reducing this type.
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
    fn try_from(v: i32) -> Result<Self, i32> {
        DataType::ALL.get(usize::try_from(v).map_err(|_| v)?).copied().ok_or(v)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.c_name())
    }
}

/// Reduction operators of docs/abi.md, with NCCL's numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
}

impl RedOp {
    /// Every operator, in numbering order.
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    /// The C name, as used in messages.
    pub const fn c_name(self) -> &'static str {
        match self {
            RedOp::Sum => "fcclSum",
            RedOp::Prod => "fcclProd",
            RedOp::Max => "fcclMax",
            RedOp::Min => "fcclMin",
            RedOp::Avg => "fcclAvg",
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
        }
    }
}

impl TryFrom<i32> for RedOp {
    type Error = i32;
    fn try_from(v: i32) -> Result<Self, i32> {
        RedOp::ALL.get(usize::try_from(v).map_err(|_| v)?).copied().ok_or(v)
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
        for (i, op) in RedOp::ALL.iter().enumerate() {
            assert_eq!(RedOp::try_from(i as i32), Ok(*op));
        }
        assert!(RedOp::try_from(5).is_err());
        assert!(RedOp::try_from(i32::MIN).is_err());
    }
}
