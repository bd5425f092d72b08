//! An indexed binary min-heap of bucket openings.
//!
//! Each item is `(opening, slot)`: the instant a bucket opens and the index of the bucket's
//! slot in the gate's dense slot vector. The slot records the item's position in the heap
//! (through [`Positions`]), so an update re-sifts the one item in place: O(log n) per change,
//! exact through `&self` (no stale items to skip), and its size is exactly the number of
//! gated buckets. A lazily-cleaned heap would keep superseded items under latest-wins churn.
//!
//! Positions are maintained by the heap itself; every method keeps
//! `positions.get(items[i].slot) == i` for every `i`. Out-of-range positions are ignored rather
//! than trusted (they cannot happen while that invariant holds; the model checks it).

use alloc::vec::Vec;

use crate::time::Instant;

/// Where a slot's heap position is stored: the heap writes it on every move.
pub(super) trait Positions {
    /// Record that `slot`'s item now sits at heap index `pos`.
    fn set(&mut self, slot: usize, pos: usize);
}

/// The heap itself: a `Vec` in the usual implicit-tree layout, smallest opening on top.
#[derive(Clone, Debug, Default)]
pub(super) struct IndexedHeap {
    items: Vec<(Instant, usize)>,
}

impl IndexedHeap {
    /// Number of items (gated buckets with a known leader).
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.items.len()
    }

    /// The item with the earliest opening.
    #[inline]
    pub(super) fn peek(&self) -> Option<(Instant, usize)> {
        self.items.first().copied()
    }

    /// The item at heap index `pos`.
    #[cfg(any(test, feature = "model"))]
    #[inline]
    pub(super) fn get(&self, pos: usize) -> Option<(Instant, usize)> {
        self.items.get(pos).copied()
    }

    /// Reserved capacity (for the shrink rule).
    #[inline]
    pub(super) fn capacity(&self) -> usize {
        self.items.capacity()
    }

    /// Release capacity down to `min` items (or the current length).
    pub(super) fn shrink_to(&mut self, min: usize) {
        self.items.shrink_to(min);
    }

    /// Insert `slot` opening at `at`.
    pub(super) fn push<P: Positions + ?Sized>(&mut self, at: Instant, slot: usize, pos: &mut P) {
        let i = self.items.len();
        self.items.push((at, slot));
        pos.set(slot, i);
        self.sift_up(i, pos);
    }

    /// Change the opening of the item at `i` and restore the heap order around it.
    pub(super) fn update<P: Positions + ?Sized>(&mut self, i: usize, at: Instant, pos: &mut P) {
        let Some(item) = self.items.get_mut(i) else {
            return;
        };
        let old = item.0;
        item.0 = at;
        if at < old {
            self.sift_up(i, pos);
        } else if at > old {
            self.sift_down(i, pos);
        }
    }

    /// Remove the item at `i`, returning its slot.
    pub(super) fn remove<P: Positions + ?Sized>(&mut self, i: usize, pos: &mut P) -> Option<usize> {
        let last = self.items.len().checked_sub(1)?;
        if i > last {
            return None;
        }
        self.items.swap(i, last);
        let (_, slot) = self.items.pop()?;
        if i < last {
            if let Some(&(_, moved)) = self.items.get(i) {
                pos.set(moved, i);
            }
            // The moved item came from the bottom: it may belong above or below `i`.
            let i = self.sift_up(i, pos);
            self.sift_down(i, pos);
        }
        Some(slot)
    }

    /// Point the item at `i` to a different slot (the slot vector moved it).
    pub(super) fn set_slot(&mut self, i: usize, slot: usize) {
        if let Some(item) = self.items.get_mut(i) {
            item.1 = slot;
        }
    }

    /// Drop every item (positions are the caller's to reset).
    pub(super) fn clear(&mut self) {
        self.items.clear();
    }

    /// Move the item at `i` up while it opens earlier than its parent; returns where it ends.
    fn sift_up<P: Positions + ?Sized>(&mut self, mut i: usize, pos: &mut P) -> usize {
        while i > 0 {
            let parent = (i - 1) / 2;
            match (self.items.get(i), self.items.get(parent)) {
                (Some(&(a, _)), Some(&(b, _))) if a < b => {}
                _ => break,
            }
            self.swap(i, parent, pos);
            i = parent;
        }
        i
    }

    /// Move the item at `i` down while a child opens earlier; returns where it ends.
    fn sift_down<P: Positions + ?Sized>(&mut self, mut i: usize, pos: &mut P) -> usize {
        loop {
            let Some(&(at, _)) = self.items.get(i) else {
                return i;
            };
            let left = i.saturating_mul(2).saturating_add(1);
            let right = left.saturating_add(1);
            let mut best = i;
            let mut best_at = at;
            for child in [left, right] {
                if let Some(&(c, _)) = self.items.get(child)
                    && c < best_at
                {
                    best = child;
                    best_at = c;
                }
            }
            if best == i {
                return i;
            }
            self.swap(i, best, pos);
            i = best;
        }
    }

    fn swap<P: Positions + ?Sized>(&mut self, a: usize, b: usize, pos: &mut P) {
        if a >= self.items.len() || b >= self.items.len() {
            return;
        }
        self.items.swap(a, b);
        if let Some(&(_, s)) = self.items.get(a) {
            pos.set(s, a);
        }
        if let Some(&(_, s)) = self.items.get(b) {
            pos.set(s, b);
        }
    }

    /// Whether the heap order holds and `position(slot)` agrees with every item
    /// (for the model checker and the tests).
    #[cfg(any(test, feature = "model"))]
    pub(super) fn is_consistent(&self, position: impl Fn(usize) -> Option<usize>) -> bool {
        self.items.iter().enumerate().all(|(i, &(at, slot))| {
            let parent_ok = i == 0 || self.items.get((i - 1) / 2).is_some_and(|&(p, _)| p <= at);
            parent_ok && position(slot) == Some(i)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Rng, SplitMix64};

    impl Positions for Vec<usize> {
        fn set(&mut self, slot: usize, pos: usize) {
            if let Some(p) = self.get_mut(slot) {
                *p = pos;
            }
        }
    }

    fn t(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    #[test]
    fn pops_in_opening_order_and_tracks_positions() {
        let mut h = IndexedHeap::default();
        let mut pos = alloc::vec![usize::MAX; 6];
        for (slot, ms) in [50, 10, 40, 20, 30, 5].into_iter().enumerate() {
            h.push(t(ms), slot, &mut pos);
            assert!(h.is_consistent(|s| pos.get(s).copied()));
        }
        let mut order = Vec::new();
        while let Some((at, _)) = h.peek() {
            order.push(at);
            assert_eq!(h.remove(0, &mut pos).map(|s| pos[s]), Some(0));
            assert!(h.is_consistent(|s| pos.get(s).copied()));
        }
        assert_eq!(order, [5, 10, 20, 30, 40, 50].map(t));
    }

    #[test]
    fn update_resifts_in_both_directions() {
        let mut h = IndexedHeap::default();
        let mut pos = alloc::vec![usize::MAX; 4];
        for (slot, ms) in [10, 20, 30, 40].into_iter().enumerate() {
            h.push(t(ms), slot, &mut pos);
        }
        h.update(pos[3], t(1), &mut pos);
        assert_eq!(
            h.peek(),
            Some((t(1), 3)),
            "a shortened gate moves to the top"
        );
        h.update(pos[3], t(99), &mut pos);
        assert_eq!(h.peek(), Some((t(10), 0)), "a lengthened one sinks");
        assert!(h.is_consistent(|s| pos.get(s).copied()));
    }

    #[test]
    fn random_removals_and_updates_keep_the_order() {
        let mut rng = SplitMix64::new(9);
        let mut h = IndexedHeap::default();
        let n = 200;
        let mut pos = alloc::vec![usize::MAX; n];
        let mut live = alloc::vec![false; n];
        for _ in 0..if cfg!(miri) { 300 } else { 4000 } {
            let slot = (rng.next_u64() % n as u64) as usize;
            let at = Instant::from_nanos(rng.next_u64() % 1000);
            match (live[slot], rng.next_u64() % 2) {
                (false, _) => {
                    h.push(at, slot, &mut pos);
                    live[slot] = true;
                }
                (true, 0) => h.update(pos[slot], at, &mut pos),
                (true, _) => {
                    assert_eq!(h.remove(pos[slot], &mut pos), Some(slot));
                    live[slot] = false;
                    pos[slot] = usize::MAX;
                }
            }
            assert!(h.is_consistent(|s| pos.get(s).copied()));
            assert_eq!(h.len(), live.iter().filter(|&&l| l).count());
        }
    }

    #[test]
    fn out_of_range_positions_are_ignored() {
        let mut h = IndexedHeap::default();
        let mut pos = alloc::vec![usize::MAX; 1];
        assert_eq!(h.remove(0, &mut pos), None);
        h.update(7, t(1), &mut pos);
        h.push(t(3), 0, &mut pos);
        assert_eq!(h.remove(5, &mut pos), None);
        assert_eq!(h.peek(), Some((t(3), 0)));
    }
}
