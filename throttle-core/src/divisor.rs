//! Exact division by a runtime `u64` divisor without a divide instruction.
//!
//! A divisor fixed when a config is built (a backoff's resolution or multiplier denominator)
//! is turned once into a 128-bit reciprocal, so every later `n / d` is two multiplications and
//! an addition: a few cycles, where a hardware 64-bit division costs tens and a `u128` one
//! calls into the runtime library.
//!
//! The method is Lemire, Kaser and Kurz's direct computation ("Faster remainder by direct
//! computation", Software: Practice and Experience 49(6), 2019, theorem 1): with `F` bits of
//! fraction and `c = ⌈2^F / d⌉`, `⌊c·n / 2^F⌋ = ⌊n/d⌋` for every `n < 2^N` as soon as
//! `F ≥ N + log₂ d`. For 64-bit `n` and `d` that is `F = 128`: `c < 2^128` for every `d ≥ 2`,
//! and no shift or correction step depends on `d` (variable shifts are slow on x86 without
//! BMI2, which a portable build cannot assume). `d = 1` would need `c = 2^128`, so a
//! [`Divisor`] holds `d ≥ 2` and callers treat 1 as the identity.

/// A precomputed exact divisor `d ≥ 2`: `div(n) == n / d` for every `u64` `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Divisor {
    d: u64,
    /// `⌈2^128 / d⌉` in two halves (8-byte alignment keeps the configs small).
    lo: u64,
    hi: u64,
}

impl Divisor {
    /// The divisor `d`, or `None` for 0 and 1 (1 is the identity, left to the caller).
    pub(crate) const fn new(d: u64) -> Option<Self> {
        if d < 2 {
            return None;
        }
        // ⌈2^128/d⌉ = ⌊(2^128 − 1)/d⌋ + 1 for d ≥ 2 (a power of two divides 2^128 and gives
        // the same), at most 2^127.
        let c = u128::MAX / d as u128 + 1;
        Some(Divisor {
            d,
            lo: c as u64,
            hi: (c >> 64) as u64,
        })
    }

    /// The divisor itself.
    #[inline]
    pub(crate) const fn get(self) -> u64 {
        self.d
    }

    /// `⌊n / d⌋`.
    #[inline]
    pub(crate) const fn div(self, n: u64) -> u64 {
        // ⌊c·n / 2^128⌋ with c = hi·2^64 + lo: the low half only carries into the high one.
        // hi·n ≤ (2^64 − 1)² and the carry is below 2^64, so the sum fits in u128. Wrapping
        // only keeps a proof slip from becoming a panic; the tests compare with `/`.
        let carry = (self.lo as u128 * n as u128) >> 64;
        let high = self.hi as u128 * n as u128;
        (high.wrapping_add(carry) >> 64) as u64
    }

    /// `n` rounded down to a multiple of `d` (`n − n mod d`).
    #[inline]
    pub(crate) const fn round_down(self, n: u64) -> u64 {
        // ⌊n/d⌋·d ≤ n: cannot wrap.
        self.div(n).wrapping_mul(self.d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(d: u64, n: u64) {
        let Some(div) = Divisor::new(d) else {
            panic!("{d} is a divisor above 1");
        };
        assert_eq!(div.div(n), n / d, "{n} / {d}");
        assert_eq!(
            div.round_down(n),
            n - n % d,
            "{n} rounded down to a multiple of {d}"
        );
    }

    /// Numerators where a wrong reciprocal shows first: around multiples of `d`, around powers
    /// of two, and the ends of the range.
    fn edge_numerators(d: u64) -> impl Iterator<Item = u64> {
        let mut v = alloc::vec![0, 1, 2, 3, u64::MAX, u64::MAX - 1, u64::MAX - 2];
        for k in [
            1u64,
            2,
            3,
            1_000,
            u64::MAX / d,
            (u64::MAX / d).saturating_sub(1),
        ] {
            let m = k.saturating_mul(d);
            v.extend([m.saturating_sub(1), m, m.saturating_add(1)]);
        }
        for s in 0..64 {
            let p = 1u64 << s;
            v.extend([p - 1, p, p + 1]);
        }
        let top = (u64::MAX / d) * d;
        v.extend([top, top.saturating_sub(1), top.wrapping_add(d - 1)]);
        v.into_iter()
    }

    #[test]
    fn zero_and_one_are_left_to_the_caller() {
        assert_eq!(Divisor::new(0), None);
        assert_eq!(Divisor::new(1), None);
        assert_eq!(Divisor::new(2).map(|d| d.get()), Some(2));
    }

    #[test]
    fn divides_exactly_at_edge_divisors_and_numerators() {
        let mut divisors = alloc::vec![
            2,
            3,
            5,
            6,
            7,
            10,
            641,
            999_999,
            1_000_000,
            1_000_001,
            1_000_000_000,
            u64::MAX,
            u64::MAX - 1,
            u64::MAX / 2,
            u64::MAX / 2 + 1,
            u64::MAX / 2 + 2,
            u64::MAX / 3,
            (1 << 32) - 1,
            (1 << 32) + 1,
            274_177,
            6_700_417,
        ];
        for s in 2..64 {
            let p = 1u64 << s;
            divisors.extend([p, p + 1, p - 1, p | (p >> 1)]);
        }
        // Under miri a fifth of them (every edge kind still appears), as it runs ~100x slower.
        for d in divisors.into_iter().step_by(if cfg!(miri) { 5 } else { 1 }) {
            for n in edge_numerators(d) {
                check(d, n);
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn divides_exactly_for_every_small_divisor_and_numerator() {
        for d in 2..=300u64 {
            for n in 0..=3_000u64 {
                check(d, n);
            }
        }
    }

    /// Any width of divisor and numerator is equally likely, plus the extremes.
    fn wide() -> impl Strategy<Value = u64> {
        prop_oneof![
            (any::<u64>(), 0u32..64).prop_map(|(x, s)| x >> s),
            (0u32..64).prop_map(|s| 1u64 << s),
            Just(u64::MAX),
            Just(2u64),
        ]
    }

    proptest! {
        #![proptest_config(crate::proptest_config(20_000))]

        #[test]
        fn division_and_rounding_match_plain_div_and_rem_over_all_u64(
            d in wide(),
            n in wide(),
            near in any::<i8>(),
        ) {
            let d = d.max(2);
            let div = Divisor::new(d).ok_or_else(|| TestCaseError::fail("a divisor above 1"))?;
            prop_assert_eq!(div.div(n), n / d);
            prop_assert_eq!(div.round_down(n), n - n % d);
            // Just around a multiple of d, where an off-by-one quotient shows.
            let m = (n / d).saturating_mul(d).saturating_add_signed(i64::from(near));
            prop_assert_eq!(div.div(m), m / d);
            prop_assert_eq!(div.round_down(m), m - m % d);
        }
    }
}
