//! reduce_scatter and reduce_scatter_v: the owners' reduction (`reduce::reduce_phase`)
//! with rank o's block as owner o's chunk, whose result stays with its owner.
//! Large calls between mapped buffers take `mapped` first (see `plan`).

use super::reduce::{reduce_phase, Dest, Results};
use super::{Cx, Scratch};
use crate::backend::host::engine::Schedule;
use crate::coll::CollKind;
use crate::error::{Error, Result};

pub(super) fn build(s: &mut Schedule<'_>, cx: &Cx<'_>, scratch: &mut Scratch) -> Result<()> {
    let co = cx.co;
    let keep = Results { dest: Dest::Keep, stream: cx.stream, by_address: false };
    if co.kind == CollKind::ReduceScatter {
        let chunks = |o: usize| (o * co.count, co.count);
        return reduce_phase(s, cx, scratch, &chunks, &|_| 0, keep);
    }
    let v = co.v.as_ref().ok_or_else(|| Error::internal("reduce_scatter_v without counts"))?;
    let chunks = |o: usize| (v.sdispls()[o], v.recvcounts()[o]);
    reduce_phase(s, cx, scratch, &chunks, &|_| 0, keep)
}
