//! Backends execute validated collectives. Each communicator holds one [`Router`]: an
//! ordered table of the backends it can use (NCCL, then the device path, then the
//! built-in backend), and every call goes to the first that accepts it, as NCCL's
//! transport table picks the first transport whose `canConnect` holds. Every rank
//! builds the same table from the same allgathered facts, so they all route a call
//! the same way.
//!
//! - `nccl`: NCCL, loaded at run time, when every rank has its own GPU.
//! - `ipc`: device memory of ranks that share one GPU, moved GPU to GPU.
//! - `builtin`: everything else: host memory on the host algorithms, device memory
//!   staged through host memory.

pub mod builtin;
pub mod capture;
pub mod host;
pub mod ipc;
pub mod nccl;
pub mod pack;
pub mod staging;

use crate::coll::{Call, Coll, CollKind};
use crate::error::{Error, Result};
use crate::transport::Transport;
use crate::types::DataType;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// The rendezvous's allgather as a backend's set-up sees it: every rank's blob, rank
/// by rank.
pub type Allgather<'a> = dyn FnMut(&[u8]) -> Result<Vec<Vec<u8>>> + 'a;

/// How a run of calls was served: the algorithm that fcclCommGetLastPath and the INFO
/// line name (docs/performance.md), one value per way, as NCCL's NCCL_ALGO_* are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    /// Nothing ran yet.
    None,
    /// host: a small call through the bulletin board, in one step.
    Board,
    /// host: between the ranks' own buffers (every rank maps every other's).
    Mapped,
    /// host: a small send/recv group, copied ahead on the links.
    Eager,
    /// host: a schedule of pieces over the links.
    Schedule,
    /// staged: device memory in chunks through page-locked host memory.
    Pipelined,
    /// a group whose calls took different ways.
    Mixed,
    /// one GPU: a group of collectives and send/recv.
    Group,
    /// one GPU: the executor's one copy launch.
    ExecCopy,
    /// one GPU: in-place all_to_all through device scratch.
    ExecCopyScratch,
    /// ipc, rank 0 of posted calls (checkMode off or unset): handed to its proxy thread, which
    /// enqueues the call on its own stream once every rank's post is read.
    ExecProxy,
    /// one GPU: all_to_all in place on every rank, blocks exchanged pairwise in one launch.
    ExecSwap,
    /// one GPU: strided (axis) copies.
    ExecCopy2d,
    /// one GPU: the executor's one fused reduction launch.
    ExecReduce,
    /// one GPU: a reduce_scatter along an axis, packed then reduced.
    ExecCopy2dReduce,
    /// one GPU under MPS: this rank had no share to move.
    MpsIdle,
    /// one GPU under MPS: every rank reduces its slice.
    MpsSlices,
    /// one GPU under MPS: every rank moves its share.
    MpsShares,
    /// ipc under MPS, posted calls (checkMode off or unset): every rank's proxy thread reads
    /// every post and enqueues this rank's share on its own stream.
    MpsProxy,
    /// one GPU, ranks in one process: this rank waited for the executor on the host.
    HostWait,
    /// one GPU: this rank signalled and waits on its stream.
    SignalWait,
    /// one GPU: as SignalWait, its buffers copied through lent device memory (they
    /// cannot be shared with other processes).
    SignalWaitCopied,
    /// the ranks called different collectives: failed before anything moved.
    Mismatch,
    /// refused before anything moved (a stream being captured into a CUDA graph).
    Refused,
    /// one GPU: send/recv pulled GPU to GPU.
    P2pPull,
    /// one GPU: send/recv, some pulled, some through a bounce buffer.
    P2pPullBounce,
    /// one GPU: send/recv through a bounce buffer.
    P2pBounce,
    /// one GPU: send/recv sizes did not match.
    P2pMismatch,
    /// one GPU: send/recv to this rank itself.
    P2pSelf,
    /// NCCL: enqueued on the stream.
    Enqueued,
}

impl Algo {
    /// The name logs and fcclCommGetLastPath give it.
    pub const fn name(self) -> &'static str {
        match self {
            Algo::None => "none",
            Algo::Board => "board",
            Algo::Mapped => "mapped",
            Algo::Eager => "eager",
            Algo::Schedule => "schedule",
            Algo::Pipelined => "pipelined",
            Algo::Mixed => "mixed",
            Algo::Group => "group",
            Algo::ExecCopy => "exec-copy",
            Algo::ExecCopyScratch => "exec-copy-scratch",
            Algo::ExecProxy => "exec-proxy",
            Algo::ExecSwap => "exec-swap",
            Algo::ExecCopy2d => "exec-copy2d",
            Algo::ExecReduce => "exec-reduce",
            Algo::ExecCopy2dReduce => "exec-copy2d-reduce",
            Algo::MpsIdle => "mps-idle",
            Algo::MpsSlices => "mps-slices",
            Algo::MpsShares => "mps-shares",
            Algo::MpsProxy => "mps-proxy",
            Algo::HostWait => "host-wait",
            Algo::SignalWait => "signal-wait",
            Algo::SignalWaitCopied => "signal-wait-copied",
            Algo::Mismatch => "mismatch",
            Algo::Refused => "refused",
            Algo::P2pPull => "p2p-pull",
            Algo::P2pPullBounce => "p2p-pull+bounce",
            Algo::P2pBounce => "p2p-bounce",
            Algo::P2pMismatch => "p2p-mismatch",
            Algo::P2pSelf => "p2p-self",
            Algo::Enqueued => "enqueued",
        }
    }
}

/// When ranks in separate processes sharing one GPU stop agreeing on their device calls
/// on the host and post them instead (the ipc backend's `posts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Posting {
    /// checkMode fingerprint, set: every call is agreed, so a mismatch fails it alone.
    Never,
    /// checkMode unset: from a call that passed device memory on every rank (NCCL's contract).
    Device,
    /// checkMode off: from the first call every rank can post.
    Always,
}

impl Posting {
    /// What a communicator's checkMode (None: unset) allows.
    pub fn of(check_mode: Option<bool>) -> Posting {
        match check_mode {
            None => Posting::Device,
            Some(false) => Posting::Always,
            Some(true) => Posting::Never,
        }
    }
}

/// What a backend needs of its communicator to run calls.
pub struct Exec<'a> {
    pub t: &'a mut Transport,
    /// The communicator's collective counter: a backend that exchanges messages of
    /// its own numbers them from here, as every rank does the same.
    pub seq: &'a mut u64,
    pub timeout: Duration,
    pub abort: &'a AtomicBool,
    /// checkMode: the ranks compare each call before data moves (over the links too).
    pub check: bool,
    /// Whether ranks sharing one GPU may post their device calls instead of agreeing on
    /// each one (checkMode off, or unset: see [`Posting`]).
    pub posting: Posting,
    /// Whether CUDA is in use in this process (`cuda::active()`), asked once per run by
    /// whoever makes the `Exec`: without CUDA each ask walks the loaded libraries.
    pub cuda: bool,
    /// What served the last run (for the log line and fcclCommGetLastPath): the
    /// backend's name for it ("host", "staged", "ipc", "nccl", "mixed"), set by the
    /// router and changed by a backend that hands a call to another way of running it.
    pub backend: &'static str,
    /// How the last run was served: a short name, set by the backend (docs/performance.md lists them).
    pub algo: Algo,
    /// Host exchanges with the other ranks the run made besides its data (descriptor
    /// exchanges, votes, barriers: [`Exec::allgather`], [`Exec::barrier`]), for
    /// fcclCommGetLastExchanges and the cost model.
    pub exchanges: u32,
}

/// How a run of calls ended when the communicator survived it. A run returns
/// `Result<Outcome>`: `Err` broke the communicator (a peer vanished, a timeout, a
/// corrupt stream); `Ok(Outcome::Failed)` failed these calls only (ranks disagreed on
/// them) and the communicator stays usable.
#[must_use]
#[derive(Debug)]
pub enum Outcome {
    Done,
    Failed(Error),
}

impl Outcome {
    /// The calls' result for their caller (either way the communicator is usable).
    pub fn into_result(self) -> Result<()> {
        match self {
            Outcome::Done => Ok(()),
            Outcome::Failed(e) => Err(e),
        }
    }
}

impl From<Option<Error>> for Outcome {
    fn from(e: Option<Error>) -> Outcome {
        e.map_or(Outcome::Done, Outcome::Failed)
    }
}

impl Exec<'_> {
    /// Every rank's `mine` (the same length on every rank), rank by rank, gathered over
    /// the communicator's links at sequence number `seq` (None: the communicator's
    /// next, as every rank takes it): the exchange a backend makes for its own
    /// protocol (descriptors, plans). What served the call (`algo`) is left as it was.
    pub fn allgather(&mut self, mine: &[u8], seq: Option<u64>) -> Result<(Vec<u8>, Outcome)> {
        let mut all = vec![0u8; mine.len() * self.t.nranks];
        let ex = Coll::new(CollKind::AllGather, mine.as_ptr(), all.as_mut_ptr(), mine.len(), DataType::Uint8);
        let r = self.on_links(ex, seq)?;
        Ok((all, r))
    }

    /// A barrier over the communicator's links at its next sequence number.
    pub fn barrier(&mut self) -> Result<Outcome> {
        self.on_links(Coll::new(CollKind::Barrier, std::ptr::null(), std::ptr::null_mut(), 0, DataType::Uint8), None)
    }

    fn on_links(&mut self, coll: Coll, seq: Option<u64>) -> Result<Outcome> {
        let seq = seq.unwrap_or_else(|| {
            *self.seq += 1;
            *self.seq
        });
        let algo = self.algo;
        self.exchanges += 1;
        let r = host::execute(self, &[Call { coll, seq }]);
        self.algo = algo;
        r
    }
}

/// One way of executing collectives.
pub trait Backend: Send + Sync {
    /// The backend's identity ("nccl", "ipc", "builtin").
    fn id(&self) -> &'static str;
    /// The backend's name for a call it accepts, as logs show it.
    fn name(&self, c: &Coll) -> &'static str {
        let _ = c;
        self.id()
    }
    /// Whether this backend runs `c`; `alone`: `c` is a whole run, not part of a group.
    /// Must depend only on facts every rank shares and on `c` itself.
    fn accepts(&self, c: &Coll, alone: bool) -> bool;
    /// Runs `calls` (all accepted) as one unit. `Err` is fatal for the communicator;
    /// `Ok(Outcome::Failed(e))` failed the calls and left the communicator usable.
    fn run(&self, x: &mut Exec<'_>, calls: &[Call]) -> Result<Outcome>;
    /// Ends this backend's waits from another thread (fcclCommAbort).
    fn abort(&self) {}
    /// An error that broke the communicator outside any call (work left on a stream
    /// that could not finish), for fcclCommGetAsyncError.
    fn async_error(&self) -> Option<Error> {
        None
    }
}

/// A communicator's backends, in order of preference; the last accepts everything.
pub struct Router {
    table: Vec<Box<dyn Backend>>,
}

impl Router {
    /// `table` in order of preference; its last entry must accept every call.
    pub fn new(table: Vec<Box<dyn Backend>>) -> Router {
        assert!(!table.is_empty(), "a router needs a backend that takes every call");
        Router { table }
    }

    /// The index of the backend that serves `c`.
    fn route(&self, c: &Coll, alone: bool) -> usize {
        let last = self.table.len() - 1;
        self.table[..last].iter().position(|b| b.accepts(c, alone)).unwrap_or(last)
    }

    /// Whether a backend before the last takes `calls` (host memory included).
    pub fn claims(&self, calls: &[Call]) -> bool {
        let last = self.table.len() - 1;
        let alone = calls.len() == 1;
        calls.iter().any(|c| self.route(&c.coll, alone) < last)
    }

    /// The backend serving `c` when it runs alone, for logs.
    pub fn name_of(&self, c: &Coll) -> &'static str {
        self.table[self.route(c, true)].name(c)
    }

    /// The name of each call's backend (in a run of `calls`).
    pub fn names(&self, calls: &[Call]) -> Vec<&'static str> {
        let alone = calls.len() == 1;
        calls.iter().map(|c| self.table[self.route(&c.coll, alone)].name(&c.coll)).collect()
    }

    /// Runs `calls` as one unit: each backend runs the calls it serves, in table
    /// order, which every rank follows, so a group split over backends still pairs up.
    pub fn run(&self, x: &mut Exec<'_>, calls: &[Call]) -> Result<Outcome> {
        if let [c] = calls {
            let b = &self.table[self.route(&c.coll, true)];
            x.backend = b.name(&c.coll);
            return b.run(x, calls);
        }
        let routes: Vec<usize> = calls.iter().map(|c| self.route(&c.coll, false)).collect();
        let mut first_err = None;
        let mut algos: Vec<Algo> = Vec::new();
        let mut backends: Vec<&'static str> = Vec::new();
        for (i, b) in self.table.iter().enumerate() {
            let mine: Vec<Call> = calls
                .iter()
                .zip(&routes)
                .filter(|(_, &r)| r == i)
                .map(|(c, _)| Call { coll: c.coll.clone(), seq: c.seq })
                .collect();
            if mine.is_empty() {
                continue;
            }
            x.backend = mine.iter().map(|c| b.name(&c.coll)).find(|&n| n != "host").unwrap_or("host");
            if let Outcome::Failed(e) = b.run(x, &mine)? {
                first_err.get_or_insert(e);
            }
            algos.push(x.algo);
            backends.push(x.backend);
        }
        if algos.len() > 1 {
            x.algo = Algo::Mixed;
            x.backend = if backends.iter().all(|&b| b == backends[0]) { backends[0] } else { "mixed" };
        }
        Ok(first_err.into())
    }

    /// Runs `calls` of host memory that no backend but the last claims (see
    /// [`Router::claims`]) on the last, without routing each: the host path's fast lane.
    pub fn run_host(&self, x: &mut Exec<'_>, calls: &[Call]) -> Result<Outcome> {
        self.table[self.table.len() - 1].run(x, calls)
    }

    /// The first backend's error that broke the communicator outside any call.
    pub fn async_error(&self) -> Option<Error> {
        self.table.iter().find_map(|b| b.async_error())
    }

    /// Ends every backend's waits (fcclCommAbort).
    pub fn abort(&self) {
        for b in &self.table {
            b.abort();
        }
    }

    /// The backends in order of preference, for logs ("nccl > builtin").
    pub fn describe(&self) -> String {
        self.table.iter().map(|b| b.id()).collect::<Vec<_>>().join(" > ")
    }

    /// The backend that serves device memory first: "nccl", "ipc" or "builtin".
    pub fn device_backend(&self) -> &'static str {
        self.table[0].id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::CollKind;
    use crate::transport::inproc;
    use crate::types::DataType;
    use std::sync::{Arc, Mutex};

    type Log = Arc<Mutex<Vec<Vec<u64>>>>;

    /// Takes calls of one kind and records the sequence numbers of each run.
    struct Takes {
        kind: CollKind,
        id: &'static str,
        runs: Log,
    }

    impl Backend for Takes {
        fn id(&self) -> &'static str {
            self.id
        }
        fn accepts(&self, c: &Coll, _: bool) -> bool {
            c.kind == self.kind
        }
        fn run(&self, x: &mut Exec<'_>, calls: &[Call]) -> Result<Outcome> {
            // A way of its own per backend, to tell which one ran.
            x.algo = if self.id == "first" { Algo::Board } else { Algo::Schedule };
            self.runs.lock().unwrap().push(calls.iter().map(|c| c.seq).collect());
            Ok(Outcome::Done)
        }
    }

    fn call(kind: CollKind, seq: u64) -> Call {
        Call { coll: Coll::new(kind, std::ptr::null(), std::ptr::null_mut(), 0, DataType::Uint8), seq }
    }

    #[test]
    fn the_first_backend_that_accepts_serves_and_groups_split_in_table_order() {
        let logs: Vec<Log> = (0..3).map(|_| Log::default()).collect();
        let mk = |kind, id, i: usize| -> Box<dyn Backend> { Box::new(Takes { kind, id, runs: logs[i].clone() }) };
        let router = Router::new(vec![
            mk(CollKind::Broadcast, "first", 0),
            mk(CollKind::AllReduce, "second", 1),
            mk(CollKind::AllReduce, "shadowed", 2),
        ]);
        assert_eq!(router.describe(), "first > second > shadowed");
        assert_eq!(router.device_backend(), "first");
        // No earlier entry takes a barrier: the last one serves it, whatever it accepts.
        assert_eq!(router.name_of(&call(CollKind::Barrier, 0).coll), "shadowed");
        assert_eq!(router.name_of(&call(CollKind::AllReduce, 0).coll), "second");

        let mut t = inproc::build(1).unwrap().pop().unwrap();
        let (abort, mut seq) = (AtomicBool::new(false), 0);
        let mut x = Exec {
            t: &mut t,
            seq: &mut seq,
            timeout: Duration::from_secs(1),
            abort: &abort,
            check: false,
            posting: Posting::Never,
            cuda: false,
            backend: "",
            algo: Algo::None,
            exchanges: 0,
        };
        let group = [
            call(CollKind::AllReduce, 1),
            call(CollKind::Broadcast, 2),
            call(CollKind::AllReduce, 3),
            call(CollKind::Barrier, 4),
        ];
        assert!(matches!(router.run(&mut x, &group).unwrap(), Outcome::Done));
        assert_eq!((x.backend, x.algo), ("mixed", Algo::Mixed));
        assert_eq!(router.names(&group), ["second", "first", "second", "shadowed"]);
        assert!(matches!(router.run(&mut x, &group[1..2]).unwrap(), Outcome::Done));
        assert_eq!((x.backend, x.algo), ("first", Algo::Board));
        let runs = |i: usize| logs[i].lock().unwrap().clone();
        // Each backend ran its share once, calls in their order; the lone call after.
        assert_eq!(runs(0), vec![vec![2], vec![2]]);
        assert_eq!(runs(1), vec![vec![1, 3]]);
        assert_eq!(runs(2), vec![vec![4]]);
    }
}
