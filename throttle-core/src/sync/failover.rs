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

use core::fmt;
use core::future::Future;

use super::loom::{Arc, Mutex, lock};
use super::oneshot::{self, Sender};
use super::unwind;
use super::{Panicked, Runtime};
use crate::error::ConfigError;
use crate::failover::{
    Call, CallAction, CallConfig, CoalesceAction, CoalescerConfig, ErrorClassifier, Generation,
    RefreshCoalescer, RetryBudget, SurfaceReason,
};
use crate::rng::SplitMix64;

/// A call's error given back to the caller, with why it was not retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("request failed ({reason:?})")]
#[non_exhaustive]
pub struct Surfaced<E> {
    /// The last error the request failed with.
    pub error: E,
    /// Why it was surfaced instead of retried.
    pub reason: SurfaceReason,
}

/// Why a [`FailoverExecutor::call`] gave no value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError<E> {
    /// The request's last error, given back instead of retried.
    #[error(transparent)]
    Surfaced(#[from] Surfaced<E>),
    /// User code the call ran panicked: `op` or its future, the classifier, or `refresh` or
    /// its future. The call ended there; a refresh it was running ended as failed, so the
    /// calls that joined it retry and a later refresh can start.
    #[error(transparent)]
    Panicked(#[from] Panicked),
}

impl<E> CallError<E> {
    /// The surfaced error, if the call ended with one (not with a panic).
    pub fn surfaced(&self) -> Option<&Surfaced<E>> {
        match self {
            CallError::Surfaced(s) => Some(s),
            CallError::Panicked(_) => None,
        }
    }

    /// The request's last error, if the call ended with one (not with a panic).
    pub fn into_error(self) -> Option<E> {
        match self {
            CallError::Surfaced(s) => Some(s.error),
            CallError::Panicked(_) => None,
        }
    }
}

struct FailoverState<B> {
    budget: B,
    rng: SplitMix64,
    coalescer: RefreshCoalescer<Sender<bool>>,
    refreshes_started: u64,
}

struct Shared<K, B> {
    classifier: K,
    config: CallConfig,
    state: Mutex<FailoverState<B>>,
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
/// - `op` is called once per send, so a request is re-sent only when the classifier said it
///   was not executed ([`RetrySafety::NotExecuted`](crate::failover::RetrySafety)).
/// - Cancel-safe: dropping a call's future while it refreshes ends that refresh as failed and
///   releases the calls that joined it.
/// - A panic in `op()`, its future, the classifier, `refresh()` or its future ends the call
///   with [`CallError::Panicked`] (the panic is caught, the call's future does not unwind); a
///   refresh it was running ends as failed, as if cancelled.
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
                    rng: super::seed::client_rng(super::seed::next_client_id()),
                    coalescer: RefreshCoalescer::new(coalescer)?,
                    refreshes_started: 0,
                }),
            }),
        })
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

    /// Sends `op()` and drives the failover [`Call`] to its end: `Ok` with the first success,
    /// or the last error [`Surfaced`] with its reason, or [`CallError::Panicked`] if user code
    /// panicked. See the type's contract.
    pub async fn call<T, E, Op, OpFut, Rf, RfFut>(
        &self,
        mut op: Op,
        mut refresh: Rf,
    ) -> Result<T, CallError<E>>
    where
        K: ErrorClassifier<E>,
        Op: FnMut() -> OpFut,
        OpFut: Future<Output = Result<T, E>>,
        Rf: FnMut() -> RfFut,
        RfFut: Future<Output = bool>,
    {
        let mut call = Call::new(&self.shared.config);
        let mut action = {
            let mut st = lock(&self.shared.state);
            call.start(self.rt.now(), &mut st.budget)
        };
        loop {
            // Here `action` is `Send` or `Retry`.
            if let CallAction::Retry { after } = action
                && !after.is_zero()
            {
                self.rt.sleep_until(self.rt.now() + after).await;
            }
            let error = match unwind::catch(async { op().await }).await? {
                Ok(value) => {
                    let mut st = lock(&self.shared.state);
                    let _ = call.handle_success(self.rt.now(), &mut st.budget);
                    return Ok(value);
                }
                Err(error) => error,
            };
            let class = unwind::call(|| self.shared.classifier.classify(&error))?;
            action = {
                let mut guard = lock(&self.shared.state);
                let st = &mut *guard;
                call.handle_error(self.rt.now(), class, &mut st.budget, &mut st.rng)
            };
            loop {
                match action {
                    CallAction::Refresh => {
                        let ok = self.refreshed(&mut refresh).await?;
                        let mut guard = lock(&self.shared.state);
                        let st = &mut *guard;
                        action =
                            call.handle_refreshed(self.rt.now(), ok, &mut st.budget, &mut st.rng);
                    }
                    CallAction::Send | CallAction::Retry { .. } => break,
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

    /// Runs or joins the coalesced refresh; returns whether it succeeded, or `Err` if this
    /// call ran it and `refresh` panicked (the refresh then ended as failed for its joiners).
    async fn refreshed<Rf, RfFut>(&self, refresh: &mut Rf) -> Result<bool, Panicked>
    where
        Rf: FnMut() -> RfFut,
        RfFut: Future<Output = bool>,
    {
        let (tx, rx) = oneshot::channel();
        let action = {
            let mut st = lock(&self.shared.state);
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
            let mut st = lock(&self.shared.state);
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
    use crate::sync::test_support::{Executor, TestRuntime};
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
        let (d, f) = (Arc::clone(&done), fx.clone());
        exec.spawn(async move {
            let tries = AtomicUsize::new(0);
            let r = f
                .call(
                    || {
                        let n = tries.fetch_add(1, Ordering::SeqCst);
                        async move {
                            if n == 0 {
                                Err(ErrorKind::NotLeader)
                            } else {
                                Ok(n)
                            }
                        }
                    },
                    || async { true },
                )
                .await;
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
