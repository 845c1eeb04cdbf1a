//! File descriptors passed between ranks' processes (VMM allocations' shareable handles), as
//! NCCL's ncclIpcSocket does: one abstract-namespace Unix datagram socket per rank and
//! communicator, named after the communicator's control region so that a job's
//! communicators never collide. A sender queues descriptors with SCM_RIGHTS without the
//! receiver waiting; each carries a tag (owner pid, allocation base, identity, size) that
//! the receiver matches against what a descriptor of the call names, keeping the rest.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a passed descriptor is: the owner's pid, the allocation's base address there, the
/// driver's identity of it (buffer id) and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    pub pid: u32,
    pub base: usize,
    pub id: u64,
    pub size: usize,
}

const MAGIC: u32 = 0x4644_5053; // "FDPS"
/// Descriptors per message (the kernel takes up to 253).
const PER_MSG: usize = 64;
const TAG_BYTES: usize = 32;
const HEAD: usize = 8;

/// A rank's socket, and what arrived that no call has taken yet.
pub struct FdSocket {
    sock: OwnedFd,
    /// The communicator's part of every rank's socket name.
    prefix: String,
    got: Mutex<HashMap<(u32, usize), (Tag, OwnedFd)>>,
}

/// An abstract socket address (a name with a leading NUL) and its length.
fn address(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let n = name.len().min(a.sun_path.len() - 1);
    for (i, b) in name.as_bytes()[..n].iter().enumerate() {
        a.sun_path[i + 1] = *b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + n;
    (a, len as libc::socklen_t)
}

fn os(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

impl FdSocket {
    fn name(prefix: &str, rank: usize) -> String {
        format!("ferroccl-fd{prefix}-{rank}")
    }

    /// Binds rank `rank`'s socket of the communicator whose region is `prefix`.
    pub fn bind(prefix: &str, rank: usize) -> Result<FdSocket, String> {
        // SAFETY: plain socket creation.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(os("socket(AF_UNIX, SOCK_DGRAM)"));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let name = Self::name(prefix, rank);
        let (a, len) = address(&name);
        // SAFETY: a valid address of `len` bytes.
        if unsafe { libc::bind(sock.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) } != 0 {
            return Err(os(&format!("bind of the abstract Unix socket @{name}")));
        }
        Ok(FdSocket { sock, prefix: prefix.to_string(), got: Mutex::new(HashMap::new()) })
    }

    /// Queues `items` on rank `to`'s socket, retrying until `deadline` while it is not
    /// bound yet or its queue is full.
    pub fn send(&self, to: usize, items: &[(Tag, BorrowedFd<'_>)], deadline: Instant) -> Result<(), String> {
        let name = Self::name(&self.prefix, to);
        let (a, alen) = address(&name);
        for part in items.chunks(PER_MSG) {
            let mut body = vec![0u8; HEAD + TAG_BYTES * part.len()];
            body[..4].copy_from_slice(&MAGIC.to_le_bytes());
            body[4..8].copy_from_slice(&(part.len() as u32).to_le_bytes());
            for (i, (t, _)) in part.iter().enumerate() {
                let at = HEAD + TAG_BYTES * i;
                body[at..at + 4].copy_from_slice(&t.pid.to_le_bytes());
                body[at + 8..at + 16].copy_from_slice(&(t.base as u64).to_le_bytes());
                body[at + 16..at + 24].copy_from_slice(&t.id.to_le_bytes());
                body[at + 24..at + 32].copy_from_slice(&(t.size as u64).to_le_bytes());
            }
            let fds: Vec<i32> = part.iter().map(|(_, f)| f.as_raw_fd()).collect();
            let bytes = std::mem::size_of_val(fds.as_slice()) as u32;
            // SAFETY: CMSG_SPACE is a pure computation.
            let space = unsafe { libc::CMSG_SPACE(bytes) } as usize;
            let mut ctl = vec![0u64; space.div_ceil(8)];
            let mut iov = libc::iovec { iov_base: body.as_mut_ptr().cast(), iov_len: body.len() };
            // SAFETY: msghdr is plain data; all zeroes is a valid value.
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            m.msg_name = (&a as *const libc::sockaddr_un as *mut libc::sockaddr_un).cast();
            m.msg_namelen = alen;
            m.msg_iov = &mut iov;
            m.msg_iovlen = 1;
            m.msg_control = ctl.as_mut_ptr().cast();
            m.msg_controllen = space as _;
            // SAFETY: the control buffer holds CMSG_SPACE(bytes) bytes, aligned for cmsghdr;
            // the header and data written lie inside it.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&m);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
                std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<i32>(), fds.len());
            }
            loop {
                // SAFETY: `m` describes valid buffers for the call.
                if unsafe { libc::sendmsg(self.sock.as_raw_fd(), &m, libc::MSG_DONTWAIT) } >= 0 {
                    break;
                }
                let e = std::io::Error::last_os_error();
                let retry = matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::ECONNREFUSED | libc::ENOENT | libc::EINTR | libc::ENOBUFS)
                );
                if !retry || Instant::now() >= deadline {
                    return Err(format!("sending file descriptors to @{name}: {e}"));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(())
    }

    /// Reads every message waiting, keeping its descriptors by (pid, base); a newer one for
    /// the same allocation replaces the older.
    fn drain(&self) {
        let mut got = self.got.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let mut body = vec![0u8; HEAD + TAG_BYTES * PER_MSG];
            // SAFETY: CMSG_SPACE is a pure computation.
            let space = unsafe { libc::CMSG_SPACE((4 * PER_MSG) as u32) } as usize;
            let mut ctl = vec![0u64; space.div_ceil(8)];
            let mut iov = libc::iovec { iov_base: body.as_mut_ptr().cast(), iov_len: body.len() };
            // SAFETY: msghdr is plain data; all zeroes is a valid value.
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            m.msg_iov = &mut iov;
            m.msg_iovlen = 1;
            m.msg_control = ctl.as_mut_ptr().cast();
            m.msg_controllen = space as _;
            // SAFETY: `m` describes valid buffers for the call.
            let n =
                unsafe { libc::recvmsg(self.sock.as_raw_fd(), &mut m, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
            if n < 0 {
                return;
            }
            let mut fds: Vec<OwnedFd> = Vec::new();
            // SAFETY: the kernel filled the control buffer; the CMSG macros walk it within
            // msg_controllen, and each descriptor received is ours to own.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&m);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                        let k = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                        let p = libc::CMSG_DATA(c).cast::<i32>();
                        for i in 0..k {
                            fds.push(OwnedFd::from_raw_fd(p.add(i).read_unaligned()));
                        }
                    }
                    c = libc::CMSG_NXTHDR(&m, c);
                }
            }
            let n = n as usize;
            if n < HEAD || u32::from_le_bytes(body[..4].try_into().expect("4 bytes")) != MAGIC {
                continue;
            }
            let count = u32::from_le_bytes(body[4..8].try_into().expect("4 bytes")) as usize;
            let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
            for (i, fd) in fds.into_iter().enumerate().take(count.min((n - HEAD) / TAG_BYTES)) {
                let at = HEAD + TAG_BYTES * i;
                let pid = u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes"));
                let t = Tag { pid, base: u64_at(at + 8) as usize, id: u64_at(at + 16), size: u64_at(at + 24) as usize };
                got.insert((t.pid, t.base), (t, fd));
            }
        }
    }

    /// Takes what arrived so far (the caller imports it).
    pub fn take_all(&self) -> Vec<(Tag, OwnedFd)> {
        self.drain();
        let mut got = self.got.lock().unwrap_or_else(|p| p.into_inner());
        got.drain().map(|(_, v)| v).collect()
    }

    /// Waits until a message arrives or `until` passes.
    pub fn wait(&self, until: Instant) {
        let left = until.saturating_duration_since(Instant::now());
        let mut p = libc::pollfd { fd: self.sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    /// Descriptors queued before the receiver looks arrive with their tags, several per
    /// message and from several sends; the received descriptor is the same file.
    #[test]
    fn descriptors_arrive_with_their_tags() {
        let prefix = format!("/fdpass-test-{}", std::process::id());
        let (a, b) = (FdSocket::bind(&prefix, 0).unwrap(), FdSocket::bind(&prefix, 1).unwrap());
        assert!(FdSocket::bind(&prefix, 1).is_err(), "a name is bound once");
        let mut files: Vec<std::fs::File> = (0..3).map(|_| tempfile()).collect();
        for (i, f) in files.iter_mut().enumerate() {
            f.write_all(format!("file {i}").as_bytes()).unwrap();
        }
        let tag = |i: usize| Tag { pid: 7, base: 0x1000 * (i + 1), id: 40 + i as u64, size: 2 << 20 };
        let until = Instant::now() + Duration::from_secs(5);
        a.send(1, &[(tag(0), files[0].as_fd()), (tag(1), files[1].as_fd())], until).unwrap();
        a.send(1, &[(tag(2), files[2].as_fd())], until).unwrap();
        let mut got = b.take_all();
        got.sort_by_key(|(t, _)| t.base);
        assert_eq!(got.iter().map(|(t, _)| *t).collect::<Vec<_>>(), (0..3).map(tag).collect::<Vec<_>>());
        for (i, (_, fd)) in got.into_iter().enumerate() {
            let mut f = std::fs::File::from(fd);
            let mut s = String::new();
            f.rewind().unwrap();
            f.read_to_string(&mut s).unwrap();
            assert_eq!(s, format!("file {i}"));
        }
        assert!(b.take_all().is_empty(), "taken once");
        let nobody = a.send(5, &[(tag(0), files[0].as_fd())], Instant::now());
        assert!(nobody.unwrap_err().contains("@ferroccl-fd"), "no rank 5 bound: the error names the socket");
    }

    fn tempfile() -> std::fs::File {
        let name = std::ffi::CString::new("fdpass-test").unwrap();
        // SAFETY: a NUL-terminated name; the descriptor is fresh and owned by the File.
        unsafe { std::fs::File::from_raw_fd(libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC)) }
    }
}
