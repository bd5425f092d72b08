//! Exponential backoff with injected, integer-only jitter.
//!
//! A [`BackoffConfig`] says how delays grow; a [`Backoff`] is one retry sequence (its attempt
//! count, previous delay, drawn additive offset and the budget it has spent). Neither reads a
//! clock: they hand out spans, and the caller turns a span into a deadline on its own timeline.
//!
//! # How one delay is computed
//!
//! For the 0-based attempt `a`, every step in nanoseconds, in this order:
//!
//! 1. **Base.** `d₀ = initial`, `dₐ₊₁ = min(max, ⌊dₐ·num/den⌋)`, exact and saturating
//!    ([`Jitter::Additive`] starts the same recurrence from `initial + offset` instead). The
//!    attempt at which the base stops changing is found when the config is built, so a
//!    sequence costs O(1) per delay and any attempt (`u32::MAX` included) costs at most
//!    [`MAX_RAMP_ATTEMPTS`] steps; validation bounds every jittered start the same way.
//! 2. **Jitter** ([`Jitter`]), drawn from the caller's RNG, then, with the default
//!    [`JitterOrder::JitterThenCap`], **clamped to `max`** (`max` includes jitter, Fluss's
//!    rule); with [`JitterOrder::CapThenJitter`] (gRFC A6, gRPC connection backoff) the capped
//!    base is jittered and not clamped again, so a delay may exceed `max` by the jitter's
//!    reach. With `first_delay_unjittered` the first delay of a sequence skips this step and
//!    draws nothing (gRPC's first wait is exactly `INITIAL_BACKOFF`).
//! 3. **Floor**: `max(floor, ·)`. Validation keeps `floor ≤ max`, so this never exceeds `max`.
//! 4. **Truncation** down to a multiple of `resolution`, but never below one `resolution`
//!    step: an enabled backoff never hands out a zero delay (a raw delay below one step, e.g.
//!    a [`Jitter::Full`] draw near 0 or an `initial` under the resolution, becomes one step).
//!    Validation requires `floor` to be a multiple of `resolution`, so truncating never drops
//!    below `floor`, and `resolution ≤ max` when enabled, so the step never exceeds `max`.
//! 5. **Limits** (only in [`Backoff::next_delay`], in this order): after `max_attempts`
//!    delays the next is refused (Gobblin's `maxRetries`); once the delays handed out sum to
//!    more than the soft `max_wait` the next is refused (Gobblin's `maxWait`: the delay that
//!    crosses it still runs); both before anything is drawn. Then a delay larger than what is
//!    left of the optional hard total budget is refused. [`Exhausted`] says which.
//!
//! So every delay lies in `[max(floor, resolution), largest_delay]` (`largest_delay` is `max`
//! truncated to the grid with jitter-then-cap; see [`BackoffConfig::largest_delay`]) and is a
//! multiple of `resolution`, except that an
//! `initial` of zero disables the backoff: every delay is zero (see
//! [`BackoffConfig::is_disabled`]).
//!
//! Every step is exact as written; the code reaches the same values without a division
//! instruction on the way (precomputed reciprocals, and truncation merged into the
//! proportional scaling), as `docs/backoff.md` explains.
//!
//! ```
//! use core::time::Duration;
//! use throttle_sansio::backoff::{Backoff, BackoffConfig, Jitter};
//! use throttle_sansio::rng::SplitMix64;
//!
//! let cfg = BackoffConfig::builder()
//!     .initial(Duration::from_secs(1))
//!     .max(Duration::from_secs(5))
//!     .jitter(Jitter::None)
//!     .build()?;
//! let mut rng = SplitMix64::new(1);
//! let mut backoff = Backoff::new();
//! let secs: Vec<u64> = (0..5)
//!     .filter_map(|_| backoff.next_delay(&cfg, &mut rng))
//!     .map(|d| d.as_secs())
//!     .collect();
//! assert_eq!(secs, [1, 2, 4, 5, 5]); // capped exactly at 5 s
//! # Ok::<(), throttle_sansio::ConfigError>(())
//! ```

mod arith;
mod builder;
mod config;
mod jitter;
mod state;

pub use builder::BackoffConfigBuilder;
pub use config::BackoffConfig;
pub use jitter::{Jitter, JitterOrder};
pub use state::{Backoff, Exhausted};

/// The most attempts the base delay may take to settle (reach `max` or stop growing).
///
/// A multiplier so close to 1 that the base keeps growing past this many attempts is refused
/// at validation, from `initial` and, with [`Jitter::Additive`], from every jittered start;
/// this bounds the work of [`BackoffConfig::delay_for`] for any attempt.
pub const MAX_RAMP_ATTEMPTS: u32 = 4096;

#[cfg(test)]
mod tests;
