//! Extensions beyond NCCL, driven from one thread over fcclCommInitAll ranks.
#![allow(clippy::needless_range_loop)] // rank-indexed loops read clearer here

use ferroccl::ffi::*;
use std::ffi::CStr;
use std::ptr::{null, null_mut};

fn ck(r: fcclResult_t) {
    if r != fcclSuccess {
        // SAFETY: fcclGetLastError returns a NUL-terminated string that stays valid until this thread's next failing call, after the panic message is built.
        let msg = unsafe { CStr::from_ptr(fcclGetLastError(null_mut())) };
        panic!("call failed with {r}: {}", msg.to_string_lossy());
    }
}

fn init_all(n: usize) -> Vec<fcclComm_t> {
    let mut comms = vec![null_mut(); n];
    // SAFETY: comms has room for the n handles fcclCommInitAll writes; devlist NULL makes host ranks.
    ck(unsafe { fcclCommInitAll(comms.as_mut_ptr(), n as i32, null()) });
    comms
}

/// Runs `f(rank)` for every rank inside one group.
fn group(n: usize, mut f: impl FnMut(usize) -> fcclResult_t) -> fcclResult_t {
    ck(fcclGroupStart());
    for r in 0..n {
        let res = f(r);
        if res != fcclSuccess {
            fcclGroupEnd();
            return res;
        }
    }
    fcclGroupEnd()
}

#[test]
fn all_gather_axis_1_of_two_2x3_tensors_gives_2x6_rows() {
    let comms = init_all(2);
    let a = [0.0f32, 1., 2., 10., 11., 12.]; // rows [a0 a1 a2], [a10 a11 a12]
    let b = [100.0f32, 101., 102., 110., 111., 112.];
    let mut out = [[0.0f32; 12]; 2];
    let shape = [2usize, 3];
    // SAFETY: a, b and out[r] hold the 6 and 12 floats a 2x3 tensor gathered over 2 ranks needs, and they
    // outlive group(), whose fcclGroupEnd completes the calls (host memory).
    ck(group(2, |r| unsafe {
        let src = if r == 0 { a.as_ptr() } else { b.as_ptr() };
        fcclAllGatherAxis(src as _, out[r].as_mut_ptr() as _, 2, shape.as_ptr(), 1, fcclFloat32, comms[r], null_mut())
    }));
    let want = [0.0f32, 1., 2., 100., 101., 102., 10., 11., 12., 110., 111., 112.];
    assert_eq!(out[0], want);
    assert_eq!(out[1], want);
}

#[test]
fn reduce_scatter_axis_gives_each_rank_its_block_along_the_axis() {
    let n = 2;
    let comms = init_all(n);
    // Shape 3x4, axis 1: rank r gets columns 2r..2r+2 of the sum.
    let inputs: Vec<Vec<f64>> = (0..n).map(|r| (0..12).map(|i| (i * 10 + r) as f64).collect()).collect();
    let mut out = [[0.0f64; 6]; 2];
    let shape = [3usize, 4];
    // SAFETY: inputs[r] holds 12 doubles (shape 3x4), out[r] the 6 of this rank's block; both outlive
    // group(), whose fcclGroupEnd completes the calls.
    ck(group(n, |r| unsafe {
        fcclReduceScatterAxis(
            inputs[r].as_ptr() as _,
            out[r].as_mut_ptr() as _,
            2,
            shape.as_ptr(),
            1,
            fcclFloat64,
            fcclSum,
            comms[r],
            null_mut(),
        )
    }));
    for r in 0..n {
        for row in 0..3 {
            for c in 0..2 {
                let i = row * 4 + 2 * r + c;
                assert_eq!(out[r][row * 2 + c], (0..n).map(|q| (i * 10 + q) as f64).sum::<f64>());
            }
        }
    }
}

#[test]
fn all_gather_v_with_uneven_counts_and_a_mismatch() {
    let n = 3;
    let comms = init_all(n);
    let counts = [2usize, 0, 3];
    let displs = [0usize, 4, 6];
    let sends: Vec<Vec<i32>> = (0..n).map(|r| (0..counts[r]).map(|i| (r * 100 + i) as i32).collect()).collect();
    let mut out = [[-1i32; 9]; 3];
    // SAFETY: sends[r] holds counts[r] ints, out[r] the 9 that counts and displs address, counts and
    // displs one entry per rank; all outlive group(), whose fcclGroupEnd completes the calls.
    ck(group(n, |r| unsafe {
        fcclAllGatherV(
            sends[r].as_ptr() as _,
            counts[r],
            out[r].as_mut_ptr() as _,
            counts.as_ptr(),
            displs.as_ptr(),
            fcclInt32,
            comms[r],
            null_mut(),
        )
    }));
    for r in 0..n {
        assert_eq!(out[r], [0, 1, -1, -1, -1, -1, 200, 201, 202]);
    }
    // Rank 2 claims to send 2 elements while the others expect 3.
    // SAFETY: as above, rank 2 sending fewer elements than its buffer holds (the mismatch is
    // found before anything is written).
    let res = group(n, |r| unsafe {
        let sc = if r == 2 { 2 } else { counts[r] };
        fcclAllGatherV(
            sends[r].as_ptr() as _,
            sc,
            out[r].as_mut_ptr() as _,
            counts.as_ptr(),
            displs.as_ptr(),
            fcclInt32,
            comms[r],
            null_mut(),
        )
    });
    assert_eq!(res, fcclCollectiveMismatch);
}

#[test]
fn coalesced_all_reduce_matches_per_buffer_calls_bit_for_bit() {
    let n = 3;
    let comms = init_all(n);
    let counts: Vec<usize> = (0..200).map(|i| (i * 37) % 3000).collect();
    let data =
        |r: usize, b: usize| -> Vec<f32> { (0..counts[b]).map(|i| ((r * 7 + b * 3 + i) % 11) as f32 * 0.1).collect() };
    let sends: Vec<Vec<Vec<f32>>> = (0..n).map(|r| (0..counts.len()).map(|b| data(r, b)).collect()).collect();
    let mut coal: Vec<Vec<Vec<f32>>> = (0..n).map(|_| counts.iter().map(|&c| vec![0.0; c]).collect()).collect();
    let mut plain = coal.clone();
    std::thread::scope(|s| {
        for (r, out) in coal.iter_mut().enumerate() {
            let (c, sends, counts) = (comms[r] as usize, &sends[r], &counts);
            s.spawn(move || {
                let sp: Vec<*const f32> = sends.iter().map(|v| v.as_ptr()).collect();
                let rp: Vec<*mut f32> = out.iter_mut().map(|v| v.as_mut_ptr()).collect();
                // SAFETY: sp and rp point to counts.len() buffers of counts[b] floats each, which outlive the
                // blocking call, as do sp, rp and counts.
                ck(unsafe {
                    fcclAllReduceCoalesced(
                        sp.as_ptr() as _,
                        rp.as_ptr() as _,
                        counts.as_ptr(),
                        counts.len() as i32,
                        fcclFloat32,
                        fcclSum,
                        4096,
                        c as fcclComm_t,
                        null_mut(),
                    )
                });
            });
        }
    });
    for b in 0..counts.len() {
        // SAFETY: sends[r][b] and plain[r][b] hold counts[b] floats and outlive group(), whose
        // fcclGroupEnd completes the calls.
        ck(group(n, |r| unsafe {
            fcclAllReduce(
                sends[r][b].as_ptr() as _,
                plain[r][b].as_mut_ptr() as _,
                counts[b],
                fcclFloat32,
                fcclSum,
                comms[r],
                null_mut(),
            )
        }));
    }
    for r in 0..n {
        for b in 0..counts.len() {
            let (x, y): (Vec<u32>, Vec<u32>) =
                (coal[r][b].iter().map(|v| v.to_bits()).collect(), plain[r][b].iter().map(|v| v.to_bits()).collect());
            assert_eq!(x, y, "rank {r} buffer {b}");
        }
    }
}

#[test]
fn wire_all_reduce_stays_within_its_error_bound() {
    let n = 4;
    let comms = init_all(n);
    let count = 100_000;
    let x: Vec<Vec<f32>> =
        (0..n).map(|r| (0..count).map(|i| ((i * 7919 + r * 104729) % 1000) as f32 / 997.0 - 0.4).collect()).collect();
    let mut out = vec![vec![0.0f32; count]; n];
    // SAFETY: x[r] and out[r] hold count floats each and outlive group(), whose fcclGroupEnd
    // completes the calls.
    ck(group(n, |r| unsafe {
        fcclAllReduceWire(
            x[r].as_ptr() as _,
            out[r].as_mut_ptr() as _,
            count,
            fcclFloat32,
            fcclSum,
            fcclBfloat16,
            comms[r],
            null_mut(),
        )
    }));
    let u = 2f64.powi(-8);
    for i in 0..count {
        let exact: f64 = (0..n).map(|r| x[r][i] as f64).sum();
        let mag: f64 = (0..n).map(|r| (x[r][i] as f64).abs()).sum();
        let err = (out[0][i] as f64 - exact).abs();
        assert!(err <= (n as f64 + 1.0) * u * mag, "element {i}: {} vs {exact}", out[0][i]);
        for r in 1..n {
            assert_eq!(out[r][i].to_bits(), out[0][i].to_bits(), "ranks differ at {i}");
        }
    }
    // Unsupported: integer data.
    // SAFETY: x[0] and out[0] hold at least one element; the call refuses the integer type before reading them.
    let r = unsafe {
        fcclAllReduceWire(
            x[0].as_ptr() as _,
            out[0].as_mut_ptr() as _,
            1,
            fcclInt32,
            fcclSum,
            fcclBfloat16,
            comms[0],
            null_mut(),
        )
    };
    assert_eq!(r, fcclInvalidArgument);
}

#[test]
fn local_scatter_then_gather_round_trips() {
    let src: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let shape = [4usize, 6];
    for dim in 0..2 {
        let sizes = [1usize, 2, 3];
        let along = shape[dim];
        let chunk_sizes: Option<[usize; 3]> = if along == 6 { Some(sizes) } else { None };
        let lens: Vec<usize> = match chunk_sizes {
            Some(s) => s.to_vec(),
            None => vec![2, 1, 1],
        };
        let mut parts: Vec<Vec<f32>> = lens.iter().map(|&l| vec![0.0; l * 24 / along]).collect();
        let dsts: Vec<*mut f32> = parts.iter_mut().map(|p| p.as_mut_ptr()).collect();
        let devs = [-1i32; 3];
        // SAFETY: src holds 24 floats (shape 4x6), dsts points to 3 vectors sized for their chunks along
        // dim, devs and chunk_sizes have 3 entries; all outlive the call, which copies before it returns.
        ck(unsafe {
            fcclLocalScatter(
                src.as_ptr() as _,
                -1,
                2,
                shape.as_ptr(),
                dim as i32,
                fcclFloat32,
                chunk_sizes.as_ref().map_or(null(), |s| s.as_ptr()),
                dsts.as_ptr() as _,
                devs.as_ptr(),
                3,
            )
        });
        let mut back = vec![0.0f32; 24];
        let srcs: Vec<*const f32> = parts.iter().map(|p| p.as_ptr()).collect();
        // SAFETY: srcs points to the 3 chunks, lens and devs have 3 entries and back holds 24 floats; all
        // outlive the call, which copies before it returns.
        ck(unsafe {
            fcclLocalGather(
                srcs.as_ptr() as _,
                devs.as_ptr(),
                lens.as_ptr(),
                3,
                2,
                shape.as_ptr(),
                dim as i32,
                fcclFloat32,
                back.as_mut_ptr() as _,
                -1,
            )
        });
        assert_eq!(back, src, "dim {dim}");
    }
    // A device id needs CUDA.
    let mut d = [0u8; 4];
    let dp = [d.as_mut_ptr()];
    assert_eq!(
        // SAFETY: d, dp and the device list are 4 bytes, 1 and 1 entries that outlive the call, which
        // refuses the device id (no CUDA here) before it reads or writes them.
        unsafe { fcclLocalBroadcast(d.as_ptr() as _, 0, 4, dp.as_ptr() as _, [-1].as_ptr(), 1) },
        fcclUnavailable
    );
}
