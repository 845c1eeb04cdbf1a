//! Stream capture and graphs. While a stream captures, work enqueued on it is recorded as
//! nodes of the capture's graph instead of running; `cuGraphLaunch` enqueues the recorded
//! work on the launch stream, in capture order, every replay. The rules are the driver's
//! (CUDA programming guide, "Prohibited and Unhandled Operations"; `cuStreamBeginCapture`,
//! `cuThreadExchangeStreamCaptureMode`): synchronising or querying a capturing stream, a
//! captured event or a context with a capture, and using the legacy stream while a blocking
//! stream of its context captures, are refused and invalidate the capture; "potentially
//! unsafe" calls are refused where the capture modes say so.

use crate::error::{bail, Error, Result};
use crate::state::{self, HandleKind, State};
use crate::stream::op::OpKind;
use cudarc::driver::sys::CUresult;
use std::cell::Cell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `CUstreamCaptureMode`.
pub const MODE_GLOBAL: u32 = 0;
pub const MODE_THREAD_LOCAL: u32 = 1;
pub const MODE_RELAXED: u32 = 2;

/// Captures in progress in the process: the calls the modes restrict skip the lock at 0.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The calling thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`).
    static THREAD_MODE: Cell<u32> = const { Cell::new(MODE_GLOBAL) };
}

/// The calling thread's interaction mode.
pub fn thread_mode() -> u32 {
    THREAD_MODE.with(Cell::get)
}

/// Sets the calling thread's interaction mode; returns the previous one.
pub fn exchange_thread_mode(mode: u32) -> u32 {
    THREAD_MODE.with(|m| m.replace(mode))
}

/// One recorded operation and the nodes (indices) it depends on.
pub struct Node {
    pub handle: u64,
    pub op: OpKind,
    pub deps: Vec<usize>,
}

/// A capture sequence in progress.
pub struct Capture {
    /// `cuStreamGetCaptureInfo`'s id (unique in the process, never 0).
    pub id: u64,
    /// The stream it was begun on (it must end there).
    pub origin: u64,
    pub ctx: u64,
    pub mode: u32,
    /// The thread that began it.
    pub thread: u64,
    /// The graph handle `cuStreamGetCaptureInfo` reports and `cuStreamEndCapture` returns.
    pub graph: u64,
    pub nodes: Vec<Node>,
    /// Every stream that takes part (the origin and those joined through captured events).
    pub streams: Vec<u64>,
    /// Why it was invalidated, if it was.
    pub invalid: Option<String>,
    /// The dependency handles last reported by `cuStreamGetCaptureInfo` (kept alive here).
    pub reported: Vec<u64>,
}

/// A graph made by a capture: its nodes in capture order (a valid topological order).
pub struct Graph {
    pub ctx: u64,
    pub nodes: Vec<Node>,
}

/// An instantiated graph: what each launch enqueues.
pub struct Exec {
    pub ops: Vec<OpKind>,
}

/// Begins a capture on stream `sid` (resolved; not the legacy stream).
pub fn begin(st: &mut State, sid: u64, mode: u32) -> Result<()> {
    let s = &st.streams[&sid];
    if s.kind == crate::stream::StreamKind::Legacy {
        bail!(
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            "the legacy default stream (NULL / CU_STREAM_LEGACY) cannot be captured; capture a created stream"
        );
    }
    if s.capture.is_some() {
        bail!(CUDA_ERROR_ILLEGAL_STATE, "stream {sid:#x} is already capturing");
    }
    let ctx = s.ctx;
    st.next_capture += 1;
    let id = st.next_capture;
    let graph = st.new_handle(HandleKind::Graph);
    st.captures.insert(
        id,
        Capture {
            id,
            origin: sid,
            ctx,
            mode,
            thread: state::thread_key(),
            graph,
            nodes: Vec::new(),
            streams: vec![sid],
            invalid: None,
            reported: Vec::new(),
        },
    );
    let s = st.streams.get_mut(&sid).expect("resolved");
    s.capture = Some(id);
    s.cap_deps.clear();
    ACTIVE.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// Records `op` on capturing stream `sid` (a node after the stream's current dependencies).
pub fn record(st: &mut State, sid: u64, cid: u64, op: OpKind) {
    let h = st.new_handle(HandleKind::GraphNode);
    let deps = std::mem::take(&mut st.streams.get_mut(&sid).expect("capturing stream").cap_deps);
    let c = st.captures.get_mut(&cid).expect("a capturing stream's capture exists");
    c.nodes.push(Node { handle: h, op, deps });
    let at = c.nodes.len() - 1;
    st.streams.get_mut(&sid).expect("capturing stream").cap_deps = vec![at];
}

/// Marks capture `cid` invalid (the first reason stays).
pub fn invalidate(st: &mut State, cid: u64, why: &str) {
    if let Some(c) = st.captures.get_mut(&cid) {
        c.invalid.get_or_insert_with(|| why.to_string());
    }
}

/// The error of an operation that may not be captured: it invalidates the capture, as the
/// driver's do.
pub fn refuse(st: &mut State, cid: u64, code: CUresult, why: String) -> Error {
    invalidate(st, cid, &why);
    Error::new(code, why)
}

/// Fails an operation that cannot be captured (`what`) when stream `sid` captures.
pub fn not_capturable(st: &mut State, sid: u64, what: &str) -> Result<()> {
    if let Some(cid) = st.streams[&sid].capture {
        return Err(refuse(
            st,
            cid,
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            format!("{what} cannot be captured (stream {sid:#x} is capturing); the capture is invalidated"),
        ));
    }
    Ok(())
}

/// Captures of context `ctx` on blocking streams (which order with the legacy stream).
fn blocking_captures(st: &State, ctx: u64) -> Vec<u64> {
    let mut v: Vec<u64> = st
        .streams
        .values()
        .filter(|s| s.ctx == ctx && s.blocking() && !s.destroyed)
        .filter_map(|s| s.capture)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Work on (or a query of) the legacy stream of `ctx`: refused, and the captures
/// invalidated, while a blocking stream of the context captures (the legacy stream would
/// have to order with work that does not run).
pub fn legacy_use(st: &mut State, ctx: u64, invalidate_them: bool) -> Result<()> {
    let caps = blocking_captures(st, ctx);
    if caps.is_empty() {
        return Ok(());
    }
    let why = "the legacy default stream (NULL, CU_STREAM_LEGACY, and synchronous copies and memsets) is used while \
               a blocking stream of its context captures";
    if invalidate_them {
        for c in &caps {
            invalidate(st, *c, why);
        }
    }
    bail!(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "{why}; create the capturing stream with CU_STREAM_NON_BLOCKING");
}

/// Synchronising or querying stream `sid`: refused (and its capture invalidated) while it
/// captures; the legacy stream while a blocking stream of its context captures.
pub fn stream_sync(st: &mut State, sid: u64, call: &str) -> Result<()> {
    let s = &st.streams[&sid];
    if let Some(cid) = s.capture {
        return Err(refuse(
            st,
            cid,
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            format!(
                "{call} of stream {sid:#x}, which is capturing (its work does not run until the graph is launched)"
            ),
        ));
    }
    if s.kind == crate::stream::StreamKind::Legacy {
        let ctx = s.ctx;
        legacy_use(st, ctx, true)?;
    }
    Ok(())
}

/// Synchronising context `ctx`: refused (and its captures invalidated) while any of its
/// streams captures.
pub fn ctx_sync(st: &mut State, ctx: u64) -> Result<()> {
    let caps: Vec<u64> = st.captures.values().filter(|c| c.ctx == ctx).map(|c| c.id).collect();
    if caps.is_empty() {
        return Ok(());
    }
    let why = format!("cuCtxSynchronize of context {ctx:#x}, one of whose streams is capturing");
    for c in &caps {
        invalidate(st, *c, &why);
    }
    Err(Error::new(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, why))
}

/// The driver functions the capture modes restrict ("potentially unsafe": they allocate or
/// free memory or synchronise with the device outside any stream, so a capture cannot
/// observe them). Stream and event synchronisation and queries check themselves.
pub const UNSAFE: &[&str] = &[
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemFree_v2",
    "cuMemAllocHost_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemcpy",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoD_v2",
    "cuMemcpyPeer",
    "cuMemcpy2D_v2",
    "cuMemcpy2DUnaligned_v2",
    "cuMemsetD8_v2",
    "cuMemsetD16_v2",
    "cuMemsetD32_v2",
    "cuMemsetD2D8_v2",
    "cuMemsetD2D16_v2",
    "cuMemsetD2D32_v2",
    "cuIpcOpenMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
];

/// A potentially unsafe call (`name`) from the calling thread: refused with
/// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating the captures concerned, where the
/// modes say so: in GLOBAL thread mode while this thread captures (not RELAXED) or another
/// thread captures in GLOBAL mode; in THREAD_LOCAL mode while this thread captures (not
/// RELAXED); never in RELAXED mode.
pub fn check_unsafe(name: &str) -> Result<()> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let mode = thread_mode();
    if mode == MODE_RELAXED {
        return Ok(());
    }
    let me = state::thread_key();
    let mut st = state::lock();
    let hit: Vec<u64> = st
        .captures
        .values()
        .filter(|c| {
            (c.thread == me && c.mode != MODE_RELAXED)
                || (mode == MODE_GLOBAL && c.thread != me && c.mode == MODE_GLOBAL)
        })
        .map(|c| c.id)
        .collect();
    if hit.is_empty() {
        return Ok(());
    }
    let why = format!(
        "{name} is not permitted while a stream capture is in progress ({} capture(s); this thread's mode is {}); \
         the capture is invalidated. Call it before or after the capture, or relax this thread with \
         cuThreadExchangeStreamCaptureMode(CU_STREAM_CAPTURE_MODE_RELAXED)",
        hit.len(),
        mode_name(mode)
    );
    for c in &hit {
        invalidate(&mut st, *c, &why);
    }
    Err(Error::new(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, why))
}

pub fn mode_name(m: u32) -> &'static str {
    match m {
        MODE_GLOBAL => "CU_STREAM_CAPTURE_MODE_GLOBAL",
        MODE_THREAD_LOCAL => "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL",
        _ => "CU_STREAM_CAPTURE_MODE_RELAXED",
    }
}

/// Every node that `from` depends on, directly or not, and `from` itself.
fn ancestors(nodes: &[Node], from: &[usize]) -> HashSet<usize> {
    let mut seen = HashSet::new();
    let mut todo: Vec<usize> = from.to_vec();
    while let Some(n) = todo.pop() {
        if seen.insert(n) {
            todo.extend(nodes[n].deps.iter().copied());
        }
    }
    seen
}

/// Ends the capture begun on stream `sid` by the calling thread: its graph's handle, or
/// the reason there is none (every stream of the capture leaves capture mode either way,
/// except when `sid` is not where it began).
pub fn end(st: &mut State, sid: u64) -> Result<u64> {
    let Some(cid) = st.streams[&sid].capture else {
        bail!(CUDA_ERROR_ILLEGAL_STATE, "stream {sid:#x} is not capturing");
    };
    let c = &st.captures[&cid];
    if c.origin != sid {
        bail!(
            CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
            "the capture was begun on stream {:#x}, not {sid:#x}; end it there",
            c.origin
        );
    }
    if c.mode != MODE_RELAXED && c.thread != state::thread_key() {
        bail!(
            CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
            "the capture was begun in {} mode by another thread; end it on that thread",
            mode_name(c.mode)
        );
    }
    let c = st.captures.remove(&cid).expect("looked up");
    ACTIVE.fetch_sub(1, Ordering::AcqRel);
    let mut frontier = Vec::new();
    let mut unjoined = Vec::new();
    for &s in &c.streams {
        if let Some(x) = st.streams.get_mut(&s) {
            x.capture = None;
            let deps = std::mem::take(&mut x.cap_deps);
            if s == sid {
                frontier = deps;
            } else {
                unjoined.push((s, deps));
            }
        }
    }
    if let Some(why) = c.invalid {
        bail!(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "the capture was invalidated: {why}");
    }
    let joined = ancestors(&c.nodes, &frontier);
    if let Some((s, _)) = unjoined.iter().find(|(_, d)| d.iter().any(|n| !joined.contains(n))) {
        bail!(
            CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
            "stream {s:#x} took part in the capture but its work was not joined back into the origin stream \
             {sid:#x} (record an event on it and wait for it on the origin stream before ending the capture)"
        );
    }
    st.graphs.insert(c.graph, Graph { ctx: c.ctx, nodes: c.nodes });
    Ok(c.graph)
}

/// The capture a graph handle belongs to while it is being captured.
pub fn capture_of_graph(st: &State, g: u64) -> Option<u64> {
    st.captures.values().find(|c| c.graph == g).map(|c| c.id)
}

/// Launches `exec` on stream `sid`: its operations in order (recorded, if `sid` captures).
pub fn launch(st: &mut State, exec: u64, sid: u64) -> Result<()> {
    let Some(e) = st.execs.get(&exec) else {
        bail!(CUDA_ERROR_INVALID_VALUE, "{exec:#x} is not an instantiated graph (destroyed or never made)");
    };
    let ops: Vec<OpKind> = e.ops.to_vec();
    if ops.is_empty() {
        crate::stream::enqueue(st, sid, OpKind::Nop, Vec::new());
    }
    for op in ops {
        crate::stream::enqueue(st, sid, op, Vec::new());
    }
    Ok(())
}
