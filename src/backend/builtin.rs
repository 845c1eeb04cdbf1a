//! The built-in backend as a router entry: host memory runs on the host algorithms;
//! device memory is staged through host memory around them (see `staging`: a call
//! alone in chunks, pipelined; a group whole). It takes every call, so it ends every
//! communicator's table.

use super::{host, staging, Backend, Exec, Outcome};
use crate::coll::{Call, Coll};
use crate::error::Result;
use crate::mem::Placement;

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
        if calls.iter().all(|c| c.coll.placement == Placement::Host || c.coll.is_noop()) {
            return host::execute(x, calls);
        }
        if let [call] = calls {
            return staging::run(x, call, self.rank, self.nranks);
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
