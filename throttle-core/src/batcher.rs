//! Rate-adaptive batcher: per-shard open batches that grow while the shard's dispatch window is
//! exhausted, so the batch size follows the server's service rate instead of flooding it with
//! tiny RPCs.
//!
//! Operations go into their shard's *open batch*. A batch is *full* at
//! `max_requests_per_batch` operations or, for writes, when the next operation would take it
//! past `max_batch_bytes` (an operation larger than that travels alone). Full batches go to the
//! [`DispatchWindow`]: sent at once if the shard has credit, else queued FIFO. When the driver's
//! input queue is empty it calls [`flush`](Batcher::flush): open batches of shards with credit
//! go out at once (there is no linger timer); open batches of exhausted shards are parked in the
//! window and keep growing, since the next operation for that shard reclaims the parked batch
//! rather than starting a new one behind it. [`poll_action`](Batcher::poll_action) flushes the
//! same way once it runs out of actions, so a caller that drains the actions (as it must, to
//! get its sends) never strands an open batch, even if it never calls `flush`.
//!
//! The batcher owns every operation's caller handle `H` from [`handle_op`](Batcher::handle_op)
//! until it ends, and ends each exactly once: [`BatchAction::Deliver`] (a response arrived) or
//! [`BatchAction::Fail`] (no response, the batch failed with the caller's error, or the
//! batcher closed), unless the caller withdraws it first with [`cancel`](Batcher::cancel): an
//! operation whose batch has not left yet (open, parked or queued) is taken out of it and its
//! handle handed back, and a batch left empty is dropped without ever taking a credit. An
//! operation may also carry a payload `P` ([`handle_op_with_payload`](Batcher::handle_op_with_payload)),
//! the request itself, which leaves by value in its batch's [`BatchAction::Send`]: the caller
//! puts it on the wire without a copy, while the handle stays for the `Deliver` or `Fail`.
//!
//! Two closes: [`close`](Batcher::close) fails everything not yet sent;
//! [`drain`](Batcher::drain) refuses new operations but sends everything accepted.
//!
//! See `docs/dispatch-window.md` for the state diagram.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::hash::{BuildHasher, Hash};
use core::num::{NonZeroU64, NonZeroUsize};
use core::time::Duration;

use hashbrown::HashTable;
use smallvec::SmallVec;

use crate::dispatch_window::{
    CreditId, Dispatch, DispatchWindow, Place, Submitted, Ticket, WindowConfig,
};
use crate::error::{ConfigError, ReleaseError};
use crate::maintenance::{Maintenance, Peak};
use crate::slab::{Key, Slab};
use crate::time::{Clock, Instant};

/// Which limits a batcher applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BatchKind {
    /// Read batches are bounded by operation count only.
    Read,
    /// Write batches are bounded by operation count and by `max_batch_bytes`.
    Write,
}

/// Configuration of a [`Batcher`]: batch limits and the dispatch window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatcherConfig {
    kind: BatchKind,
    max_requests_per_batch: NonZeroUsize,
    max_batch_bytes: NonZeroU64,
    /// Valid: [`BatcherConfig::with_window`] refuses an invalid one.
    window: WindowConfig,
    oversized: Oversized,
    /// How long an operation may wait for its end, from its acceptance (`None`: forever).
    op_timeout: Option<Duration>,
}

/// 1000 operations per batch (Oxia's `maxRequestsPerBatch`).
const DEFAULT_MAX_REQUESTS: NonZeroUsize = match NonZeroUsize::new(1000) {
    Some(n) => n,
    None => NonZeroUsize::MIN,
};

/// 128 KiB per write batch (Oxia's `maxBatchSize`).
const DEFAULT_MAX_BYTES: NonZeroU64 = match NonZeroU64::new(128 * 1024) {
    Some(n) => n,
    None => NonZeroU64::MIN,
};

impl Default for BatcherConfig {
    /// The Oxia Java client's write defaults: 1000 operations (`maxRequestsPerBatch`), 128 KiB,
    /// 4 batches in flight per shard (`maxWriteBatchesInFlight`, PR #360).
    fn default() -> Self {
        BatcherConfig {
            kind: BatchKind::Write,
            max_requests_per_batch: DEFAULT_MAX_REQUESTS,
            max_batch_bytes: DEFAULT_MAX_BYTES,
            window: WindowConfig::default(),
            oversized: Oversized::TravelAlone,
            op_timeout: None,
        }
    }
}

impl BatcherConfig {
    /// The defaults for writes (same as `Default`).
    pub fn writes() -> Self {
        Self::default()
    }

    /// The defaults for reads: 1000 operations per batch, no byte limit, 4 in flight.
    pub fn reads() -> Self {
        BatcherConfig {
            kind: BatchKind::Read,
            ..Self::default()
        }
    }

    /// At most `n` operations per batch. Infallible: a zero limit cannot be written.
    #[must_use]
    pub fn with_max_requests_per_batch(mut self, n: NonZeroUsize) -> Self {
        self.max_requests_per_batch = n;
        self
    }

    /// Write batches stop before exceeding `bytes` (ignored for reads). Infallible: a zero
    /// limit cannot be written.
    #[must_use]
    pub fn with_max_batch_bytes(mut self, bytes: NonZeroU64) -> Self {
        self.max_batch_bytes = bytes;
        self
    }

    /// The per-shard dispatch window. The one fallible builder: a [`WindowConfig`] can still
    /// be invalid (`max_in_flight` 0), and is refused here with its own error, so a
    /// `BatcherConfig` is valid by construction and [`Batcher::new`] cannot fail.
    ///
    /// ```
    /// use throttle_sansio::{BatcherConfig, WindowConfig};
    ///
    /// let four = BatcherConfig::reads().with_window(WindowConfig::default().with_max_in_flight(4));
    /// assert_eq!(four.map(|c| c.window().max_in_flight()), Ok(4));
    /// assert!(BatcherConfig::reads().with_window(WindowConfig::default().with_max_in_flight(0)).is_err());
    /// ```
    pub fn with_window(mut self, window: WindowConfig) -> Result<Self, ConfigError> {
        window.validate()?;
        self.window = window;
        Ok(self)
    }

    /// At most `n` batches in flight per shard: the window of
    /// [`WindowConfig::new(n)`](WindowConfig::new), infallible since `n` is not 0.
    ///
    /// ```
    /// use core::num::NonZeroUsize;
    /// use throttle_sansio::BatcherConfig;
    ///
    /// let two = NonZeroUsize::new(2).expect("not zero");
    /// assert_eq!(BatcherConfig::writes().with_max_in_flight(two).window().max_in_flight(), 2);
    /// ```
    #[must_use]
    pub fn with_max_in_flight(mut self, n: NonZeroUsize) -> Self {
        self.window = WindowConfig::new(n);
        self
    }

    /// What a write batcher does with an operation larger than
    /// [`max_batch_bytes`](Self::max_batch_bytes): [`Oversized::TravelAlone`] (the default)
    /// or [`Oversized::Reject`]. Ignored for reads (no byte limit).
    ///
    /// ```
    /// use throttle_sansio::{BatcherConfig, Oversized};
    ///
    /// assert_eq!(BatcherConfig::writes().oversized(), Oversized::TravelAlone);
    /// assert_eq!(BatcherConfig::writes().with_oversized(Oversized::Reject).oversized(), Oversized::Reject);
    /// ```
    #[must_use]
    pub fn with_oversized(mut self, oversized: Oversized) -> Self {
        self.oversized = oversized;
        self
    }

    /// What happens to an operation larger than the batch limit.
    pub fn oversized(&self) -> Oversized {
        self.oversized
    }

    /// Gives every operation a deadline: its acceptance by [`Batcher::handle_op`] (the
    /// batcher's clamped clock) plus `timeout`, saturating at [`Instant::MAX`]. There is none
    /// by default; the Oxia Java client's is 30 s (`OxiaClientBuilder.DefaultRequestTimeout`).
    ///
    /// - An operation not yet sent (open, parked, queued or requeued) whose deadline has
    ///   passed is taken out of its batch by [`Batcher::handle_timeout`] (and by
    ///   [`Batcher::flush`], which runs the same step first) and ends with
    ///   [`FailReason::TimedOut`]; a batch left empty is dropped without taking a credit.
    ///   Once [`Batcher::poll_timeout`] has passed, run `handle_timeout` before reporting a
    ///   batch's end, a requeue or a resume: the credit those free would otherwise send an
    ///   overdue operation (with a deadline already past; the `sync` driver does this).
    /// - A batch that leaves carries the earliest deadline of its operations
    ///   ([`Batch::deadline`], the one RPC carries them all, as a gRPC deadline would): the
    ///   caller enforces it on the send, and reports a send that outlives it with
    ///   [`Batcher::handle_failure`] (the driver in `sync` does, as `OpError::TimedOut`).
    ///
    /// A `timeout` of zero times out every operation that has not left by the next
    /// `handle_timeout`.
    ///
    /// ```
    /// use core::time::Duration;
    /// use throttle_sansio::BatcherConfig;
    ///
    /// assert_eq!(BatcherConfig::writes().op_timeout(), None);
    /// let oxia = BatcherConfig::writes().with_op_timeout(Duration::from_secs(30));
    /// assert_eq!(oxia.op_timeout(), Some(Duration::from_secs(30)));
    /// ```
    #[must_use]
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = Some(timeout);
        self
    }

    /// The operation timeout ([`with_op_timeout`](Self::with_op_timeout)), if any.
    pub fn op_timeout(&self) -> Option<Duration> {
        self.op_timeout
    }

    /// Read or write limits.
    pub fn kind(&self) -> BatchKind {
        self.kind
    }

    /// Operations per batch at most (at least 1).
    pub fn max_requests_per_batch(&self) -> usize {
        self.max_requests_per_batch.get()
    }

    /// Bytes per write batch at most (at least 1; an operation larger than this goes alone).
    pub fn max_batch_bytes(&self) -> u64 {
        self.max_batch_bytes.get()
    }

    /// The per-shard dispatch window.
    pub fn window(&self) -> WindowConfig {
        self.window
    }
}

/// A batch of operations for one shard, in arrival order: the operations' handles `H`, which
/// the batcher keeps until each operation ends, and their payloads `P` (`()` unless the
/// operations were added with [`Batcher::handle_op_with_payload`]), which leave by value in
/// the batch's [`BatchAction::Send`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch<H, P = ()> {
    ops: Vec<H>,
    /// The payloads, position by position with `ops`, until the batch is sent (then empty).
    payloads: Vec<P>,
    bytes: u64,
    opened_at: Instant,
    /// Its id in the batcher's `held` slab while it has not left (stale once it has).
    id: Key,
    /// The ordinal the next operation added gets (each operation's [`OpId`] names its batch
    /// and its ordinal).
    next_ordinal: u64,
    /// The ordinals of `ops`, position by position, once an operation was withdrawn; empty
    /// while none was (then an operation's ordinal is its position).
    ordinals: Vec<u64>,
    /// The deadlines of `ops`, position by position (non-decreasing: operations join in
    /// acceptance order), with an operation timeout; empty without one.
    deadlines: Vec<Instant>,
}

impl<H, P> Batch<H, P> {
    /// The operations' handles, in arrival order; a response's position indexes this slice.
    pub fn ops(&self) -> &[H] {
        &self.ops
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch holds no operation.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Sum of the operations' sizes (saturating). An operation withdrawn by
    /// [`Batcher::cancel`] still counts: a withdrawal never lets a write batch grow past the
    /// byte limit it was cut for.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// When the first operation arrived (the batcher's clamped clock).
    pub fn opened_at(&self) -> Instant {
        self.opened_at
    }

    /// The earliest deadline of its operations (that of the oldest, since they are in
    /// acceptance order), with an operation timeout
    /// ([`BatcherConfig::with_op_timeout`]); `None` without one. For a batch in flight it is
    /// the send's deadline: report a send that outlives it with [`Batcher::handle_failure`].
    pub fn deadline(&self) -> Option<Instant> {
        self.deadlines.first().copied()
    }
}

/// Why an operation ended without a response. `E` is the error the caller passed to
/// [`Batcher::handle_failure`] for the operation's batch (`()` when it has none).
///
/// ```
/// use throttle_sansio::FailReason;
///
/// let why: FailReason<&str> = FailReason::BatchFailed("shard 3 is not the leader");
/// assert_eq!(why.error(), Some(&"shard 3 is not the leader"));
/// assert_eq!(FailReason::<&str>::Closed.error(), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailReason<E = ()> {
    /// Its batch completed but the response did not cover it.
    NoResponse,
    /// Its batch failed as a whole, with this error (a copy of the one passed to
    /// [`Batcher::handle_failure`]; each operation of the batch gets its own).
    BatchFailed(E),
    /// The batcher closed before the operation was sent.
    Closed,
    /// Its deadline ([`BatcherConfig::with_op_timeout`]) passed before its batch left:
    /// [`Batcher::handle_timeout`] took it out of the batch, which never carries it.
    TimedOut,
}

impl<E> FailReason<E> {
    /// The batch's error, for [`BatchFailed`](Self::BatchFailed).
    pub fn error(&self) -> Option<&E> {
        match self {
            FailReason::BatchFailed(e) => Some(e),
            _ => None,
        }
    }

    /// The batch's error by value, for [`BatchFailed`](Self::BatchFailed).
    pub fn into_error(self) -> Option<E> {
        match self {
            FailReason::BatchFailed(e) => Some(e),
            _ => None,
        }
    }
}

/// What the driver must do next, drained with [`Batcher::poll_action`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchAction<Shard, H, P = (), E = ()> {
    /// Send the batch held under `credit`: its operations' payloads are here by value, in
    /// batch order (the handles stay in the batcher: read them with [`Batcher::batch`]).
    /// Report its end with [`Batcher::handle_response`] or [`Batcher::handle_failure`]
    /// exactly once.
    Send {
        /// The shard to send to.
        shard: Shard,
        /// The batch's credit.
        credit: CreditId,
        /// The operations' payloads, position by position (a response's position indexes
        /// this vector too). All `()` for operations added with [`Batcher::handle_op`]
        /// (a `Vec<()>` never allocates).
        payloads: Vec<P>,
    },
    /// Hand the operation its response: entry `position` of its batch's response.
    Deliver {
        /// The operation's handle.
        handle: H,
        /// Its position in the batch (and in the response).
        position: usize,
    },
    /// End the operation with an error.
    Fail {
        /// The operation's handle.
        handle: H,
        /// Why it failed (with the batch's error for a failed batch).
        reason: FailReason<E>,
    },
}

/// Why [`Batcher::handle_op`] refused an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum RefuseReason {
    /// The batcher closed ([`Batcher::close`], or it ran out of ids).
    #[error("the batcher is closed")]
    Closed,
    /// The batcher is draining ([`Batcher::drain`]): it sends what it holds, takes nothing new.
    #[error("the batcher is draining")]
    Draining,
    /// A write operation larger than the batch limit, under [`Oversized::Reject`] (Oxia's
    /// `RequestTooLarge`).
    #[error("operation of {bytes} bytes exceeds the {limit}-byte batch limit")]
    TooLarge {
        /// The operation's size.
        bytes: u64,
        /// [`BatcherConfig::max_batch_bytes`].
        limit: u64,
    },
}

/// An operation the batcher refused, and why; what was offered is handed back: the handle, or
/// `(handle, payload)` from [`Batcher::handle_op_with_payload`]. (Not `Closed`: that is
/// `sync::Closed` (feature `std`), the handles' unit error, and no two public types of the
/// crate share a name.)
///
/// ```
/// use core::num::NonZeroU64;
/// use throttle_sansio::{Batcher, BatcherConfig, Instant, Oversized, RefuseReason, Refused};
/// # use core::hash::BuildHasherDefault;
/// # #[derive(Default)] struct H(u64);
/// # impl core::hash::Hasher for H {
/// #     fn finish(&self) -> u64 { self.0 }
/// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
/// # }
/// let limit = NonZeroU64::new(16).expect("not zero");
/// let cfg = BatcherConfig::writes().with_max_batch_bytes(limit).with_oversized(Oversized::Reject);
/// let mut b: Batcher<u32, &str, BuildHasherDefault<H>> = Batcher::new(cfg);
/// let refused = b.handle_op(Instant::ZERO, 1, "put big", 64).unwrap_err();
/// assert_eq!(refused, Refused::new("put big", RefuseReason::TooLarge { bytes: 64, limit: 16 }));
/// assert_eq!(refused.to_string(), "batcher refused the operation: operation of 64 bytes exceeds the 16-byte batch limit");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("batcher refused the operation: {reason}")]
#[non_exhaustive]
pub struct Refused<H> {
    /// What was offered, handed back.
    pub handle: H,
    /// Why it was refused.
    pub reason: RefuseReason,
}

impl<H> Refused<H> {
    /// A refusal of `handle` for `reason`.
    pub fn new(handle: H, reason: RefuseReason) -> Self {
        Refused { handle, reason }
    }

    /// The refused operation's handle.
    pub fn into_handle(self) -> H {
        self.handle
    }

    /// Why it was refused.
    pub fn reason(&self) -> RefuseReason {
        self.reason
    }
}

/// What a write batcher does with an operation larger than
/// [`BatcherConfig::max_batch_bytes`] ([`BatcherConfig::with_oversized`]; reads have no byte
/// limit, so this never applies to them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Oversized {
    /// The default: it closes the open batch and leaves in a batch of its own (a server that
    /// takes it gets it; one that refuses it answers that one batch with its error).
    #[default]
    TravelAlone,
    /// Refused at once by [`Batcher::handle_op`] with [`RefuseReason::TooLarge`], before it
    /// is batched: nothing is queued or sent (the Rust Oxia client's `RequestTooLarge`, for
    /// an operation of more than `max_batch_size` bytes).
    Reject,
}

/// Why [`Batcher::requeue_with_payloads`] refused; nothing changed.
///
/// ```
/// use throttle_sansio::batcher::RequeueError;
/// use throttle_sansio::{Batcher, BatcherConfig, BatchAction, Instant, ReleaseError};
/// # use core::hash::BuildHasherDefault;
/// # #[derive(Default)] struct H(u64);
/// # impl core::hash::Hasher for H {
/// #     fn finish(&self) -> u64 { self.0 }
/// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
/// # }
/// let mut b: Batcher<u32, u8, BuildHasherDefault<H>, &str> = Batcher::new(BatcherConfig::reads());
/// b.handle_op_with_payload(Instant::ZERO, 1, 7, "get a", 0).unwrap();
/// let Some(BatchAction::Send { credit, payloads, .. }) = b.poll_action() else { unreachable!() };
/// assert_eq!(
///     b.requeue_with_payloads(Instant::ZERO, credit, vec![]),
///     Err(RequeueError::Payloads { payloads: vec![], expected: 1 })
/// );
/// b.requeue_with_payloads(Instant::ZERO, credit, payloads).unwrap();
/// assert_eq!(
///     b.requeue_with_payloads(Instant::ZERO, credit, vec!["get a"]),
///     Err(RequeueError::Credit(ReleaseError::AlreadyReleased))
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequeueError<P> {
    /// The credit names no batch in flight (unknown, or already released).
    #[error("no batch in flight under this credit")]
    Credit(#[source] ReleaseError),
    /// The payloads handed back are not one per operation of the batch; here they are back.
    #[error("requeue needs one payload per operation ({expected}), got {}", .payloads.len())]
    Payloads {
        /// The payloads passed, handed back.
        payloads: Vec<P>,
        /// The batch's operation count.
        expected: usize,
    },
}

/// Names an operation accepted by [`Batcher::handle_op`], for [`Batcher::cancel`]. Meaningful
/// only to the batcher that issued it (another batcher's, or a forged one, is refused as
/// [`ReleaseError::Unknown`]); never reused.
///
/// ```
/// use throttle_sansio::{Batcher, BatcherConfig, Instant, Withdrawal};
/// # use core::hash::BuildHasherDefault;
/// # #[derive(Default)] struct H(u64);
/// # impl core::hash::Hasher for H {
/// #     fn finish(&self) -> u64 { self.0 }
/// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
/// # }
/// let mut b: Batcher<u32, &str, BuildHasherDefault<H>> = Batcher::new(BatcherConfig::reads());
/// let id = b.handle_op(Instant::ZERO, 1, "get a", 0).unwrap();
/// assert_eq!(b.cancel(id), Ok(Withdrawal::Withdrawn("get a")));
/// assert_eq!(b.cancel(id), Ok(Withdrawal::TooLate), "nothing left to withdraw");
/// b.flush(Instant::ZERO);
/// assert_eq!(b.poll_action(), None, "the emptied batch is never sent");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpId {
    batch: Key,
    ordinal: u64,
}

#[cfg(feature = "model")]
impl OpId {
    /// An id derived from this one that its batcher never issued, for the model checker:
    /// `0` an ordinal past the batch's, `1` another batcher's tag, `2` a generation never
    /// issued.
    pub(crate) fn forged(self, how: u8) -> OpId {
        let k = self.batch;
        match how {
            0 => OpId {
                ordinal: u64::MAX,
                ..self
            },
            1 => OpId {
                batch: Key::new(k.generation, k.slot(), k.tag().wrapping_add(1)),
                ..self
            },
            _ => OpId {
                batch: Key::new(u64::MAX - 1, k.slot(), k.tag()),
                ..self
            },
        }
    }
}

/// What [`Batcher::cancel`] did.
///
/// ```
/// use throttle_sansio::{BatchAction, Batcher, BatcherConfig, Instant, Withdrawal};
/// # use core::hash::BuildHasherDefault;
/// # #[derive(Default)] struct H(u64);
/// # impl core::hash::Hasher for H {
/// #     fn finish(&self) -> u64 { self.0 }
/// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
/// # }
/// let mut b: Batcher<u32, &str, BuildHasherDefault<H>> = Batcher::new(BatcherConfig::reads());
/// let (now, a) = (Instant::ZERO, b.handle_op(Instant::ZERO, 1, "get a", 0).unwrap());
/// b.flush(now); // shard 1 has credit: the batch leaves
/// assert!(matches!(b.poll_action(), Some(BatchAction::Send { .. })));
/// assert_eq!(b.cancel(a), Ok(Withdrawal::TooLate), "it ends through poll_action instead");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Withdrawal<H> {
    /// The operation's batch had not left: the operation is out of it, and its handle is
    /// handed back. It is never sent and never ends through [`Batcher::poll_action`].
    Withdrawn(H),
    /// Nothing to withdraw: the operation's batch has left (the operation ends through
    /// `poll_action` as usual), or the operation already ended or was withdrawn.
    TooLate,
}

/// Where a batch that has not left is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// In the batcher's open list, the entry at this place.
    Open(Place),
    /// Parked in the window, at this place.
    Parked(Place),
    /// Queued in the window under this ticket.
    Queued(Ticket),
    /// In flight under this credit (it left; [`Batcher::requeue`] may put it back).
    Sent(CreditId),
}

#[derive(Clone, Debug)]
struct InFlight<H, P> {
    credit: CreditId,
    batch: Batch<H, P>,
}

/// A shard with an open batch in the batcher (`batch` is `None` once the last one left full).
#[derive(Clone, Debug)]
struct OpenShard<Shard, H, P> {
    key: Shard,
    /// The window's hash of `key`, taken once by `handle_op`.
    hash: u64,
    /// The shard's entry in the window, pinned while it is listed here, so that `flush` and
    /// `close` reach it without a lookup: they run no user code.
    place: Place,
    batch: Option<Batch<H, P>>,
}

/// The stored hash of the open shard at `i`, to rehash the index without running user code.
fn open_hash<Shard, H, P>(list: &[OpenShard<Shard, H, P>], i: u32) -> u64 {
    list.get(i as usize).map_or(0, |o| o.hash)
}

/// The smallest length of the deadline queue that triggers a sweep of its stale entries.
const TIMERS_MIN: usize = 64;

/// Per-shard batching in front of a [`DispatchWindow`].
///
/// Generic over the shard key, the caller's per-operation handle `H` (a response channel, an
/// operation id, …) and the hasher `S`. Use one batcher for reads and another for writes, each
/// with its own window, as the Oxia Java client does since PR #362 (its `ReadBatchFactory`
/// keeps a per-shard `DispatchWindow` of its own).
///
/// # Driving contract
///
/// - Type parameters: the shard key, the per-operation handle `H`, the hasher `S`, the
///   per-operation payload `P` (default `()`: none) and the batch error `E` passed to
///   `handle_failure` (default `()`).
/// - Inputs: [`handle_op`](Self::handle_op) (or
///   [`handle_op_with_payload`](Self::handle_op_with_payload)) for each operation;
///   [`flush`](Self::flush) whenever the driver's input queue is empty;
///   [`handle_response`](Self::handle_response) or [`handle_failure`](Self::handle_failure)
///   exactly once per sent batch; [`close`](Self::close) or [`drain`](Self::drain) to close.
/// - Output: after a burst of inputs, drain [`poll_action`](Self::poll_action) until `None`
///   (running out of actions flushes open batches: add every operation of a burst before
///   draining, or each one leaves alone while its shard has credit). A `Send` carries the
///   batch's payloads by value; the handles stay, readable by position with
///   [`batch`](Self::batch). Put it on the wire after the drain loop or from within it;
///   nothing re-enters the batcher.
/// - Queries (`&self`): [`batch`](Self::batch), [`window`](Self::window),
///   [`open_batches`](Self::open_batches), [`open_ops`](Self::open_ops),
///   [`is_closed`](Self::is_closed), [`is_draining`](Self::is_draining),
///   [`is_drained`](Self::is_drained).
/// - Completion: `handle_response(now, credit, positions)` names the positions (indexes into
///   [`Batch::ops`]) that got a response; each of those is `Deliver`ed once, every other
///   operation of the batch `Fail`s with [`FailReason::NoResponse`]. Out-of-range and repeated
///   positions are ignored. `handle_failure(now, credit, error)` fails every operation with
///   [`FailReason::BatchFailed`] carrying its own copy of `error`. Either releases the batch's
///   credit exactly once (through [`DispatchWindow::complete`], the single point of truth) and
///   may `Send` the next batch.
/// - Maintenance: when [`poll_timeout`](Self::poll_timeout) returns a deadline, call
///   [`handle_timeout(now)`](Self::handle_timeout) once it has passed (earlier or more often is
///   harmless: it runs at most once per
///   [`MAINTENANCE_INTERVAL`](crate::dispatch_window::MAINTENANCE_INTERVAL)). It is the only
///   place memory is given back, for the batcher and its window. There is no linger timer:
///   otherwise `now` only stamps [`Batch::opened_at`].
///
/// Allocation: after warm-up a workload that repeats allocates nothing. Emptied operation
/// buffers go to a pool that holds at most as many as were in use at the recent peak, and the
/// maps keep their capacity between rounds; `handle_timeout` shrinks them only once the peak
/// since its previous run is below a quarter of their capacity, so idle shards' memory comes
/// back within two runs.
///
/// ```
/// use throttle_sansio::{BatchAction, Batcher, BatcherConfig, FailReason, Instant};
/// # use core::hash::BuildHasherDefault;
/// # #[derive(Default)] struct H(u64);
/// # impl core::hash::Hasher for H {
/// #     fn finish(&self) -> u64 { self.0 }
/// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
/// # }
/// let mut b: Batcher<u32, &str, BuildHasherDefault<H>> = Batcher::new(BatcherConfig::reads());
/// let now = Instant::ZERO;
/// b.handle_op(now, 1, "get a", 0).unwrap();
/// b.handle_op(now, 1, "get b", 0).unwrap();
/// b.flush(now); // input queue empty and shard 1 has credit: the batch goes out now
/// let Some(BatchAction::Send { shard: 1, credit, .. }) = b.poll_action() else { unreachable!() };
/// assert_eq!(b.batch(credit).unwrap().ops(), ["get a", "get b"]);
///
/// b.handle_response(now, credit, [0]).unwrap(); // the response covered only position 0
/// assert_eq!(b.poll_action(), Some(BatchAction::Deliver { handle: "get a", position: 0 }));
/// assert_eq!(
///     b.poll_action(),
///     Some(BatchAction::Fail { handle: "get b", reason: FailReason::NoResponse })
/// );
/// assert_eq!(b.poll_action(), None);
/// ```
#[derive(Clone, Debug)]
pub struct Batcher<Shard, H, S, P = (), E = ()> {
    cfg: BatcherConfig,
    clock: Clock,
    window: DispatchWindow<Shard, Batch<H, P>, S>,
    /// Index of `open_list` by the shards' stored hashes.
    open: HashTable<u32>,
    /// Shards with an open batch in the batcher, in arrival order: `flush` and `close` drain
    /// it without scanning every shard ever seen.
    open_list: Vec<OpenShard<Shard, H, P>>,
    /// Entries of `open_list` holding `Some` batch, so `open_batches` is exact and O(1).
    open_count: usize,
    /// Batches in flight, indexed by their credit's slot.
    sent: Vec<Option<InFlight<H, P>>>,
    actions: VecDeque<BatchAction<Shard, H, P, E>>,
    /// Where each batch that has not left is, by [`Batch::id`]: what [`cancel`](Self::cancel)
    /// follows from an [`OpId`].
    held: Slab<Held>,
    /// Emptied operation buffers. A new buffer is made only when this is empty, so buffers in
    /// use plus spares never exceed the peak number in use at once.
    spare_ops: Vec<Vec<H>>,
    /// Operation buffers in use (open, parked, queued or in flight).
    ops_out: usize,
    /// Emptied deadline buffers (with an operation timeout), as `spare_ops`.
    spare_deadlines: Vec<Vec<Instant>>,
    /// With an operation timeout: each accepted operation's deadline and id, sorted by
    /// deadline: `handle_op` appends (the clock is clamped, so its deadline is the latest),
    /// `requeue` inserts in order. An entry is *stale* once its batch ended (`held` no longer
    /// has it); stale entries are dropped from the front by `handle_timeout` and, in bulk,
    /// when the queue reaches `timers_limit`.
    timers: VecDeque<(Instant, OpId)>,
    /// The queue length that triggers dropping stale entries: twice what survived the last
    /// sweep (at least [`TIMERS_MIN`]), so the sweeps cost O(1) per operation and the queue
    /// holds at most about twice the operations held.
    timers_limit: usize,
    peak_timers: Peak,
    responded: Vec<bool>,
    /// Scratch for [`handle_failure`](Self::handle_failure): one copy of the error per
    /// operation, made before anything changes. Empty between calls.
    errors: Vec<E>,
    closed: bool,
    /// After [`drain`](Self::drain): operations are refused, but everything accepted is sent.
    draining: bool,
    maintenance: Maintenance,
    peak_ops_out: Peak,
    peak_batch_len: Peak,
    peak_open: Peak,
    peak_actions: Peak,
}

impl<Shard, H, S, E> Batcher<Shard, H, S, (), E>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    /// Adds an operation of `bytes` bytes for `shard`, with no payload: the batch's `Send`
    /// carries `()`s and the caller reads the handles by reference with
    /// [`batch`](Self::batch). Otherwise exactly
    /// [`handle_op_with_payload`](Self::handle_op_with_payload).
    pub fn handle_op(
        &mut self,
        now: Instant,
        shard: Shard,
        handle: H,
        bytes: u64,
    ) -> Result<OpId, Refused<H>> {
        self.handle_op_with_payload(now, shard, handle, (), bytes)
            .map_err(|r| Refused::new(r.handle.0, r.reason))
    }

    /// Withdraws the operation `op` if its batch has not left yet, handing its handle back:
    /// [`cancel_with_payload`](Self::cancel_with_payload) without a payload.
    pub fn cancel(&mut self, op: OpId) -> Result<Withdrawal<H>, ReleaseError> {
        self.cancel_with_payload(op).map(|w| match w {
            Withdrawal::Withdrawn((handle, ())) => Withdrawal::Withdrawn(handle),
            Withdrawal::TooLate => Withdrawal::TooLate,
        })
    }

    /// The batch in flight under `credit` was torn (its stream broke before an answer): puts
    /// it back at the head of its shard's order, to be sent again:
    /// [`requeue_with_payloads`](Self::requeue_with_payloads) for operations without a
    /// payload. An unknown or already-released credit is an `Err` and changes nothing.
    ///
    /// # Panics
    ///
    /// If the shard's `Clone` panics (one copy, made before anything changes: the batch is
    /// then still in flight under `credit`).
    ///
    /// ```
    /// use core::num::NonZeroUsize;
    /// use throttle_sansio::{BatchAction, Batcher, BatcherConfig, Instant};
    /// # use core::hash::BuildHasherDefault;
    /// # #[derive(Default)] struct H(u64);
    /// # impl core::hash::Hasher for H {
    /// #     fn finish(&self) -> u64 { self.0 }
    /// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
    /// # }
    /// let one = NonZeroUsize::MIN;
    /// let cfg = BatcherConfig::writes().with_max_requests_per_batch(one);
    /// let mut b: Batcher<u32, &str, BuildHasherDefault<H>> = Batcher::new(cfg);
    /// let now = Instant::ZERO;
    /// b.handle_op(now, 1, "put k1", 1).unwrap();
    /// b.handle_op(now, 1, "put k2", 1).unwrap();
    /// let sent = |b: &mut Batcher<u32, &str, _>| -> Vec<_> {
    ///     core::iter::from_fn(|| b.poll_action())
    ///         .filter_map(|a| match a { BatchAction::Send { credit, .. } => Some(credit), _ => None })
    ///         .collect()
    /// };
    /// let [c1, c2] = sent(&mut b)[..] else { unreachable!() };
    /// b.pause(1); // the stream tore: nothing more goes out until it is back
    /// b.requeue(now, c1).unwrap();
    /// b.requeue(now, c2).unwrap();
    /// b.resume(now, 1); // reconnected
    /// let again = sent(&mut b);
    /// assert_eq!(b.batch(again[0]).unwrap().ops(), ["put k1"]);
    /// assert_eq!(b.batch(again[1]).unwrap().ops(), ["put k2"]);
    /// ```
    pub fn requeue(&mut self, now: Instant, credit: CreditId) -> Result<(), ReleaseError> {
        let n = self.batch(credit).map_or(0, Batch::len);
        let mut payloads = Vec::new();
        payloads.resize(n, ());
        self.requeue_with_payloads(now, credit, payloads)
            .map_err(|e| match e {
                RequeueError::Credit(e) => e,
                // Unreachable: one `()` per operation was passed.
                RequeueError::Payloads { .. } => ReleaseError::Unknown,
            })
    }
}

impl<Shard, H, S, P, E> Batcher<Shard, H, S, P, E>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    /// A batcher with the default hasher of `S`. Infallible: a [`BatcherConfig`] is valid by
    /// construction.
    pub fn new(cfg: BatcherConfig) -> Self
    where
        S: Default,
    {
        Self::with_hasher(cfg, S::default())
    }

    /// A batcher hashing shard keys with `hasher`. Infallible, as [`new`](Self::new).
    pub fn with_hasher(cfg: BatcherConfig, hasher: S) -> Self {
        // `BatcherConfig::with_window` refuses a window of 0, the one invalid `WindowConfig`,
        // so the limit is never 0 here (and 1 would be the safe reading if it were).
        let limit = NonZeroUsize::new(cfg.window.max_in_flight()).unwrap_or(NonZeroUsize::MIN);
        let window = DispatchWindow::limited(limit, hasher.clone());
        Batcher {
            cfg,
            clock: Clock::default(),
            window,
            open: HashTable::new(),
            open_list: Vec::new(),
            open_count: 0,
            sent: Vec::new(),
            actions: VecDeque::new(),
            held: Slab::new(),
            spare_ops: Vec::new(),
            ops_out: 0,
            spare_deadlines: Vec::new(),
            timers: VecDeque::new(),
            timers_limit: TIMERS_MIN,
            peak_timers: Peak::default(),
            responded: Vec::new(),
            errors: Vec::new(),
            closed: false,
            draining: false,
            maintenance: Maintenance::default(),
            peak_ops_out: Peak::default(),
            peak_batch_len: Peak::default(),
            peak_open: Peak::default(),
            peak_actions: Peak::default(),
        }
    }

    /// Adds an operation of `bytes` bytes for `shard`: its `handle` stays in the batcher until
    /// the operation ends (`Deliver` or `Fail`), its `payload` leaves by value in its batch's
    /// [`BatchAction::Send`]. A batch that becomes full is handed to the window at once; the
    /// open batch goes out (or is parked) at the next [`flush`](Self::flush), or when
    /// [`poll_action`](Self::poll_action) runs out of actions, so an accepted operation is
    /// never stranded. Refused, handle and payload handed back, after [`close`](Self::close)
    /// or [`drain`](Self::drain). The returned [`OpId`] withdraws the operation with
    /// [`cancel_with_payload`](Self::cancel_with_payload) until its batch leaves.
    ///
    /// Should the batcher run out of batch ids (2^64 batches; see
    /// [`Exhausted`](crate::Exhausted)), it closes, as when its window does.
    ///
    /// The shard's key is hashed once, looked up (`Eq`) and copied (`Clone`, once per copy this
    /// operation keeps or sends) before anything changes, so a panic in any of them leaves the
    /// batcher as it was (the operation's handle and payload are dropped with the panic).
    ///
    /// ```
    /// use throttle_sansio::{BatchAction, Batcher, BatcherConfig, Instant};
    /// # use core::hash::BuildHasherDefault;
    /// # #[derive(Default)] struct H(u64);
    /// # impl core::hash::Hasher for H {
    /// #     fn finish(&self) -> u64 { self.0 }
    /// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
    /// # }
    /// // Handles are reply ids the batcher keeps; payloads are requests the caller takes.
    /// let mut b: Batcher<u32, u64, BuildHasherDefault<H>, String> =
    ///     Batcher::new(BatcherConfig::reads());
    /// let now = Instant::ZERO;
    /// b.handle_op_with_payload(now, 1, 7, "get a".to_string(), 0).unwrap();
    /// b.handle_op_with_payload(now, 1, 8, "get b".to_string(), 0).unwrap();
    /// let Some(BatchAction::Send { credit, payloads, .. }) = b.poll_action() else { unreachable!() };
    /// assert_eq!(payloads, ["get a", "get b"]); // by value: no clone
    /// b.handle_response(now, credit, [0, 1]).unwrap();
    /// assert!(matches!(b.poll_action(), Some(BatchAction::Deliver { handle: 7, position: 0 })));
    /// assert!(matches!(b.poll_action(), Some(BatchAction::Deliver { handle: 8, position: 1 })));
    /// ```
    pub fn handle_op_with_payload(
        &mut self,
        now: Instant,
        shard: Shard,
        handle: H,
        payload: P,
        bytes: u64,
    ) -> Result<OpId, Refused<(H, P)>> {
        if !self.closed && !self.held.can_issue() {
            self.close();
        }
        if self.closed || self.draining {
            self.clock.observe(now);
            let reason = if self.closed {
                RefuseReason::Closed
            } else {
                RefuseReason::Draining
            };
            return Err(Refused::new((handle, payload), reason));
        }
        if self.cfg.oversized == Oversized::Reject
            && self.cfg.kind == BatchKind::Write
            && bytes > self.cfg.max_batch_bytes()
        {
            // Oxia's check (`size > max_batch_size`): an operation of exactly the limit fits.
            self.clock.observe(now);
            let limit = self.cfg.max_batch_bytes();
            return Err(Refused::new(
                (handle, payload),
                RefuseReason::TooLarge { bytes, limit },
            ));
        }
        // User code first: the hash, the lookups and every key copy needed below.
        let hash = self.window.hash_key(&shard);
        let listed = self.find_open(hash, &shard);
        let place = match listed {
            Some(i) => self.open_list.get(i).map(|o| o.place),
            None => self.window.place_of(&shard, hash),
        };
        let current = match listed {
            Some(i) => self.open_list.get(i).and_then(|o| o.batch.as_ref()),
            None => place.and_then(|p| self.window.parked_at(p)),
        };
        let (held, held_bytes) = current.map_or((0, 0), |b| (b.ops.len(), b.bytes));
        let by_bytes = self.cfg.kind == BatchKind::Write;
        let max_bytes = self.cfg.max_batch_bytes();
        let max_ops = self.cfg.max_requests_per_batch();
        // An operation that would push a non-empty write batch past the byte limit closes it.
        let overflows = by_bytes && held > 0 && held_bytes.saturating_add(bytes) > max_bytes;
        let (held, held_bytes) = if overflows {
            (0, 0)
        } else {
            (held, held_bytes)
        };
        let fills = held.saturating_add(1) >= max_ops
            || (by_bytes && held_bytes.saturating_add(bytes) >= max_bytes);
        // Copies: the window's (a shard it has no entry for), the list's (a shard not listed),
        // and one per batch sent (each dispatch names its shard).
        let needed = usize::from(place.is_none())
            + usize::from(listed.is_none())
            + usize::from(overflows)
            + usize::from(fills);
        let mut keys: SmallVec<[Shard; 4]> = SmallVec::new();
        for _ in 1..needed {
            keys.push(shard.clone());
        }
        if needed > 0 {
            keys.push(shard);
        }
        // From here on no user code runs.
        let now = self.clock.observe(now);
        self.maintenance.touch();
        let i = match (listed, place) {
            (Some(i), _) => i,
            (None, place) => {
                let place = match place {
                    Some(p) => {
                        self.window.pin(p);
                        p
                    }
                    None => match keys.pop() {
                        Some(key) => self.window.open_pinned(key, hash),
                        None => return Err(Refused::new((handle, payload), RefuseReason::Closed)), // unreachable: counted above
                    },
                };
                // Reclaim the parked batch so newer operations join it instead of queueing
                // behind.
                let parked = self.window.reclaim_at(place);
                if let Some(b) = &parked {
                    self.open_count += 1;
                    self.locate(b.id, Held::Open(place));
                }
                let Some(key) = keys.pop() else {
                    self.window.unpin(place);
                    return Err(Refused::new((handle, payload), RefuseReason::Closed)); // unreachable: counted above
                };
                let i = self.open_list.len();
                self.open_list.push(OpenShard {
                    key,
                    hash,
                    place,
                    batch: parked,
                });
                let list = &self.open_list;
                self.open
                    .insert_unique(hash, i as u32, |&j| open_hash(list, j));
                self.peak_open.see(self.open_list.len());
                i
            }
        };
        let Some(open) = self.open_list.get_mut(i) else {
            // Unreachable: listed above. Hand the operation back rather than lose it.
            return Err(Refused::new((handle, payload), RefuseReason::Closed));
        };
        let place = open.place;
        let slot = &mut open.batch;
        let mut overflowed = None;
        if overflows {
            overflowed = slot.take();
            self.open_count = self.open_count.saturating_sub(1);
        }
        let batch = match slot {
            Some(batch) => batch,
            None => {
                // `can_issue` was checked above and nothing was issued since.
                let Ok(id) = self.held.insert(Held::Open(place)) else {
                    return Err(Refused::new((handle, payload), RefuseReason::Closed)); // unreachable
                };
                self.open_count += 1;
                self.ops_out = self.ops_out.saturating_add(1);
                self.peak_ops_out.see(self.ops_out);
                slot.insert(Batch {
                    ops: self.spare_ops.pop().unwrap_or_default(),
                    payloads: Vec::new(),
                    bytes: 0,
                    opened_at: now,
                    id,
                    next_ordinal: 0,
                    ordinals: Vec::new(),
                    deadlines: match self.cfg.op_timeout {
                        Some(_) => self.spare_deadlines.pop().unwrap_or_default(),
                        None => Vec::new(),
                    },
                })
            }
        };
        let op_id = OpId {
            batch: batch.id,
            ordinal: batch.next_ordinal,
        };
        // 2^64 operations in one batch's life: never in practice.
        batch.next_ordinal = batch.next_ordinal.saturating_add(1);
        if !batch.ordinals.is_empty() {
            batch.ordinals.push(op_id.ordinal);
        }
        batch.ops.push(handle);
        batch.payloads.push(payload);
        batch.bytes = batch.bytes.saturating_add(bytes);
        self.peak_batch_len.see(batch.ops.len());
        let deadline = self.cfg.op_timeout.map(|t| now.saturating_add(t));
        if let Some(at) = deadline {
            batch.deadlines.push(at);
        }
        let full = if fills {
            self.open_count = self.open_count.saturating_sub(1);
            slot.take()
        } else {
            None
        };
        for b in [overflowed, full].into_iter().flatten() {
            match keys.pop() {
                Some(key) => self.submit_full(place, key, b),
                // Unreachable: one copy was made per batch sent.
                None => self.fail_closed(b),
            }
        }
        // After the hand-overs: a sweep must find every batch where `held` says it is.
        if let Some(at) = deadline {
            self.push_timer(at, op_id);
        }
        Ok(op_id)
    }

    /// The driver's input queue is empty: send every open batch whose shard has credit; park
    /// the others in the window, where they keep growing. Runs no user code.
    ///
    /// The open-batch map keeps its capacity for the next round; only
    /// [`handle_timeout`](Self::handle_timeout) shrinks it.
    pub fn flush(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        // Operations past their deadline time out rather than leave.
        self.expire(now);
        self.maintenance.touch();
        self.open.clear();
        let mut list = core::mem::take(&mut self.open_list);
        for open in list.drain(..) {
            let place = open.place;
            if let Some(batch) = open.batch {
                self.open_count = self.open_count.saturating_sub(1);
                let id = batch.id;
                match self.window.submit_or_park_at(place, open.key, batch) {
                    Ok(Some(d)) => self.record(d),
                    Ok(None) => self.locate(id, Held::Parked(place)),
                    Err(e) => {
                        // Closed (id space spent) or, impossibly, already parked: never lose
                        // ops.
                        self.fail_closed(e.into_batch());
                        self.close_if_window_closed();
                    }
                }
            }
            self.window.unpin(place);
        }
        self.open_list = list;
    }

    /// The batch under `credit` got a response covering `positions` (indexes into its
    /// [`Batch::ops`]). Delivers those, fails the rest with [`FailReason::NoResponse`], and
    /// releases the credit (which may `Send` the shard's next batch).
    ///
    /// An unknown or already-released credit is an `Err`; nothing changes and `positions` is
    /// not read.
    pub fn handle_response<I>(
        &mut self,
        now: Instant,
        credit: CreditId,
        positions: I,
    ) -> Result<(), ReleaseError>
    where
        I: IntoIterator<Item = usize>,
    {
        // `complete` copies the key (user `Clone`) before it changes anything.
        let next = self.window.complete(credit);
        self.clock.observe(now);
        let next = next?;
        self.maintenance.touch();
        if let Some(flight) = self.take_sent(credit) {
            let _ = self.held.remove(flight.batch.id);
            self.responded.clear();
            self.responded.resize(flight.batch.ops.len(), false);
            for p in positions {
                if let Some(r) = self.responded.get_mut(p) {
                    *r = true;
                }
            }
            let mut ops = flight.batch.ops;
            self.recycle_deadlines(flight.batch.deadlines);
            for (position, handle) in ops.drain(..).enumerate() {
                let action = if self.responded.get(position).copied().unwrap_or(false) {
                    BatchAction::Deliver { handle, position }
                } else {
                    BatchAction::Fail {
                        handle,
                        reason: FailReason::NoResponse,
                    }
                };
                self.push_action(action);
            }
            self.recycle(ops);
        }
        self.after_release(next);
        Ok(())
    }

    /// The batch under `credit` failed as a whole with `error`: fails every operation with
    /// [`FailReason::BatchFailed`] carrying its own copy of `error` (the last operation gets
    /// `error` itself, so a batch of `n` clones it `n - 1` times; share an expensive error
    /// with an `Arc`), and releases the credit (which may `Send` the next batch). An unknown
    /// or already-released credit is an `Err`, changes nothing and drops `error`.
    ///
    /// `E = ()` for a caller with no error to pass.
    ///
    /// # Panics
    ///
    /// If `E::clone` panics. The copies are made before anything changes, so the batcher is
    /// then as it was (the credit is still live: report the failure again).
    ///
    /// ```
    /// use throttle_sansio::{BatchAction, Batcher, BatcherConfig, FailReason, Instant};
    /// # use core::hash::BuildHasherDefault;
    /// # #[derive(Default)] struct H(u64);
    /// # impl core::hash::Hasher for H {
    /// #     fn finish(&self) -> u64 { self.0 }
    /// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
    /// # }
    /// let mut b: Batcher<u32, &str, BuildHasherDefault<H>, (), &str> =
    ///     Batcher::new(BatcherConfig::reads());
    /// b.handle_op(Instant::ZERO, 1, "get a", 0).unwrap();
    /// let Some(BatchAction::Send { credit, .. }) = b.poll_action() else { unreachable!() };
    /// b.handle_failure(Instant::ZERO, credit, "not the leader").unwrap();
    /// assert_eq!(
    ///     b.poll_action(),
    ///     Some(BatchAction::Fail { handle: "get a", reason: FailReason::BatchFailed("not the leader") })
    /// );
    /// ```
    pub fn handle_failure(
        &mut self,
        now: Instant,
        credit: CreditId,
        error: E,
    ) -> Result<(), ReleaseError>
    where
        E: Clone,
    {
        // User code first: one copy of the error per operation but the last (`E::clone`), into
        // a scratch buffer of our own that a panic drops.
        let n = self.batch(credit).map_or(0, Batch::len);
        let mut errors = core::mem::take(&mut self.errors);
        errors.clear();
        for _ in 1..n {
            errors.push(error.clone());
        }
        if n > 0 {
            errors.push(error);
        }
        // `complete` copies the key (user `Clone`) before it changes anything.
        let next = self.window.complete(credit);
        self.clock.observe(now);
        let next = match next {
            Ok(next) => next,
            Err(e) => {
                errors.clear();
                self.errors = errors;
                return Err(e);
            }
        };
        self.maintenance.touch();
        if let Some(flight) = self.take_sent(credit) {
            let _ = self.held.remove(flight.batch.id);
            let mut ops = flight.batch.ops;
            self.recycle_deadlines(flight.batch.deadlines);
            for (handle, error) in ops.drain(..).zip(errors.drain(..)) {
                self.push_action(BatchAction::Fail {
                    handle,
                    reason: FailReason::BatchFailed(error),
                });
            }
            self.recycle(ops);
        }
        errors.clear();
        self.errors = errors;
        self.after_release(next);
        Ok(())
    }

    /// Withdraws the operation `op` if its batch has not left yet (it is open, parked or
    /// queued): the operation is taken out of the batch, which keeps the others in their
    /// order, and its handle is handed back in [`Withdrawal::Withdrawn`]. A batch left empty
    /// is dropped: it never takes a credit, and the shard's next batch goes out as if it had
    /// never been. Runs no user code and emits no action.
    ///
    /// [`Withdrawal::TooLate`] if the operation's batch has left (its `Send` was emitted: the
    /// operation ends through [`poll_action`](Self::poll_action) as usual), or if it already
    /// ended or was withdrawn. An [`OpId`] this batcher never issued (another batcher's, a
    /// forged one) is refused as [`ReleaseError::Unknown`] and changes nothing.
    ///
    /// O(operations in the batch). The first withdrawal from a batch allocates a list of the
    /// positions' ordinals for it.
    ///
    /// ```
    /// use throttle_sansio::{Batcher, BatcherConfig, Instant, Withdrawal};
    /// # use core::hash::BuildHasherDefault;
    /// # #[derive(Default)] struct H(u64);
    /// # impl core::hash::Hasher for H {
    /// #     fn finish(&self) -> u64 { self.0 }
    /// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
    /// # }
    /// let mut b: Batcher<u32, u64, BuildHasherDefault<H>, &str> = Batcher::new(BatcherConfig::reads());
    /// let id = b.handle_op_with_payload(Instant::ZERO, 1, 7, "get a", 0).unwrap();
    /// assert_eq!(b.cancel_with_payload(id), Ok(Withdrawal::Withdrawn((7, "get a"))));
    /// ```
    pub fn cancel_with_payload(&mut self, op: OpId) -> Result<Withdrawal<(H, P)>, ReleaseError> {
        let Some(&at) = self.held.get(op.batch) else {
            return match self.held.refusal(op.batch) {
                ReleaseError::AlreadyReleased => Ok(Withdrawal::TooLate),
                refusal => Err(refusal),
            };
        };
        let open = match at {
            Held::Open(place) => self.open_at(place),
            Held::Sent(_) => return Ok(Withdrawal::TooLate),
            _ => None,
        };
        let batch = match at {
            Held::Open(_) => open
                .and_then(|i| self.open_list.get_mut(i))
                .and_then(|o| o.batch.as_mut()),
            Held::Parked(place) => self.window.parked_at_mut(place),
            Held::Queued(ticket) => self.window.queued_mut(ticket),
            Held::Sent(_) => None,
        };
        let Some(batch) = batch.filter(|b| b.id == op.batch) else {
            // Unreachable: `held` follows every batch that has not left.
            debug_assert!(false, "a held batch is not where it is recorded");
            return Ok(Withdrawal::TooLate);
        };
        if op.ordinal >= batch.next_ordinal {
            return Err(ReleaseError::Unknown);
        }
        let position = if batch.ordinals.is_empty() {
            // Nothing withdrawn yet: ordinals are positions.
            let Ok(p) = usize::try_from(op.ordinal) else {
                return Ok(Withdrawal::TooLate);
            };
            batch.ordinals.extend(0..batch.next_ordinal);
            p
        } else {
            match batch.ordinals.binary_search(&op.ordinal) {
                Ok(p) => p,
                Err(_) => return Ok(Withdrawal::TooLate), // withdrawn before
            }
        };
        // Payloads are kept position by position with the handles until the batch is sent.
        if position >= batch.ops.len() || position >= batch.payloads.len() {
            debug_assert!(false, "an ordinal beyond the batch");
            return Ok(Withdrawal::TooLate);
        }
        batch.ordinals.remove(position);
        let handle = batch.ops.remove(position);
        let payload = batch.payloads.remove(position);
        if position < batch.deadlines.len() {
            batch.deadlines.remove(position);
        }
        let emptied = batch.ops.is_empty();
        self.maintenance.touch();
        if emptied {
            let empty = match at {
                Held::Open(_) => {
                    let b = open
                        .and_then(|i| self.open_list.get_mut(i))
                        .and_then(|o| o.batch.take());
                    if b.is_some() {
                        self.open_count = self.open_count.saturating_sub(1);
                    }
                    b
                }
                Held::Parked(place) => self.window.reclaim_at(place),
                Held::Queued(ticket) => self.window.cancel(ticket).ok(),
                Held::Sent(_) => None,
            };
            let _ = self.held.remove(op.batch);
            if let Some(b) = empty {
                self.recycle(b.ops);
                self.recycle_deadlines(b.deadlines);
            }
        }
        Ok(Withdrawal::Withdrawn((handle, payload)))
    }

    /// Pauses `shard` (its stream is down, e.g. during a reconnect backoff): until
    /// [`resume`](Self::resume) none of its batches is sent. Operations for it are still
    /// accepted and batched as when the shard has no credit: the open batch is parked at the
    /// next flush and keeps growing, full batches queue in arrival order. Batches in flight are
    /// untouched: report their ends as usual, or [`requeue`](Self::requeue) the torn ones
    /// (they go back at the head of the line and wait for the resume). The rule is the
    /// window's ([`DispatchWindow::pause`], where pausing a shard the window has no entry
    /// for, and the memory that takes, is described): the batcher adds none of its own.
    /// Idempotent; does nothing after [`close`](Self::close). [`drain`](Self::drain) does not
    /// lift it: a draining batcher is drained once the shard is resumed and everything sent
    /// has ended, or [`close`](Self::close) fails what is still held.
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash` or `Eq`, or the hasher, panics; the batcher is unchanged.
    pub fn pause(&mut self, shard: Shard) {
        self.maintenance.touch();
        self.window.pause(shard);
    }

    /// Ends a pause of `shard`: its held-back batches (requeued ones first, then the queued
    /// ones, then the parked open batch: the order they would have left in) are sent as far as
    /// the shard has credit, each as a [`BatchAction::Send`]; the rest follow as credits
    /// return. Does nothing for a shard that is not paused.
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash`, `Eq` or `Clone`, or the hasher, panics (every key copy is
    /// made before anything changes); the batcher is then unchanged.
    pub fn resume(&mut self, now: Instant, shard: Shard) {
        let sent = self.window.resume(now, &shard);
        self.clock.observe(now);
        self.maintenance.touch();
        for d in sent {
            self.record(d);
        }
        self.close_if_window_closed();
    }

    /// Whether `shard` is paused ([`pause`](Self::pause), not resumed since).
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash` or `Eq`, or the hasher, panics.
    pub fn is_paused(&self, shard: &Shard) -> bool {
        self.window.is_paused(shard)
    }

    /// The batch in flight under `credit` was torn (its stream broke, so its operations may or
    /// may not have reached the server): puts it back at the head of its shard's order for
    /// at-least-once delivery, with `payloads`, the payloads its [`BatchAction::Send`]
    /// carried, in the same order (one per operation).
    ///
    /// The batch keeps its operations, their order and their [`OpId`]s. It goes before every
    /// batch of the shard that has not left (queued, parked or open), and after the shard's
    /// other requeued batches that left before it (its latest departure counts), whatever the
    /// order of the `requeue` calls: so when one tear takes a shard's batches in flight, they
    /// reach the server again in the order they left in. (A batch torn a second time, after
    /// a resend, goes by its resend: it may then follow a batch that first left after it.)
    /// Its credit
    /// is released exactly once, here (do not report the batch's end as well: a later
    /// [`handle_response`](Self::handle_response) or
    /// [`handle_failure`](Self::handle_failure) under `credit` is refused, as for any released
    /// credit). The freed credit goes to the head of the shard's line at once, unless the
    /// shard is [`pause`](Self::pause)d: pause first, requeue every torn batch, then
    /// [`resume`](Self::resume) once reconnected; the requeued batches are then sent first, in
    /// order (`BatchAction::Send`, with new credits and the payloads by value).
    ///
    /// While [`drain`](Self::drain)ing the batch is still sent again; after
    /// [`close`](Self::close) (or if the window can issue no ticket) its operations fail with
    /// [`FailReason::Closed`] instead. An operation of a requeued batch can be withdrawn with
    /// [`cancel_with_payload`](Self::cancel_with_payload) until the batch leaves again.
    ///
    /// This is the Rust Oxia client's handling of a torn write stream: the unacknowledged
    /// requests are put back in front of the shard's pending ones and sent again, in order,
    /// once the stream is back.
    ///
    /// `Err(RequeueError::Credit)` for an unknown or already-released credit;
    /// `Err(RequeueError::Payloads)` (the payloads handed back) when their number is not the
    /// batch's: either way nothing changes.
    ///
    /// # Panics
    ///
    /// If the shard's `Clone` panics (one copy, made before anything changes: the batch is
    /// then still in flight under `credit`, and `payloads` are dropped).
    pub fn requeue_with_payloads(
        &mut self,
        now: Instant,
        credit: CreditId,
        payloads: Vec<P>,
    ) -> Result<(), RequeueError<P>> {
        // The key copy (user `Clone`) first; then the clock sees `now`, refused or not, as in
        // `handle_response`.
        let key = self.window.credit_key(credit);
        // From here on no user code runs.
        self.clock.observe(now);
        let key = key.map_err(RequeueError::Credit)?;
        let expected = match self.batch(credit) {
            Some(b) => b.len(),
            // Unreachable: every live credit's batch is recorded.
            None => return Err(RequeueError::Credit(ReleaseError::Unknown)),
        };
        if payloads.len() != expected {
            return Err(RequeueError::Payloads { payloads, expected });
        }
        self.maintenance.touch();
        let Some(flight) = self.take_sent(credit) else {
            return Err(RequeueError::Credit(ReleaseError::Unknown));
        };
        let mut batch = flight.batch;
        batch.payloads = payloads;
        let id = batch.id;
        // Its operations' due entries may have left the deadline queue while it was in
        // flight: queue them again, in deadline order, for the next `handle_timeout`.
        let now = self.clock.peek(now);
        for (position, &at) in batch.deadlines.iter().enumerate() {
            if at > now {
                break;
            }
            let ordinal = match batch.ordinals.get(position) {
                Some(&o) => o,
                None => u64::try_from(position).unwrap_or(u64::MAX),
            };
            let op = OpId { batch: id, ordinal };
            // An entry no `handle_timeout` has reached yet is still there: one per operation.
            if self.timers.iter().any(|&(_, o)| o == op) {
                continue;
            }
            let i = self.timers.partition_point(|&(a, _)| a <= at);
            self.timers.insert(i, (at, op));
        }
        let (back, next) = match self.window.requeue(credit, key, batch) {
            Ok(done) => done,
            // Unreachable: the credit was live above and nothing ran since.
            Err(e) => return Err(RequeueError::Credit(e)),
        };
        match back {
            Ok(ticket) => self.locate(id, Held::Queued(ticket)),
            Err(e) => self.fail_closed(e.into_batch()),
        }
        self.after_release(next);
        Ok(())
    }

    /// The index in `open_list` of the shard at `place` (no user code).
    fn open_at(&self, place: Place) -> Option<usize> {
        let list = &self.open_list;
        self.open
            .find(place.key_hash(), |&j| {
                list.get(j as usize).is_some_and(|o| o.place == place)
            })
            .map(|&j| j as usize)
    }

    /// The failing close: every operation not yet sent (open, queued or parked) fails with
    /// [`FailReason::Closed`] (drain them with [`poll_action`](Self::poll_action)). Batches in
    /// flight are untouched; complete them as usual (their releases send nothing). Later
    /// operations are refused. Idempotent: a second `close` fails nothing more; after
    /// [`drain`](Self::drain) it fails what the drain had not sent yet. Runs no user code.
    ///
    /// Order: per shard, arrival order, batch by batch: the queued batches oldest first, then
    /// the open batch (parked or not), each in its operations' order, which is the order
    /// [`drain`](Self::drain) would have sent them in. (Oxia's `fail_all` fails the open
    /// batch first; arrival order lets a caller that retries failed operations in the order
    /// it gets them keep each shard's order.) Shards come in no particular order.
    pub fn close(&mut self) {
        self.closed = true;
        self.maintenance.touch();
        // Nothing is held back after this: no operation is left to time out.
        self.timers.clear();
        self.open.clear();
        let mut list = core::mem::take(&mut self.open_list);
        let mut open = Vec::new();
        for o in list.drain(..) {
            self.window.unpin(o.place);
            if let Some(batch) = o.batch {
                self.open_count = self.open_count.saturating_sub(1);
                open.push(batch);
            }
        }
        self.open_list = list;
        // A shard's open batch is either parked (handed out after its queued ones) or held
        // here, never both: `handle_op` reclaims the parked one.
        let mut held = Vec::new();
        self.window.close_with(|_, batch| held.push(batch));
        for batch in held.into_iter().chain(open) {
            self.fail_closed(batch);
        }
    }

    /// The draining close: later operations are refused ([`Refused`], as after
    /// [`close`](Self::close)), but every operation already accepted is still sent: open
    /// batches are flushed now, and queued and parked batches go out as credits return,
    /// keeping batch boundaries and per-shard arrival order. Complete batches in flight as
    /// usual; once nothing is open, queued, parked or in flight and every action is drained,
    /// [`is_drained`](Self::is_drained). Withdrawing with `cancel` still works until a batch
    /// leaves. A [`close`](Self::close) afterwards fails what is still held back.
    /// Idempotent; does nothing after `close`. Runs no user code; uses no window operation
    /// beyond those of an open batcher.
    ///
    /// ```
    /// use throttle_sansio::batcher::{RefuseReason, Refused};
    /// use throttle_sansio::{BatchAction, Batcher, BatcherConfig, Instant, WindowConfig};
    /// # use core::hash::BuildHasherDefault;
    /// # #[derive(Default)] struct H(u64);
    /// # impl core::hash::Hasher for H {
    /// #     fn finish(&self) -> u64 { self.0 }
    /// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
    /// # }
    /// let one = BatcherConfig::reads().with_window(WindowConfig::default().with_max_in_flight(1)).unwrap();
    /// let mut b: Batcher<u32, &str, BuildHasherDefault<H>> = Batcher::new(one);
    /// let now = Instant::ZERO;
    /// b.handle_op(now, 1, "a", 0).unwrap();
    /// let Some(BatchAction::Send { credit, .. }) = b.poll_action() else { unreachable!() };
    /// b.handle_op(now, 1, "b", 0).unwrap(); // no credit left: held back
    /// b.drain(now);
    /// assert_eq!(b.handle_op(now, 1, "c", 0), Err(Refused::new("c", RefuseReason::Draining)));
    /// assert_eq!(b.poll_action(), None);
    /// b.handle_response(now, credit, [0]).unwrap(); // the credit returns: "b" goes out
    /// assert!(matches!(b.poll_action(), Some(BatchAction::Deliver { handle: "a", .. })));
    /// let Some(BatchAction::Send { credit, .. }) = b.poll_action() else { unreachable!() };
    /// assert!(!b.is_drained(), "b is in flight");
    /// b.handle_response(now, credit, [0]).unwrap();
    /// assert!(matches!(b.poll_action(), Some(BatchAction::Deliver { handle: "b", .. })));
    /// assert!(b.is_drained());
    /// ```
    pub fn drain(&mut self, now: Instant) {
        if self.closed {
            self.clock.observe(now);
            return;
        }
        self.draining = true;
        self.flush(now);
    }

    /// Whether operations are refused ([`close`](Self::close) or [`drain`](Self::drain)) and
    /// everything accepted has ended: nothing open, queued, parked or in flight, and no
    /// action left to [`poll_action`](Self::poll_action).
    pub fn is_drained(&self) -> bool {
        (self.closed || self.draining)
            && self.open_count == 0
            && self.window.shard_count() == 0
            && self.window.live_credits() == 0
            && self.actions.is_empty()
    }

    /// Whether [`drain`](Self::drain) was called (operations are refused, but everything
    /// accepted is sent).
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Maintenance for the batcher and its window: gives memory back, once at most per
    /// [`MAINTENANCE_INTERVAL`](crate::dispatch_window::MAINTENANCE_INTERVAL).
    ///
    /// Spare operation buffers beyond the peak number in use since the previous run are
    /// freed; the open-batch map, the pools and the other buffers shrink only if that peak is
    /// below a quarter of their capacity, and then to twice the peak. A workload that repeats
    /// within the interval therefore keeps what it uses and allocates nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        self.expire(now);
        self.window.handle_timeout(now);
        if !self.maintenance.begin(now) {
            return;
        }
        let timers = self.peak_timers.roll(self.timers.len());
        if let Some(target) = self.maintenance.target(self.timers.capacity(), timers) {
            self.timers.shrink_to(target);
        }
        let open = self.peak_open.roll(self.open_list.len());
        if let Some(target) = self.maintenance.target(self.open.capacity(), open) {
            let list = &self.open_list;
            self.open.shrink_to(target, |&j| open_hash(list, j));
        }
        if let Some(target) = self.maintenance.target(self.open_list.capacity(), open) {
            self.open_list.shrink_to(target);
        }
        let out = self.peak_ops_out.roll(self.ops_out);
        self.spare_ops.truncate(out.saturating_sub(self.ops_out));
        self.spare_deadlines
            .truncate(out.saturating_sub(self.ops_out));
        if let Some(target) = self
            .maintenance
            .target(self.spare_deadlines.capacity(), out)
        {
            self.spare_deadlines.shrink_to(target);
        }
        if let Some(target) = self.maintenance.target(self.spare_ops.capacity(), out) {
            self.spare_ops.shrink_to(target);
        }
        let len = self.peak_batch_len.roll(0);
        for ops in &mut self.spare_ops {
            if let Some(target) = self.maintenance.target(ops.capacity(), len) {
                ops.shrink_to(target);
            }
        }
        if let Some(target) = self.maintenance.target(self.responded.capacity(), len) {
            self.responded.shrink_to(target);
        }
        if let Some(target) = self.maintenance.target(self.errors.capacity(), len) {
            self.errors.shrink_to(target);
        }
        self.held.shrink(&self.maintenance);
        let actions = self.peak_actions.roll(self.actions.len());
        if let Some(target) = self.maintenance.target(self.actions.capacity(), actions) {
            self.actions.shrink_to(target);
        }
        // In-flight batches are indexed by credit slot; slots past the window's slab are free.
        let slots = self.window.credit_slots();
        if let Some(target) = self.maintenance.target(self.sent.capacity(), slots) {
            self.sent.truncate(slots);
            self.sent.shrink_to(target);
        }
    }

    /// Sets the capacity collections keep when they shrink, so model checks reach shrinking.
    #[cfg(feature = "model")]
    pub(crate) fn set_shrink_floor(&mut self, floor: usize) {
        self.maintenance.set_floor(floor);
        self.window.set_shrink_floor(floor);
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next run: the earliest deadline
    /// of an operation held back (with an operation timeout), or maintenance for the batcher
    /// or its window; `None` while there is neither. O(1). It may name the deadline of an
    /// operation that has ended since (a run then changes nothing but the queue of
    /// deadlines), never one later than a held operation's.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.maintenance.deadline(),
            self.window.poll_timeout(),
            self.timers.front().map(|&(at, _)| at),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The next thing to do, or `None` when there is nothing left.
    ///
    /// Once the actions run out, it first [`flush`](Self::flush)es any open batch (at the
    /// latest time seen), so draining the actions, which a caller does anyway to get its
    /// `Send`s, is enough for every accepted operation to go out or be parked where a
    /// returning credit sends it: an open batch cannot be stranded by a forgotten `flush`.
    /// Call `flush` yourself, as before, when your input queue is empty; to batch several
    /// operations for a shard with credit, add them all before draining.
    pub fn poll_action(&mut self) -> Option<BatchAction<Shard, H, P, E>> {
        if self.actions.is_empty() && self.open_count > 0 {
            let now = self.clock.peek(Instant::ZERO);
            self.flush(now);
        }
        self.actions.pop_front()
    }

    /// The batch in flight under `credit`: its handles in position order (its payloads left
    /// in the `Send`).
    pub fn batch(&self, credit: CreditId) -> Option<&Batch<H, P>> {
        match self.sent.get(credit.slot()) {
            Some(Some(f)) if f.credit == credit => Some(&f.batch),
            _ => None,
        }
    }

    /// The dispatch window (credits, queued and parked batches per shard).
    pub fn window(&self) -> &DispatchWindow<Shard, Batch<H, P>, S> {
        &self.window
    }

    /// Shards with an open batch held by the batcher (not counting parked ones, nor shards
    /// whose last batch just left full).
    pub fn open_batches(&self) -> usize {
        self.open_count
    }

    /// Operations in `shard`'s open batch, whether held here or parked in the window.
    pub fn open_ops(&self, shard: &Shard) -> usize {
        let hash = self.window.hash_key(shard);
        match self
            .find_open(hash, shard)
            .and_then(|i| self.open_list.get(i))
        {
            Some(open) => open.batch.as_ref().map_or(0, Batch::len),
            None => self.window.parked(shard).map_or(0, Batch::len),
        }
    }

    /// Internal consistency (the open index ↔ list ↔ pinned window entries), for the model
    /// checker and tests.
    #[cfg(any(test, feature = "model"))]
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        if self.open.len() != self.open_list.len() {
            return Err("the open index and list differ in length");
        }
        for (i, open) in self.open_list.iter().enumerate() {
            if open.hash != self.window.hash_key(&open.key) {
                return Err("an open shard's stored hash is not its key's");
            }
            if self.find_open(open.hash, &open.key) != Some(i) {
                return Err("an open shard's key does not find it");
            }
            if self.window.place_of(&open.key, open.hash) != Some(open.place)
                || !self.window.is_pinned(open.place)
            {
                return Err("an open shard's window entry is gone or unpinned");
            }
        }
        let some = self.open_list.iter().filter(|o| o.batch.is_some()).count();
        if some != self.open_count {
            return Err("open_count is wrong");
        }
        for open in &self.open_list {
            if let Some(b) = &open.batch {
                if self.held.get(b.id) != Some(&Held::Open(open.place)) {
                    return Err("an open batch is not recorded where it is");
                }
                if !b.ordinals.is_empty() && b.ordinals.len() != b.ops.len() {
                    return Err("an open batch's ordinals do not match its operations");
                }
            }
        }
        if self.held.live() < self.open_count {
            return Err("fewer batches recorded as held than open");
        }
        Ok(())
    }

    /// Batches that have not left (open, parked or queued), as `cancel` finds them.
    #[cfg(any(test, feature = "model"))]
    #[doc(hidden)]
    pub fn held_batches(&self) -> usize {
        // Every live credit's batch is recorded as sent.
        self.held.live().saturating_sub(self.window.live_credits())
    }

    /// The index in `open_list` of `shard`, whose hash is `hash` (user `Eq`).
    fn find_open(&self, hash: u64, shard: &Shard) -> Option<usize> {
        let list = &self.open_list;
        self.open
            .find(hash, |&j| {
                list.get(j as usize).is_some_and(|o| o.key == *shard)
            })
            .map(|&j| j as usize)
    }

    /// Whether the failing [`close`](Self::close) ran (called, or once the window ran out of
    /// credit ids). Operations are refused then, and also while
    /// [`is_draining`](Self::is_draining).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Hands a full batch to the shard's (pinned) window entry at `place`.
    fn submit_full(&mut self, place: Place, shard: Shard, batch: Batch<H, P>) {
        let id = batch.id;
        match self.window.submit_at(place, shard, batch) {
            Ok(Submitted::Sent(d)) => self.record(d),
            Ok(Submitted::Queued(ticket)) => self.locate(id, Held::Queued(ticket)),
            Err(e) => {
                self.fail_closed(e.into_batch());
                self.close_if_window_closed();
            }
        }
    }

    /// Records where the not-yet-sent batch `id` is now.
    fn locate(&mut self, id: Key, at: Held) {
        if let Some(h) = self.held.get_mut(id) {
            *h = at;
        }
    }

    /// The batch `d` left: it holds a credit now, and its operations can no longer be
    /// withdrawn.
    fn record(&mut self, mut d: Dispatch<Shard, Batch<H, P>>) {
        self.locate(d.batch.id, Held::Sent(d.credit));
        let payloads = core::mem::take(&mut d.batch.payloads);
        let slot = d.credit.slot();
        if self.sent.len() <= slot {
            self.sent.resize_with(slot.saturating_add(1), || None);
        }
        if let Some(entry) = self.sent.get_mut(slot) {
            *entry = Some(InFlight {
                credit: d.credit,
                batch: d.batch,
            });
            self.push_action(BatchAction::Send {
                shard: d.shard,
                credit: d.credit,
                payloads,
            });
        }
    }

    fn take_sent(&mut self, credit: CreditId) -> Option<InFlight<H, P>> {
        let entry = self.sent.get_mut(credit.slot())?;
        if entry.as_ref().is_some_and(|f| f.credit == credit) {
            entry.take()
        } else {
            None
        }
    }

    fn after_release(&mut self, next: Option<Dispatch<Shard, Batch<H, P>>>) {
        if let Some(d) = next {
            self.record(d);
        }
        self.close_if_window_closed();
    }

    /// Once the window can issue no credit id, nothing held back could ever be sent: fail
    /// it and close (the window itself refuses new batches with `Exhausted`).
    fn close_if_window_closed(&mut self) {
        if (self.window.is_closed() || self.window.is_exhausted()) && !self.closed {
            self.close();
        }
    }

    /// Fails every operation of a batch that never left with [`FailReason::Closed`].
    fn fail_closed(&mut self, batch: Batch<H, P>) {
        let _ = self.held.remove(batch.id);
        self.recycle_deadlines(batch.deadlines);
        let mut ops = batch.ops;
        for handle in ops.drain(..) {
            self.push_action(BatchAction::Fail {
                handle,
                reason: FailReason::Closed,
            });
        }
        self.recycle(ops);
    }

    fn push_action(&mut self, action: BatchAction<Shard, H, P, E>) {
        self.actions.push_back(action);
        self.peak_actions.see(self.actions.len());
    }

    /// Takes back an emptied buffer. Every buffer handed out comes back here exactly once, so
    /// the pool never holds more than the peak number in use (maintenance trims it further).
    fn recycle(&mut self, ops: Vec<H>) {
        self.ops_out = self.ops_out.saturating_sub(1);
        self.spare_ops.push(ops);
    }

    /// Takes back an emptied batch's deadline buffer (one that never allocated is dropped):
    /// at most one per operation buffer handed out, as for `spare_ops`.
    fn recycle_deadlines(&mut self, mut deadlines: Vec<Instant>) {
        if deadlines.capacity() > 0 {
            deadlines.clear();
            self.spare_deadlines.push(deadlines);
        }
    }

    /// Queues the deadline of the operation just accepted (the latest yet, the clock being
    /// clamped), first dropping every stale entry once the queue reaches `timers_limit`.
    fn push_timer(&mut self, at: Instant, op: OpId) {
        if self.timers.len() >= self.timers_limit {
            let mut timers = core::mem::take(&mut self.timers);
            timers.retain(|&(_, op)| self.holds_op(op));
            self.timers = timers;
            self.timers_limit = self.timers.len().saturating_mul(2).max(TIMERS_MIN);
        }
        self.timers.push_back((at, op));
        self.peak_timers.see(self.timers.len());
    }

    /// Whether `op` is still in a batch this batcher holds (open, parked, queued or in
    /// flight): not ended, withdrawn or timed out. O(log operations of its batch).
    fn holds_op(&self, op: OpId) -> bool {
        let batch = match self.held.get(op.batch) {
            None => None,
            Some(&Held::Open(place)) => self
                .open_at(place)
                .and_then(|i| self.open_list.get(i))
                .and_then(|o| o.batch.as_ref()),
            Some(&Held::Parked(place)) => self.window.parked_at(place),
            Some(&Held::Queued(ticket)) => self.window.queued_at(ticket),
            Some(&Held::Sent(credit)) => self.batch(credit),
        };
        batch.is_some_and(|b| {
            b.id == op.batch
                && op.ordinal < b.next_ordinal
                && (b.ordinals.is_empty() || b.ordinals.binary_search(&op.ordinal).is_ok())
        })
    }

    /// Ends every operation not yet sent whose deadline is at or before `now` with
    /// [`FailReason::TimedOut`] (withdrawn as [`cancel`](Self::cancel) would, its payload
    /// dropped), in acceptance order, and drops the stale entries at the front: afterwards the
    /// front entry, if any, is a held operation's, due after `now`. An entry of an operation
    /// in flight is dropped once due: the send's deadline ([`Batch::deadline`]) is the
    /// caller's to enforce, and a [`requeue`](Self::requeue) queues the entries again.
    fn expire(&mut self, now: Instant) {
        while let Some(&(at, op)) = self.timers.front() {
            let at_held = self.held.get(op.batch).copied();
            match at_held {
                Some(_) if at > now => break,
                None | Some(Held::Sent(_)) => {}
                Some(_) => {
                    if let Ok(Withdrawal::Withdrawn((handle, payload))) =
                        self.cancel_with_payload(op)
                    {
                        self.push_action(BatchAction::Fail {
                            handle,
                            reason: FailReason::TimedOut,
                        });
                        // Dropped after everything is consistent: its destructor is user code.
                        self.timers.pop_front();
                        drop(payload);
                        continue;
                    }
                }
            }
            self.timers.pop_front();
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod panicking_key_tests {
    use super::*;
    use crate::test_hasher::TestHasher;
    use crate::test_key::{Call, PanicKey, panics};
    use alloc::format;

    fn nz(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)
    }

    fn nzb(n: u64) -> NonZeroU64 {
        NonZeroU64::new(n).unwrap_or(NonZeroU64::MIN)
    }

    type KeyBatcher = Batcher<PanicKey, u32, TestHasher>;

    const T0: Instant = Instant::ZERO;

    fn writes(max_ops: usize, max_in_flight: u32) -> KeyBatcher {
        let cfg = BatcherConfig::writes()
            .with_max_requests_per_batch(nz(max_ops))
            .with_max_batch_bytes(nzb(100))
            .with_window(WindowConfig::default().with_max_in_flight(max_in_flight as usize))
            .unwrap();
        KeyBatcher::new(cfg)
    }

    /// Drains the actions: the shards sent to, and the operations that ended.
    fn drain(b: &mut KeyBatcher) -> (Vec<(u32, CreditId)>, Vec<u32>) {
        let (mut sent, mut ended) = (Vec::new(), Vec::new());
        while let Some(a) = b.poll_action() {
            match a {
                BatchAction::Send { shard, credit, .. } => sent.push((shard.0, credit)),
                BatchAction::Deliver { handle, .. } | BatchAction::Fail { handle, .. } => {
                    ended.push(handle)
                }
            }
        }
        (sent, ended)
    }

    /// `flush` took each open batch out of the map by key (user `Hash`, `Eq`) and then looked
    /// the shard up in the window: a panic between the two lost the batch and its
    /// operations. Open shards now keep their hash and their pinned window entry, so `flush`
    /// runs no user code.
    #[test]
    fn flush_runs_no_key_callback() {
        for call in [Call::Hash, Call::Eq, Call::Clone] {
            let mut b = writes(10, 1);
            assert!(b.handle_op(T0, PanicKey(1), 1, 1).is_ok());
            assert!(b.handle_op(T0, PanicKey(2), 2, 1).is_ok());
            assert!(!panics(2, call, 0, || b.flush(T0)), "{call:?} ran in flush");
            let (sent, _) = drain(&mut b);
            let mut shards: Vec<u32> = sent.iter().map(|s| s.0).collect();
            shards.sort_unstable();
            assert_eq!(shards, [1, 2], "{call:?}: both batches sent");
            assert_eq!(b.check_invariants(), Ok(()));
        }
    }

    /// `close` removed open batches by key and had the window clone keys: a panic there
    /// left operations that never ended. It now runs no user code.
    #[test]
    fn close_runs_no_key_callback() {
        for call in [Call::Hash, Call::Eq, Call::Clone] {
            let mut b = writes(10, 1);
            assert!(b.handle_op(T0, PanicKey(1), 1, 1).is_ok());
            b.flush(T0); // in flight
            assert!(b.handle_op(T0, PanicKey(1), 2, 1).is_ok());
            b.flush(T0); // parked
            assert!(b.handle_op(T0, PanicKey(2), 3, 100).is_ok()); // full: in flight
            assert!(b.handle_op(T0, PanicKey(2), 4, 100).is_ok()); // full: queued
            let _ = drain(&mut b);
            assert!(b.handle_op(T0, PanicKey(3), 5, 1).is_ok()); // open (not drained)
            for k in 1..=3 {
                assert!(
                    !panics(k, call, 0, || b.close()),
                    "{call:?} of {k} ran in close"
                );
            }
            let (_, mut ended) = drain(&mut b);
            ended.sort_unstable();
            assert_eq!(ended, [2, 4, 5], "{call:?}: every operation not sent fails");
            assert_eq!(b.check_invariants(), Ok(()));
        }
    }

    type Input = fn(&mut KeyBatcher, u32, CreditId);

    const INPUTS: [(&str, Input); 6] = [
        ("small op", |b, k, _| {
            let _ = b.handle_op(Instant::from_millis(5), PanicKey(k), 90, 1);
        }),
        ("overflowing op", |b, k, _| {
            let _ = b.handle_op(Instant::from_millis(5), PanicKey(k), 91, 99);
        }),
        ("filling op", |b, k, _| {
            let _ = b.handle_op(Instant::from_millis(5), PanicKey(k), 92, 100);
        }),
        ("response", |b, _, c| {
            let _ = b.handle_response(Instant::from_millis(5), c, [0]);
        }),
        ("failure", |b, _, c| {
            let _ = b.handle_failure(Instant::from_millis(5), c, ());
        }),
        ("timeout", |b, _, _| b.handle_timeout(Instant::MAX)),
    ];

    /// Whichever key callback panics at whichever call, the input did not happen: the
    /// batcher is exactly as before (its `Debug` form), consistent, and keeps serving:
    /// every operation ends exactly once.
    #[test]
    #[cfg_attr(miri, ignore)] // some 200 cases, each formatting the machine twice: slow under miri
    fn a_panicking_key_callback_leaves_the_batcher_as_it_was_and_serving() {
        let mut base = writes(3, 1);
        let t = Instant::from_millis(1);
        // Shard 2: one batch in flight, one parked. Shard 1: one in flight, two ops open.
        for (k, h) in [(2, 10), (2, 11), (1, 20)] {
            assert!(base.handle_op(t, PanicKey(k), h, 1).is_ok());
            base.flush(t);
        }
        // Drained before the last two, which stay open (draining would flush them).
        let (sent, _) = drain(&mut base);
        for h in [21, 22] {
            assert!(base.handle_op(t, PanicKey(1), h, 1).is_ok());
        }
        assert_eq!(base.open_batches(), 1);
        let credits: Vec<CreditId> = sent.iter().map(|s| s.1).collect();
        let mut fired = 0;
        for (name, input) in INPUTS {
            // Listed (open here), parked in the window, new.
            for (k, &credit) in [1, 2, 3].iter().zip(credits.iter().cycle()) {
                for call in [Call::Hash, Call::Eq, Call::Clone] {
                    for skip in 0..4 {
                        let mut b = base.clone();
                        let before = format!("{b:?}");
                        if panics(*k, call, skip, || input(&mut b, *k, credit)) {
                            fired += 1;
                            let what = format!("{name} on {k}, {call:?} #{skip}");
                            assert_eq!(format!("{b:?}"), before, "{what}: the batcher changed");
                        }
                        assert_eq!(b.check_invariants(), Ok(()), "{name} on {k}");
                        input(&mut b, *k, credit);
                        assert_eq!(b.check_invariants(), Ok(()), "{name} on {k}, unarmed");
                        // Everything still ends: close, then complete what is in flight.
                        let (mut sent, mut ended) = drain(&mut b);
                        b.close();
                        while let Some((_, c)) = sent.pop() {
                            let _ = b.handle_response(t, c, [0, 1, 2]);
                            let (more, done) = drain(&mut b);
                            sent.extend(more);
                            ended.extend(done);
                        }
                        for c in &credits {
                            let _ = b.handle_response(t, *c, [0]);
                        }
                        ended.extend(drain(&mut b).1);
                        // The input ran twice when unarmed, so its handle may end twice.
                        for h in [10, 11, 20, 21, 22] {
                            let n = ended.iter().filter(|&&x| x == h).count();
                            assert_eq!(n, 1, "{name} on {k}: op {h} ended {n} times");
                        }
                        assert_eq!(b.window().live_credits(), 0, "{name} on {k}");
                    }
                }
            }
        }
        assert!(fired > 20, "only {fired} armed calls fired");
    }
}
