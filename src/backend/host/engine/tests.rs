//! The engine's tests: direct messages, split copies, exchanges between two buffers
//! and in-place send/receive, between thread ranks.

use super::exchange::swap_offers;
use super::split::share_pieces;
use super::*;
use crate::backend::host::plan::Plan;
use crate::coll::counts::P2pCall;
use crate::mem::reduce;
use crate::transport::inproc;
use crate::types::{DataType, RedOp};
use std::cell::Cell;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

// The defaults the tests are sized by.
const SPLIT_MIN: usize = Plan::DEFAULT.split_min;
const SPLIT_PIECE: usize = Plan::DEFAULT.split_piece;
const EAGER_MAX: usize = Plan::DEFAULT.eager_max;
const GATED_MIN: usize = Plan::DEFAULT.gated_min;

thread_local! {
    /// Pieces of split copies this thread copied as the sender.
    pub(super) static SENDER_PIECES: Cell<u64> = const { Cell::new(0) };
    /// The receiver leaves every piece of a split copy to the sender.
    pub(super) static RECEIVER_IDLE: Cell<bool> = const { Cell::new(false) };
    /// This thread's rank says it cannot swap (its offers carry address 0).
    pub(super) static SWAP_REFUSED: Cell<bool> = const { Cell::new(false) };
    /// This thread's rank sends nothing by address (as over links without
    /// single copy).
    pub(super) static DIRECT_REFUSED: Cell<bool> = const { Cell::new(false) };
    /// Bytes this thread's gated receives of messages sent by address read
    /// (see `rx::gated_piece`).
    pub(super) static GATED_READ: Cell<usize> = const { Cell::new(0) };
}

/// One direct message of `len` bytes from rank 0 to rank 1 of a thread pair,
/// into a sink of `kind` (0 copy, 1 streaming copy, 2 sum reduction); the bytes
/// rank 1 ends with and the pieces rank 0 copied.
fn one_message(len: usize, kind: u8, idle: bool) -> (Vec<u8>, Vec<u8>, u64) {
    let (src, dst, _, pieces) = one_message_tee(len, kind, idle, false);
    (src, dst, pieces)
}

/// As [`one_message`]; with `tee`, the sender also wants the message in a
/// buffer of its own (a broadcast root out of place), which comes back fourth.
fn one_message_tee(len: usize, kind: u8, idle: bool, tee: bool) -> (Vec<u8>, Vec<u8>, Vec<u8>, u64) {
    let ts = inproc::build(2).expect("links");
    let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 65536) as u8).collect();
    let mut dst = vec![1u8; len];
    let mut own = vec![2u8; if tee { len } else { 0 }];
    let abort = AtomicBool::new(false);
    let pieces = std::thread::scope(|s| {
        let mut it = ts.into_iter();
        let (mut t0, mut t1) = (it.next().unwrap(), it.next().unwrap());
        let (src, dst, own, abort) = (&src, &mut dst, &mut own, &abort);
        let ctl = move || RunCtl { timeout: Duration::from_secs(20), abort, what: &|| "test".to_string() };
        let sender = s.spawn(move || {
            SENDER_PIECES.with(|c| c.set(0));
            let mut sched = Schedule::new(1);
            if tee {
                sched.send_tee(1, src.as_ptr(), len, own.as_mut_ptr(), kind == 1);
            } else {
                sched.send(1, src.as_ptr(), len, &[]);
            }
            assert!(run(&mut t0, &mut sched, &ctl()).expect("send").is_none());
            SENDER_PIECES.with(|c| c.get())
        });
        s.spawn(move || {
            RECEIVER_IDLE.with(|c| c.set(idle));
            let p = dst.as_mut_ptr();
            let sink = match kind {
                0 => Sink::Copy(p),
                1 => Sink::Stream(p),
                _ => Sink::Reduce { acc: p, dtype: DataType::Uint8, op: RedOp::Sum },
            };
            let mut sched = Schedule::new(1);
            sched.recv(0, len, sink, &[]);
            assert!(run(&mut t1, &mut sched, &ctl()).expect("recv").is_none());
        });
        sender.join().expect("sender")
    });
    (src, dst, own, pieces)
}

/// A receiver that leaves every piece to the sender gets the whole message,
/// the last piece short included, copied by the sender alone.
#[test]
fn the_sender_can_copy_every_piece() {
    for (len, kind) in [(SPLIT_MIN, 0), (5 * SPLIT_PIECE + 12_344, 1), (3 << 20, 0)] {
        let (src, dst, pieces) = one_message(len, kind, true);
        assert!(dst == src, "{len} bytes, sink {kind}");
        assert_eq!(pieces, share_pieces(len), "{len} bytes: the sender copied every piece");
    }
}

/// A sender that wants its own copy of a large message (a broadcast root out of
/// place) leaves it to the pieces: whoever copies a piece writes both
/// destinations, the sender alone when the receiver is idle; both exact.
#[test]
fn the_senders_own_copy_is_written_with_the_pieces() {
    for (len, kind, idle) in [(SPLIT_MIN, 0, true), (5 * SPLIT_PIECE + 12_344, 1, false), (6 << 20, 0, false)] {
        let (src, dst, own, pieces) = one_message_tee(len, kind, idle, true);
        assert!(dst == src && own == src, "{len} bytes, sink {kind}, idle {idle}");
        if idle {
            assert_eq!(pieces, share_pieces(len), "{len} bytes: the sender copied every piece");
        }
    }
    // Below a split copy's size the sender copies its own alone, as before.
    let (src, dst, own, pieces) = one_message_tee(SPLIT_MIN - 8, 0, true, true);
    assert!(dst == src && own == src);
    assert_eq!(pieces, 0);
}

/// Both sides take pieces: the result is exact whoever copied what.
#[test]
fn sender_and_receiver_split_a_copy_exactly() {
    for len in [SPLIT_MIN + 8, 16 << 20] {
        for _ in 0..5 {
            let (src, dst, pieces) = one_message(len, 0, false);
            assert!(dst == src, "{len} bytes");
            assert!(pieces <= share_pieces(len));
        }
    }
}

/// One in-place exchange of `len` bytes between the blocks of a thread pair
/// (`Schedule::swap`, with the exchange through the rings as the fallback).
/// Rank 1 offers (it leaves every piece to rank 0 when `idle`); rank `refuse`
/// says it cannot swap. Whether each rank ends with the other's block, and the
/// pieces rank 0 swapped.
fn one_swap(len: usize, idle: bool, refuse: Option<usize>) -> (bool, u64) {
    let pattern = |r: usize| -> Vec<u8> { (0..len).map(|i| (i * (3 + 4 * r) + i / 4099 + r) as u8).collect() };
    let (bufs, pieces) = one_exchange(len, Exchange::Swap, idle, refuse, pattern, false, [false; 2]);
    (bufs[0] == pattern(1) && bufs[1] == pattern(0), pieces)
}

/// As [`one_swap`], for an fcclSend and an fcclRecv of each rank with the other
/// over its one buffer (rank 0 posts the receive first).
fn one_p2p_swap(len: usize, idle: bool, refuse: Option<usize>) -> (bool, u64) {
    let pattern = |r: usize| -> Vec<u8> { (0..len).map(|i| (i * (5 + 2 * r) + i / 4093 + r) as u8).collect() };
    let (bufs, pieces) = one_exchange(len, Exchange::Swap, idle, refuse, pattern, true, [false; 2]);
    (bufs[0] == pattern(1) && bufs[1] == pattern(0), pieces)
}

/// One in-place exchange `how` of `len` bytes between the blocks of a thread
/// pair, which start as `pattern(rank)`: both blocks after it, and the pieces
/// rank 0 took. As for [`one_swap`] otherwise.
fn one_exchange(
    len: usize,
    how: Exchange,
    idle: bool,
    refuse: Option<usize>,
    pattern: impl Fn(usize) -> Vec<u8>,
    p2p: bool,
    apart: [bool; 2],
) -> ([Vec<u8>; 2], u64) {
    assert!(swap_offers(1, 0) && !swap_offers(0, 1));
    let ts = inproc::build(2).expect("links");
    // A rank `apart` (out of place) starts with its input in a buffer of its own
    // and junk in its block.
    let inputs: Vec<Vec<u8>> = (0..2).map(|r| if apart[r] { pattern(r) } else { Vec::new() }).collect();
    let mut bufs = [0, 1].map(|r| if apart[r] { vec![0xA5; len] } else { pattern(r) });
    let inputs = &inputs;
    let abort = AtomicBool::new(false);
    let pieces = std::thread::scope(|s| {
        let abort = &abort;
        let ctl = move || RunCtl { timeout: Duration::from_secs(20), abort, what: &|| "test".to_string() };
        let handles: Vec<_> = ts
            .into_iter()
            .zip(bufs.iter_mut())
            .enumerate()
            .map(|(r, (mut t, buf))| {
                s.spawn(move || {
                    SENDER_PIECES.with(|c| c.set(0));
                    RECEIVER_IDLE.with(|c| c.set(idle && r == 1));
                    SWAP_REFUSED.with(|c| c.set(refuse == Some(r)));
                    let (peer, at) = (1 - r, buf.as_mut_ptr());
                    let src = if apart[r] { inputs[r].as_ptr() } else { at as *const u8 };
                    let mut sched = Schedule::new(1);
                    if p2p {
                        let what = |send| P2pCall { send, count: len, dtype: DataType::Uint8, peer, refused: false };
                        if r == 0 {
                            sched.p2p_recv(peer, at, len, what(false));
                        }
                        sched.p2p_send(peer, at, len, what(true));
                        if r == 1 {
                            sched.p2p_recv(peer, at, len, what(false));
                        }
                        assert!(run(&mut t, &mut sched, &ctl()).expect("exchange").is_none());
                        return SENDER_PIECES.with(|c| c.get());
                    }
                    sched.swap(
                        peer,
                        Block { at, src, len },
                        how,
                        |_| {},
                        |s| {
                            for a in (0..len).step_by(64 << 10) {
                                let m = (64 << 10).min(len - a);
                                // SAFETY: inside the block.
                                let p = unsafe { at.add(a) };
                                let sent = s.send_staged(peer, p, m, &[]);
                                s.recv(peer, m, Sink::Copy(p), &[sent]);
                            }
                        },
                    );
                    assert!(run(&mut t, &mut sched, &ctl()).expect("swap").is_none());
                    SENDER_PIECES.with(|c| c.get())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank")).next().expect("rank 0")
    });
    (bufs, pieces)
}

/// A reducing exchange leaves the reduction in both blocks, whoever reduced
/// which piece, the helper alone included (int32 max, float32 sum, float64 avg).
#[test]
fn reducing_exchanges_leave_the_result_in_both_blocks() {
    let ints = |r: usize, n: usize| -> Vec<i64> {
        (0..n as i64).map(|i| (i * 7919 + r as i64 * 104_729) % 100_003 - 50_000).collect()
    };
    for (dtype, op, es) in
        [(DataType::Int32, RedOp::Max, 4), (DataType::Float32, RedOp::Sum, 4), (DataType::Float64, RedOp::Avg, 8)]
    {
        for (len, idle) in [(SPLIT_MIN + 8, false), (5 << 20, false), (3 * SPLIT_PIECE + 16, true)] {
            let n = len / es;
            let bytes = |r: usize| -> Vec<u8> {
                ints(r, n)
                    .into_iter()
                    .flat_map(|v| match dtype {
                        DataType::Int32 => (v as i32).to_le_bytes().to_vec(),
                        DataType::Float32 => (v as f32 * 0.25).to_le_bytes().to_vec(),
                        _ => (v as f64 * 0.5).to_le_bytes().to_vec(),
                    })
                    .collect()
            };
            let (bufs, pieces) =
                one_exchange(len, Exchange::Reduce { dtype, op, stream: false }, idle, None, bytes, false, [false; 2]);
            let mut want = bytes(0);
            reduce::reduce_inplace(dtype, op, &mut want, &bytes(1));
            reduce::finish_inplace(dtype, op, 2, &mut want);
            assert!(bufs[0] == want && bufs[1] == want, "{dtype} {op:?}, {len} bytes, idle offerer {idle}");
            if idle {
                assert_eq!(pieces, share_pieces(len), "the helper reduced every piece");
            }
        }
    }
}

/// Out of place on either rank or both, a reducing exchange reads each input
/// where it is and leaves the reduction in both blocks, whoever reduced which
/// piece (the helper alone included).
#[test]
fn reductions_out_of_place_leave_the_result_in_both_blocks() {
    let (dtype, op) = (DataType::Int32, RedOp::Sum);
    let ints = |r: usize, len: usize| -> Vec<u8> {
        (0..len / 4).flat_map(|i| ((i as i32).wrapping_mul(7919) ^ (r as i32 * 104_729)).to_le_bytes()).collect()
    };
    for apart in [[true, true], [true, false], [false, true]] {
        for (len, idle) in [(SPLIT_MIN + 8, false), (3 << 20, false), (3 * SPLIT_PIECE + 16, true)] {
            let how = Exchange::Reduce { dtype, op, stream: true };
            let (bufs, pieces) = one_exchange(len, how, idle, None, |r| ints(r, len), false, apart);
            let mut want = ints(0, len);
            reduce::reduce_inplace(dtype, op, &mut want, &ints(1, len));
            assert!(bufs[0] == want && bufs[1] == want, "out of place {apart:?}, {len} bytes, idle {idle}");
            if idle {
                assert_eq!(pieces, share_pieces(len), "the helper reduced every piece");
            }
        }
    }
}

/// Both ranks swap pieces of the pair of blocks: exact whoever swapped what,
/// over and over, the last piece short included.
#[test]
fn swaps_exchange_blocks_exactly() {
    for len in [SPLIT_MIN, 5 * SPLIT_PIECE + 12_344, 16 << 20] {
        for _ in 0..3 {
            let (exact, pieces) = one_swap(len, false, None);
            assert!(exact, "{len} bytes");
            assert!(pieces <= share_pieces(len));
        }
    }
}

/// An offerer that leaves every piece to its peer still ends with the peer's
/// block: the peer swapped them all, into both buffers.
#[test]
fn the_helper_can_swap_every_piece() {
    for len in [SPLIT_MIN, 3 * SPLIT_PIECE + 8] {
        let (exact, pieces) = one_swap(len, true, None);
        assert!(exact, "{len} bytes");
        assert_eq!(pieces, share_pieces(len), "{len} bytes: rank 0 swapped every piece");
    }
}

/// When either rank cannot swap, both exchange through the rings instead (the
/// offerer's idleness, which would stall a swap, does not matter then).
#[test]
fn a_rank_that_cannot_swap_makes_both_exchange_through_the_rings() {
    for refuse in [0, 1] {
        for len in [SPLIT_MIN, 3 << 20] {
            let (exact, pieces) = one_swap(len, true, Some(refuse));
            assert!(exact, "{len} bytes, rank {refuse} refusing");
            assert_eq!(pieces, 0, "no swap");
        }
    }
}

/// An fcclSend and an fcclRecv with one peer over one buffer, on both ranks,
/// swap the two buffers: exactly, whoever swapped which piece (the helper alone
/// included); when either rank cannot swap, through the rings, each receive
/// writing only what its own send has sent, still exactly.
#[test]
fn in_place_send_recv_pairs_swap_or_go_through_the_rings() {
    for len in [EAGER_MAX + 1, 5 * SPLIT_PIECE + 12_344, 9 << 20] {
        let (exact, pieces) = one_p2p_swap(len, false, None);
        assert!(exact, "{len} bytes");
        assert!(pieces <= share_pieces(len));
        let (exact, pieces) = one_p2p_swap(len, true, None);
        assert!(exact, "{len} bytes, idle offerer");
        assert_eq!(pieces, share_pieces(len), "{len} bytes: rank 0 swapped every piece");
        for refuse in [0, 1] {
            let (exact, pieces) = one_p2p_swap(len, true, Some(refuse));
            assert!(exact, "{len} bytes, rank {refuse} refusing");
            assert_eq!(pieces, 0, "no swap");
        }
    }
}

/// A ring of thread ranks shifts messages several times larger than the rings
/// (256 KiB) and than a gated receive reads ahead (GATED_AHEAD) through one
/// buffer each, the receive at or below the send (which waits for the send's
/// progress) or above it (the send's payload is copied aside): never
/// deadlocks, and every rank ends with its predecessor's message and the rest
/// of its buffer untouched. Thread ranks could swap, but at 3 and 4 ranks nobody
/// exchanges with one peer. Sent by address (the receive at or below the send
/// then reads ahead of its gate, and reads every byte that way), by address on
/// some ranks only, and through the rings.
#[test]
fn in_place_ring_shifts_larger_than_the_rings_finish_right() {
    let len = GATED_MIN + (1 << 20) + 4;
    let fill = |r: usize| -> Vec<u8> { (0..len + 8192).map(|i| (i % 253 + 31 * r + i / 9973) as u8).collect() };
    for (n, refused) in [(3usize, 0b000), (4, 0b0000), (3, 0b111), (4, 0b1111), (4, 0b0101), (3, 0b001)] {
        for (send_at, recv_at) in [(0, 0), (8192, 0), (4096, 1000), (0, 5000)] {
            let ts = inproc::build_with_ring(n, 256 << 10).expect("links");
            let mut bufs: Vec<Vec<u8>> = (0..n).map(fill).collect();
            let abort = AtomicBool::new(false);
            std::thread::scope(|s| {
                let abort = &abort;
                for ((r, mut t), buf) in ts.into_iter().enumerate().zip(bufs.iter_mut()) {
                    // Ranks that share cores, as where in-place sends go by address.
                    t.policy = crate::transport::wait::SpinPolicy::for_ranks(n, 1);
                    s.spawn(move || {
                        let ctl = RunCtl { timeout: Duration::from_secs(20), abort, what: &|| "test".to_string() };
                        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                        let what =
                            |send, peer| P2pCall { send, count: len, dtype: DataType::Uint8, peer, refused: false };
                        let base = buf.as_mut_ptr();
                        let mut sched = Schedule::new(1);
                        // SAFETY: both ranges lie inside the buffer (len + 8192 bytes).
                        unsafe {
                            sched.p2p_recv(prev, base.add(recv_at), len, what(false, prev));
                            sched.p2p_send(next, base.add(send_at), len, what(true, next));
                        }
                        DIRECT_REFUSED.with(|c| c.set(refused & (1 << r) != 0));
                        GATED_READ.with(|c| c.set(0));
                        assert!(run(&mut t, &mut sched, &ctl).expect("ring shift").is_none());
                        // A gated receive of a message sent by address reads all of it.
                        let by_address = refused & (1 << prev) == 0 && recv_at <= send_at;
                        let gated = GATED_READ.with(|c| c.get());
                        assert_eq!(gated, if by_address { len } else { 0 }, "{n} ranks, rank {r}");
                        DIRECT_REFUSED.with(|c| c.set(false));
                    });
                }
            });
            for (r, buf) in bufs.iter().enumerate() {
                let (own, theirs) = (fill(r), fill((r + n - 1) % n));
                let what = format!("{n} ranks, send at {send_at}, receive at {recv_at}, rank {r}");
                assert!(buf[recv_at..recv_at + len] == theirs[send_at..send_at + len], "{what}: received");
                assert!(buf[..recv_at] == own[..recv_at], "{what}: before");
                assert!(buf[recv_at + len..] == own[recv_at + len..], "{what}: after");
            }
        }
    }
}

/// Below SPLIT_MIN, and into reductions, the receiver reads alone (no offer is
/// made, so an idle receiver still finishes).
#[test]
fn small_messages_and_reductions_are_not_shared() {
    let (src, dst, pieces) = one_message(SPLIT_MIN - 8, 0, true);
    assert!(dst == src);
    assert_eq!(pieces, 0);
    let (src, dst, pieces) = one_message(SPLIT_MIN * 2, 2, true);
    assert!(dst.iter().zip(&src).all(|(d, s)| *d == s.wrapping_add(1)), "1 + src");
    assert_eq!(pieces, 0);
}

/// A group of 16k fcclSend and 16k fcclRecv with one peer, each pair over the same
/// 64 bytes of one buffer (an exchange in place, message by message): every rank
/// ends with the peer's buffer. (The overlaps are found by sorting: `inplace`.)
#[test]
fn a_group_of_many_sends_and_receives_in_place_moves_every_message() {
    const K: usize = 16 << 10;
    const N: usize = 64;
    let ts = inproc::build(2).expect("links");
    let abort = AtomicBool::new(false);
    let fill = |r: usize| -> Vec<u8> { (0..K * N).map(|i| (i * 31 + i / 4099 + 101 * r) as u8).collect() };
    let mut bufs: Vec<Vec<u8>> = (0..2).map(fill).collect();
    std::thread::scope(|s| {
        let abort = &abort;
        for ((r, mut t), buf) in ts.into_iter().enumerate().zip(bufs.iter_mut()) {
            s.spawn(move || {
                let ctl = RunCtl { timeout: Duration::from_secs(60), abort, what: &|| "test".to_string() };
                let peer = 1 - r;
                let what = |send| P2pCall { send, count: N, dtype: DataType::Uint8, peer, refused: false };
                let base = buf.as_mut_ptr();
                let mut sched = Schedule::new(1);
                for i in 0..K {
                    // SAFETY: every message lies inside the buffer (K * N bytes).
                    unsafe {
                        sched.p2p_send(peer, base.add(i * N), N, what(true));
                        sched.p2p_recv(peer, base.add(i * N), N, what(false));
                    }
                }
                assert!(run(&mut t, &mut sched, &ctl).expect("run").is_none());
            });
        }
    });
    assert!(bufs[0] == fill(1) && bufs[1] == fill(0), "every rank ends with its peer's messages");
}

/// A send that must be copied aside (a receive of the group starts above it in
/// the same buffer) when there is no memory for the copy: the run fails on both
/// ranks with fcclSystemError naming the size and saying the communicator is
/// unusable, before anything was sent; the process lives on.
#[test]
fn a_copy_aside_without_memory_fails_the_run_not_the_process() {
    use crate::mem::fallible::FAIL_ABOVE;
    // Larger than anything the process-wide pool may hold from other tests.
    let len = (100 << 20) + 8;
    let ts = inproc::build(2).expect("links");
    let abort = AtomicBool::new(false);
    std::thread::scope(|s| {
        let abort = &abort;
        for (r, mut t) in ts.into_iter().enumerate() {
            s.spawn(move || {
                let ctl = RunCtl { timeout: Duration::from_secs(20), abort, what: &|| "test".to_string() };
                let peer = 1 - r;
                let what = |send| P2pCall { send, count: len, dtype: DataType::Uint8, peer, refused: false };
                let mut buf = vec![0u8; len + 8];
                let base = buf.as_mut_ptr();
                let mut sched = Schedule::new(1);
                // SAFETY: both ranges lie inside the buffer.
                unsafe {
                    sched.p2p_send(peer, base, len, what(true));
                    sched.p2p_recv(peer, base.add(8), len, what(false));
                }
                FAIL_ABOVE.with(|c| c.set(1 << 20));
                let res = run(&mut t, &mut sched, &ctl);
                FAIL_ABOVE.with(|c| c.set(usize::MAX));
                let e = res.expect_err("no memory for the copy");
                assert_eq!(e.code, crate::error::Code::SystemError, "{}", e.msg);
                assert!(e.msg.contains(&format!("cannot allocate {len} bytes")), "{}", e.msg);
                assert!(e.msg.contains("the communicator is unusable now"), "{}", e.msg);
            });
        }
    });
}

/// A send/recv pair whose one side was refused (its stream is being captured: the
/// handshake alone, one byte, flagged): the peer's matching calls fail at once with
/// fcclInvalidUsage naming the capture, for an eager size and a size that waits for the
/// receiver's count, and both sides refused fail both; nothing reaches the peer's buffer.
#[test]
fn a_refused_side_fails_its_peer_at_once() {
    for (len, refusers) in [(64, [true, false]), (1 << 20, [true, false]), (1 << 20, [false, true]), (64, [true, true])]
    {
        let ts = inproc::build(2).expect("links");
        let abort = AtomicBool::new(false);
        let started = std::time::Instant::now();
        std::thread::scope(|s| {
            let abort = &abort;
            for (r, mut t) in ts.into_iter().enumerate() {
                s.spawn(move || {
                    let ctl = RunCtl { timeout: Duration::from_secs(30), abort, what: &|| "test".to_string() };
                    let peer = 1 - r;
                    let refused = refusers[r];
                    let n = if refused { 1 } else { len };
                    let what = |send| P2pCall { send, count: n, dtype: DataType::Uint8, peer, refused };
                    let src = vec![7u8; n];
                    let mut dst = vec![0u8; n];
                    let mut sched = Schedule::new(1);
                    sched.p2p_send(peer, src.as_ptr(), n, what(true));
                    sched.p2p_recv(peer, dst.as_mut_ptr(), n, what(false));
                    let e = run(&mut t, &mut sched, &ctl).expect("no fatal error").expect("the pair fails");
                    if !refused {
                        assert_eq!(e.code, crate::error::Code::InvalidUsage, "{}", e.msg);
                        assert!(e.msg.contains("captured into a CUDA graph"), "{}", e.msg);
                        assert!(e.msg.contains(&format!("rank {peer} called its side")), "{}", e.msg);
                    }
                    assert!(dst.iter().all(|&b| b == 0), "nothing reaches a buffer of a refused pair");
                });
            }
        });
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{len} bytes: the peer failed only after {:?}",
            started.elapsed()
        );
    }
}
