//! The process-global state of the simulated driver, `cuInit`, and the wrapper every
//! exported function runs its body in (initialisation and fork checks, panics, tracing).

use crate::config::{self, Config, Trace};
use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::ipc::IpcTable;
use crate::mem::MemTable;
use crate::module::{Function, Module};
use crate::stream::Stream;
use cudarc::driver::sys::CUresult;
use std::cell::Cell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;

/// Everything the API calls and the executor share; one lock, held briefly (copies and
/// kernels run outside it).
pub struct Global {
    pub state: Mutex<State>,
    /// The executor waits here for new work.
    pub work: Condvar,
    /// Host threads waiting for stream progress wait here; the executor notifies after
    /// every batch of operations.
    pub done: Condvar,
    /// Time origin of event timestamps.
    pub epoch: Instant,
}

static GLOBAL: OnceLock<Global> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());
/// Set in a child forked after `cuInit`: like the real driver, CUDA is unusable there
/// (and the parent's lock may be held by a thread that does not exist in the child).
static FORKED: AtomicBool = AtomicBool::new(false);
/// pid of the process that initialised, for IPC handles.
static PID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static ON_EXECUTOR: Cell<bool> = const { Cell::new(false) };
    static THREAD_KEY: u64 = {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

/// A small unique number for the calling thread (per-thread default streams).
pub fn thread_key() -> u64 {
    THREAD_KEY.with(|k| *k)
}

pub fn mark_executor_thread() {
    ON_EXECUTOR.with(|c| c.set(true));
}

pub fn initialized() -> bool {
    GLOBAL.get().is_some()
}

/// The global state; only called behind [`api`], which checks that `cuInit` succeeded.
pub fn global() -> &'static Global {
    GLOBAL.get().expect("simgpu: state used before cuInit")
}

/// Locks the state. A panic while it was held (caught and reported by [`api`]) does not
/// make it unusable: every update keeps the tables consistent at each step.
pub fn lock() -> MutexGuard<'static, State> {
    global().state.lock().unwrap_or_else(PoisonError::into_inner)
}

pub fn pid() -> u32 {
    PID.load(Ordering::Relaxed) as u32
}

/// Kinds of opaque handles; part of the handle value so that one kind is never taken for another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleKind {
    Ctx = 1,
    Stream = 2,
    Event = 3,
    Module = 4,
    Function = 5,
    Pool = 6,
    Graph = 7,
    GraphNode = 8,
    GraphExec = 9,
    /// CUmemGenericAllocationHandle.
    Mem = 10,
}

pub struct State {
    pub cfg: Config,
    next_handle: u64,
    pub ctxs: HashMap<u64, Ctx>,
    /// The primary context of each visible device (inactive until retained).
    pub primaries: Vec<u64>,
    pub streams: HashMap<u64, Stream>,
    /// (thread key, context) -> that thread's per-thread default stream.
    pub per_thread: HashMap<(u64, u64), u64>,
    pub events: HashMap<u64, Event>,
    pub modules: HashMap<u64, Module>,
    pub functions: HashMap<u64, Function>,
    pub mem: MemTable,
    pub ipc: IpcTable,
    /// cuMemCreate handles and address reservations.
    pub vmm: crate::vmm::VmmTable,
    /// The default memory pool handle of each visible device.
    pub pools: Vec<u64>,
    /// Stream captures in progress, by capture id; the last id given.
    pub captures: HashMap<u64, crate::graph::Capture>,
    pub next_capture: u64,
    /// Graphs made by captures, and instantiated graphs, by handle.
    pub graphs: HashMap<u64, crate::graph::Graph>,
    pub execs: HashMap<u64, crate::graph::Exec>,
}

impl State {
    fn new(cfg: Config) -> State {
        let devices = cfg.visible.len();
        let mut st = State {
            mem: MemTable::new(devices),
            cfg,
            next_handle: 0,
            ctxs: HashMap::new(),
            primaries: Vec::new(),
            streams: HashMap::new(),
            per_thread: HashMap::new(),
            events: HashMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            ipc: IpcTable::default(),
            vmm: Default::default(),
            pools: Vec::new(),
            captures: HashMap::new(),
            next_capture: 0,
            graphs: HashMap::new(),
            execs: HashMap::new(),
        };
        for d in 0..devices {
            let h = st.new_handle(HandleKind::Ctx);
            st.ctxs.insert(h, Ctx::new(d as i32, 0, true, st.next_handle));
            st.primaries.push(h);
            let p = st.new_handle(HandleKind::Pool);
            st.pools.push(p);
        }
        st
    }

    /// A fresh opaque handle: non-NULL, never 0x1/0x2 (the special stream handles), never
    /// reused, and pointing at no mapped memory, so dereferencing one faults.
    pub fn new_handle(&mut self, kind: HandleKind) -> u64 {
        self.next_handle += 1;
        0x5e00_0000_0000 | ((kind as u64) << 36) | (self.next_handle << 4)
    }

    pub fn devices(&self) -> usize {
        self.cfg.visible.len()
    }

    /// The physical ordinal of visible device `d`.
    pub fn physical(&self, d: i32) -> usize {
        self.cfg.visible[d as usize]
    }
}

/// `cuInit`: reads the configuration and starts the executor thread, once.
pub fn init(flags: u32) -> Result<()> {
    if flags != 0 {
        return Err(Error::new(CUresult::CUDA_ERROR_INVALID_VALUE, format!("flags {flags:#x} must be 0")));
    }
    if FORKED.load(Ordering::Relaxed) {
        return Err(Error::new(
            CUresult::CUDA_ERROR_NOT_INITIALIZED,
            "CUDA was initialised in the parent before fork(); it cannot be used in the child",
        ));
    }
    let _g = INIT_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    if initialized() {
        return Ok(());
    }
    let cfg = Config::from_env();
    if cfg.visible.is_empty() {
        return Err(Error::new(
            CUresult::CUDA_ERROR_NO_DEVICE,
            format!("no visible device (FERROCCL_SIM_DEVICES={}, CUDA_VISIBLE_DEVICES)", cfg.physical),
        ));
    }
    PID.store(u64::from(std::process::id()), Ordering::Relaxed);
    let g = Global {
        state: Mutex::new(State::new(cfg)),
        work: Condvar::new(),
        done: Condvar::new(),
        epoch: Instant::now(),
    };
    if GLOBAL.set(g).is_err() {
        return Ok(());
    }
    // SAFETY: `mark_forked` only stores to an atomic, which is async-signal-safe as a fork
    // handler must be.
    unsafe { libc::pthread_atfork(None, None, Some(mark_forked)) };
    std::thread::Builder::new()
        .name("simgpu-exec".into())
        .spawn(crate::stream::exec::run)
        .map_err(|e| Error::new(CUresult::CUDA_ERROR_OPERATING_SYSTEM, format!("cannot start the executor: {e}")))?;
    Ok(())
}

extern "C" fn mark_forked() {
    FORKED.store(true, Ordering::Relaxed);
}

/// Runs `f`, catching panics (no unwinding across the C boundary).
fn guarded(f: impl FnOnce() -> Result<()>) -> Result<()> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            Err(Error::new(CUresult::CUDA_ERROR_UNKNOWN, format!("internal error (simulator bug): {msg}")))
        }
    }
}

fn report(name: &str, r: Result<()>) -> CUresult {
    match r {
        Ok(()) => {
            if config::trace() == Trace::All {
                eprintln!("simgpu: {name} -> CUDA_SUCCESS");
            }
            CUresult::CUDA_SUCCESS
        }
        Err(e) => {
            let quiet = e.code == CUresult::CUDA_ERROR_NOT_READY && config::trace() != Trace::All;
            if config::trace() != Trace::Off && !quiet {
                eprintln!("simgpu: {name}: {} -> {:?}", e.why, e.code);
            }
            e.code
        }
    }
}

/// The body of every exported driver function that needs `cuInit`: CUDA_ERROR_NOT_INITIALIZED
/// before it (and in a forked child), CUDA_ERROR_NOT_PERMITTED from a host function running
/// on a stream (as the real driver forbids), CUDA_ERROR_UNKNOWN if the simulator panics.
pub fn api(name: &'static str, f: impl FnOnce() -> Result<()>) -> CUresult {
    crate::costs::on_call(name);
    let r = if FORKED.load(Ordering::Relaxed) {
        Err(Error::new(CUresult::CUDA_ERROR_NOT_INITIALIZED, "called in a child forked after cuInit"))
    } else if !initialized() {
        Err(Error::new(CUresult::CUDA_ERROR_NOT_INITIALIZED, "cuInit(0) has not been called"))
    } else if ON_EXECUTOR.with(Cell::get) {
        Err(Error::new(
            CUresult::CUDA_ERROR_NOT_PERMITTED,
            "CUDA calls are not allowed in a host function or stream callback",
        ))
    } else if crate::graph::UNSAFE.contains(&name) {
        guarded(|| crate::graph::check_unsafe(name).and_then(|()| f()))
    } else {
        guarded(f)
    };
    report(name, r)
}

/// Like [`api`] for the few functions that work before `cuInit`.
pub fn api_pre_init(name: &'static str, f: impl FnOnce() -> Result<()>) -> CUresult {
    crate::costs::on_call(name);
    report(name, guarded(f))
}
