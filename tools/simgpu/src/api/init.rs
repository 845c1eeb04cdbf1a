//! Initialisation, version and error strings: the calls that work before `cuInit`.

use super::{non_null, out};
use crate::error::{self, bail};
use crate::state::{self, api_pre_init};
use cudarc::driver::sys::CUresult;
use std::ffi::{c_char, c_int, c_uint};

/// Initialises the simulated driver: reads the configuration (docs/sim-gpu.md) and starts
/// the one executor thread, at the first successful call. Flags other than 0 are
/// CUDA_ERROR_INVALID_VALUE; no visible device is CUDA_ERROR_NO_DEVICE; in a child forked
/// after the parent initialised, CUDA_ERROR_NOT_INITIALIZED (CUDA cannot be used there).
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    api_pre_init("cuInit", || state::init(flags))
}

/// 13000 (CUDA 13.0); works before cuInit.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: `out` checks NULL; the caller passes a writable int.
    api_pre_init("cuDriverGetVersion", || unsafe { out(version, 13000, "driverVersion") })
}

/// The real driver's description of every CUresult ("invalid argument", ...); an unknown
/// value is CUDA_ERROR_INVALID_VALUE with `*pStr` set to NULL. Works before cuInit.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: c_uint, pstr: *mut *const c_char) -> CUresult {
    api_pre_init("cuGetErrorString", || {
        non_null(pstr, "pStr")?;
        let s = error::string(error);
        // SAFETY: non-NULL (checked); the strings live for the whole process.
        unsafe { *pstr = s.map_or(std::ptr::null(), |s| s.as_ptr()) };
        if s.is_none() {
            bail!(CUDA_ERROR_INVALID_VALUE, "{error} is not a CUresult");
        }
        Ok(())
    })
}

/// The enum name of every CUresult ("CUDA_ERROR_INVALID_VALUE"); as cuGetErrorString otherwise.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: c_uint, pstr: *mut *const c_char) -> CUresult {
    api_pre_init("cuGetErrorName", || {
        non_null(pstr, "pStr")?;
        let s = error::name(error);
        // SAFETY: non-NULL (checked); the strings live for the whole process.
        unsafe { *pstr = s.map_or(std::ptr::null(), |s| s.as_ptr()) };
        if s.is_none() {
            bail!(CUDA_ERROR_INVALID_VALUE, "{error} is not a CUresult");
        }
        Ok(())
    })
}
