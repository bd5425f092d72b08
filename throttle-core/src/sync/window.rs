//! Async credit of a shared [`DispatchWindow`]: [`WindowHandle`], its [`Acquire`] future and
//! [`Permit`], the only way to hold a credit.
//!
//! The handle keeps its shards on [`STRIPES`] independently locked stripes: a shard's key
//! hashes onto one stripe, and each stripe is a window of its own with its waiters' wakers
//! behind its own mutex, so tasks on shards of different stripes never wait for each other's
//! lock. Within a stripe, the window owns the per-shard FIFO line of waiters (each waiter is a held-back "batch" naming its waker slot),
//! no barging, O(1) cancel and the hand-off of a freed credit to the oldest waiter, so those
//! rules are the core machine's, checked by its model and fuzz target; this file adds only the
//! lock and the wakers.
//!
//! Exactly-once credit, by construction:
//!
//! - a credit is issued under the lock, to exactly one owner: a [`Permit`] returned at once, or
//!   a waiter's slot (`Granted`), which its [`Acquire`] turns into a `Permit` on its next poll;
//! - a `Permit` releases in `complete(self)` or `Drop`, whichever runs first (a flag guards the
//!   second), and the window itself refuses a second release of the same id;
//! - a release hands a fresh credit straight to the shard's oldest waiter under the same lock,
//!   so free credit and waiting waiters never coexist and nothing can barge in between;
//! - an `Acquire` dropped after a credit was handed to it releases that credit (which passes it
//!   on to the next waiter); [`close`](WindowHandle::close) releases the credits of waiters that
//!   have not yet observed them and fails every waiter.
//!
//! Wakers are taken out under the lock and woken after it is dropped.
//!
//! Every rule above holds per stripe, since a shard's credits, line and waiters all live in its
//! one stripe; a [`Permit`] remembers its stripe ([`Permit::stripe`]) beside its credit id.
//! Only [`close`](WindowHandle::close) and the event-sink switch take more than one stripe
//! lock, always all of them in stripe order (and the event slot's lock inside them), so no two
//! of them can deadlock.
//!
//! A stripe's window is made on the stripe's first use, under its lock. The two handle-wide
//! settings (closed, and the event capacity of the sink) are kept in every stripe's slot and
//! changed on all of them under all the locks, so a window made later starts as the made ones
//! are: closed after a close, with events on while a sink is set.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;
use core::future::Future;
use core::hash::{BuildHasher, Hash};
use core::num::NonZeroUsize;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;

use smallvec::SmallVec;

use super::events::{EventSink, EventTap, Observed, ObservedGuard, drain, lock_observed};
use super::loom::{Arc, Mutex, OnceSlot, lock};
use super::signal::{WakeSignal, wait_for};
use super::waiters::{WaiterKey, Waiters, wake_all};
use super::{Closed, Runtime};
use crate::dispatch_window::{
    CreditId, DispatchWindow, Entered, ShardSnapshot, SubmitError, Take, Ticket, WindowConfig,
    WindowEvent,
};
use crate::error::ConfigError;
use crate::snapshot::{Cursor, Page};
use crate::time::Instant;

/// Wakers collected under the lock, woken after it is dropped.
type Wakeups = SmallVec<[Waker; 2]>;

/// Independently locked stripes of a [`WindowHandle`]: 1024 (under loom, 2, so the models
/// reach both cross-stripe and same-stripe interleavings in their budget).
///
/// Why so many: a stripe two threads both use moves its lock and its window's lines between
/// their cores on every operation, even when the two never wait for each other. With two
/// threads on 64 shards each, 64 stripes leave about 63 % of a thread's shards on a stripe the
/// other also uses, 1024 about 6 %; the two-thread benchmark (`BENCHMARKS.md`) measures the
/// difference. A stripe nobody has used costs only its lock slot (32 bytes): its window is
/// made on the stripe's first use, so an empty handle stays small.
#[cfg(not(loom))]
pub const STRIPES: usize = 1024;
/// Independently locked stripes of a [`WindowHandle`] (2 under loom).
#[cfg(loom)]
pub const STRIPES: usize = 2;

/// The stripe of a shard whose key hashes to `hash`: bits 32 and up, which the stripe's own
/// table (placing entries by the low bits and filtering by the top seven) barely reads, so
/// striping costs the tables no spread.
#[inline]
pub(crate) fn stripe_of(hash: u64) -> usize {
    ((hash >> 32) as usize) & (STRIPES - 1)
}

/// What releasing a [`Permit`] did with its credit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "tells whether a waiter received the credit; ignore with `let _ =`"]
#[non_exhaustive]
pub enum Released {
    /// The shard's oldest waiter received a fresh credit in its place.
    HandedOn,
    /// Nobody was waiting (or the handle is closed): the slot is free.
    Freed,
}

/// Why [`WindowHandle::try_acquire`] gave no permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum TryAcquireError {
    /// The shard has no free credit, or waiters are ahead in its line.
    #[error("no credit available for the shard")]
    NoCredit,
    /// The handle was closed.
    #[error("the window is closed")]
    Closed,
}

/// The typed timeout of this layer: a wait or an operation reached its deadline first.
///
/// What [`AcquireError::TimedOut`] carries (a window wait), and what a
/// [`BatchDriver`](super::BatchDriver)'s operation fails with when its configured operation
/// timeout passes ([`OpError::TimedOut`](super::OpError::TimedOut)).
///
/// ```
/// use throttle_sansio::sync::TimedOut;
///
/// assert_eq!(TimedOut.to_string(), "the deadline passed before the operation completed");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("the deadline passed before the operation completed")]
pub struct TimedOut;

/// Why a timed wait for a window credit ([`WindowHandle::acquire_timeout`],
/// [`Acquire::deadline`]) gave no permit.
///
/// ```
/// use throttle_sansio::sync::{AcquireError, TimedOut};
/// use std::error::Error as _;
///
/// let e = AcquireError::TimedOut(TimedOut);
/// assert_eq!(e.to_string(), "no window credit before the deadline");
/// assert!(e.source().is_some());
/// assert_eq!(AcquireError::Closed.to_string(), "the window is closed");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// The deadline passed while the waiter was still in its shard's line: it left the line
    /// and holds no credit.
    #[error("no window credit before the deadline")]
    TimedOut(#[source] TimedOut),
    /// The handle was closed.
    #[error("the window is closed")]
    Closed,
}

impl From<Closed> for AcquireError {
    fn from(_: Closed) -> Self {
        AcquireError::Closed
    }
}

/// A waiter's state in the arena. A slot is freed only by the [`Acquire`] that owns it.
enum Waiter {
    /// In its shard's line in the window, under `ticket`.
    Waiting(Ticket),
    /// A credit was handed to it; its `Acquire` has not observed it yet.
    Granted(CreditId),
    /// Failed by `close`.
    Closed,
}

#[cfg(test)]
#[derive(Default, Clone, Copy)]
pub(crate) struct Stats {
    /// Releases the window refused: a credit released twice. Must stay 0.
    pub(crate) refused_releases: usize,
    /// The most credits in flight for one shard at any moment.
    pub(crate) peak_in_flight: u32,
}

/// The window and its waiters' wakers. The window owns every rule: the per-shard FIFO line
/// (its held-back "batches" are waiter slot numbers), no barging, O(1) cancel and the
/// hand-off of a freed credit to the line's oldest waiter. This layer only keeps, per waiter
/// slot, the waker to wake and the credit handed over until its future observes it.
struct WindowState<Shard, S> {
    window: DispatchWindow<Shard, WaiterKey, S>,
    waiters: Waiters<Waiter>,
    #[cfg(test)]
    stats: Stats,
}

enum Issue {
    Credit(CreditId),
    NoCredit,
    Closed,
    /// The window cannot issue another id (after `u64::MAX - 1` credits, or `u32::MAX` live
    /// at once); the caller must [`close`](WindowState::close) the handle, since nobody
    /// waiting could ever be served (kept out of the hot path, which therefore needs no
    /// buffer of wakers).
    Exhausted,
}

impl<Shard, S> WindowState<Shard, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// A credit for a newcomer, if it may have one without waiting: the shard has free credit
    /// and nobody is in its line (the window refuses barging).
    #[inline]
    fn try_issue(&mut self, shard: &Shard, hash: u64) -> Issue {
        match self.window.try_take(shard, hash) {
            Take::Credit(credit) => {
                self.saw_in_flight(credit);
                self.note_issued(credit);
                Issue::Credit(credit)
            }
            Take::NoCredit => Issue::NoCredit,
            Take::Closed => Issue::Closed,
            Take::Exhausted => Issue::Exhausted,
        }
    }

    /// Records the [`WindowEvent::Dispatched`] of `credit`, just issued, while events are on.
    /// The window clones the shard key for it after the credit is out, so the clone runs under
    /// `catch_unwind`: a panicking `Clone` loses the event (counted as dropped) and nothing
    /// else, and the lock is not poisoned.
    #[inline]
    fn note_issued(&mut self, credit: CreditId) {
        if self.window.events_on() {
            self.note_issued_cold(credit);
        }
    }

    #[cold]
    fn note_issued_cold(&mut self, credit: CreditId) {
        let window = &mut self.window;
        if super::unwind::call(|| window.note_dispatched(credit)).is_err() {
            self.window.note_event_lost();
        }
    }

    /// Test statistics after `credit` was issued. Found through the credit, so it runs no
    /// user code after the change (a key's `Hash` that panicked here would strand the credit).
    #[inline]
    fn saw_in_flight(&mut self, _credit: CreditId) {
        #[cfg(test)]
        {
            let n = self.window.in_flight_of(_credit);
            self.stats.peak_in_flight = self.stats.peak_in_flight.max(n);
        }
    }

    /// Puts a new waiter at the back of `shard`'s line, or gives it a credit at once if it may
    /// have one.
    ///
    /// All the user code runs first: the waker's clone, then, in the window, the key's `Eq`,
    /// `Hash` and `Clone`, each before the window changes anything. The waiter's slot is
    /// inserted last, under the key the window already holds, so a panic in any of them
    /// leaves both the line and the arena as they were.
    fn enqueue(&mut self, shard: &Shard, hash: u64, waker: &Waker) -> Result<WaiterKey, Issue> {
        let waker = waker.clone();
        let key = self.waiters.next_key();
        match self.window.enqueue_hinted(shard, hash, key) {
            Ok(Entered::Queued(ticket)) => {
                let inserted = self.waiters.insert_owned(Waiter::Waiting(ticket), waker);
                debug_assert_eq!(inserted, key, "the window holds the key the arena gave");
                Ok(inserted)
            }
            Ok(Entered::Credit(credit, _)) => {
                self.saw_in_flight(credit);
                self.note_issued(credit);
                Err(Issue::Credit(credit))
            }
            Err(SubmitError::Exhausted(_)) => Err(Issue::Exhausted),
            Err(_) => Err(Issue::Closed),
        }
    }

    /// Releases `credit`; the window hands a fresh one to the shard's oldest waiter, whose
    /// waker is collected. `Err(())` when the window ran out of ids with waiters left: the
    /// caller must close the handle.
    #[inline]
    fn release(&mut self, credit: CreditId, wakeups: &mut Wakeups) -> Result<Released, ()> {
        match self.window.release(credit) {
            Ok(Some((fresh, key))) => {
                self.waiters.resolve(key, Waiter::Granted(fresh), wakeups);
                self.note_issued(fresh);
                Ok(Released::HandedOn)
            }
            // Nobody waits in the common case, so the exhaustion check is skipped.
            Ok(None)
                if self.waiters.len() > 0
                    && self.window.is_exhausted()
                    && !self.window.is_closed() =>
            {
                Err(())
            }
            Ok(None) => Ok(Released::Freed),
            Err(_) => {
                #[cfg(test)]
                {
                    self.stats.refused_releases += 1;
                }
                Ok(Released::Freed)
            }
        }
    }

    /// Gives `shard` its own limit (`None`: the configured one again); the window hands the
    /// credits a grown limit frees to the shard's oldest waiters, whose wakers are collected.
    /// Returns how many waiters were handed one. The key's `Hash`, `Eq` and `Clone` run in the
    /// window before anything changes.
    fn set_limit(
        &mut self,
        shard: &Shard,
        hash: u64,
        limit: Option<NonZeroUsize>,
        wakeups: &mut Wakeups,
    ) -> usize {
        let mut granted = SmallVec::<[(CreditId, WaiterKey); 4]>::new();
        self.window
            .set_limit_hinted(shard, hash, limit, |credit, key| {
                granted.push((credit, key))
            });
        let n = granted.len();
        for (credit, key) in granted {
            self.waiters.resolve(key, Waiter::Granted(credit), wakeups);
            self.saw_in_flight(credit);
            self.note_issued(credit);
        }
        n
    }

    /// Frees the slot of a finished waiter and returns what it held; a waiter still in line
    /// leaves it (O(1), in the window).
    fn take_waiter(&mut self, key: WaiterKey) -> Option<Waiter> {
        let old = self.waiters.remove(key)?;
        if let Waiter::Waiting(ticket) = &old {
            let _ = self.window.cancel(*ticket);
        }
        Some(old)
    }

    /// Closed, and no credit live: what [`WindowHandle::closed`] waits for.
    #[inline]
    fn is_drained(&self) -> bool {
        self.window.is_closed() && self.window.live_credits() == 0
    }

    /// Fails every waiter; credits handed to waiters that have not observed them go back.
    fn close(&mut self, wakeups: &mut Wakeups) {
        // Every waiter is visited below, so the window's list of them is not needed.
        self.window.close_with(|_, _| ());
        let mut handed = SmallVec::<[CreditId; 4]>::new();
        self.waiters.wake_where(wakeups, |state| {
            match core::mem::replace(state, Waiter::Closed) {
                Waiter::Waiting(_) => true,
                Waiter::Granted(credit) => {
                    handed.push(credit);
                    false
                }
                Waiter::Closed => false,
            }
        });
        for credit in handed {
            // After the close a release frees the slot and hands nothing on.
            if self.window.release(credit).is_err() {
                #[cfg(test)]
                {
                    self.stats.refused_releases += 1;
                }
            }
        }
    }
}

/// A cloneable handle to a dispatch window shared by concurrent submitters: await a credit per
/// shard ([`acquire`](Self::acquire)), in FIFO order, and hold it as a [`Permit`].
///
/// `Clone + Send + Sync` (for `Send` shard keys and a `Send + Sync` hasher: a clone of the
/// hasher lives beside the lock and is used from every thread); clones share one window.
///
/// # Contract
///
/// - [`acquire`](Self::acquire) joins the shard's line on its first poll and resolves, in line
///   order, to a `Permit` or to [`Closed`]. Dropping the future leaves the line; if a credit
///   had already been handed to it, the credit goes to the next waiter. Newcomers never barge:
///   while anyone waits for the shard, even [`try_acquire`](Self::try_acquire) is refused.
/// - A `Permit` is released exactly once, by [`Permit::complete`] or by dropping it; the
///   release hands the credit to the shard's oldest waiter, if any.
/// - [`close`](Self::close) fails every waiter and every later acquire with [`Closed`].
///   Permits already held stay valid and release as usual (their credit just frees).
/// - No caller code runs under the lock except the key's `Hash`/`Eq`/`Clone` and the waker's
///   `clone`, all before anything changes: a panic in one of them propagates to the caller
///   that passed the key (or polled), and the handle serves everyone else as before. Wakers
///   are woken after the lock is dropped; one whose `wake` panics does not keep the others
///   from being woken, and the release or close that woke it returns normally.
///
/// The hasher `S` defaults to std's [`RandomState`](std::hash::RandomState), which
/// [`new`](WindowHandle::new) uses; [`with_hasher`](Self::with_hasher) takes any other.
///
/// ```
/// use throttle_sansio::WindowConfig;
/// use throttle_sansio::sync::{Released, TryAcquireError, WindowHandle};
///
/// // No annotation: `new` builds a `WindowHandle<u32, RandomState>`.
/// let window = WindowHandle::new(WindowConfig::default().with_max_in_flight(1)).unwrap();
/// let permit = window.try_acquire(7u32).unwrap();
/// assert_eq!(window.try_acquire(7).unwrap_err(), TryAcquireError::NoCredit);
/// assert_eq!(permit.complete(), Released::Freed); // nobody waited
/// assert_eq!(window.available(&7), 1);
/// ```
pub struct WindowHandle<Shard, S = std::hash::RandomState> {
    shared: Arc<Shared<Shard, S>>,
    /// One owner count per stripe: an owned permit or future clones its stripe's, so owned
    /// permits of different stripes touch different reference counts (one count for the
    /// whole handle was a cache line every owned acquire and release on every core wrote).
    owners: Arc<Owners<Shard, S>>,
}

/// The per-stripe owner counts of a handle, indexed by stripe, each made on the first owned
/// permit or future of its stripe.
type Owners<Shard, S> = Box<[OnceSlot<Arc<Owner<Shard, S>>>]>;

/// A stripe, behind its lock: its window, made on the stripe's first use, and the two
/// handle-wide settings every stripe's window follows. `close` and the sink's install change
/// those on every stripe, made or not, under all the stripes' locks, so a window made later
/// (under its stripe's lock) starts closed, and with events on, exactly when the made ones
/// are.
struct Stripe<Shard, S> {
    /// On its own cache lines, so two stripes' windows never share one.
    state: Option<Box<Padded<WindowState<Shard, S>>>>,
    /// The handle was closed.
    closed: bool,
    /// The event capacity the handle's sink asks for (0 without a sink).
    event_capacity: usize,
}

impl<Shard, S> Stripe<Shard, S> {
    /// A stripe not used yet.
    fn unused() -> Self {
        Stripe {
            state: None,
            closed: false,
            event_capacity: 0,
        }
    }

    /// The stripe's window, if it was made.
    #[inline]
    fn made(&self) -> Option<&WindowState<Shard, S>> {
        self.state.as_deref().map(|st| &st.0)
    }

    /// Closed, and no credit live: [`WindowState::is_drained`], for a stripe never used (so
    /// holding no credit) simply whether the handle is closed.
    fn is_drained(&self) -> bool
    where
        Shard: Hash + Eq + Clone,
        S: BuildHasher,
    {
        self.made().map_or(self.closed, WindowState::is_drained)
    }
}

impl<Shard, S> Observed for Stripe<Shard, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    type Event = WindowEvent<Shard>;

    #[inline]
    fn poll_event(&mut self) -> Option<WindowEvent<Shard>> {
        self.state.as_deref_mut()?.0.window.poll_event()
    }

    #[inline]
    fn has_events(&self) -> bool {
        self.made().is_some_and(|st| st.window.has_events())
    }
}

/// A stripe's reference count of the handle's state, on its own cache lines.
#[repr(align(128))]
struct Owner<Shard, S>(Arc<Shared<Shard, S>>);

/// A stripe's window state on cache lines of its own, so that writes to one stripe's window
/// never move a line another stripe's window uses. The lock slots themselves are not padded
/// (32 bytes each, two to a line): padding them to a line each was measured in `threads_2`
/// (three alternated runs each way) and changed nothing beyond the noise, for 4× the slots'
/// memory.
#[repr(align(128))]
struct Padded<T>(T);

/// What a handle's clones, permits and futures share: the locked stripes, and a clone of the
/// window's hasher so that a shard key is hashed before a lock is taken, not under it.
struct Shared<Shard, S> {
    hasher: S,
    /// `S::clone`, for the hasher of a stripe's window made on first use (a function pointer,
    /// so that only [`WindowHandle::with_hasher`] needs `S: Clone`).
    clone_hasher: fn(&S) -> S,
    /// The config every stripe's window is made with (validated by `with_hasher`).
    cfg: WindowConfig,
    /// Exactly [`STRIPES`] of them; a shard lives in `stripes[stripe_of(hash)]`.
    stripes: Box<[Mutex<Stripe<Shard, S>>]>,
    /// Notified (after unlock) by every release that leaves the closed window with no live
    /// credit, and by `close` itself: [`WindowHandle::closed`] listens.
    drained: WakeSignal,
    /// The window's event sink: every critical section that changes the window takes the lock
    /// through [`Shared::lock`], which hands the window's events to it after unlock.
    tap: EventTap<WindowEvent<Shard>>,
}

impl<Shard, S> Shared<Shard, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// Stripe `i` (masked into range).
    #[inline]
    fn stripe(&self, i: usize) -> &Mutex<Stripe<Shard, S>> {
        &self.stripes[i & (STRIPES - 1)]
    }

    /// Stripe `i`'s lock, for a critical section that may change its window: its events go to
    /// the sink once the lock is dropped. Queries take the plain lock.
    #[inline]
    fn lock(&self, i: usize) -> ObservedGuard<'_, Stripe<Shard, S>> {
        lock_observed(self.stripe(i), &self.tap)
    }

    /// The window of a locked stripe, made now if this is the stripe's first use.
    #[inline]
    fn live<'g>(&self, stripe: &'g mut Stripe<Shard, S>) -> &'g mut WindowState<Shard, S> {
        let Stripe {
            state,
            closed,
            event_capacity,
        } = stripe;
        match state {
            Some(st) => &mut st.0,
            None => &mut state.insert(self.fresh(*closed, *event_capacity)).0,
        }
    }

    /// A stripe's first window: the handle's config and a clone of its hasher (user code:
    /// if it panics, the stripe stays unused and nothing changed), closed at once if the
    /// handle is (the window's own close, which then has no waiter to fail), and with the
    /// events of the handle's sink.
    #[cold]
    #[inline(never)]
    fn fresh(&self, closed: bool, event_capacity: usize) -> Box<Padded<WindowState<Shard, S>>> {
        let mut window = DispatchWindow::valid(self.cfg, (self.clone_hasher)(&self.hasher));
        window.set_event_capacity(event_capacity);
        let mut st = WindowState {
            window,
            waiters: Waiters::new(),
            #[cfg(test)]
            stats: Stats::default(),
        };
        if closed {
            st.close(&mut Wakeups::new());
        }
        Box::new(Padded(st))
    }

    /// Every stripe closed and no credit live in any: what [`WindowHandle::closed`] waits
    /// for. Takes the stripes' locks one at a time.
    fn is_drained(&self) -> bool {
        self.stripes.iter().all(|st| lock(st).is_drained())
    }

    /// Fails every waiter and refuses later acquires, on every stripe at once: the stripes'
    /// locks are all taken, in stripe order, before any closes, so no acquire on any stripe
    /// succeeds once `close` returns and none sees some stripes closed and others open. Wakes
    /// the waiters after unlocking.
    fn close(&self) {
        let mut wakeups = Wakeups::new();
        let (drained, events) = {
            let mut all: Vec<_> = self.stripes.iter().map(lock).collect();
            for st in &mut all {
                // A stripe not used yet makes its window closed (`Shared::fresh`).
                st.closed = true;
                if let Some(made) = st.state.as_deref_mut() {
                    made.0.close(&mut wakeups);
                }
            }
            let drained = all.iter().all(|st| st.is_drained());
            // The events of every stripe come out under the locks and reach the sink only
            // once all of them are released: a sink that reads the handle (another stripe)
            // must not find a lock still held by this thread.
            let events: Vec<_> = all
                .iter_mut()
                .map(|st| drain(&mut **st))
                .filter(|batch| !batch.is_empty())
                .collect();
            (drained, events)
        };
        for batch in events {
            self.tap.deliver(batch);
        }
        wake_all(wakeups);
        self.drained.notify_if(drained);
    }
}

/// How a [`Permit`] or an [`Acquire`] reaches the handle's state: by borrowing the handle
/// ([`WindowHandle::acquire`], [`WindowHandle::try_acquire`]: no reference count to touch), or
/// by owning a count of it ([`WindowHandle::acquire_owned`],
/// [`WindowHandle::try_acquire_owned`]: `'static`, so it can move into a spawned task).
enum Holder<'a, Shard, S> {
    Borrowed(&'a Shared<Shard, S>),
    /// The count of the permit's stripe.
    Owned(Arc<Owner<Shard, S>>),
}

impl<Shard, S> Holder<'_, Shard, S> {
    #[inline]
    fn get(&self) -> &Shared<Shard, S> {
        match self {
            Holder::Borrowed(shared) => shared,
            Holder::Owned(owner) => &owner.0,
        }
    }
}

impl<Shard, S> Clone for WindowHandle<Shard, S> {
    fn clone(&self) -> Self {
        WindowHandle {
            shared: Arc::clone(&self.shared),
            owners: Arc::clone(&self.owners),
        }
    }
}

impl<Shard, S> fmt::Debug for WindowHandle<Shard, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowHandle").finish_non_exhaustive()
    }
}

impl<Shard: Hash + Eq + Clone> WindowHandle<Shard, std::hash::RandomState> {
    /// A handle over a new window, hashing shard keys with a fresh std
    /// [`RandomState`](std::hash::RandomState) (as `HashMap::new` does); refuses an invalid
    /// `cfg`. For another hasher, [`with_hasher`](Self::with_hasher).
    pub fn new(cfg: WindowConfig) -> Result<Self, ConfigError> {
        Self::with_hasher(cfg, std::hash::RandomState::new())
    }
}

impl<Shard, S> WindowHandle<Shard, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// A handle over a new window, hashing shard keys with `hasher`.
    pub fn with_hasher(cfg: WindowConfig, hasher: S) -> Result<Self, ConfigError>
    where
        S: Clone,
    {
        cfg.validate()?;
        // Each stripe's window is made on the stripe's first use (`Shared::live`).
        let stripes = (0..STRIPES).map(|_| Mutex::new(Stripe::unused()));
        let shared = Arc::new(Shared {
            stripes: stripes.collect::<Vec<_>>().into_boxed_slice(),
            tap: EventTap::default(),
            hasher,
            clone_hasher: S::clone,
            cfg,
            drained: WakeSignal::new(),
        });
        let owners = (0..STRIPES).map(|_| OnceSlot::new());
        Ok(WindowHandle {
            shared,
            owners: Arc::new(owners.collect::<Vec<_>>().into_boxed_slice()),
        })
    }

    /// Waits for a credit of `shard`: FIFO per shard, cancel-safe (see the type's contract).
    /// The permit borrows the handle; [`acquire_owned`](Self::acquire_owned) gives one that
    /// can outlive it.
    ///
    /// # Panics
    ///
    /// If `shard`'s `Hash` (or the hasher) panics: the future hashes its key when it is made,
    /// so the panic reaches this call, before anything changed. A poll of the future can panic
    /// on the key's `Hash`, `Eq` or `Clone` and on the waker's `clone` (see [`Acquire`]).
    #[inline]
    pub fn acquire(&self, shard: Shard) -> Acquire<'_, Shard, S> {
        let hash = self.shared.hasher.hash_one(&shard);
        Acquire::new(Holder::Borrowed(&self.shared), shard, hash)
    }

    /// As [`acquire`](Self::acquire), for a `'static` permit ([`OwnedPermit`]) that holds a
    /// reference count of the handle's state, e.g. to move into a spawned task.
    ///
    /// # Panics
    ///
    /// If `shard`'s `Hash` (or the hasher) panics: the future hashes its key when it is made,
    /// so the panic reaches this call, before anything changed. A poll of the future can panic
    /// on the key's `Hash`, `Eq` or `Clone` and on the waker's `clone` (see [`Acquire`]).
    #[inline]
    pub fn acquire_owned(&self, shard: Shard) -> Acquire<'static, Shard, S>
    where
        Shard: 'static,
        S: 'static,
    {
        let hash = self.shared.hasher.hash_one(&shard);
        Acquire::new(self.owned(stripe_of(hash)), shard, hash)
    }

    /// As [`acquire`](Self::acquire), giving up at `timeout` after this call on `rt`'s clock
    /// (the deadline saturates at [`Instant::MAX`], which never fires). See
    /// [`Acquire::deadline`] for the exact rule: a credit handed over before the waiter
    /// observes its deadline wins, so a timer and a grant that race lose no credit.
    ///
    /// ```
    #[doc = include_str!("doc/tiny_runtime.md")]
    /// use core::time::Duration;
    /// use throttle_sansio::WindowConfig;
    /// use throttle_sansio::sync::{AcquireError, TimedOut, WindowHandle};
    ///
    /// let rt = Tiny::default();
    /// let window = WindowHandle::new(WindowConfig::default().with_max_in_flight(1)).unwrap();
    /// let held = window.try_acquire(7u32).unwrap();
    /// let mut late = Box::pin(window.acquire_timeout(&rt, 7, Duration::from_millis(50)));
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert!(late.as_mut().poll(&mut cx).is_pending(), "in line behind `held`");
    /// rt.clock.advance(Duration::from_millis(50));
    /// assert_eq!(rt.block_on(late).unwrap_err(), AcquireError::TimedOut(TimedOut));
    /// assert_eq!(window.waiting(&7), 0, "the timed-out waiter left the line");
    /// drop(held);
    /// assert_eq!(window.available(&7), 1);
    /// ```
    ///
    /// # Panics
    ///
    /// As [`acquire`](Self::acquire).
    pub fn acquire_timeout<'a, R: Runtime>(
        &'a self,
        rt: &R,
        shard: Shard,
        timeout: Duration,
    ) -> impl Future<Output = Result<Permit<'a, Shard, S>, AcquireError>> + 'a
    where
        Shard: 'a,
        S: 'a,
    {
        let deadline = rt.now().saturating_add(timeout);
        self.acquire(shard).deadline(rt, deadline)
    }

    /// A credit of `shard` now, if one is free and nobody waits for the shard. The permit
    /// borrows the handle; see [`try_acquire_owned`](Self::try_acquire_owned).
    ///
    /// # Panics
    ///
    /// If `shard`'s `Hash`, `Eq` or `Clone` (or the hasher) panics. The panic reaches this
    /// caller and the window is as before the call (it runs them before it changes anything:
    /// no credit issued, no entry made); other and later callers proceed.
    #[inline]
    pub fn try_acquire(&self, shard: Shard) -> Result<Permit<'_, Shard, S>, TryAcquireError> {
        self.take_now(shard, |_| Holder::Borrowed(&self.shared))
    }

    /// As [`try_acquire`](Self::try_acquire), for a `'static` permit ([`OwnedPermit`]).
    ///
    /// # Panics
    ///
    /// If `shard`'s `Hash`, `Eq` or `Clone` (or the hasher) panics. The panic reaches this
    /// caller and the window is as before the call (it runs them before it changes anything:
    /// no credit issued, no entry made); other and later callers proceed.
    #[inline]
    pub fn try_acquire_owned(&self, shard: Shard) -> Result<OwnedPermit<Shard, S>, TryAcquireError>
    where
        Shard: 'static,
        S: 'static,
    {
        self.take_now(shard, |stripe| self.owned(stripe))
    }

    /// An owner count of stripe `stripe`'s, for an owned permit or future.
    #[inline]
    fn owned(&self, stripe: usize) -> Holder<'static, Shard, S> {
        let slot = &self.owners[stripe & (STRIPES - 1)];
        Holder::Owned(slot.get_or_init(|| Arc::new(Owner(Arc::clone(&self.shared)))))
    }

    /// A credit now, held through the holder `hold` makes (for the credit's stripe) once the
    /// credit is issued.
    #[inline]
    fn take_now<'a>(
        &self,
        shard: Shard,
        hold: impl FnOnce(usize) -> Holder<'a, Shard, S>,
    ) -> Result<Permit<'a, Shard, S>, TryAcquireError> {
        let hash = self.shared.hasher.hash_one(&shard);
        let stripe = stripe_of(hash);
        let issued = self
            .shared
            .live(&mut self.shared.lock(stripe))
            .try_issue(&shard, hash);
        match issued {
            Issue::Credit(credit) => Ok(Permit::new(hold(stripe), shard, stripe, credit)),
            Issue::NoCredit => Err(TryAcquireError::NoCredit),
            Issue::Closed => Err(TryAcquireError::Closed),
            Issue::Exhausted => {
                self.close();
                Err(TryAcquireError::Closed)
            }
        }
    }

    /// Fails every waiter (their futures resolve to [`Closed`]) and refuses later acquires.
    /// Permits already held stay valid; releasing them frees their slots. Idempotent. Runs no
    /// key code and never panics: a waiter's waker that panics in `wake` is caught, and the
    /// others (and the [`closed`](Self::closed) listeners) are still woken.
    pub fn close(&self) {
        self.shared.close();
    }

    /// Resolves once the handle is closed and no credit is live: every permit released (and
    /// every credit handed to a waiter given back by the close). With [`close`](Self::close),
    /// a graceful shutdown: `window.close(); window.closed().await`. Waits for the close
    /// itself too, so it may be awaited before `close` is called. Cancel-safe.
    pub async fn closed(&self) {
        wait_for(&self.shared.drained, || self.shared.is_drained()).await;
    }

    /// Whether [`close`](Self::close) was called (or the window ran out of credit ids).
    pub fn is_closed(&self) -> bool {
        // `close` marks every stripe (and closes every window made) under all their locks,
        // so any one of them answers.
        lock(self.shared.stripe(0)).closed
    }

    /// Credits per shard, as configured: the capacity of every shard without a limit of its
    /// own ([`set_max_in_flight`](Self::set_max_in_flight)).
    pub fn capacity(&self) -> u32 {
        self.query_stripe(0, |st| st.window.capacity())
    }

    /// `shard`'s capacity now: its own limit if one was set, else [`capacity`](Self::capacity).
    ///
    /// # Panics
    ///
    /// If `shard`'s `Hash` or `Eq` (or the hasher) panics; nothing changed.
    pub fn capacity_of(&self, shard: &Shard) -> u32 {
        self.query(shard, |st| st.window.capacity_of(shard))
    }

    /// Gives `shard` its own limit at run time, for every clone of the handle: `Some(n)`
    /// allows `n` permits of it at once from now on, `None` gives it the configured limit
    /// again ([`DispatchWindow::set_max_in_flight`], the same rule): a larger limit hands
    /// the credits it frees to the shard's oldest waiters at once, in line order (returned:
    /// how many), and wakes them after the lock is dropped; a smaller one revokes no permit,
    /// and each release frees its credit instead of handing it on until fewer than the new
    /// limit are held. Does nothing after [`close`](Self::close).
    ///
    /// A shard with its own limit keeps its entry in the stripe's map while idle; `None`
    /// lets it go again.
    ///
    /// ```
    /// use core::num::NonZeroUsize;
    /// use throttle_sansio::WindowConfig;
    /// use throttle_sansio::sync::{TryAcquireError, WindowHandle};
    ///
    /// let window = WindowHandle::new(WindowConfig::default().with_max_in_flight(2)).unwrap();
    /// let a = window.try_acquire(7u32).unwrap();
    /// let b = window.try_acquire(7).unwrap();
    /// assert_eq!(window.set_max_in_flight(&7, NonZeroUsize::new(1)), 0);
    /// drop(a); // retired: 1 held, the new limit
    /// assert_eq!(window.try_acquire(7).unwrap_err(), TryAcquireError::NoCredit);
    /// assert_eq!(window.set_max_in_flight(&7, NonZeroUsize::new(3)), 0, "nobody waits");
    /// assert_eq!((window.capacity_of(&7), window.available(&7)), (3, 2));
    /// # drop(b);
    /// ```
    ///
    /// # Panics
    ///
    /// If `shard`'s `Hash`, `Eq` or `Clone` (or the hasher) panics; nothing changed. A
    /// waiter's waker that panics in `wake` is caught: the others are still woken.
    pub fn set_max_in_flight(&self, shard: &Shard, limit: Option<NonZeroUsize>) -> usize {
        let hash = self.shared.hasher.hash_one(shard);
        let stripe = stripe_of(hash);
        let mut wakeups = Wakeups::new();
        let granted = {
            let mut guard = self.shared.lock(stripe);
            self.shared
                .live(&mut guard)
                .set_limit(shard, hash, limit, &mut wakeups)
        };
        wake_all(wakeups);
        granted
    }

    /// `f` on stripe `i`'s window, locked for a query (made if the stripe was not used yet,
    /// so every answer is the window's own).
    fn query_stripe<R>(&self, i: usize, f: impl FnOnce(&WindowState<Shard, S>) -> R) -> R {
        f(self.shared.live(&mut lock(self.shared.stripe(i))))
    }

    /// `f` on the window of `shard`'s stripe (for its key's `Hash`), locked for a query.
    fn query<R>(&self, shard: &Shard, f: impl FnOnce(&WindowState<Shard, S>) -> R) -> R {
        self.query_stripe(stripe_of(self.shared.hasher.hash_one(shard)), f)
    }

    /// Credits of `shard` held (by permits, or handed to waiters not yet woken).
    ///
    /// # Panics
    ///
    /// If `shard`'s `Hash` or `Eq` (or the hasher) panics; nothing changed.
    pub fn in_flight(&self, shard: &Shard) -> u32 {
        self.query(shard, |st| st.window.in_flight(shard))
    }

    /// Free credits of `shard`. Never positive while waiters are in the shard's line.
    ///
    /// # Panics
    ///
    /// If `shard`'s `Hash` or `Eq` (or the hasher) panics; nothing changed.
    pub fn available(&self, shard: &Shard) -> u32 {
        self.query(shard, |st| st.window.available(shard))
    }

    /// Waiters in `shard`'s line.
    ///
    /// # Panics
    ///
    /// If `shard`'s `Hash` or `Eq` (or the hasher) panics; nothing changed.
    pub fn waiting(&self, shard: &Shard) -> usize {
        self.query(shard, |st| st.window.queued(shard))
    }

    /// The stripe `shard` hashes onto (`0..STRIPES`), as [`Permit::stripe`] reports it.
    ///
    /// # Panics
    ///
    /// If `shard`'s `Hash` (or the hasher) panics; nothing changed.
    pub fn stripe_of(&self, shard: &Shard) -> usize {
        stripe_of(self.shared.hasher.hash_one(shard))
    }

    #[cfg(test)]
    pub(crate) fn stats(&self) -> Stats {
        let mut all = Stats::default();
        for st in self.shared.stripes.iter() {
            let Some(stats) = lock(st).made().map(|made| made.stats) else {
                continue;
            };
            all.refused_releases += stats.refused_releases;
            all.peak_in_flight = all.peak_in_flight.max(stats.peak_in_flight);
        }
        all
    }

    /// `f` over every stripe's state (made now if the stripe was not used yet), summed (tests
    /// look inside the stripes).
    #[cfg(all(test, not(loom)))]
    fn total(&self, f: impl Fn(&mut WindowState<Shard, S>) -> usize) -> usize {
        let stripes = self.shared.stripes.iter();
        stripes.map(|st| f(self.shared.live(&mut lock(st)))).sum()
    }

    #[cfg(test)]
    pub(crate) fn live_credits(&self) -> usize {
        let stripes = self.shared.stripes.iter();
        stripes
            .map(|st| lock(st).made().map_or(0, |made| made.window.live_credits()))
            .sum()
    }

    /// One page of at most `max` tracked shards, each with its permits held and free, its
    /// tasks waiting in `acquire`, and whether it is paused ([`DispatchWindow::snapshot`]).
    /// Start with `from = None`, then pass each page's `next` until it is `None`. The walk goes
    /// stripe by stripe (a cursor names its stripe), holding one stripe's lock at a time, and
    /// every shard tracked throughout the walk is listed exactly once.
    ///
    /// ```
    /// use throttle_sansio::WindowConfig;
    /// use throttle_sansio::sync::WindowHandle;
    ///
    /// let window = WindowHandle::new(WindowConfig::default()).unwrap();
    /// let _a = window.try_acquire("a").unwrap();
    /// let _b = window.try_acquire("b").unwrap();
    /// let page = window.snapshot(None, 10);
    /// let mut held: Vec<_> = page.items.iter().map(|s| (s.shard, s.in_flight)).collect();
    /// held.sort();
    /// assert_eq!((held, page.next), (vec![("a", 1), ("b", 1)], None));
    /// ```
    ///
    /// # Panics
    ///
    /// Only if a shard's `Clone` panics (each listed key is cloned, under the lock, which
    /// changes nothing); the handle keeps serving.
    pub fn snapshot(&self, from: Option<Cursor>, max: usize) -> Page<ShardSnapshot<Shard>> {
        let max = max.max(1);
        // The cursor's part tag names the stripe: `2·stripe` to resume inside it after the
        // window's place, `2·stripe + 1` to start it from its beginning. Not the place's
        // hash: that is the stripe's window's own hash of the key, which a hasher whose
        // clones hash differently puts on another stripe than the handle's.
        let (mut stripe, mut from) = match from {
            None => (0, None),
            Some(c) => {
                let stripe = usize::try_from(c.part() >> 1).unwrap_or(STRIPES);
                (stripe, (c.part() & 1 == 0).then_some(c))
            }
        };
        let mut items = Vec::new();
        while stripe < STRIPES {
            let room = max.saturating_sub(items.len());
            let page = match lock(self.shared.stripe(stripe)).made() {
                Some(made) => made.window.snapshot(from, room),
                // A stripe never used tracks no shard.
                None => Page {
                    items: Vec::new(),
                    next: None,
                },
            };
            items.extend(page.items);
            if let Some(next) = page.next {
                let next = next.in_part((stripe as u64) << 1);
                return Page {
                    items,
                    next: Some(next),
                };
            }
            stripe += 1;
            if items.len() >= max && stripe < STRIPES {
                let next = Cursor::after(0, 0).in_part(((stripe as u64) << 1) | 1);
                return Page {
                    items,
                    next: Some(next),
                };
            }
            from = None;
        }
        Page { items, next: None }
    }

    /// Sends the window's observation events ([`WindowEvent`]: every credit issued, with its
    /// shard, and every credit released, with the shard's count left in flight) to `sink`, for
    /// every clone of this handle, replacing any sink set before, and turns the window's events
    /// on (they are off until then, and cost nothing but one check per critical section).
    ///
    /// With events on, the window clones the shard key once per credit issued, after the
    /// credit is out, under `catch_unwind`: a panicking `Clone` loses that event (counted in
    /// [`events_dropped`](Self::events_dropped)) and nothing else. The sink is called as
    /// [`GateHandle::set_event_sink`](super::GateHandle::set_event_sink) describes: after the
    /// lock is dropped, once per event, in order, with a panic caught and counted
    /// ([`event_sink_panics`](Self::event_sink_panics)).
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use throttle_sansio::sync::WindowHandle;
    /// use throttle_sansio::{WindowConfig, WindowEvent};
    ///
    /// let window: WindowHandle<u32> = WindowHandle::new(WindowConfig::default()).unwrap();
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = Arc::clone(&seen);
    /// window.set_event_sink(move |e: &WindowEvent<u32>| log.lock().unwrap().push(e.clone()));
    /// let permit = window.try_acquire(7).unwrap();
    /// drop(permit);
    /// let seen = seen.lock().unwrap();
    /// assert!(matches!(
    ///     seen[..],
    ///     [
    ///         WindowEvent::Dispatched { shard: 7, .. },
    ///         WindowEvent::Released { in_flight: 0, .. },
    ///     ]
    /// ));
    /// ```
    pub fn set_event_sink(&self, sink: impl EventSink<WindowEvent<Shard>> + 'static) {
        self.install_sink(Some(std::sync::Arc::new(sink)));
    }

    /// Removes the event sink and turns the window's events off again.
    pub fn clear_event_sink(&self) {
        self.install_sink(None);
    }

    fn install_sink(&self, sink: Option<std::sync::Arc<dyn EventSink<WindowEvent<Shard>>>>) {
        self.shared
            .tap
            .install(self.shared.stripes.iter(), sink, |st, capacity| {
                // A stripe not used yet makes its window with it (`Shared::fresh`).
                st.event_capacity = capacity;
                if let Some(made) = st.state.as_deref_mut() {
                    made.0.window.set_event_capacity(capacity);
                }
            });
    }

    /// Events the sink panicked on (each one lost; nothing else changed).
    pub fn event_sink_panics(&self) -> u64 {
        self.shared.tap.panics()
    }

    /// Events lost before a sink saw them: to the window's bound, to a shard key's `Clone`
    /// that panicked as the handle copied it into one, or delivered just after a
    /// [`clear_event_sink`](Self::clear_event_sink).
    pub fn events_dropped(&self) -> u64 {
        let stripes = self.shared.stripes.iter();
        let dropped = stripes.fold(0u64, |n, st| {
            let made = lock(st)
                .made()
                .map_or(0, |made| made.window.events_dropped());
            n.saturating_add(made)
        });
        dropped.saturating_add(self.shared.tap.unseen())
    }
}

/// One credit of a shard's window, held until [`complete`](Self::complete)d or dropped.
///
/// Not `Clone`; `Send` (for `Send` shard keys and a `Send + Sync` hasher). Dropping it
/// releases the credit just like `complete`, so a task cancelled while holding it gives the
/// credit back. `Permit<'a, …>` borrows its [`WindowHandle`] (from
/// [`acquire`](WindowHandle::acquire) / [`try_acquire`](WindowHandle::try_acquire));
/// [`OwnedPermit`] = `Permit<'static, …>` holds a reference count of the handle's state
/// instead (from [`acquire_owned`](WindowHandle::acquire_owned) /
/// [`try_acquire_owned`](WindowHandle::try_acquire_owned)), like tokio's `SemaphorePermit` and
/// `OwnedSemaphorePermit`. Both release the same way.
#[must_use = "a permit holds a window credit until it is completed or dropped"]
pub struct Permit<'a, Shard, S = std::hash::RandomState>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    shared: Holder<'a, Shard, S>,
    shard: Shard,
    /// The stripe the credit is from (`0..STRIPES`).
    stripe: usize,
    credit: CreditId,
    /// Cleared by the first release, so `complete` followed by `Drop` releases once.
    live: bool,
}

/// A [`Permit`] that owns a reference count of the handle's state: `'static`, so it can move
/// into a spawned task. See [`WindowHandle::acquire_owned`].
pub type OwnedPermit<Shard, S = std::hash::RandomState> = Permit<'static, Shard, S>;

impl<Shard, S> fmt::Debug for Permit<'_, Shard, S>
where
    Shard: Hash + Eq + Clone + fmt::Debug,
    S: BuildHasher,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("shard", &self.shard)
            .field("stripe", &self.stripe)
            .field("credit", &self.credit)
            .finish()
    }
}

impl<'a, Shard, S> Permit<'a, Shard, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    #[inline]
    fn new(shared: Holder<'a, Shard, S>, shard: Shard, stripe: usize, credit: CreditId) -> Self {
        Permit {
            shared,
            shard,
            stripe,
            credit,
            live: true,
        }
    }

    /// The shard this credit belongs to.
    pub fn shard(&self) -> &Shard {
        &self.shard
    }

    /// The credit's id in its stripe's window. Unique for the handle's life: each stripe's
    /// window tags its ids with its own instance tag, so two stripes' ids never coincide (and
    /// a [`WindowEvent`]'s `credit` names one credit of the handle).
    pub fn credit(&self) -> CreditId {
        self.credit
    }

    /// The stripe the credit is from (`0..STRIPES`), which its shard's key hashes onto.
    pub fn stripe(&self) -> usize {
        self.stripe
    }

    /// Releases the credit: the shard's oldest waiter receives one in its place
    /// ([`Released::HandedOn`]), else the slot frees ([`Released::Freed`]). Runs no key code
    /// and never panics, as dropping the permit (even by an unwinding task): the wake of the
    /// waiter handed the credit is caught, and the waiter still gets it.
    #[inline]
    pub fn complete(mut self) -> Released {
        self.release()
    }

    #[inline]
    fn release(&mut self) -> Released {
        if !core::mem::replace(&mut self.live, false) {
            return Released::Freed;
        }
        let shared = self.shared.get();
        let mut guard = shared.lock(self.stripe);
        let st = shared.live(&mut guard);
        let mut wakeups = Wakeups::new();
        let released = st.release(self.credit, &mut wakeups);
        let drained = st.is_drained();
        drop(guard);
        if drained {
            // The last credit of a closed stripe: `closed()` may resolve (it checks them all).
            self.shared.get().drained.notify();
        }
        match released {
            Ok(released) => {
                wake_all(wakeups);
                released
            }
            Err(()) => {
                // The window ran out of ids with waiters left: none could ever be served.
                self.shared.get().close();
                Released::Freed
            }
        }
    }
}

impl<Shard, S> Drop for Permit<'_, Shard, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    #[inline]
    fn drop(&mut self) {
        // Checked here, inline: after `complete` the permit is spent, and its drop then costs
        // no call.
        if self.live {
            let _ = self.release();
        }
    }
}

#[derive(Clone, Copy)]
enum AcquireState {
    /// Not polled yet: not in line.
    Start,
    /// In line, in this waiter slot.
    Waiting(WaiterKey),
    /// Resolved; polling again returns `Pending` forever.
    Done,
}

/// The future of [`WindowHandle::acquire`] (`Acquire<'a, …>`, resolving to a `Permit<'a, …>`)
/// and of [`WindowHandle::acquire_owned`] (`Acquire<'static, …>`, resolving to an
/// [`OwnedPermit`]), or to [`Closed`].
///
/// It joins the shard's line when first polled. Dropping it at any point is safe: it leaves the
/// line, and a credit already handed to it passes to the next waiter.
///
/// # Panics
///
/// Only the first poll runs key code: the shard key's `Eq` (the lookups), `Hash` and `Clone` (a
/// new shard's entry). It also clones the waker when it joins the line, and a later poll from
/// another task clones that task's waker. If one of them panics, the panic reaches the poller
/// and the window is as before the poll:
///
/// - a first poll that panicked left the future neither in the line nor resolved: polling it
///   again tries afresh, and dropping it is safe;
/// - a re-poll whose waker's `clone` panicked leaves the waiter in its place, with the waker
///   it had.
///
/// A re-poll from the same task and the drop run no user code. The wake of a waiter it hands a
/// credit on to is caught, so it never panics there.
#[must_use = "futures do nothing unless polled"]
pub struct Acquire<'a, Shard, S = std::hash::RandomState>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// Moved into the [`Permit`] when it resolves (an owned holder's reference count is taken
    /// once, when the future is made).
    shared: Option<Holder<'a, Shard, S>>,
    /// Moved into the [`Permit`] when it resolves.
    shard: Option<Shard>,
    /// `shard`'s hash, computed once when the future is made.
    hash: u64,
    state: AcquireState,
}

impl<'a, Shard, S> Acquire<'a, Shard, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    #[inline]
    fn new(shared: Holder<'a, Shard, S>, shard: Shard, hash: u64) -> Self {
        Acquire {
            hash,
            shared: Some(shared),
            shard: Some(shard),
            state: AcquireState::Start,
        }
    }
}

impl<'a, Shard, S> Acquire<'a, Shard, S>
where
    Shard: Hash + Eq + Clone + 'a,
    S: BuildHasher + 'a,
{
    /// This wait, given up at `deadline` on `rt`'s clock: resolves to the permit, to
    /// [`AcquireError::Closed`], or to [`AcquireError::TimedOut`].
    ///
    /// The rule, decided under the handle's lock when the timer has fired: a waiter still in
    /// its shard's line leaves it (the window's O(1) cancel, as when the future is dropped)
    /// and the wait times out; a waiter the window already handed a credit to resolves to
    /// that permit, even though the deadline passed. So a release and the timer that race
    /// never lose or duplicate a credit. The wait is polled before the timer, so a credit free
    /// at the first poll is taken even with a deadline already passed (`Duration::ZERO` is a
    /// `try_acquire` that reports [`AcquireError::TimedOut`] instead of waiting).
    ///
    /// Dropping the returned future is dropping this `Acquire` (see the type). Its timer is
    /// `rt`'s [`sleep_until`](Runtime::sleep_until), pinned in the future itself.
    ///
    /// # Panics
    ///
    /// As polling this `Acquire` (see the type).
    pub fn deadline<R: Runtime>(
        mut self,
        rt: &R,
        deadline: Instant,
    ) -> impl Future<Output = Result<Permit<'a, Shard, S>, AcquireError>> + 'a {
        let sleep = rt.sleep_until(deadline);
        async move {
            let mut sleep = core::pin::pin!(sleep);
            core::future::poll_fn(move |cx| {
                if let Poll::Ready(done) = Pin::new(&mut self).poll(cx) {
                    return Poll::Ready(done.map_err(AcquireError::from));
                }
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(self.expire());
                }
                Poll::Pending
            })
            .await
        }
    }

    /// The deadline passed: under one lock, a waiter still in line leaves it
    /// ([`AcquireError::TimedOut`]); one handed a credit takes it; one failed by `close`
    /// resolves to [`AcquireError::Closed`]. A future not yet in line (never polled) times
    /// out. Runs no user code. The future is resolved afterwards (polling it again returns
    /// `Pending`, dropping it does nothing).
    pub(crate) fn expire(&mut self) -> Result<Permit<'a, Shard, S>, AcquireError> {
        let state = core::mem::replace(&mut self.state, AcquireState::Done);
        let timed_out = Err(AcquireError::TimedOut(TimedOut));
        let AcquireState::Waiting(key) = state else {
            return match state {
                AcquireState::Start => timed_out,
                _ => Err(AcquireError::Closed),
            };
        };
        let Some(shared) = self.shared.as_ref() else {
            return Err(AcquireError::Closed);
        };
        let stripe = stripe_of(self.hash);
        let taken = {
            let shared = shared.get();
            shared.live(&mut shared.lock(stripe)).take_waiter(key)
        };
        match (taken, self.shared.take(), self.shard.take()) {
            (Some(Waiter::Granted(credit)), Some(shared), Some(shard)) => {
                Ok(Permit::new(shared, shard, stripe, credit))
            }
            (Some(Waiter::Waiting(_)), _, _) => timed_out,
            _ => Err(AcquireError::Closed),
        }
    }
}

// No field is structurally pinned.
impl<Shard, S> Unpin for Acquire<'_, Shard, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
}

impl<Shard: Hash + Eq + Clone + fmt::Debug, S: BuildHasher> fmt::Debug for Acquire<'_, Shard, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shard = &self.shard; // `None` once resolved
        f.debug_struct("Acquire")
            .field("shard", shard)
            .finish_non_exhaustive()
    }
}

impl<'a, Shard, S> Future for Acquire<'a, Shard, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    type Output = Result<Permit<'a, Shard, S>, Closed>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(shared) = this.shared.as_ref() else {
            return Poll::Pending; // resolved already
        };
        let Some(shard) = this.shard.as_ref() else {
            return Poll::Pending; // resolved already
        };
        let stripe = stripe_of(this.hash);
        let mut guard = shared.get().lock(stripe);
        let st = shared.get().live(&mut guard);
        // `Err(true)`: the window just ran out of ids; close the handle before resolving.
        let outcome = match this.state {
            AcquireState::Start => match st.try_issue(shard, this.hash) {
                Issue::Credit(credit) => Ok(credit),
                Issue::Closed => Err(false),
                Issue::Exhausted => Err(true),
                // Checking for credit and joining the line happen under one lock, so a
                // release cannot slip in between and be missed.
                Issue::NoCredit => match st.enqueue(shard, this.hash, cx.waker()) {
                    Ok(key) => {
                        this.state = AcquireState::Waiting(key);
                        return Poll::Pending;
                    }
                    Err(Issue::Credit(credit)) => Ok(credit),
                    Err(Issue::Exhausted) => Err(true),
                    Err(_) => Err(false),
                },
            },
            AcquireState::Waiting(key) => match st.waiters.get(key) {
                Some(Waiter::Waiting(_)) => {
                    st.waiters.register(key, cx.waker());
                    return Poll::Pending;
                }
                _ => match st.take_waiter(key) {
                    Some(Waiter::Granted(credit)) => Ok(credit),
                    _ => Err(false),
                },
            },
            AcquireState::Done => return Poll::Pending,
        };
        drop(guard);
        if outcome == Err(true) {
            shared.get().close();
        }
        this.state = AcquireState::Done;
        // The key moves into the permit: no user `Clone` runs once the credit is ours.
        Poll::Ready(match (outcome, this.shared.take(), this.shard.take()) {
            (Ok(credit), Some(shared), Some(shard)) => {
                Ok(Permit::new(shared, shard, stripe, credit))
            }
            // `shared` and `shard` were checked above; an error resolves without them.
            (Ok(_), _, _) | (Err(_), _, _) => Err(Closed),
        })
    }
}

impl<Shard: Hash + Eq + Clone, S: BuildHasher> Drop for Acquire<'_, Shard, S> {
    #[inline]
    fn drop(&mut self) {
        let (AcquireState::Waiting(key), Some(shared)) = (self.state, self.shared.as_ref()) else {
            return;
        };
        self.state = AcquireState::Done;
        let mut wakeups = Wakeups::new();
        let mut exhausted = false;
        let mut drained = false;
        {
            let mut guard = shared.get().lock(stripe_of(self.hash));
            let st = shared.get().live(&mut guard);
            // Still in line: it leaves it (the window cancels its ticket). Cancelled after a
            // credit was handed to it: the credit goes back, to the next waiter if any. No
            // user code runs here: the window names the shard by its stored hash.
            if let Some(Waiter::Granted(credit)) = st.take_waiter(key) {
                exhausted = st.release(credit, &mut wakeups).is_err();
                drained = st.is_drained();
            }
        }
        if exhausted {
            shared.get().close();
        }
        shared.get().drained.notify_if(drained);
        wake_all(wakeups);
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, not(loom)))]
mod panics;
