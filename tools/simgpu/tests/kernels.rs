//! The simulated NVRTC (CUDA C compiled with the host's compiler), modules, launches over
//! every block and thread, and faults of kernels (sticky, as on a GPU).

mod common;
use common::*;
use cudarc::driver::sys::{CUfunction, CUmodule};
use cudarc::nvrtc::sys::nvrtcResult as N;
use std::ffi::{c_char, c_void, CStr, CString};

/// Compiles `src` with the simulated NVRTC: the PTX, or the result and log.
pub fn compile(src: &str, opts: &[&str]) -> Result<Vec<u8>, (N, String)> {
    let csrc = CString::new(src).unwrap();
    let copts: Vec<CString> = opts.iter().map(|o| CString::new(*o).unwrap()).collect();
    let ptrs: Vec<*const c_char> = copts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: NUL-terminated strings that outlive the calls; buffers of the reported sizes.
    unsafe {
        let mut prog = std::ptr::null_mut();
        assert_eq!(
            nvrtcCreateProgram(&mut prog, csrc.as_ptr(), c"k.cu".as_ptr(), 0, std::ptr::null(), std::ptr::null()),
            N::NVRTC_SUCCESS
        );
        let r = nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr());
        let mut n = 0;
        assert_eq!(nvrtcGetProgramLogSize(prog, &mut n), N::NVRTC_SUCCESS);
        let mut log = vec![0u8; n];
        assert_eq!(nvrtcGetProgramLog(prog, log.as_mut_ptr().cast()), N::NVRTC_SUCCESS);
        let log = String::from_utf8_lossy(&log[..n - 1]).into_owned();
        let out = if r == N::NVRTC_SUCCESS {
            assert_eq!(nvrtcGetPTXSize(prog, &mut n), N::NVRTC_SUCCESS);
            let mut ptx = vec![0u8; n];
            assert_eq!(nvrtcGetPTX(prog, ptx.as_mut_ptr().cast()), N::NVRTC_SUCCESS);
            assert_eq!(ptx[n - 1], 0);
            Ok(ptx)
        } else {
            Err((r, log))
        };
        assert_eq!(nvrtcDestroyProgram(&mut prog), N::NVRTC_SUCCESS);
        assert!(prog.is_null());
        out
    }
}

fn load(ptx: &[u8]) -> CUmodule {
    let mut m = std::ptr::null_mut();
    // SAFETY: NUL-terminated PTX.
    ok(unsafe { cuModuleLoadData(&mut m, ptx.as_ptr().cast()) });
    m
}

fn function(m: CUmodule, name: &str) -> CUfunction {
    let mut f = std::ptr::null_mut();
    let c = CString::new(name).unwrap();
    // SAFETY: a NUL-terminated name.
    ok(unsafe { cuModuleGetFunction(&mut f, m, c.as_ptr()) });
    f
}

/// Launches `f` with one pointer per parameter value.
fn launch(f: CUfunction, grid: [u32; 3], block: [u32; 3], s: CUstream, params: &mut [*mut c_void]) -> CUresult {
    // SAFETY: the parameters match the kernel's (callers).
    unsafe {
        cuLaunchKernel(
            f,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            0,
            s,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
}

fn arg<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast()
}

const SRC: &str = r#"
// a * x + y over n elements, one thread each (some threads of the last block idle).
extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned int n) {
  unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
// Every thread writes its block and thread number where the grid puts it.
extern "C" __global__ void ids(unsigned int* out) {
  unsigned int t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  unsigned int b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 1000u + t;
}
struct Pair { const unsigned int* p; unsigned long long i; };
// out[0] = p[i], through a pointer inside a struct.
extern "C" __global__ void read_at(struct Pair a, unsigned int* out) { out[0] = a.p[a.i]; }
"#;

#[test]
fn compiled_kernels_run_every_thread_of_the_grid() {
    let _c = Ctx::new(0);
    let ptx = compile(SRC, &["--gpu-architecture=compute_90"]).unwrap();
    let text = CStr::from_bytes_until_nul(&ptx).unwrap().to_str().unwrap();
    assert!(text.contains("simulated NVRTC") && text.contains(".target sm_90"), "{text}");
    assert!(text.contains("// ferroccl-simgpu-object: ") && text.contains(".visible .entry saxpy("), "{text}");
    assert!(
        text.contains("saxpy_param_0") && text.contains("saxpy_param_3") && !text.contains("saxpy_param_4"),
        "{text}"
    );
    assert!(text.contains(".param .align 8 .b8 read_at_param_0[16]"), "{text}");
    let m = load(&ptx);
    let saxpy = function(m, "saxpy");
    let n = 1000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 7.0).collect();
    let y: Vec<f32> = (0..n).map(|i| 1.0 / (i as f32 + 1.0)).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_ne_bytes()).collect::<Vec<u8>>();
    let (dx, dy) = (alloc(4 * n), alloc(4 * n));
    htod(dx, &bytes(&x));
    htod(dy, &bytes(&y));
    let (mut a, mut px, mut py, mut cnt) = (3.5f32, dx, dy, n as u32);
    ok(launch(
        saxpy,
        [4, 1, 1],
        [256, 1, 1],
        std::ptr::null_mut(),
        &mut [arg(&mut a), arg(&mut px), arg(&mut py), arg(&mut cnt)],
    ));
    let want: Vec<f32> = x.iter().zip(&y).map(|(x, y)| 3.5 * x + y).collect();
    assert_eq!(dtoh(dy, 4 * n), bytes(&want));

    // Every block and thread of a 3-D grid runs once, with its own indices.
    let ids = function(m, "ids");
    let (grid, block) = ([2u32, 3, 1], [4u32, 2, 2]);
    let total = 6 * 16;
    let out = alloc(4 * total);
    let mut po = out;
    ok(launch(ids, grid, block, std::ptr::null_mut(), &mut [arg(&mut po)]));
    let got: Vec<u32> = dtoh(out, 4 * total).chunks(4).map(|c| u32::from_ne_bytes(c.try_into().unwrap())).collect();
    let want: Vec<u32> = (0..total as u32).map(|k| (k / 16) * 1000 + k % 16).collect();
    assert_eq!(got, want);

    // The `extra` form: one packed buffer at the kernel's layout (float, 2 pointers, u32).
    htod(dy, &bytes(&y));
    let mut buf = [0u8; 28];
    buf[0..4].copy_from_slice(&2.0f32.to_ne_bytes());
    buf[8..16].copy_from_slice(&dx.to_ne_bytes());
    buf[16..24].copy_from_slice(&dy.to_ne_bytes());
    buf[24..28].copy_from_slice(&(n as u32).to_ne_bytes());
    let mut size = 28usize;
    // CU_LAUNCH_PARAM_BUFFER_POINTER (1), CU_LAUNCH_PARAM_BUFFER_SIZE (2), CU_LAUNCH_PARAM_END.
    let key = |k: usize| std::ptr::null_mut::<u8>().wrapping_add(k).cast::<c_void>();
    let mut extra: [*mut c_void; 5] =
        [key(1), buf.as_mut_ptr().cast(), key(2), (&mut size as *mut usize).cast(), std::ptr::null_mut()];
    // SAFETY: the launch arrays match the documented forms; the rest are invalid on purpose.
    unsafe {
        ok(cuLaunchKernel(
            saxpy,
            8,
            1,
            1,
            128,
            1,
            1,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            extra.as_mut_ptr(),
        ));
        let want: Vec<f32> = x.iter().zip(&y).map(|(x, y)| 2.0 * x + y).collect();
        assert_eq!(dtoh(dy, 4 * n), bytes(&want));
        let bad = CUresult::CUDA_ERROR_INVALID_VALUE;
        *extra[3].cast::<usize>() = 24;
        assert_eq!(
            cuLaunchKernel(saxpy, 1, 1, 1, 32, 1, 1, 0, std::ptr::null_mut(), std::ptr::null_mut(), extra.as_mut_ptr()),
            bad,
            "the packed size must be the kernel's"
        );
        let mut p = [std::ptr::null_mut::<c_void>(); 4];
        for (g, b) in [(1, 1025), (0, 32)] {
            assert_eq!(
                cuLaunchKernel(saxpy, g, 1, 1, b, 1, 1, 0, std::ptr::null_mut(), p.as_mut_ptr(), std::ptr::null_mut()),
                bad
            );
        }
        assert_eq!(
            cuLaunchKernel(saxpy, 1, 1, 1, 32, 1, 1, 0, std::ptr::null_mut(), p.as_mut_ptr(), extra.as_mut_ptr()),
            bad
        );
        assert_eq!(
            cuLaunchKernel(saxpy, 1, 1, 1, 32, 1, 1, 0, std::ptr::null_mut(), p.as_mut_ptr(), std::ptr::null_mut()),
            bad,
            "NULL parameter pointers"
        );
        let mut fa = 0;
        ok(cuFuncGetAttribute(&mut fa, 0, saxpy));
        assert_eq!(fa, 1024);
        let mut g = std::ptr::null_mut();
        assert_eq!(cuModuleGetFunction(&mut g, m, c"daxpy".as_ptr()), CUresult::CUDA_ERROR_NOT_FOUND);
        ok(cuModuleUnload(m));
        assert_eq!(
            launch(
                saxpy,
                [1, 1, 1],
                [1, 1, 1],
                std::ptr::null_mut(),
                &mut [arg(&mut a), arg(&mut px), arg(&mut py), arg(&mut cnt)]
            ),
            CUresult::CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(cuModuleGetFunction(&mut g, m, c"saxpy".as_ptr()), CUresult::CUDA_ERROR_INVALID_HANDLE);
        let mut junk = std::ptr::null_mut();
        assert_eq!(cuModuleLoadData(&mut junk, c"not ptx".as_ptr().cast()), CUresult::CUDA_ERROR_INVALID_IMAGE);
        let foreign = c".version 8.0\n.target sm_90\n.visible .entry saxpy(\n)\n{\n}\n";
        assert_eq!(
            cuModuleLoadData(&mut junk, foreign.as_ptr().cast()),
            CUresult::CUDA_ERROR_INVALID_IMAGE,
            "PTX the simulated NVRTC did not make cannot run"
        );
        for d in [dx, dy, out] {
            ok(cuMemFree_v2(d));
        }
    }
}

/// A launch passes at most 32764 bytes of parameters, as the real driver (CUDA 12.1 and
/// later on Hopper): a kernel that takes more is refused, one that takes exactly that runs.
#[test]
fn launches_pass_at_most_the_real_drivers_parameter_bytes() {
    let _c = Ctx::new(0);
    let src = r#"
struct Most { unsigned int v[8189]; };
struct Over { unsigned int v[8190]; };
extern "C" __global__ void most(unsigned int* out, struct Most t) { out[0] = t.v[8188]; }
extern "C" __global__ void over(unsigned int* out, struct Over t) { out[0] = t.v[8189]; }
"#;
    let m = load(&compile(src, &[]).unwrap());
    let out = alloc(4);
    htod(out, &[0; 4]);
    let mut p = out;
    let mut t = vec![0u32; 8190];
    t[8188] = 0xfeed;
    // 8 + 8190 * 4 = 32768 bytes: refused, nothing runs.
    let r = launch(function(m, "over"), [1, 1, 1], [1, 1, 1], std::ptr::null_mut(), &mut [arg(&mut p), arg(&mut t[0])]);
    assert_eq!(r, CUresult::CUDA_ERROR_INVALID_VALUE, "a launch of 32768 bytes of parameters");
    // 8 + 8189 * 4 = 32764 bytes: the most a launch passes.
    ok(launch(function(m, "most"), [1, 1, 1], [1, 1, 1], std::ptr::null_mut(), &mut [arg(&mut p), arg(&mut t[0])]));
    // SAFETY: no arguments.
    ok(unsafe { cuCtxSynchronize() });
    assert_eq!(dtoh(out, 4), 0xfeedu32.to_le_bytes(), "the last word of 32764 bytes of parameters");
}

#[test]
fn nvrtc_compiles_the_source_and_reports_its_errors() {
    let (r, log) = compile("extern \"C\" __global__ void k(float* x) {\n  x[0] = y;\n}\n", &[]).unwrap_err();
    assert_eq!(r, N::NVRTC_ERROR_COMPILATION);
    assert!(log.contains("k.cu:2") && log.contains("'y'"), "the compiler's message at the program's line: {log}");
    let (r, log) = compile("__global__ void k(float* x) {}", &[]).unwrap_err();
    assert_eq!(r, N::NVRTC_ERROR_COMPILATION, "not extern \"C\": the name would be mangled");
    assert!(log.contains("extern \"C\"") && log.contains("docs/sim-gpu.md"), "{log}");
    let (r, log) =
        compile("extern \"C\" __global__ void k(float* x) { x[threadIdx.x] = 1; __syncthreads(); }", &[]).unwrap_err();
    assert_eq!(r, N::NVRTC_ERROR_COMPILATION);
    assert!(log.contains("__syncthreads is not supported"), "{log}");
    let (r, _) = compile(SRC, &["-arch"]).unwrap_err();
    assert_eq!(r, N::NVRTC_ERROR_INVALID_OPTION);
    assert!(compile(SRC, &["-arch=sm_120", "-std=c++17", "--fmad=false"]).is_ok());
    // SAFETY: valid out-pointers.
    unsafe {
        let (mut major, mut minor) = (0, 0);
        assert_eq!(nvrtcVersion(&mut major, &mut minor), N::NVRTC_SUCCESS);
        assert_eq!((major, minor), (13, 0));
        let s = CStr::from_ptr(nvrtcGetErrorString(N::NVRTC_ERROR_COMPILATION as i32));
        assert_eq!(s.to_str().unwrap(), "NVRTC_ERROR_COMPILATION");
        let mut n = 0;
        assert_eq!(nvrtcGetNumSupportedArchs(&mut n), N::NVRTC_SUCCESS);
        let mut archs = vec![0; n as usize];
        assert_eq!(nvrtcGetSupportedArchs(archs.as_mut_ptr()), N::NVRTC_SUCCESS);
        assert!(archs.contains(&90));
        assert_eq!(nvrtcGetPTXSize(0x1234 as *mut c_void, &mut 0), N::NVRTC_ERROR_INVALID_PROGRAM);
    }
}

#[test]
fn work_queued_before_a_stream_ordered_free_still_runs() {
    let _c = Ctx::new(0);
    let f = function(load(&compile(SRC, &[]).unwrap()), "read_at");
    let s = stream(0);
    let (a, out) = (alloc(64), alloc(4));
    htod(a, &(0..16u32).flat_map(|v| (v * 3).to_ne_bytes()).collect::<Vec<u8>>());
    let mut pair = [a, 5u64];
    let mut po = out;
    // SAFETY: allocations and a stream of the test.
    unsafe {
        ok(launch(f, [1, 1, 1], [1, 1, 1], s, &mut [arg(&mut pair), arg(&mut po)]));
        ok(cuMemFreeAsync(a, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(dtoh(out, 4), 15u32.to_ne_bytes());
        // Queued after the free: pointers are only resolved when the kernel runs.
        assert_eq!(launch(f, [1, 1, 1], [1, 1, 1], s, &mut [arg(&mut pair), arg(&mut po)]), OK);
        assert_eq!(cuStreamSynchronize(s), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    }
}

static HOST: [u32; 8] = [7; 8];

#[test]
fn a_kernel_touching_memory_it_may_not_fails_the_context_for_good() {
    let t = "a_kernel_touching_memory_it_may_not_fails_the_context_for_good";
    if !is_child(t) {
        let out = run_child(t, &[]);
        assert_child_ok(&out);
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| l.contains("failed with CUDA_ERROR_ILLEGAL_ADDRESS")).collect();
        assert_eq!(lines.len(), 5, "one line per failed context:\n{err}");
        for (l, why) in lines.iter().zip([
            "not inside any allocation",
            "neither pinned nor registered",
            "freed",
            "no memory there",
            "no peer access",
        ]) {
            assert!(l.contains("kernel read_at") && l.contains(why), "{why:?} missing from {l}");
        }
        return;
    }
    let ptx = compile(SRC, &[]).unwrap();
    // (device of the kernel's context, struct Pair built from an allocation of 16 u32 of device 0)
    type Case = dyn Fn(CUdeviceptr) -> (i32, [u64; 2]);
    let cases: [&Case; 5] = [
        // One element past the end: the page after an allocation is never mapped.
        &|a| (0, [a, 16]),
        // A pageable host array as the output parameter (below).
        &|a| (0, [a, 0]),
        // Freed memory.
        &|a| {
            // SAFETY: an allocation of the test, freed before the launch.
            ok(unsafe { cuMemFree_v2(a) });
            (0, [a, 0])
        },
        // NULL.
        &|_| (0, [0, 0]),
        // Memory of device 0 from a context of device 1 without peer access.
        &|a| (1, [a, 0]),
    ];
    for (i, case) in cases.into_iter().enumerate() {
        let dev0 = Ctx::new(0);
        let a = alloc(64);
        htod(a, &[1; 64]);
        let (dev, mut pair) = case(a);
        // The kernel's context: device 0's, or a new one of `dev` (current from now on).
        let other = (dev != 0).then(|| Ctx::new(dev));
        let m = load(&ptx);
        let f = function(m, "read_at");
        let out = alloc(4);
        let mut po = if i == 1 { HOST.as_ptr() as u64 } else { out };
        let ill = CUresult::CUDA_ERROR_ILLEGAL_ADDRESS;
        ok(launch(f, [1, 1, 1], [1, 1, 1], std::ptr::null_mut(), &mut [arg(&mut pair), arg(&mut po)]));
        let failed = other.as_ref().unwrap_or(&dev0).0;
        // SAFETY: calls on the failed context; valid pointers.
        unsafe {
            assert_eq!(cuCtxSynchronize(), ill, "case {i}");
            let mut d = 0;
            assert_eq!(cuMemAlloc_v2(&mut d, 16), ill);
            assert_eq!(cuStreamSynchronize(std::ptr::null_mut()), ill);
            assert_eq!(launch(f, [1, 1, 1], [1, 1, 1], std::ptr::null_mut(), &mut [arg(&mut pair), arg(&mut po)]), ill);
            assert_eq!(cuMemsetD8_v2(out, 0, 1), ill);
            ok(cuCtxDestroy_v2(failed));
        }
        match other {
            Some(o) => std::mem::forget(o),
            None => std::mem::forget(dev0),
        }
    }
    assert_eq!(HOST, [7; 8], "the pageable array was not written");
    // Other contexts are unaffected, and device memory is still out of the host's reach
    // after kernels mapped it for themselves.
    let _c = Ctx::new(0);
    let d = alloc(16);
    htod(d, &[1; 16]);
    assert_eq!(dtoh(d, 16), vec![1; 16]);
}

fn maps_lines() -> usize {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().count()
}

#[test]
fn launches_leave_no_mappings_behind() {
    if !is_child("launches_leave_no_mappings_behind") {
        assert_child_ok(&run_child("launches_leave_no_mappings_behind", &[]));
        return;
    }
    let _c = Ctx::new(0);
    let f = function(load(&compile(SRC, &[]).unwrap()), "read_at");
    let out = alloc(4);
    let mut po = out;
    let run = |bufs: &[CUdeviceptr], po: &mut u64| {
        for &a in bufs {
            let mut pair = [a, 3u64];
            ok(launch(f, [1, 1, 1], [1, 1, 1], std::ptr::null_mut(), &mut [arg(&mut pair), arg(po)]));
        }
        // SAFETY: no arguments.
        ok(unsafe { cuCtxSynchronize() });
    };
    let warm: Vec<CUdeviceptr> = (0..4).map(|_| alloc(4096)).collect();
    run(&warm, &mut po);
    let before = maps_lines();
    for round in 0..50 {
        let bufs: Vec<CUdeviceptr> = (0..4).map(|k| alloc(100 + 1000 * k + round)).collect();
        run(&bufs, &mut po);
        for b in bufs {
            // SAFETY: allocations of the test.
            ok(unsafe { cuMemFree_v2(b) });
        }
    }
    let after = maps_lines();
    eprintln!("maps before {before} after {after}");
    assert!(after <= before + 4, "200 launches on fresh allocations left {} more mappings", after - before);
}

#[test]
fn after_kernels_ran_the_host_still_faults_on_device_memory() {
    let t = "after_kernels_ran_the_host_still_faults_on_device_memory";
    if !is_child(t) {
        let out = run_child(t, &[]);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("kernel ran"), "{out:?}");
        return;
    }
    let _c = Ctx::new(0);
    let f = function(load(&compile(SRC, &[]).unwrap()), "read_at");
    let (a, out) = (alloc(64), alloc(4));
    let (mut pair, mut po) = ([a, 1u64], out);
    ok(launch(f, [1, 1, 1], [1, 1, 1], std::ptr::null_mut(), &mut [arg(&mut pair), arg(&mut po)]));
    // SAFETY: no arguments.
    ok(unsafe { cuCtxSynchronize() });
    eprintln!("kernel ran");
    // SAFETY: not sound on purpose: the read must fault (this child process dies of it).
    let v = unsafe { std::ptr::read_volatile(a as *const u32) };
    eprintln!("read {v} through a device pointer");
}
