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
    CreditId, Dispatch, DispatchWindow, Place, Submitted, Ticket, WindowConfig, WindowEvent,
};
use crate::error::{ConfigError, ReleaseError};
use crate::event::EventQueue;
use crate::maintenance::{Maintenance, Peak};
use crate::slab::{Key, Slab};
use crate::time::{Clock, Instant};

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

/// An observation of the batcher, drained with [`Batcher::poll_event`] once turned on with
/// [`Batcher::set_event_capacity`] (off by default: see [`crate::event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchEvent<Shard> {
    /// A batch left for `shard` under `credit`: one per [`BatchAction::Send`], recorded as
    /// [`Batcher::poll_action`] returns it, in the order of the `Send`s.
    Dispatched {
        /// The shard.
        shard: Shard,
        /// The batch's credit.
        credit: CreditId,
        /// Its operations.
        ops: usize,
        /// Its bytes (the sum of its operations' sizes).
        bytes: u64,
    },
    /// The credit of a batch that ended (a response, a failure) or was requeued was released.
    Released {
        /// The credit released.
        credit: CreditId,
        /// Its shard's batches in flight after the release, counting one sent at once under
        /// the freed credit (then a `Dispatched` follows).
        in_flight: u32,
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
    /// Observations, off until [`Self::set_event_capacity`]. The window's own events are on
    /// exactly when these are, and are turned into these as each input ends.
    events: EventQueue<BatchEvent<Shard>>,
    /// A `Dispatched` is being recorded for the head `Send` (set while its key is copied).
    noting: bool,
    /// The batches a grown limit sent ([`Self::set_max_in_flight`]), kept between calls so
    /// that a limit change allocates nothing after warm-up.
    granted: Vec<Dispatch<Shard, Batch<H, P>>>,
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
        let mut window = DispatchWindow::limited(limit, hasher.clone());
        // The batcher records each dispatch itself (`poll_action`), so its window records only
        // releases: no dispatch copies a key for an event the batcher would drop.
        window.set_dispatch_events(false);
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
            events: EventQueue::new(),
            noting: false,
            granted: Vec::new(),
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

    /// The index in `open_list` of the shard at `place` (no user code).
    fn open_at(&self, place: Place) -> Option<usize> {
        let list = &self.open_list;
        self.open
            .find(place.key_hash(), |&j| {
                list.get(j as usize).is_some_and(|o| o.place == place)
            })
            .map(|&j| j as usize)
    }

    /// The next thing to do, or `None` when there is nothing left.
    ///
    /// Once the actions run out, it first [`flush`](Self::flush)es any open batch (at the
    /// latest time seen), so draining the actions, which a caller does anyway to get its
    /// `Send`s, is enough for every accepted operation to go out or be parked where a
    /// returning credit sends it: an open batch cannot be stranded by a forgotten `flush`.
    /// Call `flush` yourself, as before, when your input queue is empty; to batch several
    /// operations for a shard with credit, add them all before draining.
    ///
    /// With events on ([`Self::set_event_capacity`]) a `Send` is recorded as
    /// [`BatchEvent::Dispatched`] here, with a copy of its shard key: a panicking `Clone` then
    /// reaches the caller with the `Send` still queued, and the next call returns it (without
    /// its event, counted in [`Self::events_dropped`]).
    pub fn poll_action(&mut self) -> Option<BatchAction<Shard, H, P, E>> {
        if self.actions.is_empty() && self.open_count > 0 {
            let now = self.clock.peek(Instant::ZERO);
            self.flush(now);
        }
        if self.events.is_on() {
            self.note_send();
        }
        self.actions.pop_front()
    }

    /// The oldest undrained observation, if events are on ([`Self::set_event_capacity`]).
    pub fn poll_event(&mut self) -> Option<BatchEvent<Shard>> {
        self.events.pop()
    }

    /// Record up to `capacity` undrained events (0, the default, turns them off: no input
    /// builds one, or copies a key for one). See [`crate::event`].
    pub fn set_event_capacity(&mut self, capacity: usize) {
        self.events.set_capacity(capacity);
        self.noting = false;
        // The window's events are drained into these after every input that makes one, so
        // its queue holds at most one input's worth: unbounded there, bounded here.
        self.window
            .set_event_capacity(if capacity == 0 { 0 } else { usize::MAX });
    }

    /// Events lost to a full queue (or discarded by turning events off) so far.
    pub fn events_dropped(&self) -> u64 {
        self.events.dropped()
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
        match self.window.submit_at(place, shard, None, batch) {
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
        self.pump_events();
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
        self.pump_events();
        self.close_if_window_closed();
    }

    /// Turns the window's `Released` events into the batcher's (the window records no
    /// `Dispatched`: the batcher records each dispatch from its `Send`, see `poll_action`).
    /// Runs no user code.
    #[inline]
    fn pump_events(&mut self) {
        if self.events.is_on() {
            self.pump_events_cold();
        }
    }

    #[cold]
    fn pump_events_cold(&mut self) {
        while let Some(e) = self.window.poll_event() {
            if let WindowEvent::Released { credit, in_flight } = e {
                self.events
                    .emit(|| BatchEvent::Released { credit, in_flight });
            }
        }
    }

    /// With events on, records the `Dispatched` of the `Send` at the head of the actions,
    /// before it leaves: the event's copy of the shard key (user `Clone`) is made while the
    /// action is still queued, so a panicking `Clone` loses nothing; that `Send` then goes
    /// out without its event (counted in `events_dropped`).
    #[cold]
    fn note_send(&mut self) {
        let Some(BatchAction::Send { shard, credit, .. }) = self.actions.front() else {
            return;
        };
        let credit = *credit;
        if core::mem::replace(&mut self.noting, true) {
            // The copy for this `Send` panicked on an earlier poll.
            self.noting = false;
            self.events.note_dropped();
            return;
        }
        let shard = shard.clone();
        self.noting = false;
        let (ops, bytes) = self.batch(credit).map_or((0, 0), |b| (b.len(), b.bytes()));
        self.events.emit(|| BatchEvent::Dispatched {
            shard,
            credit,
            ops,
            bytes,
        });
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
}

mod config;
mod ends;
mod held;
mod timers;

pub use config::{BatchKind, BatcherConfig};

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
