//! The few PMIx client calls fcclCommInitFromEnv needs to pass rank 0's unique id to
//! the other ranks under mpirun or srun --mpi=pmix when no address is given
//! (from_env.rs says when). libpmix is loaded at run time, never linked: a build or a
//! host without it loses only this way of meeting. The types are declared here from
//! PMIx's pmix_common.h (the layouts are the same in PMIx 3, 4 and 5).

use crate::error::{Error, Result};
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::OnceLock;
use std::time::Duration;

/// The names tried, in order: the run-time library's SONAME, then a development link.
pub const LIB_NAMES: [&str; 2] = ["libpmix.so.2", "libpmix.so"];

/// PMIX_MAX_NSLEN + 1.
const NSPACE_BYTES: usize = 256;
/// PMIX_MAX_KEYLEN + 1.
const KEY_BYTES: usize = 512;

/// pmix_proc_t: a namespace and a rank in it.
#[repr(C)]
#[derive(Clone, Copy)]
struct Proc {
    nspace: [c_char; NSPACE_BYTES],
    rank: u32,
}

/// pmix_value_t: a type tag (pmix_data_type_t) and the value.
#[repr(C)]
struct Value {
    kind: u16,
    data: Data,
}

/// pmix_value_t's union. Its largest member is pmix_envar_t (two pointers and a char),
/// which `_size` stands for: 24 bytes, 8-aligned.
#[repr(C)]
#[derive(Clone, Copy)]
union Data {
    flag: bool,
    integer: c_int,
    string: *mut c_char,
    _size: [u64; 3],
}

/// pmix_info_t: a key, directives and a value.
#[repr(C)]
struct Info {
    key: [c_char; KEY_BYTES],
    flags: u32,
    value: Value,
}

const PMIX_SUCCESS: c_int = 0;
const PMIX_BOOL: u16 = 1;
const PMIX_STRING: u16 = 3;
const PMIX_INT: u16 = 6;
/// pmix_scope_t: shared with every process of the job, on this host and others.
const PMIX_GLOBAL: u8 = 3;
const PMIX_COLLECT_DATA: &str = "pmix.collect";
const PMIX_TIMEOUT: &str = "pmix.timeout";

type InitFn = unsafe extern "C" fn(*mut Proc, *mut Info, usize) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*const Info, usize) -> c_int;
type PutFn = unsafe extern "C" fn(u8, *const c_char, *mut Value) -> c_int;
type CommitFn = unsafe extern "C" fn() -> c_int;
type FenceFn = unsafe extern "C" fn(*const Proc, usize, *const Info, usize) -> c_int;
type GetFn = unsafe extern "C" fn(*const Proc, *const c_char, *const Info, usize, *mut *mut Value) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type ValueDestructFn = unsafe extern "C" fn(*mut Value);

/// The entry points, resolved from a library that stays loaded for the process's life.
struct Api {
    init: InitFn,
    finalize: FinalizeFn,
    put: PutFn,
    commit: CommitFn,
    fence: FenceFn,
    get: GetFn,
    error_string: ErrorStringFn,
    /// PMIx 4 and later; PMIx 3 has only the macro, whose effect on a string is two frees.
    value_destruct: Option<ValueDestructFn>,
    path: &'static str,
}

/// Opens the first of [`LIB_NAMES`] that loads and has the calls; the error names every attempt.
fn load() -> std::result::Result<(Library, Api), String> {
    let mut tried = Vec::new();
    for name in LIB_NAMES {
        // SAFETY: loading libpmix runs its initialisers, which have no preconditions.
        let lib = match unsafe { Library::open(Some(name), RTLD_NOW | RTLD_LOCAL) } {
            Ok(l) => l,
            Err(e) => {
                tried.push(format!("{name}: {e}"));
                continue;
            }
        };
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is PMIx's function of that name, declared above with
                // pmix.h's signature; the library stays loaded while the pointer is used.
                match unsafe { lib.get(concat!($name, "\0").as_bytes()) } {
                    Ok(s) => *s,
                    Err(e) => {
                        tried.push(format!("{name}: {e}"));
                        continue;
                    }
                }
            };
        }
        let api = Api {
            init: sym!("PMIx_Init"),
            finalize: sym!("PMIx_Finalize"),
            put: sym!("PMIx_Put"),
            commit: sym!("PMIx_Commit"),
            fence: sym!("PMIx_Fence"),
            get: sym!("PMIx_Get"),
            error_string: sym!("PMIx_Error_string"),
            // SAFETY: as above; PMIx_Value_destruct(pmix_value_t *) where it exists.
            value_destruct: unsafe { lib.get(b"PMIx_Value_destruct\0") }.ok().map(|s| *s),
            path: name,
        };
        return Ok((lib, api));
    }
    Err(tried.join("; "))
}

/// This process as a PMIx client: initialised once and kept so until the process
/// exits. Finalising earlier would break an MPI_Init that follows (Open MPI 4 cannot
/// initialise PMIx again once it was finalised), and a client that exits without
/// finalising makes mpirun fail the job, so PMIx_Finalize runs at exit.
pub struct Client {
    _lib: Library,
    api: Api,
    me: Proc,
    /// The process that initialised: a forked child must not finalise its parent's client.
    pid: u32,
}

static CLIENT: OnceLock<std::result::Result<Client, Error>> = OnceLock::new();

/// The PMIx client of this process, initialised on first use. fcclUnavailable when
/// libpmix cannot be loaded (the message lists what was tried); fcclSystemError
/// when PMIx_Init fails.
pub fn client() -> Result<&'static Client> {
    match CLIENT.get_or_init(start) {
        Ok(c) => Ok(c),
        Err(e) => Err(e.clone()),
    }
}

fn start() -> std::result::Result<Client, Error> {
    let (lib, api) = load().map_err(|tried| Error::unavailable(format!("libpmix could not be loaded ({tried})")))?;
    let mut me = Proc { nspace: [0; NSPACE_BYTES], rank: 0 };
    // SAFETY: PMIx_Init writes the caller's identity into `me`; no info array is passed.
    let rc = unsafe { (api.init)(&mut me, std::ptr::null_mut(), 0) };
    if rc != PMIX_SUCCESS {
        return Err(Error::system(format!(
            "PMIx_Init failed in {}: {}; this process's launcher set PMIX_NAMESPACE but its PMIx server cannot be reached",
            api.path,
            status(&api, rc)
        )));
    }
    // SAFETY: finalize_at_exit is a plain extern "C" function that never unwinds.
    if unsafe { libc::atexit(finalize_at_exit) } != 0 {
        crate::log::warn(format_args!(
            "cannot register PMIx_Finalize to run at exit: the launcher may report that this process exited without finalising"
        ));
    }
    Ok(Client { _lib: lib, api, me, pid: std::process::id() })
}

/// Drops this process's hold on PMIx as it exits (PMIx_Init and _Finalize are counted,
/// so an MPI program's own pair is unaffected).
extern "C" fn finalize_at_exit() {
    if let Some(Ok(c)) = CLIENT.get() {
        if std::process::id() == c.pid {
            // SAFETY: this process initialised PMIx in start(); no info array is passed.
            unsafe { (c.api.finalize)(std::ptr::null(), 0) };
        }
    }
}

/// A PMIx status as `NAME (code)`.
fn status(api: &Api, rc: c_int) -> String {
    // SAFETY: PMIx_Error_string returns a static string for any status.
    let s = unsafe { (api.error_string)(rc) };
    if s.is_null() {
        return format!("status {rc}");
    }
    // SAFETY: a NUL-terminated static string from libpmix.
    format!("{} ({rc})", unsafe { CStr::from_ptr(s) }.to_string_lossy())
}

/// A key as pmix_key_t wants it (keys are ours: short ASCII without NUL).
fn key(k: &str) -> CString {
    CString::new(k).expect("PMIx keys are ours and have no NUL")
}

/// An info entry with `k` (shorter than [`KEY_BYTES`]) and `value`.
fn info(k: &str, value: Value) -> Info {
    let mut key = [0 as c_char; KEY_BYTES];
    for (d, s) in key.iter_mut().zip(k.bytes().take(KEY_BYTES - 1)) {
        *d = s as c_char;
    }
    Info { key, flags: 0, value }
}

/// PMIX_TIMEOUT's value: whole seconds, rounded up, at least 1 (0 means forever).
pub fn timeout_secs(t: Duration) -> c_int {
    let s = t.as_secs() + u64::from(t.subsec_nanos() > 0);
    s.clamp(1, c_int::MAX as u64) as c_int
}

impl Client {
    /// This process's rank in its namespace.
    pub fn rank(&self) -> u32 {
        self.me.rank
    }

    /// This process's namespace (the job's name in PMIx).
    pub fn namespace(&self) -> String {
        let b: Vec<u8> = self.me.nspace.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&b).into_owned()
    }

    /// Publishes `value` under `k` to every process of the job (PMIx_Put with
    /// PMIX_GLOBAL, then PMIx_Commit); the others can read it after the next fence.
    pub fn put(&self, k: &str, value: &str) -> Result<()> {
        let ck = key(k);
        let cv = CString::new(value).map_err(|_| Error::internal(format!("a value for PMIx key {k} holds a NUL")))?;
        let mut v = Value { kind: PMIX_STRING, data: Data { string: cv.as_ptr().cast_mut() } };
        // SAFETY: the key and the string are NUL-terminated and outlive the call, which copies them.
        let rc = unsafe { (self.api.put)(PMIX_GLOBAL, ck.as_ptr(), &mut v) };
        if rc != PMIX_SUCCESS {
            return Err(Error::system(format!("PMIx_Put of {k} failed: {}", status(&self.api, rc))));
        }
        // SAFETY: no arguments; pushes the values put so far to the local PMIx server.
        let rc = unsafe { (self.api.commit)() };
        if rc != PMIX_SUCCESS {
            return Err(Error::system(format!("PMIx_Commit of {k} failed: {}", status(&self.api, rc))));
        }
        Ok(())
    }

    /// Waits until every process of this namespace reaches its fence, collecting what
    /// each committed, for at most `timeout`.
    pub fn fence(&self, timeout: Duration) -> Result<()> {
        let infos = [
            info(PMIX_COLLECT_DATA, Value { kind: PMIX_BOOL, data: Data { flag: true } }),
            info(PMIX_TIMEOUT, Value { kind: PMIX_INT, data: Data { integer: timeout_secs(timeout) } }),
        ];
        // SAFETY: no process array means every process of this one's namespace; the info
        // entries are well-formed and outlive the call.
        let rc = unsafe { (self.api.fence)(std::ptr::null(), 0, infos.as_ptr(), infos.len()) };
        if rc != PMIX_SUCCESS {
            return Err(Error::system(format!(
                "PMIx_Fence of namespace {} (all its processes, collecting data, timeout {} s) failed: {}; every rank must call fcclCommInitFromEnv",
                self.namespace(),
                timeout_secs(timeout),
                status(&self.api, rc)
            )));
        }
        Ok(())
    }

    /// The string `rank` of this namespace published under `k`.
    pub fn get(&self, rank: u32, k: &str) -> Result<String> {
        let ck = key(k);
        let who = Proc { rank, ..self.me };
        let mut v: *mut Value = std::ptr::null_mut();
        // SAFETY: `who` and the key outlive the call; PMIx allocates the value it returns in `v`.
        let rc = unsafe { (self.api.get)(&who, ck.as_ptr(), std::ptr::null(), 0, &mut v) };
        if rc != PMIX_SUCCESS || v.is_null() {
            return Err(Error::system(format!(
                "PMIx_Get of {k} from rank {rank} of namespace {} failed: {}",
                self.namespace(),
                status(&self.api, rc)
            )));
        }
        // SAFETY: PMIx_Get succeeded, so `v` is a value PMIx allocated for us.
        let (kind, data) = unsafe { ((*v).kind, (*v).data) };
        let got = if kind == PMIX_STRING {
            // SAFETY: a PMIX_STRING value holds a NUL-terminated string or NULL.
            let s = unsafe { data.string };
            // SAFETY: checked non-NULL; the string lives until the value is freed below.
            (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
        } else {
            None
        };
        // SAFETY: releases the value as PMIX_VALUE_RELEASE does: its contents (for a
        // string, the string PMIx malloc'd), then the value PMIx malloc'd.
        unsafe {
            match self.api.value_destruct {
                Some(d) => d(v),
                None if kind == PMIX_STRING => libc::free(data.string.cast()),
                None => {}
            }
            libc::free(v.cast());
        }
        got.ok_or_else(|| {
            Error::system(format!(
                "PMIx_Get of {k} from rank {rank} of namespace {} gave a value of PMIx type {kind}, not a string (type {PMIX_STRING}): another program uses this key",
                self.namespace()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_are_pmix_commons() {
        // sizeof and offsetof as a C compiler gives them with pmix_common.h (PMIx 4.2, x86-64).
        assert_eq!((size_of::<Proc>(), offset_of!(Proc, rank)), (260, 256));
        assert_eq!((size_of::<Value>(), offset_of!(Value, data)), (32, 8));
        assert_eq!((size_of::<Info>(), offset_of!(Info, flags), offset_of!(Info, value)), (552, 512, 520));
    }

    #[test]
    fn info_keys_are_copied_and_terminated() {
        let i = info(PMIX_COLLECT_DATA, Value { kind: PMIX_BOOL, data: Data { flag: true } });
        // SAFETY: `info` leaves a NUL after the key.
        let k = unsafe { CStr::from_ptr(i.key.as_ptr()) };
        assert_eq!(k.to_str().unwrap(), "pmix.collect");
        let long = "k".repeat(KEY_BYTES + 10);
        let i = info(&long, Value { kind: PMIX_BOOL, data: Data { flag: true } });
        assert_eq!(i.key[KEY_BYTES - 2], b'k' as c_char);
        assert_eq!(i.key[KEY_BYTES - 1], 0);
    }

    #[test]
    fn timeouts_round_up_to_whole_seconds() {
        assert_eq!(timeout_secs(Duration::from_millis(1)), 1);
        assert_eq!(timeout_secs(Duration::ZERO), 1);
        assert_eq!(timeout_secs(Duration::from_millis(2001)), 3);
        assert_eq!(timeout_secs(Duration::from_secs(600)), 600);
        assert_eq!(timeout_secs(Duration::from_secs(u64::MAX)), c_int::MAX);
    }
}
