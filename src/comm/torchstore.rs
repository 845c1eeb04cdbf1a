//! A client of torch.distributed's TCPStore, just enough to pass one value from rank 0
//! to the other ranks through the store that torchrun's agent serves on MASTER_PORT
//! (TORCHELASTIC_USE_AGENT_STORE=True), where rank 0 cannot listen itself.
//!
//! The message format is TCPStore's (torch/csrc/distributed/c10d/TCPStore.cpp and
//! TCPStoreLibUvBackend.cpp): a command byte, then strings and values as a u64 length
//! and bytes, integers in the host's byte order (as torch writes them). A client first
//! sends VALIDATE with torch's magic number; SET has no reply; WAIT replies one byte
//! when every key is set; GET replies the value.

use crate::error::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const VALIDATE: u8 = 0;
const SET: u8 = 1;
const GET: u8 = 3;
const WAIT: u8 = 6;
const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;
const STOP_WAITING: u8 = 0;
/// Longest value accepted back: ours are 128 bytes; anything near this is not ours.
const MAX_VALUE: u64 = 1 << 20;

/// One connection to a TCPStore.
pub struct Store {
    sock: TcpStream,
    addr: String,
    deadline: Instant,
}

/// A string as TCPStore sends it: its length as a u64, then its bytes.
fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_ne_bytes());
    out.extend_from_slice(b);
}

/// The SET command for `key` and `value`.
fn set_frame(key: &str, value: &[u8]) -> Vec<u8> {
    let mut f = vec![SET];
    put_bytes(&mut f, key.as_bytes());
    put_bytes(&mut f, value);
    f
}

/// The WAIT command for one key.
fn wait_frame(key: &str) -> Vec<u8> {
    let mut f = vec![WAIT];
    f.extend_from_slice(&1u64.to_ne_bytes());
    put_bytes(&mut f, key.as_bytes());
    f
}

/// The GET command for `key`.
fn get_frame(key: &str) -> Vec<u8> {
    let mut f = vec![GET];
    put_bytes(&mut f, key.as_bytes());
    f
}

impl Store {
    /// The local address of the connection to the store: the interface that reaches its host.
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.sock.local_addr().ok().map(|a| a.ip())
    }

    /// Connects to the store at `host:port` and validates, retrying refused
    /// connections until `deadline` (every operation of this store ends by then).
    pub fn connect(host: &str, port: u16, deadline: Instant) -> Result<Store> {
        let addr = format!("{host}:{port}");
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| Error::invalid_arg(format!("torch's store address {addr:?} does not resolve: {e}")))?
            .collect();
        let mut last = None;
        loop {
            for a in &addrs {
                let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                match TcpStream::connect_timeout(a, left) {
                    Ok(sock) => {
                        sock.set_nodelay(true)?;
                        let mut s = Store { sock, addr, deadline };
                        let mut f = vec![VALIDATE];
                        f.extend_from_slice(&VALIDATION_MAGIC.to_ne_bytes());
                        s.send(&f)?;
                        return Ok(s);
                    }
                    Err(e) => last = Some(e),
                }
            }
            if Instant::now() >= deadline {
                let e = last.map_or_else(|| "no address".to_string(), |e| e.to_string());
                return Err(Error::timeout(format!(
                    "cannot reach torch's store at {addr} ({e}); under torchrun the agent serves it at MASTER_ADDR:MASTER_PORT"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sets `key` to `value` (TCPStore replies nothing to a SET).
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.send(&set_frame(key, value))
    }

    /// The value of `key`, waiting until some client has set it (or the deadline).
    pub fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        self.send(&wait_frame(key))?;
        let mut r = [0u8; 1];
        self.recv(&mut r, key)?;
        if r[0] != STOP_WAITING {
            return Err(self.protocol(format!("answered {} to a wait for {key:?}", r[0])));
        }
        self.send(&get_frame(key))?;
        let mut len = [0u8; 8];
        self.recv(&mut len, key)?;
        let len = u64::from_ne_bytes(len);
        if len > MAX_VALUE {
            return Err(self.protocol(format!("announced a value of {len} bytes for {key:?}")));
        }
        let mut v = vec![0u8; len as usize];
        self.recv(&mut v, key)?;
        Ok(v)
    }

    fn send(&mut self, b: &[u8]) -> Result<()> {
        self.sock
            .set_write_timeout(Some(self.left()))
            .and_then(|_| self.sock.write_all(b))
            .map_err(|e| Error::system(format!("writing to torch's store at {}: {e}", self.addr)))
    }

    fn recv(&mut self, b: &mut [u8], key: &str) -> Result<()> {
        let mut got = 0;
        while got < b.len() {
            if let Err(e) = self.sock.set_read_timeout(Some(self.left())) {
                return Err(Error::system(format!("torch's store at {}: {e}", self.addr)));
            }
            match self.sock.read(&mut b[got..]) {
                Ok(0) => return Err(self.protocol(format!("closed the connection while {key:?} was awaited"))),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(Error::timeout(format!(
                        "{key:?} did not appear in torch's store at {} in time",
                        self.addr
                    )))
                }
                Err(e) => return Err(Error::system(format!("reading from torch's store at {}: {e}", self.addr))),
            }
        }
        Ok(())
    }

    /// What is left until the deadline, never zero (a zero timeout means none to std).
    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
    }

    fn protocol(&self, what: String) -> Error {
        Error::system(format!(
            "torch's store at {} {what}: it does not speak the TCPStore protocol this library knows (a torch much newer or older than 2.x, or not a TCPStore); set FERROCCL_ROOT_ADDR instead",
            self.addr
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::net::TcpListener;
    use std::sync::{Arc, Condvar, Mutex};

    #[test]
    fn frames_are_torchs() {
        // Byte for byte what torch's SendBuffer writes (little-endian hosts).
        if cfg!(target_endian = "little") {
            assert_eq!(
                set_frame("/k", b"v"),
                [&[1u8, 2, 0, 0, 0, 0, 0, 0, 0][..], b"/k", &[1, 0, 0, 0, 0, 0, 0, 0], b"v"].concat()
            );
            assert_eq!(wait_frame("/k"), [&[6u8, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0][..], b"/k"].concat());
            assert_eq!(get_frame("ab"), [&[3u8, 2, 0, 0, 0, 0, 0, 0, 0][..], b"ab"].concat());
        }
    }

    type Kv = Arc<(Mutex<HashMap<Vec<u8>, Vec<u8>>>, Condvar)>;

    fn read_n(s: &mut TcpStream, n: usize) -> Option<Vec<u8>> {
        let mut b = vec![0u8; n];
        s.read_exact(&mut b).ok().map(|_| b)
    }
    fn read_str(s: &mut TcpStream) -> Option<Vec<u8>> {
        let n = u64::from_ne_bytes(read_n(s, 8)?.try_into().ok()?);
        read_n(s, n as usize)
    }

    /// A store that follows TCPStore's protocol as its server does, for the commands above.
    fn serve(mut s: TcpStream, kv: Kv) {
        let Some(v) = read_n(&mut s, 5) else { return };
        assert_eq!(v[0], VALIDATE);
        assert_eq!(u32::from_ne_bytes(v[1..5].try_into().unwrap()), VALIDATION_MAGIC);
        while let Some(cmd) = read_n(&mut s, 1) {
            match cmd[0] {
                SET => {
                    let (k, v) = (read_str(&mut s).unwrap(), read_str(&mut s).unwrap());
                    kv.0.lock().unwrap().insert(k, v);
                    kv.1.notify_all();
                }
                WAIT => {
                    assert_eq!(read_n(&mut s, 8).unwrap(), 1u64.to_ne_bytes());
                    let k = read_str(&mut s).unwrap();
                    let mut m = kv.0.lock().unwrap();
                    while !m.contains_key(&k) {
                        m = kv.1.wait(m).unwrap();
                    }
                    s.write_all(&[STOP_WAITING]).unwrap();
                }
                GET => {
                    let k = read_str(&mut s).unwrap();
                    let v = kv.0.lock().unwrap()[&k].clone();
                    let mut out = (v.len() as u64).to_ne_bytes().to_vec();
                    out.extend_from_slice(&v);
                    s.write_all(&out).unwrap();
                }
                c => panic!("unexpected command {c}"),
            }
        }
    }

    fn fake_store() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let kv: Kv = Arc::default();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let kv = kv.clone();
                std::thread::spawn(move || serve(s, kv));
            }
        });
        port
    }

    #[test]
    fn get_waits_for_a_later_set() {
        let port = fake_store();
        let deadline = Instant::now() + Duration::from_secs(20);
        let reader = std::thread::spawn(move || Store::connect("127.0.0.1", port, deadline).unwrap().get("/x"));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!reader.is_finished(), "get returned before the key was set");
        Store::connect("127.0.0.1", port, deadline).unwrap().set("/x", &[7u8; 128]).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), vec![7u8; 128]);
    }

    #[test]
    fn a_key_never_set_times_out_naming_it() {
        let port = fake_store();
        let t0 = Instant::now();
        let mut s = Store::connect("127.0.0.1", port, t0 + Duration::from_millis(300)).unwrap();
        let e = s.get("/never").unwrap_err();
        assert_eq!(e.code, crate::error::Code::Timeout, "{e:?}");
        assert!(e.msg.contains("/never") && e.msg.contains(&port.to_string()), "{}", e.msg);
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn nothing_listening_is_a_timeout_naming_the_address() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let e = Store::connect("127.0.0.1", port, Instant::now() + Duration::from_millis(250)).err().unwrap();
        assert_eq!(e.code, crate::error::Code::Timeout, "{e:?}");
        assert!(e.msg.contains(&format!("127.0.0.1:{port}")) && e.msg.contains("MASTER_PORT"), "{}", e.msg);
    }
}
