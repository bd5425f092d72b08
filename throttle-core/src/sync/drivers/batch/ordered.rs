//! [`SendOrder::PerShard`]: each shard's batches reach the transport in dispatch order, through
//! one *lane* task per shard; and [`BatchDriverBuilder`], which chooses the mode.
//!
//! The hand-off. Under the driver's lock, `drain` gives every dispatched batch (the batcher's
//! `Send`, in credit order) to [`Lanes::route`], which appends it to its shard's lane queue. A
//! shard with batches in flight or queued has exactly one lane entry and one lane task
//! ([`LaneRun`]); the first batch routed to a shard without an entry creates the entry and asks
//! the caller to start the task (after unlock, [`LaneRun::carry`]). The task takes
//! its queue under the lock (storing its waker there when the queue is empty), then, outside
//! it, calls [`Transport::send`] for each batch in queue order and polls its in-flight futures
//! front to back. It removes its entry, under the same lock in which it finds the queue empty
//! and nothing in flight, and ends; a batch routed after that starts a new task. So there is
//! never a second task for a shard, and a batch is never behind a task that ended.
//!
//! Credits: each batch is owned by a [`SendGuard`] from the moment the task takes it, so a
//! batch ends through the guard's one rule: reported by the task, or released by the guard's
//! `Drop` if the task is dropped unfinished. That `Drop` ([`LaneRun`]'s) also releases, through
//! the same guard, every batch still queued in its lane, including the ones those releases
//! dispatched (a release dispatches only the same shard's batches, into this lane, whose entry
//! lives until the loop finds it empty: no lane is ever started from a destructor).

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::fmt;
use core::future::Future;
use core::hash::{BuildHasher, Hash};
use core::pin::Pin;
use core::task::{Context, Poll, Waker};

use super::{
    BatchDriver, DriverOf, Ending, Kept, Outgoing, Parts, Prepared, Raced, Requeue, SendGuard,
    ShardId, Transport, lock, race, unwind, wake_one,
};
use crate::backoff::BackoffConfig;
use crate::batcher::BatcherConfig;
use crate::error::ConfigError;
use crate::limiter::LimiterConfig;
use crate::sync::{Panicked, Runtime};

/// How a [`BatchDriver`] hands a shard's batches to its [`Transport`].
///
/// - [`Concurrent`](Self::Concurrent) (the default, and what [`BatchDriver::new`] builds):
///   each batch is sent from whichever task dispatched it and awaited in a task of its own.
///   Up to the shard's window limit of batches are in the transport at once, and
///   nothing orders them: two batches dispatched one after the other can reach `send`, or
///   have their futures first polled, in either order (two threads dispatching at once, or a
///   runtime that runs the second batch's task first).
/// - [`PerShard`](Self::PerShard): one task per shard (its *lane*) makes every call to
///   [`Transport::send`] for that shard, in dispatch order (the order in which the shard's
///   batches took their window credits), and polls the shard's in-flight send futures in that
///   same order on every pass, so a batch's future is first polled only after every earlier
///   batch's future of the shard has been polled at least once. The window still pipelines:
///   up to the shard's window limit of batches are in flight, and their answers are taken in
///   whatever order they come.
///
/// With `PerShard`, a transport that puts its request on an ordered stream inside `send`, or
/// before its future's first `Pending`, writes each shard's batches in dispatch order, which
/// keeps each submitter's operations to a shard in the order it submitted them. A future that
/// returns `Pending` *before* it has written (it waits for a connection first, say) can be
/// overtaken by the next batch's future; for strictly one batch at a time per shard, set the
/// window's `max_in_flight` to 1 (in either mode), at the cost of one round trip per batch:
/// a shard then sends at most one batch per round trip, and its batches grow to carry what
/// arrives meanwhile.
///
/// The lane polls a shard's futures in order on each wake, so a wake of any one of them polls
/// all of them (`max_in_flight` polls per wake). Panics and dropped tasks are handled as in the
/// concurrent mode: a `send` or future that panics fails its batch's operations with
/// [`OpError::Panicked`](super::OpError::Panicked) and releases its credit, and the shard's
/// later batches still go; a lane task the runtime drops releases the credit of every batch it
/// held or had queued (their operations fail with
/// [`OpError::NoResponse`](super::OpError::NoResponse)).
///
/// ```
#[doc = include_str!("../../doc/tiny_runtime.md")]
/// use throttle_sansio::{BatcherConfig, WindowConfig};
/// use throttle_sansio::sync::{BatchDriver, BatchOutcome, SendOrder, Transport};
///
/// /// Writes each batch to its shard's stream (here: a log) when `send` is called.
/// #[derive(Clone, Default)]
/// struct Stream(Arc<Mutex<Vec<(u8, Vec<u64>)>>>);
///
/// impl Transport<u8, u64> for Stream {
///     type Output = u64;
///     type Error = std::io::Error;
///
///     fn send(
///         &self,
///         shard: &u8,
///         puts: Vec<u64>,
///     ) -> impl Future<Output = BatchOutcome<u64, std::io::Error>> + Send + 'static {
///         self.0.lock().unwrap().push((*shard, puts.clone()));
///         core::future::ready(Ok(puts.into_iter().map(Ok).collect()))
///     }
/// }
///
/// let (rt, stream) = (Tiny::default(), Stream::default());
/// let cfg = BatcherConfig::writes()
///     .with_window(WindowConfig::default().with_max_in_flight(4))
///     .expect("a window above 0 is valid");
/// let driver: BatchDriver<_, _, u8, u64> = BatchDriver::builder(rt.clone(), stream.clone(), cfg)
///     .with_send_order(SendOrder::PerShard)
///     .build();
/// assert_eq!(driver.send_order(), SendOrder::PerShard);
/// let puts: Vec<_> = (0..3).map(|k| driver.submit(1, k)).collect();
/// for (k, put) in puts.into_iter().enumerate() {
///     assert_eq!(rt.block_on(put).unwrap(), k as u64);
/// }
/// let written: Vec<u64> = stream.0.lock().unwrap().iter().flat_map(|(_, b)| b.clone()).collect();
/// assert_eq!(written, [0, 1, 2], "shard 1's stream in submission order");
/// driver.close();
/// rt.block_on(driver.closed());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SendOrder {
    /// Each batch sent and awaited on its own; no order between a shard's batches.
    #[default]
    Concurrent,
    /// One lane task per shard: `send` called, and the futures polled, in dispatch order.
    PerShard,
}

/// Builds a [`BatchDriver`] with choices beyond [`BatchDriver::new`]'s: the [`SendOrder`] and
/// the hasher. Made by [`BatchDriver::builder`].
///
/// ```
#[doc = include_str!("../../doc/tiny_runtime.md")]
/// use throttle_sansio::BatcherConfig;
/// use throttle_sansio::sync::{BatchDriver, BatchOutcome, SendOrder};
///
/// async fn exchange(shard: u8, keys: Vec<u32>) -> BatchOutcome<u64, std::io::Error> {
///     Ok(keys.into_iter().map(|k| Ok(u64::from(k) + u64::from(shard))).collect())
/// }
/// let rt = Tiny::default();
/// let send = |shard: &u8, keys| exchange(*shard, keys);
/// let driver = BatchDriver::builder(rt.clone(), send, BatcherConfig::reads())
///     .with_send_order(SendOrder::PerShard)
///     .with_hasher(std::hash::RandomState::new())
///     .build();
/// assert_eq!(rt.block_on(driver.submit(2, 40)).unwrap(), 42);
/// driver.close();
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct BatchDriverBuilder<R, T: Transport<Shard, Op>, Shard, Op, S = std::hash::RandomState> {
    pub(super) rt: R,
    pub(super) transport: T,
    pub(super) cfg: BatcherConfig,
    pub(super) hasher: S,
    pub(super) order: SendOrder,
    pub(super) requeue: Option<Requeue<Op>>,
    /// A limiter per shard driving its window ([`Self::with_limiter`]), if on.
    pub(super) limiter: Option<LimiterConfig>,
    /// `BatchDriver::start` for these types, taken where their bounds hold, so that `build`
    /// needs none (a new hasher takes it anew: [`with_hasher`](Self::with_hasher)).
    pub(super) start: StartFn<R, T, Shard, Op, S>,
}

/// Builds and spawns the driver a builder describes.
pub(super) type StartFn<R, T, Shard, Op, S> =
    fn(BatchDriverBuilder<R, T, Shard, Op, S>) -> BatchDriver<R, T, Shard, Op, S>;

impl<R, T: Transport<Shard, Op>, Shard, Op, S> fmt::Debug
    for BatchDriverBuilder<R, T, Shard, Op, S>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchDriverBuilder")
            .field("cfg", &self.cfg)
            .field("order", &self.order)
            .field("requeue", &self.requeue.as_ref().map(|rq| &rq.backoff))
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl<R, T: Transport<Shard, Op>, Shard, Op, S> BatchDriverBuilder<R, T, Shard, Op, S> {
    /// What [`BatchDriver::with_hasher`] builds (concurrent sends, no requeue), built by
    /// `start`.
    pub(super) fn new(
        rt: R,
        transport: T,
        cfg: BatcherConfig,
        hasher: S,
        start: StartFn<R, T, Shard, Op, S>,
    ) -> Self {
        BatchDriverBuilder {
            rt,
            transport,
            cfg,
            hasher,
            order: SendOrder::Concurrent,
            requeue: None,
            limiter: None,
            start,
        }
    }

    /// How the driver hands each shard's batches to the transport (default
    /// [`SendOrder::Concurrent`]).
    pub fn with_send_order(mut self, order: SendOrder) -> Self {
        self.order = order;
        self
    }

    /// Requeues torn batches instead of failing them, pausing their shard for `reconnect`'s
    /// next delay (off by default).
    ///
    /// When a batch fails as a whole with an error the transport classes as a torn stream
    /// ([`Transport::torn`]: the server did not execute it), the driver:
    ///
    /// 1. pauses the batch's shard: nothing more is dispatched to it;
    /// 2. puts the batch back at the head of the shard's order in the batcher
    ///    ([`Batcher::requeue`](crate::Batcher::requeue)), its operations still waiting for
    ///    their results (each resolves once: with the resend's answer, or its timeout);
    /// 3. resumes the shard after the next delay of the shard's reconnect backoff sequence
    ///    (drawn from `reconnect` with a per-driver generator), which sends the requeued
    ///    batch first, then the shard's later ones, in their order.
    ///
    /// The sequence restarts once a batch of the shard is answered. A delay the backoff
    /// refuses (its attempt or time budget spent) fails the torn batch with the transport's
    /// error ([`OpError::Batch`](super::OpError::Batch)) instead. Delivery is at least once:
    /// a batch the server did execute but the transport still called torn runs twice.
    ///
    /// To resend, the driver clones each operation before `send` (the transport consumes
    /// the originals), hence `Op: Clone`; a `clone` that panics fails that batch with
    /// [`OpError::Panicked`](super::OpError::Panicked) before it is sent.
    ///
    /// ```
    #[doc = include_str!("../../doc/tiny_runtime.md")]
    /// use core::time::Duration;
    /// use throttle_sansio::{BackoffConfig, BatcherConfig};
    /// use throttle_sansio::sync::{BatchDriver, BatchOutcome, SendOrder};
    ///
    /// let reconnect = BackoffConfig::grpc_connection();
    /// let send = |_: &u8, puts: Vec<u64>| async move {
    ///     let ok: BatchOutcome<u64, std::io::Error> = Ok(puts.into_iter().map(Ok).collect());
    ///     ok
    /// };
    /// let rt = Tiny::default();
    /// let driver = BatchDriver::builder(rt.clone(), send, BatcherConfig::writes())
    ///     .with_send_order(SendOrder::PerShard)
    ///     .with_requeue(reconnect)
    ///     .build();
    /// assert_eq!(rt.block_on(driver.submit(1, 5)).unwrap(), 5);
    /// driver.close();
    /// ```
    pub fn with_requeue(mut self, reconnect: BackoffConfig) -> Self
    where
        Op: Clone,
    {
        self.requeue = Some(Requeue {
            copy: Op::clone,
            backoff: reconnect,
        });
        self
    }

    /// Sizes each shard's window from what its batches observe (off by default: every shard
    /// keeps the configured window). Each shard gets a [`Limiter`](crate::limiter::Limiter) of
    /// `config` before its first operation is batched, and its window takes the limiter's
    /// initial limit; each batch's end is then one sample (its round trip from the moment it
    /// left, and the shard's batches in flight then), and every new limit becomes the shard's
    /// window limit
    /// ([`DispatchWindow::set_max_in_flight`](crate::DispatchWindow::set_max_in_flight): a
    /// larger one sends held-back batches at once, a smaller one revokes nothing).
    ///
    /// The outcome of a batch for its limiter ([`limiter::BatchEnd`](crate::limiter::BatchEnd)):
    /// answered (whatever each operation's result) is `Ok`; a whole-batch error from the
    /// transport is a drop, and so is the operation timeout if the batch spent at least half of
    /// it in flight (else the deadline went on waiting for a credit); a torn stream, a panic or
    /// an abandoned send says nothing about load and is ignored. The rule lives in
    /// [`limiter::PerShard`](crate::limiter::PerShard), which the simulator drives too.
    ///
    /// Memory: a shard keeps its stored key, its limiter (a few hundred bytes) and its window
    /// entry for as long as the driver lives, once it was used: a driver for a fixed set of
    /// shards stays bounded by it, one whose shard keys come and go grows with them.
    ///
    /// `Err` if `config` is invalid ([`LimiterConfig::validate`]).
    ///
    /// ```
    #[doc = include_str!("../../doc/tiny_runtime.md")]
    /// use throttle_sansio::BatcherConfig;
    /// use throttle_sansio::limiter::{AimdConfig, LimiterConfig};
    /// use throttle_sansio::sync::{BatchDriver, BatchOutcome};
    ///
    /// let send = |_: &u8, gets: Vec<u64>| async move {
    ///     let ok: BatchOutcome<u64, std::io::Error> = Ok(gets.into_iter().map(Ok).collect());
    ///     ok
    /// };
    /// let rt = Tiny::default();
    /// let aimd = LimiterConfig::aimd(AimdConfig::default().with_limits(1, 2, 16));
    /// let driver = BatchDriver::builder(rt.clone(), send, BatcherConfig::reads())
    ///     .with_limiter(aimd)
    ///     .unwrap()
    ///     .build();
    /// assert_eq!(driver.capacity_of(&1), 4, "the configured window until shard 1 is used");
    /// assert_eq!(rt.block_on(driver.submit(1, 5)).unwrap(), 5);
    /// // AIMD's initial 2, then one answered batch with 1 of 2 in flight: in use, + 1.
    /// assert_eq!(driver.capacity_of(&1), 3);
    /// driver.close();
    /// ```
    pub fn with_limiter(mut self, config: LimiterConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        self.limiter = Some(config);
        Ok(self)
    }

    /// Hashes shard keys with `hasher` (as [`BatchDriver::with_hasher`]).
    pub fn with_hasher<S2>(self, hasher: S2) -> BatchDriverBuilder<R, T, Shard, Op, S2>
    where
        S2: BuildHasher + Clone + Send + 'static,
        R: Runtime,
        T: Transport<Shard, Op>,
        Shard: Hash + Eq + Clone + Send + 'static,
        Op: Send + 'static,
    {
        BatchDriverBuilder {
            rt: self.rt,
            transport: self.transport,
            cfg: self.cfg,
            hasher,
            order: self.order,
            requeue: self.requeue,
            limiter: self.limiter,
            start: BatchDriver::start,
        }
    }

    /// The driver, its task spawned on the runtime. Infallible, as [`BatchDriver::new`]: a
    /// [`BatcherConfig`] is valid by construction.
    ///
    /// # Panics
    ///
    /// If the runtime's [`spawn`](Runtime::spawn) panics, as for [`BatchDriver::new`].
    pub fn build(self) -> BatchDriver<R, T, Shard, Op, S> {
        (self.start)(self)
    }
}

/// Where dispatched batches go, kept in the driver's state (under its lock).
pub(super) enum Lanes<Shard, Op> {
    /// Back to the critical section that dispatched them (sent from there).
    Concurrent,
    /// Into their shard's lane, indexed by shard id (`None`: no lane task for that id).
    PerShard(Vec<Option<Lane<Shard, Op>>>),
}

/// One shard's lane: the batches dispatched and not yet taken by its task, and the task's
/// waker while it waits for more.
pub(super) struct Lane<Shard, Op> {
    queue: VecDeque<Outgoing<Shard, Op>>,
    waker: Option<Waker>,
}

/// Lane tasks to start and wake once the lock is dropped.
#[derive(Default)]
pub(super) struct LaneWork {
    start: Vec<ShardId>,
    wake: Vec<Waker>,
}

impl LaneWork {
    pub(super) fn extend(&mut self, more: Self) {
        self.start.extend(more.start);
        self.wake.extend(more.wake);
    }
}

impl<Shard, Op> Lanes<Shard, Op> {
    pub(super) fn new(order: SendOrder) -> Self {
        match order {
            SendOrder::Concurrent => Lanes::Concurrent,
            SendOrder::PerShard => Lanes::PerShard(Vec::new()),
        }
    }

    fn order(&self) -> SendOrder {
        match self {
            Lanes::Concurrent => SendOrder::Concurrent,
            Lanes::PerShard(_) => SendOrder::PerShard,
        }
    }

    /// Under the lock, in dispatch order: `send` is the batch just dispatched to `shard`.
    /// Concurrent: handed back, for the caller to send. Per shard: appended to the shard's
    /// lane; `work` gets the lane's waker, or, for a shard without a lane, the lane to start.
    pub(super) fn route(
        &mut self,
        shard: ShardId,
        send: Outgoing<Shard, Op>,
        work: &mut LaneWork,
    ) -> Option<Outgoing<Shard, Op>> {
        let Lanes::PerShard(lanes) = self else {
            return Some(send);
        };
        if lanes.len() <= shard.0 {
            lanes.resize_with(shard.0 + 1, || None);
        }
        match lanes.get_mut(shard.0) {
            Some(Some(lane)) => {
                lane.queue.push_back(send);
                work.wake.extend(lane.waker.take());
            }
            Some(slot) => {
                *slot = Some(Lane {
                    queue: VecDeque::from([send]),
                    waker: None,
                });
                work.start.push(shard);
            }
            // Unreachable: resized above.
            None => return Some(send),
        }
        None
    }

    /// The lane task's look at its queue: moves the queued batches into `into` (in order). An
    /// empty queue stores `waker` for the next `route`, and if the task is also `idle`
    /// (nothing in flight) removes the lane: `false`, the task ends.
    fn take(
        &mut self,
        shard: ShardId,
        into: &mut VecDeque<Outgoing<Shard, Op>>,
        waker: &Waker,
        idle: bool,
    ) -> bool {
        let Lanes::PerShard(lanes) = self else {
            return false;
        };
        let Some(slot) = lanes.get_mut(shard.0) else {
            return false;
        };
        let Some(lane) = slot else {
            return false;
        };
        if !lane.queue.is_empty() {
            core::mem::swap(&mut lane.queue, into);
            return true;
        }
        if idle {
            *slot = None;
            return false;
        }
        if !lane.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            lane.waker = Some(waker.clone());
        }
        true
    }

    /// The dropped lane task's look: the next queued batch, or, with none left, the lane
    /// removed (`None`).
    fn pop_or_remove(&mut self, shard: ShardId) -> Option<Outgoing<Shard, Op>> {
        let Lanes::PerShard(lanes) = self else {
            return None;
        };
        let slot = lanes.get_mut(shard.0)?;
        let next = slot.as_mut().and_then(|lane| lane.queue.pop_front());
        if next.is_none() {
            *slot = None;
        }
        next
    }
}

/// A send future as the lane keeps it (boxed: its type is the transport's unnameable one),
/// raced against the operation timeout.
type SendFuture<T, Shard, Op> = Pin<
    Box<
        dyn Future<
                Output = Raced<
                    <T as Transport<Shard, Op>>::Output,
                    <T as Transport<Shard, Op>>::Error,
                >,
            > + Send,
    >,
>;

/// One batch in the transport: its credit's guard, its size, its future.
struct Flight<P: Parts> {
    guard: SendGuard<P>,
    ops: usize,
    future: SendFuture<P::T, P::Shard, P::Op>,
    /// The copy kept for a resend (requeue on).
    kept: Option<Kept<P::Shard, P::Op>>,
}

/// A shard's lane task: owns the lane entry from its start until it removes it.
pub(super) struct LaneRun<P: Parts> {
    driver: DriverOf<P>,
    shard: ShardId,
    /// The shard's batches in the transport, in dispatch order.
    flights: VecDeque<Flight<P>>,
    /// Batches just taken from the lane, to send (kept for its allocation).
    taken: VecDeque<Outgoing<P::Shard, P::Op>>,
    /// The task removed its lane entry and ended: nothing is left for `Drop`.
    ended: bool,
}

impl<R, T: Transport<Shard, Op>, Shard, Op, S> BatchDriver<R, T, Shard, Op, S> {
    /// How this driver hands each shard's batches to the transport.
    pub fn send_order(&self) -> SendOrder {
        lock(&self.shared.state).lanes.order()
    }
}

impl<P: Parts> LaneRun<P> {
    /// After unlock: wakes the lanes given more batches, and starts the new ones on `driver`'s
    /// runtime. A `spawn` that panics is caught: it dropped the lane task, whose `Drop`
    /// released the lane's batches.
    pub(super) fn carry(driver: &DriverOf<P>, work: &mut LaneWork) {
        for waker in work.wake.drain(..) {
            wake_one(waker);
        }
        for shard in work.start.drain(..) {
            let lane = LaneRun::<P> {
                driver: driver.clone(),
                shard,
                flights: VecDeque::new(),
                taken: VecDeque::new(),
                ended: false,
            };
            let task = lane.run();
            let _refused = unwind::call(|| driver.shared.rt.spawn(task));
        }
    }

    async fn run(mut self) {
        core::future::poll_fn(|cx| self.poll_lane(cx)).await;
    }

    /// Takes the lane's new batches and sends them in order, then polls every batch in flight
    /// front to back; again while either made progress. Ready once the lane is removed.
    fn poll_lane(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let live = {
                let mut st = lock(&self.driver.shared.state);
                let idle = self.flights.is_empty();
                st.lanes.take(self.shard, &mut self.taken, cx.waker(), idle)
            };
            if !live {
                self.ended = true;
                return Poll::Ready(());
            }
            let mut progressed = !self.taken.is_empty();
            while let Some(out) = self.taken.pop_front() {
                let guard = SendGuard {
                    driver: self.driver.clone(),
                    credit: Some(out.credit),
                };
                let Prepared {
                    key,
                    ops,
                    kept,
                    deadline,
                    ..
                } = match self.driver.prepare(out) {
                    Ok(ready) => ready,
                    Err((_, ending)) => {
                        guard.finish(ending);
                        continue;
                    }
                };
                let n = ops.len();
                let shared = &self.driver.shared;
                match unwind::call(|| shared.transport.send(&key, ops)) {
                    Ok(sending) => {
                        let timer = deadline.map(|at| shared.rt.sleep_until(at));
                        self.flights.push_back(Flight {
                            guard,
                            ops: n,
                            future: Box::pin(race(sending, timer)),
                            kept,
                        });
                    }
                    Err(Panicked) => guard.finish(Ending::Panicked),
                }
            }
            let mut i = 0;
            while let Some(flight) = self.flights.get_mut(i) {
                let outcome = match unwind::call(|| flight.future.as_mut().poll(cx)) {
                    Ok(Poll::Pending) => {
                        i += 1;
                        continue;
                    }
                    Ok(Poll::Ready(outcome)) => Ok(outcome),
                    Err(panicked) => Err(panicked),
                };
                progressed = true;
                if let Some(done) = self.flights.remove(i) {
                    let Flight {
                        guard,
                        ops,
                        future,
                        kept,
                    } = done;
                    drop(future);
                    let ending = self.driver.ending(outcome, ops, kept);
                    guard.finish(ending);
                }
            }
            if !progressed {
                return Poll::Pending;
            }
        }
    }
}

impl<P: Parts> Drop for LaneRun<P> {
    /// Dropped unfinished (the runtime shut down, or refused the task): every batch it held is
    /// released by its guard, then every batch still in its lane, until the lane is empty and
    /// removed.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        for flight in self.flights.drain(..) {
            let Flight { guard, future, .. } = flight;
            drop(future);
            drop(guard);
        }
        let driver = self.driver.clone();
        let unsent = self.taken.drain(..);
        let mut release = |batch: Outgoing<P::Shard, P::Op>| {
            let Outgoing {
                key, credit, ops, ..
            } = batch;
            drop((key, ops));
            drop(SendGuard::<P> {
                driver: driver.clone(),
                credit: Some(credit),
            });
        };
        unsent.for_each(&mut release);
        loop {
            let next = lock(&self.driver.shared.state)
                .lanes
                .pop_or_remove(self.shard);
            match next {
                Some(batch) => release(batch),
                None => break,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::WindowConfig;
    use crate::sync::test_support::{
        CountingWaker, Executor, RefusingRuntime, Sends, TestRuntime, poll_once,
    };
    use crate::sync::{BatchOutcome, OpError};
    use crate::test_hasher::TestHasher;
    use core::num::NonZeroUsize;
    use std::sync::Arc as StdArc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    type Answered = core::future::Ready<BatchOutcome<u32, &'static str>>;

    /// A transport answering every batch at once, counting in `sent` the batches it was sent.
    fn echo(sent: &StdArc<AtomicUsize>) -> Sends<impl Fn(Vec<u32>) -> Answered + use<>> {
        let count = StdArc::clone(sent);
        Sends::new(move |ops: Vec<u32>| {
            count.fetch_add(1, Ordering::SeqCst);
            core::future::ready(Ok(ops.into_iter().map(Ok).collect()))
        })
    }

    #[test]
    fn a_lane_task_the_runtime_refuses_releases_every_batch_of_its_lane_and_starts_no_other() {
        let mut exec = Executor::default();
        let rt = RefusingRuntime::new(&mut exec);
        let spawns = StdArc::clone(&rt.spawns);
        let sent = StdArc::new(AtomicUsize::new(0));
        let cfg = BatcherConfig::reads()
            .with_max_requests_per_batch(NonZeroUsize::MIN)
            .with_window(WindowConfig::default().with_max_in_flight(2))
            .expect("a window above 0 is valid");
        let driver = BatchDriver::builder(rt, echo(&sent), cfg)
            .with_send_order(SendOrder::PerShard)
            .with_hasher(TestHasher::default())
            .build();
        // Three batches of one: two take the shard's credits and go to its lane, the third
        // waits in the window until a credit comes back (then into the same lane).
        let mut submits: Vec<_> = (0..3).map(|op| driver.submit(1, op)).collect();
        exec.run_until_stalled();
        let (w, _) = CountingWaker::new();
        for (op, s) in submits.iter_mut().enumerate() {
            assert!(
                matches!(poll_once(s, &w), Poll::Ready(Err(OpError::NoResponse))),
                "op {op}"
            );
        }
        assert_eq!(
            (driver.in_flight(&1), driver.open_ops(&1), driver.queued()),
            (0, 0, 0),
            "every credit back"
        );
        assert_eq!(
            sent.load(Ordering::SeqCst),
            0,
            "nothing sent from a destructor"
        );
        assert_eq!(
            spawns.load(Ordering::SeqCst),
            2,
            "the driver task and one lane task: no lane started from the drop"
        );
        assert_eq!(exec.run_until_stalled(), 1, "the driver task lives on");
        driver.close();
        assert_eq!(exec.run_until_stalled(), 0);
    }

    #[test]
    fn a_lane_ends_when_its_shard_is_idle_and_a_later_batch_starts_a_new_one() {
        let mut exec = Executor::default();
        let mut rt = TestRuntime::new();
        rt.spawner = Some(exec.spawner());
        let sent = StdArc::new(AtomicUsize::new(0));
        let driver = BatchDriver::builder(rt, echo(&sent), BatcherConfig::reads())
            .with_send_order(SendOrder::PerShard)
            .with_hasher(TestHasher::default())
            .build();
        let (w, _) = CountingWaker::new();
        for op in [1, 2] {
            let mut s = driver.submit(7, op);
            assert_eq!(
                exec.run_until_stalled(),
                1,
                "op {op}: only the driver task left"
            );
            assert!(matches!(poll_once(&mut s, &w), Poll::Ready(Ok(v)) if v == op));
        }
        assert_eq!(sent.load(Ordering::SeqCst), 2);
        let st = lock(&driver.shared.state);
        let Lanes::PerShard(lanes) = &st.lanes else {
            panic!("built per shard");
        };
        assert!(lanes.iter().all(Option::is_none), "no lane left behind");
        drop(st);
        driver.close();
        assert_eq!(exec.run_until_stalled(), 0);
    }
}
