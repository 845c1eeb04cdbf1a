//! The message format of the host links: what the engine, the eager path (`eager`) and
//! the mapped path's descriptors (`mapped`) write into a peer's stream and read out of it.
//!
//! Every message is a 16-byte header (its kind, a flag byte, the tag of the call it
//! belongs to, and a length field), then its payload padded to a multiple of 8 bytes.
//! A direct message (sent by address) carries one or two 40-byte descriptors of the
//! sender's buffers instead of its payload. See docs/design/host.md, "Messages".

use crate::mem::shared;
use crate::transport::Link;

/// Bytes of a header.
pub const HDR: usize = 16;
/// Bytes of a buffer's descriptor: its address in the sender, and where it lies in
/// one of the sender's shared allocations (serial 0: none).
pub const DESC: usize = 40;
/// Tag of steps whose messages may belong to any collective (call fingerprints):
/// the receiver checks the content instead of the tag.
pub const ANY_TAG: u32 = u32::MAX;

/// A collective's message of `len` bytes through the stream.
pub const K_DATA: u8 = 1;
/// An fcclSend's count (the length field), ahead of a payload that waits for the
/// receiver's count.
pub const K_P2P_HDR: u8 = 2;
/// The receiver's count for its next fcclRecv from the peer, sent when the run that
/// receives starts (not when the sender's header arrives): in an exchange, where both
/// ranks send and receive, it travels while the data does, so the sender learns the
/// verdict without a round trip of its own. The flag says the receive is half of an
/// exchange in place that its rank can swap (see [`K_P2P_SWAP`]).
pub const K_P2P_REPLY: u8 = 3;
/// The payload of an fcclSend whose counts agreed.
pub const K_P2P_DATA: u8 = 4;
/// A collective message sent by address: the receiver reads it straight from the
/// sender's buffer and reports the read done through the link. The payload is a
/// descriptor; with the flag set, a second one follows: the sender's own destination
/// for the message (a broadcast root's recvbuff out of place), which whoever copies a
/// piece of the message writes too, so each piece is read once for both destinations.
pub const K_DIRECT: u8 = 5;
/// Skips the rest of the ring, unread and unwritten: the next message starts at the
/// ring's beginning (see `Link::rewind_gap`). Its length field is the gap after the header.
pub const K_SKIP: u8 = 6;
/// An fcclSend of at most `eager_max` bytes that cannot go by address: the count and
/// the payload in one message. The send is done when the receiver's count has come
/// too ([`K_P2P_REPLY`]), so a mismatch fails both sides, but the data does not wait.
pub const K_P2P_EAGER: u8 = 7;
/// The payload of a large fcclSend, sent by address as [`K_DIRECT`] is. The flag says
/// that receives of the sender's run wait for the receiver's read reports.
pub const K_P2P_DIRECT: u8 = 8;
/// An offer to exchange two blocks between the ranks' buffers (in-place all_to_all,
/// 2-rank all_reduce; see `engine::Exchange`): a direct message whose two descriptors
/// name the sender's block and its input (address 0 when it cannot exchange, the next
/// word then saying whether it is in place).
pub const K_SWAP: u8 = 9;
/// The payload of a large fcclSend whose buffer is also where the matching fcclRecv
/// from the same peer lands, when both ranks of the pair are in place and can swap:
/// an offer as [`K_SWAP`]'s, which the peer's fcclRecv takes as its payload.
pub const K_P2P_SWAP: u8 = 10;

/// Index of the flag byte in a header.
pub const FLAG: usize = 1;
/// Flag of a [`K_P2P_REPLY`]: the receive is half of an exchange in place that its rank
/// can swap (see [`K_P2P_SWAP`]).
pub const P2P_PAIR: u8 = 1;
/// Flag of a [`K_P2P_HDR`], [`K_P2P_EAGER`] or [`K_P2P_REPLY`]: its rank refused the call
/// (its stream is being captured into a CUDA graph; no count, no payload). The peer's
/// matching call fails at once, and so does the refused one.
pub const P2P_REFUSED: u8 = 2;

/// `n` rounded up to a multiple of 8: the stream's unit.
pub const fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// A message header: its kind, the tag of the call it belongs to, and its length
/// field (the payload's size, or the count a handshake announces); flag 0.
pub fn header(kind: u8, tag: u32, len: usize) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[0] = kind;
    h[4..8].copy_from_slice(&tag.to_le_bytes());
    h[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    h
}

/// The kind, tag and length field of a header (see [`header`]).
pub fn parse_header(h: &[u8; HDR]) -> (u8, u32, usize) {
    let tag = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
    (h[0], tag, u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")) as usize)
}

/// A descriptor naming `src`, in the shared allocation `shared` if any.
pub fn encode_desc(src: *const u8, shared: Option<shared::Desc>) -> [u8; DESC] {
    let mut d = [0u8; DESC];
    d[0..8].copy_from_slice(&(src as usize as u64).to_le_bytes());
    if let Some(r) = shared {
        d[8..16].copy_from_slice(&r.serial.to_le_bytes());
        d[16..24].copy_from_slice(&r.region_len.to_le_bytes());
        d[24..32].copy_from_slice(&r.offset.to_le_bytes());
        d[32..36].copy_from_slice(&r.fd.to_le_bytes());
        d[36..40].copy_from_slice(&r.epoch.to_le_bytes());
    }
    d
}

/// The sender's address and shared allocation named by a descriptor.
pub fn decode_desc(d: &[u8; DESC]) -> (u64, Option<shared::Desc>) {
    let word = |i: usize| u64::from_le_bytes(d[i..i + 8].try_into().unwrap());
    let serial = word(8);
    let desc = (serial != 0).then(|| shared::Desc {
        serial,
        region_len: word(16),
        offset: word(24),
        fd: i32::from_le_bytes(d[32..36].try_into().unwrap()),
        epoch: u32::from_le_bytes(d[36..40].try_into().unwrap()),
    });
    (word(0), desc)
}

/// Reads the incoming stream into `buf` from `*got` on, as far as bytes have
/// arrived (a fixed-size record may straddle the ring's wrap point); true when
/// any byte was taken.
pub fn gather(link: &mut dyn Link, buf: &mut [u8], got: &mut usize) -> bool {
    let start = *got;
    while *got < buf.len() {
        let avail = link.recv_avail();
        if avail.is_empty() {
            break;
        }
        let k = avail.len().min(buf.len() - *got);
        buf[*got..*got + k].copy_from_slice(&avail[..k]);
        link.recv_commit(k);
        *got += k;
    }
    *got > start
}
