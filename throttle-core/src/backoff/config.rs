//! The validated config: presets, getters, and the base delay of any attempt (step 1).

use core::time::Duration;

use super::arith::{grow, grow_narrow};
use super::builder::{
    BackoffConfigBuilder, FLUSS_DISK, FLUSS_RETRY, GENERAL, GOBBLIN, GRPC, KAFKA, NS_PER_MS, Rules,
};
use super::jitter::Spread;
use super::{Jitter, JitterOrder, MAX_RAMP_ATTEMPTS};
use crate::divisor::Divisor;
use crate::error::ConfigError;
use crate::rng::Rng;

/// How backoff delays grow, are jittered, floored, truncated and budgeted.
///
/// Built by a preset, [`BackoffConfig::builder`], or [`BackoffConfig::to_builder`] (which keeps
/// a preset's option names and bounds). A built config is always valid. `Default` is the Fluss
/// disk-write-locked preset. See the [module docs](super) for the order of operations.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackoffConfig {
    pub(super) initial: u64,
    pub(super) max: u64,
    pub(super) num: u32,
    pub(super) den: u32,
    pub(super) jitter: Jitter,
    pub(super) floor: u64,
    pub(super) resolution: u64,
    pub(super) budget: Option<u64>,
    /// Most delays per sequence (Gobblin `maxRetries`).
    pub(super) max_attempts: Option<u32>,
    /// Soft total wait, in ns (Gobblin `maxWait`).
    pub(super) max_wait: Option<u64>,
    /// Whether `max` clamps the jittered delay or only the base.
    pub(super) order: JitterOrder,
    /// The first delay of a sequence is its base, undrawn.
    pub(super) first_unjittered: bool,
    /// First attempt whose base is final (`max`, or a value the multiplier cannot grow).
    pub(super) settle: u32,
    /// The base of every attempt from `settle` on.
    pub(super) settled: u64,
    /// `den` and `resolution` prepared for division without a divide instruction, `None`
    /// for 1 (derived from them, so equality still means equal options).
    pub(super) den_div: Option<Divisor>,
    pub(super) res_div: Option<Divisor>,
    /// What an enabled, non-fixed [`Jitter::Proportional`] draws with, else `None`.
    pub(super) spread: Option<Spread>,
    /// `max` truncated to the resolution with jitter-then-cap; with cap-then-jitter the grid's
    /// largest value (nothing clamps the drawn delay).
    pub(super) top: u64,
    /// `floor` truncated to the resolution, and at least one step.
    pub(super) bottom: u64,
    pub(super) rules: Rules,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self::fluss_disk_write_locked()
    }
}

const fn ms(n: u64) -> u64 {
    n * NS_PER_MS
}

/// ±20 %, the jitter Fluss, Kafka and gRPC use.
pub(super) const TWENTY_PERCENT: Jitter = Jitter::Proportional { ppm: 200_000 };

impl BackoffConfig {
    /// The same `delay` before every retry, unjittered (backon's `ConstantBuilder`, tower's
    /// fixed backoff): `initial = max = delay`, no jitter. Refuses a delay the builder
    /// refuses (see [`BackoffConfigBuilder::initial`]).
    ///
    /// ```
    /// use core::time::Duration;
    /// use throttle_sansio::backoff::BackoffConfig;
    /// use throttle_sansio::rng::SplitMix64;
    ///
    /// let cfg = BackoffConfig::constant(Duration::from_millis(100))?;
    /// let mut rng = SplitMix64::new(1);
    /// assert_eq!(cfg.delay_for(0, &mut rng), Duration::from_millis(100));
    /// assert_eq!(cfg.delay_for(7, &mut rng), Duration::from_millis(100));
    /// # Ok::<(), throttle_sansio::ConfigError>(())
    /// ```
    pub fn constant(delay: Duration) -> Result<Self, ConfigError> {
        BackoffConfig::builder()
            .initial(delay)
            .max(delay)
            .jitter(Jitter::None)
            .build()
    }

    /// Fluss `DISK_WRITE_LOCKED`: 1 s → 10 s, ×2, ±20 %, floor 1 ms; validated as
    /// `1 ms ≤ initial ≤ max ≤ 2 147 483 647 ms`.
    pub fn fluss_disk_write_locked() -> Self {
        BackoffConfigBuilder::preset(FLUSS_DISK, ms(1_000), ms(10_000), (2, 1), TWENTY_PERCENT)
            .floor(Duration::from_millis(1))
            .assemble()
    }

    /// Fluss retriable write errors: 100 ms → 1 s, ×2, ±20 %; validated as
    /// `0 ≤ initial ≤ max ≤ 2 147 483 647 ms`, where `initial = 0` disables the backoff.
    pub fn fluss_retriable_write() -> Self {
        BackoffConfigBuilder::preset(FLUSS_RETRY, ms(100), ms(1_000), (2, 1), TWENTY_PERCENT)
            .assemble()
    }

    /// Kafka client retries (`retry.backoff.ms` 100, `retry.backoff.max.ms` 1000, ×2, ±20 %).
    pub fn kafka_retry() -> Self {
        BackoffConfigBuilder::preset(KAFKA, ms(100), ms(1_000), (2, 1), TWENTY_PERCENT).assemble()
    }

    /// gRPC connection backoff (grpc/grpc `doc/connection-backoff.md`): the first wait is
    /// exactly `INITIAL_BACKOFF` = 1 s (nothing drawn), then the base grows
    /// `min(cur·1.6, 120 s)` and each wait is that base ±20 %, jittered after the cap
    /// ([`JitterOrder::CapThenJitter`]), so waits at the cap spread over 96–144 s. The
    /// protocol's `MIN_CONNECT_TIMEOUT` (20 s) is the connection table's setting,
    /// [`ConnConfig::with_min_connect_timeout`](crate::conn_key::ConnConfig::with_min_connect_timeout):
    /// the table, not the backoff, gives each attempt its time.
    pub fn grpc_connection() -> Self {
        BackoffConfigBuilder::preset(GRPC, ms(1_000), ms(120_000), (16, 10), TWENTY_PERCENT)
            .jitter_order(JitterOrder::CapThenJitter)
            .first_delay_unjittered(true)
            .assemble()
    }

    /// Gobblin throttling client: 500 ms plus an additive offset in `[0, 500 ms)` drawn once
    /// per sequence, ×2, at most 10 s.
    ///
    /// Upstream grows by `α·d + 1` ms; this grows by exactly `α·d` (500, 1000, 2000 … ms).
    pub fn gobblin_throttling_client() -> Self {
        let jitter = Jitter::Additive {
            range: Duration::from_millis(500),
        };
        BackoffConfigBuilder::preset(GOBBLIN, ms(500), ms(10_000), (2, 1), jitter).assemble()
    }

    /// A builder with general rules (`initial ≤ max`, no preset bounds), starting from
    /// 1 s → 10 s, ×2, ±20 %, floor 0, resolution 1 ms, no budget, no attempt or wait limit.
    ///
    /// `const`, like every setter of the builder, so a config's options can be a `const` (as
    /// backon's `ExponentialBuilder` can); validation and the precomputed ramp happen in
    /// [`BackoffConfigBuilder::build`], at run time:
    ///
    /// ```
    /// use core::time::Duration;
    /// use throttle_sansio::backoff::{BackoffConfig, BackoffConfigBuilder, Jitter, JitterOrder};
    ///
    /// const RETRY: BackoffConfigBuilder = BackoffConfig::builder()
    ///     .initial(Duration::from_millis(100))
    ///     .max(Duration::from_secs(1))
    ///     .jitter(Jitter::PerDelay { ppm: 1_000_000 })
    ///     .jitter_order(JitterOrder::CapThenJitter);
    /// let cfg = RETRY.build()?;
    /// assert_eq!(cfg.initial(), Duration::from_millis(100));
    /// # Ok::<(), throttle_sansio::ConfigError>(())
    /// ```
    pub const fn builder() -> BackoffConfigBuilder {
        BackoffConfigBuilder::preset(GENERAL, ms(1_000), ms(10_000), (2, 1), TWENTY_PERCENT)
    }

    /// A builder holding this config's values, option names and bounds (a Fluss preset's
    /// builder keeps refusing `initial < 1 ms`).
    pub fn to_builder(&self) -> BackoffConfigBuilder {
        BackoffConfigBuilder {
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
            rules: self.rules,
        }
    }

    /// Whether `other` was built under the same option names and bounds (the same preset, or
    /// both general): the preset a serialised config names.
    #[cfg(feature = "serde")]
    pub(crate) fn same_rules(&self, other: &BackoffConfig) -> bool {
        self.rules == other.rules
    }

    /// Delay for 0-based `attempt` as the first draw of a fresh sequence.
    ///
    /// A fresh sequence has no additive offset yet, so [`Jitter::Additive`] draws a new one;
    /// [`Jitter::Decorrelated`] has no previous delay, so the base of `attempt − 1` stands in
    /// for it (`initial` at attempt 0, which is exactly a sequence's first draw). No budget
    /// applies here. Bounded work for every attempt.
    pub fn delay_for<R: Rng + ?Sized>(&self, attempt: u32, rng: &mut R) -> Duration {
        let base = self.base_for(attempt, &mut None, rng);
        let prev = self.stand_in_prev(attempt);
        Duration::from_nanos(self.draw_at(attempt, base, prev, rng))
    }

    /// The unjittered base delay of `attempt`: step 1 only (no floor, no truncation).
    pub fn base_delay(&self, attempt: u32) -> Duration {
        Duration::from_nanos(self.base_at(attempt))
    }

    /// The first attempt whose base delay is final: from it on every base is the same (`max`,
    /// or a value the multiplier can no longer grow). At most [`MAX_RAMP_ATTEMPTS`].
    pub fn cap_attempt(&self) -> u32 {
        self.settle
    }

    /// Whether `initial` is zero, which disables the backoff: every delay is zero, without
    /// jitter, floor or budget, and nothing is drawn.
    pub fn is_disabled(&self) -> bool {
        self.initial == 0
    }

    /// The first base delay.
    pub fn initial(&self) -> Duration {
        Duration::from_nanos(self.initial)
    }

    /// The cap: with [`JitterOrder::JitterThenCap`] the largest delay, jitter included; with
    /// [`JitterOrder::CapThenJitter`] the largest base, which the jitter may exceed (see
    /// [`BackoffConfig::largest_delay`]).
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max)
    }

    /// Where `max` applies relative to the jitter draw.
    pub fn jitter_order(&self) -> JitterOrder {
        self.order
    }

    /// Whether the first delay of a sequence is its base, with nothing drawn.
    pub fn first_delay_unjittered(&self) -> bool {
        self.first_unjittered
    }

    /// The largest delay any draw can give (zero when disabled): `max` on the grid with
    /// jitter-then-cap; with cap-then-jitter `max` scaled by the largest factor a
    /// proportional or per-delay draw can take, floored and truncated like a delay.
    pub fn largest_delay(&self) -> Duration {
        if self.is_disabled() {
            return Duration::ZERO;
        }
        let raw = match (&self.spread, self.order) {
            (Some(spread), JitterOrder::CapThenJitter) => {
                let factor = spread.low + spread.width.saturating_sub(1);
                super::arith::mul_div(self.max, factor, super::jitter::PPM, |n| {
                    n / super::jitter::PPM
                })
            }
            _ => self.max,
        };
        Duration::from_nanos(self.finish(raw))
    }

    /// The growth factor as `(num, den)`.
    pub fn multiplier(&self) -> (u32, u32) {
        (self.num, self.den)
    }

    /// The jitter strategy.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The smallest delay (applied after jitter).
    pub fn floor(&self) -> Duration {
        Duration::from_nanos(self.floor)
    }

    /// Delays are truncated down to a multiple of this.
    pub fn resolution(&self) -> Duration {
        Duration::from_nanos(self.resolution)
    }

    /// The hard total budget of one sequence, if any.
    pub fn total_budget(&self) -> Option<Duration> {
        self.budget.map(Duration::from_nanos)
    }

    /// The most delays one sequence hands out (Gobblin's `maxRetries`), if limited.
    pub fn max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }

    /// The soft total wait of one sequence (Gobblin's `maxWait`), if any.
    pub fn max_wait(&self) -> Option<Duration> {
        self.max_wait.map(Duration::from_nanos)
    }

    /// Base of `attempt`: the settled value from `settle` on, otherwise at most `settle`
    /// steps of the recurrence.
    pub(super) fn base_at(&self, attempt: u32) -> u64 {
        if attempt >= self.settle {
            return self.settled;
        }
        let mut d = self.initial;
        for _ in 0..attempt {
            d = grow(d, self.num, self.den_div, self.max);
        }
        d
    }

    /// The base a sequence with additive offset `offset` uses at `attempt` (drawing the offset
    /// first if there is none yet): for [`Jitter::Additive`] the recurrence grown from the
    /// jittered start, otherwise the unjittered base.
    pub(super) fn base_for<R: Rng + ?Sized>(
        &self,
        attempt: u32,
        offset: &mut Option<u64>,
        rng: &mut R,
    ) -> u64 {
        match self.jittered_start(offset, rng) {
            Some(start) => self.ramp_from(start, attempt),
            None => self.base_at(attempt),
        }
    }

    /// `attempt` steps of the recurrence from `start`, stopping once it stops changing.
    /// Validation guarantees every start an offset can give settles within
    /// [`MAX_RAMP_ATTEMPTS`] steps, so stopping there too is exact.
    fn ramp_from(&self, start: u64, attempt: u32) -> u64 {
        let mut d = start;
        for _ in 0..attempt.min(MAX_RAMP_ATTEMPTS) {
            let next = grow(d, self.num, self.den_div, self.max);
            if next == d {
                break;
            }
            d = next;
        }
        d
    }

    /// The base after `prev` in a running sequence: `grow(prev)`.
    pub(super) fn next_base(&self, prev: u64) -> u64 {
        self.next_base_narrow(prev)
            .unwrap_or_else(|| grow(prev, self.num, self.den_div, self.max))
    }

    /// [`BackoffConfig::next_base`] when it needs no product wider than `u64`, else `None`.
    #[inline]
    pub(super) fn next_base_narrow(&self, prev: u64) -> Option<u64> {
        // `settled` is a fixed point of `grow`. Comparing (a predictable branch) instead of
        // multiplying also keeps the previous base off the critical path once the ramp is over.
        if prev == self.settled {
            return Some(self.settled);
        }
        grow_narrow(prev, self.num, self.den_div, self.max)
    }
}
