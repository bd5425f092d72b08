//! Error classification: the two independent answers a failover call needs.
//!
//! The caller maps each error to an [`ErrorClass`]: should metadata be refreshed
//! (`refresh`), and is an automatic retry safe (`retry`)? Upstream Fluss expresses the same
//! thing as two predicates (a refresh predicate and a retry predicate); keeping them apart is
//! what lets the admin write gateway refresh after a timeout without ever re-executing a write.
//!
//! A new error class is a small [`ErrorClassifier`] impl (or a closure); the presets cover the
//! two gateways of the Fluss admin client over a three-way [`ErrorKind`].

/// Whether an automatic retry of a failed request is safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetrySafety {
    /// Never retry automatically: the request may have executed (timeout, lost connection,
    /// unknown outcome) or the error is permanent. The caller decides what to do.
    Never,
    /// The server provably rejected the request before executing it (e.g. "not the leader"),
    /// so an automatic retry cannot apply it twice.
    NotExecuted,
}

/// What kind of failure an error is, for the retry it may lead to: it picks the backoff
/// ([`CallConfig::with_throttling_backoff`](super::CallConfig::with_throttling_backoff)) and
/// what the retry costs a budget that prices retries ([`AwsRetryQuota`](super::AwsRetryQuota)).
///
/// The three causes are those of the AWS SDKs' standard retry mode ("Retry behavior", AWS
/// SDKs and Tools reference guide): a throttling error (`ThrottlingException`, HTTP 429) backs
/// off from a longer base, a timeout cost 10 quota tokens instead of 5 before the 2026
/// revision, and every other retryable error is transient.
///
/// ```
/// use throttle_sansio::failover::{ErrorCause, ErrorClass};
///
/// let throttled = ErrorClass::RETRY.with_cause(ErrorCause::Throttling);
/// assert_eq!(throttled.cause, ErrorCause::Throttling);
/// assert_eq!(ErrorClass::RETRY.cause, ErrorCause::Transient, "the default cause");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCause {
    /// Any retryable error that is neither a timeout nor throttling (the default).
    #[default]
    Transient,
    /// The attempt timed out (no answer arrived in time).
    Timeout,
    /// The server asked the client to slow down (throttling, "too many requests").
    Throttling,
}

/// How a call should react to one error: refresh metadata, and/or retry automatically.
///
/// The two answers are independent: `refresh` alone (timeout on a write) refreshes and then
/// surfaces the original error; `retry` alone retries on the same metadata. `cause` says what
/// kind of failure it was: it picks the retry's backoff and its cost to the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ErrorClass {
    /// Refresh metadata (e.g. find the new coordinator leader) before going on.
    pub refresh: bool,
    /// Whether the failed request may be retried automatically.
    pub retry: RetrySafety,
    /// What kind of failure it was ([`ErrorCause::Transient`] unless set with
    /// [`ErrorClass::with_cause`]).
    pub cause: ErrorCause,
}

impl ErrorClass {
    /// Neither refresh nor retry: surface the error as it is.
    pub const SURFACE: ErrorClass = ErrorClass::new(false, RetrySafety::Never);
    /// Refresh metadata, then surface the original error (a write that may have executed).
    pub const REFRESH_THEN_SURFACE: ErrorClass = ErrorClass::new(true, RetrySafety::Never);
    /// Refresh metadata, then retry automatically (a request rejected before execution).
    pub const REFRESH_AND_RETRY: ErrorClass = ErrorClass::new(true, RetrySafety::NotExecuted);
    /// Retry automatically on the same metadata.
    pub const RETRY: ErrorClass = ErrorClass::new(false, RetrySafety::NotExecuted);

    /// A class from its two answers, with the cause [`ErrorCause::Transient`].
    pub const fn new(refresh: bool, retry: RetrySafety) -> Self {
        ErrorClass {
            refresh,
            retry,
            cause: ErrorCause::Transient,
        }
    }

    /// This class with `cause` (the answers stay the same).
    #[must_use]
    pub const fn with_cause(mut self, cause: ErrorCause) -> Self {
        self.cause = cause;
        self
    }
}

/// Maps a caller's error type `E` to an [`ErrorClass`].
///
/// Closures `Fn(&E) -> ErrorClass` are classifiers too:
///
/// ```
/// use throttle_sansio::failover::{ErrorClass, ErrorClassifier};
/// let by_code = |code: &u16| if *code == 503 { ErrorClass::REFRESH_AND_RETRY } else { ErrorClass::SURFACE };
/// assert_eq!(by_code.classify(&503), ErrorClass::REFRESH_AND_RETRY);
/// ```
pub trait ErrorClassifier<E: ?Sized> {
    /// The class of `error`.
    fn classify(&self, error: &E) -> ErrorClass;
}

impl<E: ?Sized, F: Fn(&E) -> ErrorClass> ErrorClassifier<E> for F {
    fn classify(&self, error: &E) -> ErrorClass {
        self(error)
    }
}

/// The three kinds of error the presets distinguish.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The server is not the leader (Fluss `NotCoordinatorLeaderException`): it rejected the
    /// request before executing it.
    NotLeader,
    /// Any other recoverable error (network error, timeout, disconnect): the request may or
    /// may not have executed.
    Retriable,
    /// Anything else: permanent for this request.
    Fatal,
}

/// A caller's error type that can say which [`ErrorKind`] it is, so the presets classify it.
///
/// One method to implement; [`ErrorKind`] itself implements it.
pub trait HasErrorKind {
    /// The kind of this error.
    fn error_kind(&self) -> ErrorKind;
}

impl HasErrorKind for ErrorKind {
    fn error_kind(&self) -> ErrorKind {
        *self
    }
}

/// Preset for read-only gateways: every recoverable error refreshes and retries (a read is
/// safe to repeat); anything else surfaces.
///
/// Not-leader counts as recoverable here: for a read it is the plainest failover signal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadOnlyGateway;

impl<E: HasErrorKind + ?Sized> ErrorClassifier<E> for ReadOnlyGateway {
    fn classify(&self, error: &E) -> ErrorClass {
        match error.error_kind() {
            ErrorKind::NotLeader | ErrorKind::Retriable => ErrorClass::REFRESH_AND_RETRY,
            ErrorKind::Fatal => ErrorClass::SURFACE,
        }
    }
}

/// Preset for the admin write gateway (the upstream coordinator-failover fix).
///
/// Not-leader refreshes and retries (the server rejected the write before executing it);
/// any other recoverable error refreshes and then surfaces the original error (the write may
/// have executed, so only the user may retry it); anything else surfaces untouched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdminWriteGateway;

impl<E: HasErrorKind + ?Sized> ErrorClassifier<E> for AdminWriteGateway {
    fn classify(&self, error: &E) -> ErrorClass {
        match error.error_kind() {
            ErrorKind::NotLeader => ErrorClass::REFRESH_AND_RETRY,
            ErrorKind::Retriable => ErrorClass::REFRESH_THEN_SURFACE,
            ErrorKind::Fatal => ErrorClass::SURFACE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller's own error type, plugged into the presets by one method.
    enum RpcError {
        NotCoordinatorLeader,
        Timeout,
        Network,
        TableNotExist,
    }

    impl HasErrorKind for RpcError {
        fn error_kind(&self) -> ErrorKind {
            match self {
                RpcError::NotCoordinatorLeader => ErrorKind::NotLeader,
                RpcError::Timeout | RpcError::Network => ErrorKind::Retriable,
                RpcError::TableNotExist => ErrorKind::Fatal,
            }
        }
    }

    #[test]
    fn admin_write_retries_only_not_leader() {
        // Upstream: refreshPredicate = NotCoordinatorLeader || Retriable,
        // retryPredicate = NotCoordinatorLeader only.
        let p = AdminWriteGateway;
        assert_eq!(
            p.classify(&RpcError::NotCoordinatorLeader),
            ErrorClass::REFRESH_AND_RETRY
        );
        assert_eq!(
            p.classify(&RpcError::Timeout),
            ErrorClass::REFRESH_THEN_SURFACE
        );
        assert_eq!(
            p.classify(&RpcError::Network),
            ErrorClass::REFRESH_THEN_SURFACE
        );
        assert_eq!(p.classify(&RpcError::TableNotExist), ErrorClass::SURFACE);
    }

    #[test]
    fn read_only_refreshes_and_retries_every_recoverable_error() {
        let p = ReadOnlyGateway;
        assert_eq!(
            p.classify(&ErrorKind::Retriable),
            ErrorClass::REFRESH_AND_RETRY
        );
        assert_eq!(
            p.classify(&ErrorKind::NotLeader),
            ErrorClass::REFRESH_AND_RETRY
        );
        assert_eq!(p.classify(&ErrorKind::Fatal), ErrorClass::SURFACE);
    }

    #[test]
    fn causes_default_to_transient_and_leave_the_answers_alone() {
        for class in [
            ErrorClass::SURFACE,
            ErrorClass::REFRESH_THEN_SURFACE,
            ErrorClass::REFRESH_AND_RETRY,
            ErrorClass::RETRY,
            AdminWriteGateway.classify(&ErrorKind::NotLeader),
            ReadOnlyGateway.classify(&ErrorKind::Retriable),
        ] {
            assert_eq!(class.cause, ErrorCause::Transient);
            let throttled = class.with_cause(ErrorCause::Throttling);
            assert_eq!(
                (throttled.refresh, throttled.retry),
                (class.refresh, class.retry)
            );
            assert_eq!(throttled.cause, ErrorCause::Throttling);
            assert_ne!(throttled, class);
        }
        assert_eq!(ErrorCause::default(), ErrorCause::Transient);
    }

    #[test]
    fn a_closure_is_a_classifier() {
        let c = |e: &RpcError| match e {
            RpcError::Network => ErrorClass::RETRY,
            _ => ErrorClass::SURFACE,
        };
        assert_eq!(
            c.classify(&RpcError::Network),
            ErrorClass::new(false, RetrySafety::NotExecuted)
        );
        assert_eq!(c.classify(&RpcError::Timeout).retry, RetrySafety::Never);
    }
}
