//! Stream memory operations (cuStreamWaitValue*, cuStreamWriteValue*, cuStreamBatchMemOp):
//! atomic stores and polled atomic loads on device-accessible memory, which another stream,
//! the host or another process (IPC memory, shared registered pages) may write.

use crate::error::{bail, Result};
use crate::mem::{Loc, MemTable};
use crate::stream::op::Side;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub const WAIT_GEQ: u32 = 0x0;
pub const WAIT_EQ: u32 = 0x1;
pub const WAIT_AND: u32 = 0x2;
pub const WAIT_NOR: u32 = 0x3;
pub const WAIT_FLUSH: u32 = 1 << 30;
pub const WRITE_NO_MEMORY_BARRIER: u32 = 0x1;

/// The target of a memory operation: device, IPC-opened or managed memory (through the
/// alias) or pinned/registered host memory (directly), aligned to the operand size.
pub fn target(mem: &MemTable, addr: u64, wide: bool) -> Result<Side> {
    let size = if wide { 8 } else { 4 };
    if !addr.is_multiple_of(size as u64) {
        bail!(CUDA_ERROR_INVALID_VALUE, "address {addr:#x} is not aligned to {size} bytes");
    }
    match mem.classify(addr, size, "address")? {
        Loc::Dev(a, off) => Ok(Side::Dev(a, off)),
        Loc::Pinned(p) => Ok(Side::Host(p)),
        Loc::Pageable(_) => bail!(
            CUDA_ERROR_INVALID_VALUE,
            "address {addr:#x} is pageable host memory; the GPU cannot access it (cuMemHostRegister it)"
        ),
    }
}

pub fn check_wait_flags(flags: u32) -> Result<()> {
    if flags & !WAIT_FLUSH > WAIT_NOR {
        bail!(CUDA_ERROR_INVALID_VALUE, "wait flags {flags:#x} are not GEQ, EQ, AND or NOR (plus FLUSH)");
    }
    Ok(())
}

pub fn check_write_flags(flags: u32) -> Result<()> {
    if flags & !WRITE_NO_MEMORY_BARRIER != 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "write flags {flags:#x} are not valid");
    }
    Ok(())
}

/// The wait condition on the current value `cur`. GEQ is cyclic, as CUDA documents:
/// `(int)(*addr - value) >= 0` in the operand's width.
pub fn condition(cur: u64, value: u64, wide: bool, flags: u32) -> bool {
    match flags & !WAIT_FLUSH {
        WAIT_GEQ if wide => (cur.wrapping_sub(value) as i64) >= 0,
        WAIT_GEQ => ((cur as u32).wrapping_sub(value as u32) as i32) >= 0,
        WAIT_EQ => cur == value,
        WAIT_AND => cur & value != 0,
        _ if wide => !(cur | value) != 0,
        _ => !((cur | value) as u32) != 0,
    }
}

/// Whether the wait at `p` is satisfied now.
///
/// # Safety
/// `p` is aligned for the operand and points into memory mapped for the call's duration.
pub unsafe fn wait_satisfied(p: *mut u8, value: u64, wide: bool, flags: u32) -> bool {
    let cur = if wide {
        // SAFETY: aligned, mapped (caller); accessed only atomically by the simulator.
        unsafe { AtomicU64::from_ptr(p.cast()) }.load(Ordering::SeqCst)
    } else {
        // SAFETY: as above.
        u64::from(unsafe { AtomicU32::from_ptr(p.cast()) }.load(Ordering::SeqCst))
    };
    condition(cur, value, wide, flags)
}

/// Stores `value` at `p` atomically.
///
/// # Safety
/// As for [`wait_satisfied`], and writable.
pub unsafe fn write(p: *mut u8, value: u64, wide: bool) {
    if wide {
        // SAFETY: aligned, mapped, writable (caller).
        unsafe { AtomicU64::from_ptr(p.cast()) }.store(value, Ordering::SeqCst);
    } else {
        // SAFETY: as above.
        unsafe { AtomicU32::from_ptr(p.cast()) }.store(value as u32, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_follow_the_cuda_documentation() {
        assert!(condition(5, 5, false, WAIT_GEQ) && condition(6, 5, false, WAIT_GEQ));
        assert!(!condition(4, 5, false, WAIT_GEQ));
        // Cyclic: 1 is "after" 0xffff_fffe in 32-bit sequence space.
        assert!(condition(1, 0xffff_fffe, false, WAIT_GEQ));
        assert!(!condition(0xffff_fffe, 1, false, WAIT_GEQ));
        assert!(condition(1, u64::MAX - 1, true, WAIT_GEQ));
        assert!(condition(7, 7, true, WAIT_EQ | WAIT_FLUSH) && !condition(7, 8, true, WAIT_EQ));
        assert!(condition(0b110, 0b010, false, WAIT_AND) && !condition(0b100, 0b010, false, WAIT_AND));
        // NOR: some bit set in neither.
        assert!(condition(0, 0, false, WAIT_NOR));
        assert!(!condition(0xffff_0000, 0x0000_ffff, false, WAIT_NOR));
        assert!(condition(0xffff_0000, 0x0000_ffff, true, WAIT_NOR));
        assert!(check_wait_flags(4).is_err() && check_wait_flags(WAIT_NOR | WAIT_FLUSH).is_ok());
        assert!(check_write_flags(2).is_err() && check_write_flags(1).is_ok());
    }
}
