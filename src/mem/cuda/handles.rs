//! Typed CUDA handles: a context and a stream are different things to the driver, so
//! they are different types here. Each holds the driver's handle as an address, so that
//! it is `Send`, `Sync` and hashable; the driver owns what it names.

use super::cu;

/// A CUDA context (`CUcontext`). [`Ctx::NONE`] (NULL) stands for the calling thread's
/// current context, or device 0's primary one, where a call accepts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ctx(usize);

impl Ctx {
    pub const NONE: Ctx = Ctx(0);

    pub fn from_raw(c: cu::CUcontext) -> Ctx {
        Ctx(c as usize)
    }

    pub fn raw(self) -> cu::CUcontext {
        self.0 as cu::CUcontext
    }

    pub fn is_none(self) -> bool {
        self.0 == 0
    }
}

/// A CUDA stream (`CUstream`, `cudaStream_t` from C). [`Stream::DEFAULT`] (NULL) is
/// the legacy default stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stream(usize);

impl Stream {
    pub const DEFAULT: Stream = Stream(0);

    /// The stream a C caller passed (`cudaStream_t`; NULL: the default stream).
    pub fn from_ptr(s: *const std::ffi::c_void) -> Stream {
        Stream(s as usize)
    }

    pub fn raw(self) -> cu::CUstream {
        self.0 as cu::CUstream
    }

    /// The stream as C sees it, for a library that takes a `cudaStream_t` (NCCL).
    pub fn as_ptr(self) -> *mut std::ffi::c_void {
        self.0 as *mut std::ffi::c_void
    }
}

/// A device address (`CUdeviceptr`) the host never dereferences, such as a host-mapped
/// word as the device sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DevPtr(u64);

impl DevPtr {
    pub fn from_raw(d: cu::CUdeviceptr) -> DevPtr {
        DevPtr(d)
    }

    pub fn raw(self) -> cu::CUdeviceptr {
        self.0
    }

    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevPtr {
        DevPtr(self.0 + bytes as u64)
    }
}
