//! A call's fingerprint: which collectives a rank is about to run (kind, count, type,
//! op, root, sequence number) in a message every rank compares with its peers', so
//! that ranks that called different things fail together before data moves, on
//! whichever path carries the messages (the host's links and board, the device
//! path's descriptors).

use super::{Call, Coll, CollKind};
use crate::error::Error;
use crate::types::{DataType, RedOp};

/// Calls described in full; further ones are folded into a hash.
const MAX_CALLS: usize = 8;
const REC: usize = 32;
const MSG: usize = 16 + MAX_CALLS * REC;

/// A call's record as four little-endian words: sequence number; kind and type;
/// op (with the wire type in its upper bits) and root; count.
fn record(c: &Call) -> [u64; REC / 8] {
    let co = &c.coll;
    let reduces =
        matches!(co.kind, CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter | CollKind::ReduceScatterV);
    // The wire type, if any, rides in the op's upper bits: a wire all_reduce moves
    // different bytes than a plain one.
    let wire = co.wire.map_or(0, |w| (w as u32 + 1) << 8);
    let op = if reduces { co.op as u32 | wire } else { 0 };
    let rooted = matches!(co.kind, CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter);
    let root = if rooted { co.root as u32 } else { 0 };
    // Per-rank counts differ by design; the v-calls' own exchange checks them.
    let per_rank = matches!(co.kind, CollKind::AlltoAllv | CollKind::AllGatherV | CollKind::ReduceScatterV);
    let count = if per_rank { 0 } else { co.count as u64 };
    let pair = |lo: u32, hi: u32| u64::from(lo) | u64::from(hi) << 32;
    [c.seq, pair(kind_id(co.kind), co.dtype as u32), pair(op, root), count]
}

fn kind_id(k: CollKind) -> u32 {
    k as u32
}

fn describe(r: &[u8]) -> String {
    let seq = u64::from_le_bytes(r[0..8].try_into().unwrap());
    let kind = u32::from_le_bytes(r[8..12].try_into().unwrap());
    let dt = u32::from_le_bytes(r[12..16].try_into().unwrap());
    let op = u32::from_le_bytes(r[16..20].try_into().unwrap());
    let root = u32::from_le_bytes(r[20..24].try_into().unwrap());
    let count = u64::from_le_bytes(r[24..32].try_into().unwrap());
    let name = ALL_KINDS.iter().find(|k| kind_id(**k) == kind).map_or("unknown call", |k| k.c_name());
    let dt = DataType::try_from(dt as i32).map_or("?", |d| d.c_name());
    let mut s = format!("{name}(count {count}, {dt}");
    if matches!(name, "fcclAllReduce" | "fcclReduce" | "fcclReduceScatter" | "fcclReduceScatterV") {
        s += &format!(", {}", RedOp::try_from((op & 0xff) as i32).map_or("?", |o| o.c_name()));
        if op >> 8 != 0 {
            s += &format!(", wire {}", DataType::try_from((op >> 8) as i32 - 1).map_or("?", |d| d.c_name()));
        }
    }
    if matches!(name, "fcclBroadcast" | "fcclReduce" | "fcclGather" | "fcclScatter") {
        s += &format!(", root {root}");
    }
    s + &format!(") #{seq}")
}

const ALL_KINDS: [CollKind; 14] = [
    CollKind::AllReduce,
    CollKind::Broadcast,
    CollKind::Reduce,
    CollKind::AllGather,
    CollKind::ReduceScatter,
    CollKind::AlltoAll,
    CollKind::Gather,
    CollKind::Scatter,
    CollKind::AlltoAllv,
    CollKind::Send,
    CollKind::Recv,
    CollKind::Barrier,
    CollKind::AllGatherV,
    CollKind::ReduceScatterV,
];

pub fn is_collective(c: &Coll) -> bool {
    !c.kind.is_p2p()
}

/// Bytes of a fingerprint message.
pub const MSG_BYTES: usize = MSG;

/// Writes the fingerprint of `calls` into `m` (at least [`MSG_BYTES`] long) and
/// returns a 64-bit digest of it: ranks whose digests agree called the same
/// collectives, unless a 2^-64 accident says otherwise.
pub fn message_into(calls: &[Call], m: &mut [u8]) -> u64 {
    // Only the header and the records of the calls are written and compared (see
    // `used`): whatever follows them is stale, and writing a whole message per call
    // cost more than the rest of the fingerprinting. The digest is taken from the
    // words as they are written (the same as `digest` of the message).
    let m: &mut [u8; MSG] = (&mut m[..MSG]).try_into().expect("MSG bytes");
    if let [call] = calls {
        if is_collective(&call.coll) {
            // One call (nearly every call): header and record in one go.
            let [r0, r1, r2, r3] = record(call);
            let words = [1, FNV_BASIS, r0, r1, r2, r3];
            let mut d = Digest::new();
            for (i, w) in words.into_iter().enumerate() {
                m[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
                d.add(w);
            }
            return d.0;
        }
    }
    let mut count = 0usize;
    let mut h = FNV_BASIS;
    for c in calls.iter().filter(|c| is_collective(&c.coll)) {
        if count >= MAX_CALLS {
            for b in record(c).iter().flat_map(|w| w.to_le_bytes()) {
                h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
        count += 1;
    }
    let mut d = Digest::new();
    let mut put = |i: usize, w: u64| {
        m[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        d.add(w);
    };
    put(0, count as u64);
    put(1, h);
    for (k, c) in calls.iter().filter(|c| is_collective(&c.coll)).take(MAX_CALLS).enumerate() {
        for (i, w) in record(c).into_iter().enumerate() {
            put(2 + k * (REC / 8) + i, w);
        }
    }
    d.0
}

/// A 64-bit digest of one call's record (what it is and its sequence number), from
/// which the host's links derive a call's tag.
pub fn record_digest(c: &Call) -> u64 {
    let mut d = Digest::new();
    record(c).into_iter().for_each(|w| d.add(w));
    d.0
}

/// Bytes of one call's fingerprint (header and record) as [`one`] writes it.
pub const ONE_BYTES: usize = 16 + REC;

/// The fingerprint of a single call, for paths that carry it in messages of their own
/// (the device path's descriptors); [`verdict`] compares such fingerprints.
pub fn one(call: &Call) -> [u8; ONE_BYTES] {
    let mut m = [0u8; MSG];
    message_into(std::slice::from_ref(call), &mut m);
    m[..ONE_BYTES].try_into().expect("ONE_BYTES <= MSG")
}

/// Start of the FNV-1a hash of the records beyond MAX_CALLS (the header's second word).
const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// The running digest of a fingerprint message's words (multiply-rotate).
struct Digest(u64);

impl Digest {
    fn new() -> Digest {
        Digest(0x9e37_79b9_7f4a_7c15)
    }

    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(0xff51_afd7_ed55_8ccd).rotate_left(29);
    }
}

/// The bytes of a fingerprint message that count: its header and its records.
fn used(m: &[u8]) -> &[u8] {
    let n = (u64::from_le_bytes(m[0..8].try_into().unwrap()) as usize).min(MAX_CALLS);
    &m[..16 + n * REC]
}

/// A 64-bit digest of a fingerprint message (multiply-rotate over its used words).
pub fn digest(m: &[u8]) -> u64 {
    let mut d = Digest::new();
    used(m).chunks_exact(8).for_each(|w| d.add(u64::from_le_bytes(w.try_into().unwrap())));
    d.0
}

pub fn message(calls: &[Call]) -> Vec<u8> {
    let mut m = vec![0u8; MSG];
    message_into(calls, &mut m);
    m
}

fn describe_msg(m: &[u8]) -> String {
    let n = u64::from_le_bytes(m[0..8].try_into().unwrap()) as usize;
    let shown: Vec<String> = (0..n.min(MAX_CALLS)).map(|i| describe(&m[16 + i * REC..16 + (i + 1) * REC])).collect();
    match n {
        0 => "no collective".into(),
        1 => shown[0].clone(),
        _ => format!("a group of {n}: {}{}", shown.join(", "), if n > MAX_CALLS { ", ..." } else { "" }),
    }
}

/// Compares this rank's fingerprint with every peer's: `Some(error)` when any rank
/// differs. Every rank sees every fingerprint, so all of them fail together.
pub fn verdict<'a>(me: usize, n: usize, mine: &[u8], theirs: impl Fn(usize) -> &'a [u8]) -> Option<Error> {
    let d = disagreement(me, (0..n).filter(|&p| p != me), mine, theirs)?;
    Some(Error::mismatch(format!(
        "ranks called different collectives: {d}; no data was moved, the communicator is still usable"
    )))
}

/// "rank 0 called X; rank 2 called Y" when any of `peers` announced something other
/// than `mine`, or None when they all agree.
pub fn disagreement<'a>(
    me: usize,
    peers: impl Iterator<Item = usize> + Clone,
    mine: &[u8],
    theirs: impl Fn(usize) -> &'a [u8],
) -> Option<String> {
    let mine = used(mine);
    if peers.clone().all(|p| used(theirs(p)) == mine) {
        return None;
    }
    let mut lines = vec![format!("rank {me} called {}", describe_msg(mine))];
    for p in peers {
        let m = used(theirs(p));
        if m != mine {
            lines.push(format!("rank {p} called {}", describe_msg(m)));
        }
    }
    Some(lines.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(kind: CollKind, count: usize, dtype: DataType, op: RedOp, root: usize, seq: u64) -> Call {
        let mut coll = Coll::new(kind, std::ptr::null(), std::ptr::null_mut(), count, dtype);
        coll.op = op;
        coll.root = root;
        Call { coll, seq }
    }

    #[test]
    fn message_reads_back_and_every_field_counts() {
        let base = call(CollKind::Reduce, 3, DataType::Float32, RedOp::Max, 1, 7);
        let mut m = vec![0xAAu8; MSG];
        let d = message_into(std::slice::from_ref(&base), &mut m);
        assert_eq!(d, digest(&m));
        assert_eq!(describe_msg(&m), "fcclReduce(count 3, fcclFloat32, fcclMax, root 1) #7");
        // Stale bytes after the used part do not count.
        let mut m2 = vec![0x55u8; MSG];
        assert_eq!(message_into(std::slice::from_ref(&base), &mut m2), d);
        let variants = [
            call(CollKind::Reduce, 4, DataType::Float32, RedOp::Max, 1, 7),
            call(CollKind::Reduce, 3, DataType::Float64, RedOp::Max, 1, 7),
            call(CollKind::Reduce, 3, DataType::Float32, RedOp::Min, 1, 7),
            call(CollKind::Reduce, 3, DataType::Float32, RedOp::Max, 0, 7),
            call(CollKind::Reduce, 3, DataType::Float32, RedOp::Max, 1, 8),
            call(CollKind::AllReduce, 3, DataType::Float32, RedOp::Max, 1, 7),
        ];
        for v in &variants {
            let mut mv = vec![0u8; MSG];
            assert_ne!(message_into(std::slice::from_ref(v), &mut mv), d, "{}", describe_msg(&mv));
        }
        // A gather ignores the op, an all_reduce the root: they do not make a difference.
        let g = |op, root| {
            let mut mg = vec![0u8; MSG];
            message_into(&[call(CollKind::Gather, 3, DataType::Int8, op, root, 2)], &mut mg)
        };
        assert_eq!(g(RedOp::Sum, 1), g(RedOp::Max, 1));
        assert_ne!(g(RedOp::Sum, 1), g(RedOp::Sum, 0));
    }
}
