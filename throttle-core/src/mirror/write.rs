//! The write path's mirrors: KV backpressure (server and client halves), the write gate and
//! the paced writer.

use core::time::Duration;

use serde::{Deserialize, Serialize};

use super::leaf::{field, to_ms, to_ms_opt};
use super::via_mirror;
use crate::backoff::BackoffConfig;
use crate::backpressure::{PressureConfig, ThrottleCurve};
use crate::error::ConfigError;
use crate::options::write_gate as opt;
use crate::paced_writer::PacedWriterConfig;
use crate::write_gate::{Reason, WriteGateConfig};

/// [`PressureConfig`] as written: the two L0 triggers and the optional flush budget, built
/// with [`PressureConfig::builder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PressureConfigMirror {
    /// `PressureConfigBuilder::l0_trigger`, in files.
    #[serde(deserialize_with = "field::l0_trigger")]
    pub l0_trigger: u32,
    /// `PressureConfigBuilder::l0_slowdown_writes_trigger`, in files.
    #[serde(deserialize_with = "field::l0_slowdown_writes_trigger")]
    pub l0_slowdown_writes_trigger: u32,
    /// `PressureConfigBuilder::flush_budget`; absent or `null` for
    /// `PressureConfigBuilder::without_flush_budget`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_budget: Option<FlushBudgetMirror>,
}

/// The two arguments of `PressureConfigBuilder::flush_budget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct FlushBudgetMirror {
    /// RocksDB `write_buffer_size`, in bytes.
    #[serde(deserialize_with = "field::write_buffer_size")]
    pub write_buffer_size: u64,
    /// RocksDB `max_write_buffer_number`.
    #[serde(deserialize_with = "field::max_write_buffers")]
    pub max_write_buffers: u32,
}

impl From<&PressureConfig> for PressureConfigMirror {
    fn from(cfg: &PressureConfig) -> Self {
        PressureConfigMirror {
            l0_trigger: cfg.l0_trigger(),
            l0_slowdown_writes_trigger: cfg.l0_slowdown_writes_trigger(),
            flush_budget: cfg.flush_budget().map(|b| FlushBudgetMirror {
                write_buffer_size: b.write_buffer_size,
                max_write_buffers: b.max_write_buffers,
            }),
        }
    }
}

impl TryFrom<PressureConfigMirror> for PressureConfig {
    type Error = ConfigError;
    fn try_from(m: PressureConfigMirror) -> Result<Self, ConfigError> {
        let builder = PressureConfig::builder()
            .l0_trigger(m.l0_trigger)
            .l0_slowdown_writes_trigger(m.l0_slowdown_writes_trigger);
        match m.flush_budget {
            Some(b) => builder.flush_budget(b.write_buffer_size, b.max_write_buffers),
            None => builder.without_flush_budget(),
        }
        .build()
    }
}

via_mirror!(PressureConfig, PressureConfigMirror);

/// [`ThrottleCurve`] as written, built with [`ThrottleCurve::builder`] (which refuses a
/// ceiling above `u32::MAX` ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ThrottleCurveMirror {
    /// `ThrottleCurveBuilder::exponent`.
    #[serde(deserialize_with = "field::exponent")]
    pub exponent: u32,
    /// `ThrottleCurveBuilder::max_throttle`, in ms.
    #[serde(deserialize_with = "field::max_throttle_ms")]
    pub max_throttle_ms: u64,
}

impl From<&ThrottleCurve> for ThrottleCurveMirror {
    fn from(curve: &ThrottleCurve) -> Self {
        ThrottleCurveMirror {
            exponent: curve.exponent(),
            // The curve holds whole `u32` milliseconds.
            max_throttle_ms: curve.max_throttle().as_secs() * 1_000
                + u64::from(curve.max_throttle().subsec_millis()),
        }
    }
}

impl TryFrom<ThrottleCurveMirror> for ThrottleCurve {
    type Error = ConfigError;
    fn try_from(m: ThrottleCurveMirror) -> Result<Self, ConfigError> {
        ThrottleCurve::builder()
            .exponent(m.exponent)
            .max_throttle(Duration::from_millis(m.max_throttle_ms))
            .build()
    }
}

via_mirror!(ThrottleCurve, ThrottleCurveMirror);

/// The probe settings of one registered reason: `WriteGateConfig::set_probe` and
/// `WriteGateConfig::set_probe_ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ReasonProbeMirror {
    /// The probe allowance; absent or `null` turns probe mode off.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "field::probe_sends"
    )]
    pub probe_sends: Option<u32>,
    /// The probe state's time to live, in ms.
    #[serde(deserialize_with = "field::probe_ttl_ms")]
    pub probe_ttl_ms: u64,
}

/// The built-in reasons of a gate's registry, each with its probe settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct WriteGateReasonsMirror {
    /// [`Reason::DISK_WRITE_LOCKED`].
    pub disk_write_locked: ReasonProbeMirror,
    /// [`Reason::KV_BACKPRESSURE`].
    pub kv_backpressure: ReasonProbeMirror,
    /// [`Reason::RETRIABLE_WRITE`].
    pub retriable_write: ReasonProbeMirror,
}

/// [`WriteGateConfig`] as written: the built-in reasons' delay sources, the KV options and
/// the probe settings of every registered reason.
///
/// `kv_hard_rejection` is present (with that reason's probe settings) exactly when
/// [`WriteGateConfig::with_kv_hard_rejection_never_shorten`] is on. Custom reasons
/// ([`WriteGateConfig::register`]) are registered in code, which hands out their
/// [`Reason`]s: a config holding one is refused by the conversion to the mirror (its name is
/// a `&'static str` no file can give back), so register them after reading the file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct WriteGateConfigMirror {
    /// [`WriteGateConfig::with_disk_write_locked`].
    pub disk_write_locked: BackoffConfig,
    /// [`WriteGateConfig::with_retriable_write`].
    pub retriable_write: BackoffConfig,
    /// [`WriteGateConfig::with_kv_curve`].
    pub kv_curve: ThrottleCurve,
    /// [`WriteGateConfig::with_kv_jitter`], in ppm.
    #[serde(deserialize_with = "field::kv_jitter_ppm")]
    pub kv_jitter_ppm: u32,
    /// [`WriteGateConfig::with_kv_hard_rejection_never_shorten`], with the probe settings of
    /// the reason it registers; absent or `null` when off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_hard_rejection: Option<ReasonProbeMirror>,
    /// The probe settings of the built-in reasons.
    pub reasons: WriteGateReasonsMirror,
    /// [`WriteGateConfig::with_wake_slack`], in ms; absent reads as 0 (files written before
    /// the option existed).
    #[serde(default, deserialize_with = "field::wake_slack_ms")]
    pub wake_slack_ms: u64,
}

fn probe_of(cfg: &WriteGateConfig, reason: Reason) -> Result<ReasonProbeMirror, ConfigError> {
    let spec = cfg.reason(reason).ok_or(ConfigError::Invalid {
        option: &opt::REASONS,
        reason: "a built-in reason is missing from the registry",
    })?;
    Ok(ReasonProbeMirror {
        probe_sends: spec.probe_sends(),
        probe_ttl_ms: to_ms(&opt::SET_PROBE_TTL, spec.probe_time_to_live())?,
    })
}

impl TryFrom<&WriteGateConfig> for WriteGateConfigMirror {
    type Error = ConfigError;
    /// Refuses a config with custom reasons, or with a probe time to live that is not a whole
    /// number of milliseconds.
    fn try_from(cfg: &WriteGateConfig) -> Result<Self, ConfigError> {
        let builtins = [
            Reason::DISK_WRITE_LOCKED,
            Reason::KV_BACKPRESSURE,
            Reason::RETRIABLE_WRITE,
        ];
        let hard = usize::from(cfg.kv_hard_rejection().is_some());
        if cfg.reasons().len() != builtins.len() + hard {
            return Err(ConfigError::Invalid {
                option: &opt::REASONS,
                reason: "custom reasons are registered in code (their names are `&'static \
                         str`), so a serialised configuration cannot hold them",
            });
        }
        let [disk, kv, retriable] = builtins.map(|r| probe_of(cfg, r));
        Ok(WriteGateConfigMirror {
            disk_write_locked: cfg.disk_write_locked().clone(),
            retriable_write: cfg.retriable_write().clone(),
            kv_curve: *cfg.kv_curve(),
            kv_jitter_ppm: cfg.kv_jitter_ppm(),
            kv_hard_rejection: match cfg.kv_hard_rejection() {
                Some(r) => Some(probe_of(cfg, r)?),
                None => None,
            },
            reasons: WriteGateReasonsMirror {
                disk_write_locked: disk?,
                kv_backpressure: kv?,
                retriable_write: retriable?,
            },
            wake_slack_ms: to_ms(&opt::WAKE_SLACK, cfg.wake_slack())?,
        })
    }
}

/// Applies `probe` to `reason` through the setters (which refuse a zero allowance).
fn set_probe(
    cfg: &mut WriteGateConfig,
    reason: Reason,
    probe: ReasonProbeMirror,
) -> Result<(), ConfigError> {
    cfg.set_probe(reason, probe.probe_sends)?;
    cfg.set_probe_ttl(reason, Duration::from_millis(probe.probe_ttl_ms))
}

impl TryFrom<WriteGateConfigMirror> for WriteGateConfig {
    type Error = ConfigError;
    /// [`WriteGateConfig::fluss_landed`]'s registry with every option of the mirror, through
    /// the builder methods and setters, then [`WriteGateConfig::validate`].
    fn try_from(m: WriteGateConfigMirror) -> Result<Self, ConfigError> {
        let mut cfg = WriteGateConfig::fluss_landed()
            .with_disk_write_locked(m.disk_write_locked)
            .with_retriable_write(m.retriable_write)
            .with_kv_curve(m.kv_curve)
            .with_kv_jitter(m.kv_jitter_ppm)
            .with_wake_slack(Duration::from_millis(m.wake_slack_ms));
        if let Some(probe) = m.kv_hard_rejection {
            cfg = cfg.with_kv_hard_rejection_never_shorten()?;
            if let Some(hard) = cfg.kv_hard_rejection() {
                set_probe(&mut cfg, hard, probe)?;
            }
        }
        set_probe(
            &mut cfg,
            Reason::DISK_WRITE_LOCKED,
            m.reasons.disk_write_locked,
        )?;
        set_probe(&mut cfg, Reason::KV_BACKPRESSURE, m.reasons.kv_backpressure)?;
        set_probe(&mut cfg, Reason::RETRIABLE_WRITE, m.reasons.retriable_write)?;
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(WriteGateConfig, WriteGateConfigMirror);

/// [`PacedWriterConfig`] as written, with its gate as a sub-object.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PacedWriterConfigMirror {
    /// [`PacedWriterConfig::with_batch_bytes`], in bytes.
    #[serde(deserialize_with = "field::batch_bytes")]
    pub batch_bytes: u64,
    /// [`PacedWriterConfig::with_max_retries`].
    #[serde(deserialize_with = "field::max_retries")]
    pub max_retries: u32,
    /// [`PacedWriterConfig::with_gate`].
    pub gate: WriteGateConfig,
    /// [`PacedWriterConfig::with_disk_backoff`].
    #[serde(deserialize_with = "field::disk_backoff")]
    pub disk_backoff: bool,
    /// [`PacedWriterConfig::with_kv_pressure`].
    #[serde(deserialize_with = "field::kv_pressure")]
    pub kv_pressure: bool,
    /// [`PacedWriterConfig::with_wake_slack`], in ms; absent or `null` for the default
    /// derived from the gate's disk backoff.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "field::wake_slack_ms"
    )]
    pub wake_slack_ms: Option<u64>,
}

impl TryFrom<&PacedWriterConfig> for PacedWriterConfigMirror {
    type Error = ConfigError;
    /// Refuses a wake slack that is not a whole number of milliseconds.
    fn try_from(cfg: &PacedWriterConfig) -> Result<Self, ConfigError> {
        let option = &crate::options::paced_writer::WAKE_SLACK;
        let wake_slack_ms = to_ms_opt(option, cfg.explicit_wake_slack())?;
        Ok(PacedWriterConfigMirror {
            batch_bytes: cfg.batch_bytes(),
            max_retries: cfg.max_retries(),
            gate: cfg.gate().clone(),
            disk_backoff: cfg.disk_backoff(),
            kv_pressure: cfg.kv_pressure(),
            wake_slack_ms,
        })
    }
}

impl TryFrom<PacedWriterConfigMirror> for PacedWriterConfig {
    type Error = ConfigError;
    fn try_from(m: PacedWriterConfigMirror) -> Result<Self, ConfigError> {
        let cfg = PacedWriterConfig::default()
            .with_batch_bytes(m.batch_bytes)
            .with_max_retries(m.max_retries)
            .with_gate(m.gate)
            .with_disk_backoff(m.disk_backoff)
            .with_kv_pressure(m.kv_pressure);
        let cfg = match m.wake_slack_ms {
            Some(ms) => cfg.with_wake_slack(Duration::from_millis(ms)),
            None => cfg,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

via_mirror!(PacedWriterConfig, PacedWriterConfigMirror);
