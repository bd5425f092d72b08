//! Errors: refused configuration ([`ConfigError`]) and misuse at run time ([`ReleaseError`]).
//!
//! Refusals that are part of normal operation ("not yet", "closed until …") are outcomes, not
//! errors; see each machine. Every error here is a small `Copy` enum whose message names the
//! option or the value at fault.

use crate::options::ConfigOption;

/// A configuration the machines refuse, found at construction (`validate()` or a builder).
///
/// Every variant carries the [`ConfigOption`] at fault (from the one table in
/// [`crate::options`]), and the message names its Rust name, the builder method that sets it
/// and the upstream key it reproduces:
///
/// ```
/// use core::time::Duration;
/// use throttle_sansio::BackoffConfig;
///
/// let err = BackoffConfig::fluss_disk_write_locked()
///     .to_builder()
///     .initial(Duration::from_micros(999))
///     .build()
///     .unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "`initial` = 999000 ns is outside 1000000..=2147483647000000 ns \
///      (`BackoffConfigBuilder::initial`; Fluss `client.writer.disk-write-locked.backoff`)"
/// );
/// assert_eq!(err.option().method(), "BackoffConfigBuilder::initial");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value lies outside the range the option allows (bounds inclusive, in `unit`).
    #[error("`{name}` = {got} {unit} is outside {min}..={max} {unit} ({option})", name = option.name())]
    OutOfRange {
        /// The setting at fault.
        option: &'static ConfigOption,
        /// The value given.
        got: u64,
        /// The smallest value allowed.
        min: u64,
        /// The largest value allowed.
        max: u64,
        /// The unit of the three numbers (`ns`, `ms`, `ppm`, …).
        unit: &'static str,
    },
    /// Two options are in the wrong order (e.g. an initial delay above the maximum).
    #[error(
        "`{name}` must not exceed `{limit_name}` ({option}; limit {limit})",
        name = option.name(),
        limit_name = limit.name()
    )]
    Inverted {
        /// The setting that is too large.
        option: &'static ConfigOption,
        /// The setting it must not exceed.
        limit: &'static ConfigOption,
    },
    /// An option is malformed in another way; `reason` says how.
    #[error("`{name}`: {reason} ({option})", name = option.name())]
    Invalid {
        /// The setting at fault.
        option: &'static ConfigOption,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl ConfigError {
    /// The option at fault (for [`ConfigError::Inverted`], the one that is too large).
    pub const fn option(&self) -> &'static ConfigOption {
        match *self {
            ConfigError::OutOfRange { option, .. }
            | ConfigError::Inverted { option, .. }
            | ConfigError::Invalid { option, .. } => option,
        }
    }
}

pub use crate::slab::Exhausted;

/// Releasing a credit that the machine does not hold.
///
/// Nothing changes when this is returned: the window is never widened by a bogus or repeated
/// release (upstream lets its counter go negative and the window silently grows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReleaseError {
    /// The credit was never issued by this machine.
    #[error("unknown credit")]
    Unknown,
    /// The credit was issued and has already been released.
    #[error("credit already released")]
    AlreadyReleased,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options;
    use alloc::string::ToString;

    #[test]
    fn messages_name_the_option() {
        let e = ConfigError::OutOfRange {
            option: &options::backoff::FLUSS_DISK_INITIAL,
            got: 0,
            min: 1,
            max: 2_147_483_647,
            unit: "ms",
        };
        assert_eq!(
            e.to_string(),
            "`initial` = 0 ms is outside 1..=2147483647 ms (`BackoffConfigBuilder::initial`; \
             Fluss `client.writer.disk-write-locked.backoff`)"
        );
        let e = ConfigError::Inverted {
            option: &options::backoff::INITIAL,
            limit: &options::backoff::MAX,
        };
        assert_eq!(
            e.to_string(),
            "`initial` must not exceed `max` (`BackoffConfigBuilder::initial`; no upstream key; \
             limit `BackoffConfigBuilder::max`; no upstream key)"
        );
        let e = ConfigError::Invalid {
            option: &options::window::MAX_IN_FLIGHT,
            reason: "must be at least 1",
        };
        assert_eq!(
            e.to_string(),
            "`max_in_flight`: must be at least 1 (`WindowConfig::with_max_in_flight`; \
             Oxia `maxReadBatchesInFlight`, Oxia `maxWriteBatchesInFlight`)"
        );
        assert_eq!(
            ReleaseError::AlreadyReleased.to_string(),
            "credit already released"
        );
    }
}
