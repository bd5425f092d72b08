//! Model check of [`DispatchWindow`] and [`SingleWindow`] against one naive reference.
//!
//! The reference keeps every credit ever issued and every held-back batch in plain `Vec`s in
//! global arrival order, and answers each query by scanning them. It shares no code with the
//! machine: it does not know slabs, generations or per-shard queues.
//!
//! Checked after every operation: credits conserved (`in_flight + available == capacity`),
//! never more than `max_in_flight` per shard, FIFO dispatch (a release sends the shard's
//! oldest queued batch, then its parked one), ids never reused, double and bogus releases
//! change nothing, every batch leaves exactly once (dispatched, reclaimed, failed or refused),
//! and no idle shard is counted or holds a buffer; idle entries are gone once maintenance
//! has run with nothing live (`tracked_shards() == 0`). Maintenance (`handle_timeout`) is interleaved at
//! random times and must change none of this; its deadline is never in the past, and it goes
//! quiet after two runs with nothing live.
//!
//! Shards are [`Key`]s. Operations 20, 21 and 22 each arm one `Hash`, `Eq` or `Clone` call (in
//! that order) to panic and run another operation under `catch_unwind` (see [`super::user`]):
//! if the armed call fired, the window must be exactly as before and the reference is rolled
//! back.
//!
//! Operation 23 drains the window (`drain`, close for sending): the reference refuses new
//! batches and keeps handing held-back ones on, and a run that ends draining completes every
//! credit until nothing is left, checking that every held batch left whole, in order, and
//! that `is_drained` turns true.
//!
//! [`check_single`] runs the same decoder and reference over a [`SingleWindow`], as one
//! shard: every output of the single-shard window is checked against what the reference
//! (and so the multi-shard window, on its shard) answers.

use alloc::format;
use alloc::vec::Vec;
use core::fmt::Debug;

use super::user::{self, Arm, Key};
use super::{Cursor, Divergence};
use crate::dispatch_window::{
    CreditId, Dispatch, DispatchWindow, SingleWindow, SubmitError, Submitted, Ticket, WindowConfig,
};
use crate::error::{ConfigError, ReleaseError};
use crate::test_hasher::TestHasher;
use crate::time::Instant;

type Window = DispatchWindow<Key, u32, TestHasher>;

/// Operations before the panicking-callback ones (20 `Hash`, 21 `Eq`, 22 `Clone`).
const OPS: u8 = 20;

/// `drain`, after the panicking-callback operations.
const DRAIN: u8 = OPS + Arm::OPS;

/// Every operation value assigned.
const ALL: u8 = DRAIN + 1;

/// A window under check: the multi-shard window over [`Key`]s, or the single-shard window as
/// shard 0. Outputs are in the multi-shard window's types.
pub(crate) trait Subject: Debug + Sized {
    /// Shards the decoder draws from.
    const SHARDS: u8;
    fn make(cfg: WindowConfig) -> Result<Self, ConfigError>;
    fn set_shrink_floor(&mut self, floor: usize);
    fn submit(
        &mut self,
        shard: Key,
        batch: u32,
    ) -> Result<Option<Dispatch<Key, u32>>, SubmitError<u32>>;
    fn submit_or_park(
        &mut self,
        shard: Key,
        batch: u32,
    ) -> Result<Option<Dispatch<Key, u32>>, SubmitError<u32>>;
    fn enqueue(&mut self, shard: Key, batch: u32) -> Result<Submitted<Key, u32>, SubmitError<u32>>;
    fn reclaim(&mut self, shard: &Key) -> Option<u32>;
    fn complete(&mut self, credit: CreditId) -> Result<Option<Dispatch<Key, u32>>, ReleaseError>;
    fn cancel(&mut self, ticket: Ticket) -> Result<u32, ReleaseError>;
    fn close(&mut self) -> Vec<(u8, u32)>;
    fn drain(&mut self);
    fn handle_timeout(&mut self, now: Instant);
    fn poll_timeout(&self) -> Option<Instant>;
    fn skip_generations_to(&mut self, next: u64);
    fn instance_tag(&self) -> u32;
    fn capacity(&self) -> u32;
    fn in_flight(&self, shard: &Key) -> u32;
    fn available(&self, shard: &Key) -> u32;
    fn queued(&self, shard: &Key) -> usize;
    fn parked(&self, shard: &Key) -> Option<u32>;
    fn is_queued(&self, ticket: Ticket) -> bool;
    fn shard_count(&self) -> usize;
    fn tracked_shards(&self) -> usize;
    fn live_credits(&self) -> usize;
    fn is_closed(&self) -> bool;
    fn is_draining(&self) -> bool;
    fn is_drained(&self) -> bool;
}

impl Subject for Window {
    const SHARDS: u8 = 4;
    fn make(cfg: WindowConfig) -> Result<Self, ConfigError> {
        Window::new(cfg)
    }
    fn set_shrink_floor(&mut self, floor: usize) {
        Window::set_shrink_floor(self, floor);
    }
    fn submit(
        &mut self,
        shard: Key,
        batch: u32,
    ) -> Result<Option<Dispatch<Key, u32>>, SubmitError<u32>> {
        Window::submit(self, shard, batch)
    }
    fn submit_or_park(
        &mut self,
        shard: Key,
        batch: u32,
    ) -> Result<Option<Dispatch<Key, u32>>, SubmitError<u32>> {
        Window::submit_or_park(self, shard, batch)
    }
    fn enqueue(&mut self, shard: Key, batch: u32) -> Result<Submitted<Key, u32>, SubmitError<u32>> {
        Window::enqueue(self, shard, batch)
    }
    fn reclaim(&mut self, shard: &Key) -> Option<u32> {
        Window::reclaim(self, shard)
    }
    fn complete(&mut self, credit: CreditId) -> Result<Option<Dispatch<Key, u32>>, ReleaseError> {
        Window::complete(self, credit)
    }
    fn cancel(&mut self, ticket: Ticket) -> Result<u32, ReleaseError> {
        Window::cancel(self, ticket)
    }
    fn close(&mut self) -> Vec<(u8, u32)> {
        Window::close(self)
            .iter()
            .map(|(k, b)| (k.id(), *b))
            .collect()
    }
    fn drain(&mut self) {
        Window::drain(self);
    }
    fn handle_timeout(&mut self, now: Instant) {
        Window::handle_timeout(self, now);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Window::poll_timeout(self)
    }
    fn skip_generations_to(&mut self, next: u64) {
        Window::skip_generations_to(self, next);
    }
    fn instance_tag(&self) -> u32 {
        Window::instance_tag(self)
    }
    fn capacity(&self) -> u32 {
        Window::capacity(self)
    }
    fn in_flight(&self, shard: &Key) -> u32 {
        Window::in_flight(self, shard)
    }
    fn available(&self, shard: &Key) -> u32 {
        Window::available(self, shard)
    }
    fn queued(&self, shard: &Key) -> usize {
        Window::queued(self, shard)
    }
    fn parked(&self, shard: &Key) -> Option<u32> {
        Window::parked(self, shard).copied()
    }
    fn is_queued(&self, ticket: Ticket) -> bool {
        Window::is_queued(self, ticket)
    }
    fn shard_count(&self) -> usize {
        Window::shard_count(self)
    }
    fn tracked_shards(&self) -> usize {
        Window::tracked_shards(self)
    }
    fn live_credits(&self) -> usize {
        Window::live_credits(self)
    }
    fn is_closed(&self) -> bool {
        Window::is_closed(self)
    }
    fn is_draining(&self) -> bool {
        Window::is_draining(self)
    }
    fn is_drained(&self) -> bool {
        Window::is_drained(self)
    }
}

/// The single-shard window's dispatch, as the multi-shard window's for shard 0.
fn on_shard_0(d: Dispatch<(), u32>) -> Dispatch<Key, u32> {
    Dispatch {
        shard: Key::new(0),
        credit: d.credit,
        batch: d.batch,
    }
}

impl Subject for SingleWindow<u32> {
    const SHARDS: u8 = 1;
    fn make(cfg: WindowConfig) -> Result<Self, ConfigError> {
        SingleWindow::new(cfg)
    }
    fn set_shrink_floor(&mut self, floor: usize) {
        SingleWindow::set_shrink_floor(self, floor);
    }
    fn submit(
        &mut self,
        _: Key,
        batch: u32,
    ) -> Result<Option<Dispatch<Key, u32>>, SubmitError<u32>> {
        SingleWindow::submit(self, batch).map(|d| d.map(on_shard_0))
    }
    fn submit_or_park(
        &mut self,
        _: Key,
        batch: u32,
    ) -> Result<Option<Dispatch<Key, u32>>, SubmitError<u32>> {
        SingleWindow::submit_or_park(self, batch).map(|d| d.map(on_shard_0))
    }
    fn enqueue(&mut self, _: Key, batch: u32) -> Result<Submitted<Key, u32>, SubmitError<u32>> {
        SingleWindow::enqueue(self, batch).map(|s| match s {
            Submitted::Sent(d) => Submitted::Sent(on_shard_0(d)),
            Submitted::Queued(t) => Submitted::Queued(t),
        })
    }
    fn reclaim(&mut self, _: &Key) -> Option<u32> {
        SingleWindow::reclaim(self)
    }
    fn complete(&mut self, credit: CreditId) -> Result<Option<Dispatch<Key, u32>>, ReleaseError> {
        SingleWindow::complete(self, credit).map(|d| d.map(on_shard_0))
    }
    fn cancel(&mut self, ticket: Ticket) -> Result<u32, ReleaseError> {
        SingleWindow::cancel(self, ticket)
    }
    fn close(&mut self) -> Vec<(u8, u32)> {
        SingleWindow::close(self)
            .into_iter()
            .map(|b| (0, b))
            .collect()
    }
    fn drain(&mut self) {
        SingleWindow::drain(self);
    }
    fn handle_timeout(&mut self, now: Instant) {
        SingleWindow::handle_timeout(self, now);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        SingleWindow::poll_timeout(self)
    }
    fn skip_generations_to(&mut self, next: u64) {
        SingleWindow::skip_generations_to(self, next);
    }
    fn instance_tag(&self) -> u32 {
        SingleWindow::instance_tag(self)
    }
    fn capacity(&self) -> u32 {
        SingleWindow::capacity(self)
    }
    fn in_flight(&self, _: &Key) -> u32 {
        SingleWindow::in_flight(self)
    }
    fn available(&self, _: &Key) -> u32 {
        SingleWindow::available(self)
    }
    fn queued(&self, _: &Key) -> usize {
        SingleWindow::queued(self)
    }
    fn parked(&self, _: &Key) -> Option<u32> {
        SingleWindow::parked(self).copied()
    }
    fn is_queued(&self, ticket: Ticket) -> bool {
        SingleWindow::is_queued(self, ticket)
    }
    fn shard_count(&self) -> usize {
        // The books' own count, checked against the window's state: 0 or 1.
        let counted = SingleWindow::shard_count(self);
        if counted == usize::from(!self.is_idle()) {
            counted
        } else {
            usize::MAX
        }
    }
    fn tracked_shards(&self) -> usize {
        // No map: only the shard itself, while active.
        SingleWindow::shard_count(self)
    }
    fn live_credits(&self) -> usize {
        SingleWindow::live_credits(self)
    }
    fn is_closed(&self) -> bool {
        SingleWindow::is_closed(self)
    }
    fn is_draining(&self) -> bool {
        SingleWindow::is_draining(self)
    }
    fn is_drained(&self) -> bool {
        SingleWindow::is_drained(self)
    }
}

/// Where a batch ended up (each batch must reach exactly one final place).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Held,
    Dispatched,
    Reclaimed,
    Withdrawn,
    Failed,
    Refused,
}

#[derive(Clone, Debug)]
struct Reference {
    cap: u32,
    /// New batches are refused (after `close` or `drain`).
    closed: bool,
    /// `drain` was called and `close` not since: held-back batches still leave.
    draining: bool,
    /// Credit ids the machine may still issue (only shrinks when the model skips ahead).
    ids_left: u64,
    /// Every credit ever issued: (id, shard, live).
    credits: Vec<(CreditId, u8, bool)>,
    /// Full batches waiting, in global arrival order: (shard, batch).
    queued: Vec<(u8, u32)>,
    /// Parked open batches: (shard, batch).
    parked: Vec<(u8, u32)>,
    /// Every ticket `enqueue` returned, with its batch.
    tickets: Vec<(Ticket, u32)>,
    /// Every batch and where it went.
    fates: Vec<(u32, Fate)>,
}

impl Reference {
    fn in_flight(&self, shard: u8) -> u32 {
        let n = self
            .credits
            .iter()
            .filter(|(_, s, live)| *live && *s == shard)
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    fn has_queued(&self, shard: u8) -> bool {
        self.queued.iter().any(|(s, _)| *s == shard)
    }

    fn parked_of(&self, shard: u8) -> Option<u32> {
        self.parked
            .iter()
            .find(|(s, _)| *s == shard)
            .map(|(_, b)| *b)
    }

    fn has_credit(&self, shard: u8) -> bool {
        self.in_flight(shard) < self.cap
            && !self.has_queued(shard)
            && self.parked_of(shard).is_none()
    }

    fn set_fate(&mut self, batch: u32, fate: Fate) -> Result<(), Divergence> {
        match self.fates.iter_mut().find(|(b, _)| *b == batch) {
            Some((_, f)) if *f == Fate::Held => {
                *f = fate;
                Ok(())
            }
            Some((_, f)) => Err(format!("batch {batch} left twice: was {f:?}, now {fate:?}")),
            None => Err(format!("batch {batch} was never submitted")),
        }
    }

    /// Records a fresh credit the machine issued for `shard`.
    fn issued(&mut self, credit: CreditId, shard: u8) -> Result<(), Divergence> {
        if self.credits.iter().any(|(c, _, _)| *c == credit) {
            return Err(format!("credit {credit:?} reused"));
        }
        self.ids_left = self.ids_left.saturating_sub(1);
        self.credits.push((credit, shard, true));
        Ok(())
    }
}

/// Decodes `data` into window operations, drives the multi-shard window and the reference,
/// and returns the first disagreement.
pub fn check(data: &[u8]) -> Result<(), Divergence> {
    run::<Window>(data)
}

/// As [`check`], over a [`SingleWindow`] (every operation on its one shard).
pub fn check_single(data: &[u8]) -> Result<(), Divergence> {
    run::<SingleWindow<u32>>(data)
}

/// [`check`], then [`check_single`] on the same input: what the fuzz target and the corpus
/// replay run.
pub fn check_all(data: &[u8]) -> Result<(), Divergence> {
    check(data)?;
    check_single(data).map_err(|e| format!("single-shard window: {e}"))
}

fn run<W: Subject>(data: &[u8]) -> Result<(), Divergence> {
    let mut c = Cursor::new(data);
    // The limit, as a client gives it (`usize`); above `u32::MAX` the window clamps, so
    // `usize::MAX` behaves as `u32::MAX` did before the limit was a `usize`.
    let (limit, cap) = match c.below(8) {
        0 => (usize::MAX, u32::MAX),
        n => (usize::from(n % 4) + 1, u32::from(n % 4) + 1),
    };
    let Ok(mut w) = W::make(WindowConfig::default().with_max_in_flight(limit)) else {
        return Err(format!("max_in_flight {limit} refused"));
    };
    if w.capacity() != cap {
        return Err(format!(
            "max_in_flight {limit}: capacity {}, want {cap}",
            w.capacity()
        ));
    }
    // Without the production floor of 16, the few shards of a short run reach the shrinking
    // paths of maintenance.
    w.set_shrink_floor(0);
    let r = Reference {
        cap,
        closed: false,
        draining: false,
        ids_left: u64::MAX - 1,
        credits: Vec::new(),
        queued: Vec::new(),
        parked: Vec::new(),
        tickets: Vec::new(),
        fates: Vec::new(),
    };
    let mut st = State {
        w,
        r,
        next_batch: 0,
        now: Instant::ZERO,
    };
    let mut step = 0usize;
    while !c.is_empty() {
        step += 1;
        let Some(op) = c.select(ALL) else {
            continue;
        };
        if (OPS..DRAIN).contains(&op) {
            // A panicking key callback during another operation.
            let Some(arm) = Arm::decode(&mut c, op - OPS, W::SHARDS) else {
                continue;
            };
            let Some(inner) = c.select(OPS) else {
                continue;
            };
            let before = user::snapshot(&st.w);
            let saved = (st.r.clone(), st.next_batch);
            match user::run(arm, || apply(inner, &mut c, &mut st, step)) {
                Ok(done) => done?,
                Err(user::Panicked) => {
                    user::unchanged(&before, &st.w, arm)
                        .map_err(|e| format!("step {step}: {e}"))?;
                    (st.r, st.next_batch) = saved;
                }
            }
        } else {
            apply(op, &mut c, &mut st, step)?;
        }
        compare(&st.w, &st.r).map_err(|e| format!("step {step}: {e}"))?;
    }
    let State { mut w, mut r, .. } = st;
    if r.draining {
        // Draining: completing every credit sends everything held back, whole and in order
        // (each completion is checked against the reference), until nothing is left.
        while let Some(&(credit, _, _)) = r.credits.iter().find(|x| x.2) {
            complete(&mut w, &mut r, credit)?;
            compare(&w, &r)?;
        }
        let stuck = r.queued.len() + r.parked.len();
        if stuck == 0 && !w.is_drained() {
            return Err("every credit completed while draining, but not drained".into());
        }
        if stuck > 0 && r.ids_left > 0 {
            return Err(format!("{stuck} batches held after draining with ids left"));
        }
    }
    // Close (collecting what a drain could not send for lack of ids), then complete every
    // live credit: everything must end and nothing may remain.
    close(&mut w, &mut r)?;
    let live: Vec<CreditId> = r.credits.iter().filter(|x| x.2).map(|x| x.0).collect();
    for credit in live {
        complete(&mut w, &mut r, credit)?;
    }
    compare(&w, &r)?;
    // With nothing live, two runs give everything back and maintenance goes quiet.
    w.handle_timeout(Instant::MAX);
    w.handle_timeout(Instant::MAX);
    if let Some(t) = w.poll_timeout() {
        return Err(format!("idle window still asks for maintenance at {t:?}"));
    }
    if let Some((b, _)) = r.fates.iter().find(|(_, f)| *f == Fate::Held) {
        return Err(format!("batch {b} never left the window"));
    }
    if !w.is_drained() {
        return Err("closed with nothing left, but not drained".into());
    }
    if w.shard_count() != 0 || w.tracked_shards() != 0 || w.live_credits() != 0 {
        return Err(format!(
            "state left after everything ended and maintenance ran: {} shards ({} entries), {} credits",
            w.shard_count(),
            w.tracked_shards(),
            w.live_credits()
        ));
    }
    Ok(())
}

/// What one run carries from operation to operation.
struct State<W> {
    w: W,
    r: Reference,
    next_batch: u32,
    now: Instant,
}

/// Runs operation `op` on the window and the reference.
fn apply<W: Subject>(
    op: u8,
    c: &mut Cursor<'_>,
    st: &mut State<W>,
    step: usize,
) -> Result<(), Divergence> {
    let State {
        w,
        r,
        next_batch,
        now,
    } = st;
    let shard = c.below(W::SHARDS);
    match op {
        0..=5 => {
            let park = c.bool();
            let batch = *next_batch;
            *next_batch = next_batch.wrapping_add(1);
            r.fates.push((batch, Fate::Held));
            submit(w, r, shard, batch, park).map_err(|e| format!("step {step}: {e}"))?;
        }
        6 => {
            let got = w.reclaim(&Key::new(shard));
            let want = r.parked_of(shard);
            if got != want {
                return Err(format!(
                    "step {step}: reclaim({shard}) = {got:?}, want {want:?}"
                ));
            }
            if let Some(b) = want {
                r.parked.retain(|(s, _)| *s != shard);
                r.set_fate(b, Fate::Reclaimed)?;
            }
        }
        7..=10 => {
            // A live credit, chosen by index among live ones.
            let live: Vec<CreditId> = r.credits.iter().filter(|x| x.2).map(|x| x.0).collect();
            if let Some(credit) = live.get(usize::from(c.u8()) % live.len().max(1)) {
                complete(w, r, *credit).map_err(|e| format!("step {step}: {e}"))?;
            }
        }
        11 => {
            // A credit issued earlier, live or not (duplicates after release).
            let n = r.credits.len();
            if let Some((credit, _, _)) = r.credits.get(usize::from(c.u16()) % n.max(1)).copied() {
                complete(w, r, credit).map_err(|e| format!("step {step}: {e}"))?;
            }
        }
        12 => {
            let slot = match c.below(3) {
                0 => u32::MAX,
                1 => u32::from(c.u8() % 8),
                _ => c.u32(),
            };
            let generation = match c.below(4) {
                0 => 0,
                1 => u64::MAX,
                2 => u64::from(c.u8()),
                _ => c.u64(),
            };
            let credit = CreditId::forge(w.instance_tag(), slot, generation);
            complete(w, r, credit).map_err(|e| format!("step {step}: bogus {e}"))?;
        }
        // Closing is rare, so most runs stay open long enough to exhaust windows.
        13 if c.below(4) == 0 => {
            close(w, r).map_err(|e| format!("step {step}: {e}"))?;
        }
        14 => {
            // Jump close to the end of the id space.
            let left = u64::from(c.below(4));
            w.skip_generations_to(u64::MAX - left);
            r.ids_left = r.ids_left.min(left);
        }
        15 => {
            *now = c.time_step(*now);
            let due = w.poll_timeout().is_some_and(|t| t <= *now);
            w.handle_timeout(*now);
            if due && w.tracked_shards() != w.shard_count() {
                return Err(format!(
                    "step {step}: maintenance ran at {now:?} and left {} idle entries",
                    w.tracked_shards() - w.shard_count()
                ));
            }
            maintenance_is_not_overdue(w, *now).map_err(|e| format!("step {step}: {e}"))?;
        }
        16 => {
            // A full batch through `enqueue`, keeping the ticket of a queued one.
            let batch = *next_batch;
            *next_batch = next_batch.wrapping_add(1);
            r.fates.push((batch, Fate::Held));
            enqueue(w, r, shard, batch).map_err(|e| format!("step {step}: {e}"))?;
        }
        17 => {
            // Cancel a ticket issued earlier: still queued, or dispatched, withdrawn or
            // failed since (then refused, changing nothing).
            let n = r.tickets.len();
            if let Some((ticket, batch)) = r.tickets.get(usize::from(c.u16()) % n.max(1)).copied() {
                cancel(w, r, ticket, batch).map_err(|e| format!("step {step}: {e}"))?;
            }
        }
        18 => {
            // A live credit under another window's tag: unknown here, changes nothing.
            let live: Vec<CreditId> = r.credits.iter().filter(|x| x.2).map(|x| x.0).collect();
            if let Some(credit) = live.get(usize::from(c.u8()) % live.len().max(1)) {
                let foreign = CreditId::forge(
                    credit.tag().wrapping_add(1),
                    u32::try_from(credit.slot()).unwrap_or(u32::MAX),
                    credit.generation(),
                );
                let got = w.complete(foreign);
                if got != Err(ReleaseError::Unknown) {
                    return Err(format!(
                        "step {step}: another window's credit {foreign:?} = {got:?}"
                    ));
                }
            }
        }
        19 => {
            // A ticket under another window's tag: unknown here, changes nothing.
            let n = r.tickets.len();
            if let Some((ticket, _)) = r.tickets.get(usize::from(c.u16()) % n.max(1)) {
                let foreign =
                    Ticket::forged(ticket.tag().wrapping_add(1), ticket.id(), ticket.slot());
                let got = w.cancel(foreign);
                if got != Err(ReleaseError::Unknown) || w.is_queued(foreign) {
                    return Err(format!(
                        "step {step}: another window's ticket {foreign:?} = {got:?}"
                    ));
                }
            }
        }
        // Draining is rare too, so most runs reach it with work held back.
        DRAIN if c.below(4) == 0 => {
            w.drain();
            if !r.closed {
                r.closed = true;
                r.draining = true;
            }
        }
        _ => {}
    }
    Ok(())
}

fn submit<W: Subject>(
    w: &mut W,
    r: &mut Reference,
    shard: u8,
    batch: u32,
    park: bool,
) -> Result<(), Divergence> {
    let got = if park {
        w.submit_or_park(Key::new(shard), batch)
    } else {
        w.submit(Key::new(shard), batch)
    };
    let what = if park { "submit_or_park" } else { "submit" };
    expect_submit(r, shard, batch, park, what, got)
}

/// Checks what a submit of `batch` returned against the reference, and applies it there.
fn expect_submit(
    r: &mut Reference,
    shard: u8,
    batch: u32,
    park: bool,
    what: &str,
    got: Result<Option<crate::dispatch_window::Dispatch<Key, u32>>, SubmitError<u32>>,
) -> Result<(), Divergence> {
    if r.closed {
        r.set_fate(batch, Fate::Refused)?;
        return match got {
            Err(SubmitError::Closed(b)) if b == batch => Ok(()),
            other => Err(format!(
                "{what} after close = {other:?}, want Closed({batch})"
            )),
        };
    }
    if park && r.parked_of(shard).is_some() {
        r.set_fate(batch, Fate::Refused)?;
        return match got {
            Err(SubmitError::AlreadyParked(b)) if b == batch => Ok(()),
            other => Err(format!(
                "{what} over a parked batch = {other:?}, want AlreadyParked"
            )),
        };
    }
    if r.has_credit(shard) {
        if r.ids_left == 0 {
            // Ids never wrap: the batch is refused, and the window stays open for releases.
            r.set_fate(batch, Fate::Refused)?;
            return match got {
                Err(SubmitError::Exhausted(b)) if b == batch => Ok(()),
                other => Err(format!(
                    "{what} with no ids left = {other:?}, want Exhausted"
                )),
            };
        }
        return match got {
            Ok(Some(d)) if d.shard.id() == shard && d.batch == batch => {
                r.issued(d.credit, shard)?;
                r.set_fate(batch, Fate::Dispatched)
            }
            other => Err(format!(
                "{what}({shard}, {batch}) with credit = {other:?}, want a dispatch"
            )),
        };
    }
    if got != Ok(None) {
        return Err(format!(
            "{what}({shard}, {batch}) when exhausted = {got:?}, want Ok(None)"
        ));
    }
    if park {
        r.parked.push((shard, batch));
    } else {
        r.queued.push((shard, batch));
    }
    Ok(())
}

/// `enqueue`: as a full `submit`, and a queued batch's ticket is recorded.
fn enqueue<W: Subject>(
    w: &mut W,
    r: &mut Reference,
    shard: u8,
    batch: u32,
) -> Result<(), Divergence> {
    let (got, ticket) = match w.enqueue(Key::new(shard), batch) {
        Ok(Submitted::Sent(d)) => (Ok(Some(d)), None),
        Ok(Submitted::Queued(t)) => (Ok(None), Some(t)),
        Err(e) => (Err(e), None),
    };
    expect_submit(r, shard, batch, false, "enqueue", got)?;
    let Some(ticket) = ticket else {
        return Ok(());
    };
    if r.tickets.iter().any(|(t, _)| *t == ticket) {
        return Err(format!("ticket {ticket:?} reused"));
    }
    if !w.is_queued(ticket) {
        return Err(format!("fresh ticket {ticket:?} is not queued"));
    }
    r.tickets.push((ticket, batch));
    Ok(())
}

/// `cancel`: a ticket still queued withdraws its batch; any other is refused unchanged.
fn cancel<W: Subject>(
    w: &mut W,
    r: &mut Reference,
    ticket: Ticket,
    batch: u32,
) -> Result<(), Divergence> {
    let got = w.cancel(ticket);
    match r.queued.iter().position(|(_, b)| *b == batch) {
        Some(i) => {
            r.queued.remove(i);
            r.set_fate(batch, Fate::Withdrawn)?;
            match got {
                Ok(b) if b == batch => {}
                other => return Err(format!("cancel({ticket:?}) = {other:?}, want Ok({batch})")),
            }
        }
        None => match got {
            Err(ReleaseError::AlreadyReleased) => {}
            other => {
                return Err(format!(
                    "cancel of a finished {ticket:?} = {other:?}, want AlreadyReleased"
                ));
            }
        },
    }
    if w.is_queued(ticket) {
        return Err(format!("{ticket:?} still queued after cancel"));
    }
    Ok(())
}

fn complete<W: Subject>(w: &mut W, r: &mut Reference, credit: CreditId) -> Result<(), Divergence> {
    let got = w.complete(credit);
    let Some(idx) = r.credits.iter().position(|(c, _, _)| *c == credit) else {
        return match got {
            Err(_) => Ok(()),
            Ok(d) => Err(format!("never-issued {credit:?} released: {d:?}")),
        };
    };
    let Some(&(_, shard, live)) = r.credits.get(idx) else {
        return Err(format!("credit index {idx} vanished"));
    };
    if !live {
        return match got {
            Err(ReleaseError::AlreadyReleased) => Ok(()),
            other => Err(format!(
                "second release of {credit:?} = {other:?}, want AlreadyReleased"
            )),
        };
    }
    if let Some(entry) = r.credits.get_mut(idx) {
        entry.2 = false;
    }
    let next = if r.closed && !r.draining {
        None
    } else if let Some(i) = r.queued.iter().position(|(s, _)| *s == shard) {
        Some((r.queued.remove(i).1, Some(i)))
    } else if let Some(i) = r.parked.iter().position(|(s, _)| *s == shard) {
        Some((r.parked.remove(i).1, None))
    } else {
        None
    };
    match next {
        None => match got {
            Ok(None) => Ok(()),
            other => Err(format!("release of {credit:?} = {other:?}, want Ok(None)")),
        },
        Some((batch, from_queue)) if r.ids_left == 0 => {
            // No id for the next batch: it stays held (ids never wrap; `close` collects it).
            match from_queue {
                Some(i) => r.queued.insert(i, (shard, batch)),
                None => r.parked.push((shard, batch)),
            }
            match got {
                Ok(None) => Ok(()),
                other => Err(format!(
                    "release with no ids left = {other:?}, want Ok(None)"
                )),
            }
        }
        Some((batch, _)) => match got {
            Ok(Some(d)) if d.shard.id() == shard && d.batch == batch => {
                r.issued(d.credit, shard)?;
                r.set_fate(batch, Fate::Dispatched)
            }
            other => Err(format!(
                "release of {credit:?} = {other:?}, want dispatch of {batch}"
            )),
        },
    }
}

fn close<W: Subject>(w: &mut W, r: &mut Reference) -> Result<(), Divergence> {
    let got: Vec<(u8, u32)> = w.close();
    r.closed = true;
    r.draining = false;
    let mut want: Vec<(u8, u32)> = core::mem::take(&mut r.queued);
    want.append(&mut r.parked);
    if got.len() != want.len() {
        return Err(format!(
            "close returned {got:?}, want {want:?} (any shard order)"
        ));
    }
    for shard in 0..W::SHARDS {
        let g: Vec<u32> = got
            .iter()
            .filter(|(s, _)| *s == shard)
            .map(|(_, b)| *b)
            .collect();
        let x: Vec<u32> = want
            .iter()
            .filter(|(s, _)| *s == shard)
            .map(|(_, b)| *b)
            .collect();
        if g != x {
            return Err(format!(
                "close for shard {shard} returned {g:?}, want {x:?}"
            ));
        }
    }
    for (_, b) in want {
        r.set_fate(b, Fate::Failed)?;
    }
    Ok(())
}

/// After `handle_timeout(now)` the next deadline is later than `now` (or the end of time).
fn maintenance_is_not_overdue<W: Subject>(w: &W, now: Instant) -> Result<(), Divergence> {
    match w.poll_timeout() {
        Some(t) if t <= now && t != Instant::MAX => Err(format!(
            "maintenance still due at {t:?} after handle_timeout({now:?})"
        )),
        _ => Ok(()),
    }
}

fn compare<W: Subject>(w: &W, r: &Reference) -> Result<(), Divergence> {
    let mut active = 0usize;
    for shard in 0..W::SHARDS {
        let key = Key::new(shard);
        let in_flight = r.in_flight(shard);
        let queued = r.queued.iter().filter(|(s, _)| *s == shard).count();
        let parked = r.parked_of(shard);
        let got = (w.in_flight(&key), w.queued(&key), w.parked(&key));
        if got != (in_flight, queued, parked) {
            return Err(format!(
                "shard {shard}: (in_flight, queued, parked) = {got:?}, want {:?}",
                (in_flight, queued, parked)
            ));
        }
        if w.in_flight(&key).saturating_add(w.available(&key)) != w.capacity()
            || w.in_flight(&key) > r.cap
        {
            return Err(format!(
                "shard {shard}: in_flight {} + available {} != capacity {}",
                w.in_flight(&key),
                w.available(&key),
                w.capacity()
            ));
        }
        if in_flight > 0 || queued > 0 || parked.is_some() {
            active += 1;
        }
    }
    let live = r.credits.iter().filter(|x| x.2).count();
    if w.tracked_shards() < active {
        return Err(format!(
            "{} map entries for {active} active shards",
            w.tracked_shards()
        ));
    }
    let drained = r.closed && active == 0;
    let got = (
        w.shard_count(),
        w.live_credits(),
        w.is_closed(),
        w.is_draining(),
        w.is_drained(),
    );
    let want = (active, live, r.closed, r.draining, drained);
    if got != want {
        return Err(format!(
            "(shards, live credits, closed, draining, drained) = {got:?}, want {want:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_short_inputs_pass() {
        assert_eq!(check(&[]), Ok(()));
        assert_eq!(check(&[1, 0, 0, 0, 1, 0, 8]), Ok(()));
        assert_eq!(check_single(&[]), Ok(()));
        assert_eq!(check_single(&[1, 0, 0, 0, 1, 0, 8]), Ok(()));
    }
}
