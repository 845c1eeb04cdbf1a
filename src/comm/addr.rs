//! Which address a rank gives its peers on other hosts, and the interfaces it chooses from.
//!
//! By default a rank advertises the local address of its connection to the rendezvous
//! point: the kernel routed that connection over the interface that reaches the other
//! hosts, so no variable is needed for the common case. FERROCCL_HOST_ADDR names the
//! address outright; FERROCCL_SOCKET_IFNAME (or NCCL_SOCKET_IFNAME) picks interfaces.

use crate::env;
use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr};

/// Where an advertised address came from; travels to peers so their errors can say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// FERROCCL_HOST_ADDR.
    HostAddr,
    /// FERROCCL_SOCKET_IFNAME or NCCL_SOCKET_IFNAME.
    Ifname,
    /// The local end of the connection to the rendezvous point.
    Route,
    /// The first up interface other than loopback, docker* last (the route was loopback).
    FirstInterface,
    /// Loopback: this host has no other interface.
    Loopback,
}

impl Source {
    /// The byte that stands for this source in an encoded address.
    pub fn code(self) -> u8 {
        match self {
            Source::HostAddr => 1,
            Source::Ifname => 2,
            Source::Route => 3,
            Source::FirstInterface => 4,
            Source::Loopback => 5,
        }
    }

    /// The source a byte from an encoded address stands for (an unknown byte reads as the route).
    pub fn from_code(b: u8) -> Source {
        match b {
            1 => Source::HostAddr,
            2 => Source::Ifname,
            4 => Source::FirstInterface,
            5 => Source::Loopback,
            _ => Source::Route,
        }
    }

    /// How the address was chosen, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Source::HostAddr => "set by FERROCCL_HOST_ADDR",
            Source::Ifname => "of the interface FERROCCL_SOCKET_IFNAME/NCCL_SOCKET_IFNAME selects",
            Source::Route => "the one its host reached the rendezvous point from",
            Source::FirstInterface => "its host's first interface other than loopback (docker* last)",
            Source::Loopback => "loopback: its host has no other interface",
        }
    }
}

/// An address of an up interface of this host.
#[derive(Clone, Debug)]
pub struct Iface {
    pub name: String,
    pub ip: IpAddr,
    pub loopback: bool,
}

/// Whether an address can be given to another host: not unspecified, and not an IPv6
/// link-local address (it would need the interface's scope, which differs per host).
fn usable(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !v4.is_unspecified(),
        IpAddr::V6(v6) => !v6.is_unspecified() && (v6.segments()[0] & 0xffc0) != 0xfe80,
    }
}

/// Every usable IPv4 and IPv6 address of this host's up interfaces, in the kernel's order.
pub fn interfaces() -> Vec<Iface> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills ifap with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return out;
    }
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_flags & (libc::IFF_UP as u32) == 0 || ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr of the family it names.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: the family is AF_INET, so the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: the family is AF_INET6, so the sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::from(sin6.sin6_addr.s6_addr)
            }
            _ => continue,
        };
        if !usable(&ip) {
            continue;
        }
        // SAFETY: ifa_name is the interface's NUL-terminated name.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        out.push(Iface { name, ip, loopback: ifa.ifa_flags & (libc::IFF_LOOPBACK as u32) != 0 });
    }
    // SAFETY: ifap came from getifaddrs.
    unsafe { libc::freeifaddrs(ifap) };
    out
}

/// Whether interface `name` passes an NCCL_SOCKET_IFNAME-style `spec`: comma-separated
/// name prefixes, `=` first for exact names, `^` first to exclude the listed ones.
pub fn interface_matches(spec: &str, name: &str) -> bool {
    let spec = spec.trim();
    let (exclude, spec) = match spec.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let (exact, spec) = match spec.strip_prefix('=') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let listed = spec.split(',').map(str::trim).filter(|p| !p.is_empty()).any(|p| {
        if exact {
            name == p
        } else {
            name.starts_with(p)
        }
    });
    listed != exclude
}

/// The interface selection in force: FERROCCL_SOCKET_IFNAME, else NCCL_SOCKET_IFNAME,
/// with the name of the variable it came from.
pub fn ifname_spec() -> Option<(String, &'static str)> {
    env::SOCKET_IFNAME
        .get()
        .map(|s| (s, env::SOCKET_IFNAME.name))
        .or_else(|| env::NCCL_SOCKET_IFNAME.get().map(|s| (s, env::NCCL_SOCKET_IFNAME.name)))
}

/// The first address in `list` of family `prefer` (when given), else of IPv4, else any.
fn pick<'a>(list: impl Iterator<Item = &'a Iface> + Clone, prefer: Option<IpAddr>) -> Option<IpAddr> {
    let of = |v4: bool| list.clone().find(|i| i.ip.is_ipv4() == v4).map(|i| i.ip);
    prefer.and_then(|p| of(p.is_ipv4())).or_else(|| of(true)).or_else(|| list.clone().next().map(|i| i.ip))
}

/// The address a rank advertises, from FERROCCL_HOST_ADDR, the interface selection,
/// the route to the rendezvous point (`route`), or this host's interfaces, in that
/// order. `other_hosts`: some peer is on another host, so loopback will not do.
pub fn choose(route: Option<IpAddr>, other_hosts: bool) -> Result<(IpAddr, Source)> {
    choose_from(route, other_hosts, &interfaces())
}

fn choose_from(route: Option<IpAddr>, other_hosts: bool, ifaces: &[Iface]) -> Result<(IpAddr, Source)> {
    if let Some(ip) = env::HOST_ADDR.ip().map_err(|e| {
        Error::invalid_arg(format!("{}; set it to this host's address that the other hosts can reach, or unset it to advertise the address this host reaches the rendezvous point from", e.msg))
    })? {
        return Ok((ip, Source::HostAddr));
    }
    if let Some((spec, var)) = ifname_spec() {
        let chosen = ifaces.iter().filter(|i| interface_matches(&spec, &i.name));
        return pick(chosen, route).map(|ip| (ip, Source::Ifname)).ok_or_else(|| {
            let have: Vec<String> = ifaces.iter().map(|i| format!("{} {}", i.name, i.ip)).collect();
            Error::invalid_arg(format!(
                "{var}={spec:?} selects no up interface with an address; this host has: {}. Name one of them (prefixes, comma-separated; ^ excludes, = matches exactly) or unset {var}",
                if have.is_empty() { "none".to_string() } else { have.join(", ") }
            ))
        });
    }
    match route {
        Some(ip) if usable(&ip) && !(other_hosts && ip.is_loopback()) => return Ok((ip, Source::Route)),
        _ => {}
    }
    // As NCCL without NCCL_SOCKET_IFNAME: a container bridge only when nothing else is up.
    let others = ifaces.iter().filter(|i| !i.loopback);
    if let Some(ip) =
        pick(others.clone().filter(|i| !i.name.starts_with("docker")), route).or_else(|| pick(others, route))
    {
        return Ok((ip, Source::FirstInterface));
    }
    Ok((route.filter(|r| r.is_loopback()).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)), Source::Loopback))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, ip: &str) -> Iface {
        Iface { name: name.into(), ip: ip.parse().unwrap(), loopback: name == "lo" }
    }

    #[test]
    fn matching_follows_nccl_syntax() {
        assert!(interface_matches("eth", "eth0"));
        assert!(!interface_matches("eth", "ib0"));
        assert!(interface_matches("ib,eth", "eth1"));
        assert!(!interface_matches("^docker,lo", "docker0"));
        assert!(interface_matches("^docker,lo", "eth0"));
        assert!(interface_matches("=eth0", "eth0"));
        assert!(!interface_matches("=eth0", "eth01"));
        assert!(!interface_matches("^=eth0", "eth0"));
        assert!(interface_matches("^=eth0", "eth01"));
    }

    #[test]
    fn loopback_is_listed_and_can_be_named() {
        let lo = interfaces().into_iter().find(|i| i.ip == IpAddr::V4(Ipv4Addr::LOCALHOST)).expect("127.0.0.1 is up");
        assert!(lo.loopback && interface_matches("=lo", &lo.name));
    }

    #[test]
    fn link_local_v6_is_never_advertised() {
        assert!(!usable(&"fe80::1".parse().unwrap()));
        assert!(usable(&"fd00::1".parse().unwrap()));
        assert!(!usable(&"0.0.0.0".parse().unwrap()));
    }

    #[test]
    fn route_then_interfaces() {
        // Run without the variables that override the choice (tests share one environment).
        if env::HOST_ADDR.get().is_some() || ifname_spec().is_some() {
            return;
        }
        let ifs = vec![
            iface("lo", "127.0.0.1"),
            iface("docker0", "172.17.0.1"),
            iface("eth0", "fd00::2"),
            iface("eth1", "10.0.0.2"),
        ];
        let r = choose_from(Some("10.1.1.1".parse().unwrap()), true, &ifs).unwrap();
        assert_eq!(r, ("10.1.1.1".parse().unwrap(), Source::Route));
        // Loopback to the point is fine when every peer is on this host.
        let r = choose_from(Some("127.0.0.1".parse().unwrap()), false, &ifs).unwrap();
        assert_eq!(r, ("127.0.0.1".parse().unwrap(), Source::Route));
        // Not when a peer is elsewhere: an interface of the route's family, IPv4 first.
        let r = choose_from(Some("127.0.0.1".parse().unwrap()), true, &ifs).unwrap();
        assert_eq!(r, ("10.0.0.2".parse().unwrap(), Source::FirstInterface));
        let r = choose_from(Some("::1".parse().unwrap()), true, &ifs).unwrap();
        assert_eq!(r, ("fd00::2".parse().unwrap(), Source::FirstInterface));
        let r = choose_from(None, true, &ifs[..2]).unwrap();
        assert_eq!(r, ("172.17.0.1".parse().unwrap(), Source::FirstInterface));
        let r = choose_from(None, true, &ifs[..1]).unwrap();
        assert_eq!(r, ("127.0.0.1".parse().unwrap(), Source::Loopback));
    }

    #[test]
    fn sources_survive_encoding() {
        for s in [Source::HostAddr, Source::Ifname, Source::Route, Source::FirstInterface, Source::Loopback] {
            assert_eq!(Source::from_code(s.code()), s);
        }
    }
}
