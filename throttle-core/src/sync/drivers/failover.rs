//! [`FailoverExecutor`]: runs requests under the failover [`Call`] machine for many tasks at
//! once, with one shared [`RetryBudget`] and one coalesced metadata refresh at a time.
//!
//! Each `call` keeps its own [`Call`] (task-local, no lock). The budget, the jitter rng and the
//! [`RefreshCoalescer`] sit behind one lock. A call whose error asks for a refresh either
//! starts it (it runs the caller's `refresh` future) or joins the running one and sleeps on a
//! one-shot slot; the refresher's end releases every joiner after the lock is dropped. A
//! refresher cancelled mid-refresh ends its generation as failed (a guard's `Drop`), so its
//! joiners are never stranded; they retry anyway, as `Call` does after a failed refresh.
//!
//! User code that panics (`op` or its future, the classifier, `refresh` or its future) ends
//! that call with [`CallError::Panicked`]; a refresher's panic ends its generation as failed
//! through the same guard, so its joiners retry and the next refresh can start.
//!
//! Every call counts itself in flight from its start to its end (a guard, so a dropped or
//! panicking call is counted out too); [`FailoverExecutor::closed`] waits for that count to
//! reach zero after [`FailoverExecutor::close`]. A refresh runs inside the call that started
//! it, so it is covered by the same count.

use core::fmt;
use core::future::Future;

use super::events::{EVENT_CAPACITY, EventSink, EventTap, Observed, lock_observed};
use super::loom::{Arc, Mutex, lock};
use super::oneshot::{self, Sender};
use super::retry::Attempt;
use super::signal::{WakeSignal, wait_for};
use super::unwind;
use super::{Panicked, Runtime};
use crate::error::ConfigError;
use crate::failover::{
    Call, CallAction, CallConfig, CallEvent, CoalesceAction, CoalescerConfig, ErrorClass,
    ErrorClassifier, Generation, RefreshCoalescer, RefreshEvent, RetryBudget, SurfaceReason,
};
use crate::rng::SplitMix64;
use crate::time::Instant;

/// A call's last error given back to the caller, with why it was not retried.
///
/// `Display` says that the request failed and why this layer did not retry it; the error
/// itself is the [`source`](std::error::Error::source).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("request failed and was not retried: {reason}")]
#[non_exhaustive]
pub struct Surfaced<E> {
    /// The last error the request failed with.
    #[source]
    pub error: E,
    /// Why it was surfaced instead of retried.
    pub reason: SurfaceReason,
}

/// Why a [`FailoverExecutor::call`] gave no value.
///
/// `Display` describes this layer's failure; the request's own error, when there is one, is
/// reachable through [`source`](std::error::Error::source) (through the [`Surfaced`] it
/// wraps).
///
/// ```
/// use std::error::Error as _;
/// use throttle_sansio::failover::SurfaceReason;
/// use throttle_sansio::sync::{CallError, Surfaced};
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("not the leader")]
/// struct NotLeader;
///
/// let err = CallError::from(Surfaced::new(NotLeader, SurfaceReason::RetriesExhausted));
/// assert_eq!(
///     err.to_string(),
///     "request failed and was not retried: the automatic retries are used up"
/// );
/// assert_eq!(err.source().unwrap().to_string(), "not the leader");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError<E> {
    /// The request's last error, given back instead of retried.
    #[error(transparent)]
    Surfaced(#[from] Surfaced<E>),
    /// The call's deadline had already passed when it was started: nothing was sent.
    #[error("the call's deadline had passed before its first attempt: nothing was sent")]
    Expired,
    /// The executor was closed ([`FailoverExecutor::close`]) before the call started: nothing
    /// was sent.
    #[error("the failover executor is closed: the call was not started")]
    Closed,
    /// User code the call ran panicked: `op` or its future, the classifier, or `refresh` or
    /// its future. The call ended there; a refresh it was running ended as failed, so the
    /// calls that joined it retry and a later refresh can start.
    #[error(transparent)]
    Panicked(#[from] Panicked),
}

impl<E> Surfaced<E> {
    /// `error`, surfaced for `reason`.
    pub fn new(error: E, reason: SurfaceReason) -> Self {
        Surfaced { error, reason }
    }
}

impl<E> CallError<E> {
    /// The surfaced error, if the call ended with one (not with a panic).
    pub fn surfaced(&self) -> Option<&Surfaced<E>> {
        match self {
            CallError::Surfaced(s) => Some(s),
            CallError::Expired | CallError::Closed | CallError::Panicked(_) => None,
        }
    }

    /// The request's last error, if the call ended with one (not with a panic, and not
    /// before its first attempt).
    pub fn into_error(self) -> Option<E> {
        match self {
            CallError::Surfaced(s) => Some(s.error),
            CallError::Expired | CallError::Closed | CallError::Panicked(_) => None,
        }
    }
}

/// An observation of a [`FailoverExecutor`], handed to its sink
/// ([`FailoverExecutor::set_event_sink`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailoverEvent {
    /// One call's decision: a refresh asked for, a retry decided, an error surfaced.
    Call(CallEvent),
    /// The shared refresh: started, joined, completed, or a call refused by a full coalescer.
    Refresh(RefreshEvent),
}

struct FailoverState<B> {
    budget: B,
    /// Whether a sink is set: new calls then record their events.
    events: bool,
    rng: SplitMix64,
    coalescer: RefreshCoalescer<Sender<bool>>,
    refreshes_started: u64,
    closed: bool,
    /// Calls started and not yet ended (refreshes run inside them).
    in_flight: usize,
}

impl<B> FailoverState<B> {
    fn is_drained(&self) -> bool {
        self.closed && self.in_flight == 0
    }
}

struct Shared<K, B> {
    classifier: K,
    config: CallConfig,
    state: Mutex<FailoverState<B>>,
    /// Notified when a closed executor's last call ends: [`FailoverExecutor::closed`].
    drained: WakeSignal,
    /// The sink of the calls' and the coalescer's events.
    tap: EventTap<FailoverEvent>,
}

impl<B> Observed for FailoverState<B> {
    type Event = FailoverEvent;

    fn poll_event(&mut self) -> Option<FailoverEvent> {
        self.coalescer.poll_event().map(FailoverEvent::Refresh)
    }

    fn has_events(&self) -> bool {
        self.coalescer.has_events()
    }
}

impl<K, B> Shared<K, B> {
    /// Hands the events `call`'s last input recorded to the sink (none while events are off).
    /// Call with no lock held.
    fn deliver_call(&self, call: &mut Call) {
        let mut events = super::events::Drained::new();
        while let Some(event) = call.poll_event() {
            events.push(FailoverEvent::Call(event));
        }
        if !self.tap.deliver(events) {
            // The sink was cleared while the call ran: it records nothing more.
            call.set_event_capacity(0);
        }
    }
}

/// Runs requests with failover: classify each error ([`ErrorClassifier`]), refresh metadata
/// once for all concurrent callers ([`RefreshCoalescer`]), retry within the shared
/// [`RetryBudget`], sleeping out the call's backoff on the runtime's clock.
/// `Clone + Send + Sync`; clones share the budget and the coalescer.
///
/// # Contract
///
/// - [`call(op, refresh)`](Self::call) sends `op()`; on an error it follows the [`Call`]
///   machine: `refresh()` (coalesced: at most one runs at a time, its `bool` is whether it
///   succeeded) and/or a retry of `op()` after the backoff, until success or a
///   [`Surfaced`] error ([`CallError::Surfaced`]).
/// - [`call_until(deadline, op, refresh)`](Self::call_until) is the same call with the
///   [`Call`]'s deadline: no attempt starts at or after it, no backoff sleep reaches it, and
///   each attempt gets an [`Attempt`] with its number and the time left, measured on the
///   runtime's clock as it starts. An attempt or refresh in flight is not cut at the
///   deadline: bound it with `time_left`.
/// - `op` is called once per send, so a request is re-sent only when the classifier said it
///   was not executed ([`RetrySafety::NotExecuted`](crate::failover::RetrySafety)).
/// - Cancel-safe: dropping a call's future while it refreshes ends that refresh as failed and
///   releases the calls that joined it.
/// - A panic in `op()`, its future, the classifier, `refresh()` or its future ends the call
///   with [`CallError::Panicked`] (the panic is caught, the call's future does not unwind); a
///   refresh it was running ends as failed, as if cancelled.
/// - [`close`](Self::close) stops intake (later calls fail with [`CallError::Closed`] and
///   send nothing); calls already started run to their end, and
///   [`closed`](Self::closed) resolves once none is left.
///
/// # Example
///
/// Two admin writes hit a coordinator that has moved: one refresh finds the new leader and
/// both retry once. (Any [`Runtime`] works; this one has a manual clock and a poll loop.)
///
/// ```
/// use core::future::Future;
/// use core::sync::atomic::{AtomicBool, Ordering};
/// use core::task::{Context, Poll, Waker};
/// use throttle_sansio::Instant;
/// use throttle_sansio::failover::{AdminWriteGateway, CallConfig, ErrorKind, FinagleBudget};
/// use throttle_sansio::sync::{FailoverExecutor, ManualClock, Runtime};
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
/// let fx = FailoverExecutor::new(
///     Manual(ManualClock::new()),
///     AdminWriteGateway,
///     FinagleBudget::default(), // Finagle's default: 100 retries in reserve
///     CallConfig::default(),    // upstream: one automatic retry
/// )?;
/// let moved = AtomicBool::new(false);
/// let write = |id: u32| {
///     let ok = moved.load(Ordering::SeqCst);
///     async move { if ok { Ok(id) } else { Err(ErrorKind::NotLeader) } }
/// };
/// let refresh = || { moved.store(true, Ordering::SeqCst); async { true } };
/// let both = async {
///     let a = fx.call(|| write(1), refresh).await;
///     let b = fx.call(|| write(2), refresh).await;
///     (a, b)
/// };
/// let mut both = core::pin::pin!(both);
/// let mut cx = Context::from_waker(Waker::noop());
/// let Poll::Ready((a, b)) = both.as_mut().poll(&mut cx) else { unreachable!() };
/// assert_eq!((a, b), (Ok(1), Ok(2)));
/// assert_eq!(fx.refreshes_started(), 1);
/// fx.close();
/// assert!(fx.is_closed() && fx.in_flight() == 0);
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
pub struct FailoverExecutor<R, K, B> {
    rt: R,
    shared: Arc<Shared<K, B>>,
}

impl<R: Clone, K, B> Clone for FailoverExecutor<R, K, B> {
    fn clone(&self) -> Self {
        FailoverExecutor {
            rt: self.rt.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<R, K, B> fmt::Debug for FailoverExecutor<R, K, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailoverExecutor").finish_non_exhaustive()
    }
}

/// Counts a call out of flight when it ends, however it ends (returned, dropped, unwound).
struct InFlight<'a, K, B> {
    shared: &'a Shared<K, B>,
}

impl<K, B> Drop for InFlight<'_, K, B> {
    fn drop(&mut self) {
        let drained = {
            let mut st = lock(&self.shared.state);
            st.in_flight = st.in_flight.saturating_sub(1);
            st.is_drained()
        };
        self.shared.drained.notify_if(drained);
    }
}

impl<R, K, B> FailoverExecutor<R, K, B>
where
    R: Runtime,
    B: RetryBudget,
{
    /// An executor classifying errors with `classifier`, sharing `budget` between its calls;
    /// refuses an invalid `config`.
    pub fn new(rt: R, classifier: K, budget: B, config: CallConfig) -> Result<Self, ConfigError> {
        Self::with_coalescer(rt, classifier, budget, config, CoalescerConfig::default())
    }

    /// As [`new`](Self::new), with the coalescer's bound on held calls.
    pub fn with_coalescer(
        rt: R,
        classifier: K,
        budget: B,
        config: CallConfig,
        coalescer: CoalescerConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(FailoverExecutor {
            rt,
            shared: Arc::new(Shared {
                classifier,
                config,
                state: Mutex::new(FailoverState {
                    budget,
                    events: false,
                    rng: super::seed::client_rng(super::seed::next_client_id()),
                    coalescer: RefreshCoalescer::new(coalescer)?,
                    refreshes_started: 0,
                    closed: false,
                    in_flight: 0,
                }),
                drained: WakeSignal::new(),
                tap: EventTap::default(),
            }),
        })
    }

    /// Sends the executor's observation events ([`FailoverEvent`]: each call's refresh
    /// request, retry decision and surfaced error, and the shared refresh's start, joins, end
    /// and refusals) to `sink`, for every clone, replacing any sink set before, and turns them
    /// on for calls started from now on (events are off until then, and cost nothing).
    ///
    /// The sink is called as [`GateHandle::set_event_sink`](super::GateHandle::set_event_sink)
    /// describes: outside the lock, once per event, in order, with a panic caught and counted
    /// ([`event_sink_panics`](Self::event_sink_panics)).
    pub fn set_event_sink(&self, sink: impl EventSink<FailoverEvent> + 'static) {
        self.install_sink(Some(std::sync::Arc::new(sink)));
    }

    /// Removes the event sink and turns events off. A call in flight stops recording at its
    /// next input; the event that input recorded finds no sink and is counted in
    /// [`events_dropped`](Self::events_dropped).
    pub fn clear_event_sink(&self) {
        self.install_sink(None);
    }

    fn install_sink(&self, sink: Option<std::sync::Arc<dyn EventSink<FailoverEvent>>>) {
        self.shared.tap.install(
            core::slice::from_ref(&self.shared.state),
            sink,
            |st, capacity| {
                st.events = capacity > 0;
                st.coalescer.set_event_capacity(capacity);
            },
        );
    }

    /// Events lost before a sink saw them: to the coalescer's bound before the executor
    /// drained it, or recorded (by the coalescer or a call in flight) before a
    /// [`clear_event_sink`](Self::clear_event_sink) and delivered after it. A call's own
    /// queue never overflows: it records at most one event per input and is drained after
    /// each.
    pub fn events_dropped(&self) -> u64 {
        let dropped = lock(&self.shared.state).coalescer.events_dropped();
        dropped.saturating_add(self.shared.tap.unseen())
    }

    /// Events the sink panicked on (each one lost; nothing else changed).
    pub fn event_sink_panics(&self) -> u64 {
        self.shared.tap.panics()
    }

    /// Restarts the backoff jitter from `seed` (tests; the default seed is random).
    pub fn reseed(&self, seed: u64) {
        lock(&self.shared.state).rng = SplitMix64::new(seed);
    }

    /// Reads the shared budget.
    pub fn with_budget<T>(&self, read: impl FnOnce(&B) -> T) -> T {
        read(&lock(&self.shared.state).budget)
    }

    /// Refreshes started so far (each coalesced refresh counts once).
    pub fn refreshes_started(&self) -> u64 {
        lock(&self.shared.state).refreshes_started
    }

    /// Calls waiting for the running refresh (its starter included).
    pub fn refresh_waiters(&self) -> usize {
        lock(&self.shared.state).coalescer.held()
    }

    /// Whether a refresh is running now.
    pub fn is_refreshing(&self) -> bool {
        lock(&self.shared.state).coalescer.in_flight().is_some()
    }

    /// Calls started and not yet ended.
    pub fn in_flight(&self) -> usize {
        lock(&self.shared.state).in_flight
    }

    /// Whether [`close`](Self::close) has been called.
    pub fn is_closed(&self) -> bool {
        lock(&self.shared.state).closed
    }

    /// Stops intake: every later [`call`](Self::call) fails with [`CallError::Closed`] and
    /// sends nothing. Calls already started go on (they may still refresh and retry).
    /// Idempotent.
    pub fn close(&self) {
        let drained = {
            let mut st = lock(&self.shared.state);
            st.closed = true;
            st.is_drained()
        };
        self.shared.drained.notify_if(drained);
    }

    /// Resolves once the executor is closed and every call it started, with the refreshes
    /// they ran, has ended. With [`close`](Self::close), a graceful shutdown:
    /// `fx.close(); fx.closed().await`. Cancel-safe.
    pub async fn closed(&self) {
        wait_for(&self.shared.drained, || {
            lock(&self.shared.state).is_drained()
        })
        .await;
    }

    /// Sends `op()` and drives the failover [`Call`] to its end: `Ok` with the first success,
    /// or the last error [`Surfaced`] with its reason, [`CallError::Closed`] after
    /// [`close`](Self::close), or [`CallError::Panicked`] if user code panicked. No deadline;
    /// see [`call_until`](Self::call_until) and the type's contract.
    pub async fn call<T, E, Op, OpFut, Rf, RfFut>(
        &self,
        mut op: Op,
        refresh: Rf,
    ) -> Result<T, CallError<E>>
    where
        K: ErrorClassifier<E>,
        Op: FnMut() -> OpFut,
        OpFut: Future<Output = Result<T, E>>,
        Rf: FnMut() -> RfFut,
        RfFut: Future<Output = bool>,
    {
        self.call_until(None, move |_| op(), refresh).await
    }

    /// [`call`](Self::call) with the [`Call`]'s deadline (`None`: none): no attempt starts at
    /// or after `deadline` (a call started past it fails with [`CallError::Expired`]; a retry
    /// that would start past it surfaces the last error with
    /// [`SurfaceReason::DeadlineExceeded`]), no backoff sleep reaches it, and `op` gets each
    /// attempt's [`Attempt`]: its number (1 for the first send) and the time left on the
    /// runtime's clock as it starts.
    pub async fn call_until<T, E, Op, OpFut, Rf, RfFut>(
        &self,
        deadline: Option<Instant>,
        mut op: Op,
        mut refresh: Rf,
    ) -> Result<T, CallError<E>>
    where
        K: ErrorClassifier<E>,
        Op: FnMut(Attempt) -> OpFut,
        OpFut: Future<Output = Result<T, E>>,
        Rf: FnMut() -> RfFut,
        RfFut: Future<Output = bool>,
    {
        let mut call = self.new_call(deadline);
        {
            let mut st = lock(&self.shared.state);
            if st.closed {
                return Err(CallError::Closed);
            }
            st.in_flight = st.in_flight.saturating_add(1);
        }
        // Made outside the lock: its drop takes the lock, even when a budget input unwinds.
        let _in_flight = InFlight {
            shared: &self.shared,
        };
        let mut action = self.start_call(&mut call, self.rt.now());
        if let CallAction::Surface { .. } = action {
            return Err(CallError::Expired);
        }
        // The error of the attempt before a retry, given back if its timer wakes too late.
        let mut last: Option<E> = None;
        loop {
            // Here `action` is `Send` or `Retry`; the call put a retry's start before the
            // deadline, so this sleep never aims past it.
            if let CallAction::Retry { after, .. } = action {
                if !after.is_zero() {
                    self.rt.sleep_until(self.rt.now() + after).await;
                }
                // A timer that woke at or after the deadline: the retry is not sent.
                let due = call.handle_retry_due(self.rt.now());
                if let (CallAction::Surface { reason }, Some(error)) = (due, last.take()) {
                    return Err(Surfaced { error, reason }.into());
                }
            }
            let attempt = Attempt::new(call.sends(), call.time_left(self.rt.now()));
            let error = match unwind::catch(async { op(attempt).await }).await? {
                Ok(value) => {
                    let _ = self.succeed(&mut call, self.rt.now());
                    return Ok(value);
                }
                Err(error) => error,
            };
            let class = self.classify(&error)?;
            action = self.fail(&mut call, self.rt.now(), class);
            loop {
                match action {
                    CallAction::Refresh => {
                        let ok = self.refreshed(&mut refresh).await?;
                        action = self.refreshed_at(&mut call, self.rt.now(), ok);
                    }
                    CallAction::Send { .. } | CallAction::Retry { .. } => {
                        last = Some(error);
                        break;
                    }
                    CallAction::Surface { reason } => {
                        return Err(Surfaced { error, reason }.into());
                    }
                    // Unreachable: the call is driven in order, so it never answers `None` or
                    // `Complete` to an error or a refresh. Surface rather than spin.
                    _ => {
                        return Err(Surfaced {
                            error,
                            reason: SurfaceReason::ClassifiedNever,
                        }
                        .into());
                    }
                }
            }
        }
    }

    /// The runtime the executor reads `now` from and sleeps on.
    #[cfg(feature = "tower-retry")]
    pub(crate) fn runtime(&self) -> &R {
        &self.rt
    }

    /// `call`'s start at `now`, with the shared budget.
    pub(crate) fn start_call(&self, call: &mut Call, now: Instant) -> CallAction {
        let action = call.start(now, &mut lock(&self.shared.state).budget);
        self.shared.deliver_call(call);
        action
    }

    /// `call`'s success at `now`, told to the shared budget.
    pub(crate) fn succeed(&self, call: &mut Call, now: Instant) -> CallAction {
        let action = call.handle_success(now, &mut lock(&self.shared.state).budget);
        self.shared.deliver_call(call);
        action
    }

    /// `call`'s error of class `class` at `now`: the call decides, with the shared budget and
    /// jitter generator.
    pub(crate) fn fail(&self, call: &mut Call, now: Instant, class: ErrorClass) -> CallAction {
        let action = {
            let mut guard = lock(&self.shared.state);
            let st = &mut *guard;
            call.handle_error(now, class, &mut st.budget, &mut st.rng)
        };
        self.shared.deliver_call(call);
        action
    }

    /// The end of the refresh `call` asked for, at `now`: the call decides.
    pub(crate) fn refreshed_at(&self, call: &mut Call, now: Instant, ok: bool) -> CallAction {
        let action = {
            let mut guard = lock(&self.shared.state);
            let st = &mut *guard;
            call.handle_refreshed(now, ok, &mut st.budget, &mut st.rng)
        };
        self.shared.deliver_call(call);
        action
    }

    /// A new call under this executor's config, with `deadline`; it records events while a
    /// sink is set.
    pub(crate) fn new_call(&self, deadline: Option<Instant>) -> Call {
        let mut call = Call::new(&self.shared.config).with_deadline(deadline);
        if lock(&self.shared.state).events {
            call.set_event_capacity(EVENT_CAPACITY);
        }
        call
    }

    /// The class of `error`, by the executor's classifier; its panic is `Err`.
    pub(crate) fn classify<E>(&self, error: &E) -> Result<ErrorClass, Panicked>
    where
        K: ErrorClassifier<E>,
    {
        unwind::call(|| self.shared.classifier.classify(error))
    }

    /// Runs or joins the coalesced refresh; returns whether it succeeded, or `Err` if this
    /// call ran it and `refresh` panicked (the refresh then ended as failed for its joiners).
    pub(crate) async fn refreshed<Rf, RfFut>(&self, refresh: &mut Rf) -> Result<bool, Panicked>
    where
        Rf: FnMut() -> RfFut,
        RfFut: Future<Output = bool>,
    {
        let (tx, rx) = oneshot::channel();
        let action = {
            let mut st = lock_observed(&self.shared.state, &self.shared.tap);
            let action = st.coalescer.handle_refresh_needed(tx);
            if let CoalesceAction::Start(_) = action {
                st.refreshes_started = st.refreshes_started.saturating_add(1);
            }
            action
        };
        match action {
            CoalesceAction::Start(generation) => {
                let guard = RefreshGuard {
                    shared: &self.shared,
                    generation: Some(generation),
                };
                // A panic returns here, and dropping the guard ends the refresh as failed.
                let ok = unwind::catch(async { refresh().await }).await?;
                guard.complete(ok);
                Ok(rx.await.unwrap_or(false))
            }
            CoalesceAction::Join(_) => Ok(rx.await.unwrap_or(false)),
            // The coalescer is full: handed back, treated as a failed refresh (still retries).
            _ => Ok(false),
        }
    }
}

/// Ends a started refresh exactly once: [`complete`](Self::complete), or as failed on drop.
struct RefreshGuard<'a, K, B> {
    shared: &'a Shared<K, B>,
    generation: Option<Generation>,
}

impl<K, B> RefreshGuard<'_, K, B> {
    fn complete(mut self, ok: bool) {
        self.end(ok);
    }

    fn end(&mut self, ok: bool) {
        let Some(generation) = self.generation.take() else {
            return;
        };
        let mut released = alloc::vec::Vec::new();
        {
            let mut st = lock_observed(&self.shared.state, &self.shared.tap);
            if st.coalescer.handle_refreshed(generation, ok).is_ok() {
                while let Some(r) = st.coalescer.poll_action() {
                    released.push((r.waiter, r.ok));
                }
            }
        }
        for (tx, ok) in released {
            tx.send(ok);
        }
    }
}

impl<K, B> Drop for RefreshGuard<'_, K, B> {
    fn drop(&mut self) {
        self.end(false);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::failover::{AdminWriteGateway, ErrorKind, GrpcThrottle, Unlimited};
    use crate::sync::WakeSignal;
    use crate::sync::test_support::{Executor, TestRuntime, failing_once};
    use std::sync::Mutex as StdMutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn runtime(exec: &Executor) -> TestRuntime {
        let mut rt = TestRuntime::new();
        rt.spawner = Some(exec.spawner());
        rt
    }

    /// A coordinator that moves: sends fail with `NotLeader` until a refresh has found the new
    /// leader; the refresh itself ends only when the test opens `lookup`.
    struct Cluster {
        moved: std::sync::atomic::AtomicBool,
        sends: AtomicUsize,
        lookups: AtomicUsize,
        lookup: WakeSignal,
    }

    impl Cluster {
        fn send(&self, id: u32) -> impl Future<Output = Result<u32, ErrorKind>> + use<> {
            self.sends.fetch_add(1, Ordering::SeqCst);
            let reply = if self.moved.load(Ordering::SeqCst) {
                Ok(id)
            } else {
                Err(ErrorKind::NotLeader)
            };
            core::future::ready(reply)
        }

        fn refresh(self: &Arc<Self>) -> impl Future<Output = bool> + use<> {
            self.lookups.fetch_add(1, Ordering::SeqCst);
            let (this, done) = (Arc::clone(self), self.lookup.changed(0));
            async move {
                done.await;
                this.moved.store(true, Ordering::SeqCst);
                true
            }
        }
    }

    fn admin_writes(
        exec: &Executor,
    ) -> FailoverExecutor<TestRuntime, AdminWriteGateway, Unlimited> {
        FailoverExecutor::new(
            runtime(exec),
            AdminWriteGateway,
            Unlimited,
            CallConfig::default(),
        )
        .unwrap()
    }

    #[test]
    fn concurrent_not_leader_failures_share_one_refresh_and_each_retry_once() {
        let mut exec = Executor::default();
        let fx = admin_writes(&exec);
        let cluster = Arc::new(Cluster {
            moved: Default::default(),
            sends: AtomicUsize::new(0),
            lookups: AtomicUsize::new(0),
            lookup: WakeSignal::new(),
        });
        let answered = Arc::new(AtomicUsize::new(0));
        for id in 0..3 {
            let (fx, c, answered) = (fx.clone(), Arc::clone(&cluster), Arc::clone(&answered));
            exec.spawn(async move {
                if fx.call(|| c.send(id), || c.refresh()).await == Ok(id) {
                    answered.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        assert_eq!(exec.run_until_stalled(), 3, "all wait for the one refresh");
        assert_eq!((fx.refresh_waiters(), fx.refreshes_started()), (3, 1));
        cluster.lookup.notify();
        assert_eq!(exec.run_until_stalled(), 0);
        assert_eq!(answered.load(Ordering::SeqCst), 3);
        assert_eq!(
            cluster.sends.load(Ordering::SeqCst),
            6,
            "one send and one retry each"
        );
        assert_eq!(cluster.lookups.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_sink_sees_each_calls_decisions_and_the_one_shared_refresh_outside_the_lock() {
        let mut exec = Executor::default();
        let fx = admin_writes(&exec);
        let seen = Arc::new(StdMutex::new(alloc::vec::Vec::new()));
        let (log, probe) = (Arc::clone(&seen), fx.clone());
        fx.set_event_sink(move |e: &FailoverEvent| {
            // Reading the executor here would deadlock if the sink ran under its lock.
            let _ = probe.in_flight();
            log.lock().unwrap().push(*e);
        });
        let cluster = Arc::new(Cluster {
            moved: Default::default(),
            sends: AtomicUsize::new(0),
            lookups: AtomicUsize::new(0),
            lookup: WakeSignal::new(),
        });
        for id in 0..2 {
            let (fx, c) = (fx.clone(), Arc::clone(&cluster));
            exec.spawn(async move {
                assert_eq!(fx.call(|| c.send(id), || c.refresh()).await, Ok(id));
            });
        }
        exec.run_until_stalled();
        cluster.lookup.notify();
        exec.run_until_stalled();
        let got = seen.lock().unwrap().clone();
        let g = Generation::from_raw(0);
        let count = |want: FailoverEvent| got.iter().filter(|e| **e == want).count();
        let cause = crate::failover::ErrorCause::Transient;
        assert_eq!(
            count(FailoverEvent::Call(CallEvent::RefreshRequested { cause })),
            2
        );
        assert_eq!(
            count(FailoverEvent::Refresh(RefreshEvent::Started {
                generation: g
            })),
            1
        );
        assert_eq!(
            count(FailoverEvent::Refresh(RefreshEvent::Joined {
                generation: g,
                waiters: 2
            })),
            1
        );
        assert_eq!(
            count(FailoverEvent::Refresh(RefreshEvent::Completed {
                generation: g,
                ok: true,
                released: 2
            })),
            1
        );
        let retry = FailoverEvent::Call(CallEvent::RetryDecided {
            attempt: 1,
            delay: core::time::Duration::ZERO,
            cause,
        });
        assert_eq!(count(retry), 2);
        assert_eq!(got.len(), 7, "{got:?}");
        // The refresh starts after the first call asked for it, and completes after both
        // joined; each retry comes after the completion.
        let at = |want: FailoverEvent| got.iter().position(|e| *e == want);
        let completed = at(FailoverEvent::Refresh(RefreshEvent::Completed {
            generation: g,
            ok: true,
            released: 2,
        }));
        assert!(at(retry) > completed, "{got:?}");

        // Cleared: later calls record nothing, and a panicking sink never ran.
        fx.clear_event_sink();
        let c = Arc::clone(&cluster);
        let f = fx.clone();
        exec.spawn(async move {
            assert_eq!(f.call(|| c.send(9), || c.refresh()).await, Ok(9));
        });
        exec.run_until_stalled();
        assert_eq!(seen.lock().unwrap().len(), 7);
        assert_eq!(fx.event_sink_panics(), 0);
    }

    #[test]
    fn a_panicking_sink_loses_its_events_and_the_call_still_ends() {
        let mut exec = Executor::default();
        let fx = FailoverExecutor::new(
            runtime(&exec),
            |_: &&str| crate::failover::ErrorClass::SURFACE,
            Unlimited,
            CallConfig::default(),
        )
        .unwrap();
        fx.set_event_sink(|_: &FailoverEvent| panic!("user sink"));
        let out = Arc::new(StdMutex::new(None));
        let (o, f) = (Arc::clone(&out), fx.clone());
        exec.spawn(async move {
            let r = f
                .call(
                    || core::future::ready(Err::<u8, _>("no")),
                    || async { true },
                )
                .await;
            *o.lock().unwrap() = Some(r.map_err(|e| e.surfaced().map(|s| s.reason)));
        });
        exec.run_until_stalled();
        assert_eq!(
            out.lock().unwrap().take(),
            Some(Err(Some(SurfaceReason::ClassifiedNever)))
        );
        assert_eq!(fx.event_sink_panics(), 1, "one event: the surfaced error");
        assert_eq!(fx.in_flight(), 0);
    }

    #[test]
    fn a_sink_cleared_while_a_call_runs_counts_that_calls_next_event_as_dropped() {
        let mut exec = Executor::default();
        let fx = FailoverExecutor::new(
            runtime(&exec),
            |_: &&str| crate::failover::ErrorClass::RETRY,
            Unlimited,
            CallConfig::default(),
        )
        .unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&seen);
        fx.set_event_sink(move |_: &FailoverEvent| {
            count.fetch_add(1, Ordering::SeqCst);
        });
        let sends = Arc::new(AtomicUsize::new(0));
        let (s, f, inner) = (Arc::clone(&sends), fx.clone(), fx.clone());
        exec.spawn(async move {
            let r = f
                .call(
                    || {
                        // The first send clears the sink; the call started with events on.
                        let n = s.fetch_add(1, Ordering::SeqCst);
                        if n == 0 {
                            inner.clear_event_sink();
                        }
                        core::future::ready(Err::<usize, _>("busy"))
                    },
                    || async { true },
                )
                .await;
            let reason = r.map_err(|e| e.surfaced().map(|s| s.reason));
            assert_eq!(reason, Err(Some(SurfaceReason::RetriesExhausted)));
        });
        exec.run_until_stalled();
        assert!(sends.load(Ordering::SeqCst) >= 2);
        // The retry decision after the first send found no sink: counted, and the call
        // stopped recording (the surfaced error is neither seen nor counted).
        assert_eq!(seen.load(Ordering::SeqCst), 0);
        assert_eq!(fx.events_dropped(), 1);
        assert_eq!(fx.event_sink_panics(), 0);
    }

    #[test]
    fn a_write_that_may_have_executed_refreshes_then_surfaces_without_a_resend() {
        let mut exec = Executor::default();
        let fx = FailoverExecutor::new(
            runtime(&exec),
            |_: &&str| crate::failover::ErrorClass::REFRESH_THEN_SURFACE,
            GrpcThrottle::default(),
            CallConfig::default(),
        )
        .unwrap();
        let sends = Arc::new(AtomicUsize::new(0));
        let out = Arc::new(StdMutex::new(None));
        let (s, o, f) = (Arc::clone(&sends), Arc::clone(&out), fx.clone());
        exec.spawn(async move {
            let r = f
                .call(
                    || {
                        s.fetch_add(1, Ordering::SeqCst);
                        async { Err::<(), _>("timeout") }
                    },
                    || async { true },
                )
                .await;
            *o.lock().unwrap() = Some(r);
        });
        assert_eq!(exec.run_until_stalled(), 0);
        assert_eq!(sends.load(Ordering::SeqCst), 1);
        assert_eq!(
            out.lock().unwrap().take(),
            Some(Err(CallError::Surfaced(Surfaced {
                error: "timeout",
                reason: SurfaceReason::ClassifiedNever
            })))
        );
        assert_eq!(fx.refreshes_started(), 1);
    }

    #[test]
    fn a_cancelled_refresher_releases_its_joiners_as_failed_and_they_still_retry() {
        let mut exec = Executor::default();
        let fx = admin_writes(&exec);
        let waker_count = crate::sync::test_support::CountingWaker::new();
        // The refresher: its refresh never ends; it is dropped mid-refresh.
        let attempts = Arc::new(AtomicUsize::new(0));
        let a = Arc::clone(&attempts);
        let mut refresher = alloc::boxed::Box::pin(fx.call(
            move || {
                a.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(ErrorKind::NotLeader) }
            },
            core::future::pending::<bool>,
        ));
        let mut cx = core::task::Context::from_waker(&waker_count.0);
        assert!(refresher.as_mut().poll(&mut cx).is_pending());
        assert!(fx.is_refreshing());
        let done = Arc::new(StdMutex::new(None));
        let (d, call) = (Arc::clone(&done), failing_once(&fx));
        exec.spawn(async move {
            let r = call.await;
            *d.lock().unwrap() = Some(r);
        });
        assert_eq!(
            exec.run_until_stalled(),
            1,
            "the joiner waits for the refresh"
        );
        drop(refresher);
        assert!(!fx.is_refreshing());
        assert_eq!(exec.run_until_stalled(), 0);
        assert_eq!(
            done.lock().unwrap().take(),
            Some(Ok(1)),
            "retried after the failed refresh"
        );
        assert_eq!(fx.refreshes_started(), 1);
    }

    type Outcome = Arc<StdMutex<alloc::vec::Vec<Result<usize, CallError<ErrorKind>>>>>;

    /// Spawns a call whose first send fails with `NotLeader` and whose retry succeeds with
    /// `id`; its refresh is `refresh`.
    fn spawn_call<Rf, RfFut>(
        exec: &Executor,
        fx: &FailoverExecutor<TestRuntime, AdminWriteGateway, Unlimited>,
        id: usize,
        refresh: Rf,
        out: &Outcome,
    ) where
        Rf: FnMut() -> RfFut + Send + 'static,
        RfFut: Future<Output = bool> + Send,
    {
        let (fx, out) = (fx.clone(), Arc::clone(out));
        exec.spawn(async move {
            let tries = AtomicUsize::new(0);
            let op = || {
                let first = tries.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    if first {
                        Err(ErrorKind::NotLeader)
                    } else {
                        Ok(id)
                    }
                }
            };
            let r = fx.call(op, refresh).await;
            out.lock().unwrap().push(r);
        });
    }

    #[test]
    fn a_refresher_whose_refresh_panics_fails_alone_its_joiners_retry_and_a_later_refresh_runs() {
        for in_future in [false, true] {
            let mut exec = Executor::default();
            let fx = admin_writes(&exec);
            let out: Outcome = Arc::default();
            let lookup = WakeSignal::new();
            // The refresher: its refresh panics, in `refresh()` or in its future, once the test
            // lets it go on.
            let go = lookup.changed(0);
            let mut go = Some(go);
            spawn_call(
                &exec,
                &fx,
                0,
                move || {
                    let go = go.take();
                    assert!(in_future, "refresh() panics");
                    async move {
                        if let Some(go) = go {
                            go.await;
                        }
                        assert!(!in_future, "the refresh future panics");
                        true
                    }
                },
                &out,
            );
            if in_future {
                spawn_call(&exec, &fx, 1, || async { true }, &out);
                assert_eq!(exec.run_until_stalled(), 2, "the joiner waits");
                assert_eq!(fx.refresh_waiters(), 2);
                lookup.notify();
            }
            exec.run_until_stalled();
            assert!(!fx.is_refreshing(), "the generation ended");
            let mut got = core::mem::take(&mut *out.lock().unwrap());
            assert_eq!(got.remove(0), Err(CallError::Panicked(Panicked)));
            if in_future {
                assert_eq!(got, [Ok(1)], "the joiner retried after the failed refresh");
            }
            // A later failure starts a new refresh, which runs.
            spawn_call(&exec, &fx, 2, || async { true }, &out);
            assert_eq!(exec.run_until_stalled(), 0);
            assert_eq!(out.lock().unwrap()[..], [Ok(2)]);
            assert_eq!(fx.refreshes_started(), 2);
            assert_eq!(fx.refresh_waiters(), 0);
        }
    }

    #[test]
    fn a_classifier_or_an_op_that_panics_fails_that_call_alone() {
        let mut exec = Executor::default();
        let fx = FailoverExecutor::new(
            runtime(&exec),
            |e: &&str| {
                assert_ne!(*e, "classifier panics", "the classifier panics");
                crate::failover::ErrorClass::REFRESH_THEN_SURFACE
            },
            Unlimited,
            CallConfig::default(),
        )
        .unwrap();
        let out = Arc::new(StdMutex::new(alloc::vec::Vec::new()));
        for which in 0..4 {
            let (fx, out) = (fx.clone(), Arc::clone(&out));
            exec.spawn(async move {
                let r = fx
                    .call(
                        || {
                            assert_ne!(which, 1, "op() panics");
                            async move {
                                match which {
                                    0 => Err("classifier panics"),
                                    2 => panic!("the op's future panics"),
                                    _ => Ok(which),
                                }
                            }
                        },
                        || async { true },
                    )
                    .await;
                out.lock().unwrap().push((which, r));
            });
        }
        assert_eq!(exec.run_until_stalled(), 0);
        let mut got = core::mem::take(&mut *out.lock().unwrap());
        got.sort_by_key(|(which, _)| *which);
        let panicked = Err(CallError::Panicked(Panicked));
        assert_eq!(
            got,
            [(0, panicked), (1, panicked), (2, panicked), (3, Ok(3))]
        );
        assert_eq!(fx.refreshes_started(), 0);
    }
}
