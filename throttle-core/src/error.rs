//! Errors: refused configuration ([`ConfigError`]) and misuse at run time ([`ReleaseError`]).
//!
//! Refusals that are part of normal operation ("not yet", "closed until …") are outcomes, not
//! errors; see each machine. Every error here is a small `Copy` enum whose message names the
//! option or the value at fault.

/// A configuration the machines refuse, found at construction (`validate()` or a builder).
///
/// `option` is the dotted name of the setting at fault, as a user would find it in a client's
/// configuration, e.g. `client.writer.disk-write-locked.backoff.initial`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value lies outside the range the option allows (bounds inclusive, in `unit`).
    #[error("`{option}` = {got} {unit} is outside {min}..={max} {unit}")]
    OutOfRange {
        /// The setting at fault.
        option: &'static str,
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
    #[error("`{option}` must not exceed `{limit}`")]
    Inverted {
        /// The setting that is too large.
        option: &'static str,
        /// The setting it must not exceed.
        limit: &'static str,
    },
    /// An option is malformed in another way; `reason` says how.
    #[error("`{option}`: {reason}")]
    Invalid {
        /// The setting at fault.
        option: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
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
    use alloc::string::ToString;

    #[test]
    fn messages_name_the_option() {
        let e = ConfigError::OutOfRange {
            option: "client.writer.disk-write-locked.backoff.initial",
            got: 0,
            min: 1,
            max: 2_147_483_647,
            unit: "ms",
        };
        assert_eq!(
            e.to_string(),
            "`client.writer.disk-write-locked.backoff.initial` = 0 ms is outside 1..=2147483647 ms"
        );
        let e = ConfigError::Inverted {
            option: "backoff.initial",
            limit: "backoff.max",
        };
        assert_eq!(
            e.to_string(),
            "`backoff.initial` must not exceed `backoff.max`"
        );
        assert_eq!(
            ReleaseError::AlreadyReleased.to_string(),
            "credit already released"
        );
    }
}
