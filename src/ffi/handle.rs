//! Communicator handles: ids that are never reused, so a destroyed or foreign
//! handle is recognised as such instead of being dereferenced.

use super::{fcclComm, fcclComm_t};
use crate::comm::Comm;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

static NEXT: AtomicU64 = AtomicU64::new(1);
static LIVE: RwLock<Option<HashMap<u64, Arc<Comm>, IdHash>>> = RwLock::new(None);

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
    LIVE.write()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(|| HashMap::with_hasher(IdHash))
        .insert(id_of(h), Arc::new(c));
}

/// The live communicator behind a handle.
pub fn get(h: fcclComm_t) -> Result<Arc<Comm>> {
    if h.is_null() {
        return Err(Error::invalid_arg("comm is NULL; pass a communicator from fcclCommInit*"));
    }
    let live = LIVE.read().unwrap_or_else(|p| p.into_inner());
    live.as_ref().and_then(|m| m.get(&id_of(h))).cloned().ok_or_else(|| not_live(h))
}

/// Removes a handle; the communicator is freed once no call still uses it.
pub fn remove(h: fcclComm_t) -> Result<Arc<Comm>> {
    if h.is_null() {
        return Err(Error::invalid_arg("comm is NULL; pass a communicator from fcclCommInit*"));
    }
    LIVE.write()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
        .and_then(|m| m.remove(&id_of(h)))
        .ok_or_else(|| not_live(h))
}

fn not_live(h: fcclComm_t) -> Error {
    Error::invalid_arg(format!(
        "comm {h:p} is not a live communicator (already destroyed, or not made by fcclCommInit*/fcclCommSplit)"
    ))
}
