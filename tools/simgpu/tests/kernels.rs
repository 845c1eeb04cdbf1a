//! The simulated NVRTC, modules, launches and the fccl_reduce kernels (checked against the
//! library's own host reduction), and sticky faults.

mod common;
use common::*;
use cudarc::driver::sys::CUfunction;
use cudarc::nvrtc::sys::nvrtcResult as N;
use ferroccl_simgpu::reduce::reduce_all;
use ferroccl_simgpu::types::{DataType, RedOp};
use std::ffi::{c_char, c_void, CStr, CString};

const TYPES: [(&str, DataType); 12] = [
    ("i8", DataType::Int8),
    ("u8", DataType::Uint8),
    ("i32", DataType::Int32),
    ("u32", DataType::Uint32),
    ("i64", DataType::Int64),
    ("u64", DataType::Uint64),
    ("f16", DataType::Float16),
    ("bf16", DataType::Bfloat16),
    ("f32", DataType::Float32),
    ("f64", DataType::Float64),
    ("f8e4m3", DataType::Float8e4m3),
    ("f8e5m2", DataType::Float8e5m2),
];
const OPS: [(&str, RedOp); 5] =
    [("sum", RedOp::Sum), ("prod", RedOp::Prod), ("max", RedOp::Max), ("min", RedOp::Min), ("avg", RedOp::Avg)];

fn source(names: &[String]) -> String {
    let mut s = String::from("struct Ins { const void* p[8]; };\n");
    for n in names {
        s.push_str(&format!(
            "extern \"C\" __global__ void {n}(void* out, struct Ins ins, int n, unsigned long long count) {{ }}\n"
        ));
    }
    s
}

/// Compiles `src` with the simulated NVRTC: the PTX, or the result and log.
fn compile(src: &str, opts: &[&str]) -> Result<Vec<u8>, (N, String)> {
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

fn load(ptx: &[u8]) -> cudarc::driver::sys::CUmodule {
    let mut m = std::ptr::null_mut();
    // SAFETY: NUL-terminated PTX.
    ok(unsafe { cuModuleLoadData(&mut m, ptx.as_ptr().cast()) });
    m
}

fn function(m: cudarc::driver::sys::CUmodule, name: &str) -> CUfunction {
    let mut f = std::ptr::null_mut();
    let c = CString::new(name).unwrap();
    // SAFETY: a NUL-terminated name.
    ok(unsafe { cuModuleGetFunction(&mut f, m, c.as_ptr()) });
    f
}

/// Launches a reduce kernel through kernelParams: out = op(ins...) over `count` elements.
fn launch(f: CUfunction, out: CUdeviceptr, ins: &[CUdeviceptr], count: u64, s: CUstream) -> CUresult {
    let mut out = out;
    let mut arr = [0u64; 8];
    arr[..ins.len()].copy_from_slice(ins);
    let mut n = ins.len() as i32;
    let mut count = count;
    let mut params: [*mut c_void; 4] = [
        (&mut out as *mut u64).cast(),
        (&mut arr as *mut [u64; 8]).cast(),
        (&mut n as *mut i32).cast(),
        (&mut count as *mut u64).cast(),
    ];
    // SAFETY: the parameters match the kernel's layout.
    unsafe { cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, s, params.as_mut_ptr(), std::ptr::null_mut()) }
}

#[test]
fn compile_load_and_launch_f32_sum() {
    let _c = Ctx::new(0);
    let ptx = compile(&source(&["fccl_reduce_f32_sum".into()]), &["--gpu-architecture=compute_90"]).unwrap();
    let text = CStr::from_bytes_until_nul(&ptx).unwrap().to_str().unwrap();
    assert!(
        text.contains("simulated NVRTC") && text.contains(".version 8.0") && text.contains(".target sm_90"),
        "{text}"
    );
    assert!(text.contains(".address_size 64") && text.contains(".visible .entry fccl_reduce_f32_sum("), "{text}");
    let m = load(&ptx);
    let f = function(m, "fccl_reduce_f32_sum");
    let ins: Vec<CUdeviceptr> = (1..=3).map(|_| alloc(16)).collect();
    for (i, &d) in ins.iter().enumerate() {
        let v: Vec<u8> = [i as f32 + 1.0; 4].iter().flat_map(|x| x.to_ne_bytes()).collect();
        htod(d, &v);
    }
    let out = alloc(16);
    ok(launch(f, out, &ins, 4, std::ptr::null_mut()));
    let r: Vec<f32> = dtoh(out, 16).chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect();
    assert_eq!(r, vec![6.0; 4]);
    // The `extra` form: one packed buffer at the kernel's layout.
    let mut buf = [0u8; 88];
    buf[0..8].copy_from_slice(&out.to_ne_bytes());
    buf[8..16].copy_from_slice(&ins[0].to_ne_bytes());
    buf[16..24].copy_from_slice(&ins[0].to_ne_bytes());
    buf[72..76].copy_from_slice(&2i32.to_ne_bytes());
    buf[80..88].copy_from_slice(&4u64.to_ne_bytes());
    let mut size = 88usize;
    // CU_LAUNCH_PARAM_BUFFER_POINTER (1), CU_LAUNCH_PARAM_BUFFER_SIZE (2), CU_LAUNCH_PARAM_END.
    let key = |k: usize| std::ptr::null_mut::<u8>().wrapping_add(k).cast::<c_void>();
    let mut extra: [*mut c_void; 5] =
        [key(1), buf.as_mut_ptr().cast(), key(2), (&mut size as *mut usize).cast(), std::ptr::null_mut()];
    // SAFETY: the launch arrays match the documented forms; the rest are invalid on purpose.
    unsafe {
        ok(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, std::ptr::null_mut(), std::ptr::null_mut(), extra.as_mut_ptr()));
        let r: Vec<f32> = dtoh(out, 16).chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect();
        assert_eq!(r, vec![2.0; 4]);
        let bad = CUresult::CUDA_ERROR_INVALID_VALUE;
        let mut p = [std::ptr::null_mut::<c_void>(); 4];
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 1025, 1, 1, 0, std::ptr::null_mut(), p.as_mut_ptr(), std::ptr::null_mut()),
            bad
        );
        assert_eq!(
            cuLaunchKernel(f, 0, 1, 1, 32, 1, 1, 0, std::ptr::null_mut(), p.as_mut_ptr(), std::ptr::null_mut()),
            bad
        );
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, std::ptr::null_mut(), p.as_mut_ptr(), extra.as_mut_ptr()),
            bad
        );
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, std::ptr::null_mut(), p.as_mut_ptr(), std::ptr::null_mut()),
            bad
        );
        let mut fa = 0;
        ok(cuFuncGetAttribute(&mut fa, 0, f));
        assert_eq!(fa, 1024);
        let mut g = std::ptr::null_mut();
        assert_eq!(cuModuleGetFunction(&mut g, m, c"fccl_reduce_f32_max".as_ptr()), CUresult::CUDA_ERROR_NOT_FOUND);
        ok(cuModuleUnload(m));
        assert_eq!(launch(f, out, &ins, 4, std::ptr::null_mut()), CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(
            cuModuleGetFunction(&mut g, m, c"fccl_reduce_f32_sum".as_ptr()),
            CUresult::CUDA_ERROR_INVALID_HANDLE
        );
        let mut junk = std::ptr::null_mut();
        assert_eq!(cuModuleLoadData(&mut junk, c"not ptx".as_ptr().cast()), CUresult::CUDA_ERROR_INVALID_IMAGE);
        for d in ins.into_iter().chain([out]) {
            ok(cuMemFree_v2(d));
        }
    }
}

#[test]
fn nvrtc_refuses_kernels_the_simulator_does_not_implement() {
    let (r, log) = compile("extern \"C\" __global__ void my_kernel(float* x) { x[0] = 1; }", &[]).unwrap_err();
    assert_eq!(r, N::NVRTC_ERROR_COMPILATION);
    assert!(log.contains("my_kernel") && log.contains("docs/sim-gpu.md"), "{log}");
    let (r, _) = compile("__global__ void fccl_reduce_f32_sum(float* x) {}", &[]).unwrap_err();
    assert_eq!(r, N::NVRTC_ERROR_COMPILATION, "not extern \"C\": the name would be mangled");
    let (r, _) = compile(&source(&["fccl_reduce_f32_sum".into()]), &["-arch"]).unwrap_err();
    assert_eq!(r, N::NVRTC_ERROR_INVALID_OPTION);
    assert!(compile(&source(&["fccl_reduce_f32_sum".into()]), &["-arch=sm_120", "-std=c++17"]).is_ok());
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

/// Deterministic bytes (xorshift).
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn every_type_and_operation_matches_the_host_reduction() {
    let _c = Ctx::new(1);
    let names: Vec<String> =
        TYPES.iter().flat_map(|(t, _)| OPS.iter().map(move |(o, _)| format!("fccl_reduce_{t}_{o}"))).collect();
    let m = load(&compile(&source(&names), &[]).unwrap());
    let count = 1000usize;
    let s = stream(0);
    for (ti, (t, dt)) in TYPES.iter().enumerate() {
        let bytes_n = count * dt.size();
        let inputs: Vec<Vec<u8>> = (0..3).map(|k| bytes((ti * 10 + k) as u64, bytes_n)).collect();
        let devs: Vec<CUdeviceptr> = inputs
            .iter()
            .map(|v| {
                let d = alloc(bytes_n);
                htod(d, v);
                d
            })
            .collect();
        let out = alloc(bytes_n);
        for (o, op) in OPS {
            let f = function(m, &format!("fccl_reduce_{t}_{o}"));
            let mut want = vec![0u8; bytes_n];
            let mut acc = vec![0u8; count * dt.acc_size()];
            reduce_all(*dt, op, 3, |i| &inputs[i], &mut want, &mut acc);
            ok(launch(f, out, &devs, count as u64, s));
            // SAFETY: a stream of the test.
            ok(unsafe { cuStreamSynchronize(s) });
            assert_eq!(dtoh(out, bytes_n), want, "{t} {o}");
            // One input: a copy.
            ok(launch(f, out, &devs[1..2], count as u64, s));
            assert_eq!(dtoh(out, bytes_n), inputs[1], "{t} {o} n=1");
        }
        // In place: the output is the first input.
        let f = function(m, &format!("fccl_reduce_{t}_sum"));
        let mut want = vec![0u8; bytes_n];
        let mut acc = vec![0u8; count * dt.acc_size()];
        reduce_all(*dt, RedOp::Sum, 2, |i| &inputs[i], &mut want, &mut acc);
        ok(launch(f, devs[0], &devs[..2], count as u64, s));
        assert_eq!(dtoh(devs[0], bytes_n), want, "{t} in place");
        for d in devs.into_iter().chain([out]) {
            // SAFETY: allocations of the test.
            ok(unsafe { cuMemFree_v2(d) });
        }
    }
}

/// Runs one reduce kernel on little-endian element bytes and returns the output bytes.
fn run_one(name: &str, elem: usize, ins: &[Vec<u8>]) -> Vec<u8> {
    let m = load(&compile(&source(&[name.into()]), &[]).unwrap());
    let f = function(m, name);
    let n = ins[0].len();
    let devs: Vec<CUdeviceptr> = ins
        .iter()
        .map(|v| {
            let d = alloc(n);
            htod(d, v);
            d
        })
        .collect();
    let out = alloc(n);
    ok(launch(f, out, &devs, (n / elem) as u64, std::ptr::null_mut()));
    dtoh(out, n)
}

#[test]
fn hand_computed_values() {
    let _c = Ctx::new(0);
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    assert_eq!(run_one("fccl_reduce_f32_sum", 4, &[f32s(&[1.0]), f32s(&[2.0]), f32s(&[3.0])]), f32s(&[6.0]));
    // int8 sum wraps: 100 + 100 = 200 = -56.
    assert_eq!(run_one("fccl_reduce_i8_sum", 1, &[vec![100], vec![100]]), vec![(-56i8) as u8]);
    // int32 avg truncates toward zero: (-7 + 0) / 2 = -3.
    let i32s = |v: i32| v.to_le_bytes().to_vec();
    assert_eq!(run_one("fccl_reduce_i32_avg", 4, &[i32s(-7), i32s(0)]), i32s(-3));
    assert_eq!(run_one("fccl_reduce_u8_max", 1, &[vec![3, 250], vec![200, 7]]), vec![200, 250]);
    let f64s = |v: f64| v.to_le_bytes().to_vec();
    assert_eq!(run_one("fccl_reduce_f64_prod", 8, &[f64s(1.5), f64s(-2.0), f64s(4.0)]), f64s(-12.0));
    // bfloat16 avg of 1.0 (0x3f80) and 2.0 (0x4000) = 1.5 (0x3fc0).
    assert_eq!(run_one("fccl_reduce_bf16_avg", 2, &[vec![0x80, 0x3f], vec![0x00, 0x40]]), vec![0xc0, 0x3f]);
    // half min of 1.0 (0x3c00) and -2.0 (0xc000) = -2.0.
    assert_eq!(run_one("fccl_reduce_f16_min", 2, &[vec![0x00, 0x3c], vec![0x00, 0xc0]]), vec![0x00, 0xc0]);
}

#[test]
fn work_queued_before_a_stream_ordered_free_still_runs() {
    let _c = Ctx::new(0);
    let m = load(&compile(&source(&["fccl_reduce_u32_max".into()]), &[]).unwrap());
    let f = function(m, "fccl_reduce_u32_max");
    let s = stream(0);
    let (a, b, out) = (alloc(64), alloc(64), alloc(64));
    htod(a, &[1; 64]);
    htod(b, &[2; 64]);
    // SAFETY: allocations and a stream of the test.
    unsafe {
        ok(launch(f, out, &[a, b], 16, s));
        ok(cuMemFreeAsync(a, s));
        ok(cuMemFreeAsync(b, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(dtoh(out, 64), vec![2; 64]);
        // Queued after the free: refused at the call.
        assert_eq!(launch(f, out, &[a, b], 16, s), OK, "pointers are only checked when the kernel runs");
        assert_eq!(cuStreamSynchronize(s), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    }
}

static HOST: [u32; 8] = [0; 8];

#[test]
fn a_kernel_touching_memory_outside_an_allocation_fails_the_context_for_good() {
    let t = "a_kernel_touching_memory_outside_an_allocation_fails_the_context_for_good";
    if !is_child(t) {
        let out = run_child(t, &[]);
        assert_child_ok(&out);
        let err = String::from_utf8_lossy(&out.stderr);
        let lines = err.lines().filter(|l| l.contains("failed with CUDA_ERROR_ILLEGAL_ADDRESS")).count();
        assert_eq!(lines, 3, "one line per failed context:\n{err}");
        return;
    }
    let m_src = source(&["fccl_reduce_u32_sum".into()]);
    let ptx = compile(&m_src, &[]).unwrap();
    type Case = dyn Fn(CUdeviceptr, CUdeviceptr) -> (CUdeviceptr, Vec<CUdeviceptr>, u64);
    let cases: [&Case; 3] = [
        // 64 elements = 256 bytes: past the end of the 128-byte allocations.
        &|a, b| (a, vec![a, b], 64),
        // A host (pageable) pointer as input.
        &|a, _| (a, vec![a, HOST.as_ptr() as u64], 8),
        // The output partially overlaps an input.
        &|a, _| (a + 4, vec![a], 8),
    ];
    for case in cases {
        let c = Ctx::new(0);
        let m = load(&ptx);
        let f = function(m, "fccl_reduce_u32_sum");
        let (a, b) = (alloc(128), alloc(128));
        let (out, ins, count) = case(a, b);
        let ill = CUresult::CUDA_ERROR_ILLEGAL_ADDRESS;
        ok(launch(f, out, &ins, count, std::ptr::null_mut()));
        // SAFETY: calls on the failed context; valid pointers.
        unsafe {
            assert_eq!(cuCtxSynchronize(), ill);
            let mut d = 0;
            assert_eq!(cuMemAlloc_v2(&mut d, 16), ill);
            assert_eq!(cuStreamSynchronize(std::ptr::null_mut()), ill);
            assert_eq!(launch(f, out, &ins, 1, std::ptr::null_mut()), ill);
            assert_eq!(cuMemsetD8_v2(a, 0, 1), ill);
            ok(cuCtxDestroy_v2(c.0));
        }
        std::mem::forget(c);
    }
    // Other contexts are unaffected.
    let _c = Ctx::new(0);
    let d = alloc(16);
    htod(d, &[1; 16]);
    assert_eq!(dtoh(d, 16), vec![1; 16]);
}
