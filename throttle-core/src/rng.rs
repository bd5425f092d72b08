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
use core::fmt;

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

    /// The next word of the stream.
    #[inline]
    fn step(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        finalize(self.state)
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
        Ok(self.step())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        fill_from_words(dst, || self.step());
        Ok(())
    }
}

/// A generator made of a closure returning `u64` words: any source of random words, from
/// any version of `rand`, as the [`Rng`] every drawing method takes.
///
/// The machines take rand_core 0.10's [`Rng`]; a client on rand 0.9 (`rand::rng()`) or on
/// another generator wraps a closure over it instead of adding a second `rand`. Each
/// [`next_u64`](Rng::next_u64) is one call of the closure; [`next_u32`](Rng::next_u32) is the
/// high half of one call, and [`fill_bytes`](Rng::fill_bytes) takes one call per 8 bytes,
/// little-endian (the last call's unused bytes are dropped), as [`SplitMix64`] does. So a
/// `FnRng` over a generator's `next_u64` draws exactly what that generator would if it
/// implemented [`Rng`] the same way. Infallible: the closure cannot report an error.
///
/// The machines draw only through `next_u64` (see [`below`]); the wrapper is built per call
/// and dropped after, like the `&mut rng` it stands for.
///
/// ```
/// use throttle_sansio::rng::FnRng;
/// use throttle_sansio::{BackoffConfig, Instant, WriteGate};
///
/// // Any generator with a `next_u64`: rand 0.9's `rand::rng()` in a real client
/// // (`use rand::RngCore as _;`), a stand-in here.
/// struct TheirRng(u64);
/// impl TheirRng {
///     fn next_u64(&mut self) -> u64 {
///         self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1);
///         self.0
///     }
/// }
/// let mut theirs = TheirRng(42);
///
/// # extern crate std;
/// let mut gate: WriteGate<u32, std::hash::RandomState> = WriteGate::new(Default::default())?;
/// let now = Instant::from_millis(5);
/// let wait = gate.handle_disk_write_locked(now, &7, 0, &mut FnRng(|| theirs.next_u64()));
/// assert!(wait.as_millis() >= 800 && wait.as_millis() <= 1200); // 1 s ± 20 %
///
/// let delay = BackoffConfig::fluss_retriable_write()
///     .delay_for(0, &mut FnRng(|| theirs.next_u64()));
/// assert!(delay.as_millis() >= 80 && delay.as_millis() <= 120); // 100 ms ± 20 %
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
///
/// # Panics
///
/// A draw panics if, and only if, the closure does; the drawing methods document what that
/// leaves behind (the input did not happen).
#[derive(Clone, Copy)]
pub struct FnRng<F>(pub F);

impl<F> FnRng<F>
where
    F: FnMut() -> u64,
{
    /// The generator whose every 64-bit word is one call of `next_u64`.
    pub const fn new(next_u64: F) -> Self {
        FnRng(next_u64)
    }
}

impl<F> fmt::Debug for FnRng<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnRng(..)")
    }
}

impl<F> rand_core::TryRng for FnRng<F>
where
    F: FnMut() -> u64,
{
    type Error = Infallible;

    #[inline]
    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(((self.0)() >> 32) as u32)
    }

    #[inline]
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok((self.0)())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        fill_from_words(dst, &mut self.0);
        Ok(())
    }
}

/// A rand 0.9 generator (any rand_core 0.9 `RngCore`, e.g. `rand::rng()`) as the [`Rng`]
/// every drawing method takes. Feature `rand_core_0_9`.
///
/// What it adds over [`FnRng`]: the generator goes in as it is, with no closure, and the
/// wrapper has a type a struct field can name (`Rand09<rand::rngs::ThreadRng>`, or
/// `Rand09<&mut dyn rand_core::RngCore>`). `next_u32`, `next_u64` and `fill_bytes` are the
/// wrapped generator's own, so every draw is one it made; a rand_core 0.9 `CryptoRng`
/// stays a [`CryptoRng`](rand_core::CryptoRng). Infallible, as rand_core 0.9's `RngCore` is.
///
/// ```
/// use throttle_sansio::rng::Rand09;
/// use throttle_sansio::BackoffConfig;
/// use rand_core_0_9::RngCore; // rand 0.9's `rand::RngCore`
///
/// // A rand 0.9 generator: `rand::rng()` in a real client, a stand-in here.
/// struct TheirRng(u64);
/// impl RngCore for TheirRng {
///     fn next_u32(&mut self) -> u32 { (self.next_u64() >> 32) as u32 }
///     fn next_u64(&mut self) -> u64 {
///         self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1);
///         self.0
///     }
///     fn fill_bytes(&mut self, dst: &mut [u8]) { rand_core_0_9::impls::fill_bytes_via_next(self, dst) }
/// }
///
/// let mut rng = Rand09(TheirRng(42));
/// let delay = BackoffConfig::fluss_retriable_write().delay_for(0, &mut rng);
/// assert!(delay.as_millis() >= 80 && delay.as_millis() <= 120); // 100 ms ± 20 %
///
/// // Or borrow a generator that lives elsewhere:
/// let mut theirs = TheirRng(7);
/// let _ = BackoffConfig::kafka_retry().delay_for(1, &mut Rand09(&mut theirs));
/// ```
///
/// # Panics
///
/// A draw panics if, and only if, the wrapped generator does.
#[cfg(feature = "rand_core_0_9")]
#[cfg_attr(docsrs, doc(cfg(feature = "rand_core_0_9")))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rand09<R>(pub R);

#[cfg(feature = "rand_core_0_9")]
impl<R: rand_core_0_9::RngCore> Rand09<R> {
    /// `rng` as our [`Rng`].
    pub const fn new(rng: R) -> Self {
        Rand09(rng)
    }

    /// The wrapped generator.
    pub fn into_inner(self) -> R {
        self.0
    }
}

#[cfg(feature = "rand_core_0_9")]
impl<R: rand_core_0_9::RngCore> rand_core::TryRng for Rand09<R> {
    type Error = Infallible;

    #[inline]
    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(self.0.next_u32())
    }

    #[inline]
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.0.next_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.0.fill_bytes(dst);
        Ok(())
    }
}

#[cfg(feature = "rand_core_0_9")]
impl<R: rand_core_0_9::CryptoRng> rand_core::TryCryptoRng for Rand09<R> {}

/// `dst` from successive words of `next`, 8 little-endian bytes each: the byte stream of
/// [`SplitMix64`], [`FnRng`] and the rand 0.9 wrapper alike.
fn fill_from_words(dst: &mut [u8], mut next: impl FnMut() -> u64) {
    for chunk in dst.chunks_mut(8) {
        let word = next().to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
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
    fn fn_rng_over_a_splitmix_stream_draws_what_splitmix_draws() {
        let mut source = SplitMix64::new(11);
        let mut adapted = FnRng(|| source.next_u64());
        let mut direct = SplitMix64::new(11);
        for _ in 0..4 {
            assert_eq!(adapted.next_u64(), direct.next_u64());
            assert_eq!(adapted.next_u32(), direct.next_u32());
        }
        for len in [0, 1, 7, 8, 9, 16, 23] {
            let (mut a, mut b) = ([0u8; 23], [0u8; 23]);
            adapted.fill_bytes(&mut a[..len]);
            direct.fill_bytes(&mut b[..len]);
            assert_eq!(a, b, "fill_bytes of {len} bytes");
        }
        // The uniform draws go through `next_u64`: same words, same answers.
        for bound in [1, 3, 10, 400_000, u64::MAX] {
            assert_eq!(below(&mut adapted, bound), below(&mut direct, bound));
        }
        assert_eq!(adapted.next_u64(), direct.next_u64(), "still in step");
    }

    #[test]
    fn fn_rng_hands_out_exactly_the_closure_words() {
        let words = [
            u64::MAX,
            0x0123_4567_89AB_CDEF,
            0x1122_3344_5566_7788,
            0xAABB,
        ];
        let mut i = 0;
        let mut rng = FnRng::new(|| {
            let w = words[i % words.len()];
            i += 1;
            w
        });
        assert_eq!(rng.next_u64(), u64::MAX);
        assert_eq!(rng.next_u32(), 0x0123_4567, "the high half of one word");
        let mut bytes = [0u8; 10];
        rng.fill_bytes(&mut bytes);
        assert_eq!(
            bytes,
            [0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0xBB, 0xAA],
            "little-endian words, the second cut to its two low bytes"
        );
        assert_eq!(rng.next_u64(), u64::MAX, "fill_bytes took two words");
        // The Lemire rejection path sees the closure's words too: word 0 is redrawn.
        let script = [0, (1 << 62) + 1];
        let mut j = 0;
        let mut rng = FnRng(|| {
            let w = script[j];
            j += 1;
            w
        });
        assert_eq!(below(&mut rng, 400_000), 100_000);
        assert_eq!(j, 2);
        assert_eq!(
            alloc::format!("{:?}", FnRng(|| 0)),
            "FnRng(..)",
            "Debug without a Debug closure"
        );
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
