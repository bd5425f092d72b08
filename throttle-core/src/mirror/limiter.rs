//! The adaptive limiter's mirrors: its two algorithms, its sample window, and the choice of
//! one algorithm with an optional window.

use core::time::Duration;

use serde::{Deserialize, Serialize};

use super::leaf::{field, to_ms};
use super::via_mirror;
use crate::error::ConfigError;
use crate::limiter::{AimdConfig, Algorithm, Gradient2Config, LimiterConfig, SampleWindowConfig};
use crate::options::limiter as opt;

/// [`AimdConfig`] as written, checked by [`AimdConfig::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AimdConfigMirror {
    /// [`AimdConfig::with_limits`]: the smallest limit.
    #[serde(deserialize_with = "field::min")]
    pub min: u32,
    /// [`AimdConfig::with_limits`]: the limit before the first sample.
    #[serde(deserialize_with = "field::initial")]
    pub initial: u32,
    /// [`AimdConfig::with_limits`]: the largest limit.
    #[serde(deserialize_with = "field::max")]
    pub max: u32,
    /// [`AimdConfig::with_backoff_ratio_ppm`].
    #[serde(deserialize_with = "field::backoff_ratio_ppm")]
    pub backoff_ratio_ppm: u32,
    /// [`AimdConfig::with_timeout`], in ms.
    #[serde(deserialize_with = "field::timeout_ms")]
    pub timeout_ms: u64,
}

impl TryFrom<&AimdConfig> for AimdConfigMirror {
    type Error = ConfigError;
    /// Refuses a timeout that is not a whole number of milliseconds.
    fn try_from(cfg: &AimdConfig) -> Result<Self, ConfigError> {
        Ok(AimdConfigMirror {
            min: cfg.min(),
            initial: cfg.initial(),
            max: cfg.max(),
            backoff_ratio_ppm: cfg.backoff_ratio_ppm(),
            timeout_ms: to_ms(&opt::AIMD_TIMEOUT, cfg.timeout())?,
        })
    }
}

impl TryFrom<AimdConfigMirror> for AimdConfig {
    type Error = ConfigError;
    fn try_from(m: AimdConfigMirror) -> Result<Self, ConfigError> {
        let cfg = AimdConfig::default()
            .with_limits(m.min, m.initial, m.max)
            .with_backoff_ratio_ppm(m.backoff_ratio_ppm)
            .with_timeout(Duration::from_millis(m.timeout_ms));
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(AimdConfig, AimdConfigMirror);

/// [`Gradient2Config`] as written, checked by [`Gradient2Config::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Gradient2ConfigMirror {
    /// [`Gradient2Config::with_limits`]: the smallest limit.
    #[serde(deserialize_with = "field::min")]
    pub min: u32,
    /// [`Gradient2Config::with_limits`]: the limit before the first sample.
    #[serde(deserialize_with = "field::initial")]
    pub initial: u32,
    /// [`Gradient2Config::with_limits`]: the largest limit.
    #[serde(deserialize_with = "field::max")]
    pub max: u32,
    /// [`Gradient2Config::with_smoothing_ppm`].
    #[serde(deserialize_with = "field::smoothing_ppm")]
    pub smoothing_ppm: u32,
    /// [`Gradient2Config::with_queue_size`].
    #[serde(deserialize_with = "field::queue_size")]
    pub queue_size: u32,
    /// [`Gradient2Config::with_long_window`], in samples.
    #[serde(deserialize_with = "field::long_window")]
    pub long_window: u32,
    /// [`Gradient2Config::with_rtt_tolerance_ppm`].
    #[serde(deserialize_with = "field::rtt_tolerance_ppm")]
    pub rtt_tolerance_ppm: u32,
}

impl From<&Gradient2Config> for Gradient2ConfigMirror {
    fn from(cfg: &Gradient2Config) -> Self {
        Gradient2ConfigMirror {
            min: cfg.min(),
            initial: cfg.initial(),
            max: cfg.max(),
            smoothing_ppm: cfg.smoothing_ppm(),
            queue_size: cfg.queue_size(),
            long_window: cfg.long_window(),
            rtt_tolerance_ppm: cfg.rtt_tolerance_ppm(),
        }
    }
}

impl TryFrom<Gradient2ConfigMirror> for Gradient2Config {
    type Error = ConfigError;
    fn try_from(m: Gradient2ConfigMirror) -> Result<Self, ConfigError> {
        let cfg = Gradient2Config::default()
            .with_limits(m.min, m.initial, m.max)
            .with_smoothing_ppm(m.smoothing_ppm)
            .with_queue_size(m.queue_size)
            .with_long_window(m.long_window)
            .with_rtt_tolerance_ppm(m.rtt_tolerance_ppm);
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(Gradient2Config, Gradient2ConfigMirror);

/// [`SampleWindowConfig`] as written, checked by [`SampleWindowConfig::validate`]. The
/// threshold is in nanoseconds: its default (100 µs) is below a millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SampleWindowConfigMirror {
    /// [`SampleWindowConfig::with_window_time`]: the shortest window, in ms.
    #[serde(deserialize_with = "field::min_window_ms")]
    pub min_window_ms: u64,
    /// [`SampleWindowConfig::with_window_time`]: the longest window, in ms.
    #[serde(deserialize_with = "field::max_window_ms")]
    pub max_window_ms: u64,
    /// [`SampleWindowConfig::with_window_size`], in samples.
    #[serde(deserialize_with = "field::window_size")]
    pub window_size: u32,
    /// [`SampleWindowConfig::with_min_rtt_threshold`], in ns.
    #[serde(deserialize_with = "field::min_rtt_threshold_ns")]
    pub min_rtt_threshold_ns: u64,
}

impl TryFrom<&SampleWindowConfig> for SampleWindowConfigMirror {
    type Error = ConfigError;
    /// Refuses a window time that is not a whole number of milliseconds, and a threshold
    /// above `u64::MAX` ns.
    fn try_from(cfg: &SampleWindowConfig) -> Result<Self, ConfigError> {
        let threshold = cfg.min_rtt_threshold();
        Ok(SampleWindowConfigMirror {
            min_window_ms: to_ms(&opt::WINDOW_MIN_TIME, cfg.min_window())?,
            max_window_ms: to_ms(&opt::WINDOW_MAX_TIME, cfg.max_window())?,
            window_size: cfg.window_size(),
            min_rtt_threshold_ns: u64::try_from(threshold.as_nanos()).map_err(|_| {
                ConfigError::Invalid {
                    option: &opt::WINDOW_MIN_RTT_THRESHOLD,
                    reason: "is longer than u64::MAX nanoseconds, which its serialised `_ns` \
                             field counts",
                }
            })?,
        })
    }
}

impl TryFrom<SampleWindowConfigMirror> for SampleWindowConfig {
    type Error = ConfigError;
    fn try_from(m: SampleWindowConfigMirror) -> Result<Self, ConfigError> {
        let cfg = SampleWindowConfig::default()
            .with_window_time(
                Duration::from_millis(m.min_window_ms),
                Duration::from_millis(m.max_window_ms),
            )
            .with_window_size(m.window_size)
            .with_min_rtt_threshold(Duration::from_nanos(m.min_rtt_threshold_ns));
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(SampleWindowConfig, SampleWindowConfigMirror);

/// [`LimiterConfig`] as written: exactly one of `aimd` and `gradient2` (its algorithm, as a
/// sub-object), and an optional `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LimiterConfigMirror {
    /// [`LimiterConfig::aimd`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aimd: Option<AimdConfig>,
    /// [`LimiterConfig::gradient2`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradient2: Option<Gradient2Config>,
    /// [`LimiterConfig::with_window`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<SampleWindowConfig>,
}

impl From<&LimiterConfig> for LimiterConfigMirror {
    fn from(cfg: &LimiterConfig) -> Self {
        let (aimd, gradient2) = match *cfg.algorithm() {
            Algorithm::Aimd(c) => (Some(c), None),
            Algorithm::Gradient2(c) => (None, Some(c)),
        };
        LimiterConfigMirror {
            aimd,
            gradient2,
            window: cfg.window().copied(),
        }
    }
}

impl TryFrom<LimiterConfigMirror> for LimiterConfig {
    type Error = ConfigError;
    /// Refuses both algorithms or neither.
    fn try_from(m: LimiterConfigMirror) -> Result<Self, ConfigError> {
        let cfg = match (m.aimd, m.gradient2) {
            (Some(c), None) => LimiterConfig::aimd(c),
            (None, Some(c)) => LimiterConfig::gradient2(c),
            _ => {
                return Err(ConfigError::Invalid {
                    option: &opt::ALGORITHM_AIMD,
                    reason: "needs exactly one of `aimd` and `gradient2`",
                });
            }
        };
        let cfg = match m.window {
            Some(w) => cfg.with_window(w),
            None => cfg,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(LimiterConfig, LimiterConfigMirror);
