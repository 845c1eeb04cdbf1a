//! Logging controlled by FERROCCL_DEBUG (WARN, INFO, TRACE) and FERROCCL_DEBUG_FILE.

use std::fmt::Arguments;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Level {
    Warn = 1,
    Info = 2,
    Trace = 3,
}

struct Logger {
    level: Level,
    file: Option<Mutex<std::fs::File>>,
}

fn logger() -> &'static Logger {
    static L: OnceLock<Logger> = OnceLock::new();
    L.get_or_init(|| {
        let level = match crate::env::DEBUG.get_or_default().to_ascii_uppercase().as_str() {
            "INFO" => Level::Info,
            "TRACE" => Level::Trace,
            _ => Level::Warn,
        };
        let file = crate::env::DEBUG_FILE.get().and_then(|pattern| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            let path = pattern.replace("%h", host.trim()).replace("%p", &std::process::id().to_string());
            std::fs::OpenOptions::new().create(true).append(true).open(path).ok().map(Mutex::new)
        });
        Logger { level, file }
    })
}

pub fn enabled(level: Level) -> bool {
    logger().level >= level
}

fn emit(level: Level, args: Arguments<'_>) {
    let l = logger();
    if l.level < level {
        return;
    }
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

pub fn warn(args: Arguments<'_>) {
    emit(Level::Warn, args)
}

pub fn info(args: Arguments<'_>) {
    emit(Level::Info, args)
}
