//! The control page of a communicator whose ranks share one GPU: one page of host
//! shared memory that every rank maps and registers with CUDA (host-mapped), so that
//! the ranks' streams order themselves with stream memory operations
//! (`cuStreamWriteValue32` / `cuStreamWaitValue32`) on its words, and the host can read
//! them (to know what the GPU has done) and write them (to release waits that would
//! never end) without asking the GPU.
//!
//! Words, each on its own 64-byte line: `done` (the last call the executor finished),
//! `ready[r]` (the last call whose inputs rank r's stream had ready), `failed`
//! (non-zero once a rank gave up on the communicator; every rank sees it).

use crate::error::{Error, Result};
use crate::mem::cuda;
use std::ffi::CString;
use std::sync::atomic::{AtomicU32, Ordering};

const PAGE: usize = 4096;
const LINE: usize = 64;
const DONE: usize = 0;
const FAILED: usize = PAGE - LINE;
/// Ranks the page has lines for.
pub const MAX_RANKS: usize = PAGE / LINE - 2;

/// One process's mapping of a communicator's control page.
pub struct Ctl {
    host: *mut u8,
    /// Device address of the page in `ctx`.
    dev: usize,
    ctx: usize,
    /// The shared-memory name; the creator unlinks it when done.
    name: CString,
    owner: bool,
}

// SAFETY: the page is shared memory accessed only through atomics (host) and stream
// operations (device); the pointer itself is never reassigned.
unsafe impl Send for Ctl {}
// SAFETY: as above.
unsafe impl Sync for Ctl {}

impl Ctl {
    /// The page's shared-memory name for communicator `nonce` created by process `pid`
    /// (the `-p<pid>` suffix lets a later process remove it if `pid` dies first).
    pub fn name(nonce: u64, pid: u32) -> String {
        format!("/fccl-ctl-{nonce:016x}-p{pid}")
    }

    /// Creates the page (zeroed) and maps it for this process and context `ctx`.
    pub fn create(name: &str, ctx: usize) -> Result<Ctl> {
        Self::map(name, ctx, true)
    }

    /// Maps the page another rank created.
    pub fn open(name: &str, ctx: usize) -> Result<Ctl> {
        Self::map(name, ctx, false)
    }

    fn map(name: &str, ctx: usize, create: bool) -> Result<Ctl> {
        let cname = CString::new(name).map_err(|_| Error::internal("control page name with NUL"))?;
        let flags = if create { libc::O_CREAT | libc::O_EXCL | libc::O_RDWR } else { libc::O_RDWR };
        // SAFETY: cname is a valid C string.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(Error::os(format!("shm_open({name}) for the device control page")));
        }
        // SAFETY: fd is an open shared-memory object; a new one is sized here.
        if create && unsafe { libc::ftruncate(fd, PAGE as libc::off_t) } != 0 {
            let e = Error::os(format!("ftruncate of {name} to one page"));
            // SAFETY: fd open, cname valid.
            unsafe {
                libc::close(fd);
                libc::shm_unlink(cname.as_ptr());
            }
            return Err(e);
        }
        // SAFETY: maps one page of the object; the mapping keeps its own reference.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), PAGE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        // SAFETY: fd is ours to close.
        unsafe { libc::close(fd) };
        let unlink = || {
            if create {
                // SAFETY: cname valid.
                unsafe { libc::shm_unlink(cname.as_ptr()) };
            }
        };
        if p == libc::MAP_FAILED {
            unlink();
            return Err(Error::os(format!("mmap of the device control page {name}")));
        }
        let host = p as *mut u8;
        let registered = cuda::CtxGuard::enter(ctx).and_then(|_g| {
            // SAFETY: the page is mapped until Drop, which unregisters it first.
            unsafe { cuda::register_host_mapped(host, PAGE) }
        });
        match registered {
            Ok(dev) => Ok(Ctl { host, dev, ctx, name: cname, owner: create }),
            Err(e) => {
                // SAFETY: mapped above, not registered.
                unsafe { libc::munmap(p, PAGE) };
                unlink();
                Err(e.context("registering the device control page"))
            }
        }
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        // SAFETY: off is a line offset inside the mapped page; the page lives as long
        // as self and is only accessed atomically.
        unsafe { &*(self.host.add(off) as *const AtomicU32) }
    }

    /// The last call the executor finished.
    pub fn done(&self) -> &AtomicU32 {
        self.word(DONE)
    }

    /// The last call whose inputs rank `r`'s stream had ready.
    pub fn ready(&self, r: usize) -> &AtomicU32 {
        assert!(r < MAX_RANKS, "rank {r} beyond the control page");
        self.word(LINE * (1 + r))
    }

    /// Non-zero once a rank gave up on the communicator.
    pub fn failed(&self) -> &AtomicU32 {
        self.word(FAILED)
    }

    /// Device addresses, for stream operations in this process's context.
    pub fn dev_done(&self) -> usize {
        self.dev + DONE
    }

    pub fn dev_ready(&self, r: usize) -> usize {
        assert!(r < MAX_RANKS, "rank {r} beyond the control page");
        self.dev + LINE * (1 + r)
    }

    /// Whether call `k` is finished (`done` at or past it, cyclically).
    pub fn finished(&self, k: u32) -> bool {
        reached(self.done().load(Ordering::Acquire), k)
    }

    /// Lets every wait for call `k` or earlier go on: used when the call can never
    /// complete (a rank died, timed out, or the communicator was aborted).
    pub fn release(&self, k: u32, nranks: usize) {
        self.failed().store(1, Ordering::Release);
        for r in 0..nranks.min(MAX_RANKS) {
            raise(self.ready(r), k);
        }
        raise(self.done(), k);
    }
}

/// Whether counter value `v` is at or past `k` (cyclic, as CU_STREAM_WAIT_VALUE_GEQ).
pub fn reached(v: u32, k: u32) -> bool {
    (v.wrapping_sub(k) as i32) >= 0
}

fn raise(w: &AtomicU32, k: u32) {
    let _ = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| (!reached(v, k)).then_some(k));
}

impl Drop for Ctl {
    fn drop(&mut self) {
        // The caller made sure no queued stream operation still uses the page.
        if let Ok(_g) = cuda::CtxGuard::enter(self.ctx) {
            // SAFETY: registered in map(); unregistered once.
            let _ = unsafe { cuda::unregister_host(self.host as usize) };
        }
        // SAFETY: mapped in map(), unmapped once.
        unsafe { libc::munmap(self.host.cast(), PAGE) };
        if self.owner {
            // SAFETY: name is a valid C string.
            unsafe { libc::shm_unlink(self.name.as_ptr()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_compare_cyclically() {
        assert!(reached(5, 5) && reached(6, 5) && !reached(4, 5));
        assert!(reached(2, u32::MAX) && !reached(u32::MAX, 2));
    }
}
