//! The per-call failover machine: send, classify the failure, refresh, retry at most
//! `max_auto_retries` times, and finish exactly once.

use core::time::Duration;

use super::budget::RetryBudget;
use super::classify::{ErrorCause, ErrorClass, RetrySafety};
use crate::backoff::{Backoff, BackoffConfig};
use crate::error::ConfigError;
use crate::event::EventQueue;
use crate::rng::Rng;
use crate::time::Instant;

/// Settings of a failover call.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallConfig {
    max_auto_retries: u32,
    backoff: Option<BackoffConfig>,
    throttling_backoff: Option<BackoffConfig>,
}

impl Default for CallConfig {
    /// [`CallConfig::fluss_admin`].
    fn default() -> Self {
        Self::fluss_admin()
    }
}

impl CallConfig {
    /// Upstream's policy (the Fluss admin gateway's retry proxy): one automatic retry, sent
    /// as soon as the refresh completes, no backoff.
    pub fn fluss_admin() -> Self {
        CallConfig {
            max_auto_retries: 1,
            backoff: None,
            throttling_backoff: None,
        }
    }

    /// At most `n` automatic retries per call (0 disables them; refreshes still happen).
    pub fn with_max_auto_retries(mut self, n: u32) -> Self {
        self.max_auto_retries = n;
        self
    }

    /// Wait a backoff delay before each automatic retry (none by default).
    pub fn with_backoff(mut self, backoff: BackoffConfig) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// A second backoff for retries after an error classified [`ErrorCause::Throttling`]
    /// (none by default: they use [`CallConfig::with_backoff`]'s).
    ///
    /// The AWS SDKs' standard mode (2026 revision) backs off from a 1 s base after throttling
    /// and from 50 ms after any other error, both ×2 up to 20 s. Each backoff keeps its own
    /// sequence in a call (its attempt count and its limits), so a call that is throttled after
    /// two transient errors waits the throttling backoff's first delay.
    ///
    /// ```
    /// use core::time::Duration;
    /// use throttle_sansio::backoff::{BackoffConfig, Jitter};
    /// use throttle_sansio::failover::*;
    /// use throttle_sansio::rng::SplitMix64;
    /// use throttle_sansio::Instant;
    ///
    /// let aws = |base_ms| {
    ///     BackoffConfig::builder()
    ///         .initial(Duration::from_millis(base_ms))
    ///         .max(Duration::from_secs(20))
    ///         .multiplier(2, 1)
    ///         .jitter(Jitter::None) // AWS draws full jitter; none here, to show the bases
    ///         .build()
    /// };
    /// let cfg = CallConfig::default()
    ///     .with_max_auto_retries(3)
    ///     .with_backoff(aws(50)?)
    ///     .with_throttling_backoff(aws(1_000)?);
    /// let (mut budget, mut rng, now) = (AwsRetryQuota::default(), SplitMix64::new(1), Instant::ZERO);
    /// let mut call = Call::new(&cfg);
    /// let _ = call.start(now, &mut budget);
    /// let throttled = ErrorClass::RETRY.with_cause(ErrorCause::Throttling);
    /// let after = |a| match a {
    ///     CallAction::Retry { after, .. } => after,
    ///     other => panic!("{other:?}"),
    /// };
    /// assert_eq!(after(call.handle_error(now, ErrorClass::RETRY, &mut budget, &mut rng)), Duration::from_millis(50));
    /// assert_eq!(after(call.handle_error(now, throttled, &mut budget, &mut rng)), Duration::from_secs(1));
    /// assert_eq!(after(call.handle_error(now, ErrorClass::RETRY, &mut budget, &mut rng)), Duration::from_millis(100));
    /// # Ok::<(), throttle_sansio::ConfigError>(())
    /// ```
    pub fn with_throttling_backoff(mut self, backoff: BackoffConfig) -> Self {
        self.throttling_backoff = Some(backoff);
        self
    }

    /// The retry limit.
    pub fn max_auto_retries(&self) -> u32 {
        self.max_auto_retries
    }

    /// The backoff before retries, if any.
    pub fn backoff(&self) -> Option<&BackoffConfig> {
        self.backoff.as_ref()
    }

    /// The backoff before retries after throttling, if one is set apart.
    pub fn throttling_backoff(&self) -> Option<&BackoffConfig> {
        self.throttling_backoff.as_ref()
    }

    /// Every combination is valid (the backoff config was validated when it was built); this
    /// exists so every config in the crate is checked the same way.
    pub fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

/// Why a call gave its error back to the user instead of retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SurfaceReason {
    /// The error was classified [`RetrySafety::Never`].
    ClassifiedNever,
    /// The call has already used its `max_auto_retries`.
    RetriesExhausted,
    /// The shared [`RetryBudget`] refused the retry.
    BudgetEmpty,
    /// The backoff refused another delay: one of its limits (`max_attempts`, the soft
    /// `max_wait` or the hard total budget) is reached.
    BackoffExhausted,
    /// The call's deadline: the retry would start at or after it (or, at
    /// [`Call::start`], it has already passed, and nothing was sent).
    DeadlineExceeded,
}

impl core::fmt::Display for SurfaceReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            SurfaceReason::ClassifiedNever => "the error is not safe to retry",
            SurfaceReason::RetriesExhausted => "the automatic retries are used up",
            SurfaceReason::BudgetEmpty => "the shared retry budget refused a retry",
            SurfaceReason::BackoffExhausted => "the backoff refused another delay",
            SurfaceReason::DeadlineExceeded => "the call's deadline leaves no time for a retry",
        })
    }
}

/// What the caller does next for a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a call's next step must be carried out (or it never finishes)"]
pub enum CallAction {
    /// Send the request, then report its outcome with `handle_success` or `handle_error`.
    Send {
        /// The time left before the call's deadline (`None` without one); always positive.
        time_left: Option<Duration>,
    },
    /// Refresh metadata (through the [`RefreshCoalescer`](super::RefreshCoalescer)), then
    /// report with `handle_refreshed`.
    Refresh,
    /// Send the request again after `after` (zero without a backoff), then report its outcome.
    Retry {
        /// How long to wait before sending.
        after: Duration,
        /// The time the retry will have once `after` has passed: `deadline − (now + after)`,
        /// always positive (`None` without a deadline).
        time_left: Option<Duration>,
    },
    /// Give the latest error to the user. The call is finished.
    Surface {
        /// Why the error was not retried.
        reason: SurfaceReason,
    },
    /// Give the success to the user. The call is finished.
    Complete,
    /// Nothing to do: the input was late (the call is finished) or out of order (e.g. a
    /// refresh result while a request is in flight). Nothing changed.
    None,
}

/// An observation of a call, drained with [`Call::poll_event`] once turned on with
/// [`Call::set_event_capacity`] (off by default: see [`crate::event`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallEvent {
    /// The call asked for a metadata refresh ([`CallAction::Refresh`]) after an error.
    RefreshRequested {
        /// The cause of the error that asked for it.
        cause: ErrorCause,
    },
    /// The call handed out a [`CallAction::Retry`].
    RetryDecided {
        /// The retry's number in this call: 1 for the first retry.
        attempt: u32,
        /// The wait before it (zero without a backoff).
        delay: Duration,
        /// The cause of the error it retries, which picked the backoff.
        cause: ErrorCause,
    },
    /// The call handed out a [`CallAction::Surface`]: the error goes back to the user.
    ErrorSurfaced {
        /// Why it was not retried.
        reason: SurfaceReason,
    },
}

/// Where a call stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallState {
    /// Not started.
    Idle,
    /// A request is in flight; its outcome is awaited.
    AwaitingResult,
    /// A metadata refresh is awaited.
    AwaitingRefresh,
    /// Finished with success.
    Succeeded,
    /// Finished by surfacing an error.
    Surfaced(SurfaceReason),
}

/// One request under failover: the upstream admin-gateway retry proxy as a state machine.
///
/// ```text
/// Idle --start--> AwaitingResult --success--> Succeeded
///                   |  ^      \--error, no refresh--> (decide)
///                   |  |                                 |
///             error,|  +-------- Retry { after } --------+
///           refresh v                                    |
///           AwaitingRefresh --refreshed(ok or not)--> (decide) --> Surfaced(reason)
/// ```
///
/// `decide` retries only an error classified [`RetrySafety::NotExecuted`], only while fewer
/// than `max_auto_retries` retries were sent, only when the backoff (if any) grants a delay,
/// the retry would start before the call's deadline (if any), and the [`RetryBudget`] grants
/// a withdrawal; otherwise it surfaces and says why. The error's
/// [`ErrorCause`](super::ErrorCause) picks the backoff (the throttling one, when configured,
/// for [`ErrorCause::Throttling`](super::ErrorCause::Throttling)) and is passed to the budget
/// ([`RetryBudget::try_withdraw_for`], and [`RetryBudget::handle_retry_success`] when that
/// retry succeeds).
///
/// # Deadline
///
/// [`Call::with_deadline`] / [`Call::set_deadline`] give the call an instant after which no
/// attempt starts: `start` at or past it surfaces [`SurfaceReason::DeadlineExceeded`] without
/// sending, a retry that would start at or past it (`now + after ≥ deadline`) surfaces the
/// error with that reason (before the budget is asked, so no withdrawal is wasted), and an
/// error reported at or past it asks for no refresh (the call has no time to use one). Every
/// `Send` / `Retry` carries the attempt's `time_left`. An attempt already in flight is not
/// cut: the caller bounds it with `time_left`.
///
/// # Driving contract
///
/// - Input [`Call::start`] once; then, for every `Send`/`Retry` it hands out, report exactly one
///   outcome: [`Call::handle_success`] or [`Call::handle_error`] with the error's
///   [`ErrorClass`]. A synchronous transport error (the send failed before the request left) is
///   reported through `handle_error` like any other.
/// - After a `Refresh`, report the refresh's end with [`Call::handle_refreshed`], success or not.
/// - After a `Retry`, once `after` has passed, report [`Call::handle_retry_due`] before
///   sending (optional without a deadline): it ends the call instead if a late wake-up has
///   reached the deadline.
/// - Every input returns the one next [`CallAction`]; `Surface` and `Complete` are terminal and
///   are returned at most once. Any input in the wrong state returns [`CallAction::None`] and
///   changes nothing.
/// - Pass the same shared [`RetryBudget`] to every call of a client; `rng` is drawn from only
///   when a backoff is configured.
/// - Queries ([`Call::state`], [`Call::sends`], …) take `&self`.
///
/// The call keeps no clock: without a deadline it makes no decision from time and forwards
/// `now` to the budget, which clamps time itself; with one it compares each `now` with it.
///
/// ```
/// use core::time::Duration;
/// use throttle_sansio::failover::*;
/// use throttle_sansio::rng::SplitMix64;
/// use throttle_sansio::Instant;
///
/// let (mut budget, mut rng) = (Unlimited, SplitMix64::new(1));
/// let cfg = CallConfig::default().with_max_auto_retries(5);
/// let mut call = Call::new(&cfg).with_deadline(Some(Instant::from_millis(100)));
/// let now = Instant::from_millis(30);
/// let time_left = Some(Duration::from_millis(70));
/// assert_eq!(call.start(now, &mut budget), CallAction::Send { time_left });
/// // At 100 ms the retry would start at the deadline: the error surfaces instead.
/// let late = Instant::from_millis(100);
/// assert_eq!(
///     call.handle_error(late, ErrorClass::RETRY, &mut budget, &mut rng),
///     CallAction::Surface { reason: SurfaceReason::DeadlineExceeded }
/// );
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    config: CallConfig,
    deadline: Option<Instant>,
    backoff: Backoff,
    /// The sequence of [`CallConfig::with_throttling_backoff`], apart from the other.
    throttling_backoff: Backoff,
    state: CallState,
    /// The retry safety of the error whose refresh is awaited.
    pending: RetrySafety,
    /// The cause of the error whose refresh is awaited.
    pending_cause: ErrorCause,
    /// The cause the attempt in flight was retried for (`None` for the first attempt).
    retry_cause: Option<ErrorCause>,
    retries: u32,
    /// A `Retry` was handed out and [`Call::handle_retry_due`] has not been reported for it.
    due: bool,
    sends: u64,
    refreshes: u64,
    /// Observations, off until [`Self::set_event_capacity`].
    events: EventQueue<CallEvent>,
}

impl Call {
    /// A call that has not started.
    pub fn new(config: &CallConfig) -> Self {
        Call {
            config: config.clone(),
            deadline: None,
            backoff: Backoff::new(),
            throttling_backoff: Backoff::new(),
            state: CallState::Idle,
            pending: RetrySafety::Never,
            pending_cause: ErrorCause::Transient,
            retry_cause: None,
            retries: 0,
            due: false,
            sends: 0,
            refreshes: 0,
            events: EventQueue::new(),
        }
    }

    /// This call with no attempt starting at or after `deadline` (`None`: no deadline).
    #[must_use]
    pub fn with_deadline(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    /// Command: sets or clears the deadline; later decisions use it (an attempt in flight
    /// keeps the `time_left` it was given).
    pub fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    /// The deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The time from `now` to the deadline (zero once it has passed), or `None` without one.
    pub fn time_left(&self, now: Instant) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(now))
    }

    /// Whether an attempt starting at `at` would start at or after the deadline.
    fn too_late(&self, at: Instant) -> bool {
        self.deadline.is_some_and(|d| at >= d)
    }

    /// Input: begin the call. Returns [`CallAction::Send`] the first time, then
    /// [`CallAction::None`]; with a deadline at or before `now`, surfaces
    /// [`SurfaceReason::DeadlineExceeded`] instead, without sending (nothing reaches the
    /// budget).
    pub fn start<B: RetryBudget + ?Sized>(&mut self, now: Instant, budget: &mut B) -> CallAction {
        if self.state != CallState::Idle {
            return CallAction::None;
        }
        if self.too_late(now) {
            return self.surface(SurfaceReason::DeadlineExceeded);
        }
        budget.handle_request(now);
        self.state = CallState::AwaitingResult;
        self.sends = 1;
        CallAction::Send {
            time_left: self.time_left(now),
        }
    }

    /// Input: the request in flight succeeded. Returns [`CallAction::Complete`] once.
    ///
    /// The budget hears [`RetryBudget::handle_success`] for a success at the first attempt
    /// and [`RetryBudget::handle_retry_success`] with the retry's cause for one on a retry.
    pub fn handle_success<B: RetryBudget + ?Sized>(
        &mut self,
        now: Instant,
        budget: &mut B,
    ) -> CallAction {
        if self.state != CallState::AwaitingResult {
            return CallAction::None;
        }
        self.due = false;
        match self.retry_cause {
            None => budget.handle_success(now),
            Some(cause) => budget.handle_retry_success(now, cause),
        }
        self.state = CallState::Succeeded;
        CallAction::Complete
    }

    /// Input: the request in flight failed with an error of class `class`.
    ///
    /// Returns `Refresh` when the class asks for one (whatever happens next) and the deadline,
    /// if any, is still ahead; otherwise the retry decision. A synchronous transport error
    /// comes here too.
    // Upstream surfaces a synchronous send failure untouched; we classify it like any other,
    // so a dead coordinator's refused connection still triggers the refresh.
    pub fn handle_error<B: RetryBudget + ?Sized, R: Rng + ?Sized>(
        &mut self,
        now: Instant,
        class: ErrorClass,
        budget: &mut B,
        rng: &mut R,
    ) -> CallAction {
        if self.state != CallState::AwaitingResult {
            return CallAction::None;
        }
        self.due = false;
        if class.retry == RetrySafety::NotExecuted {
            budget.handle_failure(now);
        }
        if class.refresh && !self.too_late(now) {
            self.state = CallState::AwaitingRefresh;
            self.pending = class.retry;
            self.pending_cause = class.cause;
            self.refreshes = self.refreshes.saturating_add(1);
            self.events
                .emit(|| CallEvent::RefreshRequested { cause: class.cause });
            return CallAction::Refresh;
        }
        self.decide(now, class.retry, class.cause, budget, rng)
    }

    /// Input: the refresh asked for has ended; `ok` says whether it succeeded.
    ///
    /// `ok` does not change the decision: a failed refresh does not prevent the retry (another
    /// refresh may have updated the metadata meanwhile, and the retry's own failure will ask
    /// for a new refresh).
    pub fn handle_refreshed<B: RetryBudget + ?Sized, R: Rng + ?Sized>(
        &mut self,
        now: Instant,
        ok: bool,
        budget: &mut B,
        rng: &mut R,
    ) -> CallAction {
        let _ = ok;
        if self.state != CallState::AwaitingRefresh {
            return CallAction::None;
        }
        self.decide(now, self.pending, self.pending_cause, budget, rng)
    }

    fn decide<B: RetryBudget + ?Sized, R: Rng + ?Sized>(
        &mut self,
        now: Instant,
        retry: RetrySafety,
        cause: ErrorCause,
        budget: &mut B,
        rng: &mut R,
    ) -> CallAction {
        match retry {
            RetrySafety::Never => return self.surface(SurfaceReason::ClassifiedNever),
            RetrySafety::NotExecuted if self.retries >= self.config.max_auto_retries => {
                return self.surface(SurfaceReason::RetriesExhausted);
            }
            RetrySafety::NotExecuted => {}
        }
        // The backoff is asked before the shared budget, so a refused delay never wastes a
        // withdrawal that other calls could have used.
        // A throttling error uses its own backoff when one is set apart, else the other.
        let (config, sequence) = match (&self.config.throttling_backoff, cause) {
            (Some(cfg), ErrorCause::Throttling) => (Some(cfg), &mut self.throttling_backoff),
            _ => (self.config.backoff.as_ref(), &mut self.backoff),
        };
        let after = match config {
            None => Duration::ZERO,
            Some(cfg) => match sequence.next_delay(cfg, rng) {
                Some(d) => d,
                None => return self.surface(SurfaceReason::BackoffExhausted),
            },
        };
        // The deadline too comes before the budget: a retry too late to start must not take a
        // withdrawal either.
        let at = now.saturating_add(after);
        if self.too_late(at) {
            return self.surface(SurfaceReason::DeadlineExceeded);
        }
        if !budget.try_withdraw_for(now, cause) {
            return self.surface(SurfaceReason::BudgetEmpty);
        }
        self.retry_cause = Some(cause);
        self.retries = self.retries.saturating_add(1);
        self.sends = self.sends.saturating_add(1);
        self.state = CallState::AwaitingResult;
        self.due = true;
        let attempt = self.retries;
        self.events.emit(|| CallEvent::RetryDecided {
            attempt,
            delay: after,
            cause,
        });
        CallAction::Retry {
            after,
            time_left: self.time_left(at),
        }
    }

    /// Input (optional): the `after` of the last `Retry` has passed, and the retry is about to
    /// be sent at `now`. Returns `Send { time_left }` to go ahead, or, when `now` has reached
    /// the deadline (a timer that woke late), `Surface { DeadlineExceeded }`: the retry is not
    /// sent and the call ends. `None` when no `Retry` awaits its send. A driver whose timer can
    /// wake late calls it, so no attempt starts at or after the deadline; one on exact time
    /// may skip it.
    pub fn handle_retry_due(&mut self, now: Instant) -> CallAction {
        if !self.due || self.state != CallState::AwaitingResult {
            return CallAction::None;
        }
        self.due = false;
        if self.too_late(now) {
            return self.surface(SurfaceReason::DeadlineExceeded);
        }
        CallAction::Send {
            time_left: self.time_left(now),
        }
    }

    fn surface(&mut self, reason: SurfaceReason) -> CallAction {
        self.state = CallState::Surfaced(reason);
        self.events.emit(|| CallEvent::ErrorSurfaced { reason });
        CallAction::Surface { reason }
    }

    /// The oldest undrained observation, if events are on ([`Self::set_event_capacity`]).
    /// Drain after acting on the input's [`CallAction`].
    pub fn poll_event(&mut self) -> Option<CallEvent> {
        self.events.pop()
    }

    /// Record up to `capacity` undrained events (0, the default, turns them off: no input
    /// then builds one). Past the capacity the oldest is dropped and counted.
    pub fn set_event_capacity(&mut self, capacity: usize) {
        self.events.set_capacity(capacity);
    }

    /// Events lost to a full queue (or discarded by turning events off) so far.
    pub fn events_dropped(&self) -> u64 {
        self.events.dropped()
    }

    /// Where the call stands.
    pub fn state(&self) -> CallState {
        self.state
    }

    /// Whether the call has finished (succeeded or surfaced).
    pub fn is_terminal(&self) -> bool {
        matches!(self.state, CallState::Succeeded | CallState::Surfaced(_))
    }

    /// Requests handed out so far: the first send plus every automatic retry.
    pub fn sends(&self) -> u64 {
        self.sends
    }

    /// Automatic retries handed out so far.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// Refreshes asked for so far.
    pub fn refreshes(&self) -> u64 {
        self.refreshes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failover::budget::{
        AwsRetryQuota, AwsRetryQuotaConfig, FinagleBudget, FinagleBudgetConfig, GrpcThrottle,
        Unlimited,
    };
    use crate::failover::classify::{
        AdminWriteGateway, ErrorClassifier, ErrorKind, HasErrorKind, ReadOnlyGateway,
    };
    use crate::rng::SplitMix64;
    use alloc::vec::Vec;

    const T: Instant = Instant::from_nanos(1_000);

    /// Drives one call against scripted outcomes; counts what the caller had to do.
    struct Script {
        call: Call,
        rng: SplitMix64,
        sends: u32,
        refreshes: u32,
        end: Option<CallAction>,
    }

    impl Script {
        fn new(cfg: &CallConfig) -> Self {
            Script {
                call: Call::new(cfg),
                rng: SplitMix64::new(7),
                sends: 0,
                refreshes: 0,
                end: None,
            }
        }

        fn act(&mut self, a: CallAction) -> CallAction {
            match a {
                CallAction::Send { .. } | CallAction::Retry { .. } => self.sends += 1,
                CallAction::Refresh => self.refreshes += 1,
                CallAction::Surface { .. } | CallAction::Complete => {
                    assert!(self.end.is_none(), "second completion: {a:?}");
                    self.end = Some(a);
                }
                CallAction::None => {}
            }
            a
        }

        /// Outcome of each send, in order: `Err(kind)` or `Ok`, with refresh results `ok`.
        fn run<E, C: ErrorClassifier<E>, B: RetryBudget>(
            &mut self,
            c: &C,
            budget: &mut B,
            outcomes: &[Result<(), E>],
            refresh_ok: bool,
        ) {
            let mut a = self.call.start(T, budget);
            let _ = self.act(a);
            let mut outs = outcomes.iter();
            loop {
                a = match a {
                    CallAction::Send { .. } | CallAction::Retry { .. } => match outs.next() {
                        Some(Ok(())) => self.call.handle_success(T, budget),
                        Some(Err(k)) => {
                            self.call
                                .handle_error(T, c.classify(k), budget, &mut self.rng)
                        }
                        None => panic!("more sends than scripted outcomes"),
                    },
                    CallAction::Refresh => {
                        self.call
                            .handle_refreshed(T, refresh_ok, budget, &mut self.rng)
                    }
                    _ => break,
                };
                let _ = self.act(a);
            }
        }
    }

    #[test]
    fn admin_write_not_leader_refreshes_once_and_retries_once_to_success() {
        // Upstream: NotCoordinatorLeaderException is rejected before execution: refresh, retry.
        let mut s = Script::new(&CallConfig::default());
        s.run(
            &AdminWriteGateway,
            &mut Unlimited,
            &[Err(ErrorKind::NotLeader), Ok(())],
            true,
        );
        assert_eq!((s.refreshes, s.sends), (1, 2));
        assert_eq!(s.end, Some(CallAction::Complete));
        assert_eq!(s.call.state(), CallState::Succeeded);
    }

    #[test]
    fn admin_write_not_leader_twice_surfaces_after_second_failure() {
        let mut s = Script::new(&CallConfig::default());
        s.run(
            &AdminWriteGateway,
            &mut Unlimited,
            &[Err(ErrorKind::NotLeader), Err(ErrorKind::NotLeader)],
            true,
        );
        assert_eq!(s.sends, 2, "one automatic retry only");
        // The second not-leader still refreshes, so the user's manual retry sees fresh metadata.
        assert_eq!(s.refreshes, 2);
        assert_eq!(
            s.end,
            Some(CallAction::Surface {
                reason: SurfaceReason::RetriesExhausted
            })
        );
    }

    /// The admin client's errors, plugged into the presets through their kind.
    #[derive(Clone, Copy, Debug)]
    enum AdminError {
        Network,
        Timeout,
    }

    impl HasErrorKind for AdminError {
        fn error_kind(&self) -> ErrorKind {
            ErrorKind::Retriable
        }
    }

    #[test]
    fn admin_write_network_error_or_timeout_refreshes_then_surfaces_original_error() {
        // Upstream: NetworkException/TimeoutException refresh metadata but are not retried: the
        // write may have executed.
        for e in [AdminError::Network, AdminError::Timeout] {
            let mut s = Script::new(&CallConfig::default());
            s.run(&AdminWriteGateway, &mut Unlimited, &[Err(e)], true);
            assert_eq!((s.refreshes, s.sends), (1, 1), "{e:?}");
            assert_eq!(
                s.end,
                Some(CallAction::Surface {
                    reason: SurfaceReason::ClassifiedNever
                })
            );
        }
    }

    #[test]
    fn admin_write_non_retriable_error_surfaces_at_once() {
        let mut s = Script::new(&CallConfig::default());
        s.run(
            &AdminWriteGateway,
            &mut Unlimited,
            &[Err(ErrorKind::Fatal)],
            true,
        );
        assert_eq!((s.refreshes, s.sends), (0, 1));
        assert_eq!(
            s.end,
            Some(CallAction::Surface {
                reason: SurfaceReason::ClassifiedNever
            })
        );
    }

    #[test]
    fn read_only_retriable_error_refreshes_and_retries() {
        let mut s = Script::new(&CallConfig::default());
        s.run(
            &ReadOnlyGateway,
            &mut Unlimited,
            &[Err(ErrorKind::Retriable), Ok(())],
            true,
        );
        assert_eq!((s.refreshes, s.sends), (1, 2));
        assert_eq!(s.end, Some(CallAction::Complete));
    }

    #[test]
    fn failed_refresh_still_retries() {
        let mut s = Script::new(&CallConfig::default());
        s.run(
            &AdminWriteGateway,
            &mut Unlimited,
            &[Err(ErrorKind::NotLeader), Ok(())],
            false,
        );
        assert_eq!((s.refreshes, s.sends), (1, 2));
        assert_eq!(s.end, Some(CallAction::Complete));
    }

    #[test]
    fn zero_auto_retries_still_refreshes_then_surfaces() {
        let mut s = Script::new(&CallConfig::default().with_max_auto_retries(0));
        s.run(
            &AdminWriteGateway,
            &mut Unlimited,
            &[Err(ErrorKind::NotLeader)],
            true,
        );
        assert_eq!((s.refreshes, s.sends), (1, 1));
        assert_eq!(
            s.end,
            Some(CallAction::Surface {
                reason: SurfaceReason::RetriesExhausted
            })
        );
    }

    #[test]
    fn retry_without_refresh_is_immediate() {
        let mut call = Call::new(&CallConfig::default().with_max_auto_retries(3));
        let (b, r) = (&mut Unlimited, &mut SplitMix64::new(1));
        assert_eq!(call.start(T, b), CallAction::Send { time_left: None });
        for _ in 0..3 {
            assert_eq!(
                call.handle_error(T, ErrorClass::RETRY, b, r),
                CallAction::Retry {
                    after: Duration::ZERO,
                    time_left: None,
                }
            );
        }
        assert_eq!(
            call.handle_error(T, ErrorClass::RETRY, b, r),
            CallAction::Surface {
                reason: SurfaceReason::RetriesExhausted
            }
        );
        assert_eq!((call.sends(), call.retries(), call.refreshes()), (4, 3, 0));
    }

    #[test]
    fn events_are_off_by_default_then_name_each_decision_within_the_bound() {
        let cfg = CallConfig::default().with_max_auto_retries(2).with_backoff(
            BackoffConfig::builder()
                .initial(Duration::from_millis(10))
                .jitter(crate::backoff::Jitter::None)
                .build()
                .expect("valid"),
        );
        let (b, r) = (&mut Unlimited, &mut SplitMix64::new(1));
        let throttled = ErrorClass::REFRESH_AND_RETRY.with_cause(ErrorCause::Throttling);

        // Off: the same inputs record nothing.
        let mut off = Call::new(&cfg);
        let _ = off.start(T, b);
        let _ = off.handle_error(T, throttled, b, r);
        let _ = off.handle_refreshed(T, true, b, r);
        assert_eq!((off.poll_event(), off.events_dropped()), (None, 0));

        let mut call = Call::new(&cfg);
        call.set_event_capacity(8);
        let _ = call.start(T, b);
        assert_eq!(call.poll_event(), None, "a send is an action, not an event");
        assert_eq!(call.handle_error(T, throttled, b, r), CallAction::Refresh);
        let first = call.handle_refreshed(T, false, b, r);
        let second = call.handle_error(T, ErrorClass::RETRY, b, r);
        let end = call.handle_error(T, ErrorClass::RETRY, b, r);
        assert!(matches!(first, CallAction::Retry { .. }), "{first:?}");
        assert!(matches!(second, CallAction::Retry { .. }), "{second:?}");
        // Late inputs after the end record nothing.
        assert_eq!(call.handle_success(T, b), CallAction::None);
        let got: Vec<_> = core::iter::from_fn(|| call.poll_event()).collect();
        assert_eq!(
            got,
            [
                CallEvent::RefreshRequested {
                    cause: ErrorCause::Throttling
                },
                CallEvent::RetryDecided {
                    attempt: 1,
                    delay: Duration::from_millis(10),
                    cause: ErrorCause::Throttling
                },
                CallEvent::RetryDecided {
                    attempt: 2,
                    delay: Duration::from_millis(20),
                    cause: ErrorCause::Transient
                },
                CallEvent::ErrorSurfaced {
                    reason: SurfaceReason::RetriesExhausted
                },
            ]
        );
        assert_eq!(
            end,
            CallAction::Surface {
                reason: SurfaceReason::RetriesExhausted
            }
        );

        // A deadline already passed at start surfaces without sending: one event. With a
        // capacity of 1, a second event would evict it; here it is the only one.
        let mut late = Call::new(&cfg).with_deadline(Some(T));
        late.set_event_capacity(1);
        let _ = late.start(T, b);
        assert_eq!(
            late.poll_event(),
            Some(CallEvent::ErrorSurfaced {
                reason: SurfaceReason::DeadlineExceeded
            })
        );

        // The bound: capacity 1 keeps the newest event and counts the evicted one.
        let mut small = Call::new(&cfg);
        small.set_event_capacity(1);
        let _ = small.start(T, b);
        let _ = small.handle_error(T, ErrorClass::REFRESH_THEN_SURFACE, b, r);
        let _ = small.handle_refreshed(T, true, b, r);
        assert_eq!(
            (
                small.poll_event(),
                small.poll_event(),
                small.events_dropped()
            ),
            (
                Some(CallEvent::ErrorSurfaced {
                    reason: SurfaceReason::ClassifiedNever
                }),
                None,
                1
            )
        );
    }

    #[test]
    fn terminal_exactly_once_under_late_inputs() {
        let (b, r) = (&mut Unlimited, &mut SplitMix64::new(1));
        let late = |call: &mut Call, b: &mut Unlimited, r: &mut SplitMix64| {
            let before = call.clone();
            assert_eq!(call.start(T, b), CallAction::None);
            assert_eq!(call.handle_success(T, b), CallAction::None);
            assert_eq!(
                call.handle_error(T, ErrorClass::REFRESH_AND_RETRY, b, r),
                CallAction::None
            );
            assert_eq!(call.handle_refreshed(T, true, b, r), CallAction::None);
            assert_eq!(*call, before, "late inputs change nothing");
        };
        let mut ok = Call::new(&CallConfig::default());
        assert_eq!(ok.start(T, b), CallAction::Send { time_left: None });
        assert_eq!(ok.handle_success(T, b), CallAction::Complete);
        late(&mut ok, b, r);
        assert!(ok.is_terminal());

        let mut failed = Call::new(&CallConfig::default());
        assert_eq!(failed.start(T, b), CallAction::Send { time_left: None });
        assert_eq!(
            failed.handle_error(T, ErrorClass::SURFACE, b, r),
            CallAction::Surface {
                reason: SurfaceReason::ClassifiedNever
            }
        );
        late(&mut failed, b, r);
        assert_eq!(
            failed.state(),
            CallState::Surfaced(SurfaceReason::ClassifiedNever)
        );
    }

    #[test]
    fn out_of_order_inputs_are_ignored() {
        let (b, r) = (&mut Unlimited, &mut SplitMix64::new(1));
        let mut call = Call::new(&CallConfig::default());
        assert_eq!(call.handle_success(T, b), CallAction::None, "not started");
        assert_eq!(call.handle_refreshed(T, true, b, r), CallAction::None);
        assert_eq!(call.start(T, b), CallAction::Send { time_left: None });
        assert_eq!(
            call.handle_refreshed(T, true, b, r),
            CallAction::None,
            "no refresh asked"
        );
        assert_eq!(
            call.handle_error(T, ErrorClass::REFRESH_AND_RETRY, b, r),
            CallAction::Refresh
        );
        assert_eq!(
            call.handle_success(T, b),
            CallAction::None,
            "awaiting the refresh, not a result"
        );
        assert_eq!(
            call.handle_error(T, ErrorClass::SURFACE, b, r),
            CallAction::None
        );
        assert_eq!(call.state(), CallState::AwaitingRefresh);
        assert_eq!(
            call.handle_refreshed(T, true, b, r),
            CallAction::Retry {
                after: Duration::ZERO,
                time_left: None,
            }
        );
    }

    #[test]
    fn never_is_not_retried_even_with_retries_and_budget_left() {
        let (b, r) = (&mut Unlimited, &mut SplitMix64::new(1));
        let mut call = Call::new(&CallConfig::default().with_max_auto_retries(u32::MAX));
        assert_eq!(call.start(T, b), CallAction::Send { time_left: None });
        assert_eq!(
            call.handle_error(T, ErrorClass::new(false, RetrySafety::Never), b, r),
            CallAction::Surface {
                reason: SurfaceReason::ClassifiedNever
            }
        );
        assert_eq!(call.retries(), 0);
    }

    #[test]
    fn empty_grpc_throttle_surfaces_with_budget_empty() {
        // maxTokens 10: tokens 10 → 5 after five qualified failures; 5 ≤ 10/2 stops retries.
        let mut budget = GrpcThrottle::default();
        for _ in 0..4 {
            budget.handle_failure(T);
        }
        let r = &mut SplitMix64::new(1);
        let mut call = Call::new(&CallConfig::default());
        assert_eq!(
            call.start(T, &mut budget),
            CallAction::Send { time_left: None }
        );
        assert_eq!(
            call.handle_error(T, ErrorClass::REFRESH_AND_RETRY, &mut budget, r),
            CallAction::Refresh
        );
        assert_eq!(budget.milli_tokens(), 5_000, "the failure paid its token");
        assert_eq!(
            call.handle_refreshed(T, true, &mut budget, r),
            CallAction::Surface {
                reason: SurfaceReason::BudgetEmpty
            }
        );
        // A success earns 0.1 token: 5.1 > 5, retries resume for the next call.
        let mut next = Call::new(&CallConfig::default());
        assert_eq!(
            next.start(T, &mut budget),
            CallAction::Send { time_left: None }
        );
        assert_eq!(next.handle_success(T, &mut budget), CallAction::Complete);
        assert_eq!(budget.milli_tokens(), 5_100);
        assert!(budget.can_retry(T));
    }

    #[test]
    fn empty_finagle_budget_surfaces_with_budget_empty() {
        // Floor 1 retry/s over a 1 s TTL, no percentage: exactly one retry per second.
        let cfg = FinagleBudgetConfig::default()
            .with_ttl(Duration::from_secs(1))
            .with_min_retries_per_sec(1)
            .with_percent_can_retry_ppm(0);
        let mut budget = FinagleBudget::new(cfg).unwrap();
        let r = &mut SplitMix64::new(1);
        let mut first = Call::new(&CallConfig::default());
        assert_eq!(
            first.start(T, &mut budget),
            CallAction::Send { time_left: None }
        );
        assert_eq!(
            first.handle_error(T, ErrorClass::RETRY, &mut budget, r),
            CallAction::Retry {
                after: Duration::ZERO,
                time_left: None,
            }
        );
        let mut second = Call::new(&CallConfig::default());
        assert_eq!(
            second.start(T, &mut budget),
            CallAction::Send { time_left: None }
        );
        assert_eq!(
            second.handle_error(T, ErrorClass::RETRY, &mut budget, r),
            CallAction::Surface {
                reason: SurfaceReason::BudgetEmpty
            }
        );
        // One TTL after the budget's first withdrawal (`T`, its anchor) the withdrawal has expired and
        // the floor allows one again.
        let later = T + Duration::from_secs(1);
        let mut third = Call::new(&CallConfig::default());
        assert_eq!(
            third.start(later, &mut budget),
            CallAction::Send { time_left: None }
        );
        assert!(matches!(
            third.handle_error(later, ErrorClass::RETRY, &mut budget, r),
            CallAction::Retry { .. }
        ));
    }

    #[test]
    fn backoff_delays_the_retry() {
        // Fluss retriable-write backoff: 100 ms ± 20 % for the first retry.
        let cfg = CallConfig::default().with_backoff(BackoffConfig::fluss_retriable_write());
        let (b, r) = (&mut Unlimited, &mut SplitMix64::new(9));
        let mut call = Call::new(&cfg);
        assert_eq!(call.start(T, b), CallAction::Send { time_left: None });
        assert_eq!(
            call.handle_error(T, ErrorClass::REFRESH_AND_RETRY, b, r),
            CallAction::Refresh
        );
        match call.handle_refreshed(T, true, b, r) {
            CallAction::Retry { after, .. } => {
                assert!(
                    after >= Duration::from_millis(80) && after <= Duration::from_millis(120),
                    "{after:?}"
                );
            }
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    #[test]
    fn backoff_total_budget_surfaces_with_backoff_exhausted() {
        // 100 ms fixed delays under a 150 ms hard total: the second retry's delay is refused.
        let backoff = BackoffConfig::builder()
            .initial(Duration::from_millis(100))
            .max(Duration::from_millis(100))
            .jitter(crate::backoff::Jitter::None)
            .total_budget(Some(Duration::from_millis(150)))
            .build()
            .unwrap();
        let cfg = CallConfig::default()
            .with_max_auto_retries(5)
            .with_backoff(backoff);
        let (b, r) = (
            &mut crate::failover::GrpcThrottle::default(),
            &mut SplitMix64::new(2),
        );
        let mut call = Call::new(&cfg);
        assert_eq!(call.start(T, b), CallAction::Send { time_left: None });
        assert_eq!(
            call.handle_error(T, ErrorClass::RETRY, b, r),
            CallAction::Retry {
                after: Duration::from_millis(100),
                time_left: None,
            }
        );
        let tokens = b.milli_tokens();
        assert_eq!(
            call.handle_error(T, ErrorClass::RETRY, b, r),
            CallAction::Surface {
                reason: SurfaceReason::BackoffExhausted
            }
        );
        assert!(b.can_retry(T));
        assert_eq!(
            b.milli_tokens(),
            tokens - 1_000,
            "only the failure's token: no withdrawal wasted"
        );
    }

    /// `docs/design.md` §3.6: the backoff is asked before the shared budget. A gRPC throttle's
    /// withdrawal is free, so only a Finagle budget shows the order: a refused delay must
    /// leave its balance untouched.
    #[test]
    fn backoff_refusal_does_not_spend_a_finagle_withdrawal() {
        // 100 ms fixed delays under a 150 ms hard total: the second retry's delay is refused.
        let backoff = BackoffConfig::builder()
            .initial(Duration::from_millis(100))
            .max(Duration::from_millis(100))
            .jitter(crate::backoff::Jitter::None)
            .total_budget(Some(Duration::from_millis(150)))
            .build()
            .unwrap();
        let cfg = CallConfig::default()
            .with_max_auto_retries(5)
            .with_backoff(backoff);
        // Reserve of 2 retries per 1 s TTL, no percentage of requests.
        let mut b = FinagleBudget::new(
            FinagleBudgetConfig::default()
                .with_ttl(Duration::from_secs(1))
                .with_min_retries_per_sec(2)
                .with_percent_can_retry_ppm(0),
        )
        .unwrap();
        let r = &mut SplitMix64::new(1);
        let mut call = Call::new(&cfg);
        assert_eq!(call.start(T, &mut b), CallAction::Send { time_left: None });
        assert!(matches!(
            call.handle_error(T, ErrorClass::RETRY, &mut b, r),
            CallAction::Retry { .. }
        ));
        assert_eq!(
            call.handle_error(T, ErrorClass::RETRY, &mut b, r),
            CallAction::Surface {
                reason: SurfaceReason::BackoffExhausted
            }
        );
        assert_eq!(
            b.balance(T),
            1,
            "the refused retry withdrew from the budget"
        );
        assert!(b.can_retry(T));
    }

    #[test]
    fn extremes_of_time_and_retry_count_do_not_panic() {
        let (r, mut b) = (&mut SplitMix64::new(1), FinagleBudget::default());
        let mut call = Call::new(&CallConfig::default().with_max_auto_retries(u32::MAX));
        assert_eq!(
            call.start(Instant::MAX, &mut b),
            CallAction::Send { time_left: None }
        );
        // Time runs backwards to the epoch: the budget clamps it, the call does not care.
        assert!(matches!(
            call.handle_error(Instant::ZERO, ErrorClass::RETRY, &mut b, r),
            CallAction::Retry { .. }
        ));
        assert!(matches!(
            call.handle_error(Instant::MAX, ErrorClass::REFRESH_AND_RETRY, &mut b, r),
            CallAction::Refresh
        ));
        assert!(matches!(
            call.handle_refreshed(Instant::ZERO, false, &mut b, r),
            CallAction::Retry { .. }
        ));
        assert_eq!(
            call.handle_success(Instant::from_nanos(u64::MAX), &mut b),
            CallAction::Complete
        );
        assert_eq!((call.sends(), call.retries()), (3, 2));
        // A retry counter at its ceiling saturates instead of wrapping.
        let mut c = Call::new(&CallConfig::default().with_max_auto_retries(u32::MAX));
        c.retries = u32::MAX - 1;
        assert_eq!(
            c.start(Instant::ZERO, &mut Unlimited),
            CallAction::Send { time_left: None }
        );
        assert!(matches!(
            c.handle_error(Instant::ZERO, ErrorClass::RETRY, &mut Unlimited, r),
            CallAction::Retry { .. }
        ));
        assert_eq!(c.retries(), u32::MAX);
        assert_eq!(
            c.handle_error(Instant::ZERO, ErrorClass::RETRY, &mut Unlimited, r),
            CallAction::Surface {
                reason: SurfaceReason::RetriesExhausted
            }
        );
    }

    /// AWS standard mode's exponential backoff from `base`: ×2 up to MAX_BACKOFF (20 s).
    fn aws_backoff(base: Duration, jitter: crate::backoff::Jitter) -> BackoffConfig {
        BackoffConfig::builder()
            .initial(base)
            .max(Duration::from_secs(20))
            .multiplier(2, 1)
            .jitter(jitter)
            .build()
            .unwrap()
    }

    /// The 2026 revision's two backoffs: 50 ms for transient errors, 1 s for throttling.
    fn aws_2026(retries: u32, jitter: crate::backoff::Jitter) -> CallConfig {
        CallConfig::default()
            .with_max_auto_retries(retries)
            .with_backoff(aws_backoff(Duration::from_millis(50), jitter))
            .with_throttling_backoff(aws_backoff(Duration::from_secs(1), jitter))
    }

    fn retry_after(a: CallAction) -> Duration {
        match a {
            CallAction::Retry { after, .. } => after,
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    const THROTTLED: ErrorClass = ErrorClass::RETRY.with_cause(ErrorCause::Throttling);
    const TIMED_OUT: ErrorClass = ErrorClass::RETRY.with_cause(ErrorCause::Timeout);

    #[test]
    fn aws_2026_backs_off_throttling_from_1_s_and_other_errors_from_50_ms() {
        // "Retry behavior" (AWS SDKs and Tools reference guide, 2026 revision, "Backoff"):
        // base 1,000 ms for throttling errors, 50 ms for the others, ×2 per attempt, capped at
        // MAX_BACKOFF = 20 s before jitter. Without jitter the bases show exactly.
        let cfg = aws_2026(20, crate::backoff::Jitter::None);
        let (b, r) = (&mut Unlimited, &mut SplitMix64::new(1));
        let mut transient = Call::new(&cfg);
        let _ = transient.start(T, b);
        let got: Vec<u64> = (0..11)
            .map(|_| {
                retry_after(transient.handle_error(T, ErrorClass::RETRY, b, r)).as_millis() as u64
            })
            .collect();
        assert_eq!(
            got,
            [
                50, 100, 200, 400, 800, 1_600, 3_200, 6_400, 12_800, 20_000, 20_000
            ]
        );
        let mut throttled = Call::new(&cfg);
        let _ = throttled.start(T, b);
        let got: Vec<u64> = (0..7)
            .map(|_| retry_after(throttled.handle_error(T, THROTTLED, b, r)).as_millis() as u64)
            .collect();
        assert_eq!(got, [1_000, 2_000, 4_000, 8_000, 16_000, 20_000, 20_000]);
        // A timeout is a transient error for the backoff.
        let mut timeout = Call::new(&cfg);
        let _ = timeout.start(T, b);
        assert_eq!(
            retry_after(timeout.handle_error(T, TIMED_OUT, b, r)),
            Duration::from_millis(50)
        );
    }

    #[test]
    fn aws_full_jitter_stays_within_the_capped_base_of_each_class() {
        // AWS: `rand(0, 1) · min(base · 2^i, MAX_BACKOFF)`: full jitter after the cap.
        let cfg = aws_2026(12, crate::backoff::Jitter::Full);
        let (b, r) = (&mut Unlimited, &mut SplitMix64::new(42));
        for (class, base) in [(ErrorClass::RETRY, 50u64), (THROTTLED, 1_000)] {
            let mut call = Call::new(&cfg);
            let _ = call.start(T, b);
            for i in 0..12u32 {
                let cap = Duration::from_millis((base << i).min(20_000));
                let after = retry_after(call.handle_error(T, class, b, r));
                assert!(
                    after >= Duration::from_millis(1) && after <= cap,
                    "{class:?} retry {i}: {after:?} above {cap:?}"
                );
            }
        }
    }

    #[test]
    fn each_backoff_keeps_its_own_sequence_and_throttling_falls_back_without_one() {
        let cfg = aws_2026(5, crate::backoff::Jitter::None);
        let (b, r) = (&mut Unlimited, &mut SplitMix64::new(1));
        let mut call = Call::new(&cfg);
        let _ = call.start(T, b);
        let seq: Vec<u64> = [
            ErrorClass::RETRY,
            ErrorClass::RETRY,
            THROTTLED,
            ErrorClass::RETRY,
            THROTTLED,
        ]
        .into_iter()
        .map(|c| retry_after(call.handle_error(T, c, b, r)).as_millis() as u64)
        .collect();
        assert_eq!(seq, [50, 100, 1_000, 200, 2_000]);
        // Only one backoff: throttling uses it too.
        let one = CallConfig::default()
            .with_max_auto_retries(2)
            .with_backoff(aws_backoff(
                Duration::from_millis(50),
                crate::backoff::Jitter::None,
            ));
        assert_eq!(one.throttling_backoff(), None);
        let mut call = Call::new(&one);
        let _ = call.start(T, b);
        assert_eq!(
            retry_after(call.handle_error(T, THROTTLED, b, r)),
            Duration::from_millis(50)
        );
        assert_eq!(
            retry_after(call.handle_error(T, ErrorClass::RETRY, b, r)),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn the_call_reports_each_retry_cause_to_the_aws_quota() {
        // Standard mode's quota through a call: a retry after a timeout takes 10 tokens, its
        // success gives them back; a success at the first attempt adds 1.
        let r = &mut SplitMix64::new(1);
        let mut q = AwsRetryQuota::default();
        let mut call = Call::new(&CallConfig::default().with_max_auto_retries(3));
        let _ = call.start(T, &mut q);
        assert!(matches!(
            call.handle_error(T, TIMED_OUT, &mut q, r),
            CallAction::Retry { .. }
        ));
        assert_eq!(q.tokens(), 490);
        assert!(matches!(
            call.handle_error(T, ErrorClass::RETRY, &mut q, r),
            CallAction::Retry { .. }
        ));
        assert_eq!(q.tokens(), 485, "the second retry is transient: 5");
        assert_eq!(call.handle_success(T, &mut q), CallAction::Complete);
        assert_eq!(
            q.tokens(),
            490,
            "the success refunds the last retry's 5 only"
        );
        let mut first = Call::new(&CallConfig::default());
        let _ = first.start(T, &mut q);
        assert_eq!(first.handle_success(T, &mut q), CallAction::Complete);
        assert_eq!(q.tokens(), 491, "a success with no retry adds 1");
        // The cause survives a refresh: refresh-and-retry after a throttling error.
        let mut q = AwsRetryQuota::new(AwsRetryQuotaConfig::aws_standard_2026());
        let mut call = Call::new(&CallConfig::default());
        let _ = call.start(T, &mut q);
        let class = ErrorClass::REFRESH_AND_RETRY.with_cause(ErrorCause::Throttling);
        assert_eq!(call.handle_error(T, class, &mut q, r), CallAction::Refresh);
        assert!(matches!(
            call.handle_refreshed(T, true, &mut q, r),
            CallAction::Retry { .. }
        ));
        assert_eq!(q.tokens(), 495, "2026: a throttled retry costs 5");
        // A quota that cannot pay refuses the retry.
        let mut poor = AwsRetryQuota::new(AwsRetryQuotaConfig::default().with_max_tokens(9));
        let mut call = Call::new(&CallConfig::default());
        let _ = call.start(T, &mut poor);
        assert_eq!(
            call.handle_error(T, TIMED_OUT, &mut poor, r),
            CallAction::Surface {
                reason: SurfaceReason::BudgetEmpty
            }
        );
        assert_eq!(poor.tokens(), 9);
    }

    fn fixed_100ms(retries: u32) -> CallConfig {
        let backoff = BackoffConfig::builder()
            .initial(Duration::from_millis(100))
            .max(Duration::from_millis(100))
            .jitter(crate::backoff::Jitter::None)
            .build()
            .unwrap();
        CallConfig::default()
            .with_max_auto_retries(retries)
            .with_backoff(backoff)
    }

    /// A budget that deposits one whole retry per request, so a deposit shows in the balance.
    fn finagle_one_per_request() -> FinagleBudget {
        FinagleBudget::new(
            FinagleBudgetConfig::default()
                .with_ttl(Duration::from_secs(1))
                .with_min_retries_per_sec(0)
                .with_percent_can_retry_ppm(1_000_000),
        )
        .unwrap()
    }

    fn ms(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    #[test]
    fn start_at_or_after_the_deadline_surfaces_without_sending() {
        let mut b = finagle_one_per_request();
        for now in [ms(100), ms(101), Instant::MAX] {
            let mut call = Call::new(&CallConfig::default()).with_deadline(Some(ms(100)));
            assert_eq!(
                call.start(now, &mut b),
                CallAction::Surface {
                    reason: SurfaceReason::DeadlineExceeded
                }
            );
            assert_eq!(call.sends(), 0);
            assert!(call.is_terminal());
            assert_eq!(call.start(now, &mut b), CallAction::None, "once only");
        }
        assert_eq!(b.balance(ms(100)), 0, "no request reached the budget");
        // 1 ns before the deadline the attempt starts, with 1 ns left.
        let mut call = Call::new(&CallConfig::default()).with_deadline(Some(ms(100)));
        assert_eq!(
            call.start(ms(100) - Duration::from_nanos(1), &mut b),
            CallAction::Send {
                time_left: Some(Duration::from_nanos(1))
            }
        );
    }

    #[test]
    fn a_retry_that_would_start_at_the_deadline_surfaces_and_takes_no_withdrawal() {
        let mut b = finagle_one_per_request();
        let r = &mut SplitMix64::new(1);
        let mut call = Call::new(&fixed_100ms(5)).with_deadline(Some(ms(250)));
        assert_eq!(
            call.start(ms(0), &mut b),
            CallAction::Send {
                time_left: Some(Duration::from_millis(250))
            }
        );
        // Retry at 100 ms: 150 ms left once the delay has passed.
        assert_eq!(
            call.handle_error(ms(0), ErrorClass::RETRY, &mut b, r),
            CallAction::Retry {
                after: Duration::from_millis(100),
                time_left: Some(Duration::from_millis(150)),
            }
        );
        assert_eq!(b.balance(ms(100)), 0, "the deposit went to the first retry");
        // The next would start at 149 + 100 = 249 ms, within the deadline: the budget decides.
        assert_eq!(
            call.handle_error(ms(149), ErrorClass::RETRY, &mut b, r),
            CallAction::Surface {
                reason: SurfaceReason::BudgetEmpty
            }
        );
        let mut call = Call::new(&fixed_100ms(5)).with_deadline(Some(ms(250)));
        let mut b = finagle_one_per_request();
        assert!(matches!(call.start(ms(0), &mut b), CallAction::Send { .. }));
        // At 150 ms the retry would start exactly at 250 ms: refused, before the budget.
        assert_eq!(
            call.handle_error(ms(150), ErrorClass::RETRY, &mut b, r),
            CallAction::Surface {
                reason: SurfaceReason::DeadlineExceeded
            }
        );
        assert_eq!(b.balance(ms(150)), 1, "no withdrawal was taken");
    }

    #[test]
    fn an_error_at_or_past_the_deadline_asks_for_no_refresh() {
        let (b, r) = (&mut Unlimited, &mut SplitMix64::new(1));
        let mut call = Call::new(&CallConfig::default()).with_deadline(Some(ms(10)));
        assert!(matches!(call.start(ms(0), b), CallAction::Send { .. }));
        assert_eq!(
            call.handle_error(ms(9), ErrorClass::REFRESH_AND_RETRY, b, r),
            CallAction::Refresh,
            "before the deadline the refresh runs"
        );
        // The refresh ends at the deadline: the retry cannot start.
        assert_eq!(
            call.handle_refreshed(ms(10), true, b, r),
            CallAction::Surface {
                reason: SurfaceReason::DeadlineExceeded
            }
        );
        let mut call = Call::new(&CallConfig::default()).with_deadline(Some(ms(10)));
        assert!(matches!(call.start(ms(0), b), CallAction::Send { .. }));
        assert_eq!(
            call.handle_error(ms(10), ErrorClass::REFRESH_AND_RETRY, b, r),
            CallAction::Surface {
                reason: SurfaceReason::DeadlineExceeded
            }
        );
        assert_eq!(call.refreshes(), 0);
        // A Never error past the deadline still says it was never safe to retry.
        let mut call = Call::new(&CallConfig::default()).with_deadline(Some(ms(10)));
        assert!(matches!(call.start(ms(0), b), CallAction::Send { .. }));
        assert_eq!(
            call.handle_error(ms(10), ErrorClass::REFRESH_THEN_SURFACE, b, r),
            CallAction::Surface {
                reason: SurfaceReason::ClassifiedNever
            }
        );
    }

    #[test]
    fn time_left_shrinks_with_every_attempt_and_a_cleared_deadline_gives_none() {
        let (b, r) = (&mut Unlimited, &mut SplitMix64::new(1));
        let mut call = Call::new(&fixed_100ms(u32::MAX)).with_deadline(Some(ms(1_000)));
        let mut left = match call.start(ms(0), b) {
            CallAction::Send { time_left } => time_left.unwrap(),
            other => panic!("{other:?}"),
        };
        let mut now = ms(0);
        let mut retries = 0;
        loop {
            now += Duration::from_millis(50);
            match call.handle_error(now, ErrorClass::RETRY, b, r) {
                CallAction::Retry { after, time_left } => {
                    let t = time_left.unwrap();
                    assert!(t < left, "{t:?} after {left:?}");
                    assert_eq!(now + after + t, ms(1_000));
                    left = t;
                    now += after;
                    retries += 1;
                }
                CallAction::Surface { reason } => {
                    assert_eq!(reason, SurfaceReason::DeadlineExceeded);
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        // Attempts at 0, 150, …, 900 ms; from 950 ms the retry would start at 1050 ms.
        assert_eq!(retries, 6);
        assert_eq!(call.time_left(ms(2_000)), Some(Duration::ZERO));
        call.set_deadline(None);
        assert_eq!((call.deadline(), call.time_left(ms(0))), (None, None));
    }

    #[test]
    fn a_retry_due_at_or_after_the_deadline_is_not_sent() {
        let (b, r) = (&mut Unlimited, &mut SplitMix64::new(1));
        let mut call = Call::new(&fixed_100ms(5)).with_deadline(Some(ms(150)));
        assert!(matches!(call.start(ms(0), b), CallAction::Send { .. }));
        assert_eq!(
            call.handle_retry_due(ms(10)),
            CallAction::None,
            "no retry yet"
        );
        assert!(matches!(
            call.handle_error(ms(40), ErrorClass::RETRY, b, r),
            CallAction::Retry { .. }
        ));
        // Planned for 140 ms; on time the retry goes ahead with what is left.
        let mut on_time = call.clone();
        assert_eq!(
            on_time.handle_retry_due(ms(140)),
            CallAction::Send {
                time_left: Some(Duration::from_millis(10))
            }
        );
        assert_eq!(on_time.handle_retry_due(ms(140)), CallAction::None, "once");
        // The timer woke at 150 ms: the retry is not sent, the call ends.
        assert_eq!(
            call.handle_retry_due(ms(150)),
            CallAction::Surface {
                reason: SurfaceReason::DeadlineExceeded
            }
        );
        assert!(call.is_terminal());
        assert_eq!(call.handle_success(ms(150), b), CallAction::None);
    }
}
