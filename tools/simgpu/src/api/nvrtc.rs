//! The simulated NVRTC's C API (needs no cuInit).

use crate::config::{self, Trace};
use crate::nvrtc::{Fail, Program, ARCHS, DEFAULT_NAME};
use cudarc::nvrtc::sys::nvrtcResult as N;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock, PoisonError};

type Programs = HashMap<u64, Program>;

fn programs() -> std::sync::MutexGuard<'static, Programs> {
    static P: OnceLock<Mutex<Programs>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(PoisonError::into_inner)
}

/// Opaque program handles: never NULL, never reused, never dereferenceable.
fn new_handle() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    0x5e70_0000_0000 | (NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 4)
}

/// Runs an NVRTC body: panics become NVRTC_ERROR_INTERNAL_ERROR; errors are traced.
fn nv(name: &str, f: impl FnOnce() -> Result<(), (N, String)>) -> N {
    let r = catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err((N::NVRTC_ERROR_INTERNAL_ERROR, "internal error (simulator bug)".into())));
    match r {
        Ok(()) => {
            if config::trace() == Trace::All {
                eprintln!("simgpu: {name} -> NVRTC_SUCCESS");
            }
            N::NVRTC_SUCCESS
        }
        Err((code, why)) => {
            if config::trace() != Trace::Off {
                eprintln!("simgpu: {name}: {why} -> {code:?}");
            }
            code
        }
    }
}

fn fail(code: N, why: impl Into<String>) -> Result<(), (N, String)> {
    Err((code, why.into()))
}

/// Runs `f` on the program `prog` names (NVRTC_ERROR_INVALID_PROGRAM otherwise).
fn with_program<T>(
    prog: *mut c_void,
    f: impl FnOnce(&mut Program) -> Result<T, (N, String)>,
) -> Result<T, (N, String)> {
    let mut ps = programs();
    match ps.get_mut(&(prog as u64)) {
        Some(p) => f(p),
        None => Err((N::NVRTC_ERROR_INVALID_PROGRAM, format!("{prog:?} is not a program"))),
    }
}

/// Copies a NUL-terminated string into the caller's buffer.
///
/// # Safety
/// `buf` is NULL or holds `s.len() + 1` bytes (the size the matching *Size call reported).
unsafe fn copy_out(buf: *mut c_char, s: &CStr) -> Result<(), (N, String)> {
    if buf.is_null() {
        return fail(N::NVRTC_ERROR_INVALID_INPUT, "output buffer is NULL");
    }
    let b = s.to_bytes_with_nul();
    // SAFETY: the buffer holds the size reported by the *Size call (caller).
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), buf.cast::<u8>(), b.len()) };
    Ok(())
}

/// Writes an output value, NVRTC_ERROR_INVALID_INPUT for NULL.
///
/// # Safety
/// `p` is NULL or writable.
unsafe fn put<T>(p: *mut T, v: T) -> Result<(), (N, String)> {
    if p.is_null() {
        return fail(N::NVRTC_ERROR_INVALID_INPUT, "output pointer is NULL");
    }
    // SAFETY: non-NULL and writable (caller).
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// CUDA 13.0.
#[no_mangle]
pub unsafe extern "C" fn nvrtcVersion(major: *mut c_int, minor: *mut c_int) -> N {
    // SAFETY: `put` checks NULL.
    nv("nvrtcVersion", || unsafe {
        if minor.is_null() {
            return fail(N::NVRTC_ERROR_INVALID_INPUT, "minor is NULL");
        }
        put(major, 13)?;
        put(minor, 0)
    })
}

/// The enum name of each result ("NVRTC_ERROR_COMPILATION"), as the real NVRTC returns.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetErrorString(result: c_int) -> *const c_char {
    static S: OnceLock<Vec<CString>> = OnceLock::new();
    let names = S.get_or_init(|| {
        (0..=N::NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED as u32)
            .map(|v| {
                // SAFETY: nvrtcResult is a `repr(u32)` enum with exactly the contiguous values
                // 0..=NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED.
                let r: N = unsafe { std::mem::transmute::<u32, N>(v) };
                CString::new(format!("{r:?}")).expect("no NUL")
            })
            .collect()
    });
    static UNKNOWN: &CStr = c"NVRTC_ERROR unknown";
    usize::try_from(result).ok().and_then(|i| names.get(i)).map_or(UNKNOWN.as_ptr(), |s| s.as_ptr())
}

/// Records the source; headers are accepted and ignored (nothing is preprocessed).
#[no_mangle]
pub unsafe extern "C" fn nvrtcCreateProgram(
    prog: *mut *mut c_void,
    src: *const c_char,
    name: *const c_char,
    num_headers: c_int,
    headers: *const *const c_char,
    include_names: *const *const c_char,
) -> N {
    nv("nvrtcCreateProgram", || {
        if prog.is_null() || src.is_null() || num_headers < 0 {
            return fail(N::NVRTC_ERROR_INVALID_INPUT, "prog or src is NULL, or numHeaders < 0");
        }
        if num_headers > 0 && (headers.is_null() || include_names.is_null()) {
            return fail(N::NVRTC_ERROR_INVALID_INPUT, "numHeaders > 0 with NULL arrays");
        }
        // SAFETY: NUL-terminated strings (caller).
        let src = unsafe { CStr::from_ptr(src) }.to_string_lossy().into_owned();
        let name = if name.is_null() {
            DEFAULT_NAME.to_string()
        } else {
            // SAFETY: as above.
            unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
        };
        let h = new_handle();
        programs().insert(h, Program { src, name, ..Default::default() });
        // SAFETY: checked non-NULL.
        unsafe { put(prog, h as *mut c_void) }
    })
}

/// Destroys the program and sets `*prog` to NULL.
#[no_mangle]
pub unsafe extern "C" fn nvrtcDestroyProgram(prog: *mut *mut c_void) -> N {
    nv("nvrtcDestroyProgram", || {
        if prog.is_null() {
            return fail(N::NVRTC_ERROR_INVALID_PROGRAM, "prog is NULL");
        }
        // SAFETY: non-NULL, points at a program handle (caller).
        let h = unsafe { *prog } as u64;
        if programs().remove(&h).is_none() {
            return fail(N::NVRTC_ERROR_INVALID_PROGRAM, format!("{h:#x} is not a program"));
        }
        // SAFETY: as above.
        unsafe { *prog = std::ptr::null_mut() };
        Ok(())
    })
}

/// "Compiles": every `__global__` function must be an extern "C" kernel the simulator
/// implements, else NVRTC_ERROR_COMPILATION with a log naming it. Options must start with
/// `-` (NVRTC_ERROR_INVALID_OPTION otherwise); any architecture is accepted.
#[no_mangle]
pub unsafe extern "C" fn nvrtcCompileProgram(
    prog: *mut c_void,
    num_options: c_int,
    options: *const *const c_char,
) -> N {
    nv("nvrtcCompileProgram", || {
        if num_options < 0 || (num_options > 0 && options.is_null()) {
            return fail(N::NVRTC_ERROR_INVALID_INPUT, "numOptions < 0 or options NULL");
        }
        let mut opts = Vec::new();
        for i in 0..num_options as usize {
            // SAFETY: `options` has `num_options` entries (caller).
            let o = unsafe { *options.add(i) };
            if o.is_null() {
                return fail(N::NVRTC_ERROR_INVALID_OPTION, format!("options[{i}] is NULL"));
            }
            // SAFETY: a NUL-terminated option (caller).
            opts.push(unsafe { CStr::from_ptr(o) }.to_string_lossy().into_owned());
        }
        crate::costs::add(crate::costs::Cost::Compiles, 1);
        with_program(prog, |p| {
            p.compile(&opts).map_err(|e| {
                let code = match e {
                    Fail::InvalidOption => N::NVRTC_ERROR_INVALID_OPTION,
                    _ => N::NVRTC_ERROR_COMPILATION,
                };
                (code, p.log.to_string_lossy().trim_end().to_string())
            })
        })
    })
}

fn ptx_of(p: &Program) -> Option<&CString> {
    p.ptx.as_ref()
}

fn log_of(p: &Program) -> Option<&CString> {
    Some(&p.log)
}

macro_rules! size_and_text {
    ($(#[$doc:meta])* $size_fn:ident, $fn:ident, $what:literal, $field:ident) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $size_fn(prog: *mut c_void, size: *mut usize) -> N {
            nv(stringify!($size_fn), || {
                let n = with_program(prog, |p| {
                    $field(p).map(|s| s.as_bytes_with_nul().len()).ok_or_else(|| {
                        (N::NVRTC_ERROR_INVALID_PROGRAM, concat!("the program has no ", $what, " (not compiled)").into())
                    })
                })?;
                // SAFETY: `put` checks NULL.
                unsafe { put(size, n) }
            })
        }

        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $fn(prog: *mut c_void, buf: *mut c_char) -> N {
            nv(stringify!($fn), || {
                with_program(prog, |p| match $field(p) {
                    // SAFETY: the buffer holds what the size call reported (caller).
                    Some(s) => unsafe { copy_out(buf, s) },
                    None => fail(N::NVRTC_ERROR_INVALID_PROGRAM, concat!("the program has no ", $what, " (not compiled)")),
                })
            })
        }
    };
}

size_and_text!(
    /// The PTX-like text of a compiled program (size includes the NUL).
    nvrtcGetPTXSize, nvrtcGetPTX, "PTX", ptx_of
);
/// The same text as nvrtcGetPTX (the simulated driver loads it either way), only for a
/// program compiled for a real architecture (`sm_*`): for a virtual one NVRTC has no
/// CUBIN, its size is 0 and nvrtcGetCUBIN fails.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetCUBINSize(prog: *mut c_void, size: *mut usize) -> N {
    nv("nvrtcGetCUBINSize", || {
        let n = with_program(prog, |p| match (&p.ptx, p.real_arch) {
            (None, _) => Err((N::NVRTC_ERROR_INVALID_PROGRAM, "the program has no CUBIN (not compiled)".into())),
            (Some(_), false) => Ok(0),
            (Some(s), true) => Ok(s.as_bytes_with_nul().len()),
        })?;
        // SAFETY: `put` checks NULL.
        unsafe { put(size, n) }
    })
}

/// See nvrtcGetCUBINSize.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetCUBIN(prog: *mut c_void, buf: *mut c_char) -> N {
    nv("nvrtcGetCUBIN", || {
        with_program(prog, |p| match (&p.ptx, p.real_arch) {
            (None, _) => fail(N::NVRTC_ERROR_INVALID_PROGRAM, "the program has no CUBIN (not compiled)"),
            (Some(_), false) => fail(
                N::NVRTC_ERROR_INVALID_INPUT,
                "no CUBIN: the program was compiled for a virtual architecture (compute_*); use sm_*",
            ),
            // SAFETY: the buffer holds what the size call reported (caller).
            (Some(s), true) => unsafe { copy_out(buf, s) },
        })
    })
}
size_and_text!(
    /// The compilation log ("" before or after a successful compile; size includes the NUL).
    nvrtcGetProgramLogSize, nvrtcGetProgramLog, "log", log_of
);

/// Records a name expression (before compiling: after it is
/// NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION).
#[no_mangle]
pub unsafe extern "C" fn nvrtcAddNameExpression(prog: *mut c_void, expr: *const c_char) -> N {
    nv("nvrtcAddNameExpression", || {
        if expr.is_null() {
            return fail(N::NVRTC_ERROR_INVALID_INPUT, "name expression is NULL");
        }
        // SAFETY: NUL-terminated (caller).
        let e = unsafe { CStr::from_ptr(expr) }.to_string_lossy().into_owned();
        with_program(prog, |p| {
            if p.ptx.is_some() {
                return fail(N::NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION, "already compiled");
            }
            p.exprs.push(e);
            Ok(())
        })
    })
}

/// The lowered name of a name expression: an extern "C" kernel's own name.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetLoweredName(prog: *mut c_void, expr: *const c_char, lowered: *mut *const c_char) -> N {
    nv("nvrtcGetLoweredName", || {
        if expr.is_null() || lowered.is_null() {
            return fail(N::NVRTC_ERROR_INVALID_INPUT, "name expression or output is NULL");
        }
        // SAFETY: NUL-terminated (caller).
        let e = unsafe { CStr::from_ptr(expr) }.to_string_lossy().into_owned();
        let p = with_program(prog, |p| {
            if p.ptx.is_none() {
                return Err((N::NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION, "not compiled".into()));
            }
            match p.lowered.get(&e) {
                // The CString lives in the program until it is destroyed, as NVRTC promises.
                Some(s) => Ok(s.as_ptr()),
                None => {
                    Err((N::NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID, format!("{e:?} was not added before compiling")))
                }
            }
        })?;
        // SAFETY: checked non-NULL.
        unsafe { put(lowered, p) }
    })
}

/// The number of architectures nvrtcGetSupportedArchs reports.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetNumSupportedArchs(n: *mut c_int) -> N {
    // SAFETY: `put` checks NULL.
    nv("nvrtcGetNumSupportedArchs", || unsafe { put(n, ARCHS.len() as c_int) })
}

/// CUDA 13.0's architectures (75 ... 121).
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetSupportedArchs(archs: *mut c_int) -> N {
    nv("nvrtcGetSupportedArchs", || {
        if archs.is_null() {
            return fail(N::NVRTC_ERROR_INVALID_INPUT, "output is NULL");
        }
        // SAFETY: the caller's array holds nvrtcGetNumSupportedArchs entries.
        unsafe { std::ptr::copy_nonoverlapping(ARCHS.as_ptr(), archs, ARCHS.len()) };
        Ok(())
    })
}
