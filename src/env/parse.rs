//! The one parser of each kind of value, as methods of [`Var`]: each takes the value
//! (`parse_*`, for tests and for values read elsewhere) or reads the variable (None:
//! unset), and refuses a value not of its form with fcclInvalidArgument naming the
//! variable, the value and the form: `NAME is "value": give <form>`. Variables whose
//! wrong value would change what the program does return that error from the call
//! that reads them; tuning knobs and the log's pass it to [`Var::or_default`], which
//! warns once and keeps the default (docs/robustness.md has the table).

use super::{parse_bytes, Var};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

impl Var {
    /// The error for a value `v` not of `form`.
    pub fn refuse(&self, v: &str, form: impl std::fmt::Display) -> Error {
        Error::invalid_arg(format!("{} is {:?}: give {form}", self.name, v))
    }

    /// A whole number (decimal digits only: no sign, exponent or unit) in `f`'s range.
    pub fn parse_int(&self, v: &str, f: Int) -> Result<u64> {
        match whole(v) {
            Some(0) if f.zero.is_some() => Ok(0),
            Some(n) if (f.lo..=f.hi).contains(&n) => Ok(n),
            _ => Err(self.refuse(v, f)),
        }
    }
    pub fn int(&self, f: Int) -> Result<Option<u64>> {
        self.get().map(|v| self.parse_int(&v, f)).transpose()
    }

    /// A duration: a whole number of milliseconds in `f`'s range.
    pub fn parse_ms(&self, v: &str, f: Int) -> Result<Duration> {
        self.parse_int(v, Int { unit: "milliseconds", ..f }).map(Duration::from_millis)
    }
    pub fn ms(&self, f: Int) -> Result<Option<Duration>> {
        self.get().map(|v| self.parse_ms(&v, f)).transpose()
    }

    /// A switch: 0 or 1 (also off/on, no/yes, false/true, any case).
    pub fn parse_flag(&self, v: &str) -> Result<bool> {
        const WORDS: &[(&str, bool)] = &[
            ("0", false),
            ("1", true),
            ("off", false),
            ("on", true),
            ("no", false),
            ("yes", true),
            ("false", false),
            ("true", true),
        ];
        word_of(v, WORDS).ok_or_else(|| self.refuse(v, "0 or 1"))
    }
    pub fn flag(&self) -> Result<Option<bool>> {
        self.get().map(|v| self.parse_flag(&v)).transpose()
    }

    /// One of the listed words (any case), as its value.
    pub fn parse_word<T: Copy>(&self, v: &str, words: &[(&str, T)]) -> Result<T> {
        word_of(v, words).ok_or_else(|| self.refuse(v, format_args!("one of {}", list(words))))
    }
    pub fn word<T: Copy>(&self, words: &[(&str, T)]) -> Result<Option<T>> {
        self.get().map(|v| self.parse_word(&v, words)).transpose()
    }

    /// A byte count: a whole number with an optional suffix K, M or G (powers of
    /// 1024), at most `max`; `eg` shows one.
    pub fn parse_size(&self, v: &str, max: usize, eg: &str) -> Result<usize> {
        match parse_bytes(v) {
            Some(n) if n <= max => Ok(n),
            _ => Err(self.refuse(v, SizeForm { max, eg })),
        }
    }
    pub fn size(&self, max: usize, eg: &str) -> Result<Option<usize>> {
        self.get().map(|v| self.parse_size(&v, max, eg)).transpose()
    }

    /// An IP address (v4 or v6, no port).
    pub fn parse_ip(&self, v: &str) -> Result<std::net::IpAddr> {
        v.trim().parse().map_err(|_| self.refuse(v, "an IP address such as 10.0.0.5 or fd00::5 (no port)"))
    }
    pub fn ip(&self) -> Result<Option<std::net::IpAddr>> {
        self.get().map(|v| self.parse_ip(&v)).transpose()
    }

    /// An address `host:port` (a name or an IP address, IPv6 in brackets) that resolves.
    pub fn parse_host_port(&self, v: &str) -> Result<std::net::SocketAddr> {
        resolve(v).ok_or_else(|| {
            self.refuse(v, "host:port, a host name or IP address (IPv6 in brackets) that resolves and a port from 1 to 65535 (e.g. node0:29500)")
        })
    }

    /// A tuning knob's or the log's value: `r`'s, or where it is unset the default
    /// `default`; where `r` is an error, a warning (once per variable and process)
    /// that says so and the default.
    pub fn or_default<T>(&self, r: Result<Option<T>>, default: T) -> T {
        match r {
            Ok(v) => v.unwrap_or(default),
            Err(e) => {
                let dflt = if self.default.is_empty() { "its default" } else { self.default };
                warn_once(self.name, format_args!("{}; ignored, {dflt} is used", e.msg));
                default
            }
        }
    }
}

/// The form of a whole number: from `lo` to `hi` (`u64::MAX`: no bound) of `unit`
/// (empty: a plain number), such as `eg`; with `zero`, 0 too, meaning that.
#[derive(Clone, Copy, Debug)]
pub struct Int {
    pub lo: u64,
    pub hi: u64,
    pub unit: &'static str,
    pub eg: u64,
    pub zero: Option<&'static str>,
}

impl Int {
    pub const fn new(lo: u64, hi: u64, unit: &'static str, eg: u64) -> Int {
        Int { lo, hi, unit, eg, zero: None }
    }
}

impl std::fmt::Display for Int {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let of = if self.unit.is_empty() { String::new() } else { format!(" of {}", self.unit) };
        if self.hi == u64::MAX {
            write!(f, "a whole number{of}, {} or more (e.g. {})", self.lo, self.eg)?;
        } else {
            write!(f, "a whole number{of} from {} to {} (e.g. {})", self.lo, show(self.hi), self.eg)?;
        }
        match self.zero {
            Some(z) => write!(f, ", or 0 {z}"),
            None => Ok(()),
        }
    }
}

/// The form of a byte count (see [`Var::parse_size`]).
struct SizeForm<'a> {
    max: usize,
    eg: &'a str,
}

impl std::fmt::Display for SizeForm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a byte count: a whole number with an optional suffix K, M or G (powers of 1024)")?;
        if self.max != usize::MAX {
            write!(f, ", at most {}", show_bytes(self.max))?;
        }
        write!(f, " (e.g. {})", self.eg)
    }
}

/// `n`, as 2^k where it is a large power of two.
fn show(n: u64) -> String {
    if n >= 1 << 20 && n.is_power_of_two() {
        format!("2^{}", n.trailing_zeros())
    } else {
        n.to_string()
    }
}

/// `n` bytes with the largest suffix that divides it.
fn show_bytes(n: usize) -> String {
    for (s, b) in [("G", 30), ("M", 20), ("K", 10)] {
        if n >= 1 << b && n % (1 << b) == 0 {
            return format!("{}{s}", n >> b);
        }
    }
    n.to_string()
}

/// Decimal digits only, surrounding blanks allowed; None where there is anything else
/// or the number does not fit in 64 bits.
pub(super) fn whole(v: &str) -> Option<u64> {
    let v = v.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

fn word_of<T: Copy>(v: &str, words: &[(&str, T)]) -> Option<T> {
    let v = v.trim();
    words.iter().find(|(w, _)| w.eq_ignore_ascii_case(v)).map(|&(_, t)| t)
}

/// "a, b or c".
fn list<T>(words: &[(&str, T)]) -> String {
    let w: Vec<&str> = words.iter().map(|(w, _)| *w).collect();
    match w.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => w.join(""),
    }
}

/// `host:port` (port 1 to 65535) resolved to its first address.
pub fn resolve(v: &str) -> Option<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let v = v.trim();
    let (_, port) = v.rsplit_once(':')?;
    whole(port).filter(|p| (1..=65535).contains(p))?;
    v.to_socket_addrs().ok()?.next()
}

/// Warnings about wrong values of tuning and log variables, for the log to write
/// ([`take_warnings`]): the log reads its own settings here, so this module never
/// writes to it.
static PENDING: std::sync::Mutex<(Vec<&'static str>, Vec<String>)> = std::sync::Mutex::new((Vec::new(), Vec::new()));
static ANY_PENDING: AtomicBool = AtomicBool::new(false);

/// Queues a warning about `name`, once per variable and process.
fn warn_once(name: &'static str, msg: std::fmt::Arguments<'_>) {
    let mut p = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    if !p.0.contains(&name) {
        p.0.push(name);
        p.1.push(msg.to_string());
        ANY_PENDING.store(true, Ordering::Release);
    }
}

/// The warnings queued since the last call (cheap when there are none): the log
/// writes them (`crate::log`) before its next line and at a communicator's creation.
pub fn take_warnings() -> Vec<String> {
    if !ANY_PENDING.swap(false, Ordering::Acquire) {
        return Vec::new();
    }
    std::mem::take(&mut PENDING.lock().unwrap_or_else(|e| e.into_inner()).1)
}
