//! Device memory of one call, allocated and freed in a stream's order.

use super::*;
use std::sync::Mutex;

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

/// Device memory a communicator reuses call after call for packed data (the coalesced
/// calls' buckets). Plain cuMemAlloc memory, so that the GPU-to-GPU path of ranks on one
/// GPU can share it with peers through CUDA IPC once and keep the mapping (stream-ordered
/// pool memory cannot be exported); each use waits on the stream for an event recorded
/// after the previous one, so the host never waits for it.
#[derive(Default)]
pub struct Arena {
    ptr: u64,
    bytes: usize,
    ctx: Ctx,
    /// Recorded after the last use.
    last: Option<Event>,
}

// SAFETY: the arena holds a device address and an event handle; the driver allows both
// to be used from any thread, and the owner serialises the uses (a mutex).
unsafe impl Send for Arena {}

/// Arenas grow in steps of this many bytes.
const ARENA_STEP: usize = 1 << 20;

impl Arena {
    /// `bytes` (> 0) of the arena in context `ctx` for work queued on `stream` from now
    /// on, after every earlier use; call [`Arena::used`] once that work is queued.
    pub fn take(&mut self, bytes: usize, ctx: Ctx, stream: Stream) -> Result<*mut u8> {
        let _g = CtxGuard::enter(ctx)?;
        if self.ptr == 0 || self.ctx != ctx || self.bytes < bytes {
            self.release();
            let size = bytes.max(2 * self.bytes).div_ceil(ARENA_STEP) * ARENA_STEP;
            let mut ptr: cu::CUdeviceptr = 0;
            // SAFETY: valid out-pointer; ctx is current.
            check(unsafe { cu::cuMemAlloc_v2(&mut ptr, size) }, &format!("cuMemAlloc({size} bytes of buckets)"))?;
            *self = Arena { ptr, bytes: size, ctx, last: None };
        }
        if let Some(e) = &self.last {
            e.wait_on(stream)?;
        }
        Ok(self.ptr as usize as *mut u8)
    }

    /// Marks the end of the current use: the work queued on `stream` so far.
    pub fn used(&mut self, stream: Stream) -> Result<()> {
        let _g = CtxGuard::enter(self.ctx)?;
        if self.last.is_none() {
            self.last = Some(Event::new()?);
        }
        self.last.as_ref().expect("made above").record(stream)
    }

    /// Frees the memory once its last use is done (the host waits for it: only when the
    /// arena grows or goes).
    fn release(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let Ok(_g) = CtxGuard::enter(self.ctx) else { return };
        if let Some(e) = self.last.take() {
            let _ = e.synchronize();
        }
        // SAFETY: allocated in take() and freed once; its last use is done (above).
        let _ = unsafe { cu::cuMemFree_v2(self.ptr) };
        self.ptr = 0;
        self.bytes = 0;
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        self.release();
    }
}

/// Arenas lent one call at a time (the PreMulSum products of a communicator): a call takes
/// a free arena, or a new one while every other is lent (the calls of one group are all
/// queued before any runs), and gives it back once its work is queued; the next use waits
/// on its stream for that work, so the host never waits and a peer's mapping of the
/// memory stays valid call after call.
#[derive(Default)]
pub struct Arenas {
    free: Mutex<Vec<Arena>>,
}

/// An arena lent by [`Arenas::take`] until dropped: drop it once the work that uses it is
/// queued on its stream.
pub struct Lease {
    arena: Mutex<Option<Arena>>,
    ptr: *mut u8,
    stream: Stream,
    home: std::sync::Weak<Arenas>,
}

// SAFETY: `ptr` is a device address (never dereferenced on the host) and the arena is
// behind a mutex; the driver allows its memory and event to be used from any thread.
unsafe impl Send for Lease {}
// SAFETY: as above; the only shared access is through the mutex.
unsafe impl Sync for Lease {}

impl Arenas {
    /// `bytes` (> 0) of device memory in context `ctx` for work queued on `stream` from
    /// now on: the smallest free arena that holds them, else the largest grown.
    pub fn take(self: &std::sync::Arc<Self>, bytes: usize, ctx: Ctx, stream: Stream) -> Result<Lease> {
        let mut arena = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            let fits = (0..free.len())
                .filter(|&i| free[i].ctx == ctx && free[i].bytes >= bytes)
                .min_by_key(|&i| free[i].bytes);
            let pick = fits.or_else(|| (0..free.len()).max_by_key(|&i| free[i].bytes));
            pick.map(|i| free.swap_remove(i)).unwrap_or_default()
        };
        let ptr = arena.take(bytes, ctx, stream)?;
        Ok(Lease { arena: Mutex::new(Some(arena)), ptr, stream, home: std::sync::Arc::downgrade(self) })
    }
}

impl Lease {
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(mut a) = self.arena.get_mut().unwrap_or_else(|p| p.into_inner()).take() else { return };
        // An arena whose use cannot be marked is freed instead (after a wait): never reused early.
        if a.used(self.stream).is_ok() {
            if let Some(home) = self.home.upgrade() {
                home.free.lock().unwrap_or_else(|p| p.into_inner()).push(a);
            }
        } else {
            a.last = None;
            let _g = CtxGuard::enter(a.ctx);
            // SAFETY: the stream is the lease's; waiting for it covers the arena's last use.
            let _ = unsafe { cu::cuStreamSynchronize(self.stream.raw()) };
        }
    }
}
