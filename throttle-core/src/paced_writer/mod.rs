//! The paced writer: per-bucket record accumulation and the send loop's decisions, on top of
//! the [`WriteGate`].
//!
//! It is the sans-IO form of the Fluss writer's accumulator and sender after Fluss PR #4293,
//! reduced to what pacing needs (`docs/paced-writer.md`):
//!
//! - **Accumulator.** Per bucket, a FIFO of batches. A record joins the newest batch while it
//!   has never been sent and the record fits within `batch_bytes`; otherwise it starts a new
//!   batch (a record larger than `batch_bytes` goes alone). Records appended while a bucket is
//!   gated therefore grow its waiting batches instead of adding requests.
//! - **One batch per bucket in flight**, so order within a bucket holds: a rejected batch goes
//!   back to the **front** of its bucket's queue.
//! - **Readiness, leader-first.** A bucket whose leader is unknown is reported once for a
//!   metadata refresh ([`WriterAction::RefreshLeader`]) whether or not it is gated; the
//!   caller answers with [`PacedWriter::set_leader`].
//! - **Drain.** [`PacedWriter::drain`] takes the head batch of every bucket that may send now
//!   and groups them into one request per leader node; a bucket the gate holds back is
//!   *parked* until the instant its gate answer changes ([`WriteGate::reopens_at`]), never
//!   asked again before.
//! - **Probe mode without spinning.** A `Probing` bucket is parked like a closed one, until
//!   its probe state lapses; an answer to its probe (a response for the bucket) looks at it
//!   again. So a loop that drains again and again sends nothing more than the gate allows.
//! - **Sleep, coalesced.** [`PacedWriter::poll_timeout`] is the earliest instant a parked
//!   bucket opens plus the wake slack ([`PacedWriterConfig::with_wake_slack`]), always later
//!   than the last drain; the driver sleeps until then, calls [`PacedWriter::handle_timeout`]
//!   and drains again, sending together every bucket that opened by then. No bucket is sent
//!   before its gate opens, and none waits more than the slack past it.
//! - **Retries.** The writer owns `max_retries`: a batch rejected after that many retries
//!   fails and installs nothing; otherwise the rejection is fed to the gate with the batch's
//!   attempt count before the increment, and the batch is re-queued.
//!
//! See [`PacedWriter`] for the driving contract.

mod config;
#[cfg(test)]
mod tests;

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::hash::{BuildHasher, Hash};

use hashbrown::HashTable;

use crate::backpressure::Signal;
use crate::error::{ConfigError, ReleaseError};
use crate::maintenance::{Maintenance, Peak};
use crate::rng::Rng;
use crate::slab::{Key, Slab};
use crate::time::{Clock, Instant};
use crate::write_gate::heap::{IndexedHeap, MAX_SLOTS};
use crate::write_gate::{GateEvent, GateState, OutcomeFeed, WriteGate};

pub use config::{DEFAULT_WAKE_SLACK_CAP, PacedWriterConfig};

/// A batch in flight: issued by [`PacedWriter::drain`] (in [`WriterAction::Send`]), answered
/// once with [`PacedWriter::handle_response`]. Every send of a batch (each retry) gets a fresh
/// id, so an answer to an earlier attempt is refused. Never reused (the crate's one id rule,
/// `docs/design.md` §2.9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BatchId(Key);

impl BatchId {
    /// The id's number: strictly increasing in issue order within its writer.
    pub const fn id(self) -> u64 {
        self.0.generation
    }
}

/// A batch of records for one bucket, in append order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteBatch<T> {
    records: Vec<T>,
    bytes: u64,
    attempts: u32,
    created: Instant,
}

impl<T> WriteBatch<T> {
    /// The records, in append order.
    pub fn records(&self) -> &[T] {
        &self.records
    }

    /// The records, taken out of the batch.
    pub fn into_records(self) -> Vec<T> {
        self.records
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the batch holds no record (never true for a batch the writer hands out).
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Sum of the records' sizes (saturating).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Earlier sends of this batch, each answered with a rejection: 0 on the first send, so
    /// also the retries so far (Fluss's batch `attempts`, compared with `max_retries`).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// When its first record was appended (the writer's clamped clock).
    pub fn created(&self) -> Instant {
        self.created
    }
}

/// What the server answered for one batch, as the caller's classifier sorted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteOutcome {
    /// Written. The response piggybacks this KV pressure (`Signal::Clear` for log tables or
    /// a server that sends none).
    Ok {
        /// The piggybacked pressure.
        pressure: Signal,
    },
    /// Rejected by disk protection (`DISK_WRITE_LOCKED`): the disk backoff.
    DiskWriteLocked,
    /// Rejected with the retriable storage-backpressure error (L0 ≥ Tr): the KV curve's
    /// `Full`.
    StorageBackpressure,
    /// Another retriable error: the retriable-write backoff.
    Retriable,
    /// A non-retriable error: the batch fails at once and the gate learns nothing.
    Fatal,
}

/// Why a batch failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FailCause {
    /// Rejected after `max_retries` retries; `last` is the final rejection.
    #[error("write rejected after the last allowed retry ({last:?})")]
    RetriesExhausted {
        /// The outcome of the last send.
        last: WriteOutcome,
    },
    /// The server answered with a non-retriable error.
    #[error("write failed with a non-retriable error")]
    Fatal,
    /// The writer closed before the batch was written.
    #[error("the paced writer closed before the batch was written")]
    Closed,
}

/// What the driver must do next, drained with [`PacedWriter::poll_action`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriterAction<B, N, T> {
    /// Send the batch `batch` of `bucket` (read it with [`PacedWriter::batch`]) to `node`,
    /// its leader. Sends of one drain that share a `request` number go to the same node and
    /// belong in one request; they come out one after the other. Answer each batch once with
    /// [`PacedWriter::handle_response`].
    Send {
        /// The request this batch belongs to (distinct for every node of every drain).
        request: u64,
        /// The bucket's leader.
        node: N,
        /// The bucket.
        bucket: B,
        /// The batch in flight.
        batch: BatchId,
    },
    /// `bucket` has batches to send and no known leader: refresh its metadata and call
    /// [`PacedWriter::set_leader`]. Reported once per unknown-leader episode (until the next
    /// `set_leader`).
    RefreshLeader {
        /// The bucket.
        bucket: B,
    },
    /// The batch was written; its records are the caller's again (hand the emptied buffer
    /// back with [`PacedWriter::recycle`] to avoid an allocation per batch).
    Acked {
        /// The batch.
        batch: WriteBatch<T>,
    },
    /// The batch failed for good.
    Failed {
        /// The batch.
        batch: WriteBatch<T>,
        /// Why.
        cause: FailCause,
    },
}

/// A record refused because the writer is closed; the record is handed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the paced writer is closed")]
pub struct AppendRefused<T>(pub T);

impl<T> AppendRefused<T> {
    /// The refused record.
    pub fn into_record(self) -> T {
        self.0
    }
}

/// A response the writer cannot match to a batch in flight (nothing changes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResponseError {
    /// The id was never issued by this writer.
    #[error("no batch of this writer has that id")]
    Unknown,
    /// The batch was already answered.
    #[error("the batch was already answered")]
    AlreadyAnswered,
}

impl From<ReleaseError> for ResponseError {
    fn from(e: ReleaseError) -> Self {
        match e {
            ReleaseError::AlreadyReleased => ResponseError::AlreadyAnswered,
            _ => ResponseError::Unknown,
        }
    }
}

/// One bucket the writer knows: its key, queue and leader.
#[derive(Clone, Debug)]
struct Bucket<B, T> {
    key: B,
    /// `hasher.hash_one(&key)`, taken once, so the index rehashes without user code.
    hash: u64,
    queue: VecDeque<WriteBatch<T>>,
    /// A batch of this bucket is in flight.
    in_flight: bool,
    /// The leader's slot in `nodes`.
    leader: Option<u32>,
    /// The gate was told the leader is unknown (so the bucket is kept until it is known).
    told_unknown: bool,
    /// In `ready`.
    listed: bool,
    /// A `RefreshLeader` was emitted since the last `set_leader`.
    refresh_reported: bool,
    /// The longest the queue has been since the last maintenance (its shrink rule).
    peak: u32,
}

/// One leader node buckets refer to.
#[derive(Clone, Debug)]
struct Node<N> {
    node: N,
    hash: u64,
    /// Buckets whose leader it is.
    refs: u32,
    /// The drain that last gave it a request number, and that number.
    epoch: u64,
    request: u64,
}

/// A batch in flight and its bucket's slot.
#[derive(Clone, Debug)]
struct Flight<T> {
    slot: u32,
    batch: WriteBatch<T>,
}

fn stored<X>(list: &[Option<X>], i: u32, hash: impl Fn(&X) -> u64) -> u64 {
    list.get(i as usize)
        .and_then(Option::as_ref)
        .map_or(0, hash)
}

/// The paced writer: per-bucket batches and the send loop's decisions over a [`WriteGate`].
///
/// Generic over the bucket key `B`, the leader node `N` (a server id, an address), the
/// record `T` (the caller's payload plus whatever it needs to answer the record's producer)
/// and the hasher `S` (for buckets and nodes; pass std's `RandomState` where keys come from
/// remote metadata). See the [module docs](self) for what it decides and
/// `docs/paced-writer.md` for the state per bucket.
///
/// # Driving contract
///
/// - **Inputs**: [`append`](Self::append) for each record, [`set_leader`](Self::set_leader)
///   when metadata arrives, [`handle_response`](Self::handle_response) once per batch sent
///   (with the outcome your classifier gives), [`handle_timeout`](Self::handle_timeout) at or
///   after [`poll_timeout`](Self::poll_timeout). Commands: [`drain`](Self::drain) (the send
///   loop's turn: call it after any input) and [`close`](Self::close).
/// - **Outputs**: after `drain` (and after `handle_response` or `close`, which may end
///   batches), drain [`poll_action`](Self::poll_action) until `None`: transmit each `Send`
///   (read its records with [`batch`](Self::batch); group sends that share a request number),
///   refresh metadata for each `RefreshLeader`, hand each `Acked` or `Failed` batch's records
///   their result. Then sleep until `poll_timeout` (`None`: until the next input).
/// - **Randomness**: `handle_response` draws the gate's jitter from the `rng` it is given
///   and keeps nothing.
///
/// Every send of a batch is answered exactly once: a second answer, or an answer with
/// another writer's id, is refused ([`ResponseError`]) and changes nothing. After `drain`,
/// `poll_timeout` is `None` or later than its `now`, so a driver that loops over drain, sleep,
/// `handle_timeout` never spins.
///
/// Memory: a bucket is kept while it holds batches or a leader (the leader cache is the
/// writer's metadata); batches are unbounded, so bound the bytes in front of it (a
/// [`PendingBytesLimiter`](crate::PendingBytesLimiter)). After warm-up the send and response
/// paths allocate nothing when the caller recycles acked batches.
///
/// # User code
///
/// The bucket's and node's `Hash`, `Eq` and `Clone` run before an input changes anything for
/// that bucket: a panic in one leaves the writer consistent, every batch still held exactly
/// once. `drain` works bucket by bucket, so a panic in the middle keeps the sends already
/// decided (in `poll_action`) and leaves the rest queued. `handle_response` on `Ok` feeds the
/// gate twice (success, then pressure): a panic in the second leaves the batch in flight, and
/// the response may be given again.
///
/// ```
/// use throttle_sansio::paced_writer::{PacedWriter, PacedWriterConfig, WriteOutcome, WriterAction};
/// use throttle_sansio::rng::SplitMix64;
/// use throttle_sansio::{Instant, Signal};
/// # #[derive(Default, Clone)] struct H; impl core::hash::BuildHasher for H {
/// #   type Hasher = F; fn build_hasher(&self) -> F { F(0) } }
/// # struct F(u64); impl core::hash::Hasher for F { fn finish(&self) -> u64 { self.0 }
/// #   fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.rotate_left(5) ^ u64::from(*x) } } }
///
/// // Buckets are u32, leaders u16, records &str.
/// let mut w: PacedWriter<u32, u16, &str, H> = PacedWriter::new(PacedWriterConfig::default())?;
/// let mut rng = SplitMix64::new(7);
/// let t0 = Instant::ZERO;
/// w.set_leader(t0, 1, Some(10));
/// w.append(t0, 1, "a", 100).unwrap();
/// w.append(t0, 1, "b", 100).unwrap();
/// w.drain(t0);
/// let Some(WriterAction::Send { node: 10, bucket: 1, batch, .. }) = w.poll_action() else { panic!() };
/// assert_eq!(w.batch(batch).unwrap().records(), ["a", "b"]);
///
/// // Disk protection rejects it: the bucket is parked for about a second, not resent at once.
/// w.handle_response(t0, batch, WriteOutcome::DiskWriteLocked, &mut rng)?;
/// w.drain(t0);
/// assert_eq!(w.poll_action(), None);
/// let wake = w.poll_timeout().unwrap();
/// w.handle_timeout(wake);
/// w.drain(wake);
/// let Some(WriterAction::Send { batch, .. }) = w.poll_action() else { panic!() };
/// w.handle_response(wake, batch, WriteOutcome::Ok { pressure: Signal::Clear }, &mut rng)?;
/// let Some(WriterAction::Acked { batch }) = w.poll_action() else { panic!() };
/// assert_eq!((batch.records(), batch.attempts()), (&["a", "b"][..], 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct PacedWriter<B, N, T, S> {
    cfg: PacedWriterConfig,
    gate: WriteGate<B, S>,
    hasher: S,
    clock: Clock,
    /// Bucket slots by their stored hash.
    index: HashTable<u32>,
    /// Stable slots (a free slot is `None`): `ready`, the parked heap and the flights refer
    /// to buckets by slot.
    buckets: Vec<Option<Bucket<B, T>>>,
    free: Vec<u32>,
    node_index: HashTable<u32>,
    nodes: Vec<Option<Node<N>>>,
    free_nodes: Vec<u32>,
    /// Buckets that may have a sendable head batch, each once (`Bucket::listed`).
    ready: VecDeque<u32>,
    /// Buckets with queued batches the gate holds back, by the instant its answer changes.
    /// A bucket is never both listed and parked.
    parked: IndexedHeap,
    flights: Slab<Flight<T>>,
    actions: VecDeque<WriterAction<B, N, T>>,
    /// Emptied record buffers (from `recycle`), at most the recent peak of batches held.
    spare: Vec<Vec<T>>,
    /// Batches queued (not in flight).
    queued: usize,
    drains: u64,
    next_request: u64,
    closed: bool,
    maintenance: Maintenance,
    peak_batches: Peak,
    /// `peak_batches` of the previous maintenance period.
    last_peak_batches: usize,
    peak_ready: Peak,
    peak_actions: Peak,
    peak_buckets: Peak,
}

impl<B, N, T, S> PacedWriter<B, N, T, S>
where
    B: Hash + Eq + Clone,
    N: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    /// An empty writer with the default hasher of `S`; refuses an invalid `cfg`.
    pub fn new(cfg: PacedWriterConfig) -> Result<Self, ConfigError>
    where
        S: Default,
    {
        Self::with_hasher(cfg, S::default())
    }

    /// An empty writer hashing buckets and nodes with `hasher`; refuses an invalid `cfg`.
    pub fn with_hasher(cfg: PacedWriterConfig, hasher: S) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(PacedWriter {
            gate: WriteGate::with_hasher(
                cfg.gate().clone().with_wake_slack(cfg.wake_slack()),
                hasher.clone(),
            )?,
            cfg,
            hasher,
            clock: Clock::default(),
            index: HashTable::new(),
            buckets: Vec::new(),
            free: Vec::new(),
            node_index: HashTable::new(),
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            ready: VecDeque::new(),
            parked: IndexedHeap::default(),
            flights: Slab::new(),
            actions: VecDeque::new(),
            spare: Vec::new(),
            queued: 0,
            drains: 0,
            next_request: 1,
            closed: false,
            maintenance: Maintenance::default(),
            peak_batches: Peak::default(),
            last_peak_batches: 0,
            peak_ready: Peak::default(),
            peak_actions: Peak::default(),
            peak_buckets: Peak::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PacedWriterConfig {
        &self.cfg
    }

    // ------------------------------------------------------------------------------ inputs

    /// Appends `record` of `bytes` bytes to `bucket`: it joins the bucket's newest batch if
    /// that batch was never sent and the record fits in `batch_bytes`, else it starts a new
    /// batch. Refused after [`close`](Self::close) (the record is handed back).
    ///
    /// The bucket's `Hash` and `Eq` run once, before anything changes; the key is moved in
    /// for a new bucket (no `Clone`).
    pub fn append(
        &mut self,
        now: Instant,
        bucket: B,
        record: T,
        bytes: u64,
    ) -> Result<(), AppendRefused<T>> {
        if self.closed {
            self.clock.observe(now);
            return Err(AppendRefused(record));
        }
        let hash = self.hasher.hash_one(&bucket);
        let found = self.find_bucket(hash, &bucket);
        // No user code from here on.
        let now = self.clock.observe(now);
        self.maintenance.touch();
        let slot = match found {
            Some(slot) => slot,
            None => match self.insert_bucket(bucket, hash) {
                Some(slot) => slot,
                None => return Err(AppendRefused(record)),
            },
        };
        let limit = self.cfg.batch_bytes();
        let spare = &mut self.spare;
        let Some(b) = self.buckets.get_mut(slot as usize).and_then(Option::as_mut) else {
            return Err(AppendRefused(record));
        };
        match b.queue.back_mut() {
            Some(last) if last.attempts == 0 && last.bytes.saturating_add(bytes) <= limit => {
                last.records.push(record);
                last.bytes = last.bytes.saturating_add(bytes);
            }
            _ => {
                let mut records = spare.pop().unwrap_or_default();
                records.push(record);
                b.queue.push_back(WriteBatch {
                    records,
                    bytes,
                    attempts: 0,
                    created: now,
                });
                b.peak = b.peak.max(u32::try_from(b.queue.len()).unwrap_or(u32::MAX));
                self.queued += 1;
                self.peak_batches
                    .see(self.queued.saturating_add(self.flights.live()));
            }
        }
        self.mark_ready(slot);
        Ok(())
    }

    /// `bucket`'s leader is `leader` (`None`: unknown, refresh its metadata). Tells the gate
    /// (an unknown leader drops the bucket's KV throttle and ignores the old leader's
    /// pressure), and looks at the bucket again at the next drain. Accepted after `close`.
    ///
    /// The bucket's and node's `Hash` and `Eq` (and `Hash`, `Eq`, `Clone` of the bucket inside
    /// the gate) run before anything changes.
    pub fn set_leader(&mut self, now: Instant, bucket: B, leader: Option<N>) {
        let hash = self.hasher.hash_one(&bucket);
        let found = self.find_bucket(hash, &bucket);
        let node = leader.map(|n| {
            let h = self.hasher.hash_one(&n);
            let at = self.find_node(h, &n);
            (n, h, at)
        });
        let known = node.is_some();
        if found.is_none() && !known {
            // Nothing held for the bucket and nothing to hold: the gate learns nothing either.
            self.clock.observe(now);
            return;
        }
        // The gate's input is the last user code: it changes nothing if it panics. The gate
        // runs on the writer's clock (a `now` that stepped back reads as the latest one).
        self.gate
            .handle_leader(self.clock.peek(now), &bucket, known);
        self.discard_gate_actions();
        self.clock.observe(now);
        self.maintenance.touch();
        let node_slot = match node {
            Some((n, h, at)) => match at {
                Some(at) => Some(at),
                None => self.insert_node(n, h),
            },
            None => None,
        };
        let slot = match found {
            Some(slot) => slot,
            None => match self.insert_bucket(bucket, hash) {
                Some(slot) => slot,
                None => {
                    if let Some(n) = node_slot {
                        self.release_node(n);
                    }
                    return;
                }
            },
        };
        if let Some(n) = node_slot {
            if let Some(Some(node)) = self.nodes.get_mut(n as usize) {
                node.refs = node.refs.saturating_add(1);
            }
        }
        let old = match self.buckets.get_mut(slot as usize).and_then(Option::as_mut) {
            Some(b) => {
                b.told_unknown = !known;
                b.refresh_reported = false;
                core::mem::replace(&mut b.leader, node_slot)
            }
            None => None,
        };
        if let Some(old) = old {
            self.release_node(old);
        }
        // Parked at an opening that may have moved (the KV throttle dropped) or no longer
        // waiting on a leader: look again.
        self.mark_ready(slot);
        self.evict_if_idle(slot);
    }

    /// The server answered `outcome` for the batch sent as `id`.
    ///
    /// - `Ok`: the gate learns the success (probe mode ends) and, with KV pressure on, the
    ///   piggybacked pressure; the batch is `Acked`.
    /// - a rejection with `attempts == max_retries` (or after [`close`](Self::close)): the
    ///   batch `Failed` with [`FailCause::RetriesExhausted`] (or [`FailCause::Closed`]),
    ///   nothing is installed.
    /// - another rejection: fed to the gate with the batch's attempt count before the
    ///   increment (`DiskWriteLocked` → disk backoff, `StorageBackpressure` → the KV curve's
    ///   `Full`, `Retriable` → the retriable-write backoff; with an input switched off in the
    ///   config, see there), then the batch goes back to the front of its bucket's queue.
    /// - `Fatal`: the batch `Failed` with [`FailCause::Fatal`].
    ///
    /// Draws from `rng` once for a disk or retriable rejection that is retried. An id not in
    /// flight is refused and changes nothing. `Fatal`, and any answer that ends the batch
    /// without feeding the gate (a rejection past `max_retries` or after `close`), runs no
    /// user code: a driver whose answer panicked in the gate ends the batch that way.
    pub fn handle_response<R: Rng + ?Sized>(
        &mut self,
        now: Instant,
        id: BatchId,
        outcome: WriteOutcome,
        rng: &mut R,
    ) -> Result<(), ResponseError> {
        let Some(flight) = self.flights.get(id.0) else {
            self.clock.observe(now);
            return Err(self.flights.refusal(id.0).into());
        };
        let slot = flight.slot;
        let attempts = flight.batch.attempts;
        let Some(key) = self
            .buckets
            .get(slot as usize)
            .and_then(Option::as_ref)
            .map(|b| &b.key)
        else {
            // Unreachable: a flight's bucket is kept while it is in flight.
            self.clock.observe(now);
            return Err(ResponseError::Unknown);
        };
        let retry = !self.closed && attempts < self.cfg.max_retries();
        // The gate runs on the writer's clock.
        let now = self.clock.peek(now);
        // The gate's inputs (the bucket's `Hash`, `Eq`, `Clone`) before the writer changes:
        // a success, and a rejection that is retried, feed the gate; a fatal error, or a
        // rejection that ends the batch, does not.
        let end = match outcome {
            WriteOutcome::Ok { .. } => Some(None),
            WriteOutcome::Fatal => Some(Some(FailCause::Fatal)),
            rejected if !retry => Some(Some(if self.closed {
                FailCause::Closed
            } else {
                FailCause::RetriesExhausted { last: rejected }
            })),
            _ => None,
        };
        if matches!(end, None | Some(None)) {
            let feed = OutcomeFeed {
                disk_backoff: self.cfg.disk_backoff(),
                kv_pressure: self.cfg.kv_pressure(),
            };
            self.gate
                .handle_write_outcome(now, key, outcome, attempts, feed, rng);
        }
        self.discard_gate_actions();
        self.clock.observe(now);
        self.maintenance.touch();
        let Ok(flight) = self.flights.remove(id.0) else {
            return Err(ResponseError::Unknown); // unreachable: looked up above
        };
        let mut batch = flight.batch;
        match end {
            Some(None) => self.push_action(WriterAction::Acked { batch }),
            Some(Some(cause)) => self.push_action(WriterAction::Failed { batch, cause }),
            None => {
                batch.attempts = batch.attempts.saturating_add(1);
                match self.buckets.get_mut(slot as usize).and_then(Option::as_mut) {
                    Some(b) => {
                        b.queue.push_front(batch);
                        self.queued += 1;
                    }
                    None => self.push_action(WriterAction::Failed {
                        batch,
                        cause: FailCause::Closed,
                    }),
                }
            }
        }
        if let Some(b) = self.buckets.get_mut(slot as usize).and_then(Option::as_mut) {
            b.in_flight = false;
        }
        self.mark_ready(slot);
        self.evict_if_idle(slot);
        Ok(())
    }

    /// Wakes the buckets whose gate answer changed by `now` (call at
    /// [`poll_timeout`](Self::poll_timeout), then [`drain`](Self::drain)), evicts the gate's
    /// expired state, and gives memory back once per
    /// [`MAINTENANCE_INTERVAL`](crate::dispatch_window::MAINTENANCE_INTERVAL). Runs no user
    /// code.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        self.gate.handle_timeout(now);
        self.discard_gate_actions();
        self.wake_due(now);
        self.maintain(now);
    }

    /// Lists the parked buckets whose instant has come.
    fn wake_due(&mut self, now: Instant) {
        for _ in 0..self.parked.len() {
            match self.parked.peek() {
                Some((at, slot)) if at <= now => {
                    self.parked.remove(slot);
                    if let Ok(slot) = u32::try_from(slot) {
                        self.mark_ready(slot);
                    }
                }
                _ => break,
            }
        }
    }

    // ---------------------------------------------------------------------------- commands

    /// The send loop's turn: every bucket that may have a sendable head batch is looked at
    /// once (buckets parked until `now` or earlier included, so a driver that drains at
    /// [`poll_timeout`](Self::poll_timeout) without calling `handle_timeout` loses nothing). Leader unknown → `RefreshLeader` (once per episode); gate `Closed` or `Probing`
    /// → parked until [`WriteGate::reopens_at`]; open → its head batch goes in flight
    /// (`Send`), the gate counting the send (`handle_send`). Sends are grouped into one
    /// request per leader node. Queued batches of buckets in flight wait for the answer.
    ///
    /// For each bucket, its `Hash`, `Eq` (in the gate) and `Clone` and its node's `Clone` run
    /// before the bucket changes; see the type's docs on panics.
    pub fn drain(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        self.drains = self.drains.wrapping_add(1);
        self.wake_due(now);
        let first_new = self.actions.len();
        for _ in 0..self.ready.len() {
            let Some(&slot) = self.ready.front() else {
                break;
            };
            let again = self.look_at(now, slot);
            // Only once the bucket is settled: a panic above leaves it listed at the front.
            self.ready.pop_front();
            if let Some(b) = self.buckets.get_mut(slot as usize).and_then(Option::as_mut) {
                b.listed = false;
            }
            if again {
                self.mark_ready(slot);
            }
            self.evict_if_idle(slot);
        }
        // Group this drain's sends by request, in issue order within each (no user code).
        let tail = self
            .actions
            .make_contiguous()
            .get_mut(first_new..)
            .unwrap_or(&mut []);
        tail.sort_unstable_by_key(|a| match a {
            WriterAction::Send { request, batch, .. } => (*request, batch.id()),
            _ => (0, 0),
        });
    }

    /// Closes the writer: later appends are refused, every queued batch fails with
    /// [`FailCause::Closed`], and the gate is closed. Batches in flight are untouched: answer
    /// them as usual (a rejection then fails the batch instead of retrying it). Idempotent.
    /// Runs no user code.
    pub fn close(&mut self) {
        if !self.closed {
            self.gate.close();
            self.discard_gate_actions();
        }
        self.closed = true;
        self.maintenance.touch();
        for slot in 0..self.buckets.len() {
            let Some(Some(b)) = self.buckets.get_mut(slot) else {
                continue;
            };
            let failed: VecDeque<WriteBatch<T>> = core::mem::take(&mut b.queue);
            self.queued = self.queued.saturating_sub(failed.len());
            for batch in failed {
                self.push_action(WriterAction::Failed {
                    batch,
                    cause: FailCause::Closed,
                });
            }
            self.parked.remove(slot);
            if let Ok(slot) = u32::try_from(slot) {
                self.evict_if_idle(slot);
            }
        }
    }

    /// Takes back an acked or failed batch's emptied buffer, so the next batch needs no
    /// allocation. At most the recent peak of batches held are kept.
    pub fn recycle(&mut self, mut records: Vec<T>) {
        records.clear();
        if self.spare.len().saturating_add(self.pending_batches()) < self.peak_batches_now() {
            self.spare.push(records);
        }
    }

    // ----------------------------------------------------------------------------- outputs

    /// The next thing to do, or `None` when there is nothing left.
    pub fn poll_action(&mut self) -> Option<WriterAction<B, N, T>> {
        self.actions.pop_front()
    }

    /// The earliest instant a parked bucket's gate answer changes, plus the
    /// [wake slack](PacedWriterConfig::with_wake_slack): sleep until then, call
    /// [`handle_timeout`](Self::handle_timeout) and [`drain`](Self::drain), which sends every
    /// bucket whose instant has come by then (so the buckets opening within the slack after
    /// the first travel together), and none before its own instant. `None` while no bucket
    /// with queued batches waits on its gate. After a drain, always later than its `now`.
    /// O(1).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.parked
            .peek()
            .map(|(at, _)| at + self.gate.config().wake_slack())
    }

    // ----------------------------------------------------------------------------- queries

    /// The batch in flight under `id`, to put on the wire after a `Send`.
    pub fn batch(&self, id: BatchId) -> Option<&WriteBatch<T>> {
        self.flights.get(id.0).map(|f| &f.batch)
    }

    /// Batches queued (not in flight), over all buckets.
    pub fn queued_batches(&self) -> usize {
        self.queued
    }

    /// Batches in flight.
    pub fn in_flight(&self) -> usize {
        self.flights.live()
    }

    /// Batches not yet acked or failed: queued or in flight.
    pub fn pending_batches(&self) -> usize {
        self.queued.saturating_add(self.flights.live())
    }

    /// Buckets the writer holds (with batches or a leader).
    pub fn buckets(&self) -> usize {
        self.index.len()
    }

    /// Whether [`close`](Self::close) was called (or the batch id space is spent).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The write gate (for inspection: `check`, `remaining`, `explain`).
    pub fn gate(&self) -> &WriteGate<B, S> {
        &self.gate
    }

    /// The oldest undrained observation of the writer's gate ([`GateEvent`]: each gate the
    /// responses installed, each `Wake`), if events are on ([`Self::set_event_capacity`]).
    /// The writer records none of its own: its decisions are the gate's and the batches' it
    /// hands out as actions.
    pub fn poll_event(&mut self) -> Option<GateEvent<B>> {
        self.gate.poll_event()
    }

    /// For the `sync` handles' lock guard: whether an event is waiting (one length check).
    #[cfg(feature = "std")]
    #[inline]
    pub(crate) fn has_events(&self) -> bool {
        self.gate.has_events()
    }

    /// Record up to `capacity` undrained gate events (0, the default, turns them off), as
    /// [`WriteGate::set_event_capacity`].
    pub fn set_event_capacity(&mut self, capacity: usize) {
        self.gate.set_event_capacity(capacity);
    }

    /// Gate events lost to a full queue (or discarded by turning events off) so far.
    pub fn events_dropped(&self) -> u64 {
        self.gate.events_dropped()
    }

    // ----------------------------------------------------------------------------- helpers

    /// One bucket's turn in a drain. Returns whether the bucket must be looked at again at
    /// the next drain (a state the gate gives no instant for).
    fn look_at(&mut self, now: Instant, slot: u32) -> bool {
        let Some(b) = self.buckets.get(slot as usize).and_then(Option::as_ref) else {
            return false;
        };
        if b.in_flight || b.queue.is_empty() {
            return false;
        }
        let Some(leader) = b.leader else {
            if !b.refresh_reported {
                let bucket = b.key.clone();
                self.report_refresh(slot, bucket);
            }
            return false;
        };
        let mut state = self.gate.check(now, &b.key);
        if state == GateState::UnknownLeader {
            // The gate missed the leader's return (that input panicked in user code): tell
            // it again.
            self.gate.handle_leader(now, &b.key, true);
            while self.gate.poll_action().is_some() {}
            state = self.gate.check(now, &b.key);
        }
        match state {
            GateState::Open => {}
            GateState::UnknownLeader => return true,
            GateState::Closed { until, .. } => {
                self.parked.set(slot as usize, until);
                return false;
            }
            _ => {
                // Probing (or a state added later): park until the gate's answer changes,
                // never ask again at once.
                return match self.gate.reopens_at(now, &b.key) {
                    Some(at) => {
                        self.parked.set(slot as usize, at);
                        false
                    }
                    None => true,
                };
            }
        }
        // User code first: the copies the `Send` carries, then the gate's count.
        let bucket = b.key.clone();
        let Some(node) = self
            .nodes
            .get(leader as usize)
            .and_then(Option::as_ref)
            .map(|n| n.node.clone())
        else {
            return false;
        };
        if !self.flights.can_issue() {
            // No batch id is left: nothing sent could ever be answered.
            self.close();
            return false;
        }
        self.gate.handle_send(now, &bucket);
        self.discard_gate_actions();
        // No user code from here on.
        let Some(b) = self.buckets.get_mut(slot as usize).and_then(Option::as_mut) else {
            return false;
        };
        let Some(batch) = b.queue.pop_front() else {
            return false;
        };
        let batch = match self.flights.insert(Flight { slot, batch }) {
            Ok(key) => BatchId(key),
            Err((_, flight)) => {
                b.queue.push_front(flight.batch);
                return false;
            }
        };
        b.in_flight = true;
        self.queued = self.queued.saturating_sub(1);
        let request = match self.nodes.get_mut(leader as usize).and_then(Option::as_mut) {
            Some(n) => {
                if n.epoch != self.drains {
                    n.epoch = self.drains;
                    n.request = self.next_request;
                    self.next_request = self.next_request.saturating_add(1);
                }
                n.request
            }
            None => 0,
        };
        self.push_action(WriterAction::Send {
            request,
            node,
            bucket,
            batch,
        });
        false
    }

    fn report_refresh(&mut self, slot: u32, bucket: B) {
        if let Some(b) = self.buckets.get_mut(slot as usize).and_then(Option::as_mut) {
            b.refresh_reported = true;
        }
        self.push_action(WriterAction::RefreshLeader { bucket });
    }

    /// The bucket may have a sendable head batch: list it once (and unpark it).
    fn mark_ready(&mut self, slot: u32) {
        self.parked.remove(slot as usize);
        if let Some(b) = self.buckets.get_mut(slot as usize).and_then(Option::as_mut) {
            if !b.listed && !b.in_flight && !b.queue.is_empty() {
                b.listed = true;
                self.ready.push_back(slot);
                self.peak_ready.see(self.ready.len());
            }
        }
    }

    /// The gate's wakes say which bucket's wait shrank; the writer re-looks at every bucket
    /// it feeds an input for, so they carry nothing it needs.
    fn discard_gate_actions(&mut self) {
        while self.gate.poll_action().is_some() {}
    }

    fn push_action(&mut self, action: WriterAction<B, N, T>) {
        self.actions.push_back(action);
        self.peak_actions.see(self.actions.len());
    }

    /// The most batches held at once in this maintenance period or the one before.
    fn peak_batches_now(&self) -> usize {
        let mut p = self.peak_batches;
        p.roll(self.pending_batches()).max(self.last_peak_batches)
    }

    fn find_bucket(&self, hash: u64, bucket: &B) -> Option<u32> {
        let list = &self.buckets;
        self.index
            .find(hash, |&i| {
                list.get(i as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|b| b.key == *bucket)
            })
            .copied()
    }

    fn find_node(&self, hash: u64, node: &N) -> Option<u32> {
        let list = &self.nodes;
        self.node_index
            .find(hash, |&i| {
                list.get(i as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|n| n.node == *node)
            })
            .copied()
    }

    /// Stores a new bucket (no user code: the index rehashes by stored hashes). `None` past
    /// the slot limit.
    fn insert_bucket(&mut self, key: B, hash: u64) -> Option<u32> {
        let fresh = Bucket {
            key,
            hash,
            queue: VecDeque::new(),
            in_flight: false,
            leader: None,
            told_unknown: false,
            listed: false,
            refresh_reported: false,
            peak: 0,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                if let Some(s) = self.buckets.get_mut(slot as usize) {
                    *s = Some(fresh);
                }
                slot
            }
            None => {
                let slot = u32::try_from(self.buckets.len())
                    .ok()
                    .filter(|&s| (s as usize) < MAX_SLOTS - 1)?;
                self.buckets.push(Some(fresh));
                self.parked.add_slot();
                slot
            }
        };
        let list = &self.buckets;
        self.index
            .insert_unique(hash, slot, |&i| stored(list, i, |b| b.hash));
        self.peak_buckets.see(self.index.len());
        Some(slot)
    }

    fn insert_node(&mut self, node: N, hash: u64) -> Option<u32> {
        let fresh = Node {
            node,
            hash,
            refs: 0,
            epoch: 0,
            request: 0,
        };
        let slot = match self.free_nodes.pop() {
            Some(slot) => {
                if let Some(s) = self.nodes.get_mut(slot as usize) {
                    *s = Some(fresh);
                }
                slot
            }
            None => {
                let slot = u32::try_from(self.nodes.len()).ok()?;
                self.nodes.push(Some(fresh));
                slot
            }
        };
        let list = &self.nodes;
        self.node_index
            .insert_unique(hash, slot, |&i| stored(list, i, |n| n.hash));
        Some(slot)
    }

    /// One bucket fewer refers to node `slot`; the last one frees it.
    fn release_node(&mut self, slot: u32) {
        let Some(Some(n)) = self.nodes.get_mut(slot as usize) else {
            return;
        };
        n.refs = n.refs.saturating_sub(1);
        if n.refs > 0 {
            return;
        }
        let hash = n.hash;
        if let Ok(e) = self.node_index.find_entry(hash, |&i| i == slot) {
            e.remove();
        }
        // The node is dropped once the writer is consistent again.
        let _gone = self.nodes.get_mut(slot as usize).and_then(Option::take);
        self.free_nodes.push(slot);
    }

    /// Forgets a bucket that holds nothing: no batch, no flight, no leader, nothing told to
    /// the gate, not listed.
    fn evict_if_idle(&mut self, slot: u32) {
        let Some(Some(b)) = self.buckets.get(slot as usize) else {
            return;
        };
        if b.in_flight || !b.queue.is_empty() || b.leader.is_some() || b.told_unknown || b.listed {
            return;
        }
        let hash = b.hash;
        if let Ok(e) = self.index.find_entry(hash, |&i| i == slot) {
            e.remove();
        }
        self.parked.remove(slot as usize);
        let _gone = self.buckets.get_mut(slot as usize).and_then(Option::take);
        self.free.push(slot);
    }

    /// Maintenance: shrink what is well below its recent peak.
    fn maintain(&mut self, now: Instant) {
        if !self.maintenance.begin(now) {
            return;
        }
        let m = self.maintenance;
        let buckets = self.peak_buckets.roll(self.index.len());
        if let Some(target) = m.target(self.index.capacity(), buckets) {
            let list = &self.buckets;
            self.index
                .shrink_to(target, |&i| stored(list, i, |b| b.hash));
        }
        // Trailing free slots go (their heap positions with them), then the free list drops
        // the slots that no longer exist.
        while matches!(self.buckets.last(), Some(None)) {
            let last = self.buckets.len() - 1;
            self.parked.swap_remove_slot(last);
            self.buckets.pop();
        }
        let len = self.buckets.len();
        self.free.retain(|&s| (s as usize) < len);
        if let Some(target) = m.target(self.buckets.capacity(), buckets) {
            self.buckets.shrink_to(target);
            self.free.shrink_to(target);
            self.parked.shrink_to(target, target);
        }
        for b in self.buckets.iter_mut().flatten() {
            // A queue well below its recent peak shrinks (to twice it, at least the floor).
            let peak = b.peak as usize;
            b.peak = u32::try_from(b.queue.len()).unwrap_or(u32::MAX);
            if let Some(target) = m.target(b.queue.capacity(), peak.max(b.queue.len())) {
                b.queue.shrink_to(target);
            }
        }
        let batches = self.peak_batches.roll(self.pending_batches());
        self.last_peak_batches = batches;
        self.spare
            .truncate(batches.saturating_sub(self.pending_batches()));
        self.flights.shrink(&m);
        let ready = self.peak_ready.roll(self.ready.len());
        if let Some(target) = m.target(self.ready.capacity(), ready) {
            self.ready.shrink_to(target);
        }
        let actions = self.peak_actions.roll(self.actions.len());
        if let Some(target) = m.target(self.actions.capacity(), actions) {
            self.actions.shrink_to(target);
        }
    }

    /// Internal consistency, for the model checker and tests.
    #[cfg(any(test, feature = "model"))]
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let mut queued = 0usize;
        let mut in_flight = 0usize;
        let mut live = 0usize;
        for (slot, b) in self.buckets.iter().enumerate() {
            let Some(b) = b else {
                if self.parked.contains(slot) {
                    return Err("a free slot is parked");
                }
                continue;
            };
            live += 1;
            if b.hash != self.hasher.hash_one(&b.key) {
                return Err("a bucket's stored hash is not its key's");
            }
            if self.find_bucket(b.hash, &b.key).map(|s| s as usize) != Some(slot) {
                return Err("a bucket's key does not find its slot");
            }
            queued += b.queue.len();
            in_flight += usize::from(b.in_flight);
            let parked = self.parked.contains(slot);
            if parked && b.listed {
                return Err("a bucket is both listed and parked");
            }
            if parked && (b.in_flight || b.queue.is_empty() || b.leader.is_none()) {
                return Err("a parked bucket has nothing to send or no leader");
            }
            let listings = self.ready.iter().filter(|&&s| s as usize == slot).count();
            if listings != usize::from(b.listed) {
                return Err("a bucket's listing flag disagrees with the ready list");
            }
            if b.queue.iter().skip(1).any(|q| q.attempts > 0) {
                return Err("a retried batch is not at the front of its queue");
            }
            if let Some(n) = b.leader {
                if !matches!(self.nodes.get(n as usize), Some(Some(_))) {
                    return Err("a bucket's leader is a free node slot");
                }
            }
            if !b.in_flight && !b.listed && !parked && !b.queue.is_empty() && b.leader.is_some() {
                // Idle with work and a leader: only right after close, which queues nothing.
                return Err("a bucket with queued batches is neither listed, parked nor in flight");
            }
        }
        if live != self.index.len() {
            return Err("the bucket index and slots differ in size");
        }
        if queued != self.queued {
            return Err("the queued count is wrong");
        }
        if in_flight != self.flights.live() {
            return Err("in-flight flags disagree with the flights");
        }
        for (slot, n) in self.nodes.iter().enumerate() {
            let Some(n) = n else { continue };
            let refs = self
                .buckets
                .iter()
                .flatten()
                .filter(|b| b.leader.is_some_and(|l| l as usize == slot))
                .count();
            if refs != n.refs as usize || refs == 0 {
                return Err("a node's reference count is wrong");
            }
        }
        if !self.parked.is_consistent() || self.parked.slots() != self.buckets.len() {
            return Err("the parked heap is inconsistent");
        }
        self.gate.check_invariants()
    }
}
