//! Errors: refused configuration ([`ConfigError`]) and misuse at run time ([`ReleaseError`]).
//!
//! Refusals that are part of normal operation ("not yet", "closed until …") are outcomes, not
//! errors; see each machine. Every error here is a small `Copy` enum whose message names the
//! option or the value at fault.

use core::fmt;

use crate::options::{ConfigOption, OptionKeys};

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
///
/// A client with settings of its own names them instead with
/// [`display_with`](Self::display_with) and an [`OptionKeys`] mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value lies outside the range the option allows (bounds inclusive, in `unit`).
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
    Inverted {
        /// The setting that is too large.
        option: &'static ConfigOption,
        /// The setting it must not exceed.
        limit: &'static ConfigOption,
    },
    /// An option is malformed in another way; `reason` says how.
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

    /// This error's message with the caller's keys: each option the error names (both of an
    /// [`Inverted`](Self::Inverted)) that `keys` maps is named by the caller's key alone, with
    /// none of our names, methods or upstream keys; an unmapped one is named as `Display`
    /// names it. With [`OptionKeys::NONE`] the message is exactly `Display`'s. Allocates
    /// nothing and cannot panic (only the formatter's sink can fail).
    ///
    /// ```
    /// use throttle_sansio::PacedWriterConfig;
    /// use throttle_sansio::options::{self, OptionKeys};
    ///
    /// let keys = [(&options::paced_writer::BATCH_BYTES, "writer_batch_size")];
    /// let err = PacedWriterConfig::default().with_batch_bytes(0).validate().unwrap_err();
    /// assert_eq!(
    ///     err.display_with(OptionKeys::new(&keys)).to_string(),
    ///     "`writer_batch_size` = 0 bytes is outside 1..=18446744073709551615 bytes"
    /// );
    /// assert_eq!(err.display_with(OptionKeys::NONE).to_string(), err.to_string());
    /// ```
    pub fn display_with<'a>(&'a self, keys: OptionKeys<'a>) -> DisplayWith<'a> {
        DisplayWith { error: self, keys }
    }
}

/// A [`ConfigError`] shown with the caller's option keys: see [`ConfigError::display_with`].
///
/// ```
/// use throttle_sansio::{ConfigError, options::{self, OptionKeys}};
///
/// let err = ConfigError::Inverted {
///     option: &options::backoff::FLUSS_RETRY_INITIAL,
///     limit: &options::backoff::FLUSS_RETRY_MAX,
/// };
/// let keys = [(&options::backoff::FLUSS_RETRY_MAX, "writer_retry_max_backoff_ms")];
/// assert_eq!(
///     err.display_with(OptionKeys::new(&keys)).to_string(),
///     "`initial` must not exceed `writer_retry_max_backoff_ms` (`BackoffConfigBuilder::initial`; \
///      Fluss Rust `writer_retry_backoff_ms`, Kafka `retry.backoff.ms`)"
/// );
/// ```
#[derive(Debug, Clone, Copy)]
pub struct DisplayWith<'a> {
    error: &'a ConfigError,
    keys: OptionKeys<'a>,
}

/// One option as a message names it: by the caller's key when mapped, else by our name with
/// its method and upstream keys in the parenthesis.
#[derive(Clone, Copy)]
struct Named<'a> {
    option: &'static ConfigOption,
    key: Option<&'a str>,
}

impl<'a> Named<'a> {
    fn new(option: &'static ConfigOption, keys: OptionKeys<'a>) -> Self {
        Named {
            option,
            key: keys.key(option),
        }
    }

    /// The name in backquotes.
    fn name(self) -> &'a str {
        self.key.unwrap_or(self.option.name())
    }

    /// Our description of the option, only when the caller has no key for it.
    fn ours(self) -> Option<&'static ConfigOption> {
        match self.key {
            Some(_) => None,
            None => Some(self.option),
        }
    }
}

impl fmt::Display for DisplayWith<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self.error {
            ConfigError::OutOfRange {
                option,
                got,
                min,
                max,
                unit,
            } => {
                let o = Named::new(option, self.keys);
                write!(
                    f,
                    "`{}` = {got} {unit} is outside {min}..={max} {unit}",
                    o.name()
                )?;
                match o.ours() {
                    Some(ours) => write!(f, " ({ours})"),
                    None => Ok(()),
                }
            }
            ConfigError::Inverted { option, limit } => {
                let (o, l) = (Named::new(option, self.keys), Named::new(limit, self.keys));
                write!(f, "`{}` must not exceed `{}`", o.name(), l.name())?;
                match (o.ours(), l.ours()) {
                    (Some(ours), Some(limit)) => write!(f, " ({ours}; limit {limit})"),
                    (Some(ours), None) => write!(f, " ({ours})"),
                    (None, Some(limit)) => write!(f, " (limit {limit})"),
                    (None, None) => Ok(()),
                }
            }
            ConfigError::Invalid { option, reason } => {
                let o = Named::new(option, self.keys);
                write!(f, "`{}`: {reason}", o.name())?;
                match o.ours() {
                    Some(ours) => write!(f, " ({ours})"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl fmt::Display for ConfigError {
    /// The message naming our option, its method and its upstream keys (see the type's docs);
    /// [`ConfigError::display_with`] names the caller's keys instead.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.display_with(OptionKeys::NONE), f)
    }
}

impl core::error::Error for ConfigError {}

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
