//! [`retry`]: retry any async operation, in the style of backon
//! (`retry(rt, op).backoff(cfg).when(pred).notify(cb).deadline(at).budget(b).await`).
//!
//! The helper is glue over the core: every decision (retry or not, how long to wait, whether
//! the deadline leaves room, whether the shared budget allows it) is the failover [`Call`]
//! machine's, fed with the [`BackoffConfig`], the deadline and a [`RetryBudget`]. The helper
//! runs the operation, asks `when` whether its error is worth a retry (the classification),
//! tells `notify`, and sleeps on the [`Runtime`]'s clock.

use core::fmt;
use core::future::{Future, IntoFuture};
use core::marker::PhantomData;
use core::pin::Pin;
use core::time::Duration;

use super::events::{EVENT_CAPACITY, EventSink};
use super::loom::{Arc, Mutex, lock};
use super::seed::{client_rng, next_client_id};
use super::unwind;
use super::{Panicked, Runtime, Surfaced};
use crate::backoff::BackoffConfig;
use crate::failover::{
    Call, CallAction, CallConfig, CallEvent, ErrorCause, ErrorClass, RetryBudget, SurfaceReason,
    Unlimited,
};
use crate::rng::SplitMix64;
use crate::time::Instant;

/// One attempt of a retried operation: its number and the time it has left.
///
/// Handed to the operation of [`retry`] and of
/// [`FailoverExecutor::call_until`](super::FailoverExecutor::call_until); the number counts
/// sends (1 for the first), the time left is measured on the runtime's clock as the attempt
/// starts (`None` without a deadline).
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

/// A [`RetryBudget`] shared by many retried operations (and threads): clones share it.
///
/// ```
/// use throttle_sansio::failover::{FinagleBudget, RetryBudget};
/// use throttle_sansio::sync::SharedBudget;
/// use throttle_sansio::Instant;
///
/// let budget = SharedBudget::new(FinagleBudget::default());
/// assert_eq!(budget.with(|b| b.balance(Instant::ZERO)), 100);
/// ```
pub struct SharedBudget<B> {
    inner: Arc<Mutex<B>>,
}

impl<B> Clone for SharedBudget<B> {
    fn clone(&self) -> Self {
        SharedBudget {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<B> fmt::Debug for SharedBudget<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBudget").finish_non_exhaustive()
    }
}

impl<B: RetryBudget> SharedBudget<B> {
    /// Shares `budget`.
    pub fn new(budget: B) -> Self {
        SharedBudget {
            inner: Arc::new(Mutex::new(budget)),
        }
    }

    /// Reads the budget.
    pub fn with<T>(&self, read: impl FnOnce(&B) -> T) -> T {
        read(&lock(&self.inner))
    }

    fn update<T>(&self, f: impl FnOnce(&mut B) -> T) -> T {
        f(&mut lock(&self.inner))
    }
}

/// Whether an error is worth a retry: the `when` of [`Retry`]. Closures `FnMut(&E) -> bool`
/// qualify; [`Always`] retries every error; [`ByCause`] (from [`Retry::when_cause`]) also
/// names each retried error's [`ErrorCause`].
pub trait RetryIf<E> {
    /// `true` to retry after `error`.
    fn retry_if(&mut self, error: &E) -> bool;

    /// `None` to surface `error`, or the cause it is retried for: the cause picks the
    /// retry's backoff ([`Retry::throttling_backoff`]) and its price in the budget
    /// ([`RetryBudget::try_withdraw_for`]). The helper calls only this, once per error; the
    /// default retries what [`retry_if`](Self::retry_if) accepts, as
    /// [`ErrorCause::Transient`].
    fn retry_cause(&mut self, error: &E) -> Option<ErrorCause> {
        if self.retry_if(error) {
            Some(ErrorCause::Transient)
        } else {
            None
        }
    }
}

/// A `when` that names the cause of each retried error: `FnMut(&E) -> Option<ErrorCause>`,
/// `None` to surface it. Made by [`Retry::when_cause`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ByCause<F>(pub F);

impl<E, F: FnMut(&E) -> Option<ErrorCause>> RetryIf<E> for ByCause<F> {
    fn retry_if(&mut self, error: &E) -> bool {
        (self.0)(error).is_some()
    }

    fn retry_cause(&mut self, error: &E) -> Option<ErrorCause> {
        (self.0)(error)
    }
}

impl<E, F: FnMut(&E) -> bool> RetryIf<E> for F {
    fn retry_if(&mut self, error: &E) -> bool {
        self(error)
    }
}

/// The default `when`: every error is retried (within the limits).
#[derive(Clone, Copy, Debug, Default)]
pub struct Always;

impl<E> RetryIf<E> for Always {
    fn retry_if(&mut self, _error: &E) -> bool {
        true
    }
}

/// Told about each retry before its sleep: the `notify` of [`Retry`]. Closures
/// `FnMut(&E, Duration)` qualify; [`Quiet`] does nothing.
pub trait Notify<E> {
    /// The attempt failed with `error`; the next one starts after `after`.
    fn notify(&mut self, error: &E, after: Duration);
}

impl<E, F: FnMut(&E, Duration)> Notify<E> for F {
    fn notify(&mut self, error: &E, after: Duration) {
        self(error, after)
    }
}

/// The default `notify`: nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quiet;

impl<E> Notify<E> for Quiet {
    fn notify(&mut self, _error: &E, _after: Duration) {}
}

/// Why a [`retry`] gave no value. `Display` describes this layer; the operation's last error,
/// when there is one, is the [`source`](std::error::Error::source) (through [`Surfaced`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryError<E> {
    /// The last error, not retried: `when` refused it ([`SurfaceReason::ClassifiedNever`]),
    /// or a limit ended the retries (`max_retries`, the backoff's limits, the deadline, the
    /// budget).
    #[error(transparent)]
    Surfaced(#[from] Surfaced<E>),
    /// The deadline had passed before the first attempt: nothing ran.
    #[error("the retry deadline had passed before the first attempt: nothing ran")]
    Expired,
    /// The operation, its future, `when`, `notify` or the budget panicked; the retry ended
    /// there.
    #[error(transparent)]
    Panicked(#[from] Panicked),
}

impl<E> RetryError<E> {
    /// The operation's last error, if there is one.
    pub fn into_error(self) -> Option<E> {
        match self {
            RetryError::Surfaced(s) => Some(s.error),
            RetryError::Expired | RetryError::Panicked(_) => None,
        }
    }
}

/// Retries `op` on `rt`: a [`Retry`] builder, run by `.await`.
///
/// `op` is called once per attempt with its [`Attempt`]. Defaults: the
/// [`BackoffConfig::default`] delays, 3 retries (backon's default), every error retried, no
/// deadline, no shared budget.
///
/// ```
/// use core::future::{Future, IntoFuture};
/// use core::task::{Context, Poll, Waker};
/// use core::time::Duration;
/// use throttle_sansio::backoff::{BackoffConfig, Jitter};
/// use throttle_sansio::sync::{ManualClock, Runtime, retry};
/// use throttle_sansio::Instant;
///
/// #[derive(Clone)]
/// struct Manual(ManualClock);
/// impl Runtime for Manual {
///     fn now(&self) -> Instant { self.0.now() }
///     fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + 'static {
///         self.0.sleep_until(at)
///     }
///     fn spawn<F: Future<Output = ()> + Send + 'static>(&self, _: F) {}
/// }
///
/// let clock = ManualClock::new();
/// let backoff = BackoffConfig::builder()
///     .initial(Duration::from_millis(100))
///     .jitter(Jitter::None)
///     .build()?;
/// let mut waits = Vec::new();
/// let got = {
///     let fut = retry(Manual(clock.clone()), |a| async move {
///         if a.number < 3 { Err("busy") } else { Ok(a.number) }
///     })
///     .backoff(backoff)
///     .when(|e: &&str| *e == "busy")
///     .notify(|_: &&str, after| waits.push(after))
///     .deadline(Instant::from_millis(1_000))
///     .into_future();
///     let mut fut = core::pin::pin!(fut);
///     let mut cx = Context::from_waker(Waker::noop());
///     loop {
///         match fut.as_mut().poll(&mut cx) {
///             Poll::Ready(got) => break got,
///             Poll::Pending => clock.advance_to(clock.next_deadline().unwrap()),
///         }
///     }
/// };
/// assert_eq!(got, Ok(3));
/// assert_eq!(clock.now(), Instant::from_millis(300)); // slept 100 ms, then 200 ms
/// assert_eq!(waits, [Duration::from_millis(100), Duration::from_millis(200)]);
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
pub fn retry<'a, R, Op, Fut>(rt: R, op: Op) -> Retry<'a, R, Op, Always, Quiet, Unlimited>
where
    R: Runtime,
    Op: FnMut(Attempt) -> Fut,
    Fut: Future,
{
    Retry {
        rt,
        op,
        backoff: BackoffConfig::default(),
        throttling_backoff: None,
        max_retries: 3,
        when: Always,
        notify: Quiet,
        deadline: None,
        budget: None,
        seed: None,
        events: None,
        _borrows: PhantomData,
    }
}

/// The sink of a retry's [`CallEvent`]s ([`Retry::events`]).
type CallSink = std::sync::Arc<dyn EventSink<CallEvent>>;

/// Hands the events `call`'s last input recorded to `sink` (none while it has none), each
/// under `catch_unwind`: a panicking sink loses that event, and the retry goes on.
fn emit(call: &mut Call, sink: Option<&CallSink>) {
    let Some(sink) = sink else {
        return;
    };
    while let Some(event) = call.poll_event() {
        let _ = unwind::call(|| sink.on_event(&event));
    }
}

/// A retried operation being configured; `.await` it (or [`run`](Self::run) it) to run it.
///
/// # Contract
///
/// - The first attempt starts at once (unless the deadline has already passed:
///   [`RetryError::Expired`]). After a failed attempt, `when(&error)` decides whether it is
///   worth a retry; then the core [`Call`] decides whether one is allowed and when:
///   `max_retries`, the backoff's delay and limits ([`BackoffConfig::max_attempts`],
///   [`BackoffConfig::max_wait`], its hard budget), the deadline (a retry that would start at
///   or after it is not made), the shared budget. Refused, the last error comes back as
///   [`RetryError::Surfaced`] with the [`SurfaceReason`].
/// - Allowed, `notify(&error, after)` is told, then the helper sleeps `after` on the runtime's
///   clock and starts the next attempt. The sleep ends before the deadline by construction, so
///   it never runs past it; an attempt in flight is not cut at the deadline, and gets its time
///   left in [`Attempt::time_left`] to bound itself.
/// - A panic in `op`, its future, `when`, `notify` or the budget ends the retry with
///   [`RetryError::Panicked`]; the helper holds no lock across user code, so the shared
///   budget stays usable. A retry's withdrawal from the budget is taken when it is decided:
///   if `notify` then panics, or the future is dropped during the sleep, that withdrawal stays
///   spent like a retry that failed at once (budgets hold nothing to give back).
/// - Budget events: the first attempt is a request, every error `when` accepts a failure
///   (gRPC's "qualified failure"), a success a success (a success after retries is reported
///   as [`RetryBudget::handle_retry_success`], so a quota refunds the last retry's price).
///   Each retry is withdrawn with its cause ([`RetryBudget::try_withdraw_for`]):
///   [`ErrorCause::Transient`] unless `when` names one ([`when_cause`](Self::when_cause)).
#[must_use = "a retry does nothing until awaited"]
pub struct Retry<'a, R, Op, W, N, B> {
    rt: R,
    op: Op,
    backoff: BackoffConfig,
    throttling_backoff: Option<BackoffConfig>,
    max_retries: u32,
    when: W,
    notify: N,
    deadline: Option<Instant>,
    budget: Option<SharedBudget<B>>,
    seed: Option<u64>,
    events: Option<CallSink>,
    _borrows: PhantomData<&'a ()>,
}

impl<R, Op, W, N, B> fmt::Debug for Retry<'_, R, Op, W, N, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("backoff", &self.backoff)
            .field("max_retries", &self.max_retries)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl<'a, R, Op, W, N, B> Retry<'a, R, Op, W, N, B> {
    /// The delays between attempts, and the backoff's own limits.
    pub fn backoff(mut self, backoff: BackoffConfig) -> Self {
        self.backoff = backoff;
        self
    }

    /// The delays before retries of errors whose cause is [`ErrorCause::Throttling`] (from
    /// [`when_cause`](Self::when_cause)), counted on their own sequence, as
    /// [`CallConfig::with_throttling_backoff`]; without it, throttling errors use
    /// [`backoff`](Self::backoff). AWS SDKs (2026 revision) back off throttling errors from a
    /// 1 s base and others from 50 ms.
    pub fn throttling_backoff(mut self, backoff: BackoffConfig) -> Self {
        self.throttling_backoff = Some(backoff);
        self
    }

    /// At most `n` retries (the failover [`Call`]'s `max_auto_retries`; 3 by default).
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }

    /// Retry only errors for which `when` returns `true` (every error by default).
    pub fn when<W2>(self, when: W2) -> Retry<'a, R, Op, W2, N, B> {
        self.replace(|_, notify, budget| (when, notify, budget))
    }

    /// Retry errors for which `when` returns a cause (`None` surfaces the error): like
    /// [`when`](Self::when), and the cause picks the retry's backoff and its price in the
    /// budget (an [`AwsRetryQuota`](crate::failover::AwsRetryQuota) charges a timeout more).
    pub fn when_cause<F>(self, when: F) -> Retry<'a, R, Op, ByCause<F>, N, B> {
        self.when(ByCause(when))
    }

    /// Called with the error and the delay before each retry.
    pub fn notify<N2>(self, notify: N2) -> Retry<'a, R, Op, W, N2, B> {
        self.replace(|when, _, budget| (when, notify, budget))
    }

    /// No attempt starts at or after `at` (on the runtime's clock).
    pub fn deadline(mut self, at: Instant) -> Self {
        self.deadline = Some(at);
        self
    }

    /// Share `budget` with other retries (and failover calls of the same client).
    pub fn budget<B2>(self, budget: &SharedBudget<B2>) -> Retry<'a, R, Op, W, N, B2> {
        self.replace(|when, notify, _| (when, notify, Some(budget.clone())))
    }

    /// The same retry with its classifier, notifier and budget (the parts whose types are
    /// parameters) replaced by `f`'s.
    fn replace<W2, N2, B2>(
        self,
        f: impl FnOnce(W, N, Option<SharedBudget<B>>) -> (W2, N2, Option<SharedBudget<B2>>),
    ) -> Retry<'a, R, Op, W2, N2, B2> {
        let (when, notify, budget) = f(self.when, self.notify, self.budget);
        Retry {
            when,
            notify,
            budget,
            rt: self.rt,
            op: self.op,
            backoff: self.backoff,
            throttling_backoff: self.throttling_backoff,
            max_retries: self.max_retries,
            deadline: self.deadline,
            seed: self.seed,
            events: self.events,
            _borrows: PhantomData,
        }
    }

    /// Sends the retry's decisions to `sink`, as the core [`Call`] records them
    /// ([`CallEvent`]: each retry decided, with its attempt, delay and cause, and the error
    /// surfaced, with why): one call per event, right after the decision, before `notify` and
    /// the sleep. A panic in the sink is caught: that event is lost and the retry goes on (an
    /// observer never changes the outcome). With the `tracing` feature, `sync::trace::Tracing`
    /// is such a sink.
    ///
    /// ```
    /// use core::future::Future;
    /// use core::task::{Context, Poll, Waker};
    /// use std::sync::{Arc, Mutex};
    /// use throttle_sansio::failover::CallEvent;
    /// use throttle_sansio::sync::{retry, ManualClock, Runtime};
    /// use throttle_sansio::Instant;
    ///
    /// #[derive(Clone)]
    /// struct Manual(ManualClock);
    /// impl Runtime for Manual {
    ///     fn now(&self) -> Instant { self.0.now() }
    ///     fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + 'static {
    ///         self.0.sleep_until(at)
    ///     }
    ///     fn spawn<F: Future<Output = ()> + Send + 'static>(&self, _: F) {}
    /// }
    ///
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = Arc::clone(&seen);
    /// let clock = ManualClock::new();
    /// let fut = retry(Manual(clock.clone()), |_| async { Err::<(), _>("down") })
    ///     .max_retries(1)
    ///     .events(move |e: &CallEvent| log.lock().unwrap().push(*e))
    ///     .run();
    /// let mut fut = core::pin::pin!(fut);
    /// let mut cx = Context::from_waker(Waker::noop());
    /// let got = loop {
    ///     match fut.as_mut().poll(&mut cx) {
    ///         Poll::Ready(got) => break got,
    ///         Poll::Pending => clock.advance_to(clock.next_deadline().unwrap()),
    ///     }
    /// };
    /// assert!(got.is_err());
    /// assert!(matches!(
    ///     seen.lock().unwrap()[..],
    ///     [CallEvent::RetryDecided { attempt: 1, .. }, CallEvent::ErrorSurfaced { .. }]
    /// ));
    /// ```
    pub fn events(mut self, sink: impl EventSink<CallEvent> + 'static) -> Self {
        self.events = Some(std::sync::Arc::new(sink));
        self
    }

    /// Draws the backoff jitter from `seed` (tests; by default a per-client RNG from
    /// [`client_rng`](super::client_rng)).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Runs the retries: the future `.await` gives, without its `Send + 'a` box.
    pub async fn run<T, E, Fut>(self) -> Result<T, RetryError<E>>
    where
        R: Runtime,
        Op: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        W: RetryIf<E>,
        N: Notify<E>,
        B: RetryBudget,
    {
        let Retry {
            rt,
            mut op,
            backoff,
            throttling_backoff,
            max_retries,
            mut when,
            mut notify,
            deadline,
            budget,
            seed,
            events,
            ..
        } = self;
        let sink = events.as_ref();
        let mut config = CallConfig::default()
            .with_max_auto_retries(max_retries)
            .with_backoff(backoff);
        if let Some(throttling) = throttling_backoff {
            config = config.with_throttling_backoff(throttling);
        }
        let mut call = Call::new(&config).with_deadline(deadline);
        if sink.is_some() {
            call.set_event_capacity(EVENT_CAPACITY);
        }
        let mut rng = seed.map_or_else(|| client_rng(next_client_id()), SplitMix64::new);
        let mut own = Unlimited;
        // The budget's methods are user code too: a panic there is caught like the others.
        let mut decide = |f: &mut dyn FnMut(&mut dyn RetryBudget) -> CallAction| {
            unwind::call(|| match &budget {
                Some(shared) => shared.update(|b| f(b)),
                None => f(&mut own),
            })
        };
        let action = decide(&mut |b| call.start(rt.now(), b));
        // Emitted before a budget panic returns, so what the call recorded is not lost.
        emit(&mut call, sink);
        let action = action?;
        if let CallAction::Surface { .. } = action {
            return Err(RetryError::Expired);
        }
        loop {
            let attempt = Attempt::new(call.sends(), call.time_left(rt.now()));
            let error = match unwind::catch(async { op(attempt).await }).await? {
                Ok(value) => {
                    // A budget that panics on the success does not take the value away.
                    let _ = decide(&mut |b| call.handle_success(rt.now(), b));
                    emit(&mut call, sink);
                    return Ok(value);
                }
                Err(error) => error,
            };
            let class = match unwind::call(|| when.retry_cause(&error))? {
                Some(cause) => ErrorClass::RETRY.with_cause(cause),
                None => ErrorClass::SURFACE,
            };
            let action = decide(&mut |b| call.handle_error(rt.now(), class, b, &mut rng));
            emit(&mut call, sink);
            let action = action?;
            let after = match action {
                CallAction::Retry { after, .. } => after,
                CallAction::Surface { reason } => return Err(Surfaced::new(error, reason).into()),
                // Unreachable: these classes ask for no refresh, and the call is driven in
                // order. Surface rather than spin.
                _ => return Err(Surfaced::new(error, SurfaceReason::ClassifiedNever).into()),
            };
            unwind::call(|| notify.notify(&error, after))?;
            if !after.is_zero() {
                rt.sleep_until(rt.now() + after).await;
            }
            // A timer that woke at or after the deadline: the retry is not made.
            let due = call.handle_retry_due(rt.now());
            emit(&mut call, sink);
            if let CallAction::Surface { reason } = due {
                return Err(Surfaced::new(error, reason).into());
            }
        }
    }
}

impl<'a, R, Op, W, N, B, T, E, Fut> IntoFuture for Retry<'a, R, Op, W, N, B>
where
    R: Runtime + 'a,
    Op: FnMut(Attempt) -> Fut + Send + 'a,
    Fut: Future<Output = Result<T, E>> + Send + 'a,
    W: RetryIf<E> + Send + 'a,
    N: Notify<E> + Send + 'a,
    B: RetryBudget + Send + 'a,
    T: 'a,
    E: Send + 'a,
{
    type Output = Result<T, RetryError<E>>;
    type IntoFuture = Pin<alloc::boxed::Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        alloc::boxed::Box::pin(self.run())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::test_support::TestRuntime;
    use alloc::vec::Vec;
    use core::task::{Context, Poll, Waker};
    use std::sync::Mutex as StdMutex;

    #[test]
    fn a_panicking_event_sink_loses_its_event_and_the_retry_goes_on() {
        let rt = TestRuntime::new();
        let clock = rt.clock.clone();
        let seen = std::sync::Arc::new(StdMutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&seen);
        let fut = retry(rt, |a: Attempt| async move {
            if a.number < 3 {
                Err("busy")
            } else {
                Ok(a.number)
            }
        })
        .seed(7)
        .events(move |e: &CallEvent| {
            let n = {
                let mut log = log.lock().unwrap();
                log.push(*e);
                log.len()
            };
            // The first event is recorded, then the sink panics on it.
            assert!(n > 1, "user sink");
        })
        .run();
        let mut fut = core::pin::pin!(fut);
        let mut cx = Context::from_waker(Waker::noop());
        let got = loop {
            match fut.as_mut().poll(&mut cx) {
                Poll::Ready(got) => break got,
                Poll::Pending => clock.advance_to(clock.next_deadline().unwrap()),
            }
        };
        assert_eq!(
            got.map_err(|_| ()),
            Ok(3),
            "the sink's panic changed nothing"
        );
        let seen = seen.lock().unwrap();
        let attempts: Vec<u32> = seen
            .iter()
            .map(|e| match *e {
                CallEvent::RetryDecided { attempt, .. } => attempt,
                _ => 0,
            })
            .collect();
        assert_eq!(attempts, [1, 2], "{seen:?}");
    }
}
