//! fcclSend / fcclRecv between ranks that share one GPU. Only the pair takes part, so
//! the pair orders itself: the k-th send from p to q pairs with q's k-th receive from p
//! (the host backend's order, across groups too), through slot k of the pair's mailbox
//! in the control region. Each side writes its record there (the sender: its buffer's
//! size, IPC handle and address; the receiver: its size) and reads the other's; both
//! reach the same verdict from the two records:
//! - sizes differ: both calls fail with the host backend's error, nothing moves;
//! - both buffers are device memory this path can share: GPU to GPU. On the streams
//!   (ranks in separate processes) the sender's stream writes `sent[p][q] = k + 1` once
//!   its buffer is ready and later waits for `recvd[p][q] >= k + 1`; the receiver's
//!   stream waits for `sent`, copies from its mapping of the sender's buffer and writes
//!   `recvd`. The host waits only for the peer's record. Ranks that share a process
//!   (which may share a stream) copy and synchronise instead, the sender's host waiting
//!   for the receiver's copy;
//! - otherwise (host memory, memory IPC cannot share, another context): through the
//!   pair's bounce ring in the control region, copied by the hosts;
//! - either side's stream is being captured into a CUDA graph: both calls fail with
//!   fcclInvalidUsage (see `capture`), nothing moves.
//!
//! A group's records are all written before its collectives run and its records read
//! after, and every wait polls, so that one rank's calls never hold up a peer that the
//! host backend would not hold up. Each rank's stream work for a group's device pairs:
//! every `sent` first, then the receives, then the waits for `recvd`, so that two ranks
//! that send to each other never wait for each other's copies.

use super::ctl::{Ctl, Pair, RecvRec, SendRec, BOUNCE, SLOTS};
use super::fallback::{fix, Fallback};
use super::mappings::Owner;
use super::watch::Target;
use super::{Inner, Ipc, Outcome};
use crate::backend::Algo;
use crate::backend::Exec;
use crate::coll::counts::{p2p_mismatch, P2pCall};
use crate::coll::Call;
use crate::coll::{Coll, CollKind};
use crate::error::{Error, Result};
use crate::mem::{cuda, cuda_reduce, Placement};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How a matched pair of calls moves its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Device,
    Bounce,
    Mismatch,
    Captured,
}

fn verdict(sent: u64, received: u64, sender_device: bool, receiver_device: bool) -> Verdict {
    if sent != received {
        Verdict::Mismatch
    } else if sender_device && receiver_device {
        Verdict::Device
    } else {
        Verdict::Bounce
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    /// This side's record is not in the mailbox yet (its slot is still in use).
    Post,
    /// Waiting for the peer's record.
    Match,
    /// Bounce: waiting for this rank's stream to finish the work before the call.
    Idle,
    /// Bounce: bytes moved so far.
    Move(usize),
    /// Waiting for the receiver to finish with the data (sender).
    Ack,
    Done,
}

/// One fcclSend or fcclRecv with another rank.
struct Op<'c> {
    c: &'c Coll,
    peer: usize,
    send: bool,
    slot: u64,
    bytes: usize,
    /// This side's buffer may be used GPU to GPU; else why not.
    device: std::result::Result<(), Fallback>,
    /// This side's stream is being captured into a CUDA graph.
    captured: bool,
    rec: SendRec,
    st: St,
    verdict: Option<Verdict>,
    /// Receiver, GPU to GPU: the sender's buffer in this process.
    src: usize,
    ctx: cuda::Ctx,
    /// Receiver whose buffer a send of the run reads (an exchange in place): the data
    /// lands here first and goes to the buffer once every send of the run is done.
    gated: Option<Tmp>,
}

/// Where a gated receive lands first: memory of its buffer's kind.
enum Tmp {
    Host(Vec<u8>),
    Device(cuda::Scratch),
}

impl Op<'_> {
    /// Where the received bytes go first.
    fn target(&self) -> *mut u8 {
        match &self.gated {
            Some(Tmp::Host(v)) => v.as_ptr() as *mut u8,
            Some(Tmp::Device(s)) => s.ptr(),
            None => self.c.recv,
        }
    }
}

/// A run's send/recv calls, from posting their records to their stream work.
pub struct Run<'c> {
    ops: Vec<Op<'c>>,
    selfs: Vec<&'c Coll>,
    errors: Vec<Error>,
}

/// The pair of sends from `p` to `q`.
fn pair(ctl: &Ctl, p: usize, q: usize) -> Pair<'_> {
    ctl.pair(p, q)
}

impl Ipc {
    /// The context a call's buffers live in (host memory: this rank's device's).
    fn ctx_of(&self, c: &Coll) -> Result<cuda::Ctx> {
        match c.placement {
            Placement::Device { ctx, .. } => Ok(ctx),
            Placement::Host => cuda::primary_context(self.device),
        }
    }

    /// Whether this side of `c` can go GPU to GPU with `peer` (Err: why not), and the
    /// sender's record fields.
    fn p2p_side(
        &self,
        c: &Coll,
        peer: usize,
        ctx: cuda::Ctx,
        inner: &mut Inner,
    ) -> std::result::Result<SendRec, Fallback> {
        let Placement::Device { device, .. } = c.placement else {
            return Err(Fallback::new("its buffer is host memory", fix::HOST_MEMORY));
        };
        match self.stream_mode(inner, ctx, device) {
            super::Mode::Off(m) => return Err(m),
            super::Mode::Synced => {}
            super::Mode::Stream(_) => {
                if c.kind == CollKind::Recv {
                    // The receiver copies with a kernel: compiled now, so a rank without
                    // NVRTC says so in its record.
                    cuda_reduce::copiers(ctx, device).map_err(|e| Fallback::new(e.msg, fix::NVRTC))?;
                }
            }
        }
        let mut r = SendRec { device: true, pid: std::process::id(), ..SendRec::default() };
        if c.kind == CollKind::Send {
            r.ptr = c.send as u64;
            if self.pids[peer] != std::process::id() {
                let bytes = c.count * c.dtype.size();
                let (h, off) = inner
                    .exported
                    .handle(c.send, bytes, &[peer])
                    .map_err(|e| Fallback::new(e.msg, fix::export(c.send)))?;
                r.handle = h;
                r.off = off as u64;
            }
        }
        Ok(r)
    }

    /// Starts the send/recv calls of a run: assigns their slots and posts the records
    /// that fit. Sends to and receives from this rank itself pair up here, in order.
    pub(super) fn p2p_start<'c>(&self, calls: &[&'c Call], inner: &mut Inner) -> Result<Run<'c>> {
        let me = self.rank;
        let mut run = Run { ops: Vec::new(), selfs: Vec::new(), errors: Vec::new() };
        inner.next_send.resize(self.nranks, 0);
        inner.next_recv.resize(self.nranks, 0);
        for call in calls {
            let c = &call.coll;
            if c.peer == me {
                run.selfs.push(c);
                continue;
            }
            let send = c.kind == CollKind::Send;
            let next = if send { &mut inner.next_send[c.peer] } else { &mut inner.next_recv[c.peer] };
            let slot = *next;
            *next += 1;
            let ctx = self.ctx_of(c)?;
            let _g = cuda::CtxGuard::enter(ctx)?;
            // A capturing stream gets nothing: the record says so and the pair fails.
            let captured = stream_captured(c)?;
            let side = if captured {
                Err(Fallback::new("its stream is being captured into a CUDA graph", ""))
            } else {
                self.p2p_side(c, c.peer, ctx, inner)
            };
            if send && side.is_ok() && self.synced {
                // Ranks that share a process copy from this buffer whenever they see the
                // record: the work before the call must be done first.
                cuda::sync(c.stream)?;
            }
            let bytes = c.count * c.dtype.size();
            let (rec, device) = match side {
                Ok(r) => (r, Ok(())),
                Err(why) => (SendRec { pid: std::process::id(), captured, ..SendRec::default() }, Err(why)),
            };
            let rec = SendRec { bytes: bytes as u64, ..rec };
            run.ops.push(Op {
                c,
                peer: c.peer,
                send,
                slot,
                bytes,
                device,
                captured,
                rec,
                st: St::Post,
                verdict: None,
                src: 0,
                ctx,
                gated: None,
            });
        }
        // Receives into a buffer that a send of the run reads land aside first.
        let sends: Vec<(usize, usize)> =
            run.ops.iter().filter(|o| o.send).map(|o| (o.c.send as usize, o.bytes)).collect();
        for o in run.ops.iter_mut().filter(|o| !o.send && !o.captured) {
            let (d, n) = (o.c.recv as usize, o.bytes);
            if sends.iter().any(|&(s, m)| s < d + n && d < s + m) {
                o.gated = Some(match o.c.placement {
                    Placement::Host => Tmp::Host(host_copy(
                        n,
                        "the payload of an fcclRecv whose buffer an fcclSend of the group reads (it lands here first)",
                    )?),
                    Placement::Device { .. } => {
                        let _g = cuda::CtxGuard::enter(o.ctx)?;
                        Tmp::Device(cuda::Scratch::new(n, o.ctx, o.c.stream)?)
                    }
                });
            }
        }
        if let Ok(ctl) = &self.ctl {
            for op in &mut run.ops {
                op.post(ctl, me);
            }
        }
        Ok(run)
    }

    /// Finishes a run's send/recv calls: pairs the records, moves bounced data, then
    /// puts the GPU-to-GPU pairs on the streams. `Ok(Outcome::Failed(e))`: sizes that differed
    /// (the communicator stays usable).
    pub(super) fn p2p_finish(&self, x: &mut Exec<'_>, run: Run<'_>, inner: &mut Inner) -> Result<Outcome> {
        let mut run = run;
        self.pair_selves(&mut run)?;
        if !run.ops.is_empty() {
            let ctl =
                self.ctl.as_ref().map_err(|m| Error::internal(format!("send/recv without a control region: {m}")))?;
            let res = self.progress(x, &mut run, ctl).and_then(|_| self.enqueue(&run, inner));
            if let Err(e) = res {
                // Peers may already wait on the streams for this rank's part.
                self.watch.fail(ctl, self.rank, &e);
                return Err(e);
            }
            x.algo = algo_of(&run);
            if x.algo == Algo::P2pBounce {
                x.backend = "staged";
            }
        } else if !run.selfs.is_empty() {
            x.algo = Algo::P2pSelf;
        }
        Ok(run.errors.into_iter().next().into())
    }

    /// Sends to and receives from this rank itself pair up in order, as on the host.
    fn pair_selves(&self, run: &mut Run<'_>) -> Result<()> {
        let me = self.rank;
        let sends: Vec<&Coll> = run.selfs.iter().copied().filter(|c| c.kind == CollKind::Send).collect();
        let recvs: Vec<&Coll> = run.selfs.iter().copied().filter(|c| c.kind == CollKind::Recv).collect();
        if sends.len() != recvs.len() {
            run.errors.push(Error::invalid_usage(format!(
                "rank {me} posted {} fcclSend to itself but {} fcclRecv from itself in this group; they must pair up",
                sends.len(),
                recvs.len()
            )));
        }
        for (s, r) in sends.iter().zip(&recvs) {
            if stream_captured(s)? || stream_captured(r)? {
                run.errors.push(super::super::capture::refusal(&describe(s), me, s.stream, &[me]));
                continue;
            }
            let (sb, rb) = (s.count * s.dtype.size(), r.count * r.dtype.size());
            if sb != rb {
                run.errors.push(Error::mismatch(format!(
                    "rank {me} sends {sb} bytes to itself but receives {rb} bytes from itself"
                )));
                continue;
            }
            // SAFETY: both buffers are valid for sb bytes (validated) until the streams
            // have run the copy.
            unsafe { copy_self(s, r, sb)? };
        }
        Ok(())
    }

    /// Pairs every op with its peer's record and moves what goes through the bounce
    /// rings, polling; fails at the timeout, an abort, or a peer that died or failed.
    fn progress(&self, x: &mut Exec<'_>, run: &mut Run<'_>, ctl: &Ctl) -> Result<()> {
        let me = self.rank;
        let start = Instant::now();
        let mut idle = 0u32;
        let mut last_check = start;
        // Each ordered pair's calls advance in slot order: an op waits for the one before
        // it with the same peer and direction.
        let mut last: std::collections::HashMap<(usize, bool), usize> = std::collections::HashMap::new();
        let before: Vec<Option<usize>> =
            run.ops.iter().enumerate().map(|(i, o)| last.insert((o.peer, o.send), i)).collect();
        loop {
            let mut moved = false;
            for (i, b) in before.iter().enumerate() {
                if b.is_some_and(|j| run.ops[j].st != St::Done) {
                    if run.ops[i].st == St::Post {
                        moved |= run.ops[i].post(ctl, me);
                    }
                    continue;
                }
                moved |= self.step(&mut run.ops[i], ctl, &mut run.errors)?;
            }
            if run.ops.iter().all(|o| o.st == St::Done) {
                return Ok(());
            }
            if moved {
                idle = 0;
                continue;
            }
            idle += 1;
            let now = Instant::now();
            if now.duration_since(last_check) >= Duration::from_millis(1) {
                last_check = now;
                self.check_alive(x, run, ctl, start)?;
            }
            backoff(idle);
        }
    }

    /// An error when a peer this run waits for died or failed, the communicator was
    /// aborted, or the timeout passed.
    fn check_alive(&self, x: &mut Exec<'_>, run: &Run<'_>, ctl: &Ctl, start: Instant) -> Result<()> {
        let waiting: Vec<&Op<'_>> = run.ops.iter().filter(|o| o.st != St::Done).collect();
        let what = |o: &Op<'_>| describe(o.c);
        if x.abort.load(Ordering::Acquire) || self.watch.aborted.load(Ordering::Acquire) {
            return Err(Error::remote(format!("{}: the communicator was aborted", what(waiting[0]))));
        }
        if ctl.failed().load(Ordering::Acquire) != 0 {
            return Err(Error::remote(format!(
                "{}: another rank gave up on this communicator's device calls",
                what(waiting[0])
            )));
        }
        x.t.check_flags()?;
        let mut peers: Vec<usize> = waiting.iter().map(|o| o.peer).collect();
        peers.sort_unstable();
        peers.dedup();
        x.t.check_peers_of(&peers)?;
        if start.elapsed() >= x.timeout {
            let o = waiting[0];
            let other = if o.send { "fcclRecv" } else { "fcclSend" };
            let why = if o.st == St::Post || o.st == St::Match {
                format!("rank {} did not post the matching {other}", o.peer)
            } else {
                format!("rank {} did not take its part of the data", o.peer)
            };
            return Err(Error::timeout_blaming(
                Some(o.peer),
                format!(
                    "{}: {why} within {} ms (FERROCCL_TIMEOUT_MS); it is stopped, hung, or waits for something else",
                    what(o),
                    x.timeout.as_millis()
                ),
            ));
        }
        Ok(())
    }

    /// Advances one op as far as it can now; true when it changed.
    fn step(&self, op: &mut Op<'_>, ctl: &Ctl, errors: &mut Vec<Error>) -> Result<bool> {
        let me = self.rank;
        let (p, q) = if op.send { (me, op.peer) } else { (op.peer, me) };
        let pr = pair(ctl, p, q);
        let k = op.slot;
        let before = op.st;
        if op.st == St::Post && !op.post(ctl, me) {
            return Ok(false);
        }
        if op.st == St::Match {
            let (sent, received, sender_dev, receiver_dev, theirs, peer_captured) = if op.send {
                let Some(r) = pr.get_recv(k) else { return Ok(op.st != before) };
                pr.r_read().store(k + 1, Ordering::Release);
                (op.bytes as u64, r.bytes, op.device.is_ok(), r.device, None, r.captured)
            } else {
                let Some(s) = pr.get_send(k) else { return Ok(op.st != before) };
                (s.bytes, op.bytes as u64, s.device, op.device.is_ok(), Some(s), s.captured)
            };
            let v = if op.captured || peer_captured {
                Verdict::Captured
            } else {
                verdict(sent, received, sender_dev, receiver_dev)
            };
            op.verdict = Some(v);
            match v {
                Verdict::Captured => {
                    let who: Vec<usize> = [(me, op.captured), (op.peer, peer_captured)]
                        .iter()
                        .filter(|(_, c)| *c)
                        .map(|(r, _)| *r)
                        .collect();
                    errors.push(super::super::capture::refusal(&describe(op.c), me, op.c.stream, &who));
                    op.finish(&pr);
                }
                Verdict::Mismatch => {
                    errors.push(p2p_mismatch(P2pCall::of(op.c), p, q, sent as usize, received as usize));
                    op.finish(&pr);
                }
                Verdict::Device => {
                    if let Some(s) = theirs {
                        op.src = self.map_source(&s, op.ctx)?;
                    }
                    match (op.send, self.synced) {
                        (true, true) => op.st = St::Ack,
                        (false, true) => {
                            let _g = cuda::CtxGuard::enter(op.ctx)?;
                            // SAFETY: the sender's buffer (synchronised before its record) and
                            // this receive buffer are valid for `bytes` until the sender sees
                            // s_done, after the copy is synchronised here.
                            unsafe { cuda::copy_dtod_async(op.target(), op.src as *const u8, op.bytes, op.c.stream)? };
                            cuda::sync(op.c.stream)?;
                            op.finish(&pr);
                        }
                        (_, false) => op.finish(&pr),
                    }
                }
                Verdict::Bounce => {
                    match &op.device {
                        Err(f) => self.fell_back(&describe(op.c), f),
                        Ok(()) => self.fell_back(
                            &describe(op.c),
                            &Fallback::new(format!("rank {} cannot take its side GPU to GPU", op.peer), fix::PEER),
                        ),
                    }
                    op.st = if matches!(op.c.placement, Placement::Device { .. }) { St::Idle } else { St::Move(0) };
                }
            }
        }
        if op.st == St::Idle {
            let _g = cuda::CtxGuard::enter(op.ctx)?;
            if !cuda::stream_done(op.c.stream)? {
                return Ok(op.st != before);
            }
            op.st = St::Move(0);
        }
        if let St::Move(mut at) = op.st {
            let _g = match op.c.placement {
                Placement::Device { .. } => Some(cuda::CtxGuard::enter(op.ctx)?),
                Placement::Host => None,
            };
            let dev = op.c.placement != Placement::Host;
            loop {
                let (w, r) = (pr.written().load(Ordering::Acquire), pr.read().load(Ordering::Acquire));
                let pos = if op.send { w } else { r };
                let room = if op.send { BOUNCE - (w - r) as usize } else { (w - r) as usize };
                let (ring, till_wrap) = pr.bounce(pos);
                let len = room.min(till_wrap).min(op.bytes - at);
                if len == 0 {
                    break;
                }
                // SAFETY: [ring, ring + len) is this side's part of the bounce ring (the
                // counters hand it over); the call's buffer holds `bytes` from its start.
                unsafe {
                    if op.send {
                        copy_out(ring, op.c.send.add(at), len, dev, op.c.stream)?;
                        pr.written().store(w + len as u64, Ordering::Release);
                    } else {
                        copy_in(op.target().add(at), ring, len, dev, op.c.stream)?;
                        pr.read().store(r + len as u64, Ordering::Release);
                    }
                }
                at += len;
            }
            op.st = St::Move(at);
            if at == op.bytes {
                if op.send {
                    op.st = St::Ack;
                } else {
                    op.finish(&pr);
                }
            }
        }
        if op.st == St::Ack && pr.s_done().load(Ordering::Acquire) > k {
            op.st = St::Done;
        }
        Ok(op.st != before)
    }

    /// The sender's buffer in this process: its own address in the sender's (a thread
    /// rank of this process), else this context's mapping of its allocation.
    fn map_source(&self, s: &SendRec, ctx: cuda::Ctx) -> Result<usize> {
        if s.pid == std::process::id() {
            return Ok(s.ptr as usize);
        }
        let _g = cuda::CtxGuard::enter(ctx)?;
        let mut gone = Vec::new();
        if let Ok(ctl) = &self.ctl {
            let m = &mut *self.mapped();
            m.freed.apply(ctl, self.rank, &self.pids, ctx, &mut m.maps, &mut gone);
        }
        let owner: Owner = (s.pid, (s.ptr - s.off) as usize);
        let base = self.mapped().maps.open(ctx, owner, &s.handle, &mut gone);
        self.defer_close(gone);
        Ok(base.map_err(|e| e.context("mapping a sender's buffer for fcclRecv"))? + s.off as usize)
    }

    /// Puts the GPU-to-GPU pairs of the run on the streams (ranks in separate
    /// processes), then the gated receives' copies into their buffers.
    fn enqueue(&self, run: &Run<'_>, inner: &mut Inner) -> Result<()> {
        let device: Vec<&Op<'_>> = run.ops.iter().filter(|o| o.verdict == Some(Verdict::Device)).collect();
        if !device.is_empty() && !self.synced {
            self.enqueue_device(&device, inner)?;
        }
        for o in run.ops.iter().filter(|o| !o.send && matches!(o.verdict, Some(Verdict::Device | Verdict::Bounce))) {
            match &o.gated {
                Some(Tmp::Host(v)) => {
                    // SAFETY: every send of the run is done (bounced, or copied and
                    // synchronised by its receiver): the buffer is free; v holds `bytes`.
                    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), o.c.recv, o.bytes) }
                }
                Some(Tmp::Device(t)) => {
                    let _g = cuda::CtxGuard::enter(o.ctx)?;
                    // SAFETY: on the stream after the waits for the run's sends (above):
                    // the buffer is free once the stream gets here; the scratch is freed
                    // in stream order after the copy.
                    unsafe { cuda::copy_dtod_async(o.c.recv, t.ptr(), o.bytes, o.c.stream)? }
                }
                None => {}
            }
        }
        Ok(())
    }

    fn enqueue_device(&self, device: &[&Op<'_>], inner: &mut Inner) -> Result<()> {
        let Some(Ok(reg)) = &inner.reg else {
            return Err(Error::internal("a send/recv on the streams without the control region registered"));
        };
        let ctl = &reg.ctl;
        let me = self.rank;
        let _g = cuda::CtxGuard::enter(reg.ctx)?;
        let mut targets = Vec::with_capacity(2 * device.len());
        let v = |o: &Op<'_>| (o.slot + 1) as u32;
        // SAFETY: (the stream operations and copies below) the words are registered in
        // this context and outlive the streams' use of them (Drop waits for every
        // target); the sender's buffer stays mapped until the GPU finished this call
        // (closing waits for it) and its owner keeps it until its stream passed
        // `recvd`; the receive buffer (or its scratch) is the call's.
        unsafe {
            for o in device.iter().filter(|o| o.send) {
                cuda::stream_write(o.c.stream, reg.dev(ctl.sent(me, o.peer)), v(o))?;
                targets.push(Target { w: ctl.sent(me, o.peer), v: v(o), writer: me });
            }
            for o in device.iter().filter(|o| !o.send) {
                cuda::stream_wait_geq(o.c.stream, reg.dev(ctl.sent(o.peer, me)), v(o))?;
                // A kernel that does nothing once the communicator failed: nothing of a
                // sender that died is read after its death is known.
                let Placement::Device { device: dev, .. } = o.c.placement else {
                    return Err(Error::internal("a receive on the streams into host memory"));
                };
                let cp = cuda_reduce::copiers(reg.ctx, dev)?;
                cp.copy(o.target(), o.src as *const u8, o.bytes, reg.dev(Ctl::FAILED).raw(), o.c.stream)?;
                cuda::stream_write(o.c.stream, reg.dev(ctl.recvd(o.peer, me)), v(o))?;
                targets.push(Target { w: ctl.sent(o.peer, me), v: v(o), writer: o.peer });
                targets.push(Target { w: ctl.recvd(o.peer, me), v: v(o), writer: me });
            }
            for o in device.iter().filter(|o| o.send) {
                cuda::stream_wait_geq(o.c.stream, reg.dev(ctl.recvd(me, o.peer)), v(o))?;
                targets.push(Target { w: ctl.recvd(me, o.peer), v: v(o), writer: o.peer });
            }
        }
        let what = match device.len() {
            1 => format!("device {}", describe(device[0].c)),
            n => format!("device {} and {} more send/recv", describe(device[0].c), n - 1),
        };
        self.watch.pending(&targets, Instant::now() + self.timeout, what);
        Ok(())
    }
}

impl Op<'_> {
    /// Writes this side's record if its slot is free; true when it did.
    fn post(&mut self, ctl: &Ctl, me: usize) -> bool {
        if self.st != St::Post {
            return false;
        }
        let k = self.slot;
        if self.send {
            let pr = ctl.pair(me, self.peer);
            if k >= pr.s_done().load(Ordering::Acquire) + SLOTS {
                return false;
            }
            pr.put_send(k, &self.rec);
        } else {
            let pr = ctl.pair(self.peer, me);
            if k >= pr.r_read().load(Ordering::Acquire) + SLOTS {
                return false;
            }
            pr.put_recv(k, &RecvRec { bytes: self.bytes as u64, device: self.device.is_ok(), captured: self.captured });
        }
        self.st = St::Match;
        true
    }

    /// Done with the slot: a receiver tells the sender.
    fn finish(&mut self, pr: &Pair<'_>) {
        if !self.send {
            pr.s_done().store(self.slot + 1, Ordering::Release);
        }
        self.st = St::Done;
    }
}

/// Whether the stream of a call on device memory is being captured into a CUDA graph (a
/// call on host memory never touches its stream).
fn stream_captured(c: &Coll) -> Result<bool> {
    match c.placement {
        Placement::Device { ctx, .. } => {
            let _g = cuda::CtxGuard::enter(ctx)?;
            super::super::capture::capturing(c.stream)
        }
        Placement::Host => Ok(false),
    }
}

/// "fcclSend of 37 x float32 to rank 1", for messages.
fn describe(c: &Coll) -> String {
    let (name, dir) = if c.kind == CollKind::Send { ("fcclSend", "to") } else { ("fcclRecv", "from") };
    format!("{name} of {} x {} {dir} rank {}", c.count, c.dtype, c.peer)
}

fn algo_of(run: &Run<'_>) -> Algo {
    let has = |v: Verdict| run.ops.iter().any(|o| o.verdict == Some(v));
    match (has(Verdict::Device), has(Verdict::Bounce)) {
        (true, false) => Algo::P2pPull,
        (true, true) => Algo::P2pPullBounce,
        (false, true) => Algo::P2pBounce,
        (false, false) if has(Verdict::Captured) => Algo::Refused,
        (false, false) => Algo::P2pMismatch,
    }
}

/// Spins briefly, then yields, then sleeps a little longer each time.
fn backoff(idle: u32) {
    if idle < 64 {
        std::hint::spin_loop();
    } else if idle < 256 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros((idle as u64 - 255).min(200)));
    }
}

/// Copies `len` bytes of a call's buffer (`dev`: device memory) into host memory.
///
/// # Safety
/// Both ranges are valid for `len`; the stream has finished the work before the call.
unsafe fn copy_out(dst: *mut u8, src: *const u8, len: usize, dev: bool, stream: cuda::Stream) -> Result<()> {
    if dev {
        // SAFETY: per the caller; synchronised before the bytes are published.
        unsafe { cuda::copy_dtoh_async(dst, src, len, stream)? };
        cuda::sync(stream)
    } else {
        // SAFETY: per the caller; host memory of this process.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        Ok(())
    }
}

/// Copies `len` bytes of host memory into a call's buffer (`dev`: device memory).
///
/// # Safety
/// As [`copy_out`].
unsafe fn copy_in(dst: *mut u8, src: *const u8, len: usize, dev: bool, stream: cuda::Stream) -> Result<()> {
    if dev {
        // SAFETY: per the caller; synchronised before the ring's bytes are handed back.
        unsafe { cuda::copy_htod_async(dst, src, len, stream)? };
        cuda::sync(stream)
    } else {
        // SAFETY: per the caller.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        Ok(())
    }
}

/// A send to this rank itself into the matching receive: on the receive's stream
/// where both are device memory, else through the host once both streams are done.
///
/// # Safety
/// `s.send` and `r.recv` are valid for `bytes` until the stream(s) ran the copy.
unsafe fn copy_self(s: &Coll, r: &Coll, bytes: usize) -> Result<()> {
    let dev = |c: &Coll| match c.placement {
        Placement::Device { ctx, .. } => Some(ctx),
        Placement::Host => None,
    };
    let (src, dst) = (s.send, r.recv);
    let overlap = (src as usize) < dst as usize + bytes && (dst as usize) < src as usize + bytes;
    match (dev(s), dev(r)) {
        (Some(a), Some(b)) if a == b => {
            let _g = cuda::CtxGuard::enter(b)?;
            if s.stream != r.stream {
                cuda::sync(s.stream)?;
            }
            if std::ptr::eq(src, dst) {
                return Ok(());
            }
            if !overlap {
                // SAFETY: per the caller.
                return unsafe { cuda::copy_dtod_async(dst, src, bytes, r.stream) };
            }
            // Overlapping ranges go through a copy of the source (freed in stream order).
            let tmp = cuda::Scratch::new(bytes, b, r.stream)?;
            // SAFETY: per the caller; the scratch holds `bytes`.
            unsafe {
                cuda::copy_dtod_async(tmp.ptr(), src, bytes, r.stream)?;
                cuda::copy_dtod_async(dst, tmp.ptr(), bytes, r.stream)
            }
        }
        (ds, dr) => {
            for (c, ctx) in [(s, ds), (r, dr)] {
                if let Some(ctx) = ctx {
                    let _g = cuda::CtxGuard::enter(ctx)?;
                    cuda::sync(c.stream)?;
                }
            }
            let mut tmp =
                host_copy(bytes, "the payload of an fcclSend to this rank itself, between host and device memory")?;
            // SAFETY: per the caller; tmp holds `bytes`; both streams are idle.
            unsafe {
                match ds {
                    Some(ctx) => {
                        let _g = cuda::CtxGuard::enter(ctx)?;
                        copy_out(tmp.as_mut_ptr(), src, bytes, true, s.stream)?;
                    }
                    None => copy_out(tmp.as_mut_ptr(), src, bytes, false, cuda::Stream::DEFAULT)?,
                }
                match dr {
                    Some(ctx) => {
                        let _g = cuda::CtxGuard::enter(ctx)?;
                        copy_in(dst, tmp.as_ptr(), bytes, true, r.stream)
                    }
                    None => copy_in(dst, tmp.as_ptr(), bytes, false, cuda::Stream::DEFAULT),
                }
            }
        }
    }
}

/// `bytes` of host memory for `what`, or fcclSystemError saying what to do.
fn host_copy(bytes: usize, what: &str) -> Result<Vec<u8>> {
    crate::mem::fallible::zeroed(bytes).map(Vec::from).ok_or_else(|| {
        crate::mem::fallible::out_of_memory(
            bytes,
            format_args!("host memory for {what}"),
            "send less per call, or use buffers that do not overlap",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_reach_the_same_verdict() {
        assert_eq!(verdict(8, 8, true, true), Verdict::Device);
        assert_eq!(verdict(8, 8, true, false), Verdict::Bounce);
        assert_eq!(verdict(8, 8, false, true), Verdict::Bounce);
        assert_eq!(verdict(8, 12, true, true), Verdict::Mismatch, "sizes first");
        assert_eq!(verdict(0, 4, false, false), Verdict::Mismatch);
    }
}
