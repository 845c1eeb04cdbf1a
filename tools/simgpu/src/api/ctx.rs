//! Contexts: primary contexts, created contexts, the per-thread current-context stack.

use super::{non_null, out};
use crate::ctx;
use crate::device;
use crate::error::{bail, Result};
use crate::state::{api, lock};
use crate::stream::PRIORITY_RANGE;
use cudarc::driver::sys::{CUcontext, CUdevice, CUresult};
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

/// Retains the device's primary context, activating it at the first retain. It is not made
/// current (as in the real driver).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    api("cuDevicePrimaryCtxRetain", || {
        non_null(pctx, "pctx")?;
        let mut st = lock();
        device::check(&st, dev)?;
        let h = st.primaries[dev as usize];
        if !st.ctxs[&h].active {
            ctx::activate(&mut st, h);
        }
        st.ctxs.get_mut(&h).expect("primary").retained += 1;
        // SAFETY: checked non-NULL.
        unsafe { out(pctx, h as CUcontext, "pctx") }
    })
}

/// Synchronises and tears down primary context `h` (its memory, streams, events, modules),
/// unless (`reset` false) another thread retained it meanwhile.
fn release_primary(h: u64, reset: bool) {
    let _ = ctx::synchronize(h);
    let mut st = lock();
    let c = &st.ctxs[&h];
    if c.active && (reset || c.retained == 0) {
        ctx::teardown(&mut st, h);
    }
}

/// Drops one retain; the last one destroys the context's resources (after its pending work).
/// Releasing a context that is not retained is CUDA_ERROR_INVALID_CONTEXT.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    api("cuDevicePrimaryCtxRelease_v2", || {
        let mut st = lock();
        device::check(&st, dev)?;
        let h = st.primaries[dev as usize];
        let c = st.ctxs.get_mut(&h).expect("primary");
        if !c.active || c.retained == 0 {
            bail!(CUDA_ERROR_INVALID_CONTEXT, "the primary context of device {dev} is not retained");
        }
        c.retained -= 1;
        if c.retained == 0 {
            drop(st);
            release_primary(h, false);
        }
        Ok(())
    })
}

/// Destroys everything in the primary context (after its pending work) and makes it
/// inactive: it must be retained again before use.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    api("cuDevicePrimaryCtxReset_v2", || {
        let st = lock();
        device::check(&st, dev)?;
        let h = st.primaries[dev as usize];
        if st.ctxs[&h].active {
            drop(st);
            release_primary(h, true);
        }
        Ok(())
    })
}

/// Flags and whether the primary context is active.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> CUresult {
    api("cuDevicePrimaryCtxGetState", || {
        let st = lock();
        device::check(&st, dev)?;
        non_null(active, "active")?;
        let c = &st.ctxs[&st.primaries[dev as usize]];
        // SAFETY: `out` checks NULL.
        unsafe {
            out(flags, c.flags, "flags")?;
            out(active, c.active as c_int, "active")
        }
    })
}

/// Sets the primary context's flags (allowed while active, as in the _v2 API).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    api("cuDevicePrimaryCtxSetFlags_v2", || {
        let mut st = lock();
        device::check(&st, dev)?;
        ctx::check_flags(flags)?;
        let h = st.primaries[dev as usize];
        st.ctxs.get_mut(&h).expect("primary").flags = flags;
        Ok(())
    })
}

fn create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Result<()> {
    non_null(pctx, "pctx")?;
    let h = ctx::create(&mut lock(), dev, flags)?;
    ctx::push(h);
    // SAFETY: checked non-NULL.
    unsafe { out(pctx, h as CUcontext, "pctx") }
}

/// Creates a context on `dev` and pushes it on the calling thread's stack.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    api("cuCtxCreate_v2", || create(pctx, flags, dev))
}

/// As cuCtxCreate_v2; execution affinity parameters are accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    api("cuCtxCreate_v3", || {
        if num_params < 0 || (num_params > 0 && params.is_null()) {
            bail!(CUDA_ERROR_INVALID_VALUE, "{num_params} affinity parameters at {params:?}");
        }
        create(pctx, flags, dev)
    })
}

/// As cuCtxCreate_v2; creation parameters (affinity, CIG) are accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    api("cuCtxCreate_v4", || create(pctx, flags, dev))
}

/// Destroys a created context after its pending work: its memory, streams, events and
/// modules go with it; it is popped if current on this thread (other threads holding it
/// get CUDA_ERROR_INVALID_CONTEXT). Primary contexts cannot be destroyed this way.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(c: CUcontext) -> CUresult {
    api("cuCtxDestroy_v2", || {
        let h = c as u64;
        {
            let st = lock();
            if ctx::live(&st, h)?.primary {
                bail!(CUDA_ERROR_INVALID_CONTEXT, "{h:#x} is a primary context (use cuDevicePrimaryCtxRelease)");
            }
        }
        let _ = ctx::synchronize(h);
        let mut st = lock();
        if st.ctxs.contains_key(&h) {
            ctx::teardown(&mut st, h);
        }
        ctx::forget_current(h);
        Ok(())
    })
}

/// Replaces the top of the calling thread's stack (NULL pops it).
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(c: CUcontext) -> CUresult {
    api("cuCtxSetCurrent", || {
        let h = c as u64;
        if h == 0 {
            ctx::set_top(None);
            return Ok(());
        }
        ctx::live(&lock(), h)?;
        ctx::set_top(Some(h));
        Ok(())
    })
}

/// The top of the calling thread's stack, NULL if empty.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    // SAFETY: `out` checks NULL.
    api("cuCtxGetCurrent", || unsafe { out(pctx, ctx::top().unwrap_or(0) as CUcontext, "pctx") })
}

/// Pushes a live context on the calling thread's stack.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(c: CUcontext) -> CUresult {
    api("cuCtxPushCurrent_v2", || {
        ctx::live(&lock(), c as u64)?;
        ctx::push(c as u64);
        Ok(())
    })
}

/// Pops the calling thread's current context (`pctx` may be NULL); an empty stack is
/// CUDA_ERROR_INVALID_CONTEXT.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    api("cuCtxPopCurrent_v2", || {
        let Some(h) = ctx::pop() else { bail!(CUDA_ERROR_INVALID_CONTEXT, "no context is current on this thread") };
        if !pctx.is_null() {
            // SAFETY: non-NULL, writable (caller).
            unsafe { pctx.write_unaligned(h as CUcontext) };
        }
        Ok(())
    })
}

/// The current context's device.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    api("cuCtxGetDevice", || {
        let st = lock();
        let h = ctx::current(&st)?;
        // SAFETY: `out` checks NULL.
        unsafe { out(dev, st.ctxs[&h].device, "device") }
    })
}

/// Waits for all work of the current context; returns its sticky error if that work failed.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    api("cuCtxSynchronize", || {
        let h = ctx::current(&lock())?;
        crate::graph::ctx_sync(&mut lock(), h)?;
        crate::graph::check_unsafe("cuCtxSynchronize")?;
        ctx::synchronize(h)
    })
}

/// The current context's flags.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    api("cuCtxGetFlags", || {
        let st = lock();
        let h = ctx::current(&st)?;
        // SAFETY: `out` checks NULL.
        unsafe { out(flags, st.ctxs[&h].flags, "flags") }
    })
}

/// Sets the current context's flags.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetFlags(flags: c_uint) -> CUresult {
    api("cuCtxSetFlags", || {
        let mut st = lock();
        let h = ctx::current(&st)?;
        ctx::check_flags(flags)?;
        st.ctxs.get_mut(&h).expect("current").flags = flags;
        Ok(())
    })
}

/// 3020, the API version every context made by the v2+ API reports (NULL: the current one).
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetApiVersion(c: CUcontext, version: *mut c_uint) -> CUresult {
    api("cuCtxGetApiVersion", || {
        let st = lock();
        if c.is_null() {
            ctx::current(&st)?;
        } else {
            ctx::live(&st, c as u64)?;
        }
        // SAFETY: `out` checks NULL.
        unsafe { out(version, 3020, "version") }
    })
}

/// (0, -5): least and greatest priority, either pointer may be NULL.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) -> CUresult {
    api("cuCtxGetStreamPriorityRange", || {
        ctx::current(&lock())?;
        // SAFETY: non-NULL pointers are writable (caller).
        unsafe {
            if !least.is_null() {
                least.write_unaligned(PRIORITY_RANGE.0);
            }
            if !greatest.is_null() {
                greatest.write_unaligned(PRIORITY_RANGE.1);
            }
        }
        Ok(())
    })
}

/// Lets kernels of the current context access memory of `peer` (another device's
/// context): CUDA_ERROR_INVALID_DEVICE for the same device, 704 if already enabled.
#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult {
    api("cuCtxEnablePeerAccess", || {
        let mut st = lock();
        let cur = ctx::current(&st)?;
        if flags != 0 {
            bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} must be 0");
        }
        let p = ctx::live(&st, peer as u64)?;
        if p.device == st.ctxs[&cur].device {
            bail!(CUDA_ERROR_INVALID_DEVICE, "peer context {:#x} is on the current context's device", peer as u64);
        }
        if !st.ctxs.get_mut(&cur).expect("current").peers.insert(peer as u64) {
            bail!(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access to {:#x} is already enabled", peer as u64);
        }
        Ok(())
    })
}

/// Revokes cuCtxEnablePeerAccess; 705 if it was not enabled.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult {
    api("cuCtxDisablePeerAccess", || {
        let mut st = lock();
        let cur = ctx::current(&st)?;
        ctx::live(&st, peer as u64)?;
        if !st.ctxs.get_mut(&cur).expect("current").peers.remove(&(peer as u64)) {
            bail!(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access to {:#x} is not enabled", peer as u64);
        }
        Ok(())
    })
}

/// A unique id of the context (NULL: the current one).
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetId(c: CUcontext, id: *mut c_ulonglong) -> CUresult {
    api("cuCtxGetId", || {
        let st = lock();
        let h = if c.is_null() { ctx::current(&st)? } else { c as u64 };
        let v = ctx::live(&st, h)?.id;
        // SAFETY: `out` checks NULL.
        unsafe { out(id, v, "ctxId") }
    })
}
