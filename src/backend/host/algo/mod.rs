//! Each collective as a schedule of sends, receives and local steps over the
//! transport, one file per collective (its v-form beside it). [`build`] picks the
//! file; steps name places in the caller's buffers through [`Buf::at`], which
//! checks each region against the buffer once. See docs/design/host.md,
//! "Algorithms".

mod all_gather;
mod all_reduce;
mod all_to_all;
pub mod all_to_allv;
mod barrier;
mod broadcast;
mod gather;
mod reduce;
mod reduce_scatter;
mod scatter;
mod send_recv;

pub use all_reduce::wire_window_elems;
pub use all_to_allv::alltoallv_agree;

use super::engine::{Schedule, Sink};
use super::plan;
use crate::coll::{Coll, CollKind};
use crate::error::Result;
use crate::mem::{fallible, pool::PooledBuf};
use crate::types::DataType;

/// Bytes `co` writes into this rank's recvbuff.
pub fn recv_bytes(co: &Coll, n: usize) -> usize {
    let bytes = co.count * co.dtype.size();
    match co.kind {
        CollKind::AllGather | CollKind::Gather | CollKind::AlltoAll => n * bytes,
        CollKind::AlltoAllv | CollKind::AllGatherV => {
            co.v.as_ref().map_or(0, |v| v.recvcounts().iter().sum::<usize>() * co.dtype.size())
        }
        _ => bytes,
    }
}

/// How data received into user buffers is written: streaming for large calls.
fn out_sink(dst: *mut u8, stream: bool) -> Sink {
    if stream {
        Sink::Stream(dst)
    } else {
        Sink::Copy(dst)
    }
}

/// Scratch buffers that must outlive a schedule's run (pooled: see `mem::pool`).
#[derive(Default)]
pub struct Scratch {
    bufs: Vec<PooledBuf>,
}

impl Scratch {
    /// A buffer of at least `bytes` whose address stays fixed until the scratch is
    /// dropped. Its contents are unspecified: every user writes before reading. Fails
    /// when there is no memory for it: the call has been counted on this rank and its
    /// peers may have begun it, so the communicator cannot be used any more.
    pub fn alloc(&mut self, bytes: usize) -> Result<*mut u8> {
        let mut b = PooledBuf::try_take(bytes).ok_or_else(|| {
            fallible::out_of_memory(
                bytes,
                "scratch for the host algorithm",
                "lower the host plan's segment or window (FERROCCL_HOST_PLAN seg_bytes, wire_window) or the count; the communicator is unusable now: destroy it",
            )
        })?;
        let p = b.as_mut_ptr();
        self.bufs.push(b);
        Ok(p)
    }

    /// [`Scratch::alloc`] as a [`Buf`] of exactly `bytes`.
    fn buf(&mut self, bytes: usize) -> Result<Buf> {
        let p = self.alloc(bytes)?;
        // SAFETY: the scratch owns the memory until it is dropped, after the run.
        Ok(unsafe { Buf::new(p, bytes) })
    }
}

/// A buffer of the run (a caller's, or scratch) as its start and the bytes the call
/// may touch there, so that a step names a region by offset and length and the bounds
/// are checked in one place.
#[derive(Clone, Copy)]
struct Buf {
    base: *mut u8,
    len: usize,
}
// SAFETY: a Buf is only made over memory that outlives the run and whose steps the
// schedule orders (`Buf::new`), so a step may carry it to the thread that runs it.
unsafe impl Send for Buf {}

impl Buf {
    /// # Safety
    /// `base` must be valid for reads and writes of `len` bytes until the run ends (a
    /// caller's buffer of that length, validated, or the run's scratch), and the
    /// schedule must order every step that writes a region against the others that
    /// touch it (steps run in dependency order), so that regions given out by
    /// [`Buf::bytes`] and [`Buf::bytes_mut`] never alias a live `&mut`.
    unsafe fn new(base: *mut u8, len: usize) -> Buf {
        Buf { base, len }
    }

    /// No bytes: what a slot that a call does not use holds.
    fn empty() -> Buf {
        Buf { base: std::ptr::NonNull::dangling().as_ptr(), len: 0 }
    }

    /// The `len` bytes at `off` as a buffer of their own (checked as [`Buf::at`]).
    fn sub(&self, off: usize, len: usize) -> Buf {
        Buf { base: self.at(off, len), len }
    }

    /// The `len` bytes at `off`, read by a step (checked as [`Buf::at`]).
    fn bytes<'a>(self, off: usize, len: usize) -> &'a [u8] {
        let p = self.at(off, len);
        // SAFETY: inside the buffer (at), valid and unaliased by a writer (Buf::new's contract).
        unsafe { std::slice::from_raw_parts(p, len) }
    }

    /// The `len` bytes at `off`, written by a step (checked as [`Buf::at`]).
    fn bytes_mut<'a>(self, off: usize, len: usize) -> &'a mut [u8] {
        let p = self.at(off, len);
        // SAFETY: inside the buffer (at); this step is the region's only user now (Buf::new's contract).
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }

    /// The start of the `len` bytes at `off`, which must lie inside the buffer (the
    /// call's validation guarantees it; a violation is a bug, not a user error).
    fn at(&self, off: usize, len: usize) -> *mut u8 {
        assert!(
            off.checked_add(len).is_some_and(|end| end <= self.len),
            "region of {len} bytes at {off} outside a buffer of {} bytes",
            self.len
        );
        self.base.wrapping_add(off)
    }
}

/// The balanced split the algorithms cut calls with (what a call means: in coll).
pub use crate::coll::part;

/// Segments of a chunk of `len` elements: (offset, len) pairs.
fn segments(len: usize, dtype: DataType) -> impl Iterator<Item = (usize, usize)> {
    let seg = (plan::get().seg_bytes / dtype.size()).max(1);
    (0..len.div_ceil(seg)).map(move |k| (k * seg, seg.min(len - k * seg)))
}

/// One collective as this rank builds its schedule: the call, where the rank
/// stands, and how results are written.
#[derive(Clone, Copy)]
struct Cx<'c> {
    co: &'c Coll,
    rank: usize,
    n: usize,
    send: *mut u8,
    recv: *mut u8,
    /// Bytes of one rank's block (count elements).
    bytes: usize,
    /// Large results are written with streaming stores (`mem::copy`).
    stream: bool,
    /// Copies into recvbuff stream too, unless it is still in cache (`reuse`).
    copies_stream: bool,
    /// Peers read this rank's recvbuff by address (single copy).
    recv_by_address: bool,
}

impl Cx<'_> {
    /// Where data received into `dst` in a user buffer is written.
    fn sink(&self, dst: *mut u8) -> Sink {
        out_sink(dst, self.copies_stream)
    }

    /// The peers of this rank, in rank order.
    fn peers(&self) -> impl Iterator<Item = usize> {
        let (rank, n) = (self.rank, self.n);
        (0..n).filter(move |&p| p != rank)
    }

    /// sendbuff as a [`Buf`] of `len` bytes, the extent the call's validation covers.
    fn send_buf(&self, len: usize) -> Buf {
        // SAFETY: the caller's sendbuff holds `len` bytes (validated) for the whole run.
        unsafe { Buf::new(self.send, len) }
    }

    /// recvbuff as a [`Buf`] of `len` bytes, the extent the call's validation covers.
    fn recv_buf(&self, len: usize) -> Buf {
        // SAFETY: the caller's recvbuff holds `len` bytes (validated) for the whole run.
        unsafe { Buf::new(self.recv, len) }
    }

    /// A local copy step (made in pieces between transfers) unless source and
    /// destination are the same.
    fn copy_local(&self, s: &mut Schedule<'_>, src: *mut u8, dst: *mut u8, bytes: usize) {
        copy_local(s, src, dst, bytes, self.copies_stream);
    }
}

/// Adds the steps of one collective (count > 0, validated) to `s`.
///
/// `recv_by_address`: this rank's peers read its recvbuff in place (single copy),
/// so a result written there is read again soon.
pub fn build(
    s: &mut Schedule<'_>,
    co: &Coll,
    rank: usize,
    n: usize,
    scratch: &mut Scratch,
    recv_by_address: bool,
    shares_memory: &dyn Fn(usize) -> bool,
) -> Result<()> {
    let (send, recv) = (co.send as *mut u8, co.recv);
    // Large results are written with streaming stores (FERROCCL_STREAM_MIN, see
    // `mem::copy`): they leave the caches before the caller reads them anyway. Not
    // for an in-place all_to_all, whose lines are in cache (docs/design/host.md).
    let stream = recv_bytes(co, n) >= crate::env::stream_min() && !(co.kind == CollKind::AlltoAll && send == recv);
    // Copies into a recvbuff that the previous call wrote, and that is small enough
    // to be in the caches still, keep ordinary stores (`reuse`). Reductions keep
    // `stream`, which also shapes their schedule.
    let copies_stream = stream && !super::reuse::cached(recv, recv_bytes(co, n));
    let bytes = co.count * co.dtype.size();
    let cx = Cx { co, rank, n, send, recv, bytes, stream, copies_stream, recv_by_address };
    match co.kind {
        CollKind::AllReduce => all_reduce::build(s, &cx, scratch, shares_memory),
        CollKind::ReduceScatter | CollKind::ReduceScatterV => reduce_scatter::build(s, &cx, scratch),
        CollKind::Reduce => reduce::build(s, &cx, scratch),
        CollKind::Broadcast => broadcast::build(s, &cx),
        CollKind::AllGather => all_gather::build(s, &cx),
        CollKind::AlltoAll => all_to_all::build(s, &cx),
        CollKind::AlltoAllv | CollKind::AllGatherV => all_to_allv::build(s, &cx),
        CollKind::Gather => gather::build(s, &cx),
        CollKind::Scatter => scatter::build(s, &cx),
        CollKind::Barrier => barrier::build(s, &cx),
        CollKind::Send | CollKind::Recv => send_recv::build(s, &cx),
    }
}

/// A local copy step (made in pieces between transfers) unless source and
/// destination are the same.
fn copy_local(s: &mut Schedule<'_>, src: *mut u8, dst: *mut u8, bytes: usize, stream: bool) {
    if src != dst && bytes > 0 {
        s.copy(src, dst, bytes, stream, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_range_exactly() {
        for count in [0usize, 1, 7, 1000003] {
            for n in 1..9 {
                let mut next = 0;
                for i in 0..n {
                    let (s, l) = part(count, n, i);
                    assert_eq!(s, next);
                    next += l;
                }
                assert_eq!(next, count);
            }
        }
    }

    /// Scratch there is no memory for is an error that says the communicator is done.
    #[test]
    fn scratch_without_memory_is_an_error() {
        crate::mem::fallible::FAIL_ABOVE.with(|f| f.set(1 << 20));
        let e = Scratch::default().alloc(crate::mem::pool::POOL_BYTES + 8).err();
        crate::mem::fallible::FAIL_ABOVE.with(|f| f.set(usize::MAX));
        let e = e.expect("no memory");
        assert_eq!(e.code, crate::error::Code::SystemError);
        assert!(e.msg.contains("unusable now: destroy it"), "{}", e.msg);
    }

    #[test]
    #[should_panic(expected = "outside a buffer")]
    fn a_region_past_the_buffer_is_refused() {
        let mut b = [0u8; 16];
        // SAFETY: b is 16 bytes and outlives the Buf.
        unsafe { Buf::new(b.as_mut_ptr(), 16) }.at(8, 9);
    }
}
