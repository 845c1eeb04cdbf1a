//! ferroccl-run: starts N ranks of a program as local processes.
//!
//! It serves the rendezvous itself (on loopback, with a random key per run), sets
//! FERROCCL_RANK, FERROCCL_WORLD_SIZE, FERROCCL_UNIQUE_ID and FERROCCL_ROOT_ADDR (and
//! torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) in each rank's
//! environment, prefixes each line of output with the rank, exits non-zero if any rank
//! fails, and takes every rank down with it when it is killed (ranks get SIGKILL when
//! the launcher dies). It is a launcher for one host; across hosts use mpirun, srun or
//! torchrun (docs/launchers.md).
//!
//! With `--nccl` every process it starts loads ferroccl's NCCL library in place of
//! NCCL (LD_PRELOAD), so unchanged NCCL programs and PyTorch's backend "nccl" run on
//! ferroccl; without -n it runs one command that way (`ferroccl-run --nccl torchrun ...`).
//!
//! The work is done by [`ferroccl::launch`]; this is its command line.

use ferroccl::launch::{Launch, PER_RANK_VARS};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

const USAGE: &str = "usage: ferroccl-run -n N [-x VAR[=VALUE]]... [--nccl[=PATH]] [--bind core|none] [--grace SECONDS] [--no-prefix] [--] program [args...]";

struct Args {
    n: usize,
    /// `--nccl`: None, Some(None) to find ferroccl's NCCL library, Some(Some(path)).
    nccl: Option<Option<PathBuf>>,
    prefix: bool,
    bind: bool,
    grace: Duration,
    env: Vec<(OsString, OsString)>,
    prog: Vec<OsString>,
}

/// What the command line asks for.
enum Cmd {
    Run(Args),
    Help,
    HelpEnv,
    Version,
}

/// Every option, for "did you mean".
const OPTIONS: &[&str] = &[
    "-n",
    "-np",
    "--np",
    "--nranks",
    "-x",
    "--bind",
    "--grace",
    "--no-prefix",
    "--nccl",
    "-h",
    "--help",
    "--help-env",
    "-V",
    "--version",
];

fn help() -> String {
    format!(
        "{USAGE}\n\n\
         Starts N ranks of `program` on this host; they find each other through\n\
         fcclCommInitFromEnv (and torch.distributed's env://). Output lines are prefixed\n\
         with [rank]; the exit status is the first failing rank's, 0 when all succeed.\n\
         For several hosts use mpirun, srun or torchrun (docs/launchers.md).\n\n\
         Options:\n  \
           -n, -np N            the number of ranks\n  \
           -x VAR[=VALUE]       set VAR in every rank, or pass this process's VAR on (repeatable)\n  \
           --bind core|none     pin rank r to the r-th usable CPU (core), or leave it (none, default)\n  \
           --grace SECONDS      when a rank fails, time the others get before they are killed (5)\n  \
           --nccl[=PATH]        NCCL programs and torch's backend \"nccl\" run on ferroccl's NCCL\n  \
                                library; without -n, runs one command so: --nccl torchrun ...\n  \
           --no-prefix          leave output lines as the ranks wrote them\n  \
           --help-env           the variables each rank gets, and every variable ferroccl reads\n  \
           -h, --help           this text\n  \
           -V, --version        the version\n"
    )
}

fn help_env() -> String {
    let mut s = String::from(
        "Each rank inherits this environment and gets FERROCCL_RANK, FERROCCL_WORLD_SIZE,\n\
         FERROCCL_LOCAL_RANK, FERROCCL_LOCAL_SIZE, FERROCCL_UNIQUE_ID and FERROCCL_ROOT_ADDR,\n\
         and torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE; unless MASTER_ADDR\n\
         or MASTER_PORT is given, also MASTER_ADDR=127.0.0.1 and a MASTER_PORT kept free for\n\
         rank 0. The rendezvous point listens on 127.0.0.1 only and admits only ranks that\n\
         hold this run's random key (in FERROCCL_UNIQUE_ID).\n\n\
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

/// `-x` with its argument: `VAR=VALUE` sets VALUE; `VAR` passes this process's value on.
fn export(spec: &str, env: &mut Vec<(OsString, OsString)>) -> Result<(), String> {
    let (name, value) = match spec.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (spec, None),
    };
    if name.is_empty() {
        return Err(format!("-x {spec}: give a variable name, as -x VAR or -x VAR=VALUE"));
    }
    if PER_RANK_VARS.contains(&name) {
        return Err(format!("-x {spec}: ferroccl-run sets {name} itself, to each rank's own value"));
    }
    match value {
        Some(v) => env.push((name.into(), v.into())),
        None => match std::env::var_os(name) {
            Some(v) => env.push((name.into(), v)),
            None => eprintln!("ferroccl-run: warning: -x {name}: {name} is not set here, so the ranks do not get it"),
        },
    }
    Ok(())
}

fn parse(mut it: impl Iterator<Item = OsString>) -> Result<Cmd, String> {
    let mut a = Args {
        n: 0,
        nccl: None,
        prefix: true,
        bind: false,
        grace: Duration::from_secs(5),
        env: Vec::new(),
        prog: Vec::new(),
    };
    let text = |x: OsString, what: &str| x.into_string().map_err(|x| format!("{what} {x:?}: not valid UTF-8"));
    while let Some(x) = it.next() {
        let xs = x.to_string_lossy().into_owned();
        match xs.as_str() {
            "-n" | "-np" | "--np" | "--nranks" => {
                let v = text(it.next().ok_or(format!("{xs} needs a number of ranks"))?, &xs)?;
                a.n = match v.parse() {
                    Ok(n) if n > 0 => n,
                    _ => return Err(format!("{xs} {v}: give a number of ranks of at least 1")),
                };
            }
            "-x" => {
                let v = text(it.next().ok_or("-x needs VAR or VAR=VALUE")?, "-x")?;
                export(&v, &mut a.env)?;
            }
            "--no-prefix" => a.prefix = false,
            "--nccl" => a.nccl = Some(None),
            _ if xs.starts_with("--nccl=") => a.nccl = Some(Some(PathBuf::from(&xs["--nccl=".len()..]))),
            "--bind" => {
                a.bind = match it.next().map(|v| v.to_string_lossy().into_owned()).as_deref() {
                    Some("core") => true,
                    Some("none") => false,
                    v => return Err(format!("--bind {}: use core or none", v.unwrap_or(""))),
                };
            }
            "--grace" => {
                let v = text(it.next().ok_or("--grace needs seconds")?, "--grace")?;
                a.grace = match v.parse::<f64>() {
                    Ok(s) if s.is_finite() && (0.0..=1e9).contains(&s) => Duration::from_secs_f64(s),
                    _ => return Err(format!("--grace {v}: give seconds, a number from 0")),
                };
            }
            "-h" | "--help" => return Ok(Cmd::Help),
            "--help-env" => return Ok(Cmd::HelpEnv),
            "-V" | "--version" => return Ok(Cmd::Version),
            "--" => a.prog.extend(it.by_ref()),
            _ if xs.starts_with('-') => {
                let guess = ferroccl::env::closest_word(&xs, OPTIONS);
                return Err(format!(
                    "unknown option {xs}{}",
                    guess.map_or(String::new(), |g| format!("; did you mean {g}?"))
                ));
            }
            _ => {
                a.prog.push(x);
                a.prog.extend(it.by_ref());
            }
        }
    }
    if a.n == 0 && a.nccl.is_none() {
        return Err("give the number of ranks with -n N".into());
    }
    if a.prog.is_empty() {
        return Err("give the program to run".into());
    }
    Ok(Cmd::Run(a))
}

fn main() {
    let args = match parse(std::env::args_os().skip(1)) {
        Ok(Cmd::Run(a)) => a,
        Ok(Cmd::Help) => {
            print!("{}", help());
            return;
        }
        Ok(Cmd::HelpEnv) => {
            print!("{}", help_env());
            return;
        }
        Ok(Cmd::Version) => {
            println!("ferroccl-run {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        Err(e) => {
            eprintln!("ferroccl-run: {e}\n{USAGE}\nrun ferroccl-run --help for more");
            std::process::exit(2);
        }
    };
    let mut env = args.env;
    if let Some(given) = args.nccl {
        match nccl_env(given) {
            Ok(vars) => env.extend(vars),
            Err(e) => {
                eprintln!("ferroccl-run: {e}");
                std::process::exit(2);
            }
        }
    }
    if args.n == 0 {
        // One command (a launcher such as torchrun) with ferroccl's NCCL in place.
        use std::os::unix::process::CommandExt;
        let e = std::process::Command::new(&args.prog[0]).args(&args.prog[1..]).envs(env).exec();
        eprintln!("ferroccl-run: cannot run {}: {e}", args.prog[0].to_string_lossy());
        std::process::exit(127);
    }
    let mut l = Launch::new(args.n, args.prog);
    l.prefix = args.prefix;
    l.grace = args.grace;
    l.bind = args.bind;
    l.env = env;
    std::process::exit(l.run());
}

/// Where ferroccl's NCCL library is, relative to this launcher: `make install` and the
/// Python package put it in ../lib/ferroccl/libnccl.so.2; a cargo build beside it.
fn nccl_candidates(exe: &Path) -> Vec<PathBuf> {
    let dir = exe.parent().unwrap_or(Path::new("."));
    vec![
        dir.join("../lib/ferroccl/libnccl.so.2"),
        dir.join("../lib64/ferroccl/libnccl.so.2"),
        dir.join("libferroccl_nccl.so"),
    ]
}

/// LD_PRELOAD and LD_LIBRARY_PATH that put ferroccl's NCCL library (`given`, or the one
/// found beside this launcher) first, ahead of what this environment already has: a
/// program linked against libnccl.so.2, or dlopening it (PyTorch), gets ferroccl's.
fn nccl_env(given: Option<PathBuf>) -> Result<Vec<(OsString, OsString)>, String> {
    let lib = match given {
        Some(p) if p.is_file() => p,
        Some(p) => {
            return Err(format!("--nccl={}: no such file; give the path of ferroccl's libnccl.so.2", p.display()))
        }
        None => {
            let exe =
                std::env::current_exe().map_err(|e| format!("--nccl: cannot tell where this launcher is ({e})"))?;
            let tried = nccl_candidates(&exe);
            tried.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
                let list: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
                format!(
                    "--nccl: ferroccl's NCCL library is not beside this launcher (tried {}); give its path \
                     with --nccl=PATH (make install puts it in <prefix>/lib/ferroccl/libnccl.so.2)",
                    list.join(", ")
                )
            })?
        }
    };
    let lib = lib.canonicalize().map_err(|e| format!("--nccl: {}: {e}", lib.display()))?;
    let dir = lib.parent().unwrap_or(Path::new("/")).as_os_str().to_owned();
    let prepend = |name: &str, first: &std::ffi::OsStr| {
        let mut v = first.to_owned();
        if let Some(old) = std::env::var_os(name).filter(|o| !o.is_empty()) {
            v.push(":");
            v.push(old);
        }
        (OsString::from(name), v)
    };
    Ok(vec![prepend("LD_PRELOAD", lib.as_os_str()), prepend("LD_LIBRARY_PATH", &dir)])
}
