//! Virtual memory management: cuMemCreate, reservations, mappings, access, POSIX file
//! descriptor handles between processes, and what the driver refuses.

mod common;
use common::*;
use cudarc::driver::sys::{CUdevice_attribute as A, CUpointer_attribute as P, CUresult as R};
use ferroccl_simgpu::vmm::{AccessDesc, Location, Prop, GRANULARITY};
use std::ffi::{c_void, CString};

const G: usize = GRANULARITY;

fn prop(dev: i32, types: u32) -> Prop {
    Prop {
        type_: 1,
        handle_types: types,
        location: Location { type_: 1, id: dev },
        win32: std::ptr::null_mut(),
        compression: 0,
        rdma: 0,
        usage: 0,
        reserved: [0; 4],
    }
}

fn create(size: usize, p: &Prop) -> Result<u64, R> {
    let mut h = 0;
    // SAFETY: valid pointers.
    let r = unsafe { cuMemCreate(&mut h, size, (p as *const Prop).cast(), 0) };
    if r == OK {
        Ok(h)
    } else {
        Err(r)
    }
}

fn reserve(size: usize) -> CUdeviceptr {
    let mut p = 0;
    // SAFETY: valid out-pointer.
    ok(unsafe { cuMemAddressReserve(&mut p, size, 0, 0, 0) });
    p
}

fn access(p: CUdeviceptr, size: usize, dev: i32, flags: u32) -> R {
    let d = AccessDesc { location: Location { type_: 1, id: dev }, flags };
    // SAFETY: one descriptor.
    unsafe { cuMemSetAccess(p, size, (&d as *const AccessDesc).cast(), 1) }
}

fn attr_u64(a: P, p: CUdeviceptr) -> u64 {
    let mut v = 0u64;
    // SAFETY: 8 bytes for 8-byte attributes; 4-byte ones fill the low half.
    ok(unsafe { cuPointerGetAttribute((&mut v as *mut u64).cast(), a as i32, p) });
    v
}

/// Two chunks of one physical allocation each, mapped side by side in one reservation, as
/// PyTorch's expandable segments do: (reservation, handles).
fn two_chunks(types: u32) -> (CUdeviceptr, [u64; 2]) {
    let p = prop(0, types);
    let hs = [create(G, &p).unwrap(), create(G, &p).unwrap()];
    let va = reserve(4 * G);
    // SAFETY: mapping fresh handles into the reservation.
    unsafe {
        ok(cuMemMap(va, G, 0, hs[0], 0));
        ok(cuMemMap(va + G as u64, G, 0, hs[1], 0));
    }
    (va, hs)
}

#[test]
fn the_device_reports_vmm_and_posix_fd_handles() {
    let _c = Ctx::new(0);
    for a in [
        A::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
        A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
    ] {
        let mut v = -1;
        // SAFETY: valid out-pointer.
        ok(unsafe { cuDeviceGetAttribute(&mut v, a as i32, 0) });
        assert_eq!(v, 1, "{a:?}");
    }
    let mut g = 0usize;
    let p = prop(0, 1);
    // SAFETY: valid pointers.
    unsafe {
        ok(cuMemGetAllocationGranularity(&mut g, (&p as *const Prop).cast(), 0));
        assert_eq!(g, 2 << 20);
        ok(cuMemGetAllocationGranularity(&mut g, (&p as *const Prop).cast(), 1));
        assert_eq!(g, 2 << 20);
        assert_eq!(cuMemGetAllocationGranularity(&mut g, (&p as *const Prop).cast(), 2), R::CUDA_ERROR_INVALID_VALUE);
    }
}

#[test]
fn cu_mem_create_refuses_what_the_driver_refuses() {
    let _c = Ctx::new(0);
    let p = prop(0, 1);
    assert_eq!(create(G / 2, &p), Err(R::CUDA_ERROR_INVALID_VALUE), "not a multiple of the granularity");
    assert_eq!(create(0, &p), Err(R::CUDA_ERROR_INVALID_VALUE));
    assert_eq!(create(G, &Prop { type_: 0, ..p }), Err(R::CUDA_ERROR_INVALID_VALUE), "type invalid");
    assert_eq!(create(G, &Prop { type_: 7, ..p }), Err(R::CUDA_ERROR_INVALID_VALUE), "type out of the enum");
    assert_eq!(create(G, &prop(99, 1)), Err(R::CUDA_ERROR_INVALID_DEVICE));
    // The driver accepts the fabric type here and refuses the export (see below).
    let fabric = create(G, &prop(0, 8 | 1)).expect("fabric and POSIX handle types requested");
    // SAFETY: a live handle.
    ok(unsafe { cuMemRelease(fabric) });
    assert_eq!(create(G, &prop(0, 2)), Err(R::CUDA_ERROR_NOT_SUPPORTED), "Win32 handles");
    assert_eq!(create(G, &prop(0, 0x40)), Err(R::CUDA_ERROR_INVALID_VALUE));
    let mut h = 0;
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(cuMemCreate(&mut h, G, (&p as *const Prop).cast(), 1), R::CUDA_ERROR_INVALID_VALUE, "flags");
        assert_eq!(cuMemCreate(&mut h, G, std::ptr::null(), 0), R::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuMemCreate(&mut h, 1 << 50, (&p as *const Prop).cast(), 0), R::CUDA_ERROR_OUT_OF_MEMORY);
        let h = create(G, &p).unwrap();
        ok(cuMemRelease(h));
        assert_eq!(cuMemRelease(h), R::CUDA_ERROR_INVALID_VALUE, "released twice");
    }
}

#[test]
fn mappings_need_access_and_hold_data_until_unmapped_and_released() {
    let _c = Ctx::new(0);
    let (va, hs) = two_chunks(1);
    // SAFETY: the calls below name the reservation and handles made above.
    unsafe {
        assert_eq!(cuMemMap(va + 2 * G as u64, G, 0, 0xdead, 0), R::CUDA_ERROR_INVALID_VALUE, "unknown handle");
        assert_eq!(cuMemMap(va, G, 0, hs[0], 0), R::CUDA_ERROR_INVALID_VALUE, "already mapped");
        assert_eq!(cuMemMap(va + 2 * G as u64 + 4096, G, 0, hs[0], 0), R::CUDA_ERROR_INVALID_VALUE, "misaligned");
        assert_eq!(cuMemMap(va + 2 * G as u64, G, 4096, hs[0], 0), R::CUDA_ERROR_INVALID_VALUE, "offset");
        assert_eq!(cuMemMap(va + 3 * G as u64, 2 * G, 0, hs[0], 0), R::CUDA_ERROR_INVALID_VALUE, "past the end");
        assert_eq!(cuMemMap(va + 2 * G as u64, G + 4096, 0, hs[0], 0), R::CUDA_ERROR_INVALID_VALUE, "size");
        assert_eq!(access(va, 3 * G, 0, 3), R::CUDA_ERROR_INVALID_VALUE, "not all mapped");
        assert_eq!(access(va, 2 * G, 9, 3), R::CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(access(va, 2 * G, 0, 2), R::CUDA_ERROR_INVALID_VALUE, "flags");
    }
    ok(access(va, 2 * G, 0, 3));
    let data: Vec<u8> = (0..2 * G).map(|i| (i * 7 % 251) as u8).collect();
    // Copies lie in one mapping (see docs/sim-gpu.md: stricter than the driver).
    htod(va, &data[..G]);
    htod(va + G as u64, &data[G..]);
    assert_eq!(dtoh(va + 100, 1000), data[100..1100]);
    assert_eq!(dtoh(va + G as u64, G), data[G..]);
    // SAFETY: the mapped range.
    unsafe {
        let mut v = vec![0u8; 2000];
        let across = cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), va + G as u64 - 1000, 2000);
        assert_eq!(across, R::CUDA_ERROR_INVALID_VALUE, "one copy across two mappings");
    }
    // What the driver reports for the address: the mapping is its range, not IPC-capable.
    assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 5), 2);
    assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, va + 5), 0);
    assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va + G as u64 + 5), va + G as u64);
    assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_RANGE_SIZE, va + 5), G as u64);
    assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, va), 1);
    assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, va), 3);
    let plain = alloc(4096);
    assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, plain), 1);
    // SAFETY: valid out-pointers.
    unsafe {
        let (mut base, mut size) = (0, 0);
        ok(cuMemGetAddressRange_v2(&mut base, &mut size, va + G as u64 + 77));
        assert_eq!((base, size), (va + G as u64, G));
        let mut ipc = cudarc::driver::sys::CUipcMemHandle { reserved: [0; 64] };
        assert_eq!(cuIpcGetMemHandle(&mut ipc, va), R::CUDA_ERROR_INVALID_VALUE, "VMM memory is not legacy IPC");
        assert_eq!(cuMemFree_v2(va), R::CUDA_ERROR_INVALID_VALUE, "cuMemFree of a mapping");
        let mut h = 0;
        assert_eq!(cuMemRetainAllocationHandle(&mut h, plain as *mut c_void), R::CUDA_ERROR_INVALID_VALUE);
        ok(cuMemRetainAllocationHandle(&mut h, (va + G as u64 + 9) as *mut c_void));
        assert_eq!(h, hs[1], "the handle that was mapped there");
        ok(cuMemRelease(h));
        let mut got = prop(1, 0);
        ok(cuMemGetAllocationPropertiesFromHandle((&mut got as *mut Prop).cast(), hs[0]));
        assert_eq!((got.type_, got.handle_types, got.location.type_, got.location.id), (1, 1, 1, 0));
        // Released while mapped: the memory lives on until unmapped.
        ok(cuMemRelease(hs[0]));
        assert_eq!(dtoh(va, 64), data[..64]);
        assert_eq!(cuMemUnmap(va, G / 2), R::CUDA_ERROR_INVALID_VALUE, "part of a mapping");
        assert_eq!(cuMemAddressFree(va, 4 * G), R::CUDA_ERROR_INVALID_VALUE, "still mapped");
        ok(cuMemUnmap(va, 2 * G));
        let mut v = vec![0u8; 64];
        assert_eq!(cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), va, 64), R::CUDA_ERROR_INVALID_VALUE, "unmapped");
        assert_eq!(cuMemAddressFree(va, 2 * G), R::CUDA_ERROR_INVALID_VALUE, "not the reserved size");
        ok(cuMemAddressFree(va, 4 * G));
        assert_eq!(cuMemAddressFree(va, 4 * G), R::CUDA_ERROR_INVALID_VALUE, "freed twice");
        ok(cuMemRelease(hs[1]));
        cuMemFree_v2(plain);
    }
}

#[test]
fn copies_to_a_mapping_without_access_fail_like_an_illegal_address() {
    let _c = Ctx::new(0);
    let (va, _) = two_chunks(1);
    let data = vec![1u8; 256];
    // SAFETY: a mapped range; the copy is accepted and fails when it runs.
    unsafe {
        let r = cuMemcpyHtoD_v2(va, data.as_ptr().cast(), data.len());
        let r = if r == OK { cuCtxSynchronize() } else { r };
        assert_eq!(r, R::CUDA_ERROR_ILLEGAL_ADDRESS);
        assert_eq!(cuCtxSynchronize(), R::CUDA_ERROR_ILLEGAL_ADDRESS, "sticky");
    }
}

#[test]
fn exports_need_the_posix_handle_type_requested() {
    let _c = Ctx::new(0);
    let h = create(G, &prop(0, 0)).unwrap();
    let mut fd: i32 = -1;
    // SAFETY: valid pointers.
    unsafe {
        let r = cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), h, 1, 0);
        assert_eq!(r, R::CUDA_ERROR_INVALID_VALUE, "created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR");
        assert_eq!(cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), h, 8, 0), R::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), h, 2, 0), R::CUDA_ERROR_NOT_SUPPORTED);
        ok(cuMemRelease(h));
        let mut g = 0;
        let bad = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        assert_eq!(cuMemImportFromShareableHandle(&mut g, bad as usize as *mut c_void, 1), R::CUDA_ERROR_INVALID_VALUE);
        libc::close(bad);
        assert_eq!(cuMemImportFromShareableHandle(&mut g, 999_999usize as *mut c_void, 1), R::CUDA_ERROR_INVALID_VALUE);
    }
}

/// A child process imports the parent's allocation from an inherited file descriptor, maps
/// it, reads the parent's data and writes its own; the parent sees it.
#[test]
fn a_child_imports_an_exported_file_descriptor() {
    let t = "a_child_imports_an_exported_file_descriptor";
    if is_child(t) {
        let _c = Ctx::new(0);
        let fd: i32 = std::env::var("SIMGPU_FD").unwrap().parse().unwrap();
        let mut h = 0;
        // SAFETY: the inherited fd; mapping into a fresh reservation.
        unsafe {
            ok(cuMemImportFromShareableHandle(&mut h, fd as usize as *mut c_void, 1));
            libc::close(fd);
            let va = reserve(G);
            ok(cuMemMap(va, G, 0, h, 0));
            ok(access(va, G, 0, 3));
            assert_eq!(dtoh(va, 4096), (0..4096).map(|i| (i % 256) as u8).collect::<Vec<_>>());
            htod(va + 4096, &[42u8; 16]);
            ok(cuMemUnmap(va, G));
            ok(cuMemRelease(h));
            ok(cuMemAddressFree(va, G));
        }
        return;
    }
    let _c = Ctx::new(0);
    let h = create(G, &prop(0, 1)).unwrap();
    let va = reserve(G);
    let mut fd: i32 = -1;
    // SAFETY: valid pointers; the fd is made inheritable for the child.
    unsafe {
        ok(cuMemMap(va, G, 0, h, 0));
        ok(access(va, G, 0, 3));
        htod(va, &(0..4096).map(|i| (i % 256) as u8).collect::<Vec<_>>());
        ok(cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), h, 1, 0));
        libc::fcntl(fd, libc::F_SETFD, 0);
    }
    let out = run_child(t, &[("SIMGPU_FD", &fd.to_string())]);
    assert_child_ok(&out);
    assert_eq!(dtoh(va + 4096, 16), vec![42u8; 16], "the child's write");
    // SAFETY: the parent's own objects.
    unsafe {
        libc::close(fd);
        ok(cuMemUnmap(va, G));
        ok(cuMemRelease(h));
        ok(cuMemAddressFree(va, G));
    }
}

const SRC: &str = r#"
extern "C" __global__ void copy(const unsigned char* s, unsigned char* d, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) d[i] = s[i];
}
"#;

fn kernel() -> cudarc::driver::sys::CUfunction {
    use cudarc::nvrtc::sys::nvrtcResult as N;
    let src = CString::new(SRC).unwrap();
    // SAFETY: NUL-terminated strings; buffers of the reported sizes.
    unsafe {
        let mut prog = std::ptr::null_mut();
        let r = nvrtcCreateProgram(&mut prog, src.as_ptr(), c"k.cu".as_ptr(), 0, std::ptr::null(), std::ptr::null());
        assert_eq!(r, N::NVRTC_SUCCESS);
        assert_eq!(nvrtcCompileProgram(prog, 0, std::ptr::null()), N::NVRTC_SUCCESS);
        let mut n = 0;
        assert_eq!(nvrtcGetPTXSize(prog, &mut n), N::NVRTC_SUCCESS);
        let mut ptx = vec![0u8; n];
        assert_eq!(nvrtcGetPTX(prog, ptx.as_mut_ptr().cast()), N::NVRTC_SUCCESS);
        let (mut m, mut f) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok(cuModuleLoadData(&mut m, ptx.as_ptr().cast()));
        ok(cuModuleGetFunction(&mut f, m, c"copy".as_ptr()));
        f
    }
}

fn launch_copy(f: cudarc::driver::sys::CUfunction, s: CUdeviceptr, d: CUdeviceptr, n: u64) -> R {
    let (mut s, mut d, mut n) = (s, d, n);
    let mut params: [*mut c_void; 3] =
        [(&mut s as *mut u64).cast(), (&mut d as *mut u64).cast(), (&mut n as *mut u64).cast()];
    // SAFETY: three parameters as the kernel declares them.
    let r = unsafe {
        cuLaunchKernel(f, 4, 1, 1, 128, 1, 1, 0, std::ptr::null_mut(), params.as_mut_ptr(), std::ptr::null_mut())
    };
    if r == OK {
        // SAFETY: no arguments; the caller's context is current.
        unsafe { cuCtxSynchronize() }
    } else {
        r
    }
}

/// Kernels read and write across adjacent mappings of a reservation; a mapping without
/// access (or written with read-only access) faults the launch.
#[test]
fn kernels_cross_mappings_and_fault_without_access() {
    let t = "kernels_cross_mappings_and_fault_without_access";
    if is_child(t) {
        let _c = Ctx::new(0);
        let f = kernel();
        let (va, _) = two_chunks(1);
        let ro = std::env::var("SIMGPU_READONLY").is_ok();
        ok(access(va, G, 0, 3));
        ok(access(va + G as u64, G, 0, if ro { 1 } else { 0 }));
        let n = 8192u64;
        let dst = alloc(n as usize);
        let r = if ro {
            launch_copy(f, dst, va + G as u64 - 4096, n)
        } else {
            launch_copy(f, va + G as u64 - 4096, dst, n)
        };
        assert_eq!(r, R::CUDA_ERROR_ILLEGAL_ADDRESS);
        return;
    }
    let _c = Ctx::new(0);
    let f = kernel();
    let (va, _) = two_chunks(1);
    ok(access(va, 2 * G, 0, 3));
    let data: Vec<u8> = (0..2 * G).map(|i| (i * 13 % 253) as u8).collect();
    htod(va, &data[..G]);
    htod(va + G as u64, &data[G..]);
    let n = 64 * 1024u64;
    let dst = alloc(n as usize);
    let at = va + G as u64 - 4096;
    ok(launch_copy(f, at, dst, n));
    assert_eq!(dtoh(dst, n as usize), data[G - 4096..G - 4096 + n as usize], "read across two mappings");
    assert_child_ok(&run_child(t, &[]));
    assert_child_ok(&run_child(t, &[("SIMGPU_READONLY", "1")]));
}

/// Memsets, stream writes and waits, and device-to-device copies work on a mapping with
/// access, as on any device memory.
#[test]
fn memsets_memory_operations_and_copies_work_on_mappings() {
    let _c = Ctx::new(0);
    let (va, _) = two_chunks(1);
    ok(access(va, 2 * G, 0, 3));
    let s = stream(0);
    let plain = alloc(4096);
    // SAFETY: every address lies in the mappings or `plain`, aligned as each call needs.
    unsafe {
        ok(cuMemsetD32_v2(va + G as u64, 0x0102_0304, 1024));
        ok(cuMemsetD8Async(va + 64, 0xab, 64, s));
        ok(cuStreamWriteValue32_v2(s, va + 8, 77, 0));
        ok(cuStreamWaitValue32_v2(s, va + 8, 77, 0));
        ok(cuMemcpyDtoDAsync_v2(plain, va + G as u64, 4096, s));
        ok(cuStreamSynchronize(s));
    }
    assert_eq!(dtoh(va + G as u64, 8), [4, 3, 2, 1, 4, 3, 2, 1]);
    assert_eq!(dtoh(va + 64, 64), vec![0xab; 64]);
    assert_eq!(dtoh(va + 8, 4), 77u32.to_ne_bytes());
    assert_eq!(dtoh(plain, 8), [4, 3, 2, 1, 4, 3, 2, 1], "copied from the mapping");
}
