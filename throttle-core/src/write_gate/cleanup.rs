//! Giving state back: forgetting buckets, the close, eviction and shrinking.

use super::*;

impl<K, S> WriteGate<K, S>
where
    K: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// Drop everything the gate holds for `bucket` (its deadlines, probe state and unknown
    /// leader), as if it had never been seen: it reads `Open` afterwards, leaves
    /// [`Self::poll_timeout`] and [`Self::len`], and no `Wake` is emitted for it (now or
    /// later: it holds no deadline that could open). For a bucket that no longer exists in a
    /// metadata snapshot (a dropped table or partition); see [`Self::retain`] for a whole
    /// snapshot. Returns whether the bucket had any state. Runs the key's `Hash` and `Eq` once
    /// (the lookup), nothing else; takes no `now`, since nothing about time changes.
    ///
    /// ```
    /// use throttle_sansio::rng::SplitMix64;
    /// use throttle_sansio::write_gate::{GateState, WriteGate, WriteGateConfig};
    /// use throttle_sansio::Instant;
    /// # #[derive(Default, Clone)] struct H; impl core::hash::BuildHasher for H {
    /// #   type Hasher = F; fn build_hasher(&self) -> F { F(0) } }
    /// # struct F(u64); impl core::hash::Hasher for F { fn finish(&self) -> u64 { self.0 }
    /// #   fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.rotate_left(5) ^ u64::from(*x) } } }
    ///
    /// let mut gate: WriteGate<u32, H> = WriteGate::new(WriteGateConfig::default())?;
    /// let t0 = Instant::from_millis(1);
    /// gate.handle_disk_write_locked(t0, &7, 0, &mut SplitMix64::new(1));
    /// assert!(gate.forget(&7));
    /// assert_eq!(gate.check(t0, &7), GateState::Open);
    /// assert_eq!((gate.len(), gate.poll_timeout(), gate.poll_action()), (0, None, None));
    /// assert!(!gate.forget(&7));
    /// # Ok::<(), throttle_sansio::ConfigError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// Only if the bucket's `Hash` or `Eq`, or the hasher, panics; the gate is unchanged.
    pub fn forget(&mut self, bucket: &K) -> bool {
        let Some(entry) = self.find(bucket) else {
            return false;
        };
        self.evict(slot_of(entry));
        self.maybe_shrink();
        true
    }

    /// Keep only the buckets for which `keep` returns `true` (e.g. "is in the new metadata
    /// snapshot"); drop the others as [`Self::forget`] does, with no `Wake`. `keep` sees each
    /// bucket with state once, in no particular order. No key's `Hash`, `Eq` or `Clone`
    /// runs: buckets are removed by their stored hashes. O(n) in [`Self::len`]; allocates one
    /// bit per bucket for the verdicts.
    ///
    /// All or nothing: every verdict is collected before anything is removed, so if `keep`
    /// panics the gate is exactly as it was (the bucket `keep` panicked on, and every other,
    /// is kept) and serves the next call.
    ///
    /// ```
    /// use throttle_sansio::rng::SplitMix64;
    /// use throttle_sansio::write_gate::{WriteGate, WriteGateConfig};
    /// use throttle_sansio::Instant;
    /// # #[derive(Default, Clone)] struct H; impl core::hash::BuildHasher for H {
    /// #   type Hasher = F; fn build_hasher(&self) -> F { F(0) } }
    /// # struct F(u64); impl core::hash::Hasher for F { fn finish(&self) -> u64 { self.0 }
    /// #   fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.rotate_left(5) ^ u64::from(*x) } } }
    ///
    /// // Buckets are (table, bucket); table 2 was dropped from the metadata snapshot.
    /// let mut gate: WriteGate<(u32, u32), H> = WriteGate::new(WriteGateConfig::default())?;
    /// let (t0, mut rng) = (Instant::from_millis(1), SplitMix64::new(1));
    /// for b in [(1, 0), (2, 0), (2, 1)] {
    ///     gate.handle_disk_write_locked(t0, &b, 0, &mut rng);
    /// }
    /// gate.retain(|&(table, _)| table != 2);
    /// assert_eq!(gate.len(), 1);
    /// # Ok::<(), throttle_sansio::ConfigError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// Only if `keep` panics; the gate is unchanged.
    pub fn retain<F: FnMut(&K) -> bool>(&mut self, mut keep: F) {
        let n = self.slots.len();
        if n == 0 {
            return;
        }
        // User code first: every verdict before any change.
        let mut drop = alloc::vec![0u64; n.div_ceil(64)];
        let mut any = false;
        for (i, slot) in self.slots.iter().enumerate() {
            if !keep(&slot.key) {
                if let Some(w) = drop.get_mut(i / 64) {
                    *w |= 1 << (i % 64);
                }
                any = true;
            }
        }
        if !any {
            return;
        }
        // Highest index first: `evict` moves the last slot into the hole, and that slot was
        // already judged (and kept).
        for i in (0..n).rev() {
            if drop.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0) {
                self.evict(i);
            }
        }
        self.maybe_shrink();
    }

    /// Closes the gate: later installs are refused (they return zero and draw nothing), and
    /// every gate and probe state is cleared. Leader knowledge is kept. Emits one
    /// `Wake { at }` (the latest `now` seen) if any bucket was gated. Scans the buckets once.
    ///
    /// This is the `close` of `docs/architecture.md` ("Closing") for a machine that holds no
    /// work: what it holds back are senders waiting for an opening, and clearing the gates
    /// releases them (the `Wake`) instead of failing them; writes in flight are not its to
    /// touch. Idempotent: a second `close` finds nothing gated and emits nothing.
    pub fn close(&mut self) {
        self.closed = true;
        let now = self.clock.peek(Instant::ZERO);
        if (0..self.slots.len()).any(|i| self.slot_remaining(i, now) > Duration::ZERO) {
            self.push_wake(now);
        }
        // Keep only the buckets whose leader is unknown, holding nothing else.
        let mut unknown = alloc::vec![false; self.slots.len()];
        for &e in self.index.iter() {
            if e & LEADER_UNKNOWN != 0 {
                if let Some(u) = unknown.get_mut(slot_of(e)) {
                    *u = true;
                }
            }
        }
        let slots = core::mem::take(&mut self.slots);
        let hashes = core::mem::take(&mut self.hashes);
        self.index.clear();
        self.extra.clear();
        self.probes.clear();
        self.heap.clear();
        for ((slot, hash), keep) in slots.into_iter().zip(hashes).zip(unknown) {
            if keep {
                let _ = self.insert(slot.key, hash, LEADER_UNKNOWN);
            }
        }
    }

    /// Remove slot `i` (from the heap too), keeping the slot vector dense: the last slot moves
    /// into `i`, and its map entry, custom deadlines, probe state and heap item follow.
    pub(super) fn evict(&mut self, i: usize) {
        let Some(last) = self.slots.len().checked_sub(1) else {
            return;
        };
        let Some(hash) = self.hashes.get(i).map(|h| h.map_hash()) else {
            return;
        };
        // Entries are found by stored hash and slot index: no user code runs.
        if let Ok(e) = self.index.find_entry(hash, |&e| slot_of(e) == i) {
            e.remove();
        }
        if i != last {
            if let Some(moved) = self.hashes.get(last).map(|h| h.map_hash()) {
                if let Some(e) = self.index.find_mut(moved, |&e| slot_of(e) == last) {
                    *e = (*e & LEADER_UNKNOWN) | i as u32;
                }
            }
        }
        // The key is dropped at the end, once the gate is consistent again.
        let _gone = self.slots.swap_remove(i);
        self.hashes.swap_remove(i);
        let stride = self.stride();
        if stride > 0 {
            let (from, to) = (last.saturating_mul(stride), i.saturating_mul(stride));
            for k in 0..stride {
                let moved = self.extra.get(from.saturating_add(k)).copied();
                if let (Some(v), Some(d)) = (moved, self.extra.get_mut(to.saturating_add(k))) {
                    *d = v;
                }
            }
            self.extra.truncate(from);
        }
        if i < self.probes.len() {
            self.probes.swap_remove(i);
        }
        self.heap.swap_remove_slot(i);
    }

    /// Shrink (to twice the live size, never below [`MIN_CAPACITY`]) once below a quarter of
    /// capacity, so memory follows the number of gated buckets without reallocating on every
    /// eviction. The floor keeps an emptied gate's small arrays: freeing them at zero entries
    /// would re-allocate the map, slots and heap on the next install, i.e. on every cycle of
    /// a bucket gated now and then (`docs/design.md` §2.6: no per-decision allocation after
    /// warm-up). `shrink_to` is a no-op at or below the target, so a gate within the floor never
    /// moves.
    pub(super) fn maybe_shrink(&mut self) {
        let len = self.slots.len();
        let target = len.saturating_mul(2).max(MIN_CAPACITY);
        if len < self.index.capacity() / 4 {
            let hashes = &self.hashes;
            self.index
                .shrink_to(target, |&e| stored_map_hash(hashes, e));
        }
        let mut slots_target = None;
        if len < self.slots.capacity() / 4 {
            self.slots.shrink_to(target);
            self.hashes.shrink_to(target);
            self.extra.shrink_to(target.saturating_mul(self.stride()));
            self.probes.shrink_to(if self.probing { target } else { 0 });
            slots_target = Some(target);
        }
        let gated = self.heap.len();
        let items_target =
            (gated < self.heap.capacity() / 4).then(|| gated.saturating_mul(2).max(MIN_CAPACITY));
        if items_target.is_some() || slots_target.is_some() {
            self.heap.shrink_to(
                items_target.unwrap_or(usize::MAX),
                slots_target.unwrap_or(usize::MAX),
            );
        }
    }
}
