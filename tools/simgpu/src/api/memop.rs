//! Stream memory operations: wait on and write 32/64-bit values, alone or batched.

use super::non_null;
use crate::device;
use crate::error::{bail, Error, Result};
use crate::memop;
use crate::state::{api, lock, State};
use crate::stream::{self, op::OpKind};
use cudarc::driver::sys::{CUdeviceptr, CUresult, CUstream, CUstreamBatchMemOpParams};
use std::ffi::c_uint;

/// Batch operation types (CUstreamBatchMemOpType).
const OP_WAIT_32: u32 = 1;
const OP_WRITE_32: u32 = 2;
const OP_FLUSH_REMOTE_WRITES: u32 = 3;
const OP_WAIT_64: u32 = 4;
const OP_WRITE_64: u32 = 5;
const OP_BARRIER: u32 = 6;
/// Most operations one cuStreamBatchMemOp takes.
const MAX_BATCH: u32 = 256;

fn wait_op(st: &State, addr: CUdeviceptr, value: u64, wide: bool, flags: u32) -> Result<OpKind> {
    memop::check_wait_flags(flags)?;
    Ok(OpKind::Wait { at: memop::target(&st.mem, addr, wide)?, value, wide, flags })
}

fn write_op(st: &State, addr: CUdeviceptr, value: u64, wide: bool, flags: u32) -> Result<OpKind> {
    memop::check_write_flags(flags)?;
    Ok(OpKind::Write { at: memop::target(&st.mem, addr, wide)?, value, wide })
}

/// Checks and enqueues the operations `make` builds (all or none).
fn enqueue(s: CUstream, make: impl FnOnce(&State) -> Result<Vec<OpKind>>) -> Result<()> {
    let mut st = lock();
    let sid = stream::resolve(&mut st, s as u64)?;
    for op in make(&st)? {
        stream::enqueue(&mut st, sid, op, Vec::new());
    }
    Ok(())
}

macro_rules! memop_fn {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $make:ident, $wide:expr) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name(s: CUstream, addr: CUdeviceptr, value: $ty, flags: c_uint) -> CUresult {
            api(stringify!($name), || enqueue(s, |st| Ok(vec![$make(st, addr, u64::from(value), $wide, flags)?])))
        }
    };
}

memop_fn!(
    /// The stream waits until `*addr` satisfies GEQ (cyclic), EQ, AND or NOR with `value`.
    /// `addr` must be 4-byte aligned device, IPC, managed or pinned/registered host memory;
    /// pageable host memory is CUDA_ERROR_INVALID_VALUE. Polled: another stream, the host
    /// or another process may write it.
    cuStreamWaitValue32_v2, u32, wait_op, false
);
memop_fn!(
    /// As cuStreamWaitValue32_v2 on a 64-bit value (8-byte aligned).
    cuStreamWaitValue64_v2, u64, wait_op, true
);
memop_fn!(
    /// Stores `value` atomically at `addr` when the stream gets there (same memory rules as
    /// the waits); flag CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER accepted.
    cuStreamWriteValue32_v2, u32, write_op, false
);
memop_fn!(
    /// As cuStreamWriteValue32_v2 with a 64-bit value.
    cuStreamWriteValue64_v2, u64, write_op, true
);
/// Err where the stock-driver profile says a stock driver refuses every call of `name`: the V1
/// (unversioned) memory operations, disabled unless the nvidia module is loaded with
/// NVreg_EnableStreamMemOPs=1.
fn stock_refusal(name: &str) -> Result<()> {
    if let Some(code) = device::profile().refusal(name) {
        return Err(Error::new(
            code,
            format!(
                "{name} is a V1 stream memory operation, which a stock driver disables (it needs the nvidia \
                 module loaded with NVreg_EnableStreamMemOPs=1; CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 \
                 is 0): call {name}_v2"
            ),
        ));
    }
    Ok(())
}

macro_rules! memop_v1_fn {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $make:ident, $wide:expr) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name(s: CUstream, addr: CUdeviceptr, value: $ty, flags: c_uint) -> CUresult {
            api(stringify!($name), || {
                stock_refusal(stringify!($name))?;
                enqueue(s, |st| Ok(vec![$make(st, addr, u64::from(value), $wide, flags)?]))
            })
        }
    };
}

memop_v1_fn!(
    /// V1: CUDA_ERROR_NOT_SUPPORTED, as on a stock driver (the profile's entry_points); where a
    /// profile says "available" (NVreg_EnableStreamMemOPs=1), the same as cuStreamWaitValue32_v2.
    cuStreamWaitValue32, u32, wait_op, false
);
memop_v1_fn!(
    /// V1: as cuStreamWaitValue32 for cuStreamWaitValue64_v2.
    cuStreamWaitValue64, u64, wait_op, true
);
memop_v1_fn!(
    /// V1: as cuStreamWaitValue32 for cuStreamWriteValue32_v2.
    cuStreamWriteValue32, u32, write_op, false
);
memop_v1_fn!(
    /// V1: as cuStreamWaitValue32 for cuStreamWriteValue64_v2.
    cuStreamWriteValue64, u64, write_op, true
);

/// One batch entry, read as integers (the operation field is an enum in C).
///
/// # Safety
/// `p` points at a CUstreamBatchMemOpParams.
unsafe fn batch_op(st: &State, p: *const CUstreamBatchMemOpParams, i: usize) -> Result<OpKind> {
    // SAFETY: every member of the union starts with the operation, a 32-bit enum (caller).
    let op = unsafe { p.cast::<u32>().read() };
    // SAFETY: for wait/write entries the union holds the matching struct, whose
    // value field is a union of u32/u64 and whose operation field was read as an integer.
    let (addr, v32, v64, flags) = unsafe {
        let w = std::ptr::addr_of!((*p).waitValue);
        (
            std::ptr::addr_of!((*w).address).read(),
            std::ptr::addr_of!((*w).__bindgen_anon_1).cast::<u32>().read(),
            std::ptr::addr_of!((*w).__bindgen_anon_1).cast::<u64>().read(),
            std::ptr::addr_of!((*w).flags).read(),
        )
    };
    match op {
        OP_WAIT_32 => wait_op(st, addr, u64::from(v32), false, flags),
        OP_WAIT_64 => wait_op(st, addr, v64, true, flags),
        OP_WRITE_32 => write_op(st, addr, u64::from(v32), false, flags),
        OP_WRITE_64 => write_op(st, addr, v64, true, flags),
        OP_FLUSH_REMOTE_WRITES | OP_BARRIER => Ok(OpKind::Nop),
        _ => bail!(CUDA_ERROR_INVALID_VALUE, "paramArray[{i}]: operation {op} is not valid"),
    }
}

/// Checks and enqueues a batch (all or none).
///
/// # Safety
/// `params` is NULL or has `count` entries.
unsafe fn batch(s: CUstream, count: c_uint, params: *mut CUstreamBatchMemOpParams, flags: c_uint) -> Result<()> {
    if flags != 0 || count == 0 || count > MAX_BATCH {
        bail!(CUDA_ERROR_INVALID_VALUE, "count {count} (1..={MAX_BATCH}) and flags {flags:#x} (0)");
    }
    non_null(params, "paramArray")?;
    enqueue(s, |st| {
        // SAFETY: `params` has `count` entries (caller).
        (0..count as usize).map(|i| unsafe { batch_op(st, params.add(i), i) }).collect()
    })
}

/// Several wait/write/barrier/flush operations, checked together (all or none enqueued),
/// run in order. Flags must be 0; at most 256 operations.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBatchMemOp_v2(
    s: CUstream,
    count: c_uint,
    params: *mut CUstreamBatchMemOpParams,
    flags: c_uint,
) -> CUresult {
    // SAFETY: `params` has `count` entries (caller).
    api("cuStreamBatchMemOp_v2", || unsafe { batch(s, count, params, flags) })
}

/// V1: CUDA_ERROR_NOT_SUPPORTED, as on a stock driver (the profile's entry_points); where a
/// profile says "available", the same as cuStreamBatchMemOp_v2.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBatchMemOp(
    s: CUstream,
    count: c_uint,
    params: *mut CUstreamBatchMemOpParams,
    flags: c_uint,
) -> CUresult {
    api("cuStreamBatchMemOp", || {
        stock_refusal("cuStreamBatchMemOp")?;
        // SAFETY: `params` has `count` entries (caller).
        unsafe { batch(s, count, params, flags) }
    })
}
