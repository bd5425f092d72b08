//! Model check of [`Batcher`] against a naive reference.
//!
//! The reference keeps open batches, queued batches and batches in flight in plain `Vec`s of
//! `(shard, ops)` and decides every cut, send, park and end from the rules in `docs/design.md`
//! §3.4.2 by scanning them. It shares no code with the machine (no window, no maps, no credit
//! slab).
//!
//! Checked after every operation: the batches sent (per shard, in order, with their operations,
//! bytes and opening time), every operation's end (delivered at its position, or failed with
//! the right reason), exactly one end per operation, FIFO per shard (a shard's sent operations
//! only ever increase), never more than `max_in_flight` per shard with credits conserved,
//! double and bogus completions ending nothing, `open_batches()` equal to the reference's
//! unparked open batches, and no state left for idle shards. Maintenance (`handle_timeout`) is
//! interleaved at random times and must change none of this; its deadline is never in the
//! past, and it goes quiet after two runs with nothing live.
//!
//! Operation 19 cancels an operation ([`Batcher::cancel`]): one still held back (open, parked
//! or queued; the reference takes it out of its batch and drops a batch left empty), any
//! operation ever issued (too late once its batch left or it ended), or an id derived from a
//! real one that the batcher never issued (refused as unknown, or too late when the real
//! one's batch has left). A withdrawn operation counts as ended once, and never ends again.
//!
//! Operations carry a payload (derived from their handle) that must leave by value in their
//! batch's `Send`, in position order; a failed batch's error (a number drawn per failure) must
//! reach every one of its operations' `Fail`.
//!
//! Actions are drained (which flushes open batches once they run out) after every operation
//! except `handle_op`, so several operations join an open batch between drains. After each
//! drain the checker reports a *stranded* batch: an open batch the batcher still holds, or a
//! shard holding a batch back while it has credit. At the end, before the close, every batch
//! in flight is answered until none is left, without any `flush`: an operation still held
//! back then is stranded too. With no flush in the operation list at all (operations 7 and 8
//! only sometimes occur), this shows that no operation sequence strands an accepted operation.
//!
//! Operation 14 closes (the failing close) or drains (the draining close): after a drain
//! operations are refused and everything accepted is still sent, and `is_drained` must hold
//! exactly when nothing is open, queued or in flight. A failing close fails each shard's held
//! operations in arrival order.
//!
//! Shards are [`Key`]s. Operations 16, 17 and 18 each arm one `Hash`, `Eq` or `Clone` call (in
//! that order) to panic and run another operation under `catch_unwind` (see [`super::user`]):
//! if the armed call fired, the batcher must be exactly as before and the reference is rolled
//! back.
//!
//! Operation 20, as the very first operation only (later it reads its byte and does nothing),
//! sets what the config bytes cannot: oversized rejection (`Oversized::Reject`: a write
//! larger than the byte limit is refused `TooLarge`, an operation of exactly the limit fits)
//! and an operation timeout (none, 0, 1 ns, 1 ms, 500 ms, 2 s, 10 s or `Duration::MAX`). The
//! reference gives each accepted operation the deadline acceptance + timeout; at
//! `handle_timeout` every operation held back (open, parked, queued or requeued) whose
//! deadline is at or before the clock ends `TimedOut`, and a batch left empty is dropped. A
//! sent batch must carry its oldest operation's deadline (`Batch::deadline`), and after every
//! operation `poll_timeout` must not be later than the earliest deadline held back.
//!
//! Operations 21 and 22 pause and resume a shard: a paused shard sends nothing (full batches
//! queue, the open one parks, a returning credit hands nothing on) and is not counted as
//! stranded; a resume sends its held-back batches, oldest first, as far as it has credit;
//! `is_paused` must agree. Operation 23 requeues a batch in flight (its stream tore), with the
//! payloads its `Send` carried or, sometimes, one too many (refused, nothing changes): its
//! credit is released and it goes back before every batch of its shard that never left,
//! after the shard's requeued batches whose latest departure was earlier; after a close its
//! operations fail `Closed`. FIFO per shard is then checked for first departures only (a
//! resend goes behind later operations by design); the order of every send is the
//! reference's. At the end every paused shard is resumed before the stranding check.

use alloc::format;
use alloc::vec::Vec;

use super::user::{self, Arm, Key};
use super::{Cursor, Divergence};
use core::num::{NonZeroU64, NonZeroUsize};
use core::time::Duration;

use crate::batcher::{
    BatchAction, BatchEvent, Batcher, BatcherConfig, FailReason, OpId, Oversized, RefuseReason,
    RequeueError, Withdrawal,
};
use crate::dispatch_window::{CreditId, WindowConfig};
use crate::error::ReleaseError;
use crate::test_hasher::TestHasher;
use crate::time::Instant;

const SHARDS: u8 = 4;

/// Handles, payloads and failure errors are all numbers.
type Machine = Batcher<Key, u32, TestHasher, u32, u32>;

/// The payload the checker gives the operation with handle `h`.
fn payload(h: u32) -> u32 {
    h ^ 0xA5A5_0000
}

/// Operations before the panicking-callback ones (16 `Hash`, 17 `Eq`, 18 `Clone`).
const OPS: u8 = 16;

/// The operation after the panicking-callback ones: cancel an operation.
const CANCEL: u8 = OPS + Arm::OPS;

/// As the first operation only: the options a plain config byte cannot set (operation
/// timeout, oversized rejection). Later it does nothing.
const OPTIONS: u8 = CANCEL + 1;

/// Pause a shard.
const PAUSE: u8 = CANCEL + 2;

/// Resume a shard.
const RESUME: u8 = CANCEL + 3;

/// Requeue a batch in flight (its stream tore).
const REQUEUE: u8 = CANCEL + 4;

/// Every operation value assigned.
const ALL: u8 = REQUEUE + 1;

/// The operation timeouts [`OPTIONS`] picks from: none, or one of these.
const TIMEOUTS: [Duration; 7] = [
    Duration::ZERO,
    Duration::from_nanos(1),
    Duration::from_millis(1),
    Duration::from_millis(500),
    Duration::from_secs(2),
    Duration::from_secs(10),
    Duration::MAX,
];

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Delivered(usize),
    NoResponse,
    BatchFailed(u32),
    Closed,
    TimedOut,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct RefBatch {
    /// The reference's own name for the batch (not the machine's).
    id: u32,
    ops: Vec<u32>,
    bytes: u64,
    opened_at: Instant,
    /// Requeued (torn in flight): the index in `Reference::credits` of the credit it last
    /// left under, which orders it among the shard's other requeued batches.
    departed: Option<usize>,
}

#[derive(Clone, Debug)]
struct Reference {
    write: bool,
    max_ops: u64,
    max_bytes: u64,
    cap: u64,
    closed: bool,
    /// After a drain: operations refused, everything accepted still sent.
    draining: bool,
    /// The shard of each operation, by handle.
    shard_of: Vec<u8>,
    clock: Instant,
    /// One open batch per shard at most; `true` when it sits parked in the window.
    open: Vec<(u8, RefBatch, bool)>,
    /// Full batches waiting for credit, in global arrival order.
    queued: Vec<(u8, RefBatch)>,
    in_flight: Vec<(CreditId, u8, RefBatch)>,
    /// Every credit ever seen, and the ones already completed.
    credits: Vec<CreditId>,
    released: Vec<CreditId>,
    /// Sends decided during the current operation, waiting for the machine's credits.
    to_send: Vec<(u8, RefBatch)>,
    /// Ends decided during the current operation.
    to_end: Vec<(u32, End)>,
    /// Operations that ended, and the ones refused (handed back) after close.
    ended: Vec<u32>,
    refused: Vec<u32>,
    /// Highest operation sent per shard (FIFO: sends only ever increase).
    last_sent: Vec<(u8, u32)>,
    /// Operations withdrawn by `cancel`.
    withdrawn: Vec<u32>,
    /// The next batch's `RefBatch::id`.
    next_batch: u32,
    /// The operation timeout, and each operation's deadline by handle (`None` for a refused
    /// one or without a timeout).
    timeout: Option<Duration>,
    deadline: Vec<Option<Instant>>,
    /// Operations larger than `max_bytes` are refused (writes only).
    reject_oversized: bool,
    /// Shards paused and not resumed.
    paused: Vec<u8>,
    /// What the last close failed, in the order it must have (see `close`).
    close_order: Vec<u32>,
    /// Events on (inputs ending in an odd byte), and the releases their events covered.
    events: bool,
    released_seen: usize,
}

impl Reference {
    fn in_flight_of(&self, shard: u8) -> u64 {
        let a = self
            .in_flight
            .iter()
            .filter(|(_, s, _)| *s == shard)
            .count();
        let b = self.to_send.iter().filter(|(s, _)| *s == shard).count();
        u64::try_from(a.saturating_add(b)).unwrap_or(u64::MAX)
    }

    fn holds_back(&self, shard: u8) -> bool {
        self.queued.iter().any(|(s, _)| *s == shard)
            || self
                .open
                .iter()
                .any(|(s, _, parked)| *s == shard && *parked)
    }

    fn is_paused(&self, shard: u8) -> bool {
        self.paused.contains(&shard)
    }

    fn submit_full(&mut self, shard: u8, batch: RefBatch) {
        if self.in_flight_of(shard) < self.cap && !self.holds_back(shard) && !self.is_paused(shard)
        {
            self.to_send.push((shard, batch));
        } else {
            self.queued.push((shard, batch));
        }
    }

    fn fresh_batch(&mut self) -> RefBatch {
        self.next_batch += 1;
        RefBatch {
            id: self.next_batch,
            ops: Vec::new(),
            bytes: 0,
            opened_at: self.clock,
            departed: None,
        }
    }

    /// Adds an operation; returns the id of the batch it joined.
    fn op(&mut self, shard: u8, handle: u32, bytes: u64) -> u32 {
        let i = match self.open.iter().position(|(s, _, _)| *s == shard) {
            Some(i) => i,
            None => {
                let empty = self.fresh_batch();
                self.open.push((shard, empty, false));
                self.open.len() - 1
            }
        };
        let overflows = self.open.get(i).is_some_and(|entry| {
            self.write
                && !entry.1.ops.is_empty()
                && entry.1.bytes.saturating_add(bytes) > self.max_bytes
        });
        let fresh = overflows.then(|| self.fresh_batch());
        let Some(entry) = self.open.get_mut(i) else {
            return 0;
        };
        entry.2 = false; // reclaimed
        if let Some(fresh) = fresh {
            let old = core::mem::replace(&mut entry.1, fresh);
            self.submit_full(shard, old);
        }
        let Some(entry) = self.open.get_mut(i) else {
            return 0;
        };
        let batch = entry.1.id;
        entry.1.ops.push(handle);
        entry.1.bytes = entry.1.bytes.saturating_add(bytes);
        let n = u64::try_from(entry.1.ops.len()).unwrap_or(u64::MAX);
        if n >= self.max_ops || (self.write && entry.1.bytes >= self.max_bytes) {
            let (_, full, _) = self.open.remove(i);
            self.submit_full(shard, full);
        }
        batch
    }

    /// Withdraws `handle` if its batch is held back (open, parked or queued); a batch left
    /// empty is dropped. Whether it was there.
    fn cancel(&mut self, handle: u32) -> bool {
        for (i, (_, b, _)) in self.open.iter_mut().enumerate() {
            if let Some(p) = b.ops.iter().position(|h| *h == handle) {
                b.ops.remove(p);
                if b.ops.is_empty() {
                    self.open.remove(i);
                }
                self.withdrawn.push(handle);
                return true;
            }
        }
        for (i, (_, b)) in self.queued.iter_mut().enumerate() {
            if let Some(p) = b.ops.iter().position(|h| *h == handle) {
                b.ops.remove(p);
                if b.ops.is_empty() {
                    self.queued.remove(i);
                }
                self.withdrawn.push(handle);
                return true;
            }
        }
        false
    }

    /// Whether the batch named `id` is still held back.
    fn holds_batch(&self, id: u32) -> bool {
        self.open.iter().any(|(_, b, _)| b.id == id) || self.queued.iter().any(|(_, b)| b.id == id)
    }

    fn flush(&mut self) {
        // Operations past their deadline time out rather than leave.
        self.expire();
        let mut i = 0;
        while i < self.open.len() {
            let Some(&(shard, _, parked)) = self.open.get(i) else {
                break;
            };
            if parked {
                i += 1;
                continue;
            }
            let others_held = self.queued.iter().any(|(s, _)| *s == shard);
            if self.in_flight_of(shard) < self.cap && !others_held && !self.is_paused(shard) {
                let (_, batch, _) = self.open.remove(i);
                self.to_send.push((shard, batch));
            } else if let Some(entry) = self.open.get_mut(i) {
                entry.2 = true;
                i += 1;
            }
        }
    }

    /// Ends the batch of a live credit and releases it (`positions` answered, or failed as a
    /// whole with `error`); `false` for not-live credits.
    fn complete(&mut self, credit: CreditId, positions: Option<&[usize]>, error: u32) -> bool {
        let Some(i) = self.in_flight.iter().position(|(c, _, _)| *c == credit) else {
            return false;
        };
        let (_, shard, batch) = self.in_flight.remove(i);
        self.released.push(credit);
        for (pos, h) in batch.ops.iter().enumerate() {
            let end = match positions {
                Some(ps) if ps.contains(&pos) => End::Delivered(pos),
                Some(_) => End::NoResponse,
                None => End::BatchFailed(error),
            };
            self.to_end.push((*h, end));
        }
        self.hand_on(shard);
        true
    }

    /// A credit of `shard` came back: it sends the shard's oldest held-back batch (queued,
    /// requeued ones first, then the parked one), unless the shard is paused or the batcher
    /// closed.
    fn hand_on(&mut self, shard: u8) {
        if self.closed || self.is_paused(shard) {
            return;
        }
        if let Some(q) = self.queued.iter().position(|(s, _)| *s == shard) {
            let (_, b) = self.queued.remove(q);
            self.to_send.push((shard, b));
        } else if let Some(p) = self
            .open
            .iter()
            .position(|(s, _, parked)| *s == shard && *parked)
        {
            let (_, b, _) = self.open.remove(p);
            self.to_send.push((shard, b));
        }
    }

    /// The batch in flight under `credit` tore: its credit is released and the batch goes
    /// back before every batch of its shard that never left, after the shard's requeued
    /// batches that left before it (or its operations fail `Closed` after a close). Whether
    /// the credit was live.
    fn requeue(&mut self, credit: CreditId) -> bool {
        let Some(i) = self.in_flight.iter().position(|(c, _, _)| *c == credit) else {
            return false;
        };
        let (_, shard, mut batch) = self.in_flight.remove(i);
        self.released.push(credit);
        if self.closed {
            self.to_end
                .extend(batch.ops.iter().map(|h| (*h, End::Closed)));
            return true;
        }
        let departed = self.credits.iter().position(|c| *c == credit);
        batch.departed = departed;
        let at = self
            .queued
            .iter()
            .position(|(s, b)| *s == shard && b.departed.is_none_or(|d| Some(d) >= departed))
            .unwrap_or(self.queued.len());
        self.queued.insert(at, (shard, batch));
        self.hand_on(shard);
        true
    }

    /// Resumes `shard`: its held-back batches go out, oldest first, as far as it has credit.
    fn resume(&mut self, shard: u8) {
        if !self.is_paused(shard) {
            return;
        }
        self.paused.retain(|s| *s != shard);
        while self.in_flight_of(shard) < self.cap && (self.holds_back(shard)) {
            let before = self.to_send.len();
            self.hand_on(shard);
            if self.to_send.len() == before {
                break;
            }
        }
    }

    /// Every operation held back (open, parked, queued or requeued) whose deadline is at or
    /// before the clock ends `TimedOut`; a batch left empty is dropped.
    fn expire(&mut self) {
        let (now, deadline) = (self.clock, &self.deadline);
        let due = |h: &u32| {
            usize::try_from(*h)
                .ok()
                .and_then(|i| deadline.get(i).copied().flatten())
                .is_some_and(|d| d <= now)
        };
        let mut ended = Vec::new();
        for (_, b, _) in &mut self.open {
            ended.extend(b.ops.iter().copied().filter(|h| due(h)));
            b.ops.retain(|h| !due(h));
        }
        for (_, b) in &mut self.queued {
            ended.extend(b.ops.iter().copied().filter(|h| due(h)));
            b.ops.retain(|h| !due(h));
        }
        self.open.retain(|(_, b, _)| !b.ops.is_empty());
        self.queued.retain(|(_, b)| !b.ops.is_empty());
        self.to_end
            .extend(ended.into_iter().map(|h| (h, End::TimedOut)));
    }

    /// The earliest deadline of an operation held back.
    fn earliest_held_deadline(&self) -> Option<Instant> {
        self.open
            .iter()
            .flat_map(|(_, b, _)| b.ops.iter())
            .chain(self.queued.iter().flat_map(|(_, b)| b.ops.iter()))
            .filter_map(|h| *self.deadline.get(usize::try_from(*h).ok()?)?)
            .min()
    }

    fn drain(&mut self) {
        if !self.closed {
            self.draining = true;
            self.flush();
        }
    }

    /// Nothing is open, queued or in flight, and operations are refused.
    fn is_drained(&self) -> bool {
        (self.closed || self.draining)
            && self.open.is_empty()
            && self.queued.is_empty()
            && self.in_flight.is_empty()
            && self.to_send.is_empty()
    }

    fn close(&mut self) {
        self.closed = true;
        self.paused.clear();
        // The order the close fails them in, per shard: the line (requeued batches first, in
        // their order, then the queued ones), then the open batch.
        self.close_order = self
            .queued
            .iter()
            .flat_map(|(_, b)| b.ops.iter())
            .chain(self.open.iter().flat_map(|(_, b, _)| b.ops.iter()))
            .copied()
            .collect();
        for (_, b, _) in core::mem::take(&mut self.open) {
            self.to_end.extend(b.ops.iter().map(|h| (*h, End::Closed)));
        }
        for (_, b) in core::mem::take(&mut self.queued) {
            self.to_end.extend(b.ops.iter().map(|h| (*h, End::Closed)));
        }
    }
}

/// Decodes `data` into batcher operations, drives the machine and the reference, and returns
/// the first disagreement.
pub fn check(data: &[u8]) -> Result<(), Divergence> {
    let mut c = Cursor::new(data);
    let write = c.bool();
    let max_ops = match c.below(8) {
        0 => NonZeroUsize::MAX,
        n => NonZeroUsize::new(usize::from(n)).unwrap_or(NonZeroUsize::MIN),
    };
    let max_bytes = match c.below(8) {
        0 => NonZeroU64::MAX,
        1 => NonZeroU64::MIN,
        n => NonZeroU64::new(u64::from(n) * 16).unwrap_or(NonZeroU64::MIN),
    };
    let cap = match c.below(8) {
        0 => u32::MAX,
        n => u32::from(n % 3) + 1,
    };
    let base = if write {
        BatcherConfig::writes()
    } else {
        BatcherConfig::reads()
    };
    let window = WindowConfig::default().with_max_in_flight(cap as usize);
    let Ok(cfg) = base
        .with_max_requests_per_batch(max_ops)
        .with_max_batch_bytes(max_bytes)
        .with_window(window)
    else {
        return Err(format!("window refused: {window:?}"));
    };
    let mut m = Machine::new(cfg);
    // Without the production floor of 16, the few shards of a short run reach the shrinking
    // paths of maintenance.
    m.set_shrink_floor(0);
    let r = Reference {
        write,
        max_ops: u64::try_from(max_ops.get()).unwrap_or(u64::MAX),
        max_bytes: max_bytes.get(),
        cap: u64::from(cap),
        closed: false,
        draining: false,
        shard_of: Vec::new(),
        clock: Instant::ZERO,
        open: Vec::new(),
        queued: Vec::new(),
        in_flight: Vec::new(),
        credits: Vec::new(),
        released: Vec::new(),
        to_send: Vec::new(),
        to_end: Vec::new(),
        ended: Vec::new(),
        refused: Vec::new(),
        last_sent: Vec::new(),
        withdrawn: Vec::new(),
        next_batch: 0,
        timeout: None,
        deadline: Vec::new(),
        reject_oversized: false,
        paused: Vec::new(),
        close_order: Vec::new(),
        events: data.last().is_some_and(|b| b & 1 == 1),
        released_seen: 0,
    };
    if r.events {
        m.set_event_capacity(usize::MAX);
    }
    let mut st = State {
        m,
        r,
        now: Instant::ZERO,
        next_handle: 0,
        ids: Vec::new(),
    };
    let mut step = 0usize;
    // Operations added since the last drain of the actions.
    let mut pending = false;
    while !c.is_empty() {
        step += 1;
        let Some(op) = c.select(ALL) else {
            continue;
        };
        if op == OPTIONS {
            // Only before anything happened: a fresh machine with the options.
            let b = c.u8();
            if step == 1 {
                let mut cfg = cfg;
                if b & 1 == 1 {
                    cfg = cfg.with_oversized(Oversized::Reject);
                    st.r.reject_oversized = write;
                }
                let timeout = TIMEOUTS
                    .get(usize::from(b >> 1) % (TIMEOUTS.len() + 1))
                    .copied();
                if let Some(t) = timeout {
                    cfg = cfg.with_op_timeout(t);
                }
                st.r.timeout = timeout;
                st.m = Machine::new(cfg);
                st.m.set_shrink_floor(0);
                if st.r.events {
                    st.m.set_event_capacity(usize::MAX);
                }
            }
            continue;
        }
        let adds = op <= LAST_ADD;
        // A close or drain may find operations not yet drained (an open batch held here).
        if pending && !adds && op != CLOSE {
            settle(&mut st.m, &mut st.r, false).map_err(|e| format!("step {step}: {e}"))?;
            pending = false;
        }
        let flushed = if op == CANCEL || op >= PAUSE {
            apply(op, &mut c, &mut st, step)?
        } else if op >= OPS {
            // A panicking key callback during another operation.
            let Some(arm) = Arm::decode(&mut c, op - OPS, SHARDS) else {
                continue;
            };
            let Some(inner) = c.select(OPS) else {
                continue;
            };
            let before = user::snapshot(&st.m);
            let saved = (st.r.clone(), st.now, st.next_handle, st.ids.len());
            match user::run(arm, || apply(inner, &mut c, &mut st, step)) {
                Ok(done) => done?,
                Err(user::Panicked) => {
                    user::unchanged(&before, &st.m, arm)
                        .map_err(|e| format!("step {step}: {e}"))?;
                    let ids;
                    (st.r, st.now, st.next_handle, ids) = saved;
                    st.ids.truncate(ids);
                    false
                }
            }
        } else {
            apply(op, &mut c, &mut st, step)?
        };
        st.m.check_invariants()
            .map_err(|e| format!("step {step}: {e}"))?;
        if adds {
            pending = true;
        } else {
            settle(&mut st.m, &mut st.r, flushed).map_err(|e| format!("step {step}: {e}"))?;
        }
    }
    settle(&mut st.m, &mut st.r, false).map_err(|e| format!("at the end: {e}"))?;
    let State {
        mut m,
        mut r,
        now,
        next_handle,
        ids: _,
    } = st;
    // Every paused shard's stream comes back.
    for shard in 0..SHARDS {
        if r.is_paused(shard) {
            m.resume(now, Key::new(shard));
            r.resume(shard);
            settle(&mut m, &mut r, false).map_err(|e| format!("resuming at the end: {e}"))?;
        }
    }
    // Answer every batch in flight, again and again, with no flush: whatever was accepted
    // must go out (or, after a close, have failed). Anything still held back is stranded.
    while let Some(&(credit, _, ref batch)) = r.in_flight.first() {
        let all: Vec<usize> = (0..batch.ops.len()).collect();
        if m.handle_response(now, credit, all.iter().copied()).is_err() {
            return Err(format!("live {credit:?} refused at the end"));
        }
        r.complete(credit, Some(&all), 0);
        settle(&mut m, &mut r, false).map_err(|e| format!("answering at the end: {e}"))?;
    }
    if m.held_batches() != 0 || m.open_batches() != 0 || !r.open.is_empty() || !r.queued.is_empty()
    {
        return Err(format!(
            "stranded: nothing in flight, but {} batches held back ({} open), reference {:?} {:?}",
            m.held_batches(),
            m.open_batches(),
            r.open,
            r.queued
        ));
    }
    if (m.is_closed() || m.is_draining()) && !m.is_drained() {
        return Err("nothing left, but not is_drained()".into());
    }
    // Close and complete everything in flight: every operation must have ended exactly once.
    m.close();
    r.close();
    settle(&mut m, &mut r, true)?;
    while let Some(&(credit, _, _)) = r.in_flight.first() {
        if m.handle_response(now, credit, [0]).is_err() {
            return Err(format!("live {credit:?} refused at the end"));
        }
        r.complete(credit, Some(&[0]), 0);
        settle(&mut m, &mut r, true)?;
    }
    for h in 0..next_handle {
        let n = r.ended.iter().filter(|x| **x == h).count()
            + r.refused.iter().filter(|x| **x == h).count()
            + r.withdrawn.iter().filter(|x| **x == h).count();
        if n != 1 {
            return Err(format!("operation {h} ended {n} times"));
        }
    }
    let w = m.window();
    if w.shard_count() != 0
        || w.live_credits() != 0
        || m.open_batches() != 0
        || m.held_batches() != 0
    {
        return Err(format!(
            "state left at the end: {} shards, {} credits, {} open, {} held",
            w.shard_count(),
            w.live_credits(),
            m.open_batches(),
            m.held_batches()
        ));
    }
    // With nothing live, two runs give everything back and maintenance goes quiet.
    m.handle_timeout(Instant::MAX);
    m.handle_timeout(Instant::MAX);
    if let Some(t) = m.poll_timeout() {
        return Err(format!("idle batcher still asks for maintenance at {t:?}"));
    }
    Ok(())
}

/// What one run carries from operation to operation.
struct State {
    m: Machine,
    r: Reference,
    now: Instant,
    next_handle: u32,
    /// By handle: the machine's id for the operation and the reference's batch it joined
    /// (`None` for a refused one).
    ids: Vec<Option<(OpId, u32)>>,
}

/// The last operation that adds (`handle_op`); the checker drains actions after every other.
const LAST_ADD: u8 = 6;

/// Close or drain.
const CLOSE: u8 = 14;

/// Runs operation `op` on the batcher and the reference; whether it flushed or closed.
fn apply(op: u8, c: &mut Cursor<'_>, st: &mut State, step: usize) -> Result<bool, Divergence> {
    let State {
        m,
        r,
        now,
        next_handle,
        ids,
    } = st;
    let mut flushed = false;
    match op {
        0..=6 => {
            let shard = c.below(SHARDS);
            let bytes = match c.below(8) {
                0 => u64::MAX,
                1 => 0,
                _ => u64::from(c.u8() % 64),
            };
            *now = c.time_step(*now);
            let handle = *next_handle;
            *next_handle = next_handle.wrapping_add(1);
            let got =
                m.handle_op_with_payload(*now, Key::new(shard), handle, payload(handle), bytes);
            r.clock = r.clock.max(*now);
            r.shard_of.push(shard);
            let too_large = r.reject_oversized && bytes > r.max_bytes;
            if r.closed || r.draining || too_large {
                r.refused.push(handle);
                r.deadline.push(None);
                ids.push(None);
                let want = if r.closed {
                    RefuseReason::Closed
                } else if r.draining {
                    RefuseReason::Draining
                } else {
                    RefuseReason::TooLarge {
                        bytes,
                        limit: r.max_bytes,
                    }
                };
                let refused = got.as_ref().err().map(|r| (r.handle, r.reason));
                if refused != Some(((handle, payload(handle)), want)) {
                    return Err(format!(
                        "step {step}: op {handle} of {bytes} bytes = {got:?}, want Refused({want:?})"
                    ));
                }
            } else {
                r.deadline
                    .push(r.timeout.map(|t| r.clock.saturating_add(t)));
                let Ok(id) = got else {
                    return Err(format!("step {step}: op refused while open: {got:?}"));
                };
                let batch = r.op(shard, handle, bytes);
                ids.push(Some((id, batch)));
            }
        }
        7..=8 => {
            *now = c.time_step(*now);
            m.flush(*now);
            r.clock = r.clock.max(*now);
            r.flush();
            flushed = true;
        }
        9..=13 => {
            let credit = pick_credit(c, r, m.window().instance_tag());
            let fail = c.below(4) == 0;
            let len = r
                .in_flight
                .iter()
                .find(|(x, _, _)| *x == credit)
                .map_or(0, |(_, _, b)| b.ops.len());
            let mut positions = Vec::new();
            for _ in 0..c.below(6) {
                positions.push(match c.below(8) {
                    0 => usize::MAX,
                    _ => usize::from(c.u8()) % len.saturating_add(2),
                });
            }
            let error = u32::from(c.u8());
            *now = c.time_step(*now);
            let got = if fail {
                m.handle_failure(*now, credit, error)
            } else {
                m.handle_response(*now, credit, positions.iter().copied())
            };
            r.clock = r.clock.max(*now);
            let want_released = r.released.contains(&credit);
            let live = r.complete(credit, (!fail).then_some(&positions[..]), error);
            match (live, got) {
                (true, Ok(())) => {}
                (false, Err(ReleaseError::AlreadyReleased)) if want_released => {}
                (false, Err(_)) if !want_released => {}
                (_, got) => {
                    return Err(format!(
                        "step {step}: completing {credit:?} (live {live}, released {want_released}) = {got:?}"
                    ));
                }
            }
        }
        14 => match c.below(8) {
            0 => {
                m.close();
                r.close();
                flushed = true;
            }
            1 => {
                *now = c.time_step(*now);
                m.drain(*now);
                r.clock = r.clock.max(*now);
                r.drain();
                flushed = true;
            }
            _ => {}
        },
        15 => {
            *now = c.time_step(*now);
            m.handle_timeout(*now);
            r.clock = r.clock.max(*now);
            r.expire();
            if let Some(t) = m.poll_timeout() {
                if t <= r.clock && t != Instant::MAX {
                    return Err(format!(
                        "step {step}: maintenance still due at {t:?} after handle_timeout({now:?})"
                    ));
                }
            }
        }
        CANCEL => {
            let how = c.below(8);
            let held: Vec<u32> = r
                .open
                .iter()
                .flat_map(|(_, b, _)| b.ops.iter())
                .chain(r.queued.iter().flat_map(|(_, b)| b.ops.iter()))
                .copied()
                .collect();
            let pick = usize::from(c.u16());
            let handle = match how {
                // Mostly an operation still held back, so withdrawals are frequent.
                4..=7 if !held.is_empty() => held.get(pick % held.len()).copied(),
                _ => u32::try_from(pick % ids.len().max(1)).ok(),
            };
            let Some((handle, Some((id, batch)))) =
                handle.and_then(|h| Some((h, *ids.get(usize::try_from(h).ok()?)?)))
            else {
                return Ok(false);
            };
            let (id, want) = match how {
                0..=2 => {
                    let forged = id.forged(how);
                    // An ordinal past a batch that is still held is unknown; past one that
                    // left, nothing is there to tell it apart: too late.
                    let want = if how == 0 && !r.holds_batch(batch) {
                        Ok(Withdrawal::TooLate)
                    } else {
                        Err(ReleaseError::Unknown)
                    };
                    (forged, want)
                }
                _ if r.cancel(handle) => (id, Ok(Withdrawal::Withdrawn((handle, payload(handle))))),
                _ => (id, Ok(Withdrawal::TooLate)),
            };
            let got = m.cancel_with_payload(id);
            if got != want {
                return Err(format!(
                    "step {step}: cancel of {handle} ({how}) = {got:?}, want {want:?}"
                ));
            }
        }
        PAUSE => {
            let shard = c.below(SHARDS);
            m.pause(Key::new(shard));
            if !r.closed && !r.is_paused(shard) {
                r.paused.push(shard);
            }
            if m.is_paused(&Key::new(shard)) != r.is_paused(shard) {
                return Err(format!(
                    "step {step}: shard {shard} paused {}",
                    r.is_paused(shard)
                ));
            }
        }
        RESUME => {
            let shard = c.below(SHARDS);
            *now = c.time_step(*now);
            m.resume(*now, Key::new(shard));
            r.clock = r.clock.max(*now);
            r.resume(shard);
            if m.is_paused(&Key::new(shard)) {
                return Err(format!(
                    "step {step}: shard {shard} still paused after resume"
                ));
            }
        }
        REQUEUE => {
            let credit = pick_credit(c, r, m.window().instance_tag());
            let len = r
                .in_flight
                .iter()
                .find(|(x, _, _)| *x == credit)
                .map(|(_, _, b)| b.ops.clone());
            // Mostly the payloads the `Send` carried; sometimes one too many.
            let extra = c.below(8) == 0;
            let mut payloads: Vec<u32> = len.iter().flatten().map(|h| payload(*h)).collect();
            if extra {
                payloads.push(0);
            }
            let n = payloads.len();
            *now = c.time_step(*now);
            let got = m.requeue_with_payloads(*now, credit, payloads);
            r.clock = r.clock.max(*now);
            match (len, got) {
                (Some(ops), Err(RequeueError::Payloads { payloads, expected }))
                    if extra && expected == ops.len() && payloads.len() == n => {}
                (Some(_), Ok(())) if !extra => {
                    r.requeue(credit);
                }
                (None, Err(RequeueError::Credit(_))) => {}
                (live, got) => {
                    return Err(format!(
                        "step {step}: requeue of {credit:?} (in flight {live:?}, extra {extra}) = {got:?}"
                    ));
                }
            }
        }
        _ => {}
    }
    Ok(flushed)
}

mod verdict;
use verdict::*;

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads, no batch limits, 2 in flight per shard.
    const HEADER: [u8; 4] = [0, 0, 0, 1];
    /// Adds an operation of 0 bytes for shard 0, at the same time.
    const ADD: [u8; 4] = [0, 0, 1, 2];
    /// `handle_timeout` 1 s later (a short step of 1,000,000 µs).
    const TIMEOUT_1S: [u8; 6] = [15, 5, 0x40, 0x42, 0x0F, 0x00];

    fn script(parts: &[&[u8]]) -> Vec<u8> {
        parts.iter().flat_map(|p| p.iter().copied()).collect()
    }

    #[test]
    fn a_requeued_batch_past_its_deadline_is_checked_to_time_out() {
        // Timeout 500 ms; the operation leaves, its deadline passes in flight, the stream
        // tears (pause, requeue), and the next `handle_timeout` must time it out.
        let data = script(&[
            &HEADER,
            &[OPTIONS, 3 << 1],
            &ADD,
            &TIMEOUT_1S,
            &[PAUSE, 0],
            &[REQUEUE, 4, 0, 1, 2],
            &[15, 2],
        ]);
        assert_eq!(check(&data), Ok(()));
    }

    #[test]
    fn pause_requeue_and_resume_scripts_pass() {
        // Two operations in two batches (cut by a flush), both torn and requeued in reverse
        // order while paused, then resumed: they must go out again in their first order.
        let data = script(&[
            &HEADER,
            &ADD,
            &[7, 2],
            &ADD,
            &[7, 2],
            &[PAUSE, 0],
            &[REQUEUE, 4, 1, 1, 2],
            &[REQUEUE, 4, 0, 1, 2],
            &[RESUME, 0, 2],
        ]);
        assert_eq!(check(&data), Ok(()));
    }

    #[test]
    fn an_oversized_write_is_checked_to_be_refused() {
        // Writes of at most 16 bytes (max_bytes 2 * 16... selector 1 is 1 byte), rejection on,
        // no timeout: a 5-byte write is refused as too large.
        let data = script(&[&[1, 0, 1, 1], &[OPTIONS, 1 | (7 << 1)], &[0, 0, 2, 5, 2]]);
        assert_eq!(check(&data), Ok(()));
    }

    #[test]
    fn empty_and_short_inputs_pass() {
        assert_eq!(check(&[]), Ok(()));
        assert_eq!(check(&[0, 1, 2, 1, 0, 0, 2, 5, 2, 7, 2, 9, 4]), Ok(()));
    }
}
