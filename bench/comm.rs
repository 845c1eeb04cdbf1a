//! The benchmark's use of the C API: communicator, memory and the small collectives
//! it runs outside the timed loops (agreeing on times, wrong counts, rank facts).

use ferroccl::ffi::*;
use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::ptr;

/// Exit status for a failed library call or output file.
pub const EXIT_RUNTIME: i32 = 3;
/// Exit status for bad arguments or a memory kind that is not available.
pub const EXIT_USAGE: i32 = 2;

/// Bytes of each name (backend, algorithm) in [`Comm::last_paths`]'s allgather, NUL included.
const PATH_NAME: usize = 24;

/// A failure that ends the run with `exit`.
#[derive(Debug)]
pub struct Fail {
    pub exit: i32,
    pub msg: String,
}

impl Fail {
    pub fn usage(msg: impl Into<String>) -> Fail {
        Fail { exit: EXIT_USAGE, msg: msg.into() }
    }
    pub fn runtime(msg: impl Into<String>) -> Fail {
        Fail { exit: EXIT_RUNTIME, msg: msg.into() }
    }
}

fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the library returns NUL-terminated strings that stay valid until the next call on this thread.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Turns a fcclResult_t into a `Fail` naming the call, the result and the library's message.
pub fn check(r: fcclResult_t, what: &str) -> Result<(), Fail> {
    if r == fcclSuccess {
        return Ok(());
    }
    let name = cstr(fcclGetErrorString(r));
    let last = cstr(fcclGetLastError(ptr::null_mut()));
    Err(Fail {
        exit: if r == fcclUnavailable { EXIT_USAGE } else { EXIT_RUNTIME },
        msg: format!(
            "{what} failed: {name} ({r}){}",
            if last.is_empty() { String::new() } else { format!(": {last}") }
        ),
    })
}

/// Library version code (MAJOR*10000 + MINOR*100 + PATCH).
pub fn version() -> i32 {
    let mut v: c_int = 0;
    // SAFETY: valid out pointer.
    let _ = unsafe { fcclGetVersion(as_out(&mut v)) };
    v
}

pub fn version_string(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
}

/// Host memory from fcclMemAllocHost, or device memory from fcclMemAlloc; freed on drop.
pub struct Buf {
    pub ptr: *mut u8,
}

impl Buf {
    pub fn host(bytes: usize) -> Result<Buf, Fail> {
        let mut p: *mut c_void = ptr::null_mut();
        // At least one page-sized allocation so pointers are never NULL.
        let n = bytes.max(64);
        // SAFETY: valid out pointer.
        check(unsafe { fcclMemAllocHost(as_out(&mut p), n) }, &format!("fcclMemAllocHost({n})"))?;
        // Touch every page now so page faults stay out of the timed loops.
        // SAFETY: the allocation is n bytes.
        unsafe { ptr::write_bytes(p as *mut u8, 0, n) };
        Ok(Buf { ptr: p as *mut u8 })
    }

    /// Device memory: fails with fcclUnavailable (exit 2) when CUDA is not present.
    pub fn device(bytes: usize) -> Result<Buf, Fail> {
        let mut p: *mut c_void = ptr::null_mut();
        let n = bytes.max(64);
        // SAFETY: valid out pointer.
        let r = unsafe { fcclMemAlloc(as_out(&mut p), n) };
        if r == fcclUnavailable {
            let last = cstr(fcclGetLastError(ptr::null_mut()));
            return Err(Fail::usage(format!("--mem cuda: CUDA not available ({last})")));
        }
        check(r, &format!("fcclMemAlloc({n})"))?;
        Ok(Buf { ptr: p as *mut u8 })
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated by fcclMemAllocHost/fcclMemAlloc, freed once.
        let _ = unsafe { fcclMemFree(self.ptr as *mut c_void) };
    }
}

/// `--mem cuda`: makes this rank's device current, as a CUDA program does before it
/// creates a communicator (cudaSetDevice), so the communicator knows its device and
/// the benchmark's own copies and stream waits have a context. Rank r takes device
/// r mod the visible devices (its local rank where the launcher gives one), so ranks
/// share GPUs only when there are fewer GPUs than ranks (CUDA_VISIBLE_DEVICES=0 puts
/// every rank on one). Returns the device.
pub fn select_device() -> Result<i32, Fail> {
    use ferroccl::mem::cuda;
    let n = cuda_available()?;
    let rank = ["FERROCCL_LOCAL_RANK", "LOCAL_RANK", "FERROCCL_RANK", "RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok().and_then(|s| s.trim().parse::<usize>().ok()))
        .unwrap_or(0);
    let dev = (rank % n) as i32;
    let ctx = cuda::primary_context(dev).map_err(|e| Fail::runtime(format!("--mem cuda: device {dev}: {}", e.msg)))?;
    cuda::set_current(ctx).map_err(|e| Fail::runtime(format!("--mem cuda: device {dev}: {}", e.msg)))?;
    Ok(dev)
}

/// The number of visible CUDA devices, or exit 2 with the reason there is none
/// (without creating a context: the launcher of `--nranks` checks this too).
pub fn cuda_available() -> Result<usize, Fail> {
    use ferroccl::mem::cuda;
    cuda::driver().map_err(|e| Fail::usage(format!("--mem cuda: {}", e.msg)))?;
    match cuda::device_count() {
        0 => Err(Fail::usage("--mem cuda: CUDA sees no device")),
        n => Ok(n),
    }
}

/// The device the communicator was created on (-1: host memory).
pub fn comm_device(c: &Comm) -> i32 {
    let mut d: c_int = -1;
    // SAFETY: live communicator; valid out pointer.
    let _ = unsafe { fcclCommCuDevice(c.raw, as_out(&mut d)) };
    d
}

/// This process's rank of the benchmark's communicator.
pub struct Comm {
    pub raw: fcclComm_t,
    pub rank: usize,
    pub nranks: usize,
}

impl Comm {
    /// Joins an external launch (FERROCCL_RANK or torchrun's RANK set), or makes a
    /// communicator of one rank.
    pub fn init() -> Result<Comm, Fail> {
        let mut c: fcclComm_t = ptr::null_mut();
        let launched = ["FERROCCL_RANK", "RANK"].iter().any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()));
        if launched {
            // SAFETY: valid out pointer.
            check(unsafe { fcclCommInitFromEnv(as_out(&mut c)) }, "fcclCommInitFromEnv")?;
        } else {
            let mut id = fcclUniqueId { internal: [0; FCCL_UNIQUE_ID_BYTES] };
            // SAFETY: valid out pointers; the id is used unchanged.
            check(unsafe { fcclGetUniqueId(as_out(&mut id)) }, "fcclGetUniqueId")?;
            // SAFETY: a valid out pointer and the id just made.
            check(unsafe { fcclCommInitRank(as_out(&mut c), 1, id, 0) }, "fcclCommInitRank")?;
        }
        let (mut rank, mut n): (c_int, c_int) = (0, 0);
        // SAFETY: c is a live communicator; valid out pointers.
        check(unsafe { fcclCommUserRank(c, as_out(&mut rank)) }, "fcclCommUserRank")?;
        // SAFETY: as above.
        check(unsafe { fcclCommCount(c, as_out(&mut n)) }, "fcclCommCount")?;
        Ok(Comm { raw: c, rank: rank as usize, nranks: n as usize })
    }

    pub fn barrier(&self) -> Result<(), Fail> {
        // SAFETY: live communicator.
        check(unsafe { fcclBarrier(self.raw, ptr::null_mut()) }, "fcclBarrier")
    }

    fn allreduce_in_place<T>(&self, v: &mut [T], ty: fcclDataType_t, op: fcclRedOp_t, what: &str) -> Result<(), Fail> {
        let p = v.as_mut_ptr() as *mut c_void;
        // SAFETY: v is a valid buffer of v.len() elements of the named type.
        check(unsafe { fcclAllReduce(p, p, v.len(), ty, op, self.raw, ptr::null_mut()) }, what)
    }

    pub fn allreduce_f64(&self, v: f64, op: fcclRedOp_t) -> Result<f64, Fail> {
        let mut b = [v];
        self.allreduce_in_place(&mut b, fcclFloat64, op, "fcclAllReduce (benchmark bookkeeping)")?;
        Ok(b[0])
    }

    pub fn allreduce_u64(&self, v: u64, op: fcclRedOp_t) -> Result<u64, Fail> {
        let mut b = [v];
        self.allreduce_in_place(&mut b, fcclUint64, op, "fcclAllReduce (benchmark bookkeeping)")?;
        Ok(b[0])
    }

    /// What served the last call on this communicator, as every rank saw it: each rank's
    /// (backend, algorithm) from fcclCommGetLastPath, in rank order. Reads this rank's
    /// before the allgather that shares it (the allgather becomes the last call).
    pub fn last_paths(&self) -> Result<Vec<(String, String)>, Fail> {
        let (mut b, mut a) = (ptr::null(), ptr::null());
        // SAFETY: live communicator; valid out pointers (the library writes static strings).
        check(unsafe { fcclCommGetLastPath(self.raw, as_out(&mut b), as_out(&mut a)) }, "fcclCommGetLastPath")?;
        let (backend, algorithm) = (cstr(b), cstr(a));
        // Fixed-width fields: names the library adds later travel unchanged.
        let mut mine = [0u8; 2 * PATH_NAME];
        for (i, s) in [&backend, &algorithm].into_iter().enumerate() {
            let s = &s.as_bytes()[..s.len().min(PATH_NAME - 1)];
            mine[i * PATH_NAME..i * PATH_NAME + s.len()].copy_from_slice(s);
        }
        let all = self.allgather_bytes(&mine)?;
        let field = |f: &[u8]| {
            let end = f.iter().position(|&c| c == 0).unwrap_or(f.len());
            String::from_utf8_lossy(&f[..end]).into_owned()
        };
        Ok(all.chunks(2 * PATH_NAME).map(|c| (field(&c[..PATH_NAME]), field(&c[PATH_NAME..]))).collect())
    }

    /// Every rank's `mine` (same length on every rank), in rank order.
    pub fn allgather_bytes(&self, mine: &[u8]) -> Result<Vec<u8>, Fail> {
        let mut out = vec![0u8; mine.len() * self.nranks];
        check(
            // SAFETY: buffers of the sizes the call implies.
            unsafe {
                fcclAllGather(
                    mine.as_ptr() as *const c_void,
                    out.as_mut_ptr() as *mut c_void,
                    mine.len(),
                    fcclUint8,
                    self.raw,
                    ptr::null_mut(),
                )
            },
            "fcclAllGather (benchmark bookkeeping)",
        )?;
        Ok(out)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: live communicator, destroyed once.
        let _ = unsafe { fcclCommDestroy(self.raw) };
    }
}
