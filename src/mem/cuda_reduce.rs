//! Device reductions, compiled with NVRTC at first use (one program per data type and
//! per data type's wire forms) to the device's CUBIN, kept on disk between processes
//! (`kernel_cache`) and loaded once per context: `out[i] = op(ins[0][i], ..., ins[n-1][i])` over up to [`MAX_INPUTS`]
//! device pointers (peers' buffers mapped through CUDA IPC), and all_reduce over a
//! wire type. The sources and their semantics (the host's, bit for bit, narrow floats
//! included) are in `mem::cuda_kernels`.

use crate::error::{Code, Error, Result};
use crate::log;
use crate::mem::cuda::{self, Ctx, Stream};
use crate::mem::cuda_kernels::{copy_unit, BATCH, COPY_PROGRAM, COPY_PROGRAM_NAME};
pub use crate::mem::cuda_kernels::{own_rows, variant, Reduction, IN_TABLE, MAX_INPUTS, MAX_ROWS, RANKS};
use crate::mem::kernel_cache;
use cudarc::driver::sys as cu;
use cudarc::nvrtc::sys as nv;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Mutex, OnceLock};

const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcDestroyProgram",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcVersion",
];
const DRIVER_SYMBOLS: &[&str] = &["cuModuleLoadData", "cuModuleGetFunction", "cuLaunchKernel", "cuDeviceGetAttribute"];

/// NVRTC options besides the architecture: IEEE division, no flushing of subnormals and
/// no fused multiply-adds, so that the kernels round as the host does.
pub const OPTIONS: &[&str] = &["--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"];

/// NVRTC loaded with the entry points the kernels need (the driver is not needed).
fn nvrtc_loaded() -> Result<()> {
    static R: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let r = R.get_or_init(|| {
        // SAFETY: only probes candidate names with dlopen.
        if !unsafe { nv::is_culib_present() } {
            return Err("NVRTC (libnvrtc.so) could not be loaded".into());
        }
        // SAFETY: present, so culib() does not panic; only addresses are looked up.
        let lib = unsafe { nv::culib() };
        for s in NVRTC_SYMBOLS {
            // SAFETY: as above.
            if unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err() {
                return Err(format!("NVRTC lacks {s}"));
            }
        }
        Ok(())
    });
    r.clone().map_err(|m| Error::unavailable(format!("device reduction kernels are unavailable: {m}")))
}

fn nvrtc_ready() -> Result<()> {
    static R: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let r = R.get_or_init(|| {
        cuda::driver().map_err(|e| e.msg)?;
        nvrtc_loaded().map_err(|e| e.msg)?;
        // SAFETY: the driver is present (checked by cuda::driver).
        let dl = unsafe { cu::culib() };
        for s in DRIVER_SYMBOLS {
            // SAFETY: as above.
            if unsafe { dl.get::<*const ()>(s.as_bytes()) }.is_err() {
                return Err(format!("the CUDA driver lacks {s}"));
            }
        }
        Ok(())
    });
    r.clone().map_err(|m| Error::unavailable(format!("device reduction kernels are unavailable: {m}")))
}

fn cu_check(rc: cu::CUresult, what: &str) -> Result<()> {
    if rc == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(Code::UnhandledCudaError, format!("{what} failed: {rc:?}")))
    }
}

fn nv_check(rc: nv::nvrtcResult, what: &str) -> Result<()> {
    if rc == nv::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(Code::UnhandledCudaError, format!("{what} failed: {rc:?}")))
    }
}

/// What NVRTC made of a source: its PTX (or CUBIN for an `sm_` architecture) and its
/// log, which holds the warnings of a compilation that succeeded.
pub struct Compiled {
    pub image: Vec<u8>,
    pub log: String,
}

/// Compiles `src` (named `name`) for `arch` (`compute_90`: PTX; `sm_90`: CUBIN) with
/// [`OPTIONS`]. Needs NVRTC only, no driver or GPU.
pub fn compile_for(src: &str, name: &str, arch: &str) -> Result<Compiled> {
    nvrtc_loaded()?;
    let csrc = CString::new(src).map_err(|_| Error::internal("kernel source has a NUL"))?;
    let cname = CString::new(name).map_err(|_| Error::internal("kernel name has a NUL"))?;
    let mut opts = vec![CString::new(format!("--gpu-architecture={arch}")).map_err(|_| Error::internal("NUL"))?];
    opts.extend(OPTIONS.iter().map(|o| CString::new(*o).expect("no NUL")));
    let optp: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let cubin = arch.starts_with("sm_");
    let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NVRTC is loaded (nvrtc_loaded); strings are NUL-terminated and outlive the
    // calls; buffers have the sizes NVRTC reported.
    unsafe {
        nv_check(
            nv::nvrtcCreateProgram(&mut prog, csrc.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null()),
            "nvrtcCreateProgram",
        )?;
        let rc = nv::nvrtcCompileProgram(prog, optp.len() as i32, optp.as_ptr());
        let mut n = 0usize;
        let _ = nv::nvrtcGetProgramLogSize(prog, &mut n);
        let mut log = vec![0u8; n.max(1)];
        let _ = nv::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast());
        let log = String::from_utf8_lossy(&log).trim_end_matches('\0').trim().to_string();
        let out = if rc != nv::nvrtcResult::NVRTC_SUCCESS {
            Err(Error::new(Code::UnhandledCudaError, format!("NVRTC could not compile {name} ({rc:?}): {log}")))
        } else {
            let mut n = 0usize;
            let mut image;
            if cubin {
                nv_check(nv::nvrtcGetCUBINSize(prog, &mut n), "nvrtcGetCUBINSize")?;
                if n == 0 {
                    let _ = nv::nvrtcDestroyProgram(&mut prog);
                    return Err(Error::new(
                        Code::UnhandledCudaError,
                        format!("NVRTC made no CUBIN of {name} for {arch}"),
                    ));
                }
                image = vec![0u8; n];
                nv_check(nv::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()), "nvrtcGetCUBIN")?;
            } else {
                nv_check(nv::nvrtcGetPTXSize(prog, &mut n), "nvrtcGetPTXSize")?;
                image = vec![0u8; n.max(1)];
                nv_check(nv::nvrtcGetPTX(prog, image.as_mut_ptr().cast()), "nvrtcGetPTX")?;
            }
            Ok(Compiled { image, log })
        };
        let _ = nv::nvrtcDestroyProgram(&mut prog);
        out
    }
}

/// NVRTC's version (major, minor), part of a cached kernel's key.
fn nvrtc_version() -> (i32, i32) {
    static V: OnceLock<(i32, i32)> = OnceLock::new();
    *V.get_or_init(|| {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: NVRTC is loaded (callers passed nvrtc_ready); valid out-pointers.
        let _ = unsafe { nv::nvrtcVersion(&mut major, &mut minor) };
        (major, minor)
    })
}

/// Loads `image` (a CUBIN, or NUL-terminated PTX) into the current context.
fn module_load(image: &[u8]) -> Result<cu::CUmodule> {
    let mut module: cu::CUmodule = std::ptr::null_mut();
    // SAFETY: a whole image the driver parses itself; the module stays loaded for the process's life.
    cu_check(unsafe { cu::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void) }, "cuModuleLoadData")?;
    Ok(module)
}

/// Loads program `src` (named `name`) into the current context of device `device`:
/// the device's own CUBIN, from the kernel cache or from NVRTC (then stored for the
/// next process; `kernel_cache`), so the driver has nothing to compile; PTX, which the
/// driver compiles at load, only where NVRTC or the driver cannot do the CUBIN.
fn load_program(src: &str, name: &str, device: i32) -> Result<cu::CUmodule> {
    let (major, minor) = cuda::compute_capability(device)?;
    let arch = format!("sm_{major}{minor}");
    let cached =
        kernel_cache::dir().map(|d| d.join(kernel_cache::file_name(src, name, &arch, OPTIONS, nvrtc_version())));
    if let Some(path) = &cached {
        if let Some(image) = kernel_cache::read(path) {
            match module_load(&image) {
                Ok(m) => return Ok(m),
                Err(e) => log::info(format_args!("kernel cache: {} not loaded ({e}); compiling again", path.display())),
            }
        }
    }
    let cubin = compile_for(src, name, &arch).map(|c| c.image);
    match cubin.and_then(|image| module_load(&image).map(|m| (m, image))) {
        Ok((m, image)) => {
            if let Some(path) = &cached {
                if let Err(e) = kernel_cache::write(path, &image) {
                    log::info(format_args!(
                        "kernel cache: cannot store {} ({e}); set FERROCCL_KERNEL_CACHE to a writable directory",
                        path.display()
                    ));
                }
            }
            Ok(m)
        }
        Err(e) => {
            log::warn(format_args!(
                "{name}: no {arch} CUBIN ({e}); loading its PTX, which the driver compiles at load instead"
            ));
            module_load(&compile_for(src, name, &format!("compute_{major}{minor}"))?.image)
        }
    }
}

/// Loaded programs: (context, data type, wire forms) -> CUmodule; and their kernels:
/// (context, reduction, rank-count variant) -> CUfunction.
type ModuleKey = (Ctx, crate::types::DataType, bool);
type FunctionKey = (Ctx, Reduction, usize);
static MODULES: Mutex<Option<HashMap<ModuleKey, Module>>> = Mutex::new(None);
static CACHE: Mutex<Option<HashMap<FunctionKey, Function>>> = Mutex::new(None);

/// A loaded program (`CUmodule`), kept for the process's life; an address, so that the
/// caches can be shared between threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Module(usize);

/// A kernel of a loaded program (`CUfunction`), from [`kernel`], with the number of
/// blocks that fill its device once (its grid's bound) and, for a reduction, the input
/// count it is specialised for (0: any; `cuda_kernels::variant`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Function {
    f: usize,
    full: u32,
    ranks: usize,
}

impl Function {
    fn raw(self) -> cu::CUfunction {
        self.f as cu::CUfunction
    }
}

/// Threads per block of every launch.
const THREADS: u32 = 256;

/// The kernel for `r` over any number of inputs in context `ctx` on `device`: its
/// group's program is compiled and loaded at the first use of any of them.
pub fn kernel(ctx: Ctx, device: i32, r: Reduction) -> Result<Function> {
    kernel_for(ctx, device, r, 0)
}

/// The kernel for `r` over `inputs` inputs: the one specialised for that count where
/// there is one ([`RANKS`]), else the one for any count. Every variant is in the same
/// program as [`kernel`]'s, so choosing one compiles nothing more.
pub fn kernel_for(ctx: Ctx, device: i32, r: Reduction, inputs: usize) -> Result<Function> {
    nvrtc_ready()?;
    let ranks = variant(inputs);
    if let Some(&f) = CACHE.lock().unwrap().get_or_insert_with(HashMap::new).get(&(ctx, r, ranks)) {
        return Ok(f);
    }
    let _g = cuda::CtxGuard::enter(ctx)?;
    let f = function(module_of(ctx, device, r)?, &r.entry_for(ranks), device, ranks)?;
    CACHE.lock().unwrap().get_or_insert_with(HashMap::new).insert((ctx, r, ranks), f);
    Ok(f)
}

/// The loaded program of `r`'s group in `ctx` (current), compiled at its first use.
fn module_of(ctx: Ctx, device: i32, r: Reduction) -> Result<cu::CUmodule> {
    let mkey = (ctx, r.dtype, r.wire.is_some());
    let known = MODULES.lock().unwrap().get_or_insert_with(HashMap::new).get(&mkey).copied();
    Ok(match known {
        Some(Module(m)) => m as cu::CUmodule,
        None => {
            if !r.supported() {
                return Err(Error::internal(format!("no device kernel for {r:?}")));
            }
            let module = load_program(&Reduction::program(&r.group()), &r.program_name(), device)?;
            MODULES.lock().unwrap().get_or_insert_with(HashMap::new).insert(mkey, Module(module as usize));
            module
        }
    })
}

/// Kernel `name` of `module`.
fn function(module: cu::CUmodule, name: &str, device: i32, ranks: usize) -> Result<Function> {
    let mut f: cu::CUfunction = std::ptr::null_mut();
    let fname = CString::new(name).expect("no NUL");
    // SAFETY: a loaded module and a NUL-terminated name.
    cu_check(unsafe { cu::cuModuleGetFunction(&mut f, module, fname.as_ptr()) }, "cuModuleGetFunction")?;
    Ok(Function { f: f as usize, full: cuda::resident_blocks(device, THREADS)?, ranks })
}

/// The scaling kernels: (context, data type) -> CUfunction.
static SCALERS: Mutex<Option<HashMap<(Ctx, crate::types::DataType), Function>>> = Mutex::new(None);

/// Where a PreMulSum scalar is when its kernel runs.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    /// One element, native byte order, in the low bytes.
    Bits(u64),
    /// One element in device memory of the kernel's context.
    At(*const u8),
}

/// Enqueues on `stream` `out[i] = input[i] * scalar` for `count` elements of `dt` (the
/// first half of PreMulSum; bit for bit the host's `reduce::pre_multiply`), in `ctx` on
/// `device`; compiles the type's program at its first use.
///
/// # Safety
/// `out` and `input` hold `count` elements of `dt` in device memory of `ctx`, and an
/// `At` scalar one, until the stream has run the kernel; `out` is `input` or does not
/// overlap it.
#[allow(clippy::too_many_arguments)]
pub unsafe fn scale(
    ctx: Ctx,
    device: i32,
    dt: crate::types::DataType,
    out: *mut u8,
    input: *const u8,
    count: usize,
    scalar: Scalar,
    stream: Stream,
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    nvrtc_ready()?;
    let _g = cuda::CtxGuard::enter(ctx)?;
    let known = SCALERS.lock().unwrap().get_or_insert_with(HashMap::new).get(&(ctx, dt)).copied();
    let f = match known {
        Some(f) => f,
        None => {
            let m = module_of(ctx, device, Reduction::new(dt, crate::types::RedOp::Sum))?;
            let f = function(m, &crate::mem::cuda_kernels::scale_entry(dt), device, 0)?;
            SCALERS.lock().unwrap().get_or_insert_with(HashMap::new).insert((ctx, dt), f);
            f
        }
    };
    let (sp, sbits) = match scalar {
        Scalar::Bits(b) => (0u64, b),
        Scalar::At(p) => (p as u64, 0),
    };
    let (mut o, mut i, mut c, mut sp, mut sb, mut fl) = (out as u64, input as u64, count as u64, sp, sbits, 0u64);
    let mut params: [*mut c_void; 6] = [
        (&mut o as *mut u64).cast(),
        (&mut i as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut sp as *mut u64).cast(),
        (&mut sb as *mut u64).cast(),
        (&mut fl as *mut u64).cast(),
    ];
    // SAFETY: the scaling kernel takes (pointer, pointer, unsigned long long, pointer,
    // unsigned long long, pointer); buffers per the caller.
    unsafe { launch_grid(f, &mut params, [grid_x(count, 1, f.full), 1], stream, "fccl_scale") }
}

/// Launches `f` (from [`kernel`] or [`kernel_for`] for `r`; a specialised kernel takes
/// exactly its count of inputs) on `stream`: for each row `y` of `outs.len() / nout`,
/// `counts[y]` elements (`counts[0]` for every row where it has one) from `y * step` on of
/// the row's `n` inputs reduced in input order into each of `outs[y * nout .. (y + 1) *
/// nout]`. The row's inputs: `ins` itself where it has `n` (every row reads the same
/// buffers), else `ins[y * n .. (y + 1) * n]` (each row its own: a reduce_scatter_v). `win`:
/// the host's window of a wire all_reduce, in elements (ignored otherwise); `failed`: the
/// device address of a word that, when non-zero as the kernel starts, makes it do nothing
/// (0: none). One launch, except where the rows' own inputs overflow the kernel's input
/// table ([`IN_TABLE`]; more than 19 ranks): then as few launches as hold them, each of
/// [`own_rows`] rows.
///
/// # Safety
/// Every output and input is device-accessible in the current context for what the
/// rows read or write (elements of the kernel's type) until the stream has run the
/// launch; `failed` is 0 or a device-readable word that lives as long.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch(
    f: Function,
    r: &Reduction,
    outs: &[*mut u8],
    nout: usize,
    ins: &[*const u8],
    n: usize,
    counts: &[usize],
    step: usize,
    win: usize,
    failed: u64,
    stream: Stream,
) -> Result<()> {
    let rows = outs.len().checked_div(nout).unwrap_or(0);
    let own = ins.len() != n;
    if n == 0
        || n > MAX_INPUTS
        || outs.len() > MAX_INPUTS
        || nout == 0
        || outs.len() % nout != 0
        || (own && ins.len() != rows * n)
        || (counts.len() != 1 && counts.len() != rows)
    {
        return Err(Error::internal(format!(
            "a device reduction of {} inputs ({n} per row) into {} outputs in rows of {nout}, with {} counts",
            ins.len(),
            outs.len(),
            counts.len()
        )));
    }
    if f.ranks != 0 && f.ranks != n {
        return Err(Error::internal(format!(
            "{} takes {} inputs, not {n}: choose the kernel with kernel_for(.., {n})",
            r.entry_for(f.ranks),
            f.ranks,
        )));
    }
    let count = |y: usize| counts[if counts.len() == 1 { 0 } else { y }];
    let es = r.dtype.size();
    // Rows with their own inputs: as many per launch as the table holds.
    let per = if own { own_rows(n) } else { rows.max(1) };
    let mut y0 = 0;
    while y0 < rows {
        let y1 = rows.min(y0 + per);
        let mut cs = [0u64; MAX_ROWS];
        for (c, y) in cs.iter_mut().zip(y0..y1) {
            *c = count(y) as u64;
        }
        let most = (y0..y1).map(count).max().unwrap_or(0);
        if most > 0 {
            let part = Part {
                outs: &outs[y0 * nout..y1 * nout],
                nout,
                ins: if own { &ins[y0 * n..y1 * n] } else { ins },
                // A later launch's row 0 is row y0: its inputs start y0 rows of `step` on.
                skip: y0 * step * es,
                n,
                counts: cs,
                most,
            };
            // SAFETY: a part of the caller's rows, under the caller's contract.
            unsafe { launch_part(f, r, part, step, win, failed, stream)? };
        }
        y0 = y1;
    }
    Ok(())
}

/// The rows of one launch of [`launch`]: `counts` (the first `outs.len() / nout` of them)
/// rows of `nout` outputs, `ins` (n of them: shared; n per row: each row's own,
/// [`IN_TABLE`] at most) `skip` bytes on; `most`: the largest count.
struct Part<'a> {
    outs: &'a [*mut u8],
    nout: usize,
    ins: &'a [*const u8],
    skip: usize,
    n: usize,
    counts: [u64; MAX_ROWS],
    most: usize,
}

/// One launch of [`launch`] over `p`.
///
/// # Safety
/// As [`launch`].
unsafe fn launch_part(
    f: Function,
    r: &Reduction,
    p: Part<'_>,
    step: usize,
    win: usize,
    failed: u64,
    stream: Stream,
) -> Result<()> {
    let Part { outs, nout, ins, skip, n, counts, most } = p;
    let rows = outs.len() / nout;
    let mut outs_arg = [0u64; MAX_INPUTS];
    for (a, p) in outs_arg.iter_mut().zip(outs) {
        *a = *p as u64;
    }
    let mut ins_arg = [0u64; IN_TABLE];
    for (a, p) in ins_arg.iter_mut().zip(ins) {
        *a = p.wrapping_add(skip) as u64;
    }
    let mut counts_arg = counts;
    let ip = if ins.len() == n { 0 } else { n };
    let (mut n_arg, mut nout_arg, mut ip_arg) = (n as i32, nout as i32, ip as i32);
    let mut step_arg = step as u64;
    let mut win_arg = win.max(1) as u64;
    let mut failed_arg = failed;
    let mut params: Vec<*mut c_void> = vec![
        (&mut outs_arg as *mut [u64; MAX_INPUTS]).cast(),
        (&mut ins_arg as *mut [u64; IN_TABLE]).cast(),
        (&mut counts_arg as *mut [u64; MAX_ROWS]).cast(),
        (&mut n_arg as *mut i32).cast(),
        (&mut nout_arg as *mut i32).cast(),
        (&mut ip_arg as *mut i32).cast(),
        (&mut step_arg as *mut u64).cast(),
    ];
    if r.wire.is_some() {
        params.push((&mut win_arg as *mut u64).cast());
    }
    params.push((&mut failed_arg as *mut u64).cast());
    // A plain reduction's thread takes 16 bytes of elements at a time; a wire one, one.
    // The grid's width serves the largest row (threads of shorter rows stop early).
    let per_thread = if r.wire.is_some() { 1 } else { 16 / r.dtype.size() };
    let grid = [grid_x(most.div_ceil(per_thread), rows, f.full), rows as u32];
    // SAFETY: f is a loaded kernel whose parameters are `params`: structs of MAX_INPUTS
    // and IN_TABLE pointers and MAX_ROWS counts, int x 3, unsigned long long (, unsigned
    // long long for wire kernels), pointer; buffers per the caller.
    unsafe { launch_grid(f, &mut params, grid, stream, &r.entry_for(f.ranks)) }
}

/// The copy kernels (`fccl_copy`, `fccl_copy2d`, `fccl_copy_batch`, `fccl_swap_batch`) of context `ctx` on `device`, compiled
/// and loaded at the first use in the context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copiers {
    copy: Function,
    copy2d: Function,
    batch: Function,
    swap: Function,
}

static COPIERS: Mutex<Option<HashMap<Ctx, Copiers>>> = Mutex::new(None);

/// The copy kernels of `ctx` (see [`Copiers`]).
pub fn copiers(ctx: Ctx, device: i32) -> Result<Copiers> {
    nvrtc_ready()?;
    if let Some(&c) = COPIERS.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).get(&ctx) {
        return Ok(c);
    }
    let _g = cuda::CtxGuard::enter(ctx)?;
    let module = load_program(COPY_PROGRAM, COPY_PROGRAM_NAME, device)?;
    let full = cuda::resident_blocks(device, THREADS)?;
    let get = |name: &str| -> Result<Function> {
        let mut f: cu::CUfunction = std::ptr::null_mut();
        let cname = CString::new(name).expect("no NUL");
        // SAFETY: a loaded module and a NUL-terminated name.
        cu_check(unsafe { cu::cuModuleGetFunction(&mut f, module, cname.as_ptr()) }, "cuModuleGetFunction")?;
        Ok(Function { f: f as usize, full, ranks: 0 })
    };
    let c = Copiers {
        copy: get("fccl_copy")?,
        copy2d: get("fccl_copy2d")?,
        batch: get("fccl_copy_batch")?,
        swap: get("fccl_swap_batch")?,
    };
    COPIERS.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).insert(ctx, c);
    Ok(c)
}

/// Blocks along x for `units` units (one per thread) in each of `rows` block rows: at
/// most about `full` blocks in all, the device filled once (each thread strides over the
/// rest), and at least 8 per row.
fn grid_x(units: usize, rows: usize, full: u32) -> u32 {
    units.div_ceil(THREADS as usize).clamp(1, (full as usize / rows.max(1)).max(8)) as u32
}

/// Launches kernel `what` (`f`) with `params` on `stream` over `grid` (x, y) blocks of
/// `THREADS` threads.
///
/// # Safety
/// `f`'s parameters are exactly `params`; what they point at is valid per the kernel.
unsafe fn launch_grid(
    f: Function,
    params: &mut [*mut c_void],
    grid: [u32; 2],
    stream: Stream,
    what: &str,
) -> Result<()> {
    // SAFETY: per the caller.
    let rc = unsafe {
        cu::cuLaunchKernel(
            f.raw(),
            grid[0],
            grid[1],
            1,
            THREADS,
            1,
            1,
            0,
            stream.raw(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    cu_check(rc, &format!("cuLaunchKernel({what})"))
}

impl Copiers {
    /// Enqueues on `stream` the copy of `bytes` bytes from `src` to `dst` (device
    /// addresses of the current context), unless the word at `failed` (0: none) is
    /// non-zero when the kernel starts.
    ///
    /// # Safety
    /// Both ranges are valid device memory of the current context, and `failed` is 0 or
    /// a device-readable word, until the stream has run the copy; they do not overlap.
    pub unsafe fn copy(&self, dst: *mut u8, src: *const u8, bytes: usize, failed: u64, stream: Stream) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let w = copy_unit(&[dst as usize, src as usize, bytes]);
        let (mut d, mut s, mut units, mut wu, mut fl) = (dst as u64, src as u64, (bytes / w) as u64, w as u32, failed);
        let mut params: [*mut c_void; 5] = [
            (&mut d as *mut u64).cast(),
            (&mut s as *mut u64).cast(),
            (&mut units as *mut u64).cast(),
            (&mut wu as *mut u32).cast(),
            (&mut fl as *mut u64).cast(),
        ];
        // SAFETY: fccl_copy takes (pointer, pointer, unsigned long long, unsigned int,
        // pointer); buffers per the caller.
        unsafe { launch_grid(self.copy, &mut params, [grid_x(bytes / w, 1, self.copy.full), 1], stream, "fccl_copy") }
    }

    /// As [`Copiers::copy`] for `rows` rows of `width` bytes, `dpitch` and `spitch`
    /// bytes apart.
    ///
    /// # Safety
    /// As [`Copiers::copy`], for every row.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn copy2d(
        &self,
        dst: *mut u8,
        dpitch: usize,
        src: *const u8,
        spitch: usize,
        width: usize,
        rows: usize,
        failed: u64,
        stream: Stream,
    ) -> Result<()> {
        if width == 0 || rows == 0 {
            return Ok(());
        }
        let w = copy_unit(&[dst as usize, src as usize, dpitch, spitch, width]);
        let (mut d, mut dp, mut s, mut sp) = (dst as u64, (dpitch / w) as u64, src as u64, (spitch / w) as u64);
        let (mut wd, mut r, mut wu, mut fl) = ((width / w) as u64, rows as u64, w as u32, failed);
        let mut params: [*mut c_void; 8] = [
            (&mut d as *mut u64).cast(),
            (&mut dp as *mut u64).cast(),
            (&mut s as *mut u64).cast(),
            (&mut sp as *mut u64).cast(),
            (&mut wd as *mut u64).cast(),
            (&mut r as *mut u64).cast(),
            (&mut wu as *mut u32).cast(),
            (&mut fl as *mut u64).cast(),
        ];
        let units = (width / w).saturating_mul(rows);
        // SAFETY: fccl_copy2d takes (pointer, unsigned long long, pointer, unsigned long
        // long x 3, unsigned int, pointer); buffers per the caller.
        unsafe { launch_grid(self.copy2d, &mut params, [grid_x(units, 1, self.copy2d.full), 1], stream, "fccl_copy2d") }
    }

    /// Enqueues on `stream` a whole call's copies in as few launches as the table
    /// allows (one up to [`BATCH`] sources and destinations): each group reads `len`
    /// bytes at `src` once and writes them to every one of its `dsts`. Groups of no
    /// bytes or no destinations are left out. Nothing runs once the word at `failed`
    /// (0: none) is non-zero.
    ///
    /// # Safety
    /// As [`Copiers::copy`], for every source and destination; no destination overlaps
    /// a source or another destination of the same batch.
    pub unsafe fn copy_batch(&self, groups: &[Fan], failed: u64, stream: Stream) -> Result<()> {
        let mut t = Table::default();
        for g in groups.iter().filter(|g| g.len > 0 && !g.dsts.is_empty()) {
            for part in g.dsts.chunks(BATCH) {
                if t.groups == BATCH || t.ndst + part.len() > BATCH {
                    // SAFETY: forwarded contract.
                    unsafe { self.launch_table(&mut t, failed, stream)? };
                }
                t.push(g.src, g.len, part);
            }
        }
        // SAFETY: forwarded contract.
        unsafe { self.launch_table(&mut t, failed, stream) }
    }

    /// Enqueues on `stream` the exchange of the bytes of every pair `(a, b, len)`: `len`
    /// bytes at `a` and at `b` trade places, each byte read once and written once, in as
    /// few launches as the table allows (one up to [`BATCH`] pairs). Nothing runs once
    /// the word at `failed` (0: none) is non-zero.
    ///
    /// # Safety
    /// Both ranges of every pair are valid device memory of the current context, and
    /// `failed` is 0 or a device-readable word, until the stream has run the work; no
    /// range overlaps another of the batch.
    pub unsafe fn swap_batch(&self, pairs: &[(*mut u8, *mut u8, usize)], failed: u64, stream: Stream) -> Result<()> {
        let pairs: Vec<_> = pairs.iter().filter(|p| p.2 > 0).collect();
        for part in pairs.chunks(BATCH) {
            let mut raw = RawPairs { a: [0; BATCH], b: [0; BATCH], len: [0; BATCH] };
            for (g, &&(a, b, len)) in part.iter().enumerate() {
                (raw.a[g], raw.b[g], raw.len[g]) = (a as u64, b as u64, len as u64);
            }
            let (mut n, mut fl) = (part.len() as u32, failed);
            let most = part.iter().map(|p| p.2 / 16 + 1).max().unwrap_or(1);
            let grid = [grid_x(most, part.len(), self.swap.full), part.len() as u32];
            let mut params: [*mut c_void; 3] =
                [(&mut raw as *mut RawPairs).cast(), (&mut n as *mut u32).cast(), (&mut fl as *mut u64).cast()];
            // SAFETY: fccl_swap_batch takes (struct fccl_pairs, unsigned int, pointer), and
            // RawPairs is struct fccl_pairs's layout; buffers per the caller.
            unsafe { launch_grid(self.swap, &mut params, grid, stream, "fccl_swap_batch")? };
        }
        Ok(())
    }

    /// Launches `t` (if it holds anything) and empties it.
    ///
    /// # Safety
    /// As [`Copiers::copy_batch`].
    unsafe fn launch_table(&self, t: &mut Table, failed: u64, stream: Stream) -> Result<()> {
        if t.groups == 0 {
            return Ok(());
        }
        t.raw.first[t.groups] = t.ndst as u16;
        let (mut groups, mut fl) = (t.groups as u32, failed);
        let most = t.raw.len[..t.groups].iter().map(|&l| l as usize / 16 + 1).max().unwrap_or(1);
        let grid = [grid_x(most, t.groups, self.batch.full), t.groups as u32];
        let mut params: [*mut c_void; 3] =
            [(&mut t.raw as *mut RawTable).cast(), (&mut groups as *mut u32).cast(), (&mut fl as *mut u64).cast()];
        // SAFETY: fccl_copy_batch takes (struct fccl_batch, unsigned int, pointer), and
        // RawTable is struct fccl_batch's layout; buffers per the caller.
        let r = unsafe { launch_grid(self.batch, &mut params, grid, stream, "fccl_copy_batch") };
        *t = Table::default();
        r
    }
}

/// One source copied to several destinations (see [`Copiers::copy_batch`]).
pub struct Fan {
    pub src: *const u8,
    pub len: usize,
    pub dsts: Vec<*mut u8>,
}

/// `struct fccl_batch` of the copy program, as it travels in the kernel's arguments.
#[repr(C)]
struct RawTable {
    src: [u64; BATCH],
    len: [u64; BATCH],
    dst: [u64; BATCH],
    first: [u16; BATCH + 1],
}

/// `struct fccl_pairs` of the copy program, as it travels in the kernel's arguments.
#[repr(C)]
struct RawPairs {
    a: [u64; BATCH],
    b: [u64; BATCH],
    len: [u64; BATCH],
}

/// A batch being filled.
struct Table {
    raw: RawTable,
    groups: usize,
    ndst: usize,
}

impl Default for Table {
    fn default() -> Table {
        let raw = RawTable { src: [0; BATCH], len: [0; BATCH], dst: [0; BATCH], first: [0; BATCH + 1] };
        Table { raw, groups: 0, ndst: 0 }
    }
}

impl Table {
    fn push(&mut self, src: *const u8, len: usize, dsts: &[*mut u8]) {
        let (g, t) = (self.groups, &mut self.raw);
        t.src[g] = src as u64;
        t.len[g] = len as u64;
        t.first[g] = self.ndst as u16;
        for &d in dsts {
            t.dst[self.ndst] = d as u64;
            self.ndst += 1;
        }
        self.groups += 1;
    }
}
