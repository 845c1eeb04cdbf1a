//! Large collectives of three or more ranks of one host (and 2-rank reduce and
//! out-of-place all_reduce), straight between the ranks' buffers.
//!
//! all_reduce, reduce, reduce_scatter and in-place broadcast of at least
//! `mapped_min` bytes (`plan::Plan`), where every rank's buffers can be mapped by every other
//! rank (threads of one process, or `fcclMemAllocHost` buffers of processes that map
//! each other's): each rank names its input and its recvbuff on the board with the
//! call's fingerprint, maps its peers', and then all ranks take pieces of the work
//! from one counter. A reduction's piece is reduced from every rank's input in rank
//! order in a buffer in cache and written straight into the recvbuffs that take it
//! (every rank's for all_reduce, the root's for reduce, the block's owner for
//! reduce_scatter); a broadcast's piece is read from the root's buffer and written
//! into every other rank's recvbuff while it is in cache. Each input is read once and each result written once, with no ring
//! in between; the owners' schedule (`algo::reduce`) moves every byte through a ring
//! and back, and the links' single copy reads a broadcast's source once per peer.
//!
//! Work goes by pieces that any rank takes, not by a fixed share per rank: with more
//! ranks than cores (4 ranks on 2 cores), the ranks that have a core do the work
//! while the others wait asleep, instead of the call waiting for a rank's turn. A
//! second counter counts finished pieces; the call ends on every rank when it says
//! all of them, so no rank returns while another still reads its input or writes
//! its recvbuff. Both counters live in rank 0's board header and carry the call's
//! board sequence number, so a new call starts them afresh without a reset.
//!
//! Every rank gets the same bits: each element is reduced once, in rank order.

use super::msg::{decode_desc, encode_desc, DESC};
use super::plan;
use crate::coll::Call;
use crate::coll::CollKind;
use crate::error::{Error, Result};
use crate::mem::{copy, reduce, shared};
use crate::transport::board::{Board, Waiter};
use crate::transport::Transport;
use crate::types::{DataType, RedOp};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Bits of a counter word that count pieces; the bits above hold the call's board
/// sequence number.
const COUNT_BITS: u32 = 24;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// Team words of the board (`Board::team_word`): pieces taken, pieces finished.
const TAKEN: usize = 0;
const FINISHED: usize = 1;
/// First word of a rank's record on the board, xored with the call's sequence
/// number: a record left by an earlier call in the same slot never matches.
const TAG: u64 = 0x6d61_7070_6564_0001;
/// Bytes of a record: tag, shape, count, root, then the input's and the recvbuff's
/// descriptors.
const RECORD: usize = 32 + 2 * DESC;

/// This rank's side of a call that may run here, prepared before the board step.
pub struct Mine {
    kind: CollKind,
    dtype: DataType,
    op: RedOp,
    count: usize,
    root: usize,
    /// sendbuff, where this rank has an input (null for a broadcast's non-root).
    input: *const u8,
    /// recvbuff, where this rank has a result (null for a reduce's non-root).
    recv: *mut u8,
    /// NCCL's in place: one of input and result holds the other (see [`Form`]).
    in_place: bool,
    /// Every peer can map this rank's input and recvbuff.
    capable: bool,
}

/// The bytes of a call on each rank, and where in place puts its result.
struct Form {
    /// Bytes of an input (on a rank that has one).
    input: usize,
    /// Bytes of a result (on a rank that has one).
    result: usize,
    /// In place on rank p: the result lies `p * step` bytes into the input
    /// (reduce_scatter), or both are the same memory (step 0).
    step: usize,
}

impl Form {
    /// The form of `kind` on `count` elements of `es` bytes at `n` ranks.
    fn of(kind: CollKind, count: usize, es: usize, n: usize) -> Option<Form> {
        let bytes = count.checked_mul(es)?;
        let all = bytes.checked_mul(n)?;
        let (input, result, step) = match kind {
            CollKind::AllReduce | CollKind::Reduce | CollKind::Broadcast => (bytes, bytes, 0),
            CollKind::ReduceScatter => (all, bytes, bytes),
            _ => return None,
        };
        Some(Form { input, result, step })
    }

    /// Bytes this path is measured by: what the board would hold (all ranks'
    /// blocks of a reduce_scatter, the vector otherwise).
    fn size(&self) -> usize {
        self.input
    }
}

/// Whether `kind` reduces (else it copies).
fn reduces(kind: CollKind) -> bool {
    matches!(kind, CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter)
}

/// Whether rank `p` has an input to the call.
fn has_input(kind: CollKind, root: usize, p: usize) -> bool {
    kind != CollKind::Broadcast || p == root
}

/// Whether rank `p` receives a result of the call.
fn has_result(kind: CollKind, root: usize, p: usize) -> bool {
    kind != CollKind::Reduce || p == root
}

/// Whether `calls` are one call large enough that [`prepare`] should look closer: a
/// test that small calls, which never come here, pass in a few instructions.
#[inline]
pub fn may_take(calls: &[Call], n: usize) -> bool {
    match calls {
        // Validated counts fit memory, so the product cannot wrap.
        [c] => {
            let p = plan::get();
            let floor = p.mapped_min.min(p.mapped_min_2).min(p.mapped_broadcast_min);
            c.coll.count.wrapping_mul(c.coll.dtype.size()).wrapping_mul(n) >= floor
        }
        _ => false,
    }
}

/// Whether `calls` are one call that may run here, and this rank's side of it.
/// `capable` is decided here, where the links are at hand; every rank of the call
/// then says on the board whether it is, and the call runs here only when all are.
pub fn prepare(t: &mut Transport, calls: &[Call]) -> Option<Mine> {
    let [c] = calls else { return None };
    let co = &c.coll;
    let (n, me) = (t.nranks, t.rank);
    if co.v.is_some() || co.strided.is_some() || co.wire.is_some() || co.keep.is_some() {
        return None;
    }
    let form = Form::of(co.kind, co.count, co.dtype.size(), n)?;
    let plan = plan::get();
    let min = match (n, co.kind) {
        (0 | 1, _) => return None,
        (2, CollKind::Reduce | CollKind::AllReduce) => plan.mapped_min_2,
        (2, _) => return None,
        (_, CollKind::Broadcast) => plan.mapped_broadcast_min,
        _ => plan.mapped_min,
    };
    if form.size() < min || !crate::env::split_copy() {
        return None;
    }
    let (inp, res) = (has_input(co.kind, co.root, me), has_result(co.kind, co.root, me));
    let input = if inp { co.send } else { std::ptr::null() };
    let recv = if res { co.recv } else { std::ptr::null_mut() };
    let in_place = inp && res && std::ptr::eq(input.wrapping_add(me * form.step), recv);
    let (a, b) = (input as usize, recv as usize);
    // Partial overlaps of input and result (not NCCL's in place) stay on the links.
    let apart = in_place || !inp || !res || a + form.input <= b || b + form.result <= a;
    let capable = apart
        && (0..n).filter(|&p| p != me).all(|p| {
            let l = t.link(p);
            let Some(l) = l.memory() else { return false };
            (!inp || l.can_write(input, form.input)) && (!res || l.can_write(recv, form.result))
        });
    Some(Mine {
        kind: co.kind,
        dtype: co.dtype,
        op: co.op,
        count: co.count,
        root: co.root,
        input,
        recv,
        in_place,
        capable,
    })
}

impl Mine {
    /// The shape of the call in one word, with this rank's flags.
    fn shape(&self) -> u64 {
        self.kind as u64
            | (self.dtype as u64) << 8
            | (self.op as u64) << 16
            | u64::from(self.capable) << 24
            | u64::from(self.in_place) << 25
    }

    fn form(&self, n: usize) -> Form {
        Form::of(self.kind, self.count, self.dtype.size(), n).expect("checked in prepare")
    }

    /// This rank's record of call `s`, for its slot's data area.
    pub fn record(&self, n: usize, s: u64) -> [u8; RECORD] {
        let form = self.form(n);
        let mut r = [0u8; RECORD];
        r[0..8].copy_from_slice(&(TAG ^ s).to_le_bytes());
        r[8..16].copy_from_slice(&self.shape().to_le_bytes());
        r[16..24].copy_from_slice(&(self.count as u64).to_le_bytes());
        r[24..32].copy_from_slice(&(self.root as u64).to_le_bytes());
        if self.capable {
            if !self.input.is_null() {
                r[32..32 + DESC].copy_from_slice(&encode_desc(self.input, shared::lookup(self.input, form.input)));
            }
            if !self.recv.is_null() {
                r[32 + DESC..].copy_from_slice(&encode_desc(self.recv, shared::lookup(self.recv, form.result)));
            }
        }
        r
    }
}

/// Every rank's buffers as one rank's record of call `s` names them.
pub struct Agreed {
    s: u64,
    /// By rank: input and recvbuff descriptors, and whether it is in place.
    ranks: Vec<([u8; DESC], [u8; DESC], bool)>,
}

/// The plan of call `s` when every rank (all published) is capable and describes
/// the same call as `mine`; None sends the call to the links.
pub fn agree(b: &Board, s: u64, mine: &Mine) -> Option<Agreed> {
    if !mine.capable {
        return None;
    }
    let n = b.nranks();
    let want = mine.shape() & !(1 << 25);
    let mut ranks = Vec::with_capacity(n);
    for p in 0..n {
        let r = b.data(p, s, RECORD);
        let word = |i: usize| u64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().unwrap());
        if word(0) != TAG ^ s
            || word(1) & !(1 << 25) != want
            || word(2) != mine.count as u64
            || word(3) != mine.root as u64
        {
            return None;
        }
        let desc = |at: usize| -> [u8; DESC] { r[at..at + DESC].try_into().unwrap() };
        ranks.push((desc(32), desc(32 + DESC), word(1) & (1 << 25) != 0));
    }
    // Out of place (the root's recvbuff written too) the links are as fast (see
    // `plan::Plan::mapped_broadcast_min`).
    if mine.kind == CollKind::Broadcast && !ranks[mine.root].2 {
        return None;
    }
    // In place, 2-rank all_reduce keeps its exchange (see `plan::Plan::mapped_min_2`).
    if n == 2 && mine.kind == CollKind::AllReduce && ranks.iter().any(|r| r.2) {
        return None;
    }
    Some(Agreed { s, ranks })
}

/// One rank's buffers as mapped here (null where it has none).
#[derive(Clone, Copy)]
struct Bufs {
    input: *const u8,
    recv: *mut u8,
    in_place: bool,
}

/// Maps rank `p`'s buffers, named by its record, through `link`: None where one
/// cannot be mapped here.
fn map_peer(
    link: &mut dyn crate::transport::PeerMemory,
    mine: &Mine,
    form: &Form,
    p: usize,
    (input, recv, in_place): &([u8; DESC], [u8; DESC], bool),
) -> Result<Option<Bufs>> {
    let mut map = |d: &[u8; DESC], len: usize, write: bool| -> Result<Option<*mut u8>> {
        let (addr, shared) = decode_desc(d);
        link.buffer(addr, len, shared.as_ref(), write)
    };
    let (inp, res) = (has_input(mine.kind, mine.root, p), has_result(mine.kind, mine.root, p));
    let (input, recv) = if *in_place {
        // Its input holds its recvbuff: one writable mapping serves both.
        let i = map(input, form.input, true)?;
        (i.map(|q| q.cast_const()), i.map(|q| q.wrapping_add(p * form.step)))
    } else {
        let i = if inp { map(input, form.input, false)?.map(|q| q.cast_const()) } else { Some(std::ptr::null()) };
        let r = if res { map(recv, form.result, true)? } else { Some(std::ptr::null_mut()) };
        (i, r)
    };
    Ok(input.zip(recv).map(|(input, recv)| Bufs { input, recv, in_place: *in_place }))
}

/// Runs call `agreed.s` (agreed on the board) between the buffers.
pub fn run(
    t: &mut Transport,
    mine: &Mine,
    agreed: Agreed,
    timeout: Duration,
    abort: &AtomicBool,
    what: &dyn Fn() -> String,
) -> Result<Option<Error>> {
    let (me, n) = (t.rank, t.nranks);
    let form = mine.form(n);
    // Map every peer's input and recvbuff; a rank that cannot map them all takes no
    // piece and leaves the work to the others.
    let mut bufs = Vec::with_capacity(n);
    for (p, rec) in agreed.ranks.iter().enumerate() {
        let b = if p == me {
            Some(Bufs { input: mine.input, recv: mine.recv, in_place: mine.in_place })
        } else {
            match t.link(p).memory() {
                Some(m) => map_peer(m, mine, &form, p, rec)?,
                None => None,
            }
        };
        let Some(b) = b else { break };
        bufs.push(b);
    }
    let mapped = bufs.len() == n;
    let plan = plan::get();
    let geo = Geometry::new(mine, n, crate::env::stream_min(), plan);
    let (b, checks) = t.board_with_checks().ok_or_else(|| Error::internal("a mapped call without a board"))?;
    let mut checker = |full: bool| if full { checks.alive() } else { checks.flags() };
    let mut w = Waiter::new(timeout, abort, &mut checker, what);
    // Once per process: a flag in the board would sit beside what small calls read.
    static LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !LOGGED.swap(true, Ordering::Relaxed) {
        let which = if n == 2 {
            format!("reduce and out-of-place all_reduce of {} KiB", plan.mapped_min_2 >> 10)
        } else {
            format!(
                "all_reduce, reduce and reduce_scatter of more than {} KiB and in-place broadcast of {} KiB",
                plan.mapped_min >> 10,
                plan.mapped_broadcast_min >> 10
            )
        };
        crate::log::info(format_args!(
            "between the buffers: rank {me} and its {} peers run {which} and more straight between their buffers",
            n - 1
        ));
    }
    let s = agreed.s;
    let (taken, finished) = (b.team_word(TAKEN), b.team_word(FINISHED));
    if mapped {
        let narrow = mine.dtype.is_narrow_float();
        let mut acc = vec![0u8; if narrow { geo.chunk / mine.dtype.size() * mine.dtype.acc_size() } else { 0 }];
        let mut tmp = vec![0u8; if reduces(mine.kind) { geo.chunk } else { 0 }];
        while let Some(k) = take(taken, s, geo.total) {
            geo.piece(mine, &bufs, k, &mut tmp, &mut acc);
            if finish(finished, s) == geo.total {
                b.notify_peers();
            }
        }
    }
    let done = |_: &Board| finished.load(Ordering::Acquire) == word_of(s, geo.total);
    w.wait_until(
        b,
        None,
        || {
            format!(
                "pieces of the call between the ranks' buffers are unfinished ({} of {})",
                finished.load(Ordering::Relaxed) & COUNT_MASK,
                geo.total
            )
        },
        done,
    )?;
    Ok(None)
}

/// How the call is cut into pieces.
struct Geometry {
    /// Bytes of a block: the whole vector, or (reduce_scatter) one rank's block.
    block: usize,
    piece: usize,
    /// Bytes reduced at a time in a buffer that stays in cache.
    chunk: usize,
    per_block: u64,
    total: u64,
    /// Results are at least FERROCCL_STREAM_MIN bytes: written with streaming
    /// stores where they are not also an input.
    stream: bool,
}

impl Geometry {
    fn new(mine: &Mine, n: usize, stream_min: usize, plan: &plan::Plan) -> Geometry {
        let block = mine.count * mine.dtype.size();
        let blocks = if mine.kind == CollKind::ReduceScatter { n } else { 1 };
        // At most 2^16 pieces a block, so that the count of all of them fits COUNT_BITS.
        let piece = plan.mapped_piece.max(block.div_ceil(1 << 16).next_multiple_of(64));
        let per_block = block.div_ceil(piece) as u64;
        // Not into a recvbuff the previous call wrote (`reuse`): this rank's own
        // stands for its peers', which the same loop reuses alike. Up to half the
        // limit only: every rank's input and recvbuff are in play here, and at the
        // limit (8 MiB, 2 ranks out of place: 32 MiB in all) ordinary stores lose.
        let result = mine.form(n).result;
        let stream =
            result >= stream_min && !(result <= crate::env::reuse_max() / 2 && super::reuse::cached(mine.recv, result));
        Geometry { block, piece, chunk: plan.mapped_chunk, per_block, total: per_block * blocks as u64, stream }
    }

    /// Does piece `k`: reduces it from every rank's input, or copies it from the
    /// input that holds it, into the recvbuffs that take it.
    fn piece(&self, mine: &Mine, bufs: &[Bufs], k: u64, tmp: &mut [u8], acc: &mut [u8]) {
        let n = bufs.len();
        let blk = (k / self.per_block) as usize;
        let off = (k % self.per_block) as usize * self.piece;
        let len = self.piece.min(self.block - off);
        // Where the piece lies in the inputs and in the recvbuffs that take it.
        let src_off = blk * self.block + off;
        let takers = match mine.kind {
            CollKind::AllReduce | CollKind::Broadcast => 0..n,
            CollKind::Reduce => mine.root..mine.root + 1,
            _ => blk..blk + 1,
        };
        // A broadcast's root is in place: its result is the source.
        let takes = |q: usize| reduces(mine.kind) || q != mine.root;
        let (dtype, op) = (mine.dtype, mine.op);
        let narrow = dtype.is_narrow_float();
        for c in (0..len).step_by(self.chunk) {
            let m = self.chunk.min(len - c);
            // SAFETY: every rank's input holds its whole input and every taker's
            // recvbuff its whole result (validated on each rank, agreed on the
            // board, mapped here); this rank took piece k, and nobody else reads or
            // writes these bytes until every piece is finished. Inputs are read
            // before any recvbuff (which may be the same memory, in place) is
            // written; a copy never writes its own source.
            unsafe {
                let src: *const u8 = if reduces(mine.kind) {
                    let t = &mut tmp[..m];
                    let a = if narrow { &mut acc[..m / dtype.size() * dtype.acc_size()] } else { &mut acc[..0] };
                    let input = |p: usize| std::slice::from_raw_parts(bufs[p].input.add(src_off + c), m);
                    reduce::reduce_all(dtype, op, n, input, t, a);
                    t.as_ptr()
                } else {
                    bufs[mine.root].input.add(src_off + c)
                };
                for q in takers.clone().filter(|&q| takes(q)) {
                    // A recvbuff that is also its rank's input is in cache (just read).
                    let stream = self.stream && !(reduces(mine.kind) && bufs[q].in_place);
                    copy::copy_stores(bufs[q].recv.add(off + c), src, m, stream);
                }
            }
        }
    }
}

/// The counter word of call `s` with `count`. Sequence numbers are kept modulo
/// 2^40: a word is either this call's or an earlier call's (no rank takes a piece
/// of a later call before every rank has left this one, and none leaves before
/// every piece is finished), and an earlier call's can be mistaken for this one's
/// only if no call between them in the last 2^40 calls ran here.
fn word_of(s: u64, count: u64) -> u64 {
    s << COUNT_BITS | count
}

/// Whether `v` counts call `s`.
fn is_call(v: u64, s: u64) -> bool {
    v >> COUNT_BITS == (s << COUNT_BITS) >> COUNT_BITS
}

/// Counts one more in call `s`'s `word` while it counts fewer than `limit`: returns
/// the count before (the first in a call finds an earlier call's count and starts
/// from 0), None at the limit.
fn count_up(word: &AtomicU64, s: u64, limit: u64) -> Option<u64> {
    let mut v = word.load(Ordering::Acquire);
    loop {
        let k = if is_call(v, s) { v & COUNT_MASK } else { 0 };
        if k >= limit {
            return None;
        }
        match word.compare_exchange_weak(v, word_of(s, k + 1), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(k),
            Err(x) => v = x,
        }
    }
}

/// Takes the next piece of call `s` from `word`, if one is left.
fn take(word: &AtomicU64, s: u64, total: u64) -> Option<u64> {
    count_up(word, s, total)
}

/// Counts one more finished piece of call `s` in `word`; returns how many are.
fn finish(word: &AtomicU64, s: u64) -> u64 {
    // No call has COUNT_MASK pieces (at most 2^16 a block, see Geometry).
    count_up(word, s, COUNT_MASK).map_or(COUNT_MASK, |k| k + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_start_afresh_for_each_call_and_stop_at_the_total() {
        let w = AtomicU64::new(0);
        assert_eq!(take(&w, 1, 2), Some(0));
        assert_eq!(take(&w, 1, 2), Some(1));
        assert_eq!(take(&w, 1, 2), None);
        // Call 5 finds call 1's count and starts from 0.
        assert_eq!(take(&w, 5, 3), Some(0));
        assert_eq!(take(&w, 5, 3), Some(1));
        let f = AtomicU64::new(word_of(3, 7));
        assert_eq!(finish(&f, 4), 1);
        assert_eq!(finish(&f, 4), 2);
        assert_eq!(f.load(Ordering::Relaxed), word_of(4, 2));
        // Sequence numbers past 2^40 wrap, and still tell calls apart.
        let big = (1u64 << 40) + 9;
        assert_eq!(take(&w, big, 2), Some(0));
        assert!(is_call(w.load(Ordering::Relaxed), big) && !is_call(w.load(Ordering::Relaxed), big + 1));
    }
}
