//! Model check of [`DispatchWindow`] and [`SingleWindow`] against one naive reference.
//!
//! The reference keeps every credit ever issued and every held-back batch in plain `Vec`s in
//! global arrival order, and answers each query by scanning them. It shares no code with the
//! machine: it does not know slabs, generations or per-shard queues.
//!
//! Checked after every operation: credits conserved (`in_flight + available == capacity`),
//! never more than `max_in_flight` per shard, FIFO dispatch (a release sends the shard's
//! oldest requeued batch, else its oldest queued one, else its parked one), ids never reused,
//! double and bogus releases change nothing, every batch leaves exactly once (dispatched,
//! reclaimed, failed or refused), and no idle shard is counted or holds a buffer; idle entries
//! are gone once maintenance has run with nothing live (`tracked_shards() == 0`). Maintenance
//! (`handle_timeout`) is interleaved at random times and must change none of this; its
//! deadline is never in the past, and it goes quiet after two runs with nothing live.
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
//! Operations 24, 25 and 26 (issue 15; new values, so stored inputs keep their meaning) are
//! `pause`, `resume` and `requeue`. The reference keeps paused shards in a `Vec` and requeued
//! batches in a third list beside the queued and parked ones, each with its place in the
//! order of departures (the reference's own count of credits issued). A paused shard takes no
//! credit: its new batches queue or park although credit is free, and a release of one of its
//! credits hands nothing on (the credit simply comes back free). `resume` sends its held-back
//! batches in the order they would have left (requeued ones in the order they first left,
//! then queued, then parked) under fresh credits, as many as it has free. `requeue` of a live
//! credit (a torn stream) releases it and puts its batch back at the head of its shard's
//! order, after requeued batches that left before it; the freed credit is then handed on as
//! by `complete` (so an unpaused shard resends at once); after `close` the batch is handed
//! back; a released credit is refused and changes nothing. A requeued batch gets a ticket
//! (`cancel` withdraws it while it waits). Checked after each: the same outputs and dispatch
//! order, credits conserved, `is_paused` per shard, every batch ending exactly once (a
//! requeued batch is held again until it leaves again), and a shard that is not paused with a
//! free credit holding nothing back (ids permitting). A paused idle shard keeps its map entry
//! through maintenance; `close` ends every pause. A run that ends draining resumes its paused
//! shards, as a driver whose streams came back would, before it checks that nothing is
//! stranded. Under a panicking callback (20–22) the inner operation may be any of `0..20` or
//! 24–26 (one byte, as before: the others are no-ops). [`SingleWindow`] has `pause` and
//! `resume` but no `requeue`: the single-shard run reads a `requeue`'s bytes and skips it.
//!
//! Operation 27 (issue 18) is `set_max_in_flight`: a shard's limit set at run time (1 to 6,
//! `usize::MAX`, or `None` for the configured one again). The reference keeps each shard's
//! own limit beside the configured one. A larger capacity sends the shard's held-back batches
//! at once, in the order they would have left, as many as it has free credits (none while
//! paused); a smaller one revokes nothing, and the reference hands nothing on at a release
//! until the shard is below its capacity again. Checked after each operation: `available ==
//! capacity_of − in_flight`, floored at 0, and `capacity_of` per shard; an idle shard with a
//! limit of its own keeps its entry through maintenance; `close` ends every limit.
//!
//! [`check_single`] runs the same decoder and reference over a [`SingleWindow`], as one
//! shard: every output of the single-shard window is checked against what the reference
//! (and so the multi-shard window, on its shard) answers.

use alloc::format;
use alloc::vec::Vec;
use core::fmt::Debug;
use core::num::NonZeroUsize;

use super::user::{self, Arm, Key};
use super::{Cursor, Divergence};
use crate::dispatch_window::{
    CreditId, Dispatch, DispatchWindow, SingleWindow, SubmitError, Submitted, Ticket, WindowConfig,
    WindowEvent,
};
use crate::error::{ConfigError, ReleaseError};
use crate::test_hasher::TestHasher;
use crate::time::Instant;

type Window = DispatchWindow<Key, u32, TestHasher>;

/// Operations before the panicking-callback ones (20 `Hash`, 21 `Eq`, 22 `Clone`).
const OPS: u8 = 20;

/// `drain`, after the panicking-callback operations.
const DRAIN: u8 = OPS + Arm::OPS;

/// `pause` of a shard, after `drain` (issue 15).
const PAUSE: u8 = DRAIN + 1;

/// `resume` of a shard.
const RESUME: u8 = PAUSE + 1;

/// `requeue` of a credit's batch (a torn stream): multi-shard window only.
const REQUEUE: u8 = RESUME + 1;

/// `set_max_in_flight` of a shard (issue 18): a limit that changes at run time.
const SET_LIMIT: u8 = REQUEUE + 1;

/// Every operation value assigned.
const ALL: u8 = SET_LIMIT + 1;

/// What [`DispatchWindow::requeue`] returns: the requeued batch's ticket (or the batch handed
/// back), and the dispatch of the freed credit.
type Requeued =
    Result<(Result<Ticket, SubmitError<u32>>, Option<Dispatch<Key, u32>>), ReleaseError>;

/// A window under check: the multi-shard window over [`Key`]s, or the single-shard window as
/// shard 0. Outputs are in the multi-shard window's types.
pub(crate) trait Subject: Debug + Sized {
    /// Shards the decoder draws from.
    const SHARDS: u8;
    /// A paused shard keeps its (idle) map entry through maintenance; a window without a map
    /// has none to keep.
    const PAUSE_KEEPS_ENTRY: bool;
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
    fn pause(&mut self, shard: Key);
    fn resume(&mut self, now: Instant, shard: &Key) -> Vec<Dispatch<Key, u32>>;
    fn is_paused(&self, shard: &Key) -> bool;
    /// `None`: the window has no `requeue` (the operation is skipped).
    fn requeue(&mut self, credit: CreditId, shard: Key, batch: u32) -> Option<Requeued>;
    fn set_limit(&mut self, shard: &Key, limit: Option<NonZeroUsize>) -> Vec<Dispatch<Key, u32>>;
    fn capacity_of(&self, shard: &Key) -> u32;
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
    fn set_event_capacity(&mut self, n: usize);
    fn poll_event(&mut self) -> Option<WindowEvent<Key>>;
}

impl Subject for Window {
    const SHARDS: u8 = 4;
    const PAUSE_KEEPS_ENTRY: bool = true;
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
    fn pause(&mut self, shard: Key) {
        Window::pause(self, shard);
    }
    fn resume(&mut self, now: Instant, shard: &Key) -> Vec<Dispatch<Key, u32>> {
        Window::resume(self, now, shard)
    }
    fn is_paused(&self, shard: &Key) -> bool {
        Window::is_paused(self, shard)
    }
    fn requeue(&mut self, credit: CreditId, shard: Key, batch: u32) -> Option<Requeued> {
        {
            let noted = self.note_key(&shard);
            Some(Window::requeue(self, credit, shard, noted, batch))
        }
    }
    fn set_limit(&mut self, shard: &Key, limit: Option<NonZeroUsize>) -> Vec<Dispatch<Key, u32>> {
        Window::set_max_in_flight(self, shard, limit)
    }
    fn capacity_of(&self, shard: &Key) -> u32 {
        Window::capacity_of(self, shard)
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
    fn set_event_capacity(&mut self, n: usize) {
        Window::set_event_capacity(self, n);
    }
    fn poll_event(&mut self) -> Option<WindowEvent<Key>> {
        Window::poll_event(self)
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
    const PAUSE_KEEPS_ENTRY: bool = false;
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
    fn pause(&mut self, _: Key) {
        SingleWindow::pause(self);
    }
    fn resume(&mut self, now: Instant, _: &Key) -> Vec<Dispatch<Key, u32>> {
        SingleWindow::resume(self, now)
            .into_iter()
            .map(on_shard_0)
            .collect()
    }
    fn is_paused(&self, _: &Key) -> bool {
        SingleWindow::is_paused(self)
    }
    fn requeue(&mut self, _: CreditId, _: Key, _: u32) -> Option<Requeued> {
        None
    }
    fn set_limit(&mut self, _: &Key, limit: Option<NonZeroUsize>) -> Vec<Dispatch<Key, u32>> {
        SingleWindow::set_max_in_flight(self, limit)
            .into_iter()
            .map(on_shard_0)
            .collect()
    }
    fn capacity_of(&self, _: &Key) -> u32 {
        SingleWindow::capacity(self)
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
    fn set_event_capacity(&mut self, n: usize) {
        SingleWindow::set_event_capacity(self, n);
    }
    fn poll_event(&mut self) -> Option<WindowEvent<Key>> {
        Some(match SingleWindow::poll_event(self)? {
            WindowEvent::Dispatched { credit, .. } => WindowEvent::Dispatched {
                shard: Key::new(0),
                credit,
            },
            WindowEvent::Released { credit, in_flight } => {
                WindowEvent::Released { credit, in_flight }
            }
        })
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

/// A credit the machine issued, as the reference remembers it.
#[derive(Clone, Copy, Debug)]
struct Issued {
    id: CreditId,
    shard: u8,
    /// Not yet released (by `complete` or `requeue`).
    live: bool,
    /// The batch that left under it.
    batch: u32,
    /// Its place in the order of departures (the index of this entry in `credits`).
    seq: u64,
}

/// Where a shard's oldest held-back batch is in the reference: an index into `requeued`,
/// `queued` or `parked`.
#[derive(Clone, Copy, Debug)]
enum HeldAt {
    Requeued(usize),
    Queued(usize),
    Parked(usize),
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
    /// Every credit ever issued, in the order the batches left.
    credits: Vec<Issued>,
    /// Batches put back by `requeue` after they left (a torn stream), in the order they were
    /// put back: (shard, batch, `seq` of the credit they held). A shard's next batch is its
    /// requeued one of lowest `seq`, before any batch that never left.
    requeued: Vec<(u8, u32, u64)>,
    /// Full batches waiting that never left, in global arrival order: (shard, batch).
    queued: Vec<(u8, u32)>,
    /// Parked open batches: (shard, batch).
    parked: Vec<(u8, u32)>,
    /// Paused shards (`pause` and no `resume` or `close` since).
    paused: Vec<u8>,
    /// Shards given a limit of their own by `set_max_in_flight` (and no `None` or `close`
    /// since), with it.
    limits: Vec<(u8, u32)>,
    /// Every ticket the window returned, with its batch and, for a `requeue` ticket, the
    /// `seq` the batch was requeued under (`None`: an `enqueue` ticket).
    tickets: Vec<(Ticket, u32, Option<u64>)>,
    /// Every batch and where it went.
    fates: Vec<(u32, Fate)>,
}

impl Reference {
    /// The shard's capacity: its own limit, else the configured one.
    fn cap_of(&self, shard: u8) -> u32 {
        self.limits
            .iter()
            .find(|(s, _)| *s == shard)
            .map_or(self.cap, |(_, n)| *n)
    }

    fn in_flight(&self, shard: u8) -> u32 {
        let n = self
            .credits
            .iter()
            .filter(|x| x.live && x.shard == shard)
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    fn live(&self) -> Vec<Issued> {
        self.credits.iter().filter(|x| x.live).copied().collect()
    }

    /// Whether the window is closed by `close` (not by `drain`): nothing is handed on.
    fn hard_closed(&self) -> bool {
        self.closed && !self.draining
    }

    fn is_paused(&self, shard: u8) -> bool {
        self.paused.contains(&shard)
    }

    fn parked_of(&self, shard: u8) -> Option<u32> {
        self.parked
            .iter()
            .find(|(s, _)| *s == shard)
            .map(|(_, b)| *b)
    }

    /// The shard's oldest held-back batch: its requeued batch that left first, else its
    /// oldest queued one, else its parked one.
    fn oldest_held(&self, shard: u8) -> Option<HeldAt> {
        let requeued = self
            .requeued
            .iter()
            .enumerate()
            .filter(|(_, x)| x.0 == shard)
            .min_by_key(|(_, x)| x.2)
            .map(|(i, _)| HeldAt::Requeued(i));
        requeued
            .or_else(|| {
                self.queued
                    .iter()
                    .position(|(s, _)| *s == shard)
                    .map(HeldAt::Queued)
            })
            .or_else(|| {
                self.parked
                    .iter()
                    .position(|(s, _)| *s == shard)
                    .map(HeldAt::Parked)
            })
    }

    /// Takes the batch at `at` out of the held-back ones.
    fn take_held(&mut self, at: HeldAt) -> u32 {
        match at {
            HeldAt::Requeued(i) => self.requeued.remove(i).1,
            HeldAt::Queued(i) => self.queued.remove(i).1,
            HeldAt::Parked(i) => self.parked.remove(i).1,
        }
    }

    /// The shard's held-back batches in the order they would leave.
    fn line_of(&self, shard: u8) -> Vec<u32> {
        let mut requeued: Vec<(u64, u32)> = self
            .requeued
            .iter()
            .filter(|x| x.0 == shard)
            .map(|x| (x.2, x.1))
            .collect();
        requeued.sort_unstable();
        let mut line: Vec<u32> = requeued.into_iter().map(|(_, b)| b).collect();
        line.extend(
            self.queued
                .iter()
                .filter(|(s, _)| *s == shard)
                .map(|(_, b)| *b),
        );
        line.extend(self.parked_of(shard));
        line
    }

    fn holds_back(&self, shard: u8) -> bool {
        self.oldest_held(shard).is_some()
    }

    fn has_credit(&self, shard: u8) -> bool {
        self.in_flight(shard) < self.cap_of(shard)
            && !self.holds_back(shard)
            && !self.is_paused(shard)
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

    /// A dispatched batch comes back (`requeue`): it is held again.
    fn came_back(&mut self, batch: u32) -> Result<(), Divergence> {
        match self.fates.iter_mut().find(|(b, _)| *b == batch) {
            Some((_, f)) if *f == Fate::Dispatched => {
                *f = Fate::Held;
                Ok(())
            }
            Some((_, f)) => Err(format!("batch {batch} requeued while {f:?}")),
            None => Err(format!("batch {batch} was never submitted")),
        }
    }

    /// Takes out the batches `shard`'s free credits send now, oldest first, as many as it
    /// has free credits under its capacity and ids left (for `resume` and a grown limit).
    fn take_free(&mut self, shard: u8) -> Vec<u32> {
        let free = self.cap_of(shard).saturating_sub(self.in_flight(shard));
        let mut want = Vec::new();
        while u64::try_from(want.len()).unwrap_or(u64::MAX) < self.ids_left
            && u32::try_from(want.len()).unwrap_or(u32::MAX) < free
        {
            let Some(at) = self.oldest_held(shard) else {
                break;
            };
            want.push(self.take_held(at));
        }
        want
    }

    /// Checks that `what` sent exactly `want` (batches of `shard`, in order) and records each
    /// dispatch.
    fn sent(
        &mut self,
        shard: u8,
        got: Vec<Dispatch<Key, u32>>,
        want: Vec<u32>,
        what: &str,
    ) -> Result<(), Divergence> {
        if got.len() != want.len() {
            return Err(format!(
                "{what}({shard}) = {got:?}, want batches {want:?} of shard {shard}"
            ));
        }
        for (d, batch) in got.into_iter().zip(want) {
            if d.shard.id() != shard || d.batch != batch {
                return Err(format!(
                    "{what}({shard}) sent {d:?}, want batch {batch} of shard {shard}"
                ));
            }
            self.issued(d.credit, shard, batch)?;
            self.set_fate(batch, Fate::Dispatched)?;
        }
        Ok(())
    }

    /// Records a fresh credit the machine issued for `shard`, carrying `batch`.
    fn issued(&mut self, credit: CreditId, shard: u8, batch: u32) -> Result<(), Divergence> {
        if self.credits.iter().any(|x| x.id == credit) {
            return Err(format!("credit {credit:?} reused"));
        }
        self.ids_left = self.ids_left.saturating_sub(1);
        let seq = u64::try_from(self.credits.len()).unwrap_or(u64::MAX);
        self.credits.push(Issued {
            id: credit,
            shard,
            live: true,
            batch,
            seq,
        });
        Ok(())
    }

    /// After one of `shard`'s credits was released: what the machine handed on (`got`) must
    /// be the shard's oldest held-back batch under a fresh credit, unless the window is
    /// closed, the shard is paused or still at its capacity or above (after a shrink: the
    /// credit retires), nothing is held back or no id is left.
    fn hand_on(
        &mut self,
        shard: u8,
        got: Option<Dispatch<Key, u32>>,
        what: &str,
    ) -> Result<(), Divergence> {
        let next = if self.hard_closed()
            || self.is_paused(shard)
            || self.ids_left == 0
            || self.in_flight(shard) >= self.cap_of(shard)
        {
            None
        } else {
            self.oldest_held(shard)
        };
        let Some(at) = next else {
            return match got {
                None => Ok(()),
                Some(d) => Err(format!("{what} handed on {d:?}, want nothing")),
            };
        };
        let batch = self.take_held(at);
        match got {
            Some(d) if d.shard.id() == shard && d.batch == batch => {
                self.issued(d.credit, shard, batch)?;
                self.set_fate(batch, Fate::Dispatched)
            }
            other => Err(format!(
                "{what} handed on {other:?}, want batch {batch} of shard {shard}"
            )),
        }
    }
}

/// Decodes `data` into window operations, drives the multi-shard window and the reference,
/// and returns the first disagreement.
pub fn check(data: &[u8]) -> Result<(), Divergence> {
    run::<Window>(data).map(drop)
}

/// As [`check`], over a [`SingleWindow`] (every operation on its one shard).
pub fn check_single(data: &[u8]) -> Result<(), Divergence> {
    run::<SingleWindow<u32>>(data).map(drop)
}

/// [`check`], then [`check_single`] on the same input: what the fuzz target and the corpus
/// replay run.
pub fn check_all(data: &[u8]) -> Result<(), Divergence> {
    check(data)?;
    check_single(data).map_err(|e| format!("single-shard window: {e}"))
}

/// The operation run under an armed callback: any value of an operation that may run user
/// code (`0..OPS`, `pause`, `resume`, `requeue`), else `None`. Reads one byte either way.
fn armed_op(c: &mut Cursor<'_>) -> Option<u8> {
    let v = c.u8();
    (v < OPS || (PAUSE..ALL).contains(&v)).then_some(v)
}

/// Runs `data` and returns every departure, in order: (shard, batch) per credit issued.
fn run<W: Subject>(data: &[u8]) -> Result<Vec<(u8, u32)>, Divergence> {
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
    // Events on for inputs ending in an odd byte: every dispatch and release is then checked
    // against the reference's credits after each operation, and a run with them off must
    // behave the same (the reference does not know about them).
    let events = data.last().is_some_and(|b| b & 1 == 1);
    if events {
        w.set_event_capacity(usize::MAX);
    }
    let mut seen = Seen::default();
    let r = Reference {
        cap,
        closed: false,
        draining: false,
        ids_left: u64::MAX - 1,
        credits: Vec::new(),
        requeued: Vec::new(),
        queued: Vec::new(),
        parked: Vec::new(),
        paused: Vec::new(),
        limits: Vec::new(),
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
            let Some(inner) = armed_op(&mut c) else {
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
        check_events(&mut st.w, &st.r, &mut seen, events)
            .map_err(|e| format!("step {step}: {e}"))?;
    }
    let State {
        mut w, mut r, now, ..
    } = st;
    if r.draining {
        // Draining: completing every credit sends everything held back, whole and in order
        // (each completion is checked against the reference), until nothing is left. A paused
        // shard sends nothing until it is resumed, so each round resumes the paused shards
        // (as a driver whose streams came back would) and completes again.
        loop {
            while let Some(credit) = r.credits.iter().find(|x| x.live).map(|x| x.id) {
                complete(&mut w, &mut r, credit)?;
                compare(&w, &r)?;
                check_events(&mut w, &r, &mut seen, events)?;
            }
            if r.paused.is_empty() {
                break;
            }
            for shard in r.paused.clone() {
                resume(&mut w, &mut r, now, shard)?;
                compare(&w, &r)?;
                check_events(&mut w, &r, &mut seen, events)?;
            }
        }
        let stuck = r.requeued.len() + r.queued.len() + r.parked.len();
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
    for credit in r.live() {
        complete(&mut w, &mut r, credit.id)?;
        check_events(&mut w, &r, &mut seen, events)?;
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
    Ok(r.credits.iter().map(|x| (x.shard, x.batch)).collect())
}

/// The events checked so far: dispatches (a prefix of the reference's credits, in order)
/// and releases.
#[derive(Default)]
struct Seen {
    dispatched: usize,
    released: Vec<CreditId>,
}

/// Drains the window's events after an operation and checks them against the reference:
/// one `Dispatched` per credit issued since, in issue order and naming its shard; one
/// `Released` per credit released since, each once, with its shard's credits in flight
/// after the operation (an operation releases at most one credit). With events off, none.
fn check_events<W: Subject>(
    w: &mut W,
    r: &Reference,
    seen: &mut Seen,
    on: bool,
) -> Result<(), Divergence> {
    while let Some(e) = w.poll_event() {
        if !on {
            return Err(format!("event {e:?} with events off"));
        }
        match e {
            WindowEvent::Dispatched { shard, credit } => {
                let want = r.credits.get(seen.dispatched);
                if want.is_none_or(|x| x.id != credit || x.shard != shard.id()) {
                    return Err(format!(
                        "event Dispatched({}, {credit:?}), want the credit issued #{}: {want:?}",
                        shard.id(),
                        seen.dispatched
                    ));
                }
                seen.dispatched += 1;
            }
            WindowEvent::Released { credit, in_flight } => {
                let Some(x) = r.credits.iter().find(|x| x.id == credit) else {
                    return Err(format!("event Released({credit:?}) of no credit issued"));
                };
                if x.live || seen.released.contains(&credit) {
                    return Err(format!(
                        "event Released({credit:?}): live {} or released twice",
                        x.live
                    ));
                }
                let want = r.in_flight(x.shard);
                if in_flight != want {
                    return Err(format!(
                        "event Released({credit:?}) with {in_flight} in flight, want {want}"
                    ));
                }
                seen.released.push(credit);
            }
        }
    }
    let released = r.credits.iter().filter(|x| !x.live).count();
    if on && (seen.dispatched != r.credits.len() || seen.released.len() != released) {
        return Err(format!(
            "events: {} dispatches and {} releases, want {} and {released}",
            seen.dispatched,
            seen.released.len(),
            r.credits.len()
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
            let live = r.live();
            if let Some(credit) = live.get(usize::from(c.u8()) % live.len().max(1)) {
                complete(w, r, credit.id).map_err(|e| format!("step {step}: {e}"))?;
            }
        }
        11 => {
            // A credit issued earlier, live or not (duplicates after release).
            let n = r.credits.len();
            if let Some(credit) = r.credits.get(usize::from(c.u16()) % n.max(1)).map(|x| x.id) {
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
            // Paused idle shards keep their entries (the pause is remembered there), and so do
            // idle shards with a limit of their own.
            let kept = if W::PAUSE_KEEPS_ENTRY {
                (0..W::SHARDS)
                    .filter(|&s| r.is_paused(s) || r.limits.iter().any(|(l, _)| *l == s))
                    .filter(|&s| r.in_flight(s) == 0 && !r.holds_back(s))
                    .count()
            } else {
                0
            };
            if due && w.tracked_shards() != w.shard_count() + kept {
                return Err(format!(
                    "step {step}: maintenance ran at {now:?} and left {} entries for {} active \
                     shards and {kept} paused or limited idle ones",
                    w.tracked_shards(),
                    w.shard_count()
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
            if let Some((ticket, batch, requeued)) =
                r.tickets.get(usize::from(c.u16()) % n.max(1)).copied()
            {
                cancel(w, r, ticket, batch, requeued).map_err(|e| format!("step {step}: {e}"))?;
            }
        }
        18 => {
            // A live credit under another window's tag: unknown here, changes nothing.
            let live: Vec<CreditId> = r.live().iter().map(|x| x.id).collect();
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
            if let Some((ticket, _, _)) = r.tickets.get(usize::from(c.u16()) % n.max(1)) {
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
        PAUSE => {
            w.pause(Key::new(shard));
            // After `close` a pause does nothing; a draining window still pauses.
            if !r.hard_closed() && !r.is_paused(shard) {
                r.paused.push(shard);
            }
        }
        RESUME => {
            resume(w, r, *now, shard).map_err(|e| format!("step {step}: {e}"))?;
        }
        SET_LIMIT => {
            let limit = match c.below(8) {
                0 => None,
                7 => NonZeroUsize::new(usize::MAX),
                n => NonZeroUsize::new(usize::from(n)),
            };
            set_limit(w, r, shard, limit).map_err(|e| format!("step {step}: {e}"))?;
        }
        REQUEUE => {
            // A torn stream: the batch under a live credit (or, one time in four, under any
            // credit issued earlier, then refused as released) goes back to its shard. The
            // shard byte is read and unused: the credit names its shard.
            let any = c.below(4) == 0;
            let pick = usize::from(c.u16());
            let chosen = if any {
                r.credits.get(pick % r.credits.len().max(1)).copied()
            } else {
                let live = r.live();
                live.get(pick % live.len().max(1)).copied()
            };
            if let Some(credit) = chosen {
                requeue(w, r, credit).map_err(|e| format!("step {step}: {e}"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

mod ops;
use ops::*;

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn empty_and_short_inputs_pass() {
        assert_eq!(check(&[]), Ok(()));
        assert_eq!(check(&[1, 0, 0, 0, 1, 0, 8]), Ok(()));
        assert_eq!(check_single(&[]), Ok(()));
        assert_eq!(check_single(&[1, 0, 0, 0, 1, 0, 8]), Ok(()));
    }

    // Hand-written scripts: after the limit byte, each operation is its selector, the shard
    // byte, then its own bytes. The departures (shard, batch) are worked out by hand, so a
    // reference that mis-modelled pause, resume or requeue the way the machine does would
    // still fail here.

    /// Pause, a release while paused, a requeue while paused, then resume: the release
    /// hands nothing on, and resume sends the requeued batch first, then the queued one, as
    /// far as the two free credits go; the parked batch leaves on the next release.
    const PAUSE_RELEASE_RESUME: [u8; 30] = [
        1, //                max_in_flight 2
        0, 0, 0, //          shard 0: batch 0 leaves
        0, 0, 0, //          batch 1 leaves (no credit left)
        PAUSE, 0, //         pause shard 0
        0, 0, 0, //          batch 2 queued
        0, 0, 1, //          batch 3 parked
        0, 1, 0, //          shard 1 is not paused: batch 4 leaves
        7, 0, 0, //          complete batch 0's credit: paused, nothing handed on
        REQUEUE, 0, 1, 0, 0, // requeue batch 1 (live credit 0): paused, nothing sent
        RESUME, 0, //        two free credits: batch 1, then batch 2
        7, 0, //             (first two bytes of the next release: batch 4's credit)
    ];

    #[test]
    fn pause_holds_back_and_resume_sends_requeued_then_queued_then_parked() {
        let mut data = PAUSE_RELEASE_RESUME.to_vec();
        // Complete batch 4's credit (shard 1: nothing to hand on), then batch 1's second
        // credit: the parked batch 3 leaves.
        data.extend([0, 7, 0, 0]);
        assert_eq!(
            run::<Window>(&data),
            Ok(vec![(0, 0), (0, 1), (1, 4), (0, 1), (0, 2), (0, 3)])
        );
        // One shard: batch 4 waits behind batch 2 on the paused shard, and the requeue is
        // skipped (batch 1 stays in flight): resume has one free credit, for batch 2.
        assert_eq!(
            run::<SingleWindow<u32>>(&data),
            Ok(vec![(0, 0), (0, 1), (0, 2), (0, 4), (0, 3)])
        );
    }

    #[test]
    fn a_resume_whose_key_clone_panics_leaves_the_shard_paused() {
        let mut data = PAUSE_RELEASE_RESUME.to_vec();
        // Before the resume: the same resume with shard 0's first `Clone` armed to panic
        // (key 0, no skip). It must change nothing, so the departures are as without it.
        let at = data.len() - 4;
        data.splice(at..at, [OPS + 2, 0, 0, RESUME, 0]);
        data.extend([0, 7, 0, 0]);
        assert_eq!(
            run::<Window>(&data),
            Ok(vec![(0, 0), (0, 1), (1, 4), (0, 1), (0, 2), (0, 3)])
        );
    }

    #[test]
    fn requeued_batches_go_first_in_the_order_they_first_left() {
        let data = [
            2, //                    max_in_flight 3
            0, 0, 0, 0, 0, 0, 0, 0, 0, // batches 0, 1, 2 leave
            0, 0, 0, //              batch 3 queued
            PAUSE, 0, //
            REQUEUE, 0, 1, 1, 0, //  requeue batch 1 (live credit 1): line [1, 3]
            REQUEUE, 0, 1, 0, 0, //  requeue batch 0, which left first: line [0, 1, 3]
            RESUME, 0, //            two free credits: batches 0 and 1
            7, 0, 0, //              complete batch 2: batch 3 leaves
            REQUEUE, 0, 1, 0, 0, //  not paused: batch 0 is requeued and resent at once
        ];
        assert_eq!(
            run::<Window>(&data),
            Ok(vec![(0, 0), (0, 1), (0, 2), (0, 0), (0, 1), (0, 3), (0, 0)])
        );
    }

    #[test]
    fn a_drain_leaves_a_paused_shards_batches_until_resume() {
        let data = [
            4, //       max_in_flight 1
            0, 0, 0, // batch 0 leaves
            PAUSE, 0, //
            0, 0, 0, // batch 1 queued
            DRAIN, 0, 0, // drain
            7, 0, 0, // complete batch 0: paused, so batch 1 stays although draining
        ];
        // The run ends draining with batch 1 held on the paused shard; the drain phase
        // resumes it (batch 1 leaves) and completes it.
        assert_eq!(run::<Window>(&data), Ok(vec![(0, 0), (0, 1)]));
        assert_eq!(run::<SingleWindow<u32>>(&data), Ok(vec![(0, 0), (0, 1)]));
    }

    #[test]
    fn a_shrunk_limit_retires_releases_and_a_grown_one_sends_in_order() {
        let data = [
            1, //                max_in_flight 2
            0, 0, 0, //          batch 0 leaves
            0, 0, 0, //          batch 1 leaves
            0, 0, 0, //          batch 2 queued
            0, 0, 0, //          batch 3 queued
            SET_LIMIT, 0, 1, //  limit 1: nothing revoked, nothing sent
            7, 0, 0, //          complete batch 0: 1 in flight, at the limit: retired
            7, 0, 0, //          complete batch 1: 0 in flight: batch 2 leaves
            SET_LIMIT, 0, 3, //  limit 3: batch 3 leaves at once
            SET_LIMIT, 0, 0, //  back to 2: nothing revoked (2 in flight)
        ];
        assert_eq!(
            run::<Window>(&data),
            Ok(vec![(0, 0), (0, 1), (0, 2), (0, 3)])
        );
        assert_eq!(
            run::<SingleWindow<u32>>(&data),
            Ok(vec![(0, 0), (0, 1), (0, 2), (0, 3)])
        );
    }

    #[test]
    fn a_limit_set_while_paused_applies_at_resume() {
        let data = [
            4, //                max_in_flight 1
            0, 0, 0, //          batch 0 leaves
            PAUSE, 0, //
            0, 0, 0, //          batch 1 queued
            0, 0, 0, //          batch 2 queued
            SET_LIMIT, 0, 3, //  paused: nothing sent
            RESUME, 0, //        two free credits under the new limit: batches 1 and 2
        ];
        assert_eq!(run::<Window>(&data), Ok(vec![(0, 0), (0, 1), (0, 2)]));
    }

    #[test]
    fn new_operations_took_new_selector_values() {
        // Every value below 24 kept its meaning; 24..27 are pause, resume, requeue, and 27
        // is set_max_in_flight.
        assert_eq!(
            (DRAIN, PAUSE, RESUME, REQUEUE, SET_LIMIT, ALL),
            (23, 24, 25, 26, 27, 28)
        );
        // A value past them is a one-byte no-op.
        assert_eq!(run::<Window>(&[1, ALL, 0, 0, 0]), Ok(vec![(0, 0)]));
    }
}
