//! Configuration from the environment, read once by the first successful `cuInit`
//! (the trace level is read at first use, so that calls before `cuInit` are traced too).

use std::sync::OnceLock;
use std::time::Duration;

/// Physical devices when `FERROCCL_SIM_DEVICES` is unset.
const DEFAULT_DEVICES: usize = 2;
/// At most this many physical devices: bus ids 0x10 + ordinal must fit in a byte.
const MAX_DEVICES: usize = 64;
const DEFAULT_MEM_MB: usize = 8192;
const DEFAULT_LATENCY_US: u64 = 20;

#[derive(Clone, Debug)]
pub struct Config {
    /// Physical devices of the simulated machine (the same in every process).
    pub physical: usize,
    /// Visible ordinal -> physical ordinal (`CUDA_VISIBLE_DEVICES`).
    pub visible: Vec<usize>,
    /// Memory of each device, in bytes.
    pub mem_bytes: usize,
    /// Every stream operation becomes eligible this long after it was enqueued.
    pub latency: Duration,
}

fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!("simgpu: ignoring {name}={v:?}: not a number");
            default
        }),
        Err(_) => default,
    }
}

impl Config {
    pub fn from_env() -> Config {
        let physical = env_number("FERROCCL_SIM_DEVICES", DEFAULT_DEVICES).min(MAX_DEVICES);
        let visible = visible_devices(std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(), physical);
        let mem_mb: usize = env_number("FERROCCL_SIM_MEM_MB", DEFAULT_MEM_MB);
        let latency = Duration::from_micros(env_number("FERROCCL_SIM_LATENCY_US", DEFAULT_LATENCY_US));
        Config { physical, visible, mem_bytes: mem_mb.saturating_mul(1 << 20), latency }
    }
}

/// The physical ordinals `CUDA_VISIBLE_DEVICES` selects, as the real driver reads it: entries
/// are ordinals or `GPU-<uuid prefix>`; the list ends at the first entry that is invalid,
/// out of range or repeated. Unset means every device; an empty value means none.
pub fn visible_devices(var: Option<&str>, physical: usize) -> Vec<usize> {
    let Some(var) = var else { return (0..physical).collect() };
    let mut out = Vec::new();
    for entry in var.split(',').map(str::trim) {
        let ordinal = if let Some(prefix) = entry.strip_prefix("GPU-") {
            // A prefix must name exactly one device.
            let mut m = (0..physical).filter(|&p| !prefix.is_empty() && uuid_string(p)[4..].starts_with(prefix));
            m.next().filter(|_| m.next().is_none())
        } else {
            entry.parse::<usize>().ok().filter(|&p| p < physical)
        };
        match ordinal {
            Some(p) if !out.contains(&p) => out.push(p),
            _ => break,
        }
    }
    out
}

/// The deterministic UUID of a physical device (the same in every process).
pub fn uuid(physical: usize) -> [u8; 16] {
    let p = physical as u8;
    [0xa0 | p, 0xcc, 0x1d, 0x51, 0x00, p, 0x40, 0x00, 0x80, 0x00, b'f', b'c', b'c', b'l', 0x00, p]
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as nvidia-smi prints it.
pub fn uuid_string(physical: usize) -> String {
    let b = uuid(physical);
    let hex = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("GPU-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
}

/// `FERROCCL_SIM_TRACE`: which calls print a line to stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trace {
    Off,
    /// Every call that returns an error (except CUDA_ERROR_NOT_READY from queries).
    Errors,
    /// Every call.
    All,
}

pub fn trace() -> Trace {
    static T: OnceLock<Trace> = OnceLock::new();
    *T.get_or_init(|| match std::env::var("FERROCCL_SIM_TRACE").as_deref() {
        Ok("errors") | Ok("error") | Ok("1") => Trace::Errors,
        Ok("all") => Trace::All,
        Ok("") | Ok("0") | Ok("off") | Err(_) => Trace::Off,
        Ok(other) => {
            eprintln!("simgpu: FERROCCL_SIM_TRACE={other:?} is not off, errors or all; tracing errors");
            Trace::Errors
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_devices_follow_the_real_rules() {
        assert_eq!(visible_devices(None, 3), vec![0, 1, 2]);
        assert_eq!(visible_devices(Some(""), 3), Vec::<usize>::new());
        assert_eq!(visible_devices(Some("2,0"), 3), vec![2, 0]);
        assert_eq!(visible_devices(Some("1,7,0"), 3), vec![1]);
        assert_eq!(visible_devices(Some("1,1,0"), 3), vec![1]);
        assert_eq!(visible_devices(Some("x,0"), 3), Vec::<usize>::new());
        let u = uuid_string(2);
        assert_eq!(visible_devices(Some(&u[..12]), 3), vec![2]);
        assert_eq!(visible_devices(Some("GPU-a"), 3), Vec::<usize>::new(), "ambiguous prefix");
        assert_eq!(u.len(), 40);
    }
}
