//! The batcher's timers: operation deadlines and maintenance.

use super::*;

impl<Shard, H, S, P, E> Batcher<Shard, H, S, P, E>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    /// Maintenance for the batcher and its window: gives memory back, once at most per
    /// [`MAINTENANCE_INTERVAL`](crate::dispatch_window::MAINTENANCE_INTERVAL).
    ///
    /// Spare operation buffers beyond the peak number in use since the previous run are
    /// freed; the open-batch map, the pools and the other buffers shrink only if that peak is
    /// below a quarter of their capacity, and then to twice the peak. A workload that repeats
    /// within the interval therefore keeps what it uses and allocates nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        self.expire(now);
        self.window.handle_timeout(now);
        if !self.maintenance.begin(now) {
            return;
        }
        let timers = self.peak_timers.roll(self.timers.len());
        if let Some(target) = self.maintenance.target(self.timers.capacity(), timers) {
            self.timers.shrink_to(target);
        }
        let open = self.peak_open.roll(self.open_list.len());
        if let Some(target) = self.maintenance.target(self.open.capacity(), open) {
            let list = &self.open_list;
            self.open.shrink_to(target, |&j| open_hash(list, j));
        }
        if let Some(target) = self.maintenance.target(self.open_list.capacity(), open) {
            self.open_list.shrink_to(target);
        }
        let out = self.peak_ops_out.roll(self.ops_out);
        self.spare_ops.truncate(out.saturating_sub(self.ops_out));
        self.spare_deadlines
            .truncate(out.saturating_sub(self.ops_out));
        if let Some(target) = self
            .maintenance
            .target(self.spare_deadlines.capacity(), out)
        {
            self.spare_deadlines.shrink_to(target);
        }
        if let Some(target) = self.maintenance.target(self.spare_ops.capacity(), out) {
            self.spare_ops.shrink_to(target);
        }
        let len = self.peak_batch_len.roll(0);
        for ops in &mut self.spare_ops {
            if let Some(target) = self.maintenance.target(ops.capacity(), len) {
                ops.shrink_to(target);
            }
        }
        if let Some(target) = self.maintenance.target(self.responded.capacity(), len) {
            self.responded.shrink_to(target);
        }
        if let Some(target) = self.maintenance.target(self.errors.capacity(), len) {
            self.errors.shrink_to(target);
        }
        self.held.shrink(&self.maintenance);
        let actions = self.peak_actions.roll(self.actions.len());
        if let Some(target) = self.maintenance.target(self.actions.capacity(), actions) {
            self.actions.shrink_to(target);
        }
        // In-flight batches are indexed by credit slot; slots past the window's slab are free.
        let slots = self.window.credit_slots();
        if let Some(target) = self.maintenance.target(self.sent.capacity(), slots) {
            self.sent.truncate(slots);
            self.sent.shrink_to(target);
        }
    }

    /// Sets the capacity collections keep when they shrink, so model checks reach shrinking.
    #[cfg(feature = "model")]
    pub(crate) fn set_shrink_floor(&mut self, floor: usize) {
        self.maintenance.set_floor(floor);
        self.window.set_shrink_floor(floor);
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next run: the earliest deadline
    /// of an operation held back (with an operation timeout), or maintenance for the batcher
    /// or its window; `None` while there is neither. O(1). It may name the deadline of an
    /// operation that has ended since (a run then changes nothing but the queue of
    /// deadlines), never one later than a held operation's.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.maintenance.deadline(),
            self.window.poll_timeout(),
            self.timers.front().map(|&(at, _)| at),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Takes back an emptied buffer. Every buffer handed out comes back here exactly once, so
    /// the pool never holds more than the peak number in use (maintenance trims it further).
    pub(super) fn recycle(&mut self, ops: Vec<H>) {
        self.ops_out = self.ops_out.saturating_sub(1);
        self.spare_ops.push(ops);
    }

    /// Takes back an emptied batch's deadline buffer (one that never allocated is dropped):
    /// at most one per operation buffer handed out, as for `spare_ops`.
    pub(super) fn recycle_deadlines(&mut self, mut deadlines: Vec<Instant>) {
        if deadlines.capacity() > 0 {
            deadlines.clear();
            self.spare_deadlines.push(deadlines);
        }
    }

    /// Queues the deadline of the operation just accepted (the latest yet, the clock being
    /// clamped), first dropping every stale entry once the queue reaches `timers_limit`.
    pub(super) fn push_timer(&mut self, at: Instant, op: OpId) {
        if self.timers.len() >= self.timers_limit {
            let mut timers = core::mem::take(&mut self.timers);
            timers.retain(|&(_, op)| self.holds_op(op));
            self.timers = timers;
            self.timers_limit = self.timers.len().saturating_mul(2).max(TIMERS_MIN);
        }
        self.timers.push_back((at, op));
        self.peak_timers.see(self.timers.len());
    }

    /// Whether `op` is still in a batch this batcher holds (open, parked, queued or in
    /// flight): not ended, withdrawn or timed out. O(log operations of its batch).
    pub(super) fn holds_op(&self, op: OpId) -> bool {
        let batch = match self.held.get(op.batch) {
            None => None,
            Some(&Held::Open(place)) => self
                .open_at(place)
                .and_then(|i| self.open_list.get(i))
                .and_then(|o| o.batch.as_ref()),
            Some(&Held::Parked(place)) => self.window.parked_at(place),
            Some(&Held::Queued(ticket)) => self.window.queued_at(ticket),
            Some(&Held::Sent(credit)) => self.batch(credit),
        };
        batch.is_some_and(|b| {
            b.id == op.batch
                && op.ordinal < b.next_ordinal
                && (b.ordinals.is_empty() || b.ordinals.binary_search(&op.ordinal).is_ok())
        })
    }

    /// Ends every operation not yet sent whose deadline is at or before `now` with
    /// [`FailReason::TimedOut`] (withdrawn as [`cancel`](Self::cancel) would, its payload
    /// dropped), in acceptance order, and drops the stale entries at the front: afterwards the
    /// front entry, if any, is a held operation's, due after `now`. An entry of an operation
    /// in flight is dropped once due: the send's deadline ([`Batch::deadline`]) is the
    /// caller's to enforce, and a [`requeue`](Self::requeue) queues the entries again.
    pub(super) fn expire(&mut self, now: Instant) {
        while let Some(&(at, op)) = self.timers.front() {
            let at_held = self.held.get(op.batch).copied();
            match at_held {
                Some(_) if at > now => break,
                None | Some(Held::Sent(_)) => {}
                Some(_) => {
                    if let Ok(Withdrawal::Withdrawn((handle, payload))) =
                        self.cancel_with_payload(op)
                    {
                        self.push_action(BatchAction::Fail {
                            handle,
                            reason: FailReason::TimedOut,
                        });
                        // Dropped after everything is consistent: its destructor is user code.
                        self.timers.pop_front();
                        drop(payload);
                        continue;
                    }
                }
            }
            self.timers.pop_front();
        }
    }
}
