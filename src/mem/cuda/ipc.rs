//! CUDA IPC: device allocations shared between processes by handle.

use super::*;

const IPC_SYMBOLS: &[&str] =
    &["cuIpcGetMemHandle", "cuIpcOpenMemHandle_v2", "cuMemGetAddressRange_v2", "cuMemcpyDtoDAsync_v2"];

/// Ok when the driver has what CUDA IPC between processes needs.
pub fn ipc_ready() -> Result<()> {
    static R: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    R.get_or_init(|| {
        driver().map_err(|e| e.msg)?;
        // SAFETY: the driver is present; only addresses are looked up.
        let lib = unsafe { cu::culib() };
        for s in IPC_SYMBOLS {
            // SAFETY: as above.
            if unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err() {
                return Err(format!("the CUDA driver lacks {s}"));
            }
        }
        Ok(())
    })
    .clone()
    .map_err(|m| Error::unavailable(format!("CUDA IPC is unavailable: {m}")))
}

/// The base and size of the device allocation holding `p`.
pub fn address_range(p: *const u8) -> Result<(usize, usize)> {
    let (mut base, mut size): (cu::CUdeviceptr, usize) = (0, 0);
    // SAFETY: valid out-pointers; a context is current (caller's guard).
    check(unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, p as usize as u64) }, "cuMemGetAddressRange")?;
    Ok((base as usize, size))
}

/// The IPC handle of the allocation holding `p`, and `p`'s offset in it. Fails for
/// memory IPC cannot share (managed, cuMemMap, pinned host).
pub fn ipc_handle(p: *const u8) -> Result<([u8; 64], usize)> {
    ipc_ready()?;
    let (mut base, mut size): (cu::CUdeviceptr, usize) = (0, 0);
    // SAFETY: valid out-pointers; a context is current (caller's guard).
    check(unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, p as usize as u64) }, "cuMemGetAddressRange")?;
    let mut h = cu::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: base is the start of a device allocation (from the driver).
    check(unsafe { cu::cuIpcGetMemHandle(&mut h, base) }, "cuIpcGetMemHandle")?;
    Ok((h.reserved.map(|c| c as u8), p as usize - base as usize))
}

/// Maps a peer process's allocation (its IPC `handle`) into the current context.
/// The driver counts opens of one handle in one context: each needs an [`ipc_close`].
pub fn ipc_open(handle: &[u8; 64]) -> Result<usize> {
    ipc_ready()?;
    let h = cu::CUipcMemHandle { reserved: handle.map(|b| b as std::os::raw::c_char) };
    let mut base: cu::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; the handle came from a peer's cuIpcGetMemHandle.
    let rc = unsafe {
        cu::cuIpcOpenMemHandle_v2(&mut base, h, 1 /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */)
    };
    check(rc, "cuIpcOpenMemHandle")?;
    Ok(base as usize)
}

/// Undoes one [`ipc_open`] in the current context.
///
/// # Safety
/// `base` came from `ipc_open` in the current context and no queued work uses it.
pub unsafe fn ipc_close(base: usize) -> Result<()> {
    // SAFETY: per the caller.
    check(unsafe { cu::cuIpcCloseMemHandle(base as cu::CUdeviceptr) }, "cuIpcCloseMemHandle")
}
