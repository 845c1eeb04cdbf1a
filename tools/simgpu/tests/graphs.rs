//! Stream capture and graphs: recording instead of running, replay on every launch, and the
//! driver's refusals (prohibited calls, capture modes, the legacy stream, isolation, joins).
//! A capture in GLOBAL mode restricts every thread of the process, so each test runs in a
//! child process of its own.

mod common;
use common::*;
use cudarc::driver::sys::{
    CUgraph, CUgraphExec, CUgraphNode, CUstreamCaptureMode as Mode, CUstreamCaptureStatus as Status,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const NON_BLOCKING: u32 = 1;
const GLOBAL: Mode = Mode::CU_STREAM_CAPTURE_MODE_GLOBAL;
const THREAD_LOCAL: Mode = Mode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
const RELAXED: Mode = Mode::CU_STREAM_CAPTURE_MODE_RELAXED;
const UNSUPPORTED: CUresult = CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
const INVALIDATED: CUresult = CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;

/// Runs the test body in a child process (see the module comment).
fn isolated(test: &str, body: impl FnOnce()) {
    if !is_child(test) {
        assert_child_ok(&run_child(test, &[("FERROCCL_SIM_LATENCY_US", "1000")]));
        return;
    }
    body();
}

fn begin(s: CUstream, m: Mode) {
    // SAFETY: a stream of the test.
    ok(unsafe { cuStreamBeginCapture_v2(s, m) });
}

/// Ends the capture: the result and the graph (NULL on failure).
fn end(s: CUstream) -> (CUresult, CUgraph) {
    let mut g: CUgraph = 0x1 as CUgraph;
    // SAFETY: valid out-pointer.
    let r = unsafe { cuStreamEndCapture(s, &mut g) };
    (r, g)
}

fn status(s: CUstream) -> Status {
    let mut st = Status::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: valid out-pointer.
    ok(unsafe { cuStreamIsCapturing(s, &mut st) });
    st
}

fn instantiate(g: CUgraph) -> CUgraphExec {
    let mut e: CUgraphExec = std::ptr::null_mut();
    // SAFETY: valid out-pointer; a graph of the test.
    ok(unsafe { cuGraphInstantiateWithFlags(&mut e, g, 0) });
    e
}

fn nodes(g: CUgraph) -> usize {
    let mut n = 0usize;
    // SAFETY: valid out-pointer; NULL node array asks for the count.
    ok(unsafe { cuGraphGetNodes(g, std::ptr::null_mut::<CUgraphNode>(), &mut n) });
    n
}

fn memset(d: CUdeviceptr, v: u8, n: usize, s: CUstream) -> CUresult {
    // SAFETY: device memory of the test.
    unsafe { cuMemsetD8Async(d, v, n, s) }
}

fn word(p: *mut u8) -> &'static AtomicU32 {
    // SAFETY: pinned, 256-byte aligned memory the test keeps for the process's life.
    unsafe { &*(p as *const AtomicU32) }
}

#[test]
fn captured_work_is_recorded_not_run_and_replays_on_every_launch() {
    isolated("captured_work_is_recorded_not_run_and_replays_on_every_launch", || {
        let _c = Ctx::new(0);
        let n = 256;
        let (a, b) = (alloc(n), alloc(n));
        htod(a, &vec![0; n]);
        htod(b, &vec![0; n]);
        let flag = host_alloc(64);
        word(flag).store(0, Ordering::SeqCst);
        let gate = host_alloc(64);
        word(gate).store(0, Ordering::SeqCst);
        let s = stream(NON_BLOCKING);
        assert_eq!(status(s), Status::CU_STREAM_CAPTURE_STATUS_NONE);
        begin(s, GLOBAL);
        assert_eq!(status(s), Status::CU_STREAM_CAPTURE_STATUS_ACTIVE);
        // SAFETY: memory of the test, alive for the whole test.
        unsafe {
            ok(cuStreamWaitValue32_v2(s, gate as u64, 1, 0));
            ok(memset(a, 7, n, s));
            ok(cuMemcpyDtoDAsync_v2(b, a, n, s));
            ok(cuStreamWriteValue32_v2(s, flag as u64, 5, 0));
            let (mut st, mut id, mut g) = (Status::CU_STREAM_CAPTURE_STATUS_NONE, 0u64, std::ptr::null_mut());
            let (mut deps, mut edges, mut num) = (std::ptr::null(), std::ptr::dangling(), 0usize);
            ok(cuStreamGetCaptureInfo_v3(s, &mut st, &mut id, &mut g, &mut deps, &mut edges, &mut num));
            assert_eq!(st, Status::CU_STREAM_CAPTURE_STATUS_ACTIVE);
            assert!(id != 0 && !g.is_null() && !deps.is_null() && edges.is_null());
            assert_eq!(num, 1, "the next node depends on the last one recorded");
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(word(flag).load(Ordering::SeqCst), 0, "captured work must not run");
        let (r, g) = end(s);
        ok(r);
        assert!(!g.is_null());
        assert_eq!(nodes(g), 4);
        assert_eq!(status(s), Status::CU_STREAM_CAPTURE_STATUS_NONE);
        assert_eq!(dtoh(a, n), vec![0; n], "nothing ran at capture");
        let e = instantiate(g);
        for round in 1..=3u8 {
            htod(a, &vec![0; n]);
            htod(b, &vec![round; n]);
            word(flag).store(0, Ordering::SeqCst);
            word(gate).store(0, Ordering::SeqCst);
            // SAFETY: an instantiated graph and a stream of the test.
            ok(unsafe { cuGraphLaunch(e, s) });
            std::thread::sleep(Duration::from_millis(20));
            // SAFETY: as above.
            assert_eq!(unsafe { cuStreamQuery(s) }, CUresult::CUDA_ERROR_NOT_READY, "the replayed wait holds");
            word(gate).store(1, Ordering::SeqCst);
            // SAFETY: as above.
            ok(unsafe { cuStreamSynchronize(s) });
            assert_eq!(dtoh(b, n), vec![7; n], "replay {round}");
            assert_eq!(word(flag).load(Ordering::SeqCst), 5, "replay {round}");
        }
        // SAFETY: handles of the test.
        unsafe {
            ok(cuGraphExecDestroy(e));
            ok(cuGraphDestroy(g));
            assert_eq!(cuGraphLaunch(e, s), CUresult::CUDA_ERROR_INVALID_VALUE);
        }
    });
}

#[test]
fn synchronising_or_querying_during_capture_fails_and_invalidates_it() {
    isolated("synchronising_or_querying_during_capture_fails_and_invalidates_it", || {
        let _c = Ctx::new(0);
        let d = alloc(64);
        let s = stream(NON_BLOCKING);
        let host = [0u8; 64];
        let mut ev: CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        ok(unsafe { cuEventCreate(&mut ev, 0) });
        type Call<'a> = Box<dyn Fn() -> CUresult + 'a>;
        let cases: Vec<(&str, Call, CUresult)> = vec![
            // SAFETY: s is this test's stream, alive until the test ends; no pointers.
            ("cuStreamSynchronize", Box::new(|| unsafe { cuStreamSynchronize(s) }), UNSUPPORTED),
            // SAFETY: as above.
            ("cuStreamQuery", Box::new(|| unsafe { cuStreamQuery(s) }), UNSUPPORTED),
            // SAFETY: no arguments; the test's context is current.
            ("cuCtxSynchronize", Box::new(|| unsafe { cuCtxSynchronize() }), UNSUPPORTED),
            // SAFETY: host and d are 64 bytes each and outlive the call; during a capture
            // the driver refuses the copy before touching memory (the case's point), so
            // the immutable `host` is never written.
            ("cuMemcpyDtoH_v2", Box::new(|| unsafe { cuMemcpyDtoH_v2(host.as_ptr() as *mut _, d, 64) }), UNSUPPORTED),
            (
                "cuMemAlloc_v2",
                Box::new(|| {
                    let mut p = 0;
                    // SAFETY: p is a local CUdeviceptr, valid for the driver's one write.
                    unsafe { cuMemAlloc_v2(&mut p, 64) }
                }),
                UNSUPPORTED,
            ),
            // SAFETY: d is this test's allocation; the driver refuses the free during a
            // capture, so d stays valid for the cases after this one.
            ("cuMemFree_v2", Box::new(|| unsafe { cuMemFree_v2(d) }), UNSUPPORTED),
            (
                "cuEventQuery of a captured event",
                // SAFETY: ev and s are this test's event and stream, alive until it ends.
                Box::new(|| unsafe {
                    ok(cuEventRecord(ev, s));
                    cuEventQuery(ev)
                }),
                CUresult::CUDA_ERROR_CAPTURED_EVENT,
            ),
            (
                "an async copy from pageable memory",
                // SAFETY: host and d are 64 bytes each and outlive the test; the copy only
                // reads host.
                Box::new(|| unsafe { cuMemcpyHtoDAsync_v2(d, host.as_ptr().cast(), 64, s) }),
                UNSUPPORTED,
            ),
        ];
        for (what, call, want) in cases {
            begin(s, GLOBAL);
            ok(memset(d, 1, 64, s));
            assert_eq!(call(), want, "{what} during capture");
            assert_eq!(status(s), Status::CU_STREAM_CAPTURE_STATUS_INVALIDATED, "{what}");
            let (r, g) = end(s);
            assert_eq!(r, INVALIDATED, "{what}: ending an invalidated capture");
            assert!(g.is_null(), "{what}: no graph");
            assert_eq!(status(s), Status::CU_STREAM_CAPTURE_STATUS_NONE, "{what}: the stream left capture");
        }
        // The stream and the memory work as before.
        ok(memset(d, 9, 64, s));
        // SAFETY: as above.
        ok(unsafe { cuStreamSynchronize(s) });
        assert_eq!(dtoh(d, 64), vec![9; 64]);
    });
}

#[test]
fn capture_modes_decide_which_threads_may_make_unsafe_calls() {
    isolated("capture_modes_decide_which_threads_may_make_unsafe_calls", || {
        let c = Ctx::new(0);
        let ctx = c.0 as usize;
        let s = stream(NON_BLOCKING);
        let other = move |relax: bool| {
            std::thread::spawn(move || {
                // SAFETY: the test's context; valid out-pointers.
                unsafe {
                    ok(cuCtxSetCurrent(ctx as _));
                    if relax {
                        let mut m = RELAXED;
                        ok(cuThreadExchangeStreamCaptureMode(&mut m));
                        assert_eq!(m, GLOBAL, "a thread starts in GLOBAL mode");
                    }
                    let mut p = 0;
                    let r = cuMemAlloc_v2(&mut p, 64);
                    if r == OK {
                        ok(cuMemFree_v2(p));
                    }
                    r
                }
            })
            .join()
            .unwrap()
        };
        let mine = || {
            let mut p = 0;
            // SAFETY: valid out-pointer.
            let r = unsafe { cuMemAlloc_v2(&mut p, 64) };
            if r == OK {
                // SAFETY: allocated just now.
                unsafe { cuMemFree_v2(p) };
            }
            r
        };
        // GLOBAL: another thread in GLOBAL mode may not; one relaxed may.
        begin(s, GLOBAL);
        assert_eq!(other(true), OK);
        assert_eq!(status(s), Status::CU_STREAM_CAPTURE_STATUS_ACTIVE);
        assert_eq!(other(false), UNSUPPORTED);
        assert_eq!(end(s).0, INVALIDATED);
        // THREAD_LOCAL: other threads may; the capturing thread may not.
        begin(s, THREAD_LOCAL);
        assert_eq!(other(false), OK);
        assert_eq!(status(s), Status::CU_STREAM_CAPTURE_STATUS_ACTIVE);
        assert_eq!(mine(), UNSUPPORTED);
        assert_eq!(end(s).0, INVALIDATED);
        // RELAXED: anyone may.
        begin(s, RELAXED);
        assert_eq!(mine(), OK);
        assert_eq!(other(false), OK);
        ok(end(s).0);
        // The capturing thread relaxed itself: it may, in a GLOBAL capture.
        begin(s, GLOBAL);
        let mut m = RELAXED;
        // SAFETY: valid pointer.
        ok(unsafe { cuThreadExchangeStreamCaptureMode(&mut m) });
        assert_eq!(mine(), OK);
        // SAFETY: valid pointer.
        ok(unsafe { cuThreadExchangeStreamCaptureMode(&mut m) });
        assert_eq!(m, RELAXED);
        ok(end(s).0);
        // A capture in GLOBAL mode must end on the thread that began it.
        begin(s, GLOBAL);
        let sh = s as usize;
        let r = std::thread::spawn(move || {
            // SAFETY: the test's context and stream.
            unsafe {
                ok(cuCtxSetCurrent(ctx as _));
                let mut g = std::ptr::null_mut();
                cuStreamEndCapture(sh as _, &mut g)
            }
        })
        .join()
        .unwrap();
        assert_eq!(r, CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
        ok(end(s).0);
    });
}

#[test]
fn the_legacy_stream_and_capture_states_follow_the_driver() {
    isolated("the_legacy_stream_and_capture_states_follow_the_driver", || {
        let _c = Ctx::new(0);
        let d = alloc(64);
        // SAFETY: the streams are this test's (or the legacy NULL stream), d is a 64-byte
        // allocation that outlives them, and st and p are locals valid for one write each.
        unsafe {
            assert_eq!(cuStreamBeginCapture_v2(std::ptr::null_mut(), GLOBAL), UNSUPPORTED, "legacy stream");
            let s = stream(NON_BLOCKING);
            assert_eq!(end(s).0, CUresult::CUDA_ERROR_ILLEGAL_STATE, "not capturing");
            begin(s, RELAXED);
            assert_eq!(cuStreamBeginCapture_v2(s, RELAXED), CUresult::CUDA_ERROR_ILLEGAL_STATE, "twice");
            // A non-blocking capturing stream does not order with the legacy stream.
            ok(memset(d, 1, 64, std::ptr::null_mut()));
            ok(end(s).0);
            // A blocking one does: the legacy stream may not be used meanwhile.
            let b = stream(0);
            begin(b, RELAXED);
            let mut st = Status::CU_STREAM_CAPTURE_STATUS_NONE;
            assert_eq!(
                cuStreamIsCapturing(std::ptr::null_mut(), &mut st),
                CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
            );
            assert_eq!(status(b), Status::CU_STREAM_CAPTURE_STATUS_ACTIVE, "asking does not invalidate");
            assert_eq!(memset(d, 2, 64, std::ptr::null_mut()), CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
            assert_eq!(status(b), Status::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
            assert_eq!(end(b).0, INVALIDATED);
            // Stream-ordered allocation and legacy callbacks are refused in a capture here.
            begin(s, RELAXED);
            let mut p = 0;
            assert_eq!(cuMemAllocAsync(&mut p, 64, s), UNSUPPORTED);
            assert_eq!(end(s).0, INVALIDATED);
        }
    });
}

#[test]
fn captures_fork_and_join_through_captured_events_only() {
    isolated("captures_fork_and_join_through_captured_events_only", || {
        let _c = Ctx::new(0);
        let n = 64;
        let (a, b) = (alloc(n), alloc(n));
        let (s1, s2) = (stream(NON_BLOCKING), stream(NON_BLOCKING));
        let ev = || {
            let mut e: CUevent = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            ok(unsafe { cuEventCreate(&mut e, 0) });
            e
        };
        let (outside, fork, joined) = (ev(), ev(), ev());
        // SAFETY: the streams, events and graphs are this test's, created above and alive
        // until it ends; every copy and memset stays within a and b, n bytes each.
        unsafe {
            // Waiting for an event recorded outside the capture: isolation.
            ok(cuEventRecord(outside, s2));
            begin(s1, GLOBAL);
            assert_eq!(cuStreamWaitEvent(s1, outside, 0), CUresult::CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
            assert_eq!(end(s1).0, INVALIDATED);
            // A fork that is not joined back.
            begin(s1, GLOBAL);
            ok(memset(a, 1, n, s1));
            ok(cuEventRecord(fork, s1));
            ok(cuStreamWaitEvent(s2, fork, 0));
            assert_eq!(status(s2), Status::CU_STREAM_CAPTURE_STATUS_ACTIVE, "s2 joined the capture");
            ok(memset(b, 2, n, s2));
            let (r, g) = end(s1);
            assert_eq!(r, CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
            assert!(g.is_null());
            assert_eq!(status(s2), Status::CU_STREAM_CAPTURE_STATUS_NONE);
            // Fork and join: a graph of both streams' work.
            begin(s1, GLOBAL);
            ok(memset(a, 3, n, s1));
            ok(cuEventRecord(fork, s1));
            ok(cuStreamWaitEvent(s2, fork, 0));
            assert_eq!(end(s2).0, CUresult::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "s2 is not the origin");
            ok(cuMemcpyDtoDAsync_v2(b, a, n, s2));
            ok(cuEventRecord(joined, s2));
            ok(cuStreamWaitEvent(s1, joined, 0));
            let (r, g) = end(s1);
            ok(r);
            assert_eq!(nodes(g), 2);
            let e = instantiate(g);
            ok(cuGraphLaunch(e, s1));
            ok(cuStreamSynchronize(s1));
            assert_eq!(dtoh(b, n), vec![3; n]);
            // Two captures cannot be merged.
            begin(s1, GLOBAL);
            begin(s2, GLOBAL);
            ok(cuEventRecord(fork, s1));
            assert_eq!(cuStreamWaitEvent(s2, fork, 0), CUresult::CUDA_ERROR_STREAM_CAPTURE_MERGE);
            ok(end(s1).0);
            assert_eq!(end(s2).0, INVALIDATED);
        }
    });
}
