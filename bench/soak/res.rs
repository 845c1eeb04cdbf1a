//! What the soak counts on each rank: descriptors, threads, shared memory, mappings,
//! resident memory and malloc's bytes in use, and the record the ranks exchange.

use super::RSS_STEPS;

/// One rank's resource counts.
#[derive(Clone, Copy, Debug, Default)]
pub struct Res {
    pub fds: u64,
    /// Descriptors of memfds (fcclMemAllocHost's shared buffers).
    pub memfds: u64,
    /// /dev/shm/fccl-*-p<pid> (this process's segments).
    pub shm: u64,
    pub threads: u64,
    /// Lines of /proc/self/maps.
    pub maps: u64,
    pub rss_kib: u64,
    /// Bytes malloc has handed out and not taken back (mallinfo2), KiB; 0 where the
    /// C library has no mallinfo2 (not glibc, or glibc before 2.33).
    pub heap_kib: u64,
}

pub const RES_FIELDS: usize = 7;

/// Gives freed malloc memory back to the system (glibc keeps it otherwise), so that
/// VmRSS shows memory in use rather than the allocator's reserve.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: no arguments beyond the padding; safe at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Bytes in use in malloc's arenas and its own mappings, KiB.
pub fn heap_in_use_kib() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // Looked up at run time: the wheel's binaries link against glibc 2.28, which has none.
        // SAFETY: a NUL-terminated name; RTLD_DEFAULT searches the objects already loaded.
        let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mallinfo2".as_ptr()) };
        if f.is_null() {
            return 0;
        }
        // SAFETY: glibc's mallinfo2 takes nothing and returns the struct by value.
        let mallinfo2: unsafe extern "C" fn() -> libc::mallinfo2 = unsafe { std::mem::transmute(f) };
        // SAFETY: as above; safe at any time.
        let m = unsafe { mallinfo2() };
        (m.uordblks + m.hblkhd) as u64 / 1024
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    0
}

impl Res {
    /// The counts now; call with the soak's buffers freed.
    pub fn now() -> Res {
        trim();
        let mut r = Res { heap_kib: heap_in_use_kib(), ..Res::default() };
        if let Ok(d) = std::fs::read_dir("/proc/self/fd") {
            for e in d.flatten() {
                r.fds += 1;
                if std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:")) {
                    r.memfds += 1;
                }
            }
        }
        let suffix = format!("-p{}", std::process::id());
        if let Ok(d) = std::fs::read_dir("/dev/shm") {
            r.shm = d
                .flatten()
                .filter(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with("fccl-") && name.ends_with(&suffix)
                })
                .count() as u64;
        }
        r.threads = std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count() as u64);
        r.maps = std::fs::read_to_string("/proc/self/maps").map_or(0, |s| s.lines().count() as u64);
        r.rss_kib = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
            })
            .unwrap_or(0);
        r
    }
    pub fn fields(&self) -> [u64; RES_FIELDS] {
        [self.fds, self.memfds, self.shm, self.threads, self.maps, self.rss_kib, self.heap_kib]
    }
    pub fn from_fields(f: &[u64]) -> Res {
        Res { fds: f[0], memfds: f[1], shm: f[2], threads: f[3], maps: f[4], rss_kib: f[5], heap_kib: f[6] }
    }
}

/// Growth of one count: end - start (negative when it shrank).
pub fn grow(a: u64, b: u64) -> i64 {
    b as i64 - a as i64
}

/// What one rank found, exchanged at the end.
#[derive(Clone, Copy, Debug, Default)]
pub struct RankRec {
    pub start: Res,
    pub end: Res,
    pub wrong: u64,
    pub wrong_calls: u64,
    /// u64::MAX: none.
    pub first_wrong: u64,
    /// Buffers the calls used, by kind.
    pub kinds: [u64; 3],
    pub allocations: u64,
    pub peak_rss_kib: u64,
    /// VmRSS and malloc's bytes in use (KiB) at each tenth of the calls after the
    /// warm-up (buffers freed).
    pub rss_steps: [u64; RSS_STEPS],
    pub heap_steps: [u64; RSS_STEPS],
}

pub const REC_FIELDS: usize = 2 * RES_FIELDS + 8 + 2 * RSS_STEPS;

impl RankRec {
    pub fn to_bytes(self) -> Vec<u8> {
        let mut f = Vec::with_capacity(REC_FIELDS);
        f.extend(self.start.fields());
        f.extend(self.end.fields());
        f.extend([self.wrong, self.wrong_calls, self.first_wrong]);
        f.extend(self.kinds);
        f.extend([self.allocations, self.peak_rss_kib]);
        f.extend(self.rss_steps);
        f.extend(self.heap_steps);
        f.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
    pub fn from_bytes(b: &[u8]) -> RankRec {
        let f: Vec<u64> = b.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        let k = 2 * RES_FIELDS;
        RankRec {
            start: Res::from_fields(&f[0..RES_FIELDS]),
            end: Res::from_fields(&f[RES_FIELDS..k]),
            wrong: f[k],
            wrong_calls: f[k + 1],
            first_wrong: f[k + 2],
            kinds: [f[k + 3], f[k + 4], f[k + 5]],
            allocations: f[k + 6],
            peak_rss_kib: f[k + 7],
            rss_steps: std::array::from_fn(|j| f[k + 8 + j]),
            heap_steps: std::array::from_fn(|j| f[k + 8 + RSS_STEPS + j]),
        }
    }
    /// Growth that fails the soak: descriptors, memfds, segments, threads.
    pub fn leaks(&self) -> bool {
        let (a, b) = (self.start, self.end);
        grow(a.fds, b.fds) > 0
            || grow(a.memfds, b.memfds) > 0
            || grow(a.shm, b.shm) > 0
            || grow(a.threads, b.threads) > 0
    }
    pub fn rss_growth_kib(&self) -> i64 {
        grow(self.start.rss_kib, self.end.rss_kib)
    }
}
