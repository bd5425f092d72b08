//! The rules of one shard's window, shared by [`DispatchWindow`](super::DispatchWindow) (a map
//! of shards over this core) and [`SingleWindow`](super::SingleWindow) (one of it).
//!
//! A shard's state is a [`ShardWindow`]; everything beside it that the shards of one window
//! share (the credit and ticket slabs, the pool of line buffers, the open / draining / closed
//! mode, maintenance) is the [`Books`]. Every rule (who gets a credit, who waits, what a
//! release hands on, what closing and draining do, when a shard is idle) is a method here, so
//! both window types run the same code. `P` is what a credit or a held batch remembers of its
//! shard: the multi-shard window's map place, or `()` for the single-shard window.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use super::{CreditId, SubmitError, Take};
use crate::error::ReleaseError;
use crate::maintenance::{Maintenance, Peak};
use crate::slab::{Exhausted, Key, Slab, Ticket};
use crate::time::{Clock, Instant};

/// What a shard's window holds. Once all three are empty the shard is idle: the entry stays in
/// the map (so the next batch for the shard finds it without an insert) until maintenance or
/// a growing map evicts it.
#[derive(Clone, Debug, Default)]
pub(super) struct ShardWindow<B> {
    pub(super) in_flight: u32,
    /// The shard's waiting line: tickets of its held-back full batches in arrival order, plus
    /// tombstones (tickets cancelled while waiting, recognised by no longer being live in the
    /// window's `held` slab). Cancelling only frees the ticket, so it is O(1); tombstones are
    /// dropped when they reach the head, or all at once when they outnumber the live entries.
    pub(super) line: VecDeque<Key>,
    /// Live (non-tombstone) entries of `line`.
    pub(super) queued: usize,
    pub(super) parked: Option<B>,
    /// `line` is one of the window's pooled buffers (counted in `queues_held`), taken when the
    /// shard first had to queue; it goes back to the pool when the shard idles.
    owns_queue: bool,
    /// Paused ([`Books::pause`]): no credit is granted and nothing is handed on until
    /// [`Books::resume`]; new batches queue (or park) as if the shard had no credit.
    pub(super) paused: bool,
    /// The shard's own limit set at run time ([`Books::set_limit`]), or 0 for the window's
    /// configured one. A shard with its own limit is never evicted while idle (the limit
    /// would be lost).
    pub(super) limit: u32,
}

impl<B> ShardWindow<B> {
    /// A shard's window holding `in_flight` credits and nothing else.
    pub(super) fn with_in_flight(in_flight: u32) -> Self {
        ShardWindow {
            in_flight,
            line: VecDeque::new(),
            queued: 0,
            parked: None,
            owns_queue: false,
            paused: false,
            limit: 0,
        }
    }

    /// The shard's capacity: its own limit, else `default` (the window's configured one).
    #[inline(always)]
    pub(super) fn cap(&self, default: u32) -> u32 {
        self.cap_for(self.limit, default)
    }

    /// The capacity the shard would have with its own limit `limit` (0: none).
    #[inline]
    pub(super) fn cap_for(&self, limit: u32, default: u32) -> u32 {
        if limit == 0 { default } else { limit }
    }

    pub(super) fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.queued == 0 && self.parked.is_none()
    }

    /// Whether a batch is held back (queued or parked).
    #[inline]
    pub(super) fn holds_back(&self) -> bool {
        self.queued > 0 || self.parked.is_some()
    }

    /// Whether a newcomer would have to wait: the shard is paused, has no free credit, or
    /// holds anything back (no barging past the line).
    #[inline]
    pub(super) fn must_wait(&self, cap: u32) -> bool {
        self.paused || self.in_flight >= cap || self.holds_back()
    }

    /// Batches held back: queued ones, then the parked one.
    pub(super) fn held_count(&self) -> usize {
        self.queued
            .saturating_add(usize::from(self.parked.is_some()))
    }
}

/// A held-back full batch, live in the `held` slab while it waits.
#[derive(Clone, Debug)]
pub(super) struct Held<B, P> {
    pub(super) place: P,
    pub(super) batch: B,
    /// Where it goes in its shard's line: [`NEVER_SENT`] for a batch that has not left yet
    /// (it joins the back), else the generation of the credit it held before
    /// [`Books::requeue`] put it back (requeued batches go before every batch that never
    /// left, among themselves in the order they first left).
    pub(super) order: u64,
}

/// The `order` of a held batch that never left.
pub(super) const NEVER_SENT: u64 = u64::MAX;

/// What a full batch met on entering an existing shard's window.
pub(crate) enum Entered<B> {
    /// The shard had credit: the batch goes out under it.
    Credit(CreditId, B),
    /// The batch waits in the shard's line under this ticket.
    Queued(Ticket),
}

/// Whether the window takes new batches and hands on held-back ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// Takes new batches; releases hand on held-back ones.
    Open,
    /// `drain`: refuses new batches; releases still hand on held-back ones.
    Draining,
    /// `close`: refuses new batches and holds nothing back (all were handed out).
    Closed,
}

/// The window's state beside its shards: the id slabs, the pool of line buffers, the mode,
/// the counters and maintenance.
#[derive(Clone, Debug)]
pub(super) struct Books<B, P> {
    pub(super) mode: Mode,
    /// Shards that are not idle.
    pub(super) active: usize,
    pub(super) credits: Slab<P>,
    /// Held-back full batches, by ticket.
    pub(super) held: Slab<Held<B, P>>,
    /// Line buffers of shards that went idle, for the next shard that has to queue.
    pub(super) spare_queues: Vec<VecDeque<Key>>,
    /// Shard windows owning a pooled line buffer; with `spare_queues`, every buffer.
    queues_held: usize,
    peak_queues_held: Peak,
    peak_queue_len: Peak,
    pub(super) maintenance: Maintenance,
    clock: Clock,
}

/// Pops the tombstones at the head of a shard's line, so its head, if any, is live.
#[inline]
fn drop_tombstones<B, P>(w: &mut ShardWindow<B>, held: &Slab<Held<B, P>>) {
    while let Some(&head) = w.line.front() {
        if held.get(head).is_some() {
            break;
        }
        w.line.pop_front();
    }
}

/// The oldest batch `w` holds back (its line's head, past cancelled tickets, else its parked
/// batch), taken out of the books; `None` if it holds none.
#[inline(always)]
fn take_oldest_held<B, P>(w: &mut ShardWindow<B>, held: &mut Slab<Held<B, P>>) -> Option<B> {
    drop_tombstones(w, held);
    match w.line.pop_front() {
        Some(head) => {
            w.queued = w.queued.saturating_sub(1);
            held.remove(head).ok().map(|h| h.batch)
        }
        None => w.parked.take(),
    }
}

impl<B, P: Copy> Books<B, P> {
    /// Fresh books: open, with a new instance tag shared by credits and tickets.
    pub(super) fn new() -> Self {
        let credits = Slab::new();
        let mut held = Slab::new();
        held.set_tag(credits.tag());
        Books {
            mode: Mode::Open,
            active: 0,
            credits,
            held,
            spare_queues: Vec::new(),
            queues_held: 0,
            peak_queues_held: Peak::default(),
            peak_queue_len: Peak::default(),
            maintenance: Maintenance::default(),
            clock: Clock::default(),
        }
    }

    /// Observes `now` on the books' clock (time running backwards is ignored).
    pub(super) fn observe(&mut self, now: Instant) {
        self.clock.observe(now);
    }

    /// Gives credits and tickets the instance tag `tag`.
    pub(super) fn set_tag(&mut self, tag: u32) {
        self.credits.set_tag(tag);
        self.held.set_tag(tag);
    }

    /// Whether new batches are refused (after `close` or `drain`).
    #[inline]
    pub(super) fn refuses(&self) -> bool {
        self.mode != Mode::Open
    }

    /// Whether a release of a credit of `w` (of capacity `cap`), asked before the release,
    /// hands a fresh one to a held-back batch: the window is open or draining, `w` holds one
    /// back and is not paused, and after the release fewer than `cap` credits are in flight
    /// (after a shrink, a release retires its credit until the shard is back under its
    /// limit). Ids permitting: see `hand_on`.
    #[inline]
    pub(super) fn hands_on(&self, w: &ShardWindow<B>, cap: u32) -> bool {
        self.mode != Mode::Closed && w.holds_back() && !w.paused && w.in_flight <= cap
    }

    /// Refuses new batches from now on, and keeps handing on the held-back ones. Nothing
    /// changes after `close`.
    pub(super) fn drain(&mut self) {
        if self.mode == Mode::Open {
            self.mode = Mode::Draining;
            self.maintenance.touch();
        }
    }

    /// Refuses new batches and stops handing on held-back ones: call [`Self::close_shard`] on
    /// every shard next (it hands them out), then [`Self::closed`].
    pub(super) fn close(&mut self) {
        self.mode = Mode::Closed;
        self.maintenance.touch();
    }

    /// After `close` handed out every shard's held-back batches.
    pub(super) fn closed(&mut self) {
        self.held.reset_if_empty();
    }

    /// The shard's open batch (window `w`, at `place`): sent under a fresh credit if the
    /// shard may have one without waiting, else parked.
    #[inline]
    pub(super) fn park_or_send(
        &mut self,
        w: &mut ShardWindow<B>,
        place: P,
        cap: u32,
        batch: B,
    ) -> Result<Option<(CreditId, B)>, SubmitError<B>> {
        if self.refuses() {
            return Err(SubmitError::Closed(batch));
        }
        if w.parked.is_some() {
            return Err(SubmitError::AlreadyParked(batch));
        }
        if w.must_wait(cap) {
            // Only a paused shard can be idle here.
            self.count_if_idle(w);
            w.parked = Some(batch);
            self.maintenance.touch();
            return Ok(None);
        }
        match self.take_credit(w, place) {
            Ok(credit) => Ok(Some((credit, batch))),
            Err(Exhausted) => Err(SubmitError::Exhausted(batch)),
        }
    }

    /// A credit for the shard at `place`, whose window `w` has one free; nothing changes on
    /// `Exhausted`.
    #[inline(always)]
    pub(super) fn take_credit(
        &mut self,
        w: &mut ShardWindow<B>,
        place: P,
    ) -> Result<CreditId, Exhausted> {
        let credit = CreditId(self.credits.insert(place).map_err(|(e, _)| e)?);
        if w.is_idle() {
            self.active = self.active.saturating_add(1);
        }
        w.in_flight = w.in_flight.saturating_add(1);
        self.maintenance.touch();
        Ok(credit)
    }

    /// The admission rule of a shard's window, for every entry point: refused while closed
    /// or draining; else a credit if one is free and nothing waits in the shard's line (no
    /// barging); else the caller must wait (`NoCredit`). [`Self::enter`] queues on
    /// `NoCredit`; the `sync` handle's `try_take` reports it.
    #[inline(always)]
    pub(super) fn admit(&mut self, w: &mut ShardWindow<B>, place: P, cap: u32) -> Take {
        if self.refuses() {
            return Take::Closed;
        }
        if w.must_wait(cap) {
            return Take::NoCredit;
        }
        match self.take_credit(w, place) {
            Ok(credit) => Take::Credit(credit),
            Err(Exhausted) => Take::Exhausted,
        }
    }

    /// A full batch for the shard at `place` (window `w`): a credit if the shard may have one
    /// without waiting, else a place at the back of its line.
    #[inline(always)]
    pub(super) fn enter(
        &mut self,
        w: &mut ShardWindow<B>,
        place: P,
        batch: B,
        cap: u32,
    ) -> Result<Entered<B>, SubmitError<B>> {
        match self.admit(w, place, cap) {
            Take::Credit(credit) => return Ok(Entered::Credit(credit, batch)),
            Take::Closed => return Err(SubmitError::Closed(batch)),
            Take::Exhausted => return Err(SubmitError::Exhausted(batch)),
            Take::NoCredit => {}
        }
        let ticket = match self.held.insert(Held {
            place,
            batch,
            order: NEVER_SENT,
        }) {
            Ok(key) => key,
            Err((_, held)) => return Err(SubmitError::Exhausted(held.batch)),
        };
        // Only a paused shard can be idle here.
        self.count_if_idle(w);
        self.own_line(w);
        w.line.push_back(ticket);
        w.queued += 1;
        self.peak_queue_len.see(w.line.len());
        self.maintenance.touch();
        Ok(Entered::Queued(Ticket(ticket)))
    }

    /// Counts `w` as active if it is idle (about to hold something back).
    #[inline]
    fn count_if_idle(&mut self, w: &ShardWindow<B>) {
        if w.is_idle() {
            self.active = self.active.saturating_add(1);
        }
    }

    /// Gives `w` a pooled line buffer the first time it queues.
    fn own_line(&mut self, w: &mut ShardWindow<B>) {
        if !w.owns_queue && w.line.capacity() == 0 {
            // First time this shard queues: take a pooled buffer if there is one, so the
            // number of buffers follows the peak of shards queueing at once.
            if let Some(q) = self.spare_queues.pop() {
                w.line = q;
            }
            w.owns_queue = true;
            self.queues_held = self.queues_held.saturating_add(1);
            self.peak_queues_held.see(self.queues_held);
        }
    }

    /// Puts `batch`, which left under a credit of generation `order` (already removed from
    /// the credit slab by the caller), back into the line of its shard `w` at `place`: after
    /// the batches requeued before it that left before it, before every other held-back
    /// batch (queued or parked). Then hands the freed credit on as [`Self::hand_on`] does
    /// (to the head of the line: the requeued batch itself unless one that left before it was
    /// requeued too), unless the shard is paused or still at or above `cap`: the second
    /// value. The first is the requeued
    /// batch's ticket (stale at once if the hand-on sent it), or the batch handed back when the window is closed (the caller fails it) or can issue no ticket
    /// (`Exhausted`); the credit is released either way.
    #[allow(clippy::type_complexity)]
    pub(super) fn requeue(
        &mut self,
        w: &mut ShardWindow<B>,
        place: P,
        cap: u32,
        batch: B,
        order: u64,
    ) -> (Result<Ticket, SubmitError<B>>, Option<(CreditId, B)>) {
        if self.mode == Mode::Closed {
            return (Err(SubmitError::Closed(batch)), self.hand_on(w, place, cap));
        }
        let ticket = match self.held.insert(Held {
            place,
            batch,
            order,
        }) {
            Ok(key) => key,
            Err((_, held)) => {
                return (
                    Err(SubmitError::Exhausted(held.batch)),
                    self.hand_on(w, place, cap),
                );
            }
        };
        self.own_line(w);
        // Requeued batches sit at the head, by the order they first left; tombstones among
        // them are passed over.
        let held = &self.held;
        let at = w
            .line
            .iter()
            .position(|&k| held.get(k).is_some_and(|h| h.order >= order))
            .unwrap_or(w.line.len());
        w.line.insert(at, ticket);
        w.queued += 1;
        self.peak_queue_len.see(w.line.len());
        (Ok(Ticket(ticket)), self.hand_on(w, place, cap))
    }

    /// Pauses the shard `w`: from now on it is granted no credit and hands nothing on, so
    /// everything for it waits in order, until [`Self::resume`]. Idempotent; does nothing
    /// once the window is closed.
    pub(super) fn pause(&mut self, w: &mut ShardWindow<B>) {
        if self.mode != Mode::Closed && !w.paused {
            w.paused = true;
            self.maintenance.touch();
        }
    }

    /// Ends a pause of the shard `w` at `place` and hands its free credits (up to `cap` in
    /// flight) to its held-back batches in line order (queued, then parked), passing each to
    /// `f`, as that many releases would have. At most `limit` are handed out (the caller's
    /// count of key copies). Nothing is handed out while closed or once no id can be issued.
    pub(super) fn resume(
        &mut self,
        w: &mut ShardWindow<B>,
        place: P,
        cap: u32,
        limit: usize,
        f: impl FnMut(CreditId, B),
    ) {
        if !w.paused {
            return;
        }
        w.paused = false;
        self.maintenance.touch();
        self.grant(w, place, cap, limit, f);
    }

    /// Gives the shard `w` at `place` its own limit `limit` (0: the window's configured one
    /// again), whose capacity is now `cap`, and, if it grew past the credits in flight, hands
    /// the free credits to its held-back batches in line order as [`Self::resume`] does (at
    /// most `most`, the caller's count of key copies; none while paused or closed). A shrink
    /// revokes nothing: the credits in flight stay valid, and releases retire them (hand
    /// nothing on) until fewer than `cap` are in flight.
    pub(super) fn set_limit(
        &mut self,
        w: &mut ShardWindow<B>,
        place: P,
        limit: u32,
        cap: u32,
        most: usize,
        f: impl FnMut(CreditId, B),
    ) {
        w.limit = limit;
        self.maintenance.touch();
        self.grant(w, place, cap, most, f);
    }

    /// Hands the free credits of `w` (up to `cap` in flight, at most `most` of them) to its
    /// held-back batches in line order, passing each to `f`: the common tail of a resume and
    /// of a limit that grew. Nothing while paused or closed, or once no id can be issued.
    fn grant(
        &mut self,
        w: &mut ShardWindow<B>,
        place: P,
        cap: u32,
        most: usize,
        mut f: impl FnMut(CreditId, B),
    ) {
        // An idle shard stays idle (and uncounted); a busy one stays busy below: each credit
        // handed out is in flight.
        let mut handed = 0usize;
        while handed < most
            && self.mode != Mode::Closed
            && !w.paused
            && w.in_flight < cap
            && w.holds_back()
            && self.credits.can_issue()
        {
            let batch = take_oldest_held(w, &mut self.held);
            let Some(batch) = batch else { break };
            // `can_issue` was checked above and nothing was issued since.
            let Ok(key) = self.credits.insert(place) else {
                break;
            };
            w.in_flight = w.in_flight.saturating_add(1);
            handed += 1;
            f(CreditId(key), batch);
        }
        drop_tombstones(w, &self.held);
    }

    /// How many batches [`Self::resume`] of `w` would hand out now (before the id space).
    pub(super) fn resumable(&self, w: &ShardWindow<B>, cap: u32) -> usize {
        if w.paused { self.free_held(w, cap) } else { 0 }
    }

    /// How many batches a capacity of `cap` lets [`Self::set_limit`] hand out of `w` now
    /// (before the id space): none while paused.
    pub(super) fn grantable(&self, w: &ShardWindow<B>, cap: u32) -> usize {
        if w.paused { 0 } else { self.free_held(w, cap) }
    }

    /// Held-back batches of `w` that its free credits under `cap` could take (none once
    /// closed), whatever its pause.
    fn free_held(&self, w: &ShardWindow<B>, cap: u32) -> usize {
        if self.mode == Mode::Closed {
            return 0;
        }
        let free = usize::try_from(cap.saturating_sub(w.in_flight)).unwrap_or(usize::MAX);
        free.min(w.held_count())
    }

    /// After a credit of the shard at `place` (window `w`, of capacity `cap`) was freed:
    /// hands a fresh one to the shard's oldest held-back batch (queued first, then parked)
    /// and returns it, unless the window is closed, the shard is paused or still at or above
    /// `cap` (a shrink: the credit retires), or no new id can be issued.
    #[inline(always)]
    pub(super) fn hand_on(
        &mut self,
        w: &mut ShardWindow<B>,
        place: P,
        cap: u32,
    ) -> Option<(CreditId, B)> {
        self.maintenance.touch();
        let hands_on = self.hands_on(w, cap);
        w.in_flight = w.in_flight.saturating_sub(1);
        let mut next = None;
        if hands_on && self.credits.can_issue() {
            let batch = take_oldest_held(w, &mut self.held);
            if let Some(batch) = batch {
                // `can_issue` was checked above and nothing was issued since.
                if let Ok(key) = self.credits.insert(place) {
                    w.in_flight = w.in_flight.saturating_add(1);
                    next = Some((CreditId(key), batch));
                }
            }
            drop_tombstones(w, &self.held);
        }
        self.idle_check(w);
        next
    }

    /// Takes the parked batch of `w` back, if there is one.
    pub(super) fn reclaim(&mut self, w: &mut ShardWindow<B>) -> Option<B> {
        let batch = w.parked.take()?;
        self.maintenance.touch();
        self.idle_check(w);
        Some(batch)
    }

    /// Removes `ticket`'s batch from the `held` slab (the first half of `cancel`; finish with
    /// [`Self::withdrawn`] on its shard's window). Changes nothing on an error.
    pub(super) fn withdraw(&mut self, ticket: Ticket) -> Result<Held<B, P>, ReleaseError> {
        let held = self.held.remove(ticket.0)?;
        self.maintenance.touch();
        Ok(held)
    }

    /// After [`Self::withdraw`] took a batch from the line of `w`: its count drops, and its
    /// tombstone goes at once if it was the head, or with the others once they outnumber the
    /// live entries.
    pub(super) fn withdrawn(&mut self, w: &mut ShardWindow<B>) {
        w.queued = w.queued.saturating_sub(1);
        drop_tombstones(w, &self.held);
        if w.line.len() > w.queued.saturating_mul(2).saturating_add(8) {
            let live = &self.held;
            w.line.retain(|&k| live.get(k).is_some());
        }
        self.idle_check(w);
    }

    /// Hands every held-back batch of `w` to `f` (queued in line order, then parked) and
    /// gives its line buffer back to the pool. For `close`, after [`Self::close`].
    pub(super) fn close_shard(&mut self, w: &mut ShardWindow<B>, mut f: impl FnMut(B)) {
        let was_idle = w.is_idle();
        // Closed: nothing is handed on any more, so a pause or a limit means nothing.
        w.paused = false;
        w.limit = 0;
        for key in w.line.drain(..) {
            if let Ok(held) = self.held.remove(key) {
                f(held.batch);
            }
        }
        w.queued = 0;
        if let Some(batch) = w.parked.take() {
            f(batch);
        }
        if !was_idle && w.is_idle() {
            self.active = self.active.saturating_sub(1);
        }
        if core::mem::take(&mut w.owns_queue) {
            // Closed: the shard never queues again, so its buffer goes back to the pool
            // (and from there, at maintenance, back to the allocator).
            self.queues_held = self.queues_held.saturating_sub(1);
            self.spare_queues.push(core::mem::take(&mut w.line));
        }
    }

    /// Bookkeeping for a shard whose window may just have become idle: it no longer counts
    /// as active, and its line buffer goes back to the pool at once (as if the entry were
    /// removed), so idle entries hold no buffers and the pool follows the shards queueing now.
    #[inline(always)]
    pub(super) fn idle_check(&mut self, w: &mut ShardWindow<B>) {
        if !w.is_idle() {
            return;
        }
        self.active = self.active.saturating_sub(1);
        // An idle shard's line holds only tombstones: clear them with the buffer.
        w.line.clear();
        if core::mem::take(&mut w.owns_queue) {
            self.queues_held = self.queues_held.saturating_sub(1);
            self.spare_queues.push(core::mem::take(&mut w.line));
        }
    }

    /// The start of a maintenance run at `now`: whether it runs (at most once per
    /// `MAINTENANCE_INTERVAL`; time running backwards is ignored).
    pub(super) fn begin_maintenance(&mut self, now: Instant) -> bool {
        let now = self.clock.observe(now);
        self.maintenance.begin(now)
    }

    /// Maintenance of the books: the line-buffer pool, each spare buffer and the two slabs
    /// shrink when their peak use since the previous run is below a quarter of capacity.
    pub(super) fn shrink(&mut self) {
        let held = self.peak_queues_held.roll(self.queues_held);
        self.spare_queues
            .truncate(held.saturating_sub(self.queues_held));
        if let Some(target) = self.maintenance.target(self.spare_queues.capacity(), held) {
            self.spare_queues.shrink_to(target);
        }
        let len = self.peak_queue_len.roll(0);
        for q in &mut self.spare_queues {
            if let Some(target) = self.maintenance.target(q.capacity(), len) {
                q.shrink_to(target);
            }
        }
        self.credits.shrink(&self.maintenance);
        self.held.shrink(&self.maintenance);
    }
}
