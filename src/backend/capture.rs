//! Calls on a stream that is being captured into a CUDA graph (stream capture:
//! `torch.cuda.graph`, vLLM's graph capture, `cuStreamBeginCapture`) are refused with
//! fcclInvalidUsage, on every rank alike, before anything is enqueued on a stream. The
//! built-in device paths fix per call what a replay would have to change: the values their
//! stream memory operations write and wait for, the peers' buffer addresses from the host
//! exchange, the watchdog's expectations, the host staging copies and waits. A replayed
//! graph would wait on stale values or move stale data. Real NCCL supports capture, so the
//! NCCL backend passes a capturing stream through.
//!
//! Each rank asks the driver about its own stream (one `cuStreamIsCapturing`) and says so
//! in the exchange every rank already makes (the one-GPU path's descriptors and send/recv
//! records) or, where none exists (host staging of a collective), in a one-byte vote:
//! ranks that do not capture fail the same call instead of waiting for a peer that never
//! comes. Staged send/recv have no such exchange: the capturing rank runs only their
//! handshakes, flagged as refused (`Coll::refused`), so that each peer fails at once.

use super::{Exec, Outcome};
use crate::error::{Error, Result};
use crate::mem::cuda::{self, Stream};

/// What a user can do about a refused call.
const FIX: &str = "run the collective outside graph capture (capture only the compute around it), or use the \
                   NCCL backend (FERROCCL_BACKEND=nccl, one GPU per rank), whose calls can be captured";

/// Whether `stream` is capturing (the driver's answer; a driver error is the call's error).
pub fn capturing(stream: Stream) -> Result<bool> {
    cuda::capturing(stream)
}

/// The error every rank returns for `call` when the ranks in `who` called it on a stream
/// being captured; `stream` is this rank's.
pub fn refusal(call: &str, me: usize, stream: Stream, who: &[usize]) -> Error {
    let list = who.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ");
    let s = stream.as_ptr();
    let msg = if who.contains(&me) {
        let others: Vec<String> = who.iter().filter(|&&r| r != me).map(|r| r.to_string()).collect();
        let also = if others.is_empty() { String::new() } else { format!(" (rank(s) {}'s too)", others.join(", ")) };
        format!(
            "{call} on rank {me}: its stream {s:p} is being captured into a CUDA graph{also}; ferroccl's device \
             path cannot be replayed from a graph (each call fixes its ordering values and peer addresses), so \
             the call fails on every rank and nothing was enqueued on the stream (the capture stays valid). To \
             fix: {FIX}"
        )
    } else {
        format!(
            "{call} on rank {me}: rank(s) {list} called it on a stream being captured into a CUDA graph; \
             ferroccl's device path cannot be replayed from a graph, so the call fails on every rank and nothing \
             was enqueued on this rank's stream {s:p}. To fix: {FIX}"
        )
    };
    Error::invalid_usage(msg)
}

/// The ranks whose streams capture, from every rank's answer `mine`, through one host
/// exchange at sequence number `seq` (None: the communicator's next). `Failed`: the
/// exchange failed the call.
pub fn vote(x: &mut Exec<'_>, mine: bool, seq: Option<u64>) -> Result<std::result::Result<Vec<usize>, Outcome>> {
    let (all, r) = x.allgather(&[u8::from(mine)], seq)?;
    if let Outcome::Failed(_) = r {
        return Ok(Err(r));
    }
    Ok(Ok(all.iter().enumerate().filter(|(_, &b)| b != 0).map(|(r, _)| r).collect()))
}
