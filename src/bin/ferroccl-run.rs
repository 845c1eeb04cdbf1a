//! ferroccl-run: starts N ranks of a program as local processes.
//!
//! It serves the rendezvous itself (on loopback, with a random key per run), sets
//! FERROCCL_RANK, FERROCCL_WORLD_SIZE, FERROCCL_UNIQUE_ID and FERROCCL_ROOT_ADDR in
//! each rank's environment, prefixes each line of output with the rank, exits non-zero
//! if any rank fails, and takes every rank down with it when it is killed (ranks get
//! SIGKILL when the launcher dies).
//!
//! The work is done by [`ferroccl::launch`]; this is its command line.

use ferroccl::launch::Launch;
use std::time::Duration;

struct Args {
    n: usize,
    prefix: bool,
    bind: bool,
    grace: Duration,
    prog: Vec<String>,
}

fn usage() -> String {
    let mut s = String::from(
        "usage: ferroccl-run -n N [--no-prefix] [--grace SECONDS] [--bind core|none] [--] program [args...]\n\n\
         Starts N ranks of `program` as local processes that find each other through\n\
         fcclCommInitFromEnv. Output lines are prefixed with [rank]. The exit status is\n\
         0 when every rank exits 0, otherwise the first failing rank's status; when one\n\
         rank fails the others get SECONDS (default 5) to finish before they are killed.\n\
         --bind core pins rank r to the r-th CPU the launcher may use when there are at\n\
         least N of them (mpirun's default), so that ranks waiting for each other never\n\
         share a CPU; the default, none, leaves placement to the scheduler (right for\n\
         ranks with threads of their own).\n\n\
         The rendezvous point listens on 127.0.0.1 only and admits only ranks that prove\n\
         they hold this run's random key (in FERROCCL_UNIQUE_ID); when a rank exits before\n\
         its communicator is set up, the other ranks' set-up fails at once, naming it.\n\n\
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
    let mut a = Args { n: 0, prefix: true, bind: false, grace: Duration::from_secs(5), prog: Vec::new() };
    while let Some(x) = it.next() {
        match x.as_str() {
            "-n" | "-np" | "--np" | "--nranks" => {
                let v = it.next().ok_or("-n needs a number of ranks")?;
                a.n = v.parse().map_err(|_| format!("-n {v}: not a number of ranks"))?;
            }
            "--no-prefix" => a.prefix = false,
            "--bind" => {
                a.bind = match it.next().as_deref() {
                    Some("core") => true,
                    Some("none") => false,
                    v => return Err(format!("--bind {}: use core or none", v.unwrap_or(""))),
                };
            }
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

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ferroccl-run: {e}\n\n{}", usage());
            std::process::exit(2);
        }
    };
    let mut l = Launch::new(args.n, args.prog.into_iter().map(Into::into).collect());
    l.prefix = args.prefix;
    l.grace = args.grace;
    l.bind = args.bind;
    std::process::exit(l.run());
}
