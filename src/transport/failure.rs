//! How ranks learn that a peer failed or stopped: the failure word every rank
//! publishes when it fails (in its segment, or as a notice on a TCP link), the wait
//! word a slow wait publishes, and the blame a timed-out wait derives from the
//! others' wait words. See docs/design/host.md, "Failures and timeouts".

use crate::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Failure words: 1 + the rank the failure started with in the low 24 bits, and why
/// in the high 8 (0: it died or failed; this: the word's owner timed out waiting for
/// it); u32::MAX: an abort.
pub const FAILED_TIMEOUT: u32 = 1 << 24;
/// Why, in a failure word: the word's owner found that the ranks called different
/// collectives (from a message of a peer), so peers fail with that verdict too.
pub const FAILED_MISMATCH: u32 = 2 << 24;
const FAILED_RANK: u32 = FAILED_TIMEOUT - 1;

/// The error for a peer whose failure word holds `v` (see [`FAILED_TIMEOUT`]).
#[cold]
pub(crate) fn failure(peer: usize, v: u32) -> Error {
    let culprit = ((v & FAILED_RANK) - 1) as usize;
    if v == u32::MAX {
        Error::remote_rank(peer, format!("rank {peer} failed or aborted its communicator"))
    } else if v & !FAILED_RANK == FAILED_MISMATCH {
        Error::mismatch(format!(
            "rank {peer} found that the ranks called different collectives (this call's collective, count, type, op or root differs between ranks; its error names the calls). The communicator is unusable now: destroy it (FERROCCL_CHECK=1, the default, compares the calls before any data moves)"
        ))
    } else if v & !FAILED_RANK == FAILED_TIMEOUT {
        Error::remote_rank(
            culprit,
            format!(
                "rank {culprit} stopped making progress: rank {peer} timed out waiting for it (it is stopped, hung, or slower than FERROCCL_TIMEOUT_MS allows)"
            ),
        )
    } else if culprit == peer {
        Error::remote_rank(peer, format!("rank {peer} failed or aborted its communicator"))
    } else {
        Error::remote_rank(
            culprit,
            format!("rank {culprit} died or failed (reported by rank {peer}, which stopped because of it)"),
        )
    }
}

/// In a wait word (high 32 bits): waiting for the whole team, no rank in particular.
pub const WAIT_TEAM: u32 = u32::MAX;

/// A wait word of whom `target` says (0, [`WAIT_TEAM`] or 1 + rank) at `tick`.
pub fn wait_word(target: u32, tick: u32) -> u64 {
    (u64::from(target) << 32) | u64::from(tick)
}

/// How long a timed-out rank watches the others' wait words: longer than a waiter's
/// longest sleep between two ticks (20 ms).
pub const BLAME_GAP: Duration = Duration::from_millis(60);

/// The ranks that a timed-out wait of rank `me` for `start` (for the whole team when
/// empty) comes down to: the ranks that are not live waiters (a live waiter waits for
/// someone and advances its tick), among those `me` waits for if any, else among all;
/// when every rank waits (a deadlock of mismatched calls), the ones `me` waits for.
/// `word(p)` reads rank p's wait word (None where it cannot be seen: a peer on another
/// host, which counts as not waiting). The words are sampled twice, `gap` apart
/// (longer than a waiter's sleep between ticks), while `me` keeps ticking its own
/// (`own`), so that ranks timing out together see each other wait.
pub fn blame(
    me: usize,
    n: usize,
    word: impl Fn(usize) -> Option<u64>,
    own: Option<&AtomicU64>,
    start: &[usize],
    gap: Duration,
) -> Vec<usize> {
    let first: Vec<Option<u64>> = (0..n).map(&word).collect();
    let tick_own = || {
        if let Some(w) = own {
            let v = w.load(Ordering::Relaxed);
            let target = if v >> 32 != 0 { (v >> 32) as u32 } else { WAIT_TEAM };
            w.store(wait_word(target, (v as u32).wrapping_add(1)), Ordering::Release);
        }
    };
    let step = Duration::from_millis(5);
    let t0 = std::time::Instant::now();
    while t0.elapsed() < gap {
        tick_own();
        std::thread::sleep(step);
    }
    let live = |p: usize| match (first[p], word(p)) {
        (Some(a), Some(b)) => b >> 32 != 0 && a != b && a >> 32 == b >> 32,
        _ => false,
    };
    let stuck_of = |ranks: &mut dyn Iterator<Item = usize>| ranks.filter(|&p| p != me && !live(p)).collect::<Vec<_>>();
    let direct = stuck_of(&mut start.iter().copied());
    if !direct.is_empty() {
        return direct;
    }
    let anyone = stuck_of(&mut (0..n));
    if !anyone.is_empty() {
        return anyone;
    }
    start.iter().copied().filter(|&p| p != me).collect()
}

/// The end of a timeout message: the ranks the wait comes down to, when they are not
/// simply the ones it waited for.
pub fn cause_of(me: usize, culprits: &[usize], waited: &[usize]) -> String {
    let list = |v: &[usize]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
    match culprits {
        [] => String::new(),
        [c] if waited == [*c] => format!(
            "; rank {c} stopped making progress (it is stopped, hung, or slower than FERROCCL_TIMEOUT_MS allows)"
        ),
        [c] if waited.is_empty() => {
            format!("; rank {c} stopped making progress while the others wait for it (it is stopped, hung, or slow)")
        }
        [c] => format!(
            "; this comes down to rank {c}, which stopped making progress while the others wait for it (rank {me} waited for {})",
            list(waited)
        ),
        cs => format!("; this comes down to ranks {}, which stopped making progress", list(cs)),
    }
}
