//! Starting N ranks of a program as local processes (what `ferroccl-run` and
//! `ferroccl-bench --nranks N` do).
//!
//! [`Launch::run`] serves the rendezvous itself (on loopback, with a random key, and told
//! when a rank's process ends so that a set-up waiting for it fails at once), sets
//! FERROCCL_RANK, FERROCCL_WORLD_SIZE, FERROCCL_LOCAL_RANK, FERROCCL_LOCAL_SIZE,
//! FERROCCL_UNIQUE_ID and FERROCCL_ROOT_ADDR in each rank's environment, and torchrun's
//! RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (plus MASTER_ADDR and MASTER_PORT,
//! see [`Launch::run`]) so that programs written for torchrun run unchanged, forwards
//! each line of the ranks' output prefixed with the rank, and returns the exit status: 0
//! when every rank exits 0, otherwise the first failing rank's status (128 + signal for
//! a rank killed by a signal). When one rank fails the others get a grace period to
//! finish before they are killed. Ranks get SIGKILL when the launching process dies,
//! however it dies; SIGINT, SIGTERM and SIGHUP received while ranks run are passed on
//! to them.

use crate::comm::bootstrap::{Server, ServerOptions, UniqueId};
use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// Exit status when the rendezvous point cannot be started.
pub const EXIT_RENDEZVOUS: i32 = 2;
/// Exit status when a rank's program cannot be started.
pub const EXIT_SPAWN: i32 = 127;

/// Variables set in every rank by the launcher itself, one value per rank: an extra
/// variable given for the ranks ([`Launch::env`]) must not name one of these.
pub const PER_RANK_VARS: &[&str] = &[
    "FERROCCL_RANK",
    "FERROCCL_WORLD_SIZE",
    "FERROCCL_LOCAL_RANK",
    "FERROCCL_LOCAL_SIZE",
    "FERROCCL_UNIQUE_ID",
    "FERROCCL_ROOT_ADDR",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
];

/// Last SIGINT/SIGTERM/SIGHUP received while ranks run (0 = none).
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

/// What to start and how.
#[derive(Clone, Debug)]
pub struct Launch {
    /// Number of ranks (at least 1).
    pub nranks: usize,
    /// Program and its arguments (program first).
    pub argv: Vec<OsString>,
    /// Prefix every forwarded line with `[rank] `.
    pub prefix: bool,
    /// How long the other ranks may run on after one rank failed.
    pub grace: Duration,
    /// Rank 0 writes to this process's stdout and stderr directly instead of through
    /// the line forwarder (unprefixed; it may then use `\r` progress lines and see a
    /// terminal). Other ranks are still forwarded.
    pub inherit_rank0: bool,
    /// Name used in this module's own messages on stderr (`name: rank 1 exited ...`).
    pub name: String,
    /// Pin rank r to the r-th CPU this process may run on, when there are at least
    /// as many CPUs as ranks (as mpirun's default `--bind-to core` does). Ranks that
    /// wait for each other by spinning must not share a CPU while another idles; the
    /// scheduler sometimes puts two fresh processes on one CPU and leaves them there.
    /// Off by default: a multi-threaded rank (PyTorch's intra-op threads) would be
    /// confined to one CPU.
    pub bind: bool,
    /// Variables set in every rank, on top of the environment the ranks inherit from
    /// this process (ferroccl-run's `-x VAR=VALUE`). Names in [`PER_RANK_VARS`] are
    /// the launcher's own: it sets them after these.
    pub env: Vec<(OsString, OsString)>,
}

impl Launch {
    /// `nranks` ranks of `argv`, prefixed output, 5 s grace: `ferroccl-run`'s defaults.
    pub fn new(nranks: usize, argv: Vec<OsString>) -> Launch {
        Launch {
            nranks,
            argv,
            prefix: true,
            grace: Duration::from_secs(5),
            inherit_rank0: false,
            name: "ferroccl-run".into(),
            bind: false,
            env: Vec::new(),
        }
    }

    /// The value rank processes get for `name` before the launcher sets its own: from
    /// [`Launch::env`] (last one wins), else inherited from this process.
    fn given(&self, name: &str) -> Option<OsString> {
        match self.env.iter().rev().find(|(k, _)| k == OsStr::new(name)) {
            Some((_, v)) => Some(v.clone()),
            None => std::env::var_os(name),
        }
    }

    /// Starts the ranks, waits for all of them and returns the exit status to use
    /// (see the module documentation). Problems of the launch itself are reported on
    /// stderr and give [`EXIT_RENDEZVOUS`] or [`EXIT_SPAWN`].
    ///
    /// While it runs, SIGINT, SIGTERM and SIGHUP are caught (and passed on to the
    /// ranks); the previous handlers are restored before it returns.
    ///
    /// Where neither MASTER_ADDR nor MASTER_PORT is given (inherited or in
    /// [`Launch::env`]), ranks get MASTER_ADDR=127.0.0.1 and a MASTER_PORT that this
    /// process keeps bound (not listening) until the ranks end, so torch.distributed's
    /// env:// works under it: rank 0's TCPStore can listen there (it sets
    /// SO_REUSEADDR), no other program is given the port meanwhile, and it is not the
    /// rendezvous point's port.
    pub fn run(&self) -> i32 {
        let name = &self.name;
        if self.nranks == 0 || self.argv.is_empty() {
            tell(&format!("{name}: nothing to launch (need at least one rank and a program)"));
            return EXIT_SPAWN;
        }
        // Every rank runs on this host: the point listens on loopback only. It serves
        // set-up after set-up (a program may create several communicators from the id).
        let opts = ServerOptions { reusable: true, loopback: true, ..ServerOptions::default() };
        let (id, server) = match UniqueId::serve(opts) {
            Ok(x) => x,
            Err(e) => {
                tell(&format!("{name}: cannot start the rendezvous point: {e}"));
                return EXIT_RENDEZVOUS;
            }
        };
        let master = if self.given("MASTER_ADDR").is_none() && self.given("MASTER_PORT").is_none() {
            match reserve_loopback_port() {
                Ok(x) => Some(x),
                Err(e) => {
                    tell(&format!("{name}: cannot reserve a loopback port for MASTER_PORT: {e}"));
                    server.stop();
                    return EXIT_RENDEZVOUS;
                }
            }
        } else {
            None
        };
        SIGNALLED.store(0, Ordering::SeqCst);
        let handlers = Handlers::install();
        let code = self.run_ranks(&id, &server, master.as_ref().map(|m| m.1));
        drop(handlers);
        drop(master);
        server.stop();
        code
    }

    fn run_ranks(&self, id: &UniqueId, server: &Server, master_port: Option<u16>) -> i32 {
        let name = &self.name;
        let root_addr = id.addr().map(|a| a.to_string()).unwrap_or_default();
        let mut children: Vec<Option<Child>> = Vec::new();
        let mut pipes = Vec::new();
        let cpus = if self.bind { crate::sys::allowed_cpus() } else { Vec::new() };
        let binding = cpus.len() >= self.nranks;
        for r in 0..self.nranks {
            let direct = self.inherit_rank0 && r == 0;
            let mut cmd = Command::new(&self.argv[0]);
            cmd.args(&self.argv[1..]).envs(self.env.iter().map(|(k, v)| (k, v)));
            if let Some(p) = master_port {
                cmd.env("MASTER_ADDR", "127.0.0.1").env("MASTER_PORT", p.to_string());
            }
            // Every rank runs on this host: local rank and size are the rank and size.
            for (k, v) in [
                ("FERROCCL_RANK", r),
                ("FERROCCL_WORLD_SIZE", self.nranks),
                ("FERROCCL_LOCAL_RANK", r),
                ("FERROCCL_LOCAL_SIZE", self.nranks),
                ("RANK", r),
                ("WORLD_SIZE", self.nranks),
                ("LOCAL_RANK", r),
                ("LOCAL_WORLD_SIZE", self.nranks),
            ] {
                cmd.env(k, v.to_string());
            }
            cmd.env("FERROCCL_UNIQUE_ID", id.to_hex())
                .env("FERROCCL_ROOT_ADDR", &root_addr)
                .stdin(if r == 0 { Stdio::inherit() } else { Stdio::null() })
                .stdout(if direct { Stdio::inherit() } else { Stdio::piped() })
                .stderr(if direct { Stdio::inherit() } else { Stdio::piped() });
            let parent = std::process::id() as libc::pid_t;
            // SAFETY: a plain value; CPU_SET only writes inside it.
            let set = binding.then(|| unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpus[r % cpus.len()], &mut set);
                set
            });
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    if let Some(set) = &set {
                        // Best effort: a rank that cannot be pinned still runs.
                        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set);
                    }
                    // Die with the launcher, however it dies.
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    if libc::getppid() != parent {
                        libc::_exit(137);
                    }
                    Ok(())
                });
            }
            match cmd.spawn() {
                Ok(mut c) => {
                    if let Some(o) = c.stdout.take() {
                        pipes.push(forward(o, r, self.prefix, false));
                    }
                    if let Some(e) = c.stderr.take() {
                        pipes.push(forward(e, r, self.prefix, true));
                    }
                    children.push(Some(c));
                }
                Err(e) => {
                    tell(&format!("{name}: cannot start rank {r} ({}): {e}", self.argv[0].to_string_lossy()));
                    for c in children.iter_mut().flatten() {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    return EXIT_SPAWN;
                }
            }
        }

        let mut first_failure: Option<(usize, i32)> = None;
        let mut kill_at: Option<Instant> = None;
        let mut running = self.nranks;
        while running > 0 {
            let sig = SIGNALLED.load(Ordering::SeqCst);
            if sig != 0 {
                for c in children.iter_mut().flatten() {
                    // SAFETY: signalling our own child.
                    unsafe { libc::kill(c.id() as libc::pid_t, sig) };
                }
                kill_at.get_or_insert(Instant::now() + Duration::from_secs(2));
                first_failure.get_or_insert((usize::MAX, 128 + sig));
            }
            for (r, slot) in children.iter_mut().enumerate() {
                let Some(c) = slot else { continue };
                if let Ok(Some(st)) = c.try_wait() {
                    // A set-up waiting for this rank fails now, naming it, not at its timeout.
                    server.process_ended(r, self.nranks, c.id(), &describe(st));
                    running -= 1;
                    *slot = None;
                    if !st.success() {
                        tell(&format!("{name}: rank {r} {}", describe(st)));
                        if first_failure.is_none() {
                            first_failure = Some((r, code_of(st)));
                            kill_at = Some(Instant::now() + self.grace);
                        }
                    }
                }
            }
            if kill_at.is_some_and(|t| Instant::now() >= t) {
                for (r, c) in children.iter_mut().enumerate() {
                    if let Some(c) = c {
                        tell(&format!("{name}: killing rank {r} after another rank failed"));
                        let _ = c.kill();
                    }
                }
                kill_at = None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for p in pipes {
            let _ = p.join();
        }
        first_failure.map_or(0, |f| f.1)
    }
}

/// A TCP socket bound to a free loopback port with SO_REUSEADDR and not listening, and
/// its port: while it stays open the kernel gives the port to no other bind or connect,
/// yet a program that sets SO_REUSEADDR (torch's TCPStore does) may listen on it.
fn reserve_loopback_port() -> std::io::Result<(OwnedFd, u16)> {
    // SAFETY: socket() returns a new descriptor or -1.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads one c_int from a live local.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a plain value; zeroed is a valid sockaddr_in.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    addr.sin_family = libc::AF_INET as libc::sa_family_t;
    addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: bind and getsockname read/write a sockaddr_in of `len` bytes that outlives the calls.
    unsafe {
        if libc::bind(fd, &addr as *const libc::sockaddr_in as *const libc::sockaddr, len) != 0
            || libc::getsockname(fd, &mut addr as *mut libc::sockaddr_in as *mut libc::sockaddr, &mut len) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok((sock, u16::from_be(addr.sin_port)))
}

/// The signal handlers installed while ranks run; dropping restores the previous ones.
struct Handlers(Vec<(libc::c_int, libc::sighandler_t)>);

impl Handlers {
    fn install() -> Handlers {
        let mut old = Vec::new();
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: installing an async-signal-safe handler that only stores an atomic.
            let prev = unsafe { libc::signal(s, on_signal as *const () as libc::sighandler_t) };
            if prev != libc::SIG_ERR {
                old.push((s, prev));
            }
        }
        Handlers(old)
    }
}

impl Drop for Handlers {
    fn drop(&mut self) {
        for &(s, prev) in &self.0 {
            // SAFETY: restoring the handler that was installed before.
            unsafe { libc::signal(s, prev) };
        }
    }
}

/// Copies `src` line by line to stdout or stderr, each line prefixed with `[rank] `.
fn forward(src: impl Read + Send + 'static, rank: usize, prefix: bool, to_stderr: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let mut out: Vec<u8> = Vec::with_capacity(line.len() + 8);
                    if prefix {
                        out.extend_from_slice(format!("[{rank}] ").as_bytes());
                    }
                    out.extend_from_slice(&line);
                    if !out.ends_with(b"\n") {
                        out.push(b'\n');
                    }
                    // One write per line so lines of different ranks never interleave.
                    if to_stderr {
                        let _ = std::io::stderr().lock().write_all(&out);
                    } else {
                        let mut o = std::io::stdout().lock();
                        let _ = o.write_all(&out);
                        let _ = o.flush();
                    }
                }
            }
        }
    })
}

/// Writes one line to stderr in one write: rank 0 may share this stderr (`inherit_rank0`),
/// and `eprintln!` writes each piece of its format separately.
fn tell(msg: &str) {
    let _ = std::io::stderr().lock().write_all(format!("{msg}\n").as_bytes());
}

fn describe(st: ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => "ended".into(),
    }
}

fn code_of(st: ExitStatus) -> i32 {
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}
