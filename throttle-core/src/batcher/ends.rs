//! How batches leave and end: the flush, and a batch's response or failure; the internal
//! consistency check.

use super::*;

impl<Shard, H, S, P, E> Batcher<Shard, H, S, P, E>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    /// The driver's input queue is empty: send every open batch whose shard has credit; park
    /// the others in the window, where they keep growing. Runs no user code.
    ///
    /// The open-batch map keeps its capacity for the next round; only
    /// [`handle_timeout`](Self::handle_timeout) shrinks it.
    pub fn flush(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        // Operations past their deadline time out rather than leave.
        self.expire(now);
        self.maintenance.touch();
        self.open.clear();
        let mut list = core::mem::take(&mut self.open_list);
        for open in list.drain(..) {
            let place = open.place;
            if let Some(batch) = open.batch {
                self.open_count = self.open_count.saturating_sub(1);
                let id = batch.id;
                match self.window.submit_or_park_at(place, open.key, None, batch) {
                    Ok(Some(d)) => self.record(d),
                    Ok(None) => self.locate(id, Held::Parked(place)),
                    Err(e) => {
                        // Closed (id space spent) or, impossibly, already parked: never lose
                        // ops.
                        self.fail_closed(e.into_batch());
                        self.close_if_window_closed();
                    }
                }
            }
            self.window.unpin(place);
        }
        self.open_list = list;
    }

    /// The batch under `credit` got a response covering `positions` (indexes into its
    /// [`Batch::ops`]). Delivers those, fails the rest with [`FailReason::NoResponse`], and
    /// releases the credit (which may `Send` the shard's next batch).
    ///
    /// An unknown or already-released credit is an `Err`; nothing changes and `positions` is
    /// not read.
    pub fn handle_response<I>(
        &mut self,
        now: Instant,
        credit: CreditId,
        positions: I,
    ) -> Result<(), ReleaseError>
    where
        I: IntoIterator<Item = usize>,
    {
        // `complete` copies the key (user `Clone`) before it changes anything.
        let next = self.window.complete(credit);
        self.clock.observe(now);
        let next = next?;
        self.maintenance.touch();
        if let Some(flight) = self.take_sent(credit) {
            let _ = self.held.remove(flight.batch.id);
            self.responded.clear();
            self.responded.resize(flight.batch.ops.len(), false);
            for p in positions {
                if let Some(r) = self.responded.get_mut(p) {
                    *r = true;
                }
            }
            let mut ops = flight.batch.ops;
            self.recycle_deadlines(flight.batch.deadlines);
            for (position, handle) in ops.drain(..).enumerate() {
                let action = if self.responded.get(position).copied().unwrap_or(false) {
                    BatchAction::Deliver { handle, position }
                } else {
                    BatchAction::Fail {
                        handle,
                        reason: FailReason::NoResponse,
                    }
                };
                self.push_action(action);
            }
            self.recycle(ops);
        }
        self.after_release(next);
        Ok(())
    }

    /// The batch under `credit` failed as a whole with `error`: fails every operation with
    /// [`FailReason::BatchFailed`] carrying its own copy of `error` (the last operation gets
    /// `error` itself, so a batch of `n` clones it `n - 1` times; share an expensive error
    /// with an `Arc`), and releases the credit (which may `Send` the next batch). An unknown
    /// or already-released credit is an `Err`, changes nothing and drops `error`.
    ///
    /// `E = ()` for a caller with no error to pass.
    ///
    /// # Panics
    ///
    /// If `E::clone` panics. The copies are made before anything changes, so the batcher is
    /// then as it was (the credit is still live: report the failure again).
    ///
    /// ```
    /// use throttle_sansio::{BatchAction, Batcher, BatcherConfig, FailReason, Instant};
    /// # use core::hash::BuildHasherDefault;
    /// # #[derive(Default)] struct H(u64);
    /// # impl core::hash::Hasher for H {
    /// #     fn finish(&self) -> u64 { self.0 }
    /// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
    /// # }
    /// let mut b: Batcher<u32, &str, BuildHasherDefault<H>, (), &str> =
    ///     Batcher::new(BatcherConfig::reads());
    /// b.handle_op(Instant::ZERO, 1, "get a", 0).unwrap();
    /// let Some(BatchAction::Send { credit, .. }) = b.poll_action() else { unreachable!() };
    /// b.handle_failure(Instant::ZERO, credit, "not the leader").unwrap();
    /// assert_eq!(
    ///     b.poll_action(),
    ///     Some(BatchAction::Fail { handle: "get a", reason: FailReason::BatchFailed("not the leader") })
    /// );
    /// ```
    pub fn handle_failure(
        &mut self,
        now: Instant,
        credit: CreditId,
        error: E,
    ) -> Result<(), ReleaseError>
    where
        E: Clone,
    {
        // User code first: one copy of the error per operation but the last (`E::clone`), into
        // a scratch buffer of our own that a panic drops.
        let n = self.batch(credit).map_or(0, Batch::len);
        let mut errors = core::mem::take(&mut self.errors);
        errors.clear();
        for _ in 1..n {
            errors.push(error.clone());
        }
        if n > 0 {
            errors.push(error);
        }
        // `complete` copies the key (user `Clone`) before it changes anything.
        let next = self.window.complete(credit);
        self.clock.observe(now);
        let next = match next {
            Ok(next) => next,
            Err(e) => {
                errors.clear();
                self.errors = errors;
                return Err(e);
            }
        };
        self.maintenance.touch();
        if let Some(flight) = self.take_sent(credit) {
            let _ = self.held.remove(flight.batch.id);
            let mut ops = flight.batch.ops;
            self.recycle_deadlines(flight.batch.deadlines);
            for (handle, error) in ops.drain(..).zip(errors.drain(..)) {
                self.push_action(BatchAction::Fail {
                    handle,
                    reason: FailReason::BatchFailed(error),
                });
            }
            self.recycle(ops);
        }
        errors.clear();
        self.errors = errors;
        self.after_release(next);
        Ok(())
    }

    /// Internal consistency (the open index ↔ list ↔ pinned window entries), for the model
    /// checker and tests.
    #[cfg(any(test, feature = "model"))]
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        if self.open.len() != self.open_list.len() {
            return Err("the open index and list differ in length");
        }
        for (i, open) in self.open_list.iter().enumerate() {
            if open.hash != self.window.hash_key(&open.key) {
                return Err("an open shard's stored hash is not its key's");
            }
            if self.find_open(open.hash, &open.key) != Some(i) {
                return Err("an open shard's key does not find it");
            }
            if self.window.place_of(&open.key, open.hash) != Some(open.place)
                || !self.window.is_pinned(open.place)
            {
                return Err("an open shard's window entry is gone or unpinned");
            }
        }
        let some = self.open_list.iter().filter(|o| o.batch.is_some()).count();
        if some != self.open_count {
            return Err("open_count is wrong");
        }
        for open in &self.open_list {
            if let Some(b) = &open.batch {
                if self.held.get(b.id) != Some(&Held::Open(open.place)) {
                    return Err("an open batch is not recorded where it is");
                }
                if !b.ordinals.is_empty() && b.ordinals.len() != b.ops.len() {
                    return Err("an open batch's ordinals do not match its operations");
                }
            }
        }
        if self.held.live() < self.open_count {
            return Err("fewer batches recorded as held than open");
        }
        Ok(())
    }

    /// Batches that have not left (open, parked or queued), as `cancel` finds them.
    #[cfg(any(test, feature = "model"))]
    #[doc(hidden)]
    pub fn held_batches(&self) -> usize {
        // Every live credit's batch is recorded as sent.
        self.held.live().saturating_sub(self.window.live_credits())
    }
}
