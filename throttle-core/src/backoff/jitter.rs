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
/// The widest [`Jitter::PerDelay`]: tower's largest jitter ratio, 100.
pub(super) const PER_DELAY_MAX_PPM: u64 = 100 * PPM;

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
    /// Upward jitter drawn **independently for every delay**: `⌊base·f/10⁶⌋` with `f` uniform
    /// in `[10⁶, 10⁶ + ppm)`, so the delay lies in `[base, base·(1 + ppm/10⁶))`. The per-delay
    /// form of [`Jitter::Additive`]: nothing carries over from one delay to the next, and the
    /// base grows from the unjittered one. backon's `with_jitter` is `ppm: 1_000_000`
    /// (`[d, 2d)`) with [`JitterOrder::CapThenJitter`]; tower's `ExponentialBackoff` with
    /// jitter `j` is `ppm: j·10⁶` with [`JitterOrder::JitterThenCap`] (tower clamps the
    /// jitter to `max − base`). Always draws when the backoff is enabled, even when
    /// `initial == max`.
    PerDelay {
        /// Width of the factor's range above 1, at most 100 000 000 (tower's largest jitter,
        /// 100).
        ppm: u32,
    },
}

/// Where `max` applies relative to the jitter draw.
///
/// ```
/// use core::time::Duration;
/// use throttle_sansio::backoff::{BackoffConfig, JitterOrder};
///
/// // gRPC's connection backoff jitters the capped base: at the cap, 96–144 s.
/// let grpc = BackoffConfig::grpc_connection();
/// assert_eq!(grpc.jitter_order(), JitterOrder::CapThenJitter);
/// // The largest factor is 1.2 − 10⁻⁶: 143.99988 s, truncated to the 1 ms grid.
/// assert_eq!(grpc.largest_delay(), Duration::from_millis(143_999));
/// // Fluss's "max includes jitter": never above 10 s.
/// let fluss = BackoffConfig::fluss_disk_write_locked();
/// assert_eq!(fluss.jitter_order(), JitterOrder::JitterThenCap);
/// assert_eq!(fluss.largest_delay(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum JitterOrder {
    /// Jitter first, then clamp to `max`: `max` includes jitter (Fluss's rule, and Kafka's
    /// `ExponentialBackoff.backoff`, which clamps the jittered value to `maxInterval`).
    /// Waits at the cap spread below `max` only.
    #[default]
    JitterThenCap,
    /// Cap the base at `max`, then jitter it with no clamp after: gRFC A6's
    /// `min(initial·mult^(n−1), max)·U(0.8, 1.2)` and gRPC's connection-backoff document, so
    /// waits at the cap spread over `[0.8·max, 1.2·max)` with ±20 %. Only for strategies
    /// that jitter around the base ([`Jitter::None`], [`Jitter::Proportional`],
    /// [`Jitter::Full`], [`Jitter::Equal`], [`Jitter::PerDelay`]); [`Jitter::Additive`]
    /// and [`Jitter::Decorrelated`] cap inside their own recurrence and are refused with it.
    CapThenJitter,
}

// Every match on a strategy below is exhaustive (no `_` arm), so a new strategy stops the
// build at each place that must decide what it does. `docs/architecture.md` lists the places
// the compiler cannot point at.
impl Jitter {
    /// Each strategy once, with example parameters, in the order the model decoder selects
    /// them by (`model::backoff`). Append only: a selector byte must keep meaning the same
    /// strategy, and the fuzz corpus relies on it.
    #[cfg(any(test, feature = "model"))]
    pub(crate) const ALL: [Jitter; 7] = [
        Jitter::None,
        Jitter::Proportional { ppm: 200_000 },
        Jitter::Additive {
            range: Duration::from_millis(500),
        },
        Jitter::Full,
        Jitter::Equal,
        Jitter::Decorrelated,
        Jitter::PerDelay { ppm: 1_000_000 },
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
            Jitter::PerDelay { .. } => 6,
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
            Jitter::PerDelay { ppm } if u64::from(ppm) > PER_DELAY_MAX_PPM => {
                Err(ConfigError::OutOfRange {
                    option,
                    got: u64::from(ppm),
                    min: 0,
                    max: PER_DELAY_MAX_PPM,
                    unit: "ppm",
                })
            }
            Jitter::Proportional { .. }
            | Jitter::PerDelay { .. }
            | Jitter::None
            | Jitter::Additive { .. }
            | Jitter::Full
            | Jitter::Equal
            | Jitter::Decorrelated => Ok(()),
        }
    }

    /// Whether the strategy draws around the capped base, so that
    /// [`JitterOrder::CapThenJitter`] has a meaning for it; the others cap inside their own
    /// recurrence (additive) or draw from the previous delay (decorrelated).
    pub(super) const fn jitters_the_base(self) -> bool {
        match self {
            Jitter::None
            | Jitter::Proportional { .. }
            | Jitter::Full
            | Jitter::Equal
            | Jitter::PerDelay { .. } => true,
            Jitter::Additive { .. } | Jitter::Decorrelated => false,
        }
    }

    /// The range of the offset drawn once per sequence and added to `initial`, for the
    /// strategies that start each sequence from a jittered base.
    pub(super) const fn sequence_offset(self) -> Option<Duration> {
        match self {
            Jitter::Additive { range } => Some(range),
            Jitter::None
            | Jitter::Proportional { .. }
            | Jitter::PerDelay { .. }
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
    /// What an enabled, non-fixed [`Jitter::Proportional`] config, or an enabled
    /// [`Jitter::PerDelay`] one, draws with, else `None`.
    pub(super) fn of(jitter: Jitter, initial: u64, max: u64, resolution: u64) -> Option<Spread> {
        match jitter {
            Jitter::PerDelay { ppm } if initial != 0 => {
                Divisor::new(resolution.saturating_mul(PPM)).map(|unit| Spread {
                    low: PPM,
                    width: u64::from(ppm).min(PER_DELAY_MAX_PPM),
                    unit,
                })
            }
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
            | Jitter::PerDelay { .. }
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
            | Jitter::PerDelay { .. }
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
            Jitter::Proportional { .. } | Jitter::PerDelay { .. } => match &self.spread {
                Some(spread) => return self.draw_spread(spread, base, rng),
                // A fixed proportional backoff (initial == max) stays fixed: jittering it
                // could only shorten it. (An enabled per-delay config always has a spread.)
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

    /// [`BackoffConfig::draw`] for 0-based `attempt`: with
    /// [`first_delay_unjittered`](super::BackoffConfigBuilder::first_delay_unjittered) the
    /// first delay of a sequence is its base, floored and truncated, and nothing is drawn
    /// (gRPC's connection backoff waits exactly `INITIAL_BACKOFF` first).
    #[inline]
    pub(super) fn draw_at<R: Rng + ?Sized>(
        &self,
        attempt: u32,
        base: u64,
        prev: u64,
        rng: &mut R,
    ) -> u64 {
        if attempt == 0 && self.first_unjittered && !self.is_disabled() {
            return self.finish(base);
        }
        self.draw(base, prev, rng)
    }

    /// Steps 2–4 for an effective [`Jitter::Proportional`] or [`Jitter::PerDelay`]: `⌊base·f/10⁶⌋` with a freshly
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
            // `factor ≤ 1.01·10⁸`: `(10⁶ − 1)·factor` fits, as `mul_div` needs.
            None => self.finish(mul_div(base, factor, PPM, |n| n / PPM)),
        }
    }

    /// Steps 2–4 after the jitter: `min(max)` (only with [`JitterOrder::JitterThenCap`]: `top`
    /// is the grid's largest value otherwise), `max(floor)`, truncation, then at least one
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
