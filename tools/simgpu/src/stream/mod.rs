//! Streams: queues of operations run in order by the executor thread, the legacy default
//! stream's implicit synchronisation, and waiting for stream progress from host threads.

pub mod exec;
pub mod op;

use crate::ctx;
use crate::error::{bail, Result};
use crate::state::{self, HandleKind, State};
use op::{Op, OpKind};
use std::collections::VecDeque;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

/// `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD` (macros in cuda.h, absent from cudarc).
pub const STREAM_LEGACY: u64 = 0x1;
pub const STREAM_PER_THREAD: u64 = 0x2;
pub const NON_BLOCKING: u32 = 0x1;
/// `cuCtxGetStreamPriorityRange` of a Hopper GPU: (least, greatest).
pub const PRIORITY_RANGE: (i32, i32) = (0, -5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    /// The context's legacy default stream (handles NULL and CU_STREAM_LEGACY).
    Legacy,
    /// A thread's per-thread default stream (CU_STREAM_PER_THREAD): blocking.
    PerThread,
    Created,
}

pub struct Stream {
    pub ctx: u64,
    pub kind: StreamKind,
    pub flags: u32,
    pub priority: i32,
    /// `cuStreamGetId`.
    pub id: u64,
    pub queue: VecDeque<Op>,
    /// Sequence number of the last operation enqueued / completed (0: none).
    pub enqueued: u64,
    pub completed: u64,
    /// The head is being executed (outside the lock).
    pub running: bool,
    /// cuStreamDestroy was called: the handle is dead, the queue still drains.
    pub destroyed: bool,
    /// The capture this stream takes part in, and the nodes its next operation depends on.
    pub capture: Option<u64>,
    pub cap_deps: Vec<usize>,
}

impl Stream {
    /// Whether work on it synchronises with the legacy stream.
    pub fn blocking(&self) -> bool {
        self.kind != StreamKind::Legacy && self.flags & NON_BLOCKING == 0
    }

    pub fn idle(&self) -> bool {
        self.queue.is_empty() && !self.running
    }
}

/// A new stream of context `ctx`.
pub fn create(st: &mut State, ctx: u64, kind: StreamKind, flags: u32, priority: i32) -> u64 {
    let h = st.new_handle(HandleKind::Stream);
    let s = Stream {
        ctx,
        kind,
        flags,
        priority,
        id: h >> 4,
        queue: VecDeque::new(),
        enqueued: 0,
        completed: 0,
        running: false,
        destroyed: false,
        capture: None,
        cap_deps: Vec::new(),
    };
    st.streams.insert(h, s);
    h
}

/// The stream a handle names, for work enqueued by the calling thread: NULL and
/// CU_STREAM_LEGACY are the current context's legacy stream, CU_STREAM_PER_THREAD the
/// thread's own. Needs a current context; a created stream must belong to it.
pub fn resolve(st: &mut State, h: u64) -> Result<u64> {
    let cur = ctx::current(st)?;
    match h {
        0 | STREAM_LEGACY => {
            // It orders with every blocking stream: not while one of them captures.
            crate::graph::legacy_use(st, cur, true)?;
            Ok(st.ctxs[&cur].legacy)
        }
        STREAM_PER_THREAD => Ok(per_thread(st, cur)),
        _ => {
            let s = lookup(st, h)?;
            if s.ctx != cur {
                bail!(
                    CUDA_ERROR_INVALID_HANDLE,
                    "stream {h:#x} belongs to context {:#x}, but context {cur:#x} is current",
                    s.ctx
                );
            }
            Ok(h)
        }
    }
}

/// The calling thread's per-thread default stream in `ctx`, created at first use.
pub fn per_thread(st: &mut State, ctx: u64) -> u64 {
    let key = (state::thread_key(), ctx);
    if let Some(&s) = st.per_thread.get(&key) {
        return s;
    }
    let s = create(st, ctx, StreamKind::PerThread, 0, 0);
    st.per_thread.insert(key, s);
    s
}

/// A created stream by handle (no special handles), live and of a usable context.
pub fn lookup(st: &State, h: u64) -> Result<&Stream> {
    match st.streams.get(&h) {
        Some(s) if !s.destroyed && s.kind == StreamKind::Created => {
            ctx::live(st, s.ctx)?;
            ctx::check_sticky(st, s.ctx)?;
            Ok(s)
        }
        _ => bail!(CUDA_ERROR_INVALID_HANDLE, "{h:#x} is not a stream (destroyed or never created)"),
    }
}

/// Any stream handle, special ones included, to the stream id (for queries and
/// synchronisation, which need a current context only for the special handles).
pub fn resolve_any(st: &mut State, h: u64) -> Result<u64> {
    match h {
        0 | STREAM_LEGACY | STREAM_PER_THREAD => resolve(st, h),
        _ => lookup(st, h).map(|_| h),
    }
}

/// Appends an operation to stream `sid`; returns its sequence number. Implements the legacy
/// stream's rules: work on it waits for all earlier work of the context's blocking streams,
/// and work on a blocking stream waits for earlier legacy-stream work. On a capturing
/// stream the operation is recorded in the capture instead (sequence number 0: nothing to
/// wait for).
pub fn enqueue(st: &mut State, sid: u64, kind: OpKind, extra_deps: Vec<(u64, u64)>) -> u64 {
    if let Some(cid) = st.streams[&sid].capture {
        crate::graph::record(st, sid, cid, kind);
        return 0;
    }
    let latency = st.cfg.latency;
    let s = &st.streams[&sid];
    let ctx = s.ctx;
    let mut deps = extra_deps;
    match s.kind {
        StreamKind::Legacy => {
            for (&id, o) in st.streams.iter() {
                if o.ctx == ctx && o.blocking() && o.enqueued > o.completed {
                    deps.push((id, o.enqueued));
                }
            }
        }
        _ if s.blocking() => {
            let legacy = st.ctxs[&ctx].legacy;
            let l = &st.streams[&legacy];
            if l.enqueued > l.completed {
                deps.push((legacy, l.enqueued));
            }
        }
        _ => {}
    }
    let s = st.streams.get_mut(&sid).expect("enqueue: stream exists");
    s.enqueued += 1;
    let seq = s.enqueued;
    s.queue.push_back(Op { seq, ready_at: Instant::now() + latency, deps, kind });
    state::global().work.notify_one();
    seq
}

/// Drops everything queued on stream `sid` and removes it (context torn down).
pub fn discard(st: &mut State, sid: u64) {
    if let Some(s) = st.streams.get_mut(&sid) {
        s.queue.clear();
        s.completed = s.enqueued;
        if s.running {
            // The executor finishes the running operation, then removes the stream.
            s.destroyed = true;
            return;
        }
    }
    st.streams.remove(&sid);
}

/// Whether every (stream, seq) target has completed (a removed stream has).
pub fn reached(st: &State, targets: &[(u64, u64)]) -> bool {
    targets.iter().all(|&(s, seq)| st.streams.get(&s).is_none_or(|x| x.completed >= seq))
}

/// Blocks the calling thread until every (stream, seq) target has completed, or context
/// `ctx` (if non-zero) has failed: then its sticky error.
pub fn wait_for(mut st: MutexGuard<'static, State>, ctx: u64, targets: &[(u64, u64)]) -> Result<()> {
    loop {
        if ctx != 0 {
            ctx::check_sticky(&st, ctx)?;
        }
        if reached(&st, targets) {
            return Ok(());
        }
        st = wait_a_while(st);
    }
}

/// Waits for the executor's next batch (or a millisecond, for conditions nobody notifies:
/// values written by another process, interprocess events).
pub fn wait_a_while(st: MutexGuard<'static, State>) -> MutexGuard<'static, State> {
    let g = state::global();
    g.done.wait_timeout(st, Duration::from_millis(1)).unwrap_or_else(std::sync::PoisonError::into_inner).0
}

/// Enqueues on `sid` and waits until that operation has completed.
pub fn run_sync(mut st: MutexGuard<'static, State>, sid: u64, kind: OpKind) -> Result<()> {
    let ctx = st.streams[&sid].ctx;
    let seq = enqueue(&mut st, sid, kind, Vec::new());
    wait_for(st, ctx, &[(sid, seq)])
}

/// Waits until stream `sid` has run everything enqueued so far.
pub fn synchronize(st: MutexGuard<'static, State>, sid: u64) -> Result<()> {
    let s = &st.streams[&sid];
    let (ctx, target) = (s.ctx, s.enqueued);
    wait_for(st, ctx, &[(sid, target)])
}

/// Waits until no queued or running operation may still access host memory in
/// `start..start + len` (before pinned memory is freed or unregistered: the executor would
/// otherwise touch unmapped memory). Work that cannot touch it is not waited for, so a
/// stream blocked forever elsewhere does not block the free.
pub fn quiesce_host(st: MutexGuard<'static, State>, start: usize, len: usize) {
    let mut targets = Vec::new();
    for (&id, s) in st.streams.iter() {
        if s.running {
            targets.push((id, s.completed + 1));
        }
        if let Some(op) = s.queue.iter().rev().find(|op| op.kind.may_touch_host(start, len)) {
            targets.push((id, op.seq));
        }
    }
    let _ = wait_for(st, 0, &targets);
}
