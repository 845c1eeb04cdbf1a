//! The rendezvous point and communicator set-up under hostile and broken conditions
//! (docs/robustness.md, "Rendezvous and set-up"). Tests speak the wire protocol where
//! they play an attacker or a broken rank, and run real ranks (threads, or processes
//! through ferroccl-run or this binary) where they check what users see. Timing
//! assertions are upper bounds only: "fails within timeout * 1.1 + a constant".
//!
//! Tests here run one at a time (they count threads, descriptors and CPU time of the
//! process). Children are this binary re-run as `--exact child_entry` with RDV_CHILD.

use ferroccl::comm::bootstrap::{
    frame, read_frame, Challenge, Hello, JobKey, KeySource, ServerOptions, UniqueId, MAX_RANKS,
};
use ferroccl::comm::{Comm, Options};
use ferroccl::error::{Code, Error};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

const RUN: &str = env!("CARGO_BIN_EXE_ferroccl-run");

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn opts(timeout_ms: u64) -> Options {
    Options { timeout: Duration::from_millis(timeout_ms), ..Options::default() }
}

/// Runs `Comm::init_rank` for `ranks` of `n` on threads, each with its timeout; returns
/// each result (the communicator dropped) and how long it took.
fn init_threads(
    id: UniqueId,
    n: usize,
    ranks: &[usize],
    timeout_ms: u64,
) -> Vec<std::thread::JoinHandle<(Result<(), Error>, Duration)>> {
    ranks
        .iter()
        .map(|&r| {
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let res = Comm::init_rank(n, &id, r, opts(timeout_ms)).map(drop);
                (res, t0.elapsed())
            })
        })
        .collect()
}

fn join_all(hs: Vec<std::thread::JoinHandle<(Result<(), Error>, Duration)>>) -> Vec<(Result<(), Error>, Duration)> {
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// "fails within timeout * 1.1 + slack".
fn within(d: Duration, timeout_ms: u64, slack_ms: u64) -> bool {
    d <= Duration::from_millis(timeout_ms * 11 / 10 + slack_ms)
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// CPU time (user + system) of process `pid` so far.
fn cpu_time(pid: u32) -> Duration {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = s.rsplit_once(')').map_or(vec![], |(_, r)| r.split_whitespace().collect());
    // Fields 14 and 15 of stat: the 12th and 13th after the command name.
    let ticks: u64 =
        f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0) + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// Raises this process's descriptor limit as far as allowed; returns the new limit.
fn raise_fd_limit() -> usize {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on our own process with a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max.min(1 << 16);
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
    }
    r.rlim_cur as usize
}

/// The `i`-th byte a trickling client sends: a plausible hello's length, then zeros,
/// so that only a deadline for the whole hello can cut it.
fn trickle_byte(i: usize) -> u8 {
    (ferroccl::comm::bootstrap::HELLO_BYTES as u32).to_le_bytes().get(i).copied().unwrap_or(0)
}

/// A client speaking the protocol by hand.
struct Raw {
    s: TcpStream,
    challenge: [u8; 32],
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let b = read_frame(&mut s, 64).expect("the point greets first");
        let challenge = Challenge::decode(&b).expect("a challenge").nonce;
        Raw { s, challenge }
    }

    /// Sends a hello under `key` (`pid`: pretend to be another process) and returns
    /// the reply's status and text.
    fn hello(&mut self, key: &[u8; 32], nranks: u32, rank: u32, pid: Option<u32>) -> (u8, String) {
        let mut h = Hello::new(key, &self.challenge, nranks, rank, 20_000).unwrap();
        if let Some(p) = pid {
            h.pid = p;
            h.sign(key, &self.challenge);
        }
        self.s.write_all(&frame(&h.encode())).unwrap();
        let r = read_frame(&mut self.s, 1 << 16).expect("a reply");
        (r[0], String::from_utf8_lossy(&r[1..]).into_owned())
    }
}

/// This binary as a child in role `role`, with the launchers' variables removed.
fn child(role: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child_entry", "--nocapture", "--test-threads=1", "-q"]);
    for v in ferroccl::env::ALL {
        c.env_remove(v.name);
    }
    c.env("RDV_CHILD", role);
    c
}

/// A child's report: result code, milliseconds, message.
#[derive(Debug)]
struct Report {
    rc: i32,
    ms: u64,
    msg: String,
}

fn reports(out: &str) -> Vec<(Option<usize>, Report)> {
    out.lines()
        .filter_map(|l| {
            let i = l.find("RDV rc=")?;
            let rank = l.strip_prefix('[').and_then(|r| r.split_once(']')).and_then(|(r, _)| r.parse().ok());
            let rest = &l[i + 7..];
            let (rc, rest) = rest.split_once(" ms=")?;
            let (ms, msg) = rest.split_once(" msg=")?;
            Some((rank, Report { rc: rc.parse().ok()?, ms: ms.parse().ok()?, msg: msg.to_string() }))
        })
        .collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The body of every child: initialises from the environment (after what its role
/// asks) and prints one `RDV rc=.. ms=.. msg=..` line.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var("RDV_CHILD") else { return };
    let rank = std::env::var("FERROCCL_RANK").unwrap_or_default();
    match role.as_str() {
        "flood_rank" => {
            if rank == "0" {
                println!("ROOT {}", std::env::var("FERROCCL_ROOT_ADDR").unwrap());
            }
            let go = std::path::PathBuf::from(std::env::var("RDV_GO").unwrap());
            let t0 = Instant::now();
            while !go.exists() && t0.elapsed() < Duration::from_secs(60) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        "kill_rank" if rank == "2" => {
            std::thread::sleep(Duration::from_millis(300));
            // SAFETY: raising a signal in this process.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        _ => {}
    }
    let mut comm = std::ptr::null_mut();
    let t0 = Instant::now();
    // SAFETY: a valid out-pointer.
    let rc = unsafe { ferroccl::ffi::comm::fcclCommInitFromEnv(ferroccl::ffi::as_out(&mut comm)) };
    let ms = t0.elapsed().as_millis();
    // SAFETY: returns a NUL-terminated string.
    let msg = unsafe { std::ffi::CStr::from_ptr(ferroccl::ffi::comm::fcclGetLastError(std::ptr::null_mut())) };
    println!("RDV rc={rc} ms={ms} msg={}", msg.to_string_lossy().replace('\n', " "));
    if rc == 0 {
        // SAFETY: a live communicator.
        unsafe { ferroccl::ffi::comm::fcclCommDestroy(comm) };
    }
}

// ------------------------------------------------------------------ item 2

#[test]
fn slow_clients_trickling_bytes_are_cut_at_the_hello_deadline() {
    let _g = serial();
    let hello_deadline = Duration::from_secs(1);
    let so = ServerOptions { hello_deadline, max_pending: 32, ..ServerOptions::default() };
    let (id, srv) = UniqueId::serve(so).unwrap();
    let addr = id.addr().unwrap();
    let threads_before = threads();
    // 150 clients each send one byte of a would-be hello every 100 ms.
    let mut tricklers: Vec<(TcpStream, Instant, Option<Instant>, usize)> = (0..150)
        .map(|_| {
            let s = TcpStream::connect(addr).unwrap();
            s.set_nonblocking(true).unwrap();
            (s, Instant::now(), None, 0)
        })
        .collect();
    let job = init_threads(id, 3, &[0, 1, 2], 10_000);
    let t0 = Instant::now();
    let mut most_threads = 0;
    while t0.elapsed() < Duration::from_secs(3) && tricklers.iter().any(|t| t.2.is_none()) {
        for (s, _, closed, sent) in tricklers.iter_mut().filter(|t| t.2.is_none()) {
            let mut b = [0u8; 256];
            let gone = match s.read(&mut b) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            };
            if gone || s.write(&[trickle_byte(*sent)]).is_err() {
                *closed = Some(Instant::now());
            }
            *sent += 1;
        }
        most_threads = most_threads.max(threads());
        std::thread::sleep(Duration::from_millis(100));
    }
    for (r, (res, _)) in join_all(job).into_iter().enumerate() {
        assert!(res.is_ok(), "rank {r} of the real job failed among trickling clients: {res:?}");
    }
    for (i, (_, opened, closed, _)) in tricklers.iter().enumerate() {
        let closed = closed.unwrap_or_else(|| panic!("trickling client {i} was still connected after 3 s"));
        assert!(
            closed.duration_since(*opened) <= hello_deadline * 11 / 10 + Duration::from_millis(600),
            "client {i} was cut after {:?}; the hello deadline is {hello_deadline:?}",
            closed.duration_since(*opened)
        );
    }
    // One thread serves every connection.
    assert!(most_threads < threads_before + 10, "{threads_before} threads before, {most_threads} with 150 clients");
    let cut = tricklers.iter().filter_map(|t| Some(t.2?.duration_since(t.1))).max().unwrap();
    eprintln!("150 trickling clients, hello deadline {hello_deadline:?}: the last was cut after {cut:?}");
    srv.stop();
}

#[test]
fn hundreds_of_idle_connections_cost_no_thread_or_cpu_and_do_not_block_a_job() {
    let _g = serial();
    let n = 600.min(raise_fd_limit().saturating_sub(200));
    let cap = 256;
    let so = ServerOptions { hello_deadline: Duration::from_secs(30), max_pending: cap, ..ServerOptions::default() };
    let (id, srv) = UniqueId::serve(so).unwrap();
    let addr = id.addr().unwrap();
    let threads_before = threads();
    let mut idle: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let me = std::process::id();
    std::thread::sleep(Duration::from_millis(300));
    let (cpu0, t0) = (cpu_time(me), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let (cpu, wall) = (cpu_time(me) - cpu0, t0.elapsed());
    // Idle means asleep in poll: a busy loop would burn the whole interval.
    assert!(cpu < wall / 4, "the process used {cpu:?} of CPU in {wall:?} with {n} idle connections");
    assert!(
        threads() < threads_before + 10,
        "{threads_before} threads before, {} with {n} idle connections",
        threads()
    );
    // The oldest were closed to keep at most `cap` waiting for a hello.
    eprintln!("{n} idle connections: {cpu:?} of CPU in {wall:?}");
    let open = idle
        .iter_mut()
        .map(|s| {
            s.set_nonblocking(true).unwrap();
            let mut b = [0u8; 128];
            loop {
                match s.read(&mut b) {
                    Ok(0) => return false,
                    Ok(_) => continue,
                    Err(e) => return e.kind() == std::io::ErrorKind::WouldBlock,
                }
            }
        })
        .filter(|&open| open)
        .count();
    if n > cap {
        assert!(open <= cap, "{open} of {n} idle connections are still open; the cap is {cap}");
    }
    let job = join_all(init_threads(id, 3, &[0, 1, 2], 10_000));
    for (r, (res, took)) in job.iter().enumerate() {
        assert!(res.is_ok(), "rank {r} failed among {n} idle connections: {res:?}");
        assert!(*took < Duration::from_secs(5), "rank {r} took {took:?} among {n} idle connections");
    }
    srv.stop();
}

/// The reported attack: 1,100 clients trickling bytes at ferroccl-run, which has 256
/// descriptors. The ranks must still start, and the launcher must not spin.
#[test]
fn launcher_at_its_descriptor_limit_under_a_flood_still_starts_the_job() {
    let _g = serial();
    let n = 1100.min(raise_fd_limit().saturating_sub(300));
    let go = std::env::temp_dir().join(format!("ferroccl-rdv-go-{}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let me = std::env::current_exe().unwrap();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"ulimit -n 256 && exec "$0" -n 2 -- "$1" --exact child_entry --nocapture --test-threads=1 -q"#)
        .arg(RUN)
        .arg(&me)
        .env("RDV_GO", &go)
        .env("FERROCCL_TIMEOUT_MS", "20000")
        .env("RDV_CHILD", "flood_rank")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for v in ferroccl::env::ALL {
        if v.name != "FERROCCL_TIMEOUT_MS" {
            cmd.env_remove(v.name);
        }
    }
    let mut p = cmd.spawn().unwrap();
    let pid = p.id();
    let out = p.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut lines = Vec::new();
    let root = loop {
        let l = rx.recv_timeout(Duration::from_secs(30)).expect("rank 0 prints the rendezvous address");
        lines.push(l.clone());
        if let Some(a) = l.split_once("ROOT ").map(|x| x.1.trim().to_string()) {
            break a.parse::<SocketAddr>().unwrap();
        }
    };
    // The flood: connect as many as possible, then trickle a byte each, reconnecting
    // whenever the point drops one.
    let t_flood = Instant::now();
    let (cpu0, t0) = (cpu_time(pid), Instant::now());
    let mut socks: Vec<Option<(TcpStream, usize)>> = Vec::new();
    while socks.len() < n && t_flood.elapsed() < Duration::from_secs(5) {
        socks.push(TcpStream::connect_timeout(&root, Duration::from_millis(100)).ok().map(|s| (s, 0)));
    }
    let mut cpu = cpu0;
    let status = loop {
        if let Some(st) = p.try_wait().unwrap() {
            break st;
        }
        // The ranks start once the flood has trickled for a second.
        if t0.elapsed() > Duration::from_secs(1) && !go.exists() {
            std::fs::write(&go, b"go").unwrap();
        }
        cpu = cpu_time(pid).max(cpu);
        let mut redials = 0;
        for s in socks.iter_mut() {
            let alive = s.as_mut().is_some_and(|(x, sent)| {
                *sent += 1;
                x.write(&[trickle_byte(*sent - 1)]).is_ok()
            });
            if !alive && redials < 50 {
                redials += 1;
                *s = TcpStream::connect_timeout(&root, Duration::from_millis(20)).ok().map(|s| (s, 0));
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "ferroccl-run did not finish");
        std::thread::sleep(Duration::from_millis(200));
    };
    let wall = t0.elapsed();
    drop(socks);
    reader.join().unwrap();
    let _ = std::fs::remove_file(&go);
    lines.extend(rx.try_iter());
    let text = lines.join("\n");
    let mut err = String::new();
    p.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "ferroccl-run failed under the flood: {status:?}\n{text}\n{err}");
    let rep = reports(&text);
    assert_eq!(rep.len(), 2, "{text}\n{err}");
    let mut ms = Vec::new();
    for (rank, r) in rep {
        assert_eq!(r.rc, 0, "rank {rank:?}: {}", r.msg);
        assert!(r.ms < 10_000, "rank {rank:?} took {} ms to start under the flood", r.ms);
        ms.push(r.ms);
    }
    let used = cpu - cpu0;
    assert!(used < wall / 2 + Duration::from_millis(500), "the launcher used {used:?} of CPU in {wall:?}");
    eprintln!("flood of {n} trickling clients at ferroccl-run (ulimit -n 256): ranks started in {ms:?} ms; the launcher used {used:?} of CPU in {wall:?}");
}

// ------------------------------------------------------------------ item 3

#[test]
fn a_stranger_with_the_zero_secret_is_refused_and_the_job_still_meets() {
    let _g = serial();
    let id = UniqueId::generate().unwrap();
    let addr = id.addr().unwrap();
    // The all-zero secret: a different job as far as the point can tell.
    let (st, msg) = Raw::connect(addr).hello(&[0; 32], 2, 1, None);
    assert_eq!(st, 1, "{msg}");
    assert!(msg.contains("another job") && msg.contains("FERROCCL_SECRET"), "{msg}");
    // This job's id with a forged proof.
    let mut raw = Raw::connect(addr);
    let mut h = Hello::new(&[0; 32], &raw.challenge, 2, 1, 1000).unwrap();
    h.job_id = ferroccl::comm::bootstrap::job_id(&id.secret());
    raw.s.write_all(&frame(&h.encode())).unwrap();
    let r = read_frame(&mut raw.s, 1 << 16).unwrap();
    assert_eq!(r[0], 1);
    assert!(String::from_utf8_lossy(&r[1..]).contains("proof"), "{}", String::from_utf8_lossy(&r[1..]));
    for (r, (res, _)) in join_all(init_threads(id, 2, &[0, 1], 10_000)).into_iter().enumerate() {
        assert!(res.is_ok(), "rank {r}: {res:?}");
    }
}

#[test]
fn a_fixed_address_without_any_secret_is_refused_with_what_to_set() {
    let _g = serial();
    let port = free_port();
    let out = child("init")
        .env("FERROCCL_ROOT_ADDR", format!("127.0.0.1:{port}"))
        .env("FERROCCL_RANK", "1")
        .env("FERROCCL_WORLD_SIZE", "2")
        .env("FERROCCL_TIMEOUT_MS", "3000")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let rep = reports(&text);
    assert_eq!(rep.len(), 1, "{text}");
    let r = &rep[0].1;
    assert_eq!(r.rc, Code::InvalidUsage as i32, "{r:?}");
    assert!(r.msg.contains("FERROCCL_SECRET") && r.ms < 1000, "{r:?}");
}

#[test]
fn two_jobs_on_one_port_never_merge() {
    let _g = serial();
    let root = format!("127.0.0.1:{}", free_port());
    let rank = |run_id: &str, rank: &str| {
        let mut c = child("init");
        c.env("FERROCCL_ROOT_ADDR", &root)
            .env("FERROCCL_RANK", rank)
            .env("FERROCCL_WORLD_SIZE", "2")
            .env("FERROCCL_TIMEOUT_MS", "20000")
            .env("TORCHELASTIC_RUN_ID", run_id)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    let a0 = rank("job-A", "0");
    let b1 = rank("job-B", "1").wait_with_output().unwrap();
    let b1_text = String::from_utf8_lossy(&b1.stdout).into_owned();
    let rb = reports(&b1_text);
    assert_eq!(rb.len(), 1, "{b1_text}");
    let rb = &rb[0].1;
    assert_ne!(rb.rc, 0, "rank 1 of job B joined job A's communicator: {rb:?}");
    assert!(rb.msg.contains("another job") && rb.msg.contains(&root), "{rb:?}");
    assert!(rb.ms < 10_000, "{rb:?}");
    let a1 = rank("job-A", "1").wait_with_output().unwrap();
    let a0 = a0.wait_with_output().unwrap();
    for (who, o) in [("A0", &a0), ("A1", &a1)] {
        let t = String::from_utf8_lossy(&o.stdout);
        let r = reports(&t);
        assert!(r.len() == 1 && r[0].1.rc == 0, "{who}: {t}\n{}", String::from_utf8_lossy(&o.stderr));
    }
    // The point's side says so too.
    let a0_err = String::from_utf8_lossy(&a0.stderr);
    assert!(a0_err.contains("another job"), "rank 0 of job A logged nothing about job B: {a0_err}");
}

// ------------------------------------------------------------------ item 4

/// A listener that accepts and never says anything.
fn mute_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in l.incoming() {
            held.push(c);
        }
    });
    addr
}

#[test]
fn init_against_a_mute_server_fails_within_the_timeout_naming_what_it_waited_for() {
    let _g = serial();
    let addr = mute_server();
    // Through the environment, as the issue measured it.
    let out = child("init")
        .env("FERROCCL_ROOT_ADDR", addr.to_string())
        .env("FERROCCL_SECRET", "s3cret")
        .env("FERROCCL_RANK", "1")
        .env("FERROCCL_WORLD_SIZE", "2")
        .env("FERROCCL_TIMEOUT_MS", "5000")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let rep = reports(&text);
    assert_eq!(rep.len(), 1, "{text}");
    let r = &rep[0].1;
    assert_eq!(r.rc, Code::Timeout as i32, "{r:?}");
    assert!(r.ms <= 5500, "init against a mute server with FERROCCL_TIMEOUT_MS=5000 took {} ms", r.ms);
    assert!(r.msg.contains("greet") && r.msg.contains(&addr.to_string()), "{r:?}");
    eprintln!("mute server, FERROCCL_TIMEOUT_MS=5000: failed after {} ms: {}", r.ms, r.msg);
    // In process, with a config timeout.
    let id = UniqueId::from_addr(addr, JobKey::derive(KeySource::Secret, "x"));
    let (res, took) = join_all(init_threads(id, 2, &[1], 2000)).pop().unwrap();
    let e = res.unwrap_err();
    assert_eq!(e.code, Code::Timeout, "{}", e.msg);
    assert!(within(took, 2000, 100), "took {took:?} with a 2000 ms timeout: {}", e.msg);
}

#[test]
fn a_mute_peer_fails_the_others_within_the_timeout_naming_it() {
    let _g = serial();
    let id = UniqueId::generate().unwrap();
    let job = init_threads(id, 3, &[0, 1], 3000);
    // Rank 2 joins and then says nothing.
    let mut mute = Raw::connect(id.addr().unwrap());
    let (st, msg) = mute.hello(&id.secret(), 3, 2, None);
    assert_eq!(st, 0, "{msg}");
    for (r, (res, took)) in join_all(job).into_iter().enumerate() {
        let e = res.unwrap_err();
        assert_eq!(e.code, Code::Timeout, "rank {r}: {}", e.msg);
        assert!(within(took, 3000, 200), "rank {r} took {took:?} with a 3000 ms timeout");
        assert!(e.msg.contains("joined but did not reach round 0: 2 (pid"), "rank {r}: {}", e.msg);
        eprintln!("mute peer, timeout 3000 ms: rank {r} failed after {took:?}: {}", e.msg);
    }
}

#[test]
fn a_duplicate_rank_is_refused_within_its_timeout_and_the_job_goes_on() {
    let _g = serial();
    let id = UniqueId::generate().unwrap();
    let addr = id.addr().unwrap();
    let job = init_threads(id, 3, &[0, 1], 20_000);
    std::thread::sleep(Duration::from_millis(300));
    // Another process claiming rank 1: refused at once, naming both processes.
    let t0 = Instant::now();
    let (st, msg) = Raw::connect(addr).hello(&id.secret(), 3, 1, Some(4_000_000));
    assert_eq!(st, 1, "{msg}");
    assert!(msg.contains("already taken") && msg.contains("pid 4000000"), "{msg}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    eprintln!("duplicate rank from another process: refused after {:?}: {msg}", t0.elapsed());
    // This process claiming it again (it could be its next communicator): refused when
    // its own timeout runs out, saying why.
    let (res, took) = join_all(init_threads(id, 3, &[1], 2000)).pop().unwrap();
    let e = res.unwrap_err();
    assert!(within(took, 2000, 200), "a duplicate rank 1 was refused after {took:?} with a 2000 ms timeout");
    assert!(e.msg.contains("already has rank 1") && e.msg.contains("two processes claim rank 1"), "{}", e.msg);
    eprintln!("duplicate rank, timeout 2000 ms: refused after {took:?}: {}", e.msg);
    // The set-up in progress was not disturbed.
    let last = init_threads(id, 3, &[2], 20_000);
    for (r, (res, _)) in join_all(job).into_iter().chain(join_all(last)).enumerate() {
        assert!(res.is_ok(), "rank {r}: {res:?}");
    }
}

// ------------------------------------------------------------------ item 5

#[test]
fn an_absurd_rank_count_from_a_key_holder_is_refused_without_allocating() {
    let _g = serial();
    let (id, srv) = UniqueId::serve(ServerOptions { reusable: true, ..ServerOptions::default() }).unwrap();
    let addr = id.addr().unwrap();
    for (n, r) in [(u32::MAX, 0), (u32::MAX, u32::MAX - 1), (MAX_RANKS as u32 + 1, 0), (0, 0), (4, 9)] {
        let (st, msg) = Raw::connect(addr).hello(&id.secret(), n, r, None);
        assert_eq!(st, 1, "{n}/{r}: {msg}");
        assert!(msg.contains(&n.to_string()), "{msg}");
    }
    for (r, (res, _)) in join_all(init_threads(id, 2, &[0, 1], 10_000)).into_iter().enumerate() {
        assert!(res.is_ok(), "rank {r}: {res:?}");
    }
    // The client side refuses such counts before connecting.
    let e = Comm::init_rank(MAX_RANKS + 1, &id, 0, opts(1000)).err().unwrap();
    assert_eq!(e.code, Code::InvalidArgument, "{}", e.msg);
    srv.stop();
}

// ------------------------------------------------------------------ item 9

#[test]
fn a_wrong_world_size_fails_every_rank_at_once() {
    let _g = serial();
    let id = UniqueId::generate().unwrap();
    let job = init_threads(id, 3, &[0, 1], 20_000);
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let e = Comm::init_rank(4, &id, 2, opts(20_000)).err().expect("a rank with a wrong world size is refused");
    assert!(e.msg.contains("4 ranks") && e.msg.contains("has 3"), "{}", e.msg);
    for (r, (res, _)) in join_all(job).into_iter().enumerate() {
        let e = res.unwrap_err();
        assert!(e.msg.contains("rank 2") && e.msg.contains("4 ranks"), "rank {r}: {}", e.msg);
    }
    assert!(t0.elapsed() < Duration::from_secs(3), "the others learnt of it after {:?}", t0.elapsed());
    eprintln!("wrong world size: every rank failed {:?} after it arrived (timeout 20 s)", t0.elapsed());
}

/// A hand-played rank 2 of 3 on `host` that joins and completes round 0 (a wire-up
/// description: host, pid, CPUs: any).
fn rank_2_through_round_0(id: &UniqueId, host: u64) -> Raw {
    let mut r = Raw::connect(id.addr().unwrap());
    let (st, msg) = r.hello(&id.secret(), 3, 2, None);
    assert_eq!(st, 0, "{msg}");
    let mut info = vec![0u8; 64];
    info[0..8].copy_from_slice(&host.to_le_bytes());
    info[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    info[15] = 1;
    let mut f = 0u32.to_le_bytes().to_vec();
    f.extend_from_slice(&20_000u32.to_le_bytes());
    f.extend_from_slice(&info);
    r.s.write_all(&frame(&f)).unwrap();
    let reply = read_frame(&mut r.s, 1 << 20).unwrap();
    assert_eq!(reply[0], 0, "{}", String::from_utf8_lossy(&reply[1..]));
    r
}

/// A rank whose own set-up fails after it joined reports why, and every other rank fails
/// at once with that reason (rank 0 may serve the point and be the one that failed).
#[test]
fn a_rank_that_fails_its_set_up_tells_every_rank_why() {
    let _g = serial();
    let id = UniqueId::generate().unwrap();
    let job = init_threads(id, 3, &[0, 1], 20_000);
    let mut failing = rank_2_through_round_0(&id, ferroccl::comm::bootstrap::host_id());
    let t0 = Instant::now();
    let mut f = (u32::MAX - 1).to_le_bytes().to_vec();
    f.extend_from_slice(&0u32.to_le_bytes());
    f.extend_from_slice(b"cannot reach rank 0 at 192.0.2.1 port 9");
    failing.s.write_all(&frame(&f)).unwrap();
    let confirm = read_frame(&mut failing.s, 1 << 20).unwrap();
    assert_eq!(confirm[0], 1, "the reporter is told the set-up failed");
    for (r, (res, _)) in join_all(job).into_iter().enumerate() {
        let e = res.unwrap_err();
        assert_eq!(e.code, Code::RemoteError, "rank {r}: {}", e.msg);
        assert!(
            e.msg.contains("rank 2 failed its set-up: cannot reach rank 0 at 192.0.2.1 port 9"),
            "rank {r}: {}",
            e.msg
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(2), "the others learnt of it after {:?}", t0.elapsed());
}

/// A key holder that says BYE before the first round (a rank whose init ended early, or
/// a broken client) fails the set-up at once, naming it; the others used to wait for
/// their timeout while the point said "every rank arrived".
#[test]
fn a_rank_that_leaves_before_round_0_fails_the_others_at_once_naming_it() {
    let _g = serial();
    let id = UniqueId::generate().unwrap();
    let job = init_threads(id, 3, &[0, 1], 20_000);
    // Ranks 0 and 1 wait in round 0 for rank 2.
    std::thread::sleep(Duration::from_millis(300));
    let mut r2 = Raw::connect(id.addr().unwrap());
    let (st, msg) = r2.hello(&id.secret(), 3, 2, None);
    assert_eq!(st, 0, "{msg}");
    let t0 = Instant::now();
    let mut bye = u32::MAX.to_le_bytes().to_vec();
    bye.extend_from_slice(&0u32.to_le_bytes());
    r2.s.write_all(&frame(&bye)).unwrap();
    let pid = std::process::id();
    for (r, (res, _)) in join_all(job).into_iter().enumerate() {
        let e = res.unwrap_err();
        assert_eq!(e.code, Code::RemoteError, "rank {r}: {}", e.msg);
        assert!(
            e.msg.contains(&format!("rank 2 (pid {pid} at ")) && e.msg.contains("left before the set-up finished"),
            "rank {r}: {}",
            e.msg
        );
        assert!(!e.msg.contains("every rank arrived"), "rank {r}: {}", e.msg);
    }
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "the others learnt of it after {took:?} (timeout 20 s)");
    eprintln!("BYE before round 0: the others failed {took:?} after it (timeout 20 s)");
}

/// Ranks 0 and 1 (threads here) with a hand-played rank 2 on `host` that sends its
/// description in round 0 and then stalls in round 1. Returns the TCP ports the
/// ranks opened meanwhile (local addresses as /proc/net/tcp gives them, hex) and
/// checks that losing rank 2's connection then fails them at once, naming it.
fn ports_opened_while_a_peer_stalls(host: u64) -> Vec<String> {
    let id = UniqueId::generate().unwrap();
    let before = listeners();
    let job = init_threads(id, 3, &[0, 1], 20_000);
    let stalled = rank_2_through_round_0(&id, host);
    std::thread::sleep(Duration::from_millis(500));
    let opened: Vec<String> = listeners().into_iter().filter(|l| !before.contains(l)).collect();
    let t0 = Instant::now();
    drop(stalled);
    for (r, (res, _)) in join_all(job).into_iter().enumerate() {
        let e = res.unwrap_err();
        assert_eq!(e.code, Code::RemoteError, "rank {r}: {}", e.msg);
        assert!(e.msg.contains("rank 2 (pid") && e.msg.contains("closed its connection"), "rank {r}: {}", e.msg);
    }
    assert!(t0.elapsed() < Duration::from_secs(2), "the others learnt of it after {:?}", t0.elapsed());
    eprintln!("rank lost in round 1: the others failed {:?} after (timeout 20 s)", t0.elapsed());
    opened
}

/// When a rank's connection drops mid-set-up the others fail at once, naming it; ranks
/// whose peers are all on this host open no TCP port.
#[test]
fn a_rank_lost_mid_set_up_fails_the_others_fast_and_local_ranks_open_no_port() {
    let _g = serial();
    let opened = ports_opened_while_a_peer_stalls(ferroccl::comm::bootstrap::host_id());
    assert!(opened.is_empty(), "ranks whose peers are all local opened ports: {opened:?}");
}

/// A rank with a peer on another host opens a port on the address it advertises, not on
/// every interface (here the rendezvous is on loopback, which another host cannot
/// reach, so that is this host's first other interface).
#[test]
fn ranks_with_a_remote_peer_listen_on_their_advertised_address_only() {
    let _g = serial();
    if std::env::var_os("FERROCCL_HOST_ADDR").is_some() {
        return;
    }
    let opened = ports_opened_while_a_peer_stalls(other_host());
    assert_eq!(opened.len(), 2, "ranks 0 and 1 each open one port for rank 2: {opened:?}");
    for l in &opened {
        // 00000000 is every interface in /proc/net/tcp.
        assert!(!l.starts_with("00000000:"), "a port for remote peers listens on {l}");
        assert_eq!(l.split(':').next(), opened[0].split(':').next(), "both ranks advertise one address: {opened:?}");
    }
}

fn other_host() -> u64 {
    ferroccl::comm::bootstrap::host_id() ^ 0x5eed
}

/// Listening TCP sockets of this process, as "address:port" (hex, from /proc/net).
fn listeners() -> Vec<String> {
    let mine: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(String::from))
        .collect();
    let mut out = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for l in std::fs::read_to_string(f).unwrap_or_default().lines().skip(1) {
            let c: Vec<&str> = l.split_whitespace().collect();
            if c.len() > 9 && c[3] == "0A" && mine.iter().any(|i| i == c[9]) {
                out.push(c[1].to_string());
            }
        }
    }
    out
}

/// A rank's process killed before it reached the rendezvous: ferroccl-run tells its
/// point, which fails the set-up for the others at once.
#[test]
fn a_rank_killed_during_set_up_fails_the_survivors_fast_naming_it() {
    let _g = serial();
    let me = std::env::current_exe().unwrap();
    let mut cmd = Command::new(RUN);
    cmd.args(["-n", "3", "--grace", "60", "--"])
        .arg(&me)
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1", "-q"])
        .env("RDV_CHILD", "kill_rank")
        .env("FERROCCL_TIMEOUT_MS", "30000");
    for v in ferroccl::env::ALL {
        if v.name != "FERROCCL_TIMEOUT_MS" {
            cmd.env_remove(v.name);
        }
    }
    let t0 = Instant::now();
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let rep = reports(&text);
    assert_eq!(rep.len(), 2, "{text}\n{err}");
    for (rank, r) in rep {
        assert_eq!(r.rc, Code::RemoteError as i32, "rank {rank:?}: {}", r.msg);
        assert!(r.msg.contains("rank 2") && r.msg.contains("killed by signal 9"), "rank {rank:?}: {}", r.msg);
        assert!(r.ms < 5000, "rank {rank:?} learnt of rank 2's death after {} ms (timeout 30000)", r.ms);
        eprintln!("rank killed before joining: rank {rank:?} failed after {} ms: {}", r.ms, r.msg);
    }
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
}

// ------------------------------------------------------------------ semantics kept

/// A rank may start its next communicator on a reusable id (ferroccl-run's) before
/// the others have finished setting up the previous one.
#[test]
fn ranks_set_up_communicators_back_to_back_on_a_reusable_id() {
    let _g = serial();
    let (id, srv) = UniqueId::serve(ServerOptions { reusable: true, ..ServerOptions::default() }).unwrap();
    let hs: Vec<_> = (0..3)
        .map(|r| {
            std::thread::spawn(move || {
                // Rank 0 hurries; the others dawdle between communicators.
                (0..3)
                    .map(|k| {
                        if r != 0 {
                            std::thread::sleep(Duration::from_millis(30 * k));
                        }
                        Comm::init_rank(3, &id, r, opts(20_000)).map(drop)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for (r, h) in hs.into_iter().enumerate() {
        for (k, res) in h.join().unwrap().into_iter().enumerate() {
            assert!(res.is_ok(), "rank {r}, communicator {k}: {res:?}");
        }
    }
    srv.stop();
}
