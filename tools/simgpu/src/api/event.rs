//! Events: create, record, query, synchronise, elapsed time.

use super::{non_null, out};
use crate::ctx;
use crate::error::{bail, Result};
use crate::event::{self, DISABLE_TIMING};
use crate::state::{api, lock};
use crate::stream::{self, op::OpKind};
use cudarc::driver::sys::{CUevent, CUresult, CUstream};
use std::ffi::c_uint;

/// An event of the current context. Flags: BLOCKING_SYNC, DISABLE_TIMING, INTERPROCESS
/// (which needs DISABLE_TIMING, as in CUDA).
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ph: *mut CUevent, flags: c_uint) -> CUresult {
    api("cuEventCreate", || {
        non_null(ph, "phEvent")?;
        let mut st = lock();
        let h = ctx::current(&st)?;
        let e = event::create(&mut st, h, flags)?;
        // SAFETY: checked non-NULL.
        unsafe { out(ph, e as CUevent, "phEvent") }
    })
}

/// Destroys the event; records already queued still complete.
#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(ev: CUevent) -> CUresult {
    api("cuEventDestroy_v2", || {
        let mut st = lock();
        event::lookup(&st, ev as u64)?;
        st.events.remove(&(ev as u64));
        Ok(())
    })
}

fn record(ev: CUevent, s: CUstream, flags: c_uint) -> Result<()> {
    if flags & !1 != 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} are not valid");
    }
    let mut st = lock();
    let sid = stream::resolve(&mut st, s as u64)?;
    let e = event::lookup(&st, ev as u64)?;
    let sctx = st.streams[&sid].ctx;
    if e.ctx != sctx {
        bail!(
            CUDA_ERROR_INVALID_HANDLE,
            "event {:#x} and stream {:#x} belong to different contexts",
            ev as u64,
            s as u64
        );
    }
    if let Some(cid) = st.streams[&sid].capture {
        if flags != 0 {
            return Err(crate::graph::refuse(
                &mut st,
                cid,
                CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                "CU_EVENT_RECORD_EXTERNAL in a capture (an event record node) is not simulated".into(),
            ));
        }
        // A captured event: it stands for the stream's work so far in the capture, which
        // other streams may wait for (fork and join); nothing is queued.
        let deps = st.streams[&sid].cap_deps.clone();
        st.events.get_mut(&(ev as u64)).expect("looked up").cap = Some((cid, deps));
        return Ok(());
    }
    let sync = e.sync.clone();
    let gen = sync.next_record();
    let seq = stream::enqueue(&mut st, sid, OpKind::Record { sync, gen }, Vec::new());
    let e = st.events.get_mut(&(ev as u64)).expect("looked up");
    e.last = Some((sid, seq));
    e.cap = None;
    Ok(())
}

/// Captures the stream's work so far; the event completes when the stream gets there.
#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(ev: CUevent, s: CUstream) -> CUresult {
    api("cuEventRecord", || record(ev, s, 0))
}

/// As cuEventRecord; flags 0 or CU_EVENT_RECORD_EXTERNAL.
#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags(ev: CUevent, s: CUstream, flags: c_uint) -> CUresult {
    api("cuEventRecordWithFlags", || record(ev, s, flags))
}

/// CUDA_SUCCESS if the latest record completed (or there was none), else CUDA_ERROR_NOT_READY.
#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(ev: CUevent) -> CUresult {
    api("cuEventQuery", || {
        let mut st = lock();
        event::not_captured(&mut st, ev as u64, "cuEventQuery")?;
        drop(st);
        crate::graph::check_unsafe("cuEventQuery")?;
        let st = lock();
        let e = event::lookup(&st, ev as u64)?;
        ctx::check_sticky(&st, e.ctx)?;
        if !event::complete(e) {
            bail!(CUDA_ERROR_NOT_READY, "event {:#x} is not complete", ev as u64);
        }
        Ok(())
    })
}

/// Waits for the latest record as of the call.
#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(ev: CUevent) -> CUresult {
    api("cuEventSynchronize", || {
        let mut st = lock();
        event::not_captured(&mut st, ev as u64, "cuEventSynchronize")?;
        drop(st);
        crate::graph::check_unsafe("cuEventSynchronize")?;
        let mut st = lock();
        let e = event::lookup(&st, ev as u64)?;
        let (sync, target, c) = (e.sync.clone(), e.sync.recorded(), e.ctx);
        loop {
            ctx::live(&st, c)?;
            ctx::check_sticky(&st, c)?;
            if sync.done() >= target {
                return Ok(());
            }
            st = stream::wait_a_while(st);
        }
    })
}

fn elapsed(ms: *mut f32, start: CUevent, end: CUevent) -> Result<()> {
    non_null(ms, "pMilliseconds")?;
    let mut st = lock();
    event::not_captured(&mut st, start as u64, "cuEventElapsedTime")?;
    event::not_captured(&mut st, end as u64, "cuEventElapsedTime")?;
    let (a, b) = (event::lookup(&st, start as u64)?, event::lookup(&st, end as u64)?);
    for (e, h) in [(a, start), (b, end)] {
        if e.flags & DISABLE_TIMING != 0 {
            bail!(CUDA_ERROR_INVALID_HANDLE, "event {:#x} was created with CU_EVENT_DISABLE_TIMING", h as u64);
        }
        if e.sync.recorded() == 0 {
            bail!(CUDA_ERROR_INVALID_HANDLE, "event {:#x} has not been recorded", h as u64);
        }
    }
    for (e, h) in [(a, start), (b, end)] {
        ctx::check_sticky(&st, e.ctx)?;
        if !event::complete(e) {
            bail!(CUDA_ERROR_NOT_READY, "event {:#x} is not complete", h as u64);
        }
    }
    let t = (b.sync.time_ns() as f64 - a.sync.time_ns() as f64) / 1e6;
    // SAFETY: checked non-NULL.
    unsafe { out(ms, t as f32, "pMilliseconds") }
}

/// Milliseconds between two completed records (times taken when the executor reached them).
/// DISABLE_TIMING or never recorded: CUDA_ERROR_INVALID_HANDLE; not complete: NOT_READY.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult {
    api("cuEventElapsedTime", || elapsed(ms, start, end))
}

/// As cuEventElapsedTime.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult {
    api("cuEventElapsedTime_v2", || elapsed(ms, start, end))
}
