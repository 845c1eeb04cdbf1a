//! Communicator handles: ids that are never reused, so a destroyed or foreign
//! handle is recognised as such instead of being dereferenced. A handle of a
//! non-blocking creation exists before its communicator does.

use super::{fcclComm, fcclComm_t};
use crate::comm::creation::{Creation, Poll};
use crate::comm::Comm;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};

static NEXT: AtomicU64 = AtomicU64::new(1);
static LIVE: RwLock<Option<HashMap<u64, Entry, IdHash>>> = RwLock::new(None);

/// What a handle stands for.
enum Entry {
    Ready(Arc<Comm>),
    /// Slot `.1` of a creation still running (or failed); the first lookup after it
    /// made the communicator turns the entry into `Ready`.
    Creating(Arc<Creation>, usize),
}

/// A handle as fcclCommGetAsyncError sees it.
pub enum State {
    Ready(Arc<Comm>),
    Creating,
    Failed(Error),
}

/// What fcclCommDestroy and fcclCommAbort release.
pub enum Removed {
    Comm(Arc<Comm>),
    Creating(Arc<Creation>, usize),
}

/// Ids are sequential integers chosen by us, not by an attacker: a multiplicative
/// hash spreads them well and costs a few cycles (SipHash showed up in profiles of
/// small collectives).
#[derive(Default, Clone, Copy)]
struct IdHash;
impl std::hash::BuildHasher for IdHash {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(0)
    }
}
struct IdHasher(u64);
impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

fn id_of(h: fcclComm_t) -> u64 {
    (h as usize as u64) >> 4
}

/// Registers a communicator and returns its handle.
pub fn register(c: Comm) -> fcclComm_t {
    let h = reserve();
    fill(h, c);
    h
}

/// A handle whose communicator comes later (init inside a group); until [`fill`]
/// it is refused like a handle that does not exist.
pub fn reserve() -> fcclComm_t {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    // Looks like an aligned pointer; never dereferenced.
    ((id << 4) as usize) as *mut fcclComm
}

/// Attaches a communicator to a reserved handle.
pub fn fill(h: fcclComm_t, c: Comm) {
    insert(h, Entry::Ready(Arc::new(c)));
}

/// A handle for slot `i` of a background creation: usable once fcclCommGetAsyncError
/// reports fcclSuccess on it.
pub fn register_creating(cr: &Arc<Creation>, i: usize) -> fcclComm_t {
    let h = reserve();
    insert(h, Entry::Creating(Arc::clone(cr), i));
    h
}

fn insert(h: fcclComm_t, e: Entry) {
    LIVE.write()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(|| HashMap::with_hasher(IdHash))
        .insert(id_of(h), e);
}

/// How many handles were removed so far: a thread's cached lookup (see [`LAST`])
/// stands only while this has not moved.
static REMOVED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's last lookup: (id, REMOVED when it was made, the communicator).
    /// A program calls collectives on one communicator after another, and taking the
    /// table's lock for each cost as much as a small collective's fingerprint. The
    /// reference is weak, so a destroyed communicator is freed when its last call
    /// ends, as without the cache.
    static LAST: std::cell::RefCell<(u64, u64, Weak<Comm>)> = const { std::cell::RefCell::new((0, 0, Weak::new())) };
}

/// The live communicator behind a handle.
pub fn get(h: fcclComm_t) -> Result<Arc<Comm>> {
    if h.is_null() {
        return Err(Error::invalid_arg("comm is NULL; pass a communicator from fcclCommInit*"));
    }
    let id = id_of(h);
    // Read before the table: a removal after this read makes the next lookup miss.
    let removed = REMOVED.load(Ordering::Acquire);
    let hit = LAST.with(|l| {
        let l = l.borrow();
        (l.0 == id && l.1 == removed).then(|| l.2.upgrade()).flatten()
    });
    if let Some(c) = hit {
        return Ok(c);
    }
    let c = match lookup(h, removed)? {
        State::Ready(c) => c,
        State::Creating => {
            return Err(Error::invalid_usage(format!(
                "comm {h:p} is still being created (non-blocking fcclCommInitRankConfig or fcclCommSplit); poll fcclCommGetAsyncError on it until it returns fcclSuccess before using it"
            )))
        }
        State::Failed(e) => {
            return Err(Error::invalid_usage(format!(
                "comm {h:p} could not be created ({}); destroy it (fcclCommGetAsyncError returns the error)",
                e.msg
            )))
        }
    };
    Ok(c)
}

/// The handle's communicator, or where its creation stands.
pub fn state(h: fcclComm_t) -> Result<State> {
    if h.is_null() {
        return Err(Error::invalid_arg("comm is NULL; pass a communicator from fcclCommInit*"));
    }
    lookup(h, REMOVED.load(Ordering::Acquire))
}

/// The table's answer for `h` (`removed`: REMOVED read before); a ready communicator
/// becomes this thread's cached lookup.
fn lookup(h: fcclComm_t, removed: u64) -> Result<State> {
    let id = id_of(h);
    let live = LIVE.read().unwrap_or_else(|p| p.into_inner());
    let c = match live.as_ref().and_then(|m| m.get(&id)) {
        None => return Err(not_live(h)),
        Some(Entry::Ready(c)) => Arc::clone(c),
        Some(Entry::Creating(..)) => {
            drop(live);
            match promote(h)? {
                State::Ready(c) => c,
                other => return Ok(other),
            }
        }
    };
    LAST.with(|l| *l.borrow_mut() = (id, removed, Arc::downgrade(&c)));
    Ok(State::Ready(c))
}

/// Where a creating handle stands; a communicator just made replaces its entry.
fn promote(h: fcclComm_t) -> Result<State> {
    let mut live = LIVE.write().unwrap_or_else(|p| p.into_inner());
    let e = live.as_mut().and_then(|m| m.get_mut(&id_of(h))).ok_or_else(|| not_live(h))?;
    let made = match e {
        Entry::Ready(c) => return Ok(State::Ready(Arc::clone(c))),
        Entry::Creating(cr, i) => match cr.poll(*i) {
            Poll::Ready(c) => Arc::from(c),
            Poll::Pending => return Ok(State::Creating),
            Poll::Failed(e) => return Ok(State::Failed(e)),
        },
    };
    *e = Entry::Ready(Arc::clone(&made));
    Ok(State::Ready(made))
}

/// Removes a handle; the communicator is freed once no call still uses it.
pub fn remove(h: fcclComm_t) -> Result<Removed> {
    if h.is_null() {
        return Err(Error::invalid_arg("comm is NULL; pass a communicator from fcclCommInit*"));
    }
    let e = LIVE
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
        .and_then(|m| m.remove(&id_of(h)))
        .ok_or_else(|| not_live(h))?;
    // After the table changed: every thread's cached lookup now misses.
    REMOVED.fetch_add(1, Ordering::AcqRel);
    Ok(match e {
        Entry::Ready(c) => Removed::Comm(c),
        Entry::Creating(cr, i) => Removed::Creating(cr, i),
    })
}

fn not_live(h: fcclComm_t) -> Error {
    Error::invalid_arg(format!(
        "comm {h:p} is not a live communicator (already destroyed, or not made by fcclCommInit*/fcclCommSplit)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{Comm, Options};

    #[test]
    fn removed_handle_is_refused_while_a_call_still_holds_it() {
        let c = Comm::init_all(1, Options::default(), None).unwrap().pop().unwrap();
        let h = register(c);
        // This thread's lookup is now cached.
        let held = get(h).unwrap();
        assert!(Arc::ptr_eq(&held, &get(h).unwrap()));
        // Another call (`held`) still runs on it when the handle is removed: the
        // communicator lives on, but the handle must not be found any more.
        assert!(matches!(remove(h).unwrap(), Removed::Comm(_)));
        let e = get(h).err().expect("a removed handle was found");
        assert!(e.msg.contains("is not a live communicator"), "{}", e.msg);
        drop(held);
        assert!(get(h).is_err());
        // A handle of another communicator replaces the cached lookup.
        let h2 = register(Comm::init_all(1, Options::default(), None).unwrap().pop().unwrap());
        assert!(get(h2).is_ok() && get(h).is_err());
        remove(h2).unwrap();
    }
}
