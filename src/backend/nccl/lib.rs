//! Our own small run-time binding of NCCL (cudarc never looks for `libnccl.so.2`).
//!
//! Where the library comes from, in order: `FERROCCL_NCCL_LIBRARY`, a `libnccl.so.2`
//! the process has already loaded (e.g. by PyTorch), then `libnccl.so.2` and
//! `libnccl.so` on the loader's search path; a library that turns out to be ferroccl's
//! own NCCL shim is skipped, and then the search path's directories are searched for
//! one that is not (see [`load_from`]). Every symbol is resolved up front;
//! collectives that only NCCL 2.28 has are optional. NCCL's enums stay integers
//! (their values are ours, see docs/abi.md).

use crate::env;
use crate::error::{Error, Result};
use std::ffi::c_void;
use std::os::raw::{c_char, c_int};
use std::sync::OnceLock;

pub type NcclComm = *mut c_void;
pub type Stream = *mut c_void;
type R = c_int;

/// NCCL's unique id: 128 opaque bytes, passed by value to ncclCommInitRank.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    pub internal: [c_char; 128],
}

type CollFn = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, Stream) -> R;
type RootedFn = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, NcclComm, Stream) -> R;
type MoveFn = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, NcclComm, Stream) -> R;
type RootFn = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, Stream) -> R;
type P2pFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, NcclComm, Stream) -> R;

/// The resolved entry points.
pub struct Api {
    pub path: String,
    pub version: c_int,
    pub get_version: unsafe extern "C" fn(*mut c_int) -> R,
    pub get_unique_id: unsafe extern "C" fn(*mut NcclUniqueId) -> R,
    pub comm_init_rank: unsafe extern "C" fn(*mut NcclComm, c_int, NcclUniqueId, c_int) -> R,
    pub comm_init_all: unsafe extern "C" fn(*mut NcclComm, c_int, *const c_int) -> R,
    pub comm_destroy: unsafe extern "C" fn(NcclComm) -> R,
    pub comm_abort: unsafe extern "C" fn(NcclComm) -> R,
    pub get_error_string: unsafe extern "C" fn(R) -> *const c_char,
    /// all_reduce and reduce_scatter: (send, recv, count, dtype, op, comm, stream).
    pub all_reduce: CollFn,
    pub reduce_scatter: CollFn,
    /// (send, recv, count, dtype, op, root, comm, stream).
    pub reduce: RootedFn,
    /// (send, recv, count, dtype, root, comm, stream).
    pub broadcast: RootFn,
    pub all_gather: MoveFn,
    /// ncclSend takes a const buffer; the cast is only in the type.
    pub send: P2pFn,
    pub recv: P2pFn,
    pub group_start: unsafe extern "C" fn() -> R,
    pub group_end: unsafe extern "C" fn() -> R,
    /// NCCL 2.28 and later.
    pub all_to_all: Option<MoveFn>,
    pub gather: Option<RootFn>,
    pub scatter: Option<RootFn>,
}

/// Symbols that must be there, and the optional (version-dependent) ones.
pub const REQUIRED: &[&str] = &[
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommInitAll",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclGetErrorString",
    "ncclAllReduce",
    "ncclReduceScatter",
    "ncclReduce",
    "ncclBroadcast",
    "ncclAllGather",
    "ncclSend",
    "ncclRecv",
    "ncclGroupStart",
    "ncclGroupEnd",
];
pub const OPTIONAL: &[&str] = &["ncclAlltoAll", "ncclGather", "ncclScatter"];

/// A symbol's address as a function pointer of type `F`.
///
/// # Safety
/// `p` is a function with signature `F` (a plain `extern "C" fn` pointer type).
unsafe fn as_fn<F: Copy>(p: *const c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*const c_void>());
    // SAFETY: same size (checked); the caller guarantees the signature.
    unsafe { std::mem::transmute_copy(&p) }
}

/// Builds the table from a symbol lookup (address or None).
///
/// # Safety
/// Every address `lookup` returns is the named NCCL function, with NCCL's signature.
pub unsafe fn resolve(path: &str, lookup: &dyn Fn(&str) -> Option<*const c_void>) -> Result<Api> {
    let missing: Vec<&str> = REQUIRED.iter().copied().filter(|s| lookup(s).is_none()).collect();
    if !missing.is_empty() {
        return Err(Error::unavailable(format!(
            "{path} is not a usable NCCL: it lacks {}; NCCL 2.18 or later is needed",
            missing.join(", ")
        )));
    }
    macro_rules! req {
        ($name:literal) => {
            // SAFETY: present (checked above) and NCCL's function of that name (caller's contract).
            unsafe { as_fn(lookup($name).expect("checked")) }
        };
    }
    macro_rules! opt {
        ($name:literal) => {
            // SAFETY: as req!, when present.
            lookup($name).map(|p| unsafe { as_fn(p) })
        };
    }
    let mut api = Api {
        path: path.to_string(),
        version: 0,
        get_version: req!("ncclGetVersion"),
        get_unique_id: req!("ncclGetUniqueId"),
        comm_init_rank: req!("ncclCommInitRank"),
        comm_init_all: req!("ncclCommInitAll"),
        comm_destroy: req!("ncclCommDestroy"),
        comm_abort: req!("ncclCommAbort"),
        get_error_string: req!("ncclGetErrorString"),
        all_reduce: req!("ncclAllReduce"),
        reduce_scatter: req!("ncclReduceScatter"),
        reduce: req!("ncclReduce"),
        broadcast: req!("ncclBroadcast"),
        all_gather: req!("ncclAllGather"),
        send: req!("ncclSend"),
        recv: req!("ncclRecv"),
        group_start: req!("ncclGroupStart"),
        group_end: req!("ncclGroupEnd"),
        all_to_all: opt!("ncclAlltoAll"),
        gather: opt!("ncclGather"),
        scatter: opt!("ncclScatter"),
    };
    let mut v: c_int = 0;
    // SAFETY: ncclGetVersion only writes an int.
    if unsafe { (api.get_version)(&mut v) } == 0 {
        api.version = v;
    }
    Ok(api)
}

/// One place to look for the library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Candidate {
    /// dlopen this name or path.
    Open(String),
    /// Only if the process has already loaded it (RTLD_NOLOAD).
    Loaded(String),
}

/// Where to look, in order.
pub fn candidates(env_path: Option<String>) -> Vec<Candidate> {
    let mut v = Vec::new();
    if let Some(p) = env_path {
        v.push(Candidate::Open(p));
    }
    v.push(Candidate::Loaded("libnccl.so.2".into()));
    v.push(Candidate::Open("libnccl.so.2".into()));
    v.push(Candidate::Open("libnccl.so".into()));
    v
}

/// The symbol by which ferroccl's own NCCL shim (libferroccl_nccl.so, SONAME
/// libnccl.so.2) is told apart from NCCL: a library that exports it is skipped.
pub const SHIM_MARKER: &str = "ferroccl_nccl_shim";

/// Directories searched for the real libnccl.so.2 when the name led to the shim:
/// LD_LIBRARY_PATH's, then the usual system and CUDA places.
pub fn search_dirs() -> Vec<String> {
    let mut v: Vec<String> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(String::from)
        .collect();
    for d in [
        "/usr/local/nccl/lib",
        "/usr/local/cuda/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/lib/x86_64-linux-gnu",
        "/lib64",
    ] {
        v.push(d.to_string());
    }
    v
}

/// True when the process has the shim loaded where every later library can see its
/// symbols: NCCL must then bind its own calls inside itself (RTLD_DEEPBIND).
fn shim_is_global() -> bool {
    let name = std::ffi::CString::new(SHIM_MARKER).expect("no NUL");
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the name up.
    !unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }.is_null()
}

/// Opens the first candidate that loads, is not ferroccl's shim and resolves; when a
/// name led to the shim, `dirs` are searched for a libnccl.so.2 that is not. The error
/// names every attempt.
pub fn load_from(cands: &[Candidate], dirs: &[String]) -> Result<(libloading::os::unix::Library, Api)> {
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    // Neither library resolves into the other when both are called libnccl.so.2.
    let deep = if shim_is_global() { libc::RTLD_DEEPBIND } else { 0 };
    let mut tried = Vec::new();
    let mut shim_seen = false;
    let mut extra = Vec::new();
    let mut i = 0;
    while i < cands.len() + extra.len() {
        let c = if i < cands.len() { &cands[i] } else { &extra[i - cands.len()] };
        i += 1;
        let (name, flags, how) = match c {
            Candidate::Open(n) => (n.clone(), RTLD_NOW | RTLD_LOCAL | deep, ""),
            Candidate::Loaded(n) => (n.clone(), RTLD_NOW | RTLD_LOCAL | libc::RTLD_NOLOAD, " (already loaded)"),
        };
        // SAFETY: loading NCCL runs its initialisers, which have no preconditions.
        let lib = match unsafe { Library::open(Some(&name), flags) } {
            Ok(l) => l,
            Err(e) => {
                if how.is_empty() {
                    tried.push(format!("{name}: {e}"));
                } else {
                    tried.push(format!("{name}{how}: not loaded"));
                }
                continue;
            }
        };
        // SAFETY: only the address is read, to see whether the symbol is there.
        if unsafe { lib.get::<*const c_void>(SHIM_MARKER.as_bytes()) }.is_ok() {
            tried.push(format!("{name}{how}: ferroccl's own NCCL shim (libferroccl_nccl.so), not NCCL"));
            if !shim_seen {
                shim_seen = true;
                for d in dirs {
                    for f in ["libnccl.so.2", "libnccl.so"] {
                        let p = std::path::Path::new(d).join(f);
                        if p.exists() {
                            extra.push(Candidate::Open(p.to_string_lossy().into_owned()));
                        }
                    }
                }
            }
            continue;
        }
        let lookup = |s: &str| -> Option<*const c_void> {
            // SAFETY: only the address is read; it is cast to NCCL's signature in resolve.
            unsafe { lib.get::<*const c_void>(s.as_bytes()) }.ok().map(|sym| *sym)
        };
        // SAFETY: a library that exports these NCCL names (and not the shim's marker) is NCCL.
        match unsafe { resolve(&name, &lookup) } {
            Ok(api) => return Ok((lib, api)),
            Err(e) => tried.push(e.msg),
        }
    }
    Err(Error::unavailable(format!(
        "NCCL is not available: tried {}; set {} to the path of libnccl.so.2",
        tried.join("; "),
        env::NCCL_LIBRARY.name
    )))
}

static NCCL: OnceLock<std::result::Result<(libloading::os::unix::Library, Api), Error>> = OnceLock::new();

/// NCCL, loaded once per process (fcclUnavailable saying what was tried if not).
pub fn nccl() -> Result<&'static Api> {
    match NCCL.get_or_init(|| load_from(&candidates(env::NCCL_LIBRARY.get()), &search_dirs())) {
        Ok((_, api)) => Ok(api),
        Err(e) => Err(e.clone()),
    }
}

/// Maps an NCCL result to ours: NCCL's codes are ours (docs/abi.md), with its message.
pub fn check(api: &Api, rc: R, what: &str) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static string for any code.
    let s = unsafe { (api.get_error_string)(rc) };
    let msg = if s.is_null() {
        String::new()
    } else {
        // SAFETY: NUL-terminated static string from NCCL.
        unsafe { std::ffi::CStr::from_ptr(s) }.to_string_lossy().into_owned()
    };
    let code = crate::error::Code::from_i32(rc).unwrap_or(crate::error::Code::InternalError);
    Err(Error::new(code, format!("{what} failed in NCCL ({}): {msg} (code {rc})", api.path)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    unsafe extern "C" fn fake_version(v: *mut c_int) -> R {
        // SAFETY: the caller passes a valid int.
        unsafe { *v = 22805 };
        0
    }

    #[test]
    fn env_path_comes_first_then_loaded_then_search_path() {
        let c = candidates(Some("/opt/nccl/lib/libnccl.so.2".into()));
        assert_eq!(
            c,
            vec![
                Candidate::Open("/opt/nccl/lib/libnccl.so.2".into()),
                Candidate::Loaded("libnccl.so.2".into()),
                Candidate::Open("libnccl.so.2".into()),
                Candidate::Open("libnccl.so".into()),
            ]
        );
        assert_eq!(candidates(None)[0], Candidate::Loaded("libnccl.so.2".into()));
    }

    #[test]
    fn missing_library_is_unavailable_and_names_what_was_tried() {
        let e = load_from(
            &[Candidate::Open("/nonexistent/libnccl.so.2".into()), Candidate::Loaded("libnccl-not-loaded.so.2".into())],
            &[],
        )
        .err()
        .expect("cannot load");
        assert_eq!(e.code, Code::Unavailable);
        assert!(e.msg.contains("/nonexistent/libnccl.so.2"), "{}", e.msg);
        assert!(e.msg.contains("libnccl-not-loaded.so.2 (already loaded): not loaded"), "{}", e.msg);
        assert!(e.msg.contains("FERROCCL_NCCL_LIBRARY"), "{}", e.msg);
    }

    #[test]
    fn a_library_without_nccl_symbols_is_refused() {
        // libc loads everywhere and is certainly not NCCL.
        let e = load_from(&[Candidate::Open("libc.so.6".into())], &[]).err().expect("not NCCL");
        assert_eq!(e.code, Code::Unavailable);
        assert!(e.msg.contains("lacks ncclGetVersion"), "{}", e.msg);
    }

    #[test]
    fn version_dependent_symbols_are_optional() {
        // Every required symbol resolves to a harmless function (only ncclGetVersion
        // is called); the 2.28 collectives are absent.
        let lookup = |s: &str| -> Option<*const c_void> {
            if OPTIONAL.contains(&s) {
                None
            } else {
                Some(fake_version as *const c_void)
            }
        };
        // SAFETY: resolve calls only get_version, which is fake_version's signature.
        let api = unsafe { resolve("fake", &lookup) }.unwrap_or_else(|e| panic!("{}", e.msg));
        assert_eq!(api.version, 22805);
        assert!(api.all_to_all.is_none() && api.gather.is_none() && api.scatter.is_none());
        let lookup_all = |_: &str| Some(fake_version as *const c_void);
        // SAFETY: as above.
        let api = unsafe { resolve("fake", &lookup_all) }.unwrap_or_else(|e| panic!("{}", e.msg));
        assert!(api.all_to_all.is_some() && api.gather.is_some() && api.scatter.is_some());
        let lookup_old = |s: &str| if s == "ncclSend" { None } else { Some(fake_version as *const c_void) };
        // SAFETY: resolve fails before calling anything.
        let e = unsafe { resolve("old", &lookup_old) }.err().expect("ncclSend is required");
        assert!(e.msg.contains("lacks ncclSend"), "{}", e.msg);
    }
}
