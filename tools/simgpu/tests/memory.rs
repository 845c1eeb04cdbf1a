//! Device, pinned, registered and managed memory; bounds-checked copies and memsets;
//! pointer attributes.

mod common;
use common::*;
use cudarc::driver::sys::CUpointer_attribute as P;
use std::ffi::c_void;
use std::os::unix::process::ExitStatusExt;

const INVALID: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;

#[test]
fn host_access_to_device_memory_faults() {
    let t = "host_access_to_device_memory_faults";
    if is_child(t) {
        let _c = Ctx::new(0);
        let d = alloc(4096);
        eprintln!("reading device address {d:#x} from the host");
        // SAFETY: none: this must fault, as on a GPU (the parent checks the signal).
        let v = unsafe { std::ptr::read_volatile(d as *const u8) };
        eprintln!("read {v}: device memory was readable");
        std::process::exit(0);
    }
    let out = run_child(t, &[]);
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
}

#[test]
fn copies_and_memsets_must_stay_inside_one_live_allocation() {
    let _c = Ctx::new(0);
    let d = alloc(1024);
    let other = alloc(1024);
    let buf = vec![1u8; 4096];
    let mut back = vec![0u8; 4096];
    // SAFETY: host buffers are valid for the lengths passed; device ranges are what is tested.
    unsafe {
        let src = buf.as_ptr().cast::<c_void>();
        let dst = back.as_mut_ptr().cast::<c_void>();
        ok(cuMemcpyHtoD_v2(d, src, 1024));
        assert_eq!(cuMemcpyHtoD_v2(d, src, 1025), INVALID, "crosses the end");
        assert_eq!(cuMemcpyHtoD_v2(d + 1000, src, 25), INVALID);
        assert_eq!(cuMemcpyHtoD_v2(d + 1024, src, 1), INVALID, "in the gap after it");
        assert_eq!(cuMemcpyDtoH_v2(dst, d + 1, 1024), INVALID);
        assert_eq!(cuMemcpyDtoD_v2(other, d, 1025), INVALID);
        assert_eq!(cuMemcpyDtoD_v2(other + 512, d, 513), INVALID);
        assert_eq!(cuMemsetD8_v2(d, 0, 1025), INVALID);
        assert_eq!(cuMemsetD32_v2(d + 1020, 0, 2), INVALID);
        assert_eq!(cuMemsetD32_v2(d + 2, 0, 1), INVALID, "misaligned");
        assert_eq!(cuMemcpyAsync(d, buf.as_ptr() as u64, 2000, std::ptr::null_mut()), INVALID);
        assert_eq!(cuMemcpyHtoD_v2(d, d as *const c_void, 16), INVALID, "a device pointer as host source");
        assert_eq!(cuMemcpyDtoH_v2(other as *mut c_void, d, 16), INVALID, "a device pointer as host destination");
        assert_eq!(cuMemcpyHtoD_v2(buf.as_ptr() as u64, src, 16), INVALID, "a host pointer as device destination");
        assert_eq!(cuMemcpyHtoD_v2(d, std::ptr::null(), 16), INVALID);
        ok(cuMemcpyHtoD_v2(d, src, 0));
        ok(cuMemcpyDtoH_v2(dst, d + 1024, 0));
        ok(cuMemcpyDtoH_v2(dst, d + 1000, 24));
        ok(cuMemFree_v2(other));
        assert_eq!(cuMemcpyHtoD_v2(other, src, 1), INVALID, "freed");
        assert_eq!(cuMemFree_v2(other), INVALID, "double free");
        assert_eq!(cuMemFree_v2(d + 16), INVALID, "interior pointer");
        assert_eq!(cuMemFree_v2(0x1234), INVALID, "unknown");
        // 2D: every row checked.
        let mut c = copy2d();
        c.srcMemoryType = cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_HOST;
        c.srcHost = src;
        c.srcPitch = 100;
        c.dstMemoryType = cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
        c.dstDevice = d;
        c.dstPitch = 256;
        c.WidthInBytes = 100;
        c.Height = 4;
        ok(cuMemcpy2D_v2(&c));
        c.Height = 5;
        assert_eq!(cuMemcpy2D_v2(&c), INVALID, "row 4 ends at 1124");
        c.Height = 4;
        c.dstY = 1;
        assert_eq!(cuMemcpy2D_v2(&c), INVALID);
        ok(cuMemFree_v2(d));
    }
}

#[test]
fn copies_move_the_right_bytes() {
    let _c = Ctx::new(1);
    let n = 1 << 20;
    let a = alloc(n);
    let b = alloc(n);
    let data: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
    htod(a, &data);
    // SAFETY: ranges inside the allocations; host buffers of the right sizes.
    unsafe {
        ok(cuMemcpyDtoD_v2(b, a, n));
        assert_eq!(dtoh(b, n), data);
        ok(cuMemcpy(b + 10, a, 100));
        let back = dtoh(b, 200);
        assert_eq!(&back[10..110], &data[..100]);
        ok(cuMemsetD8_v2(a, 0xab, 16));
        ok(cuMemsetD16_v2(a + 16, 0x1234, 8));
        ok(cuMemsetD32_v2(a + 32, 0xdead_beef, 4));
        let v = dtoh(a, 48);
        assert_eq!(&v[..16], &[0xab; 16]);
        assert_eq!(u16::from_ne_bytes([v[16], v[17]]), 0x1234);
        assert_eq!(u32::from_ne_bytes([v[44], v[45], v[46], v[47]]), 0xdead_beef);
        ok(cuMemsetD2D8_v2(a, 64, 0x11, 8, 3));
        let v = dtoh(a, 192);
        assert_eq!(&v[..8], &[0x11; 8]);
        assert_eq!(v[8], 0xab, "outside the rows: the earlier memset");
        assert_eq!(v[64 + 8], data[64 + 8]);
        assert_eq!(&v[128..136], &[0x11; 8]);
        // 2D device to host.
        let mut host = vec![0u8; 3 * 8];
        let mut c = copy2d();
        c.srcMemoryType = cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
        c.srcDevice = b;
        c.srcPitch = 64;
        c.srcXInBytes = 4;
        c.dstMemoryType = cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED;
        c.dstDevice = host.as_mut_ptr() as u64;
        c.dstPitch = 8;
        c.WidthInBytes = 8;
        c.Height = 3;
        ok(cuMemcpy2D_v2(&c));
        let full = dtoh(b, 192);
        for r in 0..3 {
            assert_eq!(&host[r * 8..r * 8 + 8], &full[r * 64 + 4..r * 64 + 12]);
        }
        ok(cuMemFree_v2(a));
        ok(cuMemFree_v2(b));
    }
}

unsafe fn attr_u64(a: P, p: u64) -> (CUresult, u64) {
    let mut v: u64 = 0xffff;
    // SAFETY: an 8-byte attribute into an 8-byte value.
    let r = unsafe { cuPointerGetAttribute((&mut v as *mut u64).cast(), a as i32, p) };
    (r, v)
}

unsafe fn attr_u32(a: P, p: u64) -> (CUresult, u32) {
    let mut v: u32 = 0xffff;
    // SAFETY: a 4-byte attribute into a 4-byte value.
    let r = unsafe { cuPointerGetAttribute((&mut v as *mut u32).cast(), a as i32, p) };
    (r, v)
}

#[test]
fn pointer_attributes_are_exact_for_interior_pointers() {
    let c = Ctx::new(1);
    let d = alloc(4096);
    let e = alloc(100);
    // SAFETY: attribute sizes as documented.
    unsafe {
        let p = d + 1000;
        assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p), (OK, d));
        assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_RANGE_SIZE, p), (OK, 4096));
        assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_CONTEXT, p), (OK, c.0 as u64));
        assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_DEVICE_POINTER, p), (OK, p));
        assert_eq!(attr_u32(P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p), (OK, 2));
        assert_eq!(attr_u32(P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p), (OK, 1));
        assert_eq!(attr_u32(P::CU_POINTER_ATTRIBUTE_IS_MANAGED, p), (OK, 0));
        assert_eq!(attr_u32(P::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p), (OK, 1));
        assert_eq!(attr_u32(P::CU_POINTER_ATTRIBUTE_MAPPED, p), (OK, 1));
        assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_HOST_POINTER, p).0, INVALID);
        let id = attr_u64(P::CU_POINTER_ATTRIBUTE_BUFFER_ID, d).1;
        assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_BUFFER_ID, p), (OK, id));
        assert_ne!(attr_u64(P::CU_POINTER_ATTRIBUTE_BUFFER_ID, e).1, id);
        let (mut base, mut size) = (0, 0);
        ok(cuMemGetAddressRange_v2(&mut base, &mut size, d + 4095));
        assert_eq!((base, size), (d, 4096));
        assert_eq!(cuMemGetAddressRange_v2(&mut base, &mut size, d + 4096), CUresult::CUDA_ERROR_NOT_FOUND);
        // The plural form: every size right, defaults for unknown addresses.
        let (mut mtype, mut ctx, mut ord, mut start, mut host, mut managed) =
            (9u32, std::ptr::null_mut::<c_void>(), 9i32, 0u64, 1u64, 9u32);
        let mut attrs = [
            P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE as i32,
            P::CU_POINTER_ATTRIBUTE_CONTEXT as i32,
            P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as i32,
            P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR as i32,
            P::CU_POINTER_ATTRIBUTE_HOST_POINTER as i32,
            P::CU_POINTER_ATTRIBUTE_IS_MANAGED as i32,
        ];
        let mut data: [*mut c_void; 6] = [
            (&mut mtype as *mut u32).cast(),
            (&mut ctx as *mut *mut c_void).cast(),
            (&mut ord as *mut i32).cast(),
            (&mut start as *mut u64).cast(),
            (&mut host as *mut u64).cast(),
            (&mut managed as *mut u32).cast(),
        ];
        ok(cuPointerGetAttributes(6, attrs.as_mut_ptr(), data.as_mut_ptr(), p));
        assert_eq!((mtype, ctx as u64, ord, start, host, managed), (2, c.0 as u64, 1, d, 0, 0));
        let stack = 5u64;
        let unknown = &stack as *const u64 as u64;
        ok(cuPointerGetAttributes(6, attrs.as_mut_ptr(), data.as_mut_ptr(), unknown));
        assert_eq!((mtype, ctx as u64, ord, start, host, managed), (0, 0, -2, 0, 0, 0));
        assert_eq!(attr_u32(P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, unknown).0, INVALID);
        ok(cuMemFree_v2(d));
        ok(cuPointerGetAttributes(6, attrs.as_mut_ptr(), data.as_mut_ptr(), p));
        assert_eq!(mtype, 0, "freed memory is unknown");
        ok(cuMemFree_v2(e));
    }
}

#[test]
fn pinned_memory_is_never_page_aligned_and_has_host_attributes() {
    let c = Ctx::new(0);
    // SAFETY: attribute sizes as documented; host memory used within its size.
    unsafe {
        for n in [1, 100, 4096, 1 << 20] {
            let p = host_alloc(n);
            assert_ne!(p as usize % 4096, 0, "{n} bytes at {p:?}");
            assert_eq!(p as usize % 256, 0);
            std::ptr::write_bytes(p, 0x5a, n);
            let q = p as u64 + (n as u64 - 1);
            assert_eq!(attr_u32(P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q), (OK, 1));
            assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_HOST_POINTER, q), (OK, q));
            assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_DEVICE_POINTER, q), (OK, q));
            assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, q), (OK, p as u64));
            assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_RANGE_SIZE, q), (OK, n as u64));
            assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_CONTEXT, q), (OK, c.0 as u64));
            assert_eq!(attr_u32(P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, q), (OK, 0));
            let mut dp = 0;
            ok(cuMemHostGetDevicePointer_v2(&mut dp, q as *mut c_void, 0));
            assert_eq!(dp, q);
            ok(cuMemFreeHost(p.cast()));
            assert_eq!(cuMemFreeHost(p.cast()), INVALID);
        }
        let mut p = std::ptr::null_mut();
        ok(cuMemHostAlloc(&mut p, 64, 0x1 | 0x2));
        let mut flags = 0;
        ok(cuMemHostGetFlags(&mut flags, p.cast::<u8>().add(8).cast()));
        assert_eq!(flags, 3);
        assert_eq!(cuMemFreeHost(p.cast::<u8>().add(8).cast()), INVALID, "interior pointer");
        ok(cuMemFreeHost(p));
        assert_eq!(cuMemHostAlloc(&mut p, 64, 0x10), INVALID);
        ok(cuMemAllocHost_v2(&mut p, 10));
        assert_ne!(p as usize % 4096, 0);
        ok(cuMemFreeHost(p));
    }
}

#[test]
fn host_registration_tracks_ranges() {
    let _c = Ctx::new(0);
    let mut buf = vec![0u8; 3 * 4096];
    let p = buf.as_mut_ptr();
    // SAFETY: ranges inside `buf`, or deliberately unmapped addresses the simulator only checks.
    unsafe {
        ok(cuMemHostRegister_v2(p.add(100).cast(), 5000, 0));
        assert_eq!(
            cuMemHostRegister_v2(p.add(5000).cast(), 10, 0),
            CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        );
        assert_eq!(cuMemHostRegister_v2(p.cast(), 101, 0), CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        ok(cuMemHostRegister_v2(p.add(5100).cast(), 10, 0));
        assert_eq!(attr_u32(P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p as u64 + 200), (OK, 1));
        assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p as u64 + 200), (OK, p as u64 + 100));
        assert_eq!(cuMemHostUnregister(p.add(101).cast()), CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
        ok(cuMemHostUnregister(p.add(100).cast()));
        assert_eq!(cuMemHostUnregister(p.add(100).cast()), CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
        ok(cuMemHostUnregister(p.add(5100).cast()));
        assert_eq!(cuMemHostRegister_v2(p.cast(), 0, 0), INVALID);
        assert_eq!(cuMemHostRegister_v2(0x1000 as *mut c_void, 4096, 0), INVALID, "unmapped");
        let d = alloc(4096);
        assert_eq!(cuMemHostRegister_v2(d as *mut c_void, 4096, 0), INVALID, "device memory");
        ok(cuMemFree_v2(d));
    }
}

#[test]
fn managed_memory_is_host_accessible() {
    let _c = Ctx::new(0);
    let mut m = 0;
    // SAFETY: managed memory is mapped for the host over its whole size.
    unsafe {
        ok(cuMemAllocManaged(&mut m, 1000, 1));
        let p = m as *mut u8;
        std::ptr::write_bytes(p, 9, 1000);
        assert_eq!(dtoh(m, 1000), vec![9; 1000]);
        htod(m + 10, &[1, 2, 3]);
        assert_eq!(std::slice::from_raw_parts(p.add(10), 3), &[1, 2, 3]);
        assert_eq!(attr_u32(P::CU_POINTER_ATTRIBUTE_IS_MANAGED, m + 999), (OK, 1));
        assert_eq!(attr_u32(P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, m + 999), (OK, 2));
        assert_eq!(attr_u64(P::CU_POINTER_ATTRIBUTE_HOST_POINTER, m + 999), (OK, m + 999));
        assert_eq!(attr_u32(P::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, m), (OK, 0));
        assert_eq!(cuMemAllocManaged(&mut m, 1000, 0), INVALID);
        ok(cuMemFree_v2(p as u64));
    }
}

#[test]
fn memory_is_accounted_per_device() {
    let t = "memory_is_accounted_per_device";
    if !is_child(t) {
        assert_child_ok(&run_child(t, &[("FERROCCL_SIM_MEM_MB", "1")]));
        return;
    }
    let _c = Ctx::new(0);
    // SAFETY: valid out-pointers.
    unsafe {
        let (mut free, mut total) = (0, 0);
        ok(cuMemGetInfo_v2(&mut free, &mut total));
        assert_eq!((free, total), (1 << 20, 1 << 20));
        let mut d = 0;
        assert_eq!(cuMemAlloc_v2(&mut d, (1 << 20) + 1), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        ok(cuMemAlloc_v2(&mut d, 600 << 10));
        assert_eq!(cuMemAlloc_v2(&mut d, 600 << 10), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        ok(cuMemGetInfo_v2(&mut free, &mut total));
        assert_eq!(free, 424 << 10);
        assert_eq!(cuMemAlloc_v2(&mut d, 0), INVALID);
    }
}

#[test]
fn stream_ordered_allocation() {
    let _c = Ctx::new(0);
    let s = stream(0);
    let mut host = vec![0u8; 256];
    // SAFETY: valid pointers; `host` outlives the synchronisation below.
    unsafe {
        let mut d = 0;
        ok(cuMemAllocAsync(&mut d, 256, s));
        ok(cuMemsetD8Async(d, 0x42, 256, s));
        ok(cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), d, 256, s));
        ok(cuMemFreeAsync(d, s));
        assert_eq!(cuMemsetD8Async(d, 0, 1, s), INVALID, "freed once cuMemFreeAsync returned");
        assert_eq!(cuMemFreeAsync(d, s), INVALID);
        ok(cuStreamSynchronize(s));
        assert_eq!(host, vec![0x42; 256]);
        let mut pool = std::ptr::null_mut();
        ok(cuDeviceGetDefaultMemPool(&mut pool, 0));
        ok(cuMemAllocFromPoolAsync(&mut d, 64, pool, s));
        let mut ptr_pool: *mut c_void = std::ptr::null_mut();
        ok(cuPointerGetAttribute(
            (&mut ptr_pool as *mut *mut c_void).cast(),
            P::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE as i32,
            d,
        ));
        assert_eq!(ptr_pool, pool);
        let mut h = std::mem::zeroed();
        assert_eq!(cuIpcGetMemHandle(&mut h, d), INVALID, "stream-ordered memory cannot be exported");
        ok(cuMemFree_v2(d));
        ok(cuStreamDestroy_v2(s));
    }
}
