//! The C ABI: the only code that speaks C (docs/abi.md is the contract).
//!
//! One file per area. Every exported function runs its body inside
//! [`boundary::call`], which maps core errors to `fcclResult_t`, records the
//! thread-local message and turns a panic into `fcclInternalError`. A result
//! returned through a pointer is an `Option<&mut MaybeUninit<T>>` parameter (C's `T*`),
//! written with [`boundary::Out`]'s safe methods, which refuse NULL by name.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]
// The safety contract of every exported function is the C API's: pointers are NULL
// (checked) or valid for the sizes the arguments imply. It is stated once in the
// header's conventions rather than in a `# Safety` section per function.
#![allow(clippy::missing_safety_doc)]

/// `pub const NAME: TYPE = ENUM::NAME as TYPE;` for each name: the enumerators as the
/// integers the functions take and return.
macro_rules! int_values {
    ($ty:ident = $enum:ident :: { $($name:ident),* $(,)? }) => {
        $(pub const $name: $ty = $enum::$name as $ty;)*
    };
}
pub mod args;
pub mod boundary;
pub mod coll;
pub mod comm;
pub mod ext;
pub mod handle;
pub mod mem;

/// For Rust callers of the exported functions: `&mut x` as their out-parameter type.
pub use boundary::as_out;
pub use coll::*;
pub use comm::*;
pub use ext::*;
pub use mem::*;

use std::os::raw::{c_char, c_int};

// The enums are C enums in the header (cbindgen renames `fcclResult` to `fcclResult_t`,
// and so on), so a C or C++ compiler can tell a data type from an operator. Functions
// take and return them as `c_int` (`fcclResult_t` and friends here, left out of the
// header): a value from C that is no enumerator is an error, never undefined behaviour.
// The integer constants below are the enumerators' values for Rust callers.

/// Result of every call. Values are NCCL's, plus fcclCollectiveMismatch and fcclUnavailable.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum fcclResult {
    /// The call succeeded.
    fcclSuccess = 0,
    /// A CUDA call failed.
    fcclUnhandledCudaError = 1,
    /// A system call failed (out of memory, sockets, shared memory).
    fcclSystemError = 2,
    /// A bug in ferroccl: please report it with the message of fcclGetLastError.
    fcclInternalError = 3,
    /// An argument is invalid (NULL, out of range, overflowing, unknown enum value).
    fcclInvalidArgument = 4,
    /// The call is not valid in the current state (destroyed, aborted or broken communicator, unbalanced groups).
    fcclInvalidUsage = 5,
    /// A peer died, aborted or its connection broke.
    fcclRemoteError = 6,
    /// A non-blocking operation is still in progress.
    fcclInProgress = 7,
    /// A wait exceeded the communicator's timeout; the message names the ranks that did not arrive.
    fcclTimeout = 8,
    /// Ranks called different collectives, counts, types or roots.
    fcclCollectiveMismatch = 100,
    /// A library or backend the call needs (CUDA, NCCL) is not present.
    fcclUnavailable = 101,
}

/// Element type of a buffer (NCCL's values).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum fcclDataType {
    fcclInt8 = 0,
    fcclUint8 = 1,
    fcclInt32 = 2,
    fcclUint32 = 3,
    fcclInt64 = 4,
    fcclUint64 = 5,
    fcclFloat16 = 6,
    fcclFloat32 = 7,
    fcclFloat64 = 8,
    fcclBfloat16 = 9,
    /// OCP FP8 E4M3 (no infinities, max 448; results saturate).
    fcclFloat8e4m3 = 10,
    /// OCP FP8 E5M2 (IEEE-like, with infinities).
    fcclFloat8e5m2 = 11,
    /// Number of data types.
    fcclNumTypes = 12,
}

/// NCCL's other names of data types: macros for the enumerators in the header.
pub mod aliases {
    use super::fcclDataType;
    /// Same as fcclInt8.
    pub const fcclChar: fcclDataType = fcclDataType::fcclInt8;
    /// Same as fcclInt32.
    pub const fcclInt: fcclDataType = fcclDataType::fcclInt32;
    /// Same as fcclFloat16.
    pub const fcclHalf: fcclDataType = fcclDataType::fcclFloat16;
    /// Same as fcclFloat32.
    pub const fcclFloat: fcclDataType = fcclDataType::fcclFloat32;
    /// Same as fcclFloat64.
    pub const fcclDouble: fcclDataType = fcclDataType::fcclFloat64;
}

/// Reduction operator (NCCL's values). Half, bfloat16 and fp8 accumulate in float32 and round once.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum fcclRedOp {
    fcclSum = 0,
    fcclProd = 1,
    fcclMax = 2,
    fcclMin = 3,
    /// Sum divided by the number of ranks (integer division for integer types).
    fcclAvg = 4,
    /// Number of NCCL's reduction operators (0 .. 4); the bitwise ones below are
    /// ferroccl's extension, numbered from 64 so that NCCL's values never reach them.
    fcclNumOps = 5,
    /// Bitwise and: ferroccl's extension (as Gloo and MPI have), integer types only
    /// (fcclInt8 .. fcclUint64); a float type is fcclInvalidArgument.
    fcclBand = 64,
    /// Bitwise or: ferroccl's extension, integer types only.
    fcclBor = 65,
    /// Bitwise exclusive or: ferroccl's extension, integer types only.
    fcclBxor = 66,
}

/// A result as the functions return it (a [`fcclResult`] value).
/// cbindgen:no-export
pub type fcclResult_t = c_int;
/// A data type as the functions take it (a [`fcclDataType`] value, checked).
/// cbindgen:no-export
pub type fcclDataType_t = c_int;
/// An operator as the functions take it (a [`fcclRedOp`] value, checked).
/// cbindgen:no-export
pub type fcclRedOp_t = c_int;

int_values!(fcclResult_t = fcclResult::{
    fcclSuccess, fcclUnhandledCudaError, fcclSystemError, fcclInternalError, fcclInvalidArgument,
    fcclInvalidUsage, fcclRemoteError, fcclInProgress, fcclTimeout, fcclCollectiveMismatch, fcclUnavailable,
});
int_values!(fcclDataType_t = fcclDataType::{
    fcclInt8, fcclUint8, fcclInt32, fcclUint32, fcclInt64, fcclUint64, fcclFloat16, fcclFloat32,
    fcclFloat64, fcclBfloat16, fcclFloat8e4m3, fcclFloat8e5m2, fcclNumTypes,
});
int_values!(fcclRedOp_t = fcclRedOp::{
    fcclSum, fcclProd, fcclMax, fcclMin, fcclAvg, fcclNumOps, fcclBand, fcclBor, fcclBxor,
});
pub const fcclChar: fcclDataType_t = fcclInt8;
pub const fcclInt: fcclDataType_t = fcclInt32;
pub const fcclHalf: fcclDataType_t = fcclFloat16;
pub const fcclFloat: fcclDataType_t = fcclFloat32;
pub const fcclDouble: fcclDataType_t = fcclFloat64;

/// Colour for fcclCommSplit: this rank joins no new communicator (newcomm becomes NULL).
pub const FCCL_SPLIT_NOCOLOR: c_int = -1;

/// Backend choice in fcclConfig_t: pick automatically.
pub const FCCL_BACKEND_AUTO: c_int = 0;
/// Backend choice: the built-in backend (host memory; several ranks per GPU).
pub const FCCL_BACKEND_HOST: c_int = 1;
/// Backend choice: NCCL (CUDA memory, one GPU per rank).
pub const FCCL_BACKEND_NCCL: c_int = 2;

/// checkMode in fcclConfig_t: ranks on different hosts skip the round that compares
/// calls before data moves (a mismatch is then found from the call's first message,
/// and breaks the communicator). Ranks of one host always compare. Ranks in separate
/// processes sharing one GPU stop agreeing on device calls on the host once every rank
/// has checkMode off (or unset, from a call on device memory): each posts its call and goes on, and a mismatch (or one rank's
/// graph capture) that a proxy thread (rank 0's; under MPS every rank's) finds
/// afterwards fails the communicator on every rank (fcclCommGetAsyncError names it).
pub const FCCL_CHECK_OFF: c_int = 0;
/// checkMode: fingerprint each call and compare across ranks to detect mismatches before
/// any data moves, so that a mismatch fails that call on every rank and the communicator
/// stays usable. Left unset (FCCL_CONFIG_INITIALIZER) with FERROCCL_CHECK unset, a
/// communicator does this too, except that ranks in separate processes sharing one GPU
/// post their calls as with FCCL_CHECK_OFF once a call has passed device memory on every
/// rank: device calls are then enqueued without waiting for the other ranks, as NCCL's.
pub const FCCL_CHECK_FINGERPRINT: c_int = 1;

/// Library version, also returned by fcclGetVersion as MAJOR*10000 + MINOR*100 + PATCH.
/// This is the one place the version is kept; Cargo.toml's version must match (a test checks).
pub const FCCL_MAJOR: c_int = 0;
pub const FCCL_MINOR: c_int = 1;
pub const FCCL_PATCH: c_int = 0;
pub const FCCL_VERSION_CODE: c_int = FCCL_MAJOR * 10000 + FCCL_MINOR * 100 + FCCL_PATCH;

/// Bytes in a fcclUniqueId.
pub const FCCL_UNIQUE_ID_BYTES: usize = 128;
/// Value of fcclConfig_t.magic set by FCCL_CONFIG_INITIALIZER.
pub const FCCL_CONFIG_MAGIC: u32 = 0xcafe_beef;
/// Version of the fcclConfig_t layout.
pub const FCCL_CONFIG_VERSION: u32 = 1;
/// An int field of fcclConfig_t left at its default.
pub const FCCL_CONFIG_UNDEF_INT: c_int = -2147483647 - 1;

/// Opaque communicator.
pub struct fcclComm {
    _private: [u8; 0],
}

/// A communicator handle: created by fcclCommInit*, released by fcclCommDestroy or fcclCommAbort.
pub type fcclComm_t = *mut fcclComm;

/// CUDA's stream type, so a cudaStream_t passes unchanged; host-memory calls take NULL.
pub struct CUstream_st {
    _private: [u8; 0],
}

/// A CUDA stream (cudaStream_t), or NULL. A device call on a stream that is being captured
/// into a CUDA graph returns fcclInvalidUsage on every rank and enqueues nothing (the
/// built-in paths cannot be replayed from a graph); the NCCL backend passes it through.
pub type fcclStream_t = *mut CUstream_st;

/// The rendezvous handle: opaque, safe to copy and to send to other processes by any
/// means (file, MPI, environment as hex). Made by fcclGetUniqueId.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct fcclUniqueId {
    pub internal: [c_char; FCCL_UNIQUE_ID_BYTES],
}

/// Communicator options. Initialise with FCCL_CONFIG_INITIALIZER, then set fields.
#[repr(C)]
pub struct fcclConfig_t {
    /// sizeof(fcclConfig_t), set by FCCL_CONFIG_INITIALIZER.
    pub size: usize,
    /// FCCL_CONFIG_MAGIC, set by FCCL_CONFIG_INITIALIZER.
    pub magic: u32,
    /// FCCL_CONFIG_VERSION, set by FCCL_CONFIG_INITIALIZER.
    pub version: u32,
    /// 1 (default): calls return when complete. 0: non-blocking, as NCCL's: creation and
    /// calls return fcclInProgress and finish on the communicator's progress thread;
    /// poll fcclCommGetAsyncError (see there). fcclCommSplit's children inherit it.
    pub blocking: c_int,
    /// Bound on every blocking wait, in ms; 0 or FCCL_CONFIG_UNDEF_INT = FERROCCL_TIMEOUT_MS or 10 minutes.
    pub timeoutMs: c_int,
    /// FCCL_BACKEND_AUTO (default), FCCL_BACKEND_HOST or FCCL_BACKEND_NCCL.
    pub backend: c_int,
    /// A name for logs and messages (copied), or NULL.
    pub commName: *const c_char,
    /// FCCL_CHECK_FINGERPRINT or FCCL_CHECK_OFF; unset: FERROCCL_CHECK's, and if that is
    /// unset too, fingerprint except posted device calls on one GPU (FCCL_CHECK_FINGERPRINT).
    pub checkMode: c_int,
}
