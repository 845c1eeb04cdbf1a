//! The cost model: what this process has asked of the simulated GPU, counted by kind, so
//! that tests can hold each collective to the roofline's budget per call (docs/sim-gpu.md,
//! "The cost model"). Bytes are HBM traffic: what kernels and copies read and write in
//! device memory. The library's kernels are modelled by name from their arguments (their
//! sources in `cuda_kernels` say what each touches, and tests/library_kernels.rs holds
//! them to it); any other kernel counts as unmodelled.
//!
//! Read with `simgpuGetCosts`, an export of the simulated driver alone: a program finds it
//! with dlsym and, on a real driver, does not.

use crate::types::DataType;
use std::ffi::c_uint;
use std::sync::atomic::{AtomicU64, Ordering};

/// The counters, in the order `simgpuGetCosts` writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Cost {
    /// Every driver entry point called.
    DriverCalls,
    /// Calls that block the host until the GPU gets somewhere: synchronisations,
    /// synchronous copies and sets, frees and unregistrations.
    Blocking,
    /// Kernel launches.
    Launches,
    /// Copies and sets by the driver (synchronous or on a stream).
    Copies,
    /// Stream memory operations (waits and writes of values).
    MemOps,
    /// Bytes of device memory read by kernels and copies.
    Read,
    /// Bytes of device memory written by kernels, copies and sets.
    Written,
    /// Launches of kernels the model does not know (their bytes are not counted).
    Unmodelled,
    /// Thread blocks of every launch's grid (x * y * z), summed.
    Blocks,
    /// NVRTC compilations (nvrtcCompileProgram calls).
    Compiles,
}

/// How many counters there are.
pub const COUNT: usize = Cost::Compiles as usize + 1;

static COSTS: [AtomicU64; COUNT] = [const { AtomicU64::new(0) }; COUNT];

pub fn add(c: Cost, v: u64) {
    COSTS[c as usize].fetch_add(v, Ordering::Relaxed);
}

/// Counts a call of driver entry point `name`.
pub fn on_call(name: &str) {
    add(Cost::DriverCalls, 1);
    const BLOCKING: &[&str] = &[
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
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
        "cuMemFree_v2",
        "cuMemFreeHost",
        "cuMemHostUnregister",
        "cuIpcCloseMemHandle",
    ];
    if BLOCKING.contains(&name) {
        add(Cost::Blocking, 1);
    }
    if name.starts_with("cuStreamWaitValue") || name.starts_with("cuStreamWriteValue") {
        add(Cost::MemOps, 1);
    }
}

/// Counts a copy of `bytes` bytes by the driver: read where the source is device memory,
/// written where the destination is.
pub fn on_copy(bytes: usize, src_device: bool, dst_device: bool) {
    add(Cost::Copies, 1);
    if src_device {
        add(Cost::Read, bytes as u64);
    }
    if dst_device {
        add(Cost::Written, bytes as u64);
    }
}

/// The element size of a reduction kernel's type token (`f32`, `bf16`, ...).
fn elem_size(token: &str) -> Option<u64> {
    DataType::ALL.iter().find(|d| d.kernel_token() == token).map(|d| d.size() as u64)
}

/// A launch's argument buffer and each parameter's offset in it (as the driver copied
/// them at the launch).
pub struct Args<'a> {
    pub bytes: &'a [u8],
    pub offsets: &'a [usize],
}

/// Parameter `i` of a launch as an unsigned integer of `size` bytes at offset `extra`
/// into it.
fn arg(args: &Args<'_>, i: usize, extra: usize, size: usize) -> u64 {
    let at = args.offsets.get(i).map_or(usize::MAX, |o| o + extra);
    let Some(b) = args.bytes.get(at..at.saturating_add(size)) else { return 0 };
    let mut v = [0u8; 8];
    v[..size].copy_from_slice(b);
    u64::from_le_bytes(v)
}

/// Counts a launch of kernel `name` with `args` over `grid`: (read, written) bytes by
/// the library's kernels' definitions, or unmodelled.
pub fn on_launch(name: &str, args: &Args<'_>, grid: [u32; 3]) {
    add(Cost::Launches, 1);
    add(Cost::Blocks, grid.iter().map(|&g| g as u64).product());
    let rw = model(name, args, grid);
    match rw {
        Some((r, w)) => {
            add(Cost::Read, r);
            add(Cost::Written, w);
        }
        None => add(Cost::Unmodelled, 1),
    }
}

/// What one launch of a library kernel reads and writes (see `cuda_kernels`).
fn model(name: &str, args: &Args<'_>, grid: [u32; 3]) -> Option<(u64, u64)> {
    match name {
        // (dst, src, units, w, failed)
        "fccl_copy" => {
            let b = arg(args, 2, 0, 8) * arg(args, 3, 0, 4);
            Some((b, b))
        }
        // (dst, dpitch, src, spitch, width, rows, w, failed)
        "fccl_copy2d" => {
            let b = arg(args, 4, 0, 8) * arg(args, 5, 0, 8) * arg(args, 6, 0, 4);
            Some((b, b))
        }
        // (struct { src[B]; len[B]; dst[B]; unsigned short first[B + 1]; }, groups, failed)
        "fccl_copy_batch" => {
            let batch = crate::cuda_kernels::BATCH;
            let groups = (arg(args, 1, 0, 4) as usize).min(batch);
            let (mut r, mut w) = (0, 0);
            for g in 0..groups {
                let len = arg(args, 0, 8 * (batch + g), 8);
                let first = |k: usize| arg(args, 0, 24 * batch + 2 * k, 2);
                r += len;
                w += len * first(g + 1).saturating_sub(first(g));
            }
            Some((r, w))
        }
        // (struct { a[B]; b[B]; len[B]; }, pairs, failed): both sides of a pair read and written.
        "fccl_swap_batch" => {
            let batch = crate::cuda_kernels::BATCH;
            let pairs = (arg(args, 1, 0, 4) as usize).min(batch);
            let b: u64 = (0..pairs).map(|g| 2 * arg(args, 0, 16 * batch + 8 * g, 8)).sum();
            Some((b, b))
        }
        // (out, in, count, sp, sbits, failed): the input once, the scalar when in memory.
        _ if name.starts_with("fccl_scale_") => {
            let es = elem_size(name.strip_prefix("fccl_scale_")?)?;
            let count = arg(args, 2, 0, 8);
            let scalar = if arg(args, 3, 0, 8) != 0 { es } else { 0 };
            Some((count * es + scalar, count * es))
        }
        // (outs, ins, counts, n, nout, ip, step, [win,] failed) over grid[1] rows: row y
        // reads counts[y] elements of each of n inputs and writes them to nout outputs; a
        // kernel whose name ends in `_n<K>` is unrolled for K inputs and reads exactly K.
        _ => {
            use crate::cuda_kernels::{IN_TABLE, MAX_INPUTS, MAX_ROWS, RANKS};
            let rest = name.strip_prefix("fccl_reduce_")?;
            let wire = rest.starts_with("wire_");
            let token = rest.strip_prefix("wire_").unwrap_or(rest).split('_').next()?;
            let es = elem_size(token)?;
            // Exactly the parameters of the layout the model knows.
            if args.offsets.len() != 8 + usize::from(wire) {
                return None;
            }
            let (n, nout, ip) = (arg(args, 3, 0, 4), arg(args, 4, 0, 4), arg(args, 5, 0, 4));
            let rows = grid[1] as u64;
            if n == 0 || n > MAX_INPUTS as u64 || nout == 0 || rows * nout > MAX_INPUTS as u64 || rows > MAX_ROWS as u64
            {
                return None;
            }
            // Rows read the same inputs (ip 0) or n of their own, all in the table.
            if ip != 0 && (ip != n || rows * n > IN_TABLE as u64) {
                return None;
            }
            if let Some(k) = rest.rsplit('_').next().and_then(|t| t.strip_prefix('n')) {
                let k: u64 = k.parse().ok()?;
                if !RANKS.contains(&(k as usize)) || n != k {
                    return None;
                }
            }
            let elems: u64 = (0..rows as usize).map(|y| arg(args, 2, 8 * y, 8)).sum();
            Some((n * elems * es, nout * elems * es))
        }
    }
}

/// Writes up to `n` counters (in [`Cost`]'s order) to `out` and returns how many there
/// are. An export of the simulated driver alone (no real driver has it).
///
/// # Safety
/// `out` is NULL or valid for `n` writes of u64.
#[no_mangle]
pub unsafe extern "C" fn simgpuGetCosts(out: *mut u64, n: c_uint) -> c_uint {
    if !out.is_null() {
        for (i, c) in COSTS.iter().enumerate().take(n as usize) {
            // SAFETY: i < n, and out is valid for n writes (caller).
            unsafe { out.add(i).write(c.load(Ordering::Relaxed)) };
        }
    }
    COUNT as c_uint
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model of `name` over arguments of (size, value).
    fn run(name: &str, vals: &[(usize, u64)], grid: [u32; 3]) -> Option<(u64, u64)> {
        let mut bytes = Vec::new();
        let mut offsets = Vec::new();
        for &(size, v) in vals {
            let at = bytes.len().div_ceil(size) * size;
            bytes.resize(at, 0);
            offsets.push(at);
            bytes.extend_from_slice(&v.to_le_bytes()[..size]);
        }
        model(name, &Args { bytes: &bytes, offsets: &offsets }, grid)
    }

    /// The model of reduction kernel `name` launched over `rows` rows with per-row
    /// `counts`, `n` inputs per row (`ip`: 0 shared, n own), `nout` outputs per row.
    fn red(name: &str, counts: &[u64], n: u64, nout: u64, ip: u64, win: Option<u64>, rows: u32) -> Option<(u64, u64)> {
        use crate::cuda_kernels::{IN_TABLE, MAX_INPUTS, MAX_ROWS};
        let mut bytes = vec![0u8; 8 * (MAX_INPUTS + IN_TABLE)];
        let mut offsets = vec![0, 8 * MAX_INPUTS, bytes.len()];
        for y in 0..MAX_ROWS {
            bytes.extend_from_slice(&counts.get(y).copied().unwrap_or(0).to_le_bytes());
        }
        for v in [n, nout, ip] {
            offsets.push(bytes.len());
            bytes.extend_from_slice(&(v as u32).to_le_bytes());
        }
        bytes.resize(bytes.len().div_ceil(8) * 8, 0);
        for v in [Some(0u64), win, Some(0)].into_iter().flatten() {
            offsets.push(bytes.len());
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        model(name, &Args { bytes: &bytes, offsets: &offsets }, [1, rows, 1])
    }

    #[test]
    fn the_library_kernels_are_modelled_from_their_arguments() {
        // fccl_copy of 100 units of 16 bytes.
        assert_eq!(run("fccl_copy", &[(8, 1), (8, 2), (8, 100), (4, 16), (8, 0)], [1, 1, 1]), Some((1600, 1600)));
        // A reduce_scatter of 3 rows, 4 shared inputs of 10 bfloat16 per row, 1 output each.
        let rs = |name: &str, n, rows| red(name, &[10, 10, 10], n, 1, 0, None, rows);
        assert_eq!(rs("fccl_reduce_bf16_sum", 4, 3), Some((3 * 4 * 20, 3 * 20)));
        // A reduce_scatter_v: rows of their own 4 inputs and counts 10, 0 and 7.
        let v = red("fccl_reduce_bf16_sum_n4", &[10, 0, 7], 4, 1, 4, None, 3);
        assert_eq!(v, Some((4 * 17 * 2, 17 * 2)));
        // An all_reduce over a wire: 1 row, 2 inputs, 2 outputs, 5 float64.
        assert_eq!(red("fccl_reduce_wire_f64_bf16_max", &[5], 2, 2, 0, Some(64), 1), Some((80, 80)));
        assert_eq!(rs("my_kernel", 4, 1), None);
        // The kernel unrolled for 4 inputs, launched with 4; with any other count it
        // reads other bytes than it says, and is not modelled (the cost test fails).
        assert_eq!(rs("fccl_reduce_bf16_sum_n4", 4, 3), Some((3 * 4 * 20, 3 * 20)));
        assert_eq!(rs("fccl_reduce_bf16_sum_n4", 3, 3), None);
        assert_eq!(rs("fccl_reduce_bf16_sum_n3", 3, 3), None);
        assert_eq!(red("fccl_reduce_wire_f64_bf16_max_n4", &[5], 4, 4, 0, Some(64), 1), Some((160, 160)));
        assert_eq!(red("fccl_reduce_wire_f64_bf16_max_n8", &[5], 4, 4, 0, Some(64), 1), None);
        // A wire kernel's arguments without its window, a plain one's with one: another layout.
        assert_eq!(red("fccl_reduce_wire_f64_bf16_max", &[5], 2, 2, 0, None, 1), None);
        assert_eq!(red("fccl_reduce_bf16_sum", &[5], 2, 2, 0, Some(64), 1), None);
        // Rows of outputs beyond the table, no inputs, per-row inputs that are not n or
        // overflow the input table: not a launch the library makes.
        assert_eq!(rs("fccl_reduce_bf16_sum", 4, 65), None);
        assert_eq!(rs("fccl_reduce_bf16_sum", 0, 1), None);
        assert_eq!(red("fccl_reduce_bf16_sum", &[10, 10], 4, 1, 3, None, 2), None);
        // 19 rows of 19 inputs fill 361 of the table's 379; 20 rows of 19, 380.
        assert_eq!(red("fccl_reduce_bf16_sum", &[1; 20], 19, 1, 19, None, 19), Some((19 * 19 * 2, 19 * 2)));
        assert_eq!(red("fccl_reduce_bf16_sum", &[1; 20], 19, 1, 19, None, 20), None);
    }
}
