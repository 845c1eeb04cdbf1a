//! Device memory of one call, allocated and freed in a stream's order.

use super::*;

/// Device memory one call uses for packed data, allocated and freed in the order
/// of `stream` (cuMemAllocAsync/cuMemFreeAsync): dropping it while the stream still
/// runs work on it is safe, the free waits for that work.
pub struct Scratch {
    ptr: u64,
    ctx: Ctx,
    stream: Stream,
    /// Allocated with cuMemAlloc (no stream-ordered allocator): freed after a sync.
    plain: bool,
}

impl Scratch {
    /// `bytes` (> 0) of device memory of context `ctx`, usable by work queued on `stream` from now on.
    pub fn new(bytes: usize, ctx: Ctx, stream: Stream) -> Result<Scratch> {
        let _g = CtxGuard::enter(ctx)?;
        let mut ptr: cu::CUdeviceptr = 0;
        if async_alloc() {
            // SAFETY: valid out-pointer; ctx is current and the stream belongs to it.
            let rc = unsafe { cu::cuMemAllocAsync(&mut ptr, bytes, stream.raw()) };
            check(rc, &format!("cuMemAllocAsync({bytes} bytes of scratch)"))?;
            return Ok(Scratch { ptr, ctx, stream, plain: false });
        }
        // SAFETY: valid out-pointer; ctx is current.
        check(unsafe { cu::cuMemAlloc_v2(&mut ptr, bytes) }, &format!("cuMemAlloc({bytes} bytes of scratch)"))?;
        Ok(Scratch { ptr, ctx, stream, plain: true })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr as usize as *mut u8
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let Ok(_g) = CtxGuard::enter(self.ctx) else { return };
        // SAFETY: ptr came from the matching allocation in Scratch::new and is freed once,
        // after the work queued on the stream (async free, or a sync first).
        unsafe {
            if self.plain {
                let _ = cu::cuStreamSynchronize(self.stream.raw());
                let _ = cu::cuMemFree_v2(self.ptr);
            } else {
                let _ = cu::cuMemFreeAsync(self.ptr, self.stream.raw());
            }
        }
    }
}

/// Whether the driver has stream-ordered allocation and the current device supports memory pools.
fn async_alloc() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    let syms = *HAVE.get_or_init(|| {
        // SAFETY: the driver was checked present (CtxGuard::enter ran driver()); only addresses are looked up.
        let lib = unsafe { cu::culib() };
        // SAFETY: as above.
        ASYNC_ALLOC_SYMBOLS.iter().all(|s| unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_ok())
    });
    if !syms {
        return false;
    }
    let Some(dev) = current_device() else { return false };
    let mut pools = 0;
    // SAFETY: valid out-pointer; dev is a device ordinal from the driver.
    let rc = unsafe {
        cu::cuDeviceGetAttribute(&mut pools, cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev)
    };
    rc == cu::CUresult::CUDA_SUCCESS && pools != 0
}
