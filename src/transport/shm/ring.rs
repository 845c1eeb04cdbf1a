//! One single-producer/single-consumer ring in a segment, seen from its writer or
//! its reader.
//!
//! A ring's `head` (bytes written) and `tail` (bytes read) only grow; both are
//! multiples of 8 so that elements of up to 8 bytes never straddle the wrap point.
//! The writer publishes its head with a Release store, the reader its tail; each
//! side reads the other's with Acquire, so the bytes between them belong to one side
//! at a time. Waking the other side is the link's business (see `link`).

use super::segment::{Segment, OFF_HEAD, OFF_TAIL, RING_CTRL_BYTES};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One end of a ring: the segment that holds it, its control page and its bytes.
pub(super) struct RingEnd {
    /// Keeps the mapping alive while the raw pointers below are in use.
    _seg: Arc<Segment>,
    /// The control page (see `segment`'s ring words).
    pub(super) ctrl: *mut u8,
    head: *const AtomicU64,
    tail: *const AtomicU64,
    data: *mut u8,
    pub(super) size: usize,
}

// SAFETY: the pointers point into `seg`, which the Arc keeps alive; the SPSC
// protocol gives each end exclusive use of the regions it touches.
unsafe impl Send for RingEnd {}

impl RingEnd {
    /// The ring that rank `slot` writes into `seg`.
    pub(super) fn new(seg: Arc<Segment>, slot: usize) -> RingEnd {
        let ctrl = seg.ring_ctrl(slot);
        let (head, tail) = (seg.ring_head(slot) as *const AtomicU64, seg.ring_tail(slot) as *const AtomicU64);
        // SAFETY: the ring's bytes follow its control page inside the mapping (segment_bytes).
        let data = unsafe { ctrl.add(RING_CTRL_BYTES) };
        let size = seg.ring_bytes();
        debug_assert!(
            std::ptr::eq(head, seg.ring_word(slot, OFF_HEAD)) && std::ptr::eq(tail, seg.ring_word(slot, OFF_TAIL))
        );
        RingEnd { _seg: seg, ctrl, head, tail, data, size }
    }

    /// Word `off` of the control page (one of `segment`'s ring `OFF_` constants).
    pub(super) fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= RING_CTRL_BYTES && off % 8 == 0);
        // SAFETY: inside the ring's control page, aligned, only accessed atomically.
        unsafe { &*(self.ctrl.add(off) as *const AtomicU64) }
    }

    pub(super) fn head(&self) -> &AtomicU64 {
        // SAFETY: valid for the life of seg; only accessed atomically.
        unsafe { &*self.head }
    }

    pub(super) fn tail(&self) -> &AtomicU64 {
        // SAFETY: as above.
        unsafe { &*self.tail }
    }
}

/// The writer's end of a ring.
pub(super) struct Writer {
    pub(super) ring: RingEnd,
    /// Bytes written (we are the only writer of the head).
    head: u64,
    /// The reader's position as last loaded: it only grows, so the free space it
    /// implies is a lower bound. While that bound is at least half the ring, `space`
    /// does not load the position again: the reader writes it at every read, and
    /// loading it would take that cache line back from the reader's core.
    tail: u64,
}

impl Writer {
    pub(super) fn new(ring: RingEnd) -> Writer {
        let head = ring.head().load(Ordering::Acquire);
        let tail = ring.tail().load(Ordering::Acquire);
        Writer { ring, head, tail }
    }

    /// Contiguous free space at the write position.
    #[inline]
    pub(super) fn space(&mut self) -> &mut [u8] {
        let size = self.ring.size;
        if ((self.head - self.tail) as usize) > size / 2 {
            self.tail = self.ring.tail().load(Ordering::Acquire);
        }
        let used = (self.head - self.tail) as usize;
        let free = size - used;
        let pos = (self.head % size as u64) as usize;
        let n = free.min(size - pos);
        // SAFETY: [pos, pos+n) is free ring space that the reader does not touch
        // until we publish a head past it.
        unsafe { std::slice::from_raw_parts_mut(self.ring.data.add(pos), n) }
    }

    /// Publishes `n` more bytes (the caller wakes the reader).
    #[inline]
    pub(super) fn commit(&mut self, n: usize) {
        self.head += n as u64;
        self.ring.head().store(self.head, Ordering::Release);
    }

    /// When the reader has read everything and the write position is at least `min`
    /// bytes in, the bytes up to the ring's start (see `Link::rewind_gap`).
    pub(super) fn rewind_gap(&mut self, min: usize) -> Option<usize> {
        let size = self.ring.size;
        let pos = (self.head % size as u64) as usize;
        if pos < min.max(1) || self.ring.tail().load(Ordering::Acquire) != self.head {
            return None;
        }
        // The tail just read: a cached one from before the last wrap would make
        // `space` offer less than the gap, and the skip go out in two pieces.
        self.tail = self.head;
        Some(size - pos)
    }
}

/// The reader's end of a ring.
pub(super) struct Reader {
    pub(super) ring: RingEnd,
    /// Bytes read (we are the only writer of the tail).
    tail: u64,
}

impl Reader {
    pub(super) fn new(ring: RingEnd) -> Reader {
        let tail = ring.tail().load(Ordering::Acquire);
        Reader { ring, tail }
    }

    /// Contiguous bytes published at the read position.
    #[inline]
    pub(super) fn avail(&mut self) -> &[u8] {
        let size = self.ring.size;
        let head = self.ring.head().load(Ordering::Acquire);
        let avail = (head - self.tail) as usize;
        let pos = (self.tail % size as u64) as usize;
        let n = avail.min(size - pos);
        // SAFETY: [pos, pos+n) was published by the writer (Acquire on head) and
        // is not rewritten until we publish a tail past it.
        unsafe { std::slice::from_raw_parts(self.ring.data.add(pos), n) }
    }

    /// Releases `n` more bytes to the writer (the caller wakes it).
    #[inline]
    pub(super) fn commit(&mut self, n: usize) {
        self.tail += n as u64;
        self.ring.tail().store(self.tail, Ordering::Release);
    }
}
