//! Stream operations and how the executor runs them. Every device-side range was checked
//! against its allocation when the operation was enqueued; at run time the allocation must
//! still be live (else the context fails with CUDA_ERROR_ILLEGAL_ADDRESS, as a GPU would).

use crate::event::EventSync;
use crate::kernels::Launch;
use crate::mem::alloc::{Alloc, FREEING, LIVE, PENDING};
use crate::memop;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

pub struct Op {
    pub seq: u64,
    /// Enqueue time plus the simulated launch latency.
    pub ready_at: Instant,
    /// (stream, seq) that must have completed first.
    pub deps: Vec<(u64, u64)>,
    pub kind: OpKind,
}

/// One side of a copy or the target of a memset / memory operation.
#[derive(Clone)]
pub enum Side {
    /// Device memory through its alias: (allocation, offset).
    Dev(Arc<Alloc>, usize),
    /// Host memory (pageable, pinned or registered), accessed directly when the op runs.
    Host(usize),
    /// A private copy of pageable source memory made when the copy was enqueued.
    Staged(Arc<Vec<u8>>),
}

impl Side {
    /// The address to access at run time; fails if the allocation was freed meanwhile.
    pub fn ptr(&self) -> Result<*mut u8, String> {
        match self {
            Side::Dev(a, off) => match a.state() {
                // A mapping nobody was given access to faults, as on a GPU.
                LIVE if a.denied(None, false).is_some() => Err(a.denied(None, false).unwrap_or_default()),
                // FREEING: cuMemFreeAsync was called but this work was queued before it.
                LIVE | FREEING => Ok(a.ptr(*off)),
                PENDING => Err(format!(
                    "allocation {:#x}+{} is used before its stream reached cuMemAllocAsync",
                    a.base, a.size
                )),
                _ => Err(format!("allocation {:#x}+{} was freed before this work ran", a.base, a.size)),
            },
            Side::Host(p) => Ok(*p as *mut u8),
            Side::Staged(v) => Ok(v.as_ptr() as *mut u8),
        }
    }

    /// The same side `n` bytes further on.
    pub fn offset(&self, n: usize) -> Side {
        match self {
            Side::Dev(a, off) => Side::Dev(a.clone(), off + n),
            Side::Host(p) => Side::Host(p + n),
            Side::Staged(_) => unreachable!("staged sides are never offset"),
        }
    }
}

/// A (possibly 2D) copy: `height` rows of `width` bytes, rows `pitch` bytes apart.
#[derive(Clone)]
pub struct Copy {
    pub dst: Side,
    pub dpitch: usize,
    pub src: Side,
    pub spitch: usize,
    pub width: usize,
    pub height: usize,
}

/// Cloned for every launch of a graph that recorded it.
#[derive(Clone)]
pub enum OpKind {
    Copy(Copy),
    /// `height` rows of `count` elements of `elem` bytes set to `value`, rows `pitch` apart.
    Memset {
        dst: Side,
        pitch: usize,
        count: usize,
        height: usize,
        elem: usize,
        value: u32,
    },
    /// cuStreamWriteValue32/64.
    Write {
        at: Side,
        value: u64,
        wide: bool,
    },
    /// cuStreamWaitValue32/64: the stream stops until the condition holds.
    Wait {
        at: Side,
        value: u64,
        wide: bool,
        flags: u32,
    },
    /// cuEventRecord: completes record `gen` of the event.
    Record {
        sync: Arc<EventSync>,
        gen: u64,
    },
    /// cuStreamWaitEvent on an interprocess event: waits for record `gen`.
    WaitShared {
        sync: Arc<EventSync>,
        gen: u64,
    },
    Kernel(Launch),
    /// cuLaunchHostFunc.
    HostFn {
        f: unsafe extern "C" fn(*mut c_void),
        data: usize,
    },
    /// cuStreamAddCallback: (callback, stream handle, user data).
    Callback {
        f: unsafe extern "C" fn(usize, u32, *mut c_void),
        stream: usize,
        data: usize,
    },
    /// cuMemAllocAsync: the allocation becomes usable.
    AllocReady(Arc<Alloc>),
    /// cuMemFreeAsync: the allocation is freed.
    Free(Arc<Alloc>),
    /// Only orders (cuStreamWaitEvent, barriers, flushes).
    Nop,
}

impl OpKind {
    /// Whether a waiting operation may run now (checked by the executor under the lock).
    /// A freed target counts as ready: running it reports the error.
    pub fn ready(&self) -> bool {
        match self {
            OpKind::Wait { at, value, wide, flags } => match at.ptr() {
                // SAFETY: the range was checked (aligned, inside a live allocation or pinned
                // region) when the wait was enqueued; the allocation is kept mapped by `at`.
                Ok(p) => unsafe { memop::wait_satisfied(p, *value, *wide, *flags) },
                Err(_) => true,
            },
            OpKind::WaitShared { sync, gen } => sync.done() >= *gen,
            _ => true,
        }
    }

    /// Whether running it may access host memory in `start..start + len`: host sides of
    /// copies, memsets and memory operations, kernels with a pointer argument in the range,
    /// and host functions (which may do anything).
    pub fn may_touch_host(&self, start: usize, len: usize) -> bool {
        let inside = |p: usize| p >= start && p < start + len;
        let side = |s: &Side, span: usize| matches!(s, Side::Host(p) if *p < start + len && p + span > start);
        match self {
            OpKind::Copy(c) => {
                let span = c.height.saturating_sub(1) * c.dpitch.max(c.spitch) + c.width;
                side(&c.dst, span) || side(&c.src, span)
            }
            OpKind::Memset { dst, pitch, count, height, elem, .. } => {
                side(dst, height.saturating_sub(1) * pitch + count * elem)
            }
            OpKind::Write { at, .. } | OpKind::Wait { at, .. } => side(at, 8),
            OpKind::Kernel(l) => {
                l.args.bytes.chunks_exact(8).any(|w| inside(u64::from_ne_bytes(w.try_into().expect("8")) as usize))
            }
            OpKind::HostFn { .. } | OpKind::Callback { .. } => true,
            _ => false,
        }
    }

    /// Runs the operation on the executor thread.
    pub fn run(self) -> Result<(), String> {
        match self {
            OpKind::Copy(c) => {
                let (d, s) = (c.dst.ptr()?, c.src.ptr()?);
                for row in 0..c.height {
                    // SAFETY: every row of both sides was checked to lie inside its allocation or
                    // host range when enqueued (host memory is the caller's promise, as on a GPU);
                    // `copy` allows overlap.
                    unsafe { std::ptr::copy(s.add(row * c.spitch), d.add(row * c.dpitch), c.width) };
                }
                Ok(())
            }
            OpKind::Memset { dst, pitch, count, height, elem, value } => {
                let d = dst.ptr()?;
                for row in 0..height {
                    // SAFETY: as for copies: rows checked against the allocation at enqueue.
                    unsafe { memset_row(d.add(row * pitch), count, elem, value) };
                }
                Ok(())
            }
            OpKind::Write { at, value, wide } => {
                let p = at.ptr()?;
                // SAFETY: checked aligned and inside device-accessible memory at enqueue.
                unsafe { memop::write(p, value, wide) };
                Ok(())
            }
            OpKind::Wait { at, .. } => at.ptr().map(|_| ()),
            OpKind::Record { sync, gen } => {
                sync.complete(gen);
                Ok(())
            }
            OpKind::Kernel(l) => l.run(),
            OpKind::HostFn { f, data } => {
                // SAFETY: the application's callback with its own argument, as cuLaunchHostFunc
                // promises to call it.
                unsafe { f(data as *mut c_void) };
                Ok(())
            }
            OpKind::Callback { f, stream, data } => {
                // SAFETY: as for host functions; status 0 (success: failed contexts skip work).
                unsafe { f(stream, 0, data as *mut c_void) };
                Ok(())
            }
            OpKind::AllocReady(a) => {
                if a.state() == PENDING {
                    a.set_state(LIVE);
                }
                Ok(())
            }
            OpKind::Free(a) => {
                if a.state() == FREEING {
                    crate::state::lock().mem.remove(a.base);
                }
                Ok(())
            }
            OpKind::WaitShared { .. } | OpKind::Nop => Ok(()),
        }
    }
}

/// Sets `count` elements of `elem` (1, 2 or 4) bytes at `p` to the low bytes of `value`.
///
/// # Safety
/// `p..p + count * elem` is writable.
unsafe fn memset_row(p: *mut u8, count: usize, elem: usize, value: u32) {
    match elem {
        // SAFETY: `count` bytes are writable (caller).
        1 => unsafe { std::ptr::write_bytes(p, value as u8, count) },
        _ => {
            let bytes = value.to_ne_bytes();
            for i in 0..count {
                // SAFETY: element i lies inside the range (caller); unaligned writes are fine.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.add(i * elem), elem) };
            }
        }
    }
}
