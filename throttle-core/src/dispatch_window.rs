//! Per-shard dispatch window: at most `max_in_flight` batches outstanding per shard, with
//! exactly-once credit release.
//!
//! A batch going out consumes one credit of its shard's window and carries a [`CreditId`].
//! Completing that credit ([`DispatchWindow::complete`]) frees the slot and returns the next
//! batch to send, if one was held back. The window never sends anything itself: every dispatch
//! is a value ([`Dispatch`]) the caller acts on after the call returns, so nothing re-enters the
//! machine while it is being updated.
//!
//! Held-back batches are of two kinds. *Queued* batches are full: they wait in FIFO order.
//! The *parked* batch is the shard's still-open batch: the caller parks it when the shard has
//! no credit and may [`reclaim`](DispatchWindow::reclaim) it to keep adding operations. A
//! release dispatches the oldest queued batch first, then the parked one, so operations leave
//! in the order they arrived.
//!
//! [`SingleWindow`] is the window of one shard, for a client that keeps one object per shard:
//! both types run the same per-shard rules (a shared core), so they answer alike. Both close
//! two ways: [`close`](DispatchWindow::close) fails held-back work (returns it), and
//! [`drain`](DispatchWindow::drain) keeps sending it as credits come back.
//!
//! See `docs/dispatch-window.md` for the state diagram.

use alloc::vec::Vec;
use core::hash::{BuildHasher, Hash};
use core::num::NonZeroUsize;

use hashbrown::HashTable;

use crate::error::{ConfigError, ReleaseError};
use crate::event::EventQueue;
pub use crate::maintenance::MAINTENANCE_INTERVAL;
use crate::maintenance::Peak;
use crate::slab::Key;
pub use crate::slab::{Exhausted, Ticket};
use crate::snapshot::{Cursor, Page};
use crate::time::Instant;

use limit::limit_of;
pub(crate) use shard::Entered;
use shard::{Books, Mode, ShardWindow};
pub use single::SingleWindow;

/// Configuration of a [`DispatchWindow`] or a [`SingleWindow`].
///
/// The limit is a `usize`, as clients count batches. A config built by
/// [`WindowConfig::new`] or [`Default`] is valid by construction; only
/// [`with_max_in_flight(0)`](Self::with_max_in_flight) makes an invalid one, which
/// [`validate`](Self::validate) (and so every fallible window constructor) refuses.
///
/// ```
/// use core::num::NonZeroUsize;
/// use throttle_sansio::WindowConfig;
///
/// let eight = NonZeroUsize::new(8).expect("not zero");
/// assert_eq!(WindowConfig::new(eight).max_in_flight(), 8);
/// assert_eq!(WindowConfig::default().max_in_flight(), 4);
/// assert!(WindowConfig::default().with_max_in_flight(0).validate().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WindowConfig {
    max_in_flight: usize,
}

impl Default for WindowConfig {
    /// The Oxia Java client's default for `maxReadBatchesInFlight` (PR #362) and
    /// `maxWriteBatchesInFlight` (PR #360): 4.
    fn default() -> Self {
        WindowConfig { max_in_flight: 4 }
    }
}

impl WindowConfig {
    /// At most `max_in_flight` batches outstanding per shard: valid by construction.
    #[must_use]
    pub const fn new(max_in_flight: NonZeroUsize) -> Self {
        WindowConfig {
            max_in_flight: max_in_flight.get(),
        }
    }

    /// At most `n` batches outstanding per shard (must be at least 1: `validate` refuses 0).
    ///
    /// A window counts its credits in `u32`, so a limit above `u32::MAX` is clamped to
    /// `u32::MAX` ([`DispatchWindow::capacity`] reports the clamped value). That changes
    /// nothing a caller can observe: no window can hold `u32::MAX` credits at once (its credit
    /// slots are numbered in `u32`, so it reports [`SubmitError::Exhausted`] first).
    #[must_use]
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Batches allowed outstanding per shard, as set (before the clamp to `u32::MAX`).
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// The window's per-shard capacity: [`Self::max_in_flight`] clamped to `u32::MAX`.
    #[inline]
    fn cap(&self) -> u32 {
        u32::try_from(self.max_in_flight).unwrap_or(u32::MAX)
    }

    /// Refuses a window of zero batches (it could never send anything).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_in_flight == 0 {
            return Err(ConfigError::OutOfRange {
                option: &crate::options::window::MAX_IN_FLIGHT,
                got: 0,
                min: 1,
                max: u64::try_from(usize::MAX).unwrap_or(u64::MAX),
                unit: "batches",
            });
        }
        Ok(())
    }
}

/// One credit of a shard's window, held by exactly one batch in flight.
///
/// Ids are never reused by the window that issued them: each carries a generation drawn from
/// a counter that only grows, and the tag of the window that issued it, so an id from another
/// window is refused as [`ReleaseError::Unknown`] and changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CreditId(Key);

impl CreditId {
    /// The credit's number: strictly increasing in issue order within its window, never
    /// reused (for logs and metrics; the window names a credit by the whole id).
    pub const fn seq(self) -> u64 {
        self.0.generation
    }

    /// The slab slot this credit occupies while it is live (dense, reused after release).
    #[inline]
    pub(crate) fn slot(self) -> usize {
        self.0.slot() as usize
    }

    /// Builds an arbitrary id of the window tagged `tag`: for tests and model checkers that
    /// forge bogus credits.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn forge(tag: u32, slot: u32, generation: u64) -> Self {
        CreditId(Key::new(generation, slot, tag))
    }

    /// The tag of the window that issued it.
    #[cfg(feature = "model")]
    pub(crate) fn tag(self) -> u32 {
        self.0.tag()
    }

    /// Its generation: unique for the issuing window's life.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn generation(self) -> u64 {
        self.0.generation
    }
}

/// A batch to send now, under `credit`. Returned, never sent by the window itself.
///
/// Dropping it without sending leaks its credit until [`DispatchWindow::complete`] is called.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "send the batch, then complete its credit exactly once"]
#[non_exhaustive]
pub struct Dispatch<Shard, B> {
    /// The shard the batch is for.
    pub shard: Shard,
    /// The credit the batch holds; pass it to [`DispatchWindow::complete`] exactly once.
    pub credit: CreditId,
    /// The batch itself.
    pub batch: B,
}

/// An observation of a window, drained with [`DispatchWindow::poll_event`] (or
/// [`SingleWindow::poll_event`], whose shard is `()`) once turned on with
/// `set_event_capacity` (off by default: see [`crate::event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WindowEvent<Shard> {
    /// A batch left for `shard` under `credit` (one event per [`Dispatch`] returned, whatever
    /// call returned it: a submit, a release handing the credit on, a resume).
    Dispatched {
        /// The shard (the window's copy of its key, made before the input changed anything).
        shard: Shard,
        /// The batch's credit.
        credit: CreditId,
    },
    /// `credit` was released (once; a refused release records nothing).
    Released {
        /// The credit released.
        credit: CreditId,
        /// Its shard's credits in flight after the release, counting one handed on at once
        /// to a held-back batch (then a `Dispatched` follows).
        in_flight: u32,
    },
}

/// A copy of `key` for the event of a dispatch, made (only with events on and dispatches
/// recorded: [`DispatchWindow::set_dispatch_events`]) before the input
/// changes anything, so a panicking `Clone` leaves the window as it was.
#[inline]
fn noted<Shard: Clone>(
    events: &EventQueue<WindowEvent<Shard>>,
    dispatches: bool,
    key: &Shard,
) -> Option<Shard> {
    if events.is_on() && dispatches {
        noted_cold(key)
    } else {
        None
    }
}

#[cold]
fn noted_cold<Shard: Clone>(key: &Shard) -> Option<Shard> {
    Some(key.clone())
}

/// Records the dispatch of `credit` to the shard copied by [`noted`] (nothing when off).
#[inline]
fn note_sent<Shard>(
    events: &mut EventQueue<WindowEvent<Shard>>,
    noted: Option<Shard>,
    credit: CreditId,
) {
    if let Some(shard) = noted {
        events.emit(|| WindowEvent::Dispatched { shard, credit });
    }
}

/// One tracked shard in a [`DispatchWindow::snapshot`] page, in plain terms.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardSnapshot<Shard> {
    /// The shard.
    pub shard: Shard,
    /// Batches in flight (credits held; through `WindowHandle`, permits). Above `capacity`
    /// only after a shrink, until releases retire the excess.
    pub in_flight: u32,
    /// The shard's capacity now: its own limit if one was set at run time, else the
    /// window's configured one.
    pub capacity: u32,
    /// Credits free: `capacity` less `in_flight`, floored at 0.
    pub available: u32,
    /// Full batches waiting for credit (through `WindowHandle`, tasks waiting in `acquire`).
    pub queued: usize,
    /// Whether an open batch is parked for credit.
    pub parked: bool,
    /// Whether the shard is paused ([`DispatchWindow::pause`]).
    pub paused: bool,
}

/// A batch the window refused; the batch is handed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError<B> {
    /// The window was closed ([`DispatchWindow::close`]) or is draining
    /// ([`DispatchWindow::drain`]): it takes no new batch.
    #[error("dispatch window is closed")]
    Closed(B),
    /// `submit_or_park` found a batch already parked for the shard; reclaim it first.
    #[error("the shard already has a parked batch")]
    AlreadyParked(B),
    /// The window has issued every credit or ticket id it can ([`Exhausted`]): it takes no
    /// new batch, while credits already issued still complete.
    #[error("dispatch window has issued every id it can")]
    Exhausted(B),
}

impl<B> SubmitError<B> {
    /// The refused batch.
    pub fn into_batch(self) -> B {
        match self {
            SubmitError::Closed(b) | SubmitError::AlreadyParked(b) | SubmitError::Exhausted(b) => b,
        }
    }
}

/// What [`DispatchWindow::enqueue`] did with a full batch.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "send a dispatched batch; keep a ticket to cancel the queued one"]
#[non_exhaustive]
pub enum Submitted<Shard, B> {
    /// The shard had credit: send the batch now.
    Sent(Dispatch<Shard, B>),
    /// Queued behind the shard's older held-back batches. [`DispatchWindow::cancel`] with this
    /// ticket withdraws it in O(1) until a release dispatches it.
    Queued(Ticket),
}

/// One entry of the shard map: the key, the hash that placed it, an id unique for the
/// window's life, and the shard's window. Credits and tickets name their shard by
/// `(hash, id)`, so finding it again runs no user `Hash` or `Eq`.
#[derive(Clone, Debug)]
struct ShardEntry<Shard, B> {
    key: Shard,
    hash: u64,
    id: u64,
    /// Held by a [`Batcher`](crate::Batcher) that remembers this entry's [`Place`] while the
    /// shard has an open batch there: never evicted, even while idle, until unpinned.
    pinned: bool,
    w: ShardWindow<B>,
}

impl<Shard, B> ShardEntry<Shard, B> {
    /// Whether eviction may drop the entry: idle, not pinned, not paused and without a limit
    /// of its own.
    #[inline]
    fn evictable(&self) -> bool {
        self.w.is_idle() && !self.pinned && !self.w.paused && self.w.limit == 0
    }
}

/// Where a live credit's or a held batch's shard is: its entry's hash and id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    hash: u64,
    entry: u64,
}

impl Place {
    /// The window's hash of the entry's key.
    #[inline]
    pub(crate) fn key_hash(self) -> u64 {
        self.hash
    }
}

/// What the admission rule decided ([`DispatchWindow::try_take`], and every submit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Take {
    /// A credit was issued.
    Credit(CreditId),
    /// The shard has no free credit, or holds batches back.
    NoCredit,
    /// The window is closed (by `close` or `drain`).
    Closed,
    /// The window can issue no new id.
    Exhausted,
}

/// Per-shard credit windows with FIFO hold-back of batches that find no credit.
///
/// Generic over the shard key `Shard`, the batch type `B` (opaque to the window) and the
/// hasher `S` (shard keys may come from remote metadata, so pick a keyed hasher).
///
/// # Driving contract
///
/// - Inputs: [`submit`](Self::submit) / [`enqueue`](Self::enqueue) (a full batch; `enqueue`
///   returns the ticket of a queued one), [`submit_or_park`](Self::submit_or_park) (the
///   shard's open batch), [`reclaim`](Self::reclaim), [`cancel`](Self::cancel) (withdraw a
///   queued batch), [`complete`](Self::complete) (once per credit, when the batch's RPC ends
///   for any reason), [`drain`](Self::drain) (close for sending), [`close`](Self::close)
///   (close failing held-back work).
/// - Outputs: each input that may send returns the [`Dispatch`]; send it after the call
///   returns. There is at most one dispatch per call, so there is no `poll_action`.
/// - Queries (`&self`): [`in_flight`](Self::in_flight), [`available`](Self::available),
///   [`queued`](Self::queued), [`is_parked`](Self::is_parked),
///   [`shard_count`](Self::shard_count), [`live_credits`](Self::live_credits),
///   [`is_closed`](Self::is_closed), [`is_draining`](Self::is_draining),
///   [`is_drained`](Self::is_drained).
/// - Maintenance: when [`poll_timeout`](Self::poll_timeout) returns a deadline, call
///   [`handle_timeout(now)`](Self::handle_timeout) once it has passed (calling it earlier or
///   more often is harmless: it runs at most once per [`MAINTENANCE_INTERVAL`]). It is the only
///   place memory is given back. Time plays no other part: credits never expire.
///
/// Each input hashes its key at most once, before it changes anything; credits and tickets
/// remember their shard by that hash and an entry id, so `complete` and `cancel` run no user
/// `Hash` or `Eq` at all, and `complete` clones the key (for the next [`Dispatch`]) before it
/// changes anything. A panicking user `Hash`, `Eq` or `Clone` therefore leaves the window as
/// it was before the call.
///
/// Ids ([`CreditId`], [`Ticket`]) never wrap: once spent, new batches are refused with
/// [`SubmitError::Exhausted`] while issued credits still complete. Each carries this window's
/// instance tag; another window's ids are refused as [`ReleaseError::Unknown`].
///
/// Invariants after every call: per shard `available == capacity_of − in_flight`, floored at
/// 0 (`in_flight` exceeds the shard's capacity only after
/// [`set_max_in_flight`](Self::set_max_in_flight) shrank it, and no credit is issued until
/// releases bring it back under); a shard with
/// available credit holds nothing back. A shard with nothing in flight, queued or parked is
/// idle: it is not counted by [`shard_count`](Self::shard_count), holds no queue buffer, and
/// its empty entry stays in the map so that its next batch costs one lookup, not an insert
/// and a remove. Idle entries are evicted by the next [`handle_timeout`](Self::handle_timeout)
/// run (within one [`MAINTENANCE_INTERVAL`] of a due deadline), and by an insert that would
/// otherwise grow the map while at least half of it is idle, so memory follows the shards
/// active recently (within about twice their peak), not every shard ever seen, even when
/// maintenance is never driven.
///
/// Allocation: after warm-up a workload that repeats allocates nothing. The shard map, the
/// credit and ticket slabs and a pool of line buffers (one per shard that had to queue at the
/// recent peak) keep their capacity between bursts; `handle_timeout` shrinks each of them only
/// once the peak use since its previous run is below a quarter of the capacity, and then to
/// twice that peak, so an idle window returns its memory within two runs.
///
/// ```
/// use throttle_sansio::dispatch_window::{DispatchWindow, Submitted, WindowConfig};
/// # use core::hash::BuildHasherDefault;
/// # #[derive(Default)] struct H(u64);
/// # impl core::hash::Hasher for H {
/// #     fn finish(&self) -> u64 { self.0 }
/// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
/// # }
/// let cfg = WindowConfig::default().with_max_in_flight(1);
/// let mut w: DispatchWindow<u32, &str, BuildHasherDefault<H>> = DispatchWindow::new(cfg).unwrap();
/// let first = w.submit(7, "a").unwrap().expect("credit available: sent at once");
/// assert_eq!(w.submit(7, "b").unwrap(), None); // exhausted: queued
/// let Submitted::Queued(ticket) = w.enqueue(7, "c").unwrap() else { unreachable!() };
/// assert_eq!(w.cancel(ticket), Ok("c")); // withdrawn before it left
/// let next = w.complete(first.credit).unwrap().expect("the release sends the queued batch");
/// assert_eq!(next.batch, "b");
/// assert!(w.complete(first.credit).is_err()); // a second release changes nothing
/// ```
#[derive(Clone, Debug)]
pub struct DispatchWindow<Shard, B, S> {
    cfg: WindowConfig,
    /// Every shard with work, plus idle shards not yet evicted.
    shards: HashTable<ShardEntry<Shard, B>>,
    hasher: S,
    /// Id of the next shard entry (never reused while the window lives: 2^64 inserts).
    next_entry: u64,
    peak_shards: Peak,
    /// Everything else, apart from the map, so that an input can hold one shard's entry and
    /// update the books beside it with a single lookup. The rules of each shard's window live
    /// there (`shard.rs`), shared with [`SingleWindow`].
    books: Books<B, Place>,
    /// Observations, off until [`Self::set_event_capacity`].
    events: EventQueue<WindowEvent<Shard>>,
    /// Whether events on include `Dispatched` (always, except inside a batcher, which
    /// records its own dispatches and takes only the window's releases).
    dispatch_events: bool,
}

/// The entry at `place`, found without running user code.
#[inline]
fn entry_at<Shard, B>(
    shards: &mut HashTable<ShardEntry<Shard, B>>,
    place: Place,
) -> Option<&mut ShardEntry<Shard, B>> {
    shards.find_mut(place.hash, |e| e.id == place.entry)
}

impl<Shard, B, S> DispatchWindow<Shard, B, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// A window with the default hasher of `S`.
    pub fn new(cfg: WindowConfig) -> Result<Self, ConfigError>
    where
        S: Default,
    {
        Self::with_hasher(cfg, S::default())
    }

    /// A window hashing shard keys with `hasher`.
    pub fn with_hasher(cfg: WindowConfig, hasher: S) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Self::valid(cfg, hasher))
    }

    /// A window of at most `max_in_flight` batches per shard, hashing shard keys with
    /// `hasher`. Infallible: the limit cannot be zero (above `u32::MAX` it is clamped, see
    /// [`WindowConfig::with_max_in_flight`]).
    ///
    /// ```
    /// use core::num::NonZeroUsize;
    /// use throttle_sansio::DispatchWindow;
    /// # use core::hash::BuildHasherDefault;
    /// # #[derive(Default)] struct H(u64);
    /// # impl core::hash::Hasher for H {
    /// #     fn finish(&self) -> u64 { self.0 }
    /// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
    /// # }
    /// let two = NonZeroUsize::new(2).expect("not zero");
    /// let w: DispatchWindow<u32, &str, _> = DispatchWindow::limited(two, BuildHasherDefault::<H>::default());
    /// assert_eq!(w.capacity(), 2);
    /// ```
    pub fn limited(max_in_flight: NonZeroUsize, hasher: S) -> Self {
        Self::valid(WindowConfig::new(max_in_flight), hasher)
    }

    /// A window of a config that passed `validate`.
    pub(crate) fn valid(cfg: WindowConfig, hasher: S) -> Self {
        DispatchWindow {
            cfg,
            shards: HashTable::new(),
            hasher,
            next_entry: 0,
            peak_shards: Peak::default(),
            books: Books::new(),
            events: EventQueue::new(),
            dispatch_events: true,
        }
    }

    /// Gives the window the instance tag `tag` (for targets without 32-bit atomics, where
    /// every window otherwise has tag 0). Call it on a fresh window: ids issued before are
    /// no longer recognised.
    #[must_use]
    pub fn with_instance_tag(mut self, tag: u32) -> Self {
        self.books.set_tag(tag);
        self
    }

    /// Sends a full batch at once if the shard has credit, else queues it behind the shard's
    /// older held-back batches (FIFO). `Ok(None)` means queued.
    ///
    /// # Panics
    ///
    /// Only if user code panics: the shard's `Hash`, `Eq` or `Clone`, or the hasher. The
    /// panic reaches the caller and the input did not happen: the window is as it was, and
    /// serves the next call.
    #[inline]
    pub fn submit(
        &mut self,
        shard: Shard,
        batch: B,
    ) -> Result<Option<Dispatch<Shard, B>>, SubmitError<B>> {
        let hash = self.hasher.hash_one(&shard);
        self.enqueue_at(shard, hash, batch, Some, |_| None)
    }

    /// As [`submit`](Self::submit), and a queued batch's [`Ticket`] is returned, so that it
    /// can be withdrawn with [`cancel`](Self::cancel).
    ///
    /// # Panics
    ///
    /// Only if user code panics: the shard's `Hash`, `Eq` or `Clone`, or the hasher. The
    /// panic reaches the caller and the input did not happen: the window is as it was, and
    /// serves the next call.
    #[inline]
    pub fn enqueue(
        &mut self,
        shard: Shard,
        batch: B,
    ) -> Result<Submitted<Shard, B>, SubmitError<B>> {
        let hash = self.hasher.hash_one(&shard);
        self.enqueue_at(shard, hash, batch, Submitted::Sent, Submitted::Queued)
    }

    /// Sends the shard's open batch at once if the shard has credit, else parks it, where it
    /// can be [`reclaim`](Self::reclaim)ed to keep growing. `Ok(None)` means parked.
    ///
    /// A shard has at most one parked batch: a second one is refused with
    /// [`SubmitError::AlreadyParked`].
    ///
    /// # Panics
    ///
    /// Only if user code panics: the shard's `Hash`, `Eq` or `Clone`, or the hasher. The
    /// panic reaches the caller and the input did not happen: the window is as it was, and
    /// serves the next call.
    pub fn submit_or_park(
        &mut self,
        shard: Shard,
        batch: B,
    ) -> Result<Option<Dispatch<Shard, B>>, SubmitError<B>> {
        if self.books.refuses() {
            return Err(SubmitError::Closed(batch));
        }
        let hash = self.hasher.hash_one(&shard);
        let default = self.cfg.cap();
        // The lookup (user `Eq`) is the only user code, and it runs before anything changes.
        let Some(e) = self.shards.find_mut(hash, |e| e.key == shard) else {
            return self.open_shard(shard, hash, batch).map(Some);
        };
        let place = Place { hash, entry: e.id };
        let noted = noted(&self.events, self.dispatch_events, &shard);
        let cap = e.w.cap(default);
        let sent = self.books.park_or_send(&mut e.w, place, cap, batch)?;
        Ok(sent.map(|(credit, batch)| {
            note_sent(&mut self.events, noted, credit);
            Dispatch {
                shard,
                credit,
                batch,
            }
        }))
    }

    /// A full batch for `shard`, whose hash by this window's hasher is `hash`; the outcome is
    /// built by `sent` or `queued` in place (so `submit` does not repack `enqueue`'s answer).
    #[inline(always)]
    fn enqueue_at<R>(
        &mut self,
        shard: Shard,
        hash: u64,
        batch: B,
        sent: impl FnOnce(Dispatch<Shard, B>) -> R,
        queued: impl FnOnce(Ticket) -> R,
    ) -> Result<R, SubmitError<B>> {
        if self.books.refuses() {
            return Err(SubmitError::Closed(batch));
        }
        let default = self.cfg.cap();
        // The lookup (user `Eq`) is the only user code, and it runs before anything changes.
        let Some(e) = self.shards.find_mut(hash, |e| e.key == shard) else {
            return self.open_shard(shard, hash, batch).map(sent);
        };
        let place = Place { hash, entry: e.id };
        let noted = noted(&self.events, self.dispatch_events, &shard);
        let cap = e.w.cap(default);
        match self.books.enter(&mut e.w, place, batch, cap)? {
            Entered::Credit(credit, batch) => {
                note_sent(&mut self.events, noted, credit);
                Ok(sent(Dispatch {
                    shard,
                    credit,
                    batch,
                }))
            }
            Entered::Queued(ticket) => Ok(queued(ticket)),
        }
    }

    /// First use of `shard` (not in the map): its window starts with the credit returned
    /// (`cap >= 1`, so it has one). `hash` must be this window's own hash of `shard`: it places
    /// the entry.
    fn open_shard(
        &mut self,
        shard: Shard,
        hash: u64,
        batch: B,
    ) -> Result<Dispatch<Shard, B>, SubmitError<B>> {
        // Cloning the key is user code: it runs before anything changes.
        let key = shard.clone();
        let noted = noted(&self.events, self.dispatch_events, &shard);
        match self.open_entry(key, hash) {
            Ok(credit) => {
                note_sent(&mut self.events, noted, credit);
                Ok(Dispatch {
                    shard,
                    credit,
                    batch,
                })
            }
            Err(Exhausted) => Err(SubmitError::Exhausted(batch)),
        }
    }

    /// Adds the entry of a new shard `key` (the map's own copy of the key), holding the one
    /// credit returned. Nothing changes on `Exhausted`.
    fn open_entry(&mut self, key: Shard, hash: u64) -> Result<CreditId, Exhausted> {
        let place = Place {
            hash,
            entry: self.next_entry,
        };
        let credit = CreditId(self.books.credits.insert(place).map_err(|(e, _)| e)?);
        self.next_entry = self.next_entry.wrapping_add(1);
        self.make_room();
        self.shards.insert_unique(
            hash,
            ShardEntry {
                key,
                hash,
                id: place.entry,
                pinned: false,
                w: ShardWindow::with_in_flight(1),
            },
            |e| e.hash,
        );
        self.books.active = self.books.active.saturating_add(1);
        self.peak_shards.see(self.shards.len());
        self.books.maintenance.touch();
        Ok(credit)
    }

    /// Takes the shard's parked batch back (to add operations to it), if there is one.
    ///
    /// # Panics
    ///
    /// Only if user code panics: the shard's `Hash`, `Eq` or `Clone`, or the hasher. The
    /// panic reaches the caller and the input did not happen: the window is as it was, and
    /// serves the next call.
    pub fn reclaim(&mut self, shard: &Shard) -> Option<B> {
        let hash = self.hasher.hash_one(shard);
        let place = self.place_of(shard, hash)?;
        self.reclaim_at(place)
    }

    // ------------------------------------------------------------ entry points by place
    //
    // For the `Batcher`, which looks a shard up once (user `Hash` and `Eq`) before it
    // changes anything, pins the entry, and then reaches it by place alone: none of these
    // runs user code.

    /// This window's hash of `shard` (user `Hash`).
    #[inline]
    pub(crate) fn hash_key(&self, shard: &Shard) -> u64 {
        self.hasher.hash_one(shard)
    }

    /// Where `shard`'s entry is, given [`Self::hash_key`] of it (user `Eq`; changes nothing).
    #[inline]
    pub(crate) fn place_of(&self, shard: &Shard, hash: u64) -> Option<Place> {
        self.shards.find(hash, |e| e.key == *shard).map(|e| Place {
            hash: e.hash,
            entry: e.id,
        })
    }

    /// Pins the entry at `place`: it is not evicted until [`Self::unpin`].
    pub(crate) fn pin(&mut self, place: Place) {
        if let Some(e) = entry_at(&mut self.shards, place) {
            e.pinned = true;
        }
    }

    /// Lets the entry at `place` be evicted again once idle.
    pub(crate) fn unpin(&mut self, place: Place) {
        if let Some(e) = entry_at(&mut self.shards, place) {
            e.pinned = false;
        }
    }

    /// Adds a pinned, idle entry for a shard the map does not hold; `key` is the map's copy
    /// and `hash` is [`Self::hash_key`] of it. Returns its place.
    pub(crate) fn open_pinned(&mut self, key: Shard, hash: u64) -> Place {
        let place = Place {
            hash,
            entry: self.next_entry,
        };
        self.next_entry = self.next_entry.wrapping_add(1);
        self.make_room();
        self.shards.insert_unique(
            hash,
            ShardEntry {
                key,
                hash,
                id: place.entry,
                pinned: true,
                w: ShardWindow::with_in_flight(0),
            },
            |e| e.hash,
        );
        self.peak_shards.see(self.shards.len());
        self.books.maintenance.touch();
        place
    }

    /// The batch parked at `place`'s shard, if any.
    pub(crate) fn parked_at(&self, place: Place) -> Option<&B> {
        self.shards
            .find(place.hash, |e| e.id == place.entry)?
            .w
            .parked
            .as_ref()
    }

    /// [`Self::reclaim`] of the shard at `place`.
    pub(crate) fn reclaim_at(&mut self, place: Place) -> Option<B> {
        let e = entry_at(&mut self.shards, place)?;
        self.books.reclaim(&mut e.w)
    }

    /// [`Self::enqueue`] of a full batch to the shard at `place` (`shard` is the key returned
    /// in the dispatch; `noted`, the event's copy, from [`Self::note_key`]). Runs no user code.
    pub(crate) fn submit_at(
        &mut self,
        place: Place,
        shard: Shard,
        noted: Option<Shard>,
        batch: B,
    ) -> Result<Submitted<Shard, B>, SubmitError<B>> {
        let default = self.cfg.cap();
        let Some(e) = entry_at(&mut self.shards, place) else {
            // Unreachable: the caller pinned the entry.
            debug_assert!(false, "a pinned shard has no entry");
            return Err(SubmitError::Closed(batch));
        };
        let cap = e.w.cap(default);
        match self.books.enter(&mut e.w, place, batch, cap)? {
            Entered::Credit(credit, batch) => {
                note_sent(&mut self.events, noted, credit);
                Ok(Submitted::Sent(Dispatch {
                    shard,
                    credit,
                    batch,
                }))
            }
            Entered::Queued(ticket) => Ok(Submitted::Queued(ticket)),
        }
    }

    /// The batch parked at `place`'s shard, mutably (the batcher withdraws operations from it).
    pub(crate) fn parked_at_mut(&mut self, place: Place) -> Option<&mut B> {
        entry_at(&mut self.shards, place)?.w.parked.as_mut()
    }

    /// The queued batch of `ticket`, while it waits. Runs no user code.
    pub(crate) fn queued_at(&self, ticket: Ticket) -> Option<&B> {
        self.books.held.get(ticket.0).map(|h| &h.batch)
    }

    /// The queued batch of `ticket`, mutably, while it waits (the batcher withdraws operations
    /// from it). Runs no user code.
    pub(crate) fn queued_mut(&mut self, ticket: Ticket) -> Option<&mut B> {
        self.books.held.get_mut(ticket.0).map(|h| &mut h.batch)
    }

    /// [`Self::submit_or_park`] to the shard at `place` (`shard` is the key returned in the
    /// dispatch; `noted`, the event's copy, from [`Self::note_key`]). Runs no user code.
    pub(crate) fn submit_or_park_at(
        &mut self,
        place: Place,
        shard: Shard,
        noted: Option<Shard>,
        batch: B,
    ) -> Result<Option<Dispatch<Shard, B>>, SubmitError<B>> {
        let default = self.cfg.cap();
        let Some(e) = entry_at(&mut self.shards, place) else {
            // Unreachable: the caller pinned the entry.
            debug_assert!(false, "a pinned shard has no entry");
            return Err(SubmitError::Closed(batch));
        };
        let cap = e.w.cap(default);
        let sent = self.books.park_or_send(&mut e.w, place, cap, batch)?;
        Ok(sent.map(|(credit, batch)| {
            note_sent(&mut self.events, noted, credit);
            Dispatch {
                shard,
                credit,
                batch,
            }
        }))
    }

    /// Whether the entry at `place` is in the map and pinned.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn is_pinned(&self, place: Place) -> bool {
        self.shards
            .find(place.hash, |e| e.id == place.entry)
            .is_some_and(|e| e.pinned)
    }

    /// Withdraws a queued batch before it was dispatched and hands it back, in O(1): it leaves
    /// its shard's line and the batches behind it move up. A ticket whose batch was already
    /// dispatched, withdrawn or handed out by [`close`](Self::close) is refused with
    /// [`ReleaseError::AlreadyReleased`], one this window never issued (another window's)
    /// with [`ReleaseError::Unknown`]; either way nothing changes. Runs no user code.
    pub fn cancel(&mut self, ticket: Ticket) -> Result<B, ReleaseError> {
        let held = self.books.withdraw(ticket)?;
        let Some(e) = entry_at(&mut self.shards, held.place) else {
            debug_assert!(false, "a held batch's shard has no entry");
            return Ok(held.batch);
        };
        self.books.withdrawn(&mut e.w);
        Ok(held.batch)
    }

    /// Releases `credit` exactly once and returns the shard's next batch to send: the oldest
    /// queued one, else the parked one, else nothing.
    ///
    /// Call it once per dispatched batch when its RPC ends, whatever the outcome.
    /// An unknown or already-released credit is an `Err` and changes nothing; a forged id or
    /// another window's id is never mistaken for a live one. After
    /// [`close`](Self::close) a live credit is still released (`Ok(None)`): its slot
    /// frees and nothing is sent. Once the window can issue no new credit id, the next batch
    /// stays held back (collect it with `close`).
    ///
    /// # Panics
    ///
    /// Only if user code panics: the shard's `Hash`, `Eq` or `Clone`, or the hasher. The
    /// panic reaches the caller and the input did not happen: the window is as it was, and
    /// serves the next call.
    #[inline]
    pub fn complete(
        &mut self,
        credit: CreditId,
    ) -> Result<Option<Dispatch<Shard, B>>, ReleaseError> {
        let place = *self
            .books
            .credits
            .get(credit.0)
            .ok_or_else(|| self.books.credits.refusal(credit.0))?;
        let Some(e) = entry_at(&mut self.shards, place) else {
            // Unreachable: a live credit's shard always has an entry.
            debug_assert!(false, "a live credit's shard has no window");
            return Ok(None);
        };
        let cap = e.w.cap(self.cfg.cap());
        // The key is cloned for the next dispatch before anything changes (user code).
        let shard = self.books.hands_on(&e.w, cap).then(|| e.key.clone());
        let noted = shard
            .as_ref()
            .and_then(|k| noted(&self.events, self.dispatch_events, k));
        let _ = self.books.credits.remove(credit.0);
        let next = self.books.hand_on(&mut e.w, place, cap);
        let in_flight = e.w.in_flight;
        self.events
            .emit(|| WindowEvent::Released { credit, in_flight });
        Ok(match (next, shard) {
            (Some((credit, batch)), Some(shard)) => {
                note_sent(&mut self.events, noted, credit);
                Some(Dispatch {
                    shard,
                    credit,
                    batch,
                })
            }
            // A batch is handed on only when one was held back, and then the key was cloned.
            _ => None,
        })
    }

    /// Releases `credit` exactly once and hands a fresh credit to the shard's oldest held-back
    /// batch (queued first, then parked), returned with it. Runs no user code: the `sync`
    /// handle, whose held-back "batches" are its waiters, uses it directly.
    #[cfg(feature = "std")]
    #[inline]
    pub(crate) fn release(
        &mut self,
        credit: CreditId,
    ) -> Result<Option<(CreditId, B)>, ReleaseError> {
        let place = self.books.credits.remove(credit.0)?;
        let Some(e) = entry_at(&mut self.shards, place) else {
            // Unreachable: a live credit's shard always has an entry.
            debug_assert!(false, "a live credit's shard has no window");
            return Ok(None);
        };
        let cap = e.w.cap(self.cfg.cap());
        let next = self.books.hand_on(&mut e.w, place, cap);
        let in_flight = e.w.in_flight;
        self.events
            .emit(|| WindowEvent::Released { credit, in_flight });
        Ok(next)
    }

    /// For the `sync` handles' lock guard: whether an event is waiting (one length check).
    #[cfg(feature = "std")]
    #[inline]
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// For the `sync` handle, whose credits leave through [`Self::release`]'s hand-on and the
    /// hinted entry points rather than as batches: whether events are on.
    #[cfg(feature = "std")]
    #[inline]
    pub(crate) fn events_on(&self) -> bool {
        self.events.is_on()
    }

    /// For the `sync` handle: records the [`WindowEvent::Dispatched`] of the live `credit`
    /// just issued (to a newcomer or, by a release, to a waiter). Clones the shard's key, the
    /// only user code here, and changes nothing else: the handle calls it after the credit is
    /// out, under `catch_unwind`, and counts the event lost
    /// ([`Self::note_event_lost`]) if the clone panics.
    #[cfg(feature = "std")]
    pub(crate) fn note_dispatched(&mut self, credit: CreditId) {
        let Some(place) = self.books.credits.get(credit.0) else {
            return;
        };
        let Some(e) = self.shards.find(place.hash, |e| e.id == place.entry) else {
            return;
        };
        let shard = e.key.clone();
        self.events
            .emit(|| WindowEvent::Dispatched { shard, credit });
    }

    /// For the `sync` handle: an event its user code kept from being recorded.
    #[cfg(feature = "std")]
    pub(crate) fn note_event_lost(&mut self) {
        self.events.note_dropped();
    }

    /// Before inserting a new shard: if the map is full (the insert would grow it) and at
    /// least half of its entries are idle, evicts the idle ones instead of growing. Each scan
    /// frees at least half the entries, so it runs at most once per that many inserts
    /// (amortized O(1), like the rehash it replaces), and the map stays within about twice the
    /// shards active at once even if maintenance never runs (the `sync` handle never runs it).
    /// Entries pinned by a batcher (idle, with an open batch there), paused ones and ones with
    /// a limit of their own are kept: a scan that frees less than that lets the map grow, so
    /// the next scan waits for it to fill again, and the bound counts those shards as
    /// active.
    fn make_room(&mut self) {
        // `capacity()` is `len` plus the inserts left before the table must rehash or grow.
        let len = self.shards.len();
        if len < self.shards.capacity() {
            return;
        }
        if len.saturating_sub(self.books.active).saturating_mul(2) >= len {
            self.shards.retain(|e| !e.evictable());
        }
    }

    /// Maintenance: gives memory back, once at most per [`MAINTENANCE_INTERVAL`].
    ///
    /// Each collection (the shard map, the line-buffer pool, each spare buffer, the credit and
    /// ticket slabs) shrinks only if the peak use seen since the previous run is below a
    /// quarter of its capacity, and then to twice that peak, so a workload that repeats within
    /// the interval keeps what it uses and allocates nothing. Spare line buffers beyond the
    /// peak number of shards that queued at once are freed.
    pub fn handle_timeout(&mut self, now: Instant) {
        if !self.books.begin_maintenance(now) {
            return;
        }
        // Idle shards' entries go first (they hold no queue buffer); the peak still counts
        // them, so a shard set that comes back within the interval finds the capacity.
        if self.shards.len() > self.books.active {
            self.shards.retain(|e| !e.evictable());
        }
        let peak = self.peak_shards.roll(self.shards.len());
        if let Some(target) = self.books.maintenance.target(self.shards.capacity(), peak) {
            self.shards.shrink_to(target, |e| e.hash);
        }
        self.books.shrink();
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next run, or `None` while it has
    /// nothing to give back (no input since a run that followed a quiet period).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.books.maintenance.deadline()
    }

    /// The oldest undrained observation, if events are on ([`Self::set_event_capacity`]).
    pub fn poll_event(&mut self) -> Option<WindowEvent<Shard>> {
        self.events.pop()
    }

    /// Record up to `capacity` undrained events (0, the default, turns them off: no input
    /// builds one, or copies a key for one). See [`crate::event`].
    pub fn set_event_capacity(&mut self, capacity: usize) {
        self.events.set_capacity(capacity);
    }

    /// Events lost to a full queue (or discarded by turning events off) so far.
    pub fn events_dropped(&self) -> u64 {
        self.events.dropped()
    }

    /// With `false`, events on record only `Released`: no dispatch copies a key for an
    /// event. For the [`Batcher`](crate::batcher::Batcher), which records each dispatch
    /// itself (with its operations and bytes) and would drop the window's.
    pub(crate) fn set_dispatch_events(&mut self, on: bool) {
        self.dispatch_events = on;
    }

    /// A copy of `key` for a dispatch event, if events are on (user `Clone`: call it before
    /// anything changes, then pass it to the input that may dispatch).
    #[cfg(feature = "model")]
    pub(crate) fn note_key(&self, key: &Shard) -> Option<Shard> {
        noted(&self.events, self.dispatch_events, key)
    }

    /// `shard`'s window, if it has an entry.
    fn window(&self, shard: &Shard) -> Option<&ShardWindow<B>> {
        let hash = self.hasher.hash_one(shard);
        self.shards.find(hash, |e| e.key == *shard).map(|e| &e.w)
    }

    /// Batches allowed outstanding per shard, as configured: the capacity of every shard
    /// without a limit of its own ([`set_max_in_flight`](Self::set_max_in_flight)).
    pub fn capacity(&self) -> u32 {
        self.cfg.cap()
    }

    /// `shard`'s capacity now: its own limit if [`set_max_in_flight`](Self::set_max_in_flight)
    /// gave it one, else [`capacity`](Self::capacity).
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash` or `Eq`, or the hasher, panics; the window is unchanged.
    pub fn capacity_of(&self, shard: &Shard) -> u32 {
        let default = self.cfg.cap();
        self.window(shard).map_or(default, |w| w.cap(default))
    }

    /// Batches of `shard` in flight (holding a credit).
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash` or `Eq`, or the hasher, panics; the window is unchanged.
    pub fn in_flight(&self, shard: &Shard) -> u32 {
        self.window(shard).map_or(0, |w| w.in_flight)
    }

    /// Credits of `shard` not in use: `capacity_of(shard) - in_flight(shard)`, floored at 0
    /// (after a shrink below the credits in flight, 0 until releases bring them under it).
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash` or `Eq`, or the hasher, panics; the window is unchanged.
    pub fn available(&self, shard: &Shard) -> u32 {
        let default = self.cfg.cap();
        self.window(shard)
            .map_or(default, |w| w.cap(default).saturating_sub(w.in_flight))
    }

    /// Full batches of `shard` waiting for credit (cancelled ones not counted).
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash` or `Eq`, or the hasher, panics; the window is unchanged.
    pub fn queued(&self, shard: &Shard) -> usize {
        self.window(shard).map_or(0, |w| w.queued)
    }

    /// Whether `ticket`'s batch is still queued (not dispatched, withdrawn or failed).
    pub fn is_queued(&self, ticket: Ticket) -> bool {
        self.books.held.get(ticket.0).is_some()
    }

    /// Whether `shard` has a parked open batch.
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash` or `Eq`, or the hasher, panics; the window is unchanged.
    pub fn is_parked(&self, shard: &Shard) -> bool {
        self.parked(shard).is_some()
    }

    /// `shard`'s parked open batch, if any.
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash` or `Eq`, or the hasher, panics; the window is unchanged.
    pub fn parked(&self, shard: &Shard) -> Option<&B> {
        self.window(shard).and_then(|w| w.parked.as_ref())
    }

    /// Shards with anything in flight, queued or parked.
    ///
    /// Idle shards are not counted, although their (empty) entries stay in the map until the
    /// next [`handle_timeout`](Self::handle_timeout) run, or until the map would otherwise
    /// grow, evicts them.
    pub fn shard_count(&self) -> usize {
        self.books.active
    }

    /// One page of at most `max` tracked shards (an idle shard stays tracked until it is
    /// evicted), each with its credits in flight and free, its queued batches and whether it
    /// has a parked batch or is paused. Start with `from = None`, then pass each page's `next`
    /// until it is `None`. The walk goes by each entry's stored hash, so a table that rehashes
    /// between pages lists every shard tracked throughout **exactly once** (see
    /// [`crate::snapshot`]). O(tracked shards · log `max`) per page; allocates the page.
    ///
    /// ```
    /// use throttle_sansio::dispatch_window::{DispatchWindow, WindowConfig};
    /// # #[derive(Default, Clone)] struct H; impl core::hash::BuildHasher for H {
    /// #   type Hasher = F; fn build_hasher(&self) -> F { F(0) } }
    /// # struct F(u64); impl core::hash::Hasher for F { fn finish(&self) -> u64 { self.0 }
    /// #   fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.rotate_left(5) ^ u64::from(*x) } } }
    ///
    /// let mut w: DispatchWindow<u32, &str, H> =
    ///     DispatchWindow::new(WindowConfig::default().with_max_in_flight(1))?;
    /// for shard in 0..5 {
    ///     let _ = w.submit(shard, "first");
    /// }
    /// let _ = w.submit(3, "waits");
    /// let (mut seen, mut from) = (Vec::new(), None);
    /// loop {
    ///     let page = w.snapshot(from, 2);
    ///     seen.extend(page.items.iter().map(|s| (s.shard, s.in_flight, s.queued)));
    ///     match page.next {
    ///         Some(next) => from = Some(next),
    ///         None => break,
    ///     }
    /// }
    /// seen.sort();
    /// assert_eq!(seen, [(0, 1, 0), (1, 1, 0), (2, 1, 0), (3, 1, 1), (4, 1, 0)]);
    /// # Ok::<(), throttle_sansio::ConfigError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// Only if a shard's `Clone` panics (each listed key is cloned); the window is unchanged.
    pub fn snapshot(&self, from: Option<Cursor>, max: usize) -> Page<ShardSnapshot<Shard>> {
        let max = max.max(1);
        let after = from.map(Cursor::order);
        // The `max` smallest (hash, id) after the cursor: a max-heap drops the largest past
        // `max`, and a drop means the walk has more.
        let mut best = alloc::collections::BinaryHeap::with_capacity(max.min(self.shards.len()));
        let mut more = false;
        for e in &self.shards {
            let place = (e.hash, e.id);
            if after.is_some_and(|a| place <= a) {
                continue;
            }
            best.push(place);
            if best.len() > max {
                best.pop();
                more = true;
            }
        }
        let places = best.into_sorted_vec();
        let next = places
            .last()
            .filter(|_| more)
            .map(|&(hash, id)| Cursor::after(hash, id));
        let default = self.cfg.cap();
        let items = places
            .iter()
            .filter_map(|&(hash, id)| self.shards.find(hash, |e| e.id == id))
            .map(|e| ShardSnapshot {
                shard: e.key.clone(),
                in_flight: e.w.in_flight,
                capacity: e.w.cap(default),
                available: e.w.cap(default).saturating_sub(e.w.in_flight),
                queued: e.w.queued,
                parked: e.w.parked.is_some(),
                paused: e.w.paused,
            })
            .collect();
        Page { items, next }
    }

    /// Entries in the shard map: the active shards plus idle ones not yet evicted.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn tracked_shards(&self) -> usize {
        self.shards.len()
    }

    /// Credits live across all shards.
    pub fn live_credits(&self) -> usize {
        self.books.credits.live()
    }

    /// Whether submits are refused after [`close`](Self::close).
    ///
    /// True after [`close`](Self::close) and after [`drain`](Self::drain).
    pub fn is_closed(&self) -> bool {
        self.books.refuses()
    }

    /// Whether [`drain`](Self::drain) was called and [`close`](Self::close) was not since:
    /// new batches are refused, held-back ones still leave as credits come back.
    pub fn is_draining(&self) -> bool {
        self.books.mode == Mode::Draining
    }

    /// Whether the window was closed or drained and nothing is left: no batch queued,
    /// parked or in flight on any shard. A draining window gets there once every credit was
    /// completed (unless it ran out of ids with batches still held: collect them with
    /// [`close`](Self::close)).
    pub fn is_drained(&self) -> bool {
        self.books.refuses() && self.books.active == 0
    }

    /// Whether the window can issue no new credit or ticket id (see [`Exhausted`]).
    pub fn is_exhausted(&self) -> bool {
        !self.books.credits.can_issue()
    }

    /// Slots of the credit slab: every live credit's `slot()` is below this.
    pub(crate) fn credit_slots(&self) -> usize {
        self.books.credits.slots()
    }

    /// The window's instance tag (carried by every id it issues).
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn instance_tag(&self) -> u32 {
        self.books.credits.tag()
    }

    /// Sets the capacity collections keep when they shrink, so model checks reach shrinking.
    #[cfg(feature = "model")]
    pub(crate) fn set_shrink_floor(&mut self, floor: usize) {
        self.books.maintenance.set_floor(floor);
    }

    /// Moves the credit-id counter forward, to test the end of the id space.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn skip_generations_to(&mut self, next_generation: u64) {
        self.books.credits.skip_generations_to(next_generation);
    }
}

mod held;
#[cfg(feature = "std")]
mod hinted;
mod limit;
mod shard;
mod single;
#[cfg(test)]
mod tests;
