//! What every rank of a communicator on one GPU learns when it is created: every
//! rank's process, whether all run under MPS, and the control region they share.

use super::ctl::Ctl;
use super::{mps, Setup};
use crate::backend::Allgather;
use crate::error::Result;
use crate::log;
use std::sync::Arc;

/// The rounds of `allgather` that [`processes`] runs.
pub const ROUNDS: usize = 2;

/// Set-up of a communicator whose ranks (processes) share one GPU, in two rounds of
/// `allgather` (the rendezvous): rank 0 creates the control region, every rank learns every rank's
/// process and whether it runs under MPS, then maps the region, and every rank learns
/// whether every rank could. Errors are only those of the rounds: a region that cannot
/// be made or mapped stages every device call instead, on every rank.
pub fn processes(
    rank: usize,
    nranks: usize,
    nonce: u64,
    device: i32,
    allgather: &mut Allgather<'_>,
) -> Result<Option<Setup>> {
    let pid = std::process::id();
    let made = (rank == 0).then(|| Ctl::create(&Ctl::name(nonce, pid), nranks));
    let (mps, why) = mps::local(device);
    let mut blob = [0u8; 6];
    blob[..4].copy_from_slice(&pid.to_le_bytes());
    blob[4] = mps as u8;
    blob[5] = made.as_ref().map_or(0, |m| m.is_ok() as u8);
    let all = allgather(&blob)?;
    let field = |b: &Vec<u8>, i: usize| b.get(i).copied().unwrap_or(0);
    let pids: Vec<u32> =
        all.iter().map(|b| u32::from_le_bytes(b.get(..4).and_then(|s| s.try_into().ok()).unwrap_or([0; 4]))).collect();
    let region = match made {
        Some(m) => m.map_err(|e| e.msg),
        None if field(&all[0], 5) == 1 => Ctl::open(&Ctl::name(nonce, pids[0]), nranks).map_err(|e| e.msg),
        None => Err("rank 0 could not create the device control region".to_string()),
    };
    let oks = allgather(&[region.is_ok() as u8])?;
    // Every rank has mapped the region or given up on it: its name can go.
    if let Ok(r) = &region {
        r.unlink();
    }
    let ctl = match (region, oks.iter().position(|b| field(b, 0) != 1)) {
        (Ok(c), None) => Ok(Arc::new(c)),
        (Err(m), _) => Err(m),
        (Ok(_), Some(r)) => Err(format!("rank {r} could not map the device control region")),
    };
    let mps_all = all.iter().all(|b| field(b, 4) == 1);
    if let Err(m) = &ctl {
        log::info(format_args!("rank {rank}: device calls through host staging: {m}"));
    }
    log::info(format_args!(
        "rank {rank}: ranks on one GPU: {} ({why}{})",
        if mps_all { "every rank moves its share (MPS)" } else { "rank 0 moves the data" },
        if mps && !mps_all { "; not every rank runs under MPS" } else { "" }
    ));
    Ok(Some(Setup { pids, mps: mps_all, ctl }))
}

/// Set-up of the `n` ranks of one process (threads) on one GPU: one control region
/// (their send/recv mailboxes), mapped by this process alone, so its name goes at once.
pub fn threads(nonce: u64, n: usize) -> Setup {
    let pid = std::process::id();
    let ctl = Ctl::create(&Ctl::name(nonce, pid), n)
        .map(|c| {
            c.unlink();
            Arc::new(c)
        })
        .map_err(|e| e.msg);
    Setup { pids: vec![pid; n], mps: false, ctl }
}
