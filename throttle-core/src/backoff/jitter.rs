//! The jitter strategies, and the draws that turn a base delay into a delay (steps 2–4).

use core::time::Duration;

use super::BackoffConfig;
use super::arith::{mul_div, round_down};
use crate::divisor::Divisor;
use crate::error::ConfigError;
use crate::options::ConfigOption;
use crate::rng::{Rng, below, between_inclusive};
use crate::time::duration_to_nanos;

pub(super) const PPM: u64 = 1_000_000;

/// How a delay is randomised around its base.
///
/// Ratios are integer parts per million; every draw is an exact integer (no floats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Jitter {
    /// No randomness: the delay is the base.
    None,
    /// `base · f` with `f` uniform in `[1 − ppm/10⁶, 1 + ppm/10⁶)` (Fluss, Kafka and gRPC's
    /// ±20 % is `ppm: 200_000`), clamped to `max`. A config with `initial == max` is fixed and
    /// draws nothing.
    Proportional {
        /// Half-width of the factor's range, at most 1 000 000.
        ppm: u32,
    },
    /// An offset `U[0, range)` drawn **once per sequence** (at its first delay and again after
    /// [`Backoff::reset`]) and added to `initial`; every later delay grows from that jittered
    /// start by the same recurrence: `d₀ = initial + offset`, `dₐ₊₁ = min(max, ⌊dₐ·num/den⌋)`
    /// (3 ns + 1 ns at ×3/2 gives 4, 6, 9, 13 ns). The recurrence is monotone, so the whole
    /// sequence is decorrelated and never earlier than the unjittered one. Capped at `max`,
    /// like Gobblin's `maxDelay`.
    ///
    /// [`Backoff::reset`]: super::Backoff::reset
    Additive {
        /// Width of the offset's range; zero means no offset.
        range: Duration,
    },
    /// Full jitter: `U[0, base]`, then truncated like every delay, so a draw below one
    /// `resolution` step gives one step, never zero.
    Full,
    /// Equal jitter: `base/2 + U[0, base/2]` with `base/2` rounded down, so an odd base's
    /// delay tops out 1 ns below it (`docs/design.md` §3.1, taken literally).
    Equal,
    /// Decorrelated jitter: `min(max, U[initial, 3·prev])`, where `prev` is the previous delay
    /// of the sequence (`initial` before the first).
    Decorrelated,
}

// Every match on a strategy below is exhaustive (no `_` arm), so a new strategy stops the
// build at each place that must decide what it does. `docs/architecture.md` lists the places
// the compiler cannot point at.
impl Jitter {
    /// Each strategy once, with example parameters, in the order the model decoder selects
    /// them by (`model::backoff`). Append only: a selector byte must keep meaning the same
    /// strategy, and the fuzz corpus relies on it.
    #[cfg(any(test, feature = "model"))]
    pub(crate) const ALL: [Jitter; 6] = [
        Jitter::None,
        Jitter::Proportional { ppm: 200_000 },
        Jitter::Additive {
            range: Duration::from_millis(500),
        },
        Jitter::Full,
        Jitter::Equal,
        Jitter::Decorrelated,
    ];

    /// The strategy's index in [`Jitter::ALL`]; a new strategy takes the next one and is
    /// appended there (checked when the crate is built).
    #[cfg(any(test, feature = "model"))]
    const fn position(self) -> usize {
        match self {
            Jitter::None => 0,
            Jitter::Proportional { .. } => 1,
            Jitter::Additive { .. } => 2,
            Jitter::Full => 3,
            Jitter::Equal => 4,
            Jitter::Decorrelated => 5,
        }
    }

    /// The parameter rule of the strategy, checked by [`BackoffConfigBuilder::build`] in its
    /// place among the other rules; `option` names the jitter option in errors.
    ///
    /// [`BackoffConfigBuilder::build`]: super::BackoffConfigBuilder::build
    pub(super) fn validate(self, option: &'static ConfigOption) -> Result<(), ConfigError> {
        match self {
            Jitter::Proportional { ppm } if u64::from(ppm) > PPM => Err(ConfigError::OutOfRange {
                option,
                got: u64::from(ppm),
                min: 0,
                max: PPM,
                unit: "ppm",
            }),
            Jitter::Proportional { .. }
            | Jitter::None
            | Jitter::Additive { .. }
            | Jitter::Full
            | Jitter::Equal
            | Jitter::Decorrelated => Ok(()),
        }
    }

    /// The range of the offset drawn once per sequence and added to `initial`, for the
    /// strategies that start each sequence from a jittered base.
    pub(super) const fn sequence_offset(self) -> Option<Duration> {
        match self {
            Jitter::Additive { range } => Some(range),
            Jitter::None
            | Jitter::Proportional { .. }
            | Jitter::Full
            | Jitter::Equal
            | Jitter::Decorrelated => None,
        }
    }
}

// `Jitter::ALL` lists every strategy at its position, so selectors stay put.
#[cfg(any(test, feature = "model"))]
const _: () = {
    let mut i = 0;
    while i < Jitter::ALL.len() {
        assert!(Jitter::ALL[i].position() == i);
        i += 1;
    }
};

/// A proportional jitter's factor in ppm, `low + U[0, width)`, and what scaling and
/// truncating a delay divides by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Spread {
    pub(super) low: u64,
    pub(super) width: u64,
    /// `10⁶·resolution`, saturated at `u64::MAX` (see [`BackoffConfig::draw_spread`]).
    pub(super) unit: Divisor,
}

impl Spread {
    /// What an enabled, non-fixed [`Jitter::Proportional`] config draws with, else `None`.
    pub(super) fn of(jitter: Jitter, initial: u64, max: u64, resolution: u64) -> Option<Spread> {
        match jitter {
            Jitter::Proportional { ppm } if initial != 0 && initial != max => {
                let half = u64::from(ppm).min(PPM);
                // At least 10⁶, so always a divisor.
                Divisor::new(resolution.saturating_mul(PPM)).map(|unit| Spread {
                    low: PPM - half,
                    width: 2 * half,
                    unit,
                })
            }
            Jitter::Proportional { .. }
            | Jitter::None
            | Jitter::Additive { .. }
            | Jitter::Full
            | Jitter::Equal
            | Jitter::Decorrelated => None,
        }
    }
}

impl BackoffConfig {
    /// `min(max, initial + offset)` for an enabled [`Jitter::Additive`] config, drawing the
    /// offset `U[0, range)` into `offset` if it has none yet; `None` (and no draw) otherwise.
    pub(super) fn jittered_start<R: Rng + ?Sized>(
        &self,
        offset: &mut Option<u64>,
        rng: &mut R,
    ) -> Option<u64> {
        let range = self.jitter.sequence_offset()?;
        if self.is_disabled() {
            return None;
        }
        let off = *offset.get_or_insert_with(|| below(rng, duration_to_nanos(range)));
        Some(self.initial.saturating_add(off).min(self.max))
    }

    /// What stands in for the previous delay of `attempt` outside a sequence.
    pub(super) fn stand_in_prev(&self, attempt: u32) -> u64 {
        let Some(a) = attempt.checked_sub(1) else {
            return self.initial;
        };
        match self.jitter {
            Jitter::Decorrelated => self.base_at(a),
            Jitter::None
            | Jitter::Proportional { .. }
            | Jitter::Additive { .. }
            | Jitter::Full
            | Jitter::Equal => self.initial,
        }
    }

    /// Steps 2–4: jitter around `base`, clamp, floor, truncate. For [`Jitter::Additive`]
    /// `base` already grew from the jittered start ([`BackoffConfig::base_for`]).
    pub(super) fn draw<R: Rng + ?Sized>(&self, base: u64, prev: u64, rng: &mut R) -> u64 {
        if self.is_disabled() {
            return 0;
        }
        let raw = match self.jitter {
            Jitter::Proportional { .. } => match &self.spread {
                Some(spread) => return self.draw_spread(spread, base, rng),
                // A fixed backoff (initial == max) stays fixed: jittering it could only
                // shorten it.
                None => base,
            },
            Jitter::None | Jitter::Additive { .. } => base,
            Jitter::Full => between_inclusive(rng, 0, base),
            Jitter::Equal => {
                let half = base / 2;
                half + between_inclusive(rng, 0, half)
            }
            Jitter::Decorrelated => between_inclusive(rng, self.initial, prev.saturating_mul(3)),
        };
        self.finish(raw)
    }

    /// Steps 2–4 for an effective [`Jitter::Proportional`]: `⌊base·f/10⁶⌋` with a freshly
    /// drawn factor `f`, then [`BackoffConfig::finish`].
    #[inline]
    pub(super) fn draw_spread<R: Rng + ?Sized>(
        &self,
        spread: &Spread,
        base: u64,
        rng: &mut R,
    ) -> u64 {
        let factor = spread.low + below(rng, spread.width);
        match base.checked_mul(factor) {
            // Scaling then truncating, `⌊⌊p/10⁶⌋/res⌋·res`, is `⌊p/(10⁶·res)⌋·res`: one
            // division instead of two, and the product is at most `⌊p/10⁶⌋`, so it cannot
            // wrap. A `10⁶·res` past `u64` is saturated: then the true quotient is 0 and the
            // saturated one at most 1, and both end as `bottom`, which is at least `res`.
            Some(p) => spread
                .unit
                .div(p)
                .wrapping_mul(self.resolution)
                .min(self.top)
                .max(self.bottom),
            // `factor ≤ 2·10⁶`: `(10⁶ − 1)·factor` fits, as `mul_div` needs.
            None => self.finish(mul_div(base, factor, PPM, |n| n / PPM)),
        }
    }

    /// Steps 2–4 after the jitter: `min(max)`, `max(floor)`, truncation, then at least one
    /// step (a zero delay would retry at once while the backoff claims to be enabled).
    ///
    /// Rewritten exactly: truncation `T` is monotone, so it commutes with `min` and `max` and
    /// comes first, against the precomputed `top = T(max)` and
    /// `bottom = max(T(floor), resolution)`.
    #[inline]
    pub(super) fn finish(&self, raw: u64) -> u64 {
        round_down(raw, self.res_div).min(self.top).max(self.bottom)
    }
}
