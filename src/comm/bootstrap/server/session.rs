//! The set-up protocol on the point: checking hellos, admitting or parking ranks,
//! completing rounds, and failing a set-up at once for every rank.

use super::*;
use crate::comm::bootstrap::protocol::{decode_round, frame, text, welcome};

impl Loop {
    pub(super) fn warn(&mut self, msg: &str) {
        // At most one line a second: a flood of strangers must not flood the log.
        let now = Instant::now();
        if self.last_warn.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.suppressed += 1;
            return;
        }
        let more = if self.suppressed > 0 {
            format!(" ({} similar messages suppressed)", std::mem::take(&mut self.suppressed))
        } else {
            String::new()
        };
        self.last_warn = Some(now);
        log::warn(format_args!("{msg}{more}"));
    }

    pub(super) fn on_hello(&mut self, slot: usize, body: &[u8], challenge: [u8; 32]) {
        let peer = self.conn(slot).peer;
        let hello = match Hello::decode(body) {
            Ok(h) => h,
            Err(why) => return self.refuse(slot, ST_FAILED, &format!("refused: {why}")),
        };
        if hello.job_id != self.job_id {
            let (ours, theirs) = (hex(&self.job_id[..6]), hex(&hello.job_id[..6]));
            let m = format!(
                "rendezvous point {}: refused {peer}, which claims rank {} of {} of another job (its job id {theirs}, this point serves job {ours}, keyed by {}): is a second job using this address?",
                self.local,
                hello.rank,
                hello.nranks,
                self.key.source.describe()
            );
            self.warn(&m);
            let msg = format!(
                "refused: this rendezvous point serves another job (job id {ours}; this rank's job id is {theirs}). Two jobs were given the same address: give each its own port (FERROCCL_ROOT_ADDR or MASTER_PORT); if these ranks are one job, give every rank the same FERROCCL_SECRET"
            );
            return self.refuse(slot, ST_FAILED, &msg);
        }
        if !hello.verify(&self.key.key, &challenge) {
            let m = format!(
                "rendezvous point {}: refused {peer}: its hello has this job's id but a wrong proof of the job's key",
                self.local
            );
            self.warn(&m);
            return self.refuse(
                slot,
                ST_FAILED,
                "refused: the hello carries this job's id but not a valid proof of its key; use the unique id (or FERROCCL_SECRET) of this job",
            );
        }
        if let Err(why) = hello.check_ranks() {
            return self.refuse(slot, ST_FAILED, &format!("refused: {why}"));
        }
        if let Some(n) = self.opts.nranks.filter(|&n| n != hello.nranks as usize) {
            let msg = format!(
                "rank {} (pid {} at {}) was refused: it says the communicator has {} ranks, but this job has {n} (rank 0's world size)",
                hello.rank,
                hello.pid,
                peer.ip(),
                hello.nranks
            );
            self.refuse(slot, ST_FAILED, &msg);
            return self.fail_session(ST_FAILED, &msg);
        }
        self.admit(slot, hello, challenge);
    }

    /// Joins `hello`'s rank to the set-up in progress (starting one if none), parks
    /// it until that set-up ends, or refuses it.
    pub(super) fn admit(&mut self, slot: usize, hello: Hello, challenge: [u8; 32]) {
        let now = Instant::now();
        let peer = self.conn(slot).peer;
        if let Some((status, why, _)) = &self.tombstone {
            let msg =
                format!("the set-up of this unique id already failed: {why}; create a new unique id and start again");
            return self.refuse(slot, *status, &msg);
        }
        if self.finished {
            return self.refuse(
                slot,
                ST_FAILED,
                "this unique id's set-up already completed; every communicator needs its own unique id (fcclGetUniqueId)",
            );
        }
        let (rank, nranks) = (hello.rank as usize, hello.nranks as usize);
        let hello_deadline = now + Duration::from_millis(hello.timeout_ms as u64);
        enum Then {
            Join,
            Park,
            Refuse(String),
            Fail(String),
        }
        let then = match &self.session {
            None => Then::Join,
            Some(s) => {
                let mine = |m: &Member| m.pid == hello.pid && m.host == hello.host;
                let taken = s.members[rank].as_ref();
                let done_here = s.members.iter().flatten().any(|m| mine(m) && m.finished);
                if done_here || taken.is_some_and(|m| m.finished || mine(m)) {
                    // The rank's next communicator, started before the others finished
                    // this one: it waits, within its own timeout.
                    Then::Park
                } else if let Some(m) = taken {
                    Then::Refuse(format!(
                        "refused: rank {rank} is already taken in the set-up in progress by pid {} at {}; this process (pid {} at {}) claims it too. Every process needs its own rank (check FERROCCL_RANK or RANK)",
                        m.pid,
                        m.peer.ip(),
                        hello.pid,
                        peer.ip()
                    ))
                } else if nranks != s.nranks {
                    Then::Fail(format!(
                        "rank {rank} (pid {} at {}) was refused: it says the communicator has {nranks} ranks, but the set-up in progress has {} (said first by rank {}, pid {}); every rank must be given the same world size",
                        hello.pid,
                        peer.ip(),
                        s.nranks,
                        s.first.0,
                        s.first.1
                    ))
                } else {
                    Then::Join
                }
            }
        };
        match then {
            Then::Join => {}
            Then::Park => {
                if self.parked.len() >= MAX_RANKS {
                    return self.refuse(slot, ST_FAILED, "refused: too many ranks wait for the next set-up");
                }
                self.set_state(slot, St::Parked { hello, challenge, since: now });
                self.conn(slot).deadline = Some(hello_deadline);
                let serial = self.conn(slot).serial;
                self.parked.push_back((slot, serial));
                return;
            }
            Then::Refuse(msg) => return self.refuse(slot, ST_FAILED, &msg),
            Then::Fail(msg) => {
                self.refuse(slot, ST_FAILED, &msg);
                return self.fail_session(ST_FAILED, &msg);
            }
        }
        if self.session.is_none() {
            let nonce = random_u64().unwrap_or(0x5eed ^ self.serial);
            self.session = Some(Session {
                nranks,
                nonce,
                first: (rank, hello.pid),
                members: (0..nranks).map(|_| None).collect(),
                round: 0,
                blobs: Vec::new(),
                blob_bytes: 0,
                submitted: 0,
                finished: 0,
                latest: now,
            });
        }
        let serial = self.conn(slot).serial;
        let s = self.session.as_mut().expect("a session");
        s.latest = s.latest.max(hello_deadline);
        s.members[rank] = Some(Member {
            slot,
            serial,
            pid: hello.pid,
            host: hello.host,
            peer,
            finished: false,
            submitted: false,
            waiting_since: None,
        });
        let welcome = welcome(&self.key.key, &hello, &challenge, s.nonce);
        self.set_state(slot, St::Member { rank, hdr: [0; 4], hdr_got: 0, body: Vec::new(), body_got: 0 });
        self.conn(slot).deadline = None;
        self.queue(slot, frame(&welcome));
        self.check_dead();
    }

    pub(super) fn on_frame(&mut self, slot: usize, rank: usize, f: &[u8]) {
        let (round, tmo, blob) = match decode_round(f) {
            Ok(x) => x,
            Err(why) => return self.lost(slot, &format!("sent a malformed frame ({why})")),
        };
        let serial = self.conn(slot).serial;
        let Some(s) = self.session.as_mut() else { return self.close(slot) };
        let ours = |m: &Option<Member>| m.as_ref().is_some_and(|m| m.slot == slot && m.serial == serial);
        if !s.members.get(rank).is_some_and(ours) {
            return self.close(slot);
        }
        if round == FAIL_ROUND {
            let msg = format!("rank {rank} failed its set-up: {}", text(blob));
            return self.fail_session_reported_by(ST_FAILED, &msg, Some(slot));
        }
        if round == BYE_ROUND {
            // A rank is done once it has the last round's reply, which every rank got
            // with it: no round has started since. A BYE before any round completed,
            // or while ranks wait in a round, comes from a rank that left early: the
            // set-up can never finish, and the others would wait for it in vain.
            let early = (s.round == 0 || s.submitted > 0) && !s.members[rank].as_ref().is_some_and(|m| m.finished);
            let m = s.members[rank].as_mut().expect("a member");
            if !m.finished {
                m.finished = true;
                s.finished += 1;
            }
            let all = s.finished == s.nranks;
            let left_early = (early && !all).then(|| {
                let m = s.members[rank].as_ref().expect("a member");
                let waiting: Vec<usize> =
                    (0..s.nranks).filter(|&r| s.members[r].as_ref().is_some_and(|m| m.submitted)).collect();
                let state = if s.round == 0 && s.members.iter().any(Option::is_none) {
                    format!(" ({})", s.describe_missing())
                } else if !waiting.is_empty() {
                    format!(" (ranks {} wait in round {} for it)", list(&waiting), s.round)
                } else {
                    String::new()
                };
                format!(
                    "rank {rank} (pid {} at {}) left before the set-up finished: it said it was done at round {}{state}; its init ended early (see its own error)",
                    m.pid,
                    m.peer.ip(),
                    s.round
                )
            });
            self.set_state(slot, St::Done);
            self.conn(slot).deadline = Some(Instant::now() + DONE_LINGER);
            if let Some(msg) = left_early {
                return self.fail_session(ST_FAILED, &msg);
            }
            if all {
                self.end_session();
            }
            return;
        }
        let m = s.members[rank].as_ref().expect("a member");
        if round != s.round || m.submitted || m.finished {
            let cur = s.round;
            return self.lost(slot, &format!("sent round {round} while the set-up is at round {cur}"));
        }
        if round >= MAX_ROUNDS {
            return self.lost(slot, &format!("asked for round {round}; a set-up has at most {MAX_ROUNDS}"));
        }
        if s.blob_bytes + 4 + blob.len() >= MAX_SERVER_FRAME {
            let msg = format!(
                "round {round}'s blobs exceed {} MiB together (rank {rank} sent {} bytes)",
                MAX_SERVER_FRAME >> 20,
                blob.len()
            );
            return self.fail_session(ST_FAILED, &msg);
        }
        if s.blobs.is_empty() {
            s.blobs = (0..s.nranks).map(|_| None).collect();
        }
        s.blobs[rank] = Some(blob.to_vec());
        s.blob_bytes += 4 + blob.len();
        s.submitted += 1;
        let now = Instant::now();
        let m = s.members[rank].as_mut().expect("a member");
        m.submitted = true;
        m.waiting_since = Some(now);
        let done = s.submitted == s.nranks;
        self.conn(slot).deadline = Some(now + Duration::from_millis(tmo as u64));
        if done {
            self.complete_round();
        }
    }

    pub(super) fn complete_round(&mut self) {
        let s = self.session.as_mut().expect("a session");
        let mut b = Vec::with_capacity(5 + s.blob_bytes);
        b.extend_from_slice(&((1 + s.blob_bytes) as u32).to_le_bytes());
        b.push(ST_OK);
        for blob in s.blobs.drain(..) {
            let blob = blob.unwrap_or_default();
            b.extend_from_slice(&(blob.len() as u32).to_le_bytes());
            b.extend_from_slice(&blob);
        }
        s.blob_bytes = 0;
        s.submitted = 0;
        s.round += 1;
        let reply = Arc::new(b);
        let mut to = Vec::with_capacity(s.nranks);
        for m in s.members.iter_mut().flatten() {
            m.submitted = false;
            m.waiting_since = None;
            to.push((m.slot, m.serial));
        }
        for (slot, serial) in to {
            if self.alive(slot, serial) {
                self.conn(slot).deadline = None;
                self.queue_rc(slot, reply.clone());
            }
        }
    }

    /// Every rank said BYE.
    pub(super) fn end_session(&mut self) {
        self.session = None;
        if !self.opts.reusable {
            self.finished = true;
            self.listener = None;
        }
        self.unpark();
    }

    /// Tells every rank of the set-up in progress that it failed (`msg`), at once.
    pub(super) fn fail_session(&mut self, status: u8, msg: &str) {
        self.fail_session_reported_by(status, msg, None)
    }

    /// Fails the set-up; the rank on `reporter` (which reported the failure) is told
    /// last, so its confirmation means every other rank's notice was written.
    pub(super) fn fail_session_reported_by(&mut self, status: u8, msg: &str, reporter: Option<usize>) {
        let Some(s) = self.session.take() else {
            if !self.opts.reusable && self.tombstone.is_none() {
                self.tombstone = Some((status, msg.to_string(), Instant::now() + self.opts.hello_deadline));
            }
            return;
        };
        log::warn(format_args!("rendezvous point {}: the set-up of {} ranks failed: {msg}", self.local, s.nranks));
        let last = reporter.and_then(|r| s.members.iter().flatten().find(|m| m.slot == r));
        for m in s.members.iter().flatten().filter(|m| Some(m.slot) != reporter).chain(last) {
            let closing = self.conns.get(m.slot).and_then(|c| c.as_ref()).is_some_and(|c| matches!(c.st, St::Closing));
            if !m.finished && !closing && self.alive(m.slot, m.serial) {
                self.send_last(m.slot, status, msg);
            }
        }
        if !self.opts.reusable {
            // Ranks that arrive later are told too, as long as any could still wait.
            let until = s.latest.max(Instant::now() + self.opts.hello_deadline);
            self.tombstone = Some((status, msg.to_string(), until));
        }
        self.unpark();
    }

    /// A failed one-shot point stops once its failure is no longer news.
    pub(super) fn finish_one_shot(&mut self) {
        if !self.opts.reusable && self.session.is_none() {
            self.finished = true;
            self.listener = None;
            self.unpark();
        }
    }

    /// Ranks parked behind the set-up that just ended get their turn, in order.
    pub(super) fn unpark(&mut self) {
        let parked = std::mem::take(&mut self.parked);
        for (slot, serial) in parked {
            if !self.alive(slot, serial) {
                continue;
            }
            let c = self.conn(slot);
            if !matches!(c.st, St::Parked { .. }) {
                continue;
            }
            let St::Parked { hello, challenge, .. } = std::mem::replace(&mut c.st, St::Done) else { unreachable!() };
            self.admit(slot, hello, challenge);
        }
    }

    /// Fails the set-up in progress if the launcher saw a process of it end.
    pub(super) fn check_dead(&mut self) {
        let Some(s) = &self.session else { return };
        // A process that ended has written all it ever will, maybe its BYE, which
        // this thread may not have read yet: read it first (the launcher's account
        // of how the process ended is the better one if it said nothing more).
        let unread: Vec<(usize, u64)> = s
            .members
            .iter()
            .flatten()
            .filter(|m| !m.finished && m.host == self.host && self.dead.iter().any(|d| d.2 == m.pid))
            .map(|m| (m.slot, m.serial))
            .collect();
        for (slot, serial) in unread {
            if self.alive(slot, serial) {
                self.read_input(slot, false);
            }
        }
        let Some(s) = &self.session else { return };
        let mut why = None;
        for (rank, world, pid, how) in &self.dead {
            let member = s
                .members
                .iter()
                .enumerate()
                .find_map(|(r, m)| m.as_ref().filter(|m| m.pid == *pid && m.host == self.host).map(|m| (r, m)));
            if let Some((r, m)) = member {
                if !m.finished {
                    why = Some(format!("rank {r} (pid {pid}) {how} during set-up round {}", s.round));
                    break;
                }
            } else if *world == s.nranks && s.members[*rank].is_none() {
                why = Some(format!(
                    "rank {rank}'s process (pid {pid}, started by the launcher as rank {rank} of {world}) {how} before it joined the set-up"
                ));
                break;
            }
        }
        if let Some(w) = why {
            self.fail_session(ST_FAILED, &w);
        }
    }
}
