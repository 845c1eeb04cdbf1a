//! Which recvbuffs are likely still in the caches.
//!
//! Results of FERROCCL_STREAM_MIN bytes and more are written with streaming stores,
//! which skip reading each destination line first: right for buffers that have left
//! the caches, as a benchmark that rotates its buffers (nccl-tests, ferroccl-bench)
//! sees them. A program that calls collectives again and again on the same tensor
//! finds that tensor's lines in the caches instead, where ordinary stores hit them
//! and streaming stores push every byte out to memory, several times slower there
//! (docs/design/host.md, "Streaming stores").
//!
//! So each host run notes the recvbuffs its calls write, and the next run on the
//! same thread writes with ordinary stores into any of them that is at most
//! FERROCCL_REUSE_MAX bytes (a quarter of the last-level cache by default): a
//! buffer written by the call just before is in the caches if anything is. The
//! choice is each rank's own and changes only how bytes are stored (every writer
//! orders its own streaming stores), never which messages go where.

use std::cell::RefCell;

/// Ranges remembered per run; a group with more recvbuffs keeps its first ones.
const KEPT: usize = 4;

type Ranges = [(usize, usize); KEPT];

/// The recvbuffs of the previous run on this thread and of the current one:
/// (start address, length), empty slots of length 0.
struct Recent {
    prev: Ranges,
    cur: Ranges,
}

thread_local! {
    static RECENT: RefCell<Recent> = const { RefCell::new(Recent { prev: [(0, 0); KEPT], cur: [(0, 0); KEPT] }) };
}

/// Starts a run whose calls write `recvbuffs` (address and length each): what the
/// previous run wrote becomes what [`cached`] answers from.
///
/// Recvbuffs below FERROCCL_STREAM_MIN are not noted: [`cached`] is asked only
/// about stores that would stream, never inside one of them. So a run of small
/// calls, after the first, finds nothing to note and nothing to forget and
/// returns at once (this is on every call's path).
pub fn begin(recvbuffs: impl IntoIterator<Item = (*const u8, usize)>) {
    begin_with(recvbuffs, crate::env::stream_min(), crate::env::reuse_max());
}

fn begin_with(recvbuffs: impl IntoIterator<Item = (*const u8, usize)>, min: usize, max: usize) {
    let mut fits =
        recvbuffs.into_iter().filter(|&(p, len)| !p.is_null() && len > 0 && len >= min && len <= max).peekable();
    RECENT.with_borrow_mut(|r| {
        if fits.peek().is_none() && r.cur[0].1 == 0 && r.prev[0].1 == 0 {
            return;
        }
        r.prev = r.cur;
        r.cur = [(0, 0); KEPT];
        for (slot, (p, len)) in r.cur.iter_mut().zip(fits) {
            *slot = (p as usize, len);
        }
    });
}

/// Whether `[dst, dst + len)` lies in a recvbuff that the previous run on this
/// thread wrote (and that was small enough to stay in the caches).
pub fn cached(dst: *const u8, len: usize) -> bool {
    let (a, b) = (dst as usize, (dst as usize).saturating_add(len));
    RECENT.with_borrow(|r| r.prev.iter().any(|&(p, l)| l > 0 && a >= p && b <= p + l))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(addr: usize) -> *const u8 {
        addr as *const u8
    }

    #[test]
    fn answers_from_the_previous_run_only() {
        begin_with([(at(0x10000), 4096)], 0, 1 << 20);
        assert!(!cached(at(0x10000), 4096), "nothing ran before");
        begin_with([(at(0x20000), 4096)], 0, 1 << 20);
        assert!(cached(at(0x10000), 4096));
        assert!(cached(at(0x10800), 1024), "a part of it");
        assert!(!cached(at(0x10800), 4096), "reaches past it");
        assert!(!cached(at(0x20000), 4096), "the current run's own");
        begin_with([], 0, 1 << 20);
        assert!(cached(at(0x20000), 4096));
        assert!(!cached(at(0x10000), 4096), "two runs ago");
        begin_with([], 0, 1 << 20);
        assert!(!cached(at(0x20000), 4096), "a run between");
    }

    #[test]
    fn large_buffers_are_not_remembered() {
        begin_with([(at(0x10000), 2 << 20), (at(0x800000), 1 << 20)], 0, 1 << 20);
        begin_with([], 0, 1 << 20);
        assert!(!cached(at(0x10000), 4096), "larger than the limit");
        assert!(cached(at(0x800000), 1 << 20));
        // A limit of 0 turns it off.
        begin_with([(at(0x10000), 4096)], 0, 0);
        begin_with([], 0, 0);
        assert!(!cached(at(0x10000), 4096));
    }

    #[test]
    fn buffers_below_the_streaming_size_are_not_noted() {
        begin_with([(at(0x10000), 4096)], 0, 1 << 20);
        begin_with([(at(0x20000), 1024)], 4096, 1 << 20);
        assert!(cached(at(0x10000), 4096));
        assert!(!cached(at(0x20000), 1024), "nothing below 4096 was noted");
        begin_with([(at(0x20000), 1024)], 4096, 1 << 20);
        assert!(!cached(at(0x10000), 4096), "a run of small calls still forgets");
    }

    #[test]
    fn keeps_the_first_ranges_of_a_group() {
        let many: Vec<(*const u8, usize)> = (1..=KEPT + 2).map(|i| (at(i << 20), 4096)).collect();
        begin_with(many, 0, 1 << 20);
        begin_with([], 0, 1 << 20);
        assert!(cached(at(1 << 20), 4096));
        assert!(cached(at(KEPT << 20), 4096));
        assert!(!cached(at((KEPT + 1) << 20), 4096));
        assert!(!cached(std::ptr::null(), 0), "an empty range is in no recorded buffer");
    }
}
