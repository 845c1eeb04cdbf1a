//! The progress engine: runs a schedule of sends, receives and local steps over the
//! links of one rank until every step is done.
//!
//! A collective is compiled into a [`Schedule`] (a small DAG: each step may wait for
//! earlier ones); the engine drives all of it at once, so sends to one peer, receives
//! from another and local reductions overlap, and rings never deadlock as long as
//! the ranks' schedules agree. Messages to a peer are written in schedule order and
//! read in schedule order; point-to-point messages have their own handshake (the
//! receiver announces its count when it posts the receive, the sender its count in
//! the header; large payloads follow once the counts agree) so that a count mismatch
//! is reported on both sides and leaves the streams aligned. See
//! docs/design/host.md, "The engine".
//!
//! By concern: [`wire`] (the message format, shared with `eager`), `schedule`
//! (what a run is made of), `exchange` (two buffers exchanged in place), `state`
//! (what a run keeps per peer), `inplace` (send and receive over one buffer),
//! `direct` (which messages go by address), `split` (copies shared by sender and
//! receiver), `p2p` (the send/recv handshake), `idle` (waiting and what bounds it),
//! `run` (the loop), `tx` and `rx` (a peer's two streams).

mod direct;
mod exchange;
mod idle;
mod inplace;
mod p2p;
mod run;
mod rx;
mod schedule;
mod split;
mod state;
mod tx;

#[cfg(test)]
mod tests;

pub use super::msg::ANY_TAG;
pub use direct::goes_direct_to_all;
pub use exchange::Exchange;
pub use idle::{waiting_message, Idle, RunCtl, Waits};
pub use run::run;
pub use schedule::{Action, Block, LocalFn, Schedule, Sink, Step, Via};
