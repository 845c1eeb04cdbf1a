//! ferroccl-testutil: the one deterministic pseudo-random generator of ferroccl's tests,
//! fuzzing, simulated-GPU tests and benchmark (ferroccl-bench's inputs and soak draws).
//!
//! [`Rng`] is splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
//! generators", 2014): a Weyl sequence hashed by [`mix`], so every seed (0 included)
//! gives a full-period stream, and [`Rng::stream`] gives independent streams from one
//! seed (a call number, a test case). Deterministic on every platform: a failure
//! reproduces from its seed. Not for cryptography.
//!
//! Depends on nothing, so every crate of the workspace (the kernels crate included,
//! whose own types its tests compare) can take it as a dev-dependency without a cycle.
#![forbid(unsafe_code)]

/// splitmix64's increment: the golden ratio in 64-bit fixed point.
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64's finaliser (a bijection of u64 that mixes every bit into every other):
/// the hash behind [`Rng`], and by itself a counter-based generator (the value of
/// element `i` as `mix(seed ^ i)`, in any order).
#[inline]
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A value in `0..m` from a uniform 64-bit `h` (Lemire's multiply-shift: no modulo
/// bias worth naming, no division); 0 when `m` is 0.
#[inline]
pub fn below_of(h: u64, m: u64) -> u64 {
    ((h as u128 * m as u128) >> 64) as u64
}

/// splitmix64: a seedable, deterministic stream of uniform 64-bit values.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The stream of `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Stream `i` of `seed`: streams of one seed are independent of each other, so a
    /// test case or a benchmark's call can be redrawn alone from (seed, i).
    pub fn stream(seed: u64, i: u64) -> Rng {
        Rng(mix(seed ^ mix(i.wrapping_add(0x632b_e59b_d9b4_e019))))
    }

    /// The next uniform 64-bit value.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix(self.0)
    }

    /// Uniform in `0..m`; 0 when `m` is 0 (so an empty range needs no special case).
    #[inline]
    pub fn below(&mut self, m: u64) -> u64 {
        below_of(self.next_u64(), m)
    }

    /// Uniform in `0..n` as a `usize` (an index or a length); 0 when `n` is 0.
    #[inline]
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// True with probability `num / den` (`den` >= 1).
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// One element of `v`, uniformly (`v` not empty).
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.index(v.len())]
    }

    /// Log-uniform in `1..=hi` (`hi` >= 1): small values as likely per octave as large ones.
    pub fn log_uniform(&mut self, hi: u64) -> u64 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((hi as f64 + 1.0).powf(u) as u64).clamp(1, hi)
    }

    /// `n` uniform bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill(&mut v);
        v
    }

    /// Fills `buf` with uniform bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let w = self.next_u64().to_le_bytes();
            rest.copy_from_slice(&w[..rest.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_splitmix64_stream() {
        // The reference implementation's (Vigna's splitmix64.c) first outputs for seed
        // 1234567, as Rosetta Code's SplitMix64 task lists them.
        let mut r = Rng::new(1234567);
        let want = [
            6457827717110365317u64,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821,
        ];
        for w in want {
            assert_eq!(r.next_u64(), w);
        }
    }

    #[test]
    fn below_stays_in_range_and_reaches_every_value() {
        let mut r = Rng::new(0);
        let mut seen = [0u32; 7];
        for _ in 0..7000 {
            let v = r.below(7);
            assert!(v < 7);
            seen[v as usize] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
        assert_eq!(r.below(0), 0);
        assert_eq!(r.index(1), 0);
    }

    #[test]
    fn streams_of_one_seed_differ_and_repeat() {
        let a: Vec<u64> = (0..4).map(|i| Rng::stream(9, i).next_u64()).collect();
        let b: Vec<u64> = (0..4).map(|i| Rng::stream(9, i).next_u64()).collect();
        assert_eq!(a, b);
        for i in 0..4 {
            for j in 0..i {
                assert_ne!(a[i], a[j]);
            }
        }
    }

    #[test]
    fn fill_covers_every_byte_of_odd_lengths() {
        let mut r = Rng::new(5);
        for n in [0usize, 1, 7, 8, 9, 31] {
            let v = r.bytes(n);
            assert_eq!(v.len(), n);
        }
        let mut a = Rng::new(6);
        let mut b = Rng::new(6);
        let v = a.bytes(12);
        assert_eq!(&v[..8], &b.next_u64().to_le_bytes());
        assert_eq!(&v[8..], &b.next_u64().to_le_bytes()[..4]);
        let mut r = Rng::new(3);
        for _ in 0..1000 {
            assert!((1..=1000).contains(&r.log_uniform(1000)));
        }
    }
}
