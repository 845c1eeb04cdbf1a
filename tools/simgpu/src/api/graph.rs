//! Stream capture and graphs: begin, end and query a capture, the calling thread's capture
//! interaction mode, instantiate, launch and destroy graphs.

use super::{non_null, out};
use crate::ctx;
use crate::error::{bail, Result};
use crate::graph::{self, Exec, MODE_RELAXED};
use crate::state::{api, lock, HandleKind, State};
use crate::stream::{self, STREAM_LEGACY};
use cudarc::driver::sys::{
    cuuint64_t, CUgraph, CUgraphEdgeData, CUgraphExec, CUgraphNode, CUresult, CUstream, CUstreamCaptureMode,
    CUstreamCaptureStatus,
};
use std::ffi::c_ulonglong;

/// `CUgraphInstantiate_flags` this simulator accepts: AUTO_FREE_ON_LAUNCH (no graph memory
/// nodes exist here, so it changes nothing) and USE_NODE_PRIORITY (priorities are only
/// reported). UPLOAD needs an upload stream (cuGraphInstantiateWithParams); DEVICE_LAUNCH is
/// not simulated.
const INSTANTIATE_OK: u64 = 0x1 | 0x8;

fn mode_of(m: CUstreamCaptureMode) -> u32 {
    m as u32
}

/// The stream a capture call names: created and per-thread streams; the legacy stream's
/// handles are looked up without counting as a use of it.
fn capture_stream(st: &mut State, h: u64) -> Result<u64> {
    match h {
        0 | STREAM_LEGACY => {
            let cur = ctx::current(st)?;
            Ok(st.ctxs[&cur].legacy)
        }
        _ => stream::resolve(st, h),
    }
}

/// Begins capturing the stream's work into a graph: later work on it is recorded, not run,
/// until cuStreamEndCapture. The legacy stream cannot be captured
/// (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); a capturing stream cannot begin again
/// (CUDA_ERROR_ILLEGAL_STATE). `mode`: GLOBAL, THREAD_LOCAL or RELAXED (which calls the
/// capture forbids, see cuThreadExchangeStreamCaptureMode).
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(s: CUstream, mode: CUstreamCaptureMode) -> CUresult {
    api("cuStreamBeginCapture_v2", || {
        let m = mode_of(mode);
        if m > MODE_RELAXED {
            bail!(CUDA_ERROR_INVALID_VALUE, "mode {m} is not a CUstreamCaptureMode");
        }
        let mut st = lock();
        let sid = capture_stream(&mut st, s as u64)?;
        graph::begin(&mut st, sid, m)
    })
}

/// Ends the capture begun on this stream (by this thread unless it is RELAXED) and returns
/// its graph. Every stream of the capture leaves capture mode. An invalidated capture:
/// CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and `*phGraph = NULL`; work of other streams not
/// joined back into this one: CUDA_ERROR_STREAM_CAPTURE_UNJOINED; another stream than the
/// origin: CUDA_ERROR_STREAM_CAPTURE_UNMATCHED; another thread:
/// CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD; not capturing: CUDA_ERROR_ILLEGAL_STATE.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(s: CUstream, ph: *mut CUgraph) -> CUresult {
    api("cuStreamEndCapture", || {
        non_null(ph, "phGraph")?;
        let mut st = lock();
        let sid = capture_stream(&mut st, s as u64)?;
        let r = graph::end(&mut st, sid);
        let g = match &r {
            Ok(g) => *g,
            // The capture ended without a graph (or did not end: the output is NULL too).
            Err(_) => 0,
        };
        // SAFETY: checked non-NULL.
        unsafe { out(ph, g as CUgraph, "phGraph")? };
        r.map(|_| ())
    })
}

/// The capture status of a stream and, while it captures, its capture.
fn info(s: CUstream) -> Result<(CUstreamCaptureStatus, Option<u64>)> {
    let mut st = lock();
    let sid = capture_stream(&mut st, s as u64)?;
    if st.streams[&sid].kind == stream::StreamKind::Legacy {
        // Asking about the legacy stream while a blocking stream captures is an implicit
        // use of it; the capture itself is not disturbed by the question.
        let c = st.streams[&sid].ctx;
        graph::legacy_use(&mut st, c, false)?;
    }
    Ok(match st.streams[&sid].capture {
        None => (CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE, None),
        Some(cid) if st.captures[&cid].invalid.is_some() => {
            (CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED, Some(cid))
        }
        Some(cid) => (CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE, Some(cid)),
    })
}

/// Whether the stream is capturing: NONE, ACTIVE, or INVALIDATED (an invalid operation
/// happened; the capture must still be ended). The legacy stream while a blocking stream of
/// its context captures: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(s: CUstream, status: *mut CUstreamCaptureStatus) -> CUresult {
    api("cuStreamIsCapturing", || {
        non_null(status, "captureStatus")?;
        let (v, _) = info(s)?;
        // SAFETY: checked non-NULL.
        unsafe { out(status, v, "captureStatus") }
    })
}

/// The shared body of cuStreamGetCaptureInfo_v2/_v3: the status, and while capturing (or
/// invalidated) the capture's id, its graph, and the nodes the stream's next operation will
/// depend on (valid until the next call that changes them). Outputs other than the status
/// may be NULL.
///
/// # Safety
/// Each output is NULL or writable.
unsafe fn capture_info(
    s: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph_out: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const CUgraphEdgeData,
    num: *mut usize,
) -> Result<()> {
    non_null(status, "captureStatus_out")?;
    let (v, cid) = info(s)?;
    let mut st = lock();
    let (i, g, list) = match cid {
        Some(c) => {
            let sid = capture_stream(&mut st, s as u64)?;
            let idx = st.streams[&sid].cap_deps.clone();
            let cap = st.captures.get_mut(&c).expect("live");
            cap.reported = idx.iter().map(|&n| cap.nodes[n].handle).collect();
            (cap.id, cap.graph, Some(cap.reported.as_ptr()))
        }
        None => (0, 0, None),
    };
    let n = cid.map_or(0, |c| st.captures[&c].reported.len());
    // SAFETY: each output is NULL (skipped) or writable (caller); `status` checked.
    unsafe {
        out(status, v, "captureStatus_out")?;
        if v != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            if !id.is_null() {
                out(id, i, "id_out")?;
            }
            if !graph_out.is_null() {
                out(graph_out, g as CUgraph, "graph_out")?;
            }
            if !deps.is_null() {
                let p = if n == 0 { std::ptr::null() } else { list.unwrap_or(std::ptr::null()) as *const CUgraphNode };
                out(deps, p, "dependencies_out")?;
            }
            if !edges.is_null() {
                // Every captured edge is a default edge: the driver reports NULL then.
                out(edges, std::ptr::null(), "edgeData_out")?;
            }
            if !num.is_null() {
                out(num, n, "numDependencies_out")?;
            }
        }
    }
    Ok(())
}

/// CUDA 12's form of cuStreamGetCaptureInfo (see `capture_info`).
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    s: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph_out: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    num: *mut usize,
) -> CUresult {
    // SAFETY: outputs NULL or writable (caller).
    api("cuStreamGetCaptureInfo_v2", || unsafe {
        capture_info(s, status, id, graph_out, deps, std::ptr::null_mut(), num)
    })
}

/// CUDA 13's form of cuStreamGetCaptureInfo, with the edge data (always NULL: default edges).
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    s: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph_out: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const CUgraphEdgeData,
    num: *mut usize,
) -> CUresult {
    // SAFETY: outputs NULL or writable (caller).
    api("cuStreamGetCaptureInfo_v3", || unsafe { capture_info(s, status, id, graph_out, deps, edges, num) })
}

/// Swaps the calling thread's capture interaction mode with `*mode` (GLOBAL, THREAD_LOCAL or
/// RELAXED): which potentially unsafe calls (allocation, synchronous copies, synchronisation)
/// this thread may make while captures are in progress.
#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut CUstreamCaptureMode) -> CUresult {
    api("cuThreadExchangeStreamCaptureMode", || {
        non_null(mode, "mode")?;
        // SAFETY: checked non-NULL; read as an integer (an out-of-range enum is not UB then).
        let m = unsafe { mode.cast::<u32>().read_unaligned() };
        if m > MODE_RELAXED {
            bail!(CUDA_ERROR_INVALID_VALUE, "mode {m} is not a CUstreamCaptureMode");
        }
        let old = graph::exchange_thread_mode(m);
        // SAFETY: checked non-NULL.
        unsafe { mode.cast::<u32>().write_unaligned(old) };
        Ok(())
    })
}

/// An executable graph of `hGraph`'s nodes, which each cuGraphLaunch enqueues in capture
/// order. Flags: 0, AUTO_FREE_ON_LAUNCH, USE_NODE_PRIORITY.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(ph: *mut CUgraphExec, g: CUgraph, flags: c_ulonglong) -> CUresult {
    api("cuGraphInstantiateWithFlags", || {
        non_null(ph, "phGraphExec")?;
        if flags & !INSTANTIATE_OK != 0 {
            bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x}: only AUTO_FREE_ON_LAUNCH and USE_NODE_PRIORITY here");
        }
        let mut st = lock();
        ctx::current(&st)?;
        if graph::capture_of_graph(&st, g as u64).is_some() {
            bail!(CUDA_ERROR_INVALID_VALUE, "graph {:#x} is still being captured; end the capture first", g as u64);
        }
        let Some(gr) = st.graphs.get(&(g as u64)) else {
            bail!(CUDA_ERROR_INVALID_VALUE, "{:#x} is not a graph (destroyed or never made)", g as u64);
        };
        ctx::live(&st, gr.ctx)?;
        let ops = gr.nodes.iter().map(|n| n.op.clone()).collect();
        let h = st.new_handle(HandleKind::GraphExec);
        st.execs.insert(h, Exec { ops });
        // SAFETY: checked non-NULL.
        unsafe { out(ph, h as CUgraphExec, "phGraphExec") }
    })
}

/// Enqueues the graph's work on the stream (in the order it was captured); every launch
/// runs it again. A capturing stream records it.
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(e: CUgraphExec, s: CUstream) -> CUresult {
    api("cuGraphLaunch", || {
        let mut st = lock();
        let sid = stream::resolve(&mut st, s as u64)?;
        graph::launch(&mut st, e as u64, sid)
    })
}

/// Destroys an executable graph; launches already enqueued still run.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(e: CUgraphExec) -> CUresult {
    api("cuGraphExecDestroy", || {
        let mut st = lock();
        if st.execs.remove(&(e as u64)).is_none() {
            bail!(CUDA_ERROR_INVALID_VALUE, "{:#x} is not an instantiated graph", e as u64);
        }
        Ok(())
    })
}

/// Destroys a graph (its executable graphs stay usable). A graph still being captured
/// cannot be destroyed.
#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(g: CUgraph) -> CUresult {
    api("cuGraphDestroy", || {
        let mut st = lock();
        if graph::capture_of_graph(&st, g as u64).is_some() {
            bail!(CUDA_ERROR_INVALID_VALUE, "graph {:#x} is still being captured; end the capture first", g as u64);
        }
        if st.graphs.remove(&(g as u64)).is_none() {
            bail!(CUDA_ERROR_INVALID_VALUE, "{:#x} is not a graph (destroyed or never made)", g as u64);
        }
        Ok(())
    })
}

/// The number of nodes of a graph and, if `nodes` is non-NULL, up to `*num` of their
/// handles (in capture order).
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(g: CUgraph, nodes: *mut CUgraphNode, num: *mut usize) -> CUresult {
    api("cuGraphGetNodes", || {
        non_null(num, "numNodes")?;
        let st = lock();
        let Some(gr) = st.graphs.get(&(g as u64)) else {
            bail!(CUDA_ERROR_INVALID_VALUE, "{:#x} is not a graph (destroyed or never made)", g as u64);
        };
        // SAFETY: `num` checked non-NULL; `nodes` (if non-NULL) has room for `*num` handles.
        unsafe {
            if nodes.is_null() {
                return out(num, gr.nodes.len(), "numNodes");
            }
            let room = num.read_unaligned();
            let k = room.min(gr.nodes.len());
            for (i, n) in gr.nodes.iter().take(k).enumerate() {
                nodes.add(i).write_unaligned(n.handle as CUgraphNode);
            }
            out(num, k, "numNodes")
        }
    })
}
