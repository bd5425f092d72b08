//! The write gate's queries: what a bucket may do now, when it reopens and why, and the
//! internal consistency check.

use super::*;
use crate::snapshot::{Cursor, Page};

/// One reason holding a bucket closed, in a [`BucketSnapshot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReasonOpening {
    /// The reason.
    pub reason: Reason,
    /// Its name as registered ([`ReasonSpec::name`]).
    pub name: &'static str,
    /// When this reason alone would let the bucket open.
    pub opens_at: Instant,
}

/// One tracked bucket in a [`WriteGate::snapshot`] page, in plain terms.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BucketSnapshot<K> {
    /// The bucket.
    pub bucket: K,
    /// What [`WriteGate::check`] answers for it.
    pub state: GateState,
    /// Every pending reason with its opening, as [`WriteGate::reasons`] lists them.
    pub reasons: Vec<ReasonOpening>,
}

impl<K, S> WriteGate<K, S>
where
    K: Hash + Eq + Clone,
    S: BuildHasher,
{
    // ---------------------------------------------------------------------------- queries

    /// How long `bucket` stays closed: the maximum over its reasons (zero when open).
    ///
    /// # Panics
    ///
    /// Only if the bucket's `Hash` or `Eq`, or the hasher, panics; the gate is unchanged.
    pub fn remaining(&self, now: Instant, bucket: &K) -> Duration {
        let now = self.clock.peek(now);
        self.find(bucket)
            .map_or(Duration::ZERO, |e| self.slot_remaining(slot_of(e), now))
    }

    /// [`Self::remaining`] in whole milliseconds, rounded **up**: a closed bucket never
    /// reports 0 ms.
    ///
    /// # Panics
    ///
    /// Only if the bucket's `Hash` or `Eq`, or the hasher, panics; the gate is unchanged.
    pub fn remaining_ms(&self, now: Instant, bucket: &K) -> u64 {
        ceil_millis(self.remaining(now, bucket))
    }

    /// Whether `bucket` may send now; leader-first, then the dominant gate, then probing.
    ///
    /// # Panics
    ///
    /// Only if the bucket's `Hash` or `Eq`, or the hasher, panics; the gate is unchanged.
    pub fn check(&self, now: Instant, bucket: &K) -> GateState {
        let now = self.clock.peek(now);
        // The slot the lookup compared the key with: read once, no second bounds check.
        let Some((entry, slot)) = self.lookup_slot(bucket).1 else {
            return GateState::Open;
        };
        if entry & LEADER_UNKNOWN != 0 {
            return GateState::UnknownLeader;
        }
        let i = slot_of(entry);
        if let Some((reason, until)) = self.dominant_in(&slot.deadlines, i, now) {
            return GateState::Closed { until, reason };
        }
        // A lapsed probe state reads as open before handle_timeout evicts it.
        if self.probe_lapse(i).is_none_or(|l| l <= now) {
            return GateState::Open;
        }
        let probe = self.probe(i);
        match self.probe_limit(probe.armed) {
            Some((reason, allowed)) if probe.used >= allowed => GateState::Probing { reason },
            _ => GateState::Open,
        }
    }

    /// When `bucket`'s [`check`](Self::check) answer next changes by the passage of time
    /// alone: its opening (`until`) while `Closed`, the lapse of its probe state while
    /// `Probing` ([`ReasonSpec::probe_ttl`] after it opened), `None` while `Open` or
    /// `UnknownLeader` (nothing changes without an input). Always later than `now` when
    /// `Some`. A sender parks a bucket it may not send until this instant instead of asking
    /// again at once, which is what keeps a `Probing` bucket from spinning.
    pub fn reopens_at(&self, now: Instant, bucket: &K) -> Option<Instant> {
        let now = self.clock.peek(now);
        let entry = self.find(bucket)?;
        if entry & LEADER_UNKNOWN != 0 {
            return None;
        }
        let i = slot_of(entry);
        if let Some((_, until)) = self.dominant(i, now) {
            return Some(until);
        }
        let lapse = self.probe_lapse(i).filter(|&l| l > now)?;
        let probe = self.probe(i);
        match self.probe_limit(probe.armed) {
            Some((_, allowed)) if probe.used >= allowed => Some(lapse),
            _ => None,
        }
    }

    /// The dominant pending reason of `bucket` and its deadline (latest deadline; ties to
    /// the lower reason index), or `None` when no deadline is pending. Ignores the leader
    /// and probe state.
    ///
    /// # Panics
    ///
    /// Only if the bucket's `Hash` or `Eq`, or the hasher, panics; the gate is unchanged.
    pub fn explain(&self, now: Instant, bucket: &K) -> Option<(Reason, Instant)> {
        let now = self.clock.peek(now);
        self.dominant(slot_of(self.find(bucket)?), now)
    }

    /// Every pending reason of `bucket` with its own deadline (when that reason alone would
    /// let the bucket open), in reason index order: the built-in reasons, then the registered
    /// ones. Empty when no deadline is pending (an open or untracked bucket). The bucket
    /// opens at the latest of them, which [`explain`](Self::explain) names; like `explain`,
    /// this ignores the leader and probe state. O(reasons), no allocation.
    ///
    /// # Panics
    ///
    /// Only if the bucket's `Hash` or `Eq`, or the hasher, panics; the gate is unchanged.
    pub fn reasons(
        &self,
        now: Instant,
        bucket: &K,
    ) -> impl Iterator<Item = (Reason, Instant)> + '_ {
        let now = self.clock.peek(now);
        let i = self.find(bucket).map(slot_of);
        let (builtin, extra): (&[Instant], &[Instant]) =
            match i.and_then(|i| Some((i, self.slots.get(i)?))) {
                Some((i, slot)) => (&slot.deadlines, self.extra_of(i)),
                None => (&[], &[]),
            };
        // Reason indices are below `MAX_REASONS` (64), so they count in `u8` as `Reason` does.
        (0u8..)
            .zip(builtin.iter().chain(extra))
            .filter(move |&(_, &d)| d > now)
            .map(|(r, &d)| (config::reason_from_u8(r), d))
    }

    /// One page of at most `max` tracked buckets (any with state: a deadline, an unknown
    /// leader, probe state), each with its [`check`](Self::check) answer and every pending
    /// reason with its name and opening time. Start with `from = None`, then pass each page's
    /// `next` until it is `None`; see [`crate::snapshot`] for what a walk over a gate that
    /// changes between pages guarantees (every bucket tracked throughout is listed at least
    /// once). O(`max` · reasons); allocates the page.
    ///
    /// ```
    /// use throttle_sansio::write_gate::{GateState, Reason, WriteGate, WriteGateConfig};
    /// use throttle_sansio::{Instant, Signal};
    /// # #[derive(Default, Clone)] struct H; impl core::hash::BuildHasher for H {
    /// #   type Hasher = F; fn build_hasher(&self) -> F { F(0) } }
    /// # struct F(u64); impl core::hash::Hasher for F { fn finish(&self) -> u64 { self.0 }
    /// #   fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.rotate_left(5) ^ u64::from(*x) } } }
    ///
    /// let mut gate: WriteGate<u32, H> = WriteGate::new(WriteGateConfig::fluss_issue_3454())?;
    /// let t0 = Instant::from_millis(0);
    /// for bucket in 0..5 {
    ///     gate.handle_kv_signal(t0, &bucket, Signal::Full);
    /// }
    /// let (mut listed, mut from) = (Vec::new(), None);
    /// loop {
    ///     let page = gate.snapshot(t0, from, 2); // two buckets per page
    ///     for b in &page.items {
    ///         assert!(matches!(b.state, GateState::Closed { .. }));
    ///         assert_eq!(b.reasons[0].reason, Reason::KV_BACKPRESSURE);
    ///         listed.push(b.bucket);
    ///     }
    ///     match page.next {
    ///         Some(next) => from = Some(next),
    ///         None => break,
    ///     }
    /// }
    /// listed.sort();
    /// assert_eq!(listed, [0, 1, 2, 3, 4]);
    /// # Ok::<(), throttle_sansio::ConfigError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// Only if a bucket's `Hash`, `Eq` or `Clone`, or the hasher, panics; the gate is
    /// unchanged.
    pub fn snapshot(
        &self,
        now: Instant,
        from: Option<Cursor>,
        max: usize,
    ) -> Page<BucketSnapshot<K>> {
        let (range, next) = Page::<BucketSnapshot<K>>::walk(self.slots.len(), from, max);
        let specs = self.cfg.reasons();
        let items = self.slots[range]
            .iter()
            .rev()
            .map(|slot| BucketSnapshot {
                bucket: slot.key.clone(),
                state: self.check(now, &slot.key),
                reasons: self
                    .reasons(now, &slot.key)
                    .map(|(reason, opens_at)| ReasonOpening {
                        reason,
                        name: specs.get(reason.index()).map_or("", |s| s.name()),
                        opens_at,
                    })
                    .collect(),
            })
            .collect();
        Page { items, next }
    }

    /// Whether the gate holds `bucket`'s leader as known (the default for any bucket).
    ///
    /// # Panics
    ///
    /// Only if the bucket's `Hash` or `Eq`, or the hasher, panics; the gate is unchanged.
    pub fn is_leader_known(&self, bucket: &K) -> bool {
        self.find(bucket).is_none_or(|e| e & LEADER_UNKNOWN == 0)
    }

    /// Number of buckets with any state (a stored deadline, an unknown leader, or probe
    /// state). Zero once every gate has expired and been evicted.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no bucket has any state.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Number of buckets taking part in [`Self::poll_timeout`] (gated, leader known).
    pub fn gated_len(&self) -> usize {
        self.heap.len()
    }

    /// Whether [`Self::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Internal consistency (map ↔ slots ↔ heap), for the model checker.
    #[cfg(any(test, feature = "model"))]
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let n = self.slots.len();
        if self.index.len() != n || self.heap.slots() != n || self.hashes.len() != n {
            return Err("map, slot vector, hashes and heap positions differ in length");
        }
        if self.extra.len() != n.saturating_mul(self.stride()) {
            return Err("custom deadlines do not match the slots and the registry");
        }
        if self.probes.len() != if self.probing { n } else { 0 } {
            return Err("probe state does not match the slots");
        }
        for (i, slot) in self.slots.iter().enumerate() {
            if self.hashes.get(i) != Some(&StoredHash::of(self.hasher.hash_one(&slot.key))) {
                return Err("a slot's stored hash is not its key's");
            }
            let Some(entry) = self.find(&slot.key) else {
                return Err("a slot's key is not in the map");
            };
            if slot_of(entry) != i {
                return Err("map does not point at the slot holding the key");
            }
            let unknown = entry & LEADER_UNKNOWN != 0;
            let opening = self.opening(i);
            if !unknown && self.probe(i).armed == 0 && opening == Instant::ZERO {
                return Err("an idle bucket was not evicted");
            }
            let key = if opening != Instant::ZERO {
                Some(opening)
            } else {
                self.probe_lapse(i)
            };
            let wanted = !unknown && key.is_some();
            if wanted != self.heap.contains(i) {
                return Err("heap membership disagrees with the bucket's state");
            }
            if let (true, Some(key)) = (wanted, key) {
                if self.heap.position(i).and_then(|p| self.heap.get(p)) != Some((key, i)) {
                    return Err("heap item does not match the bucket's opening");
                }
            }
            if self.closed && opening != Instant::ZERO {
                return Err("a gate survived close");
            }
        }
        if !self.heap.is_consistent() {
            return Err("heap order or positions broken");
        }
        Ok(())
    }
}
