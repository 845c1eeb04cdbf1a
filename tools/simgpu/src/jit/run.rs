//! Running a compiled kernel on the executor thread, with device memory that only the
//! kernel can touch.
//!
//! Device addresses are addresses of the simulator's `PROT_NONE` reservation, so the
//! kernel's first access to an allocation faults. The fault handler (SIGSEGV, SIGBUS)
//! checks that the kernel may access that allocation (live, of its device or a peer it
//! enabled, IPC-opened, managed) and maps the allocation's pages at its device address for
//! the rest of the launch; any other fault (outside every allocation, freed memory, another
//! device, an unmapped host address) jumps back to the runner, and the launch fails with
//! CUDA_ERROR_ILLEGAL_ADDRESS, as a GPU's fault does. Allocations end at a page boundary
//! (rounded to 512 bytes) with an unmapped page after, so reading past one faults. When the
//! launch ends its mappings go. Pointer parameters are checked first: host memory that is
//! neither pinned nor registered fails the launch, as a GPU cannot read it.
//!
//! The handler is installed at the first launch and put back in front whenever another
//! handler displaced it; faults that are not a kernel's go to the handler it displaced.

use super::Entry;
use crate::mem::alloc::{self, Alloc, Kind, FREEING, LIVE};
use crate::mem::Loc;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

extern "C" {
    fn siglongjmp(env: *mut c_void, val: c_int) -> !;
}

/// The launch running now (on the thread `RUNNER_TID`), for the fault handler.
struct Running {
    ctx: u64,
    /// The runner's `sigjmp_buf` (set by the runner, NULL outside it).
    jmp: *mut c_void,
    /// Ranges mapped at device addresses for this launch, and their allocations.
    mapped: Vec<(usize, usize, Arc<Alloc>)>,
    fault: Option<String>,
}

static CURRENT: AtomicPtr<Running> = AtomicPtr::new(std::ptr::null_mut());
static RUNNER_TID: AtomicI32 = AtomicI32::new(0);
/// The handlers ours displaced (SIGSEGV, SIGBUS): leaked boxes, replaced when we reinstall.
static PREV_SEGV: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static PREV_BUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Puts our handler in front for `sig`, remembering the one it displaces.
fn install(sig: c_int, prev: &AtomicPtr<libc::sigaction>) {
    // SAFETY: all-zero is a valid sigaction; with a NULL new action sigaction only reads.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::sigaction(sig, std::ptr::null(), &mut cur) };
    if cur.sa_sigaction == on_fault as *const () as usize {
        return;
    }
    let old = Box::into_raw(Box::new(cur));
    prev.store(old, Ordering::Release);
    // SAFETY: a zeroed sigaction with our SA_SIGINFO handler and an empty mask is valid.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_fault as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

/// Passes a fault that is not a kernel's to the handler ours displaced (or the default).
unsafe fn chain(sig: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
    let prev = if sig == libc::SIGBUS { &PREV_BUS } else { &PREV_SEGV };
    let p = prev.load(Ordering::Acquire);
    // SAFETY: a non-NULL pointer in `prev` is a leaked Box of the sigaction our handler
    // displaced (see `install`); those boxes are never freed nor written again.
    let action = if p.is_null() { libc::SIG_DFL } else { unsafe { (*p).sa_sigaction } };
    // SAFETY: as above.
    let siginfo = !p.is_null() && unsafe { (*p).sa_flags } & libc::SA_SIGINFO != 0;
    if action == libc::SIG_DFL || action == libc::SIG_IGN {
        // Restore the default and return: the access faults again and the process dies of
        // it, as it would have without the simulator.
        // SAFETY: resetting a signal's disposition to the default.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    } else if siginfo {
        // SAFETY: the displaced handler, with the arguments the kernel gave us.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = unsafe { std::mem::transmute(action) };
        f(sig, info, uctx);
    } else {
        // SAFETY: as above, a plain handler.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(action) };
        f(sig);
    }
}

extern "C" fn on_fault(sig: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
    let r = CURRENT.load(Ordering::Acquire);
    if !r.is_null() && RUNNER_TID.load(Ordering::Acquire) == gettid() {
        // SAFETY: set by `run` on this very thread, which is inside the kernel now (a
        // synchronous fault): nothing else touches it meanwhile.
        let run = unsafe { &mut *r };
        if !run.jmp.is_null() {
            // SAFETY: the kernel's fault: `info` is the kernel's siginfo.
            let addr = unsafe { (*info).si_addr() } as usize;
            let verdict = if sig == libc::SIGSEGV { map_fault(run, addr) } else { Err(bus_error(addr)) };
            match verdict {
                Ok(()) => return,
                Err(why) => {
                    run.fault = Some(why);
                    let env = run.jmp;
                    // SAFETY: the runner's live sigjmp_buf; the frames jumped over are the
                    // kernel's and this handler's, none of which owns anything.
                    unsafe { siglongjmp(env, 1) }
                }
            }
        }
    }
    // SAFETY: forwarding the signal as received.
    unsafe { chain(sig, info, uctx) }
}

fn bus_error(addr: usize) -> String {
    format!("the kernel accessed {addr:#x} and got a bus error")
}

/// Maps the allocation holding `addr` at its device address if the launch may access it.
fn map_fault(run: &mut Running, addr: usize) -> Result<(), String> {
    let st = crate::state::lock();
    let mem = &st.mem;
    if !mem.in_device_range(addr as u64) {
        return Err(format!(
            "the kernel accessed {addr:#x}, which is neither device memory nor pinned or registered host \
             memory (no memory there)"
        ));
    }
    let a = match mem.find_dev(addr as u64) {
        Some(a) if matches!(a.state(), LIVE | FREEING) => a.clone(),
        _ => return Err(format!("the kernel accessed {addr:#x}: {}", mem.why_not_device(addr as u64))),
    };
    if matches!(a.kind, Kind::Device | Kind::Async) && a.ctx != run.ctx {
        let mine = st.ctxs.get(&run.ctx);
        let same_device = mine.is_some_and(|c| c.device == a.device);
        let peer = mine.is_some_and(|c| c.peers.contains(&a.ctx));
        if !same_device && !peer {
            return Err(format!(
                "the kernel accessed {addr:#x}, memory of device {} whose context it has no peer access to",
                a.device
            ));
        }
    }
    let device = st.ctxs.get(&run.ctx).map(|c| c.device);
    if let Some(why) = a.denied(device, false) {
        return Err(format!("the kernel accessed {addr:#x}: {why}"));
    }
    if a.kind == Kind::Managed || run.mapped.iter().any(|m| Arc::ptr_eq(&m.2, &a)) {
        return Err(format!("the kernel accessed {addr:#x} of allocation {:#x}+{} and faulted", a.base, a.size));
    }
    let (start, len) = a.pages();
    alloc::map_alias_at(&a, start)?;
    if a.denied(device, true).is_some() {
        // Read-only access (cuMemSetAccess READ): a store faults again, and ends the launch.
        // SAFETY: the range was just mapped for this launch; only its protection changes.
        unsafe { libc::mprotect(start as *mut libc::c_void, len, libc::PROT_READ) };
    }
    run.mapped.push((start, len, a));
    Ok(())
}

/// One launch at a time: the prelude's thread indices are globals of each object.
static ONE: Mutex<()> = Mutex::new(());

/// Runs `k` over the grid with `args` (one value per parameter, at `offsets`).
pub fn run(
    k: &Entry,
    bytes: &[u8],
    offsets: &[usize],
    grid: [u32; 3],
    block: [u32; 3],
    ctx: u64,
) -> Result<(), String> {
    let _one = ONE.lock().unwrap_or_else(PoisonError::into_inner);
    check_pointers(k, bytes, offsets)?;
    // Parameter values at their alignment (up to 64 bytes).
    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct Chunk([u8; 64]);
    let mut buf = vec![Chunk([0; 64]); bytes.len().div_ceil(64).max(1)];
    let base = buf.as_mut_ptr().cast::<u8>();
    // SAFETY: `buf` holds at least bytes.len() bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base, bytes.len()) };
    // SAFETY: each offset lies inside the buffer (Args::layout).
    let params: Vec<*mut c_void> = offsets.iter().map(|&o| unsafe { base.add(o) }.cast()).collect();
    let dims = [grid[0], grid[1], grid[2], block[0], block[1], block[2]];
    install(libc::SIGSEGV, &PREV_SEGV);
    install(libc::SIGBUS, &PREV_BUS);
    let mut running = Running { ctx, jmp: std::ptr::null_mut(), mapped: Vec::new(), fault: None };
    RUNNER_TID.store(gettid(), Ordering::Release);
    CURRENT.store(&mut running, Ordering::Release);
    // SAFETY: the runner generated for this kernel, with one pointer per parameter to a value
    // of its layout and the grid; faults come back through `running.jmp`.
    let rc = unsafe { (k.run)(params.as_ptr(), dims.as_ptr(), &mut running.jmp) };
    CURRENT.store(std::ptr::null_mut(), Ordering::Release);
    for (start, len, _) in running.mapped.drain(..) {
        alloc::unmap_fixed(start, len);
    }
    match (rc, running.fault.take()) {
        (0, _) => Ok(()),
        (_, Some(why)) => Err(format!("kernel {}: {why}", k.name)),
        (_, None) => Err(format!("kernel {} faulted", k.name)),
    }
}

/// Pointer parameters must be NULL or device-accessible: pageable host memory is not.
fn check_pointers(k: &Entry, bytes: &[u8], offsets: &[usize]) -> Result<(), String> {
    let st = crate::state::lock();
    for (i, (p, &o)) in k.params.iter().zip(offsets).enumerate() {
        if !p.pointer || p.size != 8 {
            continue;
        }
        let v = u64::from_ne_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
        if v == 0 || st.mem.in_device_range(v) {
            continue;
        }
        if let Ok(Loc::Pageable(_)) = st.mem.classify(v, 1, "") {
            return Err(format!(
                "kernel {}: parameter {i} is {v:#x}, host memory that is neither pinned nor registered: \
                 a kernel cannot access it",
                k.name
            ));
        }
    }
    Ok(())
}
