//! Async credit of a shared [`DispatchWindow`]: [`WindowHandle`], its [`Acquire`] future and
//! [`Permit`], the only way to hold a credit.
//!
//! The handle keeps the window and its waiters' wakers behind one mutex. The window owns the
//! per-shard FIFO line of waiters (each waiter is a held-back "batch" naming its waker slot),
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

use alloc::vec::Vec;
use core::fmt;
use core::future::Future;
use core::hash::{BuildHasher, Hash};
use core::pin::Pin;
use core::task::{Context, Poll, Waker};

use smallvec::SmallVec;

use super::loom::{Arc, Mutex, lock};
use super::{Closed, wake_all};
use crate::dispatch_window::{
    CreditId, DispatchWindow, Entered, SubmitError, Take, Ticket, WindowConfig,
};
use crate::error::ConfigError;

/// Wakers collected under the lock, woken after it is dropped.
type Wakeups = SmallVec<[Waker; 2]>;

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

/// One waiter's slot. A slot is freed only by the [`Acquire`] that owns it.
enum Waiter {
    Free,
    /// In its shard's line in the window, under `ticket`.
    Waiting {
        ticket: Ticket,
        waker: Option<Waker>,
    },
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
    window: DispatchWindow<Shard, usize, S>,
    waiters: Vec<Waiter>,
    free: Vec<usize>,
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
                self.saw_in_flight(shard);
                Issue::Credit(credit)
            }
            Take::NoCredit => Issue::NoCredit,
            Take::Closed => Issue::Closed,
            Take::Exhausted => Issue::Exhausted,
        }
    }

    #[inline]
    fn saw_in_flight(&mut self, _shard: &Shard) {
        #[cfg(test)]
        {
            let n = self.window.in_flight(_shard);
            self.stats.peak_in_flight = self.stats.peak_in_flight.max(n);
        }
    }

    /// Puts a new waiter at the back of `shard`'s line, or gives it a credit at once if it may
    /// have one.
    fn enqueue(&mut self, shard: &Shard, hash: u64, waker: &Waker) -> Result<usize, Issue> {
        let idx = match self.free.pop() {
            Some(idx) => idx,
            None => {
                self.waiters.push(Waiter::Free);
                self.waiters.len() - 1
            }
        };
        match self.window.enqueue_hinted(shard, hash, idx) {
            Ok(Entered::Queued(ticket)) => {
                if let Some(slot) = self.waiters.get_mut(idx) {
                    *slot = Waiter::Waiting {
                        ticket,
                        waker: Some(waker.clone()),
                    };
                }
                Ok(idx)
            }
            Ok(Entered::Credit(credit, _)) => {
                self.free_slot(idx);
                self.saw_in_flight(shard);
                Err(Issue::Credit(credit))
            }
            Err(SubmitError::Exhausted(_)) => {
                self.free_slot(idx);
                Err(Issue::Exhausted)
            }
            Err(_) => {
                self.free_slot(idx);
                Err(Issue::Closed)
            }
        }
    }

    /// Releases `credit`; the window hands a fresh one to the shard's oldest waiter, whose
    /// waker is collected. `Err(())` when the window ran out of ids with waiters left: the
    /// caller must close the handle.
    #[inline]
    fn release(&mut self, credit: CreditId, wakeups: &mut Wakeups) -> Result<Released, ()> {
        match self.window.release(credit) {
            Ok(Some((fresh, idx))) => {
                if let Some(slot) = self.waiters.get_mut(idx)
                    && let Waiter::Waiting { waker, .. } =
                        core::mem::replace(slot, Waiter::Granted(fresh))
                    && let Some(waker) = waker
                {
                    wakeups.push(waker);
                }
                Ok(Released::HandedOn)
            }
            Ok(None) if self.window.is_exhausted() && !self.window.is_closed() => Err(()),
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

    fn free_slot(&mut self, idx: usize) {
        let Some(slot) = self.waiters.get_mut(idx) else {
            return;
        };
        *slot = Waiter::Free;
        self.free.push(idx);
        // With no waiter left, forget the slots (keeping capacity).
        if self.free.len() == self.waiters.len() {
            self.waiters.clear();
            self.free.clear();
        }
    }

    /// Frees the slot of a finished waiter and returns what it held; a waiter still in line
    /// leaves it (O(1), in the window).
    fn take_waiter(&mut self, idx: usize) -> Waiter {
        let Some(slot) = self.waiters.get_mut(idx) else {
            return Waiter::Free;
        };
        let old = core::mem::replace(slot, Waiter::Free);
        if let Waiter::Waiting { ticket, .. } = &old {
            let _ = self.window.cancel(*ticket);
        }
        if !matches!(old, Waiter::Free) {
            self.free.push(idx);
        }
        if self.free.len() == self.waiters.len() {
            self.waiters.clear();
            self.free.clear();
        }
        old
    }

    /// Fails every waiter; credits handed to waiters that have not observed them go back.
    fn close(&mut self, wakeups: &mut Wakeups) {
        // Every waiter slot is visited below, so the window's list of them is not needed.
        self.window.close_with(|_, _| ());
        let mut handed = Vec::new();
        for slot in &mut self.waiters {
            match core::mem::replace(slot, Waiter::Closed) {
                Waiter::Free => *slot = Waiter::Free,
                Waiter::Waiting { waker, .. } => wakeups.extend(waker),
                Waiter::Granted(credit) => handed.push(credit),
                Waiter::Closed => {}
            }
        }
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
/// - No caller code runs under the lock except the key's `Hash`/`Eq`/`Clone`; wakers are
///   woken after the lock is dropped.
///
/// ```
/// use throttle_core::WindowConfig;
/// use throttle_core::sync::{Released, TryAcquireError, WindowHandle};
/// # use core::hash::BuildHasherDefault;
/// # #[derive(Default)] struct H(u64);
/// # impl core::hash::Hasher for H {
/// #     fn finish(&self) -> u64 { self.0 }
/// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
/// # }
/// let window: WindowHandle<u32, BuildHasherDefault<H>> =
///     WindowHandle::new(WindowConfig::default().with_max_in_flight(1)).unwrap();
/// let permit = window.try_acquire(7).unwrap();
/// assert_eq!(window.try_acquire(7).unwrap_err(), TryAcquireError::NoCredit);
/// assert_eq!(permit.complete(), Released::Freed); // nobody waited
/// assert_eq!(window.available(&7), 1);
/// ```
pub struct WindowHandle<Shard, S> {
    shared: Arc<Shared<Shard, S>>,
}

/// What a handle's clones, permits and futures share: the locked state, and a clone of the
/// window's hasher so that a shard key is hashed before the lock is taken, not under it.
struct Shared<Shard, S> {
    hasher: S,
    state: Mutex<WindowState<Shard, S>>,
}

impl<Shard, S> Shared<Shard, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// Fails every waiter and refuses later acquires; wakes the waiters after unlocking.
    fn close(&self) {
        let mut wakeups = Wakeups::new();
        lock(&self.state).close(&mut wakeups);
        wake_all(wakeups);
    }
}

/// How a [`Permit`] or an [`Acquire`] reaches the handle's state: by borrowing the handle
/// ([`WindowHandle::acquire`], [`WindowHandle::try_acquire`]: no reference count to touch), or
/// by owning a count of it ([`WindowHandle::acquire_owned`],
/// [`WindowHandle::try_acquire_owned`]: `'static`, so it can move into a spawned task).
enum Holder<'a, Shard, S> {
    Borrowed(&'a Shared<Shard, S>),
    Owned(Arc<Shared<Shard, S>>),
}

impl<Shard, S> Holder<'_, Shard, S> {
    #[inline]
    fn get(&self) -> &Shared<Shard, S> {
        match self {
            Holder::Borrowed(shared) => shared,
            Holder::Owned(shared) => shared,
        }
    }
}

impl<Shard, S> Clone for WindowHandle<Shard, S> {
    fn clone(&self) -> Self {
        WindowHandle {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Shard, S> fmt::Debug for WindowHandle<Shard, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowHandle").finish_non_exhaustive()
    }
}

impl<Shard, S> WindowHandle<Shard, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// A handle over a new window, hashing shard keys with `S::default()`.
    pub fn new(cfg: WindowConfig) -> Result<Self, ConfigError>
    where
        S: Default + Clone,
    {
        Self::with_hasher(cfg, S::default())
    }

    /// A handle over a new window, hashing shard keys with `hasher`.
    pub fn with_hasher(cfg: WindowConfig, hasher: S) -> Result<Self, ConfigError>
    where
        S: Clone,
    {
        let window = DispatchWindow::with_hasher(cfg, hasher.clone())?;
        Ok(WindowHandle {
            shared: Arc::new(Shared {
                state: Mutex::new(WindowState {
                    window,
                    waiters: Vec::new(),
                    free: Vec::new(),
                    #[cfg(test)]
                    stats: Stats::default(),
                }),
                hasher,
            }),
        })
    }

    /// Waits for a credit of `shard`: FIFO per shard, cancel-safe (see the type's contract).
    /// The permit borrows the handle; [`acquire_owned`](Self::acquire_owned) gives one that
    /// can outlive it.
    #[inline]
    pub fn acquire(&self, shard: Shard) -> Acquire<'_, Shard, S> {
        Acquire::new(Holder::Borrowed(&self.shared), shard)
    }

    /// As [`acquire`](Self::acquire), for a `'static` permit ([`OwnedPermit`]) that holds a
    /// reference count of the handle's state, e.g. to move into a spawned task.
    #[inline]
    pub fn acquire_owned(&self, shard: Shard) -> Acquire<'static, Shard, S>
    where
        Shard: 'static,
        S: 'static,
    {
        Acquire::new(Holder::Owned(Arc::clone(&self.shared)), shard)
    }

    /// A credit of `shard` now, if one is free and nobody waits for the shard. The permit
    /// borrows the handle; see [`try_acquire_owned`](Self::try_acquire_owned).
    #[inline]
    pub fn try_acquire(&self, shard: Shard) -> Result<Permit<'_, Shard, S>, TryAcquireError> {
        self.take_now(shard, || Holder::Borrowed(&self.shared))
    }

    /// As [`try_acquire`](Self::try_acquire), for a `'static` permit ([`OwnedPermit`]).
    #[inline]
    pub fn try_acquire_owned(&self, shard: Shard) -> Result<OwnedPermit<Shard, S>, TryAcquireError>
    where
        Shard: 'static,
        S: 'static,
    {
        self.take_now(shard, || Holder::Owned(Arc::clone(&self.shared)))
    }

    /// A credit now, held through the holder `hold` makes once the credit is issued.
    #[inline]
    fn take_now<'a>(
        &self,
        shard: Shard,
        hold: impl FnOnce() -> Holder<'a, Shard, S>,
    ) -> Result<Permit<'a, Shard, S>, TryAcquireError> {
        let hash = self.shared.hasher.hash_one(&shard);
        let issued = lock(&self.shared.state).try_issue(&shard, hash);
        match issued {
            Issue::Credit(credit) => Ok(Permit::new(hold(), shard, credit)),
            Issue::NoCredit => Err(TryAcquireError::NoCredit),
            Issue::Closed => Err(TryAcquireError::Closed),
            Issue::Exhausted => {
                self.close();
                Err(TryAcquireError::Closed)
            }
        }
    }

    /// Fails every waiter (their futures resolve to [`Closed`]) and refuses later acquires.
    /// Permits already held stay valid; releasing them frees their slots. Idempotent.
    pub fn close(&self) {
        self.shared.close();
    }

    /// Whether [`close`](Self::close) was called (or the window ran out of credit ids).
    pub fn is_closed(&self) -> bool {
        lock(&self.shared.state).window.is_closed()
    }

    /// Credits per shard.
    pub fn capacity(&self) -> u32 {
        lock(&self.shared.state).window.capacity()
    }

    /// Credits of `shard` held (by permits, or handed to waiters not yet woken).
    pub fn in_flight(&self, shard: &Shard) -> u32 {
        lock(&self.shared.state).window.in_flight(shard)
    }

    /// Free credits of `shard`. Never positive while waiters are in the shard's line.
    pub fn available(&self, shard: &Shard) -> u32 {
        lock(&self.shared.state).window.available(shard)
    }

    /// Waiters in `shard`'s line.
    pub fn waiting(&self, shard: &Shard) -> usize {
        lock(&self.shared.state).window.queued(shard)
    }

    #[cfg(test)]
    pub(crate) fn stats(&self) -> Stats {
        lock(&self.shared.state).stats
    }

    #[cfg(test)]
    pub(crate) fn live_credits(&self) -> usize {
        lock(&self.shared.state).window.live_credits()
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
pub struct Permit<'a, Shard, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    shared: Holder<'a, Shard, S>,
    shard: Shard,
    credit: CreditId,
    /// Cleared by the first release, so `complete` followed by `Drop` releases once.
    live: bool,
}

/// A [`Permit`] that owns a reference count of the handle's state: `'static`, so it can move
/// into a spawned task. See [`WindowHandle::acquire_owned`].
pub type OwnedPermit<Shard, S> = Permit<'static, Shard, S>;

impl<Shard, S> fmt::Debug for Permit<'_, Shard, S>
where
    Shard: Hash + Eq + Clone + fmt::Debug,
    S: BuildHasher,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("shard", &self.shard)
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
    fn new(shared: Holder<'a, Shard, S>, shard: Shard, credit: CreditId) -> Self {
        Permit {
            shared,
            shard,
            credit,
            live: true,
        }
    }

    /// The shard this credit belongs to.
    pub fn shard(&self) -> &Shard {
        &self.shard
    }

    /// The credit's id in the underlying window (unique for the window's life).
    pub fn credit(&self) -> CreditId {
        self.credit
    }

    /// Releases the credit: the shard's oldest waiter receives one in its place
    /// ([`Released::HandedOn`]), else the slot frees ([`Released::Freed`]).
    #[inline]
    pub fn complete(mut self) -> Released {
        self.release()
    }

    #[inline]
    fn release(&mut self) -> Released {
        if !core::mem::replace(&mut self.live, false) {
            return Released::Freed;
        }
        let mut st = lock(&self.shared.get().state);
        let mut wakeups = Wakeups::new();
        let released = st.release(self.credit, &mut wakeups);
        drop(st);
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
        let _ = self.release();
    }
}

#[derive(Clone, Copy)]
enum AcquireState {
    /// Not polled yet: not in line.
    Start,
    /// In line, in this waiter slot.
    Waiting(usize),
    /// Resolved; polling again returns `Pending` forever.
    Done,
}

/// The future of [`WindowHandle::acquire`] (`Acquire<'a, …>`, resolving to a `Permit<'a, …>`)
/// and of [`WindowHandle::acquire_owned`] (`Acquire<'static, …>`, resolving to an
/// [`OwnedPermit`]), or to [`Closed`].
///
/// It joins the shard's line when first polled. Dropping it at any point is safe: it leaves the
/// line, and a credit already handed to it passes to the next waiter.
#[must_use = "futures do nothing unless polled"]
pub struct Acquire<'a, Shard, S>
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
    fn new(shared: Holder<'a, Shard, S>, shard: Shard) -> Self {
        Acquire {
            hash: shared.get().hasher.hash_one(&shard),
            shared: Some(shared),
            shard: Some(shard),
            state: AcquireState::Start,
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

impl<Shard, S> fmt::Debug for Acquire<'_, Shard, S>
where
    Shard: Hash + Eq + Clone + fmt::Debug,
    S: BuildHasher,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquire")
            .field("shard", &self.shard)
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
        let mut st = lock(&shared.get().state);
        // `Err(true)`: the window just ran out of ids; close the handle before resolving.
        let outcome = match this.state {
            AcquireState::Start => match st.try_issue(shard, this.hash) {
                Issue::Credit(credit) => Ok(credit),
                Issue::Closed => Err(false),
                Issue::Exhausted => Err(true),
                // Checking for credit and joining the line happen under one lock, so a
                // release cannot slip in between and be missed.
                Issue::NoCredit => match st.enqueue(shard, this.hash, cx.waker()) {
                    Ok(idx) => {
                        this.state = AcquireState::Waiting(idx);
                        return Poll::Pending;
                    }
                    Err(Issue::Credit(credit)) => Ok(credit),
                    Err(Issue::Exhausted) => Err(true),
                    Err(_) => Err(false),
                },
            },
            AcquireState::Waiting(idx) => match st.waiters.get_mut(idx) {
                Some(Waiter::Waiting { waker, .. }) => {
                    if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        *waker = Some(cx.waker().clone());
                    }
                    return Poll::Pending;
                }
                _ => match st.take_waiter(idx) {
                    Waiter::Granted(credit) => Ok(credit),
                    _ => Err(false),
                },
            },
            AcquireState::Done => return Poll::Pending,
        };
        drop(st);
        if outcome == Err(true) {
            shared.get().close();
        }
        this.state = AcquireState::Done;
        // The key moves into the permit: no user `Clone` runs once the credit is ours.
        Poll::Ready(match (outcome, this.shared.take(), this.shard.take()) {
            (Ok(credit), Some(shared), Some(shard)) => Ok(Permit::new(shared, shard, credit)),
            // `shared` and `shard` were checked above; an error resolves without them.
            (Ok(_), _, _) | (Err(_), _, _) => Err(Closed),
        })
    }
}

impl<Shard, S> Drop for Acquire<'_, Shard, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    #[inline]
    fn drop(&mut self) {
        let (AcquireState::Waiting(idx), Some(shared)) = (self.state, self.shared.as_ref()) else {
            return;
        };
        self.state = AcquireState::Done;
        let mut wakeups = Wakeups::new();
        let mut exhausted = false;
        {
            let mut st = lock(&shared.get().state);
            // Still in line: it leaves it (the window cancels its ticket). Cancelled after a
            // credit was handed to it: the credit goes back, to the next waiter if any. No
            // user code runs here: the window names the shard by its stored hash.
            if let Waiter::Granted(credit) = st.take_waiter(idx) {
                exhausted = st.release(credit, &mut wakeups).is_err();
            }
        }
        if exhausted {
            shared.get().close();
        }
        wake_all(wakeups);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::test_support::{CountingWaker, Executor, WakeCount, poll_once};
    use crate::test_hasher::TestHasher;
    use alloc::vec;
    use std::sync::Mutex as StdMutex;

    type Handle = WindowHandle<u32, TestHasher>;

    fn handle(cap: u32) -> Handle {
        match Handle::new(WindowConfig::default().with_max_in_flight(cap)) {
            Ok(h) => h,
            Err(e) => panic!("valid config refused: {e}"),
        }
    }

    /// A hasher builder whose clones hash differently from the original (each clone gets the
    /// next seed): legal, if odd, so the handle must not trust its own clone's hashes.
    #[derive(Default)]
    struct DriftingHasher(u64);

    impl Clone for DriftingHasher {
        fn clone(&self) -> Self {
            DriftingHasher(self.0.wrapping_add(1))
        }
    }

    impl BuildHasher for DriftingHasher {
        type Hasher = crate::test_hasher::FnvHasher;
        fn build_hasher(&self) -> Self::Hasher {
            let mut h = crate::test_hasher::FnvHasher::default();
            core::hash::Hasher::write_u64(&mut h, self.0);
            h
        }
    }

    #[test]
    fn a_hint_that_finds_its_shard_is_not_trusted_after_the_table_grows() {
        // Keys whose two hashes (the handle's clone, the window's) share hashbrown's 7-bit tag:
        // in a small table the wrong hint still finds the entry. The credit must remember the
        // hash that placed the entry, or its release misses the shard once the table grows.
        let tag = |seed: u64, k: u32| DriftingHasher(seed).hash_one(k) >> 57;
        let keys: Vec<u32> = (0..100_000)
            .filter(|&k| tag(7, k) == tag(8, k))
            .take(8)
            .collect();
        assert_eq!(keys.len(), 8);
        for k in keys {
            let h: WindowHandle<u32, DriftingHasher> = match WindowHandle::with_hasher(
                WindowConfig::default().with_max_in_flight(1),
                DriftingHasher(7),
            ) {
                Ok(h) => h,
                Err(e) => panic!("valid config refused: {e}"),
            };
            drop(h.try_acquire(k).expect("free credit")); // the entry stays, idle
            let p = h.try_acquire(k).expect("free credit");
            // Forty more active shards: the table grows and every entry moves.
            let others: Vec<_> = (1_000_000..1_000_040)
                .map(|o| h.try_acquire(o).expect("free credit"))
                .collect();
            assert_eq!(p.complete(), Released::Freed);
            assert_eq!(h.in_flight(&k), 0, "key {k}: the release found its shard");
            let again = h.try_acquire(k).expect("the credit is free again");
            drop(again);
            drop(others);
            assert_eq!(h.live_credits(), 0);
            assert_eq!(lock(&h.shared.state).window.shard_count(), 0);
        }
    }

    #[test]
    fn running_out_of_credit_ids_closes_the_handle_on_every_path() {
        let (waker, count) = CountingWaker::new();
        let spend_ids = |h: &Handle| lock(&h.shared.state).window.skip_generations_to(u64::MAX);

        // A release that would hand a fresh credit to a waiter finds no id left.
        let h = handle(1);
        let p = h.try_acquire(1).expect("free credit");
        let mut waiter = h.acquire(1);
        assert!(poll_once(&mut waiter, &waker).is_pending());
        spend_ids(&h);
        assert_eq!(p.complete(), Released::Freed);
        assert_eq!(count.wakes(), 1, "the failed waiter is woken");
        assert!(matches!(
            poll_once(&mut waiter, &waker),
            Poll::Ready(Err(Closed))
        ));
        assert!(h.is_closed());
        assert_eq!(h.live_credits(), 0);

        // try_acquire finds no id left.
        let h = handle(1);
        let mut other = h.acquire(2); // made before, first polled after the close
        let held = h.try_acquire(3).expect("free credit");
        let mut queued = h.acquire(3);
        assert!(poll_once(&mut queued, &waker).is_pending());
        spend_ids(&h);
        assert_eq!(h.try_acquire(4).unwrap_err(), TryAcquireError::Closed);
        assert!(h.is_closed());
        assert!(matches!(
            poll_once(&mut queued, &waker),
            Poll::Ready(Err(Closed))
        ));
        assert!(matches!(
            poll_once(&mut other, &waker),
            Poll::Ready(Err(Closed))
        ));
        drop(held);

        // The first poll of an acquire finds no id left.
        let h = handle(1);
        let held = h.try_acquire(5).expect("free credit");
        let mut queued = h.acquire(5);
        assert!(poll_once(&mut queued, &waker).is_pending());
        spend_ids(&h);
        let mut fresh = h.acquire(6);
        assert!(matches!(
            poll_once(&mut fresh, &waker),
            Poll::Ready(Err(Closed))
        ));
        assert!(h.is_closed());
        assert!(matches!(
            poll_once(&mut queued, &waker),
            Poll::Ready(Err(Closed))
        ));
        assert_eq!(held.complete(), Released::Freed);
        assert_eq!(h.live_credits(), 0);
        assert_eq!(h.stats().refused_releases, 0);
    }

    #[test]
    fn borrowed_permits_release_exactly_once_and_hand_off_like_owned_ones() {
        let h = handle(2);
        // complete, then the drop that follows: one release.
        let a = h.try_acquire(1).expect("free credit");
        assert_eq!(a.complete(), Released::Freed);
        // dropping releases too.
        let b = h.try_acquire(1).expect("free credit");
        drop(b);
        assert_eq!(h.available(&1), 2);

        // Borrowed and owned permits share the shard's credits.
        let c = h.try_acquire(1).expect("free credit");
        let d = h.try_acquire_owned(1).expect("free credit");
        assert_eq!(h.try_acquire(1).unwrap_err(), TryAcquireError::NoCredit);

        // A borrowed waiter is served in line, before a newcomer, and resolves to a permit.
        let (waker, count) = CountingWaker::new();
        let mut first = h.acquire(1);
        let mut second = h.acquire(1);
        assert!(poll_once(&mut first, &waker).is_pending());
        assert!(poll_once(&mut second, &waker).is_pending());
        assert_eq!(h.waiting(&1), 2);
        assert_eq!(c.complete(), Released::HandedOn);
        assert_eq!(count.wakes(), 1);
        let Poll::Ready(Ok(e)) = poll_once(&mut first, &waker) else {
            panic!("the first waiter is served first");
        };
        // Cancelled after its credit was handed over, the second waiter passes it on.
        drop(d);
        assert_eq!(h.waiting(&1), 0);
        drop(second);
        assert_eq!(
            h.in_flight(&1),
            1,
            "the cancelled waiter's credit went back"
        );
        assert_eq!(e.complete(), Released::Freed);
        assert_eq!(h.available(&1), 2);
        assert_eq!(h.live_credits(), 0);
        assert_eq!(h.stats().refused_releases, 0);
    }

    #[test]
    fn a_hasher_clone_that_hashes_differently_costs_a_lookup_not_a_second_window() {
        // The handle hashes with the original, the window with a clone: every hint is wrong.
        let h: WindowHandle<u32, DriftingHasher> = match WindowHandle::with_hasher(
            WindowConfig::default().with_max_in_flight(2),
            DriftingHasher(7),
        ) {
            Ok(h) => h,
            Err(e) => panic!("valid config refused: {e}"),
        };
        let a = h.try_acquire(5).expect("first credit");
        let b = h.try_acquire(5).expect("second credit");
        // A second entry for shard 5 would have handed out a third credit here.
        assert_eq!(h.try_acquire(5).unwrap_err(), TryAcquireError::NoCredit);
        assert_eq!(h.in_flight(&5), 2);
        assert_eq!(lock(&h.shared.state).window.tracked_shards(), 1);
        // The hand-off to a waiter goes through the same hint.
        let (waker, _count) = CountingWaker::new();
        let mut waiter = h.acquire(5);
        assert!(poll_once(&mut waiter, &waker).is_pending());
        assert_eq!(a.complete(), Released::HandedOn);
        assert_eq!(h.try_acquire(5).unwrap_err(), TryAcquireError::NoCredit);
        let Poll::Ready(Ok(again)) = poll_once(&mut waiter, &waker) else {
            panic!("the handed-on credit resolves the waiter");
        };
        assert_eq!(h.in_flight(&5), 2);
        let _ = b.complete();
        let _ = again.complete();
        assert_eq!(h.available(&5), 2);
        assert_eq!(h.live_credits(), 0);
    }

    /// A future polled by hand, with its own counting waker.
    struct Polled {
        fut: Acquire<'static, u32, TestHasher>,
        waker: Waker,
        count: WakeCount,
    }

    impl Polled {
        fn new(h: &Handle, shard: u32) -> Self {
            let (waker, count) = CountingWaker::new();
            Polled {
                fut: h.acquire_owned(shard),
                waker,
                count,
            }
        }
        fn poll(&mut self) -> Poll<Result<OwnedPermit<u32, TestHasher>, Closed>> {
            poll_once(&mut self.fut, &self.waker)
        }
        fn permit(&mut self) -> OwnedPermit<u32, TestHasher> {
            match self.poll() {
                Poll::Ready(Ok(p)) => p,
                Poll::Ready(Err(e)) => panic!("expected a permit, got {e}"),
                Poll::Pending => panic!("expected a permit, still pending"),
            }
        }
    }

    fn check_conserved(h: &Handle, shard: u32) {
        assert_eq!(h.in_flight(&shard) + h.available(&shard), h.capacity());
        assert!(h.available(&shard) == 0 || h.waiting(&shard) == 0);
        assert_eq!(h.stats().refused_releases, 0);
    }

    #[test]
    fn five_submitters_on_a_window_of_two_are_served_in_arrival_order() {
        let h = handle(2);
        let mut w: vec::Vec<Polled> = (0..5).map(|_| Polled::new(&h, 1)).collect();
        let mut held = vec::Vec::new();
        for (i, p) in w.iter_mut().enumerate() {
            match p.poll() {
                Poll::Ready(Ok(permit)) => held.push((i, permit)),
                Poll::Pending => {}
                Poll::Ready(Err(e)) => panic!("{e}"),
            }
        }
        assert_eq!(
            held.iter().map(|(i, _)| *i).collect::<vec::Vec<_>>(),
            [0, 1]
        );
        assert_eq!(h.waiting(&1), 3);
        let mut served = vec![0, 1];
        while !held.is_empty() {
            let (_, permit) = held.remove(0);
            let before: vec::Vec<usize> = w.iter().map(|p| p.count.wakes()).collect();
            let released = permit.complete();
            let woken: vec::Vec<usize> =
                (0..5).filter(|&i| w[i].count.wakes() > before[i]).collect();
            check_conserved(&h, 1);
            match woken.as_slice() {
                [] => assert_eq!(released, Released::Freed),
                [i] => {
                    assert_eq!(released, Released::HandedOn);
                    assert_eq!(*i, served.len(), "the oldest waiter is woken, and only it");
                    served.push(*i);
                    let permit = w[*i].permit();
                    held.push((*i, permit));
                }
                more => panic!("one release woke {more:?}"),
            }
            assert!(h.stats().peak_in_flight <= 2);
        }
        assert_eq!(served, [0, 1, 2, 3, 4]);
        assert_eq!((h.in_flight(&1), h.live_credits()), (0, 0));
    }

    #[test]
    fn spawned_submitters_complete_in_fifo_order_on_the_test_executor() {
        let h = handle(2);
        let log = std::sync::Arc::new(StdMutex::new(vec::Vec::new()));
        let mut ex = Executor::default();
        for i in 0..5u32 {
            let (h, log) = (h.clone(), std::sync::Arc::clone(&log));
            ex.spawn(async move {
                let Ok(permit) = h.acquire_owned(1).await else {
                    return;
                };
                if let Ok(mut l) = log.lock() {
                    l.push(i);
                }
                YieldOnce(false).await; // hold the credit across a suspension
                let _ = permit.complete();
            });
        }
        assert_eq!(ex.run_until_stalled(), 0, "every task finished");
        assert_eq!(
            log.lock().map(|l| l.clone()).unwrap_or_default(),
            [0, 1, 2, 3, 4]
        );
        assert!(h.stats().peak_in_flight <= 2);
        assert_eq!(h.live_credits(), 0);
    }

    /// Pending once (waking itself), then ready.
    struct YieldOnce(bool);
    impl Future for YieldOnce {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                return Poll::Ready(());
            }
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[test]
    fn cancelled_waiter_leaves_the_line_and_the_next_one_is_served() {
        let h = handle(1);
        let first = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
        let mut a = Polled::new(&h, 1);
        let mut b = Polled::new(&h, 1);
        assert!(a.poll().is_pending() && b.poll().is_pending());
        drop(a);
        assert_eq!(h.waiting(&1), 1);
        assert_eq!(first.complete(), Released::HandedOn);
        assert_eq!(b.count.wakes(), 1);
        let permit = b.permit();
        assert_eq!(permit.shard(), &1);
        check_conserved(&h, 1);
        drop(permit);
        assert_eq!(h.live_credits(), 0);
    }

    #[test]
    fn waiter_dropped_after_credit_was_handed_to_it_passes_the_credit_on() {
        let h = handle(1);
        let first = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
        let mut a = Polled::new(&h, 1);
        let mut b = Polled::new(&h, 1);
        assert!(a.poll().is_pending() && b.poll().is_pending());
        assert_eq!(first.complete(), Released::HandedOn); // to `a`, which never looks
        assert_eq!((a.count.wakes(), b.count.wakes()), (1, 0));
        drop(a);
        assert_eq!(b.count.wakes(), 1, "the credit moved on to b");
        let permit = b.permit();
        assert_eq!(h.in_flight(&1), 1, "one credit: not lost, not duplicated");
        check_conserved(&h, 1);
        drop(permit);
        assert_eq!(h.live_credits(), 0);
    }

    #[test]
    fn close_fails_waiters_and_later_acquires_and_held_permits_still_release_once() {
        let h = handle(1);
        let held = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
        let mut a = Polled::new(&h, 1);
        let mut b = Polled::new(&h, 2);
        let mut c = Polled::new(&h, 1);
        assert!(a.poll().is_pending());
        let b_permit = b.permit();
        assert!(c.poll().is_pending());
        assert_eq!(b_permit.complete(), Released::Freed);
        // Hand a credit to `a` that it has not observed; close must take it back.
        assert_eq!(held.complete(), Released::HandedOn);
        h.close();
        assert!(h.is_closed());
        assert_eq!(c.count.wakes(), 1, "close wakes the waiters");
        assert!(matches!(a.poll(), Poll::Ready(Err(Closed))));
        assert!(matches!(c.poll(), Poll::Ready(Err(Closed))));
        assert!(matches!(
            Polled::new(&h, 1).poll(),
            Poll::Ready(Err(Closed))
        ));
        assert_eq!(h.try_acquire(3).unwrap_err(), TryAcquireError::Closed);
        assert_eq!((h.live_credits(), h.in_flight(&1)), (0, 0));
        assert_eq!(h.stats().refused_releases, 0);
    }

    #[test]
    fn permit_held_across_close_releases_exactly_once() {
        let h = handle(2);
        let p = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
        let q = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
        h.close();
        h.close(); // idempotent
        assert_eq!(h.live_credits(), 2);
        assert_eq!(p.complete(), Released::Freed);
        drop(q);
        assert_eq!(h.live_credits(), 0);
        assert_eq!(
            h.stats().refused_releases,
            0,
            "complete + Drop released once"
        );
    }

    #[test]
    fn try_acquire_never_barges_past_a_waiter() {
        let h = handle(1);
        let first = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
        let mut a = Polled::new(&h, 1);
        assert!(a.poll().is_pending());
        assert_eq!(first.complete(), Released::HandedOn);
        assert_eq!(h.try_acquire(1).unwrap_err(), TryAcquireError::NoCredit);
        let permit = a.permit();
        drop(permit);
        assert!(
            h.try_acquire(1).is_ok(),
            "free again once the line is empty"
        );
    }

    #[test]
    fn an_exhausted_shard_never_delays_another() {
        let h = handle(1);
        let _p1 = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
        let mut w1 = Polled::new(&h, 1);
        assert!(w1.poll().is_pending());
        let p2 = Polled::new(&h, 2).permit();
        assert_eq!(
            p2.complete(),
            Released::Freed,
            "shard 2's release never serves shard 1"
        );
        assert_eq!(w1.count.wakes(), 0);
    }

    #[test]
    fn the_latest_waker_is_the_one_woken() {
        let h = handle(1);
        let first = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
        let mut a = Polled::new(&h, 1);
        assert!(a.poll().is_pending());
        let (other, other_count) = CountingWaker::new();
        assert!(poll_once(&mut a.fut, &other).is_pending());
        let _ = first.complete();
        assert_eq!((a.count.wakes(), other_count.wakes()), (0, 1));
        assert!(poll_once(&mut a.fut, &other).is_ready());
        assert!(
            poll_once(&mut a.fut, &other).is_pending(),
            "done: stays pending"
        );
    }

    #[test]
    fn idle_handle_keeps_no_waiter_state() {
        let h = handle(1);
        let first = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
        let mut ws: vec::Vec<Polled> = (0..100).map(|i| Polled::new(&h, i % 3)).collect();
        for w in &mut ws {
            let _ = w.poll();
        }
        drop(ws);
        drop(first);
        let st = lock(&h.shared.state);
        assert_eq!(
            (st.window.queued(&1), st.waiters.len(), st.free.len()),
            (0, 0, 0)
        );
        assert_eq!(st.window.live_credits(), 0);
    }
}
