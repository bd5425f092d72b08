//! The read and write path's batching mirrors: the dispatch window, the batcher and the
//! pending-bytes limiter.

use core::num::{NonZeroU64, NonZeroUsize};
use core::time::Duration;

use serde::{Deserialize, Serialize};

use super::leaf::{field, ser_enum, to_ms_opt, unit_enums};
use super::via_mirror;
use crate::batcher::{BatchKind, BatcherConfig, Oversized};
use crate::dispatch_window::WindowConfig;
use crate::error::ConfigError;
use crate::options::batcher as opt;
use crate::pending_bytes::PendingBytesConfig;

/// [`WindowConfig`] as written, checked by [`WindowConfig::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct WindowConfigMirror {
    /// [`WindowConfig::with_max_in_flight`], in batches.
    #[serde(deserialize_with = "field::max_in_flight")]
    pub max_in_flight: usize,
}

impl From<&WindowConfig> for WindowConfigMirror {
    fn from(cfg: &WindowConfig) -> Self {
        WindowConfigMirror {
            max_in_flight: cfg.max_in_flight(),
        }
    }
}

impl TryFrom<WindowConfigMirror> for WindowConfig {
    type Error = ConfigError;
    fn try_from(m: WindowConfigMirror) -> Result<Self, ConfigError> {
        let cfg = WindowConfig::default().with_max_in_flight(m.max_in_flight);
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(WindowConfig, WindowConfigMirror);

unit_enums! {
    BatchKind {
        "read" => BatchKind::Read,
        "write" => BatchKind::Write,
    }
    Oversized {
        "travel_alone" => Oversized::TravelAlone,
        "reject" => Oversized::Reject,
    }
}

/// [`BatcherConfig`] as written: its kind (the constructor, [`BatcherConfig::reads`] or
/// [`BatcherConfig::writes`]), its limits and its window as a sub-object.
///
/// The two limits are non-zero by their types, so a 0 is refused as an integer outside its
/// range, naming the field. `op_timeout_ms` may be left out (no timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BatcherConfigMirror {
    /// [`BatcherConfig::kind`]: `"read"` or `"write"`.
    #[serde(serialize_with = "ser_enum", deserialize_with = "field::kind")]
    pub kind: BatchKind,
    /// [`BatcherConfig::with_max_requests_per_batch`].
    #[serde(deserialize_with = "field::max_requests_per_batch")]
    pub max_requests_per_batch: NonZeroUsize,
    /// [`BatcherConfig::with_max_batch_bytes`], in bytes.
    #[serde(deserialize_with = "field::max_batch_bytes")]
    pub max_batch_bytes: NonZeroU64,
    /// [`BatcherConfig::with_window`].
    pub window: WindowConfig,
    /// [`BatcherConfig::with_oversized`]: `"travel_alone"` or `"reject"`.
    #[serde(serialize_with = "ser_enum", deserialize_with = "field::oversized")]
    pub oversized: Oversized,
    /// [`BatcherConfig::with_op_timeout`], in ms.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "field::op_timeout_ms"
    )]
    pub op_timeout_ms: Option<u64>,
}

impl TryFrom<&BatcherConfig> for BatcherConfigMirror {
    type Error = ConfigError;
    /// Refuses an operation timeout that is not a whole number of milliseconds.
    fn try_from(cfg: &BatcherConfig) -> Result<Self, ConfigError> {
        let op_timeout_ms = to_ms_opt(&opt::OP_TIMEOUT, cfg.op_timeout())?;
        Ok(BatcherConfigMirror {
            kind: cfg.kind(),
            max_requests_per_batch: NonZeroUsize::new(cfg.max_requests_per_batch())
                .unwrap_or(NonZeroUsize::MIN),
            max_batch_bytes: NonZeroU64::new(cfg.max_batch_bytes()).unwrap_or(NonZeroU64::MIN),
            window: cfg.window(),
            oversized: cfg.oversized(),
            op_timeout_ms,
        })
    }
}

impl TryFrom<BatcherConfigMirror> for BatcherConfig {
    type Error = ConfigError;
    fn try_from(m: BatcherConfigMirror) -> Result<Self, ConfigError> {
        let base = match m.kind {
            BatchKind::Read => BatcherConfig::reads(),
            BatchKind::Write => BatcherConfig::writes(),
        };
        let cfg = base
            .with_max_requests_per_batch(m.max_requests_per_batch)
            .with_max_batch_bytes(m.max_batch_bytes)
            .with_window(m.window)?
            .with_oversized(m.oversized);
        Ok(match m.op_timeout_ms {
            Some(ms) => cfg.with_op_timeout(Duration::from_millis(ms)),
            None => cfg,
        })
    }
}

via_mirror!(BatcherConfig, BatcherConfigMirror);

/// [`PendingBytesConfig`] as written (every value is valid: `0` disables the limiter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PendingBytesConfigMirror {
    /// [`PendingBytesConfig::with_max_pending_bytes`], in bytes.
    #[serde(deserialize_with = "field::max_pending_bytes")]
    pub max_pending_bytes: u64,
}

impl From<&PendingBytesConfig> for PendingBytesConfigMirror {
    fn from(cfg: &PendingBytesConfig) -> Self {
        PendingBytesConfigMirror {
            max_pending_bytes: cfg.max_pending_bytes(),
        }
    }
}

impl TryFrom<PendingBytesConfigMirror> for PendingBytesConfig {
    type Error = ConfigError;
    fn try_from(m: PendingBytesConfigMirror) -> Result<Self, ConfigError> {
        let cfg = PendingBytesConfig::default().with_max_pending_bytes(m.max_pending_bytes);
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(PendingBytesConfig, PendingBytesConfigMirror);
