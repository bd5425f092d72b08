//! [`WriteDriver`]: the core [`PacedWriter`] run as a task, for many producers at once.
//!
//! `append(bucket, record, bytes)` hands the record to the writer and returns a future of its
//! result. The driver's sender task (spawned on the runtime) drains the writer after every
//! input, sends each request through the user's async send closure in a task of its own,
//! sorts each batch's answer with the user's [`WriteClassifier`], and sleeps until the
//! writer's `poll_timeout` (woken early by any input). Every decision (batching, leader-first
//! readiness, parking gated and probing buckets, retries, `max_retries`) is the core machine's;
//! this file is locks, wakers and glue.
//!
//! The driver owns the clock (its [`Runtime`]) and a jitter generator seeded per client
//! ([`client_rng`](super::client_rng) with a fresh [`next_client_id`](super::next_client_id)).
//!
//! User code that panics (the send closure or its future, the classifier, a record's `Clone`
//! for a send, a bucket's `Hash` or `Eq` in `append`, the refresh callback) fails only the
//! records it was working on with [`WriteError::Panicked`]: the panic is caught where the
//! driver calls that code, a batch whose answer cannot be fed is ended as `Fatal` (a path of
//! the writer that runs no user code), and each send task owns its batches in a guard, so a
//! task the runtime drops unfinished ends them too ([`WriteError::NoResponse`]).

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;
use core::future::Future;
use core::hash::{BuildHasher, Hash};
use core::pin::Pin;
use core::task::{Context, Poll};

use super::classify::WriteClassifier;
use super::events::{EventSink, EventTap, Observed, ObservedGuard, lock_observed};
use super::loom::{Arc, Mutex, lock};
use super::oneshot::{self, Receiver, Sender};
use super::signal::{WakeSignal, sleep_or_changed, wait_for};
use super::unwind;
use super::{Panicked, Runtime, client_rng, next_client_id};
use crate::error::ConfigError;
use crate::paced_writer::{
    AppendRefused, BatchId, FailCause, PacedWriter, PacedWriterConfig, WriteOutcome, WriterAction,
};
use crate::rng::SplitMix64;
use crate::time::Instant;
use crate::write_gate::GateEvent;

/// One batch as the send closure gets it: its bucket, copies of its records (in append order)
/// and how often it was rejected before.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SendBatch<B, R> {
    /// The bucket.
    pub bucket: B,
    /// The records, in append order.
    pub records: Vec<R>,
    /// Earlier sends of this batch, each answered with a rejection: 0 on the first send, so
    /// also the retries so far (Fluss's `ProducerBatch::attempts`, compared with
    /// `max_retries`).
    pub attempts: u32,
}

/// Why a record was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The paced writer gave the record's batch up (`source()` says why: retries exhausted,
    /// a fatal answer, or the driver closed).
    #[error("the record's batch was not written")]
    Failed(#[source] FailCause),
    /// User code the record depended on panicked: the send closure or its future, the
    /// classifier, a record's `Clone` for its batch, or the bucket's `Hash`/`Eq` in
    /// [`WriteDriver::append`].
    #[error("the record's write failed in user code")]
    Panicked(#[source] Panicked),
    /// The send task of the record's batch was dropped before the answer came (the runtime
    /// shut down).
    #[error("no answer came for the record's batch")]
    NoResponse,
}

type RecordResult = Result<(), WriteError>;

/// The future of [`WriteDriver::append`]: the record's result. Cancel-safe (the record is
/// still written; its result is dropped).
#[must_use = "futures do nothing unless polled"]
pub struct Append {
    rx: Receiver<RecordResult>,
}

impl fmt::Debug for Append {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Append").finish_non_exhaustive()
    }
}

impl Future for Append {
    type Output = RecordResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<RecordResult> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(WriteError::NoResponse)))
    }
}

fn ready(result: RecordResult) -> Append {
    let (tx, rx) = oneshot::channel();
    tx.send(result);
    Append { rx }
}

/// A record inside the writer: the user's record and its producer's slot.
struct Entry<R> {
    record: R,
    tx: Sender<RecordResult>,
}

type BoxedSend<B, N, R, Resp> = Box<
    dyn Fn(N, Vec<SendBatch<B, R>>) -> Pin<Box<dyn Future<Output = Vec<Resp>> + Send>>
        + Send
        + Sync,
>;

/// The refresh callback, sized so that it fits the loom shim's `Arc` (which cannot coerce to
/// a trait object).
struct RefreshFn<B>(Box<dyn Fn(B) + Send + Sync>);

type Refresh<B> = Arc<RefreshFn<B>>;

struct State<B, N, R, S> {
    writer: PacedWriter<B, N, Entry<R>, S>,
    rng: SplitMix64,
    /// Send tasks that have not reported their answers yet.
    sending: usize,
    /// Critical sections whose results are still being handed out after unlock.
    delivering: usize,
    /// Buckets reported for a refresh before a callback was set.
    unknown: Vec<B>,
    refresh: Option<Refresh<B>>,
}

impl<B, N, R, S> State<B, N, R, S> {
    fn is_drained(&self) -> bool
    where
        B: Hash + Eq + Clone,
        N: Hash + Eq + Clone,
        S: BuildHasher + Clone,
    {
        self.writer.is_closed()
            && self.writer.pending_batches() == 0
            && self.sending == 0
            && self.delivering == 0
    }
}

impl<B, N, R, S> Observed for State<B, N, R, S>
where
    B: Hash + Eq + Clone,
    N: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    type Event = GateEvent<B>;

    fn poll_event(&mut self) -> Option<GateEvent<B>> {
        self.writer.poll_event()
    }

    fn has_events(&self) -> bool {
        self.writer.has_events()
    }
}

struct Shared<Rt, B, N, R, Resp, S> {
    rt: Rt,
    send: BoxedSend<B, N, R, Resp>,
    classifier: Box<dyn WriteClassifier<Resp>>,
    state: Mutex<State<B, N, R, S>>,
    /// The sink of the writer's gate events.
    tap: EventTap<GateEvent<B>>,
    /// Notified on every input: the sender task drains again.
    input: WakeSignal,
    /// Notified when the closed driver's last batch has ended: [`WriteDriver::closed`].
    drained: WakeSignal,
}

impl<Rt, B, N, R, Resp, S> Shared<Rt, B, N, R, Resp, S>
where
    B: Hash + Eq + Clone,
    N: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    /// The lock of every critical section that feeds the writer: its gate's events reach the
    /// sink once it is dropped. Queries take the plain lock.
    fn lock(&self) -> ObservedGuard<'_, State<B, N, R, S>> {
        lock_observed(&self.state, &self.tap)
    }
}

/// One request to send: the node, the batches' ids, and the batches.
type Request<B, N, R> = (N, Vec<BatchId>, Vec<SendBatch<B, R>>);

/// What a critical section decided, carried out after the lock is dropped.
struct Effects<B, N, R> {
    /// Requests to send.
    requests: Vec<Request<B, N, R>>,
    /// Results to hand to producers.
    done: Vec<(Sender<RecordResult>, RecordResult)>,
    refresh: Vec<B>,
}

impl<B, N, R> Effects<B, N, R> {
    fn new() -> Self {
        Effects {
            requests: Vec::new(),
            done: Vec::new(),
            refresh: Vec::new(),
        }
    }
}

/// How a request's send ended, as its task reports it.
enum Answer<Resp> {
    /// The closure's future resolved: one answer per batch, by position (missing ones are
    /// retriable).
    Answered(Vec<Resp>),
    /// The closure or its future panicked.
    Panicked,
    /// The task was dropped first.
    Abandoned,
}

/// A paced writer client: the core [`PacedWriter`] driven by its own sender task, sending
/// through one async closure. `Clone + Send + Sync`; clones append to the same writer.
///
/// # Contract
///
/// - [`append(bucket, record, bytes)`](Self::append) queues the record at once and returns an
///   [`Append`] future of its result: `Ok(())` once its batch is acked, else a
///   [`WriteError`].
/// - The sender task drains the writer after every input and at the writer's
///   `poll_timeout`; a bucket the gate holds back (closed or probing) is not asked again
///   before its instant, so the task never spins. Each request (the batches of one drain for
///   one leader) goes to `send(node, batches)` in a task of its own; its future resolves to one
///   response per batch, by position, which the [`WriteClassifier`] sorts. A missing response
///   counts as a retriable error.
/// - Leaders: [`set_leader`](Self::set_leader) feeds metadata; a bucket with records and no
///   known leader is handed to the callback of
///   [`on_leader_unknown`](Self::on_leader_unknown) (once per unknown-leader episode), which
///   should refresh metadata and call `set_leader`.
/// - [`close`](Self::close): later appends fail with [`FailCause::Closed`], every record not
///   yet sent fails likewise, batches in flight still take their answer (a rejection then
///   fails instead of retrying); [`closed`](Self::closed) resolves once every send has ended
///   and every result is delivered. Until `close`, the sender task lives on.
/// - User code that panics fails only its records (see the module docs); the driver keeps
///   serving.
///
/// ```
/// use throttle_sansio::paced_writer::{PacedWriterConfig, WriteOutcome};
/// use throttle_sansio::sync::{SendBatch, WriteDriver};
/// use throttle_sansio::Signal;
/// # use throttle_sansio::sync::{ManualClock, Runtime};
/// # #[derive(Clone)] struct Rt(ManualClock);
/// # impl Runtime for Rt {
/// #     fn now(&self) -> throttle_sansio::Instant { self.0.now() }
/// #     fn sleep_until(&self, d: throttle_sansio::Instant) -> impl core::future::Future<Output = ()> + Send + 'static { self.0.sleep_until(d) }
/// #     fn spawn<F: core::future::Future<Output = ()> + Send + 'static>(&self, f: F) { drop(f) }
/// # }
/// # let rt = Rt(ManualClock::new());
/// // Buckets u32, leaders u16, records Vec<u8>; the server answers a status code per batch.
/// let driver: WriteDriver<_, u32, u16, Vec<u8>, u8> = WriteDriver::new(
///     rt,
///     PacedWriterConfig::default(),
///     |node: u16, batches: Vec<SendBatch<u32, Vec<u8>>>| async move {
///         let _ = (node, &batches); // put them on the wire
///         vec![0u8; batches.len()]
///     },
///     |status: &u8| match status {
///         0 => WriteOutcome::Ok { pressure: Signal::Clear },
///         1 => WriteOutcome::DiskWriteLocked,
///         _ => WriteOutcome::Retriable,
///     },
/// )?;
/// driver.set_leader(7, Some(1));
/// let written = driver.append(7, b"hello".to_vec(), 5); // await it for the result
/// # drop(written);
/// driver.close();
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
pub struct WriteDriver<Rt, B, N, R, Resp, S = std::hash::RandomState> {
    shared: Arc<Shared<Rt, B, N, R, Resp, S>>,
}

impl<Rt, B, N, R, Resp, S> Clone for WriteDriver<Rt, B, N, R, Resp, S> {
    fn clone(&self) -> Self {
        WriteDriver {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Rt, B, N, R, Resp, S> fmt::Debug for WriteDriver<Rt, B, N, R, Resp, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteDriver").finish_non_exhaustive()
    }
}

impl<Rt, B, N, R, Resp> WriteDriver<Rt, B, N, R, Resp, std::hash::RandomState> {
    /// A driver writing with `cfg`, sending through `send`, sorting answers with
    /// `classifier`, buckets and nodes hashed with a fresh std
    /// [`RandomState`](std::hash::RandomState); its sender task is spawned on `rt`. Refuses
    /// an invalid config.
    ///
    /// # Panics
    ///
    /// If `rt`'s [`spawn`](Runtime::spawn) panics (`throttle_tokio::TokioRuntime` outside a
    /// tokio runtime). Nothing is left behind then.
    pub fn new<F, Fut, C>(
        rt: Rt,
        cfg: PacedWriterConfig,
        send: F,
        classifier: C,
    ) -> Result<Self, ConfigError>
    where
        Rt: Runtime,
        F: Fn(N, Vec<SendBatch<B, R>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Resp>> + Send + 'static,
        C: WriteClassifier<Resp>,
        B: Hash + Eq + Clone + Send + Sync + 'static,
        N: Hash + Eq + Clone + Send + Sync + 'static,
        R: Clone + Send + 'static,
        Resp: Send + 'static,
    {
        Self::with_hasher(rt, cfg, send, classifier, std::hash::RandomState::new())
    }
}

impl<Rt, B, N, R, Resp, S> WriteDriver<Rt, B, N, R, Resp, S>
where
    Rt: Runtime,
    B: Hash + Eq + Clone + Send + Sync + 'static,
    N: Hash + Eq + Clone + Send + Sync + 'static,
    R: Clone + Send + 'static,
    Resp: Send + 'static,
    S: BuildHasher + Clone + Send + 'static,
{
    /// As [`new`](WriteDriver::new), hashing buckets and nodes with `hasher`.
    ///
    /// # Panics
    ///
    /// If `rt`'s [`spawn`](Runtime::spawn) panics, as for `new`.
    pub fn with_hasher<F, Fut, C>(
        rt: Rt,
        cfg: PacedWriterConfig,
        send: F,
        classifier: C,
        hasher: S,
    ) -> Result<Self, ConfigError>
    where
        F: Fn(N, Vec<SendBatch<B, R>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Resp>> + Send + 'static,
        C: WriteClassifier<Resp>,
    {
        let writer = PacedWriter::with_hasher(cfg, hasher)?;
        let send: BoxedSend<B, N, R, Resp> = Box::new(move |node, batches| {
            let fut: Pin<Box<dyn Future<Output = Vec<Resp>> + Send>> =
                Box::pin(send(node, batches));
            fut
        });
        let driver = WriteDriver {
            shared: Arc::new(Shared {
                rt,
                send,
                classifier: Box::new(classifier),
                state: Mutex::new(State {
                    writer,
                    rng: client_rng(next_client_id()),
                    sending: 0,
                    delivering: 0,
                    unknown: Vec::new(),
                    refresh: None,
                }),
                input: WakeSignal::new(),
                drained: WakeSignal::new(),
                tap: EventTap::default(),
            }),
        };
        let task = driver.clone();
        driver.shared.rt.spawn(async move { task.run().await });
        Ok(driver)
    }

    /// Queues `record` (`bytes` long) for `bucket`; the future resolves with its result.
    ///
    /// The bucket's `Hash` and `Eq` run here; a panic in them fails this record with
    /// [`WriteError::Panicked`] and queues nothing. After [`close`](Self::close) the record
    /// fails with [`FailCause::Closed`].
    pub fn append(&self, bucket: B, record: R, bytes: u64) -> Append {
        let (tx, rx) = oneshot::channel();
        let now = self.shared.rt.now();
        let refused = {
            let mut st = self.shared.lock();
            let entry = Entry { record, tx };
            match unwind::call(|| st.writer.append(now, bucket, entry, bytes)) {
                Ok(Ok(())) => None,
                Ok(Err(AppendRefused(entry))) => {
                    Some((entry.tx, Err(WriteError::Failed(FailCause::Closed))))
                }
                // The entry went down with the panic; this record's future gets its own answer.
                Err(Panicked) => return ready(Err(WriteError::Panicked(Panicked))),
            }
        };
        match refused {
            Some((tx, result)) => tx.send(result),
            None => self.shared.input.notify(),
        }
        Append { rx }
    }

    /// `bucket`'s leader is `leader` (`None`: unknown). The sender task looks at the bucket
    /// again at once.
    ///
    /// # Panics
    ///
    /// If the bucket's or node's `Hash`, `Eq` or `Clone` panics: the panic reaches the caller
    /// and the writer is as it was before the call.
    pub fn set_leader(&self, bucket: B, leader: Option<N>) {
        let now = self.shared.rt.now();
        self.shared.lock().writer.set_leader(now, bucket, leader);
        self.shared.input.notify();
    }

    /// Calls `refresh(bucket)` for every bucket that has records and no known leader (once per
    /// unknown-leader episode, from the sender task, with no lock held), including those
    /// reported before this call. The callback should refresh metadata and call
    /// [`set_leader`](Self::set_leader). A panic in it is caught and dropped. Replaces an
    /// earlier callback.
    pub fn on_leader_unknown(&self, refresh: impl Fn(B) + Send + Sync + 'static) {
        let refresh: Refresh<B> = Arc::new(RefreshFn(Box::new(refresh)));
        let pending = {
            let mut st = lock(&self.shared.state);
            st.refresh = Some(Arc::clone(&refresh));
            core::mem::take(&mut st.unknown)
        };
        for bucket in pending {
            let _ = unwind::call(|| (refresh.0)(bucket));
        }
    }

    /// Stops intake (later appends fail with [`FailCause::Closed`]), fails every record not
    /// yet sent likewise, and lets the batches in flight end on their answers. Idempotent.
    pub fn close(&self) {
        let done = {
            let mut st = self.shared.lock();
            st.writer.close();
            let mut effects = Effects::new();
            collect(&mut *st, &mut effects);
            st.delivering += 1;
            effects.done
        };
        for (tx, result) in done {
            tx.send(result);
        }
        self.delivered();
        self.shared.input.notify();
    }

    /// Resolves once the driver is closed, every send has ended and every result has been
    /// handed out: `driver.close(); driver.closed().await` is a graceful shutdown. Cancel-safe.
    pub async fn closed(&self) {
        wait_for(&self.shared.drained, || {
            lock(&self.shared.state).is_drained()
        })
        .await;
    }

    /// Replaces the jitter generator (seeded per client at construction) with one seeded
    /// from `seed`, as [`FailoverExecutor::reseed`](super::FailoverExecutor::reseed) does:
    /// two drivers given the same seed and the same answers at the same instants draw the
    /// same backoff delays.
    pub fn reseed(&self, seed: u64) {
        lock(&self.shared.state).rng = SplitMix64::new(seed);
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        lock(&self.shared.state).writer.is_closed()
    }

    /// Batches queued or in flight.
    pub fn pending_batches(&self) -> usize {
        lock(&self.shared.state).writer.pending_batches()
    }

    /// Batches in flight (sent, not yet answered).
    pub fn in_flight(&self) -> usize {
        lock(&self.shared.state).writer.in_flight()
    }

    /// Sends the writer's gate events ([`GateEvent`]: each gate an answer installed, with
    /// its reason, delay, attempt and opening, and each `Wake`) to `sink`, for every clone,
    /// replacing any sink set before, and turns them on (they are off until then, and cost
    /// nothing). The sink is called as
    /// [`GateHandle::set_event_sink`](super::GateHandle::set_event_sink) describes: outside
    /// the lock, once per event, in order, with a panic caught and counted
    /// ([`event_sink_panics`](Self::event_sink_panics)), before the records that input ended
    /// are handed out.
    pub fn set_event_sink(&self, sink: impl EventSink<GateEvent<B>> + 'static) {
        self.install_sink(Some(std::sync::Arc::new(sink)));
    }

    /// Removes the event sink and turns the writer's gate events off again.
    pub fn clear_event_sink(&self) {
        self.install_sink(None);
    }

    fn install_sink(&self, sink: Option<std::sync::Arc<dyn EventSink<GateEvent<B>>>>) {
        self.shared.tap.install(
            core::slice::from_ref(&self.shared.state),
            sink,
            |st, capacity| {
                st.writer.set_event_capacity(capacity);
            },
        );
    }

    /// Events the sink panicked on (each one lost; nothing else changed).
    pub fn event_sink_panics(&self) -> u64 {
        self.shared.tap.panics()
    }

    /// Events lost before a sink saw them: to the gate's bound before the driver drained
    /// them, or delivered just after a [`clear_event_sink`](Self::clear_event_sink).
    pub fn events_dropped(&self) -> u64 {
        let dropped = lock(&self.shared.state).writer.events_dropped();
        dropped.saturating_add(self.shared.tap.unseen())
    }

    /// The sender task: drain, carry out, sleep until the writer's wake or the next input.
    async fn run(self) {
        loop {
            let epoch = self.shared.input.epoch();
            let (effects, deadline, stop) = {
                let mut st = self.shared.lock();
                let now = self.shared.rt.now();
                st.writer.handle_timeout(now);
                st.writer.drain(now);
                let mut effects = Effects::new();
                collect(&mut *st, &mut effects);
                st.sending += effects.requests.len();
                st.delivering += 1;
                let stop = st.writer.is_closed() && st.writer.pending_batches() == 0;
                (effects, st.writer.poll_timeout(), stop)
            };
            self.apply(effects);
            self.delivered();
            if stop {
                return;
            }
            let mut changed = self.shared.input.changed(epoch);
            match deadline {
                Some(at) => sleep_or_changed(&self.shared.rt, at, &mut changed).await,
                None => changed.await,
            }
        }
    }

    /// Carries out a critical section's decisions: results to producers, refreshes to the
    /// callback, requests to the send closure (each in its own task).
    fn apply(&self, effects: Effects<B, N, R>) {
        for (tx, result) in effects.done {
            tx.send(result);
        }
        if !effects.refresh.is_empty() {
            let refresh = {
                let mut st = lock(&self.shared.state);
                match st.refresh.clone() {
                    Some(f) => Some(f),
                    None => {
                        st.unknown.extend(effects.refresh.iter().cloned());
                        None
                    }
                }
            };
            if let Some(refresh) = refresh {
                for bucket in effects.refresh {
                    let _ = unwind::call(|| (refresh.0)(bucket));
                }
            }
        }
        for (node, ids, batches) in effects.requests {
            match unwind::call(|| (self.shared.send)(node, batches)) {
                Ok(sending) => self.spawn_send(ids, sending),
                Err(Panicked) => self.report(ids, Answer::Panicked),
            }
        }
    }

    /// Spawns the task awaiting one request; its guard reports the batches if the task is
    /// dropped first, or if `spawn` panics.
    fn spawn_send(
        &self,
        ids: Vec<BatchId>,
        sending: Pin<Box<dyn Future<Output = Vec<Resp>> + Send>>,
    ) {
        let guard = SendGuard {
            driver: self.clone(),
            ids: Some(ids),
            report: Self::report,
        };
        let task = async move {
            let mut guard = guard;
            guard.report(match unwind::catch(sending).await {
                Ok(responses) => Answer::Answered(responses),
                Err(Panicked) => Answer::Panicked,
            });
        };
        let _refused = unwind::call(|| self.shared.rt.spawn(task));
    }

    /// Feeds one request's answers to the writer and hands out the batches that ended.
    fn report(&self, ids: Vec<BatchId>, answer: Answer<Resp>) {
        // The classifier is user code: run it before the lock, caught.
        let outcomes: Vec<Result<WriteOutcome, WriteError>> = match &answer {
            Answer::Answered(responses) => (0..ids.len())
                .map(|i| match responses.get(i) {
                    Some(resp) => unwind::call(|| self.shared.classifier.classify(resp))
                        .map_err(WriteError::Panicked),
                    None => Ok(WriteOutcome::Retriable),
                })
                .collect(),
            Answer::Panicked => ids
                .iter()
                .map(|_| Err(WriteError::Panicked(Panicked)))
                .collect(),
            Answer::Abandoned => ids.iter().map(|_| Err(WriteError::NoResponse)).collect(),
        };
        drop(answer);
        let done = {
            let mut guard = self.shared.lock();
            let st = &mut *guard;
            let now = self.shared.rt.now();
            let mut done = Vec::new();
            for (id, outcome) in ids.into_iter().zip(outcomes) {
                let (outcome, error) = match outcome {
                    Ok(o) => (o, None),
                    Err(e) => (WriteOutcome::Fatal, Some(e)),
                };
                let fed = unwind::call(|| st.writer.handle_response(now, id, outcome, &mut st.rng));
                let error = match fed {
                    Ok(_) => error,
                    Err(Panicked) => {
                        // The bucket's key panicked inside the gate: end the batch as `Fatal`,
                        // which feeds the gate nothing and so runs no user code.
                        let _ =
                            st.writer
                                .handle_response(now, id, WriteOutcome::Fatal, &mut st.rng);
                        Some(WriteError::Panicked(Panicked))
                    }
                };
                while let Some(action) = st.writer.poll_action() {
                    end(action, error, &mut done);
                }
            }
            st.sending = st.sending.saturating_sub(1);
            st.delivering += 1;
            done
        };
        for (tx, result) in done {
            tx.send(result);
        }
        self.delivered();
        // The batches' buckets may send again.
        self.shared.input.notify();
    }

    /// Ends one delivery counted under the lock; notifies `closed()` if that drained the
    /// driver.
    fn delivered(&self) {
        let drained = {
            let mut st = lock(&self.shared.state);
            st.delivering = st.delivering.saturating_sub(1);
            st.is_drained()
        };
        self.shared.drained.notify_if(drained);
    }
}

/// Drains the writer's actions into effects (under the lock). A record whose `Clone` panics
/// while its batch is copied for the send fails the batch as `Fatal` with
/// [`WriteError::Panicked`].
fn collect<B, N, R, S>(st: &mut State<B, N, R, S>, effects: &mut Effects<B, N, R>)
where
    B: Hash + Eq + Clone,
    N: Hash + Eq + Clone,
    R: Clone,
    S: BuildHasher + Clone,
{
    let mut request = None;
    let mut broken = Vec::new();
    while let Some(action) = st.writer.poll_action() {
        match action {
            WriterAction::Send {
                request: r,
                node,
                bucket,
                batch: id,
            } => {
                let copied = st.writer.batch(id).map(|b| {
                    let attempts = b.attempts();
                    unwind::call(|| b.records().iter().map(|e| e.record.clone()).collect()).map(
                        |records| SendBatch {
                            bucket,
                            records,
                            attempts,
                        },
                    )
                });
                match copied {
                    Some(Ok(batch)) => match effects.requests.last_mut() {
                        Some((_, ids, batches)) if request == Some(r) => {
                            ids.push(id);
                            batches.push(batch);
                        }
                        _ => {
                            request = Some(r);
                            effects
                                .requests
                                .push((node, alloc::vec![id], alloc::vec![batch]));
                        }
                    },
                    _ => broken.push(id),
                }
            }
            WriterAction::RefreshLeader { bucket } => effects.refresh.push(bucket),
            other => end(other, None, &mut effects.done),
        }
    }
    for id in broken {
        // `Fatal` feeds the gate nothing: no user code runs.
        let _ = st
            .writer
            .handle_response(Instant::ZERO, id, WriteOutcome::Fatal, &mut st.rng);
        while let Some(action) = st.writer.poll_action() {
            end(
                action,
                Some(WriteError::Panicked(Panicked)),
                &mut effects.done,
            );
        }
    }
}

/// The results of an ended batch's records (`error` overrides a failure's cause).
fn end<B, N, R>(
    action: WriterAction<B, N, Entry<R>>,
    error: Option<WriteError>,
    done: &mut Vec<(Sender<RecordResult>, RecordResult)>,
) {
    let (batch, result) = match action {
        WriterAction::Acked { batch } => (batch, Ok(())),
        WriterAction::Failed { batch, cause } => {
            (batch, Err(error.unwrap_or(WriteError::Failed(cause))))
        }
        _ => return,
    };
    for entry in batch.into_records() {
        done.push((entry.tx, result));
    }
}

/// One request's batches: reported exactly once, by the task when the closure's future
/// resolves, or by `Drop` if the task is dropped first.
struct SendGuard<Rt, B, N, R, Resp, S> {
    driver: WriteDriver<Rt, B, N, R, Resp, S>,
    ids: Option<Vec<BatchId>>,
    /// `WriteDriver::report` for this driver's types, taken where their bounds hold, so that
    /// `Drop` needs none.
    report: ReportFn<Rt, B, N, R, Resp, S>,
}

type ReportFn<Rt, B, N, R, Resp, S> =
    fn(&WriteDriver<Rt, B, N, R, Resp, S>, Vec<BatchId>, Answer<Resp>);

impl<Rt, B, N, R, Resp, S> SendGuard<Rt, B, N, R, Resp, S> {
    /// Reports the request's batches as `answer`, once.
    fn report(&mut self, answer: Answer<Resp>) {
        if let Some(ids) = self.ids.take() {
            (self.report)(&self.driver, ids, answer);
        }
    }
}

impl<Rt, B, N, R, Resp, S> Drop for SendGuard<Rt, B, N, R, Resp, S> {
    fn drop(&mut self) {
        self.report(if std::thread::panicking() {
            Answer::Panicked
        } else {
            Answer::Abandoned
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::Signal;
    use crate::sync::test_support::{Executor, TestRuntime};
    use crate::test_hasher::TestHasher;
    use crate::write_gate::Reason;
    use std::sync::Mutex as StdMutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_sink_sees_the_gate_an_answer_installs_and_nothing_once_cleared() {
        let mut exec = Executor::default();
        let mut rt = TestRuntime::new();
        rt.spawner = Some(exec.spawner());
        let clock = rt.clock.clone();
        // The first send is rejected by disk protection, the next written.
        let sends = Arc::new(AtomicUsize::new(0));
        let s = Arc::clone(&sends);
        let driver = WriteDriver::with_hasher(
            rt,
            PacedWriterConfig::default(),
            move |_node: u32, batches: Vec<SendBatch<u32, u32>>| {
                let n = s.fetch_add(1, Ordering::SeqCst);
                core::future::ready(alloc::vec![n == 0; batches.len()])
            },
            |locked: &bool| {
                if *locked {
                    WriteOutcome::DiskWriteLocked
                } else {
                    WriteOutcome::Ok {
                        pressure: Signal::Clear,
                    }
                }
            },
            TestHasher::default(),
        )
        .unwrap();
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let (log, probe) = (Arc::clone(&seen), driver.clone());
        driver.set_event_sink(move |e: &GateEvent<u32>| {
            // Reading the driver here would deadlock if the sink ran under its lock.
            let _ = probe.pending_batches();
            log.lock().unwrap().push(e.clone());
        });
        driver.set_leader(7, Some(1));
        let done = Arc::new(StdMutex::new(None));
        let (d, f) = (Arc::clone(&done), driver.append(7, 70, 100));
        exec.spawn(async move { *d.lock().unwrap() = Some(f.await) });
        exec.run_until_stalled();
        let got = seen.lock().unwrap().clone();
        assert!(
            matches!(
                &got[..],
                [GateEvent::Installed {
                    bucket: 7,
                    reason: Reason::DISK_WRITE_LOCKED,
                    attempt: Some(0),
                    ..
                }]
            ),
            "{got:?}"
        );
        assert!(done.lock().unwrap().is_none(), "parked behind the gate");
        let GateEvent::Installed { opens_at, .. } = got[0] else {
            unreachable!()
        };
        // The driver's timer is armed at the opening plus the writer's default slack (50 ms):
        // at the opening itself nothing is resent yet.
        clock.advance_to(opens_at);
        exec.run_until_stalled();
        assert!(done.lock().unwrap().is_none(), "coalescing: not yet");
        clock.advance_to(opens_at + core::time::Duration::from_millis(50));
        exec.run_until_stalled();
        assert!(matches!(*done.lock().unwrap(), Some(Ok(_))));
        assert_eq!(sends.load(Ordering::SeqCst), 2);
        // The written answer piggybacks `Clear` on an open bucket: nothing installed.
        assert_eq!(seen.lock().unwrap().len(), 1, "{:?}", seen.lock().unwrap());
        assert_eq!(
            (driver.events_dropped(), driver.event_sink_panics()),
            (0, 0)
        );
        driver.clear_event_sink();
        let (d, f) = (Arc::clone(&done), driver.append(7, 71, 100));
        exec.spawn(async move { *d.lock().unwrap() = Some(f.await) });
        sends.store(0, Ordering::SeqCst); // rejected again, with no sink
        exec.run_until_stalled();
        assert_eq!(seen.lock().unwrap().len(), 1, "cleared: nothing more");
        assert_eq!(driver.events_dropped(), 0);
    }
}
