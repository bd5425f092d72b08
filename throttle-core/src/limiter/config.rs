//! The limiter's configuration: one algorithm (AIMD or Gradient2) and an optional sample
//! window. Every ratio is in ppm (parts per million), every span a `Duration`.

use core::time::Duration;

use crate::error::ConfigError;
use crate::options::{ConfigOption, limiter as opt};
use crate::time::duration_to_nanos as nanos;

/// One million: a ratio of 1.0 in ppm.
pub(crate) const PPM: u32 = 1_000_000;

/// The largest `long_window` (samples): keeps Gradient2's fixed-point average in `u128`.
pub const MAX_LONG_WINDOW: u32 = 1 << 20;

/// The largest Gradient2 `rtt_tolerance_ppm`: a tolerated rise of 1000×.
pub const MAX_RTT_TOLERANCE_PPM: u32 = 1_000_000_000;

fn out_of_range(
    option: &'static ConfigOption,
    got: u64,
    min: u64,
    max: u64,
    unit: &'static str,
) -> ConfigError {
    ConfigError::OutOfRange {
        option,
        got,
        min,
        max,
        unit,
    }
}

/// The limits an algorithm clamps to, kept and checked alike by both: `1 ≤ min ≤ initial ≤ max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) min: u32,
    pub(crate) initial: u32,
    pub(crate) max: u32,
}

/// Netflix's defaults for both algorithms: `minLimit` 20, `initialLimit` 20, a maximum of 200.
const NETFLIX_LIMITS: Limits = Limits {
    min: 20,
    initial: 20,
    max: 200,
};

impl Limits {
    fn check(
        &self,
        [min_opt, initial_opt, max_opt]: [&'static ConfigOption; 3],
    ) -> Result<(), ConfigError> {
        let Limits { min, initial, max } = *self;
        if min == 0 {
            return Err(out_of_range(min_opt, 0, 1, u64::from(u32::MAX), "requests"));
        }
        if min > max {
            return Err(ConfigError::Inverted {
                option: min_opt,
                limit: max_opt,
            });
        }
        if !(min..=max).contains(&initial) {
            return Err(out_of_range(
                initial_opt,
                u64::from(initial),
                u64::from(min),
                u64::from(max),
                "requests",
            ));
        }
        Ok(())
    }
}

/// The limit methods, alike on both algorithms' configurations.
macro_rules! limit_methods {
    ($($config:ty),*) => {$(
        impl $config {
            /// The smallest limit, the limit before the first sample, and the largest limit
            /// (`1 ≤ min ≤ initial ≤ max`, checked by `validate`).
            #[must_use]
            pub fn with_limits(mut self, min: u32, initial: u32, max: u32) -> Self {
                self.limits = Limits { min, initial, max };
                self
            }

            /// The smallest limit.
            pub fn min(&self) -> u32 {
                self.limits.min
            }

            /// The limit before the first sample.
            pub fn initial(&self) -> u32 {
                self.limits.initial
            }

            /// The largest limit.
            pub fn max(&self) -> u32 {
                self.limits.max
            }
        }
    )*};
}

limit_methods!(AimdConfig, Gradient2Config);

/// Additive increase, multiplicative decrease (Netflix's `AIMDLimit`).
///
/// A sample that was dropped, or whose round trip exceeds the timeout, multiplies the limit by
/// the backoff ratio (rounded down); any other sample adds one while the requests in flight at
/// its start are at least half the limit. The result is clamped to `[min, max]`.
///
/// [`Default`] is Netflix's `AIMDLimit.Builder`: limits 20 / 20 / 200, backoff ratio 0.9,
/// timeout 5 s.
///
/// ```
/// use core::time::Duration;
/// use throttle_sansio::limiter::AimdConfig;
///
/// let shard = AimdConfig::default().with_limits(1, 4, 64).with_timeout(Duration::from_millis(500));
/// assert!(shard.validate().is_ok());
/// assert!(AimdConfig::default().with_backoff_ratio_ppm(1_000_000).validate().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AimdConfig {
    pub(crate) limits: Limits,
    pub(crate) backoff_ratio_ppm: u32,
    pub(crate) timeout: Duration,
}

impl Default for AimdConfig {
    /// Netflix concurrency-limits `AIMDLimit.Builder`: `minLimit` 20, `initialLimit` 20,
    /// `maxLimit` 200, `backoffRatio` 0.9, `timeout` 5 s.
    fn default() -> Self {
        AimdConfig {
            limits: NETFLIX_LIMITS,
            backoff_ratio_ppm: 900_000,
            timeout: Duration::from_secs(5),
        }
    }
}

impl AimdConfig {
    /// The factor a drop multiplies the limit by, in ppm: `500_000..=999_999` (Netflix's
    /// `[0.5, 1.0)`).
    #[must_use]
    pub fn with_backoff_ratio_ppm(mut self, ppm: u32) -> Self {
        self.backoff_ratio_ppm = ppm;
        self
    }

    /// A round trip longer than `timeout` counts as a drop (at least 1 ns).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The backoff ratio, in ppm.
    pub fn backoff_ratio_ppm(&self) -> u32 {
        self.backoff_ratio_ppm
    }

    /// The timeout past which a round trip counts as a drop.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Refuses limits out of order or below 1, a backoff ratio outside `500_000..=999_999`
    /// ppm and a zero timeout.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.limits
            .check([&opt::AIMD_MIN, &opt::AIMD_INITIAL, &opt::AIMD_MAX])?;
        if !(500_000..PPM).contains(&self.backoff_ratio_ppm) {
            return Err(out_of_range(
                &opt::AIMD_BACKOFF_RATIO,
                u64::from(self.backoff_ratio_ppm),
                500_000,
                u64::from(PPM - 1),
                "ppm",
            ));
        }
        if self.timeout.is_zero() {
            return Err(out_of_range(&opt::AIMD_TIMEOUT, 0, 1, u64::MAX, "ns"));
        }
        Ok(())
    }

    pub(crate) fn timeout_ns(&self) -> u64 {
        nanos(self.timeout)
    }
}

/// Netflix's `Gradient2Limit`: the limit follows the ratio of a long-term average round trip
/// to the current one, plus a fixed allowance for queueing, smoothed.
///
/// `docs/limiter.md` gives the integer rules step by step. [`Default`] is Netflix's
/// `Gradient2Limit.Builder`: limits 20 / 20 / 200, smoothing 0.2, queue size 4, long window
/// 600 samples, RTT tolerance 1.5.
///
/// ```
/// use throttle_sansio::limiter::Gradient2Config;
///
/// let shard = Gradient2Config::default().with_limits(1, 4, 64).with_queue_size(1);
/// assert!(shard.validate().is_ok());
/// assert!(Gradient2Config::default().with_rtt_tolerance_ppm(999_999).validate().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Gradient2Config {
    pub(crate) limits: Limits,
    pub(crate) smoothing_ppm: u32,
    pub(crate) queue_size: u32,
    pub(crate) long_window: u32,
    pub(crate) rtt_tolerance_ppm: u32,
}

impl Default for Gradient2Config {
    /// Netflix concurrency-limits `Gradient2Limit.Builder`: `minLimit` 20, `initialLimit` 20,
    /// `maxConcurrency` 200, `smoothing` 0.2, `queueSize` 4, `longWindow` 600,
    /// `rttTolerance` 1.5.
    fn default() -> Self {
        Gradient2Config {
            limits: NETFLIX_LIMITS,
            smoothing_ppm: 200_000,
            queue_size: 4,
            long_window: 600,
            rtt_tolerance_ppm: 1_500_000,
        }
    }
}

impl Gradient2Config {
    /// The share of each new estimate taken into the limit, in ppm: `1..=1_000_000`.
    #[must_use]
    pub fn with_smoothing_ppm(mut self, ppm: u32) -> Self {
        self.smoothing_ppm = ppm;
        self
    }

    /// The requests of queueing allowed on top of the gradient's estimate (Netflix's constant
    /// `queueSize`; its function form is not offered).
    #[must_use]
    pub fn with_queue_size(mut self, queue_size: u32) -> Self {
        self.queue_size = queue_size;
        self
    }

    /// The samples the long-term round trip averages over: `1..=`[`MAX_LONG_WINDOW`].
    #[must_use]
    pub fn with_long_window(mut self, samples: u32) -> Self {
        self.long_window = samples;
        self
    }

    /// The rise of the current round trip over the long-term one tolerated before the limit
    /// shrinks, in ppm: `1_000_000..=`[`MAX_RTT_TOLERANCE_PPM`].
    #[must_use]
    pub fn with_rtt_tolerance_ppm(mut self, ppm: u32) -> Self {
        self.rtt_tolerance_ppm = ppm;
        self
    }

    /// The smoothing, in ppm.
    pub fn smoothing_ppm(&self) -> u32 {
        self.smoothing_ppm
    }

    /// The queueing allowance, in requests.
    pub fn queue_size(&self) -> u32 {
        self.queue_size
    }

    /// The long window, in samples.
    pub fn long_window(&self) -> u32 {
        self.long_window
    }

    /// The RTT tolerance, in ppm.
    pub fn rtt_tolerance_ppm(&self) -> u32 {
        self.rtt_tolerance_ppm
    }

    /// Refuses limits out of order or below 1, and a smoothing, long window or tolerance
    /// outside its range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.limits.check([
            &opt::GRADIENT2_MIN,
            &opt::GRADIENT2_INITIAL,
            &opt::GRADIENT2_MAX,
        ])?;
        let ranges: [(&'static ConfigOption, u32, u32, u32, &'static str); 3] = [
            (&opt::GRADIENT2_SMOOTHING, self.smoothing_ppm, 1, PPM, "ppm"),
            (
                &opt::GRADIENT2_LONG_WINDOW,
                self.long_window,
                1,
                MAX_LONG_WINDOW,
                "samples",
            ),
            (
                &opt::GRADIENT2_RTT_TOLERANCE,
                self.rtt_tolerance_ppm,
                PPM,
                MAX_RTT_TOLERANCE_PPM,
                "ppm",
            ),
        ];
        for (option, got, min, max, unit) in ranges {
            if !(min..=max).contains(&got) {
                return Err(out_of_range(
                    option,
                    u64::from(got),
                    u64::from(min),
                    u64::from(max),
                    unit,
                ));
            }
        }
        Ok(())
    }
}

/// Netflix's `WindowedLimit`: samples are gathered into windows, and each window that holds
/// enough samples updates the algorithm once, with the window's mean round trip, its largest
/// in-flight count and whether any sample in it was dropped.
///
/// A window closes at the first sample given after its end; the next one then lasts twice the
/// closed window's smallest round trip, clamped to `[min_window, max_window]`. Round trips
/// below `min_rtt_threshold` are ignored. [`Default`] is Netflix's: windows of 1 s, at least
/// 10 samples, threshold 100 µs.
///
/// ```
/// use core::time::Duration;
/// use throttle_sansio::limiter::SampleWindowConfig;
///
/// let ms = Duration::from_millis(1);
/// let fast = SampleWindowConfig::default().with_window_time(10 * ms, 100 * ms).with_window_size(4);
/// assert!(fast.validate().is_ok());
/// assert!(SampleWindowConfig::default().with_window_time(2 * ms, ms).validate().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SampleWindowConfig {
    pub(crate) min_window: Duration,
    pub(crate) max_window: Duration,
    pub(crate) window_size: u32,
    pub(crate) min_rtt_threshold: Duration,
}

impl Default for SampleWindowConfig {
    /// Netflix concurrency-limits `WindowedLimit.Builder`: `minWindowTime` and
    /// `maxWindowTime` 1 s, `windowSize` 10, `minRttThreshold` 100 µs.
    fn default() -> Self {
        SampleWindowConfig {
            min_window: Duration::from_secs(1),
            max_window: Duration::from_secs(1),
            window_size: 10,
            min_rtt_threshold: Duration::from_micros(100),
        }
    }
}

impl SampleWindowConfig {
    /// The shortest and the longest window (`0 < min ≤ max`).
    #[must_use]
    pub fn with_window_time(mut self, min: Duration, max: Duration) -> Self {
        (self.min_window, self.max_window) = (min, max);
        self
    }

    /// The samples a window needs before it updates the limit (at least 1).
    #[must_use]
    pub fn with_window_size(mut self, samples: u32) -> Self {
        self.window_size = samples;
        self
    }

    /// Round trips shorter than this are ignored (zero keeps every sample).
    #[must_use]
    pub fn with_min_rtt_threshold(mut self, threshold: Duration) -> Self {
        self.min_rtt_threshold = threshold;
        self
    }

    /// The shortest window.
    pub fn min_window(&self) -> Duration {
        self.min_window
    }

    /// The longest window.
    pub fn max_window(&self) -> Duration {
        self.max_window
    }

    /// The samples a window needs.
    pub fn window_size(&self) -> u32 {
        self.window_size
    }

    /// The round trip below which samples are ignored.
    pub fn min_rtt_threshold(&self) -> Duration {
        self.min_rtt_threshold
    }

    /// Refuses a zero window time, windows out of order and a window size of 0.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.min_window.is_zero() {
            return Err(out_of_range(&opt::WINDOW_MIN_TIME, 0, 1, u64::MAX, "ns"));
        }
        if self.min_window > self.max_window {
            return Err(ConfigError::Inverted {
                option: &opt::WINDOW_MIN_TIME,
                limit: &opt::WINDOW_MAX_TIME,
            });
        }
        if self.window_size == 0 {
            return Err(out_of_range(
                &opt::WINDOW_SIZE,
                0,
                1,
                u64::from(u32::MAX),
                "samples",
            ));
        }
        Ok(())
    }

    pub(crate) fn threshold_ns(&self) -> u64 {
        nanos(self.min_rtt_threshold)
    }

    pub(crate) fn window_ns(&self) -> (u64, u64) {
        (nanos(self.min_window), nanos(self.max_window))
    }
}

/// The algorithm a [`Limiter`](super::Limiter) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Algorithm {
    /// Additive increase, multiplicative decrease on drops and timeouts.
    Aimd(AimdConfig),
    /// The gradient of the long-term to the current round trip.
    Gradient2(Gradient2Config),
}

impl Algorithm {
    /// `(min, initial, max)` of the algorithm's limits.
    pub fn limits(&self) -> (u32, u32, u32) {
        match self {
            Algorithm::Aimd(AimdConfig { limits, .. })
            | Algorithm::Gradient2(Gradient2Config { limits, .. }) => {
                (limits.min, limits.initial, limits.max)
            }
        }
    }
}

/// A [`Limiter`](super::Limiter)'s configuration: an algorithm, and optionally a sample
/// window in front of it.
///
/// ```
/// use throttle_sansio::limiter::{AimdConfig, Gradient2Config, LimiterConfig, SampleWindowConfig};
///
/// let aimd = LimiterConfig::aimd(AimdConfig::default());
/// let windowed = LimiterConfig::gradient2(Gradient2Config::default())
///     .with_window(SampleWindowConfig::default());
/// assert!(aimd.validate().is_ok() && windowed.validate().is_ok());
/// assert_eq!(windowed.limits(), (20, 20, 200));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimiterConfig {
    pub(crate) algorithm: Algorithm,
    pub(crate) window: Option<SampleWindowConfig>,
}

impl LimiterConfig {
    /// AIMD, every sample applied as it comes (Netflix's `AIMDLimit` used directly).
    pub const fn aimd(config: AimdConfig) -> Self {
        LimiterConfig {
            algorithm: Algorithm::Aimd(config),
            window: None,
        }
    }

    /// Gradient2, every sample applied as it comes.
    pub const fn gradient2(config: Gradient2Config) -> Self {
        LimiterConfig {
            algorithm: Algorithm::Gradient2(config),
            window: None,
        }
    }

    /// Samples go through a window first (Netflix's `WindowedLimit` around the algorithm).
    #[must_use]
    pub fn with_window(mut self, window: SampleWindowConfig) -> Self {
        self.window = Some(window);
        self
    }

    /// Every sample goes to the algorithm as it comes.
    #[must_use]
    pub fn without_window(mut self) -> Self {
        self.window = None;
        self
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// The sample window, if any.
    pub fn window(&self) -> Option<&SampleWindowConfig> {
        self.window.as_ref()
    }

    /// `(min, initial, max)` of the limits.
    pub fn limits(&self) -> (u32, u32, u32) {
        self.algorithm.limits()
    }

    /// Validates the algorithm's settings and the window's.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match &self.algorithm {
            Algorithm::Aimd(c) => c.validate()?,
            Algorithm::Gradient2(c) => c.validate()?,
        }
        self.window
            .as_ref()
            .map_or(Ok(()), SampleWindowConfig::validate)
    }
}
