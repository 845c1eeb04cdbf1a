//! Helpers shared by the integration tests. The simulator's state is process-global: every
//! test makes its own contexts and streams; tests that need another configuration (or must
//! crash) run in a child process: the test binary re-executed on that one test.
#![allow(dead_code, unused_imports)]

pub use cudarc::driver::sys::{CUcontext, CUdeviceptr, CUevent, CUresult, CUstream};
pub use ferroccl_simgpu::*;
use std::process::{Command, Output};

pub const OK: CUresult = CUresult::CUDA_SUCCESS;

/// Asserts CUDA_SUCCESS, showing the error name otherwise.
#[track_caller]
pub fn ok(r: CUresult) {
    assert_eq!(r, OK, "expected CUDA_SUCCESS");
}

/// No test of the simulator takes more than a few seconds; one that waits on a stream
/// forever is a bug, and cargo test has no time limit of its own, so the process ends.
const WATCHDOG: std::time::Duration = std::time::Duration::from_secs(120);

pub fn init() {
    static WATCH: std::sync::Once = std::sync::Once::new();
    WATCH.call_once(|| {
        std::thread::spawn(|| {
            std::thread::sleep(WATCHDOG);
            eprintln!("simgpu tests: still running after {WATCHDOG:?}: a stream wait never ended; aborting");
            std::process::abort();
        });
    });
    // SAFETY: no arguments to get wrong.
    ok(unsafe { cuInit(0) });
}

/// A new context on `dev`, current on the calling thread (destroyed on drop).
pub struct Ctx(pub CUcontext);

impl Ctx {
    pub fn new(dev: i32) -> Ctx {
        init();
        let mut c: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        ok(unsafe { cuCtxCreate_v2(&mut c, 0, dev) });
        Ctx(c)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // A failed test may leave a stream blocked forever; destroying the context would wait
        // for it, so the failure would become a hang.
        if !std::thread::panicking() {
            // SAFETY: a context this test created.
            unsafe { cuCtxDestroy_v2(self.0) };
        }
    }
}

pub fn alloc(n: usize) -> CUdeviceptr {
    let mut d = 0;
    // SAFETY: valid out-pointer.
    ok(unsafe { cuMemAlloc_v2(&mut d, n) });
    d
}

pub fn host_alloc(n: usize) -> *mut u8 {
    let mut p = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    ok(unsafe { cuMemHostAlloc(&mut p, n, 0) });
    p.cast()
}

pub fn stream(flags: u32) -> CUstream {
    let mut s: CUstream = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    ok(unsafe { cuStreamCreate(&mut s, flags) });
    s
}

pub fn htod(d: CUdeviceptr, data: &[u8]) {
    // SAFETY: `data` is readable for its length.
    ok(unsafe { cuMemcpyHtoD_v2(d, data.as_ptr().cast(), data.len()) });
}

pub fn dtoh(d: CUdeviceptr, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    // SAFETY: `v` is writable for n bytes.
    ok(unsafe { cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), d, n) });
    v
}

const CHILD_VAR: &str = "SIMGPU_TEST_CHILD";

/// True in the child process started by [`run_child`] for `test`.
pub fn is_child(test: &str) -> bool {
    std::env::var(CHILD_VAR).as_deref() == Ok(test)
}

/// Re-runs this test binary on `test` alone, with `env` set, and returns what it did.
pub fn run_child(test: &str, env: &[(&str, &str)]) -> Output {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"]).env(CHILD_VAR, test);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run the child")
}

/// Asserts that a child run passed, showing its output otherwise.
#[track_caller]
pub fn assert_child_ok(out: &Output) {
    assert!(
        out.status.success(),
        "child failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Number of threads of this process.
pub fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").expect("procfs").count()
}

/// A CUDA_MEMCPY2D with every field set (host to host, nothing to copy): zeroing it would
/// give its enum fields invalid values.
pub fn copy2d() -> cudarc::driver::sys::CUDA_MEMCPY2D {
    use cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_HOST;
    cudarc::driver::sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: CU_MEMORYTYPE_HOST,
        srcHost: std::ptr::null(),
        srcDevice: 0,
        srcArray: std::ptr::null_mut(),
        srcPitch: 0,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: CU_MEMORYTYPE_HOST,
        dstHost: std::ptr::null_mut(),
        dstDevice: 0,
        dstArray: std::ptr::null_mut(),
        dstPitch: 0,
        WidthInBytes: 0,
        Height: 0,
    }
}
