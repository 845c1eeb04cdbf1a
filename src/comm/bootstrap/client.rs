//! A rank's side of the rendezvous: connect, prove the key, run rounds, say BYE.

use super::protocol::{check_ranks, ct_eq, frame, ms, read_frame_by, text, welcome_mac, write_all_by, ReadErr};
use super::{
    Challenge, Hello, UniqueId, BYE_ROUND, FAIL_ROUND, MAX_CLIENT_FRAME, MAX_SERVER_FRAME, MAX_TEXT, ST_FAILED, ST_OK,
    ST_TIMEOUT, WELCOME_BYTES,
};
use crate::comm::creation;
use crate::error::{Error, Result};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A rank's connection to the rendezvous point during communicator set-up.
pub struct Client {
    conn: TcpStream,
    addr: SocketAddr,
    round: u32,
    /// How long past its own deadline a rank waits for the point's answer, which
    /// names the ranks that did not arrive (the point answers at the deadline).
    grace: Duration,
    started: Instant,
    pub nranks: usize,
    pub rank: usize,
    /// Random per set-up: names shared-memory segments so jobs never collide.
    pub nonce: u64,
    /// The process serving the point, (pid, host id), when the id says.
    server: Option<(u32, u64)>,
}

/// How long a point whose id says it existed before the id did may refuse connections
/// before a rank concludes that it is gone (refusals are never transient there: the
/// point listened before the id was handed out, and closes only for good).
const REFUSED_GRACE: Duration = Duration::from_millis(250);

/// The error of a rank whose rendezvous point is gone for good: `lead` says what the
/// rank saw, `server` is the process that served the point, (pid, host id).
fn point_gone(lead: &str, (pid, host): (u32, u64)) -> Error {
    let here = host == super::host_id();
    if here && crate::sys::process_gone(pid) {
        Error::remote(format!(
            "{lead}: the process that created the unique id and served its rendezvous (pid {pid}) has exited. It must stay alive until every rank has joined; if it was a rank of this communicator, that rank died during set-up"
        ))
    } else if here {
        Error::remote(format!(
            "{lead}, though the process that created the unique id (pid {pid}) runs: the set-up of this id already ended (a completed or failed set-up closes its rendezvous point); every communicator needs a new unique id (fcclGetUniqueId)"
        ))
    } else {
        Error::remote(format!(
            "{lead}: the process that created the unique id (pid {pid}, on another host) has exited, or the set-up of this id already ended (or a firewall rejects connections to that port); that process must stay alive until every rank has joined"
        ))
    }
}

/// Why one attempt to join failed.
enum Attempt {
    /// Try again (the point closed the connection: busy, or restarting).
    Retry(String),
    Fatal(Error),
}

impl Client {
    /// The local address of the connection to the point: the kernel routed it over the
    /// interface that reaches the point's host, which peers elsewhere can likely reach too.
    pub fn local_ip(&self) -> Option<IpAddr> {
        self.conn.local_addr().ok().map(|a| a.ip())
    }

    /// Connects (retrying until `deadline`, the point may not be up yet) and joins.
    pub fn join(id: &UniqueId, nranks: usize, rank: usize, deadline: Instant) -> Result<Client> {
        let addr = id.addr()?;
        check_ranks(nranks as u64, rank as u64).map_err(Error::invalid_arg)?;
        let started = Instant::now();
        let total = deadline.saturating_duration_since(started);
        // Long enough for the point's verdict (it names the missing ranks) to arrive on a
        // loaded host after the shared deadline, even for short timeouts.
        let grace = (total / 20).clamp(Duration::from_millis(250), Duration::from_secs(2));
        let who = format!("rank {rank} of {nranks}");
        let mut last = String::from("no attempt finished");
        let mut waiting_for = "to reach it";
        let mut backoff = Duration::from_millis(10);
        let server = id.server_process();
        let mut refused_since: Option<Instant> = None;
        loop {
            if creation::cancelled() {
                return Err(creation::aborted());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::timeout(format!(
                    "{who}: timed out after {} ms waiting {waiting_for} at the rendezvous point {addr} ({last}); the process serving it (ferroccl-run, the caller of fcclGetUniqueId, or rank 0 under FERROCCL_ROOT_ADDR) must be running and stay alive until every rank has joined",
                    ms(started.elapsed())
                )));
            }
            let conn = match creation::connect(&addr, left.min(Duration::from_secs(2))) {
                Ok(c) => c,
                Err(e) => {
                    if let (std::io::ErrorKind::ConnectionRefused, Some(srv)) = (e.kind(), server) {
                        if refused_since.get_or_insert_with(Instant::now).elapsed() >= REFUSED_GRACE {
                            let lead = format!("{who}: the rendezvous point at {addr} refuses connections ({e})");
                            return Err(point_gone(&lead, srv));
                        }
                    } else {
                        refused_since = None;
                    }
                    last = format!("last connection attempt: {e}");
                    creation::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                    continue;
                }
            };
            refused_since = None;
            let mut client = Client { conn, addr, round: 0, grace, started, nranks, rank, nonce: 0, server };
            match client.handshake(id, &mut waiting_for, deadline) {
                Ok(()) => return Ok(client),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(why)) => {
                    last = why;
                    creation::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    fn handshake(
        &mut self,
        id: &UniqueId,
        waiting_for: &mut &'static str,
        deadline: Instant,
    ) -> std::result::Result<(), Attempt> {
        let (addr, who) = (self.addr, format!("rank {} of {}", self.rank, self.nranks));
        let fatal_timeout = |what: &str| {
            Attempt::Fatal(Error::timeout(format!(
                "{who}: timed out after {} ms waiting for the rendezvous point at {addr} {what}",
                ms(self.started.elapsed())
            )))
        };
        let conn = &mut self.conn;
        conn.set_nodelay(true).map_err(|e| Attempt::Retry(e.to_string()))?;
        *waiting_for = "for a greeting";
        let challenge = match read_frame_by(conn, 64, deadline) {
            Ok(b) => Challenge::decode(&b).map_err(|why| {
                Attempt::Fatal(Error::invalid_usage(format!(
                    "{who}: the process listening at {addr} is not a ferroccl rendezvous point of this version: {why}"
                )))
            })?,
            Err(ReadErr::Timeout { got: 0 }) => {
                return Err(fatal_timeout(
                    "to greet it (it accepted the connection but sent nothing: is a ferroccl rendezvous point of this version serving there, and is its process responsive?)",
                ))
            }
            Err(ReadErr::Timeout { .. }) => return Err(fatal_timeout("to finish its greeting")),
            Err(ReadErr::Aborted) => return Err(Attempt::Fatal(creation::aborted())),
            Err(e) => return Err(Attempt::Retry(format!("the point closed the connection before greeting ({e})"))),
        };
        let left_ms = deadline.saturating_duration_since(Instant::now()).as_millis().min(u32::MAX as u128) as u32;
        let key = id.secret();
        let hello = Hello::new(&key, &challenge.nonce, self.nranks as u32, self.rank as u32, left_ms)
            .map_err(Attempt::Fatal)?;
        if let Err(e) = write_all_by(conn, &frame(&hello.encode()), deadline) {
            return Err(Attempt::Retry(format!("the point closed the connection during the hello ({e})")));
        }
        *waiting_for = "to be admitted";
        let reply = match read_frame_by(conn, WELCOME_BYTES.max(1 + MAX_TEXT), deadline + self.grace) {
            Ok(r) => r,
            Err(ReadErr::Timeout { .. }) => {
                return Err(fatal_timeout(&format!("to admit {who} (it never answered the hello)")))
            }
            Err(ReadErr::Aborted) => return Err(Attempt::Fatal(creation::aborted())),
            Err(e) => return Err(Attempt::Retry(format!("the point closed the connection after the hello ({e})"))),
        };
        match reply.first() {
            Some(&ST_OK) if reply.len() == WELCOME_BYTES => {
                let nonce = u64::from_le_bytes(reply[1..9].try_into().unwrap());
                if !ct_eq(&reply[9..41], &welcome_mac(&key, &hello, &challenge.nonce, nonce)) {
                    return Err(Attempt::Fatal(Error::invalid_usage(format!(
                        "{who}: the rendezvous point at {addr} admitted this rank but could not prove it holds this job's key: it belongs to another job or program; give each job its own address"
                    ))));
                }
                self.nonce = nonce;
                Ok(())
            }
            Some(&ST_FAILED) => Err(Attempt::Fatal(Error::invalid_usage(format!(
                "{who}: the rendezvous point at {addr} refused it: {}",
                text(&reply[1..])
            )))),
            Some(&ST_TIMEOUT) => Err(Attempt::Fatal(Error::timeout(format!(
                "{who}: the rendezvous point at {addr} did not admit it in time: {}",
                text(&reply[1..])
            )))),
            _ => Err(Attempt::Fatal(Error::remote(format!(
                "{who}: the rendezvous point at {addr} sent a malformed reply to the hello"
            )))),
        }
    }

    /// Sends this rank's blob for the next round and returns every rank's blob.
    pub fn allgather(&mut self, blob: &[u8], deadline: Instant) -> Result<Vec<Vec<u8>>> {
        let (addr, round, rank) = (self.addr, self.round, self.rank);
        if blob.len() + 8 > MAX_CLIENT_FRAME {
            return Err(Error::internal(format!("a set-up blob of {} bytes exceeds the frame limit", blob.len())));
        }
        let tmo = deadline.saturating_duration_since(Instant::now()).as_millis().min(u32::MAX as u128 - 1) as u32;
        let mut f = Vec::with_capacity(12 + blob.len());
        f.extend_from_slice(&((8 + blob.len()) as u32).to_le_bytes());
        f.extend_from_slice(&self.round.to_le_bytes());
        f.extend_from_slice(&tmo.to_le_bytes());
        f.extend_from_slice(blob);
        self.round += 1;
        // A failed write is not the story: the point's reason is read below.
        let _ = write_all_by(&mut self.conn, &f, deadline + self.grace);
        let reply = match read_frame_by(&mut self.conn, MAX_SERVER_FRAME, deadline + self.grace) {
            Ok(r) => r,
            Err(ReadErr::Timeout { .. }) => {
                return Err(Error::timeout(format!(
                    "rank {rank}: communicator set-up timed out after {} ms in round {round} waiting for the rendezvous point at {addr}, which never answered (it names the ranks that did not arrive when it can; is its process responsive?)",
                    ms(self.started.elapsed())
                )))
            }
            Err(ReadErr::Aborted) => {
                // The others learn at once why this rank leaves, instead of that it died.
                let e = creation::aborted();
                self.send_fail(&e.msg, Instant::now() + Duration::from_millis(100));
                return Err(e);
            }
            Err(e) => {
                let lead = format!("rank {rank}: lost the rendezvous point at {addr} during set-up round {round} ({e})");
                return Err(match self.server {
                    Some(srv) if srv.1 == super::host_id() && crate::sys::process_gone(srv.0) => point_gone(&lead, srv),
                    _ => Error::remote(format!(
                        "{lead}; the process serving it (ferroccl-run, the caller of fcclGetUniqueId, or rank 0 under FERROCCL_ROOT_ADDR) may have died"
                    )),
                });
            }
        };
        match reply.first() {
            Some(&ST_OK) => {
                let mut out = Vec::with_capacity(self.nranks);
                let mut p = &reply[1..];
                for _ in 0..self.nranks {
                    if p.len() < 4 {
                        return Err(Error::remote("the rendezvous point sent a truncated reply"));
                    }
                    let n = u32::from_le_bytes(p[0..4].try_into().unwrap()) as usize;
                    if p.len() - 4 < n {
                        return Err(Error::remote("the rendezvous point sent a truncated reply"));
                    }
                    out.push(p[4..4 + n].to_vec());
                    p = &p[4 + n..];
                }
                Ok(out)
            }
            Some(&ST_TIMEOUT) => Err(Error::timeout(format!(
                "rank {rank}: communicator set-up timed out in round {round} after {} ms: {}",
                ms(self.started.elapsed()),
                text(&reply[1..])
            ))),
            Some(&ST_FAILED) => Err(Error::remote(format!(
                "rank {rank}: communicator set-up failed in round {round}: {}",
                text(&reply[1..])
            ))),
            _ => Err(Error::remote("the rendezvous point sent a malformed reply")),
        }
    }

    /// Tells the point why this rank's set-up failed, so that every other rank fails
    /// with that reason at once, and waits briefly for the point to confirm: rank 0's
    /// process may serve the point and exit right after.
    pub fn fail(mut self, why: &str) {
        let by = Instant::now() + Duration::from_secs(2);
        if self.send_fail(why, by) {
            let _ = read_frame_by(&mut self.conn, 1 + MAX_TEXT, by);
        }
    }

    /// Writes the report that this rank's set-up failed (see [`Client::fail`]).
    fn send_fail(&mut self, why: &str, by: Instant) -> bool {
        let why = &why.as_bytes()[..why.len().min(MAX_TEXT)];
        let mut f = Vec::with_capacity(12 + why.len());
        f.extend_from_slice(&((8 + why.len()) as u32).to_le_bytes());
        f.extend_from_slice(&FAIL_ROUND.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(why);
        write_all_by(&mut self.conn, &f, by).is_ok()
    }

    /// Tells the point this rank is done with set-up.
    pub fn finish(mut self) {
        let mut f = Vec::with_capacity(12);
        f.extend_from_slice(&8u32.to_le_bytes());
        f.extend_from_slice(&BYE_ROUND.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        let _ = write_all_by(&mut self.conn, &f, Instant::now() + Duration::from_secs(1));
    }
}
