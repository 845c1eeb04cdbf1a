//! Before a call is cut, every rank checks that all cut it alike.

use super::cut::Cut;
use super::{chunk_bytes, host, Exec, Outcome};
use crate::coll::{Call, Coll, CollKind};
use crate::error::{Error, Result};

/// Before a call is cut, every rank makes sure that all cut it alike: they exchange
/// what the cut is made of (and, for v-calls, agree on the counts as the host
/// algorithms do), so a mismatch fails every rank before any data moves instead of
/// leaving them in different chunks.
pub(super) fn agree(
    x: &mut Exec<'_>,
    call: &Call,
    cut: &Cut,
    rank: usize,
    n: usize,
    seq: &mut impl FnMut(&mut Exec<'_>) -> u64,
) -> Result<Outcome> {
    let c = &call.coll;
    let mine = plan_record(c);
    let mut all = vec![[0u64; RECORD]; n];
    let ex = Coll::new(
        CollKind::AllGather,
        mine.as_ptr().cast(),
        all.as_mut_ptr().cast(),
        std::mem::size_of_val(&mine),
        crate::types::DataType::Uint8,
    );
    let s = seq(x);
    if let failed @ Outcome::Failed(_) = host::execute(x, &[Call { coll: ex, seq: s }])? {
        return Ok(failed);
    }
    if all.iter().any(|r| *r != mine) {
        let each: Vec<String> = all.iter().enumerate().map(|(p, r)| format!("rank {p}: {}", describe(r))).collect();
        return Ok(Outcome::Failed(Error::mismatch(format!(
            "ranks cut a staged device call differently ({}): they called different collectives, or FERROCCL_STAGING_CHUNK differs between them (it must be the same on every rank); no data was moved, the communicator is still usable",
            each.join("; ")
        ))));
    }
    if matches!(c.kind, CollKind::AllGatherV | CollKind::ReduceScatterV) {
        let whole = Call { coll: c.clone(), seq: seq(x) };
        let what = || format!("{} #{} on rank {rank}", c.kind.c_name(), call.seq);
        if let Some((_, Some(e))) = host::agree_counts(x, &[&whole], &what)?.pop() {
            return Ok(Outcome::Failed(e));
        }
    }
    debug_assert!(cut.chunks > 1 && cut.len > cut.cols);
    Ok(Outcome::Done)
}

const RECORD: usize = 6;

/// What a call's cut is made of: kind, count (0 for v-calls: their counts are agreed
/// on their own), type, op and root where they matter, and the chunk size.
fn plan_record(c: &Coll) -> [u64; RECORD] {
    use CollKind::*;
    let v = matches!(c.kind, AllGatherV | ReduceScatterV);
    let reduces = matches!(c.kind, AllReduce | Reduce | ReduceScatter | ReduceScatterV);
    let rooted = matches!(c.kind, Broadcast | Reduce | Gather | Scatter);
    let wire = c.wire.map_or(0, |w| (w as u64 + 1) << 8);
    [
        c.kind as u64,
        if v { 0 } else { c.count as u64 },
        c.dtype as u64,
        if reduces { c.op as u64 | wire } else { 0 },
        if rooted { c.root as u64 } else { 0 },
        chunk_bytes() as u64,
    ]
}

fn describe(r: &[u64; RECORD]) -> String {
    let kind = KINDS.iter().find(|k| **k as u64 == r[0]).map_or("an unknown call", |k| k.c_name());
    let dt = crate::types::DataType::try_from(r[2] as i32).map_or("?", |d| d.c_name());
    format!("{kind}(count {}, {dt}, op {}, root {}) in chunks of {} bytes", r[1], r[3], r[4], r[5])
}

const KINDS: [CollKind; 8] = [
    CollKind::AllReduce,
    CollKind::Reduce,
    CollKind::Broadcast,
    CollKind::AllGather,
    CollKind::Gather,
    CollKind::ReduceScatter,
    CollKind::Scatter,
    CollKind::AlltoAll,
];
