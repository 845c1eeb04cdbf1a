//! Non-blocking communicators (`config.blocking = 0`) through the exported C
//! functions: creation, calls and groups that return fcclInProgress and finish on the
//! progress thread, errors reported by fcclCommGetAsyncError, abort and destroy with
//! work pending. Ranks are threads of this process.
#![allow(clippy::needless_range_loop)] // rank-indexed loops read clearer here

use ferroccl::ffi::*;
use std::ffi::CStr;
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

fn last_error() -> String {
    // SAFETY: fcclGetLastError returns a NUL-terminated string, copied before any other call.
    unsafe { CStr::from_ptr(fcclGetLastError(null_mut())) }.to_string_lossy().into_owned()
}

fn ck(r: fcclResult_t) {
    assert_eq!(r, fcclSuccess, "call failed with {r}: {}", last_error());
}

fn config(blocking: i32, timeout_ms: i32) -> fcclConfig_t {
    fcclConfig_t {
        size: std::mem::size_of::<fcclConfig_t>(),
        magic: FCCL_CONFIG_MAGIC,
        version: FCCL_CONFIG_VERSION,
        blocking,
        timeoutMs: timeout_ms,
        backend: FCCL_CONFIG_UNDEF_INT,
        commName: null(),
        checkMode: FCCL_CONFIG_UNDEF_INT,
    }
}

fn unique_id() -> fcclUniqueId {
    let mut id = fcclUniqueId { internal: [0; FCCL_UNIQUE_ID_BYTES] };
    // SAFETY: id is a local fcclUniqueId, written whole.
    ck(unsafe { fcclGetUniqueId(as_out(&mut id)) });
    id
}

fn status(c: fcclComm_t) -> fcclResult_t {
    let mut st = -1;
    // SAFETY: st is a local fcclResult_t; the handle is looked up, never trusted.
    ck(unsafe { fcclCommGetAsyncError(c, as_out(&mut st)) });
    st
}

/// Polls `c` as NCCL's documentation does until it is no longer in progress.
fn wait(c: fcclComm_t) -> fcclResult_t {
    let t0 = Instant::now();
    loop {
        let st = status(c);
        if st != fcclInProgress {
            return st;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "still in progress after 60 s");
        std::thread::yield_now();
    }
}

/// `r` is fcclInProgress (or fcclSuccess: already done), then `c` finishes without error.
fn finishes(r: fcclResult_t, c: fcclComm_t) {
    assert!(r == fcclInProgress || r == fcclSuccess, "call returned {r}: {}", last_error());
    let st = wait(c);
    assert_eq!(st, fcclSuccess, "async error {st}: {}", last_error());
}

/// One thread per rank; each creates its rank of a non-blocking communicator with
/// `timeout_ms`, waits for it, and runs `f(rank, comm)`.
fn nonblocking_ranks<T: Send>(n: usize, timeout_ms: i32, f: impl Fn(usize, fcclComm_t) -> T + Sync) -> Vec<T> {
    let id = unique_id();
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = (0..n)
            .map(|r| {
                s.spawn(move || {
                    let mut cfg = config(0, timeout_ms);
                    let mut c: fcclComm_t = null_mut();
                    // SAFETY: c is a local that receives the handle; cfg is a local fcclConfig_t that the call reads before it returns.
                    let res = unsafe { fcclCommInitRankConfig(as_out(&mut c), n as i32, id, r as i32, &mut cfg) };
                    assert_eq!(res, fcclInProgress, "non-blocking init: {}", last_error());
                    assert!(!c.is_null(), "the handle is written at once");
                    finishes(res, c);
                    f(r, c)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn calls_issued_back_to_back_run_in_order_and_are_right() {
    for n in [1usize, 2, 3] {
        nonblocking_ranks(n, 30_000, |r, c| {
            let count = 100_003usize;
            // Four all_reduces, then a broadcast over the first result, without waiting.
            let xs: Vec<Vec<f64>> = (0..4).map(|k| (0..count).map(|i| (r * 10 + k + i % 7) as f64).collect()).collect();
            let mut ys = vec![vec![0.0f64; count]; 4];
            for k in 0..4 {
                // SAFETY: xs[k] and ys[k] hold count doubles and live to the end of this closure, after
                // finishes() below has waited for every call queued on c.
                let res = unsafe {
                    fcclAllReduce(
                        xs[k].as_ptr() as _,
                        ys[k].as_mut_ptr() as _,
                        count,
                        fcclFloat64,
                        fcclSum,
                        c,
                        null_mut(),
                    )
                };
                assert!(res == fcclInProgress || res == fcclSuccess, "fcclAllReduce: {res}");
            }
            // In place over ys[0], queued behind the all_reduce that writes it.
            // SAFETY: ys[0] holds count doubles and outlives finishes(), which waits for this call.
            let res = unsafe {
                fcclBroadcast(ys[0].as_ptr() as _, ys[0].as_mut_ptr() as _, count, fcclFloat64, 0, c, null_mut())
            };
            finishes(res, c);
            for k in 0..4 {
                for i in [0, 1, 6, count / 2, count - 1] {
                    let want = (10 * n * (n - 1) / 2 + n * (k + i % 7)) as f64;
                    assert_eq!(ys[k][i], want, "n={n} rank {r} call {k} element {i}");
                }
            }
            // A group of sends and receives around the ring.
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            let send = vec![r as u32 + 1; 5000];
            let mut recv = vec![0u32; 5000];
            ck(fcclGroupStart());
            // SAFETY: send holds 5000 u32s and outlives the wait for the group below.
            ck(unsafe { fcclSend(send.as_ptr() as _, 5000, fcclUint32, next as i32, c, null_mut()) });
            // SAFETY: recv holds 5000 u32s and outlives the wait for the group below.
            ck(unsafe { fcclRecv(recv.as_mut_ptr() as _, 5000, fcclUint32, prev as i32, c, null_mut()) });
            let res = fcclGroupEnd();
            assert_eq!(res, fcclInProgress, "a group of non-blocking calls");
            finishes(res, c);
            assert!(recv.iter().all(|&v| v == prev as u32 + 1), "n={n} rank {r}: ring");
            // Finalize runs behind the queue, then only destroy is allowed.
            let mut x = [1.0f32];
            let res =
                // SAFETY: x holds the one float reduced in place and outlives the finalize below, which waits for this call.
                unsafe { fcclAllReduce(x.as_ptr() as _, x.as_mut_ptr() as _, 1, fcclFloat32, fcclSum, c, null_mut()) };
            assert!(res == fcclInProgress || res == fcclSuccess);
            // SAFETY: c is this rank's live handle; finalize only queues work on it.
            finishes(unsafe { fcclCommFinalize(c) }, c);
            assert_eq!(x[0], n as f32);
            let res =
                // SAFETY: x holds one float; the finalized communicator refuses the call before touching it.
                unsafe { fcclAllReduce(x.as_ptr() as _, x.as_mut_ptr() as _, 1, fcclFloat32, fcclSum, c, null_mut()) };
            assert_eq!(res, fcclInvalidUsage);
            assert!(last_error().contains("finalized"), "{}", last_error());
            // SAFETY: c is this rank's handle, not used after this.
            ck(unsafe { fcclCommDestroy(c) });
        });
    }
}

#[test]
fn the_caller_does_not_wait_for_its_peers() {
    // Rank 1 starts its all_reduce only after rank 0's call has returned and rank 0
    // has seen it in progress: a blocking call would never have returned.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    nonblocking_ranks(2, 30_000, |r, c| {
        let x = [r as i64 + 1; 64];
        let mut y = [0i64; 64];
        if r == 1 {
            rx.lock().unwrap().recv_timeout(Duration::from_secs(60)).expect("rank 0 never returned");
        }
        // SAFETY: x and y hold 64 ints each and outlive finishes(), which waits for this call.
        let res = unsafe { fcclAllReduce(x.as_ptr() as _, y.as_mut_ptr() as _, 64, fcclInt64, fcclSum, c, null_mut()) };
        if r == 0 {
            assert_eq!(res, fcclInProgress, "rank 0 finished an all_reduce its peer had not started");
            assert_eq!(status(c), fcclInProgress);
            assert_eq!(y[0], 0, "the result arrived before the peer called");
            tx.send(()).unwrap();
        }
        finishes(res, c);
        assert!(y.iter().all(|&v| v == 3), "rank {r}: {y:?}");
        // SAFETY: c is this rank's handle, not used after this.
        ck(unsafe { fcclCommDestroy(c) });
    });
}

#[test]
fn a_bad_argument_is_refused_at_once_and_queues_nothing() {
    nonblocking_ranks(2, 30_000, |r, c| {
        let x = [1.0f32; 4];
        let mut y = [0.0f32; 4];
        // SAFETY: x and y hold 4 floats; the root out of range is refused before anything is queued.
        let res = unsafe { fcclBroadcast(x.as_ptr() as _, y.as_mut_ptr() as _, 4, fcclFloat32, 7, c, null_mut()) };
        assert_eq!(res, fcclInvalidArgument);
        let msg = last_error();
        assert!(msg.starts_with("fcclBroadcast: root 7 out of range"), "{msg}");
        assert_eq!(status(c), fcclSuccess, "rank {r}: a refused call changed the communicator's state");
        // The communicator is fine: the next call pairs up on every rank.
        let res =
            // SAFETY: x and y hold 4 floats each and outlive finishes(), which waits for this call.
            unsafe { fcclAllReduce(x.as_ptr() as _, y.as_mut_ptr() as _, 4, fcclFloat32, fcclSum, c, null_mut()) };
        finishes(res, c);
        assert_eq!(y, [2.0; 4]);
        // SAFETY: c is this rank's handle, not used after this.
        ck(unsafe { fcclCommDestroy(c) });
    });
}

#[test]
fn an_error_on_the_progress_thread_is_reported_named_and_sticks() {
    nonblocking_ranks(2, 30_000, |r, c| {
        // Rank 0 sends 10 elements, rank 1 expects 20: both learn of the mismatch.
        let buf = [r as u8; 20];
        let mut got = [0u8; 20];
        let res = if r == 0 {
            // SAFETY: buf holds 20 bytes (10 sent) and outlives the wait(c) below, by which the send has ended.
            unsafe { fcclSend(buf.as_ptr() as _, 10, fcclUint8, 1, c, null_mut()) }
        } else {
            // SAFETY: got holds the 20 bytes asked for and outlives the wait(c) below.
            unsafe { fcclRecv(got.as_mut_ptr() as _, 20, fcclUint8, 0, c, null_mut()) }
        };
        assert!(res == fcclInProgress || res == fcclSuccess, "{res}");
        // Queued behind the failing call: must not run.
        let mut z = [5u8; 8];
        // SAFETY: z holds 8 bytes and outlives the wait(c) below; the call is dropped unrun after the failure.
        let res = unsafe { fcclAllReduce(z.as_ptr() as _, z.as_mut_ptr() as _, 8, fcclUint8, fcclSum, c, null_mut()) };
        assert!(res == fcclInProgress || res == fcclSuccess || res == fcclInvalidUsage, "{res}");
        let st = wait(c);
        assert_eq!(st, fcclCollectiveMismatch, "rank {r}: {}", last_error());
        let msg = last_error();
        let call = if r == 0 { "fcclSend: " } else { "fcclRecv: " };
        assert!(msg.starts_with(call), "rank {r}: the message names the call: {msg}");
        assert!(msg.contains("10") && msg.contains("20"), "rank {r}: {msg}");
        assert_eq!(z, [5; 8], "rank {r}: the call queued after the failure ran");
        // It sticks, and new calls are refused, naming it.
        assert_eq!(status(c), fcclCollectiveMismatch);
        // SAFETY: z holds 8 bytes; the failed communicator refuses the call before touching it.
        let res = unsafe { fcclAllReduce(z.as_ptr() as _, z.as_mut_ptr() as _, 8, fcclUint8, fcclSum, c, null_mut()) };
        assert_eq!(res, fcclInvalidUsage);
        assert!(last_error().contains("unusable after an earlier error"), "{}", last_error());
        // SAFETY: c is this rank's handle, not used after this.
        ck(unsafe { fcclCommDestroy(c) });
    });
}

#[test]
fn abort_ends_pending_work_at_once() {
    let id = unique_id();
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let peer = s.spawn(move || {
            let mut cfg = config(0, 60_000);
            let mut c: fcclComm_t = null_mut();
            // SAFETY: c is a local that receives the handle; cfg is read before the call returns.
            finishes(unsafe { fcclCommInitRankConfig(as_out(&mut c), 2, id, 1, &mut cfg) }, c);
            // Never calls; waits until rank 0 has aborted, then sees its peer gone.
            rx.recv_timeout(Duration::from_secs(60)).unwrap();
            let x = [1u8];
            let mut y = [0u8];
            let res =
                // SAFETY: x and y hold one byte each and outlive the wait(c) below, which ends the call.
                unsafe { fcclAllReduce(x.as_ptr() as _, y.as_mut_ptr() as _, 1, fcclUint8, fcclSum, c, null_mut()) };
            assert!(res == fcclInProgress || res == fcclSuccess, "{res}");
            let t0 = Instant::now();
            let st = wait(c);
            assert!(t0.elapsed() < Duration::from_secs(30), "the survivor waited for its timeout");
            assert_eq!(st, fcclRemoteError, "{}", last_error());
            // SAFETY: c is this rank's handle, not used after this.
            ck(unsafe { fcclCommDestroy(c) });
        });
        let mut cfg = config(0, 60_000);
        let mut c: fcclComm_t = null_mut();
        // SAFETY: c is a local that receives the handle; cfg is read before the call returns.
        finishes(unsafe { fcclCommInitRankConfig(as_out(&mut c), 2, id, 0, &mut cfg) }, c);
        let mut recv = vec![0u8; 1 << 20];
        // SAFETY: recv holds its 1 MiB and outlives the abort below, after which no call of c touches it.
        let res = unsafe { fcclRecv(recv.as_mut_ptr() as _, recv.len(), fcclUint8, 1, c, null_mut()) };
        assert_eq!(res, fcclInProgress);
        let x = [1u8];
        let mut y = [0u8];
        // SAFETY: x and y hold one byte each and outlive the abort below.
        let res = unsafe { fcclAllReduce(x.as_ptr() as _, y.as_mut_ptr() as _, 1, fcclUint8, fcclSum, c, null_mut()) };
        assert_eq!(res, fcclInProgress);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(status(c), fcclInProgress, "a receive with no sender finished");
        let t0 = Instant::now();
        // SAFETY: c is live; after abort returns, none of its calls touches recv or y any more.
        ck(unsafe { fcclCommAbort(c) });
        assert!(t0.elapsed() < Duration::from_secs(10), "abort took {:?}", t0.elapsed());
        // Nothing of the aborted calls writes any more; the queued all_reduce never ran.
        assert!(recv.iter().all(|&b| b == 0) && y[0] == 0);
        let mut st = 0;
        // SAFETY: st is a local; the released handle is only looked up, never dereferenced.
        assert_eq!(unsafe { fcclCommGetAsyncError(c, as_out(&mut st)) }, fcclInvalidArgument, "the handle is released");
        tx.send(()).unwrap();
        peer.join().unwrap();
    });
}

#[test]
fn destroy_waits_for_pending_work() {
    nonblocking_ranks(2, 30_000, |r, c| {
        let x = vec![r as f32 + 1.0; 1 << 18];
        let mut y = vec![0.0f32; 1 << 18];
        if r == 1 {
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: x and y hold 1 << 18 floats each and outlive the destroy below, which waits for this call.
        let res = unsafe {
            fcclAllReduce(x.as_ptr() as _, y.as_mut_ptr() as _, x.len(), fcclFloat32, fcclSum, c, null_mut())
        };
        assert!(res == fcclInProgress || res == fcclSuccess);
        // SAFETY: c is this rank's handle, not used after this.
        ck(unsafe { fcclCommDestroy(c) });
        assert!(y.iter().all(|&v| v == 3.0), "rank {r}: destroy returned before the call finished");
    });
}

#[test]
fn a_handle_being_created_is_refused_until_ready_and_a_failed_creation_says_why() {
    // Two ranks announced, one arrives: creation fails at the timeout.
    let id = unique_id();
    let mut cfg = config(0, 600);
    let mut c: fcclComm_t = null_mut();
    // SAFETY: c is a local that receives the handle; cfg is read before the call returns.
    let res = unsafe { fcclCommInitRankConfig(as_out(&mut c), 2, id, 0, &mut cfg) };
    assert_eq!(res, fcclInProgress);
    assert_eq!(status(c), fcclInProgress);
    let mut v = -1;
    // SAFETY: v is a local int; a handle still being created is refused before v is written.
    assert_eq!(unsafe { fcclCommCount(c, as_out(&mut v)) }, fcclInvalidUsage);
    assert!(last_error().contains("still being created") && last_error().contains("fcclCommGetAsyncError"));
    let x = [1u8];
    let mut y = [0u8];
    // SAFETY: x and y hold one byte; the handle being created is refused before anything is queued.
    let res = unsafe { fcclAllReduce(x.as_ptr() as _, y.as_mut_ptr() as _, 1, fcclUint8, fcclSum, c, null_mut()) };
    assert_eq!(res, fcclInvalidUsage);
    assert_eq!(v, -1);
    let st = wait(c);
    assert_eq!(st, fcclTimeout, "{}", last_error());
    let msg = last_error();
    assert!(msg.starts_with("fcclCommInitRankConfig: ") && msg.contains("1 of 2 ranks never arrived"), "{msg}");
    assert_eq!(status(c), fcclTimeout, "the error sticks");
    // SAFETY: v is a local int; the failed handle is refused before v is written.
    assert_eq!(unsafe { fcclCommCount(c, as_out(&mut v)) }, fcclInvalidUsage);
    assert!(last_error().contains("could not be created"), "{}", last_error());
    // SAFETY: c is the failed creation's handle, released here and only looked up afterwards.
    ck(unsafe { fcclCommDestroy(c) });
    // SAFETY: the released handle is only looked up, never dereferenced.
    assert_eq!(unsafe { fcclCommDestroy(c) }, fcclInvalidArgument);

    // Arguments are checked before anything starts: an error, and no handle.
    let mut bad: fcclComm_t = null_mut();
    // SAFETY: bad is a local; the rank out of range is refused before anything is written.
    let res = unsafe { fcclCommInitRankConfig(as_out(&mut bad), 2, id, 5, &mut cfg) };
    assert_eq!(res, fcclInvalidArgument);
    assert!(bad.is_null() && last_error().contains("rank 5 out of range"), "{}", last_error());

    // Abort while being created: released at once.
    let id = unique_id();
    let mut c: fcclComm_t = null_mut();
    // SAFETY: c is a local that receives the handle; cfg is read before the call returns.
    assert_eq!(unsafe { fcclCommInitRankConfig(as_out(&mut c), 2, id, 0, &mut cfg) }, fcclInProgress);
    let t0 = Instant::now();
    // SAFETY: c is the handle of a creation still running, which abort gives up.
    ck(unsafe { fcclCommAbort(c) });
    assert!(t0.elapsed() < Duration::from_millis(500), "abort waited for the creation");
    // SAFETY: v is a local int; the released handle is only looked up, never dereferenced.
    assert_eq!(unsafe { fcclCommCount(c, as_out(&mut v)) }, fcclInvalidArgument);
}

#[test]
fn one_thread_creates_and_drives_every_rank_in_groups() {
    // NCCL's pattern for one thread and several ranks: init in a group, poll each.
    let n = 4;
    let id = unique_id();
    let mut comms = vec![null_mut(); n];
    let mut cfg = config(0, 30_000);
    let solo = {
        let mut s: fcclComm_t = null_mut();
        // SAFETY: s is a local that receives the handle of a 1-rank communicator.
        ck(unsafe { fcclCommInitRank(as_out(&mut s), 1, unique_id(), 0) });
        s
    };
    ck(fcclGroupStart());
    for r in 0..n {
        // SAFETY: comms[r] is a slot of the vector, which outlives the group that creates the handles.
        ck(unsafe { fcclCommInitRankConfig(as_out(&mut comms[r]), n as i32, id, r as i32, &mut cfg) });
    }
    // Neither a blocking communicator's creation nor its calls mix in.
    let mut other: fcclComm_t = null_mut();
    // SAFETY: other is a local; the call is refused inside the group before anything is written.
    assert_eq!(unsafe { fcclCommInitRank(as_out(&mut other), 1, unique_id(), 0) }, fcclInvalidUsage);
    assert!(last_error().contains("creating a blocking communicator inside a group"), "{}", last_error());
    let x = [1i32];
    let mut y = [0i32];
    assert_eq!(
        // SAFETY: x and y hold one int; the blocking communicator's call is refused inside the group.
        unsafe { fcclAllReduce(x.as_ptr() as _, y.as_mut_ptr() as _, 1, fcclInt32, fcclSum, solo, null_mut()) },
        fcclInvalidUsage
    );
    assert!(last_error().starts_with("fcclAllReduce: fcclAllReduce on a blocking communicator"), "{}", last_error());
    assert_eq!(fcclGroupEnd(), fcclInProgress);
    for &c in &comms {
        assert_eq!(wait(c), fcclSuccess, "{}", last_error());
    }
    let xs: Vec<Vec<i32>> = (0..n).map(|r| vec![r as i32 + 1; 1000]).collect();
    let mut ys = vec![vec![0i32; 1000]; n];
    ck(fcclGroupStart());
    for r in 0..n {
        // SAFETY: xs[r] and ys[r] hold 1000 ints each and outlive the waits below, which end the
        // group's calls.
        ck(unsafe {
            fcclAllReduce(xs[r].as_ptr() as _, ys[r].as_mut_ptr() as _, 1000, fcclInt32, fcclSum, comms[r], null_mut())
        });
    }
    assert_eq!(fcclGroupEnd(), fcclInProgress);
    for r in 0..n {
        assert_eq!(wait(comms[r]), fcclSuccess);
        assert!(ys[r].iter().all(|&v| v == 10), "rank {r}");
    }
    for c in comms {
        // SAFETY: c is a handle of the group's creation, not used after this.
        ck(unsafe { fcclCommDestroy(c) });
    }
    // SAFETY: solo is the 1-rank handle, not used after this.
    ck(unsafe { fcclCommDestroy(solo) });
}

#[test]
fn a_non_blocking_split_of_a_blocking_communicator() {
    let n = 3;
    let mut comms = vec![null_mut(); n];
    // SAFETY: comms has room for the n handles written; devlist NULL makes host ranks.
    ck(unsafe { fcclCommInitAll(comms.as_mut_ptr(), n as i32, null()) });
    std::thread::scope(|s| {
        for (r, &c) in comms.iter().enumerate() {
            let c = c as usize;
            s.spawn(move || {
                let c = c as fcclComm_t;
                let mut cfg = config(0, 30_000);
                let color = if r == 2 { FCCL_SPLIT_NOCOLOR } else { 0 };
                let mut sub: fcclComm_t = null_mut();
                // SAFETY: sub is a local that receives the handle (or NULL); cfg is read before the call returns.
                let res = unsafe { fcclCommSplit(c, color, 0, as_out(&mut sub), &mut cfg) };
                let mut z = [1u8];
                if r == 2 {
                    assert!(res == fcclInProgress || res == fcclSuccess, "{res}");
                    assert!(sub.is_null());
                    assert_eq!(wait(c), fcclSuccess, "{}", last_error());
                    // SAFETY: z holds one byte reduced in place; c is blocking, so the call completes before it returns.
                    ck(unsafe {
                        fcclAllReduce(z.as_ptr() as _, z.as_mut_ptr() as _, 1, fcclUint8, fcclSum, c, null_mut())
                    });
                    assert_eq!(z, [3]);
                    return;
                }
                assert_eq!(res, fcclInProgress);
                assert!(!sub.is_null());
                assert_eq!(wait(sub), fcclSuccess, "{}", last_error());
                let (mut size, mut me) = (0, -1);
                // SAFETY: sub is ready (waited for); size is a local int.
                ck(unsafe { fcclCommCount(sub, as_out(&mut size)) });
                // SAFETY: as above; me is a local int.
                ck(unsafe { fcclCommUserRank(sub, as_out(&mut me)) });
                assert_eq!((size, me), (2, r as i32));
                // The child inherits non-blocking: its calls return at once.
                let x = [r as i32 + 1; 3];
                let mut y = [0i32; 3];
                // SAFETY: x and y hold 3 ints each and outlive the wait(sub) below, which ends this call.
                let res = unsafe {
                    fcclAllReduce(x.as_ptr() as _, y.as_mut_ptr() as _, 3, fcclInt32, fcclMax, sub, null_mut())
                };
                finishes(res, sub);
                assert_eq!(y, [2; 3]);
                // The parent stays blocking once its split has run.
                assert_eq!(wait(c), fcclSuccess);
                // SAFETY: z holds one byte; c is blocking again, so the call completes before it returns.
                ck(unsafe {
                    fcclAllReduce(z.as_ptr() as _, z.as_mut_ptr() as _, 1, fcclUint8, fcclSum, c, null_mut())
                });
                assert_eq!(z, [3]);
                // SAFETY: sub is this thread's split, not used after this.
                ck(unsafe { fcclCommDestroy(sub) });
            });
        }
    });
    // Rank 2 took part in the split only; its parent is still fine.
    for c in comms {
        assert_eq!(status(c), fcclSuccess);
        // SAFETY: c is a handle fcclCommInitAll wrote, not used after this.
        ck(unsafe { fcclCommDestroy(c) });
    }
}

#[test]
fn a_blocking_parent_refuses_calls_while_its_non_blocking_split_runs() {
    let mut comms = vec![null_mut(); 2];
    // SAFETY: comms has room for the 2 handles written; devlist NULL makes host ranks.
    ck(unsafe { fcclCommInitAll(comms.as_mut_ptr(), 2, null()) });
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    std::thread::scope(|s| {
        for (r, &c) in comms.iter().enumerate() {
            let (c, tx) = (c as usize, tx.clone());
            let rx = &rx;
            s.spawn(move || {
                let c = c as fcclComm_t;
                let mut cfg = config(0, 30_000);
                let mut sub: fcclComm_t = null_mut();
                if r == 1 {
                    // Splits only once rank 0 has seen its own split pending.
                    rx.lock().unwrap().recv_timeout(Duration::from_secs(60)).unwrap();
                }
                // SAFETY: sub is a local that receives the handle; cfg is read before the call returns.
                assert_eq!(unsafe { fcclCommSplit(c, 0, 0, as_out(&mut sub), &mut cfg) }, fcclInProgress);
                let mut x = [1i64];
                if r == 0 {
                    assert_eq!(status(sub), fcclInProgress);
                    // SAFETY: x holds one int64; the blocking parent refuses the call while its split is pending.
                    let res = unsafe {
                        fcclAllReduce(x.as_ptr() as _, x.as_mut_ptr() as _, 1, fcclInt64, fcclSum, c, null_mut())
                    };
                    assert_eq!(res, fcclInvalidUsage, "a blocking call ran beside the pending split");
                    assert!(last_error().contains("is still pending"), "{}", last_error());
                    tx.send(()).unwrap();
                }
                assert_eq!(wait(sub), fcclSuccess, "{}", last_error());
                assert_eq!(wait(c), fcclSuccess);
                // Both ranks' parents go on in step.
                // SAFETY: x holds one int64 reduced in place; c is blocking, so the call completes before it returns.
                ck(unsafe {
                    fcclAllReduce(x.as_ptr() as _, x.as_mut_ptr() as _, 1, fcclInt64, fcclSum, c, null_mut())
                });
                assert_eq!(x, [2]);
                // SAFETY: sub is this thread's split, not used after this.
                ck(unsafe { fcclCommDestroy(sub) });
            });
        }
    });
    for c in comms {
        // SAFETY: c is a handle fcclCommInitAll wrote, not used after this.
        ck(unsafe { fcclCommDestroy(c) });
    }
}

#[test]
fn a_split_queued_behind_a_failure_fails_its_new_communicator() {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    nonblocking_ranks(2, 30_000, |r, c| {
        let x = [1u8; 16];
        let mut y = [0u8; 16];
        if r == 1 {
            rx.lock().unwrap().recv_timeout(Duration::from_secs(60)).unwrap();
        }
        let res =
            // SAFETY: x and y hold 16 bytes, more than the 10 + r reduced, and outlive the wait(c) below.
            unsafe { fcclAllReduce(x.as_ptr() as _, y.as_mut_ptr() as _, 10 + r, fcclUint8, fcclSum, c, null_mut()) };
        assert_eq!(res, fcclInProgress);
        if r == 0 {
            // Queued behind the all_reduce that will fail.
            let mut sub: fcclComm_t = null_mut();
            // SAFETY: sub is a local that receives the handle; config NULL inherits the parent's.
            assert_eq!(unsafe { fcclCommSplit(c, 0, 0, as_out(&mut sub), null_mut()) }, fcclInProgress);
            tx.send(()).unwrap();
            assert_eq!(wait(sub), fcclInvalidUsage);
            assert!(last_error().contains("the split never ran"), "{}", last_error());
            // SAFETY: sub is the failed split's handle, not used after this.
            ck(unsafe { fcclCommDestroy(sub) });
        }
        assert_eq!(wait(c), fcclCollectiveMismatch, "{}", last_error());
        // SAFETY: c is this rank's handle, not used after this.
        ck(unsafe { fcclCommDestroy(c) });
    });
}
