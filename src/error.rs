//! The core's one error type and its stable mapping to `fcclResult_t`.

use std::fmt;

/// Result codes of docs/abi.md (NCCL's values, plus two of our own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Code {
    Success = 0,
    UnhandledCudaError = 1,
    SystemError = 2,
    InternalError = 3,
    InvalidArgument = 4,
    InvalidUsage = 5,
    RemoteError = 6,
    InProgress = 7,
    Timeout = 8,
    CollectiveMismatch = 100,
    Unavailable = 101,
}

impl Code {
    /// The fixed description returned by `fcclGetErrorString`.
    pub const fn describe(self) -> &'static str {
        match self {
            Code::Success => "no error",
            Code::UnhandledCudaError => "unhandled cuda error (run with FERROCCL_DEBUG=INFO for details)",
            Code::SystemError => "unhandled system error (run with FERROCCL_DEBUG=INFO for details)",
            Code::InternalError => "internal error - please report this issue to the ferroccl developers",
            Code::InvalidArgument => "invalid argument (see fcclGetLastError for details)",
            Code::InvalidUsage => "invalid usage (see fcclGetLastError for details)",
            Code::RemoteError => "remote process exited or there was a network error",
            Code::InProgress => "ferroccl operation in progress",
            Code::Timeout => "operation timed out (see fcclGetLastError for the ranks that did not arrive)",
            Code::CollectiveMismatch => "ranks called mismatched collectives (see fcclGetLastError)",
            Code::Unavailable => "a library or backend needed by the call is not available (e.g. CUDA)",
        }
    }

    /// Maps an integer from C to a code, if it is one.
    pub fn from_i32(v: i32) -> Option<Code> {
        Some(match v {
            0 => Code::Success,
            1 => Code::UnhandledCudaError,
            2 => Code::SystemError,
            3 => Code::InternalError,
            4 => Code::InvalidArgument,
            5 => Code::InvalidUsage,
            6 => Code::RemoteError,
            7 => Code::InProgress,
            8 => Code::Timeout,
            100 => Code::CollectiveMismatch,
            101 => Code::Unavailable,
            _ => return None,
        })
    }
}

/// An error: a code and a message that says what went wrong and what to do.
///
/// The message does not carry the name of the C call; the FFI boundary
/// prefixes it, so one core error reads right from every entry point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub code: Code,
    pub msg: String,
    /// For remote errors: the rank at the root of the failure (the one that died,
    /// aborted or broke), so peers that hear of it second-hand still name it.
    pub culprit: Option<usize>,
}

impl Error {
    pub fn new(code: Code, msg: impl Into<String>) -> Error {
        Error { code, msg: msg.into(), culprit: None }
    }
    pub fn invalid_arg(msg: impl Into<String>) -> Error {
        Error::new(Code::InvalidArgument, msg)
    }
    pub fn invalid_usage(msg: impl Into<String>) -> Error {
        Error::new(Code::InvalidUsage, msg)
    }
    pub fn system(msg: impl Into<String>) -> Error {
        Error::new(Code::SystemError, msg)
    }
    pub fn internal(msg: impl Into<String>) -> Error {
        Error::new(Code::InternalError, msg)
    }
    pub fn remote(msg: impl Into<String>) -> Error {
        Error::new(Code::RemoteError, msg)
    }
    pub fn timeout(msg: impl Into<String>) -> Error {
        Error::new(Code::Timeout, msg)
    }
    /// A timeout that came down to rank `culprit` (see `transport::Transport::blame`).
    pub fn timeout_blaming(culprit: Option<usize>, msg: impl Into<String>) -> Error {
        Error { code: Code::Timeout, msg: msg.into(), culprit }
    }
    pub fn mismatch(msg: impl Into<String>) -> Error {
        Error::new(Code::CollectiveMismatch, msg)
    }
    /// A remote error caused by rank `culprit`.
    pub fn remote_rank(culprit: usize, msg: impl Into<String>) -> Error {
        Error { code: Code::RemoteError, msg: msg.into(), culprit: Some(culprit) }
    }
    pub fn unavailable(msg: impl Into<String>) -> Error {
        Error::new(Code::Unavailable, msg)
    }
    /// A system error from the last OS error, naming what was attempted.
    pub fn os(what: impl fmt::Display) -> Error {
        let e = std::io::Error::last_os_error();
        Error::system(format!("{what}: {e}"))
    }
    /// Adds context in front of the message.
    pub fn context(mut self, what: impl fmt::Display) -> Error {
        self.msg = format!("{what}: {}", self.msg);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::system(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
