//! Device reductions, compiled with NVRTC at first use and cached per
//! (context, data type, operation): `out[i] = op(ins[0][i], ..., ins[n-1][i])` over up
//! to [`MAX_INPUTS`] device pointers (peers' buffers mapped through CUDA IPC).
//!
//! Semantics follow the host kernels (`mem::reduce`): integers wrap, integer Avg
//! truncates toward zero after the wrapping sum, Max/Min on floats ignore a single
//! NaN (fmax/fmin). Narrow floats (half, bfloat16, fp8) are not compiled here; their
//! calls use host staging.

use crate::error::{Code, Error, Result};
use crate::mem::cuda;
use crate::types::{DataType, RedOp};
use cudarc::driver::sys as cu;
use cudarc::nvrtc::sys as nv;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Mutex, OnceLock};

/// Most inputs one launch takes (the pointers travel by value in the kernel's arguments).
pub const MAX_INPUTS: usize = 8;

const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcDestroyProgram",
];
const DRIVER_SYMBOLS: &[&str] = &["cuModuleLoadData", "cuModuleGetFunction", "cuLaunchKernel", "cuDeviceGetAttribute"];

/// True for the types this module compiles kernels for.
pub fn supported(dt: DataType) -> bool {
    c_type(dt).is_some()
}

/// (element type, unsigned type of its width for wrapping arithmetic, is float).
fn c_type(dt: DataType) -> Option<(&'static str, &'static str, bool)> {
    Some(match dt {
        DataType::Int8 => ("signed char", "unsigned char", false),
        DataType::Uint8 => ("unsigned char", "unsigned char", false),
        DataType::Int32 => ("int", "unsigned int", false),
        DataType::Uint32 => ("unsigned int", "unsigned int", false),
        DataType::Int64 => ("long long", "unsigned long long", false),
        DataType::Uint64 => ("unsigned long long", "unsigned long long", false),
        DataType::Float32 => ("float", "float", true),
        DataType::Float64 => ("double", "double", true),
        _ => return None,
    })
}

/// The kernel's entry name: `fccl_reduce_<type>_<op>` (the simulated GPU runs
/// kernels by this convention, docs/sim-gpu.md).
pub fn entry(dt: DataType, op: RedOp) -> String {
    format!("fccl_reduce_{}_{}", dt.kernel_token(), op.short_name())
}

/// CUDA C source of the kernel for one type and operation.
pub fn source(dt: DataType, op: RedOp) -> Option<String> {
    let (t, u, float) = c_type(dt)?;
    // acc is of type U (wrapping for integers); x the next input as T.
    let combine = match (op, float) {
        (RedOp::Sum | RedOp::Avg, _) => "acc = (U)(acc + (U)x);",
        (RedOp::Prod, _) => "acc = (U)(acc * (U)x);",
        (RedOp::Max, true) => "acc = fmax(acc, x);",
        (RedOp::Min, true) => "acc = fmin(acc, x);",
        (RedOp::Max, false) => "if (x > (T)acc) acc = (U)x;",
        (RedOp::Min, false) => "if (x < (T)acc) acc = (U)x;",
    };
    let finish = match (op, float) {
        (RedOp::Avg, true) => "(T)(acc / (T)n)",
        // Signed division truncates toward zero, as the host kernels do.
        (RedOp::Avg, false) => "(T)((T)acc / (T)n)",
        _ => "(T)acc",
    };
    let name = entry(dt, op);
    Some(format!(
        r#"typedef {t} T;
typedef {u} U;
struct Ins {{ const T* p[{MAX_INPUTS}]; }};
extern "C" __global__ void {name}(T* out, struct Ins ins, int n, unsigned long long count) {{
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {{
    U acc = (U)ins.p[0][i];
    for (int k = 1; k < n; k++) {{
      T x = ins.p[k][i];
      {combine}
    }}
    out[i] = {finish};
  }}
}}
"#
    ))
}

fn nvrtc_ready() -> Result<()> {
    static R: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let r = R.get_or_init(|| {
        cuda::driver().map_err(|e| e.msg)?;
        // SAFETY: only probes candidate names with dlopen.
        if !unsafe { nv::is_culib_present() } {
            return Err("NVRTC (libnvrtc.so) could not be loaded".into());
        }
        // SAFETY: present, so culib() does not panic; only addresses are looked up.
        let lib = unsafe { nv::culib() };
        for s in NVRTC_SYMBOLS {
            // SAFETY: as above.
            if unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err() {
                return Err(format!("NVRTC lacks {s}"));
            }
        }
        // SAFETY: the driver is present (checked by cuda::driver).
        let dl = unsafe { cu::culib() };
        for s in DRIVER_SYMBOLS {
            // SAFETY: as above.
            if unsafe { dl.get::<*const ()>(s.as_bytes()) }.is_err() {
                return Err(format!("the CUDA driver lacks {s}"));
            }
        }
        Ok(())
    });
    r.clone().map_err(|m| Error::unavailable(format!("device reduction kernels are unavailable: {m}")))
}

fn cu_check(rc: cu::CUresult, what: &str) -> Result<()> {
    if rc == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(Code::UnhandledCudaError, format!("{what} failed: {rc:?}")))
    }
}

fn nv_check(rc: nv::nvrtcResult, what: &str) -> Result<()> {
    if rc == nv::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(Code::UnhandledCudaError, format!("{what} failed: {rc:?}")))
    }
}

/// PTX for `src`, compiled for the current context's device.
fn compile(src: &str, device: i32) -> Result<Vec<u8>> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out-pointers; the driver is loaded.
    unsafe {
        cu_check(
            cu::cuDeviceGetAttribute(
                &mut major,
                cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                device,
            ),
            "cuDeviceGetAttribute",
        )?;
        cu_check(
            cu::cuDeviceGetAttribute(
                &mut minor,
                cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                device,
            ),
            "cuDeviceGetAttribute",
        )?;
    }
    let csrc = CString::new(src).map_err(|_| Error::internal("kernel source has a NUL"))?;
    let name = CString::new("fccl_reduce.cu").expect("no NUL");
    let arch = CString::new(format!("--gpu-architecture=compute_{major}{minor}")).expect("no NUL");
    let opts = [arch.as_ptr()];
    let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NVRTC is loaded (nvrtc_ready); strings are NUL-terminated and outlive the calls.
    unsafe {
        nv_check(
            nv::nvrtcCreateProgram(&mut prog, csrc.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null()),
            "nvrtcCreateProgram",
        )?;
        let rc = nv::nvrtcCompileProgram(prog, opts.len() as i32, opts.as_ptr());
        let out = if rc != nv::nvrtcResult::NVRTC_SUCCESS {
            let mut n = 0usize;
            let _ = nv::nvrtcGetProgramLogSize(prog, &mut n);
            let mut log = vec![0u8; n.max(1)];
            let _ = nv::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast());
            Err(Error::new(
                Code::UnhandledCudaError,
                format!("NVRTC could not compile the reduction kernel ({rc:?}): {}", String::from_utf8_lossy(&log)),
            ))
        } else {
            let mut n = 0usize;
            nv_check(nv::nvrtcGetPTXSize(prog, &mut n), "nvrtcGetPTXSize")?;
            let mut ptx = vec![0u8; n.max(1)];
            nv_check(nv::nvrtcGetPTX(prog, ptx.as_mut_ptr().cast()), "nvrtcGetPTX")?;
            Ok(ptx)
        };
        let _ = nv::nvrtcDestroyProgram(&mut prog);
        out
    }
}

/// Compiled kernels: (context, type, op) -> CUfunction (as an integer).
type KernelKey = (usize, DataType, RedOp);
static CACHE: Mutex<Option<HashMap<KernelKey, usize>>> = Mutex::new(None);

/// The kernel for (dt, op) in context `ctx` on `device`, compiled at first use.
pub fn kernel(ctx: usize, device: i32, dt: DataType, op: RedOp) -> Result<usize> {
    nvrtc_ready()?;
    if let Some(&f) = CACHE.lock().unwrap().get_or_insert_with(HashMap::new).get(&(ctx, dt, op)) {
        return Ok(f);
    }
    let src = source(dt, op).ok_or_else(|| Error::internal(format!("no device kernel for {dt}")))?;
    let _g = cuda::CtxGuard::enter(ctx)?;
    let ptx = compile(&src, device)?;
    let mut module: cu::CUmodule = std::ptr::null_mut();
    let mut f: cu::CUfunction = std::ptr::null_mut();
    let fname = CString::new(entry(dt, op)).expect("no NUL");
    // SAFETY: ptx is NUL-terminated PTX; the module stays loaded for the process's life.
    unsafe {
        cu_check(cu::cuModuleLoadData(&mut module, ptx.as_ptr() as *const c_void), "cuModuleLoadData")?;
        cu_check(cu::cuModuleGetFunction(&mut f, module, fname.as_ptr()), "cuModuleGetFunction")?;
    }
    CACHE.lock().unwrap().get_or_insert_with(HashMap::new).insert((ctx, dt, op), f as usize);
    Ok(f as usize)
}

/// Launches `f` (from [`kernel`]) on `stream`: `out[0..count] = op over ins[..]`.
///
/// # Safety
/// `out` and every input are device-accessible in the current context for `count`
/// elements of the kernel's type until the stream has run the launch.
pub unsafe fn launch(f: usize, out: *mut u8, ins: &[*const u8], count: usize, stream: usize) -> Result<()> {
    if ins.is_empty() || ins.len() > MAX_INPUTS {
        return Err(Error::internal(format!("{} inputs for a device reduction", ins.len())));
    }
    if count == 0 {
        return Ok(());
    }
    let mut out_arg = out as u64;
    let mut ins_arg = [0u64; MAX_INPUTS];
    for (a, p) in ins_arg.iter_mut().zip(ins) {
        *a = *p as u64;
    }
    let mut n_arg = ins.len() as i32;
    let mut count_arg = count as u64;
    let mut params: [*mut c_void; 4] = [
        (&mut out_arg as *mut u64).cast(),
        (&mut ins_arg as *mut [u64; MAX_INPUTS]).cast(),
        (&mut n_arg as *mut i32).cast(),
        (&mut count_arg as *mut u64).cast(),
    ];
    let block = 256u32;
    let grid = count.div_ceil(block as usize).clamp(1, 1024) as u32;
    // SAFETY: f is a loaded kernel whose parameters match `params` (pointer, struct of
    // MAX_INPUTS pointers, int, unsigned long long); buffers per the caller.
    let rc = unsafe {
        cu::cuLaunchKernel(
            f as cu::CUfunction,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            stream as cu::CUstream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    cu_check(rc, "cuLaunchKernel")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_sources_cover_native_types_only() {
        let s = source(DataType::Int32, RedOp::Avg).unwrap();
        assert!(s.contains("typedef int T;") && s.contains("typedef unsigned int U;"), "{s}");
        assert!(s.contains("(T)((T)acc / (T)n)"), "{s}");
        let s = source(DataType::Float32, RedOp::Max).unwrap();
        assert!(s.contains("fmax(acc, x)"), "{s}");
        assert!(s.contains("__global__ void fccl_reduce_f32_max("), "{s}");
        assert!(source(DataType::Float16, RedOp::Sum).is_none());
        assert!(source(DataType::Bfloat16, RedOp::Sum).is_none());
        assert!(supported(DataType::Uint64) && !supported(DataType::Float8e4m3));
    }
}
