//! The builder, the option names and bounds a config is checked against, and validation.

use core::time::Duration;

use super::arith::{ramp, round_down};
use super::jitter::Spread;
use super::{BackoffConfig, Jitter, JitterOrder, MAX_RAMP_ATTEMPTS};
use crate::divisor::Divisor;
use crate::error::ConfigError;
use crate::options::{ConfigOption, backoff as opt};
use crate::time::duration_to_nanos;

pub(super) const NS_PER_MS: u64 = 1_000_000;

/// A span in ns, `u64::MAX` for anything longer (the saturation point), usable in `const`.
const fn nanos(d: Duration) -> u64 {
    let n = d.as_nanos();
    if n > u64::MAX as u128 {
        u64::MAX
    } else {
        n as u64
    }
}
/// Fluss validates its backoff options as Java `int` milliseconds.
pub(super) const FLUSS_MAX_NS: u64 = 2_147_483_647 * NS_PER_MS;

/// Options (from the table in [`crate::options`]) and preset-specific bounds a config is
/// validated against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rules {
    pub(super) initial: &'static ConfigOption,
    pub(super) max: &'static ConfigOption,
    pub(super) multiplier: &'static ConfigOption,
    pub(super) jitter: &'static ConfigOption,
    pub(super) floor: &'static ConfigOption,
    pub(super) resolution: &'static ConfigOption,
    pub(super) jitter_order: &'static ConfigOption,
    pub(super) first_unjittered: &'static ConfigOption,
    /// Smallest `initial` allowed, in ns.
    pub(super) initial_min: u64,
    /// Largest `max` allowed, in ns.
    pub(super) max_max: u64,
}

pub(super) const GENERAL: Rules = Rules {
    initial: &opt::INITIAL,
    max: &opt::MAX,
    multiplier: &opt::MULTIPLIER,
    jitter: &opt::JITTER,
    floor: &opt::FLOOR,
    resolution: &opt::RESOLUTION,
    jitter_order: &opt::JITTER_ORDER,
    first_unjittered: &opt::FIRST_DELAY_UNJITTERED,
    initial_min: 0,
    max_max: u64::MAX,
};

pub(super) const FLUSS_DISK: Rules = Rules {
    initial: &opt::FLUSS_DISK_INITIAL,
    max: &opt::FLUSS_DISK_MAX,
    initial_min: NS_PER_MS,
    max_max: FLUSS_MAX_NS,
    ..GENERAL
};

pub(super) const FLUSS_RETRY: Rules = Rules {
    initial: &opt::FLUSS_RETRY_INITIAL,
    max: &opt::FLUSS_RETRY_MAX,
    initial_min: 0,
    max_max: FLUSS_MAX_NS,
    ..GENERAL
};

pub(super) const KAFKA: Rules = Rules {
    initial: &opt::KAFKA_INITIAL,
    max: &opt::KAFKA_MAX,
    ..GENERAL
};

pub(super) const GRPC: Rules = Rules {
    initial: &opt::GRPC_INITIAL,
    max: &opt::GRPC_MAX,
    multiplier: &opt::GRPC_MULTIPLIER,
    jitter: &opt::GRPC_JITTER,
    ..GENERAL
};

pub(super) const GOBBLIN: Rules = Rules {
    initial: &opt::GOBBLIN_INITIAL,
    max: &opt::GOBBLIN_MAX,
    multiplier: &opt::GOBBLIN_MULTIPLIER,
    ..GENERAL
};

/// Builds a [`BackoffConfig`], validating it exactly (in nanoseconds, before truncation).
///
/// ```
/// use core::time::Duration;
/// use throttle_sansio::backoff::BackoffConfig;
///
/// let err = BackoffConfig::fluss_disk_write_locked()
///     .to_builder()
///     .initial(Duration::from_nanos(999_999))
///     .build()
///     .unwrap_err();
/// assert!(err.to_string().contains("client.writer.disk-write-locked.backoff"));
/// assert_eq!(err.option().method(), "BackoffConfigBuilder::initial");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct BackoffConfigBuilder {
    pub(super) initial: u64,
    pub(super) max: u64,
    pub(super) num: u32,
    pub(super) den: u32,
    pub(super) jitter: Jitter,
    pub(super) floor: u64,
    pub(super) resolution: u64,
    pub(super) budget: Option<u64>,
    pub(super) max_attempts: Option<u32>,
    pub(super) max_wait: Option<u64>,
    pub(super) order: JitterOrder,
    pub(super) first_unjittered: bool,
    pub(super) rules: Rules,
}

impl BackoffConfigBuilder {
    pub(super) const fn preset(
        rules: Rules,
        initial: u64,
        max: u64,
        (num, den): (u32, u32),
        jitter: Jitter,
    ) -> Self {
        BackoffConfigBuilder {
            initial,
            max,
            num,
            den,
            jitter,
            floor: 0,
            resolution: NS_PER_MS,
            budget: None,
            max_attempts: None,
            max_wait: None,
            order: JitterOrder::JitterThenCap,
            first_unjittered: false,
            rules,
        }
    }

    /// Whether `max` clamps the jittered delay ([`JitterOrder::JitterThenCap`], the default)
    /// or only the base ([`JitterOrder::CapThenJitter`], gRFC A6 and gRPC's connection
    /// backoff). Cap-then-jitter is refused with [`Jitter::Additive`] and
    /// [`Jitter::Decorrelated`], which cap inside their own recurrence.
    pub const fn jitter_order(mut self, order: JitterOrder) -> Self {
        self.order = order;
        self
    }

    /// Whether the first delay of every sequence is exactly its base (`initial`, floored and
    /// truncated) with nothing drawn, as gRPC's connection-backoff document waits exactly
    /// `INITIAL_BACKOFF` first; later delays are jittered as usual. Refused with
    /// [`Jitter::Additive`], whose offset jitters the first delay by definition.
    pub const fn first_delay_unjittered(mut self, yes: bool) -> Self {
        self.first_unjittered = yes;
        self
    }

    /// The first base delay; zero disables the backoff (where the rules allow it).
    pub const fn initial(mut self, initial: Duration) -> Self {
        self.initial = nanos(initial);
        self
    }

    /// The largest delay, jitter included.
    pub const fn max(mut self, max: Duration) -> Self {
        self.max = nanos(max);
        self
    }

    /// The growth factor `num/den` (at least 1: `num ≥ den > 0`), e.g. `(2, 1)` or `(16, 10)`.
    pub const fn multiplier(mut self, num: u32, den: u32) -> Self {
        self.num = num;
        self.den = den;
        self
    }

    /// The jitter strategy.
    pub const fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The smallest delay, applied after jitter (at most `max`, a multiple of `resolution`).
    pub const fn floor(mut self, floor: Duration) -> Self {
        self.floor = nanos(floor);
        self
    }

    /// Delays are truncated down to a multiple of this (at least 1 ns).
    pub const fn resolution(mut self, resolution: Duration) -> Self {
        self.resolution = nanos(resolution);
        self
    }

    /// A hard total budget per sequence: [`Backoff::next_delay`] refuses a delay larger than
    /// what is left of it, so the delays handed out never sum past it. Unlike
    /// [`max_wait`](Self::max_wait) (Gobblin's `maxWait`), which lets the wait that crosses it
    /// run.
    ///
    /// [`Backoff::next_delay`]: super::Backoff::next_delay
    pub const fn total_budget(mut self, budget: Option<Duration>) -> Self {
        self.budget = match budget {
            Some(b) => Some(nanos(b)),
            None => None,
        };
        self
    }

    /// At most `n` delays per sequence (Gobblin `ExponentialBackoff`'s `maxRetries`): the
    /// `n + 1`-th [`Backoff::next_delay`] is refused with [`Exhausted::Attempts`]. `Some(0)`
    /// refuses every retry; `None` (the default) sets no limit.
    ///
    /// [`Backoff::next_delay`]: super::Backoff::next_delay
    /// [`Exhausted::Attempts`]: super::Exhausted::Attempts
    pub const fn max_attempts(mut self, n: Option<u32>) -> Self {
        self.max_attempts = n;
        self
    }

    /// A soft total wait per sequence (Gobblin `ExponentialBackoff`'s `maxWait`): a delay is
    /// refused with [`Exhausted::MaxWait`] once the delays already handed out sum to **more**
    /// than `max_wait`; the delay that crosses it is still handed out. So the total wait can
    /// exceed `max_wait` by less than one delay, where [`total_budget`](Self::total_budget)
    /// never lets it. `None` (the default) sets no limit.
    ///
    /// [`Exhausted::MaxWait`]: super::Exhausted::MaxWait
    pub const fn max_wait(mut self, max_wait: Option<Duration>) -> Self {
        self.max_wait = match max_wait {
            Some(w) => Some(nanos(w)),
            None => None,
        };
        self
    }

    /// Checks every rule, in the order listed on [`BackoffConfigBuilder::build`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check().map(|_| ())
    }

    /// The config, or the first rule it breaks: resolution ≥ 1 ns; the preset's bounds on
    /// `initial` and `max`; `initial ≤ max`; `num ≥ den > 0`; proportional jitter ppm ≤
    /// 1 000 000, per-delay ppm ≤ 100 000 000; cap-then-jitter only with a strategy that
    /// jitters the base; an unjittered first delay not with additive jitter; `floor ≤ max`; `floor` a multiple of `resolution`; `resolution ≤ max` unless `initial`
    /// is zero (disabled); the base settles within [`MAX_RAMP_ATTEMPTS`] attempts, and so does
    /// the ramp from every start an additive offset can give. Durations past `u64::MAX` ns
    /// count as `u64::MAX` ns. `max_attempts`, `max_wait` and the total budget take any value.
    pub fn build(self) -> Result<BackoffConfig, ConfigError> {
        let (settle, settled) = self.check()?;
        Ok(self.finish(settle, settled))
    }

    fn check(&self) -> Result<(u32, u64), ConfigError> {
        let r = &self.rules;
        if self.resolution == 0 {
            return Err(ConfigError::OutOfRange {
                option: r.resolution,
                got: 0,
                min: 1,
                max: u64::MAX,
                unit: "ns",
            });
        }
        if self.initial < r.initial_min {
            return Err(ConfigError::OutOfRange {
                option: r.initial,
                got: self.initial,
                min: r.initial_min,
                max: r.max_max,
                unit: "ns",
            });
        }
        if self.max > r.max_max {
            return Err(ConfigError::OutOfRange {
                option: r.max,
                got: self.max,
                min: r.initial_min,
                max: r.max_max,
                unit: "ns",
            });
        }
        if self.initial > self.max {
            return Err(ConfigError::Inverted {
                option: r.initial,
                limit: r.max,
            });
        }
        if self.den == 0 {
            return Err(ConfigError::Invalid {
                option: r.multiplier,
                reason: "the denominator must be positive",
            });
        }
        if self.num < self.den {
            return Err(ConfigError::Invalid {
                option: r.multiplier,
                reason: "must be at least 1 (num >= den): a backoff never shrinks \
                         (docs/design.md), a deliberate departure from gRFC A6, which allows \
                         multipliers below 1",
            });
        }
        self.jitter.validate(r.jitter)?;
        if self.order == JitterOrder::CapThenJitter && !self.jitter.jitters_the_base() {
            return Err(ConfigError::Invalid {
                option: r.jitter_order,
                reason: "cap-then-jitter needs a jitter around the capped base (none, \
                         proportional, full, equal or per-delay); additive and decorrelated \
                         jitter cap inside their own recurrence",
            });
        }
        if self.first_unjittered && self.jitter.sequence_offset().is_some() {
            return Err(ConfigError::Invalid {
                option: r.first_unjittered,
                reason: "additive jitter offsets the first delay by definition",
            });
        }
        if self.floor > self.max {
            return Err(ConfigError::Inverted {
                option: r.floor,
                limit: r.max,
            });
        }
        if self
            .floor
            .checked_rem(self.resolution)
            .map_or(self.floor != 0, |r| r != 0)
        {
            return Err(ConfigError::Invalid {
                option: r.floor,
                reason: "must be a multiple of the resolution",
            });
        }
        // Every delay would truncate to zero (e.g. 500 µs..900 µs on a 1 ms grid).
        if self.initial > 0 && self.resolution > self.max {
            return Err(ConfigError::Inverted {
                option: r.resolution,
                limit: r.max,
            });
        }
        let settles =
            ramp(self.initial, self.max, self.num, self.den_div()).ok_or(ConfigError::Invalid {
                option: r.multiplier,
                reason: "grows too slowly: the delay must settle within 4096 attempts",
            })?;
        if let Some(start) = self.slowest_jittered_start() {
            if ramp(start, self.max, self.num, self.den_div()).is_none() {
                return Err(ConfigError::Invalid {
                    option: r.jitter,
                    reason: "a jittered start grows too slowly: the delay must settle within \
                             4096 attempts",
                });
            }
        }
        Ok(settles)
    }

    /// The additive start whose ramp takes longest, when that is not `initial` itself.
    ///
    /// `⌊d·num/den⌋ > d` exactly when `d ≥ t = ⌈den/(num − den)⌉`, and a start that grows
    /// keeps growing until `max`. Starts below `t` never move; among those that grow, a larger
    /// start stays ahead of a smaller one, so the smallest growing start is the slowest. With
    /// `initial ≥ t` that is `initial`, already checked; otherwise it is `t`, if an offset in
    /// `[0, range)` can reach it.
    fn slowest_jittered_start(&self) -> Option<u64> {
        let range = duration_to_nanos(self.jitter.sequence_offset()?);
        let step = u64::from(self.num.checked_sub(self.den)?);
        let t = u64::from(self.den).div_ceil(step.max(1));
        let highest = self
            .initial
            .saturating_add(range.checked_sub(1)?)
            .min(self.max);
        (self.initial > 0 && step > 0 && self.initial < t && t <= highest).then_some(t)
    }

    /// A preset's config; presets are checked by `presets_pass_their_own_validation`.
    pub(super) fn assemble(self) -> BackoffConfig {
        let (settle, settled) = ramp(self.initial, self.max, self.num, self.den_div())
            .unwrap_or((MAX_RAMP_ATTEMPTS, self.max));
        self.finish(settle, settled)
    }

    /// `den` as a [`Divisor`], `None` for 1 (and for 0, which validation refuses before any
    /// ramp is computed).
    fn den_div(&self) -> Option<Divisor> {
        Divisor::new(u64::from(self.den))
    }

    fn finish(self, settle: u32, settled: u64) -> BackoffConfig {
        // `None` for 1 ns (and for 0, which validation refuses): nothing to truncate.
        let res_div = Divisor::new(self.resolution);
        let spread = Spread::of(self.jitter, self.initial, self.max, self.resolution);
        // With cap-then-jitter nothing clamps the drawn delay: the grid's largest value.
        let ceiling = match self.order {
            JitterOrder::JitterThenCap => self.max,
            JitterOrder::CapThenJitter => u64::MAX,
        };
        BackoffConfig {
            den_div: self.den_div(),
            res_div,
            spread,
            top: round_down(ceiling, res_div),
            bottom: round_down(self.floor, res_div).max(self.resolution),
            initial: self.initial,
            max: self.max,
            num: self.num,
            den: self.den,
            jitter: self.jitter,
            floor: self.floor,
            resolution: self.resolution,
            budget: self.budget,
            max_attempts: self.max_attempts,
            max_wait: self.max_wait,
            order: self.order,
            first_unjittered: self.first_unjittered,
            settle,
            settled,
            rules: self.rules,
        }
    }
}
