//! The library's device reduction kernels (kernels/src/cuda_kernels.rs), compiled from their CUDA
//! C source by the simulated NVRTC and run by the simulated driver, against the library's host
//! reduction (kernels/src/reduce/): every type and operation, special values (NaN payloads and
//! signs, infinities, subnormals, signed zeros, values that overflow the narrow types), 1 to
//! 64 inputs, in place; and the wire all_reduce kernels against the host's wire algorithm.

mod common;
use common::*;
use cudarc::driver::sys::{CUfunction, CUmodule};
use cudarc::nvrtc::sys::nvrtcResult as N;
use ferroccl_kernels::cuda_kernels::{Reduction, IN_TABLE, MAX_INPUTS, MAX_ROWS};
use ferroccl_kernels::reduce::{convert, finish_inplace, reduce_all, reduce_inplace};
use ferroccl_kernels::types::DataType;
use ferroccl_testutil::Rng;
use std::ffi::{c_char, c_void, CString};

/// Compiles `src` with the simulated NVRTC and loads it.
fn module(src: &str) -> CUmodule {
    let ptx = ptx(src);
    let mut m = std::ptr::null_mut();
    // SAFETY: NUL-terminated PTX of the simulated NVRTC.
    ok(unsafe { cuModuleLoadData(&mut m, ptx.as_ptr().cast()) });
    m
}

/// The PTX of `src` from the simulated NVRTC (NUL-terminated).
fn ptx(src: &str) -> Vec<u8> {
    let csrc = CString::new(src).unwrap();
    let opt = CString::new("--gpu-architecture=compute_90").unwrap();
    let opts: [*const c_char; 1] = [opt.as_ptr()];
    // SAFETY: NUL-terminated strings that outlive the calls; buffers of the reported sizes.
    unsafe {
        let mut prog = std::ptr::null_mut();
        let name = c"fccl_reduce.cu";
        assert_eq!(
            nvrtcCreateProgram(&mut prog, csrc.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null()),
            N::NVRTC_SUCCESS
        );
        let r = nvrtcCompileProgram(prog, 1, opts.as_ptr());
        let mut n = 0;
        if r != N::NVRTC_SUCCESS {
            nvrtcGetProgramLogSize(prog, &mut n);
            let mut log = vec![0u8; n];
            nvrtcGetProgramLog(prog, log.as_mut_ptr().cast());
            panic!("the library's kernels do not compile: {}", String::from_utf8_lossy(&log));
        }
        assert_eq!(nvrtcGetPTXSize(prog, &mut n), N::NVRTC_SUCCESS);
        let mut ptx = vec![0u8; n];
        assert_eq!(nvrtcGetPTX(prog, ptx.as_mut_ptr().cast()), N::NVRTC_SUCCESS);
        nvrtcDestroyProgram(&mut prog);
        ptx
    }
}

fn function(m: CUmodule, r: &Reduction) -> CUfunction {
    let mut f = std::ptr::null_mut();
    let c = CString::new(r.entry()).unwrap();
    // SAFETY: a NUL-terminated name.
    ok(unsafe { cuModuleGetFunction(&mut f, m, c.as_ptr()) });
    f
}

/// Launches `f` as the library does (`cuda_reduce::launch`) with one output, with
/// `block` threads per block and at most `max_grid` blocks (fewer make threads loop over
/// several elements).
fn launch(f: CUfunction, wire: bool, out: CUdeviceptr, ins: &[CUdeviceptr], count: usize, win: usize, max_grid: usize) {
    launch_rows(f, wire, &[out], 1, ins, count, 0, win, max_grid);
}

/// As [`launch`], over `outs.len() / nout` block rows: row y reduces the inputs `y * step`
/// elements on into `outs[y * nout..][..nout]`.
#[allow(clippy::too_many_arguments)]
fn launch_rows(
    f: CUfunction,
    wire: bool,
    outs: &[CUdeviceptr],
    nout: usize,
    ins: &[CUdeviceptr],
    count: usize,
    step: usize,
    win: usize,
    max_grid: usize,
) {
    let counts = vec![count; outs.len() / nout];
    launch_table(f, wire, outs, nout, ins, ins.len(), &counts, step, win, max_grid);
}

/// Launches `f` as `cuda_reduce::launch` lays out its parameters: `counts.len()` block rows,
/// row y reducing `counts[y]` elements `y * step` on of its `n` inputs (`ins` itself where it
/// has `n`, else `ins[y * n..][..n]`) into `outs[y * nout..][..nout]`; the grid as wide as
/// the largest row needs, at most `max_grid` blocks.
#[allow(clippy::too_many_arguments)]
fn launch_table(
    f: CUfunction,
    wire: bool,
    outs: &[CUdeviceptr],
    nout: usize,
    ins: &[CUdeviceptr],
    n: usize,
    counts: &[usize],
    step: usize,
    win: usize,
    max_grid: usize,
) {
    assert_eq!(outs.len(), nout * counts.len());
    let mut o = [0u64; MAX_INPUTS];
    o[..outs.len()].copy_from_slice(outs);
    let mut arr = [0u64; IN_TABLE];
    arr[..ins.len()].copy_from_slice(ins);
    let mut cs = [0u64; MAX_ROWS];
    for (c, &v) in cs.iter_mut().zip(counts) {
        *c = v as u64;
    }
    let ip = if ins.len() == n { 0 } else { n };
    let (mut n, mut no, mut ip, mut st) = (n as i32, nout as i32, ip as i32, step as u64);
    let (mut w, mut failed) = (win as u64, 0u64);
    let mut params: Vec<*mut c_void> = vec![
        (&mut o as *mut [u64; MAX_INPUTS]).cast(),
        (&mut arr as *mut [u64; IN_TABLE]).cast(),
        (&mut cs as *mut [u64; MAX_ROWS]).cast(),
        (&mut n as *mut i32).cast(),
        (&mut no as *mut i32).cast(),
        (&mut ip as *mut i32).cast(),
        (&mut st as *mut u64).cast(),
    ];
    if wire {
        params.push((&mut w as *mut u64).cast());
    }
    // No failure word: the kernel always runs.
    params.push((&mut failed as *mut u64).cast());
    let block = 256;
    let most = counts.iter().copied().max().unwrap_or(0);
    let grid = most.div_ceil(block).clamp(1, max_grid) as u32;
    // SAFETY: the parameters match the kernel's layout.
    unsafe { run_kernel(f, [grid, counts.len() as u32], block as u32, &mut params) };
}

/// Bit patterns worth testing for each type.
fn specials(dt: DataType) -> Vec<u64> {
    match dt {
        DataType::Float32 => vec![
            0,
            0x8000_0000,
            0x3f80_0000,
            0xbf80_0000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0xffc0_0123,
            0x7f80_0001,
            0xff80_4000,
            0x1,
            0x8000_0001,
            0x007f_ffff,
            0x0080_0000,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x3f80_0001,
            0x4b80_0001,
            0x477f_f000,
            0x477f_f001,
            0x4380_0000,
            0x4370_0000,
            0x4760_0000,
        ],
        DataType::Float64 => vec![
            0,
            0x8000_0000_0000_0000,
            0x3ff0_0000_0000_0000,
            0x7ff0_0000_0000_0000,
            0xfff0_0000_0000_0000,
            0x7ff8_0000_0000_0000,
            0xfff8_0000_0012_3456,
            0x7ff0_0000_2000_0001,
            0x1,
            0x000f_ffff_ffff_ffff,
            0x7fef_ffff_ffff_ffff,
            0x47ef_ffff_f000_0000,
            0x47ef_ffff_e000_0000,
            0x3ff0_0000_1000_0000,
            0x3ff0_0000_0800_0000,
            0x36a0_0000_0000_0000,
            0x40ef_ffe0_0000_0000,
        ],
        DataType::Float16 => vec![
            0, 0x8000, 0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7c01, 0xfc3f, 0x0001, 0x8001, 0x03ff, 0x0400,
            0x7bff, 0xfbff, 0x3c01, 0x5bff,
        ],
        DataType::Bfloat16 => vec![
            0, 0x8000, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0xff81, 0x0001, 0x8001, 0x007f, 0x0080,
            0x7f7f, 0xff7f, 0x3f81,
        ],
        DataType::Float8e4m3 => vec![0, 0x80, 0x7f, 0xff, 0x7e, 0xfe, 0x01, 0x81, 0x07, 0x08, 0x38, 0xb8, 0x39, 0x77],
        DataType::Float8e5m2 => {
            vec![0, 0x80, 0x7c, 0xfc, 0x7d, 0x7e, 0xff, 0xfd, 0x7b, 0xfb, 0x01, 0x81, 0x03, 0x04, 0x3c, 0x3d, 0x79]
        }
        DataType::Int8 | DataType::Uint8 => vec![0, 1, 0x7f, 0x80, 0xff, 0xfe],
        DataType::Int32 | DataType::Uint32 => vec![0, 1, 0x7fff_ffff, 0x8000_0000, 0xffff_ffff, 0xffff_fffe],
        DataType::Int64 | DataType::Uint64 => vec![0, 1, i64::MAX as u64, i64::MIN as u64, u64::MAX, u64::MAX - 1],
    }
}

/// The bits of 1.0 in `dt` (floats), to draw values near it.
fn one(dt: DataType) -> u64 {
    match dt {
        DataType::Float32 => 0x3f80_0000,
        DataType::Float64 => 0x3ff0_0000_0000_0000,
        DataType::Float16 => 0x3c00,
        DataType::Bfloat16 => 0x3f80,
        DataType::Float8e4m3 => 0x38,
        DataType::Float8e5m2 => 0x3c,
        _ => 1,
    }
}

/// `count` elements of `dt`: special values, random bits and values near +-1 (whose sums
/// round), a third each.
fn input(dt: DataType, count: usize, rng: &mut Rng) -> Vec<u8> {
    let sp = specials(dt);
    let es = dt.size();
    let bits = 8 * es as u32;
    let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
    let mut v = Vec::with_capacity(count * es);
    for _ in 0..count {
        let r = rng.next_u64();
        let x = match r % 3 {
            0 => sp[(r >> 8) as usize % sp.len()],
            1 => rng.next_u64(),
            // +-1 with a random low mantissa, scaled by a few powers of two.
            _ => {
                let low = rng.next_u64() & ((mask >> 4) >> (bits / 2));
                let exp_step = if es == 8 {
                    1u64 << 52
                } else if dt == DataType::Float32 {
                    1 << 23
                } else {
                    1 << (bits - 6)
                };
                let sign = (r >> 9 & 1) << (bits - 1);
                (one(dt) + low + ((r >> 10) % 4) * exp_step).wrapping_sub(2 * exp_step) | sign
            }
        } & mask;
        v.extend_from_slice(&x.to_le_bytes()[..es]);
    }
    v
}

fn is_nan(dt: DataType, b: &[u8]) -> bool {
    let mut w = [0u8; 8];
    w[..b.len()].copy_from_slice(b);
    let x = u64::from_le_bytes(w);
    match dt {
        DataType::Float32 => x & 0x7fff_ffff > 0x7f80_0000,
        DataType::Float64 => x & 0x7fff_ffff_ffff_ffff > 0x7ff0_0000_0000_0000,
        DataType::Float16 => x & 0x7fff > 0x7c00,
        DataType::Bfloat16 => x & 0x7fff > 0x7f80,
        DataType::Float8e4m3 => x & 0x7f == 0x7f,
        DataType::Float8e5m2 => x & 0x7f > 0x7c,
        _ => false,
    }
}

/// Launches `f` over `grid` (x, y) blocks of `block` threads with `params` (one pointer
/// per parameter) on the default stream and waits for it.
///
/// # Safety
/// `params` match `f`'s parameters, and the buffers they name are the test's allocations.
unsafe fn run_kernel(f: CUfunction, grid: [u32; 2], block: u32, params: &mut [*mut c_void]) {
    // SAFETY: per the caller.
    unsafe {
        ok(cuLaunchKernel(
            f,
            grid[0],
            grid[1],
            1,
            block,
            1,
            1,
            0,
            std::ptr::null_mut(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        ));
        ok(cuCtxSynchronize());
    }
}

fn upload(v: &[u8]) -> CUdeviceptr {
    let d = alloc(v.len());
    htod(d, v);
    d
}

#[test]
fn every_reduction_gives_the_host_reductions_bits() {
    let _c = Ctx::new(0);
    let all: Vec<Reduction> = Reduction::all().into_iter().filter(|r| r.wire.is_none()).collect();
    // 12 types x 5 ops, and the integer types' bitwise ops
    assert_eq!(all.len(), 60 + 6 * 3);
    let m = module(&Reduction::program(&all));
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let count = 261;
    let mut checked = 0usize;
    for r in &all {
        let (dt, op) = (r.dtype, r.op);
        let f = function(m, r);
        let es = dt.size();
        for (n, max_grid) in [(2, 1024), (3, 1), (9, 1024), (MAX_INPUTS, 2)] {
            let inputs: Vec<Vec<u8>> = (0..n).map(|_| input(dt, count, &mut rng)).collect();
            let devs: Vec<CUdeviceptr> = inputs.iter().map(|v| upload(v)).collect();
            let out = alloc(count * es);
            launch(f, false, out, &devs, count, 0, max_grid);
            let got = dtoh(out, count * es);
            // The host reduction over the whole buffers...
            let mut whole = vec![0u8; count * es];
            let mut acc = vec![0u8; count * dt.acc_size()];
            reduce_all(dt, op, n, |i| &inputs[i], &mut whole, &mut acc);
            for e in 0..count {
                let at = e * es..(e + 1) * es;
                // ... and over this element alone (the host's scalar code).
                let one: Vec<Vec<u8>> = inputs.iter().map(|v| v[at.clone()].to_vec()).collect();
                let mut want = vec![0u8; es];
                let mut acc1 = vec![0u8; dt.acc_size()];
                reduce_all(dt, op, n, |i| &one[i], &mut want, &mut acc1);
                let what = || format!("{} n={n} element {e}: inputs {:02x?}", r.entry(), one);
                // Where two NaNs meet (two NaN inputs, or one and a NaN that an invalid
                // operation made) the host returns one of them, which one depending on its
                // code path (scalar or vector loop, first or later step): so NaN results
                // are compared as NaN (one NaN's own bits: `a_single_nan_keeps_its_bits`).
                if is_nan(dt, &want) || is_nan(dt, &got[at.clone()]) {
                    assert!(is_nan(dt, &got[at.clone()]) && is_nan(dt, &want), "{}", what());
                    assert!(is_nan(dt, &whole[at.clone()]), "{}", what());
                } else {
                    assert_eq!(got[at.clone()], want[..], "{}", what());
                    assert_eq!(got[at.clone()], whole[at.clone()], "{} (whole buffers)", what());
                }
                checked += 1;
            }
            // One input: a copy. In place: the output is the first input.
            launch(f, false, out, &devs[1..2], count, 0, 1024);
            assert_eq!(dtoh(out, count * es), inputs[1], "{} n=1", r.entry());
            launch(f, false, devs[0], &devs, count, 0, 1024);
            assert_eq!(dtoh(devs[0], count * es), got, "{} n={n} in place", r.entry());
            // An all_reduce's one pass: every input is also an output (every rank in place).
            for (d, v) in devs.iter().zip(&inputs) {
                htod(*d, v);
            }
            launch_rows(f, false, &devs, n, &devs, count, 0, 0, 1024);
            for (q, d) in devs.iter().enumerate() {
                assert_eq!(dtoh(*d, count * es), got, "{} n={n}: output {q} of every rank in place", r.entry());
            }
            for d in devs.into_iter().chain([out]) {
                // SAFETY: allocations of the test.
                ok(unsafe { cuMemFree_v2(d) });
            }
        }
    }
    assert_eq!(checked, (60 + 6 * 3) * 4 * count);
}

#[test]
fn a_single_nan_keeps_its_bits() {
    // One NaN (quiet or signalling, either sign, with a payload) among finite values comes
    // out as the host makes it: quiet, its sign kept, its payload as far as the type holds it.
    let _c = Ctx::new(0);
    let all: Vec<Reduction> = Reduction::all()
        .into_iter()
        .filter(|r| r.wire.is_none() && is_nan(r.dtype, &[0xff; 8][..r.dtype.size()]))
        .collect();
    assert_eq!(all.len(), 30);
    let m = module(&Reduction::program(&all));
    for r in &all {
        let (dt, es) = (r.dtype, r.dtype.size());
        let nans: Vec<u64> = specials(dt).into_iter().filter(|&b| is_nan(dt, &b.to_le_bytes()[..es])).collect();
        let finite = [one(dt), one(dt) | 1 << (8 * es - 1), 0];
        for nan in nans {
            for at in 0..3 {
                // The NaN first, second or last of three inputs, in every element of 33.
                let inputs: Vec<Vec<u8>> = (0..3)
                    .map(|k| {
                        let b = if k == at { nan } else { finite[k] };
                        (0..33).flat_map(|_| b.to_le_bytes()[..es].to_vec()).collect()
                    })
                    .collect();
                let devs: Vec<CUdeviceptr> = inputs.iter().map(|v| upload(v)).collect();
                let out = alloc(33 * es);
                launch(function(m, r), false, out, &devs, 33, 0, 1024);
                let mut want = vec![0u8; 33 * es];
                let mut acc = vec![0u8; 33 * dt.acc_size()];
                reduce_all(dt, r.op, 3, |i| &inputs[i], &mut want, &mut acc);
                assert_eq!(dtoh(out, 33 * es), want, "{} NaN {nan:#x} as input {at}", r.entry());
                for d in devs.into_iter().chain([out]) {
                    // SAFETY: allocations of the test.
                    ok(unsafe { cuMemFree_v2(d) });
                }
            }
        }
    }
}

/// The host's balanced split of `count` elements among `n` owners: (start, len) of part `i`.
fn part(count: usize, n: usize, i: usize) -> (usize, usize) {
    let (base, rem) = (count / n, count % n);
    (i * base + i.min(rem), base + usize::from(i < rem))
}

/// A wire all_reduce as the host runs it (backend/host/algo/all_reduce.rs, allreduce_wire), per
/// element with the host's own conversions and arithmetic: in each window, the owner of an
/// element starts from its own value, adds every other rank's value rounded to the wire
/// type in rank order after its own, divides for Avg, and rounds the result to the wire.
fn host_wire(r: &Reduction, inputs: &[Vec<u8>], count: usize, win: usize) -> Vec<u8> {
    let (dt, wire, op) = (r.dtype, r.wire.unwrap(), r.op);
    let (es, ws, n) = (dt.size(), wire.size(), inputs.len());
    let mut out = vec![0u8; count * es];
    let round = |x: &[u8]| {
        let mut w = vec![0u8; ws];
        convert(dt, x, wire, &mut w);
        let mut back = vec![0u8; es];
        convert(wire, &w, dt, &mut back);
        back
    };
    for first in (0..count).step_by(win) {
        let wc = win.min(count - first);
        for o in 0..n {
            let (off, len) = part(wc, n, o);
            for g in first + off..first + off + len {
                let at = g * es..(g + 1) * es;
                let mut acc = inputs[o][at.clone()].to_vec();
                for j in 1..n {
                    reduce_inplace(dt, op, &mut acc, &round(&inputs[(o + j) % n][at.clone()]));
                }
                finish_inplace(dt, op, n, &mut acc);
                out[at].copy_from_slice(&round(&acc));
            }
        }
    }
    out
}

#[test]
fn wire_all_reduce_gives_the_host_wire_algorithms_bits() {
    let _c = Ctx::new(0);
    let all: Vec<Reduction> = Reduction::all().into_iter().filter(|r| r.wire.is_some()).collect();
    assert_eq!(all.len(), 5 * 9);
    let m = module(&Reduction::program(&all));
    let mut rng = Rng::new(0x1234_5678_9abc_def1);
    for r in &all {
        let f = function(m, r);
        let es = r.dtype.size();
        // Windows of 7 and 100 elements: owners change inside and across windows.
        for (n, count, win) in [(2, 61, 7), (3, 61, 100), (5, 203, 7), (MAX_INPUTS, 130, 100)] {
            let inputs: Vec<Vec<u8>> = (0..n).map(|_| input(r.dtype, count, &mut rng)).collect();
            let devs: Vec<CUdeviceptr> = inputs.iter().map(|v| upload(v)).collect();
            let out = alloc(count * es);
            launch(f, true, out, &devs, count, win, 1);
            let got = dtoh(out, count * es);
            let want = host_wire(r, &inputs, count, win);
            for e in 0..count {
                let at = e * es..(e + 1) * es;
                let ins: Vec<&[u8]> = inputs.iter().map(|v| &v[at.clone()]).collect();
                assert_eq!(
                    got[at.clone()],
                    want[at.clone()],
                    "{} n={n} win={win} element {e}: inputs {ins:02x?}",
                    r.entry()
                );
            }
            launch(f, true, devs[0], &devs, count, win, 1024);
            assert_eq!(dtoh(devs[0], count * es), got, "{} in place", r.entry());
            for d in devs.into_iter().chain([out]) {
                // SAFETY: allocations of the test.
                ok(unsafe { cuMemFree_v2(d) });
            }
        }
    }
}

/// Launches the library's `fccl_copy` (as `cuda_reduce::Copiers::copy` does): `bytes`
/// from `src` to `dst` in units of the largest width that divides all three.
fn copy_kernel(f: CUfunction, dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, failed: u64) {
    let w = ferroccl_kernels::cuda_kernels::copy_unit(&[dst as usize, src as usize, bytes]);
    let (mut d, mut s, mut units, mut wu, mut fl) = (dst, src, (bytes / w) as u64, w as u32, failed);
    let mut params: [*mut c_void; 5] = [
        (&mut d as *mut u64).cast(),
        (&mut s as *mut u64).cast(),
        (&mut units as *mut u64).cast(),
        (&mut wu as *mut u32).cast(),
        (&mut fl as *mut u64).cast(),
    ];
    let grid = (bytes / w).div_ceil(256).clamp(1, 3) as u32;
    // SAFETY: the parameters match fccl_copy's.
    unsafe { run_kernel(f, [grid, 1], 256, &mut params) };
}

/// The copy kernels move exactly the bytes asked, at every alignment and unit (16-byte
/// vectors included, with grids that loop), 2D rows with their pitches, and nothing at
/// all once the failure word they are given is set.
#[test]
fn copy_kernels_move_exactly_their_bytes_and_nothing_after_a_failure() {
    let _c = Ctx::new(0);
    let m = module(ferroccl_kernels::cuda_kernels::COPY_PROGRAM);
    let get = |name: &str| {
        let mut f = std::ptr::null_mut();
        let c = CString::new(name).unwrap();
        // SAFETY: a NUL-terminated name.
        ok(unsafe { cuModuleGetFunction(&mut f, m, c.as_ptr()) });
        f
    };
    let (copy, copy2d) = (get("fccl_copy"), get("fccl_copy2d"));
    let total = 4096 + 64;
    let src: Vec<u8> = (0..total).map(|i| (i * 7 + 3) as u8).collect();
    let s = upload(&src);
    // Units of 16, 8, 4, 2 and 1 bytes; then addresses at the same offset in 16 bytes
    // (vectors between units), every offset 1..15, lengths that end anywhere.
    let mut cases = vec![(0, 0, 4096), (16, 32, 1600), (8, 8, 24), (4, 12, 20), (2, 6, 30), (1, 3, 101), (0, 0, 0)];
    cases.extend((1..16).map(|o| (o, o + 16 * (o % 3), 40 * o + o % 7)));
    cases.extend([(0, 16, 1000), (4, 20, 12), (3, 3, 13), (12, 44, 1604)]);
    for (so, doff, len) in cases {
        let d = upload(&vec![0xeeu8; total]);
        copy_kernel(copy, d + doff as u64, s + so as u64, len, 0);
        let got = dtoh(d, total);
        let mut want = vec![0xeeu8; total];
        want[doff..doff + len].copy_from_slice(&src[so..so + len]);
        assert_eq!(got, want, "copy of {len} bytes from offset {so} to offset {doff}");
    }
    // 2D: 5 rows of 12 bytes, pitches 20 (source) and 16 (destination).
    let d = upload(&[0u8; 128]);
    let (mut dd, mut dp, mut ss, mut sp, mut wd, mut r, mut wu, mut fl) = (d, 4u64, s, 5u64, 3u64, 5u64, 4u32, 0u64);
    let mut params: [*mut c_void; 8] = [
        (&mut dd as *mut u64).cast(),
        (&mut dp as *mut u64).cast(),
        (&mut ss as *mut u64).cast(),
        (&mut sp as *mut u64).cast(),
        (&mut wd as *mut u64).cast(),
        (&mut r as *mut u64).cast(),
        (&mut wu as *mut u32).cast(),
        (&mut fl as *mut u64).cast(),
    ];
    // SAFETY: the parameters match fccl_copy2d's (pitches and width in 4-byte units).
    unsafe { run_kernel(copy2d, [1, 1], 8, &mut params) };
    let got = dtoh(d, 128);
    for row in 0..5 {
        assert_eq!(&got[row * 16..row * 16 + 12], &src[row * 20..row * 20 + 12], "row {row}");
        assert_eq!(&got[row * 16 + 12..row * 16 + 16], &[0u8; 4], "row {row}'s gap");
    }
    // A set failure word (device memory here; the library's is host-mapped): nothing moves.
    let failed = upload(&1u32.to_le_bytes());
    let d = upload(&vec![0xeeu8; total]);
    copy_kernel(copy, d, s, 4096, failed);
    assert_eq!(dtoh(d, total), vec![0xeeu8; total], "a copy after the failure moved bytes");
}

#[test]
fn a_reduce_scatter_in_rows_gives_each_output_its_block() {
    let _c = Ctx::new(0);
    let all: Vec<Reduction> = [DataType::Float32, DataType::Bfloat16, DataType::Int64, DataType::Float8e4m3]
        .iter()
        .map(|&dt| Reduction::new(dt, ferroccl_kernels::types::RedOp::Sum))
        .collect();
    let m = module(&Reduction::program(&all));
    let mut rng = Rng::new(0x5eed);
    for r in &all {
        let f = function(m, r);
        let es = r.dtype.size();
        let (n, count) = (3, 77);
        let inputs: Vec<Vec<u8>> = (0..n).map(|_| input(r.dtype, n * count, &mut rng)).collect();
        let devs: Vec<CUdeviceptr> = inputs.iter().map(|v| upload(v)).collect();
        let outs: Vec<CUdeviceptr> = (0..n).map(|_| alloc(count * es)).collect();
        launch_rows(f, false, &outs, 1, &devs, count, count, 0, 1024);
        for (q, &got) in outs.iter().enumerate() {
            // Block q of every input, reduced by a launch of its own.
            let one = alloc(count * es);
            let at: Vec<CUdeviceptr> = devs.iter().map(|d| d + (q * count * es) as u64).collect();
            launch(f, false, one, &at, count, 0, 1024);
            assert_eq!(dtoh(got, count * es), dtoh(one, count * es), "{} row {q}", r.entry());
        }
    }
}

/// A reduce_scatter_v in one launch: row q has its own n inputs (rank p's block q, at p's
/// displacement for it) and its own count (uneven, some rows of none), in every kernel
/// variant of every plain reduction; each row gives the host reduction's bits, the same
/// bits as that row launched alone over shared inputs (one launch per rank, as before),
/// and writes nothing outside its output. The displacements put some rows' buffers at one
/// offset in 16 bytes (the vector path) and the ranks' blocks of others apart (the scalar
/// path).
#[test]
fn rows_of_their_own_inputs_and_counts_reduce_as_separate_launches_do() {
    let _c = Ctx::new(0);
    let all: Vec<Reduction> = Reduction::all().into_iter().filter(|r| r.wire.is_none()).collect();
    let m = module(&Reduction::program(&all));
    let mut rng = Rng::new(0x00e5_cafe_f00d_0007);
    // Rows reduced on the vector path (every buffer at one offset) and apart.
    let mut paths = [0usize; 2];
    let count = |q: usize| [37, 0, 77, 5, 130, 1, 64, 0][q % 8];
    // Rank p's displacement of block q, in elements: the blocks packed 2 elements apart,
    // then moved by a few elements, by as many on every rank except in rows 2 and 5.
    let displ = |p: usize, q: usize| (0..q).map(count).sum::<usize>() + 2 * q + [0, 0, p, 1, 1, 3 * p, 2, 0][q % 8];
    for r in &all {
        let (dt, op, es) = (r.dtype, r.op, r.dtype.size());
        for (n, ranks) in [(2, 2), (4, 4), (8, 8), (3, 0), (8, 0)] {
            let f = function_for(m, r, ranks);
            let len = displ(n - 1, n) + count(n) + 8;
            let sends: Vec<Vec<u8>> = (0..n).map(|_| input(dt, len, &mut rng)).collect();
            let devs: Vec<CUdeviceptr> = sends.iter().map(|v| upload(v)).collect();
            let row_ins =
                |q: usize| -> Vec<CUdeviceptr> { (0..n).map(|p| devs[p] + (displ(p, q) * es) as u64).collect() };
            let ins: Vec<CUdeviceptr> = (0..n).flat_map(row_ins).collect();
            let counts: Vec<usize> = (0..n).map(count).collect();
            // Rank q's output 16 bytes into its buffer plus its first input's offset in 16
            // bytes; guard bytes either side.
            let lead = |q: usize| 16 + (row_ins(q)[0] % 16) as usize;
            let bufs: Vec<CUdeviceptr> = counts.iter().map(|c| upload(&vec![0xa5u8; c * es + 32])).collect();
            let outs: Vec<CUdeviceptr> = (0..n).map(|q| bufs[q] + lead(q) as u64).collect();
            launch_table(f, false, &outs, 1, &ins, n, &counts, 0, 0, 3);
            for q in 0..n {
                let c = counts[q];
                let what = || format!("{} n={n} row {q} of {c} elements", r.entry_for(ranks));
                let b = dtoh(bufs[q], c * es + 32);
                let got = &b[lead(q)..lead(q) + c * es];
                assert!(
                    b[..lead(q)].iter().chain(&b[lead(q) + c * es..]).all(|&x| x == 0xa5),
                    "{} wrote outside its output",
                    what()
                );
                if c == 0 {
                    continue;
                }
                let apart = row_ins(q).iter().any(|&a| a % 16 != row_ins(q)[0] % 16);
                paths[usize::from(apart)] += 1;
                // The row alone, over shared inputs, as a launch of its own.
                let alone = alloc(c * es);
                launch_table(f, false, &[alone], 1, &row_ins(q), n, &[c], 0, 0, 3);
                assert_eq!(got, &dtoh(alone, c * es)[..], "{}: not the bits of its own launch", what());
                // SAFETY: an allocation of the test.
                ok(unsafe { cuMemFree_v2(alone) });
                for e in 0..c {
                    let one: Vec<Vec<u8>> =
                        (0..n).map(|p| sends[p][(displ(p, q) + e) * es..(displ(p, q) + e + 1) * es].to_vec()).collect();
                    let (mut want, mut acc) = (vec![0u8; es], vec![0u8; dt.acc_size()]);
                    reduce_all(dt, op, n, |i| &one[i], &mut want, &mut acc);
                    let g = &got[e * es..(e + 1) * es];
                    if is_nan(dt, &want) || is_nan(dt, g) {
                        assert!(is_nan(dt, &want) && is_nan(dt, g), "{} element {e}", what());
                    } else {
                        assert_eq!(g, &want[..], "{} element {e}: inputs {one:02x?}", what());
                    }
                }
            }
            for d in devs.into_iter().chain(bufs) {
                // SAFETY: allocations of the test.
                ok(unsafe { cuMemFree_v2(d) });
            }
        }
    }
    assert!(paths[0] > 0 && paths[1] > 0, "rows on the vector and the scalar path: {paths:?}");
}

/// The bytes of entry `name`'s parameters in `ptx` (the simulated NVRTC's: one `.param`
/// line each, `.u32`, `.u64` or `.align A .b8 NAME[SIZE]`), each at its alignment.
fn param_bytes(ptx: &str, name: &str) -> usize {
    let head = format!(".entry {name}(");
    let at = ptx.find(&head).unwrap_or_else(|| panic!("no entry {name}"));
    let mut end = 0usize;
    for l in ptx[at + head.len()..].lines().map(str::trim).take_while(|l| !l.starts_with(')')) {
        let Some(p) = l.strip_prefix(".param ") else { continue };
        let (align, size) = if p.starts_with(".u32") {
            (4, 4)
        } else if p.starts_with(".u64") {
            (8, 8)
        } else {
            let a: usize = p.strip_prefix(".align ").and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
            let sz: usize = p.split('[').nth(1).and_then(|r| r.split(']').next()).unwrap().parse().unwrap();
            (a, sz)
        };
        end = end.div_ceil(align) * align + size;
    }
    end
}

/// Every reduction kernel's parameters, as the compiler lays them out, take what the
/// library says (`reduce_param_bytes`): within CUDA's classic 4096 bytes.
#[test]
fn every_reduction_kernels_parameters_fit_the_classic_limit() {
    use ferroccl_kernels::cuda_kernels::{reduce_param_bytes, PARAM_LIMIT, RANKS};
    let mut checked = 0;
    // The programs the other tests compile (the simulated NVRTC's cache has them).
    for wire in [false, true] {
        let all: Vec<Reduction> = Reduction::all().into_iter().filter(|r| r.wire.is_some() == wire).collect();
        let text = String::from_utf8(ptx(&Reduction::program(&all))).unwrap();
        for r in &all {
            for k in [0].into_iter().chain(RANKS) {
                let want = reduce_param_bytes(wire);
                assert!(want <= PARAM_LIMIT);
                assert_eq!(param_bytes(&text, &r.entry_for(k)), want, "{}", r.entry_for(k));
                checked += 1;
            }
        }
    }
    assert_eq!(checked, Reduction::all().len() * 4);
}

/// Launches fccl_copy_batch over `groups` of (source, length, destinations), as
/// `cuda_reduce::Copiers::copy_batch` lays out its table.
fn copy_batch(f: CUfunction, groups: &[(CUdeviceptr, usize, Vec<CUdeviceptr>)], failed: u64) {
    use ferroccl_kernels::cuda_kernels::BATCH;
    #[repr(C)]
    struct Table {
        src: [u64; BATCH],
        len: [u64; BATCH],
        dst: [u64; BATCH],
        first: [u16; BATCH + 1],
    }
    let mut t = Table { src: [0; BATCH], len: [0; BATCH], dst: [0; BATCH], first: [0; BATCH + 1] };
    let mut k = 0;
    for (g, (src, len, dsts)) in groups.iter().enumerate() {
        t.src[g] = *src;
        t.len[g] = *len as u64;
        t.first[g] = k as u16;
        for d in dsts {
            t.dst[k] = *d;
            k += 1;
        }
    }
    t.first[groups.len()] = k as u16;
    let (mut ng, mut fl) = (groups.len() as u32, failed);
    let mut params: [*mut c_void; 3] =
        [(&mut t as *mut Table).cast(), (&mut ng as *mut u32).cast(), (&mut fl as *mut u64).cast()];
    // SAFETY: the parameters match fccl_copy_batch's.
    unsafe { run_kernel(f, [3, groups.len() as u32], 64, &mut params) };
}

#[test]
fn one_batched_launch_copies_each_source_to_all_its_destinations_and_nothing_else() {
    let _c = Ctx::new(0);
    let m = module(ferroccl_kernels::cuda_kernels::COPY_PROGRAM);
    let mut f = std::ptr::null_mut();
    let name = CString::new("fccl_copy_batch").unwrap();
    // SAFETY: a NUL-terminated name.
    ok(unsafe { cuModuleGetFunction(&mut f, m, name.as_ptr()) });
    let total = 8192;
    let src: Vec<u8> = (0..total).map(|i| (i * 13 + 5) as u8).collect();
    let s = upload(&src);
    let d = upload(&vec![0xeeu8; total]);
    // Aligned (16-byte units), odd lengths and offsets (bytes), a fan of three, an empty group.
    // Vectors between units: every destination at the source's offset in 16 bytes (5), or
    // 16-byte aligned with a length that is not (808); and one destination apart (bytes).
    let groups: Vec<(usize, usize, Vec<usize>)> = vec![
        (0, 1024, vec![0, 2048, 4096]),
        (1024, 333, vec![1101]),
        (3, 40, vec![6001, 7001]),
        (64, 0, vec![7900]),
        (2053, 301, vec![5125, 5445, 7205]),
        (3072, 808, vec![6144]),
        (2501, 77, vec![7701, 7802]),
    ];
    let dev: Vec<(CUdeviceptr, usize, Vec<CUdeviceptr>)> =
        groups.iter().map(|(so, len, ds)| (s + *so as u64, *len, ds.iter().map(|&o| d + o as u64).collect())).collect();
    copy_batch(f, &dev, 0);
    let mut want = vec![0xeeu8; total];
    for (so, len, ds) in &groups {
        for &o in ds {
            want[o..o + len].copy_from_slice(&src[*so..so + len]);
        }
    }
    assert_eq!(dtoh(d, total), want, "the batch moved other bytes than its groups'");
    // After a failure nothing moves.
    let failed = upload(&1u32.to_le_bytes());
    let d2 = upload(&vec![0xeeu8; total]);
    let dev2: Vec<(CUdeviceptr, usize, Vec<CUdeviceptr>)> = vec![(s, 4096, vec![d2])];
    copy_batch(f, &dev2, failed);
    assert_eq!(dtoh(d2, total), vec![0xeeu8; total], "a batch after the failure moved bytes");
}

fn function_for(m: CUmodule, r: &Reduction, ranks: usize) -> CUfunction {
    let mut f = std::ptr::null_mut();
    let c = CString::new(r.entry_for(ranks)).unwrap();
    // SAFETY: a NUL-terminated name.
    ok(unsafe { cuModuleGetFunction(&mut f, m, c.as_ptr()) });
    f
}

/// The 16-byte vector path (every input and output at the same offset in 16 bytes: a
/// scalar head up to the first boundary, vectors, a scalar tail), the scalar path (offsets
/// that differ: every element alone) and the kernels unrolled for 2, 4 and 8 inputs give
/// the same bits as each other and as the host, for every type and operation, with the
/// buffers at every offset of 1 to 15 bytes that the type's alignment allows (a GPU
/// cannot load an element from an address its size does not divide).
#[test]
fn vector_scalar_and_unrolled_kernels_give_the_same_bits_at_every_offset() {
    let _c = Ctx::new(0);
    let all: Vec<Reduction> = Reduction::all().into_iter().filter(|r| r.wire.is_none()).collect();
    let m = module(&Reduction::program(&all));
    let mut rng = Rng::new(0x0ff5_e7a1_16e0_0001);
    let count = 77;
    let mut launches = [0usize; 2];
    for r in &all {
        let (dt, op, es) = (r.dtype, r.op, r.dtype.size());
        let span = count * es + 16;
        for (n, ranks) in [(2, 2), (4, 4), (8, 8), (2, 0), (3, 0), (8, 0)] {
            let f = function_for(m, r, ranks);
            let inputs: Vec<Vec<u8>> = (0..n).map(|_| input(dt, count, &mut rng)).collect();
            // The host's result, element by element (NaNs compared as NaN, as above).
            let want: Vec<Vec<u8>> = (0..count)
                .map(|e| {
                    let one: Vec<Vec<u8>> = inputs.iter().map(|v| v[e * es..(e + 1) * es].to_vec()).collect();
                    let (mut w, mut acc) = (vec![0u8; es], vec![0u8; dt.acc_size()]);
                    reduce_all(dt, op, n, |i| &one[i], &mut w, &mut acc);
                    w
                })
                .collect();
            let devs: Vec<CUdeviceptr> = (0..n).map(|_| alloc(span)).collect();
            let out = alloc(span);
            let mut first: Option<Vec<u8>> = None;
            for off in (0..16).filter(|o| o % es == 0) {
                // Every buffer at `off` (vectors), then the output one element further on
                // and then one input one element further on (scalar).
                for shift in 0..3 {
                    let out_off = if shift == 1 { (off + es) % 16 } else { off };
                    let in_off = |k: usize| if shift == 2 && k == n - 1 { (off + es) % 16 } else { off };
                    for (k, d) in devs.iter().enumerate() {
                        let mut b = vec![0x5au8; span];
                        b[in_off(k)..in_off(k) + count * es].copy_from_slice(&inputs[k]);
                        htod(*d, &b);
                    }
                    htod(out, &vec![0xa5u8; span]);
                    let ins: Vec<CUdeviceptr> = devs.iter().enumerate().map(|(k, d)| d + in_off(k) as u64).collect();
                    launch(f, false, out + out_off as u64, &ins, count, 0, 2);
                    launches[usize::from(shift == 0)] += 1;
                    let b = dtoh(out, span);
                    let got = &b[out_off..out_off + count * es];
                    assert!(
                        b[..out_off].iter().chain(&b[out_off + count * es..]).all(|&x| x == 0xa5),
                        "{} wrote outside its output",
                        r.entry_for(ranks)
                    );
                    for (e, w) in want.iter().enumerate() {
                        let g = &got[e * es..(e + 1) * es];
                        let what = || format!("{} n={n} offset {off} shift {shift} element {e}", r.entry_for(ranks));
                        if is_nan(dt, w) || is_nan(dt, g) {
                            assert!(is_nan(dt, w) && is_nan(dt, g), "{}", what());
                        } else {
                            assert_eq!(g, &w[..], "{}", what());
                        }
                    }
                    // Every path and offset gives the very same bits, NaNs included.
                    match &first {
                        None => first = Some(got.to_vec()),
                        Some(f0) => assert_eq!(got, &f0[..], "{} n={n} offset {off} shift {shift}", r.entry_for(ranks)),
                    }
                }
            }
            for d in devs.into_iter().chain([out]) {
                // SAFETY: allocations of the test.
                ok(unsafe { cuMemFree_v2(d) });
            }
        }
    }
    assert!(launches[0] > 0 && launches[1] > 0, "{launches:?}");
}

/// The wire kernels unrolled for 2, 4 and 8 ranks give the host wire algorithm's bits.
#[test]
fn unrolled_wire_kernels_give_the_host_wire_algorithms_bits() {
    let _c = Ctx::new(0);
    let all: Vec<Reduction> = Reduction::all().into_iter().filter(|r| r.wire.is_some()).collect();
    let m = module(&Reduction::program(&all));
    let mut rng = Rng::new(0x77e1_5eed);
    for r in &all {
        let es = r.dtype.size();
        for n in ferroccl_kernels::cuda_kernels::RANKS {
            let (count, win) = (61, 7);
            let inputs: Vec<Vec<u8>> = (0..n).map(|_| input(r.dtype, count, &mut rng)).collect();
            let devs: Vec<CUdeviceptr> = inputs.iter().map(|v| upload(v)).collect();
            let out = alloc(count * es);
            launch(function_for(m, r, n), true, out, &devs, count, win, 1);
            assert_eq!(dtoh(out, count * es), host_wire(r, &inputs, count, win), "{} n={n}", r.entry_for(n));
            for d in devs.into_iter().chain([out]) {
                // SAFETY: allocations of the test.
                ok(unsafe { cuMemFree_v2(d) });
            }
        }
    }
}

/// Launches a type's PreMulSum scaling kernel as `cuda_reduce::scale` does: the scalar at
/// `sp` in device memory, or (`sp` 0) the low bytes of `sbits`.
fn scale(f: CUfunction, out: CUdeviceptr, input: CUdeviceptr, count: usize, sp: CUdeviceptr, sbits: u64) {
    let (mut o, mut i, mut c, mut p, mut b, mut failed) = (out, input, count as u64, sp, sbits, 0u64);
    let mut params: [*mut c_void; 6] = [
        (&mut o as *mut u64).cast(),
        (&mut i as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut p as *mut u64).cast(),
        (&mut b as *mut u64).cast(),
        (&mut failed as *mut u64).cast(),
    ];
    // A few blocks, so that threads loop over several elements.
    let grid = count.div_ceil(256).clamp(1, 3) as u32;
    // SAFETY: the parameters match the kernel's (pointer, pointer, unsigned long long,
    // pointer, unsigned long long, pointer); the buffers are allocations of the test.
    unsafe { run_kernel(f, [grid, 1], 256, &mut params) };
}

#[test]
fn the_scaling_kernels_give_the_host_pre_multiply_bits() {
    use ferroccl_kernels::cuda_kernels::scale_entry;
    use ferroccl_kernels::reduce::pre_multiply;
    let _c = Ctx::new(0);
    let mut rng = Rng::new(0x5ca1_ab1e_0dd5_eed5);
    let count = 263;
    let mut checked = 0usize;
    for dt in DataType::ALL {
        let plain = Reduction::new(dt, ferroccl_kernels::types::RedOp::Sum);
        let m = module(&Reduction::program(&plain.group()));
        let mut f = std::ptr::null_mut();
        let name = CString::new(scale_entry(dt)).unwrap();
        // SAFETY: a NUL-terminated name.
        ok(unsafe { cuModuleGetFunction(&mut f, m, name.as_ptr()) });
        let es = dt.size();
        let x = input(dt, count, &mut rng);
        let dx = upload(&x);
        let out = alloc(count * es);
        let mut scalars = specials(dt);
        scalars.extend([one(dt), rng.next_u64(), rng.next_u64()]);
        for s in scalars {
            let sb = s.to_le_bytes()[..es].to_vec();
            let mut want = vec![0u8; count * es];
            pre_multiply(dt, &sb, &x, &mut want);
            let mut bits = [0u8; 8];
            bits[..es].copy_from_slice(&sb);
            scale(f, out, dx, count, 0, u64::from_le_bytes(bits));
            let by_value = dtoh(out, count * es);
            let ds = upload(&sb);
            scale(f, out, dx, count, ds, 0);
            let from_memory = dtoh(out, count * es);
            for e in 0..count {
                let at = e * es..(e + 1) * es;
                let what = || format!("{} element {e}: {:02x?} x {:02x?}", scale_entry(dt), &x[at.clone()], sb);
                // Which of two NaN operands the host's product keeps is the compiler's
                // choice: there, NaN is what is compared.
                if is_nan(dt, &x[at.clone()]) && is_nan(dt, &sb) {
                    assert!(is_nan(dt, &by_value[at.clone()]) && is_nan(dt, &want[at.clone()]), "{}", what());
                } else {
                    assert_eq!(by_value[at.clone()], want[at.clone()], "{} (scalar by value)", what());
                }
                assert_eq!(from_memory[at.clone()], by_value[at.clone()], "{} (scalar in device memory)", what());
                checked += 1;
            }
            // In place: the output is the input.
            let copy = upload(&x);
            scale(f, copy, copy, count, ds, 0);
            assert_eq!(dtoh(copy, count * es), from_memory, "{} in place", scale_entry(dt));
            for d in [ds, copy] {
                // SAFETY: allocations of the test.
                ok(unsafe { cuMemFree_v2(d) });
            }
        }
        for d in [dx, out] {
            // SAFETY: allocations of the test.
            ok(unsafe { cuMemFree_v2(d) });
        }
    }
    assert!(checked >= 12 * 4 * count, "{checked} elements checked");
}
