//! Contexts: primary and created ones, the per-thread current-context stack, sticky
//! errors, and tearing a context down.

use crate::error::{bail, err, Error, Result};
use crate::state::{self, HandleKind, State};
use crate::stream::{self, StreamKind};
use cudarc::driver::sys::CUresult;
use std::cell::RefCell;
use std::collections::HashSet;

pub struct Ctx {
    /// Visible device ordinal.
    pub device: i32,
    pub flags: u32,
    pub primary: bool,
    /// False for a primary context nobody retains (or after a reset).
    pub active: bool,
    /// Primary contexts: number of retains.
    pub retained: u32,
    /// The legacy default stream (valid while active).
    pub legacy: u64,
    /// Set when work of this context failed on the "GPU"; returned by every later call.
    pub sticky: Option<Error>,
    /// Contexts whose memory kernels of this one may access (`cuCtxEnablePeerAccess`).
    pub peers: HashSet<u64>,
    /// `cuCtxGetId`.
    pub id: u64,
}

impl Ctx {
    pub fn new(device: i32, flags: u32, primary: bool, id: u64) -> Ctx {
        Ctx { device, flags, primary, active: false, retained: 0, legacy: 0, sticky: None, peers: HashSet::new(), id }
    }
}

thread_local! {
    /// The calling thread's context stack; the last element is current.
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// The handle on top of the calling thread's stack (not validated).
pub fn top() -> Option<u64> {
    STACK.with(|s| s.borrow().last().copied())
}

pub fn push(h: u64) {
    STACK.with(|s| s.borrow_mut().push(h));
}

pub fn pop() -> Option<u64> {
    STACK.with(|s| s.borrow_mut().pop())
}

/// `cuCtxSetCurrent`: replaces the top (pushes on an empty stack); NULL pops.
pub fn set_top(h: Option<u64>) {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        match h {
            Some(h) => match s.last_mut() {
                Some(t) => *t = h,
                None => s.push(h),
            },
            None => {
                s.pop();
            }
        }
    })
}

/// Removes `h` from the top of the calling thread's stack (after `cuCtxDestroy`).
pub fn forget_current(h: u64) {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        if s.last() == Some(&h) {
            s.pop();
        }
    })
}

/// A context handle that names a live context (sticky errors not checked).
pub fn live(st: &State, h: u64) -> Result<&Ctx> {
    match st.ctxs.get(&h) {
        Some(c) if c.active => Ok(c),
        Some(_) => bail!(CUDA_ERROR_INVALID_CONTEXT, "context {h:#x} is destroyed (primary context released or reset)"),
        None if h == 0 => bail!(CUDA_ERROR_INVALID_CONTEXT, "NULL context"),
        None => bail!(CUDA_ERROR_INVALID_CONTEXT, "{h:#x} is not a context (destroyed or never created)"),
    }
}

/// The sticky error of context `h`, if its work has failed.
pub fn check_sticky(st: &State, h: u64) -> Result<()> {
    match st.ctxs.get(&h).and_then(|c| c.sticky.clone()) {
        Some(e) => Err(Error::new(e.code, format!("context {h:#x} is unusable after an earlier error: {}", e.why))),
        None => Ok(()),
    }
}

/// The current context of the calling thread: CUDA_ERROR_INVALID_CONTEXT when there is none
/// or it is destroyed, its sticky error if its work failed.
pub fn current(st: &State) -> Result<u64> {
    let h = top().ok_or_else(|| err!(CUDA_ERROR_INVALID_CONTEXT, "no context is current on this thread"))?;
    live(st, h)?;
    check_sticky(st, h)?;
    Ok(h)
}

/// Marks context `h` failed with `code`; prints one line the first time (it is a program bug).
pub fn set_sticky(st: &mut State, h: u64, code: CUresult, why: &str) {
    let Some(c) = st.ctxs.get_mut(&h) else { return };
    if c.sticky.is_none() {
        eprintln!(
            "simgpu: context {h:#x} (device {}) failed with {code:?}: {why}; every later call in this context returns it",
            c.device
        );
        c.sticky = Some(Error::new(code, why.to_string()));
    }
}

/// Makes an inactive context usable: creates its legacy stream.
pub fn activate(st: &mut State, h: u64) {
    let legacy = stream::create(st, h, StreamKind::Legacy, 0, 0);
    let c = st.ctxs.get_mut(&h).expect("activate: context exists");
    c.active = true;
    c.legacy = legacy;
    c.sticky = None;
}

/// A new (non-primary) context on `device`, made current (pushed) by the caller.
pub fn create(st: &mut State, device: i32, flags: u32) -> Result<u64> {
    if device < 0 || device as usize >= st.devices() {
        bail!(CUDA_ERROR_INVALID_DEVICE, "device {device} is not one of the {} visible devices", st.devices());
    }
    check_flags(flags)?;
    let h = st.new_handle(HandleKind::Ctx);
    let id = h >> 4;
    st.ctxs.insert(h, Ctx::new(device, flags, false, id));
    activate(st, h);
    Ok(h)
}

pub fn check_flags(flags: u32) -> Result<()> {
    // CU_CTX_FLAGS_MASK; at most one scheduling flag.
    if flags & !0xff != 0 || (flags & 7).count_ones() > 1 {
        bail!(CUDA_ERROR_INVALID_VALUE, "context flags {flags:#x} are not valid");
    }
    Ok(())
}

/// Waits until every stream of context `h` has run what was enqueued so far. Returns the
/// context's sticky error if its work failed.
pub fn synchronize(h: u64) -> Result<()> {
    let st = state::lock();
    let targets: Vec<(u64, u64)> =
        st.streams.iter().filter(|(_, s)| s.ctx == h).map(|(&id, s)| (id, s.enqueued)).collect();
    stream::wait_for(st, h, &targets)
}

/// Frees everything context `h` owns and marks it inactive (primary) or removes it.
/// Pending work is dropped: callers synchronise first.
pub fn teardown(st: &mut State, h: u64) {
    let streams: Vec<u64> = st.streams.iter().filter(|(_, s)| s.ctx == h).map(|(&id, _)| id).collect();
    for s in streams {
        stream::discard(st, s);
    }
    st.per_thread.retain(|&(_, c), _| c != h);
    st.events.retain(|_, e| e.ctx != h);
    let modules: Vec<u64> = st.modules.iter().filter(|(_, m)| m.ctx == h).map(|(&id, _)| id).collect();
    for m in modules {
        crate::module::unload(st, m);
    }
    crate::ipc::close_all(st, h);
    st.mem.free_all_of(h);
    for c in st.ctxs.values_mut() {
        c.peers.remove(&h);
    }
    let c = st.ctxs.get_mut(&h).expect("teardown: context exists");
    if c.primary {
        c.active = false;
        c.retained = 0;
        c.sticky = None;
        c.peers.clear();
        c.legacy = 0;
    } else {
        st.ctxs.remove(&h);
    }
    crate::state::global().done.notify_all();
}
