//! tower middleware over the handles (feature `tower`): a keyed concurrency limit over a
//! [`WindowHandle`] and a write gate over a bound [`GateHandle`]; with feature `tower-retry`,
//! a retry policy over a [`FailoverExecutor`](super::FailoverExecutor) (`FailoverPolicy`).
//!
//! Both are glue: every decision stays in the core machine the handle wraps (the dispatch
//! window hands out and takes back credit, the write gate opens and closes buckets and maps a
//! write's answer onto its inputs through [`WriteGate::handle_write_outcome`]). The layers only
//! wait on the handle, forward the request, and report back.
//!
//! # How they compose
//!
//! tower's `poll_ready` cannot see the request, so neither layer can say "not ready" for one
//! key without stalling every other key. Both therefore pass `poll_ready` through to the inner
//! service and do their waiting **inside the response future**: the future first waits (for a
//! credit of the request's shard, or for the request's bucket to open), then readies a clone
//! of the inner service, calls it, and awaits the answer. An exhausted shard or a closed bucket
//! holds back only its own requests.
//!
//! With `tower::ServiceBuilder`, layers run outermost first. The order we recommend:
//!
//! ```text
//! ServiceBuilder::new()
//!     .retry(FailoverPolicy::new(fx)) // outermost: each retry passes the gate again
//!     .layer(WriteGateLayer::new(..)) // wait while the bucket is gated, feed every answer back
//!     .layer(KeyedConcurrencyLayer::new(..)) // hold a shard credit only while on the wire
//!     .service(transport)
//! ```
//!
//! The gate outside the concurrency limit, so a request waiting out a gate holds no credit that
//! other requests of its shard could use; a retry layer outside both, so a retried request
//! waits for its gate and its credit again.
//!
//! # Cost and failure
//!
//! Each response future boxes the inner service's future once (the crate forbids `unsafe`, so
//! it cannot pin it in place); the gate layer also boxes its wait. User code that panics (the
//! key or bucket extractor, the inner service's `poll_ready`, `call` or future, the classifier,
//! a key's `Hash`) fails that one request with [`LayerError::Panicked`], and whatever it held
//! (a credit) is given back.
//!
//! [`WriteGate::handle_write_outcome`]: crate::write_gate::WriteGate::handle_write_outcome

use alloc::boxed::Box;
use core::fmt;
use core::future::Future;
use core::hash::{BuildHasher, Hash};
use core::pin::Pin;
use core::task::{Context, Poll};

#[cfg(feature = "tower-retry")]
mod retry;
#[cfg(feature = "tower-retry")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower-retry")))]
pub use retry::{DeadlineOf, FailoverPolicy, NoDeadline, NoRefresh};

use tower_layer::Layer;
use tower_service::Service;

use super::loom::Arc;
use super::window::{Acquire, OwnedPermit};
use super::{Closed, GateHandle, Panicked, Runtime, WindowHandle, WriteClassifier, unwind};
use crate::write_gate::{GateState, OutcomeFeed};

/// Why a request through a throttle layer gave no response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum LayerError<E> {
    /// The inner service's own error (from its `poll_ready`, `call` or future).
    #[error(transparent)]
    Inner(E),
    /// The window handle was closed: the request was not sent.
    #[error("the concurrency window was closed; the request was not sent")]
    Closed,
    /// User code the request depended on panicked: see the module's "Cost and failure".
    #[error("user code panicked")]
    Panicked,
    /// The response future was polled again after it had completed.
    #[error("the response future was polled after it completed")]
    PolledAfterCompletion,
}

impl<E> From<Panicked> for LayerError<E> {
    fn from(_: Panicked) -> Self {
        LayerError::Panicked
    }
}

impl<E> From<Closed> for LayerError<E> {
    fn from(_: Closed) -> Self {
        LayerError::Closed
    }
}

/// Both layers' `poll_ready`: the inner service's, with a panic in it as an error.
fn inner_ready<Svc: Service<Req>, Req>(
    svc: &mut Svc,
    cx: &mut Context<'_>,
) -> Poll<Result<(), LayerError<Svc::Error>>> {
    match unwind::call(|| svc.poll_ready(cx)) {
        Ok(ready) => ready.map_err(LayerError::Inner),
        Err(panicked) => Poll::Ready(Err(panicked.into())),
    }
}

/// Readies a clone of the inner service, sends the request, awaits the answer: the second half
/// of both layers' futures. Every poll of user code is caught.
struct Forward<Svc: Service<Req>, Req> {
    svc: Svc,
    req: Option<Req>,
    fut: Option<Pin<Box<Svc::Future>>>,
}

impl<Svc: Service<Req>, Req> Forward<Svc, Req> {
    fn new(svc: Svc, req: Req) -> Self {
        Forward {
            svc,
            req: Some(req),
            fut: None,
        }
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Svc::Response, LayerError<Svc::Error>>> {
        if self.fut.is_none() {
            match inner_ready(&mut self.svc, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let Some(req) = self.req.take() else {
                return Poll::Ready(Err(LayerError::PolledAfterCompletion));
            };
            match unwind::call(|| Box::pin(self.svc.call(req))) {
                Ok(fut) => self.fut = Some(fut),
                Err(panicked) => return Poll::Ready(Err(panicked.into())),
            }
        }
        let Some(fut) = self.fut.as_mut() else {
            return Poll::Ready(Err(LayerError::PolledAfterCompletion));
        };
        match unwind::call(|| fut.as_mut().poll(cx)) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(answer)) => Poll::Ready(answer.map_err(LayerError::Inner)),
            Err(panicked) => Poll::Ready(Err(panicked.into())),
        }
    }
}

// ------------------------------------------------------------------ keyed concurrency

/// A [`Layer`] that limits the requests in flight **per shard** with a [`WindowHandle`]: at
/// most the window's `max_in_flight` requests of one shard are inside the inner service at a
/// time; the others wait in the shard's FIFO line. `key` picks each request's shard.
///
/// The credit is taken inside the response future, before the request is sent, and given
/// back exactly once when the future completes (answer or error) or is dropped (cancelled
/// while waiting in line or while on the wire). `poll_ready` is the inner service's alone, so
/// an exhausted shard never holds back another shard's requests. Closing the window fails
/// the requests waiting for a credit, and later ones, with [`LayerError::Closed`].
///
/// Stacking: see the [module docs](self); put it innermost, right above the transport, so a
/// credit is held only while the request is on the wire.
///
/// ```
/// use core::convert::Infallible;
/// use core::future::{Future, Ready, ready};
/// use core::pin::Pin;
/// use core::task::{Context, Poll, Waker};
/// use throttle_sansio::WindowConfig;
/// use throttle_sansio::sync::WindowHandle;
/// use throttle_sansio::sync::tower::KeyedConcurrencyLayer;
/// use tower_layer::Layer;
/// use tower_service::Service;
///
/// struct Put { shard: u32 }
///
/// /// The transport: answers with the shard it was sent to.
/// #[derive(Clone)]
/// struct Echo;
/// impl Service<Put> for Echo {
///     type Response = u32;
///     type Error = Infallible;
///     type Future = Ready<Result<u32, Infallible>>;
///     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
///         Poll::Ready(Ok(()))
///     }
///     fn call(&mut self, put: Put) -> Self::Future {
///         ready(Ok(put.shard))
///     }
/// }
///
/// let window: WindowHandle<u32> = WindowHandle::new(WindowConfig::default().with_max_in_flight(1))?;
/// // With `tower::ServiceBuilder`: `.layer(KeyedConcurrencyLayer::new(..))`.
/// let mut svc = KeyedConcurrencyLayer::new(window.clone(), |put: &Put| put.shard).layer(Echo);
/// let mut cx = Context::from_waker(Waker::noop());
///
/// let held = window.try_acquire(7).unwrap(); // shard 7 is full
/// assert!(svc.poll_ready(&mut cx).is_ready(), "readiness is the transport's alone");
/// let mut blocked = svc.call(Put { shard: 7 });
/// assert!(Pin::new(&mut blocked).poll(&mut cx).is_pending(), "in shard 7's line");
/// let mut other = svc.call(Put { shard: 8 });
/// assert_eq!(Pin::new(&mut other).poll(&mut cx), Poll::Ready(Ok(8)), "shard 8 is not held up");
/// drop(held);
/// assert_eq!(Pin::new(&mut blocked).poll(&mut cx), Poll::Ready(Ok(7)));
/// assert_eq!(window.in_flight(&7), 0, "the credit came back with the answer");
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
pub struct KeyedConcurrencyLayer<Shard, F, S = std::hash::RandomState> {
    window: WindowHandle<Shard, S>,
    key: Arc<F>,
}

impl<Shard, F, S> KeyedConcurrencyLayer<Shard, F, S> {
    /// A layer taking each request's credit from `window`, in the shard `key` names.
    pub fn new(window: WindowHandle<Shard, S>, key: F) -> Self {
        KeyedConcurrencyLayer {
            window,
            key: Arc::new(key),
        }
    }
}

impl<Shard, F, S> Clone for KeyedConcurrencyLayer<Shard, F, S> {
    fn clone(&self) -> Self {
        KeyedConcurrencyLayer {
            window: self.window.clone(),
            key: Arc::clone(&self.key),
        }
    }
}

impl<Shard, F, S> fmt::Debug for KeyedConcurrencyLayer<Shard, F, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedConcurrencyLayer")
            .finish_non_exhaustive()
    }
}

impl<Svc, Shard, F, S> Layer<Svc> for KeyedConcurrencyLayer<Shard, F, S> {
    type Service = KeyedConcurrency<Svc, Shard, F, S>;

    fn layer(&self, inner: Svc) -> Self::Service {
        KeyedConcurrency {
            inner,
            window: self.window.clone(),
            key: Arc::clone(&self.key),
        }
    }
}

/// The service of [`KeyedConcurrencyLayer`].
pub struct KeyedConcurrency<Svc, Shard, F, S = std::hash::RandomState> {
    inner: Svc,
    window: WindowHandle<Shard, S>,
    key: Arc<F>,
}

impl<Svc: Clone, Shard, F, S> Clone for KeyedConcurrency<Svc, Shard, F, S> {
    fn clone(&self) -> Self {
        KeyedConcurrency {
            inner: self.inner.clone(),
            window: self.window.clone(),
            key: Arc::clone(&self.key),
        }
    }
}

impl<Svc, Shard, F, S> fmt::Debug for KeyedConcurrency<Svc, Shard, F, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedConcurrency").finish_non_exhaustive()
    }
}

impl<Req, Svc, Shard, F, S> Service<Req> for KeyedConcurrency<Svc, Shard, F, S>
where
    Svc: Service<Req> + Clone,
    F: Fn(&Req) -> Shard,
    Shard: Hash + Eq + Clone + 'static,
    S: BuildHasher + 'static,
{
    type Response = Svc::Response;
    type Error = LayerError<Svc::Error>;
    type Future = ConcurrencyFuture<Svc, Req, Shard, S>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        inner_ready(&mut self.inner, cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // The key and its hash (user code) before anything is taken.
        let acquire = unwind::call(|| self.window.acquire_owned((self.key)(&req)));
        let state = match acquire {
            Ok(acquire) => Concurrency::Acquiring {
                acquire,
                forward: Forward::new(self.inner.clone(), req),
            },
            Err(panicked) => Concurrency::Failed(panicked.into()),
        };
        ConcurrencyFuture { state }
    }
}

/// The response future of [`KeyedConcurrency`]: waits for the shard's credit, then sends.
pub struct ConcurrencyFuture<Svc, Req, Shard, S>
where
    Svc: Service<Req>,
    Shard: Hash + Eq + Clone + 'static,
    S: BuildHasher + 'static,
{
    state: Concurrency<Svc, Req, Shard, S>,
}

enum Concurrency<Svc, Req, Shard, S>
where
    Svc: Service<Req>,
    Shard: Hash + Eq + Clone + 'static,
    S: BuildHasher + 'static,
{
    Acquiring {
        acquire: Acquire<'static, Shard, S>,
        forward: Forward<Svc, Req>,
    },
    Sending {
        /// Held while the request is on the wire; dropped (the credit given back) when the
        /// future completes or is dropped.
        _permit: OwnedPermit<Shard, S>,
        forward: Forward<Svc, Req>,
    },
    Failed(LayerError<Svc::Error>),
    Done,
}

// No field is structurally pinned: the inner future is boxed, the rest is moved freely.
impl<Svc, Req, Shard, S> Unpin for ConcurrencyFuture<Svc, Req, Shard, S>
where
    Svc: Service<Req>,
    Shard: Hash + Eq + Clone + 'static,
    S: BuildHasher + 'static,
{
}

impl<Svc, Req, Shard, S> fmt::Debug for ConcurrencyFuture<Svc, Req, Shard, S>
where
    Svc: Service<Req>,
    Shard: Hash + Eq + Clone + 'static,
    S: BuildHasher + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            Concurrency::Acquiring { .. } => "acquiring",
            Concurrency::Sending { .. } => "sending",
            Concurrency::Failed(_) => "failed",
            Concurrency::Done => "done",
        };
        f.debug_struct("ConcurrencyFuture")
            .field("state", &state)
            .finish()
    }
}

impl<Svc, Req, Shard, S> Future for ConcurrencyFuture<Svc, Req, Shard, S>
where
    Svc: Service<Req>,
    Shard: Hash + Eq + Clone + 'static,
    S: BuildHasher + 'static,
{
    type Output = Result<Svc::Response, LayerError<Svc::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                Concurrency::Acquiring { acquire, .. } => {
                    let permit = match unwind::call(|| Pin::new(acquire).poll(cx)) {
                        Ok(Poll::Pending) => return Poll::Pending,
                        Ok(Poll::Ready(Ok(permit))) => permit,
                        Ok(Poll::Ready(Err(closed))) => {
                            this.state = Concurrency::Done;
                            return Poll::Ready(Err(closed.into()));
                        }
                        Err(panicked) => {
                            this.state = Concurrency::Done;
                            return Poll::Ready(Err(panicked.into()));
                        }
                    };
                    if let Concurrency::Acquiring { forward, .. } =
                        core::mem::replace(&mut this.state, Concurrency::Done)
                    {
                        this.state = Concurrency::Sending {
                            _permit: permit,
                            forward,
                        };
                    }
                }
                Concurrency::Sending { forward, .. } => {
                    let Poll::Ready(answer) = forward.poll(cx) else {
                        return Poll::Pending;
                    };
                    // Gives the credit back before the answer reaches the caller.
                    this.state = Concurrency::Done;
                    return Poll::Ready(answer);
                }
                Concurrency::Failed(_) => {
                    return Poll::Ready(Err(
                        match core::mem::replace(&mut this.state, Concurrency::Done) {
                            Concurrency::Failed(error) => error,
                            _ => LayerError::PolledAfterCompletion, // unreachable: matched above
                        },
                    ));
                }
                Concurrency::Done => return Poll::Ready(Err(LayerError::PolledAfterCompletion)),
            }
        }
    }
}

// ------------------------------------------------------------------------ write gate

/// Which gate bucket a request writes to, and how many times it was already rejected (the
/// exponent of the gate's backoff). Any `Fn(&Req) -> K` is one, with attempt 0; a request
/// that carries its retry count (set by an outer retry layer) implements it to say so.
pub trait GateBucket<Req> {
    /// The bucket key.
    type Bucket;

    /// The bucket `req` writes to.
    fn bucket(&self, req: &Req) -> Self::Bucket;

    /// How many earlier attempts of `req` were rejected (0 for the first send).
    fn attempt(&self, req: &Req) -> u32 {
        let _ = req;
        0
    }
}

impl<Req, K, F: Fn(&Req) -> K> GateBucket<Req> for F {
    type Bucket = K;

    fn bucket(&self, req: &Req) -> K {
        self(req)
    }
}

/// A [`Layer`] that sends a request only while its bucket's write gate is open, and feeds every
/// answer back into the gate.
///
/// The response future waits while the request's bucket is closed with a deadline
/// ([`GateHandle::wait_until_open`], which wakes early when an input moves the opening
/// earlier), then sends; a bucket in probe mode or with an unknown leader is sent to, as the
/// paced writer does. Each answer is sorted by the [`WriteClassifier`] (the same trait the
/// [`WriteDriver`](super::WriteDriver) takes) and fed to the gate through
/// [`WriteGate::handle_write_outcome`](crate::write_gate::WriteGate::handle_write_outcome)
/// with the [`OutcomeFeed`] (every answer by default), at the request's
/// [`attempt`](GateBucket::attempt): the rule the paced writer uses. An error of the inner
/// service (a transport error, no server answer) teaches the gate nothing and is passed on.
///
/// The handle must be bound to a runtime ([`GateHandle::bind`]): the layer reads `now` and
/// sleeps on it. Spawn [`GateHandle::drive_timeouts`] once beside it to evict expired gates.
///
/// Stacking: see the [module docs](self); outside the concurrency layer and inside a retry
/// layer.
pub struct WriteGateLayer<K, S, R, B, C> {
    gate: GateHandle<K, S, R>,
    bucket: Arc<B>,
    classify: Arc<C>,
    feed: OutcomeFeed,
}

impl<K, S, R, B, C> WriteGateLayer<K, S, R, B, C> {
    /// A layer over the bound `gate`, finding each request's bucket with `bucket` and sorting
    /// each answer with `classify`.
    pub fn new(gate: GateHandle<K, S, R>, bucket: B, classify: C) -> Self {
        WriteGateLayer {
            gate,
            bucket: Arc::new(bucket),
            classify: Arc::new(classify),
            feed: OutcomeFeed::ALL,
        }
    }

    /// Which answers feed the gate (the paced writer's `with_disk_backoff` and
    /// `with_kv_pressure`); every answer by default.
    #[must_use]
    pub fn with_feed(mut self, feed: OutcomeFeed) -> Self {
        self.feed = feed;
        self
    }
}

impl<K, S, R: Clone, B, C> Clone for WriteGateLayer<K, S, R, B, C> {
    fn clone(&self) -> Self {
        WriteGateLayer {
            gate: self.gate.clone(),
            bucket: Arc::clone(&self.bucket),
            classify: Arc::clone(&self.classify),
            feed: self.feed,
        }
    }
}

impl<K, S, R, B, C> fmt::Debug for WriteGateLayer<K, S, R, B, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteGateLayer")
            .field("feed", &self.feed)
            .finish_non_exhaustive()
    }
}

impl<Svc, K, S, R: Clone, B, C> Layer<Svc> for WriteGateLayer<K, S, R, B, C> {
    type Service = WriteGateService<Svc, K, S, R, B, C>;

    fn layer(&self, inner: Svc) -> Self::Service {
        WriteGateService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`WriteGateLayer`].
pub struct WriteGateService<Svc, K, S, R, B, C> {
    inner: Svc,
    layer: WriteGateLayer<K, S, R, B, C>,
}

impl<Svc: Clone, K, S, R: Clone, B, C> Clone for WriteGateService<Svc, K, S, R, B, C> {
    fn clone(&self) -> Self {
        WriteGateService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<Svc, K, S, R, B, C> fmt::Debug for WriteGateService<Svc, K, S, R, B, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteGateService").finish_non_exhaustive()
    }
}

impl<Req, Svc, K, S, R, B, C> Service<Req> for WriteGateService<Svc, K, S, R, B, C>
where
    Svc: Service<Req> + Clone,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    R: Runtime + Sync,
    B: GateBucket<Req, Bucket = K>,
    C: WriteClassifier<Svc::Response>,
{
    type Response = Svc::Response;
    type Error = LayerError<Svc::Error>;
    type Future = GateFuture<Svc, Req, K, S, R, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        inner_ready(&mut self.inner, cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let layer = &self.layer;
        let found = unwind::call(|| (layer.bucket.bucket(&req), layer.bucket.attempt(&req)));
        let state = match found {
            Ok((bucket, attempt)) => {
                let gate = layer.gate.clone();
                let key = bucket.clone();
                Gate::Waiting {
                    wait: Box::pin(async move { gate.wait_until_open(&key).await }),
                    forward: Forward::new(self.inner.clone(), req),
                    bucket,
                    attempt,
                }
            }
            Err(panicked) => Gate::Failed(panicked.into()),
        };
        GateFuture {
            state,
            gate: layer.gate.clone(),
            classify: Arc::clone(&layer.classify),
            feed: layer.feed,
        }
    }
}

/// The response future of [`WriteGateService`]: waits for the bucket, sends, feeds the answer
/// back.
pub struct GateFuture<Svc: Service<Req>, Req, K, S, R, C> {
    state: Gate<Svc, Req, K>,
    gate: GateHandle<K, S, R>,
    classify: Arc<C>,
    feed: OutcomeFeed,
}

type Wait = Pin<Box<dyn Future<Output = GateState> + Send>>;

enum Gate<Svc: Service<Req>, Req, K> {
    Waiting {
        wait: Wait,
        forward: Forward<Svc, Req>,
        bucket: K,
        attempt: u32,
    },
    Sending {
        forward: Forward<Svc, Req>,
        bucket: K,
        attempt: u32,
    },
    Failed(LayerError<Svc::Error>),
    Done,
}

// No field is structurally pinned: the wait and the inner future are boxed.
impl<Svc: Service<Req>, Req, K, S, R, C> Unpin for GateFuture<Svc, Req, K, S, R, C> {}

impl<Svc: Service<Req>, Req, K, S, R, C> fmt::Debug for GateFuture<Svc, Req, K, S, R, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            Gate::Waiting { .. } => "waiting",
            Gate::Sending { .. } => "sending",
            Gate::Failed(_) => "failed",
            Gate::Done => "done",
        };
        f.debug_struct("GateFuture").field("state", &state).finish()
    }
}

impl<Svc, Req, K, S, R, C> Future for GateFuture<Svc, Req, K, S, R, C>
where
    Svc: Service<Req>,
    K: Hash + Eq + Clone,
    S: BuildHasher,
    R: Runtime,
    C: WriteClassifier<Svc::Response>,
{
    type Output = Result<Svc::Response, LayerError<Svc::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                Gate::Waiting { wait, .. } => {
                    match unwind::call(|| wait.as_mut().poll(cx)) {
                        Ok(Poll::Pending) => return Poll::Pending,
                        Ok(Poll::Ready(_open)) => {}
                        Err(panicked) => {
                            this.state = Gate::Done;
                            return Poll::Ready(Err(panicked.into()));
                        }
                    }
                    if let Gate::Waiting {
                        forward,
                        bucket,
                        attempt,
                        ..
                    } = core::mem::replace(&mut this.state, Gate::Done)
                    {
                        this.state = Gate::Sending {
                            forward,
                            bucket,
                            attempt,
                        };
                    }
                }
                Gate::Sending { forward, .. } => {
                    let Poll::Ready(answer) = forward.poll(cx) else {
                        return Poll::Pending;
                    };
                    let Gate::Sending {
                        bucket, attempt, ..
                    } = core::mem::replace(&mut this.state, Gate::Done)
                    else {
                        return Poll::Ready(Err(LayerError::PolledAfterCompletion)); // unreachable
                    };
                    let Ok(response) = answer else {
                        return Poll::Ready(answer);
                    };
                    let (gate, classify, feed) = (&this.gate, &this.classify, this.feed);
                    let fed = unwind::call(|| {
                        let outcome = classify.classify(&response);
                        gate.handle_write_outcome(&bucket, outcome, attempt, feed);
                    });
                    return Poll::Ready(match fed {
                        Ok(()) => Ok(response),
                        Err(panicked) => Err(panicked.into()),
                    });
                }
                Gate::Failed(_) => {
                    return Poll::Ready(Err(
                        match core::mem::replace(&mut this.state, Gate::Done) {
                            Gate::Failed(error) => error,
                            _ => LayerError::PolledAfterCompletion, // unreachable: matched above
                        },
                    ));
                }
                Gate::Done => return Poll::Ready(Err(LayerError::PolledAfterCompletion)),
            }
        }
    }
}
