//! CUDA entry points on a machine without CUDA: each returns fcclUnavailable with a
//! message, never a crash; host memory keeps working whatever FERROCCL_BACKEND says.
//! On a machine with a GPU these checks do not apply and the test says so.
//! One test function: it sets FERROCCL_BACKEND, which other threads must not see.

use ferroccl::ffi::*;
use std::ffi::CStr;
use std::ptr::{null, null_mut};

fn last_error() -> String {
    // SAFETY: fcclGetLastError returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(fcclGetLastError(null_mut())) }.to_string_lossy().into_owned()
}

fn init_one(config: *mut fcclConfig_t) -> (fcclResult_t, fcclComm_t) {
    let mut id = fcclUniqueId { internal: [0; FCCL_UNIQUE_ID_BYTES] };
    // SAFETY: valid out-pointers.
    assert_eq!(unsafe { fcclGetUniqueId(as_out(&mut id)) }, fcclSuccess);
    let mut comm: fcclComm_t = null_mut();
    // SAFETY: valid out-pointer; config is NULL or a fcclConfig_t.
    let r = unsafe { fcclCommInitRankConfig(as_out(&mut comm), 1, id, 0, config) };
    (r, comm)
}

fn all_reduce_works(comm: fcclComm_t) {
    let send = [1.0f32, 2.0, 3.0];
    let mut recv = [0.0f32; 3];
    // SAFETY: host buffers of 3 floats; NULL stream for host memory.
    let r = unsafe {
        fcclAllReduce(send.as_ptr().cast(), recv.as_mut_ptr().cast(), 3, fcclFloat32, fcclSum, comm, null_mut())
    };
    assert_eq!(r, fcclSuccess, "{}", last_error());
    assert_eq!(recv, send);
    let mut dev = 5;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { fcclCommCuDevice(comm, as_out(&mut dev)) }, fcclSuccess);
    assert_eq!(dev, -1, "a host rank reports device -1");
}

#[test]
fn without_cuda_every_cuda_entry_point_is_unavailable() {
    if ferroccl::mem::cuda::active() {
        eprintln!("CUDA is present here: the no-CUDA checks do not apply (test_cuda covers the GPU)");
        return;
    }
    // fcclMemAlloc
    let mut p: *mut std::ffi::c_void = 0x10 as *mut _;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { fcclMemAlloc(as_out(&mut p), 64) }, fcclUnavailable);
    assert_eq!(p, 0x10 as *mut _, "a failed fcclMemAlloc leaves *ptr alone");
    let m = last_error();
    assert!(m.starts_with("fcclMemAlloc: CUDA is not available"), "{m}");

    // fcclMemAllocHost still works (page-aligned host memory).
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { fcclMemAllocHost(as_out(&mut p), 64) }, fcclSuccess);
    assert_eq!(p as usize % 4096, 0);
    // SAFETY: p came from fcclMemAllocHost.
    assert_eq!(unsafe { fcclMemFree(p) }, fcclSuccess);

    // fcclCommInitAll with a device list, distinct and repeated devices.
    for devs in [vec![0], vec![0, 1], vec![0, 0]] {
        let mut comms = vec![null_mut(); devs.len()];
        // SAFETY: room for devs.len() handles; devs has that many entries.
        let r = unsafe { fcclCommInitAll(comms.as_mut_ptr(), devs.len() as i32, devs.as_ptr()) };
        assert_eq!(r, fcclUnavailable, "devlist {devs:?}");
        let m = last_error();
        assert!(m.contains("CUDA is not available"), "{m}");
        assert!(comms.iter().all(|c| c.is_null()));
    }

    // FCCL_BACKEND_NCCL in the config.
    let mut cfg = fcclConfig_t {
        size: std::mem::size_of::<fcclConfig_t>(),
        magic: FCCL_CONFIG_MAGIC,
        version: FCCL_CONFIG_VERSION,
        blocking: FCCL_CONFIG_UNDEF_INT,
        timeoutMs: FCCL_CONFIG_UNDEF_INT,
        backend: FCCL_BACKEND_NCCL,
        commName: null(),
        checkMode: FCCL_CONFIG_UNDEF_INT,
    };
    let (r, comm) = init_one(&mut cfg);
    assert_eq!(r, fcclUnavailable);
    assert!(comm.is_null());
    let m = last_error();
    assert!(m.contains("NCCL backend was requested") && m.contains("CUDA is not available"), "{m}");

    // FCCL_BACKEND_HOST and AUTO work on host memory.
    for b in [FCCL_BACKEND_HOST, FCCL_BACKEND_AUTO] {
        cfg.backend = b;
        let (r, comm) = init_one(&mut cfg);
        assert_eq!(r, fcclSuccess, "{}", last_error());
        all_reduce_works(comm);
        // SAFETY: live communicator.
        assert_eq!(unsafe { fcclCommDestroy(comm) }, fcclSuccess);
    }

    // FERROCCL_BACKEND=nccl, =host, and a bad value.
    std::env::set_var("FERROCCL_BACKEND", "nccl");
    let (r, _) = init_one(null_mut());
    assert_eq!(r, fcclUnavailable);
    assert!(last_error().contains("FERROCCL_BACKEND"), "{}", last_error());
    let mut comms = vec![null_mut(); 2];
    // SAFETY: room for 2 handles.
    assert_eq!(unsafe { fcclCommInitAll(comms.as_mut_ptr(), 2, null()) }, fcclUnavailable);
    // The config's explicit choice wins over the environment.
    cfg.backend = FCCL_BACKEND_HOST;
    let (r, comm) = init_one(&mut cfg);
    assert_eq!(r, fcclSuccess, "{}", last_error());
    all_reduce_works(comm);
    // SAFETY: live communicator.
    assert_eq!(unsafe { fcclCommDestroy(comm) }, fcclSuccess);
    std::env::set_var("FERROCCL_BACKEND", "host");
    let (r, comm) = init_one(null_mut());
    assert_eq!(r, fcclSuccess, "{}", last_error());
    all_reduce_works(comm);
    // SAFETY: live communicator.
    assert_eq!(unsafe { fcclCommDestroy(comm) }, fcclSuccess);
    std::env::set_var("FERROCCL_BACKEND", "gpu");
    let (r, _) = init_one(null_mut());
    assert_eq!(r, fcclInvalidArgument);
    assert!(last_error().contains("FERROCCL_BACKEND is \"gpu\": give one of auto, host or nccl"), "{}", last_error());
    std::env::remove_var("FERROCCL_BACKEND");
}
