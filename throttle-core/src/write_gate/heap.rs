//! An indexed 4-ary min-heap of bucket openings.
//!
//! Each item is `(opening, slot)`: the instant a bucket opens and the index of the bucket's
//! slot in the gate's dense slot vector. The heap owns a dense `u32` position array indexed by
//! slot (kept the same length as the slot vector), so an update re-sifts the one item in place:
//! O(log n) per change, exact through `&self` (no stale items to skip), and its size is exactly
//! the number of gated buckets. A lazily-cleaned heap would keep superseded items under
//! latest-wins churn.
//!
//! Why 4-ary and why these widths: at a million buckets every level is a cache miss, so half
//! the depth of a binary heap halves the misses of a sift, and the four children of a node are
//! contiguous (48 bytes, usually one line). Items are 12 bytes (the opening split in two `u32`
//! halves, so no padding) and positions 4 bytes, instead of 16 and 8: the gate's memory per
//! bucket is dominated by these dense arrays. Slots and positions therefore fit in `u32`; the
//! gate never creates a slot index at or above [`MAX_SLOTS`].
//!
//! Every method keeps `pos[items[i].slot] == i` for every `i` and `NO_POS` for slots not in
//! the heap. Out-of-range slots and positions are ignored rather than trusted (they cannot
//! happen while that invariant holds; the model checks it).

use alloc::vec::Vec;

use crate::time::Instant;

/// Position of a slot that is not in the heap.
const NO_POS: u32 = u32::MAX;

/// The exclusive bound on slot indices (the gate keeps the top bit of its map entries for a
/// flag, and `NO_POS` must stay out of range).
pub(crate) const MAX_SLOTS: usize = 1 << 31;

/// Children per node.
const ARITY: usize = 4;

/// One heap item: the opening as two `u32` halves (12 bytes with the slot, 4-aligned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Item {
    lo: u32,
    hi: u32,
    slot: u32,
}

impl Item {
    #[inline]
    fn new(at: Instant, slot: u32) -> Self {
        let ns = at.as_nanos();
        Item {
            lo: ns as u32,
            hi: (ns >> 32) as u32,
            slot,
        }
    }

    #[inline]
    fn key(self) -> u64 {
        (u64::from(self.hi) << 32) | u64::from(self.lo)
    }

    #[inline]
    fn at(self) -> Instant {
        Instant::from_nanos(self.key())
    }
}

/// The heap: items in the implicit 4-ary layout (smallest opening on top) and the position of
/// every slot.
#[derive(Clone, Debug, Default)]
pub(crate) struct IndexedHeap {
    items: Vec<Item>,
    pos: Vec<u32>,
}

impl IndexedHeap {
    /// Number of items (gated buckets with a known leader).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// The earliest opening and its slot.
    #[inline]
    pub(crate) fn peek(&self) -> Option<(Instant, usize)> {
        self.items.first().map(|it| (it.at(), it.slot as usize))
    }

    /// The item at heap index `pos`.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn get(&self, pos: usize) -> Option<(Instant, usize)> {
        self.items.get(pos).map(|it| (it.at(), it.slot as usize))
    }

    /// Where `slot` sits in the heap, if it is in it.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn position(&self, slot: usize) -> Option<usize> {
        match self.pos.get(slot) {
            Some(&p) if p != NO_POS => Some(p as usize),
            _ => None,
        }
    }

    /// Whether `slot` is in the heap.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn contains(&self, slot: usize) -> bool {
        self.pos.get(slot).is_some_and(|&p| p != NO_POS)
    }

    /// Reserved item capacity (for the shrink rule).
    #[inline]
    pub(crate) fn capacity(&self) -> usize {
        self.items.capacity()
    }

    /// Release capacity down to `items` items and `slots` positions (or the current lengths).
    pub(crate) fn shrink_to(&mut self, items: usize, slots: usize) {
        self.items.shrink_to(items);
        self.pos.shrink_to(slots);
    }

    /// A new slot was appended to the slot vector (not in the heap yet).
    pub(crate) fn add_slot(&mut self) {
        self.pos.push(NO_POS);
    }

    /// The slot vector removed `slot` by swapping the last slot into it: `slot` leaves the
    /// heap, and the moved slot's item follows it.
    pub(crate) fn swap_remove_slot(&mut self, slot: usize) {
        self.remove(slot);
        if slot >= self.pos.len() {
            return;
        }
        self.pos.swap_remove(slot);
        if let Some(&p) = self.pos.get(slot) {
            if let Some(item) = self.items.get_mut(p as usize) {
                item.slot = slot as u32;
            }
        }
    }

    /// Put `slot` in the heap at `at`, or move it there if it is in already.
    pub(crate) fn set(&mut self, slot: usize, at: Instant) {
        let Some(&p) = self.pos.get(slot) else {
            return;
        };
        if p == NO_POS {
            let i = self.items.len();
            self.items.push(Item::new(at, slot as u32));
            self.place(i);
            self.sift_up(i);
            return;
        }
        let i = p as usize;
        let Some(item) = self.items.get_mut(i) else {
            return;
        };
        let old = item.key();
        *item = Item::new(at, item.slot);
        let new = item.key();
        if new < old {
            self.sift_up(i);
        } else if new > old {
            self.sift_down(i);
        }
    }

    /// Take `slot` out of the heap (nothing if it is not in).
    pub(crate) fn remove(&mut self, slot: usize) {
        let Some(p) = self.pos.get_mut(slot) else {
            return;
        };
        let i = *p as usize;
        *p = NO_POS;
        let Some(last) = self.items.len().checked_sub(1) else {
            return;
        };
        if i > last {
            return;
        }
        self.items.swap_remove(i);
        if i < last {
            self.place(i);
            // The moved item came from the bottom: it may belong above or below `i`.
            let i = self.sift_up(i);
            self.sift_down(i);
        }
    }

    /// Drop every item and position (the gate rebuilds its slots after this).
    pub(crate) fn clear(&mut self) {
        self.items.clear();
        self.pos.clear();
    }

    /// Record the position of the item at `i`.
    #[inline]
    fn place(&mut self, i: usize) {
        if let Some(item) = self.items.get(i) {
            if let Some(p) = self.pos.get_mut(item.slot as usize) {
                *p = i as u32;
            }
        }
    }

    /// Move the item at `i` up while it opens earlier than its parent; returns where it ends.
    /// Holes instead of swaps: each level writes one item and one position.
    fn sift_up(&mut self, mut i: usize) -> usize {
        let Some(&item) = self.items.get(i) else {
            return i;
        };
        let key = item.key();
        while i > 0 {
            let parent = (i - 1) / ARITY;
            let Some(&p) = self.items.get(parent) else {
                break;
            };
            if p.key() <= key {
                break;
            }
            if let Some(slot) = self.items.get_mut(i) {
                *slot = p;
            }
            self.place(i);
            i = parent;
        }
        if let Some(slot) = self.items.get_mut(i) {
            *slot = item;
        }
        self.place(i);
        i
    }

    /// Move the item at `i` down while a child opens earlier; returns where it ends.
    fn sift_down(&mut self, mut i: usize) -> usize {
        let Some(&item) = self.items.get(i) else {
            return i;
        };
        let key = item.key();
        loop {
            let first = i.saturating_mul(ARITY).saturating_add(1);
            let end = first.saturating_add(ARITY).min(self.items.len());
            let Some(children) = self.items.get(first..end) else {
                break;
            };
            let mut best = None;
            let mut best_key = key;
            for (c, child) in children.iter().enumerate() {
                if child.key() < best_key {
                    best = Some(c);
                    best_key = child.key();
                }
            }
            let Some(c) = best else {
                break;
            };
            let child = first + c;
            if let Some(&moved) = self.items.get(child) {
                if let Some(slot) = self.items.get_mut(i) {
                    *slot = moved;
                }
            }
            self.place(i);
            i = child;
        }
        if let Some(slot) = self.items.get_mut(i) {
            *slot = item;
        }
        self.place(i);
        i
    }

    /// Whether the heap order holds, every item's position is recorded, and exactly
    /// `items.len()` slots have a position (for the model checker and the tests).
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn is_consistent(&self) -> bool {
        let ordered = self.items.iter().enumerate().all(|(i, it)| {
            let parent_ok = i == 0
                || self
                    .items
                    .get((i - 1) / ARITY)
                    .is_some_and(|p| p.key() <= it.key());
            parent_ok && self.position(it.slot as usize) == Some(i)
        });
        let placed = self.pos.iter().filter(|&&p| p != NO_POS).count();
        ordered && placed == self.items.len()
    }

    /// Bytes the heap has allocated (items and positions, by capacity), for the memory tests.
    #[cfg(test)]
    pub(super) fn allocation_size(&self) -> usize {
        self.items.capacity() * core::mem::size_of::<Item>()
            + self.pos.capacity() * core::mem::size_of::<u32>()
    }

    /// Number of slots the heap tracks positions for (must equal the gate's slot count).
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn slots(&self) -> usize {
        self.pos.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Rng, SplitMix64};

    fn t(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    fn with_slots(n: usize) -> IndexedHeap {
        let mut h = IndexedHeap::default();
        for _ in 0..n {
            h.add_slot();
        }
        h
    }

    #[test]
    fn pops_in_opening_order_and_tracks_positions() {
        let mut h = with_slots(6);
        for (slot, ms) in [50, 10, 40, 20, 30, 5].into_iter().enumerate() {
            h.set(slot, t(ms));
            assert!(h.is_consistent());
        }
        let mut order = Vec::new();
        while let Some((at, slot)) = h.peek() {
            order.push(at);
            assert_eq!(h.position(slot), Some(0));
            h.remove(slot);
            assert_eq!(h.position(slot), None);
            assert!(h.is_consistent());
        }
        assert_eq!(order, [5, 10, 20, 30, 40, 50].map(t));
    }

    #[test]
    fn update_resifts_in_both_directions() {
        let mut h = with_slots(4);
        for (slot, ms) in [10, 20, 30, 40].into_iter().enumerate() {
            h.set(slot, t(ms));
        }
        h.set(3, t(1));
        assert_eq!(
            h.peek(),
            Some((t(1), 3)),
            "a shortened gate moves to the top"
        );
        h.set(3, t(99));
        assert_eq!(h.peek(), Some((t(10), 0)), "a lengthened one sinks");
        assert!(h.is_consistent());
    }

    #[test]
    fn random_removals_updates_and_slot_moves_keep_the_order() {
        let mut rng = SplitMix64::new(9);
        let n = 200;
        let mut h = with_slots(n);
        let mut live = alloc::vec![false; n];
        for _ in 0..if cfg!(miri) { 60 } else { 4000 } {
            let slot = (rng.next_u64() % live.len() as u64) as usize;
            let at = Instant::from_nanos(rng.next_u64() % 1000);
            match (live[slot], rng.next_u64() % 3) {
                (false, _) | (true, 0) => {
                    h.set(slot, at);
                    live[slot] = true;
                }
                (true, 1) => {
                    h.remove(slot);
                    live[slot] = false;
                }
                (true, _) => {
                    // The gate evicts a slot: the last one moves into its place.
                    h.swap_remove_slot(slot);
                    live.swap_remove(slot);
                    h.add_slot();
                    live.push(false);
                }
            }
            assert!(h.is_consistent());
            assert_eq!(h.slots(), live.len());
            assert_eq!(h.len(), live.iter().filter(|&&l| l).count());
            for (s, &l) in live.iter().enumerate() {
                assert_eq!(h.contains(s), l);
            }
        }
    }

    #[test]
    fn out_of_range_slots_are_ignored() {
        let mut h = with_slots(1);
        h.remove(0);
        h.remove(5);
        h.set(7, t(1));
        h.set(0, t(3));
        h.remove(5);
        h.swap_remove_slot(9);
        assert_eq!(h.peek(), Some((t(3), 0)));
        assert!(h.is_consistent());
    }

    #[test]
    fn extreme_openings_keep_their_order() {
        let mut h = with_slots(3);
        h.set(0, Instant::MAX);
        h.set(1, Instant::from_nanos(u64::from(u32::MAX) + 1));
        h.set(2, Instant::from_nanos(u64::from(u32::MAX)));
        assert_eq!(
            h.peek(),
            Some((Instant::from_nanos(u64::from(u32::MAX)), 2))
        );
        h.remove(2);
        h.remove(1);
        assert_eq!(h.peek(), Some((Instant::MAX, 0)));
    }
}
