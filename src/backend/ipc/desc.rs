//! The descriptor every rank sends the others before a collective on the GPU-to-GPU
//! path: whether it takes part, its process, its two buffers, what it called and, for
//! calls with per-rank counts, its arrays.
//!
//! Layout (little-endian, fixed for a communicator of `n` ranks and a call kind):
//!
//! | bytes | field |
//! |---|---|
//! | 1 | [`Part`]: 0 cannot take part, 1 takes part, 2 its stream is being captured |
//! | 1 | 1 when the rank posts later calls' descriptors instead of agreeing on them |
//! | 4 | the rank's process id |
//! | 80 | the send buffer: IPC handle (64), offset in its allocation (8), address (8) |
//! | 80 | the receive buffer, likewise (all zero where the extent is empty) |
//! | `fingerprint::ONE_BYTES` | the call's fingerprint ([`fingerprint::one`]) |
//! | 32 n | per-rank counts only: sendcounts, sdispls, recvcounts, rdispls, n u64 each |

use crate::coll::{fingerprint, VCounts};
use crate::error::{Error, Result};

/// Bytes of an IPC handle (`CUipcMemHandle`, or the VMM path's stand-in).
const HANDLE: usize = 64;
/// Bytes of one buffer's record: handle, offset, address.
const BUF: usize = HANDLE + 8 + 8;
/// Where the fingerprint starts.
const FP: usize = 2 + 4 + 2 * BUF;
/// Bytes before the per-rank counts.
const FIXED: usize = FP + fingerprint::ONE_BYTES;
// A descriptor fits a posted slot of the control region at every rank count.
const _: () = assert!(FIXED <= super::ctl::post_capacity(0));

/// How a rank takes part in a call (the descriptor's first byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Part {
    /// It cannot take the call GPU to GPU: every rank stages it.
    Cannot = 0,
    /// It takes part.
    Takes = 1,
    /// Its stream is being captured into a CUDA graph: the call fails on every rank
    /// (see `capture`).
    Captured = 2,
}

/// One of a rank's buffers as its peers map it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Buf {
    /// The IPC handle of the allocation that holds it.
    pub handle: [u8; HANDLE],
    /// Its offset in that allocation.
    pub offset: u64,
    /// Its address in its owner's process; 0 where the extent is empty.
    pub addr: u64,
}

impl Buf {
    /// No buffer (an empty extent, or a rank that does not take part).
    pub const NONE: Buf = Buf { handle: [0; HANDLE], offset: 0, addr: 0 };
}

/// A rank's descriptor of one call.
#[derive(Clone, Debug)]
pub(super) struct Desc {
    pub part: Part,
    /// This rank would post later calls' descriptors (`posts`) rather than agree on them.
    pub posts: bool,
    pub pid: u32,
    /// The send buffer, then the receive buffer.
    pub bufs: [Buf; 2],
    /// What this rank called.
    pub fp: [u8; fingerprint::ONE_BYTES],
    /// The rank's four arrays, for calls with per-rank counts (else None).
    pub counts: Option<VCounts>,
}

impl Desc {
    /// A descriptor of a rank of this process with no buffers.
    pub fn new(part: Part, fp: [u8; fingerprint::ONE_BYTES], counts: Option<VCounts>) -> Desc {
        Desc { part, posts: false, pid: std::process::id(), bufs: [Buf::NONE; 2], fp, counts }
    }

    /// Bytes of a descriptor among `n` ranks, with per-rank counts or not.
    pub fn size(n: usize, per_rank: bool) -> usize {
        FIXED + if per_rank { 32 * n } else { 0 }
    }

    /// The bytes of this descriptor among `n` ranks (missing count entries as 0).
    pub fn encode(&self, n: usize) -> Vec<u8> {
        let mut b = Vec::with_capacity(Desc::size(n, self.counts.is_some()));
        b.push(self.part as u8);
        b.push(self.posts as u8);
        b.extend_from_slice(&self.pid.to_le_bytes());
        for f in &self.bufs {
            b.extend_from_slice(&f.handle);
            b.extend_from_slice(&f.offset.to_le_bytes());
            b.extend_from_slice(&f.addr.to_le_bytes());
        }
        b.extend_from_slice(&self.fp);
        if let Some(v) = &self.counts {
            for a in [v.sendcounts(), v.sdispls(), v.recvcounts(), v.rdispls()] {
                for r in 0..n {
                    b.extend_from_slice(&(a.get(r).copied().unwrap_or(0) as u64).to_le_bytes());
                }
            }
        }
        b
    }

    /// A descriptor from its bytes among `n` ranks; an error naming what is wrong when
    /// they are not one (another length, an unknown first byte).
    pub fn decode(b: &[u8], n: usize, per_rank: bool) -> Result<Desc> {
        let want = Desc::size(n, per_rank);
        if b.len() != want {
            return Err(Error::internal(format!(
                "a device-path descriptor of {} bytes, not {want} ({n} ranks{})",
                b.len(),
                if per_rank { ", per-rank counts" } else { "" }
            )));
        }
        let part = match b[0] {
            0 => Part::Cannot,
            1 => Part::Takes,
            2 => Part::Captured,
            x => {
                return Err(Error::internal(format!("a device-path descriptor whose first byte is {x}, not 0, 1 or 2")))
            }
        };
        let posts = b[1] != 0;
        let mut r = Reader { b, at: 2 };
        let pid = u32::from_le_bytes(r.take());
        let mut bufs = [Buf::NONE; 2];
        for f in &mut bufs {
            *f = Buf { handle: r.take(), offset: u64::from_le_bytes(r.take()), addr: u64::from_le_bytes(r.take()) };
        }
        let fp = r.take();
        let counts = per_rank.then(|| {
            let mut a = || -> Vec<usize> { (0..n).map(|_| u64::from_le_bytes(r.take()) as usize).collect() };
            let (sc, sd, rc, rd) = (a(), a(), a(), a());
            VCounts::new(&sc, &sd, &rc, &rd)
        });
        Ok(Desc { part, posts, pid, bufs, fp, counts })
    }
}

/// Fixed-size fields read in order from bytes whose length was checked.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        // Lengths were checked against `Desc::size`: a short slice leaves zeros, never panics.
        if let Some(s) = self.b.get(self.at..self.at + N) {
            out.copy_from_slice(s);
        }
        self.at += N;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(per_rank: bool) -> Desc {
        let mut fp = [0u8; fingerprint::ONE_BYTES];
        fp.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8 ^ 0x5a);
        let mut h = [0u8; HANDLE];
        h.iter_mut().enumerate().for_each(|(i, x)| *x = 200 - i as u8);
        Desc {
            part: Part::Takes,
            posts: per_rank,
            pid: 0x1234_5678,
            bufs: [Buf { handle: h, offset: 4096, addr: 0x7f00_0000_1000 }, Buf::NONE],
            fp,
            counts: per_rank.then(|| VCounts::new(&[1, 2, 3], &[0, 1, 3], &[4, 5, 6], &[0, 4, 9])),
        }
    }

    fn same(a: &Desc, b: &Desc) -> bool {
        let arrays = |d: &Desc| {
            d.counts.as_ref().map(|v| [v.sendcounts(), v.sdispls(), v.recvcounts(), v.rdispls()].map(|a| a.to_vec()))
        };
        a.part == b.part
            && a.posts == b.posts
            && a.pid == b.pid
            && a.bufs == b.bufs
            && a.fp == b.fp
            && arrays(a) == arrays(b)
    }

    #[test]
    fn round_trips() {
        for per_rank in [false, true] {
            let d = sample(per_rank);
            let b = d.encode(3);
            assert_eq!(b.len(), Desc::size(3, per_rank));
            let back = Desc::decode(&b, 3, per_rank).expect("decodes");
            assert!(same(&d, &back), "{d:?} came back as {back:?}");
        }
        for part in [Part::Cannot, Part::Captured] {
            let d = Desc::new(part, [7; fingerprint::ONE_BYTES], None);
            let back = Desc::decode(&d.encode(2), 2, false).expect("decodes");
            assert!(same(&d, &back));
            assert_eq!(back.pid, std::process::id());
        }
    }

    #[test]
    fn truncated_or_garbled_is_an_error() {
        let b = sample(true).encode(3);
        for len in [0, 1, 5, FP, FIXED, b.len() - 1] {
            let e = Desc::decode(&b[..len], 3, true).expect_err("truncated");
            assert!(e.msg.contains(&format!("{len} bytes")), "{}", e.msg);
        }
        let mut long = b.clone();
        long.push(0);
        assert!(Desc::decode(&long, 3, true).is_err());
        // Counts expected but absent, or present but not expected.
        assert!(Desc::decode(&sample(false).encode(3), 3, true).is_err());
        assert!(Desc::decode(&b, 3, false).is_err());
        let mut garbled = b.clone();
        garbled[0] = 9;
        let e = Desc::decode(&garbled, 3, true).expect_err("unknown first byte");
        assert!(e.msg.contains("first byte is 9"), "{}", e.msg);
    }
}
