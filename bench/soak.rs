//! `--soak N`: N pseudo-random calls, every one checked, and each rank's resources
//! counted after a warm-up and at the end.
//!
//! Call i is a pure function of (seed, i): every rank draws the same collective, type,
//! op, size, placement, root, extension parameters and uneven counts, and every rank's
//! buffer kinds and offsets (each rank keeps its own), so `--soak-first I --soak 1`
//! replays one call. Each call runs through [`Case`] as the sweep's `-c` checks do:
//! fresh inputs, the call, the check against values computed independently. Wrong
//! elements are counted locally at every call and summed over ranks every
//! [`AGREE_EVERY`] calls (for the progress line) and at the end.

use crate::cli::{Mem, Op, Opts, DEFAULT_SOAK_MAX_BYTES};
use crate::coll::{Case, Collective, ExtParams};
use crate::comm::{Buf, Comm, Fail};
use crate::data::{mix, Ty};
use crate::report::{esc, num, RankInfo};
use crate::{hostname, out, peak_rss_kib, Ctx};
use ferroccl::ffi::{fcclMax, fcclMin, fcclSum};
use std::fmt::Write as _;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Environment switch of the leak test hook (see --help).
const LEAK_VAR: &str = "FERROCCL_BENCH_LEAK";

/// Calls before the first resource count (fewer when N/4 is smaller): every path has
/// run by then, so what the library creates once is not counted as growth.
pub const WARMUP_CALLS: u64 = 300;
/// Freed buffers the library's scratch pool keeps (docs/performance.md: "at most
/// 128 MiB"); reductions of varied sizes fill it over thousands of calls.
pub const LIBRARY_POOL_MIB: u64 = 128;
/// Page-locked buffers the library keeps for staging device memory (with --mem cuda).
pub const STAGING_POOL_MIB: u64 = (ferroccl::backend::staging::POOL_MAX_BYTES >> 20) as u64;
/// Resident memory may grow this much beyond those pools (allocators keep freed memory,
/// shared rings are touched lazily).
pub const RSS_SLACK_MIB: u64 = 64;
/// The judged bound on resident memory growth.
pub const RSS_BOUND_MIB: u64 = LIBRARY_POOL_MIB + STAGING_POOL_MIB + RSS_SLACK_MIB;
/// Calls between the sums of wrong elements over ranks (a small all_reduce each).
const AGREE_EVERY: u64 = 256;
/// Wrong calls a rank describes on stderr (the rest are only counted).
const SHOW_WRONG: u64 = 10;
/// Resident memory is also read at this many even steps after the warm-up (the last
/// at the end), to tell memory that levels off from memory that keeps growing.
const RSS_STEPS: usize = 10;

/// Every collective in the order of the tallies.
fn all_colls() -> Vec<Collective> {
    Collective::ALL.iter().chain(Collective::EXT.iter()).copied().collect()
}

/// The draws of one call: splitmix64 seeded by (seed, call number).
struct Rng(u64);

impl Rng {
    fn for_call(seed: u64, i: u64) -> Rng {
        Rng(mix(seed ^ mix(i.wrapping_add(0x632b_e59b_d9b4_e019))))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
    /// Uniform in 0..m (m >= 1).
    fn below(&mut self, m: u64) -> u64 {
        ((self.next() as u128 * m as u128) >> 64) as u64
    }
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
    /// Log-uniform in 1..=hi (hi >= 1).
    fn log_uniform(&mut self, hi: u64) -> u64 {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((hi as f64 + 1.0).powf(u) as u64).clamp(1, hi)
    }
}

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// malloc: private memory peers cannot map.
    Malloc,
    /// fcclMemAllocHost: shared memory peers map from 32 KiB (single copy).
    Host,
    /// fcclMemAlloc (--mem cuda).
    Device,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Malloc, Kind::Host, Kind::Device];
    fn name(self) -> &'static str {
        match self {
            Kind::Malloc => "malloc",
            Kind::Host => "fcclMemAllocHost",
            Kind::Device => "fcclMemAlloc",
        }
    }
    fn short(self) -> &'static str {
        match self {
            Kind::Malloc => "malloc",
            Kind::Host => "host",
            Kind::Device => "dev",
        }
    }
}

/// One buffer of one rank in one call.
#[derive(Clone, Copy, Debug)]
struct BufSpec {
    kind: Kind,
    /// Elements between the allocation's start and the buffer.
    offset: usize,
    /// Free the allocation and allocate it anew before the call.
    fresh: bool,
}

/// One call, the same on every rank.
struct Call {
    coll: Collective,
    ty: Ty,
    op: Op,
    root: usize,
    /// The size drawn in bytes over the element size (as -b/-e make counts).
    count: usize,
    inplace: bool,
    x: ExtParams,
    /// Uneven counts, n x n: all_to_allv sends v[s*n+d] from s to d; all_gather_v and
    /// reduce_scatter_v give rank p v[p*n+p]. None: the sweep's pattern.
    v: Option<Vec<usize>>,
    /// Ranks whose counts are all 0 (v forms).
    idle: Vec<usize>,
    data_seed: u64,
    /// Every rank's (send, recv) buffers.
    bufs: Vec<[BufSpec; 2]>,
}

impl Call {
    fn draw(seed: u64, index: u64, colls: &[Collective], n: usize, o: &Opts) -> Call {
        let mut g = Rng::for_call(seed, index);
        let coll = g.pick(colls);
        let (ty, wire) = if coll == Collective::AllReduceWire {
            let ty = g.pick(&[Ty::Float, Ty::Double]);
            let wires: Vec<Ty> = Ty::ALL.iter().copied().filter(|w| w.is_float() && w.size() <= ty.size()).collect();
            (ty, g.pick(&wires))
        } else {
            (g.pick(&Ty::ALL), g.pick(&[Ty::Bfloat16, Ty::Half]))
        };
        let op = if coll.reduces() { g.pick(&Op::ALL) } else { Op::Sum };
        // One call in 16 of size 0; the others log-uniform, so every decade is hit.
        let bytes = if o.max_bytes == 0 || g.chance(1, 16) { 0 } else { g.log_uniform(o.max_bytes) };
        let count = (bytes / ty.size() as u64) as usize;
        let root = g.below(n as u64) as usize;
        let nbuffers = g.log_uniform(1024) as usize;
        let bucket = if g.chance(1, 2) { 0 } else { g.log_uniform(DEFAULT_SOAK_MAX_BYTES) as usize };
        let x = ExtParams { axis: g.below(2) as usize, nbuffers, bucket, wire };
        let inplace = match coll.placements(&x) {
            (true, true) => g.chance(1, 2),
            (_, has_in) => has_in,
        };
        let data_seed = g.next();
        let per = coll.layout(count, n, &x).param;
        let uneven = matches!(coll, Collective::AlltoAllv | Collective::AllGatherV | Collective::ReduceScatterV);
        let (mut v, mut idle) = (None, Vec::new());
        // Two calls in three of the v forms: random counts (0, full or between) with
        // idle ranks; the third keeps the sweep's pattern.
        if uneven && g.below(3) != 0 {
            let is_idle: Vec<bool> = (0..n).map(|_| g.chance(1, 3)).collect();
            let mut m = vec![0; n * n];
            for s in 0..n {
                for d in 0..n {
                    let c = match g.below(4) {
                        0 => 0,
                        1 => per,
                        _ => g.below(per as u64 + 1) as usize,
                    };
                    m[s * n + d] = if is_idle[s] || is_idle[d] { 0 } else { c };
                }
            }
            idle = (0..n).filter(|&r| is_idle[r]).collect();
            v = Some(m);
        }
        // Device memory for every rank or none: one backend must serve a call.
        let device = o.mem == Mem::Cuda && g.chance(1, 2);
        let bufs = (0..n)
            .map(|_| {
                let mut b = || BufSpec {
                    kind: if device {
                        Kind::Device
                    } else if g.chance(1, 2) {
                        Kind::Malloc
                    } else {
                        Kind::Host
                    },
                    offset: if g.chance(1, 2) { 0 } else { g.below(64) as usize },
                    fresh: g.chance(1, 16),
                };
                [b(), b()]
            })
            .collect();
        Call { coll, ty, op, root, count, inplace, x, v, idle, data_seed, bufs }
    }

    /// The call's parameters for messages: everything needed to recognise it.
    fn describe(&self, n: usize) -> String {
        let l = self.coll.layout(self.count, n, &self.x);
        let mut s = format!(
            "{} {} count {} ({} B), {}",
            self.coll.name(),
            self.ty.name(),
            l.param,
            l.size_bytes(self.ty.size()),
            if self.inplace { "in place" } else { "out of place" }
        );
        if self.coll.reduces() {
            let _ = write!(s, ", op {}", self.op.name());
        }
        if self.coll.has_root() {
            let _ = write!(s, ", root {}", self.root);
        }
        match self.coll {
            Collective::AllGatherAxis | Collective::ReduceScatterAxis => {
                let _ = write!(s, ", axis {}", self.x.axis);
            }
            Collective::AllReduceCoalesced | Collective::BroadcastCoalesced => {
                let _ = write!(s, ", nbuffers {}, bucket {} B", self.x.nbuffers, self.x.bucket);
            }
            Collective::AllReduceWire => {
                let _ = write!(s, ", wire {}", self.x.wire.name());
            }
            _ => {}
        }
        if let Some(v) = &self.v {
            let rows: Vec<String> =
                v.chunks(n).map(|r| r.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(" ")).collect();
            let _ = write!(s, ", counts [{}], idle ranks {:?}", rows.join("; "), self.idle);
        }
        let bufs: Vec<String> = self
            .bufs
            .iter()
            .enumerate()
            .map(|(r, [a, b])| {
                let one = |b: &BufSpec| format!("{}+{}{}", b.kind.short(), b.offset, if b.fresh { " new" } else { "" });
                format!("{r}: {} / {}", one(a), one(b))
            })
            .collect();
        let _ = write!(s, ", buffers send / recv (kind+element offset) {}", bufs.join(", "));
        s
    }
}

/// An allocation of one kind; freed on drop.
enum Block {
    Malloc(*mut u8),
    Lib(Buf),
}

impl Block {
    fn ptr(&self) -> *mut u8 {
        match self {
            Block::Malloc(p) => *p,
            Block::Lib(b) => b.ptr,
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Block::Malloc(p) = self {
            // SAFETY: allocated by malloc below, freed once.
            unsafe { libc::free(*p as *mut libc::c_void) };
        }
    }
}

/// Per kind, a send and a receive allocation, kept from call to call (so recvbuffs
/// are reused as programs reuse tensors) and allocated anew when too small or drawn
/// fresh; the host mirrors of device buffers.
struct Pool {
    slots: [[Option<(Block, usize)>; 2]; 3],
    mirrors: [Vec<u64>; 2],
    allocations: u64,
}

impl Pool {
    fn new() -> Pool {
        Pool { slots: Default::default(), mirrors: [Vec::new(), Vec::new()], allocations: 0 }
    }

    /// The allocation `which` (0 send, 1 recv) of `kind`, at least `bytes` long.
    fn get(&mut self, kind: Kind, which: usize, bytes: usize, fresh: bool) -> Result<*mut u8, Fail> {
        let slot = &mut self.slots[kind as usize][which];
        let small = match slot {
            Some((_, cap)) => *cap < bytes,
            None => true,
        };
        if fresh || small {
            // Free first, so the new allocation may reuse the address (a stale mapping
            // of the old one must not serve it).
            *slot = None;
            let b = match kind {
                Kind::Malloc => {
                    // SAFETY: plain allocation, checked for NULL.
                    let p = unsafe { libc::malloc(bytes.max(64)) } as *mut u8;
                    if p.is_null() {
                        return Err(Fail::runtime(format!("malloc({bytes}) failed")));
                    }
                    Block::Malloc(p)
                }
                Kind::Host => Block::Lib(Buf::host(bytes)?),
                Kind::Device => Block::Lib(Buf::device(bytes)?),
            };
            self.allocations += 1;
            *slot = Some((b, bytes));
        }
        Ok(slot.as_ref().map_or(std::ptr::null_mut(), |(b, _)| b.ptr()))
    }

    /// Host memory of at least `bytes` (8-byte aligned) that mirrors device buffer `which`.
    fn mirror(&mut self, which: usize, bytes: usize) -> *mut u8 {
        let m = &mut self.mirrors[which];
        let words = bytes.div_ceil(8).max(8);
        if m.len() < words {
            m.resize(words, 0);
        }
        m.as_mut_ptr() as *mut u8
    }

    /// Frees everything (before each resource count).
    fn clear(&mut self) {
        self.slots = Default::default();
        self.mirrors = [Vec::new(), Vec::new()];
    }
}

/// One rank's resource counts.
#[derive(Clone, Copy, Debug, Default)]
struct Res {
    fds: u64,
    /// Descriptors of memfds (fcclMemAllocHost's shared buffers).
    memfds: u64,
    /// /dev/shm/fccl-*-p<pid> (this process's segments).
    shm: u64,
    threads: u64,
    /// Lines of /proc/self/maps.
    maps: u64,
    rss_kib: u64,
    /// Bytes malloc has handed out and not taken back (mallinfo2), KiB; 0 where the
    /// C library has no mallinfo2 (not glibc, or glibc before 2.33).
    heap_kib: u64,
}

const RES_FIELDS: usize = 7;

/// Gives freed malloc memory back to the system (glibc keeps it otherwise), so that
/// VmRSS shows memory in use rather than the allocator's reserve.
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: no arguments beyond the padding; safe at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Bytes in use in malloc's arenas and its own mappings, KiB.
fn heap_in_use_kib() -> u64 {
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
    fn now() -> Res {
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
    fn fields(&self) -> [u64; RES_FIELDS] {
        [self.fds, self.memfds, self.shm, self.threads, self.maps, self.rss_kib, self.heap_kib]
    }
    fn from_fields(f: &[u64]) -> Res {
        Res { fds: f[0], memfds: f[1], shm: f[2], threads: f[3], maps: f[4], rss_kib: f[5], heap_kib: f[6] }
    }
}

/// Growth of one count: end - start (negative when it shrank).
fn grow(a: u64, b: u64) -> i64 {
    b as i64 - a as i64
}

/// Counts of the calls, the same on every rank (they follow the seed).
struct Tally {
    colls: Vec<u64>,
    types: [u64; 12],
    ops: [u64; 5],
    inplace: u64,
    zero: u64,
    idle: u64,
    unchecked: u64,
    /// By the size column: 0, up to 4 KiB, 64 KiB, 1 MiB, more.
    sizes: [u64; 5],
}

const SIZE_CLASSES: [&str; 5] = ["0 B", "1 B-4 KiB", "4-64 KiB", "64 KiB-1 MiB", "over 1 MiB"];

impl Tally {
    fn add(&mut self, c: &Call, n: usize, colls: &[Collective]) {
        if let Some(k) = colls.iter().position(|x| *x == c.coll) {
            self.colls[k] += 1;
        }
        if let Some(k) = Ty::ALL.iter().position(|t| *t == c.ty) {
            self.types[k] += 1;
        }
        if c.coll.reduces() {
            if let Some(k) = Op::ALL.iter().position(|o| *o == c.op) {
                self.ops[k] += 1;
            }
        }
        self.inplace += u64::from(c.inplace);
        let l = c.coll.layout(c.count, n, &c.x);
        self.zero += u64::from(l.param == 0);
        self.idle += u64::from(!c.idle.is_empty());
        self.unchecked += u64::from(c.inplace && !c.coll.inplace_checked());
        let b = l.size_bytes(c.ty.size());
        let class = match b {
            0 => 0,
            1..=4096 => 1,
            4097..=65536 => 2,
            65537..=1048576 => 3,
            _ => 4,
        };
        self.sizes[class] += 1;
    }
}

/// What one rank found, exchanged at the end.
#[derive(Clone, Copy, Debug, Default)]
struct RankRec {
    start: Res,
    end: Res,
    wrong: u64,
    wrong_calls: u64,
    /// u64::MAX: none.
    first_wrong: u64,
    /// Buffers the calls used, by kind.
    kinds: [u64; 3],
    allocations: u64,
    peak_rss_kib: u64,
    /// VmRSS and malloc's bytes in use (KiB) at each tenth of the calls after the
    /// warm-up (buffers freed).
    rss_steps: [u64; RSS_STEPS],
    heap_steps: [u64; RSS_STEPS],
}

const REC_FIELDS: usize = 2 * RES_FIELDS + 8 + 2 * RSS_STEPS;

impl RankRec {
    fn to_bytes(self) -> Vec<u8> {
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
    fn from_bytes(b: &[u8]) -> RankRec {
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
    fn leaks(&self) -> bool {
        let (a, b) = (self.start, self.end);
        grow(a.fds, b.fds) > 0
            || grow(a.memfds, b.memfds) > 0
            || grow(a.shm, b.shm) > 0
            || grow(a.threads, b.threads) > 0
    }
    fn rss_growth_kib(&self) -> i64 {
        grow(self.start.rss_kib, self.end.rss_kib)
    }
}

/// The command line that replays this soak.
fn replay(o: &Opts, n: usize, seed: u64) -> String {
    let mut s = String::from("ferroccl-bench");
    let all = all_colls();
    if o.colls != all {
        for c in &o.colls {
            let _ = write!(s, " {}", c.name());
        }
    }
    let _ = write!(s, " --soak {} --seed {seed} --nranks {n}", o.soak.unwrap_or(0));
    if o.soak_first > 0 {
        let _ = write!(s, " --soak-first {}", o.soak_first);
    }
    if o.max_bytes != DEFAULT_SOAK_MAX_BYTES {
        let _ = write!(s, " -e {}", o.max_bytes);
    }
    if o.mem == Mem::Cuda {
        s.push_str(" --mem cuda");
    }
    s
}

/// The seed every rank uses: --seed, or rank 0's draw; ranks given different
/// parameters are refused (their calls would not match).
fn agree_seed(comm: &Comm, o: &Opts) -> Result<u64, Fail> {
    let drawn = if comm.rank == 0 {
        let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        mix(t ^ (u64::from(std::process::id()) << 32))
    } else {
        0
    };
    let seed = match o.seed {
        Some(s) => s,
        None => comm.allreduce_u64(drawn, fcclSum)?,
    };
    let names: String = o.colls.iter().map(|c| c.name()).collect();
    let mut h = mix(seed ^ mix(o.soak.unwrap_or(0) ^ mix(o.soak_first ^ mix(o.max_bytes))));
    for b in names.bytes() {
        h = mix(h ^ u64::from(b));
    }
    h = mix(h ^ o.mem as u64);
    if comm.allreduce_u64(h, fcclMin)? != comm.allreduce_u64(h, fcclMax)? {
        return Err(Fail::usage(
            "--soak: the ranks were given different --soak, --seed, --soak-first, -e, --mem or collectives",
        ));
    }
    Ok(seed)
}

/// Runs the soak on this rank; returns the exit status.
pub fn run(ctx: &mut Ctx, version_code: i32, infos: &[RankInfo]) -> Result<i32, Fail> {
    let (o, comm) = (ctx.o, ctx.comm);
    let (n, me, rank0) = (comm.nranks, comm.rank, comm.rank == 0);
    let total = o.soak.unwrap_or(0);
    let first = o.soak_first;
    let seed = agree_seed(comm, o)?;
    let warm = WARMUP_CALLS.min(total / 4);
    let colls = o.colls.clone();
    if rank0 {
        let mut s = crate::report::version_line(o, version_code);
        let _ = writeln!(
            s,
            "# Soak: {total} calls from seed {seed} (calls {first}..{}), {n} ranks, sizes 0-{} B log-uniform, {} collectives",
            first + total,
            o.max_bytes,
            colls.len()
        );
        s.push_str(&crate::report::rank_lines(o, infos));
        out(&s);
    }
    let order = all_colls();
    let mut tally = Tally {
        colls: vec![0; order.len()],
        types: [0; 12],
        ops: [0; 5],
        inplace: 0,
        zero: 0,
        idle: 0,
        unchecked: 0,
        sizes: [0; 5],
    };
    let mut rec = RankRec { first_wrong: u64::MAX, ..Default::default() };
    let mut pool = Pool::new();
    let corrupt = ctx.corrupt && rank0;
    let leak = rank0 && std::env::var(LEAK_VAR).is_ok_and(|v| !v.is_empty() && v != "0");
    comm.barrier()?;
    let t0 = Instant::now();
    if warm == 0 {
        rec.start = Res::now();
        (rec.rss_steps, rec.heap_steps) = ([rec.start.rss_kib; RSS_STEPS], [rec.start.heap_kib; RSS_STEPS]);
    }
    for k in 0..total {
        let i = first + k;
        let call = Call::draw(seed, i, &colls, n, o);
        tally.add(&call, n, &order);
        let [sb, rb] = call.bufs[me];
        if !call.inplace {
            rec.kinds[sb.kind as usize] += 1;
        }
        rec.kinds[rb.kind as usize] += 1;
        let w = run_call(comm, &mut pool, &call, corrupt).map_err(|f| Fail {
            exit: f.exit,
            msg: format!(
                "soak call #{i} ({}): {}\n  replay: {} (this call alone: --soak-first {i} --soak 1)",
                call.describe(n),
                f.msg,
                replay(o, n, seed)
            ),
        })?;
        if let Some((count, first_bad)) = w {
            rec.wrong += count;
            rec.wrong_calls += 1;
            rec.first_wrong = rec.first_wrong.min(i);
            if rec.wrong_calls <= SHOW_WRONG {
                let (e, want, got) = first_bad;
                let show = |v: Option<u64>| v.map_or_else(|| "no integer / sentinel".to_string(), |v| v.to_string());
                eprintln!(
                    "ferroccl-bench: rank {me}: soak call #{i} of seed {seed} ({}): {count} wrong elements; first: \
                     element {e} expected {} got {}",
                    call.describe(n),
                    match want {
                        Some(v) => v.to_string(),
                        None => "untouched (sentinel)".into(),
                    },
                    show(got)
                );
            }
        }
        if leak && k >= warm {
            // The test hook: a descriptor never closed, as a leaking library would.
            if let Ok(f) = std::fs::File::open("/dev/null") {
                let _ = std::os::fd::IntoRawFd::into_raw_fd(f);
            }
        }
        if (k + 1) % AGREE_EVERY == 0 {
            let wrong = comm.allreduce_u64(rec.wrong, fcclSum)?;
            ctx.progress.update(&format!("soak {}/{total} calls, {wrong} wrong elements", k + 1));
        }
        if k + 1 == warm {
            // Counted with every soak buffer freed, here and at the end, so the counts
            // do not depend on which buffers the pool happens to hold.
            pool.clear();
            comm.barrier()?;
            rec.start = Res::now();
            // Steps that fall on the warm-up (short runs) read as the start.
            (rec.rss_steps, rec.heap_steps) = ([rec.start.rss_kib; RSS_STEPS], [rec.start.heap_kib; RSS_STEPS]);
        }
        let steps: Vec<usize> = (0..RSS_STEPS - 1).filter(|&j| rss_step_end(j, warm, total) == k + 1).collect();
        if !steps.is_empty() && k + 1 > warm {
            pool.clear();
            let r = Res::now();
            for j in steps {
                (rec.rss_steps[j], rec.heap_steps[j]) = (r.rss_kib, r.heap_kib);
            }
        }
    }
    pool.clear();
    comm.barrier()?;
    let secs = t0.elapsed().as_secs_f64();
    rec.end = Res::now();
    (rec.rss_steps[RSS_STEPS - 1], rec.heap_steps[RSS_STEPS - 1]) = (rec.end.rss_kib, rec.end.heap_kib);
    rec.allocations = pool.allocations;
    rec.peak_rss_kib = peak_rss_kib();
    ctx.progress.clear();
    let all = comm.allgather_bytes(&rec.to_bytes())?;
    let recs: Vec<RankRec> = all.chunks(REC_FIELDS * 8).map(RankRec::from_bytes).collect();
    let s = Summary { o, n, seed, total, first, warm, secs, tally: &tally, recs: &recs, order: &order };
    if rank0 {
        out(&s.text());
        if let Some(p) = &o.json {
            let j = s.json(version_code, infos);
            std::fs::write(p, j).map_err(|e| Fail::runtime(format!("cannot write {}: {e}", p.display())))?;
        }
    }
    Ok(if s.failures().is_empty() { 0 } else { 1 })
}

/// The number of calls done when RSS step `j` (0-based) is read: the calls after
/// the warm-up cut into RSS_STEPS even parts.
fn rss_step_end(j: usize, warm: u64, total: u64) -> u64 {
    warm + (total - warm) * (j as u64 + 1) / RSS_STEPS as u64
}

/// One call: buffers, fresh inputs, the call, the check. Returns the wrong elements
/// and the first of them (None: right, or in-place all_to_allv, which is not checked).
#[allow(clippy::type_complexity)]
fn run_call(
    comm: &Comm,
    pool: &mut Pool,
    c: &Call,
    corrupt: bool,
) -> Result<Option<(u64, (usize, Option<u64>, Option<u64>))>, Fail> {
    let (n, me) = (comm.nranks, comm.rank);
    let esize = c.ty.size();
    let l = c.coll.layout(c.count, n, &c.x);
    // Case fills and checks max(send, recv) elements of both buffers.
    let need = l.send.max(l.recv) * esize;
    let [sb, rb] = c.bufs[me];
    // SAFETY: (pointer arithmetic) each allocation holds the offset plus `need`.
    let sp = unsafe { pool.get(sb.kind, 0, sb.offset * esize + need, sb.fresh)?.add(sb.offset * esize) };
    // SAFETY: as above.
    let rp = unsafe { pool.get(rb.kind, 1, rb.offset * esize + need, rb.fresh)?.add(rb.offset * esize) };
    let device = sb.kind == Kind::Device;
    let (hs, hr) = if device { (pool.mirror(0, need), pool.mirror(1, need)) } else { (sp, rp) };
    let mut case = Case::new(comm, c.coll, c.ty, c.op, c.root, c.count, hs, hr, need, false, c.x);
    if device {
        case.device = Some((sp, rp));
    }
    if let Some(v) = &c.v {
        case.set_v_counts(|s, d| v[s * n + d]);
    }
    case.fill(c.data_seed, c.inplace)?;
    case.run(0, c.inplace)?;
    case.wait()?;
    if c.inplace && !c.coll.inplace_checked() {
        return Ok(None);
    }
    let w = case.check(c.data_seed, c.inplace, corrupt)?;
    Ok(w.first.map(|f| (w.count, f)))
}

/// Rank 0's report of a finished soak.
struct Summary<'a> {
    o: &'a Opts,
    n: usize,
    seed: u64,
    total: u64,
    first: u64,
    warm: u64,
    secs: f64,
    tally: &'a Tally,
    recs: &'a [RankRec],
    order: &'a [Collective],
}

impl Summary<'_> {
    /// The names the per-category counts are listed by: collectives in this run's
    /// order, types, ops, buffer kinds.
    fn names(&self) -> [Vec<&'static str>; 4] {
        [
            self.order.iter().map(|c| c.name()).collect(),
            Ty::ALL.iter().map(|t| t.name()).collect(),
            Op::ALL.iter().map(|o| o.name()).collect(),
            Kind::ALL.iter().map(|k| k.name()).collect(),
        ]
    }

    /// Buffers the calls used, by kind, summed over ranks.
    fn kinds(&self) -> [u64; 3] {
        std::array::from_fn(|k| self.recs.iter().map(|r| r.kinds[k]).sum())
    }
    fn wrong(&self) -> u64 {
        self.recs.iter().map(|r| r.wrong).sum()
    }
    /// Most RSS growth over ranks, KiB.
    fn rss_growth(&self) -> i64 {
        self.recs.iter().map(|r| r.rss_growth_kib()).max().unwrap_or(0)
    }
    /// Why the soak failed; empty when it passed.
    fn failures(&self) -> Vec<&'static str> {
        let mut why = Vec::new();
        if self.wrong() > 0 {
            why.push("wrong results");
        }
        if self.recs.iter().any(|r| r.leaks()) {
            why.push("descriptors, threads or shared memory grew");
        }
        if self.rss_growth() > (RSS_BOUND_MIB * 1024) as i64 {
            why.push("resident memory grew beyond the bound");
        }
        why
    }
    fn rate(&self) -> f64 {
        if self.secs > 0.0 {
            self.total as f64 / self.secs
        } else {
            0.0
        }
    }
    /// Most growth over ranks from the middle step to the end, KiB.
    fn last_half(&self, f: impl Fn(&RankRec) -> &[u64; RSS_STEPS]) -> i64 {
        self.recs.iter().map(|r| grow(f(r)[RSS_STEPS / 2 - 1], f(r)[RSS_STEPS - 1])).max().unwrap_or(0)
    }
    fn max_growth(&self, f: impl Fn(&Res) -> u64) -> i64 {
        self.recs.iter().map(|r| grow(f(&r.start), f(&r.end))).max().unwrap_or(0)
    }

    fn text(&self) -> String {
        let (t, recs) = (self.tally, self.recs);
        let mut s = String::new();
        let list = |names: &[&str], counts: &[u64]| -> String {
            let v: Vec<String> =
                names.iter().zip(counts).filter(|(_, c)| **c > 0).map(|(n, c)| format!("{n} {c}")).collect();
            if v.is_empty() {
                "none".into()
            } else {
                v.join(", ")
            }
        };
        let [cn, tn, on, kn] = self.names();
        let kinds = self.kinds();
        let wrong = self.wrong();
        let _ = writeln!(s, "#");
        let _ = writeln!(s, "# Calls per collective : {}", list(&cn, &t.colls));
        let _ = writeln!(s, "# Calls per type       : {}", list(&tn, &t.types));
        let _ = writeln!(s, "# Reductions per op    : {}", list(&on, &t.ops));
        let _ = writeln!(s, "# Calls per size       : {}", list(&SIZE_CLASSES, &t.sizes));
        let _ = writeln!(
            s,
            "# Calls                : {} in place, {} of count 0, {} with idle ranks, {} unchecked (in-place all_to_allv)",
            t.inplace, t.zero, t.idle, t.unchecked
        );
        let allocs: u64 = recs.iter().map(|r| r.allocations).sum();
        let _ = writeln!(s, "# Buffers (all ranks)  : {}; {allocs} allocations", list(&kn, &kinds));
        let _ =
            writeln!(s, "# Resources per rank, after {} warm-up calls -> at the end (soak buffers freed):", self.warm);
        let _ = writeln!(
            s,
            "#  {:>4}  {:>14}  {:>14}  {:>14}  {:>14}  {:>16}  {:>24}",
            "rank", "fds", "memfds", "shm files", "threads", "maps", "RSS (MiB)"
        );
        let pair = |a: u64, b: u64| format!("{a}->{b} ({:+})", grow(a, b));
        for (r, x) in recs.iter().enumerate() {
            let (a, b) = (x.start, x.end);
            let _ = writeln!(
                s,
                "#  {r:>4}  {:>14}  {:>14}  {:>14}  {:>14}  {:>16}  {:>24}",
                pair(a.fds, b.fds),
                pair(a.memfds, b.memfds),
                pair(a.shm, b.shm),
                pair(a.threads, b.threads),
                pair(a.maps, b.maps),
                format!(
                    "{:.1}->{:.1} ({:+.1})",
                    a.rss_kib as f64 / 1024.0,
                    b.rss_kib as f64 / 1024.0,
                    x.rss_growth_kib() as f64 / 1024.0
                )
            );
        }
        let _ = writeln!(s, "# RSS / malloc in use (MiB) at each tenth of the calls after the warm-up, per rank:");
        for (r, x) in recs.iter().enumerate() {
            let v: Vec<String> = x
                .rss_steps
                .iter()
                .zip(x.heap_steps)
                .map(|(a, b)| format!("{:.1}/{:.1}", *a as f64 / 1024.0, b as f64 / 1024.0))
                .collect();
            let _ = writeln!(s, "#  {r:>4}  {}", v.join(" "));
        }
        let rss = self.rss_growth();
        let _ = writeln!(
            s,
            "# Max growth           : fds {:+}, memfds {:+}, shm files {:+}, threads {:+}, maps {:+} (not judged), \
             RSS {:+.1} MiB (bound {RSS_BOUND_MIB} MiB: the library's scratch pool may keep \
             {LIBRARY_POOL_MIB}, its staging pool {STAGING_POOL_MIB}, plus {RSS_SLACK_MIB})",
            self.max_growth(|r| r.fds),
            self.max_growth(|r| r.memfds),
            self.max_growth(|r| r.shm),
            self.max_growth(|r| r.threads),
            self.max_growth(|r| r.maps),
            rss as f64 / 1024.0
        );
        let _ = writeln!(
            s,
            "# Last half of the run : RSS {:+.1} MiB, malloc in use {:+.1} MiB (most over ranks)",
            self.last_half(|r| &r.rss_steps) as f64 / 1024.0,
            self.last_half(|r| &r.heap_steps) as f64 / 1024.0
        );
        let peak = recs.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0);
        let _ = writeln!(s, "# Peak resident memory : {:.1} MiB (largest rank, VmHWM)", peak as f64 / 1024.0);
        let wrong_calls: Vec<String> = recs.iter().map(|r| r.wrong_calls.to_string()).collect();
        let first_wrong = recs.iter().map(|r| r.first_wrong).min().unwrap_or(u64::MAX);
        let _ = writeln!(
            s,
            "# Wrong elements       : {wrong} {}{}",
            if wrong > 0 { "FAILED" } else { "OK" },
            if wrong > 0 {
                format!(" (calls with wrong results per rank: {}; first: call #{first_wrong})", wrong_calls.join(", "))
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            s,
            "# Rate                 : {:.1} calls/s ({} calls in {:.2} s, inputs and checks included)",
            self.rate(),
            self.total,
            self.secs
        );
        let why = self.failures();
        let verdict = if why.is_empty() { "OK".to_string() } else { format!("FAILED: {}", why.join(", ")) };
        let _ = writeln!(s, "# Soak                 : {verdict}");
        let _ = writeln!(s, "# Replay               : {}", replay(self.o, self.n, self.seed));
        if first_wrong != u64::MAX {
            let _ = writeln!(s, "# First wrong call     : add --soak-first {first_wrong} --soak 1 to replay it alone");
        }
        let _ = writeln!(s, "#");
        s
    }

    fn json(&self, version_code: i32, infos: &[RankInfo]) -> String {
        let (o, t, recs) = (self.o, self.tally, self.recs);
        let obj = |names: &[&str], counts: &[u64]| -> String {
            let v: Vec<String> = names.iter().zip(counts).map(|(n, c)| format!("{}: {c}", esc(n))).collect();
            format!("{{{}}}", v.join(", "))
        };
        let res = |r: &Res| {
            format!(
                "{{\"fds\": {}, \"memfds\": {}, \"shm_files\": {}, \"threads\": {}, \"maps\": {}, \"rss_kib\": {}, \
                 \"malloc_in_use_kib\": {}}}",
                r.fds, r.memfds, r.shm, r.threads, r.maps, r.rss_kib, r.heap_kib
            )
        };
        let growth = |a: &Res, b: &Res| {
            format!(
                "{{\"fds\": {}, \"memfds\": {}, \"shm_files\": {}, \"threads\": {}, \"maps\": {}, \"rss_kib\": {}, \
                 \"malloc_in_use_kib\": {}}}",
                grow(a.fds, b.fds),
                grow(a.memfds, b.memfds),
                grow(a.shm, b.shm),
                grow(a.threads, b.threads),
                grow(a.maps, b.maps),
                grow(a.rss_kib, b.rss_kib),
                grow(a.heap_kib, b.heap_kib)
            )
        };
        let [cn, tn, on, kn] = self.names();
        let kinds = self.kinds();
        let wrong = self.wrong();
        let wrong_calls: u64 = recs.iter().map(|r| r.wrong_calls).sum();
        let first_wrong = recs.iter().map(|r| r.first_wrong).min().unwrap_or(u64::MAX);
        let rss = self.rss_growth();
        let ok = self.failures().is_empty();
        let colls: Vec<String> = o.colls.iter().map(|c| esc(c.name())).collect();
        let mut s = String::new();
        let _ = writeln!(s, "{{");
        let _ = writeln!(s, "  \"tool\": \"ferroccl-bench\",");
        let _ = writeln!(s, "  \"mode\": \"soak\",");
        let _ = writeln!(s, "  \"tool_version\": {},", esc(env!("CARGO_PKG_VERSION")));
        let _ = writeln!(s, "  \"library_version\": {},", esc(&crate::comm::version_string(version_code)));
        let _ = writeln!(s, "  \"library_version_code\": {version_code},");
        let _ = writeln!(s, "  \"host\": {},", esc(&hostname()));
        let _ = writeln!(s, "  \"date\": {},", esc(&crate::report::utc_now()));
        let _ = writeln!(s, "  \"mem\": {},", esc(o.mem.name()));
        let _ = writeln!(s, "  \"nranks\": {},", self.n);
        let _ = writeln!(s, "  \"params\": {{");
        let _ = writeln!(s, "    \"calls\": {},", self.total);
        let _ = writeln!(s, "    \"seed\": {},", self.seed);
        let _ = writeln!(s, "    \"first_call\": {},", self.first);
        let _ = writeln!(s, "    \"max_bytes\": {},", o.max_bytes);
        let _ = writeln!(s, "    \"collectives\": [{}],", colls.join(", "));
        let _ = writeln!(s, "    \"warmup_calls\": {},", self.warm);
        let _ = writeln!(s, "    \"rss_bound_mib\": {RSS_BOUND_MIB}");
        let _ = writeln!(s, "  }},");
        let _ = writeln!(s, "  \"replay\": {},", esc(&replay(o, self.n, self.seed)));
        let _ = writeln!(s, "  \"duration_s\": {},", num(self.secs));
        let _ = writeln!(s, "  \"calls_per_s\": {},", num(self.rate()));
        let _ = writeln!(s, "  \"calls_per_collective\": {},", obj(&cn, &t.colls));
        let _ = writeln!(s, "  \"calls_per_type\": {},", obj(&tn, &t.types));
        let _ = writeln!(s, "  \"reductions_per_op\": {},", obj(&on, &t.ops));
        let _ = writeln!(s, "  \"calls_per_size\": {},", obj(&SIZE_CLASSES, &t.sizes));
        let _ = writeln!(s, "  \"in_place\": {},", t.inplace);
        let _ = writeln!(s, "  \"count_zero\": {},", t.zero);
        let _ = writeln!(s, "  \"idle_rank_calls\": {},", t.idle);
        let _ = writeln!(s, "  \"unchecked\": {},", t.unchecked);
        let _ = writeln!(s, "  \"buffers\": {},", obj(&kn, &kinds));
        let _ = writeln!(s, "  \"allocations\": {},", recs.iter().map(|r| r.allocations).sum::<u64>());
        let _ = writeln!(s, "  \"wrong\": {wrong},");
        let _ = writeln!(s, "  \"wrong_calls\": {wrong_calls},");
        let fw = if first_wrong == u64::MAX { "null".to_string() } else { first_wrong.to_string() };
        let _ = writeln!(s, "  \"first_wrong_call\": {fw},");
        let _ = writeln!(s, "  \"ranks\": [");
        for (r, x) in recs.iter().enumerate() {
            let info = infos.get(r);
            let _ = writeln!(
                s,
                "    {{\"rank\": {r}, \"pid\": {}, \"host\": {}, \"device\": {}, \"peak_rss_kib\": {}, \"wrong\": {}, \
                 \"wrong_calls\": {}, \"allocations\": {}, \"start\": {}, \"end\": {}, \"growth\": {}, \
                 \"rss_kib_steps\": [{}], \"malloc_in_use_kib_steps\": [{}]}}{}",
                info.map_or(0, |i| i.pid),
                esc(info.map_or("", |i| i.host.as_str())),
                info.map_or(-1, |i| i.device),
                x.peak_rss_kib,
                x.wrong,
                x.wrong_calls,
                x.allocations,
                res(&x.start),
                res(&x.end),
                growth(&x.start, &x.end),
                x.rss_steps.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", "),
                x.heap_steps.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", "),
                if r + 1 < recs.len() { "," } else { "" }
            );
        }
        let _ = writeln!(s, "  ],");
        let _ = writeln!(
            s,
            "  \"max_growth\": {{\"fds\": {}, \"memfds\": {}, \"shm_files\": {}, \"threads\": {}, \"maps\": {}, \"rss_kib\": {rss}}},",
            self.max_growth(|r| r.fds),
            self.max_growth(|r| r.memfds),
            self.max_growth(|r| r.shm),
            self.max_growth(|r| r.threads),
            self.max_growth(|r| r.maps)
        );
        let _ = writeln!(
            s,
            "  \"last_half_growth\": {{\"rss_kib\": {}, \"malloc_in_use_kib\": {}}},",
            self.last_half(|r| &r.rss_steps),
            self.last_half(|r| &r.heap_steps)
        );
        let _ = writeln!(s, "  \"ok\": {ok}");
        let _ = writeln!(s, "}}");
        s
    }
}
