//! CUDA IPC: memory and event handles shared between processes.

use super::{non_null, out};
use crate::ctx;
use crate::error::bail;
use crate::ipc;
use crate::state::{api, lock};
use cudarc::driver::sys::{CUdeviceptr, CUevent, CUipcEventHandle, CUipcMemHandle, CUresult};
use std::ffi::{c_char, c_uint};

fn to_c(b: [u8; 64]) -> [c_char; 64] {
    b.map(|x| x as c_char)
}

fn from_c(b: [c_char; 64]) -> [u8; 64] {
    b.map(|x| x as u8)
}

/// A handle for the base of a cuMemAlloc allocation (managed, pinned, stream-ordered,
/// IPC-opened memory and interior pointers are CUDA_ERROR_INVALID_VALUE).
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) -> CUresult {
    api("cuIpcGetMemHandle", || {
        non_null(handle, "pHandle")?;
        let st = lock();
        ctx::current(&st)?;
        let h = ipc::get_mem_handle(&st, dptr)?;
        // SAFETY: checked non-NULL.
        unsafe { out(handle, CUipcMemHandle { reserved: to_c(h) }, "pHandle") }
    })
}

/// Maps another process's allocation at a fresh device address of the current context
/// (reference-counted per context and handle). In the exporting process:
/// CUDA_ERROR_INVALID_CONTEXT, as the real driver. A handle whose memory is gone (freed,
/// exporter exited): CUDA_ERROR_INVALID_HANDLE. The mapping keeps the memory alive even if
/// the exporter frees it (the real driver promises nothing then).
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    api("cuIpcOpenMemHandle_v2", || {
        non_null(pdptr, "pdptr")?;
        if flags & !1 != 0 {
            bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} are not CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS");
        }
        let mut st = lock();
        let h = ctx::current(&st)?;
        let base = ipc::open_mem(&mut st, h, &from_c(handle.reserved))?;
        // SAFETY: checked non-NULL.
        unsafe { out(pdptr, base, "pdptr") }
    })
}

/// Same as cuIpcOpenMemHandle_v2.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuIpcOpenMemHandle_v2(pdptr, handle, flags) }
}

/// Undoes one cuIpcOpenMemHandle of `dptr`; the last one unmaps.
#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    api("cuIpcCloseMemHandle", || {
        let mut st = lock();
        ctx::current(&st)?;
        ipc::close_mem(&mut st, dptr)
    })
}

/// A handle for an event created with CU_EVENT_INTERPROCESS (its counters live in a shared
/// memfd page).
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetEventHandle(handle: *mut CUipcEventHandle, ev: CUevent) -> CUresult {
    api("cuIpcGetEventHandle", || {
        non_null(handle, "pHandle")?;
        let st = lock();
        ctx::current(&st)?;
        let h = ipc::get_event_handle(&st, ev as u64)?;
        // SAFETY: checked non-NULL.
        unsafe { out(handle, CUipcEventHandle { reserved: to_c(h) }, "pHandle") }
    })
}

/// Opens another process's interprocess event in the current context: records, queries and
/// waits on either side see each other's records.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenEventHandle(ph: *mut CUevent, handle: CUipcEventHandle) -> CUresult {
    api("cuIpcOpenEventHandle", || {
        non_null(ph, "phEvent")?;
        let mut st = lock();
        let h = ctx::current(&st)?;
        let e = ipc::open_event(&mut st, h, &from_c(handle.reserved))?;
        // SAFETY: checked non-NULL.
        unsafe { out(ph, e as CUevent, "phEvent") }
    })
}
