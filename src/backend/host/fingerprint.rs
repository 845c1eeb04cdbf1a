//! checkMode over the host's links: before any data moves, every rank tells every
//! other which collectives it is about to run (`coll::fingerprint`). Any difference
//! fails the call on every rank with a message giving each side's call, and leaves
//! the communicator usable, since nothing else was sent.

use super::engine::{self, RunCtl, Schedule, Sink, ANY_TAG};
use crate::coll::{fingerprint, Call};
use crate::error::{Error, Result};
use crate::transport::Transport;

/// Bytes of a fingerprint message.
const MSG: usize = fingerprint::MSG_BYTES;

/// The tag a collective's messages carry on the links: its sequence number and what it
/// is (kind, type, op with the wire type, root, count) folded into 32 bits, so that a
/// rank that called something else learns it from the first message a peer sends it,
/// whatever FERROCCL_CHECK says (different calls get equal tags with a chance of 2^-32).
/// Send/recv keep their sequence number: their counts are compared by their handshake.
pub fn tag(c: &Call) -> u32 {
    if !fingerprint::is_collective(&c.coll) {
        return c.seq as u32;
    }
    let d = fingerprint::record_digest(c);
    let t = (d ^ (d >> 32)) as u32;
    // ANY_TAG marks messages of no particular call.
    if t == engine::ANY_TAG {
        t - 1
    } else {
        t
    }
}

/// Exchanges call fingerprints with every peer; `Some(error)` if any rank differs.
pub fn agree(t: &mut Transport, calls: &[Call], ctl: &RunCtl<'_>) -> Result<Option<Error>> {
    if !calls.iter().any(|c| fingerprint::is_collective(&c.coll)) {
        return Ok(None);
    }
    let (me, n) = (t.rank, t.nranks);
    let mine = fingerprint::message(calls);
    let mut theirs = vec![0u8; MSG * n];
    let base = theirs.as_mut_ptr();
    let mut s = Schedule::new(ANY_TAG);
    for p in (0..n).filter(|&p| p != me) {
        s.send(p, mine.as_ptr(), MSG, &[]);
    }
    for p in (0..n).filter(|&p| p != me) {
        // SAFETY: theirs holds n messages of MSG bytes.
        s.recv(p, MSG, Sink::Copy(unsafe { base.add(p * MSG) }), &[]);
    }
    if let Some(e) = engine::run(t, &mut s, ctl)? {
        return Err(e);
    }
    Ok(fingerprint::verdict(me, n, &mine, |p| &theirs[p * MSG..(p + 1) * MSG]))
}
