//! gRPC service config → our configs: a method config's `retryPolicy` (gRFC A6) becomes a
//! [`BackoffConfig`], a [`CallConfig`] and a classifier of gRPC status codes
//! ([`GrpcStatusCodes`]); `retryThrottling` becomes a [`GrpcThrottleConfig`] ([`GrpcRetryThrottling`]).
//!
//! Input is the JSON text itself, read by a small no-allocation reader (no float is ever
//! involved: durations, the multiplier and `tokenRatio` are parsed as exact decimals).
//! gRFC A6's validation rules are [`ConfigError`]s that name the JSON key
//! (`options::grpc_service_config`).
//!
//! ```
//! use core::time::Duration;
//! use throttle_sansio::backoff::JitterOrder;
//! use throttle_sansio::failover::{ErrorClass, ErrorClassifier};
//! use throttle_sansio::grpc_config::{GrpcCode, GrpcRetryPolicy};
//!
//! // gRFC A6, "Retry Policy Capabilities".
//! let policy = GrpcRetryPolicy::from_method_config_json(
//!     r#"{"name": [{"service": "foo"}], "retryPolicy": {
//!         "maxAttempts": 4, "initialBackoff": ".1s", "maxBackoff": "1s",
//!         "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}"#,
//! )?
//! .expect("a retry policy");
//! assert_eq!(policy.max_attempts(), 4);
//! assert_eq!(policy.call_config().max_auto_retries(), 3);
//! assert_eq!(policy.backoff().initial(), Duration::from_millis(100));
//! assert_eq!(policy.backoff().jitter_order(), JitterOrder::CapThenJitter);
//! assert_eq!(policy.retryable_codes().classify(&GrpcCode::Unavailable), ErrorClass::RETRY);
//! assert_eq!(policy.retryable_codes().classify(&GrpcCode::Internal), ErrorClass::SURFACE);
//! # Ok::<(), throttle_sansio::ConfigError>(())
//! ```

mod json;

use crate::backoff::{BackoffConfig, Jitter, JitterOrder};
use crate::error::ConfigError;
use crate::failover::{CallConfig, ErrorClass, ErrorClassifier, GrpcThrottleConfig};
use crate::options::{ConfigOption, backoff as backoff_opt, grpc_service_config as opt};
use core::time::Duration;
use json::{Decimal, Reader, Str};

/// gRFC A6 "Limits on Retries and Hedges": the client-side maximum of `maxAttempts`;
/// larger values are treated as this.
pub const A6_MAX_ATTEMPTS: u32 = 5;

/// The 17 gRPC status codes, numbered as on the wire (`grpc/grpc` `doc/statuscodes.md`).
///
/// ```
/// use throttle_sansio::grpc_config::GrpcCode;
/// assert_eq!(GrpcCode::from_name("UNAVAILABLE"), Some(GrpcCode::Unavailable));
/// assert_eq!(GrpcCode::from_u32(14), Some(GrpcCode::Unavailable));
/// assert_eq!(GrpcCode::Unavailable.name(), "UNAVAILABLE");
/// assert_eq!(GrpcCode::from_u32(17), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[allow(missing_docs)] // the names are gRPC's
pub enum GrpcCode {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl GrpcCode {
    /// Every code, in wire order.
    pub const ALL: [GrpcCode; 17] = [
        GrpcCode::Ok,
        GrpcCode::Cancelled,
        GrpcCode::Unknown,
        GrpcCode::InvalidArgument,
        GrpcCode::DeadlineExceeded,
        GrpcCode::NotFound,
        GrpcCode::AlreadyExists,
        GrpcCode::PermissionDenied,
        GrpcCode::ResourceExhausted,
        GrpcCode::FailedPrecondition,
        GrpcCode::Aborted,
        GrpcCode::OutOfRange,
        GrpcCode::Unimplemented,
        GrpcCode::Internal,
        GrpcCode::Unavailable,
        GrpcCode::DataLoss,
        GrpcCode::Unauthenticated,
    ];

    /// The code with wire number `n`, if there is one (0..=16).
    pub const fn from_u32(n: u32) -> Option<GrpcCode> {
        if n < 17 {
            Some(GrpcCode::ALL[n as usize])
        } else {
            None
        }
    }

    /// The code's canonical upper-case name, as service configs spell it.
    pub const fn name(self) -> &'static str {
        match self {
            GrpcCode::Ok => "OK",
            GrpcCode::Cancelled => "CANCELLED",
            GrpcCode::Unknown => "UNKNOWN",
            GrpcCode::InvalidArgument => "INVALID_ARGUMENT",
            GrpcCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            GrpcCode::NotFound => "NOT_FOUND",
            GrpcCode::AlreadyExists => "ALREADY_EXISTS",
            GrpcCode::PermissionDenied => "PERMISSION_DENIED",
            GrpcCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            GrpcCode::FailedPrecondition => "FAILED_PRECONDITION",
            GrpcCode::Aborted => "ABORTED",
            GrpcCode::OutOfRange => "OUT_OF_RANGE",
            GrpcCode::Unimplemented => "UNIMPLEMENTED",
            GrpcCode::Internal => "INTERNAL",
            GrpcCode::Unavailable => "UNAVAILABLE",
            GrpcCode::DataLoss => "DATA_LOSS",
            GrpcCode::Unauthenticated => "UNAUTHENTICATED",
        }
    }

    /// The code with this canonical name (exact, upper case, as grpc-go's `codes.Code`
    /// JSON decoding and gRPC core accept), if any.
    pub fn from_name(name: &str) -> Option<GrpcCode> {
        GrpcCode::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// Errors that carry a gRPC status code, for the [`GrpcStatusCodes`] classifier.
pub trait HasGrpcCode {
    /// The error's status code; `None` for a number outside 0..=16 (never retryable).
    fn grpc_code(&self) -> Option<GrpcCode>;
}

impl HasGrpcCode for GrpcCode {
    fn grpc_code(&self) -> Option<GrpcCode> {
        Some(*self)
    }
}

impl HasGrpcCode for u32 {
    fn grpc_code(&self) -> Option<GrpcCode> {
        GrpcCode::from_u32(*self)
    }
}

/// A set of gRPC status codes: a 17-bit bitset, no allocation. As an [`ErrorClassifier`] it
/// answers [`ErrorClass::RETRY`] for a code in the set (A6's `retryableStatusCodes`) and
/// [`ErrorClass::SURFACE`] for any other.
///
/// ```
/// use throttle_sansio::failover::{ErrorClass, ErrorClassifier};
/// use throttle_sansio::grpc_config::{GrpcCode, GrpcStatusCodes};
///
/// let codes = GrpcStatusCodes::EMPTY.with(GrpcCode::Unavailable).with(GrpcCode::Aborted);
/// assert_eq!(codes.len(), 2);
/// assert_eq!(codes.classify(&14u32), ErrorClass::RETRY);
/// assert_eq!(codes.classify(&99u32), ErrorClass::SURFACE);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GrpcStatusCodes(u32);

impl GrpcStatusCodes {
    /// No code.
    pub const EMPTY: GrpcStatusCodes = GrpcStatusCodes(0);

    /// This set with `code` added.
    #[must_use]
    pub const fn with(self, code: GrpcCode) -> Self {
        GrpcStatusCodes(self.0 | 1 << code as u8)
    }

    /// Whether `code` is in the set.
    pub const fn contains(self, code: GrpcCode) -> bool {
        self.0 & (1 << code as u8) != 0
    }

    /// How many codes the set holds.
    pub const fn len(self) -> u32 {
        self.0.count_ones()
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The codes in the set, in wire order.
    pub fn iter(self) -> impl Iterator<Item = GrpcCode> {
        GrpcCode::ALL.into_iter().filter(move |c| self.contains(*c))
    }
}

impl<E: HasGrpcCode + ?Sized> ErrorClassifier<E> for GrpcStatusCodes {
    fn classify(&self, error: &E) -> ErrorClass {
        match error.grpc_code() {
            Some(code) if self.contains(code) => ErrorClass::RETRY,
            Some(_) | None => ErrorClass::SURFACE,
        }
    }
}

/// A validated gRFC A6 `retryPolicy`: its attempts, its backoff and its retryable codes.
///
/// The backoff is `initialBackoff → maxBackoff`, × `backoffMultiplier`, ±20 % jittered after
/// the cap ([`JitterOrder::CapThenJitter`]: A6's `min(initial·mult^(n−1), max)·U(0.8, 1.2)`),
/// on a 1 ns grid, so every duration is kept exactly.
///
/// ```
/// use throttle_sansio::grpc_config::GrpcRetryPolicy;
///
/// let err = GrpcRetryPolicy::from_json(
///     r#"{"maxAttempts": 1, "initialBackoff": "1s", "maxBackoff": "2s",
///         "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}"#,
/// )
/// .unwrap_err();
/// assert_eq!(err.option().name(), "maxAttempts");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcRetryPolicy {
    max_attempts: u32,
    backoff: BackoffConfig,
    codes: GrpcStatusCodes,
}

/// The fields of a `retryPolicy` as read, before validation.
#[derive(Default)]
struct RawPolicy<'a> {
    max_attempts: Option<&'a [u8]>,
    initial: Option<Str<'a>>,
    max: Option<Str<'a>>,
    multiplier: Option<&'a [u8]>,
    codes: Option<GrpcStatusCodes>,
}

impl GrpcRetryPolicy {
    /// Parses a `retryPolicy` object (the JSON text of the object itself).
    ///
    /// Refuses, naming the key: a missing field; `maxAttempts` not an integer or below 2
    /// (above [`A6_MAX_ATTEMPTS`] it is treated as 5); `initialBackoff` or `maxBackoff` not a
    /// proto-JSON duration (`"1.5s"`, at most 9 fraction digits), not above zero, or past
    /// `u64::MAX` ns; `initialBackoff` above `maxBackoff` (our backoff's rule, where gRPC
    /// would simply cap); `backoffMultiplier` not above zero, or below 1 (refused on purpose:
    /// backoff never shrinks here, where A6 allows it), or not `num/den` with both in `u32`
    /// and `den` a power of ten up to 10⁹; `retryableStatusCodes` empty, or holding an unknown
    /// name or a number outside 0..=16. Malformed JSON is refused as `json`. Unknown keys are
    /// skipped; keys match in any ASCII case and in snake case (`max_attempts`).
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let mut r = Reader::new(text, &opt::JSON);
        let raw = Self::read(&mut r)?;
        r.end()?;
        Self::validate(&raw)
    }

    /// Parses a method config (an element of a service config's `methodConfig`): its
    /// `retryPolicy`, or `None` if it has none (its RPCs are not retried). Other keys
    /// (`name`, `timeout`, `waitForReady`, …) are skipped unread.
    pub fn from_method_config_json(text: &str) -> Result<Option<Self>, ConfigError> {
        let mut r = Reader::new(text, &opt::JSON);
        r.begin_object()?;
        let mut first = true;
        let mut raw = None;
        while let Some(key) = r.next_key(&mut first)? {
            if key.is_key("retryPolicy", "retry_policy") {
                raw = if r.null() {
                    None
                } else {
                    Some(Self::read(&mut r)?)
                };
            } else {
                r.skip()?;
            }
        }
        // The whole text is well-formed before any rule is checked.
        r.end()?;
        raw.map(|raw| Self::validate(&raw)).transpose()
    }

    fn read<'a>(r: &mut Reader<'a>) -> Result<RawPolicy<'a>, ConfigError> {
        r.begin_object()?;
        let mut raw = RawPolicy::default();
        let mut first = true;
        while let Some(key) = r.next_key(&mut first)? {
            if key.is_key("maxAttempts", "max_attempts") {
                raw.max_attempts = Some(r.number().map_err(|_| wrong_type(&opt::MAX_ATTEMPTS))?);
            } else if key.is_key("initialBackoff", "initial_backoff") {
                raw.initial = Some(r.string().map_err(|_| wrong_type(&opt::INITIAL_BACKOFF))?);
            } else if key.is_key("maxBackoff", "max_backoff") {
                raw.max = Some(r.string().map_err(|_| wrong_type(&opt::MAX_BACKOFF))?);
            } else if key.is_key("backoffMultiplier", "backoff_multiplier") {
                raw.multiplier = Some(
                    r.number()
                        .map_err(|_| wrong_type(&opt::BACKOFF_MULTIPLIER))?,
                );
            } else if key.is_key("retryableStatusCodes", "retryable_status_codes") {
                raw.codes = Some(read_codes(r)?);
            } else {
                r.skip()?;
            }
        }
        Ok(raw)
    }

    fn validate(raw: &RawPolicy<'_>) -> Result<Self, ConfigError> {
        let attempts = raw.max_attempts.ok_or(missing(&opt::MAX_ATTEMPTS))?;
        let attempts = integer(attempts, &opt::MAX_ATTEMPTS)?;
        if attempts < 2 {
            return Err(ConfigError::OutOfRange {
                option: &opt::MAX_ATTEMPTS,
                got: attempts,
                min: 2,
                max: u64::from(A6_MAX_ATTEMPTS),
                unit: "attempts",
            });
        }
        let max_attempts = u32::try_from(attempts)
            .unwrap_or(u32::MAX)
            .min(A6_MAX_ATTEMPTS);
        let initial = duration(
            raw.initial.ok_or(missing(&opt::INITIAL_BACKOFF))?,
            &opt::INITIAL_BACKOFF,
        )?;
        let max = duration(
            raw.max.ok_or(missing(&opt::MAX_BACKOFF))?,
            &opt::MAX_BACKOFF,
        )?;
        let (num, den) = multiplier(raw.multiplier.ok_or(missing(&opt::BACKOFF_MULTIPLIER))?)?;
        let codes = raw.codes.ok_or(missing(&opt::RETRYABLE_STATUS_CODES))?;
        let backoff = BackoffConfig::builder()
            .initial(initial)
            .max(max)
            .multiplier(num, den)
            .jitter(Jitter::Proportional { ppm: 200_000 })
            .jitter_order(JitterOrder::CapThenJitter)
            .resolution(Duration::from_nanos(1))
            .build()
            .map_err(rename_backoff_error)?;
        Ok(GrpcRetryPolicy {
            max_attempts,
            backoff,
            codes,
        })
    }

    /// `maxAttempts` after A6's cap: the original attempt included, 2..=5.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The backoff between attempts (see the type's docs).
    pub fn backoff(&self) -> &BackoffConfig {
        &self.backoff
    }

    /// The retryable status codes, which classify errors ([`ErrorClassifier`]).
    pub fn retryable_codes(&self) -> GrpcStatusCodes {
        self.codes
    }

    /// A call config: `maxAttempts − 1` automatic retries with this policy's backoff.
    pub fn call_config(&self) -> CallConfig {
        CallConfig::default()
            .with_max_auto_retries(self.max_attempts - 1)
            .with_backoff(self.backoff.clone())
    }
}

/// A validated gRFC A6 `retryThrottling`, which becomes a [`GrpcThrottleConfig`].
///
/// ```
/// use throttle_sansio::grpc_config::GrpcRetryThrottling;
///
/// let t = GrpcRetryThrottling::from_json(r#"{"maxTokens": 10, "tokenRatio": 0.1}"#)?;
/// let config = t.throttle_config();
/// assert_eq!((config.max_tokens(), config.milli_token_ratio()), (10, 100));
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcRetryThrottling {
    config: GrpcThrottleConfig,
}

impl GrpcRetryThrottling {
    /// Parses a `retryThrottling` object (its JSON text): `maxTokens` an integer in 1..=1000,
    /// `tokenRatio` a number above zero kept to three decimals, truncated, as gRPC does
    /// (`0.5466` → 546 milli-tokens), read as an exact decimal. A ratio whose three decimals
    /// are all zero (`0.0009`) is refused. Errors name the key; malformed JSON is refused as
    /// `json`.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let mut r = Reader::new(text, &opt::THROTTLING_JSON);
        r.begin_object()?;
        let (mut tokens, mut ratio) = (None, None);
        let mut first = true;
        while let Some(key) = r.next_key(&mut first)? {
            if key.is_key("maxTokens", "max_tokens") {
                tokens = Some(r.number().map_err(|_| wrong_type(&opt::MAX_TOKENS))?);
            } else if key.is_key("tokenRatio", "token_ratio") {
                ratio = Some(r.number().map_err(|_| wrong_type(&opt::TOKEN_RATIO))?);
            } else {
                r.skip()?;
            }
        }
        r.end()?;
        let tokens = integer(tokens.ok_or(missing(&opt::MAX_TOKENS))?, &opt::MAX_TOKENS)?;
        if !(1..=1_000).contains(&tokens) {
            return Err(ConfigError::OutOfRange {
                option: &opt::MAX_TOKENS,
                got: tokens,
                min: 1,
                max: 1_000,
                unit: "tokens",
            });
        }
        let ratio = ratio.ok_or(missing(&opt::TOKEN_RATIO))?;
        let dec = Decimal::parse(ratio).ok_or(wrong_type(&opt::TOKEN_RATIO))?;
        if dec.negative || dec.is_zero() {
            return Err(ConfigError::Invalid {
                option: &opt::TOKEN_RATIO,
                reason: "must be greater than zero (gRFC A6)",
            });
        }
        let milli = dec.floor_scaled(3).unwrap_or(u64::MAX);
        let milli_u32 =
            u32::try_from(milli)
                .ok()
                .filter(|m| *m >= 1)
                .ok_or(ConfigError::OutOfRange {
                    option: &opt::TOKEN_RATIO,
                    got: milli,
                    min: 1,
                    max: u64::from(u32::MAX),
                    unit: "milli-tokens",
                })?;
        let config = GrpcThrottleConfig::default()
            .with_max_tokens(u32::try_from(tokens).unwrap_or(1_000))
            .with_milli_token_ratio(milli_u32);
        config.validate()?;
        Ok(GrpcRetryThrottling { config })
    }

    /// The throttle's config: `maxTokens` and the milli-token ratio.
    pub fn throttle_config(&self) -> GrpcThrottleConfig {
        self.config
    }
}

fn missing(option: &'static ConfigOption) -> ConfigError {
    ConfigError::Invalid {
        option,
        reason: "is required (gRFC A6)",
    }
}

fn wrong_type(option: &'static ConfigOption) -> ConfigError {
    ConfigError::Invalid {
        option,
        reason: "has the wrong JSON type or is malformed",
    }
}

/// A non-negative JSON integer written without point or exponent, saturated at `u64::MAX`.
fn integer(text: &[u8], option: &'static ConfigOption) -> Result<u64, ConfigError> {
    let dec = Decimal::parse(text).ok_or(wrong_type(option))?;
    if !dec.is_plain_integer() {
        return Err(ConfigError::Invalid {
            option,
            reason: "must be an integer",
        });
    }
    if dec.negative && !dec.is_zero() {
        return Err(ConfigError::Invalid {
            option,
            reason: "must not be negative",
        });
    }
    Ok(dec.floor_scaled(0).unwrap_or(u64::MAX))
}

/// A proto-JSON `Duration` string, `"<seconds>[.<up to 9 digits>]s"`, above zero, in ns.
fn duration(s: Str<'_>, option: &'static ConfigOption) -> Result<Duration, ConfigError> {
    let bad = ConfigError::Invalid {
        option,
        reason: "must be a duration like \"0.1s\" (seconds, at most 9 fraction digits)",
    };
    let body = match s.raw.split_last() {
        Some((b's', body)) if !s.escaped => body,
        _ => return Err(bad),
    };
    // No exponent in a duration: only digits, one optional point, one optional leading `-`.
    if body.iter().any(|b| matches!(b, b'e' | b'E' | b'+')) {
        return Err(bad);
    }
    let dec = Decimal::parse(body).ok_or(bad)?;
    if dec.fraction_digits(9) > 9 {
        return Err(bad);
    }
    if dec.negative || dec.is_zero() {
        return Err(ConfigError::Invalid {
            option,
            reason: "must be greater than zero (gRFC A6)",
        });
    }
    dec.floor_scaled(9)
        .map(Duration::from_nanos)
        .ok_or(ConfigError::Invalid {
            option,
            reason: "exceeds u64::MAX ns (about 584 years), the longest span this crate keeps",
        })
}

/// `backoffMultiplier` as an exact `num/den`.
fn multiplier(text: &[u8]) -> Result<(u32, u32), ConfigError> {
    let option = &opt::BACKOFF_MULTIPLIER;
    let dec = Decimal::parse(text).ok_or(wrong_type(option))?;
    if dec.negative || dec.is_zero() {
        return Err(ConfigError::Invalid {
            option,
            reason: "must be greater than zero (gRFC A6)",
        });
    }
    let imprecise = ConfigError::Invalid {
        option,
        reason: "needs num/den with both in u32 and den a power of ten up to 10^9",
    };
    let k = dec.fraction_digits(9);
    if k > 9 {
        return Err(imprecise);
    }
    let num = dec
        .floor_scaled(k)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or(imprecise)?;
    let den = 10u32.pow(u32::try_from(k).unwrap_or(0));
    if num < den {
        return Err(ConfigError::Invalid {
            option,
            reason: "must be at least 1: a backoff never shrinks (docs/design.md), a \
                     deliberate departure from gRFC A6, which allows multipliers below 1",
        });
    }
    Ok((num, den))
}

/// `retryableStatusCodes`: a non-empty array of code names or numbers.
fn read_codes(r: &mut Reader<'_>) -> Result<GrpcStatusCodes, ConfigError> {
    let option = &opt::RETRYABLE_STATUS_CODES;
    r.begin_array().map_err(|_| wrong_type(option))?;
    let mut codes = GrpcStatusCodes::EMPTY;
    let mut first = true;
    while r.next_element(&mut first)? {
        let code = if r.at_string() {
            let s = r.string()?;
            core::str::from_utf8(s.raw)
                .ok()
                .filter(|_| !s.escaped)
                .and_then(GrpcCode::from_name)
                .ok_or(ConfigError::Invalid {
                    option,
                    reason: "holds an unknown status code name",
                })?
        } else {
            let n = integer(r.number().map_err(|_| wrong_type(option))?, option)?;
            u32::try_from(n)
                .ok()
                .and_then(GrpcCode::from_u32)
                .ok_or(ConfigError::OutOfRange {
                    option,
                    got: n,
                    min: 0,
                    max: 16,
                    unit: "code",
                })?
        };
        codes = codes.with(code);
    }
    if codes.is_empty() {
        return Err(ConfigError::Invalid {
            option,
            reason: "must be non-empty (gRFC A6)",
        });
    }
    Ok(codes)
}

/// A backoff builder error renamed to the JSON key that set the option.
fn rename_backoff_error(e: ConfigError) -> ConfigError {
    let key = |o: &'static ConfigOption| -> &'static ConfigOption {
        if *o == backoff_opt::INITIAL {
            &opt::INITIAL_BACKOFF
        } else if *o == backoff_opt::MAX {
            &opt::MAX_BACKOFF
        } else if *o == backoff_opt::MULTIPLIER {
            &opt::BACKOFF_MULTIPLIER
        } else {
            o
        }
    };
    match e {
        ConfigError::Inverted { option, limit } => ConfigError::Inverted {
            option: key(option),
            limit: key(limit),
        },
        ConfigError::Invalid { option, reason } => ConfigError::Invalid {
            option: key(option),
            reason,
        },
        ConfigError::OutOfRange {
            option,
            got,
            min,
            max,
            unit,
        } => ConfigError::OutOfRange {
            option: key(option),
            got,
            min,
            max,
            unit,
        },
    }
}

#[cfg(test)]
mod tests;
