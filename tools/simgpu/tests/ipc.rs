//! CUDA IPC between processes: memory and event handles. Children are this test binary
//! re-executed on one test, with the handles in the environment.

mod common;
use common::*;
use cudarc::driver::sys::{CUipcEventHandle, CUipcMemHandle, CUpointer_attribute as P};
use std::ffi::c_char;
use std::process::{Child, Command, Stdio};

fn hex(b: &[c_char; 64]) -> String {
    b.iter().map(|&c| format!("{:02x}", c as u8)).collect()
}

fn unhex(s: &str) -> [c_char; 64] {
    let mut out = [0 as c_char; 64];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap() as c_char;
    }
    out
}

fn mem_handle(d: CUdeviceptr) -> CUipcMemHandle {
    let mut h = CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: valid out-pointer.
    ok(unsafe { cuIpcGetMemHandle(&mut h, d) });
    h
}

fn env_handle(name: &str) -> CUipcMemHandle {
    CUipcMemHandle { reserved: unhex(&std::env::var(name).unwrap()) }
}

fn spawn(test: &str, env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"]).env("SIMGPU_TEST_CHILD", test);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

#[track_caller]
fn wait_ok(c: Child) {
    assert_child_ok(&c.wait_with_output().unwrap());
}

#[test]
fn a_child_opens_the_parents_memory_and_writes_through_it() {
    let t = "a_child_opens_the_parents_memory_and_writes_through_it";
    if is_child(t) {
        let _c = Ctx::new(0);
        let h = env_handle("SIMGPU_HANDLE");
        // SAFETY: valid pointers; the opened range is 4096 bytes.
        unsafe {
            let (mut d, mut again) = (0, 0);
            ok(cuIpcOpenMemHandle_v2(&mut d, h, 1));
            ok(cuIpcOpenMemHandle_v2(&mut again, h, 0));
            assert_eq!(d, again, "opened again in the same context: same address");
            assert_eq!(dtoh(d, 4096), (0..4096).map(|i| i as u8).collect::<Vec<_>>());
            let (mut base, mut size) = (0, 0);
            ok(cuMemGetAddressRange_v2(&mut base, &mut size, d + 100));
            assert_eq!((base, size), (d, 4096));
            let mut mtype = 0u32;
            ok(cuPointerGetAttribute(
                (&mut mtype as *mut u32).cast(),
                P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE as i32,
                d + 5,
            ));
            assert_eq!(mtype, 2);
            assert_eq!(cuMemFree_v2(d), CUresult::CUDA_ERROR_INVALID_VALUE, "opened memory is closed, not freed");
            ok(cuMemsetD8_v2(d, 0x77, 1024));
            // Releases the parent's stream, which waits on this word.
            ok(cuStreamWriteValue32_v2(std::ptr::null_mut(), d + 2048, 1, 0));
            ok(cuCtxSynchronize());
            ok(cuIpcCloseMemHandle(d));
            assert_eq!(dtoh(d, 4)[0], 0x77, "still open once");
            ok(cuIpcCloseMemHandle(d));
            assert_eq!(cuIpcCloseMemHandle(d), CUresult::CUDA_ERROR_INVALID_VALUE);
            let mut x = 0u8;
            assert_eq!(cuMemcpyDtoH_v2((&mut x as *mut u8).cast(), d, 1), CUresult::CUDA_ERROR_INVALID_VALUE, "closed");
        }
        return;
    }
    let _c = Ctx::new(0);
    let d = alloc(4096);
    htod(d, &(0..4096).map(|i| i as u8).collect::<Vec<_>>());
    let h = mem_handle(d);
    let s = stream(1);
    // SAFETY: device addresses of the test.
    unsafe {
        ok(cuStreamWaitValue32_v2(s, d + 2048, 1, 1));
        let mut own = 0;
        assert_eq!(
            cuIpcOpenMemHandle_v2(&mut own, h, 0),
            CUresult::CUDA_ERROR_INVALID_CONTEXT,
            "in the exporting process"
        );
        wait_ok(spawn(t, &[("SIMGPU_HANDLE", hex(&h.reserved))]));
        ok(cuStreamSynchronize(s));
        let v = dtoh(d, 4096);
        assert_eq!(&v[..1024], &[0x77; 1024][..]);
        assert_eq!(v[1024], 0);
        ok(cuMemFree_v2(d));
        ok(cuStreamDestroy_v2(s));
    }
}

/// Where the flags of several_processes_... live: apart from the data each child writes
/// at 256 * rank, so one child's data never overwrites another's flag.
const SLOTS: u64 = 2048;

#[test]
fn several_processes_write_their_slots_and_the_parent_waits_for_each() {
    let t = "several_processes_write_their_slots_and_the_parent_waits_for_each";
    if is_child(t) {
        let rank: u64 = std::env::var("SIMGPU_RANK").unwrap().parse().unwrap();
        let _c = Ctx::new(0);
        let mut d = 0;
        // SAFETY: valid pointers; slots lie inside the 4096 opened bytes.
        unsafe {
            ok(cuIpcOpenMemHandle_v2(&mut d, env_handle("SIMGPU_HANDLE"), 0));
            ok(cuMemsetD32_v2(d + 256 * rank, 100 + rank as u32, 16));
            ok(cuStreamWriteValue64_v2(std::ptr::null_mut(), d + SLOTS + 8 * rank, rank + 1, 0));
            ok(cuCtxSynchronize());
        }
        return;
    }
    let _c = Ctx::new(0);
    let d = alloc(4096);
    // SAFETY: device addresses of the test.
    unsafe {
        ok(cuMemsetD8_v2(d, 0, 4096));
        ok(cuCtxSynchronize());
        let h = hex(&mem_handle(d).reserved);
        let s = stream(1);
        for r in 0..3u64 {
            ok(cuStreamWaitValue64_v2(s, d + SLOTS + 8 * r, r + 1, 1));
        }
        let children: Vec<Child> =
            (0..3).map(|r| spawn(t, &[("SIMGPU_HANDLE", h.clone()), ("SIMGPU_RANK", r.to_string())])).collect();
        for c in children {
            wait_ok(c);
        }
        ok(cuStreamSynchronize(s));
        let v = dtoh(d, 1024);
        for r in 0..3usize {
            let w = u32::from_ne_bytes(v[256 * r + 60..256 * r + 64].try_into().unwrap());
            assert_eq!(w, 100 + r as u32);
        }
        ok(cuMemFree_v2(d));
    }
}

#[test]
fn handles_of_freed_memory_and_bad_exports_are_refused() {
    let t = "handles_of_freed_memory_and_bad_exports_are_refused";
    if is_child(t) {
        let _c = Ctx::new(0);
        let mut d = 0;
        // SAFETY: valid pointers.
        unsafe {
            let r = cuIpcOpenMemHandle_v2(&mut d, env_handle("SIMGPU_HANDLE"), 0);
            assert_eq!(r, CUresult::CUDA_ERROR_INVALID_HANDLE);
            let garbage = CUipcMemHandle { reserved: [3; 64] };
            assert_eq!(cuIpcOpenMemHandle_v2(&mut d, garbage, 0), CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        return;
    }
    let _c = Ctx::new(0);
    let d = alloc(4096);
    let h = mem_handle(d);
    // SAFETY: valid pointers.
    unsafe {
        ok(cuMemFree_v2(d));
        let mut x = CUipcMemHandle { reserved: [0; 64] };
        let keep = alloc(64);
        assert_eq!(cuIpcGetMemHandle(&mut x, keep + 8), CUresult::CUDA_ERROR_INVALID_VALUE, "interior pointer");
        assert_eq!(cuIpcGetMemHandle(&mut x, d), CUresult::CUDA_ERROR_INVALID_VALUE, "freed");
        let mut m = 0;
        ok(cuMemAllocManaged(&mut m, 64, 1));
        assert_eq!(cuIpcGetMemHandle(&mut x, m), CUresult::CUDA_ERROR_INVALID_VALUE, "managed");
        let p = host_alloc(64);
        assert_eq!(cuIpcGetMemHandle(&mut x, p as u64), CUresult::CUDA_ERROR_INVALID_VALUE, "pinned host");
        wait_ok(spawn(t, &[("SIMGPU_HANDLE", hex(&h.reserved))]));
        ok(cuMemFree_v2(keep));
        ok(cuMemFree_v2(m));
        ok(cuMemFreeHost(p.cast()));
    }
}

#[test]
fn interprocess_events_are_shared() {
    let t = "interprocess_events_are_shared";
    if is_child(t) {
        let _c = Ctx::new(0);
        // SAFETY: valid pointers; the opened range is 64 bytes.
        unsafe {
            let mut d = 0;
            ok(cuIpcOpenMemHandle_v2(&mut d, env_handle("SIMGPU_HANDLE"), 0));
            let eh = CUipcEventHandle { reserved: unhex(&std::env::var("SIMGPU_EVENT").unwrap()) };
            let mut ev = std::ptr::null_mut();
            ok(cuIpcOpenEventHandle(&mut ev, eh));
            assert_eq!(cuEventQuery(ev), CUresult::CUDA_ERROR_NOT_READY, "the parent's record is pending");
            let s = stream(1);
            ok(cuStreamWaitEvent(s, ev, 0));
            ok(cuStreamWriteValue32_v2(s, d + 4, 2, 0));
            ok(cuStreamWriteValue32_v2(std::ptr::null_mut(), d, 1, 0));
            ok(cuEventSynchronize(ev));
            ok(cuStreamSynchronize(s));
            ok(cuEventQuery(ev));
        }
        return;
    }
    let _c = Ctx::new(0);
    let d = alloc(64);
    // SAFETY: valid pointers; device addresses of the test.
    unsafe {
        ok(cuMemsetD8_v2(d, 0, 64));
        let s = stream(1);
        let mut ev = std::ptr::null_mut();
        ok(cuEventCreate(&mut ev, 2 | 4));
        let mut eh = CUipcEventHandle { reserved: [0; 64] };
        ok(cuIpcGetEventHandle(&mut eh, ev));
        let mut timed = std::ptr::null_mut();
        ok(cuEventCreate(&mut timed, 0));
        assert_eq!(cuIpcGetEventHandle(&mut eh.clone(), timed), CUresult::CUDA_ERROR_INVALID_VALUE);
        // The record waits until the child has seen it pending (the child writes d[0] = 1).
        ok(cuStreamWaitValue32_v2(s, d, 1, 1));
        ok(cuEventRecord(ev, s));
        let child = spawn(t, &[("SIMGPU_HANDLE", hex(&mem_handle(d).reserved)), ("SIMGPU_EVENT", hex(&eh.reserved))]);
        wait_ok(child);
        ok(cuEventSynchronize(ev));
        let v = dtoh(d, 8);
        assert_eq!(u32::from_ne_bytes(v[4..8].try_into().unwrap()), 2, "the child's stream waited for our record");
        ok(cuMemFree_v2(d));
    }
}
