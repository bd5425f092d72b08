//! Pending-bytes limiter: bounds the bytes of operations a client holds in flight
//! (`docs/design.md` §3.4.3).
//!
//! Every operation asks for its size in bytes before it may be batched. The limiter admits
//! operations strictly in the order they asked (FIFO, no barging), so a large operation is never
//! starved by a stream of small ones, and it keeps `used + available == limit` after every call.
//! An operation larger than the whole limit is clamped to the limit: it waits until nothing else
//! holds bytes and then proceeds alone. A limit of 0 disables the bound.
//!
//! The limiter is sans-IO: it hands out [`Ticket`]s and [`Grant`]s as values, and a release that
//! lets waiting tickets through queues one [`PendingBytesAction::Proceed`] per admitted ticket,
//! drained with [`PendingBytesLimiter::poll_action`]. The async layer (`throttle_core::sync`)
//! wakes exactly those waiters. See `docs/pending-bytes.md` for the state diagram.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::error::{ConfigError, ReleaseError};

/// Configuration of a [`PendingBytesLimiter`].
///
/// Every value is meaningful: `0` disables the limiter (everything is admitted at once) and
/// `u64::MAX` is a bound that only a `u64::MAX`-byte operation reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PendingBytesConfig {
    max_pending_bytes: u64,
}

impl PendingBytesConfig {
    /// The default bound: 64 MiB, i.e. 512 full write batches of the batcher's default 128 KiB.
    // Oxia PR #362 leans on its existing `maxPendingBytes` limiter but states no default; this is
    // our pick.
    pub const DEFAULT_MAX_PENDING_BYTES: u64 = 64 * 1024 * 1024;

    /// A limiter admitting at most `max_pending_bytes` bytes at once; `0` disables it.
    pub const fn new(max_pending_bytes: u64) -> Self {
        PendingBytesConfig { max_pending_bytes }
    }

    /// A limiter that admits every operation at once and counts nothing.
    pub const fn disabled() -> Self {
        PendingBytesConfig::new(0)
    }

    /// The bound in bytes (`0`: disabled).
    pub const fn max_pending_bytes(&self) -> u64 {
        self.max_pending_bytes
    }

    /// Whether the configuration is usable. Always `Ok`: every `u64` is a valid bound; the
    /// method exists so that every configuration in the crate is checked the same way.
    pub const fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

impl Default for PendingBytesConfig {
    fn default() -> Self {
        PendingBytesConfig::new(Self::DEFAULT_MAX_PENDING_BYTES)
    }
}

/// A place in the limiter's line: issued by [`PendingBytesLimiter::enqueue`], never reused.
///
/// A ticket names an operation from the moment it asks until its bytes are given back, whether
/// it is still waiting or already admitted; [`PendingBytesLimiter::cancel`] takes it in both
/// states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket {
    // Issue order; ids are unique for the life of the limiter (2^64 of them: at a billion
    // tickets a second that lasts 584 years, so the counter is allowed to wrap silently).
    id: u64,
    // Where the ticket's entry lives; checked against `id` on every lookup.
    slot: usize,
}

impl Ticket {
    /// The ticket's number: strictly increasing in issue order, never reused.
    pub const fn id(self) -> u64 {
        self.id
    }

    /// A ticket the limiter never issued, for tests and the model checker.
    #[cfg(any(test, feature = "model"))]
    pub(crate) const fn forged(id: u64, slot: usize) -> Self {
        Ticket { id, slot }
    }
}

/// Proof that a ticket was admitted: the operation may proceed, holding [`Grant::charged`]
/// bytes until it is given to [`PendingBytesLimiter::release`] (or its ticket is cancelled).
///
/// A grant is a plain value, so it can be copied and released twice by mistake; the limiter
/// refuses the second release. The concurrent layer wraps it in a non-`Clone` `Permit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grant {
    ticket: Ticket,
    charged: u64,
}

impl Grant {
    /// The admitted ticket.
    pub const fn ticket(self) -> Ticket {
        self.ticket
    }

    /// The bytes this grant holds: the requested size, clamped to the limit.
    pub const fn charged(self) -> u64 {
        self.charged
    }

    /// A grant the limiter never issued, for tests and the model checker.
    #[cfg(any(test, feature = "model"))]
    pub(crate) const fn forged(ticket: Ticket, charged: u64) -> Self {
        Grant { ticket, charged }
    }
}

/// What [`PendingBytesLimiter::enqueue`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a granted ticket holds bytes until it is released"]
#[non_exhaustive]
pub enum Enqueued {
    /// Admitted at once: proceed, then release the grant.
    Granted(Grant),
    /// In line behind earlier tickets: wait for [`PendingBytesAction::Proceed`] with this ticket,
    /// or cancel it.
    Waiting(Ticket),
}

impl Enqueued {
    /// The ticket, admitted or not.
    pub const fn ticket(&self) -> Ticket {
        match self {
            Enqueued::Granted(g) => g.ticket,
            Enqueued::Waiting(t) => *t,
        }
    }

    /// The grant, if the ticket was admitted at once.
    pub const fn grant(&self) -> Option<Grant> {
        match self {
            Enqueued::Granted(g) => Some(*g),
            Enqueued::Waiting(_) => None,
        }
    }
}

/// What [`PendingBytesLimiter::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cancelled {
    /// The ticket was still waiting and has left the line without ever holding bytes.
    Withdrawn,
    /// The ticket had been admitted; its bytes were released exactly as by
    /// [`PendingBytesLimiter::release`].
    Released,
}

/// Where a ticket stands, as reported by [`PendingBytesLimiter::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TicketState {
    /// In line, holding no bytes.
    Waiting,
    /// Admitted and holding its bytes.
    Granted,
    /// Released, or cancelled: finished for good.
    Done,
    /// Never issued by this limiter.
    Unknown,
}

/// An instruction from the limiter, drained with [`PendingBytesLimiter::poll_action`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PendingBytesAction {
    /// A waiting ticket has been admitted: let its operation proceed (wake its waiter) and
    /// release the grant once the operation is done.
    Proceed(Grant),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    Waiting,
    Granted,
}

#[derive(Debug, Clone)]
struct Slot {
    id: u64,
    charged: u64,
    state: SlotState,
}

/// The pending-bytes limiter (`docs/design.md` §3.4.3): FIFO admission of byte-sized operations
/// under `max_pending_bytes`, with guarded release and cancellation.
///
/// # Driving contract
///
/// - **Inputs** (mutate): [`enqueue`](Self::enqueue) asks for bytes and answers at once whether
///   they were granted; [`try_acquire`](Self::try_acquire) asks only if it can be granted now
///   (and never jumps the line); [`release`](Self::release) gives a grant's bytes back;
///   [`cancel`](Self::cancel) withdraws a waiting ticket or, for an admitted one, releases it.
/// - **Poller**: after every `release` or `cancel`, drain [`poll_action`](Self::poll_action)
///   until `None`; each [`PendingBytesAction::Proceed`] names a ticket admitted by that call,
///   in ticket order. `enqueue` and `try_acquire` never queue actions (their answer is direct).
/// - **Queries** (`&self`): [`state`](Self::state), [`used`](Self::used),
///   [`available`](Self::available), [`limit`](Self::limit), [`waiting`](Self::waiting),
///   [`granted`](Self::granted).
///
/// Cancellation safety: the owner of a ticket calls `cancel(ticket)` whenever it gives up,
/// without needing to know whether the ticket was admitted meanwhile: cancelling an admitted
/// ticket *is* releasing it, and a `Proceed` for it that was not yet drained is dropped. Each
/// ticket's bytes are therefore given back exactly once, by whichever of `release` or `cancel`
/// comes first; the other gets [`ReleaseError::AlreadyReleased`] and changes nothing.
///
/// Time plays no part: the limiter counts bytes, not rates, so no input takes `now`.
///
/// ```
/// use throttle_core::pending_bytes::{
///     Enqueued, PendingBytesAction, PendingBytesConfig, PendingBytesLimiter,
/// };
///
/// let mut limiter = PendingBytesLimiter::new(PendingBytesConfig::new(100));
/// let Enqueued::Granted(big) = limiter.enqueue(80) else { unreachable!() };
/// // 30 bytes do not fit beside 80: the ticket waits, and a later 10 may not barge past it.
/// let Enqueued::Waiting(ticket) = limiter.enqueue(30) else { unreachable!() };
/// assert_eq!(limiter.try_acquire(10), None);
///
/// limiter.release(big).unwrap();
/// let Some(PendingBytesAction::Proceed(grant)) = limiter.poll_action() else { unreachable!() };
/// assert_eq!(grant.ticket(), ticket);
/// assert_eq!(limiter.used(), 30);
/// limiter.release(grant).unwrap();
/// assert_eq!(limiter.used() + limiter.available(), limiter.limit());
/// ```
#[derive(Debug, Clone)]
pub struct PendingBytesLimiter {
    limit: u64,
    /// Sum of the charges of admitted tickets; never above `limit`.
    used: u64,
    next_id: u64,
    /// Entries of live tickets, indexed by `Ticket::slot`; freed entries are reused.
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// Waiting tickets in ticket order (ids strictly increasing front to back), plus
    /// tombstones: entries of tickets cancelled while waiting, recognised by their slot no
    /// longer holding that id in the `Waiting` state. Cancelling only frees the slot, so it
    /// is O(1); tombstones are dropped when they reach the head, or all at once when they
    /// outnumber the live entries (amortised O(1), and at most twice `waiting` entries).
    queue: VecDeque<Ticket>,
    /// Live (non-tombstone) entries of `queue`.
    waiting: usize,
    /// Admitted tickets not yet announced, in admission order; may hold stale entries for
    /// tickets released before they were drained, which `poll_action` skips.
    actions: VecDeque<Grant>,
    /// Number of admitted tickets.
    granted: usize,
}

impl PendingBytesLimiter {
    /// A limiter for `config`, holding nothing.
    pub fn new(config: PendingBytesConfig) -> Self {
        PendingBytesLimiter {
            limit: config.max_pending_bytes,
            used: 0,
            next_id: 0,
            slots: Vec::new(),
            free: Vec::new(),
            queue: VecDeque::new(),
            waiting: 0,
            actions: VecDeque::new(),
            granted: 0,
        }
    }

    /// The bound in bytes (`0`: disabled).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Whether the limiter is disabled (a limit of 0 admits everything at once).
    pub fn is_disabled(&self) -> bool {
        self.limit == 0
    }

    /// Bytes held by admitted tickets.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Bytes that may still be admitted: `limit - used`.
    pub fn available(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }

    /// Number of tickets waiting in line.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Number of admitted tickets not yet released.
    pub fn granted(&self) -> usize {
        self.granted
    }

    /// The bytes an operation of `bytes` is charged: its size clamped to the limit, so an
    /// oversized operation waits for the whole limit and then proceeds alone. With the limiter
    /// disabled every charge is 0, which is what lets everything through at once.
    pub fn charge_for(&self, bytes: u64) -> u64 {
        bytes.min(self.limit)
    }

    /// Where `ticket` stands.
    pub fn state(&self, ticket: Ticket) -> TicketState {
        match self.live_slot(ticket) {
            Some(slot) => match slot.state {
                SlotState::Waiting => TicketState::Waiting,
                _ => TicketState::Granted,
            },
            None if self.was_issued(ticket) => TicketState::Done,
            None => TicketState::Unknown,
        }
    }

    /// Asks for `bytes`: admitted at once if no ticket is waiting and the charge fits,
    /// otherwise queued behind every earlier ticket.
    pub fn enqueue(&mut self, bytes: u64) -> Enqueued {
        let charged = self.charge_for(bytes);
        if self.waiting == 0 && charged <= self.available() {
            Enqueued::Granted(self.admit_new(charged))
        } else {
            let ticket = self.issue(charged, SlotState::Waiting);
            self.queue.push_back(ticket);
            self.waiting += 1;
            Enqueued::Waiting(ticket)
        }
    }

    /// Admits `bytes` only if that needs no waiting: `None` while any ticket waits (no
    /// barging, even for a request that would fit) or when the charge does not fit. A refusal
    /// issues no ticket and changes nothing.
    pub fn try_acquire(&mut self, bytes: u64) -> Option<Grant> {
        let charged = self.charge_for(bytes);
        if self.waiting == 0 && charged <= self.available() {
            Some(self.admit_new(charged))
        } else {
            None
        }
    }

    /// Gives a grant's bytes back and admits the waiting tickets that now fit, in order (drain
    /// them with [`poll_action`](Self::poll_action)).
    ///
    /// A grant already released (or whose ticket was cancelled) is refused with
    /// [`ReleaseError::AlreadyReleased`], one this limiter never issued with
    /// [`ReleaseError::Unknown`]; either way nothing changes.
    pub fn release(&mut self, grant: Grant) -> Result<(), ReleaseError> {
        match self.live_slot(grant.ticket).map(|s| s.state) {
            Some(SlotState::Granted) => {
                self.finish_granted(grant.ticket);
                Ok(())
            }
            // A grant naming a waiting ticket cannot have come from this limiter.
            Some(_) => Err(ReleaseError::Unknown),
            None => Err(self.refusal(grant.ticket)),
        }
    }

    /// Gives up on `ticket`, whatever its state: a waiting ticket leaves the line
    /// ([`Cancelled::Withdrawn`]); an admitted one is released exactly as by
    /// [`release`](Self::release) ([`Cancelled::Released`]), and a `Proceed` for it that was
    /// not yet drained is dropped. Either way, tickets behind it that now fit are admitted.
    ///
    /// A finished ticket is refused with [`ReleaseError::AlreadyReleased`], one this limiter
    /// never issued with [`ReleaseError::Unknown`]; either way nothing changes.
    pub fn cancel(&mut self, ticket: Ticket) -> Result<Cancelled, ReleaseError> {
        match self.live_slot(ticket).map(|s| s.state) {
            Some(SlotState::Granted) => {
                self.finish_granted(ticket);
                Ok(Cancelled::Released)
            }
            Some(_) => {
                // Freeing the slot turns the ticket's queue entry into a tombstone: no search,
                // no shifting. Only the head can block the line, so the admission pass below
                // admits somebody only if this ticket was the (live) head.
                self.free_slot(ticket.slot);
                self.waiting = self.waiting.saturating_sub(1);
                self.admit_waiting();
                self.compact_queue();
                self.reset_if_idle();
                Ok(Cancelled::Withdrawn)
            }
            None => Err(self.refusal(ticket)),
        }
    }

    /// The next instruction, or `None` when there is nothing to do. Drain until `None` after
    /// every [`release`](Self::release) and [`cancel`](Self::cancel).
    pub fn poll_action(&mut self) -> Option<PendingBytesAction> {
        while let Some(grant) = self.actions.pop_front() {
            if self.is_granted(grant.ticket) {
                return Some(PendingBytesAction::Proceed(grant));
            }
        }
        None
    }

    fn live_slot(&self, ticket: Ticket) -> Option<&Slot> {
        self.slots
            .get(ticket.slot)
            .filter(|s| s.id == ticket.id && s.state != SlotState::Free)
    }

    fn is_granted(&self, ticket: Ticket) -> bool {
        self.live_slot(ticket)
            .is_some_and(|s| s.state == SlotState::Granted)
    }

    fn was_issued(&self, ticket: Ticket) -> bool {
        ticket.id < self.next_id
    }

    fn refusal(&self, ticket: Ticket) -> ReleaseError {
        if self.was_issued(ticket) {
            ReleaseError::AlreadyReleased
        } else {
            ReleaseError::Unknown
        }
    }

    fn issue(&mut self, charged: u64, state: SlotState) -> Ticket {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let entry = Slot { id, charged, state };
        let slot = match self.free.pop() {
            Some(slot) => {
                if let Some(s) = self.slots.get_mut(slot) {
                    *s = entry;
                }
                slot
            }
            None => {
                self.slots.push(entry);
                self.slots.len() - 1
            }
        };
        Ticket { id, slot }
    }

    /// Admits a new ticket whose charge the caller has checked fits.
    fn admit_new(&mut self, charged: u64) -> Grant {
        let ticket = self.issue(charged, SlotState::Granted);
        self.used = self.used.saturating_add(charged);
        self.granted += 1;
        Grant { ticket, charged }
    }

    /// Releases a ticket known to be admitted, then lets the line move.
    fn finish_granted(&mut self, ticket: Ticket) {
        let charged = self.slots.get(ticket.slot).map_or(0, |s| s.charged);
        self.used = self.used.saturating_sub(charged);
        self.granted = self.granted.saturating_sub(1);
        self.free_slot(ticket.slot);
        self.admit_waiting();
        self.reset_if_idle();
    }

    fn free_slot(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            s.state = SlotState::Free;
            self.free.push(slot);
        }
    }

    /// Admits waiting tickets from the front for as long as the head fits: strict FIFO, so a
    /// head that does not fit holds back everything behind it.
    /// Tombstones at the head are dropped on the way.
    fn admit_waiting(&mut self) {
        while let Some(&head) = self.queue.front() {
            let Some(slot) = self
                .slots
                .get_mut(head.slot)
                .filter(|s| s.id == head.id && s.state == SlotState::Waiting)
            else {
                self.queue.pop_front(); // tombstone of a cancelled ticket
                continue;
            };
            if slot.charged > self.limit.saturating_sub(self.used) {
                break;
            }
            slot.state = SlotState::Granted;
            let charged = slot.charged;
            self.used = self.used.saturating_add(charged);
            self.granted += 1;
            self.waiting = self.waiting.saturating_sub(1);
            self.queue.pop_front();
            self.push_action(Grant {
                ticket: head,
                charged,
            });
        }
    }

    /// Drops every tombstone once they outnumber the live entries, so the line never holds
    /// more than about twice `waiting` entries. Each pass costs at most twice the cancels
    /// since the previous one: amortised O(1) per cancel.
    fn compact_queue(&mut self) {
        let tombstones = self.queue.len().saturating_sub(self.waiting);
        if tombstones > self.waiting {
            let slots = &self.slots;
            self.queue.retain(|t| {
                slots
                    .get(t.slot)
                    .is_some_and(|s| s.id == t.id && s.state == SlotState::Waiting)
            });
        }
    }

    fn push_action(&mut self, grant: Grant) {
        // Entries go stale only when a caller releases before draining; compacting once they
        // outnumber the admitted tickets keeps the queue bounded even if nobody drains.
        if self.actions.len() >= self.granted.saturating_mul(2).saturating_add(16) {
            let slots = &self.slots;
            self.actions.retain(|g| {
                slots
                    .get(g.ticket.slot)
                    .is_some_and(|s| s.id == g.ticket.id && s.state == SlotState::Granted)
            });
        }
        self.actions.push_back(grant);
    }

    /// With no ticket live, every entry is free and every queued action stale: forget them
    /// (keeping capacity, so the next busy period allocates nothing).
    fn reset_if_idle(&mut self) {
        if self.granted == 0 && self.waiting == 0 {
            self.slots.clear();
            self.free.clear();
            self.actions.clear();
            self.queue.clear(); // only tombstones can be left
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(limit: u64) -> PendingBytesLimiter {
        PendingBytesLimiter::new(PendingBytesConfig::new(limit))
    }

    fn granted(e: Enqueued) -> Grant {
        match e {
            Enqueued::Granted(g) => g,
            Enqueued::Waiting(t) => panic!("expected an immediate grant, got waiting {t:?}"),
        }
    }

    fn waiting(e: Enqueued) -> Ticket {
        match e {
            Enqueued::Waiting(t) => t,
            Enqueued::Granted(g) => panic!("expected to wait, got {g:?}"),
        }
    }

    fn drain(l: &mut PendingBytesLimiter) -> Vec<Grant> {
        let mut out = Vec::new();
        while let Some(PendingBytesAction::Proceed(g)) = l.poll_action() {
            out.push(g);
        }
        out
    }

    fn assert_conserved(l: &PendingBytesLimiter) {
        assert!(l.used() <= l.limit());
        assert_eq!(l.used() + l.available(), l.limit());
    }

    #[test]
    fn default_bound_is_64_mib_and_validates() {
        let cfg = PendingBytesConfig::default();
        assert_eq!(cfg.max_pending_bytes(), 64 << 20);
        assert_eq!(cfg.validate(), Ok(()));
        assert_eq!(PendingBytesConfig::disabled().max_pending_bytes(), 0);
    }

    #[test]
    fn operations_that_fit_are_granted_at_once() {
        let mut l = limiter(100);
        let a = granted(l.enqueue(60));
        let b = granted(l.enqueue(40));
        assert_eq!((a.charged(), b.charged()), (60, 40));
        assert_eq!((l.used(), l.available(), l.granted()), (100, 0, 2));
        assert_eq!(
            l.poll_action(),
            None,
            "immediate grants are answered, not queued"
        );
        assert!(a.ticket().id() < b.ticket().id());
    }

    #[test]
    fn oversized_operation_is_clamped_to_the_limit_and_proceeds_alone() {
        let mut l = limiter(100);
        let small = granted(l.enqueue(1));
        let big = waiting(l.enqueue(1_000));
        assert_eq!(l.charge_for(1_000), 100);
        // It needs the whole limit, so it waits for the 1 byte held by `small`.
        l.release(small).unwrap();
        let g = drain(&mut l);
        assert_eq!(g.len(), 1);
        assert_eq!((g[0].ticket(), g[0].charged()), (big, 100));
        assert_eq!((l.used(), l.available()), (100, 0));
        // Alone: even one byte waits until it is released.
        let next = waiting(l.enqueue(1));
        l.release(g[0]).unwrap();
        assert_eq!(drain(&mut l)[0].ticket(), next);
        assert_conserved(&l);
    }

    #[test]
    fn oversized_operation_on_an_idle_limiter_is_granted_at_once() {
        let mut l = limiter(100);
        let g = granted(l.enqueue(u64::MAX));
        assert_eq!(g.charged(), 100);
        assert_eq!(l.available(), 0);
        assert_eq!(l.try_acquire(1), None);
    }

    #[test]
    fn zero_limit_grants_everything_at_once_and_counts_nothing() {
        let mut l = limiter(0);
        assert!(l.is_disabled());
        let grants: Vec<Grant> = [0, 1, 1 << 40, u64::MAX]
            .into_iter()
            .map(|n| granted(l.enqueue(n)))
            .collect();
        assert!(grants.iter().all(|g| g.charged() == 0));
        assert!(l.try_acquire(u64::MAX).is_some());
        assert_eq!((l.used(), l.available(), l.waiting()), (0, 0, 0));
        for g in &grants {
            l.release(*g).unwrap();
        }
        assert_eq!(drain(&mut l), Vec::new());
    }

    #[test]
    fn zero_limit_still_refuses_double_and_bogus_release() {
        let mut l = limiter(0);
        let g = granted(l.enqueue(5));
        let other = granted(l.enqueue(5));
        assert_eq!(l.release(g), Ok(()));
        assert_eq!(l.release(g), Err(ReleaseError::AlreadyReleased));
        let bogus = Grant::forged(Ticket::forged(u64::MAX, 0), 0);
        assert_eq!(l.release(bogus), Err(ReleaseError::Unknown));
        assert_eq!(l.state(other.ticket()), TicketState::Granted);
        assert_eq!(l.granted(), 1);
    }

    #[test]
    fn small_request_waits_behind_a_big_waiting_one() {
        let mut l = limiter(100);
        let first = granted(l.enqueue(50));
        let big = waiting(l.enqueue(80));
        // 10 bytes would fit beside `first`, but FIFO keeps it behind `big`.
        let small = waiting(l.enqueue(10));
        assert_eq!((l.used(), l.waiting()), (50, 2));
        l.release(first).unwrap();
        let g = drain(&mut l);
        let order: Vec<Ticket> = g.iter().map(|g| g.ticket()).collect();
        assert_eq!(order, [big, small], "admitted in ticket order");
        assert_eq!(l.used(), 90);
        assert_conserved(&l);
    }

    #[test]
    fn a_release_admits_only_the_prefix_that_fits() {
        let mut l = limiter(10);
        let hold = granted(l.enqueue(10));
        let a = waiting(l.enqueue(4));
        let b = waiting(l.enqueue(4));
        let c = waiting(l.enqueue(4));
        let d = waiting(l.enqueue(1));
        l.release(hold).unwrap();
        let order: Vec<Ticket> = drain(&mut l).iter().map(|g| g.ticket()).collect();
        assert_eq!(order, [a, b], "c does not fit, and d may not pass it");
        assert_eq!(l.state(c), TicketState::Waiting);
        assert_eq!(l.state(d), TicketState::Waiting);
        assert_eq!(l.used(), 8);
    }

    #[test]
    fn try_acquire_fails_while_any_ticket_waits() {
        let mut l = limiter(100);
        let g = granted(l.enqueue(90));
        let w = waiting(l.enqueue(20));
        assert_eq!(l.available(), 10);
        assert_eq!(l.try_acquire(1), None, "would fit, but must not barge");
        assert_eq!(l.try_acquire(0), None, "not even zero bytes barge");
        assert_eq!(
            waiting(l.enqueue(0)).id(),
            w.id() + 1,
            "a refusal issues no id"
        );
        l.release(g).unwrap();
        assert_eq!(drain(&mut l).len(), 2);
        assert!(l.try_acquire(80).is_some());
        assert_eq!(l.try_acquire(1), None, "refused when it does not fit");
        assert_eq!(l.used(), 100);
    }

    #[test]
    fn cancelling_the_waiting_head_admits_those_behind_it() {
        let mut l = limiter(100);
        let _hold = granted(l.enqueue(50));
        let head = waiting(l.enqueue(60));
        let next = waiting(l.enqueue(30));
        assert_eq!(l.cancel(head), Ok(Cancelled::Withdrawn));
        let g = drain(&mut l);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].ticket(), next);
        assert_eq!((l.used(), l.waiting()), (80, 0));
        assert_eq!(l.state(head), TicketState::Done);
    }

    #[test]
    fn cancelling_a_middle_waiter_admits_nobody_and_keeps_order() {
        let mut l = limiter(100);
        let hold = granted(l.enqueue(100));
        let a = waiting(l.enqueue(30));
        let b = waiting(l.enqueue(30));
        let c = waiting(l.enqueue(30));
        assert_eq!(l.cancel(b), Ok(Cancelled::Withdrawn));
        assert_eq!(l.poll_action(), None);
        assert_eq!((l.used(), l.waiting()), (100, 2));
        l.release(hold).unwrap();
        let order: Vec<Ticket> = drain(&mut l).iter().map(|g| g.ticket()).collect();
        assert_eq!(order, [a, c]);
        assert_eq!(l.used(), 60);
    }

    #[test]
    fn cancelling_many_middle_waiters_keeps_fifo_conservation_and_bounded_memory() {
        let mut l = limiter(10);
        let hold = granted(l.enqueue(10));
        let line: Vec<Ticket> = (0..200).map(|_| waiting(l.enqueue(1))).collect();
        // Cancel a middle stretch, sparing every seventh ticket, with the head still blocked.
        let mut kept = Vec::new();
        let mut live = line.len();
        for (i, t) in line.iter().enumerate() {
            if (20..180).contains(&i) && i % 7 != 0 {
                assert_eq!(l.cancel(*t), Ok(Cancelled::Withdrawn));
                live -= 1;
                assert_eq!(l.poll_action(), None, "a middle cancel admits nobody");
                assert_eq!(l.waiting(), live, "waiting() counts live tickets exactly");
                assert!(l.queue.len() <= 2 * l.waiting() + 1, "tombstones bounded");
                assert_eq!(l.state(*t), TicketState::Done);
                assert_eq!(l.cancel(*t), Err(ReleaseError::AlreadyReleased));
            } else {
                kept.push(*t);
            }
        }
        assert_eq!((l.used(), l.granted()), (10, 1));
        // Admission walks past the tombstones in ticket order, as bytes come back.
        let mut held: VecDeque<Grant> = VecDeque::from([hold]);
        let mut admitted = Vec::new();
        while let Some(g) = held.pop_front() {
            l.release(g).unwrap();
            for g in drain(&mut l) {
                admitted.push(g.ticket());
                held.push_back(g);
            }
            assert_conserved(&l);
            assert_eq!(held.iter().map(|g| g.charged()).sum::<u64>(), l.used());
            assert!(
                l.used() == 10 || l.waiting() == 0,
                "the line is never left blocked"
            );
        }
        assert_eq!(
            admitted, kept,
            "exactly the surviving tickets, in ticket order"
        );
        assert_eq!((l.used(), l.waiting(), l.granted()), (0, 0, 0));
        assert!(l.queue.is_empty(), "no tombstone outlives the line");
    }

    #[test]
    fn cancelling_the_head_admits_past_tombstones_behind_it() {
        let mut l = limiter(10);
        let hold = granted(l.enqueue(5));
        let head = waiting(l.enqueue(10));
        let gone: Vec<Ticket> = (0..3).map(|_| waiting(l.enqueue(1))).collect();
        let next = waiting(l.enqueue(4));
        let last = waiting(l.enqueue(2));
        for t in &gone {
            assert_eq!(l.cancel(*t), Ok(Cancelled::Withdrawn));
        }
        assert_eq!(l.cancel(head), Ok(Cancelled::Withdrawn));
        let order: Vec<Ticket> = drain(&mut l).iter().map(|g| g.ticket()).collect();
        assert_eq!(order, [next], "4 B fits beside 5 B; 2 B more does not");
        assert_eq!((l.used(), l.waiting()), (9, 1));
        assert_eq!(l.state(last), TicketState::Waiting);
        assert_eq!(l.try_acquire(0), None, "a live waiter still blocks barging");
        l.release(hold).unwrap();
        assert_eq!(drain(&mut l)[0].ticket(), last);
    }

    #[test]
    fn cancelling_a_granted_ticket_releases_its_bytes_once() {
        let mut l = limiter(100);
        let g = granted(l.enqueue(70));
        let w = waiting(l.enqueue(70));
        assert_eq!(l.cancel(g.ticket()), Ok(Cancelled::Released));
        assert_eq!(drain(&mut l)[0].ticket(), w);
        assert_eq!(l.used(), 70);
        // The bytes came back once: neither path may return them again.
        assert_eq!(l.release(g), Err(ReleaseError::AlreadyReleased));
        assert_eq!(l.cancel(g.ticket()), Err(ReleaseError::AlreadyReleased));
        assert_eq!(l.used(), 70);
        assert_conserved(&l);
    }

    #[test]
    fn cancelling_an_admitted_ticket_before_its_proceed_is_drained_drops_the_proceed() {
        let mut l = limiter(10);
        let hold = granted(l.enqueue(10));
        let a = waiting(l.enqueue(10));
        let b = waiting(l.enqueue(10));
        l.release(hold).unwrap();
        // `a` was admitted, but its waiter gave up before hearing about it.
        assert_eq!(l.cancel(a), Ok(Cancelled::Released));
        let g = drain(&mut l);
        assert_eq!(g.len(), 1, "no Proceed for the cancelled ticket");
        assert_eq!(g[0].ticket(), b);
        assert_eq!((l.used(), l.granted()), (10, 1));
    }

    #[test]
    fn double_release_is_refused_and_changes_nothing() {
        let mut l = limiter(100);
        let a = granted(l.enqueue(40));
        let b = granted(l.enqueue(40));
        l.release(a).unwrap();
        let before = (l.used(), l.available(), l.granted());
        assert_eq!(l.release(a), Err(ReleaseError::AlreadyReleased));
        assert_eq!((l.used(), l.available(), l.granted()), before);
        assert_eq!(l.state(b.ticket()), TicketState::Granted);
    }

    #[test]
    fn bogus_tickets_are_unknown_and_change_nothing() {
        let mut l = limiter(100);
        let g = granted(l.enqueue(40));
        let w = waiting(l.enqueue(100));
        let never = Ticket::forged(1 << 62, 0);
        let far_slot = Ticket::forged(1 << 62, usize::MAX);
        assert_eq!(l.cancel(never), Err(ReleaseError::Unknown));
        assert_eq!(l.cancel(far_slot), Err(ReleaseError::Unknown));
        assert_eq!(
            l.release(Grant::forged(never, 40)),
            Err(ReleaseError::Unknown)
        );
        // A grant naming a ticket that is still waiting was not issued by this limiter.
        assert_eq!(l.release(Grant::forged(w, 100)), Err(ReleaseError::Unknown));
        assert_eq!(l.state(never), TicketState::Unknown);
        assert_eq!((l.used(), l.waiting(), l.granted()), (40, 1, 1));
        assert_eq!(l.state(g.ticket()), TicketState::Granted);
        assert_eq!(l.state(w), TicketState::Waiting);
    }

    #[test]
    fn withdrawn_ticket_cannot_be_cancelled_again() {
        let mut l = limiter(10);
        let _hold = granted(l.enqueue(10));
        let w = waiting(l.enqueue(5));
        assert_eq!(l.cancel(w), Ok(Cancelled::Withdrawn));
        assert_eq!(l.cancel(w), Err(ReleaseError::AlreadyReleased));
        assert_eq!(l.waiting(), 0);
    }

    #[test]
    fn ticket_ids_are_never_reused_even_after_the_limiter_goes_idle() {
        let mut l = limiter(10);
        let first = granted(l.enqueue(5));
        l.release(first).unwrap();
        // Idle: internal entries are recycled, but the old ticket stays finished.
        let second = granted(l.enqueue(5));
        assert!(second.ticket().id() > first.ticket().id());
        assert_eq!(l.state(first.ticket()), TicketState::Done);
        assert_eq!(l.release(first), Err(ReleaseError::AlreadyReleased));
        assert_eq!(l.state(second.ticket()), TicketState::Granted);
        assert_eq!(l.used(), 5);
    }

    #[test]
    fn extreme_sizes_and_limits_never_overflow() {
        let mut l = limiter(u64::MAX);
        let a = granted(l.enqueue(u64::MAX - 1));
        let b = granted(l.enqueue(1));
        assert_eq!((l.used(), l.available()), (u64::MAX, 0));
        let c = waiting(l.enqueue(u64::MAX));
        assert_eq!(l.try_acquire(u64::MAX), None);
        l.release(a).unwrap();
        assert_eq!(
            l.poll_action(),
            None,
            "the whole limit is needed, 1 byte is held"
        );
        l.release(b).unwrap();
        let g = drain(&mut l);
        assert_eq!((g[0].ticket(), g[0].charged()), (c, u64::MAX));
        assert_conserved(&l);
        l.release(g[0]).unwrap();
        assert_eq!((l.used(), l.available()), (0, u64::MAX));
    }

    #[test]
    fn zero_byte_ticket_at_the_head_is_admitted_beside_a_full_limit() {
        let mut l = limiter(10);
        let hold = granted(l.enqueue(10));
        let z = granted(l.enqueue(0));
        assert_eq!(z.charged(), 0);
        let big = waiting(l.enqueue(10));
        let z2 = waiting(l.enqueue(0));
        l.release(hold).unwrap();
        let order: Vec<Ticket> = drain(&mut l).iter().map(|g| g.ticket()).collect();
        assert_eq!(order, [big, z2]);
    }

    #[test]
    fn undrained_actions_stay_bounded_when_grants_are_released_unannounced() {
        let mut l = limiter(1);
        let mut hold = granted(l.enqueue(1));
        for _ in 0..1_000 {
            let next = waiting(l.enqueue(1));
            l.release(hold).unwrap();
            // Released without ever draining its Proceed.
            hold = Grant::forged(next, 1);
            assert_eq!(l.state(next), TicketState::Granted);
        }
        assert!(
            l.actions.len() <= 2 * l.granted() + 17,
            "{}",
            l.actions.len()
        );
        let g = drain(&mut l);
        assert_eq!(g.len(), 1, "only the live grant is announced");
        assert_eq!(g[0].ticket(), hold.ticket());
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn conservation_holds_through_a_random_mix_of_calls() {
        use crate::rng::{SplitMix64, below};
        let mut rng = SplitMix64::new(7);
        let mut l = limiter(64);
        let mut tickets: Vec<Ticket> = Vec::new();
        let mut grants: Vec<Grant> = Vec::new();
        for _ in 0..2_000 {
            match below(&mut rng, 4) {
                0 => match l.enqueue(below(&mut rng, 80)) {
                    Enqueued::Granted(g) => grants.push(g),
                    Enqueued::Waiting(t) => tickets.push(t),
                },
                1 if !grants.is_empty() => {
                    let i = below(&mut rng, grants.len() as u64) as usize;
                    let _ = l.release(grants[i]);
                }
                2 if !tickets.is_empty() => {
                    let i = below(&mut rng, tickets.len() as u64) as usize;
                    let _ = l.cancel(tickets[i]);
                }
                _ => {
                    if let Some(g) = l.try_acquire(below(&mut rng, 80)) {
                        grants.push(g);
                    }
                }
            }
            grants.extend(drain(&mut l));
            assert_conserved(&l);
            let live: u64 = grants
                .iter()
                .filter(|g| l.state(g.ticket()) == TicketState::Granted)
                .map(|g| g.charged())
                .sum();
            assert_eq!(live, l.used());
        }
    }
}
