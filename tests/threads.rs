//! Thread-mode communicators (fcclCommInitAll) driven through the exported C functions.
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

fn destroy(comms: Vec<fcclComm_t>) {
    for c in comms {
        // SAFETY: c is a handle init_all made; the caller gives them up by passing them here.
        ck(unsafe { fcclCommDestroy(c) });
    }
}

#[test]
fn one_thread_drives_all_ranks_through_a_group() {
    for n in [1usize, 2, 3, 4, 7] {
        let comms = init_all(n);
        let count = 1_000_003usize;
        let send: Vec<Vec<f32>> = (0..n).map(|r| (0..count).map(|i| (r + i % 5) as f32).collect()).collect();
        let mut recv: Vec<Vec<f32>> = vec![vec![0.0; count]; n];
        ck(fcclGroupStart());
        for r in 0..n {
            // SAFETY: send[r] and recv[r] hold count floats each and outlive fcclGroupEnd below, which
            // completes the group's calls (host memory).
            ck(unsafe {
                fcclAllReduce(
                    send[r].as_ptr() as _,
                    recv[r].as_mut_ptr() as _,
                    count,
                    fcclFloat32,
                    fcclSum,
                    comms[r],
                    null_mut(),
                )
            });
        }
        ck(fcclGroupEnd());
        for r in 0..n {
            for i in [0, 1, 7, count / 2, count - 1] {
                let want = (n * (n - 1) / 2 + n * (i % 5)) as f32;
                assert_eq!(recv[r][i], want, "n={n} rank {r} element {i}");
            }
        }
        destroy(comms);
    }
}

#[test]
fn send_recv_ring_in_a_group_never_deadlocks() {
    let n = 4;
    let comms = init_all(n);
    let count = 3 << 20; // larger than any ring
    let send: Vec<Vec<u8>> = (0..n).map(|r| vec![r as u8 + 1; count]).collect();
    let mut recv: Vec<Vec<u8>> = vec![vec![0; count]; n];
    ck(fcclGroupStart());
    for r in 0..n {
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        // SAFETY: send[r] holds count bytes and outlives the fcclGroupEnd that completes the send.
        ck(unsafe { fcclSend(send[r].as_ptr() as _, count, fcclUint8, next as i32, comms[r], null_mut()) });
        // SAFETY: recv[r] holds count bytes and outlives the fcclGroupEnd that completes the receive.
        ck(unsafe { fcclRecv(recv[r].as_mut_ptr() as _, count, fcclUint8, prev as i32, comms[r], null_mut()) });
    }
    ck(fcclGroupEnd());
    for r in 0..n {
        let prev = (r + n - 1) % n;
        assert!(recv[r].iter().all(|&b| b == prev as u8 + 1));
    }
    destroy(comms);
}

#[test]
fn mismatched_send_recv_counts_fail_on_both_sides_and_the_comm_survives() {
    let comms = init_all(2);
    let a = [1u32; 8];
    let mut b = [0u32; 8];
    ck(fcclGroupStart());
    // SAFETY: a holds 8 u32s and outlives the fcclGroupEnd that completes (here: refuses) the send.
    ck(unsafe { fcclSend(a.as_ptr() as _, 8, fcclUint32, 1, comms[0], null_mut()) });
    // SAFETY: b holds 8 u32s, more than the 4 received; it outlives the fcclGroupEnd below.
    ck(unsafe { fcclRecv(b.as_mut_ptr() as _, 4, fcclUint32, 0, comms[1], null_mut()) });
    let r = fcclGroupEnd();
    assert_eq!(r, fcclCollectiveMismatch);
    // SAFETY: fcclGetLastError returns a NUL-terminated string, copied before any other call.
    let msg = unsafe { CStr::from_ptr(fcclGetLastError(null_mut())) }.to_string_lossy().into_owned();
    assert!(msg.contains("32 bytes") && msg.contains("16 bytes"), "{msg}");
    assert_eq!(b, [0u32; 8], "nothing written on a mismatch");
    // Still usable.
    ck(fcclGroupStart());
    // SAFETY: a holds 8 u32s and outlives the fcclGroupEnd that completes the send.
    ck(unsafe { fcclSend(a.as_ptr() as _, 8, fcclUint32, 1, comms[0], null_mut()) });
    // SAFETY: b holds the 8 u32s received and outlives the fcclGroupEnd that completes the receive.
    ck(unsafe { fcclRecv(b.as_mut_ptr() as _, 8, fcclUint32, 0, comms[1], null_mut()) });
    ck(fcclGroupEnd());
    assert_eq!(b, [1u32; 8]);
    destroy(comms);
}

#[test]
fn split_from_threads() {
    let n = 5;
    let comms = init_all(n);
    let results: Vec<(i32, i32, f64)> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, &c)| {
                let c = c as usize;
                s.spawn(move || {
                    let c = c as fcclComm_t;
                    let color = if r == 4 { FCCL_SPLIT_NOCOLOR } else { (r % 2) as i32 };
                    let mut nc: fcclComm_t = null_mut();
                    // SAFETY: c is this thread's rank of init_all; nc is a local that receives the new handle.
                    ck(unsafe { fcclCommSplit(c, color, -(r as i32), as_out(&mut nc), null_mut()) });
                    if r == 4 {
                        assert!(nc.is_null());
                        return (-1, -1, 0.0);
                    }
                    let (mut size, mut rank) = (0, 0);
                    // SAFETY: nc is the live handle the split wrote; size is a local int.
                    ck(unsafe { fcclCommCount(nc, as_out(&mut size)) });
                    // SAFETY: as above; rank is a local int.
                    ck(unsafe { fcclCommUserRank(nc, as_out(&mut rank)) });
                    let x = [r as f64];
                    let mut y = [0.0f64];
                    // SAFETY: x and y hold the one double the call moves and outlive it; a call outside a group completes before it returns.
                    ck(unsafe {
                        fcclAllReduce(x.as_ptr() as _, y.as_mut_ptr() as _, 1, fcclFloat64, fcclSum, nc, null_mut())
                    });
                    // SAFETY: nc is the split's handle, not used after this.
                    ck(unsafe { fcclCommDestroy(nc) });
                    (size, rank, y[0])
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Colour 0: old ranks 0, 2 (keys 0, -2: reversed); colour 1: 1, 3.
    assert_eq!(results[0], (2, 1, 2.0));
    assert_eq!(results[2], (2, 0, 2.0));
    assert_eq!(results[1], (2, 1, 4.0));
    assert_eq!(results[3], (2, 0, 4.0));
    destroy(comms);
}

#[test]
fn stale_and_null_handles_are_refused() {
    let comms = init_all(1);
    let stale = comms[0];
    // SAFETY: stale is the handle init_all made; it is destroyed here and only looked up afterwards.
    ck(unsafe { fcclCommDestroy(stale) });
    let mut n = 0;
    // SAFETY: n is a local int; the destroyed handle is only looked up, never dereferenced.
    assert_eq!(unsafe { fcclCommCount(stale, as_out(&mut n)) }, fcclInvalidArgument);
    // SAFETY: n is a local int; NULL is refused before any use.
    assert_eq!(unsafe { fcclCommCount(null_mut(), as_out(&mut n)) }, fcclInvalidArgument);
    // SAFETY: the destroyed handle is only looked up, never dereferenced.
    assert_eq!(unsafe { fcclCommDestroy(stale) }, fcclInvalidArgument);
    // SAFETY: fcclGetLastError returns a NUL-terminated string, copied before any other call.
    let msg = unsafe { CStr::from_ptr(fcclGetLastError(null_mut())) }.to_string_lossy().into_owned();
    assert!(msg.starts_with("fcclCommDestroy: ") && msg.contains("not a live communicator"), "{msg}");
}

#[test]
fn one_thread_creates_every_rank_inside_a_group() {
    let n = 3;
    let mut id = fcclUniqueId { internal: [0; FCCL_UNIQUE_ID_BYTES] };
    // SAFETY: id is a local fcclUniqueId, written whole.
    ck(unsafe { fcclGetUniqueId(as_out(&mut id)) });
    let mut comms = vec![null_mut(); n];
    ck(fcclGroupStart());
    for r in 0..n {
        // SAFETY: comms[r] is a slot of the vector, which outlives the group that fills the handle in.
        ck(unsafe { fcclCommInitRank(as_out(&mut comms[r]), n as i32, id, r as i32) });
    }
    // Not usable before the group ends.
    let mut size = 0;
    // SAFETY: size is a local int; the handle is checked before use (it is not ready yet).
    assert_eq!(unsafe { fcclCommCount(comms[0], as_out(&mut size)) }, fcclInvalidArgument);
    ck(fcclGroupEnd());
    let x: Vec<[f64; 2]> = (0..n).map(|r| [r as f64, 1.0]).collect();
    let mut y = vec![[0.0f64; 2]; n];
    ck(fcclGroupStart());
    for r in 0..n {
        // SAFETY: x[r] and y[r] hold the 2 doubles the call moves and outlive the fcclGroupEnd below,
        // which completes the group's calls.
        ck(unsafe {
            fcclAllReduce(x[r].as_ptr() as _, y[r].as_mut_ptr() as _, 2, fcclFloat64, fcclSum, comms[r], null_mut())
        });
    }
    ck(fcclGroupEnd());
    for r in 0..n {
        assert_eq!(y[r], [3.0, 3.0]);
        // SAFETY: comms[r] is live (the group ended); size is a local int.
        ck(unsafe { fcclCommUserRank(comms[r], as_out(&mut size)) });
        assert_eq!(size, r as i32);
    }
    destroy(comms);
}

/// Runs `f(rank, comm)` on one thread per rank and returns the results by rank.
fn per_rank<T: Send>(comms: &[fcclComm_t], f: impl Fn(usize, fcclComm_t) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, &c)| {
                let c = c as usize;
                s.spawn(move || f(r, c as fcclComm_t))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn last_error() -> String {
    // SAFETY: fcclGetLastError returns a NUL-terminated string, copied before any other call.
    unsafe { CStr::from_ptr(fcclGetLastError(null_mut())) }.to_string_lossy().into_owned()
}

#[test]
fn all_to_allv_counts_disagreeing_with_an_all_zero_rank_fail_everywhere() {
    // Rank 0 sends and expects nothing; rank 1 sends rank 0 three elements. Both must
    // report the mismatch (nobody waits forever), move no data, and stay usable.
    let comms = init_all(2);
    let out = per_rank(&comms, |r, c| {
        let send = [7i32; 8];
        let mut recv = [0i32; 8];
        let (sc, rc): ([usize; 2], [usize; 2]) = if r == 0 { ([0, 0], [0, 0]) } else { ([3, 1], [0, 1]) };
        let displs = [0usize, 4];
        // SAFETY: send and recv hold 8 ints, more than any count and displacement below addresses; sc,
        // rc and displs have an entry per rank (2); all outlive the blocking call.
        let res = unsafe {
            fcclAlltoAllv(
                send.as_ptr() as _,
                sc.as_ptr(),
                displs.as_ptr(),
                recv.as_mut_ptr() as _,
                rc.as_ptr(),
                displs.as_ptr(),
                fcclInt32,
                c,
                null_mut(),
            )
        };
        let msg = last_error();
        let mut y = [1.0f32; 2];
        // SAFETY: y holds the 2 floats reduced in place and outlives the blocking call.
        ck(unsafe { fcclAllReduce(y.as_ptr() as _, y.as_mut_ptr() as _, 2, fcclFloat32, fcclSum, c, null_mut()) });
        (res, msg, recv, y[0])
    });
    for (r, (res, msg, recv, y)) in out.into_iter().enumerate() {
        assert_eq!(res, fcclCollectiveMismatch, "rank {r}: {msg}");
        assert!(msg.contains("sendcounts[0] = 3") && msg.contains("recvcounts[1] = 0"), "rank {r}: {msg}");
        assert_eq!(recv, [0; 8], "rank {r}: no data moves on a mismatch");
        assert_eq!(y, 2.0, "rank {r}");
    }
    destroy(comms);
}

#[test]
fn all_to_allv_with_one_rank_over_the_board_limit_moves_the_right_data() {
    // Rank 0 sends 20000 ints (80 KB: more than a board slot) to rank 1; every other
    // block is small. The counts are agreed on the board, the data goes over the links.
    for n in [2usize, 3] {
        let comms = init_all(n);
        let big = 20_000usize;
        let count = |from: usize, to: usize| if from == 0 && to == 1 { big } else { 3 + from + 2 * to };
        let out = per_rank(&comms, |r, c| {
            let sc: Vec<usize> = (0..n).map(|p| count(r, p)).collect();
            let rc: Vec<usize> = (0..n).map(|p| count(p, r)).collect();
            let sd: Vec<usize> = sc.iter().scan(0, |a, &k| Some(std::mem::replace(a, *a + k))).collect();
            let rd: Vec<usize> = rc.iter().scan(0, |a, &k| Some(std::mem::replace(a, *a + k))).collect();
            let send: Vec<i32> =
                (0..n).flat_map(|p| (0..sc[p]).map(move |i| (r * 1_000_000 + p * 100_000 + i) as i32)).collect();
            let mut recv = vec![-1i32; rc.iter().sum()];
            // SAFETY: send and recv hold the sums of sc and rc, which sd and rd (one entry per rank) offset
            // into; all outlive the blocking call.
            ck(unsafe {
                fcclAlltoAllv(
                    send.as_ptr() as _,
                    sc.as_ptr(),
                    sd.as_ptr(),
                    recv.as_mut_ptr() as _,
                    rc.as_ptr(),
                    rd.as_ptr(),
                    fcclInt32,
                    c,
                    null_mut(),
                )
            });
            (recv, rd)
        });
        for (r, (recv, rd)) in out.into_iter().enumerate() {
            for p in 0..n {
                for i in 0..count(p, r) {
                    assert_eq!(
                        recv[rd[p] + i],
                        (p * 1_000_000 + r * 100_000 + i) as i32,
                        "n={n} rank {r} from {p} [{i}]"
                    );
                }
            }
        }
        destroy(comms);
    }
}

/// fcclSend of up to 64 KiB goes eagerly (count and payload in one message), larger
/// ones announce their count first. Whichever way each side's count falls, a
/// mismatch fails the send and the receive, writes nothing, and the next exchange
/// works; matching counts on both sides of the threshold move the data.
#[test]
fn send_recv_counts_across_the_eager_limit() {
    let comms = init_all(2);
    let elems = |bytes: usize| bytes / 4;
    // (sender's bytes, receiver's bytes)
    let cases = [(16, 32), (1024, 100 << 10), (100 << 10, 1024), (200 << 10, 100 << 10), (64 << 10, (64 << 10) + 4)];
    for (sb, rb) in cases {
        let out = per_rank(&comms, |r, c| {
            let send: Vec<u32> = (0..elems(sb) as u32).collect();
            let mut recv = vec![u32::MAX; elems(rb)];
            let res = if r == 0 {
                // SAFETY: send holds elems(sb) u32s and outlives the blocking call.
                unsafe { fcclSend(send.as_ptr() as _, elems(sb), fcclUint32, 1, c, null_mut()) }
            } else {
                // SAFETY: recv holds elems(rb) u32s and outlives the blocking call.
                unsafe { fcclRecv(recv.as_mut_ptr() as _, elems(rb), fcclUint32, 0, c, null_mut()) }
            };
            let msg = last_error();
            assert!(
                recv.iter().all(|&x| x == u32::MAX),
                "rank {r}: nothing written on a mismatch ({sb} vs {rb} bytes)"
            );
            // Still usable: the matching exchange of the same size both ways.
            let mut back = vec![0u32; elems(sb)];
            ck(fcclGroupStart());
            // SAFETY: send holds elems(sb) u32s and outlives the fcclGroupEnd that completes the send.
            ck(unsafe { fcclSend(send.as_ptr() as _, elems(sb), fcclUint32, 1 - r as i32, c, null_mut()) });
            // SAFETY: back holds elems(sb) u32s and outlives the fcclGroupEnd that completes the receive.
            ck(unsafe { fcclRecv(back.as_mut_ptr() as _, elems(sb), fcclUint32, 1 - r as i32, c, null_mut()) });
            ck(fcclGroupEnd());
            assert_eq!(back, send, "rank {r}: exchange of {sb} bytes after the mismatch");
            (res, msg)
        });
        for (r, (res, msg)) in out.iter().enumerate() {
            assert_eq!(*res, fcclCollectiveMismatch, "rank {r}, {sb} vs {rb} bytes: {msg}");
            assert!(msg.contains(&format!("{sb} bytes")) && msg.contains(&format!("{rb} bytes")), "{msg}");
        }
    }
    destroy(comms);
}

/// 2-rank all_reduce large enough to reduce in place between the two buffers
/// (thread ranks map each other's): right with both ranks in place, and with
/// one in place and the other not (which then both take the pipelined path),
/// for a float sum, an integer max and an average.
#[test]
fn two_rank_all_reduce_is_right_in_place_and_mixed() {
    let comms = init_all(2);
    let count = (1usize << 20) + 3;
    for (in_place, dt, op) in [
        ([true, true], fcclFloat32, fcclSum),
        ([true, false], fcclFloat32, fcclSum),
        ([false, true], fcclInt32, fcclMax),
        ([true, true], fcclInt32, fcclMax),
        ([true, true], fcclFloat64, fcclAvg),
    ] {
        let es = if dt == fcclFloat64 { 8 } else { 4 };
        let value = |r: usize, i: usize| ((i % 1013) * (r + 2) + r) as i64;
        let fill = |r: usize| -> Vec<u8> {
            (0..count)
                .flat_map(|i| {
                    let v = value(r, i);
                    match dt {
                        x if x == fcclFloat32 => (v as f32).to_le_bytes().to_vec(),
                        x if x == fcclFloat64 => (v as f64).to_le_bytes().to_vec(),
                        _ => (v as i32).to_le_bytes().to_vec(),
                    }
                })
                .collect()
        };
        let mut send: Vec<Vec<u8>> = (0..2).map(fill).collect();
        let mut recv: Vec<Vec<u8>> = vec![vec![0u8; count * es]; 2];
        ck(fcclGroupStart());
        for r in 0..2 {
            let s = send[r].as_mut_ptr();
            let d = if in_place[r] { s } else { recv[r].as_mut_ptr() };
            // SAFETY: send[r] and recv[r] hold count elements of dt (count * es bytes), d being s in place;
            // they outlive the fcclGroupEnd below, which completes the group's calls.
            ck(unsafe { fcclAllReduce(s as _, d as _, count, dt, op, comms[r], null_mut()) });
        }
        ck(fcclGroupEnd());
        for r in 0..2 {
            let out = if in_place[r] { &send[r] } else { &recv[r] };
            for i in [0, 1, 4095, count / 2, count - 1] {
                let (a, b) = (value(0, i), value(1, i));
                let got = &out[i * es..(i + 1) * es];
                let ok = match dt {
                    x if x == fcclFloat32 => f32::from_le_bytes(got.try_into().unwrap()) == (a + b) as f32,
                    x if x == fcclFloat64 => f64::from_le_bytes(got.try_into().unwrap()) == (a + b) as f64 / 2.0,
                    _ => i32::from_le_bytes(got.try_into().unwrap()) as i64 == a.max(b),
                };
                assert!(ok, "in place {in_place:?}, type {dt}, op {op}: rank {r} element {i} is {got:?}");
            }
        }
    }
    destroy(comms);
}

/// all_to_all with one rank in place and the other not pairs up at every block
/// size: a single piece against a whole block (16 KiB), offers then one piece (64
/// KiB) or several (100 KB, 1.2 MB); and with both in place (swapped) or both out
/// of place.
#[test]
fn all_to_all_with_one_rank_in_place_is_right() {
    let comms = init_all(2);
    for count in [4_000usize, 16_384, 25_000, 300_000] {
        for in_place in [[true, false], [false, true], [true, true], [false, false]] {
            let mut send: Vec<Vec<f32>> =
                (0..2).map(|r| (0..2 * count).map(|i| (r * 10_000_000 + i) as f32).collect()).collect();
            let mut recv: Vec<Vec<f32>> = vec![vec![0.0; 2 * count]; 2];
            ck(fcclGroupStart());
            for r in 0..2 {
                let s = send[r].as_mut_ptr();
                let d = if in_place[r] { s } else { recv[r].as_mut_ptr() };
                // SAFETY: send[r] and recv[r] hold the 2 * count floats an all-to-all of 2 ranks moves, d being s
                // in place; they outlive the fcclGroupEnd below.
                ck(unsafe { fcclAlltoAll(s as _, d as _, count, fcclFloat32, comms[r], null_mut()) });
            }
            ck(fcclGroupEnd());
            for r in 0..2 {
                let out = if in_place[r] { &send[r] } else { &recv[r] };
                for q in 0..2 {
                    for i in [0, 1, count / 2, count - 1] {
                        let want = (q * 10_000_000 + r * count + i) as f32;
                        assert_eq!(
                            out[q * count + i],
                            want,
                            "count {count}, {in_place:?}: rank {r} block {q} element {i}"
                        );
                    }
                }
            }
        }
    }
    destroy(comms);
}

/// One group per rank: fcclSend of `count` bytes at `buf + send_at` to rank r+1
/// and fcclRecv of `count` bytes at `buf + recv_at` from rank r-1, where rank r's
/// buffer starts as `fill(r)` (`in_place[r]` false: the receive goes to a buffer of
/// its own). Returns every rank's buffer and receive buffer afterwards.
fn shift_in_place(
    n: usize,
    count: usize,
    send_at: usize,
    recv_at: usize,
    in_place: &[bool],
    fill: &(dyn Fn(usize) -> Vec<u8> + Sync),
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let comms = init_all(n);
    let mut bufs: Vec<Vec<u8>> = (0..n).map(fill).collect();
    let mut own: Vec<Vec<u8>> = vec![vec![0xEE; count]; n];
    let b: Vec<usize> = bufs.iter_mut().map(|b| b.as_mut_ptr() as usize).collect();
    let o: Vec<usize> = own.iter_mut().map(|b| b.as_mut_ptr() as usize).collect();
    per_rank(&comms, |r, c| {
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let s = (b[r] + send_at) as *const std::ffi::c_void;
        let d = if in_place[r] { (b[r] + recv_at) as *mut std::ffi::c_void } else { o[r] as _ };
        ck(fcclGroupStart());
        // SAFETY: s points send_at bytes into rank r's buffer, which the callers size to hold count bytes
        // from there; bufs outlives the fcclGroupEnd that completes the send.
        ck(unsafe { fcclSend(s, count, fcclUint8, next as i32, c, null_mut()) });
        // SAFETY: d points recv_at bytes into rank r's buffer (sized as above) or to its own buffer of
        // count bytes; both outlive the fcclGroupEnd that completes the receive.
        ck(unsafe { fcclRecv(d, count, fcclUint8, prev as i32, c, null_mut()) });
        ck(fcclGroupEnd());
    });
    destroy(comms);
    (bufs, own)
}

#[test]
fn send_and_recv_in_one_buffer_send_what_it_held() {
    // Each fcclSend sends what its buffer held when the group ended, and its
    // fcclRecv writes only its own range: exactly in place (a ring shift, at 2 ranks
    // an exchange, which may swap the buffers), and overlapping below and above
    // the send's range. Sizes: eager, through the rings, larger than any ring.
    let fill = |r: usize| -> Vec<u8> { (0..(4 << 20) + 5000).map(|i| (r * 37 + i % 251 + i / 65536) as u8).collect() };
    for n in [2usize, 3, 4] {
        for count in [100usize, 40_000, 300_001, (3 << 20) + 5] {
            for (send_at, recv_at) in [(0, 0), (1000, 0), (0, 1000), (2000, 2000)] {
                let (bufs, _) = shift_in_place(n, count, send_at, recv_at, &vec![true; n], &fill);
                for r in 0..n {
                    let (prev, orig) = ((r + n - 1) % n, fill(r));
                    let want = &fill(prev)[send_at..send_at + count];
                    let what = format!("{n} ranks, {count} bytes, send at {send_at}, recv at {recv_at}, rank {r}");
                    assert!(bufs[r][recv_at..recv_at + count] == *want, "{what}: received range");
                    assert!(bufs[r][..recv_at] == orig[..recv_at], "{what}: before the received range");
                    let end = recv_at + count;
                    assert!(bufs[r][end..] == orig[end..], "{what}: after the received range");
                }
            }
        }
    }
    // At 2 ranks one rank in place, its peer not (an exchange only one side makes).
    for count in [100usize, 300_001, (3 << 20) + 5] {
        for in_place in [[true, false], [false, true]] {
            let (bufs, own) = shift_in_place(2, count, 0, 0, &in_place, &fill);
            for r in 0..2 {
                let got = if in_place[r] { &bufs[r][..count] } else { &own[r][..] };
                assert!(got == &fill(1 - r)[..count], "{count} bytes, in place {in_place:?}: rank {r} received");
                if !in_place[r] {
                    assert!(bufs[r] == fill(r), "{count} bytes: rank {r}'s send buffer changed");
                }
            }
        }
    }
}

/// all_reduce, reduce, reduce_scatter and broadcast with the root in place of 64 KiB
/// and more at 3 and 4 ranks, and reduce and out-of-place all_reduce of 512 KiB and
/// more at 2, run straight
/// between the ranks' buffers (`backend::host::mapped`; the other calls check the
/// links): every rank takes pieces of the whole vector, reduces them from every
/// rank's input (or reads the root's) and writes them into the recvbuffs that take
/// them. Checked at every element, with every rank in place, none, or every other
/// one; lengths that end in a partial piece; a narrow float averaged (accumulated in
/// float32, rounded once), integers summed, doubles maxed; reduce and broadcast
/// rooted at the last rank.
#[test]
fn large_collectives_between_the_buffers_are_right_in_every_placement() {
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum K {
        AllReduce,
        Reduce,
        ReduceScatter,
        Broadcast,
    }
    let value = |r: usize, i: usize| ((i * 7 + r * 13) % 61) as i64 - 20;
    for n in [2usize, 3, 4] {
        let comms = init_all(n);
        let root = n - 1;
        for kind in [K::AllReduce, K::Reduce, K::ReduceScatter, K::Broadcast] {
            for (dt, op, es, kib) in [
                (fcclInt32, fcclSum, 4, 600),
                (fcclFloat16, fcclAvg, 2, 600),
                (fcclFloat64, fcclMax, 8, 600),
                (fcclInt32, fcclSum, 4, 100),
                (fcclFloat16, fcclAvg, 2, 100),
            ] {
                // About `kib` KiB in all: one partial piece, or several and a partial one.
                let count = if kind == K::ReduceScatter { (kib << 10) / (n * es) + 17 } else { (kib << 10) / es + 3 };
                let total = if kind == K::ReduceScatter { count * n } else { count };
                let enc = |v: f64| -> Vec<u8> {
                    match dt {
                        x if x == fcclInt32 => (v as i32).to_le_bytes().to_vec(),
                        x if x == fcclFloat16 => half::f16::from_f32(v as f32).to_le_bytes().to_vec(),
                        _ => v.to_le_bytes().to_vec(),
                    }
                };
                let want = |i: usize| -> Vec<u8> {
                    let vs: Vec<i64> = (0..n).map(|r| value(r, i)).collect();
                    if kind == K::Broadcast {
                        return enc(vs[root] as f64);
                    }
                    match dt {
                        x if x == fcclInt32 => enc(vs.iter().sum::<i64>() as f64),
                        // float32 sum of exact halves, divided in float32, rounded once.
                        x if x == fcclFloat16 => enc((vs.iter().sum::<i64>() as f32 / n as f32) as f64),
                        _ => enc(*vs.iter().max().unwrap() as f64),
                    }
                };
                for placement in ["out", "in", "mixed"] {
                    let in_place = |r: usize| placement == "in" || (placement == "mixed" && r % 2 == 1);
                    let outs = per_rank(&comms, |r, c| {
                        let mut send: Vec<u8> = (0..total).flat_map(|i| enc(value(r, i) as f64)).collect();
                        let mut recv = vec![0xa5u8; count * es];
                        let s = send.as_mut_ptr();
                        let block = if kind == K::ReduceScatter { r * count * es } else { 0 };
                        // SAFETY: send holds total = n * count elements for a reduce_scatter, so the block at r * count * es is in it.
                        let d = if in_place(r) { unsafe { s.add(block) } } else { recv.as_mut_ptr() };
                        // SAFETY: send holds total elements and recv count (d being s, or the rank's block of s, in
                        // place); both outlive the blocking call, which completes before it returns.
                        ck(unsafe {
                            match kind {
                                K::AllReduce => fcclAllReduce(s as _, d as _, count, dt, op, c, null_mut()),
                                K::Reduce => fcclReduce(s as _, d as _, count, dt, op, root as i32, c, null_mut()),
                                K::ReduceScatter => fcclReduceScatter(s as _, d as _, count, dt, op, c, null_mut()),
                                K::Broadcast => fcclBroadcast(s as _, d as _, count, dt, root as i32, c, null_mut()),
                            }
                        });
                        if in_place(r) {
                            send[block..block + count * es].to_vec()
                        } else {
                            recv
                        }
                    });
                    for (r, out) in outs.iter().enumerate() {
                        if kind == K::Reduce && r != root {
                            continue;
                        }
                        let first = if kind == K::ReduceScatter { r * count } else { 0 };
                        for i in 0..count {
                            assert_eq!(
                                &out[i * es..(i + 1) * es],
                                &want(first + i)[..],
                                "{n} ranks, {kind:?}, {count} of type {dt}, op {op}, {placement}: rank {r} element {i}"
                            );
                        }
                    }
                }
            }
        }
        destroy(comms);
    }
}
