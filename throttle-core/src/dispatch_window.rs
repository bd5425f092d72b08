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
//! See `docs/dispatch-window.md` for the state diagram.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::hash::{BuildHasher, Hash};

use hashbrown::HashTable;

use crate::error::{ConfigError, ReleaseError};
pub use crate::maintenance::MAINTENANCE_INTERVAL;
use crate::maintenance::{Maintenance, Peak};
use crate::time::{Clock, Instant};

/// Option name used in configuration errors.
const MAX_IN_FLIGHT_OPTION: &str = "client.dispatch.max-batches-in-flight";

/// Configuration of a [`DispatchWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WindowConfig {
    max_in_flight: u32,
}

impl Default for WindowConfig {
    /// The Oxia Java client's default for `maxReadBatchesInFlight` (PR #362) and
    /// `maxWriteBatchesInFlight` (PR #360): 4.
    fn default() -> Self {
        WindowConfig { max_in_flight: 4 }
    }
}

impl WindowConfig {
    /// At most `n` batches outstanding per shard (must be at least 1).
    #[must_use]
    pub fn with_max_in_flight(mut self, n: u32) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Batches allowed outstanding per shard.
    pub fn max_in_flight(&self) -> u32 {
        self.max_in_flight
    }

    /// Refuses a window of zero batches (it could never send anything).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_in_flight == 0 {
            return Err(ConfigError::OutOfRange {
                option: MAX_IN_FLIGHT_OPTION,
                got: 0,
                min: 1,
                max: u64::from(u32::MAX),
                unit: "batches",
            });
        }
        Ok(())
    }
}

/// One credit of a shard's window, held by exactly one batch in flight.
///
/// Ids are never reused by the window that issued them: each carries a generation drawn from
/// a counter that only grows. Ids from a different window are meaningless to this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CreditId {
    slot: u32,
    generation: u64,
}

impl CreditId {
    /// The slab slot this credit occupies while it is live (dense, reused after release).
    #[inline]
    pub(crate) fn slot(self) -> usize {
        self.slot as usize
    }

    /// Builds an arbitrary id: for tests and model checkers that forge bogus credits.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn forge(slot: u32, generation: u64) -> Self {
        CreditId { slot, generation }
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

/// A batch the window refused; the batch is handed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError<B> {
    /// The window was closed by [`DispatchWindow::fail_all`] (or ran out of credit ids).
    #[error("dispatch window is closed")]
    Closed(B),
    /// `submit_or_park` found a batch already parked for the shard; reclaim it first.
    #[error("the shard already has a parked batch")]
    AlreadyParked(B),
}

impl<B> SubmitError<B> {
    /// The refused batch.
    pub fn into_batch(self) -> B {
        match self {
            SubmitError::Closed(b) | SubmitError::AlreadyParked(b) => b,
        }
    }
}

/// What a shard's window holds. Once all three are empty the shard is idle: the entry stays in
/// the map (so the next batch for the shard finds it without an insert) until maintenance or
/// a growing map evicts it.
#[derive(Clone, Debug)]
struct ShardWindow<B> {
    in_flight: u32,
    queued: VecDeque<B>,
    parked: Option<B>,
    /// `queued` is one of the window's pooled queue buffers (counted in `queues_held`), taken
    /// when the shard first had to queue; it goes back to the pool when the shard idles.
    owns_queue: bool,
}

impl<B> ShardWindow<B> {
    fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.queued.is_empty() && self.parked.is_none()
    }
}

/// What a live credit's slot remembers: its generation, its shard and the shard's hash (so
/// that [`DispatchWindow::complete`] finds the shard's window without hashing the key again).
#[derive(Clone, Debug)]
struct LiveCredit<Shard> {
    generation: u64,
    hash: u64,
    shard: Shard,
}

/// Live credits: a slab of slots, each remembering the generation and shard of its credit.
///
/// The slab never holds more slots than the peak number of credits live at once; freed slots
/// are reused. Ids stay unique because the generation comes from one counter for the whole
/// window, not from the slot.
#[derive(Clone, Debug)]
struct CreditSlab<Shard> {
    slots: Vec<Option<LiveCredit<Shard>>>,
    free: Vec<u32>,
    live: usize,
    peak_live: Peak,
    /// Generation of the next credit; generations `1..next_generation` have been issued.
    next_generation: u64,
}

impl<Shard> CreditSlab<Shard> {
    fn new() -> Self {
        CreditSlab {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            peak_live: Peak::default(),
            next_generation: 1,
        }
    }

    /// A fresh credit for `shard`, or `None` once the id space is spent (after
    /// `u64::MAX - 1` credits, or `u32::MAX` credits live at once).
    #[inline]
    fn issue(&mut self, shard: Shard, hash: u64) -> Option<CreditId> {
        let generation = self.next_generation;
        if generation == u64::MAX {
            return None;
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let slot = u32::try_from(self.slots.len()).ok()?;
                self.slots.push(None);
                slot
            }
        };
        match self.slots.get_mut(slot as usize) {
            Some(entry) => {
                *entry = Some(LiveCredit {
                    generation,
                    hash,
                    shard,
                })
            }
            None => {
                // Unreachable: free slots and fresh pushes are in range. Keep the slot free.
                self.free.push(slot);
                return None;
            }
        }
        self.next_generation = generation.saturating_add(1);
        self.live = self.live.saturating_add(1);
        self.peak_live.see(self.live);
        Some(CreditId { slot, generation })
    }

    /// Maintenance: once the recent peak of live credits is below a quarter of the slab's
    /// capacity, drops the free slots at its end and shrinks it (generations are untouched,
    /// so ids stay unique).
    fn shrink(&mut self, m: &Maintenance) {
        let peak = self.peak_live.roll(self.live);
        let Some(target) = m.target(self.slots.capacity(), peak) else {
            return;
        };
        while matches!(self.slots.last(), Some(None)) {
            self.slots.pop();
        }
        let len = self.slots.len();
        self.free.retain(|&slot| (slot as usize) < len);
        self.slots.shrink_to(target);
        if let Some(target) = m.target(self.free.capacity(), peak) {
            self.free.shrink_to(target);
        }
    }

    /// Frees a live credit and returns its shard and the shard's hash. Nothing changes on
    /// error.
    ///
    /// A credit that is not live is `AlreadyReleased` when its generation has been issued
    /// (`1..next_generation`), `Unknown` otherwise. A forged id whose generation was issued to
    /// a different slot is therefore reported as `AlreadyReleased`; telling the two apart
    /// exactly would mean remembering every credit ever issued.
    #[inline]
    fn release(&mut self, credit: CreditId) -> Result<(Shard, u64), ReleaseError> {
        let entry = self.slots.get_mut(credit.slot());
        if let Some(entry) = entry
            && matches!(entry, Some(c) if c.generation == credit.generation)
            && let Some(c) = entry.take()
        {
            self.free.push(credit.slot);
            self.live = self.live.saturating_sub(1);
            return Ok((c.shard, c.hash));
        }
        if credit.generation >= 1 && credit.generation < self.next_generation {
            Err(ReleaseError::AlreadyReleased)
        } else {
            Err(ReleaseError::Unknown)
        }
    }
}

/// What [`DispatchWindow::try_take`] did.
#[cfg(feature = "std")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Take {
    /// A credit was issued.
    Credit(CreditId),
    /// The shard has no free credit, or holds batches back.
    NoCredit,
    /// The window is closed (by `fail_all`, or its id space is spent).
    Closed,
}

/// Per-shard credit windows with FIFO hold-back of batches that find no credit.
///
/// Generic over the shard key `Shard`, the batch type `B` (opaque to the window) and the
/// hasher `S` (shard keys may come from remote metadata, so pick a keyed hasher).
///
/// # Driving contract
///
/// - Inputs: [`submit`](Self::submit) (a full batch), [`submit_or_park`](Self::submit_or_park)
///   (the shard's open batch), [`reclaim`](Self::reclaim), [`complete`](Self::complete) (once
///   per credit, when the batch's RPC ends for any reason), [`fail_all`](Self::fail_all) (close).
/// - Outputs: each input that may send returns `Ok(Some(Dispatch))`; send it after the call
///   returns. There is at most one dispatch per call, so there is no `poll_action`.
/// - Queries (`&self`): [`in_flight`](Self::in_flight), [`available`](Self::available),
///   [`queued`](Self::queued), [`is_parked`](Self::is_parked),
///   [`shard_count`](Self::shard_count), [`live_credits`](Self::live_credits),
///   [`is_closed`](Self::is_closed).
/// - Maintenance: when [`poll_timeout`](Self::poll_timeout) returns a deadline, call
///   [`handle_timeout(now)`](Self::handle_timeout) once it has passed (calling it earlier or
///   more often is harmless: it runs at most once per [`MAINTENANCE_INTERVAL`]). It is the only
///   place memory is given back. Time plays no other part: credits never expire.
///
/// Invariants after every call: per shard `in_flight + available == capacity`; a shard with
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
/// credit slab and a pool of queue buffers (one per shard that had to queue at the recent
/// peak) keep their capacity between bursts; `handle_timeout` shrinks each of them only once
/// the peak use since its previous run is below a quarter of the capacity, and then to twice
/// that peak, so an idle window returns its memory within two runs.
///
/// ```
/// use throttle_core::dispatch_window::{DispatchWindow, WindowConfig};
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
/// let next = w.complete(first.credit).unwrap().expect("the release sends the queued batch");
/// assert_eq!(next.batch, "b");
/// assert!(w.complete(first.credit).is_err()); // a second release changes nothing
/// ```
#[derive(Clone, Debug)]
pub struct DispatchWindow<Shard, B, S> {
    cfg: WindowConfig,
    /// Every shard with work, plus idle shards not yet evicted, with the hash by `hasher` of
    /// the shard that placed each entry (a live credit remembers it, so releases do not hash
    /// again, and growing the table rehashes nothing).
    shards: HashTable<(Shard, u64, ShardWindow<B>)>,
    hasher: S,
    /// Entries of `shards` that are not idle.
    active: usize,
    credits: CreditSlab<Shard>,
    closed: bool,
    /// Queue buffers of shards that went idle, for the next shard that has to queue.
    spare_queues: Vec<VecDeque<B>>,
    /// Shard windows owning a pooled queue buffer; with `spare_queues`, every buffer.
    queues_held: usize,
    peak_queues_held: Peak,
    peak_queue_len: Peak,
    peak_shards: Peak,
    clock: Clock,
    maintenance: Maintenance,
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
        Ok(DispatchWindow {
            cfg,
            shards: HashTable::new(),
            hasher,
            active: 0,
            credits: CreditSlab::new(),
            closed: false,
            spare_queues: Vec::new(),
            queues_held: 0,
            peak_queues_held: Peak::default(),
            peak_queue_len: Peak::default(),
            peak_shards: Peak::default(),
            clock: Clock::default(),
            maintenance: Maintenance::default(),
        })
    }

    /// Sends a full batch at once if the shard has credit, else queues it behind the shard's
    /// older held-back batches (FIFO). `Ok(None)` means queued.
    pub fn submit(
        &mut self,
        shard: Shard,
        batch: B,
    ) -> Result<Option<Dispatch<Shard, B>>, SubmitError<B>> {
        self.enter(shard, batch, false)
    }

    /// Sends the shard's open batch at once if the shard has credit, else parks it, where it
    /// can be [`reclaim`](Self::reclaim)ed to keep growing. `Ok(None)` means parked.
    ///
    /// A shard has at most one parked batch: a second one is refused with
    /// [`SubmitError::AlreadyParked`].
    pub fn submit_or_park(
        &mut self,
        shard: Shard,
        batch: B,
    ) -> Result<Option<Dispatch<Shard, B>>, SubmitError<B>> {
        self.enter(shard, batch, true)
    }

    fn enter(
        &mut self,
        shard: Shard,
        batch: B,
        park: bool,
    ) -> Result<Option<Dispatch<Shard, B>>, SubmitError<B>> {
        if self.closed {
            return Err(SubmitError::Closed(batch));
        }
        self.maintenance.touch();
        let cap = self.cfg.max_in_flight;
        let hash = self.hasher.hash_one(&shard);
        if let Some((_, _, w)) = self.shards.find_mut(hash, |(k, _, _)| *k == shard) {
            if park && w.parked.is_some() {
                return Err(SubmitError::AlreadyParked(batch));
            }
            let has_credit = w.in_flight < cap && w.queued.is_empty() && w.parked.is_none();
            if !has_credit {
                if park {
                    w.parked = Some(batch);
                } else {
                    if !w.owns_queue && w.queued.capacity() == 0 {
                        // First time this shard queues: take a pooled buffer if there is one,
                        // so the number of buffers follows the peak of shards queueing at once.
                        if let Some(q) = self.spare_queues.pop() {
                            w.queued = q;
                        }
                        w.owns_queue = true;
                        self.queues_held = self.queues_held.saturating_add(1);
                        self.peak_queues_held.see(self.queues_held);
                    }
                    w.queued.push_back(batch);
                    self.peak_queue_len.see(w.queued.len());
                }
                return Ok(None);
            }
            let Some(credit) = self.credits.issue(shard.clone(), hash) else {
                self.closed = true;
                return Err(SubmitError::Closed(batch));
            };
            if w.in_flight == 0 {
                // It had credit, so nothing was held back: it was idle until now.
                self.active = self.active.saturating_add(1);
            }
            w.in_flight = w.in_flight.saturating_add(1);
            return Ok(Some(Dispatch {
                shard,
                credit,
                batch,
            }));
        }
        let Some(credit) = self.open_shard(&shard, hash) else {
            return Err(SubmitError::Closed(batch));
        };
        Ok(Some(Dispatch {
            shard,
            credit,
            batch,
        }))
    }

    /// First use of `shard` (not in the map): its window starts with the credit returned
    /// (`cap >= 1`, so it has one). `None` closes the window (id space spent). `hash` must be
    /// this window's own hash of `shard`: it places the entry.
    fn open_shard(&mut self, shard: &Shard, hash: u64) -> Option<CreditId> {
        let Some(credit) = self.credits.issue(shard.clone(), hash) else {
            self.closed = true;
            return None;
        };
        self.make_room();
        self.active = self.active.saturating_add(1);
        self.shards.insert_unique(
            hash,
            (
                shard.clone(),
                hash,
                ShardWindow {
                    in_flight: 1,
                    queued: VecDeque::new(),
                    parked: None,
                    owns_queue: false,
                },
            ),
            |&(_, own, _)| own,
        );
        self.peak_shards.see(self.shards.len());
        Some(credit)
    }

    /// For the `sync` handle: a credit of `shard` if it has one free (and holds nothing back),
    /// with one lookup of the shard; nothing is ever queued or parked.
    ///
    /// `hash` is the shard's hash by a clone of this window's hasher, computed by the caller
    /// before it took its lock (so the lock is not held while hashing). It is only a hint:
    /// before a shard is added, the window hashes it itself, so a clone that hashed
    /// differently costs a second lookup, never a second entry for the same shard.
    #[cfg(feature = "std")]
    #[inline]
    pub(crate) fn try_take(&mut self, shard: &Shard, hash: u64) -> Take {
        if self.closed {
            return Take::Closed;
        }
        self.maintenance.touch();
        let cap = self.cfg.max_in_flight;
        let (hash, w) = match self.shards.find_mut(hash, |(k, _, _)| k == shard) {
            // The entry's own hash, not the hint that found it: after the table grows, only
            // the hash the entry was placed by is sure to find it again.
            Some((_, own, w)) => (*own, w),
            None => {
                let own = self.hasher.hash_one(shard);
                let again = if own == hash {
                    None
                } else {
                    self.shards.find_mut(own, |(k, _, _)| k == shard)
                };
                match again {
                    Some((_, _, w)) => (own, w),
                    None => {
                        return match self.open_shard(shard, own) {
                            Some(credit) => Take::Credit(credit),
                            None => Take::Closed,
                        };
                    }
                }
            }
        };
        if w.in_flight >= cap || !w.queued.is_empty() || w.parked.is_some() {
            return Take::NoCredit;
        }
        let Some(credit) = self.credits.issue(shard.clone(), hash) else {
            self.closed = true;
            return Take::Closed;
        };
        if w.in_flight == 0 {
            self.active = self.active.saturating_add(1);
        }
        w.in_flight = w.in_flight.saturating_add(1);
        Take::Credit(credit)
    }

    /// Takes the shard's parked batch back (to add operations to it), if there is one.
    pub fn reclaim(&mut self, shard: &Shard) -> Option<B> {
        let hash = self.hasher.hash_one(shard);
        let (_, _, w) = self.shards.find_mut(hash, |(k, _, _)| k == shard)?;
        let batch = w.parked.take()?;
        self.maintenance.touch();
        if w.is_idle() {
            Self::went_idle(
                w,
                &mut self.active,
                &mut self.queues_held,
                &mut self.spare_queues,
            );
        }
        Some(batch)
    }

    /// Releases `credit` exactly once and returns the shard's next batch to send: the oldest
    /// queued one, else the parked one, else nothing.
    ///
    /// Call it once per dispatched batch when its RPC ends, whatever the outcome.
    /// An unknown or already-released credit is an `Err` and changes nothing; a forged id is
    /// never mistaken for a live one. After [`fail_all`](Self::fail_all) a live credit is
    /// still released (`Ok(None)`): its slot frees and nothing is sent.
    #[inline]
    pub fn complete(
        &mut self,
        credit: CreditId,
    ) -> Result<Option<Dispatch<Shard, B>>, ReleaseError> {
        let (shard, hash, w) = Self::release_slot(&mut self.credits, &mut self.shards, credit)?;
        self.maintenance.touch();
        let Some(w) = w else {
            // Unreachable: a live credit's shard always has a window, found by the hash that
            // placed it. Nothing to release there.
            debug_assert!(false, "a live credit's shard has no window");
            return Ok(None);
        };
        let mut next = None;
        if !self.closed {
            let (batch, from_queue) = match w.queued.pop_front() {
                Some(b) => (Some(b), true),
                None => (w.parked.take(), false),
            };
            if let Some(batch) = batch {
                match self.credits.issue(shard.clone(), hash) {
                    Some(credit) => {
                        w.in_flight = w.in_flight.saturating_add(1);
                        next = Some(Dispatch {
                            shard: shard.clone(),
                            credit,
                            batch,
                        });
                    }
                    None => {
                        // Id space spent: put the batch back and close; fail_all hands it out.
                        if from_queue {
                            w.queued.push_front(batch);
                        } else {
                            w.parked = Some(batch);
                        }
                        self.closed = true;
                    }
                }
            }
        }
        if w.is_idle() {
            Self::went_idle(
                w,
                &mut self.active,
                &mut self.queues_held,
                &mut self.spare_queues,
            );
        }
        Ok(next)
    }

    /// For the `sync` handle, whose window never holds a batch back (it takes credit only
    /// through [`try_take`](Self::try_take)): releases `credit` exactly once, with nothing to
    /// dispatch. Small enough to inline, unlike [`complete`](Self::complete).
    #[cfg(feature = "std")]
    #[inline]
    pub(crate) fn release_credit(&mut self, credit: CreditId) -> Result<(), ReleaseError> {
        let (_, _, w) = Self::release_slot(&mut self.credits, &mut self.shards, credit)?;
        self.maintenance.touch();
        debug_assert!(w.is_some(), "a live credit's shard has no window");
        if let Some(w) = w
            && w.is_idle()
        {
            Self::went_idle(
                w,
                &mut self.active,
                &mut self.queues_held,
                &mut self.spare_queues,
            );
        }
        Ok(())
    }

    /// Frees `credit`'s slot and takes the credit off its shard's count: the shard, its hash
    /// and its window (always there for a live credit). Nothing changes on error.
    #[inline]
    fn release_slot<'w>(
        credits: &mut CreditSlab<Shard>,
        shards: &'w mut HashTable<(Shard, u64, ShardWindow<B>)>,
        credit: CreditId,
    ) -> Result<(Shard, u64, Option<&'w mut ShardWindow<B>>), ReleaseError> {
        let (shard, hash) = credits.release(credit)?;
        let w = shards
            .find_mut(hash, |(k, _, _)| *k == shard)
            .map(|(_, _, w)| {
                w.in_flight = w.in_flight.saturating_sub(1);
                w
            });
        Ok((shard, hash, w))
    }

    /// Closes the window and returns every held-back batch (queued, then parked, per shard;
    /// shards in no particular order). None of them was ever dispatched. Batches in flight are
    /// untouched: complete their credits as usual (`Ok(None)`). Later submits are refused
    /// with [`SubmitError::Closed`], which hands the batch back.
    pub fn fail_all(&mut self) -> Vec<(Shard, B)> {
        self.closed = true;
        self.maintenance.touch();
        let mut out = Vec::new();
        for (shard, _, w) in self.shards.iter_mut() {
            for batch in w.queued.drain(..) {
                out.push((shard.clone(), batch));
            }
            if let Some(batch) = w.parked.take() {
                out.push((shard.clone(), batch));
            }
            if w.owns_queue {
                // Closed: the shard never queues again, so its buffer goes back to the pool
                // (and from there, at maintenance, back to the allocator).
                w.owns_queue = false;
                self.queues_held = self.queues_held.saturating_sub(1);
                self.spare_queues.push(core::mem::take(&mut w.queued));
            }
        }
        self.shards.retain(|(_, _, w)| !w.is_idle());
        self.active = self.shards.len();
        out
    }

    /// Bookkeeping for a shard whose window just became idle: it no longer counts as active,
    /// and its queue buffer goes back to the pool at once (as if the entry were removed), so
    /// idle entries hold no buffers and the pool follows the shards queueing now.
    #[inline]
    fn went_idle(
        w: &mut ShardWindow<B>,
        active: &mut usize,
        queues_held: &mut usize,
        spare_queues: &mut Vec<VecDeque<B>>,
    ) {
        *active = active.saturating_sub(1);
        if core::mem::take(&mut w.owns_queue) {
            *queues_held = queues_held.saturating_sub(1);
            spare_queues.push(core::mem::take(&mut w.queued));
        }
    }

    /// Before inserting a new shard: if the map is full (the insert would grow it) and at
    /// least half of its entries are idle, evicts the idle ones instead of growing. Each scan
    /// frees at least half the entries, so it runs at most once per that many inserts
    /// (amortized O(1), like the rehash it replaces), and the map stays within about twice the
    /// shards active at once even if maintenance never runs (the `sync` handle never runs it).
    fn make_room(&mut self) {
        // `capacity()` is `len` plus the inserts left before the table must rehash or grow.
        let len = self.shards.len();
        if len < self.shards.capacity() {
            return;
        }
        if len.saturating_sub(self.active).saturating_mul(2) >= len {
            self.shards.retain(|(_, _, w)| !w.is_idle());
        }
    }

    /// Maintenance: gives memory back, once at most per [`MAINTENANCE_INTERVAL`].
    ///
    /// Each collection (the shard map, the queue-buffer pool, each spare buffer, the credit
    /// slab) shrinks only if the peak use seen since the previous run is below a quarter of its
    /// capacity, and then to twice that peak, so a workload that repeats within the interval
    /// keeps what it uses and allocates nothing. Spare queue buffers beyond the peak number of
    /// shards that queued at once are freed.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        if !self.maintenance.begin(now) {
            return;
        }
        // Idle shards' entries go first (they hold no queue buffer); the peak still counts
        // them, so a shard set that comes back within the interval finds the capacity.
        if self.shards.len() > self.active {
            self.shards.retain(|(_, _, w)| !w.is_idle());
        }
        let peak = self.peak_shards.roll(self.shards.len());
        if let Some(target) = self.maintenance.target(self.shards.capacity(), peak) {
            self.shards.shrink_to(target, |&(_, own, _)| own);
        }
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
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next run, or `None` while it has
    /// nothing to give back (no input since a run that followed a quiet period).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.maintenance.deadline()
    }

    /// `shard`'s window, if it has an entry.
    fn window(&self, shard: &Shard) -> Option<&ShardWindow<B>> {
        let hash = self.hasher.hash_one(shard);
        self.shards
            .find(hash, |(k, _, _)| k == shard)
            .map(|(_, _, w)| w)
    }

    /// Batches allowed outstanding per shard.
    pub fn capacity(&self) -> u32 {
        self.cfg.max_in_flight
    }

    /// Batches of `shard` in flight (holding a credit).
    pub fn in_flight(&self, shard: &Shard) -> u32 {
        self.window(shard).map_or(0, |w| w.in_flight)
    }

    /// Credits of `shard` not in use: `capacity() - in_flight(shard)`.
    pub fn available(&self, shard: &Shard) -> u32 {
        self.cfg.max_in_flight.saturating_sub(self.in_flight(shard))
    }

    /// Full batches of `shard` waiting for credit.
    pub fn queued(&self, shard: &Shard) -> usize {
        self.window(shard).map_or(0, |w| w.queued.len())
    }

    /// Whether `shard` has a parked open batch.
    pub fn is_parked(&self, shard: &Shard) -> bool {
        self.parked(shard).is_some()
    }

    /// `shard`'s parked open batch, if any.
    pub fn parked(&self, shard: &Shard) -> Option<&B> {
        self.window(shard).and_then(|w| w.parked.as_ref())
    }

    /// Shards with anything in flight, queued or parked.
    ///
    /// Idle shards are not counted, although their (empty) entries stay in the map until the
    /// next [`handle_timeout`](Self::handle_timeout) run, or until the map would otherwise
    /// grow, evicts them.
    pub fn shard_count(&self) -> usize {
        self.active
    }

    /// Entries in the shard map: the active shards plus idle ones not yet evicted.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn tracked_shards(&self) -> usize {
        self.shards.len()
    }

    /// Credits live across all shards.
    pub fn live_credits(&self) -> usize {
        self.credits.live
    }

    /// Whether submits are refused: after [`fail_all`](Self::fail_all), or once the window
    /// has issued `u64::MAX - 1` credits (then call `fail_all` to collect held-back batches).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Slots of the credit slab: every live credit's `slot()` is below this.
    pub(crate) fn credit_slots(&self) -> usize {
        self.credits.slots.len()
    }

    /// Sets the capacity collections keep when they shrink, so model checks reach shrinking.
    #[cfg(feature = "model")]
    pub(crate) fn set_shrink_floor(&mut self, floor: usize) {
        self.maintenance.set_floor(floor);
    }

    /// Moves the credit-id counter forward, to test the end of the id space.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn skip_generations_to(&mut self, next_generation: u64) {
        self.credits.next_generation = self.credits.next_generation.max(next_generation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maintenance::MIN_CAPACITY;
    use crate::test_hasher::TestHasher;
    use alloc::vec;
    use core::time::Duration;

    type Window = DispatchWindow<u32, &'static str, TestHasher>;

    fn window(max_in_flight: u32) -> Window {
        match Window::new(WindowConfig::default().with_max_in_flight(max_in_flight)) {
            Ok(w) => w,
            Err(e) => panic!("valid config refused: {e}"),
        }
    }

    /// Sends at once, or fails the test.
    fn sent(
        r: Result<Option<Dispatch<u32, &'static str>>, SubmitError<&'static str>>,
    ) -> Dispatch<u32, &'static str> {
        match r {
            Ok(Some(d)) => d,
            other => panic!("expected a dispatch, got {other:?}"),
        }
    }

    fn conserved(w: &Window, shards: &[u32]) {
        for s in shards {
            assert_eq!(w.in_flight(s) + w.available(s), w.capacity(), "shard {s}");
        }
    }

    #[test]
    fn default_is_four_and_zero_is_refused() {
        assert_eq!(WindowConfig::default().max_in_flight(), 4);
        let err = WindowConfig::default().with_max_in_flight(0).validate();
        assert!(matches!(
            err,
            Err(ConfigError::OutOfRange {
                option: "client.dispatch.max-batches-in-flight",
                got: 0,
                min: 1,
                ..
            })
        ));
        assert!(Window::new(WindowConfig::default().with_max_in_flight(0)).is_err());
    }

    #[test]
    fn exhausted_shard_dispatches_queued_batches_fifo() {
        let mut w = window(2);
        let a = sent(w.submit(1, "a"));
        let b = sent(w.submit(1, "b"));
        for x in ["c", "d", "e"] {
            assert_eq!(w.submit(1, x), Ok(None));
        }
        assert_eq!((w.in_flight(&1), w.available(&1), w.queued(&1)), (2, 0, 3));
        let c = w.complete(a.credit).ok().flatten().map(|d| d.batch);
        assert_eq!(c, Some("c"));
        let mut order = vec![];
        let mut credit = b.credit;
        while let Ok(Some(d)) = w.complete(credit) {
            order.push(d.batch);
            credit = d.credit;
            conserved(&w, &[1]);
            assert!(w.in_flight(&1) <= 2);
        }
        assert_eq!(order, ["d", "e"]);
    }

    #[test]
    fn release_dispatches_queued_before_parked() {
        let mut w = window(1);
        let a = sent(w.submit(1, "a"));
        assert_eq!(w.submit_or_park(1, "open"), Ok(None));
        assert_eq!(w.submit(1, "full"), Ok(None));
        assert!(w.is_parked(&1));
        let next = sent(Ok(w.complete(a.credit).unwrap_or(None)));
        assert_eq!(next.batch, "full");
        let last = sent(Ok(w.complete(next.credit).unwrap_or(None)));
        assert_eq!(last.batch, "open");
        assert!(!w.is_parked(&1));
        assert_eq!(w.complete(last.credit), Ok(None));
        assert_eq!(w.shard_count(), 0);
    }

    #[test]
    fn reclaimed_batch_is_not_dispatched_by_release_and_next_submit_goes_at_once() {
        let mut w = window(1);
        let a = sent(w.submit(1, "a"));
        assert_eq!(w.submit_or_park(1, "open"), Ok(None));
        assert_eq!(w.reclaim(&1), Some("open"));
        assert_eq!(w.reclaim(&1), None, "reclaim takes it exactly once");
        assert_eq!(
            w.complete(a.credit),
            Ok(None),
            "nothing held back: the release sends nothing"
        );
        assert_eq!(w.shard_count(), 0);
        let d = sent(w.submit_or_park(1, "open+more"));
        assert_eq!(d.batch, "open+more");
        conserved(&w, &[1]);
    }

    #[test]
    fn second_park_is_refused_and_hands_the_batch_back() {
        let mut w = window(1);
        let _a = sent(w.submit(1, "a"));
        assert_eq!(w.submit_or_park(1, "p"), Ok(None));
        let err = w.submit_or_park(1, "q");
        assert_eq!(err, Err(SubmitError::AlreadyParked("q")));
        assert_eq!(err.map_err(SubmitError::into_batch), Err("q"));
        assert_eq!(w.reclaim(&1), Some("p"));
    }

    #[test]
    fn fail_all_returns_held_back_batches_and_leaves_in_flight_ones() {
        let mut w = window(1);
        let a = sent(w.submit(1, "a"));
        assert_eq!(w.submit(1, "q1"), Ok(None));
        assert_eq!(w.submit(1, "q2"), Ok(None));
        assert_eq!(w.submit_or_park(1, "p"), Ok(None));
        let b = sent(w.submit(2, "b"));
        let mut held = w.fail_all();
        held.sort_by_key(|(s, _)| *s); // shard order is unspecified; per-shard order is not
        assert_eq!(held, [(1, "q1"), (1, "q2"), (1, "p")]);
        assert!(w.is_closed());
        assert_eq!(
            (w.in_flight(&1), w.in_flight(&2)),
            (1, 1),
            "in-flight batches untouched"
        );
        assert_eq!((w.queued(&1), w.is_parked(&1)), (0, false));
        assert_eq!(w.submit(1, "late"), Err(SubmitError::Closed("late")));
        assert_eq!(
            w.submit_or_park(3, "late"),
            Err(SubmitError::Closed("late"))
        );
        assert_eq!(
            w.complete(a.credit),
            Ok(None),
            "after close a live credit frees its slot"
        );
        assert_eq!(w.complete(a.credit), Err(ReleaseError::AlreadyReleased));
        assert_eq!(w.complete(b.credit), Ok(None));
        assert_eq!((w.shard_count(), w.live_credits()), (0, 0));
        assert!(w.fail_all().is_empty());
    }

    #[test]
    fn double_and_bogus_completions_change_nothing() {
        let mut w = window(2);
        let a = sent(w.submit(1, "a"));
        let b = sent(w.submit(1, "b"));
        assert_eq!(w.submit(1, "c"), Ok(None));
        let c = sent(Ok(w.complete(a.credit).unwrap_or(None)));
        let before = (w.in_flight(&1), w.queued(&1), w.live_credits());
        assert_eq!(w.complete(a.credit), Err(ReleaseError::AlreadyReleased));
        assert_eq!(c.credit.slot(), a.credit.slot(), "the slot is reused ...");
        assert_ne!(
            c.credit, a.credit,
            "... under a new id, so the stale id cannot free it"
        );
        for bogus in [
            CreditId::forge(0, 0),
            CreditId::forge(0, 999),
            CreditId::forge(u32::MAX, u64::MAX),
            CreditId::forge(7, u64::MAX - 1),
        ] {
            assert_eq!(w.complete(bogus), Err(ReleaseError::Unknown), "{bogus:?}");
        }
        // A forged id with an issued generation but the wrong slot: reported as released.
        assert_eq!(
            w.complete(CreditId::forge(9, 1)),
            Err(ReleaseError::AlreadyReleased)
        );
        assert_eq!((w.in_flight(&1), w.queued(&1), w.live_credits()), before);
        assert_eq!(w.complete(b.credit), Ok(None));
        assert_eq!(w.complete(c.credit), Ok(None));
        assert_eq!(w.complete(c.credit), Err(ReleaseError::AlreadyReleased));
        assert_eq!(w.shard_count(), 0);
    }

    #[test]
    fn exhausted_shard_never_delays_another() {
        let mut w = window(1);
        let a = sent(w.submit(1, "a"));
        assert_eq!(w.submit(1, "a2"), Ok(None));
        assert_eq!(w.submit_or_park(1, "a3"), Ok(None));
        let b = sent(w.submit(2, "b"));
        assert_eq!(
            w.complete(b.credit),
            Ok(None),
            "shard 2's release never sends shard 1's work"
        );
        assert_eq!(w.queued(&1), 1);
        assert!(sent(w.submit_or_park(2, "b2")).batch == "b2");
        assert_eq!(sent(Ok(w.complete(a.credit).unwrap_or(None))).shard, 1);
        conserved(&w, &[1, 2]);
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn idle_windows_are_removed_and_memory_follows_active_shards() {
        let mut w = window(4);
        for shard in 0..10_000u32 {
            let d = sent(w.submit(shard, "x"));
            assert_eq!(w.shard_count(), 1);
            assert_eq!(w.complete(d.credit), Ok(None));
            assert_eq!(w.shard_count(), 0);
        }
        assert_eq!(w.live_credits(), 0);
        assert!(w.credits.slots.len() <= 1, "the slab reuses slots");
        assert!(w.shards.capacity() <= 2 * MIN_CAPACITY);
        assert!(w.tracked_shards() <= w.shards.capacity());
    }

    #[test]
    fn idle_shard_entry_is_kept_until_maintenance_evicts_it() {
        let mut w = window(2);
        let d = sent(w.submit(1, "a"));
        assert_eq!(w.complete(d.credit), Ok(None));
        assert_eq!(
            (w.shard_count(), w.tracked_shards()),
            (0, 1),
            "idle: not counted, but its entry stays for the next batch"
        );
        let d = sent(w.submit(1, "b"));
        assert_eq!((w.shard_count(), w.tracked_shards()), (1, 1));
        conserved(&w, &[1]);
        assert_eq!(w.complete(d.credit), Ok(None));
        let busy = sent(w.submit(2, "c"));
        w.handle_timeout(secs(1));
        assert_eq!(
            (w.shard_count(), w.tracked_shards()),
            (1, 1),
            "maintenance evicts the idle shard 1 and keeps the busy shard 2"
        );
        assert_eq!((w.in_flight(&1), w.available(&1)), (0, 2));
        assert_eq!(w.complete(busy.credit), Ok(None));
    }

    #[test]
    #[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
    fn a_map_full_of_idle_shards_evicts_them_instead_of_growing() {
        let mut w = window(1);
        let anchor = sent(w.submit(u32::MAX, "busy"));
        for shard in 0..1_000u32 {
            let d = sent(w.submit(shard, "x"));
            assert_eq!(w.complete(d.credit), Ok(None));
            assert!(w.tracked_shards() <= w.shards.capacity());
        }
        assert!(
            w.shards.capacity() <= 2 * MIN_CAPACITY,
            "one busy shard: the map never grows past a small table, without maintenance"
        );
        assert_eq!((w.shard_count(), w.in_flight(&u32::MAX)), (1, 1));
        assert_eq!(w.complete(anchor.credit), Ok(None));
    }

    /// Sends one batch and queues a second for each of `shards` shards, then completes every
    /// credit (which sends the queued batches) until all are done.
    fn burst(w: &mut Window, shards: u32) {
        let mut live = vec![];
        for s in 0..shards {
            live.push(sent(w.submit(s, "first")).credit);
            assert_eq!(w.submit(s, "queued"), Ok(None));
        }
        while let Some(c) = live.pop() {
            if let Ok(Some(d)) = w.complete(c) {
                live.push(d.credit);
            }
        }
        assert_eq!((w.shard_count(), w.live_credits()), (0, 0));
    }

    fn secs(n: u64) -> Instant {
        Instant::from_millis(n * 1000)
    }

    #[test]
    fn idle_shards_keep_capacity_until_maintenance_after_a_quiet_period() {
        let mut w = window(1);
        assert_eq!(w.poll_timeout(), None, "nothing to give back yet");
        burst(&mut w, 200);
        let cap = w.shards.capacity();
        assert!(cap >= 200, "removing idle shards no longer shrinks the map");
        assert_eq!(
            w.spare_queues.len(),
            200,
            "one buffer per shard that queued"
        );
        assert_eq!(w.poll_timeout(), Some(secs(1)));
        w.handle_timeout(Instant::from_millis(999));
        assert_eq!(w.shards.capacity(), cap, "not due before the interval");
        w.handle_timeout(secs(1));
        assert_eq!(
            (w.shards.capacity(), w.spare_queues.len()),
            (cap, 200),
            "the period that just ended used all of it"
        );
        assert_eq!(
            w.poll_timeout(),
            Some(secs(2)),
            "a quieter period may follow"
        );
        w.handle_timeout(secs(2));
        assert!(w.shards.capacity() <= 2 * MIN_CAPACITY);
        assert!(w.spare_queues.is_empty() && w.spare_queues.capacity() <= 2 * MIN_CAPACITY);
        assert!(w.credits.slots.is_empty() && w.credits.free.is_empty());
        assert_eq!(
            w.poll_timeout(),
            None,
            "everything given back: maintenance goes quiet"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
    fn repeated_bursts_keep_their_capacity_through_maintenance() {
        let mut w = window(1);
        let mut now = secs(0);
        let mut snapshot = None;
        for round in 0..8 {
            burst(&mut w, 64);
            now += Duration::from_millis(1500);
            w.handle_timeout(now); // runs every round, between bursts
            let caps = (
                w.shards.capacity(),
                w.spare_queues.len(),
                w.spare_queues.capacity(),
                w.credits.slots.capacity(),
            );
            if round >= 1 {
                assert_eq!(*snapshot.get_or_insert(caps), caps, "round {round}");
            }
        }
        burst(&mut w, 16); // a smaller burst: the next run still judges it against 64
        w.handle_timeout(now + Duration::from_millis(1500));
        assert_eq!(w.spare_queues.len(), 16, "spares follow the recent peak");
    }

    #[test]
    fn maintenance_runs_once_per_interval_and_survives_time_running_backwards() {
        let mut w = window(2);
        let a = sent(w.submit(1, "a"));
        w.handle_timeout(secs(5));
        assert_eq!(w.poll_timeout(), Some(secs(6)));
        w.handle_timeout(secs(1)); // backwards: clamped to 5 s, not due
        assert_eq!(w.poll_timeout(), Some(secs(6)));
        assert_eq!(w.complete(a.credit), Ok(None));
        w.handle_timeout(Instant::MAX);
        w.handle_timeout(Instant::MAX); // the end of time: each call may run, none panics
        assert_eq!(w.poll_timeout(), None);
        let b = sent(w.submit(1, "b"));
        assert_eq!(w.poll_timeout(), Some(Instant::MAX), "deadlines saturate");
        assert_eq!(w.complete(b.credit), Ok(None));
        conserved(&w, &[1]);
    }

    #[test]
    #[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
    fn credit_ids_are_never_reused() {
        let mut w = window(3);
        let mut seen = vec![];
        let mut live: vec::Vec<CreditId> = vec![];
        for i in 0..3_000u32 {
            if live.len() == 3 || i % 5 == 4 {
                let c = live.remove(0);
                assert!(w.complete(c).is_ok());
            }
            if let Ok(Some(d)) = w.submit(i % 2, "x") {
                seen.push(d.credit);
                live.push(d.credit);
            }
        }
        let n = seen.len();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), n);
        assert!(w.credits.slots.len() <= 6);
    }

    #[test]
    fn extreme_capacity_and_end_of_id_space_are_defined() {
        let mut w = window(u32::MAX);
        for _ in 0..100 {
            let _ = sent(w.submit(1, "x"));
        }
        assert_eq!(w.available(&1), u32::MAX - 100);
        conserved(&w, &[1]);

        let mut w = window(1);
        w.skip_generations_to(u64::MAX - 2);
        let a = sent(w.submit(1, "a"));
        assert_eq!(a.credit.generation, u64::MAX - 2);
        assert_eq!(w.submit(1, "q"), Ok(None));
        let q = sent(Ok(w.complete(a.credit).unwrap_or(None)));
        assert_eq!(q.credit.generation, u64::MAX - 1, "the last id");
        assert_eq!(w.submit(1, "r"), Ok(None));
        // No id left for "r": the release frees the slot, keeps "r" and closes the window.
        assert_eq!(w.complete(q.credit), Ok(None));
        assert!(w.is_closed());
        conserved(&w, &[1]);
        assert_eq!(w.submit(2, "s"), Err(SubmitError::Closed("s")));
        assert_eq!(w.fail_all(), [(1, "r")]);
        assert_eq!(w.shard_count(), 0);
        assert_eq!(
            w.complete(CreditId::forge(0, u64::MAX)),
            Err(ReleaseError::Unknown)
        );
    }
}
