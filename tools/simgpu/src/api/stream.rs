//! Streams: creation, queries, synchronisation, event waits, host functions.

use super::{non_null, out};
use crate::ctx;
use crate::error::{bail, Result};
use crate::event;
use crate::state::{api, lock};
use crate::stream::{self, op::OpKind, StreamKind, NON_BLOCKING, PRIORITY_RANGE};
use cudarc::driver::sys::{CUcontext, CUdevice, CUevent, CUresult, CUstream};
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

fn create(ph: *mut CUstream, flags: c_uint, priority: c_int) -> Result<()> {
    non_null(ph, "phStream")?;
    if flags & !NON_BLOCKING != 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} are not CU_STREAM_DEFAULT / CU_STREAM_NON_BLOCKING");
    }
    let mut st = lock();
    let h = ctx::current(&st)?;
    let priority = priority.clamp(PRIORITY_RANGE.1, PRIORITY_RANGE.0);
    let s = stream::create(&mut st, h, StreamKind::Created, flags, priority);
    // SAFETY: checked non-NULL.
    unsafe { out(ph, s as CUstream, "phStream") }
}

/// A stream of the current context; blocking (synchronises with the legacy stream) unless
/// CU_STREAM_NON_BLOCKING.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) -> CUresult {
    api("cuStreamCreate", || create(ph, flags, 0))
}

/// As cuStreamCreate; the priority is clamped to [-5, 0] and only reported.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(ph: *mut CUstream, flags: c_uint, priority: c_int) -> CUresult {
    api("cuStreamCreateWithPriority", || create(ph, flags, priority))
}

/// Destroys a created stream: the handle is dead at once, queued work still completes.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(s: CUstream) -> CUresult {
    api("cuStreamDestroy_v2", || {
        let mut st = lock();
        stream::lookup(&st, s as u64)?;
        if let Some(cid) = st.streams[&(s as u64)].capture {
            crate::graph::invalidate(&mut st, cid, "a stream of the capture was destroyed");
        }
        st.streams.get_mut(&(s as u64)).expect("looked up").destroyed = true;
        Ok(())
    })
}

/// Waits until the stream has run everything enqueued so far; its context's sticky error if
/// that work failed. NULL / CU_STREAM_LEGACY / CU_STREAM_PER_THREAD need a current context.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    api("cuStreamSynchronize", || {
        let mut st = lock();
        let sid = stream::resolve_any(&mut st, s as u64)?;
        crate::graph::stream_sync(&mut st, sid, "cuStreamSynchronize")?;
        drop(st);
        crate::graph::check_unsafe("cuStreamSynchronize")?;
        let mut st = lock();
        let sid = stream::resolve_any(&mut st, s as u64)?;
        stream::synchronize(st, sid)
    })
}

/// CUDA_SUCCESS when all work enqueued on the stream has completed, else CUDA_ERROR_NOT_READY.
#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(s: CUstream) -> CUresult {
    api("cuStreamQuery", || {
        let mut st = lock();
        let sid = stream::resolve_any(&mut st, s as u64)?;
        crate::graph::stream_sync(&mut st, sid, "cuStreamQuery")?;
        drop(st);
        crate::graph::check_unsafe("cuStreamQuery")?;
        let mut st = lock();
        let sid = stream::resolve_any(&mut st, s as u64)?;
        let x = &st.streams[&sid];
        if x.completed < x.enqueued || !x.idle() {
            bail!(CUDA_ERROR_NOT_READY, "stream {:#x} has pending work", s as u64);
        }
        Ok(())
    })
}

/// Later work on the stream waits for the event's most recent record as of this call (an
/// event never recorded: nothing to wait for). Flags 0 or CU_EVENT_WAIT_EXTERNAL.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(s: CUstream, ev: CUevent, flags: c_uint) -> CUresult {
    api("cuStreamWaitEvent", || {
        if flags & !1 != 0 {
            bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} are not valid");
        }
        let mut st = lock();
        let sid = stream::resolve(&mut st, s as u64)?;
        let e = event::lookup(&st, ev as u64)?;
        if let Some(cid) = event::captured_in(&st, e) {
            return join(&mut st, sid, ev as u64, cid);
        }
        if let Some(cid) = st.streams[&sid].capture {
            let why = if flags != 0 {
                "CU_EVENT_WAIT_EXTERNAL in a capture (an event wait node) is not simulated".to_string()
            } else {
                format!(
                    "stream {:#x} is capturing and waits for event {:#x}, which was not recorded in the capture; \
                     only events recorded in the same capture can be waited for",
                    s as u64, ev as u64
                )
            };
            let code = if flags != 0 {
                CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
            } else {
                CUresult::CUDA_ERROR_STREAM_CAPTURE_ISOLATION
            };
            return Err(crate::graph::refuse(&mut st, cid, code, why));
        }
        if e.imported {
            let (sync, gen) = (e.sync.clone(), e.sync.recorded());
            stream::enqueue(&mut st, sid, OpKind::WaitShared { sync, gen }, Vec::new());
        } else if let Some(dep) = e.last {
            stream::enqueue(&mut st, sid, OpKind::Nop, vec![dep]);
        }
        Ok(())
    })
}

/// Stream `sid` waits for captured event `ev` of capture `cid`: a stream that does not
/// capture joins the capture (a fork), a stream of the same capture adds the dependencies (a
/// join), a stream of another capture may not merge them.
fn join(st: &mut crate::state::State, sid: u64, ev: u64, cid: u64) -> Result<()> {
    let deps = st.events[&ev].cap.as_ref().map(|(_, d)| d.clone()).unwrap_or_default();
    let s = st.streams.get_mut(&sid).expect("resolved");
    match s.capture {
        Some(c) if c == cid => {
            for d in deps {
                if !s.cap_deps.contains(&d) {
                    s.cap_deps.push(d);
                }
            }
            Ok(())
        }
        Some(other) => Err(crate::graph::refuse(
            st,
            other,
            CUresult::CUDA_ERROR_STREAM_CAPTURE_MERGE,
            format!("stream {sid:#x} waits for event {ev:#x} of another capture; two captures cannot be merged"),
        )),
        None => {
            if st.captures[&cid].ctx != s.ctx {
                bail!(CUDA_ERROR_INVALID_HANDLE, "stream {sid:#x} and event {ev:#x} belong to different contexts");
            }
            s.capture = Some(cid);
            s.cap_deps = deps;
            st.captures.get_mut(&cid).expect("live").streams.push(sid);
            Ok(())
        }
    }
}

/// Which stream a (possibly special) handle names, for the getters.
fn with_stream<T>(s: CUstream, f: impl FnOnce(&crate::state::State, &stream::Stream) -> T) -> Result<T> {
    let mut st = lock();
    let sid = stream::resolve_any(&mut st, s as u64)?;
    Ok(f(&st, &st.streams[&sid]))
}

/// The flags the stream was created with (0 for the default streams).
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(s: CUstream, flags: *mut c_uint) -> CUresult {
    api("cuStreamGetFlags", || {
        let v = with_stream(s, |_, x| x.flags)?;
        // SAFETY: `out` checks NULL.
        unsafe { out(flags, v, "flags") }
    })
}

/// The (clamped) priority the stream was created with.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority(s: CUstream, priority: *mut c_int) -> CUresult {
    api("cuStreamGetPriority", || {
        let v = with_stream(s, |_, x| x.priority)?;
        // SAFETY: `out` checks NULL.
        unsafe { out(priority, v, "priority") }
    })
}

/// The stream's context (the current one for NULL / CU_STREAM_LEGACY / CU_STREAM_PER_THREAD).
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(s: CUstream, pctx: *mut CUcontext) -> CUresult {
    api("cuStreamGetCtx", || {
        let v = with_stream(s, |_, x| x.ctx)?;
        // SAFETY: `out` checks NULL.
        unsafe { out(pctx, v as CUcontext, "pctx") }
    })
}

/// As cuStreamGetCtx; the green context is always NULL.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx_v2(s: CUstream, pctx: *mut CUcontext, pgreen: *mut *mut c_void) -> CUresult {
    api("cuStreamGetCtx_v2", || {
        let v = with_stream(s, |_, x| x.ctx)?;
        // SAFETY: `out` checks NULL.
        unsafe {
            out(pgreen, std::ptr::null_mut(), "pGreenCtx")?;
            out(pctx, v as CUcontext, "pctx")
        }
    })
}

/// A unique id of the stream.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetId(s: CUstream, id: *mut c_ulonglong) -> CUresult {
    api("cuStreamGetId", || {
        let v = with_stream(s, |_, x| x.id)?;
        // SAFETY: `out` checks NULL.
        unsafe { out(id, v, "streamId") }
    })
}

/// The device of the stream's context.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetDevice(s: CUstream, dev: *mut CUdevice) -> CUresult {
    api("cuStreamGetDevice", || {
        let v = with_stream(s, |st, x| st.ctxs[&x.ctx].device)?;
        // SAFETY: `out` checks NULL.
        unsafe { out(dev, v, "device") }
    })
}

/// Runs `f(data)` on the executor when the stream gets there. It must not call CUDA (such
/// calls return CUDA_ERROR_NOT_PERMITTED); while it runs, no other stream progresses.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(
    s: CUstream,
    f: Option<unsafe extern "C" fn(*mut c_void)>,
    data: *mut c_void,
) -> CUresult {
    api("cuLaunchHostFunc", || {
        let Some(f) = f else { bail!(CUDA_ERROR_INVALID_VALUE, "fn is NULL") };
        let mut st = lock();
        let sid = stream::resolve(&mut st, s as u64)?;
        stream::enqueue(&mut st, sid, OpKind::HostFn { f, data: data as usize }, Vec::new());
        Ok(())
    })
}

/// As cuLaunchHostFunc, calling `cb(stream, CUDA_SUCCESS, data)`; flags must be 0. Work of a
/// failed context does not run, callbacks included.
#[no_mangle]
pub unsafe extern "C" fn cuStreamAddCallback(
    s: CUstream,
    cb: Option<unsafe extern "C" fn(usize, u32, *mut c_void)>,
    data: *mut c_void,
    flags: c_uint,
) -> CUresult {
    api("cuStreamAddCallback", || {
        let Some(f) = cb else { bail!(CUDA_ERROR_INVALID_VALUE, "callback is NULL") };
        if flags != 0 {
            bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} must be 0");
        }
        let mut st = lock();
        let sid = stream::resolve(&mut st, s as u64)?;
        crate::graph::not_capturable(&mut st, sid, "cuStreamAddCallback (use cuLaunchHostFunc)")?;
        let op = OpKind::Callback { f, stream: s as usize, data: data as usize };
        stream::enqueue(&mut st, sid, op, Vec::new());
        Ok(())
    })
}
