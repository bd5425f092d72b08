//! [`FailoverPolicy`]: a `tower::retry::Policy` whose every decision is the failover [`Call`]
//! machine's (feature `tower-retry`).

use alloc::boxed::Box;
use core::fmt;
use core::future::{Future, Ready, poll_fn, ready};
use core::pin::{Pin, pin};
use core::task::Poll;

use ::tower::retry::Policy;

use super::super::loom::Arc;
use super::super::{FailoverExecutor, Runtime, unwind};
use crate::failover::{Call, CallAction, ErrorClassifier, RetryBudget};
use crate::time::Instant;

/// The deadline of a request, if it has one: no retry of it is decided at or after it. Any
/// `Fn(&Req) -> Option<Instant>` is one (on the executor's runtime's clock); [`NoDeadline`]
/// is the default.
pub trait DeadlineOf<Req> {
    /// The instant after which no retry of `req` starts, `None` for none.
    fn deadline(&self, req: &Req) -> Option<Instant>;
}

impl<Req, F: Fn(&Req) -> Option<Instant>> DeadlineOf<Req> for F {
    fn deadline(&self, req: &Req) -> Option<Instant> {
        self(req)
    }
}

/// No request has a deadline (the default of [`FailoverPolicy`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoDeadline;

impl<Req> DeadlineOf<Req> for NoDeadline {
    fn deadline(&self, _: &Req) -> Option<Instant> {
        None
    }
}

/// The refresh of a policy made without one: reports a failed refresh at once, so the call
/// goes on as after any failed refresh (a retriable error is still retried).
pub type NoRefresh = fn() -> Ready<bool>;

fn no_refresh() -> Ready<bool> {
    ready(false)
}

/// A [`tower::retry::Policy`](::tower::retry::Policy) over a [`FailoverExecutor`]: the
/// executor's classifier sorts each error, and a failover [`Call`] per request decides, with
/// the executor's shared [`RetryBudget`], its backoff (jittered from its generator) and the
/// request's deadline. Use it with `tower::retry::RetryLayer::new(policy)` or
/// `ServiceBuilder::retry(policy)`.
///
/// What it decides is exactly what [`FailoverExecutor::call_until`] decides for the same
/// errors:
/// - **Retry only what provably did not execute**: an error classified
///   [`RetrySafety::Never`](crate::failover::RetrySafety::Never) is returned as it is; a
///   retried request is cloned (`Req: Clone`) before it is sent.
/// - **Refresh apart from retry**: an error whose class asks for a refresh runs the policy's
///   refresh ([`with_refresh`](Self::with_refresh)) through the executor's coalescer (one at a
///   time; other requests join it), whether it is then retried or not.
/// - **Counts and budget**: at most the config's `max_auto_retries` retries per request, each
///   one withdrawn from the shared budget, whose `handle_request` / `handle_success` hear
///   every request and success.
/// - **Deadline** ([`with_deadline`](Self::with_deadline)): no retry is decided to start at
///   or after it, and no backoff sleep aims past it.
///
/// # tower's contract, and where it differs from the executor
///
/// tower asks the policy to decide when the answer arrives, and sends the retry once the
/// policy's future ends: nothing can withdraw it then. So the call decides at the error's
/// time, and, when the class asks for a refresh, the refresh runs *before* the backoff sleep
/// ends rather than before the decision (the call's decision does not depend on the refresh's
/// result). The refresh is cut off at the deadline; a retry whose wait ends late (a late
/// timer) is still sent by tower. A refresh for an error that is not retried runs in a task
/// spawned on the runtime. The first attempt is not the policy's: a request's deadline only
/// stops its retries. Requests through the policy are not counted by
/// [`FailoverExecutor::closed`]; after [`FailoverExecutor::close`] nothing is retried.
///
/// User code that panics (the classifier, the deadline extractor) ends the request's retries:
/// its error is returned as it is.
pub struct FailoverPolicy<R, K, B, Rf = NoRefresh, D = NoDeadline> {
    fx: FailoverExecutor<R, K, B>,
    refresh: Arc<Rf>,
    deadline: Arc<D>,
    /// This request's call: `None` in the service's own copy, made at its first answer.
    call: Option<Call>,
    /// When the request was first sent: set in the service's own copy as tower clones the
    /// request, just before its first send; a request's copy inherits it.
    first_send: Option<Instant>,
}

impl<R, K, B> FailoverPolicy<R, K, B> {
    /// A policy deciding through `fx`, without a refresh or deadlines.
    pub fn new(fx: FailoverExecutor<R, K, B>) -> Self {
        FailoverPolicy {
            fx,
            refresh: Arc::new(no_refresh as NoRefresh),
            deadline: Arc::new(NoDeadline),
            call: None,
            first_send: None,
        }
    }
}

impl<R, K, B, Rf, D> FailoverPolicy<R, K, B, Rf, D> {
    /// This policy with `refresh` as the metadata refresh an error's class can ask for (its
    /// future resolves to whether it succeeded).
    pub fn with_refresh<Rf2>(self, refresh: Rf2) -> FailoverPolicy<R, K, B, Rf2, D> {
        FailoverPolicy {
            fx: self.fx,
            refresh: Arc::new(refresh),
            deadline: self.deadline,
            call: None,
            first_send: None,
        }
    }

    /// This policy with each request's deadline read by `deadline`.
    pub fn with_deadline<D2>(self, deadline: D2) -> FailoverPolicy<R, K, B, Rf, D2> {
        FailoverPolicy {
            fx: self.fx,
            refresh: self.refresh,
            deadline: Arc::new(deadline),
            call: None,
            first_send: None,
        }
    }
}

impl<R: Clone, K, B, Rf, D> Clone for FailoverPolicy<R, K, B, Rf, D> {
    fn clone(&self) -> Self {
        FailoverPolicy {
            fx: self.fx.clone(),
            refresh: Arc::clone(&self.refresh),
            deadline: Arc::clone(&self.deadline),
            call: self.call.clone(),
            first_send: self.first_send,
        }
    }
}

impl<R, K, B, Rf, D> fmt::Debug for FailoverPolicy<R, K, B, Rf, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailoverPolicy")
            .field("call", &self.call)
            .finish_non_exhaustive()
    }
}

/// `a`, cut off when `b` ends first.
async fn until<A: Future, Bf: Future>(a: A, b: Bf) {
    let (mut a, mut b) = (pin!(a), pin!(b));
    poll_fn(|cx| {
        if a.as_mut().poll(cx).is_ready() || b.as_mut().poll(cx).is_ready() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

impl<Req, Res, E, R, K, B, Rf, RfFut, D> Policy<Req, Res, E> for FailoverPolicy<R, K, B, Rf, D>
where
    Req: Clone,
    R: Runtime + Sync,
    K: ErrorClassifier<E> + Send + Sync + 'static,
    B: RetryBudget + Send + 'static,
    Rf: Fn() -> RfFut + Send + Sync + 'static,
    RfFut: Future<Output = bool> + Send + 'static,
    D: DeadlineOf<Req>,
{
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn retry(&mut self, req: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        let now = self.fx.runtime().now();
        if self.call.is_none() {
            let deadline = unwind::call(|| self.deadline.deadline(req)).ok()?;
            let mut call = self.fx.new_call(deadline);
            let sent = self.first_send.unwrap_or(now);
            if let CallAction::Surface { .. } = self.fx.start_call(&mut call, sent) {
                return None; // sent at or after its deadline: never retried
            }
            self.call = Some(call);
        }
        let call = self.call.as_mut()?;
        let error = match result {
            Ok(_) => {
                let _ = self.fx.succeed(call, now);
                return None;
            }
            Err(error) => error,
        };
        if self.fx.is_closed() {
            return None;
        }
        let class = self.fx.classify(&*error).ok()?;
        let mut action = self.fx.fail(call, now, class);
        let refresh = action == CallAction::Refresh;
        if refresh {
            // tower needs the decision now; the call's decision after a refresh does not
            // depend on its result.
            action = self.fx.refreshed_at(call, now, true);
        }
        let time_left = call.time_left(now);
        let refresh_job = refresh.then(|| {
            let (fx, rf) = (self.fx.clone(), Arc::clone(&self.refresh));
            let cutoff = time_left.map(|left| now.saturating_add(left));
            async move {
                let rt = fx.runtime().clone();
                let job = async { fx.refreshed(&mut || rf()).await };
                match cutoff {
                    Some(at) => until(job, rt.sleep_until(at)).await,
                    None => {
                        let _ = job.await;
                    }
                }
            }
        });
        match action {
            CallAction::Retry { after, .. } => {
                let rt = self.fx.runtime().clone();
                let at = now.saturating_add(after);
                Some(Box::pin(async move {
                    if let Some(job) = refresh_job {
                        job.await;
                    }
                    if rt.now() < at {
                        rt.sleep_until(at).await;
                    }
                }))
            }
            _ => {
                if let Some(job) = refresh_job {
                    self.fx.runtime().spawn(job);
                }
                None
            }
        }
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        if self.call.is_none() {
            self.first_send = Some(self.fx.runtime().now());
        }
        Some(req.clone())
    }
}
