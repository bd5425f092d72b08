//! The batcher's withdrawals, pauses, requeues and closes: the inputs that take batches
//! out of the line or put them back.

use super::*;

impl<Shard, H, S, P, E> Batcher<Shard, H, S, P, E>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    /// Withdraws the operation `op` if its batch has not left yet (it is open, parked or
    /// queued): the operation is taken out of the batch, which keeps the others in their
    /// order, and its handle is handed back in [`Withdrawal::Withdrawn`]. A batch left empty
    /// is dropped: it never takes a credit, and the shard's next batch goes out as if it had
    /// never been. Runs no user code and emits no action.
    ///
    /// [`Withdrawal::TooLate`] if the operation's batch has left (its `Send` was emitted: the
    /// operation ends through [`poll_action`](Self::poll_action) as usual), or if it already
    /// ended or was withdrawn. An [`OpId`] this batcher never issued (another batcher's, a
    /// forged one) is refused as [`ReleaseError::Unknown`] and changes nothing.
    ///
    /// O(operations in the batch). The first withdrawal from a batch allocates a list of the
    /// positions' ordinals for it.
    ///
    /// ```
    /// use throttle_sansio::{Batcher, BatcherConfig, Instant, Withdrawal};
    /// # use core::hash::BuildHasherDefault;
    /// # #[derive(Default)] struct H(u64);
    /// # impl core::hash::Hasher for H {
    /// #     fn finish(&self) -> u64 { self.0 }
    /// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
    /// # }
    /// let mut b: Batcher<u32, u64, BuildHasherDefault<H>, &str> = Batcher::new(BatcherConfig::reads());
    /// let id = b.handle_op_with_payload(Instant::ZERO, 1, 7, "get a", 0).unwrap();
    /// assert_eq!(b.cancel_with_payload(id), Ok(Withdrawal::Withdrawn((7, "get a"))));
    /// ```
    pub fn cancel_with_payload(&mut self, op: OpId) -> Result<Withdrawal<(H, P)>, ReleaseError> {
        let Some(&at) = self.held.get(op.batch) else {
            return match self.held.refusal(op.batch) {
                ReleaseError::AlreadyReleased => Ok(Withdrawal::TooLate),
                refusal => Err(refusal),
            };
        };
        let open = match at {
            Held::Open(place) => self.open_at(place),
            Held::Sent(_) => return Ok(Withdrawal::TooLate),
            _ => None,
        };
        let batch = match at {
            Held::Open(_) => open
                .and_then(|i| self.open_list.get_mut(i))
                .and_then(|o| o.batch.as_mut()),
            Held::Parked(place) => self.window.parked_at_mut(place),
            Held::Queued(ticket) => self.window.queued_mut(ticket),
            Held::Sent(_) => None,
        };
        let Some(batch) = batch.filter(|b| b.id == op.batch) else {
            // Unreachable: `held` follows every batch that has not left.
            debug_assert!(false, "a held batch is not where it is recorded");
            return Ok(Withdrawal::TooLate);
        };
        if op.ordinal >= batch.next_ordinal {
            return Err(ReleaseError::Unknown);
        }
        let position = if batch.ordinals.is_empty() {
            // Nothing withdrawn yet: ordinals are positions.
            let Ok(p) = usize::try_from(op.ordinal) else {
                return Ok(Withdrawal::TooLate);
            };
            batch.ordinals.extend(0..batch.next_ordinal);
            p
        } else {
            match batch.ordinals.binary_search(&op.ordinal) {
                Ok(p) => p,
                Err(_) => return Ok(Withdrawal::TooLate), // withdrawn before
            }
        };
        // Payloads are kept position by position with the handles until the batch is sent.
        if position >= batch.ops.len() || position >= batch.payloads.len() {
            debug_assert!(false, "an ordinal beyond the batch");
            return Ok(Withdrawal::TooLate);
        }
        batch.ordinals.remove(position);
        let handle = batch.ops.remove(position);
        let payload = batch.payloads.remove(position);
        if position < batch.deadlines.len() {
            batch.deadlines.remove(position);
        }
        let emptied = batch.ops.is_empty();
        self.maintenance.touch();
        if emptied {
            let empty = match at {
                Held::Open(_) => {
                    let b = open
                        .and_then(|i| self.open_list.get_mut(i))
                        .and_then(|o| o.batch.take());
                    if b.is_some() {
                        self.open_count = self.open_count.saturating_sub(1);
                    }
                    b
                }
                Held::Parked(place) => self.window.reclaim_at(place),
                Held::Queued(ticket) => self.window.cancel(ticket).ok(),
                Held::Sent(_) => None,
            };
            let _ = self.held.remove(op.batch);
            if let Some(b) = empty {
                self.recycle(b.ops);
                self.recycle_deadlines(b.deadlines);
            }
        }
        Ok(Withdrawal::Withdrawn((handle, payload)))
    }

    /// Pauses `shard` (its stream is down, e.g. during a reconnect backoff): until
    /// [`resume`](Self::resume) none of its batches is sent. Operations for it are still
    /// accepted and batched as when the shard has no credit: the open batch is parked at the
    /// next flush and keeps growing, full batches queue in arrival order. Batches in flight are
    /// untouched: report their ends as usual, or [`requeue`](Self::requeue) the torn ones
    /// (they go back at the head of the line and wait for the resume). The rule is the
    /// window's ([`DispatchWindow::pause`], where pausing a shard the window has no entry
    /// for, and the memory that takes, is described): the batcher adds none of its own.
    /// Idempotent; does nothing after [`close`](Self::close). [`drain`](Self::drain) does not
    /// lift it: a draining batcher is drained once the shard is resumed and everything sent
    /// has ended, or [`close`](Self::close) fails what is still held.
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash` or `Eq`, or the hasher, panics; the batcher is unchanged.
    pub fn pause(&mut self, shard: Shard) {
        self.maintenance.touch();
        self.window.pause(shard);
    }

    /// Ends a pause of `shard`: its held-back batches (requeued ones first, then the queued
    /// ones, then the parked open batch: the order they would have left in) are sent as far as
    /// the shard has credit, each as a [`BatchAction::Send`]; the rest follow as credits
    /// return. Does nothing for a shard that is not paused.
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash`, `Eq` or `Clone`, or the hasher, panics (every key copy is
    /// made before anything changes); the batcher is then unchanged.
    pub fn resume(&mut self, now: Instant, shard: Shard) {
        let sent = self.window.resume(now, &shard);
        self.clock.observe(now);
        self.maintenance.touch();
        for d in sent {
            self.record(d);
        }
        self.close_if_window_closed();
    }

    /// Gives `shard`'s window a limit of its own at run time (`None`: the configured one
    /// again), for a concurrency limiter ([`crate::limiter::Limiter`]) that sizes each shard's
    /// window from what it observes. The rule is the window's
    /// ([`DispatchWindow::set_max_in_flight`]): a larger limit sends the shard's held-back
    /// batches at once, oldest first (requeued, queued, then the parked open batch), as far
    /// as it has credit, each as a [`BatchAction::Send`]; a smaller one revokes nothing, and
    /// releases retire credits until the shard is under it. Allocates nothing after warm-up
    /// for a change that sends at most four batches. Does nothing after
    /// [`close`](Self::close).
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash`, `Eq` or `Clone`, or the hasher, panics (every key copy is
    /// made before anything changes); the batcher is then unchanged.
    pub fn set_max_in_flight(&mut self, now: Instant, shard: &Shard, limit: Option<NonZeroUsize>) {
        // A panicking key leaves the window and the buffer as they were.
        self.window
            .set_max_in_flight_into(shard, limit, &mut self.granted);
        self.clock.observe(now);
        self.maintenance.touch();
        let mut granted = core::mem::take(&mut self.granted);
        for d in granted.drain(..) {
            self.record(d);
        }
        self.granted = granted;
        self.close_if_window_closed();
    }

    /// Whether `shard` is paused ([`pause`](Self::pause), not resumed since).
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash` or `Eq`, or the hasher, panics.
    pub fn is_paused(&self, shard: &Shard) -> bool {
        self.window.is_paused(shard)
    }

    /// The batch in flight under `credit` was torn (its stream broke, so its operations may or
    /// may not have reached the server): puts it back at the head of its shard's order for
    /// at-least-once delivery, with `payloads`, the payloads its [`BatchAction::Send`]
    /// carried, in the same order (one per operation).
    ///
    /// The batch keeps its operations, their order and their [`OpId`]s. It goes before every
    /// batch of the shard that has not left (queued, parked or open), and after the shard's
    /// other requeued batches that left before it (its latest departure counts), whatever the
    /// order of the `requeue` calls: so when one tear takes a shard's batches in flight, they
    /// reach the server again in the order they left in. (A batch torn a second time, after
    /// a resend, goes by its resend: it may then follow a batch that first left after it.)
    /// Its credit
    /// is released exactly once, here (do not report the batch's end as well: a later
    /// [`handle_response`](Self::handle_response) or
    /// [`handle_failure`](Self::handle_failure) under `credit` is refused, as for any released
    /// credit). The freed credit goes to the head of the shard's line at once, unless the
    /// shard is [`pause`](Self::pause)d: pause first, requeue every torn batch, then
    /// [`resume`](Self::resume) once reconnected; the requeued batches are then sent first, in
    /// order (`BatchAction::Send`, with new credits and the payloads by value).
    ///
    /// While [`drain`](Self::drain)ing the batch is still sent again; after
    /// [`close`](Self::close) (or if the window can issue no ticket) its operations fail with
    /// [`FailReason::Closed`] instead. An operation of a requeued batch can be withdrawn with
    /// [`cancel_with_payload`](Self::cancel_with_payload) until the batch leaves again.
    ///
    /// This is the Rust Oxia client's handling of a torn write stream: the unacknowledged
    /// requests are put back in front of the shard's pending ones and sent again, in order,
    /// once the stream is back.
    ///
    /// `Err(RequeueError::Credit)` for an unknown or already-released credit;
    /// `Err(RequeueError::Payloads)` (the payloads handed back) when their number is not the
    /// batch's: either way nothing changes.
    ///
    /// # Panics
    ///
    /// If the shard's `Clone` panics (one copy, made before anything changes: the batch is
    /// then still in flight under `credit`, and `payloads` are dropped).
    pub fn requeue_with_payloads(
        &mut self,
        now: Instant,
        credit: CreditId,
        payloads: Vec<P>,
    ) -> Result<(), RequeueError<P>> {
        // The key copy (user `Clone`) first; then the clock sees `now`, refused or not, as in
        // `handle_response`.
        let key = self.window.credit_key(credit);
        // From here on no user code runs.
        self.clock.observe(now);
        let key = key.map_err(RequeueError::Credit)?;
        let expected = match self.batch(credit) {
            Some(b) => b.len(),
            // Unreachable: every live credit's batch is recorded.
            None => return Err(RequeueError::Credit(ReleaseError::Unknown)),
        };
        if payloads.len() != expected {
            return Err(RequeueError::Payloads { payloads, expected });
        }
        self.maintenance.touch();
        let Some(flight) = self.take_sent(credit) else {
            return Err(RequeueError::Credit(ReleaseError::Unknown));
        };
        let mut batch = flight.batch;
        batch.payloads = payloads;
        let id = batch.id;
        // Its operations' due entries may have left the deadline queue while it was in
        // flight: queue them again, in deadline order, for the next `handle_timeout`.
        let now = self.clock.peek(now);
        for (position, &at) in batch.deadlines.iter().enumerate() {
            if at > now {
                break;
            }
            let ordinal = match batch.ordinals.get(position) {
                Some(&o) => o,
                None => u64::try_from(position).unwrap_or(u64::MAX),
            };
            let op = OpId { batch: id, ordinal };
            // An entry no `handle_timeout` has reached yet is still there: one per operation.
            if self.timers.iter().any(|&(_, o)| o == op) {
                continue;
            }
            let i = self.timers.partition_point(|&(a, _)| a <= at);
            self.timers.insert(i, (at, op));
        }
        let (back, next) = match self.window.requeue(credit, key, None, batch) {
            Ok(done) => done,
            // Unreachable: the credit was live above and nothing ran since.
            Err(e) => return Err(RequeueError::Credit(e)),
        };
        match back {
            Ok(ticket) => self.locate(id, Held::Queued(ticket)),
            Err(e) => self.fail_closed(e.into_batch()),
        }
        self.after_release(next);
        Ok(())
    }

    /// The failing close: every operation not yet sent (open, queued or parked) fails with
    /// [`FailReason::Closed`] (drain them with [`poll_action`](Self::poll_action)). Batches in
    /// flight are untouched; complete them as usual (their releases send nothing). Later
    /// operations are refused. Idempotent: a second `close` fails nothing more; after
    /// [`drain`](Self::drain) it fails what the drain had not sent yet. Runs no user code.
    ///
    /// Order: per shard, arrival order, batch by batch: the queued batches oldest first, then
    /// the open batch (parked or not), each in its operations' order, which is the order
    /// [`drain`](Self::drain) would have sent them in. (Oxia's `fail_all` fails the open
    /// batch first; arrival order lets a caller that retries failed operations in the order
    /// it gets them keep each shard's order.) Shards come in no particular order.
    pub fn close(&mut self) {
        self.closed = true;
        self.maintenance.touch();
        // Nothing is held back after this: no operation is left to time out.
        self.timers.clear();
        self.open.clear();
        let mut list = core::mem::take(&mut self.open_list);
        let mut open = Vec::new();
        for o in list.drain(..) {
            self.window.unpin(o.place);
            if let Some(batch) = o.batch {
                self.open_count = self.open_count.saturating_sub(1);
                open.push(batch);
            }
        }
        self.open_list = list;
        // A shard's open batch is either parked (handed out after its queued ones) or held
        // here, never both: `handle_op` reclaims the parked one.
        let mut held = Vec::new();
        self.window.close_with(|_, batch| held.push(batch));
        for batch in held.into_iter().chain(open) {
            self.fail_closed(batch);
        }
    }

    /// The draining close: later operations are refused ([`Refused`], as after
    /// [`close`](Self::close)), but every operation already accepted is still sent: open
    /// batches are flushed now, and queued and parked batches go out as credits return,
    /// keeping batch boundaries and per-shard arrival order. Complete batches in flight as
    /// usual; once nothing is open, queued, parked or in flight and every action is drained,
    /// [`is_drained`](Self::is_drained). Withdrawing with `cancel` still works until a batch
    /// leaves. A [`close`](Self::close) afterwards fails what is still held back.
    /// Idempotent; does nothing after `close`. Runs no user code; uses no window operation
    /// beyond those of an open batcher.
    ///
    /// ```
    /// use throttle_sansio::batcher::{RefuseReason, Refused};
    /// use throttle_sansio::{BatchAction, Batcher, BatcherConfig, Instant, WindowConfig};
    /// # use core::hash::BuildHasherDefault;
    /// # #[derive(Default)] struct H(u64);
    /// # impl core::hash::Hasher for H {
    /// #     fn finish(&self) -> u64 { self.0 }
    /// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
    /// # }
    /// let one = BatcherConfig::reads().with_window(WindowConfig::default().with_max_in_flight(1)).unwrap();
    /// let mut b: Batcher<u32, &str, BuildHasherDefault<H>> = Batcher::new(one);
    /// let now = Instant::ZERO;
    /// b.handle_op(now, 1, "a", 0).unwrap();
    /// let Some(BatchAction::Send { credit, .. }) = b.poll_action() else { unreachable!() };
    /// b.handle_op(now, 1, "b", 0).unwrap(); // no credit left: held back
    /// b.drain(now);
    /// assert_eq!(b.handle_op(now, 1, "c", 0), Err(Refused::new("c", RefuseReason::Draining)));
    /// assert_eq!(b.poll_action(), None);
    /// b.handle_response(now, credit, [0]).unwrap(); // the credit returns: "b" goes out
    /// assert!(matches!(b.poll_action(), Some(BatchAction::Deliver { handle: "a", .. })));
    /// let Some(BatchAction::Send { credit, .. }) = b.poll_action() else { unreachable!() };
    /// assert!(!b.is_drained(), "b is in flight");
    /// b.handle_response(now, credit, [0]).unwrap();
    /// assert!(matches!(b.poll_action(), Some(BatchAction::Deliver { handle: "b", .. })));
    /// assert!(b.is_drained());
    /// ```
    pub fn drain(&mut self, now: Instant) {
        if self.closed {
            self.clock.observe(now);
            return;
        }
        self.draining = true;
        self.flush(now);
    }

    /// Whether operations are refused ([`close`](Self::close) or [`drain`](Self::drain)) and
    /// everything accepted has ended: nothing open, queued, parked or in flight, and no
    /// action left to [`poll_action`](Self::poll_action).
    pub fn is_drained(&self) -> bool {
        (self.closed || self.draining)
            && self.open_count == 0
            && self.window.shard_count() == 0
            && self.window.live_credits() == 0
            && self.actions.is_empty()
    }

    /// Whether [`drain`](Self::drain) was called (operations are refused, but everything
    /// accepted is sent).
    pub fn is_draining(&self) -> bool {
        self.draining
    }
}

impl<Shard, H, S, E> Batcher<Shard, H, S, (), E>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    /// Adds an operation of `bytes` bytes for `shard`, with no payload: the batch's `Send`
    /// carries `()`s and the caller reads the handles by reference with
    /// [`batch`](Self::batch). Otherwise exactly
    /// [`handle_op_with_payload`](Self::handle_op_with_payload).
    pub fn handle_op(
        &mut self,
        now: Instant,
        shard: Shard,
        handle: H,
        bytes: u64,
    ) -> Result<OpId, Refused<H>> {
        self.handle_op_with_payload(now, shard, handle, (), bytes)
            .map_err(|r| Refused::new(r.handle.0, r.reason))
    }

    /// Withdraws the operation `op` if its batch has not left yet, handing its handle back:
    /// [`cancel_with_payload`](Self::cancel_with_payload) without a payload.
    pub fn cancel(&mut self, op: OpId) -> Result<Withdrawal<H>, ReleaseError> {
        self.cancel_with_payload(op).map(|w| match w {
            Withdrawal::Withdrawn((handle, ())) => Withdrawal::Withdrawn(handle),
            Withdrawal::TooLate => Withdrawal::TooLate,
        })
    }

    /// The batch in flight under `credit` was torn (its stream broke before an answer): puts
    /// it back at the head of its shard's order, to be sent again:
    /// [`requeue_with_payloads`](Self::requeue_with_payloads) for operations without a
    /// payload. An unknown or already-released credit is an `Err` and changes nothing.
    ///
    /// # Panics
    ///
    /// If the shard's `Clone` panics (one copy, made before anything changes: the batch is
    /// then still in flight under `credit`).
    ///
    /// ```
    /// use core::num::NonZeroUsize;
    /// use throttle_sansio::{BatchAction, Batcher, BatcherConfig, Instant};
    /// # use core::hash::BuildHasherDefault;
    /// # #[derive(Default)] struct H(u64);
    /// # impl core::hash::Hasher for H {
    /// #     fn finish(&self) -> u64 { self.0 }
    /// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
    /// # }
    /// let one = NonZeroUsize::MIN;
    /// let cfg = BatcherConfig::writes().with_max_requests_per_batch(one);
    /// let mut b: Batcher<u32, &str, BuildHasherDefault<H>> = Batcher::new(cfg);
    /// let now = Instant::ZERO;
    /// b.handle_op(now, 1, "put k1", 1).unwrap();
    /// b.handle_op(now, 1, "put k2", 1).unwrap();
    /// let sent = |b: &mut Batcher<u32, &str, _>| -> Vec<_> {
    ///     core::iter::from_fn(|| b.poll_action())
    ///         .filter_map(|a| match a { BatchAction::Send { credit, .. } => Some(credit), _ => None })
    ///         .collect()
    /// };
    /// let [c1, c2] = sent(&mut b)[..] else { unreachable!() };
    /// b.pause(1); // the stream tore: nothing more goes out until it is back
    /// b.requeue(now, c1).unwrap();
    /// b.requeue(now, c2).unwrap();
    /// b.resume(now, 1); // reconnected
    /// let again = sent(&mut b);
    /// assert_eq!(b.batch(again[0]).unwrap().ops(), ["put k1"]);
    /// assert_eq!(b.batch(again[1]).unwrap().ops(), ["put k2"]);
    /// ```
    pub fn requeue(&mut self, now: Instant, credit: CreditId) -> Result<(), ReleaseError> {
        let n = self.batch(credit).map_or(0, Batch::len);
        let mut payloads = Vec::new();
        payloads.resize(n, ());
        self.requeue_with_payloads(now, credit, payloads)
            .map_err(|e| match e {
                RequeueError::Credit(e) => e,
                // Unreachable: one `()` per operation was passed.
                RequeueError::Payloads { .. } => ReleaseError::Unknown,
            })
    }
}
