//! Initialisation, devices, contexts, error strings, cuGetProcAddress.

mod common;
use common::*;
use std::ffi::{c_char, CStr};

#[test]
fn not_initialized_before_cuinit_then_one_executor_thread() {
    if !is_child("not_initialized_before_cuinit_then_one_executor_thread") {
        assert_child_ok(&run_child("not_initialized_before_cuinit_then_one_executor_thread", &[]));
        return;
    }
    // SAFETY: valid pointers throughout.
    unsafe {
        let mut n = -1;
        assert_eq!(cuDeviceGetCount(&mut n), CUresult::CUDA_ERROR_NOT_INITIALIZED);
        let mut d = 0;
        assert_eq!(cuMemAlloc_v2(&mut d, 16), CUresult::CUDA_ERROR_NOT_INITIALIZED);
        let mut c: CUcontext = std::ptr::null_mut();
        assert_eq!(cuCtxGetCurrent(&mut c), CUresult::CUDA_ERROR_NOT_INITIALIZED);
        let mut v = 0;
        ok(cuDriverGetVersion(&mut v));
        assert_eq!(v, 13000);
        let mut s: *const c_char = std::ptr::null();
        ok(cuGetErrorString(201, &mut s));
        assert_eq!(CStr::from_ptr(s).to_str().unwrap(), "invalid device context");
        let mut f = std::ptr::null_mut();
        ok(cuGetProcAddress_v2(c"cuInit".as_ptr(), &mut f, 13000, 0, std::ptr::null_mut()));
        assert_eq!(f as usize, cuInit as *const () as usize);
        assert_eq!(cuInit(1), CUresult::CUDA_ERROR_INVALID_VALUE);
        let before = threads();
        ok(cuInit(0));
        assert_eq!(threads(), before + 1, "cuInit starts exactly one thread");
        ok(cuInit(0));
        assert_eq!(threads(), before + 1, "only the first cuInit starts it");
        ok(cuDeviceGetCount(&mut n));
        assert_eq!(n, 2);
    }
}

#[test]
fn calls_without_a_current_context_are_invalid_context() {
    init();
    std::thread::spawn(|| {
        // SAFETY: valid pointers; every call must fail before touching them.
        unsafe {
            let e = CUresult::CUDA_ERROR_INVALID_CONTEXT;
            let mut d: CUdeviceptr = 0;
            assert_eq!(cuMemAlloc_v2(&mut d, 16), e);
            assert_eq!(cuMemFree_v2(0x1000), e);
            let (mut free, mut total) = (0, 0);
            assert_eq!(cuMemGetInfo_v2(&mut free, &mut total), e);
            let mut s: CUstream = std::ptr::null_mut();
            assert_eq!(cuStreamCreate(&mut s, 0), e);
            assert_eq!(cuStreamSynchronize(std::ptr::null_mut()), e);
            assert_eq!(cuCtxSynchronize(), e);
            let mut ev: CUevent = std::ptr::null_mut();
            assert_eq!(cuEventCreate(&mut ev, 0), e);
            let mut m = std::ptr::null_mut();
            assert_eq!(cuModuleLoadData(&mut m, c".version 8.0\n.target sm_90\n".as_ptr().cast()), e);
            let mut p = std::ptr::null_mut();
            assert_eq!(cuMemHostAlloc(&mut p, 64, 0), e);
            let mut buf = [0u8; 64];
            assert_eq!(cuMemHostRegister_v2(buf.as_mut_ptr().cast(), 64, 0), e);
            assert_eq!(cuMemcpyHtoD_v2(0x1000, buf.as_ptr().cast(), 4), e);
            assert_eq!(cuMemcpyDtoH_v2(buf.as_mut_ptr().cast(), 0x1000, 4), e);
            assert_eq!(cuMemsetD8_v2(0x1000, 0, 4), e);
            let mut h = std::mem::zeroed();
            assert_eq!(cuIpcGetMemHandle(&mut h, 0x1000), e);
            assert_eq!(cuIpcOpenMemHandle_v2(&mut d, h, 0), e);
            assert_eq!(cuIpcCloseMemHandle(0x1000), e);
            assert_eq!(cuStreamWriteValue32_v2(std::ptr::null_mut(), 0x1000, 1, 0), e);
            let mut dev = -1;
            assert_eq!(cuCtxGetDevice(&mut dev), e);
            let mut c: CUcontext = 0x1 as CUcontext;
            ok(cuCtxGetCurrent(&mut c));
            assert!(c.is_null());
            assert_eq!(cuCtxPopCurrent_v2(&mut c), e);
        }
    })
    .join()
    .unwrap();
}

#[test]
fn devices_report_the_simulated_gpu() {
    init();
    // SAFETY: valid pointers and buffers throughout.
    unsafe {
        let mut n = 0;
        ok(cuDeviceGetCount(&mut n));
        assert_eq!(n, 2);
        let mut d = -1;
        ok(cuDeviceGet(&mut d, 1));
        assert_eq!(d, 1);
        assert_eq!(cuDeviceGet(&mut d, 2), CUresult::CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(cuDeviceGet(&mut d, -1), CUresult::CUDA_ERROR_INVALID_DEVICE);
        let mut name = [0 as c_char; 64];
        ok(cuDeviceGetName(name.as_mut_ptr(), 64, 0));
        assert_eq!(CStr::from_ptr(name.as_ptr()).to_str().unwrap(), "ferroccl simulated GPU");
        ok(cuDeviceGetName(name.as_mut_ptr(), 5, 0));
        assert_eq!(CStr::from_ptr(name.as_ptr()).to_str().unwrap(), "ferr");
        let mut bus = [0 as c_char; 32];
        ok(cuDeviceGetPCIBusId(bus.as_mut_ptr(), 32, 1));
        assert_eq!(CStr::from_ptr(bus.as_ptr()).to_str().unwrap(), "0000:11:00.0");
        ok(cuDeviceGetByPCIBusId(&mut d, c"0000:11:00.0".as_ptr()));
        assert_eq!(d, 1);
        assert_eq!(cuDeviceGetByPCIBusId(&mut d, c"0000:99:00.0".as_ptr()), CUresult::CUDA_ERROR_INVALID_DEVICE);
        let (mut major, mut minor) = (0, 0);
        ok(cuDeviceComputeCapability(&mut major, &mut minor, 0));
        assert_eq!((major, minor), (9, 0));
        let attr = |a: i32, dev: i32| {
            let mut v = -7;
            ok(cuDeviceGetAttribute(&mut v, a, dev));
            v
        };
        use cudarc::driver::sys::CUdevice_attribute as A;
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as i32, 0), 132);
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE as i32, 0), 32);
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK as i32, 0), 1024);
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING as i32, 0), 1);
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS as i32, 0), 1);
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR as i32, 0), 1);
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as i32, 1), 9);
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID as i32, 1), 0x11);
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE as i32, 0), 0);
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_INTEGRATED as i32, 0), 0);
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH as i32, 0), 0);
        let mut v = 0;
        assert_eq!(cuDeviceGetAttribute(&mut v, 0, 0), CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            cuDeviceGetAttribute(&mut v, A::CU_DEVICE_ATTRIBUTE_MAX as i32, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuDeviceGetAttribute(&mut v, 16, 5), CUresult::CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(cuDeviceGetAttribute(std::ptr::null_mut(), 16, 0), CUresult::CUDA_ERROR_INVALID_VALUE);
        ok(cuDeviceCanAccessPeer(&mut v, 0, 1));
        assert_eq!(v, 1);
        ok(cuDeviceCanAccessPeer(&mut v, 1, 1));
        assert_eq!(v, 0);
        let (mut u0, mut u1) = (std::mem::zeroed(), std::mem::zeroed());
        ok(cuDeviceGetUuid_v2(&mut u0, 0));
        ok(cuDeviceGetUuid(&mut u1, 1));
        assert_ne!(u0.bytes, u1.bytes);
        let mut total = 0;
        ok(cuDeviceTotalMem_v2(&mut total, 0));
        assert_eq!(total, 8192 << 20);
    }
}

#[test]
fn each_thread_has_its_own_context_stack() {
    let a = Ctx::new(0);
    let b = Ctx::new(1);
    // SAFETY: valid pointers throughout.
    unsafe {
        let mut c: CUcontext = std::ptr::null_mut();
        ok(cuCtxGetCurrent(&mut c));
        assert_eq!(c, b.0, "cuCtxCreate pushes");
        let mut dev = -1;
        ok(cuCtxGetDevice(&mut dev));
        assert_eq!(dev, 1);
        ok(cuCtxPopCurrent_v2(&mut c));
        assert_eq!(c, b.0);
        ok(cuCtxGetCurrent(&mut c));
        assert_eq!(c, a.0);
        ok(cuCtxPushCurrent_v2(b.0));
        ok(cuCtxSetCurrent(a.0));
        ok(cuCtxPopCurrent_v2(&mut c));
        assert_eq!(c, a.0, "cuCtxSetCurrent replaced the top");
        ok(cuCtxGetCurrent(&mut c));
        assert_eq!(c, a.0);
        let (ah, bh) = (a.0 as usize, b.0 as usize);
        std::thread::spawn(move || {
            let mut c: CUcontext = 0x1 as CUcontext;
            ok(cuCtxGetCurrent(&mut c));
            assert!(c.is_null(), "a new thread has no current context");
            ok(cuCtxSetCurrent(bh as CUcontext));
            let mut d = 0;
            ok(cuMemAlloc_v2(&mut d, 64));
            ok(cuMemFree_v2(d));
            assert_ne!(ah, bh);
        })
        .join()
        .unwrap();
        let mut flags = 9;
        ok(cuCtxGetFlags(&mut flags));
        assert_eq!(flags, 0);
        let mut id0 = 0;
        ok(cuCtxGetId(a.0, &mut id0));
        let mut id1 = 0;
        ok(cuCtxGetId(b.0, &mut id1));
        assert_ne!(id0, id1);
    }
}

#[test]
fn destroyed_contexts_are_invalid_context() {
    init();
    // SAFETY: valid pointers; the destroyed handle is only passed back to the simulator.
    unsafe {
        let mut c: CUcontext = std::ptr::null_mut();
        ok(cuCtxCreate_v2(&mut c, 0, 0));
        let mut d = 0;
        ok(cuMemAlloc_v2(&mut d, 256));
        ok(cuCtxDestroy_v2(c));
        let mut cur: CUcontext = std::ptr::null_mut();
        ok(cuCtxGetCurrent(&mut cur));
        assert!(cur.is_null(), "destroying the current context pops it");
        let e = CUresult::CUDA_ERROR_INVALID_CONTEXT;
        assert_eq!(cuCtxPushCurrent_v2(c), e);
        assert_eq!(cuCtxSetCurrent(c), e);
        assert_eq!(cuCtxDestroy_v2(c), e);
        assert_eq!(cuCtxDestroy_v2(0xdead_0000 as CUcontext), e);
        let mut v = 0;
        assert_eq!(cuCtxGetApiVersion(c, &mut v), e);
        let _keep = Ctx::new(0);
        let mut base = 0;
        assert_eq!(cuMemGetAddressRange_v2(&mut base, std::ptr::null_mut(), d), CUresult::CUDA_ERROR_NOT_FOUND);
        assert_eq!(cuMemFree_v2(d), CUresult::CUDA_ERROR_INVALID_VALUE, "the context's memory went with it");
        assert_eq!(cuCtxCreate_v2(&mut c, 0x100, 0), CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuCtxCreate_v2(&mut c, 0, 7), CUresult::CUDA_ERROR_INVALID_DEVICE);
    }
}

#[test]
fn primary_context_retain_release() {
    init();
    std::thread::spawn(|| {
        // SAFETY: valid pointers throughout.
        unsafe {
            let (mut p, mut q): (CUcontext, CUcontext) = (std::ptr::null_mut(), std::ptr::null_mut());
            ok(cuDevicePrimaryCtxRetain(&mut p, 1));
            ok(cuDevicePrimaryCtxRetain(&mut q, 1));
            assert_eq!(p, q);
            let mut cur: CUcontext = std::ptr::null_mut();
            ok(cuCtxGetCurrent(&mut cur));
            assert!(cur.is_null(), "retain does not make it current");
            let (mut flags, mut active) = (7, 0);
            ok(cuDevicePrimaryCtxGetState(1, &mut flags, &mut active));
            assert_eq!(active, 1);
            ok(cuCtxSetCurrent(p));
            let mut d = 0;
            ok(cuMemAlloc_v2(&mut d, 64));
            let per_thread = 0x2 as CUstream;
            ok(cuMemsetD8Async(d, 1, 64, per_thread));
            ok(cuDevicePrimaryCtxRelease_v2(1));
            ok(cuMemFree_v2(d));
            ok(cuDevicePrimaryCtxRelease_v2(1));
            ok(cuDevicePrimaryCtxGetState(1, &mut flags, &mut active));
            assert_eq!(active, 0);
            assert_eq!(cuMemAlloc_v2(&mut d, 64), CUresult::CUDA_ERROR_INVALID_CONTEXT);
            assert_eq!(cuDevicePrimaryCtxRelease_v2(1), CUresult::CUDA_ERROR_INVALID_CONTEXT);
            ok(cuDevicePrimaryCtxRetain(&mut q, 1));
            assert_eq!(p, q, "the primary context keeps its handle");
            ok(cuMemAlloc_v2(&mut d, 64));
            ok(cuMemsetD8Async(d, 2, 64, per_thread));
            ok(cuStreamSynchronize(per_thread));
            ok(cuDevicePrimaryCtxReset_v2(1));
            assert_eq!(cuMemAlloc_v2(&mut d, 64), CUresult::CUDA_ERROR_INVALID_CONTEXT);
            assert_eq!(cuCtxDestroy_v2(p), CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
    })
    .join()
    .unwrap();
}

#[test]
fn error_names_and_strings() {
    // SAFETY: valid out-pointers.
    unsafe {
        let mut s: *const c_char = std::ptr::null();
        ok(cuGetErrorName(700, &mut s));
        assert_eq!(CStr::from_ptr(s).to_str().unwrap(), "CUDA_ERROR_ILLEGAL_ADDRESS");
        ok(cuGetErrorString(700, &mut s));
        assert_eq!(CStr::from_ptr(s).to_str().unwrap(), "an illegal memory access was encountered");
        ok(cuGetErrorString(1, &mut s));
        assert_eq!(CStr::from_ptr(s).to_str().unwrap(), "invalid argument");
        ok(cuGetErrorString(2, &mut s));
        assert_eq!(CStr::from_ptr(s).to_str().unwrap(), "out of memory");
        assert_eq!(cuGetErrorString(12345, &mut s), CUresult::CUDA_ERROR_INVALID_VALUE);
        assert!(s.is_null());
        assert_eq!(cuGetErrorName(0, std::ptr::null_mut()), CUresult::CUDA_ERROR_INVALID_VALUE);
    }
}

#[test]
fn proc_address_returns_the_simulators_functions() {
    // SAFETY: valid pointers.
    unsafe {
        let get = |name: &CStr, version: i32| {
            let mut f = std::ptr::null_mut();
            let mut status = -1;
            let r = cuGetProcAddress_v2(name.as_ptr(), &mut f, version, 0, &mut status);
            (r, f as usize, status)
        };
        assert_eq!(get(c"cuMemAlloc", 13000), (OK, cuMemAlloc_v2 as *const () as usize, 0));
        assert_eq!(get(c"cuStreamWaitValue32", 13000).1, cuStreamWaitValue32_v2 as *const () as usize);
        assert_eq!(get(c"cuCtxCreate", 11000).1, cuCtxCreate_v2 as *const () as usize);
        assert_eq!(get(c"cuCtxCreate", 13000).1, cuCtxCreate_v4 as *const () as usize);
        assert_eq!(get(c"cuStreamGetCtx", 12000).1, cuStreamGetCtx as *const () as usize);
        assert_eq!(get(c"cuGetProcAddress", 13000).1, cuGetProcAddress_v2 as *const () as usize);
        assert_eq!(get(c"cuGraphAddKernelNode", 13000), (CUresult::CUDA_ERROR_NOT_FOUND, 0, 1));
        assert_eq!(get(c"cuStreamGetCaptureInfo", 12080).1, cuStreamGetCaptureInfo_v2 as *const () as usize);
        assert_eq!(get(c"cuStreamGetCaptureInfo", 13000).1, cuStreamGetCaptureInfo_v3 as *const () as usize);
        assert_eq!(get(c"cuStreamGetCaptureInfo", 11000).0, CUresult::CUDA_ERROR_NOT_FOUND);
    }
}

#[test]
fn cuda_visible_devices_selects_physical_devices() {
    if is_child("cuda_visible_devices_selects_physical_devices") {
        // SAFETY: valid pointers.
        unsafe {
            let mut r = cuInit(0);
            if std::env::var("CUDA_VISIBLE_DEVICES").as_deref() == Ok("") {
                assert_eq!(r, CUresult::CUDA_ERROR_NO_DEVICE);
                let mut n = 0;
                r = cuDeviceGetCount(&mut n);
                assert_eq!(r, CUresult::CUDA_ERROR_NOT_INITIALIZED);
                return;
            }
            ok(r);
            let mut n = 0;
            ok(cuDeviceGetCount(&mut n));
            assert_eq!(n, 2);
            let mut bus = [0 as c_char; 16];
            ok(cuDeviceGetPCIBusId(bus.as_mut_ptr(), 16, 0));
            assert_eq!(CStr::from_ptr(bus.as_ptr()).to_str().unwrap(), "0000:13:00.0");
            ok(cuDeviceGetPCIBusId(bus.as_mut_ptr(), 16, 1));
            assert_eq!(CStr::from_ptr(bus.as_ptr()).to_str().unwrap(), "0000:10:00.0");
        }
        return;
    }
    let t = "cuda_visible_devices_selects_physical_devices";
    assert_child_ok(&run_child(t, &[("FERROCCL_SIM_DEVICES", "4"), ("CUDA_VISIBLE_DEVICES", "3,0,9,1")]));
    assert_child_ok(&run_child(t, &[("CUDA_VISIBLE_DEVICES", "")]));
}

#[test]
fn a_forked_child_cannot_use_cuda_and_the_parent_goes_on() {
    let _c = Ctx::new(0);
    let d = alloc(64);
    // SAFETY: the child only calls the simulator (which checks the fork flag before any
    // lock) and _exit.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0);
        if pid == 0 {
            let mut n = 0;
            let r = cuDeviceGetCount(&mut n);
            libc::_exit(if r == CUresult::CUDA_ERROR_NOT_INITIALIZED { 0 } else { 1 });
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status:#x}");
    }
    htod(d, &[7; 64]);
    assert_eq!(dtoh(d, 64), vec![7; 64]);
    // SAFETY: an allocation of this test.
    ok(unsafe { cuMemFree_v2(d) });
}
