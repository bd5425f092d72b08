//! [`BatchDriver`]: the rate-adaptive [`Batcher`] run as a task, for many submitters at once.
//!
//! `submit(shard, op)` puts the operation on the driver's input queue and returns a future of
//! its result. The driver task (spawned on the runtime) drains the queue into the batcher and
//! calls [`Batcher::flush`] once the queue is empty, so operations that arrive while a shard's
//! window is exhausted join its parked batch: the batch size follows the server's rate. Each
//! `Send` is carried out by a task that awaits the user's [`Transport`] and reports the batch's
//! end back to the batcher (which releases the credit exactly once and may send the next
//! batch): one task per batch, or, with [`SendOrder::PerShard`], one per shard that sends
//! the shard's batches in dispatch order (`ordered.rs`). Results are handed to submitters
//! through one-shot slots, after the lock is dropped.
//!
//! User code that panics (`op_bytes`, the shard key's `Hash`, `Eq` or `Clone`, `send`, or the
//! future `send` returns) fails the operations it was working on with [`OpError::Panicked`]
//! and gives their credit back: the panic is caught where the driver calls that code, and each
//! send task also owns its credit in a guard, so a task the runtime drops unfinished releases
//! it too. Shard keys are user code only in `submit`: it stores each key once and names it by
//! a plain id from then on, so the driver task, the batcher and its window never run a key's
//! code (see [`Shards`]).

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::sync::Arc as ErrArc;
use alloc::vec::Vec;
use core::fmt;
use core::future::Future;
use core::hash::{BuildHasher, Hash};
use core::num::NonZeroUsize;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;

use hashbrown::HashTable;

use super::events::{Drained, EventSink, EventTap};
use super::loom::{Arc, Mutex, lock};
use super::oneshot::{self, Receiver, Sender};
use super::signal::{WakeSignal, wait_for};
use super::unwind;
use super::waiters::wake_one;
use super::{Closed, Panicked, Runtime, TimedOut};
use crate::backoff::{Backoff, BackoffConfig};
use crate::batcher::{
    BatchAction, BatchEvent, Batcher, BatcherConfig, FailReason, OpId, RefuseReason, Withdrawal,
};
use crate::dispatch_window::CreditId;
use crate::limiter::{BatchEnd as LimitEnd, PerShard};
use crate::rng::SplitMix64;
use crate::slab::{Key, Slab};
use crate::time::Instant;

#[path = "batch/ordered.rs"]
mod ordered;

pub use ordered::{BatchDriverBuilder, SendOrder};

/// What a [`Transport`] answers for one batch: one result per operation by position, or the
/// whole batch's error.
pub type BatchOutcome<O, E> = Result<Vec<Result<O, E>>, E>;

/// Sends a batch of operations to a shard: the user's side of a [`BatchDriver`]. A closure
/// `|shard: &Shard, ops: Vec<Op>| future` is one (see the impl below); implement it on a type
/// of your own for [`op_bytes`](Self::op_bytes).
pub trait Transport<Shard, Op>: Send + Sync + 'static {
    /// One operation's successful result.
    type Output: Send + 'static;
    /// An operation's error, or the whole batch's.
    type Error: Send + Sync + 'static;

    /// The operation's size, for write batches bounded by bytes (default 0: count only). If it
    /// panics, the operation fails with [`OpError::Panicked`] and is not queued.
    fn op_bytes(&self, op: &Op) -> u64 {
        let _ = op;
        0
    }

    /// Sends `ops` (in submission order) to `shard`. `Ok` holds one result per operation, by
    /// position; operations past the end of the vector fail with [`OpError::NoResponse`]. An
    /// `Err` fails every operation of the batch with [`OpError::Batch`]. The future must end
    /// (time out) on its own: the batch's window credit is held until it does.
    ///
    /// If `send` or its future panics, every operation of the batch fails with
    /// [`OpError::Panicked`] and the credit is released (the shard's next batch goes out).
    fn send(
        &self,
        shard: &Shard,
        ops: Vec<Op>,
    ) -> impl Future<Output = BatchOutcome<Self::Output, Self::Error>> + Send + 'static;

    /// Whether a whole-batch `error` means the stream tore before the server executed the
    /// batch, so that sending it again is safe and needed (default `false`: every batch error
    /// fails the batch).
    ///
    /// Consulted only by a driver built with
    /// [`BatchDriverBuilder::with_requeue`]: a torn batch goes back at the head of its shard's
    /// order (its operations keep waiting, in order, and are sent again: at-least-once
    /// delivery), and the shard is paused for the next delay of its reconnect backoff, then
    /// resumed. Called once per failed batch, with no lock held; if it panics the batch fails
    /// as if it returned `false`.
    fn torn(&self, error: &Self::Error) -> bool {
        let _ = error;
        false
    }
}

/// A closure is a transport: `|shard: &Shard, ops: Vec<Op>| future` sends the batch, with
/// [`op_bytes`](Transport::op_bytes) 0 (batches bounded by count only). For sizes, implement
/// the trait on a type of your own.
///
/// ```
/// use throttle_sansio::BatcherConfig;
/// use throttle_sansio::sync::{BatchDriver, BatchOutcome};
/// # #[derive(Clone)] struct Rt;
/// # impl throttle_sansio::sync::Runtime for Rt {
/// #     fn now(&self) -> throttle_sansio::Instant { throttle_sansio::Instant::ZERO }
/// #     fn sleep_until(&self, _: throttle_sansio::Instant) -> impl Future<Output = ()> + Send + 'static { core::future::pending() }
/// #     fn spawn<F: Future<Output = ()> + Send + 'static>(&self, _: F) {}
/// # }
/// # let rt = Rt;
/// async fn exchange(shard: u8, keys: Vec<u32>) -> BatchOutcome<u64, std::io::Error> {
///     Ok(keys.into_iter().map(|k| Ok(u64::from(k) + u64::from(shard))).collect())
/// }
/// let send = |shard: &u8, keys| exchange(*shard, keys);
/// let driver = BatchDriver::new(rt, send, BatcherConfig::reads());
/// # driver.close();
/// ```
impl<Shard, Op, F, Fut, O, E> Transport<Shard, Op> for F
where
    F: Fn(&Shard, Vec<Op>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = BatchOutcome<O, E>> + Send + 'static,
    O: Send + 'static,
    E: Send + Sync + 'static,
{
    type Output = O;
    type Error = E;

    fn send(
        &self,
        shard: &Shard,
        ops: Vec<Op>,
    ) -> impl Future<Output = BatchOutcome<O, E>> + Send + 'static {
        self(shard, ops)
    }
}

/// Why a submitted operation has no result.
///
/// `Display` says what happened at this layer; the transport's error is the
/// [`source`](std::error::Error::source) (for [`Op`](Self::Op) and [`Batch`](Self::Batch)), so
/// a report that walks the chain prints both. `std::error::Error` is implemented when `E` is
/// an error itself.
///
/// ```
/// use std::error::Error as _;
/// use throttle_sansio::sync::OpError;
///
/// let e: OpError<std::io::Error> = OpError::Op(std::io::Error::other("key not found"));
/// assert_eq!(e.to_string(), "the transport failed the operation");
/// assert_eq!(e.source().unwrap().to_string(), "key not found");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum OpError<E> {
    /// The transport's error for this operation.
    Op(E),
    /// Its batch failed as a whole (the error is shared by the batch's operations).
    Batch(BatchFailure<E>),
    /// Its batch completed without a result for it, or its send task was dropped unfinished
    /// (the runtime shut down).
    NoResponse,
    /// The driver closed before the operation was sent.
    Closed,
    /// User code it depended on panicked: [`Transport::op_bytes`] or the shard key's `Hash`,
    /// `Eq` or `Clone` in `submit` for this operation (nothing was queued), or
    /// [`Transport::send`] (or its future) for its batch (the batch's credit was released).
    Panicked(Panicked),
    /// The operation's deadline ([`BatcherConfig::with_op_timeout`], counted from its
    /// acceptance) passed before its result came: while it was still held back (it was never
    /// sent), or while its batch was in the transport (the send was dropped at the batch's
    /// deadline, its oldest operation's; every operation of the batch ends so).
    TimedOut(TimedOut),
    /// Refused at submit, before it was queued: the operation alone is larger than the batch
    /// limit and the config rejects such operations
    /// (`BatcherConfig::with_oversized`); the transport never sees it.
    TooLarge {
        /// The operation's size ([`Transport::op_bytes`]).
        bytes: u64,
        /// The batch limit it exceeds ([`BatcherConfig::max_batch_bytes`]).
        limit: u64,
    },
}

impl<E> fmt::Display for OpError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpError::Op(_) => f.write_str("the transport failed the operation"),
            OpError::Batch(b) => fmt::Display::fmt(b, f),
            OpError::NoResponse => {
                f.write_str("the transport's answer had no result for the operation")
            }
            OpError::Closed => f.write_str("the batch driver closed before the operation was sent"),
            OpError::Panicked(p) => write!(f, "{p} (the operation's batch or submit)"),
            OpError::TimedOut(_) => f.write_str("the operation's timeout passed before its result"),
            OpError::TooLarge { bytes, limit } => write!(
                f,
                "the operation of {bytes} bytes exceeds the batch limit of {limit} bytes"
            ),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for OpError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpError::Op(e) => Some(e),
            OpError::Batch(b) => Some(b.error()),
            OpError::Panicked(p) => Some(p),
            OpError::TimedOut(t) => Some(t),
            _ => None,
        }
    }
}

impl<E> From<Panicked> for OpError<E> {
    fn from(p: Panicked) -> Self {
        OpError::Panicked(p)
    }
}

/// The error of a whole batch, shared by each of its operations' [`OpError::Batch`]: the
/// transport's error, and how many operations the batch carried. Derefs to the transport's
/// error, which is also its [`source`](std::error::Error::source).
///
/// ```
#[doc = include_str!("../doc/tiny_runtime.md")]
/// use std::error::Error as _;
/// use throttle_sansio::BatcherConfig;
/// use throttle_sansio::sync::{BatchDriver, BatchOutcome, OpError, Transport};
///
/// struct Down;
///
/// impl Transport<u8, u64> for Down {
///     type Output = u64;
///     type Error = std::io::Error;
///
///     fn send(
///         &self,
///         _shard: &u8,
///         _gets: Vec<u64>,
///     ) -> impl Future<Output = BatchOutcome<u64, std::io::Error>> + Send + 'static {
///         core::future::ready(Err(std::io::Error::other("shard 1 is down")))
///     }
/// }
///
/// let rt = Tiny::default();
/// let driver: BatchDriver<_, _, u8, u64> =
///     BatchDriver::new(rt.clone(), Down, BatcherConfig::reads());
/// let (a, _b) = (driver.submit(1, 20), driver.submit(1, 21));
/// let Err(OpError::Batch(failure)) = rt.block_on(a) else { unreachable!() };
/// assert_eq!(failure.ops(), 2);
/// assert_eq!(failure.to_string(), "the transport failed the operation's batch of 2 operations");
/// assert_eq!(failure.source().unwrap().to_string(), "shard 1 is down");
/// ```
#[derive(Debug)]
pub struct BatchFailure<E> {
    error: ErrArc<E>,
    ops: usize,
}

impl<E> BatchFailure<E> {
    /// The transport's error.
    pub fn error(&self) -> &E {
        &self.error
    }

    /// The transport's error, shared with the batch's other operations.
    pub fn shared(&self) -> &ErrArc<E> {
        &self.error
    }

    /// Operations the batch carried.
    pub fn ops(&self) -> usize {
        self.ops
    }
}

impl<E> Clone for BatchFailure<E> {
    fn clone(&self) -> Self {
        BatchFailure {
            error: ErrArc::clone(&self.error),
            ops: self.ops,
        }
    }
}

impl<E> core::ops::Deref for BatchFailure<E> {
    type Target = E;
    fn deref(&self) -> &E {
        &self.error
    }
}

impl<E> fmt::Display for BatchFailure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the transport failed the operation's batch of {}",
            self.ops
        )?;
        f.write_str(if self.ops == 1 {
            " operation"
        } else {
            " operations"
        })
    }
}

impl<E: std::error::Error + 'static> std::error::Error for BatchFailure<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.error())
    }
}

impl<E> From<Closed> for OpError<E> {
    fn from(_: Closed) -> Self {
        OpError::Closed
    }
}

type OpResult<T, Shard, Op> =
    Result<<T as Transport<Shard, Op>>::Output, OpError<<T as Transport<Shard, Op>>::Error>>;

struct OpSlot<T: Transport<Shard, Op>, Shard, Op> {
    op: Option<Op>,
    /// The key the submitter passed, kept until the operation's batch is sent: the batch's
    /// first operation gives the key its `send` is called with, so no key is cloned for a
    /// send.
    key: Option<Shard>,
    /// The key's id in [`Shards`] (counted there until the slot is freed).
    shard: ShardId,
    /// The operation's id in the batcher, once the driver task handed it over (`None` while
    /// it is in the input queue).
    in_batcher: Option<OpId>,
    tx: Sender<OpResult<T, Shard, Op>>,
}

/// A shard key as the batcher and its window see it: an index into [`Shards`]. Its `Hash`,
/// `Eq` and `Clone` are the derived ones of a `usize`, so they cannot panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ShardId(usize);

/// The shard keys of the operations in the driver, each stored once and named by a
/// [`ShardId`] everywhere else. `submit` is the only input that runs a key's code: it hashes
/// the key once, compares it with the stored keys of that hash and, for a shard not yet
/// stored, clones it, all before it changes anything; a panic there fails that submit alone
/// and leaves the table as it was. Entries are placed by the hash stored in them, so the table
/// grows and shrinks without user code, and an entry is removed (by its id, without user
/// code) when the last operation slot naming it is freed.
struct Shards<Shard, S> {
    hasher: S,
    /// Entry ids, each placed by its entry's stored hash.
    index: HashTable<usize>,
    entries: Vec<Option<Interned<Shard>>>,
    free: Vec<usize>,
}

struct Interned<Shard> {
    key: Shard,
    hash: u64,
    /// Operation slots naming this entry.
    ops: usize,
}

impl<Shard: Hash + Eq + Clone, S: BuildHasher> Shards<Shard, S> {
    fn new(hasher: S) -> Self {
        Shards {
            hasher,
            index: HashTable::new(),
            entries: Vec::new(),
            free: Vec::new(),
        }
    }

    /// The id of `shard` if it is stored (user code: its `Hash`, then `Eq`; nothing changes).
    fn find(&self, shard: &Shard) -> Option<ShardId> {
        self.find_hashed(self.hasher.hash_one(shard), shard)
    }

    fn find_hashed(&self, hash: u64, shard: &Shard) -> Option<ShardId> {
        let entries = &self.entries;
        self.index
            .find(hash, |&id| {
                entries
                    .get(id)
                    .and_then(Option::as_ref)
                    .is_some_and(|e| e.key == *shard)
            })
            .map(|&id| ShardId(id))
    }

    /// The id of `shard`, counted for one more operation slot; a shard not yet stored is
    /// stored (a clone of the key). Every call of the key's code comes first.
    fn intern(&mut self, shard: &Shard) -> ShardId {
        let hash = self.hasher.hash_one(shard);
        if let Some(id) = self.find_hashed(hash, shard) {
            if let Some(Some(e)) = self.entries.get_mut(id.0) {
                e.ops = e.ops.saturating_add(1);
            }
            return id;
        }
        let key = shard.clone();
        // No user code from here on.
        let entry = Interned { key, hash, ops: 1 };
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.entries.push(None);
                self.entries.len() - 1
            }
        };
        if let Some(e) = self.entries.get_mut(id) {
            *e = Some(entry);
        }
        let entries = &self.entries;
        self.index.insert_unique(hash, id, |&id| {
            entries
                .get(id)
                .and_then(Option::as_ref)
                .map_or(0, |e| e.hash)
        });
        ShardId(id)
    }
}

impl<Shard, S> Shards<Shard, S> {
    /// Keeps `id` stored for as long as the driver lives (one more count that is never
    /// released): its shard's limiter remembers it by this id.
    fn pin(&mut self, id: ShardId) {
        if let Some(Some(e)) = self.entries.get_mut(id.0) {
            e.ops = e.ops.saturating_add(1);
        }
    }

    /// The key stored under `id`, if any (no user code).
    fn key(&self, id: ShardId) -> Option<&Shard> {
        self.entries
            .get(id.0)
            .and_then(Option::as_ref)
            .map(|e| &e.key)
    }

    /// An operation slot naming `id` was freed; the last one removes the entry (`true`: the
    /// id is free for another key). No user code (the key's `Drop` aside).
    fn release(&mut self, id: ShardId) -> bool {
        let Some(Some(e)) = self.entries.get_mut(id.0) else {
            return false;
        };
        e.ops = e.ops.saturating_sub(1);
        if e.ops > 0 {
            return false;
        }
        if let Ok(found) = self.index.find_entry(e.hash, |&i| i == id.0) {
            found.remove();
        }
        if let Some(e) = self.entries.get_mut(id.0) {
            *e = None;
        }
        self.free.push(id.0);
        true
    }

    /// Shards stored (with an operation in the driver).
    #[cfg(all(test, not(loom)))]
    fn len(&self) -> usize {
        self.index.len()
    }
}

struct DriverState<T: Transport<Shard, Op>, Shard, Op, S> {
    /// Failed batches carry their [`BatchEnd`] to each operation's `Fail`.
    batcher: Batcher<ShardId, Key, S, (), BatchEnd<T::Error>>,
    shards: Shards<Shard, S>,
    /// Operations submitted and not yet handed to the batcher: their shard, slot and size.
    inbox: VecDeque<(ShardId, Key, u64)>,
    /// Entries of `inbox` whose operation was withdrawn (their slot is gone; the driver task
    /// skips them).
    withdrawn: usize,
    /// Submitted operations by slot (the batcher's handle `H` is the slot's key).
    slots: Slab<OpSlot<T, Shard, Op>>,
    driver: Option<Waker>,
    closed: bool,
    /// Critical sections whose results are still being handed to their submitters after
    /// unlock (a batch's end, `close`): [`BatchDriver::closed`] waits for them too.
    delivering: usize,
    /// Where dispatched batches go: back to the critical section's caller (concurrent), or to
    /// their shard's lane ([`SendOrder::PerShard`]).
    lanes: ordered::Lanes<Shard, Op>,
    /// Requeue on: the shards whose stream tore, by shard id (`None`: never torn, or
    /// answered since).
    reconnecting: Vec<Option<Reconnecting>>,
    /// Draws the reconnect backoff's jitter (seeded per driver from the process seed).
    rng: SplitMix64,
    /// Requeue on: each dispatched batch remembers its operations' slots.
    keep_sent: bool,
    /// Events lost because the shard key's `Clone` panicked as the driver copied it into one.
    events_lost: u64,
    /// A limiter per shard driving its window ([`BatchDriverBuilder::with_limiter`]), if on.
    adaptive: Option<PerShard>,
}

struct DriverShared<R, T: Transport<Shard, Op>, Shard, Op, S> {
    rt: R,
    transport: T,
    state: Mutex<DriverState<T, Shard, Op, S>>,
    /// Notified when the closed driver's last batch in flight ends: [`BatchDriver::closed`].
    drained: WakeSignal,
    /// The config's operation timeout ([`BatcherConfig::with_op_timeout`]): the batcher
    /// decides every deadline; this only says whether there are any.
    op_timeout: Option<Duration>,
    /// Requeue-and-pause of torn batches, if on.
    requeue: Option<Requeue<Op>>,
    /// The config's batch limit in bytes: an operation above it is handed to the batcher in
    /// `submit` itself, so that a refusal of its size is immediate.
    size_limit: u64,
    /// The batcher's event sink ([`BatchDriver::set_event_sink`]).
    tap: EventTap<BatchEvent<Shard>>,
}

impl<T: Transport<Shard, Op>, Shard, Op, S> DriverState<T, Shard, Op, S>
where
    S: BuildHasher + Clone,
{
    /// Closed (or draining), nothing held back or in the transport, and every result decided
    /// already handed to its submitter.
    fn is_drained(&self) -> bool {
        self.closed && self.batcher.is_drained() && self.delivering == 0
    }
}

/// A dispatched batch: the key of its first operation (always there: see `drain`), its
/// credit and its operations; with requeue on, the slots of those operations, in order.
struct Outgoing<Shard, Op> {
    key: Option<Shard>,
    credit: CreditId,
    /// The batch's deadline ([`Batch::deadline`](crate::batcher::Batch::deadline)), with an
    /// operation timeout.
    deadline: Option<Instant>,
    ops: Vec<Op>,
    /// The slot of each of `ops` (requeue on), else empty.
    handles: Vec<Key>,
}

/// A copy of a batch in the transport, kept for a resend when requeue is on: the key it was
/// sent with, a clone of each operation and the operation's slot.
struct Kept<Shard, Op> {
    key: Shard,
    ops: Vec<Op>,
    handles: Vec<Key>,
}

/// Requeue-and-pause, set by [`BatchDriverBuilder::with_requeue`]: how to copy an operation
/// for a resend, and the reconnect backoff a torn shard pauses for.
pub(super) struct Requeue<Op> {
    pub(super) copy: fn(&Op) -> Op,
    pub(super) backoff: BackoffConfig,
}

/// A shard whose stream tore: its backoff sequence since its last answered batch, and when
/// it resumes while paused.
struct Reconnecting {
    backoff: Backoff,
    resume_at: Option<Instant>,
}

/// What a critical section decided, carried out after the lock is dropped.
struct Effects<T: Transport<Shard, Op>, Shard, Op> {
    /// Each batch to send (concurrent mode).
    sends: Vec<Outgoing<Shard, Op>>,
    /// The batcher's events, with the user's shard keys, for the sink.
    events: Drained<BatchEvent<Shard>>,
    done: Vec<Done<T, Shard, Op>>,
    /// Lane tasks to start or wake ([`SendOrder::PerShard`]).
    lanes: ordered::LaneWork,
    /// The driver task, to wake for a new timer (a torn shard's resume).
    driver: Option<Waker>,
}

/// A dispatched batch ready for `send` ([`BatchDriver::prepare`]).
struct Prepared<Shard, Op> {
    key: Shard,
    credit: CreditId,
    ops: Vec<Op>,
    /// The copy kept for a resend (requeue on).
    kept: Option<Kept<Shard, Op>>,
    /// When the send ends as timed out (an operation timeout is configured): the batch's
    /// [`deadline`](crate::batcher::Batch::deadline).
    deadline: Option<Instant>,
}

/// `sending`, unless `timer` fires first (`None`). Polls `sending` first, so an answer ready
/// at the deadline wins.
async fn race<F, D>(sending: F, timer: Option<D>) -> Option<F::Output>
where
    F: Future,
    D: Future<Output = ()>,
{
    let mut sending = core::pin::pin!(sending);
    let mut timer = core::pin::pin!(timer);
    core::future::poll_fn(|cx| {
        if let Poll::Ready(out) = sending.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        match timer.as_mut().as_pin_mut().map(|t| t.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(None),
            _ => Poll::Pending,
        }
    })
    .await
}

/// A submitter's slot and the result to hand it.
type Done<T, Shard, Op> = (Sender<OpResult<T, Shard, Op>>, OpResult<T, Shard, Op>);

/// Why a batch failed as a whole, passed to [`Batcher::handle_failure`], which hands each
/// operation of the batch its own copy in [`FailReason::BatchFailed`] (a copy shares the
/// transport's error through [`BatchFailure`]'s `Arc`).
enum BatchEnd<E> {
    /// The transport failed the batch.
    Failed(BatchFailure<E>),
    /// `send` or its future panicked.
    Panicked,
    /// The send task was dropped before the transport answered.
    Abandoned,
    /// The transport had not answered by the batch's operation timeout.
    TimedOut,
}

impl<E> Clone for BatchEnd<E> {
    fn clone(&self) -> Self {
        match self {
            BatchEnd::Failed(f) => BatchEnd::Failed(f.clone()),
            BatchEnd::Panicked => BatchEnd::Panicked,
            BatchEnd::Abandoned => BatchEnd::Abandoned,
            BatchEnd::TimedOut => BatchEnd::TimedOut,
        }
    }
}

impl<E> BatchEnd<E> {
    /// The operation's error.
    fn into_error(self) -> OpError<E> {
        match self {
            BatchEnd::Failed(f) => OpError::Batch(f),
            BatchEnd::Panicked => OpError::Panicked(Panicked),
            BatchEnd::Abandoned => OpError::NoResponse,
            BatchEnd::TimedOut => OpError::TimedOut(TimedOut),
        }
    }
}

/// How the batch whose end is being reported ended (`K`: the copy kept for a resend).
enum Ending<O, E, K> {
    /// No batch ended (a flush, a close): nothing to deliver.
    Nothing,
    /// The transport answered: results by position, each taken once.
    Answered(Vec<Option<Result<O, E>>>),
    /// The transport failed the whole batch.
    Failed(BatchFailure<E>),
    /// The transport failed the whole batch with an error it classed as a torn stream
    /// ([`Transport::torn`]), and a copy of the batch was kept: requeue it.
    Torn(BatchFailure<E>, K),
    /// `send` or its future panicked.
    Panicked,
    /// The send task was dropped before the transport answered (the runtime shut down).
    Abandoned,
    /// The operation timeout passed before the transport answered.
    TimedOut,
}

/// A batch end as the driver reports it.
type EndOf<T, Shard, Op> = Ending<
    <T as Transport<Shard, Op>>::Output,
    <T as Transport<Shard, Op>>::Error,
    Kept<Shard, Op>,
>;

/// A send future's output once raced against the operation timeout: `None` if the timeout
/// came first.
type Raced<O, E> = Option<BatchOutcome<O, E>>;

/// A batching driver over a [`Batcher`] and a user [`Transport`]. `Clone + Send + Sync`;
/// clones submit to the same driver.
///
/// # Contract
///
/// - [`submit(shard, op)`](Self::submit) returns a [`Submit`] future of the operation's result.
///   The operation is queued at once (not on first poll). Dropping the future before the
///   operation's batch left withdraws the operation ([`Batcher::cancel`]): the transport never
///   sees it, and a batch left empty is never sent (its turn for a credit goes to the shard's
///   next batch). Dropped later, the operation still goes out and its result is discarded.
/// - Batching: the driver task drains the queue, then flushes: a shard with free credit sends
///   its open batch at once; an exhausted shard's batch is parked and grows until a credit
///   returns. At most the shard's window limit of batches are in the transport: the
///   configured `window.max_in_flight`, or, built
///   [`with_limiter`](BatchDriverBuilder::with_limiter), the shard's limiter's limit.
/// - Send order: each batch is sent and awaited on its own ([`SendOrder::Concurrent`], what
///   [`new`](Self::new) builds), or, built with
///   [`builder`](Self::builder)`.with_send_order(SendOrder::PerShard)`, each shard's batches
///   are sent, and their futures first polled, in dispatch order (see [`SendOrder`]).
/// - [`close`](Self::close) fails every operation not yet sent (queued, open or parked) with
///   [`OpError::Closed`], refuses later submits, and stops the driver task; batches already in
///   the transport finish normally. [`drain`](Self::drain) refuses later submits too, but
///   sends everything already submitted and resolves once all of it has ended. Until one of
///   them, the driver task lives on (it holds the driver), so close or drain a driver you are
///   done with.
/// - A panic in the transport's `op_bytes`, `send` or `send`'s future fails the operations it
///   concerned with [`OpError::Panicked`]; the batch's credit is released and later submits to
///   the shard proceed. A send task the runtime drops unfinished releases its credit too
///   (its operations fail with [`OpError::NoResponse`]).
/// - The shard key's `Hash`, `Eq` and `Clone` run only in `submit` (and in the queries
///   [`in_flight`](Self::in_flight) and [`open_ops`](Self::open_ops)), before it queues
///   anything: a panic there fails that submit alone with [`OpError::Panicked`]. The driver
///   task, the batches' ends and `close` run no key code. (The key's `Drop` is not covered.)
///
/// The hasher `S` defaults to std's [`RandomState`](std::hash::RandomState), which
/// [`new`](BatchDriver::new) uses; [`with_hasher`](Self::with_hasher) takes any other.
///
/// A transport that answers each get `k` with `2 k`, on a tiny runtime of the example's own
/// (hidden: a [`ManualClock`](super::ManualClock) and a task queue that `block_on` polls;
/// `throttle_tokio::TokioRuntime` in an application):
///
/// ```
#[doc = include_str!("../doc/tiny_runtime.md")]
/// use throttle_sansio::BatcherConfig;
/// use throttle_sansio::sync::{BatchDriver, BatchOutcome, Transport};
///
/// struct Doubler;
///
/// impl Transport<u8, u64> for Doubler {
///     type Output = u64;
///     type Error = std::io::Error;
///
///     fn send(
///         &self,
///         _shard: &u8,
///         gets: Vec<u64>,
///     ) -> impl Future<Output = BatchOutcome<u64, std::io::Error>> + Send + 'static {
///         core::future::ready(Ok(gets.into_iter().map(|k| Ok(2 * k)).collect()))
///     }
/// }
///
/// let rt = Tiny::default();
/// let driver: BatchDriver<_, _, u8, u64> =
///     BatchDriver::new(rt.clone(), Doubler, BatcherConfig::reads());
/// let (a, b) = (driver.submit(1, 20), driver.submit(1, 21)); // one batch to shard 1
/// assert_eq!(rt.block_on(a).unwrap(), 40);
/// assert_eq!(rt.block_on(b).unwrap(), 42);
/// driver.close(); // graceful shutdown: nothing held back is left, then
/// rt.block_on(driver.closed()); // wait for every batch in flight to end
/// ```
pub struct BatchDriver<R, T: Transport<Shard, Op>, Shard, Op, S = std::hash::RandomState> {
    shared: Arc<DriverShared<R, T, Shard, Op, S>>,
    /// The same driver, for the [`Submit`]s it hands out to withdraw their operation on drop
    /// (type-erased, so `Submit` names only the result's types).
    withdraw: Arc<dyn Withdraw>,
}

impl<R, T: Transport<Shard, Op>, Shard, Op, S> Clone for BatchDriver<R, T, Shard, Op, S> {
    fn clone(&self) -> Self {
        BatchDriver {
            shared: Arc::clone(&self.shared),
            withdraw: Arc::clone(&self.withdraw),
        }
    }
}

/// The driver's five type parameters with their bounds, written once: its inner parts (the
/// withdrawer, the send guards, the lane tasks) take one parameter `P`, the tuple
/// `(R, T, Shard, Op, S)`, whose bounds the compiler then knows from this trait alone.
trait Parts: 'static {
    type R: Runtime;
    type T: Transport<Self::Shard, Self::Op>;
    type Shard: Hash + Eq + Clone + Send + 'static;
    type Op: Send + 'static;
    type S: BuildHasher + Clone + Send + 'static;
}

impl<
    R: Runtime,
    T: Transport<Shard, Op>,
    Shard: Hash + Eq + Clone + Send + 'static,
    Op: Send + 'static,
    S: BuildHasher + Clone + Send + 'static,
> Parts for (R, T, Shard, Op, S)
{
    type R = R;
    type T = T;
    type Shard = Shard;
    type Op = Op;
    type S = S;
}

/// The driver whose parts are `P`.
type DriverOf<P> = BatchDriver<
    <P as Parts>::R,
    <P as Parts>::T,
    <P as Parts>::Shard,
    <P as Parts>::Op,
    <P as Parts>::S,
>;

/// What a dropped [`Submit`] asks of its driver.
trait Withdraw: Send + Sync {
    /// Withdraws the operation in slot `slot` if its batch has not left.
    fn withdraw(&self, slot: Key);
}

/// The driver's [`Withdraw`]: a second handle on its shared state.
struct Withdrawer<P: Parts> {
    // The driver's state alone, not a driver: the driver holds its withdrawer.
    #[allow(clippy::type_complexity)]
    shared: Arc<DriverShared<P::R, P::T, P::Shard, P::Op, P::S>>,
}

impl<P: Parts> Withdraw for Withdrawer<P> {
    fn withdraw(&self, slot: Key) {
        let taken = {
            let mut guard = lock(&self.shared.state);
            let st = &mut *guard;
            let Some(op) = st.slots.get(slot) else {
                return; // it ended
            };
            if op.op.is_none() {
                return; // its batch left: too late, the result is dropped when it comes
            }
            match op.in_batcher {
                // Still in the input queue: the driver task skips its entry.
                None => st.withdrawn += 1,
                Some(id) => match st.batcher.cancel(id) {
                    Ok(Withdrawal::Withdrawn(_)) => {}
                    // Unreachable: its operation is still here, so its batch has not left.
                    _ => return,
                },
            }
            take_slot(st, slot)
        };
        // The operation, its key and its result slot are dropped after unlock.
        drop(taken);
    }
}

/// Type-erases a driver's [`Withdrawer`] (loom's `Arc` cannot coerce, so it converts a std one).
fn erase<W: Withdraw + 'static>(w: W) -> Arc<dyn Withdraw> {
    #[cfg(all(test, loom))]
    {
        let std: std::sync::Arc<dyn Withdraw> = std::sync::Arc::new(w);
        Arc::from_std(std)
    }
    #[cfg(not(all(test, loom)))]
    {
        Arc::new(w)
    }
}

impl<R, T: Transport<Shard, Op>, Shard, Op, S> fmt::Debug for BatchDriver<R, T, Shard, Op, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchDriver").finish_non_exhaustive()
    }
}

/// The future of [`BatchDriver::submit`]: the operation's result.
///
/// Dropping it cancels the operation: if its batch has not left yet, the operation is
/// withdrawn and never reaches the transport; if it has, the operation completes and its
/// result is discarded. Either way nothing is stranded (`docs/sync.md`).
///
/// ```
#[doc = include_str!("../doc/tiny_runtime.md")]
/// use throttle_sansio::{BatcherConfig, WindowConfig};
/// use throttle_sansio::sync::{BatchDriver, BatchOutcome, Transport};
///
/// /// Records every get it receives, as the server would see them.
/// #[derive(Clone, Default)]
/// struct Server(Arc<Mutex<Vec<u64>>>);
///
/// impl Transport<u8, u64> for Server {
///     type Output = u64;
///     type Error = std::io::Error;
///
///     fn send(
///         &self,
///         _shard: &u8,
///         gets: Vec<u64>,
///     ) -> impl Future<Output = BatchOutcome<u64, std::io::Error>> + Send + 'static {
///         self.0.lock().unwrap().extend(&gets);
///         core::future::ready(Ok(gets.into_iter().map(Ok).collect()))
///     }
/// }
///
/// let (rt, server) = (Tiny::default(), Server::default());
/// let driver: BatchDriver<_, _, u8, u64> =
///     BatchDriver::new(rt.clone(), server.clone(), BatcherConfig::reads());
/// let wanted = driver.submit(1, 7);
/// let given_up = driver.submit(1, 8);
/// drop(given_up); // before its batch left: withdrawn
/// assert_eq!(rt.block_on(wanted).unwrap(), 7);
/// assert_eq!(*server.0.lock().unwrap(), [7], "the server never saw 8");
/// ```
#[must_use = "the operation is withdrawn if this is dropped before its batch leaves"]
pub struct Submit<O, E> {
    rx: Receiver<Result<O, OpError<E>>>,
    /// The driver and the operation's slot, until the result is taken: what `Drop` withdraws.
    pending: Option<(Arc<dyn Withdraw>, Key)>,
}

impl<O, E> Submit<O, E> {
    /// A submit that already has its result (refused at once): nothing to withdraw.
    fn done(result: Result<O, OpError<E>>) -> Self {
        let (tx, rx) = oneshot::channel();
        tx.send(result);
        Submit { rx, pending: None }
    }
}

impl<O, E> fmt::Debug for Submit<O, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Submit")
            .field("pending", &self.pending.is_some())
            .finish_non_exhaustive()
    }
}

impl<O, E> Future for Submit<O, E> {
    type Output = Result<O, OpError<E>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let result = Pin::new(&mut this.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(OpError::Closed)));
        if result.is_ready() {
            this.pending = None; // it ended: nothing to withdraw
        }
        result
    }
}

impl<O, E> Drop for Submit<O, E> {
    fn drop(&mut self) {
        if let Some((driver, slot)) = self.pending.take() {
            driver.withdraw(slot);
        }
    }
}

impl<R, T, Shard, Op> BatchDriver<R, T, Shard, Op, std::hash::RandomState>
where
    R: Runtime,
    T: Transport<Shard, Op>,
    Shard: Hash + Eq + Clone + Send + 'static,
    Op: Send + 'static,
{
    /// A driver batching with `cfg` (shard keys hashed with a fresh std
    /// [`RandomState`](std::hash::RandomState)), sending through `transport`; its task is
    /// spawned on `rt`. Infallible: a [`BatcherConfig`] is valid by construction (its one
    /// fallible part, [`BatcherConfig::with_window`], refuses a bad window). For another
    /// hasher, [`with_hasher`](Self::with_hasher); for per-shard ordered sends,
    /// [`builder`](Self::builder).
    ///
    /// # Panics
    ///
    /// If `rt`'s [`spawn`](Runtime::spawn) panics: `throttle_tokio::TokioRuntime` does when it
    /// was made outside a tokio runtime and this is called outside one too (make it with
    /// `TokioRuntime::with_handle`, or inside the runtime). Nothing is left behind then.
    pub fn new(rt: R, transport: T, cfg: BatcherConfig) -> Self {
        Self::with_hasher(rt, transport, cfg, std::hash::RandomState::new())
    }

    /// A builder of a driver batching with `cfg` and sending through `transport` on `rt`;
    /// until told otherwise it builds what [`new`](Self::new) does ([`SendOrder::Concurrent`],
    /// a fresh std [`RandomState`](std::hash::RandomState)).
    pub fn builder(
        rt: R,
        transport: T,
        cfg: BatcherConfig,
    ) -> BatchDriverBuilder<R, T, Shard, Op, std::hash::RandomState> {
        BatchDriverBuilder::new(
            rt,
            transport,
            cfg,
            std::hash::RandomState::new(),
            Self::start,
        )
    }
}

impl<R, T, Shard, Op, S> BatchDriver<R, T, Shard, Op, S>
where
    R: Runtime,
    T: Transport<Shard, Op>,
    Shard: Hash + Eq + Clone + Send + 'static,
    Op: Send + 'static,
    S: BuildHasher + Clone + Send + 'static,
{
    /// As [`new`](Self::new), hashing shard keys with `hasher`.
    ///
    /// # Panics
    ///
    /// If `rt`'s [`spawn`](Runtime::spawn) panics, as for [`new`](Self::new).
    pub fn with_hasher(rt: R, transport: T, cfg: BatcherConfig, hasher: S) -> Self {
        Self::start(BatchDriverBuilder::new(
            rt,
            transport,
            cfg,
            hasher,
            Self::start,
        ))
    }

    /// Builds the driver `builder` describes and spawns its task (every constructor ends here).
    fn start(builder: BatchDriverBuilder<R, T, Shard, Op, S>) -> Self {
        let BatchDriverBuilder {
            rt,
            transport,
            cfg,
            hasher,
            order,
            requeue,
            limiter,
            ..
        } = builder;
        let keep_sent = requeue.is_some();
        let shared = Arc::new(DriverShared {
            rt,
            transport,
            op_timeout: cfg.op_timeout(),
            size_limit: cfg.max_batch_bytes(),
            requeue,
            state: Mutex::new(DriverState {
                batcher: Batcher::with_hasher(cfg, hasher.clone()),
                shards: Shards::new(hasher),
                inbox: VecDeque::new(),
                withdrawn: 0,
                slots: Slab::new(),
                driver: None,
                closed: false,
                delivering: 0,
                lanes: ordered::Lanes::new(order),
                reconnecting: Vec::new(),
                rng: super::client_rng(super::next_client_id()),
                keep_sent,
                events_lost: 0,
                adaptive: limiter.and_then(|cfg| PerShard::new(cfg).ok()),
            }),
            drained: WakeSignal::new(),
            tap: EventTap::default(),
        });
        let driver = BatchDriver {
            withdraw: erase(Withdrawer::<(R, T, Shard, Op, S)> {
                shared: Arc::clone(&shared),
            }),
            shared,
        };
        let task = driver.clone();
        driver.shared.rt.spawn(async move { task.run().await });
        driver
    }

    /// Sends the batcher's observation events ([`BatchEvent`]: every batch dispatched, with
    /// its shard, credit, operations and bytes, and every batch credit released) to `sink`,
    /// for every clone, replacing any sink set before, and turns them on (they are off until
    /// then, and cost nothing). The sink is called as
    /// [`GateHandle::set_event_sink`](super::GateHandle::set_event_sink) describes: outside
    /// the lock, once per event, in order, with a panic caught and counted
    /// ([`event_sink_panics`](Self::event_sink_panics)). The shard key is cloned for each
    /// `Dispatched` under `catch_unwind`: a panicking `Clone` loses that event only.
    pub fn set_event_sink(&self, sink: impl EventSink<BatchEvent<Shard>> + 'static) {
        self.install_sink(Some(std::sync::Arc::new(sink)));
    }

    /// Removes the event sink and turns the batcher's events off again.
    pub fn clear_event_sink(&self) {
        self.install_sink(None);
    }

    fn install_sink(&self, sink: Option<std::sync::Arc<dyn EventSink<BatchEvent<Shard>>>>) {
        self.shared.tap.install(
            core::slice::from_ref(&self.shared.state),
            sink,
            |st, capacity| {
                st.batcher.set_event_capacity(capacity);
            },
        );
    }

    /// Events the sink panicked on (each one lost; nothing else changed).
    pub fn event_sink_panics(&self) -> u64 {
        self.shared.tap.panics()
    }

    /// Events lost before a sink saw them: to the batcher's bound, to a shard key's `Clone`
    /// that panicked as the driver copied it into one, or delivered just after a
    /// [`clear_event_sink`](Self::clear_event_sink).
    pub fn events_dropped(&self) -> u64 {
        let lost = {
            let st = lock(&self.shared.state);
            st.batcher.events_dropped().saturating_add(st.events_lost)
        };
        lost.saturating_add(self.shared.tap.unseen())
    }

    /// Queues `op` for `shard`; the future resolves with its result (see the contract).
    ///
    /// The only call that runs the key's `Hash`, `Eq` and `Clone` (a shard new to the driver
    /// is cloned once); a panic in one of them, or in [`Transport::op_bytes`], fails this
    /// submit with [`OpError::Panicked`] and queues nothing.
    pub fn submit(&self, shard: Shard, op: Op) -> Submit<T::Output, T::Error> {
        // User code, before anything is queued: a panic fails this operation alone.
        let Ok(bytes) = unwind::call(|| self.shared.transport.op_bytes(&op)) else {
            return Submit::done(Err(OpError::Panicked(Panicked)));
        };
        let (tx, rx) = oneshot::channel();
        let (waker, slot, sized) = {
            let mut guard = lock(&self.shared.state);
            let st = &mut *guard;
            if st.closed {
                drop(guard);
                return Submit::done(Err(OpError::Closed));
            }
            // The key's code, caught under the lock: `intern` runs all of it before it changes
            // anything, so a panic leaves the state as it was (and the lock unpoisoned).
            let Ok(id) = unwind::call(|| st.shards.intern(&shard)) else {
                drop(guard);
                return Submit::done(Err(OpError::Panicked(Panicked)));
            };
            let slot = OpSlot {
                op: Some(op),
                key: Some(shard),
                shard: id,
                in_batcher: None,
                tx,
            };
            let key = match st.slots.insert(slot) {
                Ok(key) => key,
                Err((_, refused)) => {
                    // 2^64 submits (or 2^32 at once): never in practice.
                    let _ = st.shards.release(id);
                    drop(guard);
                    drop(refused);
                    return Submit::done(Err(OpError::Closed));
                }
            };
            let mut sized = None;
            if bytes > self.shared.size_limit {
                // Over the batch limit: handed to the batcher now, behind the input queue, so
                // that the batcher's verdict on its size (`Oversized`) reaches this call.
                let now = self.shared.rt.now();
                let mut effects = Effects::new();
                feed(st, now, &mut effects);
                admit(st, now, (id, key, bytes), &mut effects);
                sized = Some(effects);
            } else {
                st.inbox.push_back((id, key, bytes));
            }
            (st.driver.take(), key, sized)
        };
        if let Some(effects) = sized {
            self.apply(effects);
        }
        if let Some(w) = waker {
            wake_one(w);
        }
        Submit {
            rx,
            pending: Some((Arc::clone(&self.withdraw), slot)),
        }
    }

    /// The failing close: fails every operation whose batch has not been dispatched (given a
    /// credit) with [`OpError::Closed`], in submission order (oldest first), refuses later
    /// submits and stops the driver task. Dispatched batches finish normally: in
    /// [`SendOrder::PerShard`] mode that includes batches already in a shard's lane that the
    /// lane has not yet handed to [`Transport::send`]. Idempotent. For a close that sends
    /// everything accepted, see [`drain`](Self::drain).
    pub fn close(&self) {
        let (effects, waker, drained) = {
            let mut guard = lock(&self.shared.state);
            let st = &mut *guard;
            st.closed = true;
            let now = self.shared.rt.now();
            let mut effects = Effects::new();
            // Oldest first: what the batcher holds back arrived before what still waits in
            // the input queue, and the batcher fails its own in arrival order.
            st.batcher.close();
            drain(st, now, &mut effects, &mut Ending::Nothing);
            while let Some((_, index, _)) = st.inbox.pop_front() {
                if let Some(slot) = take_slot(st, index) {
                    effects.done.push((slot.tx, Err(OpError::Closed)));
                }
            }
            st.withdrawn = 0;
            st.delivering += 1;
            (effects, st.driver.take(), st.is_drained())
        };
        debug_assert!(!drained, "a delivery is in progress");
        self.apply(effects);
        if let Some(w) = waker {
            wake_one(w);
        }
        self.delivered(1);
    }

    /// The draining close: refuses later submits (with [`OpError::Closed`]) and stops the
    /// driver task, but sends every operation already submitted: the input queue goes to the
    /// batcher, open batches go out now, and held-back batches go out as credits return
    /// ([`Batcher::drain`]), keeping batch boundaries and each shard's submission order. The
    /// returned future resolves once every one of them has ended and its result was handed
    /// to its submitter (it is [`closed`](Self::closed)). The draining happens at the call,
    /// not on first poll, so dropping the future drains all the same.
    /// [`close`](Self::close) afterwards fails whatever is still held back. Idempotent; after
    /// `close`, only waits.
    ///
    /// ```
    #[doc = include_str!("../doc/tiny_runtime.md")]
    /// use throttle_sansio::BatcherConfig;
    /// use throttle_sansio::sync::{BatchDriver, BatchOutcome, OpError};
    ///
    /// let send = |_: &u8, gets: Vec<u64>| async move {
    ///     let ok: BatchOutcome<u64, std::io::Error> = Ok(gets.into_iter().map(Ok).collect());
    ///     ok
    /// };
    /// let rt = Tiny::default();
    /// let driver: BatchDriver<_, _, u8, u64> =
    ///     BatchDriver::new(rt.clone(), send, BatcherConfig::reads());
    /// let (a, b) = (driver.submit(1, 7), driver.submit(2, 8));
    /// let drained = driver.drain();
    /// assert!(matches!(rt.block_on(driver.submit(1, 9)), Err(OpError::Closed)));
    /// rt.block_on(drained);
    /// assert_eq!((rt.block_on(a).unwrap(), rt.block_on(b).unwrap()), (7, 8));
    /// ```
    pub fn drain(&self) -> impl Future<Output = ()> + '_ {
        let (effects, waker) = {
            let mut guard = lock(&self.shared.state);
            let st = &mut *guard;
            let effects = if st.closed {
                None
            } else {
                st.closed = true;
                let now = self.shared.rt.now();
                let mut effects = Effects::new();
                feed(st, now, &mut effects);
                st.batcher.drain(now);
                drain(st, now, &mut effects, &mut Ending::Nothing);
                st.delivering += 1;
                Some(effects)
            };
            (effects, st.driver.take())
        };
        if let Some(effects) = effects {
            self.apply(effects);
            self.delivered(1);
        }
        if let Some(w) = waker {
            wake_one(w);
        }
        self.closed()
    }

    /// Resolves once the driver is closed (or draining) and nothing is held back or in the
    /// transport (every batch sent has ended and delivered its results). With
    /// [`close`](Self::close), a graceful shutdown that fails what was held back:
    /// `driver.close(); driver.closed().await`; [`drain`](Self::drain) sends it instead.
    /// Cancel-safe.
    pub async fn closed(&self) {
        wait_for(&self.shared.drained, || {
            lock(&self.shared.state).is_drained()
        })
        .await;
    }

    /// Operation slots in use (submitted, not yet ended or withdrawn), for the loom models.
    #[cfg(all(test, loom))]
    pub(crate) fn slots_in_use(&self) -> usize {
        lock(&self.shared.state).slots.live()
    }

    /// Whether [`close`](Self::close) or [`drain`](Self::drain) was called (submits are
    /// refused from then on).
    pub fn is_closed(&self) -> bool {
        lock(&self.shared.state).closed
    }

    /// Batches of `shard` in the transport now (at most the window's capacity).
    ///
    /// Runs the key's `Hash` and `Eq`; a panic there propagates to the caller and changes
    /// nothing (as for the handles' queries).
    pub fn in_flight(&self, shard: &Shard) -> u32 {
        let st = lock(&self.shared.state);
        // A shard with no operation in the driver is not stored, and has nothing in flight.
        st.shards
            .find(shard)
            .map_or(0, |id| st.batcher.window().in_flight(&id))
    }

    /// `shard`'s window limit now: its limiter's limit with
    /// [`BatchDriverBuilder::with_limiter`] once its first batch left, else the configured
    /// one. Runs the key's `Hash` and `Eq`, as [`in_flight`](Self::in_flight) does.
    pub fn capacity_of(&self, shard: &Shard) -> u32 {
        let st = lock(&self.shared.state);
        match st.shards.find(shard) {
            Some(id) => st.batcher.window().capacity_of(&id),
            None => st.batcher.window().capacity(),
        }
    }

    /// Operations of `shard` waiting in its open (or parked) batch. Runs the key's `Hash` and
    /// `Eq`, as [`in_flight`](Self::in_flight) does.
    pub fn open_ops(&self, shard: &Shard) -> usize {
        let st = lock(&self.shared.state);
        st.shards
            .find(shard)
            .map_or(0, |id| st.batcher.open_ops(&id))
    }

    /// Operations submitted and not yet handed to the batcher, queued for the driver task
    /// (withdrawn ones not counted).
    pub fn queued(&self) -> usize {
        let st = lock(&self.shared.state);
        st.inbox.len().saturating_sub(st.withdrawn)
    }

    /// The driver task: run the timers that are due (the batcher's operation timeouts and
    /// maintenance, first, so that no operation past its deadline is flushed; the resumes of
    /// paused shards), drain the input queue, flush when it is empty, then sleep until a
    /// submit or the next timer. After a close it lives on only while
    /// timers remain and the driver is not drained (a draining driver's paused shards must
    /// still resume, its held operations still time out).
    async fn run(self) {
        let mut timer = None;
        core::future::poll_fn(|cx| {
            loop {
                let now = self.shared.rt.now();
                let (effects, next, stop) = {
                    let mut guard = lock(&self.shared.state);
                    let st = &mut *guard;
                    let mut effects = Effects::new();
                    let mut busy = false;
                    if st.batcher.poll_timeout().is_some_and(|at| at <= now) {
                        st.batcher.handle_timeout(now);
                        busy = true;
                    }
                    if !st.closed && !st.inbox.is_empty() {
                        feed(st, now, &mut effects);
                        // The input queue is empty: the rate-adaptive flush.
                        st.batcher.flush(now);
                        busy = true;
                    }
                    busy |= resume_due(st, now);
                    if busy {
                        drain(st, now, &mut effects, &mut Ending::Nothing);
                    }
                    // A deadline that did not move past `now` waits for the next wake.
                    let next = next_deadline(st).filter(|&at| at > now);
                    // After a close only the operation timeouts and the resumes of paused
                    // shards keep the task (not the batcher's maintenance).
                    let needed = self.shared.op_timeout.is_some()
                        || st
                            .reconnecting
                            .iter()
                            .any(|r| r.as_ref().is_some_and(|r| r.resume_at.is_some()));
                    let stop = st.closed && (!needed || next.is_none() || st.is_drained());
                    if !busy
                        && !stop
                        && !st.driver.as_ref().is_some_and(|w| w.will_wake(cx.waker()))
                    {
                        st.driver = Some(cx.waker().clone());
                    }
                    (busy.then_some(effects), next, stop)
                };
                if let Some(effects) = effects {
                    self.apply(effects);
                    continue;
                }
                if stop {
                    return Poll::Ready(());
                }
                let Some(at) = next else {
                    timer = None;
                    return Poll::Pending;
                };
                if !matches!(&timer, Some((armed, _)) if *armed == at) {
                    timer = Some((at, Box::pin(self.shared.rt.sleep_until(at))));
                }
                if let Some((_, sleep)) = timer.as_mut() {
                    if sleep.as_mut().poll(cx).is_ready() {
                        timer = None;
                        continue;
                    }
                }
                return Poll::Pending;
            }
        })
        .await;
    }

    /// Carries out a critical section's decisions: results to submitters, batches to the
    /// transport (each in its own task, which reports the batch's end). A `send` that panics
    /// ends its batch as [`Ending::Panicked`] here, and whatever that release decides is
    /// carried out in the same loop (no recursion).
    fn apply(&self, mut effects: Effects<T, Shard, Op>) {
        let mut ended = 0;
        loop {
            self.shared
                .tap
                .deliver(core::mem::take(&mut effects.events));
            for (tx, result) in effects.done.drain(..) {
                tx.send(result);
            }
            let mut unsent = Vec::new();
            for out in effects.sends.drain(..) {
                let Prepared {
                    key,
                    credit,
                    ops,
                    kept,
                    deadline,
                } = match self.prepare(out) {
                    Ok(ready) => ready,
                    Err(ended) => {
                        unsent.push(ended);
                        continue;
                    }
                };
                let n = ops.len();
                match unwind::call(|| self.shared.transport.send(&key, ops)) {
                    Ok(sending) => {
                        let timer = deadline.map(|at| self.shared.rt.sleep_until(at));
                        self.spawn_send(credit, n, race(sending, timer), kept);
                    }
                    Err(Panicked) => unsent.push((credit, Ending::Panicked)),
                }
            }
            ordered::LaneRun::<(R, T, Shard, Op, S)>::carry(self, &mut effects.lanes);
            if let Some(w) = effects.driver.take() {
                wake_one(w);
            }
            if unsent.is_empty() {
                self.delivered(ended);
                return;
            }
            for (credit, ending) in unsent {
                effects.extend(self.end_batch(credit, ending));
                ended += 1;
            }
        }
    }

    /// Ends `n` deliveries counted by [`end_batch`](Self::end_batch) or `close` (their
    /// results are with the submitters now) and notifies `closed()` if that drained the
    /// driver.
    fn delivered(&self, n: usize) {
        if n == 0 {
            return;
        }
        let (drained, task) = {
            let mut st = lock(&self.shared.state);
            st.delivering = st.delivering.saturating_sub(n);
            let drained = st.is_drained();
            // A closed driver's task waiting on a timer ends once the driver is drained.
            (drained, if drained { st.driver.take() } else { None })
        };
        self.shared.drained.notify_if(drained);
        if let Some(w) = task {
            wake_one(w);
        }
    }

    /// Spawns the task that awaits one batch's `send` future and reports its end. The task owns
    /// the credit in a [`SendGuard`] from the start, so dropping the task at any point (the
    /// runtime shutting down, or the future never polled) still releases it. A `spawn` that
    /// panics is caught: it dropped the task, so the credit is back, and the other batches of
    /// this `apply` are still spawned.
    fn spawn_send(
        &self,
        credit: CreditId,
        ops: usize,
        sending: impl Future<Output = Raced<T::Output, T::Error>> + Send + 'static,
        kept: Option<Kept<Shard, Op>>,
    ) {
        let guard = SendGuard::<(R, T, Shard, Op, S)> {
            driver: self.clone(),
            credit: Some(credit),
        };
        let task = async move {
            let guard = guard;
            let outcome = unwind::catch(sending).await;
            let ending = guard.driver.ending(outcome, ops, kept);
            guard.finish(ending);
        };
        let _refused = unwind::call(|| self.shared.rt.spawn(task));
    }

    /// Readies a dispatched batch for `send`: keeps a copy of it first if requeue is on (the
    /// operations' and the key's `Clone` are user code: a panic fails the batch), with the
    /// deadline of its send, which the batcher decided (its oldest operation's). `Err`: the
    /// batch ended before it was sent.
    #[allow(clippy::type_complexity)]
    fn prepare(
        &self,
        out: Outgoing<Shard, Op>,
    ) -> Result<Prepared<Shard, Op>, (CreditId, EndOf<T, Shard, Op>)> {
        let Outgoing {
            key,
            credit,
            deadline,
            ops,
            handles,
        } = out;
        let Some(key) = key else {
            // Unreachable: each operation keeps its key until its batch is sent.
            debug_assert!(false, "a batch to send without a key");
            return Err((credit, Ending::Abandoned));
        };
        let kept = match &self.shared.requeue {
            Some(rq) => {
                let copy = || (key.clone(), ops.iter().map(rq.copy).collect::<Vec<Op>>());
                match unwind::call(copy) {
                    Ok((key, ops)) => Some(Kept { key, ops, handles }),
                    Err(Panicked) => return Err((credit, Ending::Panicked)),
                }
            }
            None => None,
        };
        Ok(Prepared {
            deadline,
            key,
            credit,
            ops,
            kept,
        })
    }

    /// How a batch of `ops` operations ended, from its raced send future's output (`Err`: the
    /// future panicked). A batch error is a torn stream if requeue is on and the transport
    /// says so ([`Transport::torn`], caught: a panic there is a plain failure).
    fn ending(
        &self,
        outcome: Result<Raced<T::Output, T::Error>, Panicked>,
        ops: usize,
        kept: Option<Kept<Shard, Op>>,
    ) -> EndOf<T, Shard, Op> {
        match outcome {
            Ok(Some(Ok(results))) => Ending::Answered(results.into_iter().map(Some).collect()),
            Ok(Some(Err(e))) => {
                let torn = kept.is_some()
                    && matches!(unwind::call(|| self.shared.transport.torn(&e)), Ok(true));
                let failure = BatchFailure {
                    error: ErrArc::new(e),
                    ops,
                };
                match kept {
                    Some(kept) if torn => Ending::Torn(failure, kept),
                    _ => Ending::Failed(failure),
                }
            }
            Ok(None) => Ending::TimedOut,
            Err(Panicked) => Ending::Panicked,
        }
    }

    /// Reports a batch's end and carries out what the release decides.
    fn finish(&self, credit: CreditId, ending: EndOf<T, Shard, Op>) {
        let effects = self.end_batch(credit, ending);
        self.apply(effects);
        self.delivered(1);
    }

    /// Under the lock: the batch under `credit` ended as `ending`. Releases the credit (once:
    /// the batcher refuses a second release) and collects the results and the next sends.
    /// Counts one delivery in progress: end it with [`delivered`](Self::delivered) once the
    /// effects are carried out.
    fn end_batch(
        &self,
        credit: CreditId,
        mut ending: EndOf<T, Shard, Op>,
    ) -> Effects<T, Shard, Op> {
        let mut guard = lock(&self.shared.state);
        let st = &mut *guard;
        let now = self.shared.rt.now();
        let mut effects = Effects::new();
        // Operations past their deadline time out first, so the credit this end frees does
        // not send them (the driver task may not have run its timer yet).
        if st.batcher.poll_timeout().is_some_and(|at| at <= now) {
            st.batcher.handle_timeout(now);
        }
        // A failure goes to the batcher, which copies it to each operation's `Fail`.
        // An unknown credit cannot come back here (each credit is reported once), so what
        // each release returns is not needed.
        let end = match &ending {
            Ending::Answered(_) => LimitEnd::Answered,
            Ending::Failed(_) => LimitEnd::Failed,
            Ending::TimedOut => LimitEnd::TimedOut {
                timeout: self.shared.op_timeout.unwrap_or(Duration::ZERO),
            },
            _ => LimitEnd::Other,
        };
        match core::mem::replace(&mut ending, Ending::Nothing) {
            Ending::Answered(results) => {
                let n = results.len();
                ending = Ending::Answered(results);
                answered(st, credit);
                let _ = st.batcher.handle_response(now, credit, 0..n);
            }
            Ending::Failed(f) => {
                let _ = st.batcher.handle_failure(now, credit, BatchEnd::Failed(f));
            }
            Ending::Torn(f, kept) => {
                if let Some(rq) = &self.shared.requeue {
                    if requeue(st, rq, now, credit, f, kept) {
                        effects.driver = st.driver.take();
                    }
                }
            }
            Ending::Panicked => {
                let _ = st.batcher.handle_failure(now, credit, BatchEnd::Panicked);
            }
            Ending::TimedOut => {
                let _ = st.batcher.handle_failure(now, credit, BatchEnd::TimedOut);
            }
            Ending::Abandoned | Ending::Nothing => {
                let _ = st.batcher.handle_failure(now, credit, BatchEnd::Abandoned);
            }
        }
        adapt_ended(st, now, credit, end);
        drain(st, now, &mut effects, &mut ending);
        st.delivering += 1;
        effects
    }

    /// A dropped send task's end: releases the credit and fails the batch with
    /// [`OpError::NoResponse`] (or [`OpError::Panicked`] while unwinding). The batches that the
    /// release would send are failed the same way instead of sent: this runs in a destructor
    /// (the runtime is dropping tasks, or a panic is unwinding), where no transport is called.
    fn abandon(&self, credit: CreditId) {
        let end = || {
            if std::thread::panicking() {
                BatchEnd::Panicked
            } else {
                BatchEnd::Abandoned
            }
        };
        let (done, events) = {
            let mut guard = lock(&self.shared.state);
            let st = &mut *guard;
            let now = self.shared.rt.now();
            let mut effects = Effects::new();
            let mut credits = alloc::vec![credit];
            while let Some(credit) = credits.pop() {
                let _ = st.batcher.handle_failure(now, credit, end());
                // Its limiter counts it out of flight (and learns nothing from it).
                adapt_ended(st, now, credit, LimitEnd::Other);
                drain(st, now, &mut effects, &mut Ending::Nothing);
                credits.extend(effects.sends.drain(..).map(|out| out.credit));
            }
            st.delivering += 1;
            (effects.done, effects.events)
        };
        // The releases and the dispatches this end made (each failed at once here), after
        // unlock and before the results, as `apply` does.
        self.shared.tap.deliver(events);
        for (tx, result) in done {
            tx.send(result);
        }
        self.delivered(1);
    }
}

/// One send task's credit: released exactly once, by the task when the transport answers, or
/// by `Drop` if the task is dropped first.
struct SendGuard<P: Parts> {
    driver: DriverOf<P>,
    credit: Option<CreditId>,
}

impl<P: Parts> SendGuard<P> {
    /// The batch ended as `ending`: reports it (which releases the credit) instead of `Drop`.
    fn finish(mut self, ending: EndOf<P::T, P::Shard, P::Op>) {
        if let Some(credit) = self.credit.take() {
            self.driver.finish(credit, ending);
        }
    }
}

impl<P: Parts> Drop for SendGuard<P> {
    fn drop(&mut self) {
        if let Some(credit) = self.credit.take() {
            self.driver.abandon(credit);
        }
    }
}

impl<T: Transport<Shard, Op>, Shard, Op> Effects<T, Shard, Op> {
    fn new() -> Self {
        Effects {
            sends: Vec::new(),
            events: Drained::new(),
            done: Vec::new(),
            lanes: ordered::LaneWork::default(),
            driver: None,
        }
    }

    fn extend(&mut self, more: Self) {
        self.sends.extend(more.sends);
        self.events.extend(more.events);
        self.done.extend(more.done);
        self.lanes.extend(more.lanes);
        if more.driver.is_some() {
            self.driver = more.driver;
        }
    }
}

/// Hands every operation of the input queue to the batcher, in order (skipping withdrawn
/// entries); one the batcher refuses fails with [`OpError::Closed`].
fn feed<T, Shard, Op, S>(
    st: &mut DriverState<T, Shard, Op, S>,
    now: Instant,
    effects: &mut Effects<T, Shard, Op>,
) where
    T: Transport<Shard, Op>,
    S: BuildHasher + Clone,
{
    while let Some((shard, slot, bytes)) = st.inbox.pop_front() {
        if st.slots.get(slot).is_none() {
            // Withdrawn while it waited here.
            st.withdrawn = st.withdrawn.saturating_sub(1);
            continue;
        }
        admit(st, now, (shard, slot, bytes), effects);
    }
}

/// Hands one operation (its shard, slot and size) to the batcher; one it refuses fails with
/// the refusal's reason: [`OpError::TooLarge`], or [`OpError::Closed`].
fn admit<T, Shard, Op, S>(
    st: &mut DriverState<T, Shard, Op, S>,
    now: Instant,
    (shard, slot, bytes): (ShardId, Key, u64),
    effects: &mut Effects<T, Shard, Op>,
) where
    T: Transport<Shard, Op>,
    S: BuildHasher + Clone,
{
    adapt_open(st, now, shard);
    match st.batcher.handle_op(now, shard, slot, bytes) {
        Ok(id) => {
            if let Some(s) = st.slots.get_mut(slot) {
                s.in_batcher = Some(id);
            }
        }
        Err(refused) => {
            let error = match refused.reason() {
                RefuseReason::TooLarge { bytes, limit } => OpError::TooLarge { bytes, limit },
                _ => OpError::Closed,
            };
            if let Some(s) = take_slot(st, refused.into_handle()) {
                effects.done.push((s.tx, Err(error)));
            }
        }
    }
}

fn take_slot<T, Shard, Op, S>(
    st: &mut DriverState<T, Shard, Op, S>,
    slot: Key,
) -> Option<OpSlot<T, Shard, Op>>
where
    T: Transport<Shard, Op>,
{
    let slot = st.slots.remove(slot).ok()?;
    if st.shards.release(slot.shard) {
        forget_shard(st, slot.shard);
    }
    Some(slot)
}

/// The shard of the batch in flight under `credit` (through its first operation's slot).
fn shard_of<T, Shard, Op, S>(st: &DriverState<T, Shard, Op, S>, credit: CreditId) -> Option<ShardId>
where
    T: Transport<Shard, Op>,
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    let batch = st.batcher.batch(credit)?;
    batch
        .ops()
        .iter()
        .find_map(|&h| st.slots.get(h).map(|slot| slot.shard))
}

/// With an adaptive limit ([`BatchDriverBuilder::with_limiter`]): before `shard`'s first
/// operation goes to the batcher, its limiter is made and the shard's window takes the
/// initial limit, so the first burst already obeys it; the shard's id is kept for the limiter
/// from then on.
fn adapt_open<T, Shard, Op, S>(st: &mut DriverState<T, Shard, Op, S>, now: Instant, shard: ShardId)
where
    T: Transport<Shard, Op>,
    S: BuildHasher + Clone,
{
    let first = st.adaptive.as_mut().and_then(|limits| limits.open(shard.0));
    adopt(st, now, shard, first);
}

/// A limiter made now for `shard` with initial limit `first`: the limiter lives as long as
/// the driver, so the shard's id must not name another key later, and the window takes it.
fn adopt<T, Shard, Op, S>(
    st: &mut DriverState<T, Shard, Op, S>,
    now: Instant,
    shard: ShardId,
    first: Option<u32>,
) where
    T: Transport<Shard, Op>,
    S: BuildHasher + Clone,
{
    if let Some(first) = first {
        st.shards.pin(shard);
        let limit = NonZeroUsize::new(usize::try_from(first).unwrap_or(usize::MAX));
        st.batcher.set_max_in_flight(now, &shard, limit);
    }
}

/// With an adaptive limit: the batch under `credit` left for `shard` at `now`.
fn adapt_sent<T, Shard, Op, S>(
    st: &mut DriverState<T, Shard, Op, S>,
    now: Instant,
    shard: ShardId,
    credit: CreditId,
) where
    T: Transport<Shard, Op>,
    S: BuildHasher + Clone,
{
    let first = st
        .adaptive
        .as_mut()
        .and_then(|limits| limits.on_sent(shard.0, credit, now));
    adopt(st, now, shard, first);
}

/// With an adaptive limit: the batch under `credit` ended at `now` as `end` (its credit
/// released already); a new limit from its shard's limiter goes to the shard's window, whose
/// batches it sends come out of the next `drain`.
fn adapt_ended<T, Shard, Op, S>(
    st: &mut DriverState<T, Shard, Op, S>,
    now: Instant,
    credit: CreditId,
    end: LimitEnd,
) where
    T: Transport<Shard, Op>,
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    let changed = st
        .adaptive
        .as_mut()
        .and_then(|limits| limits.on_end(credit, now, end));
    if let Some((shard, limit)) = changed {
        let limit = NonZeroUsize::new(usize::try_from(limit).unwrap_or(usize::MAX));
        st.batcher.set_max_in_flight(now, &ShardId(shard), limit);
    }
}

/// The batch under `credit` was answered: its shard's stream works, so its reconnect backoff
/// starts afresh (unless the shard is paused by another batch's tear).
fn answered<T, Shard, Op, S>(st: &mut DriverState<T, Shard, Op, S>, credit: CreditId)
where
    T: Transport<Shard, Op>,
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    if st.reconnecting.is_empty() {
        return;
    }
    let Some(id) = shard_of(st, credit) else {
        return;
    };
    if let Some(entry) = st.reconnecting.get_mut(id.0) {
        if entry.as_ref().is_some_and(|r| r.resume_at.is_none()) {
            *entry = None;
        }
    }
}

/// A torn batch: its operations' copies go back into their slots (those not ended
/// meanwhile), the shard pauses and the batch goes back at the head of its shard's order in
/// the batcher; the shard resumes after the next delay of its reconnect backoff (`true`: a
/// resume was scheduled, wake the driver task). A batch torn while its shard is paused
/// already (several batches were in flight on the stream that broke) joins that pause: one
/// tear, one delay. A backoff that refuses another delay (its
/// attempt or time limit), or a batch none of whose operations is left, fails the batch with
/// the transport's error instead.
fn requeue<T, Shard, Op, S>(
    st: &mut DriverState<T, Shard, Op, S>,
    rq: &Requeue<Op>,
    now: Instant,
    credit: CreditId,
    failure: BatchFailure<T::Error>,
    kept: Kept<Shard, Op>,
) -> bool
where
    T: Transport<Shard, Op>,
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    let delay = shard_of(st, credit).and_then(|id| {
        if st.reconnecting.len() <= id.0 {
            st.reconnecting.resize_with(id.0 + 1, || None);
        }
        let entry = st.reconnecting.get_mut(id.0)?.get_or_insert(Reconnecting {
            backoff: Backoff::new(),
            resume_at: None,
        });
        // Paused already: another batch of the same broken stream, one reconnect for both.
        if entry.resume_at.is_none() {
            let delay = entry.backoff.next_delay(&rq.backoff, &mut st.rng)?;
            entry.resume_at = Some(now.saturating_add(delay));
        }
        Some(id)
    });
    let Some(id) = delay else {
        let _ = st
            .batcher
            .handle_failure(now, credit, BatchEnd::Failed(failure));
        return false;
    };
    let Kept { key, ops, handles } = kept;
    let mut key = Some(key);
    for (h, op) in handles.into_iter().zip(ops) {
        if let Some(slot) = st.slots.get_mut(h) {
            slot.op = Some(op);
            if key.is_some() {
                slot.key = key.take();
            }
        }
    }
    st.batcher.pause(id);
    if st.batcher.requeue(now, credit).is_err() {
        // Unreachable: the batch is in flight under `credit` (its end is reported once).
        let _ = st
            .batcher
            .handle_failure(now, credit, BatchEnd::Failed(failure));
    }
    true
}

/// The shard id `id` names no key any more (its last operation ended, say every operation of
/// a requeued batch timed out during the pause): a pause and backoff of it end now, so a key
/// that gets the id next starts unpaused.
fn forget_shard<T, Shard, Op, S>(st: &mut DriverState<T, Shard, Op, S>, id: ShardId)
where
    T: Transport<Shard, Op>,
{
    let Some(entry) = st.reconnecting.get_mut(id.0) else {
        return;
    };
    match entry {
        // Paused: resumed by the driver task's next pass, which runs before anything of a
        // new key with this id can be dispatched (the key's `submit` wakes it).
        Some(r) if r.resume_at.is_some() => {
            r.backoff = Backoff::new();
            r.resume_at = Some(Instant::ZERO);
        }
        _ => *entry = None,
    }
}

/// Resumes every paused shard whose backoff delay has passed; `true` if one did.
fn resume_due<T, Shard, Op, S>(st: &mut DriverState<T, Shard, Op, S>, now: Instant) -> bool
where
    T: Transport<Shard, Op>,
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    let mut resumed = false;
    for (i, entry) in st.reconnecting.iter_mut().enumerate() {
        let Some(r) = entry else { continue };
        if r.resume_at.is_some_and(|at| at <= now) {
            r.resume_at = None;
            st.batcher.resume(now, ShardId(i));
            resumed = true;
        }
    }
    resumed
}

/// The driver task's next timer: the batcher's (operation timeouts, maintenance) or a
/// paused shard's resume, whichever comes first.
fn next_deadline<T, Shard, Op, S>(st: &DriverState<T, Shard, Op, S>) -> Option<Instant>
where
    T: Transport<Shard, Op>,
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    st.reconnecting
        .iter()
        .filter_map(|r| r.as_ref().and_then(|r| r.resume_at))
        .chain(st.batcher.poll_timeout())
        .min()
}

/// Drains the batcher's actions into effects; `ending` is how the reported batch ended.
fn drain<T, Shard, Op, S>(
    st: &mut DriverState<T, Shard, Op, S>,
    now: Instant,
    effects: &mut Effects<T, Shard, Op>,
    ending: &mut EndOf<T, Shard, Op>,
) where
    T: Transport<Shard, Op>,
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    while let Some(action) = st.batcher.poll_action() {
        match action {
            BatchAction::Send { shard, credit, .. } => {
                adapt_sent(st, now, shard, credit);
                let batch = st.batcher.batch(credit);
                let deadline = batch.and_then(|b| b.deadline());
                let handles: Vec<Key> = batch.map(|b| b.ops().to_vec()).unwrap_or_default();
                // The first operation's key is the batch's (they share the shard id); the
                // others' copies are dropped here.
                let mut key = None;
                let mut ops = Vec::with_capacity(handles.len());
                let mut sent = Vec::new();
                let keep = st.keep_sent;
                for h in handles {
                    let Some(slot) = st.slots.get_mut(h) else {
                        continue;
                    };
                    let own = slot.key.take();
                    if key.is_none() {
                        key = own;
                    }
                    if let Some(op) = slot.op.take() {
                        ops.push(op);
                        if keep {
                            sent.push(h);
                        }
                    }
                }
                let out = Outgoing {
                    key,
                    credit,
                    deadline,
                    ops,
                    handles: sent,
                };
                // Per-shard mode: to the shard's lane, in this (dispatch) order.
                if let Some(send) = st.lanes.route(shard, out, &mut effects.lanes) {
                    effects.sends.push(send);
                }
            }
            BatchAction::Deliver { handle, position } => {
                let result = match ending {
                    Ending::Answered(results) => results.get_mut(position).and_then(Option::take),
                    _ => None,
                };
                if let Some(slot) = take_slot(st, handle) {
                    let result = match result {
                        Some(Ok(value)) => Ok(value),
                        Some(Err(e)) => Err(OpError::Op(e)),
                        None => Err(OpError::NoResponse),
                    };
                    effects.done.push((slot.tx, result));
                }
            }
            BatchAction::Fail { handle, reason } => {
                if let Some(slot) = take_slot(st, handle) {
                    // The batcher carried the batch's failure to this operation.
                    let error = match reason {
                        FailReason::BatchFailed(end) => end.into_error(),
                        FailReason::Closed => OpError::Closed,
                        FailReason::TimedOut => OpError::TimedOut(TimedOut),
                        _ => OpError::NoResponse,
                    };
                    effects.done.push((slot.tx, Err(error)));
                }
            }
        }
    }
    note_events(st, effects);
}

/// Moves the batcher's events into `effects`, naming each batch's shard by the user's key
/// (its interned copy is cloned; no event is built while events are off). The clone is user
/// code after the batcher has changed, so it runs under `catch_unwind`: a `Clone` that panics
/// loses that event (counted in [`BatchDriver::events_dropped`]) and nothing else.
fn note_events<T, Shard, Op, S>(
    st: &mut DriverState<T, Shard, Op, S>,
    effects: &mut Effects<T, Shard, Op>,
) where
    T: Transport<Shard, Op>,
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    while let Some(event) = st.batcher.poll_event() {
        let event = match event {
            BatchEvent::Dispatched {
                shard,
                credit,
                ops,
                bytes,
            } => {
                let key = st.shards.key(shard);
                match key.map(|k| unwind::call(|| k.clone())) {
                    Some(Ok(shard)) => BatchEvent::Dispatched {
                        shard,
                        credit,
                        ops,
                        bytes,
                    },
                    _ => {
                        st.events_lost = st.events_lost.saturating_add(1);
                        continue;
                    }
                }
            }
            BatchEvent::Released { credit, in_flight } => {
                BatchEvent::Released { credit, in_flight }
            }
        };
        effects.events.push(event);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::WindowConfig;
    use crate::sync::panic_support::{Point, TrapKey};
    use crate::sync::test_support::{Executor, TestRuntime};
    use crate::test_hasher::TestHasher;
    use std::hash::RandomState;
    use std::sync::Mutex as StdMutex;

    type Reply = Sender<BatchOutcome<u32, &'static str>>;
    type Sent = Vec<(u8, Vec<u32>, Reply)>;

    /// Holds every sent batch until the test answers it.
    #[derive(Clone, Default)]
    struct Held(Arc<StdMutex<Sent>>);

    /// An operation whose `op_bytes` panics.
    const BYTES_PANIC: u32 = 900;
    /// An operation whose batch's `send` panics before returning a future.
    const SEND_PANIC: u32 = 901;
    /// A batch reply on which the send future panics instead of returning it.
    const FUTURE_PANIC: &str = "the send future panics";

    /// A shard key the test transport can name without calling the key's code.
    trait Numbered {
        fn number(&self) -> u8;
    }

    impl Numbered for u8 {
        fn number(&self) -> u8 {
            *self
        }
    }

    impl Numbered for TrapKey {
        fn number(&self) -> u8 {
            u8::try_from(self.0).unwrap_or(u8::MAX)
        }
    }

    impl<K: Numbered> Transport<K, u32> for Held {
        type Output = u32;
        type Error = &'static str;
        fn op_bytes(&self, op: &u32) -> u64 {
            assert_ne!(*op, BYTES_PANIC, "op_bytes panics");
            0
        }
        fn send(
            &self,
            shard: &K,
            ops: Vec<u32>,
        ) -> impl Future<Output = BatchOutcome<u32, &'static str>> + Send + 'static {
            assert!(!ops.contains(&SEND_PANIC), "send panics");
            let (tx, rx) = oneshot::channel();
            self.0.lock().unwrap().push((shard.number(), ops, tx));
            async move {
                let reply = rx.await.unwrap_or(Err("dropped"));
                assert_ne!(reply, Err(FUTURE_PANIC), "the send future panics");
                reply
            }
        }
    }

    impl Held {
        fn take(&self) -> Sent {
            core::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    type Results = Arc<StdMutex<Vec<(u32, Result<u32, OpError<&'static str>>)>>>;

    fn setup(
        window: u32,
    ) -> (
        Executor,
        BatchDriver<TestRuntime, Held, u8, u32, RandomState>,
        Held,
        Results,
    ) {
        let (exec, driver, held, out, _clock) = setup_with(window, None);
        (exec, driver, held, out)
    }

    /// A driver over [`Held`] with a window of `window` reads and the operation timeout
    /// `timeout`, and the runtime's clock.
    fn setup_with(window: u32, timeout: Option<Duration>) -> Timed {
        let exec = Executor::default();
        let mut rt = TestRuntime::new();
        rt.spawner = Some(exec.spawner());
        let clock = rt.clock.clone();
        let held = Held::default();
        let mut cfg = BatcherConfig::reads()
            .with_window(WindowConfig::default().with_max_in_flight(window as usize))
            .unwrap();
        if let Some(t) = timeout {
            cfg = cfg.with_op_timeout(t);
        }
        let driver = BatchDriver::new(rt, held.clone(), cfg);
        (
            exec,
            driver,
            held,
            Arc::new(StdMutex::new(Vec::new())),
            clock,
        )
    }

    fn submit(
        exec: &Executor,
        d: &BatchDriver<TestRuntime, Held, u8, u32, RandomState>,
        out: &Results,
        op: u32,
    ) {
        let (fut, out) = (d.submit(1, op), Arc::clone(out));
        exec.spawn(async move {
            let r = fut.await;
            out.lock().unwrap().push((op, r));
        });
    }

    /// Submits each of `ops` (to shard 1), then runs the tasks until they stall.
    fn submit_all(
        exec: &mut Executor,
        d: &BatchDriver<TestRuntime, Held, u8, u32, RandomState>,
        out: &Results,
        ops: &[u32],
    ) {
        for &op in ops {
            submit(exec, d, out, op);
        }
        exec.run_until_stalled();
    }

    #[test]
    fn operations_arriving_while_the_window_is_exhausted_ride_one_later_batch() {
        let (mut exec, driver, held, out) = setup(1);
        submit_all(&mut exec, &driver, &out, &[10]);
        let first = held.take();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].1, [10]);
        for op in 11..15 {
            submit(&exec, &driver, &out, op);
        }
        exec.run_until_stalled();
        assert!(
            held.take().is_empty(),
            "the window of 1 is full: nothing else sent"
        );
        assert_eq!((driver.in_flight(&1), driver.open_ops(&1)), (1, 4));
        let (_, _, reply) = first.into_iter().next().unwrap();
        reply.send(Ok(alloc::vec![Ok(100)]));
        exec.run_until_stalled();
        let second = held.take();
        assert_eq!(second.len(), 1);
        assert_eq!(
            second[0].1,
            [11, 12, 13, 14],
            "the parked batch grew to four"
        );
        let (_, _, reply) = second.into_iter().next().unwrap();
        reply.send(Ok(alloc::vec![Ok(111), Err("nope"), Ok(113)]));
        exec.run_until_stalled();
        let mut got = core::mem::take(&mut *out.lock().unwrap());
        got.sort_by_key(|(op, _)| *op);
        assert!(matches!(got[0], (10, Ok(100))));
        assert!(matches!(got[1], (11, Ok(111))));
        assert!(matches!(got[2], (12, Err(OpError::Op("nope")))));
        assert!(matches!(got[3], (13, Ok(113))));
        assert!(matches!(got[4], (14, Err(OpError::NoResponse))));
    }

    #[test]
    fn the_sink_sees_each_batch_dispatched_with_its_size_and_each_credit_released() {
        let (mut exec, driver, held, out) = setup(1);
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let (log, probe) = (Arc::clone(&seen), driver.clone());
        driver.set_event_sink(move |e: &BatchEvent<u8>| {
            // Reading the driver here would deadlock if the sink ran under its lock.
            let _ = probe.in_flight(&1);
            log.lock().unwrap().push(e.clone());
        });
        submit_all(&mut exec, &driver, &out, &[10]);
        for op in 11..15 {
            submit(&exec, &driver, &out, op);
        }
        exec.run_until_stalled();
        let (_, _, reply) = held.take().into_iter().next().unwrap();
        reply.send(Ok(alloc::vec![Ok(100)]));
        exec.run_until_stalled();
        let (_, _, reply) = held.take().into_iter().next().unwrap();
        reply.send(Ok(alloc::vec![Ok(111)]));
        exec.run_until_stalled();
        let shape: Vec<_> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|e| match e {
                BatchEvent::Dispatched { shard, ops, .. } => ("dispatched", *shard, *ops),
                BatchEvent::Released { in_flight, .. } => ("released", 0, *in_flight as usize),
            })
            .collect();
        // The first release hands its credit to the parked batch at once (one in flight).
        assert_eq!(
            shape,
            [
                ("dispatched", 1, 1),
                ("released", 0, 1),
                ("dispatched", 1, 4),
                ("released", 0, 0),
            ]
        );
        assert_eq!(
            (driver.events_dropped(), driver.event_sink_panics()),
            (0, 0)
        );
        driver.clear_event_sink();
        submit_all(&mut exec, &driver, &out, &[20]);
        assert_eq!(seen.lock().unwrap().len(), 4, "cleared: nothing more");
    }

    #[test]
    fn a_failed_batch_fails_each_of_its_operations_with_the_shared_error() {
        let (mut exec, driver, held, out) = setup(1);
        submit_all(&mut exec, &driver, &out, &[1, 2]);
        let (_, ops, reply) = held.take().into_iter().next().unwrap();
        assert_eq!(ops, [1, 2], "queued together: one batch");
        reply.send(Err("broken pipe"));
        exec.run_until_stalled();
        let got = out.lock().unwrap();
        assert_eq!(got.len(), 2);
        assert!(
            got.iter()
                .all(|(_, r)| matches!(r, Err(OpError::Batch(e)) if **e == "broken pipe"))
        );
        assert_eq!(driver.in_flight(&1), 0, "the credit came back");
    }

    /// Fails a batch holding operation 0 as a whole, and every operation of any other batch
    /// on its own, with `std::io::Error`s.
    struct Failing;

    impl Transport<u8, u32> for Failing {
        type Output = u32;
        type Error = std::io::Error;
        fn send(
            &self,
            _shard: &u8,
            ops: Vec<u32>,
        ) -> impl Future<Output = BatchOutcome<u32, std::io::Error>> + Send + 'static {
            use std::io::{Error, ErrorKind};
            let outcome = if ops.contains(&0) {
                Err(Error::new(ErrorKind::ConnectionReset, "shard 1 is down"))
            } else {
                Ok(ops
                    .iter()
                    .map(|_| Err(Error::new(ErrorKind::NotFound, "no such key")))
                    .collect())
            };
            core::future::ready(outcome)
        }
    }

    #[test]
    fn errors_describe_this_layer_and_expose_the_transport_s_error_as_source() {
        use std::error::Error as _;
        use std::format;
        use std::io::ErrorKind;
        use std::string::ToString;
        let mut exec = Executor::default();
        let mut rt = TestRuntime::new();
        rt.spawner = Some(exec.spawner());
        let driver = BatchDriver::new(rt, Failing, BatcherConfig::reads());
        type IoResult = Result<u32, OpError<std::io::Error>>;
        let out: Arc<StdMutex<Vec<(u32, IoResult)>>> = Arc::default();
        for op in [0, 1, 2] {
            let (fut, out) = (driver.submit(1, op), Arc::clone(&out));
            exec.spawn(async move {
                let r = fut.await;
                out.lock().unwrap().push((op, r));
            });
            exec.run_until_stalled(); // each its own batch
        }
        let mut got = core::mem::take(&mut *out.lock().unwrap());
        got.sort_by_key(|(op, _)| *op);
        let kind = |e: &OpError<std::io::Error>| {
            let source = e.source().expect("the transport's error is the source");
            source.downcast_ref::<std::io::Error>().map(|io| io.kind())
        };
        let Err(batch) = &got[0].1 else {
            panic!("op 0 succeeded")
        };
        assert!(matches!(batch, OpError::Batch(b) if b.ops() == 1));
        assert_eq!(
            batch.to_string(),
            "the transport failed the operation's batch of 1 operation"
        );
        assert_eq!(kind(batch), Some(ErrorKind::ConnectionReset));
        for (op, r) in &got[1..] {
            let Err(e) = r else {
                panic!("op {op} succeeded")
            };
            assert_eq!(e.to_string(), "the transport failed the operation");
            assert_eq!(kind(e), Some(ErrorKind::NotFound), "op {op}");
        }
        assert!(OpError::<std::io::Error>::Closed.source().is_none());
        assert_eq!(
            format!("{:?}", driver.submit(1, 9)),
            "Submit { pending: true, .. }"
        );
        driver.close();
        assert_eq!(
            format!("{:?}", driver.submit(1, 9)),
            "Submit { pending: false, .. }"
        );
    }

    #[test]
    fn close_fails_held_operations_lets_in_flight_ones_finish_and_refuses_new_ones() {
        let (mut exec, driver, held, out) = setup(1);
        submit_all(&mut exec, &driver, &out, &[1]);
        submit(&exec, &driver, &out, 2); // parked behind the full window
        exec.run_until_stalled();
        submit(&exec, &driver, &out, 3); // still in the input queue
        driver.close();
        submit(&exec, &driver, &out, 4); // refused
        exec.run_until_stalled();
        let (_, _, reply) = held.take().into_iter().next().unwrap();
        reply.send(Ok(alloc::vec![Ok(7)]));
        assert_eq!(exec.run_until_stalled(), 0, "the driver task stopped");
        let mut got = core::mem::take(&mut *out.lock().unwrap());
        got.sort_by_key(|(op, _)| *op);
        assert!(matches!(got[0], (1, Ok(7))));
        assert!(
            got[1..]
                .iter()
                .all(|(_, r)| matches!(r, Err(OpError::Closed)))
        );
        assert!(held.take().is_empty(), "nothing sent after close");
    }

    #[test]
    fn closed_resolves_only_once_closed_and_the_last_batch_in_flight_ends() {
        use crate::sync::test_support::{CountingWaker, poll_once};
        let (mut exec, driver, held, out) = setup(2);
        submit_all(&mut exec, &driver, &out, &[1]);
        submit_all(&mut exec, &driver, &out, &[2]);
        let mut sent = held.take();
        assert_eq!(sent.len(), 2, "two batches in the transport");
        let (w, wakes) = CountingWaker::new();
        let mut closed = alloc::boxed::Box::pin(driver.closed());
        assert!(poll_once(&mut closed, &w).is_pending(), "not closed yet");
        driver.close();
        assert!(
            poll_once(&mut closed, &w).is_pending(),
            "two batches in flight"
        );
        let (_, _, reply) = sent.remove(0);
        reply.send(Ok(alloc::vec![Ok(7)]));
        exec.run_until_stalled();
        assert!(
            poll_once(&mut closed, &w).is_pending(),
            "one batch in flight"
        );
        assert_eq!(wakes.wakes(), 0);
        let (_, _, reply) = sent.remove(0);
        reply.send(Err("late"));
        exec.run_until_stalled();
        assert_eq!(wakes.wakes(), 1, "the last batch's end wakes the waiter");
        assert!(poll_once(&mut closed, &w).is_ready());
        assert_eq!(out.lock().unwrap().len(), 2, "both results delivered first");
    }

    /// The driver's books hold: the shard's credits are conserved (`in_flight + available ==
    /// capacity`, no other live credit) and no operation slot is left without an owner once
    /// `pending` operations are still unanswered.
    fn assert_books<R: Runtime>(
        driver: &BatchDriver<R, Held, u8, u32, RandomState>,
        shard: u8,
        pending: usize,
    ) {
        assert_books_of(driver, &[shard], pending);
    }

    /// [`assert_books`] over several shards, for any key: each shard's credits are conserved,
    /// no credit is live beyond theirs, exactly `pending` operation slots are in use (every
    /// other one free), and no shard key is stored once nothing is pending.
    fn assert_books_of<R: Runtime, K, S>(
        driver: &BatchDriver<R, Held, K, u32, S>,
        shards: &[K],
        pending: usize,
    ) where
        Held: Transport<K, u32>,
        K: Hash + Eq + Clone,
        S: BuildHasher + Clone,
    {
        let st = lock(&driver.shared.state);
        let w = st.batcher.window();
        let mut in_flight = 0;
        for shard in shards {
            let (busy, free) = match st.shards.find(shard) {
                Some(id) => (w.in_flight(&id), w.available(&id)),
                None => (0, w.capacity()),
            };
            assert_eq!(busy + free, w.capacity(), "credits conserved");
            in_flight += busy as usize;
        }
        assert_eq!(w.live_credits(), in_flight, "no other credit live");
        assert_eq!(st.slots.live(), pending, "operation slots in use");
        if pending == 0 {
            assert_eq!(st.shards.len(), 0, "no shard key left stored");
            assert_eq!(st.batcher.open_batches(), 0);
        }
    }

    fn results(out: &Results) -> Vec<(u32, Result<u32, OpError<&'static str>>)> {
        let mut got = core::mem::take(&mut *out.lock().unwrap());
        got.sort_by_key(|(op, _)| *op);
        got
    }

    #[test]
    fn a_panicking_send_future_fails_its_batch_and_its_credit_sends_the_parked_batch() {
        let (mut exec, driver, held, out) = setup(1);
        submit_all(&mut exec, &driver, &out, &[1]);
        submit_all(&mut exec, &driver, &out, &[2, 3]);
        assert_eq!(driver.open_ops(&1), 2, "parked behind the full window");
        let (_, _, reply) = held.take().into_iter().next().unwrap();
        reply.send(Err(FUTURE_PANIC));
        exec.run_until_stalled();
        let got = results(&out);
        assert!(matches!(got[..], [(1, Err(OpError::Panicked(Panicked)))]));
        let (_, ops, reply) = held
            .take()
            .into_iter()
            .next()
            .expect("the parked batch went out");
        assert_eq!(ops, [2, 3]);
        reply.send(Ok(alloc::vec![Ok(20), Ok(30)]));
        exec.run_until_stalled();
        assert!(matches!(results(&out)[..], [(2, Ok(20)), (3, Ok(30))]));
        assert_books(&driver, 1, 0);
    }

    #[test]
    fn a_send_that_panics_before_returning_its_future_fails_its_batch_and_frees_the_credit() {
        let (mut exec, driver, held, out) = setup(1);
        // Sent by the driver task: the task survives the panic.
        submit_all(&mut exec, &driver, &out, &[SEND_PANIC]);
        assert!(matches!(
            results(&out)[..],
            [(SEND_PANIC, Err(OpError::Panicked(_)))]
        ));
        assert_books(&driver, 1, 0);
        // Sent by a send task, as the credit of the batch before it comes back.
        submit_all(&mut exec, &driver, &out, &[1]);
        submit_all(&mut exec, &driver, &out, &[SEND_PANIC]);
        let (_, _, reply) = held.take().into_iter().next().unwrap();
        reply.send(Ok(alloc::vec![Ok(10)]));
        exec.run_until_stalled();
        let got = results(&out);
        assert!(matches!(got[0], (1, Ok(10))));
        assert!(matches!(got[1], (SEND_PANIC, Err(OpError::Panicked(_)))));
        assert_books(&driver, 1, 0);
        submit_all(&mut exec, &driver, &out, &[2]);
        let (_, ops, reply) = held
            .take()
            .into_iter()
            .next()
            .expect("later submits proceed");
        assert_eq!(ops, [2]);
        reply.send(Ok(alloc::vec![Ok(20)]));
        exec.run_until_stalled();
        assert!(matches!(results(&out)[..], [(2, Ok(20))]));
        assert_books(&driver, 1, 0);
    }

    #[test]
    fn an_op_bytes_that_panics_fails_that_submit_alone() {
        let (mut exec, driver, held, out) = setup(1);
        let (w, _) = crate::sync::test_support::CountingWaker::new();
        let mut refused = driver.submit(1, BYTES_PANIC);
        assert!(matches!(
            crate::sync::test_support::poll_once(&mut refused, &w),
            Poll::Ready(Err(OpError::Panicked(Panicked)))
        ));
        assert_eq!(driver.queued(), 0, "nothing queued");
        submit_all(&mut exec, &driver, &out, &[5]);
        let (_, ops, reply) = held.take().into_iter().next().unwrap();
        assert_eq!(ops, [5]);
        reply.send(Ok(alloc::vec![Ok(50)]));
        exec.run_until_stalled();
        assert!(matches!(results(&out)[..], [(5, Ok(50))]));
        assert_books(&driver, 1, 0);
    }

    type Timed = (
        Executor,
        BatchDriver<TestRuntime, Held, u8, u32, RandomState>,
        Held,
        Results,
        crate::sync::ManualClock,
    );

    /// A driver over [`Held`] with a window of 1 and an operation timeout of 30 s, the Oxia
    /// Java client's default request timeout (streamnative/oxia-java, `OxiaClientBuilder`
    /// `DefaultRequestTimeout`), and its clock.
    fn setup_timed() -> Timed {
        setup_with(1, Some(Duration::from_secs(30)))
    }

    /// Advances the clock by `by`, runs the tasks until they stall, and takes the results
    /// that came in, in arrival order.
    fn advance_and_run(
        exec: &mut Executor,
        clock: &crate::sync::ManualClock,
        by: Duration,
        out: &Results,
    ) -> Vec<(u32, Result<u32, OpError<&'static str>>)> {
        clock.advance(by);
        exec.run_until_stalled();
        core::mem::take(&mut *out.lock().unwrap())
    }

    #[test]
    fn a_hung_send_and_the_operations_held_behind_it_time_out_each_at_its_deadline() {
        let (mut exec, driver, held, out, clock) = setup_timed();
        submit_all(&mut exec, &driver, &out, &[1]);
        let hung = held.take();
        assert_eq!(hung.len(), 1, "1 is in the transport, which never answers");
        clock.advance(Duration::from_secs(10));
        submit_all(&mut exec, &driver, &out, &[2]);
        assert!(held.take().is_empty(), "2 waits for the credit");
        clock.advance(Duration::from_millis(19_999));
        exec.run_until_stalled();
        assert!(out.lock().unwrap().is_empty(), "nothing is due before 30 s");
        // At 30 s the send is dropped: 1 times out and its credit sends 2 (due at 40 s).
        let got = advance_and_run(&mut exec, &clock, Duration::from_millis(1), &out);
        assert!(
            matches!(got[..], [(1, Err(OpError::TimedOut(TimedOut)))]),
            "{got:?}"
        );
        let second = held.take();
        assert_eq!(
            second.iter().map(|s| s.1.clone()).collect::<Vec<_>>(),
            [alloc::vec![2]]
        );
        drop(hung);
        let got = advance_and_run(&mut exec, &clock, Duration::from_secs(10), &out);
        assert!(
            matches!(got[..], [(2, Err(OpError::TimedOut(TimedOut)))]),
            "{got:?}"
        );
        assert_eq!(driver.in_flight(&1), 0, "every credit came back");
        // An answer in time still wins.
        submit_all(&mut exec, &driver, &out, &[3]);
        let (_, _, reply) = held.take().into_iter().next().unwrap();
        clock.advance(Duration::from_millis(29_999));
        reply.send(Ok(alloc::vec![Ok(33)]));
        exec.run_until_stalled();
        let got = core::mem::take(&mut *out.lock().unwrap());
        assert!(matches!(got[..], [(3, Ok(33))]), "{got:?}");
        drop(second);
    }

    #[test]
    fn a_send_task_dropped_unfinished_releases_its_credit() {
        let (mut exec, driver, held, _out) = setup(1);
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        driver.set_event_sink(move |e: &BatchEvent<u8>| log.lock().unwrap().push(e.clone()));
        let mut first = driver.submit(1, 1);
        exec.run_until_stalled();
        let mut parked = driver.submit(1, 2);
        exec.run_until_stalled();
        assert_eq!((driver.in_flight(&1), driver.open_ops(&1)), (1, 1));
        let sent = held.take();
        // The runtime shuts down: its tasks (the driver's and the send task) are dropped.
        drop(exec);
        assert_eq!(driver.in_flight(&1), 0, "the credit came back");
        let (w, _) = crate::sync::test_support::CountingWaker::new();
        use crate::sync::test_support::poll_once;
        assert!(matches!(
            poll_once(&mut first, &w),
            Poll::Ready(Err(OpError::NoResponse))
        ));
        assert!(
            matches!(
                poll_once(&mut parked, &w),
                Poll::Ready(Err(OpError::NoResponse))
            ),
            "the batch the credit would have sent fails too: nothing is sent from a destructor"
        );
        assert!(held.take().is_empty());
        drop(sent);
        assert_books(&driver, 1, 0);
        // The sink saw every credit dispatched released again, the dropped task's included.
        let seen = seen.lock().unwrap();
        let count = |released: bool| {
            seen.iter()
                .filter(|e| matches!(e, BatchEvent::Released { .. }) == released)
                .count()
        };
        assert!(count(false) >= 1, "{seen:?}");
        assert_eq!(count(true), count(false), "{seen:?}");
        assert_eq!(driver.events_dropped(), 0);
    }

    #[test]
    fn a_spawn_that_panics_fails_that_batch_and_the_driver_task_keeps_running() {
        use crate::sync::test_support::{CountingWaker, RefusingRuntime, poll_once};
        let mut exec = Executor::default();
        let rt = RefusingRuntime::new(&mut exec);
        let held = Held::default();
        let cfg = BatcherConfig::reads()
            .with_window(WindowConfig::default().with_max_in_flight(1))
            .unwrap();
        let driver = BatchDriver::new(rt, held.clone(), cfg);
        let (w, _) = CountingWaker::new();
        for op in [1, 2] {
            let mut result = driver.submit(1, op);
            exec.run_until_stalled();
            assert!(
                matches!(
                    poll_once(&mut result, &w),
                    Poll::Ready(Err(OpError::NoResponse))
                ),
                "op {op}"
            );
            assert_eq!(driver.queued(), 0, "op {op}: the driver task took it");
            assert_books(&driver, 1, 0);
        }
        assert_eq!(
            held.take().len(),
            2,
            "each batch was handed to the transport"
        );
    }

    // A shard key whose `Hash`, `Eq` or `Clone` panics (issue 12): the driver runs a key's code
    // in `submit` alone, so the submit it panicked in fails with `Panicked` and nothing else
    // does. Before, the driver task ran it (`Batcher::handle_op`, `flush`, the window's hand-on,
    // `close`): a panic there killed the task with a batch on its way between the batcher and
    // the window.

    type TrapDriver = BatchDriver<TestRuntime, Held, TrapKey, u32, TestHasher>;

    /// A driver over [`Held`] with a window of one read batch per shard, keys of type `K`
    /// hashed with [`TestHasher`], and the executor that runs its tasks.
    fn window_of_one<K>() -> (
        Executor,
        BatchDriver<TestRuntime, Held, K, u32, TestHasher>,
        Held,
    )
    where
        K: Numbered + Hash + Eq + Clone + Send + 'static,
    {
        let exec = Executor::default();
        let mut rt = TestRuntime::new();
        rt.spawner = Some(exec.spawner());
        let held = Held::default();
        let cfg = BatcherConfig::reads()
            .with_window(WindowConfig::default().with_max_in_flight(1))
            .unwrap();
        let driver = BatchDriver::with_hasher(rt, held.clone(), cfg, TestHasher::default());
        (exec, driver, held)
    }

    const A: u32 = 1;
    const B: u32 = 2;
    /// A shard first seen after the sweep's operation.
    const C: u32 = 3;

    /// A driver over keys that panic on cue, with a window of one batch per shard.
    struct Fixture {
        exec: Executor,
        driver: TrapDriver,
        held: Held,
        out: Results,
        /// Every operation submitted, in order.
        submitted: Vec<u32>,
        /// Operations whose `Submit` was ready at once, before the driver task ran.
        at_once: Vec<u32>,
        /// Every batch the test answered: `(shard, ops)`, in order.
        answered: Vec<(u8, Vec<u32>)>,
    }

    impl Fixture {
        fn new() -> Self {
            let (exec, driver, held) = window_of_one();
            Fixture {
                exec,
                driver,
                held,
                out: Arc::default(),
                submitted: Vec::new(),
                at_once: Vec::new(),
                answered: Vec::new(),
            }
        }

        /// Submits `op` to `shard`; its result goes to `out` (at once if it is ready at once).
        fn submit(&mut self, shard: u32, op: u32) {
            use crate::sync::test_support::{CountingWaker, poll_once};
            self.submitted.push(op);
            let mut result = self.driver.submit(TrapKey(shard), op);
            let (w, _) = CountingWaker::new();
            if let Poll::Ready(r) = poll_once(&mut result, &w) {
                self.at_once.push(op);
                self.out.lock().unwrap().push((op, r));
                return;
            }
            let out = Arc::clone(&self.out);
            self.exec.spawn(async move {
                let r = result.await;
                out.lock().unwrap().push((op, r));
            });
        }

        fn run(&mut self) {
            self.exec.run_until_stalled();
        }

        /// Answers the batches of `shard` in the transport (`None`: every shard), each
        /// operation `x` with `10 * x`, and runs the tasks.
        fn answer(&mut self, shard: Option<u32>) {
            let (mine, others): (Sent, Sent) = self
                .held
                .take()
                .into_iter()
                .partition(|s| shard.is_none_or(|n| u32::from(s.0) == n));
            self.held.0.lock().unwrap().extend(others);
            for (to, ops, reply) in mine {
                self.answered.push((to, ops.clone()));
                reply.send(Ok(ops.iter().map(|x| Ok(10 * x)).collect()));
            }
            self.run();
        }

        /// Answers every batch until none is left in the transport.
        fn answer_all(&mut self) {
            while !self.held.0.lock().unwrap().is_empty() {
                self.answer(None);
            }
        }

        /// Every submit resolved exactly once: `Ok(10 * op)`, or one of `allowed` errors, or
        /// `Panicked` for exactly one submit, failed at once, if the trap `sprung`. Returns the
        /// operations that failed with `Closed`.
        fn assert_every_submit_resolved(&self, sprung: Option<Point>) -> Vec<u32> {
            let got = results(&self.out);
            let mut ops: Vec<u32> = got.iter().map(|(op, _)| *op).collect();
            let mut submitted = self.submitted.clone();
            submitted.sort_unstable();
            ops.dedup();
            assert_eq!(ops, submitted, "{sprung:?}: each submit resolved once");
            let mut panicked = Vec::new();
            let mut closed = Vec::new();
            for (op, r) in &got {
                match r {
                    Ok(v) => assert_eq!(*v, 10 * op, "{sprung:?}: op {op}"),
                    Err(OpError::Panicked(Panicked)) => panicked.push(*op),
                    Err(OpError::Closed) => closed.push(*op),
                    Err(e) => panic!("{sprung:?}: op {op} failed with {e:?}"),
                }
            }
            match sprung {
                None => assert!(panicked.is_empty(), "{panicked:?} panicked unprovoked"),
                Some(point) => {
                    assert_eq!(
                        panicked.len(),
                        1,
                        "{point:?}: one submit fails: {panicked:?}"
                    );
                    assert!(
                        self.at_once.contains(&panicked[0]),
                        "{point:?}: the submit whose key panicked fails at once"
                    );
                }
            }
            closed
        }
    }

    /// Two shards behind a window of one: batches go out, the next ones park (and grow), and
    /// each end hands the credit to the parked batch. Ends with A's `[3, 5]` and B's `[4, 6]`
    /// in the transport and A's `[7]` parked.
    fn two_shards_parking_and_handing_on(f: &mut Fixture) {
        f.submit(A, 1);
        f.submit(B, 2);
        f.run();
        f.submit(A, 3);
        f.submit(B, 4);
        f.submit(A, 5);
        f.run();
        f.answer(Some(A)); // [1] ends: A's parked [3, 5] goes out
        f.submit(B, 6); // joins B's parked [4]
        f.run();
        f.answer(Some(B)); // [2] ends: B's parked [4, 6] goes out
        f.submit(A, 7); // parked behind [3, 5]
        f.run();
    }

    /// The key calls of the scenario, all in `submit`: a new shard is hashed and cloned once, a
    /// stored one hashed and compared once. None in the driver task, the ends or `close`.
    const SCENARIO_CALLS: [Point; 14] = {
        use Point::{Clone, Eq, Hash};
        [
            Hash, Clone, Hash, Clone, Hash, Eq, Hash, Eq, Hash, Eq, Hash, Eq, Hash, Eq,
        ]
    };

    #[test]
    fn a_key_panicking_at_any_call_fails_only_its_own_submit_and_the_driver_keeps_serving() {
        let points = crate::sync::panic_support::sweep_caught(
            Fixture::new,
            two_shards_parking_and_handing_on,
            |f, sprung| {
                if sprung.is_none() {
                    assert_eq!(
                        f.answered,
                        [(1, alloc::vec![1]), (2, alloc::vec![2])],
                        "the first batches ended; the parked ones are in the transport"
                    );
                    assert_eq!(f.driver.open_ops(&TrapKey(A)), 1, "[7] parked");
                }
                // Later submits, the key behaving now: to the same shards and a new one.
                f.submit(A, 8);
                f.submit(B, 9);
                f.submit(C, 10);
                f.run();
                f.answer_all();
                if sprung.is_none() {
                    assert_eq!(
                        f.answered[2..4],
                        [(1, alloc::vec![3, 5]), (2, alloc::vec![4, 6])],
                        "the parked batches grew and were handed on"
                    );
                }
                let closed = f.assert_every_submit_resolved(sprung);
                assert!(closed.is_empty(), "{sprung:?}: {closed:?} closed");
                assert_books_of(&f.driver, &[TrapKey(A), TrapKey(B), TrapKey(C)], 0);
                assert_eq!(f.exec.run_until_stalled(), 1, "the driver task lives on");
                f.driver.close();
                assert_eq!(f.exec.run_until_stalled(), 0, "and ends at close");
            },
        );
        assert_eq!(points, SCENARIO_CALLS);
    }

    #[test]
    fn a_key_panicking_at_any_call_before_close_strands_nothing_the_close_fails() {
        let points = crate::sync::panic_support::sweep_caught(
            Fixture::new,
            |f| {
                two_shards_parking_and_handing_on(f);
                f.submit(B, 8); // parked behind [4, 6]
                f.run();
                f.submit(A, 9); // still queued for the driver task
                f.driver.close();
                f.answer_all(); // the batches in the transport end normally
            },
            |f, sprung| {
                f.answer_all();
                let closed = f.assert_every_submit_resolved(sprung);
                if sprung.is_none() {
                    assert_eq!(closed, [7, 8, 9], "the parked and queued operations");
                }
                assert_books_of(&f.driver, &[TrapKey(A), TrapKey(B)], 0);
                assert_eq!(f.exec.run_until_stalled(), 0, "the driver task ended");
                f.submit(A, 10);
                assert_eq!(f.at_once.last(), Some(&10), "refused at once");
                assert!(matches!(results(&f.out)[..], [(10, Err(OpError::Closed))]));
            },
        );
        use Point::{Eq, Hash};
        assert_eq!(
            points[..],
            [&SCENARIO_CALLS[..], &[Hash, Eq, Hash, Eq]].concat(),
            "the scenario's calls and the two submits after it: close runs none"
        );
    }

    /// A shard key whose `Hash`, `Eq` or `Clone` (the one named) panics at every call.
    #[derive(Debug)]
    struct Sour {
        n: u8,
        sour: Option<Point>,
    }

    impl Hash for Sour {
        fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
            assert_ne!(self.sour, Some(Point::Hash), "a sour Hash");
            self.n.hash(state);
        }
    }

    impl PartialEq for Sour {
        fn eq(&self, other: &Self) -> bool {
            let sour = Some(Point::Eq);
            assert!(self.sour != sour && other.sour != sour, "a sour Eq");
            self.n == other.n
        }
    }

    impl Eq for Sour {}

    impl Clone for Sour {
        fn clone(&self) -> Self {
            assert_ne!(self.sour, Some(Point::Clone), "a sour Clone");
            Sour {
                n: self.n,
                sour: self.sour,
            }
        }
    }

    impl Numbered for Sour {
        fn number(&self) -> u8 {
            self.n
        }
    }

    #[test]
    fn a_key_that_always_panics_fails_each_of_its_submits_and_every_other_shard_is_served() {
        use crate::sync::test_support::{CountingWaker, poll_once};
        for point in [Point::Hash, Point::Eq, Point::Clone] {
            let (mut exec, driver, held) = window_of_one::<Sour>();
            let out = Results::default();
            let submit = |exec: &Executor, n: u8, op: u32| {
                let (fut, out) = (driver.submit(Sour { n, sour: None }, op), Arc::clone(&out));
                exec.spawn(async move {
                    let r = fut.await;
                    out.lock().unwrap().push((op, r));
                });
            };
            submit(&exec, 1, 1);
            exec.run_until_stalled(); // shard 1 stored, [1] in the transport
            // `Eq` is reached through the stored shard 1; `Hash` and `Clone` through a new one.
            let n = if point == Point::Eq { 1 } else { 2 };
            let (w, _) = CountingWaker::new();
            for op in [2, 3, 4] {
                let mut refused = driver.submit(
                    Sour {
                        n,
                        sour: Some(point),
                    },
                    op,
                );
                assert!(
                    matches!(
                        poll_once(&mut refused, &w),
                        Poll::Ready(Err(OpError::Panicked(Panicked)))
                    ),
                    "{point:?}: op {op} fails at once"
                );
                exec.run_until_stalled();
            }
            submit(&exec, 1, 5); // parked behind [1]
            submit(&exec, 2, 6);
            submit(&exec, 3, 7);
            exec.run_until_stalled();
            while !held.0.lock().unwrap().is_empty() {
                for (_, ops, reply) in held.take() {
                    reply.send(Ok(ops.iter().map(|x| Ok(10 * x)).collect()));
                }
                exec.run_until_stalled();
            }
            let got: Vec<_> = results(&out)
                .into_iter()
                .map(|(op, r)| (op, r.ok()))
                .collect();
            assert_eq!(
                got,
                [(1, Some(10)), (5, Some(50)), (6, Some(60)), (7, Some(70))],
                "{point:?}"
            );
            let shards = [1, 2, 3].map(|n| Sour { n, sour: None });
            assert_books_of(&driver, &shards, 0);
            assert_eq!(
                exec.run_until_stalled(),
                1,
                "{point:?}: the driver task lives on"
            );
            driver.close();
        }
    }
}
