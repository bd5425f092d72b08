//! Injected randomness.
//!
//! Methods that draw take `rng: &mut R` with `R: Rng + ?Sized` and never store it, so machines
//! stay `Clone`, comparable and replayable. [`Rng`] is the rand_core 0.10 trait, aliased here
//! once for the whole crate. Uniform draws are exact integers (no floats, no modulo bias).
//!
//! [`SplitMix64`] is a tiny seeded generator for tests, simulations and fuzzing. It is not
//! cryptographic and must not be seeded identically across a fleet: adapters seed each client
//! from a per-process random source mixed with a client id.

use core::convert::Infallible;

/// The random-number trait every drawing method takes (rand_core's `Rng`).
pub use rand_core::Rng;

/// A uniform draw in `[0, bound)`; `0` when `bound == 0`.
///
/// Lemire's multiply-and-reject: unbiased, one multiplication in the common case.
#[inline]
pub fn below<R: Rng + ?Sized>(rng: &mut R, bound: u64) -> u64 {
    if bound == 0 {
        return 0;
    }
    let mut m = u128::from(rng.next_u64()) * u128::from(bound);
    let mut low = m as u64;
    if low < bound {
        // Reject the few low words that would bias the result (2^64 mod bound of them).
        let threshold = bound.wrapping_neg() % bound;
        while low < threshold {
            m = u128::from(rng.next_u64()) * u128::from(bound);
            low = m as u64;
        }
    }
    (m >> 64) as u64
}

/// A uniform draw in `[lo, hi]` (inclusive); `lo` when `hi <= lo`.
#[inline]
pub fn between_inclusive<R: Rng + ?Sized>(rng: &mut R, lo: u64, hi: u64) -> u64 {
    if hi <= lo {
        return lo;
    }
    let span = hi - lo;
    if span == u64::MAX {
        return rng.next_u64();
    }
    lo + below(rng, span + 1)
}

/// SplitMix64 (Steele, Lea and Flood): a small, fast, seeded generator.
///
/// ```
/// use throttle_sansio::rng::{Rng, SplitMix64};
/// let mut a = SplitMix64::new(7);
/// let mut b = SplitMix64::new(7);
/// assert_eq!(a.next_u64(), b.next_u64()); // same seed, same stream
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose stream is determined by `seed`.
    pub const fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }
}

/// SplitMix64's output function (a 64-bit mixer): also how `sync` mixes a client id into
/// the process seed.
#[inline]
pub(crate) const fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl rand_core::TryRng for SplitMix64 {
    type Error = Infallible;

    #[inline]
    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((self.try_next_u64()? >> 32) as u32)
    }

    #[inline]
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        Ok(finalize(self.state))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let word = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        Ok(())
    }
}

/// An `Rng` that panics on every draw: a user generator that fails, for the tests of the
/// `# Panics` contracts of the drawing inputs.
#[cfg(test)]
pub(crate) struct PanickingRng;

#[cfg(test)]
impl rand_core::TryRng for PanickingRng {
    type Error = Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        panic!("the user's generator panics")
    }
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        panic!("the user's generator panics")
    }
    fn try_fill_bytes(&mut self, _dst: &mut [u8]) -> Result<(), Infallible> {
        panic!("the user's generator panics")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A generator that replays fixed words, to pin the rejection path.
    struct Script<'a>(&'a [u64], usize);
    impl rand_core::TryRng for Script<'_> {
        type Error = Infallible;
        fn try_next_u32(&mut self) -> Result<u32, Infallible> {
            Ok(self.try_next_u64()? as u32)
        }
        fn try_next_u64(&mut self) -> Result<u64, Infallible> {
            let w = self.0[self.1 % self.0.len()];
            self.1 += 1;
            Ok(w)
        }
        fn try_fill_bytes(&mut self, _: &mut [u8]) -> Result<(), Infallible> {
            Ok(())
        }
    }

    #[test]
    fn splitmix_matches_reference_stream() {
        // First outputs of SplitMix64 seeded with 0 (the published reference values).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let mut bytes = [0u8; 11];
        SplitMix64::new(0).fill_bytes(&mut bytes);
        assert_eq!(bytes[..8], 0xE220_A839_7B1D_CDAFu64.to_le_bytes());
    }

    #[test]
    fn below_stays_in_range_and_hits_both_ends() {
        let mut r = SplitMix64::new(1);
        let (mut saw0, mut saw9) = (false, false);
        for _ in 0..2000 {
            let x = below(&mut r, 10);
            assert!(x < 10);
            saw0 |= x == 0;
            saw9 |= x == 9;
        }
        assert!(saw0 && saw9);
        assert_eq!(below(&mut r, 0), 0);
        assert_eq!(below(&mut Script(&[u64::MAX], 0), u64::MAX), u64::MAX - 1);
    }

    #[test]
    fn below_rejects_biased_low_words() {
        // bound 3: threshold = 2^64 mod 3 = 1, so a first word whose low product is 0 is redrawn.
        let mut s = Script(&[0, u64::MAX], 0);
        assert_eq!(below(&mut s, 3), 2);
        assert_eq!(s.1, 2, "the biased first word was rejected");
    }

    #[test]
    fn between_inclusive_covers_full_range() {
        let mut r = SplitMix64::new(3);
        assert_eq!(between_inclusive(&mut r, 5, 5), 5);
        assert_eq!(between_inclusive(&mut r, 9, 2), 9);
        for _ in 0..100 {
            let x = between_inclusive(&mut r, 10, 12);
            assert!((10..=12).contains(&x));
        }
        let _ = between_inclusive(&mut r, 0, u64::MAX);
    }
}
