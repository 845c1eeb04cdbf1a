//! NCCL 2.28's C ABI on ferroccl: built as libferroccl_nccl.so with SONAME
//! libnccl.so.2, so NCCL programs link it (`-lnccl`) and NCCL binaries load it
//! (LD_PRELOAD or LD_LIBRARY_PATH) in place of NVIDIA's library.
//!
//! Each function converts its arguments and calls ferroccl's C functions (the same
//! code as libferroccl.so, linked in); ncclComm_t handles are ferroccl communicators.
//! Functions without a ferroccl meaning return ncclInvalidUsage with a message for
//! ncclGetLastError. Results are NCCL 2.28's codes: ferroccl's own are mapped
//! ([`nccl_code`]). Every function also has its `pnccl*` name, as NCCL's library has.
//! build.rs keeps everything else (ferroccl's `fccl*` names) out of the export table.
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]
// The safety contract of every exported function is NCCL's C API: pointers are NULL
// (checked where NCCL checks) or valid for the sizes the arguments imply.
#![allow(clippy::missing_safety_doc)]

use ferroccl::ffi::{self as f, boundary, fcclComm_t, fcclConfig_t, fcclResult_t, fcclStream_t, fcclUniqueId};
use std::ffi::{c_void, CStr};
use std::mem::MaybeUninit;
use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// NCCL's result code.
pub type ncclResult_t = c_int;
/// A communicator: the object behind it is a ferroccl communicator.
pub type ncclComm_t = fcclComm_t;
/// NCCL's element type (its values, see [`dtype`]).
pub type ncclDataType_t = c_int;
/// NCCL's reduction operator (its values, see [`redop`]).
pub type ncclRedOp_t = c_int;
/// CUDA's stream, the same type as ferroccl's.
pub type cudaStream_t = fcclStream_t;
/// NCCL's unique id: 128 opaque bytes, the layout of ferroccl's.
pub type ncclUniqueId = fcclUniqueId;
/// NCCL's memory-window handle (ncclCommWindowRegister).
pub type ncclWindow_t = *mut c_void;

pub const ncclSuccess: ncclResult_t = 0;
pub const ncclUnhandledCudaError: ncclResult_t = 1;
pub const ncclSystemError: ncclResult_t = 2;
pub const ncclInternalError: ncclResult_t = 3;
pub const ncclInvalidArgument: ncclResult_t = 4;
pub const ncclInvalidUsage: ncclResult_t = 5;
pub const ncclRemoteError: ncclResult_t = 6;
pub const ncclInProgress: ncclResult_t = 7;
/// NCCL 2.28's ncclNumResults: codes from here up are not NCCL 2.28's.
pub const ncclNumResults: ncclResult_t = 8;

/// The NCCL version this library's ABI is (ncclGetVersion): 2.28.9.
pub const NCCL_VERSION_CODE: c_int = 22809;
/// ncclConfig_t.magic as NCCL_CONFIG_INITIALIZER sets it.
pub const NCCL_API_MAGIC: u32 = 0xcafe_beef;
/// ncclCommWindowRegister's flags (NCCL_WIN_DEFAULT, NCCL_WIN_COLL_SYMMETRIC).
const NCCL_WIN_FLAGS: c_int = 0x01;

/// The marker by which ferroccl's NCCL backend recognises (and skips) this library
/// when it looks for the real libnccl.so.2.
#[no_mangle]
pub static ferroccl_nccl_shim: [u8; 9] = *b"ferroccl\0";

/// NCCL 2.28's ncclConfig_t (`struct ncclConfig_v22800`), field for field.
#[repr(C)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
}

/// NCCL's ncclSimInfo_t (ncclGroupSimulateEnd); only passed through.
#[repr(C)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub estimatedTime: f32,
}

/// The device API's team (`struct ncclTeam`), returned by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ncclTeam_t {
    pub nRanks: c_int,
    pub rank: c_int,
    pub stride: c_int,
}

// ---------------------------------------------------------------- the boundary

/// ferroccl's result as NCCL 2.28's: its own codes become the nearest NCCL code
/// (the message keeps the exact cause).
pub fn nccl_code(r: fcclResult_t) -> ncclResult_t {
    match r {
        0..=7 => r,
        f::fcclTimeout => ncclRemoteError,
        f::fcclCollectiveMismatch => ncclInvalidUsage,
        f::fcclUnavailable => ncclUnhandledCudaError,
        _ => ncclInternalError,
    }
}

fn code_name(r: c_int) -> &'static str {
    match r {
        f::fcclTimeout => "fcclTimeout",
        f::fcclCollectiveMismatch => "fcclCollectiveMismatch",
        f::fcclUnavailable => "fcclUnavailable",
        ncclUnhandledCudaError => "ncclUnhandledCudaError",
        ncclRemoteError => "ncclRemoteError",
        ncclInvalidUsage => "ncclInvalidUsage",
        _ => "ncclInternalError",
    }
}

fn last_error() -> String {
    // SAFETY: the pointer is this thread's NUL-terminated message, alive until its next failing call.
    unsafe { CStr::from_ptr(boundary::last_error_ptr()) }.to_string_lossy().into_owned()
}

/// Sets `name`'s message and returns `code`.
fn fail(name: &str, code: ncclResult_t, msg: impl std::fmt::Display) -> ncclResult_t {
    boundary::set_last_error(format!("{name}: {msg}"));
    code
}

/// What a function without a ferroccl meaning returns: ncclInvalidUsage and why.
fn unsupported(name: &str, why: &str) -> ncclResult_t {
    fail(name, ncclInvalidUsage, format_args!("not supported by ferroccl's NCCL library: {why}"))
}

/// A ferroccl call's result as `name`'s: the message names the NCCL function, and
/// says so when the code had to be mapped. fcclInProgress (a non-blocking
/// communicator's call still running) is no error: it passes as ncclInProgress.
fn ret(name: &str, r: fcclResult_t) -> ncclResult_t {
    if r == f::fcclSuccess || r == f::fcclInProgress {
        return r;
    }
    let msg = last_error();
    let body = match msg.split_once(": ") {
        Some((call, rest)) if call.starts_with("fccl") => rest.to_string(),
        _ => msg,
    };
    renamed(name, &body, r)
}

/// Sets `name: body` as the last error, noting a code NCCL 2.28 lacks; returns NCCL's code.
fn renamed(name: &str, body: &str, r: fcclResult_t) -> ncclResult_t {
    let code = nccl_code(r);
    if code == r {
        boundary::set_last_error(format!("{name}: {body}"));
    } else {
        boundary::set_last_error(format!(
            "{name}: {body} (ferroccl's {}, reported as {}: NCCL 2.28 has no such code)",
            code_name(r),
            code_name(code)
        ));
    }
    code
}

/// Runs an exported function's body: NCCL's variables are honoured, and a panic
/// becomes ncclInternalError with a message instead of crossing into C.
fn guard(name: &str, body: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    ferroccl::env::enable_nccl_aliases();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            fail(
                name,
                ncclInternalError,
                format_args!("internal error ({what}); please report this to the ferroccl developers"),
            )
        }
    }
}

/// NCCL's element types as ferroccl's (the same numbers, listed so that a change on
/// either side is a compile-time decision); unknown values pass on for ferroccl to refuse.
pub fn dtype(d: ncclDataType_t) -> f::fcclDataType_t {
    match d {
        0 => f::fcclInt8,
        1 => f::fcclUint8,
        2 => f::fcclInt32,
        3 => f::fcclUint32,
        4 => f::fcclInt64,
        5 => f::fcclUint64,
        6 => f::fcclFloat16,
        7 => f::fcclFloat32,
        8 => f::fcclFloat64,
        9 => f::fcclBfloat16,
        10 => f::fcclFloat8e4m3,
        11 => f::fcclFloat8e5m2,
        other => other,
    }
}

/// NCCL's built-in operators as ferroccl's (as [`dtype`]); None for any other value,
/// so that ferroccl's own operators (the bitwise ones, 64 and up) are never reached.
pub fn redop(o: ncclRedOp_t) -> Option<f::fcclRedOp_t> {
    Some(match o {
        0 => f::fcclSum,
        1 => f::fcclProd,
        2 => f::fcclMax,
        3 => f::fcclMin,
        4 => f::fcclAvg,
        _ => return None,
    })
}

/// Runs `call` with `cfg` converted to ferroccl's config and maps its result; a config
/// NCCL would refuse fails here, naming `name`. NULL gives NCCL's defaults where `fresh`
/// (a new communicator), else stays NULL (a split inherits its parent's options).
///
/// # Safety
/// `cfg` is NULL or points to an ncclConfig_t of the size it states.
unsafe fn with_config(
    name: &str,
    cfg: *const ncclConfig_t,
    fresh: bool,
    call: impl FnOnce(*mut fcclConfig_t) -> fcclResult_t,
) -> ncclResult_t {
    // SAFETY: per the caller.
    let mut fc = match unsafe { config(name, cfg) } {
        Ok(c) => c.or_else(|| fresh.then(defaults)),
        Err(r) => return r,
    };
    ret(name, call(fc.as_mut().map_or(std::ptr::null_mut(), |c| c as *mut fcclConfig_t)))
}

/// ferroccl's defaults under NCCL's contract: calls are not agreed on the host before
/// they run (checkMode off: ranks sharing one GPU post their device calls, and a
/// mismatch fails the communicator, reported by ncclCommGetAsyncError, as NCCL's
/// asynchronous errors), unless FERROCCL_CHECK is set, which then decides.
fn defaults() -> fcclConfig_t {
    defaults_with(std::env::var_os("FERROCCL_CHECK").is_some_and(|v| !v.is_empty()))
}

/// [`defaults`], `set`: whether FERROCCL_CHECK is set (then the library reads it).
fn defaults_with(set: bool) -> fcclConfig_t {
    fcclConfig_t {
        size: std::mem::size_of::<fcclConfig_t>(),
        magic: f::FCCL_CONFIG_MAGIC,
        version: f::FCCL_CONFIG_VERSION,
        blocking: f::FCCL_CONFIG_UNDEF_INT,
        timeoutMs: f::FCCL_CONFIG_UNDEF_INT,
        backend: f::FCCL_CONFIG_UNDEF_INT,
        commName: std::ptr::null(),
        checkMode: if set { f::FCCL_CONFIG_UNDEF_INT } else { f::FCCL_CHECK_OFF },
    }
}

/// ncclConfig_t as fcclConfig_t: `blocking` and `commName` carry over, NCCL's GPU
/// kernel knobs have no meaning here, checkMode is [`defaults`]'. NULL stays NULL.
///
/// # Safety
/// `cfg` is NULL or points to at least `cfg->size` readable bytes of an ncclConfig_t.
unsafe fn config(name: &str, cfg: *const ncclConfig_t) -> Result<Option<fcclConfig_t>, ncclResult_t> {
    if cfg.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL; size and magic are the first fields of every ncclConfig_t version.
    let (size, magic) = unsafe { ((*cfg).size, (*cfg).magic) };
    if magic != NCCL_API_MAGIC {
        return Err(fail(
            name,
            ncclInvalidArgument,
            format_args!("config->magic is {magic:#x}, not {NCCL_API_MAGIC:#x}: initialise the ncclConfig_t with NCCL_CONFIG_INITIALIZER"),
        ));
    }
    let end_of = |off: usize, len: usize| size >= off + len;
    if !end_of(std::mem::offset_of!(ncclConfig_t, blocking), 4) {
        return Err(fail(
            name,
            ncclInvalidArgument,
            format_args!(
                "config->size is {size}, too small for an ncclConfig_t: initialise it with NCCL_CONFIG_INITIALIZER"
            ),
        ));
    }
    let mut out = defaults();
    // SAFETY: within `size` (checked).
    out.blocking = unsafe { (*cfg).blocking };
    if end_of(std::mem::offset_of!(ncclConfig_t, commName), std::mem::size_of::<*const c_char>()) {
        // SAFETY: within `size` (checked).
        out.commName = unsafe { (*cfg).commName };
    }
    Ok(Some(out))
}

/// `comm` is a live communicator (for the functions that only accept a handle).
fn check_comm(name: &str, comm: ncclComm_t) -> ncclResult_t {
    let mut n: c_int = 0;
    // SAFETY: n is a local int, which ferroccl writes whole if at all; it checks the handle.
    ret(name, unsafe { f::fcclCommCount(comm, f::as_out(&mut n)) })
}

/// Defines an exported NCCL function and its `pnccl*` alias (NCCL's profiling name).
macro_rules! nccl_api {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret $body

        const _: () = {
            /// NCCL's profiling name of the function of the same name without the `p`.
            #[export_name = concat!("p", stringify!($name))]
            pub unsafe extern "C" fn alias($($arg: $ty),*) -> $ret {
                // SAFETY: the same function, called with the caller's arguments.
                unsafe { $name($($arg),*) }
            }
        };
    };
}

// ---------------------------------------------------------------- memory

nccl_api! {
    /// fcclMemAlloc: CUDA device memory on the current device (an error without CUDA).
    fn ncclMemAlloc(ptr: Option<&mut MaybeUninit<*mut c_void>>, size: usize) -> ncclResult_t {
        // SAFETY: forwarded under the same contract.
        guard("ncclMemAlloc", || ret("ncclMemAlloc", unsafe { f::fcclMemAlloc(ptr, size) }))
    }
}

nccl_api! {
    /// fcclMemFree: frees ncclMemAlloc's memory; NULL is a no-op.
    fn ncclMemFree(ptr: *mut c_void) -> ncclResult_t {
        // SAFETY: forwarded under the same contract.
        guard("ncclMemFree", || ret("ncclMemFree", unsafe { f::fcclMemFree(ptr) }))
    }
}

// ---------------------------------------------------------------- communicators

nccl_api! {
    /// Writes 22809 (NCCL 2.28.9, the ABI this library provides) to `*version`.
    fn ncclGetVersion(version: Option<&mut MaybeUninit<c_int>>) -> ncclResult_t {
        guard("ncclGetVersion", || {
            let Some(version) = version else {
                return fail("ncclGetVersion", ncclInvalidArgument, "version is NULL; pass the address of an int");
            };
            version.write(NCCL_VERSION_CODE);
            ncclSuccess
        })
    }
}

nccl_api! {
    /// fcclGetUniqueId: the rendezvous point lives in the calling process until every rank joined.
    fn ncclGetUniqueId(uniqueId: Option<&mut MaybeUninit<ncclUniqueId>>) -> ncclResult_t {
        // SAFETY: forwarded under the same contract.
        guard("ncclGetUniqueId", || ret("ncclGetUniqueId", unsafe { f::fcclGetUniqueId(uniqueId) }))
    }
}

nccl_api! {
    /// fcclCommInitRankConfig with ncclConfig_t's `blocking` and `commName` (NULL: NCCL's
    /// defaults, see `defaults`).
    fn ncclCommInitRankConfig(
        comm: Option<&mut MaybeUninit<ncclComm_t>>,
        nranks: c_int,
        commId: ncclUniqueId,
        rank: c_int,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        let name = "ncclCommInitRankConfig";
        guard(name, || {
            // SAFETY: NULL or an ncclConfig_t (NCCL's contract); the call is forwarded under
            // the same contract with p NULL or a local config.
            unsafe { with_config(name, config, true, |p| f::fcclCommInitRankConfig(comm, nranks, commId, rank, p)) }
        })
    }
}

nccl_api! {
    /// fcclCommInitRankConfig with NCCL's defaults (see `defaults`).
    fn ncclCommInitRank(comm: Option<&mut MaybeUninit<ncclComm_t>>, nranks: c_int, commId: ncclUniqueId, rank: c_int) -> ncclResult_t {
        let name = "ncclCommInitRank";
        guard(name, || {
            // SAFETY: forwarded under the same contract, with a local config.
            unsafe { with_config(name, std::ptr::null(), true, |p| f::fcclCommInitRankConfig(comm, nranks, commId, rank, p)) }
        })
    }
}

nccl_api! {
    /// fcclCommInitAll: `ndev` ranks in this process; `devlist` NULL gives host-memory
    /// ranks (NCCL would take GPUs 0..ndev-1), a device list needs CUDA.
    fn ncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t {
        // SAFETY: forwarded under the same contract.
        guard("ncclCommInitAll", || ret("ncclCommInitAll", unsafe { f::fcclCommInitAll(comm, ndev, devlist) }))
    }
}

nccl_api! {
    /// NCCL's scalable init: every rank passes the same `nId` ids; ferroccl needs one
    /// rendezvous, the first id's.
    fn ncclCommInitRankScalable(
        newcomm: Option<&mut MaybeUninit<ncclComm_t>>,
        nranks: c_int,
        myrank: c_int,
        nId: c_int,
        commIds: *mut ncclUniqueId,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        let name = "ncclCommInitRankScalable";
        guard(name, || {
            if nId < 1 || commIds.is_null() {
                return fail(
                    name,
                    ncclInvalidArgument,
                    format_args!("nId is {nId} and commIds is {commIds:?}; pass at least one id from ncclGetUniqueId"),
                );
            }
            // SAFETY: commIds has nId >= 1 ids (NCCL's contract).
            let id = unsafe { *commIds };
            // SAFETY: NULL or an ncclConfig_t (NCCL's contract); the call is forwarded under
            // the same contract with p NULL or a local config.
            unsafe { with_config(name, config, true, |p| f::fcclCommInitRankConfig(newcomm, nranks, id, myrank, p)) }
        })
    }
}

nccl_api! {
    /// fcclCommFinalize.
    fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
        // SAFETY: ferroccl checks the handle.
        guard("ncclCommFinalize", || ret("ncclCommFinalize", unsafe { f::fcclCommFinalize(comm) }))
    }
}

nccl_api! {
    /// fcclCommDestroy.
    fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
        guard("ncclCommDestroy", || {
            // Before the handle goes: its address may be reused by the next communicator.
            forget_ops(comm);
            // SAFETY: ferroccl checks the handle.
            ret("ncclCommDestroy", unsafe { f::fcclCommDestroy(comm) })
        })
    }
}

nccl_api! {
    /// fcclCommAbort: callable from any thread; every blocked call on `comm` returns.
    fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
        guard("ncclCommAbort", || {
            // Before the handle goes: its address may be reused by the next communicator.
            forget_ops(comm);
            // SAFETY: ferroccl checks the handle.
            ret("ncclCommAbort", unsafe { f::fcclCommAbort(comm) })
        })
    }
}

nccl_api! {
    /// Not supported (ncclInvalidUsage): ferroccl cannot cancel a communicator's
    /// operations and keep it; ncclCommAbort ends them and the communicator.
    fn ncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t {
        let _ = (comm, revokeFlags);
        guard("ncclCommRevoke", || {
            unsupported("ncclCommRevoke", "a communicator's operations cannot be revoked while it stays usable; call ncclCommAbort, which returns every blocked call")
        })
    }
}

nccl_api! {
    /// fcclCommSplit; `config` NULL inherits the parent's options.
    fn ncclCommSplit(
        comm: ncclComm_t,
        color: c_int,
        key: c_int,
        newcomm: Option<&mut MaybeUninit<ncclComm_t>>,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        let name = "ncclCommSplit";
        guard(name, || {
            // SAFETY: NULL or an ncclConfig_t (NCCL's contract); the call is forwarded under
            // the same contract with p NULL or a local config.
            unsafe { with_config(name, config, false, |p| f::fcclCommSplit(comm, color, key, newcomm, p)) }
        })
    }
}

/// NCCL_SHRINK_DEFAULT and NCCL_SHRINK_ABORT (nccl.h).
const SHRINK_DEFAULT: c_int = 0;
const SHRINK_ABORT: c_int = 1;

/// The ranks of an `n`-rank communicator that remain after excluding `list`, or the
/// message that says what is wrong with `list` (this rank `me` must not be in it).
fn survivors(list: &[c_int], n: c_int, me: c_int) -> Result<Vec<c_int>, String> {
    let mut seen = vec![false; n.max(0) as usize];
    for (i, &r) in list.iter().enumerate() {
        if r < 0 || r >= n {
            return Err(format!("excludeRanksList[{i}] is {r}; the communicator's ranks are 0..{}", n - 1));
        }
        if std::mem::replace(&mut seen[r as usize], true) {
            return Err(format!("excludeRanksList names rank {r} twice"));
        }
    }
    if seen[me as usize] {
        return Err(format!(
            "rank {me} is in excludeRanksList: only the ranks that remain call ncclCommShrink (the excluded ones do not call it)"
        ));
    }
    Ok((0..n).filter(|&r| !seen[r as usize]).collect())
}

/// Waits for a non-blocking communicator's queued work (fcclInProgress) to end.
fn settle(comm: ncclComm_t, r: fcclResult_t) -> fcclResult_t {
    if r != f::fcclInProgress {
        return r;
    }
    loop {
        let mut e = f::fcclSuccess;
        // SAFETY: e is a local, which ferroccl writes whole if at all; it checks the handle.
        let q = unsafe { f::fcclCommGetAsyncError(comm, f::as_out(&mut e)) };
        if q != f::fcclSuccess {
            return q;
        }
        if e != f::fcclInProgress {
            return e;
        }
        std::thread::yield_now();
    }
}

nccl_api! {
    /// The ranks of `comm` but `excludeRanksList` make a new communicator, numbered in
    /// the order of their ranks in `comm`; only they call it. The lowest of them makes a
    /// unique id and sends it to the others on `comm` (so `comm` must still work:
    /// NCCL_SHRINK_ABORT on a communicator that failed is refused, with what to do), then
    /// they join as ncclCommInitRankConfig does. `config` NULL gives the defaults (NCCL
    /// inherits the parent's).
    fn ncclCommShrink(
        comm: ncclComm_t,
        excludeRanksList: *mut c_int,
        excludeRanksCount: c_int,
        newcomm: Option<&mut MaybeUninit<ncclComm_t>>,
        config: *mut ncclConfig_t,
        shrinkFlags: c_int,
    ) -> ncclResult_t {
        let name = "ncclCommShrink";
        guard(name, || {
            let Some(newcomm) = newcomm else {
                return fail(name, ncclInvalidArgument, "newcomm is NULL; pass a pointer to receive the new communicator");
            };
            newcomm.write(std::ptr::null_mut());
            if shrinkFlags != SHRINK_DEFAULT && shrinkFlags != SHRINK_ABORT {
                return fail(name, ncclInvalidArgument, format_args!(
                    "shrinkFlags is {shrinkFlags}; pass NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)"
                ));
            }
            let Some((me, n)) = rank_and_size(name, comm) else { return ncclInvalidArgument };
            if excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList.is_null()) {
                return fail(name, ncclInvalidArgument, format_args!(
                    "excludeRanksCount is {excludeRanksCount} with excludeRanksList {excludeRanksList:p}; pass a count of 0 or more and a list of that many ranks"
                ));
            }
            let list: &[c_int] = if excludeRanksCount == 0 {
                &[]
            } else {
                // SAFETY: non-NULL and, by NCCL's contract, excludeRanksCount entries long.
                unsafe { std::slice::from_raw_parts(excludeRanksList, excludeRanksCount as usize) }
            };
            let kept = match survivors(list, n, me) {
                Ok(k) => k,
                Err(m) => return fail(name, ncclInvalidArgument, m),
            };
            let mut e = f::fcclSuccess;
            // SAFETY: e is a local, which ferroccl writes whole if at all; the handle was checked above.
            if unsafe { f::fcclCommGetAsyncError(comm, f::as_out(&mut e)) } == f::fcclSuccess && e != f::fcclSuccess && e != f::fcclInProgress {
                return fail(name, ncclInvalidUsage, format_args!(
                    "the communicator has failed ({}); ferroccl passes the new communicator's id between the remaining ranks over it, so it cannot shrink a failed one: make a new communicator with ncclCommInitRank (a fresh id through your launcher's store) instead",
                    code_name(e)
                ));
            }
            let leader = kept[0];
            // SAFETY: ncclUniqueId is plain bytes; all zero is a valid value to overwrite.
            let mut id: ncclUniqueId = unsafe { std::mem::zeroed() };
            if me == leader {
                // SAFETY: id is a local, which ferroccl writes whole if at all.
                let r = unsafe { f::fcclGetUniqueId(f::as_out(&mut id)) };
                if r != f::fcclSuccess {
                    return ret(name, r);
                }
            }
            let bytes = std::mem::size_of::<ncclUniqueId>();
            // SAFETY: `id` is `bytes` long and lives until the group ends (host memory, so
            // every call completes before fcclGroupEnd returns); ranks are in range.
            let r = unsafe {
                // One group, so that the leader's sends do not wait for each other.
                let _ = f::fcclGroupStart();
                let mut r = f::fcclSuccess;
                if me == leader {
                    for &q in &kept[1..] {
                        if r == f::fcclSuccess {
                            r = f::fcclSend((&id as *const ncclUniqueId).cast(), bytes, f::fcclUint8, q, comm, std::ptr::null_mut());
                        }
                    }
                } else {
                    r = f::fcclRecv((&mut id as *mut ncclUniqueId).cast(), bytes, f::fcclUint8, leader, comm, std::ptr::null_mut());
                }
                let end = f::fcclGroupEnd();
                if r == f::fcclSuccess { end } else { r }
            };
            let r = settle(comm, r);
            if r != f::fcclSuccess {
                return ret(name, r);
            }
            let rank = kept.iter().position(|&q| q == me).expect("me is kept") as c_int;
            // SAFETY: NULL or an ncclConfig_t (NCCL's contract); newcomm checked above.
            unsafe { with_config(name, config, true, |p| f::fcclCommInitRankConfig(Some(newcomm), kept.len() as c_int, id, rank, p)) }
        })
    }
}

/// Texts of NCCL 2.28's result codes, then one for any other value.
static ERROR_STRINGS: [&CStr; 9] = [
    c"no error",
    c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
    c"internal error - please report this issue to the ferroccl developers",
    c"invalid argument (run with NCCL_DEBUG=WARN for details)",
    c"invalid usage (run with NCCL_DEBUG=WARN for details)",
    c"remote process exited or there was a network error",
    c"NCCL operation in progress",
    c"unknown result code",
];

nccl_api! {
    /// A fixed description of any result value (static; never NULL).
    fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
        let i = if (0..ncclNumResults).contains(&result) { result as usize } else { ERROR_STRINGS.len() - 1 };
        ERROR_STRINGS[i].as_ptr()
    }
}

nccl_api! {
    /// This thread's last error message: the call, the values, the cause (`comm` may be NULL).
    fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
        f::fcclGetLastError(comm)
    }
}

nccl_api! {
    /// Has no effect (and says so in ncclGetLastError): ferroccl reads its log settings
    /// (FERROCCL_DEBUG, or NCCL_DEBUG here) once per process.
    fn ncclResetDebugInit() -> () {
        let _ = unsupported("ncclResetDebugInit", "log settings are read once per process");
    }
}

/// NCCL's internal entry behind ncclResetDebugInit, exported by its library; as that.
#[no_mangle]
pub extern "C" fn ncclResetDebugInitInternal() {
    let _ = unsupported("ncclResetDebugInitInternal", "log settings are read once per process");
}

nccl_api! {
    /// fcclCommGetAsyncError, the error as NCCL's code: ncclInProgress while a
    /// non-blocking communicator's work runs; an error's message (ncclGetLastError)
    /// names the NCCL call that failed.
    fn ncclCommGetAsyncError(comm: ncclComm_t, asyncError: Option<&mut MaybeUninit<ncclResult_t>>) -> ncclResult_t {
        let name = "ncclCommGetAsyncError";
        guard(name, || {
            let Some(out) = asyncError else {
                // SAFETY: ferroccl checks the handle, then refuses the NULL out-pointer.
                return ret(name, unsafe { f::fcclCommGetAsyncError(comm, None) });
            };
            let mut e = f::fcclSuccess;
            // SAFETY: e is a local, which ferroccl writes whole if at all; it checks the handle.
            let r = ret(name, unsafe { f::fcclCommGetAsyncError(comm, f::as_out(&mut e)) });
            if r == ncclSuccess {
                let code = if e == f::fcclSuccess || e == f::fcclInProgress {
                    e
                } else {
                    // "fcclAllReduce: why" is ncclAllReduce's error here.
                    let msg = last_error();
                    match msg.split_once(": ") {
                        Some((call, rest)) if call.starts_with("fccl") => {
                            renamed(&format!("nccl{}", &call[4..]), rest, e)
                        }
                        _ => renamed(name, &msg, e),
                    }
                };
                out.write(code);
            }
            r
        })
    }
}

nccl_api! {
    /// fcclCommCount.
    fn ncclCommCount(comm: ncclComm_t, count: Option<&mut MaybeUninit<c_int>>) -> ncclResult_t {
        // SAFETY: forwarded under the same contract.
        guard("ncclCommCount", || ret("ncclCommCount", unsafe { f::fcclCommCount(comm, count) }))
    }
}

nccl_api! {
    /// fcclCommCuDevice: -1 for host-memory ranks.
    fn ncclCommCuDevice(comm: ncclComm_t, device: Option<&mut MaybeUninit<c_int>>) -> ncclResult_t {
        // SAFETY: forwarded under the same contract.
        guard("ncclCommCuDevice", || ret("ncclCommCuDevice", unsafe { f::fcclCommCuDevice(comm, device) }))
    }
}

nccl_api! {
    /// fcclCommUserRank.
    fn ncclCommUserRank(comm: ncclComm_t, rank: Option<&mut MaybeUninit<c_int>>) -> ncclResult_t {
        // SAFETY: forwarded under the same contract.
        guard("ncclCommUserRank", || ret("ncclCommUserRank", unsafe { f::fcclCommUserRank(comm, rank) }))
    }
}

nccl_api! {
    /// Buffer registration speeds NCCL up and changes no result; ferroccl needs none:
    /// checks `comm`, sets `*handle` to `buff` and succeeds.
    fn ncclCommRegister(comm: ncclComm_t, buff: *mut c_void, size: usize, handle: Option<&mut MaybeUninit<*mut c_void>>) -> ncclResult_t {
        let name = "ncclCommRegister";
        let _ = size;
        guard(name, || {
            let r = check_comm(name, comm);
            if r != ncclSuccess {
                return r;
            }
            let Some(handle) = handle else {
                return fail(name, ncclInvalidArgument, "handle is NULL; pass the address of a void*");
            };
            handle.write(buff);
            ncclSuccess
        })
    }
}

nccl_api! {
    /// Releases a ncclCommRegister handle: checks `comm`, nothing else to do.
    fn ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
        let _ = handle;
        guard("ncclCommDeregister", || check_comm("ncclCommDeregister", comm))
    }
}

nccl_api! {
    /// Like ncclCommRegister: collectives on the buffer work as on any other; `*win`
    /// is an opaque handle (the device API that would use it is not supported).
    fn ncclCommWindowRegister(
        comm: ncclComm_t,
        buff: *mut c_void,
        size: usize,
        win: Option<&mut MaybeUninit<ncclWindow_t>>,
        winFlags: c_int,
    ) -> ncclResult_t {
        let name = "ncclCommWindowRegister";
        let _ = size;
        guard(name, || {
            let r = check_comm(name, comm);
            if r != ncclSuccess {
                return r;
            }
            let Some(win) = win else {
                return fail(name, ncclInvalidArgument, "win is NULL; pass the address of an ncclWindow_t");
            };
            if winFlags & !NCCL_WIN_FLAGS != 0 {
                return fail(
                    name,
                    ncclInvalidArgument,
                    format_args!("winFlags is {winFlags:#x}; use NCCL_WIN_DEFAULT or NCCL_WIN_COLL_SYMMETRIC"),
                );
            }
            win.write(buff);
            ncclSuccess
        })
    }
}

nccl_api! {
    /// Releases a ncclCommWindowRegister window: checks `comm`, nothing else to do.
    fn ncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
        let _ = win;
        guard("ncclCommWindowDeregister", || check_comm("ncclCommWindowDeregister", comm))
    }
}

/// A PreMulSum operator's scalar: its bytes, read at creation (ncclScalarHostImmediate),
/// or the address to read them from at each call (ncclScalarDevice: host or device memory).
#[derive(Clone, Copy)]
enum Scalar {
    Now([u8; 8]),
    AtCall(usize),
}

/// One operator of ncclRedOpCreatePreMulSum.
#[derive(Clone, Copy)]
struct PreMulOp {
    datatype: ncclDataType_t,
    scalar: Scalar,
}

/// One communicator's operators: op value ncclNumOps + k is `slots[k]`; freed slots
/// are reused last-freed first, as NCCL's free list does.
struct CommOps {
    comm: usize,
    slots: Vec<Option<PreMulOp>>,
    free: Vec<usize>,
}

impl CommOps {
    fn get(&self, op: ncclRedOp_t) -> Option<PreMulOp> {
        let k = usize::try_from(op.checked_sub(5)?).ok()?;
        *self.slots.get(k)?
    }
}

/// The operators made by ncclRedOpCreatePreMulSum, per communicator address.
static PREMUL_OPS: std::sync::Mutex<Vec<CommOps>> = std::sync::Mutex::new(Vec::new());

fn premul_ops() -> std::sync::MutexGuard<'static, Vec<CommOps>> {
    // A panic while held leaves the list consistent (no change spans a fallible step).
    PREMUL_OPS.lock().unwrap_or_else(|p| p.into_inner())
}

/// `comm`'s operator `op`, if it has one.
fn premul_op(comm: ncclComm_t, op: ncclRedOp_t) -> Option<PreMulOp> {
    premul_ops().iter().find(|c| c.comm == comm as usize).and_then(|c| c.get(op))
}

/// Forgets `comm`'s operators (it is being destroyed; its address may be reused).
fn forget_ops(comm: ncclComm_t) {
    premul_ops().retain(|c| c.comm != comm as usize);
}

/// Bytes of one element of NCCL type `d` (None: not a type).
fn type_size(d: ncclDataType_t) -> Option<usize> {
    Some(match d {
        0 | 1 | 10 | 11 => 1,
        6 | 9 => 2,
        2 | 3 | 7 => 4,
        4 | 5 | 8 => 8,
        _ => return None,
    })
}

nccl_api! {
    /// An operator for `comm` and `datatype`: the sum of each rank's input times the
    /// scalar. ncclScalarHostImmediate reads `*scalar` now; ncclScalarDevice reads it
    /// when each collective is called (on its stream, for device memory). The value is
    /// ncclNumOps + k, k NCCL's slot index (freed slots reused last-freed first); NCCL
    /// 2.28.9 also XORs it with a hash of the communicator's address, which programs
    /// cannot rely on.
    fn ncclRedOpCreatePreMulSum(
        op: Option<&mut MaybeUninit<ncclRedOp_t>>,
        scalar: *mut c_void,
        datatype: ncclDataType_t,
        residence: c_int,
        comm: ncclComm_t,
    ) -> ncclResult_t {
        let name = "ncclRedOpCreatePreMulSum";
        guard(name, || {
            let r = check_comm(name, comm);
            if r != ncclSuccess {
                return r;
            }
            let op = match op {
                Some(op) if !scalar.is_null() => op,
                op => {
                    let op: *const MaybeUninit<ncclRedOp_t> = op.map_or(std::ptr::null(), |o| o);
                    return fail(
                        name,
                        ncclInvalidArgument,
                        format_args!("op is {op:?} and scalar is {scalar:?}; pass the address of an ncclRedOp_t and of the scalar"),
                    );
                }
            };
            let Some(size) = type_size(datatype) else {
                return fail(
                    name,
                    ncclInvalidArgument,
                    format_args!("datatype {datatype} is not an ncclDataType_t (valid: 0 ncclInt8 .. 11 ncclFloat8e5m2)"),
                );
            };
            let scalar = match residence {
                1 => {
                    let mut b = [0u8; 8];
                    // SAFETY: scalar is non-NULL and points to one `datatype` element (NCCL's contract).
                    unsafe { std::ptr::copy_nonoverlapping(scalar.cast::<u8>(), b.as_mut_ptr(), size) };
                    Scalar::Now(b)
                }
                0 => Scalar::AtCall(scalar as usize),
                _ => {
                    return fail(
                        name,
                        ncclInvalidArgument,
                        format_args!("residence {residence} is not an ncclScalarResidence_t (0 ncclScalarDevice, 1 ncclScalarHostImmediate)"),
                    );
                }
            };
            let mut all = premul_ops();
            let i = match all.iter().position(|c| c.comm == comm as usize) {
                Some(i) => i,
                None => {
                    all.push(CommOps { comm: comm as usize, slots: Vec::new(), free: Vec::new() });
                    all.len() - 1
                }
            };
            let ops = &mut all[i];
            let k = ops.free.pop().unwrap_or(ops.slots.len());
            let Some(value) = c_int::try_from(k).ok().and_then(|k| k.checked_add(5)) else {
                return fail(
                    name,
                    ncclInvalidUsage,
                    "every operator value is taken; destroy operators with ncclRedOpDestroy",
                );
            };
            if k == ops.slots.len() {
                ops.slots.push(None);
            }
            ops.slots[k] = Some(PreMulOp { datatype, scalar });
            op.write(value);
            ncclSuccess
        })
    }
}

nccl_api! {
    /// Frees an operator of ncclRedOpCreatePreMulSum; a built-in one, or one `comm`
    /// does not have, is ncclInvalidArgument. Calls already made with it are unaffected.
    fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
        let name = "ncclRedOpDestroy";
        guard(name, || {
            if (0..5).contains(&op) {
                return fail(
                    name,
                    ncclInvalidArgument,
                    format_args!("op {op} is a built-in operator; only operators of ncclRedOpCreatePreMulSum are destroyed"),
                );
            }
            let r = check_comm(name, comm);
            if r != ncclSuccess {
                return r;
            }
            let mut all = premul_ops();
            match all.iter_mut().find(|c| c.comm == comm as usize && c.get(op).is_some()) {
                Some(ops) => {
                    let k = (op - 5) as usize;
                    ops.slots[k] = None;
                    ops.free.push(k);
                    ncclSuccess
                }
                None => fail(name, ncclInvalidArgument, format_args!("op {op} was not made by ncclRedOpCreatePreMulSum on this communicator (or was destroyed already)")),
            }
        })
    }
}

/// An operator as a call takes it: a built-in one, or a PreMulSum operator's scalar.
enum Op {
    Builtin(f::fcclRedOp_t),
    PreMul(f::coll::PreMulScalar),
}

/// `op` for a call on `comm` with `datatype`, or NCCL's refusal (message set): an
/// operator of ncclRedOpCreatePreMulSum only serves the communicator and type it was
/// made for.
fn resolve_op(name: &str, op: ncclRedOp_t, datatype: ncclDataType_t, comm: ncclComm_t) -> Result<Op, ncclResult_t> {
    if let Some(o) = redop(op) {
        return Ok(Op::Builtin(o));
    }
    let Some(p) = premul_op(comm, op) else {
        return Err(fail(name, ncclInvalidArgument, format_args!("op {op} is neither a built-in ncclRedOp_t (0 ncclSum .. 4 ncclAvg) nor an operator of ncclRedOpCreatePreMulSum on this communicator")));
    };
    if p.datatype != datatype {
        return Err(fail(
            name,
            ncclInvalidArgument,
            format_args!(
                "op {op} was made for datatype {} and the call's datatype is {datatype}; create one operator per type",
                p.datatype
            ),
        ));
    }
    Ok(Op::PreMul(match p.scalar {
        Scalar::Now(b) => f::coll::PreMulScalar::Bytes(b),
        // Read by the call (host or device memory), which NCCL's contract keeps valid.
        Scalar::AtCall(addr) => f::coll::PreMulScalar::At(addr as *const u8),
    }))
}

/// Runs a reduction with `op`: the ferroccl collective `builtin` for a built-in
/// operator, a pre-multiplied sum of `kind` for a PreMulSum one.
#[allow(clippy::too_many_arguments)]
fn reduction(
    name: &str,
    kind: f::coll::PreMulKind,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
    builtin: impl FnOnce(f::fcclRedOp_t) -> fcclResult_t,
) -> ncclResult_t {
    match resolve_op(name, op, datatype, comm) {
        Err(r) => r,
        Ok(Op::Builtin(o)) => ret(name, builtin(o)),
        Ok(Op::PreMul(sc)) => ret(name, {
            // SAFETY: forwarded under the collective's and the operator's contracts.
            unsafe { f::coll::premul_sum(name, kind, sendbuff, recvbuff, count, dtype(datatype), sc, comm, stream) }
        }),
    }
}

// ---------------------------------------------------------------- collectives

nccl_api! {
    /// fcclReduce.
    fn ncclReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        op: ncclRedOp_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        let name = "ncclReduce";
        guard(name, || {
            let kind = f::coll::PreMulKind::Reduce(root);
            reduction(name, kind, sendbuff, recvbuff, count, datatype, op, comm, stream, |op| {
                // SAFETY: forwarded under the same contract.
                unsafe { f::fcclReduce(sendbuff, recvbuff, count, dtype(datatype), op, root, comm, stream) }
            })
        })
    }
}

nccl_api! {
    /// In-place broadcast (NCCL's legacy form): fcclBroadcast(buff, buff, ...).
    fn ncclBcast(
        buff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclBcast", || {
            // SAFETY: forwarded under the same contract.
            ret("ncclBcast", unsafe { f::fcclBroadcast(buff, buff, count, dtype(datatype), root, comm, stream) })
        })
    }
}

nccl_api! {
    /// fcclBroadcast.
    fn ncclBroadcast(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclBroadcast", || {
            // SAFETY: forwarded under the same contract.
            ret("ncclBroadcast", unsafe { f::fcclBroadcast(sendbuff, recvbuff, count, dtype(datatype), root, comm, stream) })
        })
    }
}

nccl_api! {
    /// fcclAllReduce.
    fn ncclAllReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        op: ncclRedOp_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        let name = "ncclAllReduce";
        guard(name, || {
            let kind = f::coll::PreMulKind::AllReduce;
            reduction(name, kind, sendbuff, recvbuff, count, datatype, op, comm, stream, |op| {
                // SAFETY: forwarded under the same contract.
                unsafe { f::fcclAllReduce(sendbuff, recvbuff, count, dtype(datatype), op, comm, stream) }
            })
        })
    }
}

nccl_api! {
    /// fcclReduceScatter.
    fn ncclReduceScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcount: usize,
        datatype: ncclDataType_t,
        op: ncclRedOp_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        let name = "ncclReduceScatter";
        guard(name, || {
            let kind = f::coll::PreMulKind::ReduceScatter;
            reduction(name, kind, sendbuff, recvbuff, recvcount, datatype, op, comm, stream, |op| {
                // SAFETY: forwarded under the same contract.
                unsafe { f::fcclReduceScatter(sendbuff, recvbuff, recvcount, dtype(datatype), op, comm, stream) }
            })
        })
    }
}

nccl_api! {
    /// fcclAllGather.
    fn ncclAllGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: ncclDataType_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclAllGather", || {
            // SAFETY: forwarded under the same contract.
            ret("ncclAllGather", unsafe { f::fcclAllGather(sendbuff, recvbuff, sendcount, dtype(datatype), comm, stream) })
        })
    }
}

nccl_api! {
    /// fcclAlltoAll (`count` elements per peer).
    fn ncclAlltoAll(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclAlltoAll", || {
            // SAFETY: forwarded under the same contract.
            ret("ncclAlltoAll", unsafe { f::fcclAlltoAll(sendbuff, recvbuff, count, dtype(datatype), comm, stream) })
        })
    }
}

nccl_api! {
    /// fcclGather (`count` elements per rank).
    fn ncclGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclGather", || {
            // SAFETY: forwarded under the same contract.
            ret("ncclGather", unsafe { f::fcclGather(sendbuff, recvbuff, count, dtype(datatype), root, comm, stream) })
        })
    }
}

nccl_api! {
    /// fcclScatter (`count` elements per rank).
    fn ncclScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclScatter", || {
            // SAFETY: forwarded under the same contract.
            ret("ncclScatter", unsafe { f::fcclScatter(sendbuff, recvbuff, count, dtype(datatype), root, comm, stream) })
        })
    }
}

nccl_api! {
    /// fcclSend.
    fn ncclSend(
        sendbuff: *const c_void,
        count: usize,
        datatype: ncclDataType_t,
        peer: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclSend", || {
            // SAFETY: forwarded under the same contract.
            ret("ncclSend", unsafe { f::fcclSend(sendbuff, count, dtype(datatype), peer, comm, stream) })
        })
    }
}

nccl_api! {
    /// fcclRecv.
    fn ncclRecv(
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        peer: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclRecv", || {
            // SAFETY: forwarded under the same contract.
            ret("ncclRecv", unsafe { f::fcclRecv(recvbuff, count, dtype(datatype), peer, comm, stream) })
        })
    }
}

// ---------------------------------------------------------------- groups

nccl_api! {
    /// fcclGroupStart.
    fn ncclGroupStart() -> ncclResult_t {
        guard("ncclGroupStart", || ret("ncclGroupStart", f::fcclGroupStart()))
    }
}

nccl_api! {
    /// fcclGroupEnd.
    fn ncclGroupEnd() -> ncclResult_t {
        guard("ncclGroupEnd", || ret("ncclGroupEnd", f::fcclGroupEnd()))
    }
}

nccl_api! {
    /// Not supported (ncclInvalidUsage; the group stays open): ferroccl has no cost
    /// model to estimate a group's time with.
    fn ncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
        let _ = simInfo;
        guard("ncclGroupSimulateEnd", || {
            unsupported("ncclGroupSimulateEnd", "no cost model to simulate a group with; the group stays open, end it with ncclGroupEnd")
        })
    }
}

// ---------------------------------------------------------------- device API (host side)

/// Why the device API's functions are not supported.
const NO_DEVICE_API: &str =
    "ferroccl has no device-side API (ncclDevComm, symmetric windows, GIN); use the host collectives";

nccl_api! {
    /// Not supported (ncclInvalidUsage): no device-side API.
    fn ncclDevCommCreate(comm: ncclComm_t, reqs: *const c_void, outDevComm: *mut c_void) -> ncclResult_t {
        let _ = (comm, reqs, outDevComm);
        guard("ncclDevCommCreate", || unsupported("ncclDevCommCreate", NO_DEVICE_API))
    }
}

nccl_api! {
    /// Not supported (ncclInvalidUsage): no device communicator can have been created.
    fn ncclDevCommDestroy(comm: ncclComm_t, devComm: *const c_void) -> ncclResult_t {
        let _ = (comm, devComm);
        guard("ncclDevCommDestroy", || unsupported("ncclDevCommDestroy", NO_DEVICE_API))
    }
}

nccl_api! {
    /// Not supported (ncclInvalidUsage): no device-side barriers.
    fn ncclLsaBarrierCreateRequirement(team: ncclTeam_t, nBarriers: c_int, outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t {
        let _ = (team, nBarriers, outHandle, outReq);
        guard("ncclLsaBarrierCreateRequirement", || unsupported("ncclLsaBarrierCreateRequirement", NO_DEVICE_API))
    }
}

nccl_api! {
    /// Not supported (ncclInvalidUsage): no device-side barriers.
    fn ncclGinBarrierCreateRequirement(
        comm: ncclComm_t,
        team: ncclTeam_t,
        nBarriers: c_int,
        outHandle: *mut c_void,
        outReq: *mut c_void,
    ) -> ncclResult_t {
        let _ = (comm, team, nBarriers, outHandle, outReq);
        guard("ncclGinBarrierCreateRequirement", || unsupported("ncclGinBarrierCreateRequirement", NO_DEVICE_API))
    }
}

nccl_api! {
    /// Not supported (ncclInvalidUsage): no device-side all-to-all.
    fn ncclLLA2ACreateRequirement(nBlocks: c_int, nSlots: c_int, outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t {
        let _ = (nBlocks, nSlots, outHandle, outReq);
        guard("ncclLLA2ACreateRequirement", || unsupported("ncclLLA2ACreateRequirement", NO_DEVICE_API))
    }
}

nccl_api! {
    /// NCCL's slot arithmetic for its low-latency all-to-all: one slot per 8 bytes of each element.
    fn ncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int {
        maxElts.saturating_mul((maxEltSize.max(0) + 7) / 8)
    }
}

/// This rank and the number of ranks of `comm`, or None (message set) if it is not one.
fn rank_and_size(name: &str, comm: ncclComm_t) -> Option<(c_int, c_int)> {
    let (mut n, mut r) = (0, 0);
    // SAFETY: locals, which ferroccl writes whole if at all; it checks the handle.
    let ok =
        unsafe { f::fcclCommCount(comm, f::as_out(&mut n)) == 0 && f::fcclCommUserRank(comm, f::as_out(&mut r)) == 0 };
    if ok {
        Some((r, n))
    } else {
        let _ = ret(name, f::fcclInvalidArgument);
        None
    }
}

nccl_api! {
    /// All ranks of `comm` (an invalid comm gives a team of 0 ranks).
    fn ncclTeamWorld(comm: ncclComm_t) -> ncclTeam_t {
        let t = rank_and_size("ncclTeamWorld", comm).map(|(r, n)| ncclTeam_t { nRanks: n, rank: r, stride: 1 });
        t.unwrap_or(ncclTeam_t { nRanks: 0, rank: 0, stride: 1 })
    }
}

nccl_api! {
    /// The ranks whose memory this rank can address directly through NCCL windows:
    /// only itself, as ferroccl has no device-side API.
    fn ncclTeamLsa(comm: ncclComm_t) -> ncclTeam_t {
        let t = rank_and_size("ncclTeamLsa", comm).map(|_| ncclTeam_t { nRanks: 1, rank: 0, stride: 1 });
        t.unwrap_or(ncclTeam_t { nRanks: 0, rank: 0, stride: 1 })
    }
}

nccl_api! {
    /// The ranks with this rank's place in every load/store team: with one-rank teams
    /// (ncclTeamLsa), all ranks.
    fn ncclTeamRail(comm: ncclComm_t) -> ncclTeam_t {
        let t = rank_and_size("ncclTeamRail", comm).map(|(r, n)| ncclTeam_t { nRanks: n, rank: r, stride: 1 });
        t.unwrap_or(ncclTeam_t { nRanks: 0, rank: 0, stride: 1 })
    }
}

nccl_api! {
    /// The world rank of rank `rank` of `team` (a team that contains this rank).
    fn ncclTeamRankToWorld(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
        match rank_and_size("ncclTeamRankToWorld", comm) {
            Some((me, _)) => me + (rank - team.rank) * team.stride,
            None => -1,
        }
    }
}

nccl_api! {
    /// The rank in this rank's load/store team (ncclTeamLsa: itself alone) of rank
    /// `rank` of `team`: 0 for this rank.
    fn ncclTeamRankToLsa(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
        match rank_and_size("ncclTeamRankToLsa", comm) {
            Some((me, _)) => me + (rank - team.rank) * team.stride - me,
            None => -1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroccl::ffi::as_out;

    #[test]
    fn ferroccl_codes_map_onto_nccl_2_28s() {
        for r in 0..8 {
            assert_eq!(nccl_code(r), r);
        }
        assert_eq!(nccl_code(f::fcclTimeout), ncclRemoteError);
        assert_eq!(nccl_code(f::fcclCollectiveMismatch), ncclInvalidUsage);
        assert_eq!(nccl_code(f::fcclUnavailable), ncclUnhandledCudaError);
        assert_eq!(nccl_code(-1), ncclInternalError);
    }

    #[test]
    fn ncclconfig_defaults_leave_calls_unagreed_unless_ferroccl_check_is_set() {
        assert_eq!(defaults_with(false).checkMode, f::FCCL_CHECK_OFF);
        assert_eq!(defaults_with(true).checkMode, f::FCCL_CONFIG_UNDEF_INT, "FERROCCL_CHECK decides");
        let d = defaults_with(false);
        assert_eq!(
            (d.blocking, d.timeoutMs, d.backend),
            (f::FCCL_CONFIG_UNDEF_INT, f::FCCL_CONFIG_UNDEF_INT, f::FCCL_CONFIG_UNDEF_INT)
        );
        assert!(d.commName.is_null());
        // A given ncclConfig_t gets the same checkMode; NULL stays NULL (a split inherits).
        // SAFETY: ncclConfig_t is plain integers and pointers; all zeros is a valid value.
        let mut c: ncclConfig_t = unsafe { std::mem::zeroed() };
        c.size = std::mem::size_of::<ncclConfig_t>();
        c.magic = NCCL_API_MAGIC;
        c.blocking = 0;
        // SAFETY: a whole ncclConfig_t of the size it states, then NULL.
        let got = unsafe { config("t", &c) }.ok().flatten().expect("a config");
        assert_eq!((got.blocking, got.checkMode), (0, defaults().checkMode));
        // SAFETY: as above.
        assert!(unsafe { config("t", std::ptr::null()) }.ok().flatten().is_none());
    }

    #[test]
    fn config_layout_is_nccl_2_28s() {
        assert_eq!(std::mem::size_of::<ncclConfig_t>(), 80);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, blocking), 16);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, netName), 32);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, commName), 48);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, nvlinkCentricSched), 76);
        assert_eq!(std::mem::size_of::<ncclUniqueId>(), 128);
    }

    #[test]
    fn non_blocking_calls_pass_in_progress_and_async_errors_name_the_nccl_call() {
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { ncclGetUniqueId(as_out(&mut id)) }, ncclSuccess);
        // Neither rank aborts before both have their error: an abort may reach the peer
        // first and fail its call with "rank N aborted" instead.
        let both_polled = std::sync::Barrier::new(2);
        let both_polled = &both_polled;
        let msgs: Vec<(ncclResult_t, ncclResult_t, String)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|rank| {
                    s.spawn(move || {
                        let mut cfg = ncclConfig_t {
                            size: std::mem::size_of::<ncclConfig_t>(),
                            magic: NCCL_API_MAGIC,
                            version: 22800,
                            blocking: 0,
                            cgaClusterSize: f::FCCL_CONFIG_UNDEF_INT,
                            minCTAs: f::FCCL_CONFIG_UNDEF_INT,
                            maxCTAs: f::FCCL_CONFIG_UNDEF_INT,
                            netName: std::ptr::null(),
                            splitShare: f::FCCL_CONFIG_UNDEF_INT,
                            trafficClass: f::FCCL_CONFIG_UNDEF_INT,
                            commName: std::ptr::null(),
                            collnetEnable: f::FCCL_CONFIG_UNDEF_INT,
                            CTAPolicy: f::FCCL_CONFIG_UNDEF_INT,
                            shrinkShare: f::FCCL_CONFIG_UNDEF_INT,
                            nvlsCTAs: f::FCCL_CONFIG_UNDEF_INT,
                            nChannelsPerNetPeer: f::FCCL_CONFIG_UNDEF_INT,
                            nvlinkCentricSched: f::FCCL_CONFIG_UNDEF_INT,
                        };
                        let mut comm: ncclComm_t = std::ptr::null_mut();
                        // SAFETY: valid pointers; the config is NCCL 2.28's layout.
                        let init = unsafe { ncclCommInitRankConfig(as_out(&mut comm), 2, id, rank, &mut cfg) };
                        let poll = |comm| {
                            let mut st = ncclInProgress;
                            while st == ncclInProgress {
                                // SAFETY: a live communicator and a valid out-pointer.
                                assert_eq!(unsafe { ncclCommGetAsyncError(comm, as_out(&mut st)) }, ncclSuccess);
                            }
                            st
                        };
                        assert_eq!(poll(comm), ncclSuccess, "{}", last_error());
                        // Counts differ by rank: found on the progress thread, on both.
                        let x = [1.0f32; 4];
                        let mut y = [0.0f32; 4];
                        // SAFETY: buffers of at least 3 floats.
                        let r = unsafe {
                            ncclAllReduce(
                                x.as_ptr().cast(),
                                y.as_mut_ptr().cast(),
                                2 + rank as usize,
                                7,
                                0,
                                comm,
                                std::ptr::null_mut(),
                            )
                        };
                        let st = poll(comm);
                        let msg = last_error();
                        both_polled.wait();
                        // SAFETY: a live communicator.
                        assert_eq!(unsafe { ncclCommAbort(comm) }, ncclSuccess);
                        (init, r, format!("{st} {msg}"))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (init, r, msg) in msgs {
            assert_eq!((init, r), (ncclInProgress, ncclInProgress), "{msg}");
            assert!(msg.starts_with("5 ncclAllReduce: ranks called different collectives"), "{msg}");
            assert!(
                msg.ends_with(
                    "(ferroccl's fcclCollectiveMismatch, reported as ncclInvalidUsage: NCCL 2.28 has no such code)"
                ),
                "{msg}"
            );
        }
    }

    #[test]
    fn error_strings_cover_every_value() {
        // SAFETY: returns static NUL-terminated strings for any value.
        let s = |r| unsafe { CStr::from_ptr(ncclGetErrorString(r)) }.to_string_lossy().into_owned();
        assert_eq!(s(0), "no error");
        assert!(s(5).starts_with("invalid usage"));
        assert_eq!(s(8), "unknown result code");
        assert_eq!(s(-3), "unknown result code");
    }

    #[test]
    fn shrink_keeps_the_unlisted_ranks_in_order_and_refuses_bad_lists() {
        assert_eq!(survivors(&[3, 1], 5, 0).unwrap(), vec![0, 2, 4]);
        assert_eq!(survivors(&[], 3, 2).unwrap(), vec![0, 1, 2]);
        assert!(survivors(&[5], 5, 0).unwrap_err().contains("ranks are 0..4"));
        assert!(survivors(&[-1], 5, 0).unwrap_err().contains("excludeRanksList[0] is -1"));
        assert!(survivors(&[2, 2], 5, 0).unwrap_err().contains("twice"));
        assert!(survivors(&[1, 0], 5, 0).unwrap_err().contains("rank 0 is in excludeRanksList"));
    }

    #[test]
    fn unsupported_calls_say_why() {
        // SAFETY: a NULL simInfo is never dereferenced.
        let r = unsafe { ncclGroupSimulateEnd(std::ptr::null_mut()) };
        assert_eq!(r, ncclInvalidUsage);
        let msg = last_error();
        assert!(msg.starts_with("ncclGroupSimulateEnd: not supported"), "{msg}");
        // SAFETY: plain arithmetic on its arguments.
        assert_eq!(unsafe { ncclLLA2ACalcSlots(10, 12) }, 20);
    }
}
