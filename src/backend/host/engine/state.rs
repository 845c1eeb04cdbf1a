//! What a run keeps per peer: the message being written and the one being read,
//! the queues of steps waiting for each, and the direct messages waiting for the
//! peer's reads. Kept between runs (their memory, and the store choice per peer),
//! emptied at the start of each.

use super::super::msg::{DESC, HDR, K_DIRECT, K_P2P_DIRECT, K_P2P_SWAP, K_SKIP, K_SWAP};
use super::exchange::{Exchange, PeerInput, Side};
use super::schedule::Sink;
use crate::backend::host::plan::Plan;
use crate::mem::copy;
use crate::mem::pool::PooledBuf;
use crate::transport::{Link, Share};
use std::collections::VecDeque;

/// An outgoing message being written.
pub(super) struct Tx {
    pub(super) kind: u8,
    pub(super) tag: u32,
    /// The header's length field: the payload's size, or for a handshake the count announced.
    pub(super) announce: usize,
    pub(super) src: *const u8,
    /// Payload bytes that follow the header.
    pub(super) payload: usize,
    pub(super) step: Option<usize>,
    pub(super) written: usize,
    /// Payload carried in the message itself (a direct message's descriptor; a
    /// [`K_SWAP`] offer's two).
    pub(super) inline: [u8; 2 * DESC],
    /// Where the payload is copied as well, and whether with streaming stores.
    pub(super) tee: Option<(*mut u8, bool)>,
    /// Bytes of a direct message copied to `tee` so far (after the descriptor went).
    pub(super) tee_done: usize,
    /// A direct message: done once the peer reports it read (else once written: a
    /// swap offer on a link without read reports, which can never lead to a swap).
    pub(super) awaits_read: bool,
    /// The header's flag byte (see `msg::FLAG`).
    pub(super) flag: u8,
    /// The fcclSend step whose payload this is, when a receive of the run waits
    /// for it to leave its buffer (`inplace::InPlace`): its progress is recorded there.
    pub(super) progress: Option<usize>,
}

impl Tx {
    pub(super) fn data(kind: u8, tag: u32, src: *const u8, len: usize, step: Option<usize>) -> Tx {
        Tx {
            kind,
            tag,
            announce: len,
            src,
            payload: len,
            step,
            written: 0,
            inline: [0; 2 * DESC],
            tee: None,
            tee_done: 0,
            awaits_read: false,
            flag: 0,
            progress: None,
        }
    }
    pub(super) fn control(kind: u8, tag: u32, announce: usize) -> Tx {
        Tx { announce, payload: 0, ..Tx::data(kind, tag, std::ptr::null(), 0, None) }
    }
    /// Header of a skip over `gap` bytes (header included) to the ring's start.
    pub(super) fn skip(gap: usize) -> Tx {
        Tx::data(K_SKIP, 0, std::ptr::null(), gap - HDR, None)
    }
    /// A message of `len` bytes at `src` sent by address (`desc`); `tee`: also
    /// copied there by the sender while the peer reads it.
    pub(super) fn direct(
        kind: u8,
        tag: u32,
        src: *const u8,
        len: usize,
        step: usize,
        desc: [u8; DESC],
        tee: Option<(*mut u8, bool)>,
    ) -> Tx {
        let mut inline = [0; 2 * DESC];
        inline[..DESC].copy_from_slice(&desc);
        Tx { payload: DESC, step: Some(step), inline, tee, awaits_read: true, ..Tx::data(kind, tag, src, len, None) }
    }
    pub(super) fn is_direct(&self) -> bool {
        matches!(self.kind, K_DIRECT | K_P2P_DIRECT | K_SWAP | K_P2P_SWAP)
    }
}

/// Where a direct message's bytes are read from.
#[derive(Clone, Copy)]
pub(super) enum Source {
    /// Mapped here: ordinary loads.
    Ptr(*const u8),
    /// The sender's address, read with `Link::read_direct`.
    Remote(u64),
}

/// A direct message's descriptor as it arrives (it may wrap around the ring),
/// then where its bytes are.
pub(super) struct DirectRx {
    /// One descriptor, or a [`K_SWAP`] offer's two (its block's, then its input's).
    pub(super) desc: [u8; 2 * DESC],
    pub(super) want: usize,
    pub(super) got: usize,
    pub(super) src: Option<Source>,
}

impl DirectRx {
    /// For a message of `kind` whose header flag is `flag`.
    pub(super) fn new(kind: u8, flag: u8) -> DirectRx {
        let want = if kind == K_SWAP || (kind == K_DIRECT && flag != 0) { 2 * DESC } else { DESC };
        DirectRx { desc: [0; 2 * DESC], want, got: 0, src: None }
    }
}

/// This rank's side of an exchange that it reads the peer's offer for: its block
/// and input, and once the offer is read the peer's input.
#[derive(Clone, Copy)]
pub(super) struct RxSwap {
    pub(super) own: Side,
    pub(super) how: Exchange,
    pub(super) peer_input: PeerInput,
}

/// An incoming message being read, for step `step`.
pub(super) struct Rx {
    pub(super) step: usize,
    pub(super) len: usize,
    pub(super) sink: Sink,
    pub(super) read: usize,
    /// A direct message: its descriptor and source.
    pub(super) direct: Option<DirectRx>,
    /// A direct message copied with its sender: the slot, and whether every piece has been taken.
    pub(super) share: Option<(Share, bool)>,
    /// A swap offer: this rank's side of the exchange.
    pub(super) swap: Option<RxSwap>,
    /// An fcclRecv into a buffer that sends of the run read (see `inplace::InPlace`).
    pub(super) gated: bool,
    /// A direct fcclSend whose sender's receives wait for this rank's reads
    /// (`Link::report_read`), so this rank reports them piece by piece.
    pub(super) reports: bool,
    /// A gated receive of such a message: the bytes read ahead of the gate.
    pub(super) held: Option<Held>,
    /// The sender's own destination for the message, mapped here: each piece this
    /// rank copies goes there too (see [`K_DIRECT`]).
    pub(super) tee: Option<*mut u8>,
}

impl Rx {
    /// A message of `len` bytes for step `step` into `sink`, read from the stream;
    /// the other fields as the message kind needs them.
    pub(super) fn new(step: usize, len: usize, sink: Sink) -> Rx {
        Rx {
            step,
            len,
            sink,
            read: 0,
            direct: None,
            share: None,
            swap: None,
            gated: false,
            reports: false,
            held: None,
            tee: None,
        }
    }
}

/// The bytes of a gated direct message read out of the sender's buffer and not
/// yet written (see `Plan::gated_ahead`): offset `o` of the message is at
/// `o % gated_ahead` here.
pub(super) struct Held {
    pub(super) buf: PooledBuf,
    /// Bytes of the message written into the destination (all those below
    /// `Rx::read` are here or written).
    pub(super) written: usize,
}

/// How a sender helps copy its direct message into the receiver's buffer, once the
/// receiver offers a split copy (see `split`).
#[derive(Clone, Copy)]
pub(super) enum Help {
    /// Each piece copied into the receiver's destination.
    Copy,
    /// Each piece also into this rank's own destination (`stream`: with streaming
    /// stores), which the receiver writes with its pieces too (`split::tee_shared`).
    Tee { dst: *mut u8, stream: bool },
    /// A [`K_P2P_SWAP`] offer: pieces swapped.
    P2pSwap,
}

/// A direct message of ours that this rank helps copy into the receiver's buffer.
#[derive(Clone, Copy)]
pub(super) struct TxShare {
    /// The message's number on the link.
    pub(super) seq: u64,
    /// Where its receiver wants it, as written from here.
    pub(super) dst: *mut u8,
    pub(super) stream: bool,
}

#[derive(Default)]
pub(super) struct Peer {
    pub(super) cur_tx: Option<Tx>,
    pub(super) urgent: VecDeque<Tx>,
    pub(super) send_q: VecDeque<usize>,
    pub(super) data_rq: VecDeque<usize>,
    pub(super) p2p_rq: VecDeque<usize>,
    pub(super) awaiting_reply: VecDeque<usize>,
    /// Receivers' counts (K_P2P_REPLY) that came before this run started the send
    /// they answer.
    /// (count, whether flagged: see HDR_FLAG).
    pub(super) early_replies: VecDeque<(usize, u8)>,
    /// fcclSends to this peer in this run, and receivers' counts read for them.
    pub(super) p2p_sends: usize,
    pub(super) replies_read: usize,
    pub(super) awaiting_payload: VecDeque<usize>,
    pub(super) cur_rx: Option<Rx>,
    /// Direct messages sent so far, and the steps that wait for their reads.
    pub(super) direct_sent: u64,
    /// (step, message number, how this rank helps copy it).
    pub(super) direct_wait: VecDeque<(usize, u64, Help)>,
    /// Whether `direct_sent` has been read from the link in this run.
    pub(super) direct_started: bool,
    /// The split copy of our direct message that the peer offered, once looked up.
    pub(super) share: Option<TxShare>,
    /// How pieces are written into this peer's ring; kept across runs.
    pub(super) stores: copy::StoreChoice,
    /// Bytes this run sends to this peer, all messages together.
    pub(super) run_bytes: usize,
}

impl Peer {
    /// Before this run's first direct message: the link's read counter spans runs,
    /// and every earlier run waited for the reads of its own direct messages, so its
    /// value now is where this run's messages are counted from.
    pub(super) fn start_direct(&mut self, link: &mut dyn Link) {
        if !self.direct_started {
            self.direct_sent = link.memory().map_or(0, |m| m.reads_done());
            self.direct_started = true;
        }
    }

    /// Empties the queues (keeping their memory) for the next run, also after a run
    /// that ended in an error.
    pub(super) fn reset(&mut self) {
        self.cur_tx = None;
        self.cur_rx = None;
        self.urgent.clear();
        self.send_q.clear();
        self.data_rq.clear();
        self.p2p_rq.clear();
        self.awaiting_reply.clear();
        self.early_replies.clear();
        self.p2p_sends = 0;
        self.replies_read = 0;
        self.awaiting_payload.clear();
        self.direct_sent = 0;
        self.direct_wait.clear();
        self.direct_started = false;
        self.share = None;
        self.run_bytes = 0;
    }
}

/// How pieces of a message of `payload` bytes are written into a peer's ring when
/// the run sends `run_bytes` to that peer in all: from `ring_stream_max` on,
/// whichever [`copy::StoreChoice`] finds right for the peer now (the writer runs
/// far ahead: a large message, or the many segments of a large reduction);
/// otherwise streaming stores for messages from `ring_stream_min` and ordinary ones
/// below it.
pub(super) fn ring_streaming(plan: &Plan, stores: &mut copy::StoreChoice, payload: usize, run_bytes: usize) -> bool {
    if run_bytes >= plan.ring_stream_max {
        stores.choose()
    } else {
        payload >= plan.ring_stream_min
    }
}
