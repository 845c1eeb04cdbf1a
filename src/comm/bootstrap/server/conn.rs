//! The point's connections: accepting them under the pending cap, buffered writes,
//! and reading each connection's frames according to its state.

use super::*;
use crate::comm::bootstrap::protocol::frame;
use std::io::Write;

impl Loop {
    pub(super) fn accept_some(&mut self) {
        // A bounded batch: connections already accepted get their turn to say hello
        // before a flood can push them out of the pending cap.
        for _ in 0..(self.max_pending / 4).max(1) {
            let Some(l) = &self.listener else { return };
            match l.accept() {
                Ok((s, peer)) => self.add_conn(s, peer),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(e.kind(), std::io::ErrorKind::Interrupted | std::io::ErrorKind::ConnectionAborted) => {}
                Err(e)
                    if !matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    ) =>
                {
                    // Some other failure of one connection (EPROTO, ...): rest briefly in
                    // case it persists, rather than spin on a readable listener.
                    self.paused_until = Some(Instant::now() + EMFILE_REST / 10);
                    return;
                }
                Err(e) => {
                    // Out of descriptors (or buffers): make room, or rest instead of
                    // spinning on a listener that stays readable.
                    if !self.evict_oldest() {
                        self.paused_until = Some(Instant::now() + EMFILE_REST);
                        let m = format!(
                            "rendezvous point {}: cannot accept connections ({e}); raise the file descriptor limit (ulimit -n)",
                            self.local
                        );
                        self.warn(&m);
                    }
                    return;
                }
            }
        }
    }

    pub(super) fn add_conn(&mut self, sock: TcpStream, peer: SocketAddr) {
        if self.npending >= self.max_pending {
            self.evict_oldest();
        }
        let Ok(challenge) = random_secret() else { return };
        if sock.set_nonblocking(true).is_err() {
            return;
        }
        let _ = sock.set_nodelay(true);
        self.serial += 1;
        let c = Conn {
            sock,
            peer,
            serial: self.serial,
            st: St::Greeting { challenge, buf: Box::new([0; 4 + HELLO_BYTES]), got: 0 },
            deadline: Some(Instant::now() + self.opts.hello_deadline),
            wq: VecDeque::new(),
            woff: 0,
            close_after_flush: false,
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.conns[s] = Some(c);
                s
            }
            None => {
                self.conns.push(Some(c));
                self.conns.len() - 1
            }
        };
        self.npending += 1;
        self.pending.push_back((slot, self.serial));
        self.queue(slot, frame(&Challenge { nonce: challenge }.encode()));
    }

    /// Closes the connection that has been pending longest; false if there is none.
    pub(super) fn evict_oldest(&mut self) -> bool {
        while let Some((slot, serial)) = self.pending.pop_front() {
            if self.alive(slot, serial) && self.conns[slot].as_ref().is_some_and(|c| c.st.pending()) {
                self.close(slot);
                return true;
            }
        }
        false
    }

    pub(super) fn set_state(&mut self, slot: usize, st: St) {
        let serial = self.conns[slot].as_ref().map_or(0, |c| c.serial);
        let c = self.conn(slot);
        let (was, now) = (c.st.pending(), st.pending());
        c.st = st;
        if was && !now {
            self.npending -= 1;
        } else if !was && now {
            self.npending += 1;
            self.pending.push_back((slot, serial));
        }
    }

    pub(super) fn close(&mut self, slot: usize) {
        if let Some(c) = self.conns[slot].take() {
            if c.st.pending() {
                self.npending -= 1;
            }
            self.free.push(slot);
            // Forget it in the session so a later event does not touch a reused slot.
            if let (St::Member { rank, .. }, Some(s)) = (&c.st, &mut self.session) {
                if let Some(m) = s.members.get_mut(*rank).and_then(|m| m.as_mut()) {
                    if m.slot == slot && m.serial == c.serial {
                        m.slot = usize::MAX;
                    }
                }
            }
        }
    }

    pub(super) fn queue(&mut self, slot: usize, frame: Vec<u8>) {
        self.queue_rc(slot, Arc::new(frame));
    }

    pub(super) fn queue_rc(&mut self, slot: usize, frame: Arc<Vec<u8>>) {
        self.conn(slot).wq.push_back(frame);
        self.flush(slot);
    }

    /// Writes what the socket takes now.
    pub(super) fn flush(&mut self, slot: usize) {
        let c = self.conn(slot);
        while let Some(f) = c.wq.front() {
            match c.sock.write(&f[c.woff..]) {
                Ok(n) => {
                    c.woff += n;
                    if c.woff == f.len() {
                        c.wq.pop_front();
                        c.woff = 0;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => return self.lost(slot, "closed its connection"),
            }
        }
        if c.close_after_flush {
            c.close_after_flush = false;
            let _ = c.sock.shutdown(std::net::Shutdown::Write);
            c.deadline = Some(Instant::now() + LINGER);
        }
    }

    /// Queues a last frame (status and text) and closes after it.
    pub(super) fn send_last(&mut self, slot: usize, status: u8, msg: &str) {
        let mut b = Vec::with_capacity(1 + msg.len().min(MAX_TEXT));
        b.push(status);
        b.extend_from_slice(&msg.as_bytes()[..msg.len().min(MAX_TEXT)]);
        self.set_state(slot, St::Closing);
        let c = self.conn(slot);
        c.close_after_flush = true;
        c.deadline = Some(Instant::now() + LINGER);
        self.queue(slot, frame(&b));
    }

    pub(super) fn refuse(&mut self, slot: usize, status: u8, msg: &str) {
        self.send_last(slot, status, msg);
    }

    pub(super) fn readable(&mut self, slot: usize) {
        self.read_input(slot, true)
    }

    /// Reads and handles what the connection on `slot` holds; a rank's connection
    /// that ends is lost when `eof_is_loss` (else left for the caller's verdict).
    pub(super) fn read_input(&mut self, slot: usize, eof_is_loss: bool) {
        let serial = self.conn(slot).serial;
        loop {
            if !self.alive(slot, serial) {
                return;
            }
            let c = self.conns[slot].as_mut().expect("alive");
            match &mut c.st {
                St::Greeting { buf, got, .. } => {
                    let want = if *got < 4 {
                        4
                    } else {
                        let len = u32::from_le_bytes(buf[0..4].try_into().unwrap()) as usize;
                        if len != HELLO_BYTES {
                            let why = if len == 48 {
                                "a hello of rendezvous protocol 1 (an older ferroccl); use the same ferroccl build in every process of a job".to_string()
                            } else {
                                format!("a first frame of {len} bytes is not a hello (a hello has {HELLO_BYTES})")
                            };
                            return self.refuse(slot, ST_FAILED, &format!("refused: {why}"));
                        }
                        4 + HELLO_BYTES
                    };
                    match read_some(&mut c.sock, &mut buf[*got..want]) {
                        Io::Data(n) => *got += n,
                        Io::Eof => return self.close(slot),
                        Io::Again => return,
                    }
                    if *got == 4 + HELLO_BYTES {
                        // Still pending (it counts against the cap) until admitted or refused.
                        let body: [u8; HELLO_BYTES] = buf[4..].try_into().expect("a whole hello");
                        let St::Greeting { challenge, .. } = c.st else { unreachable!() };
                        return self.on_hello(slot, &body, challenge);
                    }
                }
                St::Member { rank, hdr, hdr_got, body, body_got } => {
                    let rank = *rank;
                    if *hdr_got < 4 {
                        match read_some(&mut c.sock, &mut hdr[*hdr_got..]) {
                            Io::Data(n) => *hdr_got += n,
                            Io::Eof if eof_is_loss => return self.lost(slot, "closed its connection"),
                            Io::Eof | Io::Again => return,
                        }
                        if *hdr_got == 4 {
                            let len = u32::from_le_bytes(*hdr) as usize;
                            if len > MAX_CLIENT_FRAME {
                                return self.lost(
                                    slot,
                                    &format!("sent a frame of {len} bytes (the limit is {MAX_CLIENT_FRAME})"),
                                );
                            }
                            *body = vec![0; len];
                            *body_got = 0;
                        }
                    }
                    if *hdr_got == 4 {
                        if *body_got < body.len() {
                            match read_some(&mut c.sock, &mut body[*body_got..]) {
                                Io::Data(n) => *body_got += n,
                                Io::Eof if eof_is_loss => return self.lost(slot, "closed its connection"),
                                Io::Eof | Io::Again => return,
                            }
                        }
                        if *body_got == body.len() {
                            let f = std::mem::take(body);
                            *hdr_got = 0;
                            self.on_frame(slot, rank, &f);
                        }
                    }
                }
                St::Parked { .. } | St::Done | St::Closing => {
                    let parked = matches!(c.st, St::Parked { .. });
                    let mut scratch = [0u8; 256];
                    match read_some(&mut c.sock, &mut scratch) {
                        // A parked rank that speaks or leaves gave up waiting.
                        Io::Data(_) if parked => return self.close(slot),
                        Io::Data(_) => {}
                        Io::Eof => return self.close(slot),
                        Io::Again => return,
                    }
                }
            }
        }
    }

    /// A connection broke or misbehaved; `why` completes "rank r (pid p) ...".
    pub(super) fn lost(&mut self, slot: usize, why: &str) {
        let c = self.conns[slot].as_ref().expect("alive");
        let St::Member { rank, .. } = c.st else { return self.close(slot) };
        self.close(slot);
        let Some(s) = &self.session else { return };
        let Some(m) = s.members[rank].as_ref() else { return };
        if m.finished {
            return;
        }
        let msg = format!(
            "rank {rank} (pid {} at {}) {why} during set-up round {}: its process died, was killed, or its init failed (see its own error)",
            m.pid,
            m.peer.ip(),
            s.round
        );
        self.fail_session(ST_FAILED, &msg);
    }
}
