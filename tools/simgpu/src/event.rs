//! Events: record generations and completion counters, in process memory or, for
//! interprocess events, in a shared memfd page that other processes map.

use crate::error::{bail, Result};
use crate::mem::alloc::Backing;
use crate::state::{self, HandleKind, State};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub const DEFAULT: u32 = 0x0;
pub const BLOCKING_SYNC: u32 = 0x1;
pub const DISABLE_TIMING: u32 = 0x2;
pub const INTERPROCESS: u32 = 0x4;

/// Counters of an event: [records made, records completed, time of the last completion (ns
/// since the process's epoch)]. Generations only grow: a record completes `done` up to its
/// own generation.
pub struct EventSync {
    counters: *const AtomicU64,
    /// Keeps the counters' memory alive: a heap box or a shared mapping.
    _heap: Option<Box<[AtomicU64; 3]>>,
    pub shared: Option<Backing>,
}

// SAFETY: `counters` points into `_heap` or `shared`, both owned here and never moved; the
// counters are atomics.
unsafe impl Send for EventSync {}
// SAFETY: as above.
unsafe impl Sync for EventSync {}

impl EventSync {
    pub fn local() -> EventSync {
        let heap = Box::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
        EventSync { counters: heap.as_ptr(), _heap: Some(heap), shared: None }
    }

    /// Counters in the first bytes of a shared page (exported or imported).
    pub fn shared(b: Backing) -> EventSync {
        EventSync { counters: b.alias as *const AtomicU64, _heap: None, shared: Some(b) }
    }

    fn at(&self, i: usize) -> &AtomicU64 {
        // SAFETY: three counters live at `counters` for as long as `self` (see the fields).
        unsafe { &*self.counters.add(i) }
    }

    /// Generation of the latest record.
    pub fn recorded(&self) -> u64 {
        self.at(0).load(Ordering::Acquire)
    }

    /// Highest completed generation.
    pub fn done(&self) -> u64 {
        self.at(1).load(Ordering::Acquire)
    }

    pub fn time_ns(&self) -> u64 {
        self.at(2).load(Ordering::Acquire)
    }

    /// A new record: its generation.
    pub fn next_record(&self) -> u64 {
        self.at(0).fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Record `gen` reached the front of its stream.
    pub fn complete(&self, gen: u64) {
        let t = state::global().epoch.elapsed().as_nanos() as u64;
        self.at(2).store(t.max(1), Ordering::Release);
        self.at(1).fetch_max(gen, Ordering::AcqRel);
    }
}

pub struct Event {
    pub ctx: u64,
    pub flags: u32,
    pub sync: Arc<EventSync>,
    /// (stream, seq) of the latest record made in this process.
    pub last: Option<(u64, u64)>,
    /// Opened with cuIpcOpenEventHandle: completion is only known through the counters.
    pub imported: bool,
    /// Buffer id for IPC handles.
    pub id: u64,
    /// Last recorded in a capturing stream: (capture id, the nodes the record stands for).
    pub cap: Option<(u64, Vec<usize>)>,
}

/// A new event of context `ctx`.
pub fn create(st: &mut State, ctx: u64, flags: u32) -> Result<u64> {
    if flags & !(BLOCKING_SYNC | DISABLE_TIMING | INTERPROCESS) != 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "event flags {flags:#x} are not valid");
    }
    if flags & INTERPROCESS != 0 && flags & DISABLE_TIMING == 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "CU_EVENT_INTERPROCESS needs CU_EVENT_DISABLE_TIMING");
    }
    let id = st.mem.next_id();
    let sync = if flags & INTERPROCESS != 0 {
        let name = format!("fccl-sim-ev-{}-{id}", state::pid());
        EventSync::shared(Backing::create(&name, 4096, true)?)
    } else {
        EventSync::local()
    };
    let h = st.new_handle(HandleKind::Event);
    st.events.insert(h, Event { ctx, flags, sync: Arc::new(sync), last: None, imported: false, id, cap: None });
    Ok(h)
}

/// An event by handle, of a live context.
pub fn lookup(st: &State, h: u64) -> Result<&Event> {
    match st.events.get(&h) {
        Some(e) => {
            crate::ctx::live(st, e.ctx)?;
            Ok(e)
        }
        None => bail!(CUDA_ERROR_INVALID_HANDLE, "{h:#x} is not an event (destroyed or never created)"),
    }
}

/// The live capture the event was last recorded in, if any (a "captured event").
pub fn captured_in(st: &State, e: &Event) -> Option<u64> {
    e.cap.as_ref().map(|(c, _)| *c).filter(|c| st.captures.contains_key(c))
}

/// CUDA_ERROR_CAPTURED_EVENT (and the capture invalidated) when `call` queries or
/// synchronises an event last recorded in a capture in progress.
pub fn not_captured(st: &mut State, h: u64, call: &str) -> Result<()> {
    let e = lookup(st, h)?;
    if let Some(cid) = captured_in(st, e) {
        return Err(crate::graph::refuse(
            st,
            cid,
            cudarc::driver::sys::CUresult::CUDA_ERROR_CAPTURED_EVENT,
            format!("{call} of event {h:#x}, last recorded in a stream that is capturing (it stands for no work yet)"),
        ));
    }
    Ok(())
}

/// Whether the event's latest record has completed (an event never recorded has).
pub fn complete(e: &Event) -> bool {
    e.sync.done() >= e.sync.recorded()
}
