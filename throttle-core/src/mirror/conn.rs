//! [`ConnConfig`]'s mirror.

use core::time::Duration;

use serde::{Deserialize, Serialize};

use super::leaf::{field, ser_enum, to_ms, unit_enums};
use super::via_mirror;
use crate::backoff::BackoffConfig;
use crate::conn_key::{BackoffFrom, ConnConfig};
use crate::error::ConfigError;
use crate::options::conn as opt;

unit_enums! {
    BackoffFrom {
        "attempt_start" => BackoffFrom::AttemptStart,
        "failure" => BackoffFrom::Failure,
    }
}

/// [`ConnConfig`] as written, with its connect backoff as a sub-object, checked by
/// [`ConnConfig::validate`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ConnConfigMirror {
    /// [`ConnConfig::with_max_idle`], in ms.
    #[serde(deserialize_with = "field::max_idle_ms")]
    pub max_idle_ms: u64,
    /// [`ConnConfig::with_connect_backoff`].
    pub connect_backoff: BackoffConfig,
    /// [`ConnConfig::with_min_connect_timeout`], in ms.
    #[serde(deserialize_with = "field::min_connect_timeout_ms")]
    pub min_connect_timeout_ms: u64,
    /// [`ConnConfig::with_backoff_from`]: `"attempt_start"` or `"failure"`.
    #[serde(serialize_with = "ser_enum", deserialize_with = "field::backoff_from")]
    pub backoff_from: BackoffFrom,
}

impl TryFrom<&ConnConfig> for ConnConfigMirror {
    type Error = ConfigError;
    /// Refuses a span that is not a whole number of milliseconds (`Duration::MAX`, "for
    /// ever", included: write `u64::MAX` ms, some 584 million years, instead).
    fn try_from(cfg: &ConnConfig) -> Result<Self, ConfigError> {
        Ok(ConnConfigMirror {
            max_idle_ms: to_ms(&opt::MAX_IDLE, cfg.max_idle())?,
            connect_backoff: cfg.connect_backoff().clone(),
            min_connect_timeout_ms: to_ms(&opt::MIN_CONNECT_TIMEOUT, cfg.min_connect_timeout())?,
            backoff_from: cfg.backoff_from(),
        })
    }
}

impl TryFrom<ConnConfigMirror> for ConnConfig {
    type Error = ConfigError;
    fn try_from(m: ConnConfigMirror) -> Result<Self, ConfigError> {
        let cfg = ConnConfig::default()
            .with_max_idle(Duration::from_millis(m.max_idle_ms))
            .with_connect_backoff(m.connect_backoff)
            .with_min_connect_timeout(Duration::from_millis(m.min_connect_timeout_ms))
            .with_backoff_from(m.backoff_from);
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(ConnConfig, ConnConfigMirror);
