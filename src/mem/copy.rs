//! Host memory copies for data that will not be read again soon.
//!
//! A large collective writes its result once and returns: the caller reads it
//! later, if at all, and by then it has left the caches anyway. Ordinary stores
//! first read every destination line from memory (read for ownership) and then
//! write it back, so a copy into memory costs three transfers per line; streaming
//! (non-temporal) stores write whole lines without reading them, two transfers.
//! Measured on the 2-core development VM (AMD EPYC, data beyond the caches):
//! 15-16 GB/s into memory with ordinary stores, 22-23 GB/s streaming.

/// Copies `n` bytes from `src` to `dst` with ordinary stores: data that a peer or
/// the caller reads again soon (pieces of large messages in a ring, small results).
///
/// glibc's `memcpy` moves blocks of this size with `rep movsb`, which on the AMD
/// EPYC VMs we measure on ran at half the speed of plain vector loads and stores
/// when copying from memory into a ring (broadcast of 2 MiB, side by side: 6.5
/// against 13 GB/s), so large blocks take a vector loop here.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `n` bytes, and the two
/// ranges must not overlap.
#[inline]
pub unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: the caller's contract.
    unsafe { copy_with::<false>(dst, src, n) }
}

/// Copies `n` bytes from `src` to `dst` with streaming stores where the CPU has
/// them (AVX2), ordinary `memcpy` elsewhere. The stores are ordered (`sfence`)
/// before it returns, so a release store that follows publishes them.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `n` bytes, and the two
/// ranges must not overlap.
pub unsafe fn copy_streaming(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: the caller's contract.
    unsafe { copy_with::<true>(dst, src, n) }
}

/// [`copy_streaming`] when `streaming`, else [`copy`].
///
/// # Safety
/// As for [`copy`].
#[inline]
pub unsafe fn copy_stores(dst: *mut u8, src: *const u8, n: usize, streaming: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        if streaming {
            copy_streaming(dst, src, n)
        } else {
            copy(dst, src, n)
        }
    }
}

/// Chooses between ordinary and streaming stores for data that another CPU reads
/// next (ring pieces, board slots), from the writer's own timings.
///
/// Ordinary stores are right while the two CPUs share a die: the reader then takes
/// the lines from the shared cache. When they do not (the VM's host decides, and
/// changes it while a program runs), each ordinary store must first take its line
/// back from the reader's cache across the dies, and a whole transfer slows to
/// about 2 GB/s, while streaming stores, which go to memory, keep their speed. So
/// the writer times its copies (one clock read each, against microseconds of
/// copying) and streams while ordinary stores are more than [`Self::MARGIN`] times
/// slower; every 16th copy goes the other way, so both estimates stay current.
/// See docs/results/2026-11-24-host-performance.md ("Ring stores").
#[derive(Default)]
pub struct StoreChoice {
    /// Recent cost of ordinary and streaming copies, ns per KiB (0: not measured yet).
    ordinary: f32,
    streaming: f32,
    copies: u32,
}

impl StoreChoice {
    /// Streaming stores must be this many times faster for the writer before they
    /// are chosen: they also cost the reader, who then reads from memory instead
    /// of the shared cache.
    pub const MARGIN: f32 = 2.0;

    /// Whether the next copy should use streaming stores.
    pub fn choose(&mut self) -> bool {
        self.copies = self.copies.wrapping_add(1);
        let prefer = self.streaming > 0.0 && self.ordinary > Self::MARGIN * self.streaming;
        if self.copies % 16 == 0 {
            !prefer
        } else {
            prefer
        }
    }

    /// Copies `n` bytes with streaming stores or not, and records how long it took.
    ///
    /// # Safety
    /// As for [`copy`].
    pub unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, n: usize, streaming: bool) {
        let t0 = std::time::Instant::now();
        // SAFETY: the caller's contract.
        unsafe { copy_stores(dst, src, n, streaming) };
        self.record(streaming, n, t0.elapsed());
    }

    fn record(&mut self, streaming: bool, bytes: usize, took: std::time::Duration) {
        let v = took.as_nanos() as f32 * 1024.0 / bytes.max(1) as f32;
        let e = if streaming { &mut self.streaming } else { &mut self.ordinary };
        *e = if *e == 0.0 { v } else { *e + (v - *e) / 8.0 };
    }
}

/// The vector loop for blocks of 2 KiB and more where the CPU has AVX2, else `memcpy`.
///
/// # Safety
/// As for [`copy`].
#[inline]
unsafe fn copy_with<const STREAM: bool>(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if n >= 2048 && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the caller's contract, and the CPU has AVX2 (checked above).
            unsafe { vector_avx2::<STREAM>(dst, src, n) };
            return;
        }
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
}

/// The vector copy loop: 128 bytes per iteration, streaming stores if `STREAM`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn vector_avx2<const STREAM: bool>(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256, _mm256_stream_si256, _mm_sfence};
    // Streaming stores need 32-byte aligned destinations: copy up to the first
    // 64-byte boundary (a whole line) the ordinary way.
    let head = if STREAM { (dst as usize).wrapping_neg() & 63 } else { 0 };
    // SAFETY: callers pass n >= 2048 > head, so both ranges hold the head.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    let body_end = head + (n - head) / 128 * 128;
    while i < body_end {
        // SAFETY: [i, i+128) lies inside both ranges; with STREAM, dst + i is
        // 64-byte aligned.
        unsafe {
            let v = [0, 32, 64, 96].map(|k| _mm256_loadu_si256(src.add(i + k) as *const __m256i));
            for (k, x) in [0, 32, 64, 96].into_iter().zip(v) {
                let d = dst.add(i + k) as *mut __m256i;
                if STREAM {
                    _mm256_stream_si256(d, x);
                } else {
                    _mm256_storeu_si256(d, x);
                }
            }
        }
        i += 128;
    }
    // SAFETY: the tail [body_end, n) lies inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i) };
    if STREAM {
        _mm_sfence();
    }
}

/// Exchanges the `n` bytes at `a` with the `n` bytes at `b` (an in-place
/// all_to_all's pair of blocks): every byte is read once and written once, as in
/// a single copy, through vector registers where the CPU has AVX2.
///
/// # Safety
/// Both ranges must be valid for reads and writes of `n` bytes and must not overlap.
pub unsafe fn swap(a: *mut u8, b: *mut u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if n >= 2048 && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the caller's contract, and the CPU has AVX2 (checked above).
            unsafe { swap_avx2(a, b, n) };
            return;
        }
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::swap_nonoverlapping(a, b, n) };
}

/// The vector swap loop: 128 bytes of each side per iteration.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn swap_avx2(a: *mut u8, b: *mut u8, n: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};
    let body_end = n / 128 * 128;
    let mut i = 0;
    while i < body_end {
        // SAFETY: [i, i+128) lies inside both ranges, which do not overlap.
        unsafe {
            let x = [0, 32, 64, 96].map(|k| _mm256_loadu_si256(a.add(i + k) as *const __m256i));
            let y = [0, 32, 64, 96].map(|k| _mm256_loadu_si256(b.add(i + k) as *const __m256i));
            for (k, (x, y)) in [0, 32, 64, 96].into_iter().zip(x.into_iter().zip(y)) {
                _mm256_storeu_si256(a.add(i + k) as *mut __m256i, y);
                _mm256_storeu_si256(b.add(i + k) as *mut __m256i, x);
            }
        }
        i += 128;
    }
    // SAFETY: the tail [body_end, n) lies inside both ranges.
    unsafe { std::ptr::swap_nonoverlapping(a.add(i), b.add(i), n - i) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choices(s: &mut StoreChoice, n: usize) -> usize {
        (0..n).filter(|_| s.choose()).count()
    }

    #[test]
    fn streaming_is_chosen_only_while_ordinary_stores_are_much_slower() {
        use std::time::Duration;
        let mut s = StoreChoice::default();
        // Unmeasured: ordinary stores, with every 16th copy streamed to measure it.
        assert_eq!(choices(&mut s, 32), 2);
        // Streaming 1.5x faster for the writer: not enough to pay for its reader.
        s.record(false, 64 << 10, Duration::from_micros(6));
        s.record(true, 64 << 10, Duration::from_micros(4));
        assert_eq!(choices(&mut s, 32), 2);
        // Ordinary stores 5x slower (the CPUs on different dies): stream, and try
        // ordinary stores every 16th copy.
        for _ in 0..40 {
            s.record(false, 64 << 10, Duration::from_micros(20));
        }
        assert_eq!(choices(&mut s, 32), 30);
        // They recover: back to ordinary stores.
        for _ in 0..40 {
            s.record(false, 64 << 10, Duration::from_micros(3));
        }
        assert_eq!(choices(&mut s, 32), 2);
        // Costs are per KiB: 4 KiB in 0.25 µs is as fast as 64 KiB in 4 µs.
        let mut t = StoreChoice::default();
        t.record(true, 4 << 10, Duration::from_nanos(250));
        assert_eq!(t.streaming, 62.5);
        // A timed copy copies.
        let src: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        for streaming in [false, true] {
            let mut dst = vec![0u8; 8192];
            // SAFETY: both hold 8192 bytes and do not overlap.
            unsafe { t.copy(dst.as_mut_ptr(), src.as_ptr(), 8192, streaming) };
            assert_eq!(dst, src);
        }
    }

    #[test]
    fn swaps_exchange_exactly_at_every_alignment_and_length() {
        let x: Vec<u8> = (0..20_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let y: Vec<u8> = (0..20_000u32).map(|i| (i.wrapping_mul(40_503) >> 5) as u8 ^ 0x5A).collect();
        for (ao, bo) in [(0usize, 0usize), (1, 0), (0, 1), (7, 33), (63, 5)] {
            for n in [0usize, 1, 100, 2047, 2048, 2049, 4096 + 127, 19_000] {
                let (mut a, mut b) = (x.clone(), y.clone());
                // SAFETY: both ranges are inside their (distinct) vectors.
                unsafe { swap(a.as_mut_ptr().add(ao), b.as_mut_ptr().add(bo), n) };
                assert_eq!(&a[ao..ao + n], &y[bo..bo + n], "a+{ao} b+{bo} n={n}");
                assert_eq!(&b[bo..bo + n], &x[ao..ao + n], "a+{ao} b+{bo} n={n}");
                assert_eq!(&a[..ao], &x[..ao]);
                assert_eq!(&a[ao + n..], &x[ao + n..]);
                assert_eq!(&b[bo + n..], &y[bo + n..]);
            }
        }
    }

    #[test]
    fn copies_match_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for (so, dof) in [(0usize, 0usize), (1, 0), (0, 1), (7, 33), (63, 5), (32, 32)] {
            for n in [0usize, 1, 100, 2047, 2048, 2049, 4095, 4096, 4097, 4096 + 127, 10_000, 19_000] {
                // SAFETY: both ranges are inside their vectors and disjoint.
                for f in [copy, copy_streaming] {
                    let mut dst = vec![0xAAu8; 20_100];
                    // SAFETY: both ranges are inside their vectors and disjoint.
                    unsafe { f(dst.as_mut_ptr().add(dof), src.as_ptr().add(so), n) };
                    assert_eq!(&dst[dof..dof + n], &src[so..so + n], "src+{so} dst+{dof} n={n}");
                    assert!(dst[..dof].iter().all(|&b| b == 0xAA) && dst[dof + n..].iter().all(|&b| b == 0xAA));
                }
            }
        }
    }
}
