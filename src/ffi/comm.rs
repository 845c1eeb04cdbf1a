//! Communicator calls: version, unique ids, init, split, finalize, destroy, abort, queries, errors.

use super::boundary::{call, last_error_ptr, set_last_error, Out};
use super::handle::{self, Removed, State};
use super::*;
use crate::comm::bootstrap::{UniqueId, UNIQUE_ID_BYTES};
use crate::comm::creation::Creation;
use crate::comm::{group, Backend, Comm, Issued, Options};
use crate::error::{Code, Error, Result};
use std::ffi::{CStr, CString};
use std::mem::MaybeUninit;
use std::os::raw::{c_char, c_int};
use std::sync::OnceLock;
use std::time::Duration;

fn id_to_c(id: &UniqueId) -> fcclUniqueId {
    let mut out = fcclUniqueId { internal: [0; FCCL_UNIQUE_ID_BYTES] };
    for (o, b) in out.internal.iter_mut().zip(id.0.iter()) {
        *o = *b as c_char;
    }
    out
}

fn id_from_c(id: &fcclUniqueId) -> UniqueId {
    let mut b = [0u8; UNIQUE_ID_BYTES];
    for (o, c) in b.iter_mut().zip(id.internal.iter()) {
        *o = *c as u8;
    }
    UniqueId(b)
}

/// Reads a fcclConfig_t over `base` options; NULL keeps `base`.
///
/// # Safety
/// `config` is NULL or points to a readable fcclConfig_t of at least `config->size` bytes.
unsafe fn options_from(config: *const fcclConfig_t, base: Options) -> Result<Options> {
    if config.is_null() {
        return Ok(base);
    }
    // SAFETY: non-NULL; the caller passes a fcclConfig_t.
    let c = unsafe { &*config };
    if c.magic != FCCL_CONFIG_MAGIC {
        return Err(Error::invalid_arg(format!(
            "config->magic is {:#x}, expected {FCCL_CONFIG_MAGIC:#x}; initialise the config with FCCL_CONFIG_INITIALIZER",
            c.magic
        )));
    }
    if c.size < std::mem::size_of::<fcclConfig_t>() || c.version == 0 {
        return Err(Error::invalid_arg(format!(
            "config->size {} / version {} do not describe a fcclConfig_t of this library ({} bytes, version {FCCL_CONFIG_VERSION}); initialise it with FCCL_CONFIG_INITIALIZER",
            c.size,
            c.version,
            std::mem::size_of::<fcclConfig_t>()
        )));
    }
    let mut o = base;
    let undef = |v: c_int| v == FCCL_CONFIG_UNDEF_INT;
    if !undef(c.blocking) {
        match c.blocking {
            0 | 1 => o.blocking = c.blocking == 1,
            v => return Err(Error::invalid_arg(format!("config->blocking is {v}; use 0 or 1"))),
        }
    }
    if !undef(c.timeoutMs) && c.timeoutMs != 0 {
        if c.timeoutMs < 0 {
            return Err(Error::invalid_arg(format!(
                "config->timeoutMs is {}; use a positive number of ms or 0 for the default",
                c.timeoutMs
            )));
        }
        o.timeout = Duration::from_millis(c.timeoutMs as u64);
    }
    if !undef(c.backend) {
        o.backend = match c.backend {
            FCCL_BACKEND_AUTO => Backend::Auto,
            FCCL_BACKEND_HOST => Backend::Host,
            FCCL_BACKEND_NCCL => Backend::Nccl,
            v => {
                return Err(Error::invalid_arg(format!(
                    "config->backend is {v}; use FCCL_BACKEND_AUTO, _HOST or _NCCL"
                )))
            }
        };
    }
    if !c.commName.is_null() {
        // SAFETY: a non-NULL commName is a NUL-terminated string (config contract).
        let name = unsafe { CStr::from_ptr(c.commName) };
        o.name = name.to_string_lossy().chars().take(128).collect();
    }
    if !undef(c.checkMode) {
        o.check_mode = match c.checkMode {
            FCCL_CHECK_OFF => Some(false),
            FCCL_CHECK_FINGERPRINT => Some(true),
            v => {
                return Err(Error::invalid_arg(format!(
                    "config->checkMode is {v}; use FCCL_CHECK_OFF or FCCL_CHECK_FINGERPRINT"
                )))
            }
        };
    }
    Ok(o)
}

/// Writes the library version (MAJOR*10000 + MINOR*100 + PATCH, see FCCL_VERSION_CODE) to `*version`.
#[no_mangle]
pub unsafe extern "C" fn fcclGetVersion(version: Option<&mut MaybeUninit<c_int>>) -> fcclResult_t {
    call("fcclGetVersion", || version.put("version", FCCL_VERSION_CODE))
}

/// Creates a unique id and starts its rendezvous point in the calling process (a rank
/// or not), which must stay alive until every rank has joined. Pass the id unchanged
/// to every rank's fcclCommInitRank.
#[no_mangle]
pub unsafe extern "C" fn fcclGetUniqueId(uniqueId: Option<&mut MaybeUninit<fcclUniqueId>>) -> fcclResult_t {
    call("fcclGetUniqueId", || {
        let out = uniqueId.required("uniqueId")?;
        let id = UniqueId::generate()?;
        out.write(id_to_c(&id));
        Ok(())
    })
}

fn init_rank(
    comm: Option<&mut MaybeUninit<fcclComm_t>>,
    nranks: c_int,
    id: &fcclUniqueId,
    rank: c_int,
    opts: Options,
) -> Result<Issued> {
    let comm = comm.required("comm")?;
    if nranks <= 0 {
        return Err(Error::invalid_arg(format!("nranks is {nranks}; a communicator has at least one rank")));
    }
    if rank < 0 || rank >= nranks {
        return Err(Error::invalid_arg(format!(
            "rank {rank} out of range for a communicator of {nranks} ranks (valid: 0..{})",
            nranks - 1
        )));
    }
    let id = id_from_c(id);
    let mut opts = opts;
    // The rank's device is the one current on this thread now: inside a group the
    // communicator is created later, on another thread (NCCL's one-thread,
    // several-GPUs pattern: cudaSetDevice(i) then init, for each i). A blocking init
    // on this thread asks after it has joined the rendezvous: loading the CUDA driver
    // can take long, and a rank that dies before it joins cannot be named to the others.
    if opts.device.is_none() && (!opts.blocking || group::active()) {
        opts.device = crate::mem::cuda::current_device();
    }
    if !opts.blocking {
        return init_later(comm, nranks as usize, id, rank as usize, opts);
    }
    if group::active() {
        // NCCL's way to create several ranks from one thread: inits inside a group
        // complete together at fcclGroupEnd; the handle is usable after it.
        let h = handle::reserve();
        let hv = h as usize;
        group::enqueue_init(
            true,
            Box::new(move || {
                let c = Comm::init_rank(nranks as usize, &id, rank as usize, opts)?;
                handle::fill(hv as fcclComm_t, c);
                Ok(())
            }),
        )?;
        comm.write(h);
        return Ok(Issued::Done);
    }
    let c = Comm::init_rank(nranks as usize, &id, rank as usize, opts)?;
    comm.write(handle::register(c));
    Ok(Issued::Done)
}

/// A non-blocking init: checks what can be checked alone, writes the handle and
/// leaves the rendezvous and the connecting of the ranks to a thread of their own
/// (inside a group, from fcclGroupEnd on), as NCCL's `blocking = 0` does.
fn init_later(
    comm: &mut MaybeUninit<fcclComm_t>,
    nranks: usize,
    id: UniqueId,
    rank: usize,
    opts: Options,
) -> Result<Issued> {
    Comm::check_init(nranks, &id, rank, &opts)?;
    let cr = Creation::new(1);
    let make = move || {
        Comm::init_rank(nranks, &id, rank, opts).map(|c| vec![c]).map_err(|e| e.context("fcclCommInitRankConfig"))
    };
    // Inside a group fcclGroupEnd is the call that returns fcclInProgress, as in NCCL.
    let issued = if group::active() {
        let started = std::sync::Arc::clone(&cr);
        group::enqueue_init(false, Box::new(move || started.start(make)))?;
        Issued::Done
    } else {
        cr.start(make)?;
        Issued::InProgress
    };
    comm.write(handle::register_creating(&cr, 0));
    Ok(issued)
}

/// Creates rank `rank` of a communicator of `nranks` ranks that meet at `commId`'s
/// rendezvous point. Blocks until every rank has joined, or returns fcclTimeout
/// naming the ranks that never arrived. Inside fcclGroupStart/End (one thread
/// creating several ranks), it returns at once and the ranks are created together
/// at fcclGroupEnd; the handle is usable after that. (fcclCommInitRankConfig with
/// `config->blocking = 0` returns at once instead.)
#[no_mangle]
pub unsafe extern "C" fn fcclCommInitRank(
    comm: Option<&mut MaybeUninit<fcclComm_t>>,
    nranks: c_int,
    commId: fcclUniqueId,
    rank: c_int,
) -> fcclResult_t {
    call("fcclCommInitRank", || init_rank(comm, nranks, &commId, rank, Options::from_env()?))
}

/// Like fcclCommInitRank, with options (`config` NULL = defaults).
///
/// With `config->blocking = 0` the communicator is non-blocking, as NCCL's: this call
/// checks its arguments (errors are returned here, nothing is created), writes
/// `*comm` and returns fcclInProgress while the rendezvous and the connecting of the
/// ranks go on in the background; poll fcclCommGetAsyncError(*comm) until it returns something else:
/// fcclSuccess (the communicator is ready) or the error that ended its creation (the
/// message, naming this function, is then fcclGetLastError's; destroy the handle).
/// Until then only fcclCommGetAsyncError, fcclCommDestroy (waits for the creation)
/// and fcclCommAbort (gives it up at once) take the handle; other calls return
/// fcclInvalidUsage. Inside a group this call returns fcclSuccess and the creation
/// starts at fcclGroupEnd, which returns fcclInProgress. The calls on a non-blocking communicator are
/// non-blocking too: see fcclCommGetAsyncError.
#[no_mangle]
pub unsafe extern "C" fn fcclCommInitRankConfig(
    comm: Option<&mut MaybeUninit<fcclComm_t>>,
    nranks: c_int,
    commId: fcclUniqueId,
    rank: c_int,
    config: *mut fcclConfig_t,
) -> fcclResult_t {
    call("fcclCommInitRankConfig", || {
        // SAFETY: config is NULL or a fcclConfig_t (API contract).
        let opts = unsafe { options_from(config, Options::from_env()?) }?;
        init_rank(comm, nranks, &commId, rank, opts)
    })
}

/// Creates `ndev` ranks in this process at once, written to `comms[0..ndev]`.
/// `devlist` NULL makes host-memory ranks (drive them from one thread per rank, or
/// from one thread with fcclGroupStart/fcclGroupEnd). A device list (ndev CUDA
/// device ids, repeats allowed) needs CUDA, else fcclUnavailable; distinct devices
/// use NCCL when it is loadable, repeated ones the built-in backend.
#[no_mangle]
pub unsafe extern "C" fn fcclCommInitAll(comms: *mut fcclComm_t, ndev: c_int, devlist: *const c_int) -> fcclResult_t {
    call("fcclCommInitAll", || {
        if comms.is_null() {
            return Err(Error::invalid_arg("comms is NULL; pass an array of ndev fcclComm_t to receive the handles"));
        }
        if ndev <= 0 {
            return Err(Error::invalid_arg(format!("ndev is {ndev}; create at least one rank")));
        }
        let devs = if devlist.is_null() {
            None
        } else {
            // SAFETY: a non-NULL devlist has ndev entries (API contract).
            Some(unsafe { std::slice::from_raw_parts(devlist, ndev as usize) }.to_vec())
        };
        // SAFETY: non-NULL and, by the API contract, room for ndev handles, which this
        // call alone writes until it returns.
        let out = unsafe { std::slice::from_raw_parts_mut(comms.cast::<MaybeUninit<fcclComm_t>>(), ndev as usize) };
        let all = Comm::init_all(ndev as usize, Options::from_env()?, devs.as_deref())?;
        for (o, c) in out.iter_mut().zip(all) {
            o.write(handle::register(c));
        }
        Ok(())
    })
}

/// Creates this process's rank from the environment of the launcher that started it.
/// Rank and world size come from one launcher, the first of: FERROCCL_RANK and
/// FERROCCL_WORLD_SIZE (ferroccl-run, or by hand); torchrun's RANK and WORLD_SIZE; Open
/// MPI's OMPI_COMM_WORLD_RANK and _SIZE; PMIX_RANK (with the size of Open MPI, PMI or
/// srun); PMI_RANK and PMI_SIZE (MPICH's or Intel MPI's mpiexec); Slurm's SLURM_PROCID
/// and SLURM_STEP_NUM_TASKS (a task of srun); with none of these set, the program is
/// a job of one rank (as an MPI singleton). The ranks meet at FERROCCL_UNIQUE_ID
/// (set by ferroccl-run), else at FERROCCL_ROOT_ADDR (host:port where rank 0 serves
/// the rendezvous); a job of one rank needs neither; under torchrun rank 0 passes a
/// fresh id through the agent's store on MASTER_PORT; else MASTER_ADDR:MASTER_PORT;
/// else, under mpirun or srun --mpi=pmix, rank 0 passes a fresh id through PMIx
/// (libpmix loaded at run time; PMIx_Finalize runs at exit, so MPI_Init may come before
/// or after). A rendezvous at an address needs a secret: FERROCCL_SECRET, else one
/// derived from the launcher's job id (torchrun, mpirun, srun); without either it
/// returns fcclInvalidUsage. See docs/launchers.md for each launcher's command line.
#[no_mangle]
pub unsafe extern "C" fn fcclCommInitFromEnv(comm: Option<&mut MaybeUninit<fcclComm_t>>) -> fcclResult_t {
    call("fcclCommInitFromEnv", || {
        let comm = comm.required("comm")?;
        let c = crate::comm::from_env::init()?;
        comm.write(handle::register(c));
        Ok(())
    })
}

/// Splits `comm`: every rank calls it; ranks with the same `color` form a new
/// communicator, ordered by `key` then by rank in `comm`. color FCCL_SPLIT_NOCOLOR
/// makes `*newcomm` NULL. `config` NULL inherits the parent's options. The child
/// keeps the parent's device; where the parent's ranks share one GPU, its device
/// memory moves GPU to GPU as the parent's does. A child of a communicator NCCL serves
/// uses the built-in backend (staged; a WARN says so at its first device call).
///
/// When the new communicator is non-blocking (`config->blocking = 0`, or inherited),
/// the split is too, as in NCCL: it is checked here, `*newcomm` is written at once and
/// fcclInProgress returned; the split runs on `comm`'s progress thread after the
/// calls queued there. Poll fcclCommGetAsyncError(*newcomm) until it returns
/// fcclSuccess (or the error, which then also stops `comm`). Make no blocking call on
/// a blocking `comm` meanwhile: it would be refused.
#[no_mangle]
pub unsafe extern "C" fn fcclCommSplit(
    comm: fcclComm_t,
    color: c_int,
    key: c_int,
    newcomm: Option<&mut MaybeUninit<fcclComm_t>>,
    config: *mut fcclConfig_t,
) -> fcclResult_t {
    call("fcclCommSplit", || {
        let parent = handle::get(comm)?;
        let newcomm = newcomm.required("newcomm")?;
        if group::active() {
            return Err(Error::invalid_usage(
                "fcclCommSplit inside a group is not supported; call it from every rank outside fcclGroupStart/End",
            ));
        }
        // SAFETY: config is NULL or a fcclConfig_t (API contract).
        let opts = unsafe { options_from(config, parent.opts.clone()) }?;
        if !opts.blocking {
            Comm::check_color(color)?;
            let cr = (color >= 0).then(|| Creation::new(1));
            let issued = parent.split_later(color, key, opts, cr.clone())?;
            let h = cr.map_or(std::ptr::null_mut(), |cr| handle::register_creating(&cr, 0));
            newcomm.write(h);
            // The parent may be done, the child never is before its handle exists.
            return Ok(if h.is_null() { issued } else { Issued::InProgress });
        }
        parent.wait_idle();
        let child = parent.split(color, key, opts)?;
        let h = child.map_or(std::ptr::null_mut(), handle::register);
        newcomm.write(h);
        Ok(Issued::Done)
    })
}

/// Finishes outstanding work; afterwards only fcclCommDestroy may be called on `comm`.
/// On a non-blocking communicator it returns fcclInProgress and finishes after the
/// calls queued before it: poll fcclCommGetAsyncError until fcclSuccess, then destroy.
#[no_mangle]
pub unsafe extern "C" fn fcclCommFinalize(comm: fcclComm_t) -> fcclResult_t {
    call("fcclCommFinalize", || {
        let c = handle::get(comm)?;
        if c.opts.blocking {
            c.finalize().map(|()| Issued::Done)
        } else {
            c.finalize_later()
        }
    })
}

/// Releases `comm` and everything it holds. NULL is a no-op; a destroyed handle
/// returns fcclInvalidArgument. Work still queued on a non-blocking communicator (or
/// its creation) is waited for first, as a blocking call would have; to end it at
/// once, call fcclCommAbort instead.
#[no_mangle]
pub unsafe extern "C" fn fcclCommDestroy(comm: fcclComm_t) -> fcclResult_t {
    call("fcclCommDestroy", || {
        if comm.is_null() {
            return Ok(());
        }
        match handle::remove(comm)? {
            Removed::Comm(c) => c.wait_idle(),
            Removed::Creating(cr, i) => drop(cr.wait(i)),
        }
        Ok(())
    })
}

/// Aborts `comm` from any thread: every blocked call on it returns, peers are told,
/// and the handle is released. On a non-blocking communicator the calls still queued
/// are dropped unrun and the running one ends; when this returns, no call of `comm`
/// touches its buffers any more. A communicator still being created is given up:
/// its creation ends in the background and the new rank leaves at once. NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn fcclCommAbort(comm: fcclComm_t) -> fcclResult_t {
    call("fcclCommAbort", || {
        if comm.is_null() {
            return Ok(());
        }
        match handle::remove(comm)? {
            Removed::Comm(c) => c.abort(),
            Removed::Creating(cr, i) => cr.abandon(i),
        }
        Ok(())
    })
}

/// Writes where `comm` stands to `*asyncError`: fcclSuccess when nothing is pending
/// and nothing failed; fcclInProgress while a non-blocking creation, call, group,
/// split or finalize of it is queued or running; else the error that broke it (then
/// fcclGetLastError on this thread gives its message, naming the call that failed).
///
/// Non-blocking communicators (`config->blocking = 0`), as NCCL's: a call checks its
/// arguments on the calling thread (errors are returned at once, nothing is queued),
/// then returns fcclInProgress (fcclSuccess if it already finished) and runs on the
/// communicator's progress thread, in call order, without the caller waiting for
/// peers. fcclGroupEnd over non-blocking communicators hands each one's calls over
/// the same way. Calls may be issued back to back: each is queued behind the one
/// before (NCCL asks to poll for fcclSuccess between them; doing so works the same
/// here). Until this returns fcclSuccess, keep every buffer of the pending calls
/// alive and untouched (receive buffers are written, send buffers may still be
/// read); on device memory, fcclSuccess means the work is enqueued on its streams,
/// in call order, as NCCL's. The first error stops the communicator: the calls
/// queued after it are dropped, later calls return fcclInvalidUsage, and this
/// function keeps returning the error; abort or destroy the communicator.
/// fcclCommAbort drops the queued calls and ends the running one.
#[no_mangle]
pub unsafe extern "C" fn fcclCommGetAsyncError(
    comm: fcclComm_t,
    asyncError: Option<&mut MaybeUninit<fcclResult_t>>,
) -> fcclResult_t {
    call("fcclCommGetAsyncError", || {
        let st = handle::state(comm)?;
        let out = asyncError.required("asyncError")?;
        let res = match st {
            State::Ready(c) => c.async_status(),
            State::Creating => Ok(Issued::InProgress),
            State::Failed(e) => Err(e),
        };
        let code = match res {
            Ok(Issued::Done) => fcclSuccess,
            Ok(Issued::InProgress) => fcclInProgress,
            Err(e) => {
                set_last_error(e.msg);
                e.code as fcclResult_t
            }
        };
        out.write(code);
        Ok(())
    })
}

/// Writes the number of ranks of `comm` to `*count`.
#[no_mangle]
pub unsafe extern "C" fn fcclCommCount(comm: fcclComm_t, count: Option<&mut MaybeUninit<c_int>>) -> fcclResult_t {
    call("fcclCommCount", || {
        let c = handle::get(comm)?;
        count.put("count", c.nranks as c_int)
    })
}

/// Writes this rank's index in `comm` to `*rank`.
#[no_mangle]
pub unsafe extern "C" fn fcclCommUserRank(comm: fcclComm_t, rank: Option<&mut MaybeUninit<c_int>>) -> fcclResult_t {
    call("fcclCommUserRank", || {
        let c = handle::get(comm)?;
        rank.put("rank", c.rank as c_int)
    })
}

/// Writes the CUDA device of `comm` to `*device`: the device current when the rank
/// was created (or its devlist entry), -1 for host-memory ranks.
#[no_mangle]
pub unsafe extern "C" fn fcclCommCuDevice(comm: fcclComm_t, device: Option<&mut MaybeUninit<c_int>>) -> fcclResult_t {
    call("fcclCommCuDevice", || {
        let c = handle::get(comm)?;
        device.put("device", c.device)
    })
}

/// Writes what served the last call (or group) that ran on `comm`: `*backend` is
/// "host" (host memory, the built-in algorithms), "staged" (device memory through host
/// memory), "ipc" (ranks sharing one GPU, GPU to GPU), "nccl" (NVIDIA's NCCL), "mixed"
/// (a group over several) or "none" (no call yet); `*algorithm` a short name for how
/// (docs/performance.md lists them). The same words as the FERROCCL_DEBUG=INFO line of the call;
/// ranks of one call may differ in `algorithm` (rank 0 moves the data, the others wait),
/// never in `backend`. The strings are static: never free them. Either pointer may be
/// NULL to skip it. Waits while another thread is in a call on `comm`.
#[no_mangle]
pub unsafe extern "C" fn fcclCommGetLastPath(
    comm: fcclComm_t,
    backend: Option<&mut MaybeUninit<*const c_char>>,
    algorithm: Option<&mut MaybeUninit<*const c_char>>,
) -> fcclResult_t {
    call("fcclCommGetLastPath", || {
        let c = handle::get(comm)?;
        let (b, a) = c.last_path();
        if let Some(out) = backend {
            out.write(static_c_str(b));
        }
        if let Some(out) = algorithm {
            out.write(static_c_str(a));
        }
        Ok(())
    })
}

/// Writes to `*exchanges` how many times the last call (or group) that ran on `comm`
/// waited for the other ranks on the host besides moving its data: the one-GPU
/// path's descriptor exchange (one per collective; with checkMode off on every rank,
/// none after the first call: a proxy thread (rank 0's; under MPS every rank's), not
/// the caller, reads the others' posted descriptors; 1 on a rank that ran 16 calls
/// ahead of one), the capture vote of a staged
/// device call, a barrier of ranks that share a process. 0 for calls whose only
/// messages are their data (host memory, NCCL) and before the first call. What the
/// ferroccl cost model holds a device call to, and the `host exchanges` of the
/// call's FERROCCL_DEBUG=INFO line. Waits while another thread is in a call on `comm`.
#[no_mangle]
pub unsafe extern "C" fn fcclCommGetLastExchanges(
    comm: fcclComm_t,
    exchanges: Option<&mut MaybeUninit<c_int>>,
) -> fcclResult_t {
    call("fcclCommGetLastExchanges", || {
        let c = handle::get(comm)?;
        exchanges.put("exchanges", c.last_exchanges().min(c_int::MAX as u32) as c_int)
    })
}

/// A NUL-terminated copy of a static string, made once and kept for the life of the
/// process (the set of names is fixed, so the table stays small).
fn static_c_str(s: &'static str) -> *const c_char {
    static TABLE: OnceLock<std::sync::Mutex<Vec<(&'static str, &'static CStr)>>> = OnceLock::new();
    let mut t = TABLE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, c)) = t.iter().find(|(k, _)| *k == s) {
        return c.as_ptr();
    }
    let c: &'static CStr = Box::leak(CString::new(s.replace('\0', "")).unwrap_or_default().into_boxed_c_str());
    t.push((s, c));
    c.as_ptr()
}

/// A fixed description of a result code (never NULL, also for unknown values).
#[no_mangle]
pub extern "C" fn fcclGetErrorString(result: fcclResult_t) -> *const c_char {
    static TABLE: OnceLock<Vec<(fcclResult_t, CString)>> = OnceLock::new();
    static UNKNOWN: &CStr = c"unknown result code";
    let table = TABLE.get_or_init(|| {
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 100, 101]
            .into_iter()
            .filter_map(Code::from_i32)
            .map(|c| (c as fcclResult_t, CString::new(c.describe()).expect("no NUL")))
            .collect()
    });
    table.iter().find(|(c, _)| *c == result).map_or(UNKNOWN.as_ptr(), |(_, s)| s.as_ptr())
}

/// This thread's last error message: the call that failed, the values, the cause and
/// what to do. Empty if no call failed on this thread yet. `comm` may be NULL (the
/// message is per thread, not per communicator). Valid until this thread's next failing call.
#[no_mangle]
pub extern "C" fn fcclGetLastError(comm: fcclComm_t) -> *const c_char {
    let _ = comm;
    last_error_ptr()
}
