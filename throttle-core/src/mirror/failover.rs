//! The failover mirrors: the call, the refresh coalescer and the three retry budgets.

use core::time::Duration;

use serde::{Deserialize, Serialize};

use super::leaf::{field, to_ms};
use super::via_mirror;
use crate::backoff::BackoffConfig;
use crate::error::ConfigError;
use crate::failover::{
    AwsRetryQuotaConfig, CallConfig, CoalescerConfig, ErrorCause, FinagleBudgetConfig,
    GrpcThrottleConfig,
};
use crate::options::failover as opt;

/// [`CallConfig`] as written; each backoff, a sub-object, may be left out (none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CallConfigMirror {
    /// [`CallConfig::with_max_auto_retries`].
    #[serde(deserialize_with = "field::max_auto_retries")]
    pub max_auto_retries: u32,
    /// [`CallConfig::with_backoff`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffConfig>,
    /// [`CallConfig::with_throttling_backoff`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttling_backoff: Option<BackoffConfig>,
}

impl From<&CallConfig> for CallConfigMirror {
    fn from(cfg: &CallConfig) -> Self {
        CallConfigMirror {
            max_auto_retries: cfg.max_auto_retries(),
            backoff: cfg.backoff().cloned(),
            throttling_backoff: cfg.throttling_backoff().cloned(),
        }
    }
}

impl TryFrom<CallConfigMirror> for CallConfig {
    type Error = ConfigError;
    fn try_from(m: CallConfigMirror) -> Result<Self, ConfigError> {
        let mut cfg = CallConfig::fluss_admin().with_max_auto_retries(m.max_auto_retries);
        if let Some(backoff) = m.backoff {
            cfg = cfg.with_backoff(backoff);
        }
        if let Some(backoff) = m.throttling_backoff {
            cfg = cfg.with_throttling_backoff(backoff);
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(CallConfig, CallConfigMirror);

/// [`CoalescerConfig`] as written, checked by [`CoalescerConfig::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CoalescerConfigMirror {
    /// [`CoalescerConfig::with_max_waiters`], in calls.
    #[serde(deserialize_with = "field::max_waiters")]
    pub max_waiters: usize,
}

impl From<&CoalescerConfig> for CoalescerConfigMirror {
    fn from(cfg: &CoalescerConfig) -> Self {
        CoalescerConfigMirror {
            max_waiters: cfg.max_waiters(),
        }
    }
}

impl TryFrom<CoalescerConfigMirror> for CoalescerConfig {
    type Error = ConfigError;
    fn try_from(m: CoalescerConfigMirror) -> Result<Self, ConfigError> {
        let cfg = CoalescerConfig::default().with_max_waiters(m.max_waiters);
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(CoalescerConfig, CoalescerConfigMirror);

/// [`GrpcThrottleConfig`] as written, checked by [`GrpcThrottleConfig::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct GrpcThrottleConfigMirror {
    /// [`GrpcThrottleConfig::with_max_tokens`].
    #[serde(deserialize_with = "field::max_tokens")]
    pub max_tokens: u32,
    /// [`GrpcThrottleConfig::with_milli_token_ratio`], in milli-tokens.
    #[serde(deserialize_with = "field::milli_token_ratio")]
    pub milli_token_ratio: u32,
}

impl From<&GrpcThrottleConfig> for GrpcThrottleConfigMirror {
    fn from(cfg: &GrpcThrottleConfig) -> Self {
        GrpcThrottleConfigMirror {
            max_tokens: cfg.max_tokens(),
            milli_token_ratio: cfg.milli_token_ratio(),
        }
    }
}

impl TryFrom<GrpcThrottleConfigMirror> for GrpcThrottleConfig {
    type Error = ConfigError;
    fn try_from(m: GrpcThrottleConfigMirror) -> Result<Self, ConfigError> {
        let cfg = GrpcThrottleConfig::default()
            .with_max_tokens(m.max_tokens)
            .with_milli_token_ratio(m.milli_token_ratio);
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(GrpcThrottleConfig, GrpcThrottleConfigMirror);

/// [`FinagleBudgetConfig`] as written, checked by [`FinagleBudgetConfig::validate`] (whose
/// `ttl` is a whole number of seconds, so `ttl_ms` a multiple of 1000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct FinagleBudgetConfigMirror {
    /// [`FinagleBudgetConfig::with_ttl`], in ms.
    #[serde(deserialize_with = "field::ttl_ms")]
    pub ttl_ms: u64,
    /// [`FinagleBudgetConfig::with_min_retries_per_sec`].
    #[serde(deserialize_with = "field::min_retries_per_sec")]
    pub min_retries_per_sec: u32,
    /// [`FinagleBudgetConfig::with_percent_can_retry_ppm`], in ppm.
    #[serde(deserialize_with = "field::percent_can_retry_ppm")]
    pub percent_can_retry_ppm: u32,
}

impl TryFrom<&FinagleBudgetConfig> for FinagleBudgetConfigMirror {
    type Error = ConfigError;
    /// Refuses a `ttl` that is not a whole number of milliseconds.
    fn try_from(cfg: &FinagleBudgetConfig) -> Result<Self, ConfigError> {
        Ok(FinagleBudgetConfigMirror {
            ttl_ms: to_ms(&opt::TTL, cfg.ttl())?,
            min_retries_per_sec: cfg.min_retries_per_sec(),
            percent_can_retry_ppm: cfg.percent_can_retry_ppm(),
        })
    }
}

impl TryFrom<FinagleBudgetConfigMirror> for FinagleBudgetConfig {
    type Error = ConfigError;
    fn try_from(m: FinagleBudgetConfigMirror) -> Result<Self, ConfigError> {
        let cfg = FinagleBudgetConfig::default()
            .with_ttl(Duration::from_millis(m.ttl_ms))
            .with_min_retries_per_sec(m.min_retries_per_sec)
            .with_percent_can_retry_ppm(m.percent_can_retry_ppm);
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(FinagleBudgetConfig, FinagleBudgetConfigMirror);

/// [`AwsRetryQuotaConfig`] as written (every value is valid).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AwsRetryQuotaConfigMirror {
    /// [`AwsRetryQuotaConfig::with_max_tokens`].
    #[serde(deserialize_with = "field::max_tokens")]
    pub max_tokens: u32,
    /// [`AwsRetryQuotaConfig::with_retry_cost`].
    #[serde(deserialize_with = "field::retry_cost")]
    pub retry_cost: u32,
    /// [`AwsRetryQuotaConfig::with_timeout_cost`].
    #[serde(deserialize_with = "field::timeout_cost")]
    pub timeout_cost: u32,
    /// [`AwsRetryQuotaConfig::with_throttling_cost`].
    #[serde(deserialize_with = "field::throttling_cost")]
    pub throttling_cost: u32,
    /// [`AwsRetryQuotaConfig::with_no_retry_increment`].
    #[serde(deserialize_with = "field::no_retry_increment")]
    pub no_retry_increment: u32,
}

impl From<&AwsRetryQuotaConfig> for AwsRetryQuotaConfigMirror {
    fn from(cfg: &AwsRetryQuotaConfig) -> Self {
        AwsRetryQuotaConfigMirror {
            max_tokens: cfg.max_tokens(),
            retry_cost: cfg.cost(ErrorCause::Transient),
            timeout_cost: cfg.cost(ErrorCause::Timeout),
            throttling_cost: cfg.cost(ErrorCause::Throttling),
            no_retry_increment: cfg.no_retry_increment(),
        }
    }
}

impl TryFrom<AwsRetryQuotaConfigMirror> for AwsRetryQuotaConfig {
    type Error = ConfigError;
    fn try_from(m: AwsRetryQuotaConfigMirror) -> Result<Self, ConfigError> {
        let cfg = AwsRetryQuotaConfig::default()
            .with_max_tokens(m.max_tokens)
            .with_retry_cost(m.retry_cost)
            .with_timeout_cost(m.timeout_cost)
            .with_throttling_cost(m.throttling_cost)
            .with_no_retry_increment(m.no_retry_increment);
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(AwsRetryQuotaConfig, AwsRetryQuotaConfigMirror);
