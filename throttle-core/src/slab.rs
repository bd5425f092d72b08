//! The one generational id slab of the crate: credits ([`CreditId`](crate::CreditId)),
//! tickets ([`Ticket`]) and, through [`IdSpace`], connection ids
//! ([`ConnId`](crate::ConnId)) all come from here, so they share one exhaustion rule and one
//! binding to the instance that issued them.
//!
//! - **Generations never wrap.** Each instance draws generations from one counter that only
//!   grows, starting at 1. Once it would reach `u64::MAX` (or a slab would need more than
//!   `u32::MAX` slots), new ids are refused with [`Exhausted`]; ids already issued are still
//!   released normally. At a billion ids a second the counter lasts 584 years, so in practice
//!   only tests that move the counter forward reach the end.
//! - **Ids are bound to their issuer.** Every id carries its instance's tag. An id with another
//!   tag is refused as unknown and changes nothing, so an id from a second window, limiter or
//!   table can never release, widen or close anything here. Tags come from a process-wide
//!   counter where the target has 32-bit atomics; elsewhere every instance has tag 0 unless the
//!   caller gives each its own (`with_instance_tag`). A clone of a machine keeps its tag: it is
//!   a copy of the same books, so the original's ids are meaningful to it.

use alloc::vec::Vec;

use crate::error::ReleaseError;
use crate::maintenance::{Maintenance, Peak};

/// The machine has issued every id it can: it refuses new ones (see the module docs), while
/// ids already issued are still released normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("the id space is spent: no new id can be issued")]
pub struct Exhausted;

/// A fresh instance tag: distinct for each call in the process (until 2^32 instances), from a
/// process-wide counter.
#[cfg(target_has_atomic = "32")]
pub(crate) fn next_instance_tag() -> u32 {
    use core::sync::atomic::{AtomicU32, Ordering};
    // Only uniqueness matters, not ordering with other memory: `Relaxed` suffices.
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Without 32-bit atomics there is no race-free global counter: every instance starts with
/// tag 0, and callers that keep several instances give each a tag of their own.
#[cfg(not(target_has_atomic = "32"))]
pub(crate) fn next_instance_tag() -> u32 {
    0
}

/// An id as the slab issues it: the issuer's tag, the slot it lives in while live, and its
/// generation (unique for the issuer's life). 16 bytes, as two words (the tag and the slot
/// share one), so that it is passed in two registers rather than through memory; ordered by
/// generation, i.e. by issue order within one instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Key {
    pub(crate) generation: u64,
    /// The tag in the high half, the slot in the low half.
    at: u64,
}

impl Key {
    #[inline]
    pub(crate) const fn new(generation: u64, slot: u32, tag: u32) -> Self {
        Key {
            generation,
            at: ((tag as u64) << 32) | slot as u64,
        }
    }

    /// The slot it lives in while live.
    #[inline]
    pub(crate) const fn slot(self) -> u32 {
        self.at as u32
    }

    /// The tag of the instance that issued it.
    #[inline]
    pub(crate) const fn tag(self) -> u32 {
        (self.at >> 32) as u32
    }
}

/// A place in a machine's waiting line: a batch queued in a
/// [`DispatchWindow`](crate::DispatchWindow), or an operation waiting in a
/// [`PendingBytesLimiter`](crate::PendingBytesLimiter). Issued by one instance and meaningful
/// only to it; never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub(crate) Key);

impl Ticket {
    /// The ticket's number: strictly increasing in issue order within its issuer, never
    /// reused.
    pub const fn id(self) -> u64 {
        self.0.generation
    }

    /// A ticket of the instance tagged `tag` that it may never have issued, for tests and
    /// the model checkers.
    #[cfg(any(test, feature = "model"))]
    pub(crate) const fn forged(tag: u32, id: u64, slot: u32) -> Self {
        Ticket(Key::new(id, slot, tag))
    }

    /// The tag of the instance that issued it.
    #[cfg(feature = "model")]
    pub(crate) const fn tag(self) -> u32 {
        self.0.tag()
    }

    /// The slot it lives in while live.
    #[cfg(any(test, feature = "model"))]
    pub(crate) const fn slot(self) -> u32 {
        self.0.slot()
    }
}

/// An instance's tag and generation counter: the exhaustion rule and the issuer binding,
/// without storage (the connection table keeps its own entries and takes only ids from here).
#[derive(Clone, Copy, Debug)]
pub(crate) struct IdSpace {
    tag: u32,
    /// The next generation to issue; `1..next` have been issued.
    next: u64,
}

impl IdSpace {
    /// A fresh space with a process-unique tag.
    pub(crate) fn new() -> Self {
        IdSpace {
            tag: next_instance_tag(),
            next: 1,
        }
    }

    pub(crate) fn tag(&self) -> u32 {
        self.tag
    }

    /// Re-tags the space. Only meaningful before any id was issued (the machines' builders
    /// call it on a fresh instance); ids issued under the old tag become unknown.
    pub(crate) fn set_tag(&mut self, tag: u32) {
        self.tag = tag;
    }

    /// The next generation, or [`Exhausted`] once `u64::MAX - 1` have been issued.
    #[inline]
    pub(crate) fn next(&mut self) -> Result<u64, Exhausted> {
        let generation = self.next;
        if generation == u64::MAX {
            return Err(Exhausted);
        }
        self.next = generation + 1;
        Ok(generation)
    }

    /// Whether `generation` would be issued next (nothing is issued by asking).
    pub(crate) fn peek(&self) -> Result<u64, Exhausted> {
        if self.next == u64::MAX {
            Err(Exhausted)
        } else {
            Ok(self.next)
        }
    }

    /// Whether this space issued an id with `tag` and `generation`.
    #[inline]
    pub(crate) fn issued(&self, tag: u32, generation: u64) -> bool {
        tag == self.tag && generation >= 1 && generation < self.next
    }

    /// Why an id that is not live was refused: `AlreadyReleased` if this space issued it,
    /// else `Unknown` (another instance's id, or one never issued).
    #[inline]
    pub(crate) fn refusal(&self, tag: u32, generation: u64) -> ReleaseError {
        if self.issued(tag, generation) {
            ReleaseError::AlreadyReleased
        } else {
            ReleaseError::Unknown
        }
    }

    /// Moves the counter forward, to test the end of the id space.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn skip_to(&mut self, next: u64) {
        self.next = self.next.max(next);
    }
}

/// A live id's slot: its generation and value. A free slot is `None` (a stale id is told
/// apart by the `IdSpace`, not by the slot).
#[derive(Clone, Debug)]
struct Live<T> {
    generation: u64,
    value: T,
}

/// Live ids and the value each carries: a vector of slots plus a free list, reused in LIFO
/// order. It never holds more slots than the peak number of ids live at once, and ids stay
/// unique because generations come from the instance's [`IdSpace`], not from the slot.
#[derive(Clone, Debug)]
pub(crate) struct Slab<T> {
    slots: Vec<Option<Live<T>>>,
    free: Vec<u32>,
    live: usize,
    peak_live: Peak,
    ids: IdSpace,
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            peak_live: Peak::default(),
            ids: IdSpace::new(),
        }
    }

    pub(crate) fn tag(&self) -> u32 {
        self.ids.tag()
    }

    /// See [`IdSpace::set_tag`].
    pub(crate) fn set_tag(&mut self, tag: u32) {
        self.ids.set_tag(tag);
    }

    /// Ids live now.
    #[inline]
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Slots allocated: every live id's slot is below this.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Slots the slab has room for without allocating.
    #[cfg(test)]
    pub(crate) fn slot_capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// A fresh id carrying `value`. On [`Exhausted`] nothing changes and `value` is handed
    /// back.
    #[inline(always)]
    pub(crate) fn insert(&mut self, value: T) -> Result<Key, (Exhausted, T)> {
        // Check both limits before changing anything, so a refusal leaves no trace.
        let slot = match self.free.last() {
            Some(&slot) => slot,
            None => match u32::try_from(self.slots.len()) {
                Ok(slot) => slot,
                Err(_) => return Err((Exhausted, value)),
            },
        };
        let generation = match self.ids.next() {
            Ok(g) => g,
            Err(e) => return Err((e, value)),
        };
        let entry = Some(Live { generation, value });
        if self.free.pop().is_some() {
            if let Some(s) = self.slots.get_mut(slot as usize) {
                *s = entry;
            }
        } else {
            self.slots.push(entry);
        }
        self.live += 1;
        self.peak_live.see(self.live);
        Ok(Key::new(generation, slot, self.ids.tag()))
    }

    /// The value of a live id.
    #[inline]
    pub(crate) fn get(&self, key: Key) -> Option<&T> {
        if key.tag() != self.ids.tag() {
            return None;
        }
        match self.slots.get(key.slot() as usize) {
            Some(Some(l)) if l.generation == key.generation => Some(&l.value),
            _ => None,
        }
    }

    /// The value of a live id, mutably.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: Key) -> Option<&mut T> {
        if key.tag() != self.ids.tag() {
            return None;
        }
        match self.slots.get_mut(key.slot() as usize) {
            Some(Some(l)) if l.generation == key.generation => Some(&mut l.value),
            _ => None,
        }
    }

    /// Frees a live id and returns its value. An id that is not live is refused (see
    /// [`IdSpace::refusal`]) and nothing changes.
    #[inline]
    pub(crate) fn remove(&mut self, key: Key) -> Result<T, ReleaseError> {
        if key.tag() == self.ids.tag() {
            if let Some(s) = self.slots.get_mut(key.slot() as usize) {
                if matches!(s, Some(l) if l.generation == key.generation) {
                    if let Some(l) = s.take() {
                        self.free.push(key.slot());
                        self.live -= 1;
                        return Ok(l.value);
                    }
                }
            }
        }
        Err(self.ids.refusal(key.tag(), key.generation))
    }

    /// Why `key` is not live: `AlreadyReleased` if this slab issued it, else `Unknown`.
    pub(crate) fn refusal(&self, key: Key) -> ReleaseError {
        self.ids.refusal(key.tag(), key.generation)
    }

    /// Whether this slab issued `key` (live or not).
    pub(crate) fn issued(&self, key: Key) -> bool {
        self.ids.issued(key.tag(), key.generation)
    }

    /// Whether a new id could be issued now.
    pub(crate) fn can_issue(&self) -> bool {
        self.ids.peek().is_ok()
            && (!self.free.is_empty() || u32::try_from(self.slots.len()).is_ok())
    }

    /// With nothing live, forgets every slot (keeping capacity). Generations are untouched.
    pub(crate) fn reset_if_empty(&mut self) {
        if self.live == 0 {
            self.slots.clear();
            self.free.clear();
        }
    }

    /// Maintenance: once the recent peak of live ids is below a quarter of the slab's
    /// capacity, drops the free slots at its end and shrinks it (generations are untouched,
    /// so ids stay unique).
    pub(crate) fn shrink(&mut self, m: &Maintenance) {
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

    /// Moves the generation counter forward, to test the end of the id space.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn skip_generations_to(&mut self, next: u64) {
        self.ids.skip_to(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_released_exactly_once() {
        let mut s = Slab::new();
        let a = s.insert('a').unwrap();
        let b = s.insert('b').unwrap();
        assert_ne!(a, b);
        assert_eq!(s.remove(a), Ok('a'));
        assert_eq!(s.remove(a), Err(ReleaseError::AlreadyReleased));
        let c = s.insert('c').unwrap();
        assert_eq!(c.slot(), a.slot(), "the freed slot is reused");
        assert_ne!(c, a, "with a fresh generation");
        assert_eq!(s.get(a), None);
        assert_eq!(s.get(c), Some(&'c'));
        assert_eq!(s.live(), 2);
    }

    #[test]
    fn an_id_from_another_instance_is_unknown_and_changes_nothing() {
        let mut one = Slab::new();
        let mut two = Slab::new();
        assert_ne!(one.tag(), two.tag());
        let a = one.insert(1).unwrap();
        let b = two.insert(2).unwrap();
        assert_eq!((a.slot(), a.generation), (b.slot(), b.generation));
        assert_eq!(two.remove(a), Err(ReleaseError::Unknown));
        assert_eq!(two.get(a), None);
        assert_eq!(two.live(), 1);
        assert_eq!(two.remove(b), Ok(2));
    }

    #[test]
    fn at_exhaustion_new_ids_are_refused_and_releases_still_accepted() {
        let mut s = Slab::new();
        s.skip_generations_to(u64::MAX - 1);
        let last = s.insert(1).unwrap();
        assert_eq!(last.generation, u64::MAX - 1);
        assert!(!s.can_issue());
        assert_eq!(s.insert(2), Err((Exhausted, 2)));
        assert_eq!(s.live(), 1, "a refusal changes nothing");
        assert_eq!(s.remove(last), Ok(1));
        assert_eq!(s.insert(3), Err((Exhausted, 3)), "generations never wrap");
        assert_eq!(s.remove(last), Err(ReleaseError::AlreadyReleased));
    }

    #[test]
    fn ids_stay_16_bytes_with_the_tag() {
        use core::mem::size_of;
        assert_eq!(size_of::<Key>(), 16);
        assert_eq!(size_of::<crate::CreditId>(), 16);
        assert_eq!(size_of::<Ticket>(), 16);
        assert_eq!(size_of::<crate::ConnId>(), 16);
    }

    #[test]
    fn tags_differ_per_instance() {
        let a = IdSpace::new();
        let b = IdSpace::new();
        assert_ne!(a.tag(), b.tag());
        let mut c = IdSpace::new();
        c.set_tag(7);
        assert_eq!(c.tag(), 7);
        assert_eq!(c.refusal(a.tag(), 0), ReleaseError::Unknown);
    }
}
