//! The one boundary every exported function goes through.

use super::{fcclInProgress, fcclInternalError, fcclResult_t, fcclSuccess};
use crate::comm::Issued;
use crate::error::Result;
use std::cell::RefCell;
use std::ffi::CString;
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

/// Writes `value` through an out-pointer that the caller checked for NULL.
///
/// # Safety
/// `p` must be valid for a write of `T`.
pub unsafe fn write_out<T>(p: *mut T, value: T) {
    // SAFETY: guaranteed by the caller.
    unsafe { p.write(value) }
}
