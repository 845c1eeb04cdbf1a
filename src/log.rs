//! Logging controlled by FERROCCL_DEBUG (WARN, INFO, TRACE) and FERROCCL_DEBUG_FILE, else
//! NCCL_DEBUG and NCCL_DEBUG_FILE (as libnccl.so.2 reads them).

use std::fmt::Arguments;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Level {
    Warn = 1,
    Info = 2,
    Trace = 3,
}

/// FERROCCL_DEBUG, else NCCL_DEBUG: the log level, and what was wrong with the value
/// (a warning for the log itself to write: the level is then WARN).
fn debug_level() -> (Level, Option<String>) {
    let Some((name, v)) = crate::env::DEBUG.lookup() else { return (Level::Warn, None) };
    let (var, words) = match name == crate::env::NCCL_DEBUG.name {
        true => (&crate::env::NCCL_DEBUG, NCCL_DEBUG_WORDS),
        false => (&crate::env::DEBUG, DEBUG_WORDS),
    };
    match var.parse_word(&v, words) {
        Ok(l) => (l, None),
        Err(e) => (Level::Warn, Some(format!("{}; ignored, WARN is used", e.msg))),
    }
}

/// FERROCCL_DEBUG's words.
const DEBUG_WORDS: &[(&str, Level)] = &[("WARN", Level::Warn), ("INFO", Level::Info), ("TRACE", Level::Trace)];
/// NCCL_DEBUG's: its levels below INFO are WARN here (ferroccl always reports failures).
const NCCL_DEBUG_WORDS: &[(&str, Level)] = &[
    ("NONE", Level::Warn),
    ("VERSION", Level::Warn),
    ("WARN", Level::Warn),
    ("ABORT", Level::Warn),
    ("INFO", Level::Info),
    ("TRACE", Level::Trace),
];

/// FERROCCL_DEBUG_FILE, else NCCL_DEBUG_FILE, with %h and %p replaced: the variable
/// and the path.
fn debug_file() -> Option<(&'static str, String)> {
    let (var, pattern) = crate::env::DEBUG_FILE.lookup()?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    Some((var, pattern.trim().replace("%h", host.trim()).replace("%p", &std::process::id().to_string())))
}

struct Logger {
    level: Level,
    file: Option<Mutex<std::fs::File>>,
}

fn logger() -> &'static Logger {
    static L: OnceLock<Logger> = OnceLock::new();
    L.get_or_init(|| {
        // FERROCCL_DEBUG / FERROCCL_DEBUG_FILE, else NCCL_DEBUG / NCCL_DEBUG_FILE; a
        // wrong value is warned about here (once: the logger is made once) and the
        // default used, WARN and stderr.
        let (level, mut problems) = match debug_level() {
            (level, Some(p)) => (level, vec![p]),
            (level, None) => (level, Vec::new()),
        };
        let file = debug_file().and_then(|(var, path)| {
            match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
                Ok(f) => Some(Mutex::new(f)),
                Err(e) => {
                    problems.push(format!(
                        "{var} names {path:?}, which cannot be opened for appending ({e}): give a writable file (%h: host, %p: pid); logging to stderr"
                    ));
                    None
                }
            }
        });
        let l = Logger { level, file };
        for p in problems {
            write_line(&l, Level::Warn, format_args!("{p}"));
        }
        l
    })
}

/// Writes one line of `l` at `level` to its file or stderr.
fn write_line(l: &Logger, level: Level, args: Arguments<'_>) {
    let line = format!("ferroccl {} {:?}: {}\n", std::process::id(), level, args);
    match &l.file {
        Some(f) => {
            let _ = f.lock().unwrap_or_else(|p| p.into_inner()).write_all(line.as_bytes());
        }
        None => {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

pub fn enabled(level: Level) -> bool {
    logger().level >= level
}

fn emit(level: Level, args: Arguments<'_>) {
    let l = logger();
    flush(l);
    if l.level < level {
        return;
    }
    write_line(l, level, args);
}

/// Writes the warnings about wrong tuning values that the environment registry has
/// queued ([`crate::env::take_warnings`]; it cannot write to the log, which reads it).
fn flush(l: &Logger) {
    for w in crate::env::take_warnings() {
        write_line(l, Level::Warn, format_args!("{w}"));
    }
}

/// Writes the queued warnings now (see [`flush`]); every log line does it first.
pub fn flush_env_warnings() {
    flush(logger());
}

pub fn warn(args: Arguments<'_>) {
    emit(Level::Warn, args)
}

pub fn info(args: Arguments<'_>) {
    emit(Level::Info, args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{DEBUG, NCCL_DEBUG};

    #[test]
    fn log_levels_are_listed_words_and_nccl_s_below_info_are_warn() {
        assert_eq!(DEBUG.parse_word("info", DEBUG_WORDS).unwrap(), Level::Info);
        assert_eq!(DEBUG.parse_word(" Trace", DEBUG_WORDS).unwrap(), Level::Trace);
        for (var, words, bad, form) in [
            (&DEBUG, DEBUG_WORDS, "LOUD", "one of WARN, INFO or TRACE"),
            (&DEBUG, DEBUG_WORDS, "VERSION", "one of WARN, INFO or TRACE"),
            (&NCCL_DEBUG, NCCL_DEBUG_WORDS, "LOUD", "one of NONE, VERSION, WARN, ABORT, INFO or TRACE"),
        ] {
            let e = var.parse_word(bad, words).unwrap_err();
            assert_eq!(e.msg, format!("{} is {bad:?}: give {form}", var.name));
        }
        assert_eq!(NCCL_DEBUG.parse_word("VERSION", NCCL_DEBUG_WORDS).unwrap(), Level::Warn);
        assert_eq!(NCCL_DEBUG.parse_word("info", NCCL_DEBUG_WORDS).unwrap(), Level::Info);
    }
}
