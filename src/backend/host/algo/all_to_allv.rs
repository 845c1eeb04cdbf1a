//! all_to_allv and all_gather_v (counts per rank): where each part of the call is.
//!
//! - on one host, the board first (`announce::run`): a single all_to_allv whose data
//!   fits every slot moves whole there (`announce::alltoallv`); otherwise its counts,
//!   and those of every v-call of the group, are agreed there (`counts_verdicts`);
//! - else `host::execute` agrees the counts over the links with [`alltoallv_agree`]
//!   here; either way a mismatch fails the call on every rank before data moves;
//! - the data then moves by the schedule [`build`] here;
//! - the NCCL form: `backend::nccl` (grouped send/recv).

use super::{Buf, Cx, Scratch};
use crate::backend::host::engine::{self, RunCtl, Schedule, Sink};
use crate::coll::counts::{counts_error, describe_pair, describe_self, pair_values};
use crate::error::{Error, Result};
use crate::transport::Transport;

/// Block p of sendbuff goes to rank p; rank p's block lands at its displacement in
/// recvbuff; this rank's own block is copied locally.
pub(super) fn build(s: &mut Schedule<'_>, cx: &Cx<'_>) -> Result<()> {
    let (co, rank) = (cx.co, cx.rank);
    let es = co.dtype.size();
    let v = co.v.as_ref().ok_or_else(|| Error::internal("all_to_allv without counts"))?;
    let (sc, sd, rc, rd) = (v.sendcounts(), v.sdispls(), v.recvcounts(), v.rdispls());
    let extent =
        |counts: &[usize], displs: &[usize]| (0..cx.n).map(|p| (displs[p] + counts[p]) * es).max().unwrap_or(0);
    let (send, recv) = (cx.send_buf(extent(sc, sd)), cx.recv_buf(extent(rc, rd)));
    let block = |b: &Buf, counts: &[usize], displs: &[usize], p: usize| b.at(displs[p] * es, counts[p] * es);
    for p in cx.peers() {
        s.send(p, block(&send, sc, sd, p), sc[p] * es, &[]);
    }
    for p in cx.peers() {
        s.recv(p, rc[p] * es, cx.sink(block(&recv, rc, rd, p)), &[]);
    }
    let mine = sc[rank].min(rc[rank]) * es;
    cx.copy_local(s, send.at(sd[rank] * es, mine), recv.at(rd[rank] * es, mine), mine);
    Ok(())
}

/// For every call with per-rank counts (all_to_allv, all_gather_v,
/// reduce_scatter_v): exchange counts with each peer, then let every rank know who
/// found a mismatch, so all ranks fail together without moving data.
/// Returns (seq, error if the call must fail) per call.
pub fn alltoallv_agree(
    t: &mut Transport,
    calls: &[&crate::coll::Call],
    ctl: &RunCtl<'_>,
) -> Result<Vec<(u64, Option<Error>)>> {
    let (me, n) = (t.rank, t.nranks);
    let nc = calls.len();
    let mut scratch = Scratch::default();
    let mine_out: Vec<Vec<u64>> = (0..n)
        .map(|p| {
            calls
                .iter()
                .flat_map(|c| {
                    let (a, b) = pair_values(&c.coll, p);
                    [a, b]
                })
                .collect()
        })
        .collect();
    let inbox: Vec<Buf> = (0..n).map(|_| scratch.buf(nc * 16)).collect::<Result<_>>()?;
    let mut s = Schedule::new(calls[0].seq as u32);
    for p in (0..n).filter(|&p| p != me) {
        s.send(p, mine_out[p].as_ptr() as *const u8, nc * 16, &[]);
    }
    for p in (0..n).filter(|&p| p != me) {
        s.recv(p, nc * 16, Sink::Copy(inbox[p].at(0, nc * 16)), &[]);
    }
    if let Some(e) = engine::run(t, &mut s, ctl)? {
        return Err(e);
    }
    let read = |p: usize, i: usize| -> u64 {
        // Written by the run above.
        u64::from_le_bytes(inbox[p].bytes(i * 8, 8).try_into().unwrap())
    };
    // My findings per call: first mismatch description.
    let mut found: Vec<Option<String>> = vec![None; nc];
    for (ci, c) in calls.iter().enumerate() {
        for p in (0..n).filter(|&p| p != me) {
            let theirs = (read(p, ci * 2), read(p, ci * 2 + 1));
            if let Some(d) = describe_pair(&c.coll, me, p, pair_values(&c.coll, p), theirs) {
                found[ci].get_or_insert(d);
            }
        }
        if let Some(d) = describe_self(&c.coll, me, pair_values(&c.coll, me)) {
            found[ci].get_or_insert(d);
        }
    }
    // Agreement: everyone learns which ranks found a mismatch in which call.
    let flags: Vec<u64> = found.iter().map(|f| u64::from(f.is_some())).collect();
    let flag_in: Vec<Buf> = (0..n).map(|_| scratch.buf(nc * 8)).collect::<Result<_>>()?;
    let mut s = Schedule::new(calls[0].seq as u32);
    for p in (0..n).filter(|&p| p != me) {
        s.send(p, flags.as_ptr() as *const u8, nc * 8, &[]);
    }
    for p in (0..n).filter(|&p| p != me) {
        s.recv(p, nc * 8, Sink::Copy(flag_in[p].at(0, nc * 8)), &[]);
    }
    if let Some(e) = engine::run(t, &mut s, ctl)? {
        return Err(e);
    }
    Ok(calls
        .iter()
        .enumerate()
        .map(|(ci, c)| {
            let reporters: Vec<usize> = (0..n)
                .filter(|&p| {
                    if p == me {
                        return flags[ci] != 0;
                    }
                    // Written by the run above.
                    u64::from_le_bytes(flag_in[p].bytes(ci * 8, 8).try_into().unwrap()) != 0
                })
                .collect();
            let err = counts_error(found[ci].take(), &reporters);
            (c.seq, err)
        })
        .collect())
}
