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
//! drained with [`PendingBytesLimiter::poll_action`]. The async layer (`throttle_sansio::sync`)
//! wakes exactly those waiters. See `docs/pending-bytes.md` for the state diagram.

use alloc::collections::VecDeque;

use crate::error::{ConfigError, ReleaseError};
use crate::slab::Slab;
pub use crate::slab::{Exhausted, Ticket};

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
    /// The default bound: 256 MiB, the Oxia Java client's `maxPendingBytes` default (PR #348,
    /// the limiter PR #362 relies on), i.e. 2048 full write batches of the batcher's default
    /// 128 KiB.
    pub const DEFAULT_MAX_PENDING_BYTES: u64 = 256 * 1024 * 1024;

    /// Admit at most `max_pending_bytes` bytes at once; `0` disables the limiter.
    #[must_use]
    pub const fn with_max_pending_bytes(mut self, max_pending_bytes: u64) -> Self {
        self.max_pending_bytes = max_pending_bytes;
        self
    }

    /// A limiter that admits every operation at once and counts nothing (the same as
    /// `with_max_pending_bytes(0)`).
    pub const fn disabled() -> Self {
        PendingBytesConfig {
            max_pending_bytes: 0,
        }
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
    /// The Oxia Java client's default: `maxPendingBytes` = 256 MiB (PR #348),
    /// [`DEFAULT_MAX_PENDING_BYTES`](Self::DEFAULT_MAX_PENDING_BYTES).
    fn default() -> Self {
        PendingBytesConfig {
            max_pending_bytes: Self::DEFAULT_MAX_PENDING_BYTES,
        }
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
    Waiting,
    Granted,
}

#[derive(Debug, Clone)]
struct Slot {
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
/// use throttle_sansio::pending_bytes::{
///     Enqueued, PendingBytesAction, PendingBytesConfig, PendingBytesLimiter,
/// };
///
/// let mut limiter = PendingBytesLimiter::new(PendingBytesConfig::default().with_max_pending_bytes(100));
/// let Ok(Enqueued::Granted(big)) = limiter.enqueue(80) else { unreachable!() };
/// // 30 bytes do not fit beside 80: the ticket waits, and a later 10 may not barge past it.
/// let Ok(Enqueued::Waiting(ticket)) = limiter.enqueue(30) else { unreachable!() };
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
    /// Live tickets (waiting or admitted), by ticket.
    tickets: Slab<Slot>,
    /// Waiting tickets in ticket order (ids strictly increasing front to back), plus
    /// tombstones: entries of tickets cancelled while waiting, recognised by no longer being
    /// live in the `Waiting` state. Cancelling only frees the ticket, so it is O(1);
    /// tombstones are dropped when they reach the head, or all at once when they outnumber
    /// the live entries (amortised O(1), and at most twice `waiting` entries).
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
            tickets: Slab::new(),
            queue: VecDeque::new(),
            waiting: 0,
            actions: VecDeque::new(),
            granted: 0,
        }
    }

    /// Gives the limiter the instance tag `tag` (for targets without 32-bit atomics, where
    /// every limiter otherwise has tag 0). Call it on a fresh limiter: tickets issued before
    /// are no longer recognised.
    #[must_use]
    pub fn with_instance_tag(mut self, tag: u32) -> Self {
        self.tickets.set_tag(tag);
        self
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
        match self.tickets.get(ticket.0) {
            Some(slot) => match slot.state {
                SlotState::Waiting => TicketState::Waiting,
                SlotState::Granted => TicketState::Granted,
            },
            None if self.tickets.issued(ticket.0) => TicketState::Done,
            None => TicketState::Unknown,
        }
    }

    /// Asks for `bytes`: admitted at once if no ticket is waiting and the charge fits,
    /// otherwise queued behind every earlier ticket.
    ///
    /// Ticket ids never wrap: once the limiter has issued `u64::MAX - 1` of them it refuses
    /// new ones with [`Exhausted`] (nothing changes), while issued tickets still release.
    pub fn enqueue(&mut self, bytes: u64) -> Result<Enqueued, Exhausted> {
        let charged = self.charge_for(bytes);
        if self.waiting == 0 && charged <= self.available() {
            self.admit_new(charged).map(Enqueued::Granted)
        } else {
            let ticket = self.issue(charged, SlotState::Waiting)?;
            self.queue.push_back(ticket);
            self.waiting += 1;
            Ok(Enqueued::Waiting(ticket))
        }
    }

    /// Admits `bytes` only if that needs no waiting: `None` while any ticket waits (no
    /// barging, even for a request that would fit), when the charge does not fit, or once the
    /// ids are spent ([`enqueue`](Self::enqueue) tells that case apart). A refusal issues no
    /// ticket and changes nothing.
    pub fn try_acquire(&mut self, bytes: u64) -> Option<Grant> {
        let charged = self.charge_for(bytes);
        if self.waiting == 0 && charged <= self.available() {
            self.admit_new(charged).ok()
        } else {
            None
        }
    }

    /// Gives a grant's bytes back and admits the waiting tickets that now fit, in order (drain
    /// them with [`poll_action`](Self::poll_action)).
    ///
    /// A grant already released (or whose ticket was cancelled) is refused with
    /// [`ReleaseError::AlreadyReleased`], one this limiter never issued (another limiter's,
    /// say) with [`ReleaseError::Unknown`]; either way nothing changes.
    pub fn release(&mut self, grant: Grant) -> Result<(), ReleaseError> {
        match self.tickets.get(grant.ticket.0).map(|s| s.state) {
            Some(SlotState::Granted) => {
                self.finish_granted(grant.ticket);
                Ok(())
            }
            // A grant naming a waiting ticket cannot have come from this limiter.
            Some(SlotState::Waiting) => Err(ReleaseError::Unknown),
            None => Err(self.tickets.refusal(grant.ticket.0)),
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
        match self.tickets.get(ticket.0).map(|s| s.state) {
            Some(SlotState::Granted) => {
                self.finish_granted(ticket);
                Ok(Cancelled::Released)
            }
            Some(SlotState::Waiting) => {
                // Freeing the ticket turns its queue entry into a tombstone: no search, no
                // shifting. Only the head can block the line, so the admission pass below
                // admits somebody only if this ticket was the (live) head.
                let _ = self.tickets.remove(ticket.0);
                self.waiting = self.waiting.saturating_sub(1);
                self.admit_waiting();
                self.compact_queue();
                self.reset_if_idle();
                Ok(Cancelled::Withdrawn)
            }
            None => Err(self.tickets.refusal(ticket.0)),
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

    fn is_granted(&self, ticket: Ticket) -> bool {
        self.tickets
            .get(ticket.0)
            .is_some_and(|s| s.state == SlotState::Granted)
    }

    fn is_waiting(tickets: &Slab<Slot>, ticket: Ticket) -> bool {
        tickets
            .get(ticket.0)
            .is_some_and(|s| s.state == SlotState::Waiting)
    }

    fn issue(&mut self, charged: u64, state: SlotState) -> Result<Ticket, Exhausted> {
        self.tickets
            .insert(Slot { charged, state })
            .map(Ticket)
            .map_err(|(e, _)| e)
    }

    /// Admits a new ticket whose charge the caller has checked fits.
    fn admit_new(&mut self, charged: u64) -> Result<Grant, Exhausted> {
        let ticket = self.issue(charged, SlotState::Granted)?;
        self.used = self.used.saturating_add(charged);
        self.granted += 1;
        Ok(Grant { ticket, charged })
    }

    /// Releases a ticket known to be admitted, then lets the line move.
    fn finish_granted(&mut self, ticket: Ticket) {
        let charged = self.tickets.remove(ticket.0).map_or(0, |s| s.charged);
        self.used = self.used.saturating_sub(charged);
        self.granted = self.granted.saturating_sub(1);
        self.admit_waiting();
        self.reset_if_idle();
    }

    /// Admits waiting tickets from the front for as long as the head fits: strict FIFO, so a
    /// head that does not fit holds back everything behind it.
    /// Tombstones at the head are dropped on the way.
    fn admit_waiting(&mut self) {
        while let Some(&head) = self.queue.front() {
            let Some(slot) = self
                .tickets
                .get_mut(head.0)
                .filter(|s| s.state == SlotState::Waiting)
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
            let tickets = &self.tickets;
            self.queue.retain(|&t| Self::is_waiting(tickets, t));
        }
    }

    fn push_action(&mut self, grant: Grant) {
        // Entries go stale only when a caller releases before draining; compacting once they
        // outnumber the admitted tickets keeps the queue bounded even if nobody drains.
        if self.actions.len() >= self.granted.saturating_mul(2).saturating_add(16) {
            let tickets = &self.tickets;
            self.actions.retain(|g| {
                tickets
                    .get(g.ticket.0)
                    .is_some_and(|s| s.state == SlotState::Granted)
            });
        }
        self.actions.push_back(grant);
    }

    /// With no ticket live, every entry is free and every queued action stale: forget them
    /// (keeping capacity, so the next busy period allocates nothing).
    fn reset_if_idle(&mut self) {
        if self.granted == 0 && self.waiting == 0 {
            self.tickets.reset_if_empty();
            self.actions.clear();
            self.queue.clear(); // only tombstones can be left
        }
    }

    /// The limiter's instance tag (carried by every ticket it issues).
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn instance_tag(&self) -> u32 {
        self.tickets.tag()
    }

    /// Moves the ticket-id counter forward, to test the end of the id space.
    #[cfg(test)]
    pub(crate) fn skip_ids_to(&mut self, next: u64) {
        self.tickets.skip_generations_to(next);
    }
}

#[cfg(test)]
mod tests;
