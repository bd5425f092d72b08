//! A retry helper in the style of backon (placeholder, filled in below).

use core::time::Duration;

/// One attempt of a retried operation: its number and the time it has left.
///
/// Handed to the operation of [`FailoverExecutor::call_until`](super::FailoverExecutor) and
/// of [`retry`]; the number counts sends (1 for the first), the time left is measured on
/// the runtime's clock as the attempt starts (`None` without a deadline).
///
/// ```
/// use throttle_sansio::sync::Attempt;
/// fn timeout_for(a: Attempt) -> core::time::Duration {
///     a.time_left.unwrap_or(core::time::Duration::from_secs(30))
/// }
/// # let _ = timeout_for;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Attempt {
    /// 1 for the first send, 2 for the first retry, …
    pub number: u64,
    /// The time left before the deadline as the attempt starts, `None` without one.
    pub time_left: Option<Duration>,
}

impl Attempt {
    pub(crate) fn new(number: u64, time_left: Option<Duration>) -> Self {
        Attempt { number, time_left }
    }
}
