//! Modules, functions and kernel launches.

use super::{non_null, out};
use crate::ctx;
use crate::error::{bail, err, Result};
use crate::kernels::Launch;
use crate::module;
use crate::state::{api, lock};
use crate::stream::{self, op::OpKind};
use cudarc::driver::sys::{CUfunction, CUmodule, CUresult, CUstream};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

fn load(pmod: *mut CUmodule, image: &[u8]) -> Result<()> {
    non_null(pmod, "module")?;
    ctx::current(&lock())?;
    let (entries, path) = module::parse_ptx(image)?;
    let object = crate::jit::load(&path).map_err(|e| err!(CUDA_ERROR_INVALID_IMAGE, "{e}"))?;
    let mut st = lock();
    let h = ctx::current(&st)?;
    let m = module::load(&mut st, h, entries, object)?;
    // SAFETY: checked non-NULL.
    unsafe { out(pmod, m as CUmodule, "module") }
}

/// Loads PTX text (as the simulated NVRTC produces) into the current context. Other images
/// (cubin, fatbin) are CUDA_ERROR_INVALID_IMAGE: the simulator cannot run machine code.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(pmod: *mut CUmodule, image: *const c_void) -> CUresult {
    api("cuModuleLoadData", || {
        non_null(image, "image")?;
        // SAFETY: PTX images are NUL-terminated (caller).
        load(pmod, unsafe { CStr::from_ptr(image.cast()) }.to_bytes())
    })
}

/// As cuModuleLoadData; JIT options are checked for presence and ignored.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    pmod: *mut CUmodule,
    image: *const c_void,
    num_options: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CUresult {
    api("cuModuleLoadDataEx", || {
        if num_options > 0 && (options.is_null() || values.is_null()) {
            bail!(CUDA_ERROR_INVALID_VALUE, "{num_options} options but NULL arrays");
        }
        non_null(image, "image")?;
        // SAFETY: PTX images are NUL-terminated (caller).
        load(pmod, unsafe { CStr::from_ptr(image.cast()) }.to_bytes())
    })
}

/// Loads a PTX file; missing file: CUDA_ERROR_FILE_NOT_FOUND.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(pmod: *mut CUmodule, fname: *const c_char) -> CUresult {
    api("cuModuleLoad", || {
        non_null(fname, "fname")?;
        // SAFETY: a NUL-terminated path (caller).
        let path = unsafe { CStr::from_ptr(fname) }.to_string_lossy().into_owned();
        let image = std::fs::read(&path).map_err(|e| err!(CUDA_ERROR_FILE_NOT_FOUND, "{path}: {e}"))?;
        load(pmod, &image)
    })
}

/// Unloads a module: its functions become invalid (launches already queued still run).
#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    api("cuModuleUnload", || {
        let mut st = lock();
        ctx::current(&st)?;
        module::lookup(&st, hmod as u64)?;
        module::unload(&mut st, hmod as u64);
        Ok(())
    })
}

/// A function of the module: the name must be an entry of it and a kernel the simulator
/// implements (docs/sim-gpu.md), else CUDA_ERROR_NOT_FOUND.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(pf: *mut CUfunction, hmod: CUmodule, name: *const c_char) -> CUresult {
    api("cuModuleGetFunction", || {
        non_null(pf, "hfunc")?;
        non_null(name, "name")?;
        // SAFETY: a NUL-terminated name (caller).
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        let mut st = lock();
        ctx::current(&st)?;
        let f = module::get_function(&mut st, hmod as u64, &name)?;
        // SAFETY: checked non-NULL.
        unsafe { out(pf, f as CUfunction, "hfunc") }
    })
}

/// Queues a kernel on the stream. Checked at the call: the function handle, grid and block
/// dimensions (> 0, at most 1024 threads per block), exactly one of `kernelParams` and
/// `extra`; argument values are copied now. Pointers are resolved when the kernel runs:
/// memory it may not access fails the context with CUDA_ERROR_ILLEGAL_ADDRESS.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    s: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    api("cuLaunchKernel", || {
        let mut st = lock();
        let sid = stream::resolve(&mut st, s as u64)?;
        let func = module::function(&st, f as u64)?;
        let (kernel, fctx) = (func.kernel.clone(), func.ctx);
        if fctx != st.streams[&sid].ctx {
            bail!(
                CUDA_ERROR_INVALID_HANDLE,
                "function {:#x} belongs to context {fctx:#x}, not the current one",
                f as u64
            );
        }
        let (grid, block) = ([gx, gy, gz], [bx, by, bz]);
        module::check_dims(grid, block, shared)?;
        // SAFETY: the parameter arrays are the caller's, as cuLaunchKernel documents them.
        let args = unsafe { module::copy_args(&kernel, params, extra)? };
        let cost_args = crate::costs::Args { bytes: &args.bytes, offsets: &args.offsets };
        crate::costs::on_launch(&kernel.0.name, &cost_args, grid);
        stream::enqueue(&mut st, sid, OpKind::Kernel(Launch { kernel, args, ctx: fctx, grid, block }), Vec::new());
        Ok(())
    })
}

/// Function attributes of a simple kernel (1024 threads per block, no static shared memory,
/// PTX 8.0, sm_90); values outside CUfunction_attribute are CUDA_ERROR_INVALID_VALUE.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(pi: *mut c_int, attrib: c_int, f: CUfunction) -> CUresult {
    api("cuFuncGetAttribute", || {
        module::function(&lock(), f as u64)?;
        let v = match attrib {
            0 => 1024,     // MAX_THREADS_PER_BLOCK
            1..=3 => 0,    // SHARED, CONST, LOCAL sizes
            4 => 32,       // NUM_REGS
            5 => 80,       // PTX_VERSION
            6 => 90,       // BINARY_VERSION
            7 => 0,        // CACHE_MODE_CA
            8 => 48 << 10, // MAX_DYNAMIC_SHARED_SIZE_BYTES
            9..=15 => 0,
            _ => bail!(CUDA_ERROR_INVALID_VALUE, "{attrib} is not a function attribute"),
        };
        // SAFETY: `out` checks NULL.
        unsafe { out(pi, v, "pi") }
    })
}

/// Accepted for valid attributes (the value is not used).
#[no_mangle]
pub unsafe extern "C" fn cuFuncSetAttribute(f: CUfunction, attrib: c_int, _value: c_int) -> CUresult {
    api("cuFuncSetAttribute", || {
        module::function(&lock(), f as u64)?;
        if !(0..16).contains(&attrib) {
            bail!(CUDA_ERROR_INVALID_VALUE, "{attrib} is not a function attribute");
        }
        Ok(())
    })
}

/// The function's entry name (valid while its module is loaded).
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) -> CUresult {
    api("cuFuncGetName", || {
        let st = lock();
        let p = module::function(&st, f as u64)?.name.as_ptr();
        // SAFETY: `out` checks NULL.
        unsafe { out(name, p, "name") }
    })
}

/// The module the function came from.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetModule(pmod: *mut CUmodule, f: CUfunction) -> CUresult {
    api("cuFuncGetModule", || {
        let m = module::function(&lock(), f as u64)?.module;
        // SAFETY: `out` checks NULL.
        unsafe { out(pmod, m as CUmodule, "hmod") }
    })
}
