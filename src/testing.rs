//! Helpers for the crate's unit tests.

/// xorshift64*: deterministic random numbers, so a failure reproduces from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in 0..n.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
