//! How a rank waits for its peers: it spins, then yields, then sleeps on a 32-bit
//! word shared between threads or processes (Linux futex), as [`SpinPolicy`] says.
//!
//! Sleeping keeps ranks that outnumber the cores from stealing the core a peer needs.
//! The futex is not "private": the word may live in memory mapped by several
//! processes. See docs/design/host.md, "Waiting".

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// How long a waiter spins before it yields, and before it sleeps.
#[derive(Clone, Copy)]
pub struct SpinPolicy {
    pub spin: Duration,
    pub yield_until: Duration,
    /// More ranks than CPUs: ranks take turns on cores.
    pub shares_cores: bool,
}

impl SpinPolicy {
    /// With at least a core per rank, spinning wins (the peer is microseconds away),
    /// but not for long: the scheduler sometimes leaves two ranks on one CPU while
    /// another idles, and then every wait lasts as long as the spin. With more ranks
    /// than cores, a spinning rank takes the core its peer needs, so it yields almost
    /// at once and soon sleeps.
    ///
    /// `cpus` is how many CPUs the ranks of this host may run on together: each rank
    /// pinned to its own CPU still has a CPU per rank.
    pub fn for_ranks(local_ranks: usize, cpus: usize) -> SpinPolicy {
        if local_ranks > cpus {
            SpinPolicy { spin: Duration::from_micros(2), yield_until: Duration::from_micros(20), shares_cores: true }
        } else {
            SpinPolicy { spin: Duration::from_micros(20), yield_until: Duration::from_micros(300), shares_cores: false }
        }
    }
}

/// Sleeps while `*word == expected`, at most `timeout`. Spurious returns are fine:
/// callers re-check their condition.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call; the
    // kernel only reads it and the timespec, which lives on this stack frame.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every waiter sleeping on `word`.
pub fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32; FUTEX_WAKE does not dereference
    // anything else.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, std::ptr::null::<u8>(), 0usize, 0u32);
    }
}
