//! Plain mirrors of every configuration, for `serde` (feature `serde`).
//!
//! Each configuration serialises and deserialises through its mirror here: a struct of plain
//! public fields, one per option a user sets through the builder methods, and nothing derived
//! (no precomputed ramp, divisor or spread). [`TryFrom`] turns a mirror into the real
//! configuration by calling those builder methods and the configuration's own `validate()` or
//! `build()`, so a file is held to exactly the rules code is, and refused with the same
//! [`ConfigError`](crate::ConfigError), which names the option at fault. The configurations'
//! own `Serialize` and `Deserialize` go through the mirror, so
//! `serde_json::from_str::<WriteGateConfig>(…)` validates too.
//!
//! - **Field names** are the option names of [`crate::options`] (`docs/options.md`), with a
//!   `_ms` (or `_ns`) suffix for a span; a sub-configuration nests as a sub-object under its
//!   option's name (`gate`, `disk_write_locked`, `window`, …).
//! - **Spans** are integer milliseconds (`u64`), except a backoff's `resolution_ns`, the one
//!   span whose useful values go below a millisecond. Serialising a span with a
//!   sub-millisecond part into a `_ms` field is refused (naming the option), never rounded;
//!   reading a `_ms` backoff span past `u64::MAX` ns is refused, never saturated.
//! - **Optional** fields (the `Option` ones: limits and sub-configurations that may be absent)
//!   may be left out, meaning `None`, and are left out when `None`; every other field is
//!   required. Unknown fields are refused.
//! - **Errors** name the field: serde's own for an unknown or missing field; the field's name
//!   and its expected values for a wrong type, an integer outside its type or an unknown
//!   name; the [`ConfigError`](crate::ConfigError) message (option, builder method, upstream
//!   key) for a value the configuration refuses.
//!
//! `docs/serde.md` has the details and `docs/presets/` one file per preset.
//!
//! ```
//! use throttle_sansio::mirror::ThrottleCurveMirror;
//! use throttle_sansio::ThrottleCurve;
//!
//! let mut mirror = ThrottleCurveMirror::from(&ThrottleCurve::fluss_issue_3454());
//! assert_eq!((mirror.exponent, mirror.max_throttle_ms), (3, 5_000));
//! mirror.exponent = 5;
//! let err = ThrottleCurve::try_from(mirror).unwrap_err();
//! assert!(err.to_string().starts_with("`exponent` = 5"));
//! assert_eq!(err.option().method(), "ThrottleCurveBuilder::exponent");
//! ```

mod backoff;
mod conn;
mod dispatch;
mod failover;
mod leaf;
mod limiter;
mod write;

pub use backoff::{BackoffConfigMirror, BackoffPreset, JitterMirror};
pub use conn::ConnConfigMirror;
pub use dispatch::{BatcherConfigMirror, PendingBytesConfigMirror, WindowConfigMirror};
pub use failover::{
    AwsRetryQuotaConfigMirror, CallConfigMirror, CoalescerConfigMirror, FinagleBudgetConfigMirror,
    GrpcThrottleConfigMirror,
};
pub use limiter::{
    AimdConfigMirror, Gradient2ConfigMirror, LimiterConfigMirror, SampleWindowConfigMirror,
};
pub use write::{
    FlushBudgetMirror, PacedWriterConfigMirror, PressureConfigMirror, ReasonProbeMirror,
    ThrottleCurveMirror, WriteGateConfigMirror, WriteGateReasonsMirror,
};

/// `Serialize` and `Deserialize` for a configuration, through its mirror: serialising
/// converts to the mirror (`TryFrom<&Config>`, or `From`), deserialising reads the mirror and
/// validates it into the configuration (`TryFrom<Mirror>`), each error as a serde error with
/// the [`ConfigError`](crate::ConfigError)'s message.
macro_rules! via_mirror {
    ($config:ty, $mirror:ty) => {
        impl serde::Serialize for $config {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mirror = <$mirror>::try_from(self).map_err(serde::ser::Error::custom)?;
                serde::Serialize::serialize(&mirror, s)
            }
        }

        impl<'de> serde::Deserialize<'de> for $config {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let mirror = <$mirror as serde::Deserialize<'de>>::deserialize(d)?;
                <$config>::try_from(mirror).map_err(serde::de::Error::custom)
            }
        }
    };
}
use via_mirror;
