//! `cuGetProcAddress`: the simulator's own functions by name, mapped from the base name the
//! way the real driver maps versioned entry points.

use super::non_null;
use super::*;
use crate::error::bail;
use crate::state::api_pre_init;
use cudarc::driver::sys::CUresult;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

macro_rules! exports {
    ($($f:ident,)*) => {
        /// Every exported driver function: (name, address).
        pub fn exports() -> &'static [(&'static str, usize)] {
            static T: OnceLock<Vec<(&'static str, usize)>> = OnceLock::new();
            T.get_or_init(|| vec![$((stringify!($f), $f as *const () as usize)),*])
        }
    };
}

exports! {
    cuCtxCreate_v2,
    cuCtxCreate_v3,
    cuCtxCreate_v4,
    cuCtxDestroy_v2,
    cuCtxDisablePeerAccess,
    cuCtxEnablePeerAccess,
    cuCtxGetApiVersion,
    cuCtxGetCurrent,
    cuCtxGetDevice,
    cuCtxGetFlags,
    cuCtxGetId,
    cuCtxGetStreamPriorityRange,
    cuCtxPopCurrent_v2,
    cuCtxPushCurrent_v2,
    cuCtxSetCurrent,
    cuCtxSetFlags,
    cuCtxSynchronize,
    cuDeviceCanAccessPeer,
    cuDeviceComputeCapability,
    cuDeviceGet,
    cuDeviceGetAttribute,
    cuDeviceGetByPCIBusId,
    cuDeviceGetCount,
    cuDeviceGetDefaultMemPool,
    cuDeviceGetMemPool,
    cuDeviceGetName,
    cuDeviceGetP2PAttribute,
    cuDeviceGetPCIBusId,
    cuDeviceGetUuid,
    cuDeviceGetUuid_v2,
    cuDevicePrimaryCtxGetState,
    cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxReset_v2,
    cuDevicePrimaryCtxRetain,
    cuDevicePrimaryCtxSetFlags_v2,
    cuDeviceTotalMem_v2,
    cuDriverGetVersion,
    cuEventCreate,
    cuEventDestroy_v2,
    cuEventElapsedTime,
    cuEventElapsedTime_v2,
    cuEventQuery,
    cuEventRecord,
    cuEventRecordWithFlags,
    cuEventSynchronize,
    cuFuncGetAttribute,
    cuFuncGetModule,
    cuFuncGetName,
    cuFuncSetAttribute,
    cuGetErrorName,
    cuGetErrorString,
    cuGetProcAddress,
    cuGetProcAddress_v2,
    cuGraphDestroy,
    cuGraphExecDestroy,
    cuGraphGetNodes,
    cuGraphInstantiateWithFlags,
    cuGraphLaunch,
    cuInit,
    cuIpcCloseMemHandle,
    cuIpcGetEventHandle,
    cuIpcGetMemHandle,
    cuIpcOpenEventHandle,
    cuIpcOpenMemHandle,
    cuIpcOpenMemHandle_v2,
    cuLaunchHostFunc,
    cuLaunchKernel,
    cuMemAddressFree,
    cuMemAddressReserve,
    cuMemAllocAsync,
    cuMemAllocFromPoolAsync,
    cuMemAllocHost_v2,
    cuMemAllocManaged,
    cuMemAllocPitch_v2,
    cuMemAlloc_v2,
    cuMemCreate,
    cuMemExportToShareableHandle,
    cuMemFreeAsync,
    cuMemFreeHost,
    cuMemFree_v2,
    cuMemGetAccess,
    cuMemGetAddressRange_v2,
    cuMemGetAllocationGranularity,
    cuMemGetAllocationPropertiesFromHandle,
    cuMemGetInfo_v2,
    cuMemHostAlloc,
    cuMemHostGetDevicePointer_v2,
    cuMemHostGetFlags,
    cuMemHostRegister_v2,
    cuMemHostUnregister,
    cuMemImportFromShareableHandle,
    cuMemMap,
    cuMemPoolGetAttribute,
    cuMemPoolSetAttribute,
    cuMemPoolTrimTo,
    cuMemRelease,
    cuMemRetainAllocationHandle,
    cuMemSetAccess,
    cuMemUnmap,
    cuMemcpy,
    cuMemcpy2DAsync_v2,
    cuMemcpy2DUnaligned_v2,
    cuMemcpy2D_v2,
    cuMemcpyAsync,
    cuMemcpyDtoDAsync_v2,
    cuMemcpyDtoD_v2,
    cuMemcpyDtoHAsync_v2,
    cuMemcpyDtoH_v2,
    cuMemcpyHtoDAsync_v2,
    cuMemcpyHtoD_v2,
    cuMemcpyPeer,
    cuMemcpyPeerAsync,
    cuMemsetD16Async,
    cuMemsetD16_v2,
    cuMemsetD2D16Async,
    cuMemsetD2D16_v2,
    cuMemsetD2D32Async,
    cuMemsetD2D32_v2,
    cuMemsetD2D8Async,
    cuMemsetD2D8_v2,
    cuMemsetD32Async,
    cuMemsetD32_v2,
    cuMemsetD8Async,
    cuMemsetD8_v2,
    cuModuleGetFunction,
    cuModuleLoad,
    cuModuleLoadData,
    cuModuleLoadDataEx,
    cuModuleUnload,
    cuPointerGetAttribute,
    cuPointerGetAttributes,
    cuPointerSetAttribute,
    cuStreamAddCallback,
    cuStreamBatchMemOp,
    cuStreamBatchMemOp_v2,
    cuStreamBeginCapture_v2,
    cuStreamCreate,
    cuStreamCreateWithPriority,
    cuStreamDestroy_v2,
    cuStreamEndCapture,
    cuStreamGetCaptureInfo_v2,
    cuStreamGetCaptureInfo_v3,
    cuStreamGetCtx,
    cuStreamGetCtx_v2,
    cuStreamGetDevice,
    cuStreamGetFlags,
    cuStreamGetId,
    cuStreamGetPriority,
    cuStreamIsCapturing,
    cuStreamQuery,
    cuStreamSynchronize,
    cuStreamWaitEvent,
    cuStreamWaitValue32,
    cuStreamWaitValue32_v2,
    cuStreamWaitValue64,
    cuStreamWaitValue64_v2,
    cuStreamWriteValue32,
    cuStreamWriteValue32_v2,
    cuStreamWriteValue64,
    cuStreamWriteValue64_v2,
    cuThreadExchangeStreamCaptureMode,
}

/// The entry point a (base) name denotes for a program built against `version`: the
/// versions whose signatures changed follow it, the others get the newest suffix.
pub fn lookup(symbol: &str, version: i32) -> Option<usize> {
    let find = |n: &str| exports().iter().find(|(e, _)| *e == n).map(|&(_, a)| a);
    let pinned = match symbol {
        "cuCtxCreate" if version >= 12050 => Some("cuCtxCreate_v4"),
        "cuCtxCreate" if version >= 11040 => Some("cuCtxCreate_v3"),
        "cuCtxCreate" => Some("cuCtxCreate_v2"),
        "cuStreamGetCtx" if version >= 12050 => Some("cuStreamGetCtx_v2"),
        "cuStreamGetCtx" => Some("cuStreamGetCtx"),
        "cuGetProcAddress" if version >= 12000 => Some("cuGetProcAddress_v2"),
        "cuGetProcAddress" => Some("cuGetProcAddress"),
        // cuda.h's meaning: the edge data came with CUDA 13's form; before 11.3 the
        // unversioned form (status and id only), which the simulator does not export.
        "cuStreamGetCaptureInfo" if version >= 13000 => Some("cuStreamGetCaptureInfo_v3"),
        "cuStreamGetCaptureInfo" if version >= 11030 => Some("cuStreamGetCaptureInfo_v2"),
        "cuStreamGetCaptureInfo" => Some("cuStreamGetCaptureInfo"),
        // The memory operations got their _v2 (on by default) in CUDA 11.7; an older caller
        // gets the V1 entry points, which a stock driver refuses.
        "cuStreamWaitValue32"
        | "cuStreamWaitValue64"
        | "cuStreamWriteValue32"
        | "cuStreamWriteValue64"
        | "cuStreamBatchMemOp"
            if version < 11070 =>
        {
            Some(symbol)
        }
        _ => None,
    };
    if let Some(p) = pinned {
        return find(p);
    }
    ["_v4", "_v3", "_v2", ""].iter().find_map(|s| find(&format!("{symbol}{s}")))
}

fn get(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int) -> crate::error::Result<()> {
    non_null(symbol, "symbol")?;
    non_null(pfn, "pfn")?;
    // SAFETY: a NUL-terminated name (caller).
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy().into_owned();
    let found = lookup(&name, version);
    // SAFETY: checked non-NULL.
    unsafe { *pfn = found.unwrap_or(0) as *mut c_void };
    if found.is_none() {
        bail!(CUDA_ERROR_NOT_FOUND, "the simulator has no {name}");
    }
    Ok(())
}

/// The address of the simulator's function for `symbol` (a base name such as
/// "cuMemAlloc"); CUDA_ERROR_NOT_FOUND and `*pfn = NULL` if it has none. Flags (per-thread
/// default stream variants) are accepted and ignored. Works before cuInit.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    _flags: u64,
    status: *mut c_int,
) -> CUresult {
    api_pre_init("cuGetProcAddress_v2", || {
        let r = get(symbol, pfn, version);
        if !status.is_null() {
            // CU_GET_PROC_ADDRESS_SUCCESS / _SYMBOL_NOT_FOUND.
            // SAFETY: non-NULL, writable (caller).
            unsafe { status.write_unaligned(if r.is_ok() { 0 } else { 1 }) };
        }
        r
    })
}

/// As cuGetProcAddress_v2 without the status output (CUDA 11.3-11.8).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    _flags: u64,
) -> CUresult {
    api_pre_init("cuGetProcAddress", || get(symbol, pfn, version))
}
