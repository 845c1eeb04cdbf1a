//! The one boundary every exported function goes through.

use super::{fcclInProgress, fcclInternalError, fcclResult_t, fcclSuccess};
use crate::comm::Issued;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::ffi::CString;
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error.
pub fn set_last_error(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// Pointer to this thread's last error message, valid until this thread's next failing call.
pub fn last_error_ptr() -> *const std::os::raw::c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// What a successful body returns: `()` for a call that is complete, [`Issued`] for
/// one that may still run (non-blocking communicators: fcclInProgress, no message).
pub trait Outcome {
    fn code(self) -> fcclResult_t;
}

impl Outcome for () {
    #[inline]
    fn code(self) -> fcclResult_t {
        fcclSuccess
    }
}

impl Outcome for Issued {
    #[inline]
    fn code(self) -> fcclResult_t {
        match self {
            Issued::Done => fcclSuccess,
            Issued::InProgress => fcclInProgress,
        }
    }
}

/// Runs an exported function's body: errors become codes with a message that
/// starts with the C function's name, and a panic never crosses into C.
pub fn call<T: Outcome>(name: &str, body: impl FnOnce() -> Result<T>) -> fcclResult_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(done)) => done.code(),
        Ok(Err(e)) => {
            set_last_error(format!("{name}: {}", e.msg));
            e.code as fcclResult_t
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(format!("{name}: internal error ({what}); please report this to the ferroccl developers"));
            fcclInternalError
        }
    }
}

/// An exported function's out-parameter as C passes it (`T*`, NULL being `None`): the
/// signatures spell out `Option<&mut MaybeUninit<T>>` because cbindgen renders exactly
/// that as `T*` (an alias would reach the header under its own name). The C contract
/// (a non-NULL pointer is valid for a write of `T`) is thereby in the type, so the body
/// writes with safe code and NULL becomes the usual error.
pub trait Out<'a, T> {
    /// The place to write, or fcclInvalidArgument naming the parameter `name` when NULL.
    fn required(self, name: &str) -> Result<&'a mut MaybeUninit<T>>;
    /// Writes `value`, or fcclInvalidArgument naming `name` when NULL.
    fn put(self, name: &str, value: T) -> Result<()>;
}

impl<'a, T> Out<'a, T> for Option<&'a mut MaybeUninit<T>> {
    fn required(self, name: &str) -> Result<&'a mut MaybeUninit<T>> {
        self.ok_or_else(|| Error::invalid_arg(format!("{name} is NULL; pass a pointer to receive the result")))
    }

    fn put(self, name: &str, value: T) -> Result<()> {
        self.required(name)?.write(value);
        Ok(())
    }
}

/// `x` as an out-parameter, for Rust code that calls the exported functions (the NCCL
/// shim, tests, the benchmark): they take `Option<&mut MaybeUninit<T>>`, which C sees as `T*`.
///
/// # Safety
/// The function it is passed to writes only whole values of `T` through it (never
/// `MaybeUninit::uninit()`), as every exported function of this library does.
pub unsafe fn as_out<T: Copy>(x: &mut T) -> Option<&mut MaybeUninit<T>> {
    // SAFETY: MaybeUninit<T> has T's layout; the caller promises that only initialised
    // values are written, so `x` still holds a valid T afterwards.
    Some(unsafe { &mut *(x as *mut T).cast::<MaybeUninit<T>>() })
}
