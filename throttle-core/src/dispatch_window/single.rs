//! [`SingleWindow`]: the window of one shard, for a client that keeps one object per shard.

use alloc::vec::Vec;
use core::num::NonZeroUsize;

use super::shard::{Books, Entered, Mode, ShardWindow};
use super::{CreditId, Dispatch, SubmitError, Submitted, Ticket, WindowConfig, WindowEvent};
use crate::error::{ConfigError, ReleaseError};
use crate::event::EventQueue;
use crate::time::Instant;

/// The dispatch window of one shard: at most `max_in_flight` batches outstanding, with
/// exactly-once credit release, FIFO hold-back of the batches that find no credit, one parked
/// open batch, O(1) cancel of a queued batch by [`Ticket`], a close that fails held-back work
/// and a drain that sends it.
///
/// For a client that already keeps one object per shard (Oxia's shard manager, a per-partition
/// sender): it has no key, no hasher and no map, so no call hashes anything and none runs user
/// code. Its rules are those of one shard of a [`DispatchWindow`](super::DispatchWindow), and
/// not a copy: both types run the same per-shard core, so every answer here is the answer the
/// multi-shard window gives for a single shard. Outputs are the multi-shard window's types
/// with the shard `()`: a [`Dispatch<(), B>`](Dispatch) (send `batch`, then complete `credit`
/// exactly once) and [`Submitted<(), B>`](Submitted).
///
/// # Driving contract
///
/// - Inputs: [`submit`](Self::submit) / [`enqueue`](Self::enqueue) (a full batch),
///   [`submit_or_park`](Self::submit_or_park) (the open batch), [`reclaim`](Self::reclaim),
///   [`cancel`](Self::cancel), [`complete`](Self::complete) (once per credit, when the batch's
///   RPC ends for any reason), [`drain`](Self::drain) (close for sending) and
///   [`close`](Self::close) (close failing held-back work).
/// - Outputs: each input that may send returns the [`Dispatch`]; send it after the call returns.
/// - Maintenance: when [`poll_timeout`](Self::poll_timeout) returns a deadline, call
///   [`handle_timeout(now)`](Self::handle_timeout) once it has passed; it only gives memory
///   back (a burst's queue buffer and id slots). Credits never expire.
///
/// Ids never wrap: once spent, new batches are refused with [`SubmitError::Exhausted`] while
/// issued credits still complete. Another window's credits and tickets are refused as
/// [`ReleaseError::Unknown`].
///
/// ```
/// use throttle_sansio::dispatch_window::{SingleWindow, SubmitError, Submitted};
/// use core::num::NonZeroUsize;
///
/// let mut w = SingleWindow::limited(NonZeroUsize::MIN); // one batch in flight
/// let first = w.submit("a").unwrap().expect("credit available: sent at once");
/// assert_eq!(w.submit("b").unwrap(), None); // no credit: queued
/// let Submitted::Queued(ticket) = w.enqueue("c").unwrap() else { unreachable!() };
/// assert_eq!(w.cancel(ticket), Ok("c")); // withdrawn before it left
/// assert_eq!(w.submit_or_park("open").unwrap(), None); // the open batch waits, parked
/// let next = w.complete(first.credit).unwrap().expect("the release sends the queued batch");
/// assert_eq!(next.batch, "b");
/// assert!(w.complete(first.credit).is_err()); // a second release changes nothing
/// w.drain(); // refuse new batches, keep sending the held ones
/// assert_eq!(w.submit("late"), Err(SubmitError::Closed("late")));
/// let last = w.complete(next.credit).unwrap().expect("the parked batch leaves too");
/// assert_eq!(last.batch, "open");
/// assert_eq!(w.complete(last.credit), Ok(None));
/// assert!(w.is_drained());
/// ```
#[derive(Clone, Debug)]
pub struct SingleWindow<B> {
    cap: u32,
    w: ShardWindow<B>,
    books: Books<B, ()>,
    /// Observations, off until [`Self::set_event_capacity`].
    events: EventQueue<WindowEvent<()>>,
}

impl<B> Default for SingleWindow<B> {
    /// A window of the default config (4 batches in flight).
    fn default() -> Self {
        Self::valid(WindowConfig::default())
    }
}

impl<B> SingleWindow<B> {
    /// A window of `cfg`; refused if `cfg` is invalid (`max_in_flight` 0).
    pub fn new(cfg: WindowConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Self::valid(cfg))
    }

    /// A window of at most `max_in_flight` batches in flight. Infallible: the limit cannot be
    /// zero (above `u32::MAX` it is clamped, see [`WindowConfig::with_max_in_flight`]).
    pub fn limited(max_in_flight: NonZeroUsize) -> Self {
        Self::valid(WindowConfig::new(max_in_flight))
    }

    fn valid(cfg: WindowConfig) -> Self {
        SingleWindow {
            cap: cfg.cap(),
            w: ShardWindow::with_in_flight(0),
            books: Books::new(),
            events: EventQueue::new(),
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

    /// Sends a full batch at once if a credit is free and nothing is held back, else queues it
    /// behind the older held-back batches (FIFO). `Ok(None)` means queued.
    pub fn submit(&mut self, batch: B) -> Result<Option<Dispatch<(), B>>, SubmitError<B>> {
        Ok(match self.enter(batch)? {
            Entered::Credit(credit, batch) => Some(self.sent(credit, batch)),
            Entered::Queued(_) => None,
        })
    }

    /// As [`submit`](Self::submit), and a queued batch's [`Ticket`] is returned, so that it
    /// can be withdrawn with [`cancel`](Self::cancel).
    pub fn enqueue(&mut self, batch: B) -> Result<Submitted<(), B>, SubmitError<B>> {
        Ok(match self.enter(batch)? {
            Entered::Credit(credit, batch) => Submitted::Sent(self.sent(credit, batch)),
            Entered::Queued(ticket) => Submitted::Queued(ticket),
        })
    }

    fn enter(&mut self, batch: B) -> Result<Entered<B>, SubmitError<B>> {
        let cap = self.cap_now();
        self.books.enter(&mut self.w, (), batch, cap)
    }

    /// Sends the open batch at once if a credit is free and nothing is held back, else parks
    /// it, where it can be [`reclaim`](Self::reclaim)ed to keep growing. `Ok(None)` means
    /// parked. A second parked batch is refused with [`SubmitError::AlreadyParked`].
    pub fn submit_or_park(&mut self, batch: B) -> Result<Option<Dispatch<(), B>>, SubmitError<B>> {
        let cap = self.cap_now();
        let got = self.books.park_or_send(&mut self.w, (), cap, batch)?;
        Ok(got.map(|(credit, batch)| self.sent(credit, batch)))
    }

    /// Takes the parked batch back (to add operations to it), if there is one.
    pub fn reclaim(&mut self) -> Option<B> {
        self.books.reclaim(&mut self.w)
    }

    /// Withdraws a queued batch before it was dispatched and hands it back, in O(1). A ticket
    /// whose batch was already dispatched, withdrawn or handed out by [`close`](Self::close)
    /// is refused with [`ReleaseError::AlreadyReleased`], another window's with
    /// [`ReleaseError::Unknown`]; either way nothing changes.
    pub fn cancel(&mut self, ticket: Ticket) -> Result<B, ReleaseError> {
        let held = self.books.withdraw(ticket)?;
        self.books.withdrawn(&mut self.w);
        Ok(held.batch)
    }

    /// Releases `credit` exactly once and returns the next batch to send: the oldest queued
    /// one, else the parked one, else nothing. Call it once per dispatched batch when its RPC
    /// ends, whatever the outcome.
    ///
    /// An unknown or already-released credit is an `Err` and changes nothing. While
    /// [`drain`](Self::drain)ing, held-back batches keep leaving; after
    /// [`close`](Self::close) a live credit is still released (`Ok(None)`) and nothing is
    /// sent. Once the window can issue no new credit id, the next batch stays held back
    /// (collect it with `close`).
    pub fn complete(&mut self, credit: CreditId) -> Result<Option<Dispatch<(), B>>, ReleaseError> {
        self.books.credits.remove(credit.0)?;
        let cap = self.cap_now();
        let next = self.books.hand_on(&mut self.w, (), cap);
        let in_flight = self.w.in_flight;
        self.events
            .emit(|| WindowEvent::Released { credit, in_flight });
        Ok(next.map(|(credit, batch)| self.sent(credit, batch)))
    }

    /// Pauses the shard: until [`resume`](Self::resume) no credit is granted and a release
    /// hands nothing on; new batches are accepted and wait in arrival order (full ones
    /// queued, the open one parked). As [`DispatchWindow::pause`](super::DispatchWindow::pause)
    /// (same rules, same code); this window has no map, so a pause costs no memory.
    ///
    /// ```
    /// use throttle_sansio::dispatch_window::SingleWindow;
    /// use throttle_sansio::Instant;
    ///
    /// let mut w = SingleWindow::default(); // 4 in flight
    /// w.pause();
    /// assert_eq!(w.submit("a").unwrap(), None, "paused: queued");
    /// assert_eq!(w.submit_or_park("open").unwrap(), None, "paused: parked");
    /// let sent: Vec<_> = w.resume(Instant::ZERO).into_iter().map(|d| d.batch).collect();
    /// assert_eq!(sent, ["a", "open"]);
    /// ```
    pub fn pause(&mut self) {
        self.books.pause(&mut self.w);
    }

    /// Ends a pause and returns the batches to send now: the held-back ones oldest first
    /// (queued, then parked), as many as there are free credits. As
    /// [`DispatchWindow::resume`](super::DispatchWindow::resume).
    pub fn resume(&mut self, now: Instant) -> Vec<Dispatch<(), B>> {
        let cap = self.cap_now();
        let n = self.books.resumable(&self.w, cap);
        let mut out = Vec::with_capacity(n);
        self.books.observe(now);
        let events = &mut self.events;
        self.books.resume(&mut self.w, (), cap, n, |credit, batch| {
            events.emit(|| WindowEvent::Dispatched { shard: (), credit });
            out.push(sent(credit, batch));
        });
        out
    }

    /// Whether the shard is paused (a [`close`](Self::close) ends the pause).
    pub fn is_paused(&self) -> bool {
        self.w.paused
    }

    /// Closes the window for sending: new batches are refused with [`SubmitError::Closed`],
    /// held-back ones keep leaving, queued first then parked, as credits complete. As
    /// [`DispatchWindow::drain`](super::DispatchWindow::drain).
    pub fn drain(&mut self) {
        self.books.drain();
    }

    /// Closes the window and returns every held-back batch (queued in line order, then the
    /// parked one); none was dispatched. Batches in flight are untouched: complete their
    /// credits as usual (`Ok(None)`). Later submits are refused with [`SubmitError::Closed`].
    /// Idempotent; also ends a [`drain`](Self::drain), returning what it had not sent yet.
    pub fn close(&mut self) -> Vec<B> {
        let mut out = Vec::with_capacity(self.w.held_count());
        self.books.close();
        self.books.close_shard(&mut self.w, |batch| out.push(batch));
        self.books.closed();
        out
    }

    /// Maintenance: gives memory back (the line buffer of a past burst, id slots), once at
    /// most per [`MAINTENANCE_INTERVAL`](super::MAINTENANCE_INTERVAL), by the same rule as
    /// [`DispatchWindow::handle_timeout`](super::DispatchWindow::handle_timeout).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.books.begin_maintenance(now) {
            self.books.shrink();
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next run, or `None` while it has
    /// nothing to give back.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.books.maintenance.deadline()
    }

    /// Batches allowed in flight now: the limit set by
    /// [`set_max_in_flight`](Self::set_max_in_flight), else the configured one.
    pub fn capacity(&self) -> u32 {
        self.cap_now()
    }

    /// The capacity now: the shard's own limit, else the configured one.
    #[inline]
    fn cap_now(&self) -> u32 {
        self.w.cap(self.cap)
    }

    /// Changes the limit at run time: `Some(n)` allows `n` batches in flight from now on
    /// (clamped to `u32::MAX`), `None` goes back to the configured limit. Returns the batches
    /// a larger limit sends now: the held-back ones oldest first (queued, then parked), as
    /// many as there are free credits, each under a fresh credit (none while paused). A
    /// smaller limit revokes nothing: the credits in flight stay valid, and each release
    /// retires its credit (sends nothing) until fewer than the new limit are in flight. As
    /// [`DispatchWindow::set_max_in_flight`](super::DispatchWindow::set_max_in_flight)
    /// (same rules, same code). Does nothing after [`close`](Self::close), which also ends
    /// the limit set here.
    ///
    /// ```
    /// use core::num::NonZeroUsize;
    /// use throttle_sansio::dispatch_window::SingleWindow;
    ///
    /// let mut w = SingleWindow::limited(NonZeroUsize::new(2).unwrap());
    /// let a = w.submit("a").unwrap().unwrap();
    /// let b = w.submit("b").unwrap().unwrap();
    /// assert_eq!(w.submit("c").unwrap(), None, "two in flight: queued");
    /// assert!(w.set_max_in_flight(NonZeroUsize::new(1)).is_empty(), "a shrink sends nothing");
    /// assert_eq!((w.in_flight(), w.available()), (2, 0));
    /// assert_eq!(w.complete(a.credit).unwrap(), None, "retired: still one in flight");
    /// let grown = w.set_max_in_flight(NonZeroUsize::new(3));
    /// assert_eq!(grown.iter().map(|d| d.batch).collect::<Vec<_>>(), ["c"]);
    /// assert_eq!((w.in_flight(), w.available()), (2, 1));
    /// # let _ = b;
    /// ```
    pub fn set_max_in_flight(&mut self, limit: Option<NonZeroUsize>) -> Vec<Dispatch<(), B>> {
        if self.books.mode == Mode::Closed {
            return Vec::new();
        }
        let limit = super::limit_of(limit);
        let cap = self.w.cap_for(limit, self.cap);
        let n = self.books.grantable(&self.w, cap);
        let mut out = Vec::with_capacity(n);
        let events = &mut self.events;
        self.books
            .set_limit(&mut self.w, (), limit, cap, n, |credit, batch| {
                events.emit(|| WindowEvent::Dispatched { shard: (), credit });
                out.push(sent(credit, batch));
            });
        out
    }

    /// Batches in flight (holding a credit).
    pub fn in_flight(&self) -> u32 {
        self.w.in_flight
    }

    /// Credits not in use: `capacity() - in_flight()`, floored at 0.
    pub fn available(&self) -> u32 {
        self.cap_now().saturating_sub(self.w.in_flight)
    }

    /// Full batches waiting for credit (cancelled ones not counted).
    pub fn queued(&self) -> usize {
        self.w.queued
    }

    /// Whether `ticket`'s batch is still queued (not dispatched, withdrawn or failed).
    pub fn is_queued(&self, ticket: Ticket) -> bool {
        self.books.held.get(ticket.0).is_some()
    }

    /// Whether an open batch is parked.
    pub fn is_parked(&self) -> bool {
        self.w.parked.is_some()
    }

    /// The parked open batch, if any.
    pub fn parked(&self) -> Option<&B> {
        self.w.parked.as_ref()
    }

    /// Whether nothing is in flight, queued or parked.
    pub fn is_idle(&self) -> bool {
        self.w.is_idle()
    }

    /// Credits live (the same as [`in_flight`](Self::in_flight), as a `usize`).
    pub fn live_credits(&self) -> usize {
        self.books.credits.live()
    }

    /// Whether new batches are refused: after [`close`](Self::close) or
    /// [`drain`](Self::drain).
    pub fn is_closed(&self) -> bool {
        self.books.refuses()
    }

    /// Whether [`drain`](Self::drain) was called and [`close`](Self::close) was not since.
    pub fn is_draining(&self) -> bool {
        self.books.mode == Mode::Draining
    }

    /// Whether the window was closed or drained and nothing is left in flight, queued or
    /// parked.
    pub fn is_drained(&self) -> bool {
        self.books.refuses() && self.w.is_idle()
    }

    /// Whether the window can issue no new credit or ticket id (see
    /// [`Exhausted`](super::Exhausted)).
    pub fn is_exhausted(&self) -> bool {
        !self.books.credits.can_issue()
    }

    /// Shards with anything in flight, queued or parked: 0 or 1 (the books' own count, which
    /// the model checks against [`Self::is_idle`]).
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn shard_count(&self) -> usize {
        self.books.active
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

impl<B> SingleWindow<B> {
    /// The oldest undrained observation, if events are on ([`Self::set_event_capacity`]).
    pub fn poll_event(&mut self) -> Option<WindowEvent<()>> {
        self.events.pop()
    }

    /// Record up to `capacity` undrained events (0, the default, turns them off). See
    /// [`crate::event`].
    pub fn set_event_capacity(&mut self, capacity: usize) {
        self.events.set_capacity(capacity);
    }

    /// Events lost to a full queue (or discarded by turning events off) so far.
    pub fn events_dropped(&self) -> u64 {
        self.events.dropped()
    }

    /// The dispatch of `batch` under `credit`, recorded as an event (when on).
    #[inline]
    fn sent(&mut self, credit: CreditId, batch: B) -> Dispatch<(), B> {
        self.events
            .emit(|| WindowEvent::Dispatched { shard: (), credit });
        sent(credit, batch)
    }
}

#[inline]
fn sent<B>(credit: CreditId, batch: B) -> Dispatch<(), B> {
    Dispatch {
        shard: (),
        credit,
        batch,
    }
}

#[cfg(test)]
mod tests;
