//! Why a call leaves the GPU-to-GPU path for host staging, what its user can do about
//! it, and the warning that says so once per communicator and remedy.

use super::Ipc;
use crate::log;

/// Why this rank cannot take a call GPU to GPU, and what its user can do about it.
#[derive(Clone, Debug)]
pub(crate) struct Fallback {
    pub why: String,
    pub fix: &'static str,
}

impl Fallback {
    pub fn new(why: impl Into<String>, fix: &'static str) -> Fallback {
        Fallback { why: why.into(), fix }
    }
}

/// What a user can do about each reason a call leaves the GPU-to-GPU path.
pub(crate) mod fix {
    pub const REGION: &str =
        "the control region is POSIX shared memory: check the free space and permissions of /dev/shm";
    pub const CONTEXT: &str = "allocate every device buffer of a communicator in one context (the device's primary context, as the CUDA runtime and PyTorch do)";
    pub const MEMOPS: &str = "the path orders the ranks' streams with stream memory operations (the _v2 entry points, on by default since CUDA 11.7) on host-mapped memory: update the NVIDIA driver, or set FERROCCL_CUDA_IPC=0 to stage on purpose";
    pub const HOST_MEMORY: &str = "pass device memory on every rank (or host memory on every rank)";
    pub const EXPORT: &str = "allocate buffers with cudaMalloc/cuMemAlloc, or with cuMemCreate requesting CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (as PyTorch's expandable_segments:True does): managed and stream-ordered pool memory cannot be shared between processes";
    pub const VMM: &str = "allocate with requestedHandleTypes including CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, as PyTorch's expandable segments do, on a driver that reports CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED; a buffer must lie in consecutive mappings";

    /// The remedy for a buffer at `p` that cannot be shared: VMM memory has its own.
    pub fn export(p: *const u8) -> &'static str {
        if crate::mem::cuda::Retained::at(p).is_ok() {
            VMM
        } else {
            EXPORT
        }
    }
    pub const NVRTC: &str =
        "the reduction kernels are compiled at run time: install NVRTC for this driver's CUDA version (libnvrtc.so)";
    pub const OVERLAP: &str = "pass an output that does not overlap the input";
    pub const PEER: &str = "see the warning of the rank named";
}

impl Ipc {
    /// Says that `what` leaves the GPU-to-GPU path for host staging: a WARN the first
    /// time this communicator meets `f.fix`, INFO after that.
    pub(super) fn fell_back(&self, what: &str, f: &Fallback) {
        let first = {
            let mut w = self.warned.lock().unwrap_or_else(|p| p.into_inner());
            !w.contains(&f.fix) && {
                w.push(f.fix);
                true
            }
        };
        let line = format_args!(
            "rank {}: {what} goes through host staging, not GPU to GPU: {}. To fix: {}{}",
            self.rank,
            f.why,
            f.fix,
            if first { " (said once per communicator; FERROCCL_DEBUG=INFO names the path of every call)" } else { "" }
        );
        if first {
            log::warn(line);
        } else {
            log::info(line);
        }
    }
}
