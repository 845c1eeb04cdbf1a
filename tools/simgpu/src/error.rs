//! Errors of the simulated driver: a `CUresult` plus the reason, printed with
//! `FERROCCL_SIM_TRACE=errors`, and the names and strings `cuGetErrorName` /
//! `cuGetErrorString` return.

use cudarc::driver::sys::CUresult as R;
use std::ffi::CStr;

/// A failed call: the code the caller sees and why (for the trace).
#[derive(Debug, Clone)]
pub struct Error {
    pub code: R,
    pub why: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(code: R, why: impl Into<String>) -> Error {
        Error { code, why: why.into() }
    }
}

/// `Err(Error)` with a formatted reason: `bail!(CUDA_ERROR_INVALID_VALUE, "size {} is 0", n)`.
macro_rules! bail {
    ($code:ident, $($arg:tt)*) => {
        return Err($crate::error::Error::new(cudarc::driver::sys::CUresult::$code, format!($($arg)*)))
    };
}
pub(crate) use bail;

/// An `Error` with a formatted reason, for `ok_or_else` and `map_err`.
macro_rules! err {
    ($code:ident, $($arg:tt)*) => {
        $crate::error::Error::new(cudarc::driver::sys::CUresult::$code, format!($($arg)*))
    };
}
pub(crate) use err;

/// Every `CUresult` of CUDA 13.0, so that a raw integer from C can be checked before it is
/// turned into the enum (an out-of-range enum value would be undefined behaviour in Rust).
const ALL: &[R] = &[
    R::CUDA_SUCCESS,
    R::CUDA_ERROR_INVALID_VALUE,
    R::CUDA_ERROR_OUT_OF_MEMORY,
    R::CUDA_ERROR_NOT_INITIALIZED,
    R::CUDA_ERROR_DEINITIALIZED,
    R::CUDA_ERROR_PROFILER_DISABLED,
    R::CUDA_ERROR_PROFILER_NOT_INITIALIZED,
    R::CUDA_ERROR_PROFILER_ALREADY_STARTED,
    R::CUDA_ERROR_PROFILER_ALREADY_STOPPED,
    R::CUDA_ERROR_STUB_LIBRARY,
    R::CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER,
    R::CUDA_ERROR_DEVICE_UNAVAILABLE,
    R::CUDA_ERROR_NO_DEVICE,
    R::CUDA_ERROR_INVALID_DEVICE,
    R::CUDA_ERROR_DEVICE_NOT_LICENSED,
    R::CUDA_ERROR_INVALID_IMAGE,
    R::CUDA_ERROR_INVALID_CONTEXT,
    R::CUDA_ERROR_CONTEXT_ALREADY_CURRENT,
    R::CUDA_ERROR_MAP_FAILED,
    R::CUDA_ERROR_UNMAP_FAILED,
    R::CUDA_ERROR_ARRAY_IS_MAPPED,
    R::CUDA_ERROR_ALREADY_MAPPED,
    R::CUDA_ERROR_NO_BINARY_FOR_GPU,
    R::CUDA_ERROR_ALREADY_ACQUIRED,
    R::CUDA_ERROR_NOT_MAPPED,
    R::CUDA_ERROR_NOT_MAPPED_AS_ARRAY,
    R::CUDA_ERROR_NOT_MAPPED_AS_POINTER,
    R::CUDA_ERROR_ECC_UNCORRECTABLE,
    R::CUDA_ERROR_UNSUPPORTED_LIMIT,
    R::CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
    R::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
    R::CUDA_ERROR_INVALID_PTX,
    R::CUDA_ERROR_INVALID_GRAPHICS_CONTEXT,
    R::CUDA_ERROR_NVLINK_UNCORRECTABLE,
    R::CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
    R::CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
    R::CUDA_ERROR_JIT_COMPILATION_DISABLED,
    R::CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY,
    R::CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC,
    R::CUDA_ERROR_CONTAINED,
    R::CUDA_ERROR_INVALID_SOURCE,
    R::CUDA_ERROR_FILE_NOT_FOUND,
    R::CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
    R::CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
    R::CUDA_ERROR_OPERATING_SYSTEM,
    R::CUDA_ERROR_INVALID_HANDLE,
    R::CUDA_ERROR_ILLEGAL_STATE,
    R::CUDA_ERROR_LOSSY_QUERY,
    R::CUDA_ERROR_NOT_FOUND,
    R::CUDA_ERROR_NOT_READY,
    R::CUDA_ERROR_ILLEGAL_ADDRESS,
    R::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
    R::CUDA_ERROR_LAUNCH_TIMEOUT,
    R::CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING,
    R::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
    R::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
    R::CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
    R::CUDA_ERROR_CONTEXT_IS_DESTROYED,
    R::CUDA_ERROR_ASSERT,
    R::CUDA_ERROR_TOO_MANY_PEERS,
    R::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
    R::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    R::CUDA_ERROR_HARDWARE_STACK_ERROR,
    R::CUDA_ERROR_ILLEGAL_INSTRUCTION,
    R::CUDA_ERROR_MISALIGNED_ADDRESS,
    R::CUDA_ERROR_INVALID_ADDRESS_SPACE,
    R::CUDA_ERROR_INVALID_PC,
    R::CUDA_ERROR_LAUNCH_FAILED,
    R::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
    R::CUDA_ERROR_TENSOR_MEMORY_LEAK,
    R::CUDA_ERROR_NOT_PERMITTED,
    R::CUDA_ERROR_NOT_SUPPORTED,
    R::CUDA_ERROR_SYSTEM_NOT_READY,
    R::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
    R::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
    R::CUDA_ERROR_MPS_CONNECTION_FAILED,
    R::CUDA_ERROR_MPS_RPC_FAILURE,
    R::CUDA_ERROR_MPS_SERVER_NOT_READY,
    R::CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,
    R::CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED,
    R::CUDA_ERROR_MPS_CLIENT_TERMINATED,
    R::CUDA_ERROR_CDP_NOT_SUPPORTED,
    R::CUDA_ERROR_CDP_VERSION_MISMATCH,
    R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    R::CUDA_ERROR_STREAM_CAPTURE_MERGE,
    R::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
    R::CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
    R::CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
    R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
    R::CUDA_ERROR_CAPTURED_EVENT,
    R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
    R::CUDA_ERROR_TIMEOUT,
    R::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
    R::CUDA_ERROR_EXTERNAL_DEVICE,
    R::CUDA_ERROR_INVALID_CLUSTER_SIZE,
    R::CUDA_ERROR_FUNCTION_NOT_LOADED,
    R::CUDA_ERROR_INVALID_RESOURCE_TYPE,
    R::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
    R::CUDA_ERROR_KEY_ROTATION,
    R::CUDA_ERROR_UNKNOWN,
];

/// The `CUresult` with numeric value `v`, if there is one.
pub fn from_raw(v: u32) -> Option<R> {
    ALL.iter().copied().find(|r| *r as u32 == v)
}

/// The real driver's description where this crate knows it, else one made from the name.
fn description(r: R) -> String {
    let known = match r {
        R::CUDA_SUCCESS => "no error",
        R::CUDA_ERROR_INVALID_VALUE => "invalid argument",
        R::CUDA_ERROR_OUT_OF_MEMORY => "out of memory",
        R::CUDA_ERROR_NOT_INITIALIZED => "initialization error",
        R::CUDA_ERROR_DEINITIALIZED => "driver shutting down",
        R::CUDA_ERROR_STUB_LIBRARY => "CUDA driver is a stub library",
        R::CUDA_ERROR_NO_DEVICE => "no CUDA-capable device is detected",
        R::CUDA_ERROR_INVALID_DEVICE => "invalid device ordinal",
        R::CUDA_ERROR_INVALID_IMAGE => "device kernel image is invalid",
        R::CUDA_ERROR_INVALID_CONTEXT => "invalid device context",
        R::CUDA_ERROR_MAP_FAILED => "mapping of buffer object failed",
        R::CUDA_ERROR_UNMAP_FAILED => "unmapping of buffer object failed",
        R::CUDA_ERROR_NO_BINARY_FOR_GPU => "no kernel image is available for execution on the device",
        R::CUDA_ERROR_CONTEXT_ALREADY_IN_USE => "exclusive-thread device already in use by a different thread",
        R::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => "peer access is not supported between these two devices",
        R::CUDA_ERROR_INVALID_PTX => "a PTX JIT compilation failed",
        R::CUDA_ERROR_INVALID_SOURCE => "invalid source",
        R::CUDA_ERROR_FILE_NOT_FOUND => "file not found",
        R::CUDA_ERROR_OPERATING_SYSTEM => "OS call failed or operation not supported on this OS",
        R::CUDA_ERROR_INVALID_HANDLE => "invalid resource handle",
        R::CUDA_ERROR_ILLEGAL_STATE => "the operation cannot be performed in the present state",
        R::CUDA_ERROR_NOT_FOUND => "named symbol not found",
        R::CUDA_ERROR_NOT_READY => "device not ready",
        R::CUDA_ERROR_ILLEGAL_ADDRESS => "an illegal memory access was encountered",
        R::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => "too many resources requested for launch",
        R::CUDA_ERROR_LAUNCH_TIMEOUT => "the launch timed out and was terminated",
        R::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => "peer access is already enabled",
        R::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => "peer access has not been enabled",
        R::CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE => "cannot set while device is active in this process",
        R::CUDA_ERROR_CONTEXT_IS_DESTROYED => "context is destroyed",
        R::CUDA_ERROR_ASSERT => "device-side assert triggered",
        R::CUDA_ERROR_TOO_MANY_PEERS => "peer mapping resources exhausted",
        R::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => "part or all of the requested memory range is already mapped",
        R::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED => "pointer does not correspond to a registered memory region",
        R::CUDA_ERROR_MISALIGNED_ADDRESS => "misaligned address",
        R::CUDA_ERROR_LAUNCH_FAILED => "unspecified launch failure",
        R::CUDA_ERROR_NOT_PERMITTED => "operation not permitted",
        R::CUDA_ERROR_NOT_SUPPORTED => "operation not supported",
        R::CUDA_ERROR_TIMEOUT => "wait operation timed out",
        R::CUDA_ERROR_UNKNOWN => "unknown error",
        _ => "",
    };
    if !known.is_empty() {
        return known.to_string();
    }
    let name = format!("{r:?}");
    name.trim_start_matches("CUDA_ERROR_").to_ascii_lowercase().replace('_', " ")
}

/// NUL-terminated (name, description) of every code, built once and kept for the process's
/// life: the C API hands out `const char*` that must stay valid.
type Strings = Vec<(R, Box<CStr>, Box<CStr>)>;

fn strings() -> &'static Strings {
    static S: std::sync::OnceLock<Strings> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        ALL.iter()
            .map(|&r| {
                let name = std::ffi::CString::new(format!("{r:?}")).expect("enum names have no NUL");
                let desc = std::ffi::CString::new(description(r)).expect("descriptions have no NUL");
                (r, name.into_boxed_c_str(), desc.into_boxed_c_str())
            })
            .collect()
    })
}

/// `cuGetErrorName`'s string for `v` (`"CUDA_ERROR_INVALID_VALUE"`), None for unknown values.
pub fn name(v: u32) -> Option<&'static CStr> {
    strings().iter().find(|(r, _, _)| *r as u32 == v).map(|(_, n, _)| &**n)
}

/// `cuGetErrorString`'s string for `v` (`"invalid argument"`), None for unknown values.
pub fn string(v: u32) -> Option<&'static CStr> {
    strings().iter().find(|(r, _, _)| *r as u32 == v).map(|(_, _, s)| &**s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_name_and_a_string() {
        for &r in ALL {
            assert_eq!(from_raw(r as u32), Some(r));
            assert_eq!(name(r as u32).unwrap().to_str().unwrap(), format!("{r:?}"));
            assert!(!string(r as u32).unwrap().to_bytes().is_empty());
        }
        assert_eq!(string(201).unwrap().to_str().unwrap(), "invalid device context");
        assert_eq!(string(700).unwrap().to_str().unwrap(), "an illegal memory access was encountered");
        assert_eq!(string(916).unwrap().to_str().unwrap(), "key rotation");
        assert!(from_raw(12345).is_none() && name(12345).is_none());
    }
}
