//! ferroccl-run: starts N ranks of a program as local processes.
//!
//! It serves the rendezvous itself, sets FERROCCL_RANK, FERROCCL_WORLD_SIZE,
//! FERROCCL_UNIQUE_ID and FERROCCL_ROOT_ADDR in each rank's environment, prefixes each
//! line of output with the rank, exits non-zero if any rank fails, and takes every
//! rank down with it when it is killed (ranks get SIGKILL when the launcher dies).

use ferroccl::comm::bootstrap::UniqueId;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

struct Args {
    n: usize,
    prefix: bool,
    grace: Duration,
    prog: Vec<String>,
}

fn usage() -> String {
    let mut s = String::from(
        "usage: ferroccl-run -n N [--no-prefix] [--grace SECONDS] [--] program [args...]\n\n\
         Starts N ranks of `program` as local processes that find each other through\n\
         fcclCommInitFromEnv. Output lines are prefixed with [rank]. The exit status is\n\
         0 when every rank exits 0, otherwise the first failing rank's status; when one\n\
         rank fails the others get SECONDS (default 5) to finish before they are killed.\n\n\
         Environment variables ferroccl reads:\n",
    );
    for v in ferroccl::env::ALL {
        s += &format!(
            "  {:<22} {}{}\n",
            v.name,
            v.doc,
            if v.default.is_empty() { String::new() } else { format!(" (default {})", v.default) }
        );
    }
    s
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args { n: 0, prefix: true, grace: Duration::from_secs(5), prog: Vec::new() };
    while let Some(x) = it.next() {
        match x.as_str() {
            "-n" | "-np" | "--np" | "--nranks" => {
                let v = it.next().ok_or("-n needs a number of ranks")?;
                a.n = v.parse().map_err(|_| format!("-n {v}: not a number of ranks"))?;
            }
            "--no-prefix" => a.prefix = false,
            "--grace" => {
                let v = it.next().ok_or("--grace needs seconds")?;
                a.grace = Duration::from_secs_f64(v.parse().map_err(|_| format!("--grace {v}: not a number"))?);
            }
            "-h" | "--help" => {
                print!("{}", usage());
                std::process::exit(0);
            }
            "--" => {
                a.prog.extend(it.by_ref());
            }
            _ if x.starts_with('-') && a.prog.is_empty() => return Err(format!("unknown option {x}")),
            _ => {
                a.prog.push(x);
                a.prog.extend(it.by_ref());
            }
        }
    }
    if a.n == 0 {
        return Err("give the number of ranks with -n N (N >= 1)".into());
    }
    if a.prog.is_empty() {
        return Err("give the program to run".into());
    }
    Ok(a)
}

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

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ferroccl-run: {e}\n\n{}", usage());
            std::process::exit(2);
        }
    };
    let id = match UniqueId::generate(true) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("ferroccl-run: cannot start the rendezvous point: {e}");
            std::process::exit(2);
        }
    };
    for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installing an async-signal-safe handler that only stores an atomic.
        unsafe { libc::signal(s, on_signal as *const () as libc::sighandler_t) };
    }
    let root_addr = id.addr().map(|a| a.to_string()).unwrap_or_default();
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut pipes = Vec::new();
    for r in 0..args.n {
        let mut cmd = Command::new(&args.prog[0]);
        cmd.args(&args.prog[1..])
            .env("FERROCCL_RANK", r.to_string())
            .env("FERROCCL_WORLD_SIZE", args.n.to_string())
            .env("FERROCCL_LOCAL_RANK", r.to_string())
            .env("FERROCCL_LOCAL_SIZE", args.n.to_string())
            .env("FERROCCL_UNIQUE_ID", id.to_hex())
            .env("FERROCCL_ROOT_ADDR", &root_addr)
            .stdin(if r == 0 { Stdio::inherit() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
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
                pipes.push(forward(c.stdout.take().expect("piped"), r, args.prefix, false));
                pipes.push(forward(c.stderr.take().expect("piped"), r, args.prefix, true));
                children.push(Some(c));
            }
            Err(e) => {
                eprintln!("ferroccl-run: cannot start rank {r} ({}): {e}", args.prog[0]);
                for c in children.iter_mut().flatten() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                std::process::exit(127);
            }
        }
    }

    let mut first_failure: Option<(usize, i32)> = None;
    let mut kill_at: Option<Instant> = None;
    let mut running = args.n;
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
                running -= 1;
                *slot = None;
                if !st.success() {
                    eprintln!("ferroccl-run: rank {r} {}", describe(st));
                    if first_failure.is_none() {
                        first_failure = Some((r, code_of(st)));
                        kill_at = Some(Instant::now() + args.grace);
                    }
                }
            }
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            for (r, c) in children.iter_mut().enumerate() {
                if let Some(c) = c {
                    eprintln!("ferroccl-run: killing rank {r} after another rank failed");
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
    std::process::exit(first_failure.map_or(0, |f| f.1));
}
