//! The built-in backend as a router entry: host memory runs on the host algorithms;
//! device memory is staged through host memory around them (see `staging`: a call
//! alone in chunks, pipelined; a group whole). It takes every call, so it ends every
//! communicator's table. Device calls on a stream that is being captured into a CUDA
//! graph are refused on every rank alike (see `capture`).

use super::{capture, host, staging, Backend, Exec, Outcome};
use crate::coll::{Call, Coll};
use crate::error::Result;
use crate::mem::{cuda, Placement};

pub struct Builtin {
    pub rank: usize,
    pub nranks: usize,
}

impl Backend for Builtin {
    fn id(&self) -> &'static str {
        "builtin"
    }

    fn name(&self, c: &Coll) -> &'static str {
        match c.placement {
            Placement::Host => "host",
            _ => "staged",
        }
    }

    fn accepts(&self, _: &Coll, _: bool) -> bool {
        true
    }

    fn run(&self, x: &mut Exec<'_>, calls: &[Call]) -> Result<Outcome> {
        let on_host = calls.iter().all(|c| c.coll.placement == Placement::Host || c.coll.is_noop());
        let p2p = calls.iter().any(|c| c.coll.kind.is_p2p());
        // Staging copies and waits on the callers' streams: nothing may happen on one that
        // is being captured into a CUDA graph. For collectives every rank learns first
        // whether any rank's stream captures (a vote), and then the calls fail everywhere,
        // untouched. Every rank of a collective must vote alike: those with device memory,
        // and, with CUDA in use, those of a call with per-rank counts whatever their memory
        // (a rank with nothing to send or receive passes no device buffer). send/recv
        // involve only their pairs, whose memory may differ in kind: a capturing rank runs
        // only their handshakes, flagged as refused and without buffers, so that each peer's
        // matching call fails at once too (`Coll::refused`).
        let votes = !p2p && (!on_host || (x.cuda && calls.iter().any(|c| c.coll.v.is_some())));
        if on_host && !votes {
            return host::execute(x, calls);
        }
        let device = || calls.iter().filter(|c| c.coll.placement != Placement::Host && !c.coll.is_noop());
        let mut mine = None;
        for c in device() {
            let Placement::Device { ctx, .. } = c.coll.placement else { continue };
            let _g = cuda::CtxGuard::enter(ctx)?;
            if capture::capturing(c.coll.stream)? {
                mine = Some(c.coll.stream);
                break;
            }
        }
        let first = device().next().map_or(&calls[0].coll, |c| &c.coll).clone();
        if p2p {
            if let Some(stream) = mine {
                let refusal = capture::refusal(first.kind.c_name(), self.rank, stream, &[self.rank]);
                if calls.iter().all(|c| c.coll.kind.is_p2p()) {
                    let refused: Vec<Call> =
                        calls.iter().map(|c| Call { coll: refused(&c.coll), seq: c.seq }).collect();
                    // Its own verdict is the refusal: what the handshakes say adds nothing.
                    let _ = host::execute(x, &refused)?;
                }
                // A group with collectives too: they are not told (their peers fail at the
                // communicator's timeout).
                return Ok(Outcome::Failed(refusal));
            }
            if let [call] = calls {
                return staging::run(x, call, self.rank, self.nranks);
            }
        } else {
            let own = match calls {
                [call] if call.seq == *x.seq => Some(call.seq),
                _ => None,
            };
            let who = match capture::vote(x, mine.is_some(), own)? {
                Ok(who) => who,
                Err(failed) => return Ok(failed),
            };
            if !who.is_empty() {
                let stream = mine.unwrap_or(first.stream);
                return Ok(Outcome::Failed(capture::refusal(first.kind.c_name(), self.rank, stream, &who)));
            }
            if let [call] = calls {
                // A fresh sequence number: the vote used the call's own.
                *x.seq += 1;
                let call = Call { coll: call.coll.clone(), seq: *x.seq };
                return if on_host {
                    host::execute(x, &[call])
                } else {
                    staging::run(x, &call, self.rank, self.nranks)
                };
            }
        }
        // A group's calls run as one host schedule (so that its sends and receives pair
        // up): staged whole.
        let mut staged = Vec::new();
        let mut copies = Vec::with_capacity(calls.len());
        for c in calls {
            let mut coll = c.coll.clone();
            if coll.placement != Placement::Host && !coll.is_noop() {
                staged.push(staging::stage_in(&mut coll, c.coll.placement, self.rank, self.nranks)?);
            }
            copies.push(Call { coll, seq: c.seq });
        }
        let res = host::execute(x, &copies)?;
        for s in staged {
            s.stage_out()?;
        }
        Ok(res)
    }
}

/// The handshake-only form of send/recv `c` that its rank refused, flagged so that the
/// peer fails its matching call: one byte of host memory of its own (the handshake's
/// smallest message; a refused receive never writes it), never the caller's buffers.
fn refused(c: &Coll) -> Coll {
    // An atomic for its interior mutability: the engine may write through the pointer.
    let byte = std::sync::Arc::new(std::sync::atomic::AtomicU8::new(0));
    let p = byte.as_ptr();
    let mut r = Coll::new(c.kind, p, p, 1, crate::types::DataType::Uint8);
    r.peer = c.peer;
    r.refused = true;
    r.keep = Some(byte);
    r
}
