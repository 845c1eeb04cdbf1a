//! Why a call leaves the GPU-to-GPU path for host staging, what its user can do about
//! it, and the warning that says so once per communicator and remedy.

use super::Ipc;
use crate::backend::{host, pack, staging, Exec, Outcome};
use crate::coll::{Call, CollKind};
use crate::error::Result;
use crate::log;
use crate::mem::Placement;

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
    /// Posted calls (checkMode off or unset) cannot be staged, whoever passes host memory.
    pub const HOST_MEMORY_POSTED: &str = "pass device memory (posted calls are not agreed on before they run, so \
        they cannot be staged through the host even when every rank passes host memory; FERROCCL_CHECK=1 or \
        checkMode FCCL_CHECK_FINGERPRINT stages such calls)";
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
    /// Says that `what` leaves the GPU-to-GPU path for host staging.
    pub(super) fn fell_back(&self, what: &str, f: &Fallback) {
        self.say(f, format_args!("{what} goes through host staging, not GPU to GPU: {}", f.why));
    }

    /// Says that this rank's buffers of `what` go through lent device memory because
    /// they cannot be shared (`f`).
    pub(super) fn detoured(&self, what: &str, f: &Fallback) {
        self.say(
            f,
            format_args!(
                "{what} stays GPU to GPU, but {}: this rank's stream copies it into device memory the communicator lends and the results back (one more device copy per call)",
                f.why
            ),
        );
    }

    /// `what` happened for reason `f`, and its fix: a WARN the first time this
    /// communicator meets `f.fix`, INFO after that.
    fn say(&self, f: &Fallback, what: std::fmt::Arguments<'_>) {
        let first = {
            let mut w = self.warned.lock().unwrap_or_else(|p| p.into_inner());
            !w.contains(&f.fix) && {
                w.push(f.fix);
                true
            }
        };
        let line = format_args!(
            "rank {}: {what}. To fix: {}{}",
            self.rank,
            f.fix,
            if first { " (said once per communicator; FERROCCL_DEBUG=INFO names the path of every call)" } else { "" }
        );
        if first {
            log::warn(line);
        } else {
            log::info(line);
        }
    }

    /// Runs `call` after `f` took it off the GPU-to-GPU path (on every rank alike): on
    /// the built-in backend, device buffers staged after the calls before it on the
    /// stream. The caller has left the call's context.
    pub(super) fn stage(&self, x: &mut Exec<'_>, call: &Call, f: &Fallback) -> Result<Outcome> {
        let (c, n) = (&call.coll, self.nranks);
        self.fell_back(c.kind.c_name(), f);
        if c.placement == Placement::Host {
            // This rank's buffers are host memory: the host algorithms serve it.
            x.backend = "host";
            *x.seq += 1;
            return host::execute(x, &[Call { coll: c.clone(), seq: *x.seq }]);
        }
        // A reduce_scatter along an axis is packed first (the host has no strided form).
        let coll = match c.strided {
            Some(_) if c.kind == CollKind::ReduceScatter => pack::pack_reduce_scatter(c, n)?,
            _ => c.clone(),
        };
        // A fresh sequence number: the descriptor exchange used the call's own.
        *x.seq += 1;
        let staged = Call { coll, seq: *x.seq };
        let res = staging::run(x, &staged, self.rank, n)?;
        x.backend = "staged";
        Ok(res)
    }
}
