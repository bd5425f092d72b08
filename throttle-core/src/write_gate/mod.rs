//! The write gate: one per-bucket write throttle that unifies every reason to hold writes back.
//!
//! A writer asks the gate, per bucket, whether it may send now ([`WriteGate::check`]), how long
//! to wait ([`WriteGate::remaining`]), and when to wake up next ([`WriteGate::poll_timeout`]).
//! The gate learns why to hold back from inputs: disk-write-locked rejections (a jittered
//! exponential backoff), KV backpressure signals (the pressure curve), other retriable write
//! errors (a backoff), and any custom reason registered in [`WriteGateConfig`]. Each bucket
//! keeps one deadline per reason; the bucket opens when the last of them has passed.
//!
//! See [`WriteGate`] for the driving contract and `docs/write-gate.md` for the state diagram.

mod config;
mod heap;

use alloc::vec::Vec;
use core::hash::{BuildHasher, Hash};
use core::time::Duration;

use hashbrown::HashTable;

use crate::backpressure::Signal;
use crate::rng::Rng;
use crate::time::{Clock, Instant, ceil_millis};

pub use config::{DEFAULT_PROBE_TTL, MAX_REASONS, Reason, ReasonSpec, UpdateRule, WriteGateConfig};
use heap::IndexedHeap;

/// The floor of a disk-write-locked backoff: a disk rejection always holds the bucket for at
/// least 1 ms, whatever the configured jitter draws (the Fluss rule `1 ms ≤ initial`).
pub const DISK_WRITE_LOCKED_FLOOR: Duration = Duration::from_millis(1);

/// Whether one bucket may send, as [`WriteGate::check`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GateState {
    /// Send.
    Open,
    /// Hold the bucket's batches until `until` (exactly: it opens when `now ≥ until`);
    /// `reason` is the dominant one (latest deadline, ties to the lower reason index).
    Closed {
        /// The instant the bucket opens, if nothing else changes.
        until: Instant,
        /// The reason whose deadline is `until`.
        reason: Reason,
    },
    /// Closed with no deadline: `reason`'s probe allowance after its backoff is used up. It
    /// opens on [`WriteGate::handle_success`], or when the probe state lapses
    /// ([`ReasonSpec::probe_ttl`] after the bucket opened); a new rejection (an install of a never-shorten
    /// reason, or of a latest-wins reason that has probe mode itself) re-gates it with a
    /// deadline and a fresh allowance. A latest-wins signal without probe mode (KV pressure)
    /// is not a rejection and leaves the used allowance as it is.
    Probing {
        /// The probing reason (the smallest allowance among armed ones; ties to lower index).
        reason: Reason,
    },
    /// The bucket's leader is unknown: refresh metadata first. Reported before any gate
    /// (leader-first), since the refresh sends no data and should overlap the wait.
    UnknownLeader,
}

/// An effect the gate asks for, drained with [`WriteGate::poll_action`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GateAction {
    /// Some bucket's remaining time just decreased: re-evaluate the sender's sleep. `at` is
    /// that bucket's new opening instant (`now + its new remaining time`, so `now` when it
    /// opened outright). Undrained wakes coalesce into one carrying the earliest `at`.
    Wake {
        /// When the bucket whose wait shrank now opens.
        at: Instant,
    },
}

/// Misuse of the gate (nothing changes when it is returned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// The reason was not registered in this gate's configuration.
    #[error("throttle reason {0:?} is not registered with this gate")]
    UnknownReason(Reason),
}

/// Reasons whose deadlines live inline in the slot: the three built-ins (fixed indices).
const BUILTIN: usize = 3;

/// Top bit of a map entry: the bucket's leader is unknown. The other 31 bits are the slot
/// index. Kept in the map entry (not the slot) because `check` reads the entry anyway and the
/// slot has no spare byte: the flag costs no extra cache miss and no memory.
const LEADER_UNKNOWN: u32 = 1 << 31;

/// Buckets' worth of capacity the shrink rule never releases: an emptied gate keeps this much
/// so the next install allocates nothing (a few hundred bytes for small keys).
const MIN_CAPACITY: usize = 16;

/// The slot index of a map entry.
#[inline]
fn slot_of(entry: u32) -> usize {
    (entry & !LEADER_UNKNOWN) as usize
}

/// One bucket's key and built-in deadlines: 32 bytes for a `u64` key, so with the 4-byte map
/// entry and the heap's 16 bytes a gated bucket costs about 60 bytes at a million buckets, and
/// a `check` reads one aligned 32-byte record after the map. A slot exists while the bucket
/// holds a stored deadline, an unknown leader or an armed probe; it is evicted as soon as it
/// holds none of them.
#[derive(Clone, Debug)]
struct Slot<K> {
    key: K,
    /// Deadlines of the built-in reasons, indexed by [`Reason::index`]; `Instant::ZERO` means
    /// none (a stored deadline is always later than the `now` that stored it, so never zero).
    /// Custom reasons' deadlines live in `WriteGate::extra`.
    deadlines: [Instant; BUILTIN],
}

/// Probe state of one bucket, kept (one per slot) only when some reason has probe mode.
#[derive(Clone, Copy, Debug, Default)]
struct Probe {
    /// Bit `r` set: reason `r` (with probe mode) gated this bucket since the last success.
    armed: u64,
    /// Sends counted since the bucket's backoffs expired.
    used: u32,
    /// When the bucket last opened (its latest deadline while one is pending): the probe
    /// state lapses the armed reasons' longest `probe_ttl` after it.
    opened: Instant,
}

fn reason_at(index: usize) -> Option<Reason> {
    // Only indices below the registry length are ever stored, and those fit in u8.
    u8::try_from(index).ok().map(config::reason_from_u8)
}

fn bit(index: usize) -> u64 {
    u32::try_from(index)
        .ok()
        .and_then(|i| 1u64.checked_shl(i))
        .unwrap_or(0)
}

/// The unified per-bucket write throttle (Fluss's `WriteThrottleController`), sans-IO.
///
/// `K` is the caller's bucket type (e.g. a table bucket id); `S` hashes it (pass std's
/// `RandomState` where keys can be influenced remotely).
///
/// # Driving contract
///
/// - **Inputs** (`&mut self`, each takes `now`, clamped so time never runs backwards):
///   [`handle_disk_write_locked`](Self::handle_disk_write_locked),
///   [`handle_retriable_write`](Self::handle_retriable_write),
///   [`handle_kv_signal`](Self::handle_kv_signal), [`handle_throttle`](Self::handle_throttle)
///   (installs; each returns the bucket's remaining time after it),
///   [`handle_leader`](Self::handle_leader), [`handle_send`](Self::handle_send),
///   [`handle_success`](Self::handle_success), and [`handle_timeout`](Self::handle_timeout)
///   (evicts expired gates). Lifecycle: [`begin_close`](Self::begin_close),
///   [`shutdown`](Self::shutdown).
/// - **Queries** (`&self`, expired deadlines read as open, nothing is re-drawn or extended):
///   [`check`](Self::check) (call before draining a bucket), [`remaining`](Self::remaining),
///   [`remaining_ms`](Self::remaining_ms), [`explain`](Self::explain).
/// - **Pollers**: after any input, drain [`poll_action`](Self::poll_action) until `None` (a
///   `Wake` means some bucket opens earlier than before), then sleep until
///   [`poll_timeout`](Self::poll_timeout) (the earliest opening among gated buckets with a
///   known leader, possibly already past) and call `handle_timeout` at that instant.
///
/// Every input and `poll_timeout` costs O(log n) in the number of gated buckets (an indexed
/// 4-ary heap); no input scans the buckets (only `shutdown` does, once). The gate stores at
/// most 2³¹ − 2 buckets (slot indices are 31-bit): past that, an input for a new bucket stores
/// nothing (an install returns zero).
///
/// ```
/// use core::time::Duration;
/// use throttle_core::backpressure::Signal;
/// use throttle_core::rng::SplitMix64;
/// use throttle_core::write_gate::{GateAction, GateState, Reason, WriteGate, WriteGateConfig};
/// use throttle_core::Instant;
/// # #[derive(Default, Clone)] struct H; impl core::hash::BuildHasher for H {
/// #   type Hasher = F; fn build_hasher(&self) -> F { F(0) } }
/// # struct F(u64); impl core::hash::Hasher for F { fn finish(&self) -> u64 { self.0 }
/// #   fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.rotate_left(5) ^ u64::from(*x) } } }
///
/// let mut gate: WriteGate<u32, H> = WriteGate::new(WriteGateConfig::default());
/// let mut rng = SplitMix64::new(1);
/// let t0 = Instant::from_millis(1_000);
///
/// // First disk rejection of a batch (attempt 0): about 1 s, ±20 %.
/// let wait = gate.handle_disk_write_locked(t0, &7, 0, &mut rng);
/// assert!(wait >= Duration::from_millis(800) && wait <= Duration::from_millis(1_200));
/// assert!(matches!(gate.check(t0, &7), GateState::Closed { reason: Reason::DISK_WRITE_LOCKED, .. }));
/// assert_eq!(gate.poll_timeout(), Some(t0 + wait));
///
/// // A KV signal can only lengthen this bucket's wait here, so nothing wakes.
/// gate.handle_kv_signal(t0, &7, Signal::Pressure(100_000));
/// assert_eq!(gate.poll_action(), None);
///
/// gate.handle_timeout(t0 + wait);
/// assert_eq!(gate.check(t0 + wait, &7), GateState::Open);
/// assert!(gate.is_empty());
/// ```
#[derive(Clone, Debug)]
pub struct WriteGate<K, S> {
    cfg: WriteGateConfig,
    hasher: S,
    /// One entry per stored bucket: its slot index (hashed by the key stored in the slot) and
    /// the leader-unknown flag ([`LEADER_UNKNOWN`]).
    index: HashTable<u32>,
    /// Dense: evicting swaps the last slot in.
    slots: Vec<Slot<K>>,
    /// Deadlines of custom reasons (index ≥ 3), `reasons - 3` per slot; empty without them.
    extra: Vec<Instant>,
    /// One per slot when some reason has probe mode; empty otherwise (the default).
    probes: Vec<Probe>,
    /// Whether any registered reason has probe mode (fixed at construction).
    probing: bool,
    /// Custom reasons, i.e. `extra` deadlines per slot (fixed at construction; kept here so
    /// the hot paths need not read the registry).
    stride: usize,
    heap: IndexedHeap,
    clock: Clock,
    wake: Option<Instant>,
    closing: bool,
    shut_down: bool,
}

impl<K, S> WriteGate<K, S>
where
    K: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// A gate with no buckets, hashing keys with `hasher`.
    pub fn with_hasher(cfg: WriteGateConfig, hasher: S) -> Self {
        WriteGate {
            probing: cfg.reasons().iter().any(|r| r.probe_sends().is_some()),
            stride: cfg.reasons().len().saturating_sub(BUILTIN),
            cfg,
            hasher,
            index: HashTable::new(),
            slots: Vec::new(),
            extra: Vec::new(),
            probes: Vec::new(),
            heap: IndexedHeap::default(),
            clock: Clock::default(),
            wake: None,
            closing: false,
            shut_down: false,
        }
    }

    /// A gate with no buckets and a default hasher.
    pub fn new(cfg: WriteGateConfig) -> Self
    where
        S: Default,
    {
        Self::with_hasher(cfg, S::default())
    }

    /// The configuration (reasons and delay sources).
    pub fn config(&self) -> &WriteGateConfig {
        &self.cfg
    }

    // ----------------------------------------------------------------------------- inputs

    /// A write to `bucket` was rejected with `DISK_WRITE_LOCKED`.
    ///
    /// `attempts` is the batch's attempt count **before** it is incremented for this retry
    /// (the first rejection is exponent 0). The delay is
    /// `disk_write_locked.delay_for(attempts, rng)`, at least [`DISK_WRITE_LOCKED_FLOOR`],
    /// installed never-shorten. The gate does not count retries: the sender owns
    /// `max_retries` and installs nothing for a batch it fails. Draws from `rng` exactly once
    /// unless shut down. Returns the bucket's remaining time (zero after [`Self::shutdown`]).
    pub fn handle_disk_write_locked<R: Rng + ?Sized>(
        &mut self,
        now: Instant,
        bucket: &K,
        attempts: u32,
        rng: &mut R,
    ) -> Duration {
        if self.shut_down {
            self.clock.observe(now);
            return Duration::ZERO;
        }
        let delay = self
            .cfg
            .disk_write_locked
            .delay_for(attempts, rng)
            .max(DISK_WRITE_LOCKED_FLOOR);
        self.install(now, bucket, Reason::DISK_WRITE_LOCKED.index(), delay)
    }

    /// A write to `bucket` failed with another retriable error: like
    /// [`Self::handle_disk_write_locked`] with the `retriable_write` backoff and no floor (a
    /// zero delay, e.g. `initial = 0`, installs nothing).
    pub fn handle_retriable_write<R: Rng + ?Sized>(
        &mut self,
        now: Instant,
        bucket: &K,
        attempts: u32,
        rng: &mut R,
    ) -> Duration {
        if self.shut_down {
            self.clock.observe(now);
            return Duration::ZERO;
        }
        let delay = self.cfg.retriable_write.delay_for(attempts, rng);
        self.install(now, bucket, Reason::RETRIABLE_WRITE.index(), delay)
    }

    /// The leader of `bucket` reported KV backpressure `signal`: the throttle becomes
    /// `kv_curve.delay(signal)` from `now`, latest-wins (it may shorten or, on `Clear`, lift
    /// the KV throttle). Ignored while the bucket's leader is unknown (it is the old
    /// leader's word). Returns the bucket's remaining time.
    pub fn handle_kv_signal(&mut self, now: Instant, bucket: &K, signal: Signal) -> Duration {
        let delay = self.cfg.kv_curve.delay(signal);
        self.install(now, bucket, Reason::KV_BACKPRESSURE.index(), delay)
    }

    /// Install `delay` for `reason` (custom or built-in) on `bucket` under that reason's
    /// update rule, exactly as given (no floor, no jitter). Returns the bucket's remaining
    /// time, or [`GateError::UnknownReason`] (nothing changes) for a reason this gate's
    /// configuration did not register.
    pub fn handle_throttle(
        &mut self,
        now: Instant,
        bucket: &K,
        reason: Reason,
        delay: Duration,
    ) -> Result<Duration, GateError> {
        if reason.index() >= self.cfg.reasons().len() {
            return Err(GateError::UnknownReason(reason));
        }
        Ok(self.install(now, bucket, reason.index(), delay))
    }

    /// The leader of `bucket` became unknown (`known == false`) or known again.
    ///
    /// Unknown: the bucket's leader-scoped throttles (KV) are dropped, other gates survive;
    /// it leaves `poll_timeout` and [`Self::check`] reports `UnknownLeader` first. The state
    /// is stored even for an ungated bucket (so `check` can report it) until the leader is
    /// known again, when the bucket rejoins the wake-up computation or, holding nothing
    /// else, is evicted.
    pub fn handle_leader(&mut self, now: Instant, bucket: &K, known: bool) {
        let now = self.clock.observe(now);
        let entry = match (self.find(bucket), known) {
            (Some(e), _) => e,
            (None, true) => return,
            (None, false) => match self.insert(bucket.clone(), LEADER_UNKNOWN) {
                Some(e) => e,
                None => return,
            },
        };
        let i = slot_of(entry);
        self.clean(i, now);
        if known {
            if entry & LEADER_UNKNOWN != 0 {
                self.set_leader_unknown(bucket, i, false);
            }
        } else {
            let before = self.slot_remaining(i, now);
            let mut dropped = 0u64;
            for r in 0..self.cfg.reasons().len() {
                if self
                    .cfg
                    .reasons()
                    .get(r)
                    .is_some_and(|s| s.is_leader_scoped())
                {
                    if let Some(d) = self.deadline_mut(i, r) {
                        *d = Instant::ZERO;
                    }
                    dropped |= bit(r);
                }
            }
            if let Some(p) = self.probes.get_mut(i) {
                p.armed &= !dropped;
            }
            if entry & LEADER_UNKNOWN == 0 {
                self.set_leader_unknown(bucket, i, true);
            }
            let after = self.slot_remaining(i, now);
            if after < before {
                self.push_wake(now + after);
            }
        }
        self.settle(i, !known, now);
    }

    /// A batch was sent to `bucket`. Counted only while probing: the bucket's deadlines have
    /// all passed and a probe-mode reason gated it since the last success.
    pub fn handle_send(&mut self, now: Instant, bucket: &K) {
        let now = self.clock.observe(now);
        let Some(entry) = self.find(bucket) else {
            return;
        };
        let i = slot_of(entry);
        self.clean(i, now);
        let open = self.opening(i) == Instant::ZERO;
        if let Some(p) = self.probes.get_mut(i)
            && p.armed != 0
            && open
        {
            p.used = p.used.saturating_add(1);
        }
        self.settle(i, entry & LEADER_UNKNOWN != 0, now);
    }

    /// A write to `bucket` succeeded: probe mode ends for the bucket (its allowance resets).
    /// Pending deadlines stay: the success may answer a batch sent before the rejection.
    pub fn handle_success(&mut self, now: Instant, bucket: &K) {
        let now = self.clock.observe(now);
        let Some(entry) = self.find(bucket) else {
            return;
        };
        let i = slot_of(entry);
        self.clean(i, now);
        if let Some(p) = self.probes.get_mut(i) {
            *p = Probe::default();
        }
        self.settle(i, entry & LEADER_UNKNOWN != 0, now);
    }

    /// Evict every gate whose deadline has passed (`deadline ≤ now`) and every probe state
    /// that lapsed; a bucket holding nothing else is removed. Shrinks the maps once they are below a quarter of their
    /// capacity. Call it at [`Self::poll_timeout`].
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        // Each round removes the top, so this bound is never reached; it only rules out a loop.
        for _ in 0..self.heap.len() {
            let Some((at, i)) = self.heap.peek() else {
                break;
            };
            if at > now {
                break;
            }
            self.clean(i, now);
            // Only buckets with a known leader are in the heap.
            self.settle(i, false, now);
        }
        self.maybe_shrink();
    }

    /// Graceful close has begun: gates keep being honoured (the close waits for them) and
    /// installs are still accepted.
    pub fn begin_close(&mut self) {
        self.closing = true;
    }

    /// Hard stop: every gate and probe state is cleared and later installs are refused
    /// (they return zero and draw nothing). Leader knowledge is kept. Emits one
    /// `Wake { at }` (the latest `now` seen) if any bucket was gated. Scans the buckets once.
    pub fn shutdown(&mut self) {
        self.shut_down = true;
        let now = self.clock.peek(Instant::ZERO);
        if (0..self.slots.len()).any(|i| self.slot_remaining(i, now) > Duration::ZERO) {
            self.push_wake(now);
        }
        // Keep only the buckets whose leader is unknown, holding nothing else.
        let mut unknown = alloc::vec![false; self.slots.len()];
        for &e in self.index.iter() {
            if e & LEADER_UNKNOWN != 0
                && let Some(u) = unknown.get_mut(slot_of(e))
            {
                *u = true;
            }
        }
        let slots = core::mem::take(&mut self.slots);
        self.index.clear();
        self.extra.clear();
        self.probes.clear();
        self.heap.clear();
        for (slot, keep) in slots.into_iter().zip(unknown) {
            if keep {
                let _ = self.insert(slot.key, LEADER_UNKNOWN);
            }
        }
    }

    // ---------------------------------------------------------------------------- queries

    /// How long `bucket` stays closed: the maximum over its reasons (zero when open).
    pub fn remaining(&self, now: Instant, bucket: &K) -> Duration {
        let now = self.clock.peek(now);
        self.find(bucket)
            .map_or(Duration::ZERO, |e| self.slot_remaining(slot_of(e), now))
    }

    /// [`Self::remaining`] in whole milliseconds, rounded **up**: a closed bucket never
    /// reports 0 ms.
    pub fn remaining_ms(&self, now: Instant, bucket: &K) -> u64 {
        ceil_millis(self.remaining(now, bucket))
    }

    /// Whether `bucket` may send now; leader-first, then the dominant gate, then probing.
    pub fn check(&self, now: Instant, bucket: &K) -> GateState {
        let now = self.clock.peek(now);
        let Some(entry) = self.find(bucket) else {
            return GateState::Open;
        };
        if entry & LEADER_UNKNOWN != 0 {
            return GateState::UnknownLeader;
        }
        let i = slot_of(entry);
        if let Some((reason, until)) = self.dominant(i, now) {
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

    /// The dominant pending reason of `bucket` and its deadline (latest deadline; ties to
    /// the lower reason index), or `None` when no deadline is pending. Ignores the leader
    /// and probe state.
    pub fn explain(&self, now: Instant, bucket: &K) -> Option<(Reason, Instant)> {
        let now = self.clock.peek(now);
        self.dominant(slot_of(self.find(bucket)?), now)
    }

    /// Whether the gate holds `bucket`'s leader as known (the default for any bucket).
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

    /// Whether [`Self::begin_close`] was called.
    pub fn is_closing(&self) -> bool {
        self.closing
    }

    /// Whether [`Self::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down
    }

    // ---------------------------------------------------------------------------- pollers

    /// The next effect to carry out, if any. Drain until `None` after each input.
    pub fn poll_action(&mut self) -> Option<GateAction> {
        self.wake.take().map(|at| GateAction::Wake { at })
    }

    /// The earliest opening among gated buckets whose leader is known, where a probing
    /// bucket's opening is its probe lapse ([`ReasonSpec::probe_ttl`] after its gates
    /// opened): sleep until then and call [`Self::handle_timeout`]. May be in the past (a gate expired but not yet evicted).
    /// `None` when no such bucket is gated. O(1).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.heap.peek().map(|(at, _)| at)
    }

    // ---------------------------------------------------------------------------- helpers

    /// `bucket`'s map entry (slot index and leader flag), comparing keys in the slots.
    #[inline]
    fn find(&self, bucket: &K) -> Option<u32> {
        let hash = self.hasher.hash_one(bucket);
        let slots = &self.slots;
        self.index
            .find(hash, |&e| {
                slots.get(slot_of(e)).is_some_and(|s| s.key == *bucket)
            })
            .copied()
    }

    /// Deadlines per slot kept in `extra` (the custom reasons).
    #[inline]
    fn stride(&self) -> usize {
        self.stride
    }

    /// Slot `i`'s custom deadlines.
    fn extra_of(&self, i: usize) -> &[Instant] {
        let stride = self.stride();
        if stride == 0 {
            return &[];
        }
        let start = i.saturating_mul(stride);
        self.extra
            .get(start..start.saturating_add(stride))
            .unwrap_or(&[])
    }

    /// Slot `i`'s deadlines in reason order (`ZERO` for none).
    #[inline]
    fn deadlines(&self, i: usize) -> impl Iterator<Item = Instant> + '_ {
        let builtin = self.slots.get(i).map_or(&[][..], |s| &s.deadlines[..]);
        builtin.iter().chain(self.extra_of(i)).copied()
    }

    fn deadline_mut(&mut self, i: usize, r: usize) -> Option<&mut Instant> {
        if r < BUILTIN {
            return self.slots.get_mut(i)?.deadlines.get_mut(r);
        }
        let at = i
            .checked_mul(self.stride())?
            .checked_add(r.checked_sub(BUILTIN)?)?;
        self.extra.get_mut(at)
    }

    /// The latest stored deadline of slot `i` (`ZERO` when none).
    #[inline]
    fn opening(&self, i: usize) -> Instant {
        self.deadlines(i).max().unwrap_or(Instant::ZERO)
    }

    /// Max over reasons of the time left; expired deadlines count as zero.
    #[inline]
    fn slot_remaining(&self, i: usize, now: Instant) -> Duration {
        self.opening(i).saturating_duration_since(now)
    }

    /// The pending reason with the latest deadline; ties go to the lower index.
    #[inline]
    fn dominant(&self, i: usize, now: Instant) -> Option<(Reason, Instant)> {
        // The built-in reasons first, unrolled over the fixed-size array (the common gate has
        // no custom reason, and `check` is its hot path); ties keep the lower index.
        let (mut best_r, mut best) = (0, Instant::ZERO);
        if let Some(s) = self.slots.get(i) {
            for (r, &d) in s.deadlines.iter().enumerate() {
                if d > best {
                    (best_r, best) = (r, d);
                }
            }
        }
        for (r, &d) in self.extra_of(i).iter().enumerate() {
            if d > best {
                (best_r, best) = (BUILTIN + r, d);
            }
        }
        // The latest deadline is pending iff any is: a pending reason's deadline exceeds
        // `now`, so the maximum does too.
        if best > now {
            Some((reason_at(best_r)?, best))
        } else {
            None
        }
    }

    /// Forget slot `i`'s deadlines that have passed (so stored deadlines were all pending at
    /// the last input that touched the bucket).
    fn clean(&mut self, i: usize, now: Instant) {
        let clear = |d: &mut Instant| {
            if *d <= now {
                *d = Instant::ZERO;
            }
        };
        if let Some(s) = self.slots.get_mut(i) {
            s.deadlines.iter_mut().for_each(clear);
        }
        let stride = self.stride();
        if stride > 0 {
            let start = i.saturating_mul(stride);
            if let Some(e) = self.extra.get_mut(start..start.saturating_add(stride)) {
                e.iter_mut().for_each(clear);
            }
        }
        self.lapse_probe(i, now);
    }

    fn probe(&self, i: usize) -> Probe {
        self.probes.get(i).copied().unwrap_or_default()
    }

    /// The armed probe reason with the smallest allowance (ties to the lower index).
    fn probe_limit(&self, armed: u64) -> Option<(Reason, u32)> {
        if armed == 0 {
            return None;
        }
        let mut best: Option<(usize, u32)> = None;
        for (r, spec) in self.cfg.reasons().iter().enumerate() {
            let Some(n) = spec.probe_sends() else {
                continue;
            };
            if armed & bit(r) != 0 && best.is_none_or(|(_, b)| n < b) {
                best = Some((r, n));
            }
        }
        best.and_then(|(r, n)| Some((reason_at(r)?, n)))
    }

    /// Store a new bucket with nothing gated; returns its map entry. `None` (nothing stored)
    /// once [`heap::MAX_SLOTS`]` - 1` buckets are stored: slot indices must fit in 31 bits.
    fn insert(&mut self, key: K, flag: u32) -> Option<u32> {
        let i = self.slots.len();
        if i >= heap::MAX_SLOTS - 1 {
            return None;
        }
        let entry = (i as u32) | flag;
        let hash = self.hasher.hash_one(&key);
        self.slots.push(Slot {
            key,
            deadlines: [Instant::ZERO; BUILTIN],
        });
        let stride = self.stride();
        self.extra
            .extend(core::iter::repeat_n(Instant::ZERO, stride));
        if self.probing {
            self.probes.push(Probe::default());
        }
        self.heap.add_slot();
        let (hasher, slots) = (&self.hasher, &self.slots);
        self.index.insert_unique(hash, entry, |&e| {
            slots.get(slot_of(e)).map_or(0, |s| hasher.hash_one(&s.key))
        });
        Some(entry)
    }

    /// Set or clear the leader-unknown flag of slot `i` (whose key is `bucket`).
    fn set_leader_unknown(&mut self, bucket: &K, i: usize, unknown: bool) {
        let hash = self.hasher.hash_one(bucket);
        if let Some(e) = self.index.find_mut(hash, |&e| slot_of(e) == i) {
            *e = if unknown {
                *e | LEADER_UNKNOWN
            } else {
                *e & !LEADER_UNKNOWN
            };
        }
    }

    fn push_wake(&mut self, at: Instant) {
        self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
    }

    /// The one install path every reason shares: clamp time, apply the reason's rule, arm
    /// probes, wake if the bucket's remaining time fell, and settle the heap.
    fn install(&mut self, now: Instant, bucket: &K, r: usize, delay: Duration) -> Duration {
        let now = self.clock.observe(now);
        if self.shut_down {
            return Duration::ZERO;
        }
        let Some(&spec) = self.cfg.reasons().get(r) else {
            return Duration::ZERO;
        };
        let candidate = now + delay;
        let pending = candidate > now;
        let entry = match self.find(bucket) {
            Some(e) => e,
            None if pending => match self.insert(bucket.clone(), 0) {
                Some(e) => e,
                None => return Duration::ZERO,
            },
            // Nothing stored and nothing to store: an absent bucket stays absent.
            None => return Duration::ZERO,
        };
        let (i, unknown) = (slot_of(entry), entry & LEADER_UNKNOWN != 0);
        self.clean(i, now);
        let before = self.slot_remaining(i, now);
        let ignored = spec.is_leader_scoped() && unknown;
        if let (false, Some(d)) = (ignored, self.deadline_mut(i, r)) {
            match spec.rule() {
                UpdateRule::NeverShorten => {
                    if pending && candidate > *d {
                        *d = candidate;
                    }
                }
                UpdateRule::LatestWins => *d = if pending { candidate } else { Instant::ZERO },
            }
            if let Some(p) = self.probes.get_mut(i) {
                if pending {
                    // Only a new rejection re-gates (`docs/design.md` §3.3): a never-shorten
                    // install is one, and a latest-wins reason with probe mode re-gates its own
                    // probe. A latest-wins signal without probe mode (KV pressure, carried by
                    // accepted writes) is no rejection: it leaves the allowance as it is.
                    if spec.rule() == UpdateRule::NeverShorten || spec.probe_sends().is_some() {
                        p.used = 0;
                    }
                    if spec.probe_sends().is_some() {
                        p.armed |= bit(r);
                    }
                } else if spec.rule() == UpdateRule::LatestWins {
                    p.armed &= !bit(r);
                }
            }
        }
        let after = self.slot_remaining(i, now);
        if after < before {
            self.push_wake(now + after);
        }
        self.settle(i, unknown, now);
        after
    }

    /// Restore slot `i`'s invariants after a change at `now` (after [`Self::clean`]): note
    /// when the bucket opened and lapse its probe state past the ttl; in the heap iff its
    /// leader is known and it holds a deadline (keyed by its opening) or a live probe state
    /// (keyed by the lapse: the instant it turns from `Probing` to `Open`); evicted when it
    /// holds nothing.
    fn settle(&mut self, i: usize, leader_unknown: bool, now: Instant) {
        let opening = self.opening(i);
        if let Some(p) = self.probes.get_mut(i) {
            // Pending: it opens at `opening`. Not pending: it opened when the last deadline
            // passed (already noted) or now, if an input just lifted a later one.
            p.opened = if opening != Instant::ZERO {
                opening
            } else {
                p.opened.min(now)
            };
        }
        self.lapse_probe(i, now);
        if !leader_unknown {
            if opening != Instant::ZERO {
                self.heap.set(i, opening);
                return;
            }
            if let Some(lapse) = self.probe_lapse(i) {
                self.heap.set(i, lapse);
                return;
            }
        }
        self.heap.remove(i);
        if !leader_unknown && self.probe(i).armed == 0 {
            self.evict(i);
        }
    }

    /// When slot `i`'s probe state lapses (`None` when no probe is armed).
    fn probe_lapse(&self, i: usize) -> Option<Instant> {
        let p = self.probes.get(i)?;
        if p.armed == 0 {
            return None;
        }
        let ttl = self
            .cfg
            .reasons()
            .iter()
            .enumerate()
            .filter(|(r, _)| p.armed & bit(*r) != 0)
            .map(|(_, spec)| spec.probe_time_to_live())
            .max()
            .unwrap_or(Duration::ZERO);
        Some(p.opened + ttl)
    }

    /// End slot `i`'s probe state if it lapsed by `now` (only while no deadline is pending).
    fn lapse_probe(&mut self, i: usize, now: Instant) {
        if self.opening(i) == Instant::ZERO
            && self.probe_lapse(i).is_some_and(|l| l <= now)
            && let Some(p) = self.probes.get_mut(i)
        {
            *p = Probe::default();
        }
    }

    /// Remove slot `i` (from the heap too), keeping the slot vector dense: the last slot moves
    /// into `i`, and its map entry, custom deadlines, probe state and heap item follow.
    fn evict(&mut self, i: usize) {
        let Some(last) = self.slots.len().checked_sub(1) else {
            return;
        };
        let Some(gone) = self.slots.get(i) else {
            return;
        };
        // Entries are found by slot index, so no key is compared.
        let hash = self.hasher.hash_one(&gone.key);
        if let Ok(e) = self.index.find_entry(hash, |&e| slot_of(e) == i) {
            e.remove();
        }
        if i != last
            && let Some(moved) = self.slots.get(last)
        {
            let hash = self.hasher.hash_one(&moved.key);
            if let Some(e) = self.index.find_mut(hash, |&e| slot_of(e) == last) {
                *e = (*e & LEADER_UNKNOWN) | i as u32;
            }
        }
        self.slots.swap_remove(i);
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
    fn maybe_shrink(&mut self) {
        let len = self.slots.len();
        let target = len.saturating_mul(2).max(MIN_CAPACITY);
        if len < self.index.capacity() / 4 {
            let (hasher, slots) = (&self.hasher, &self.slots);
            self.index.shrink_to(target, |&e| {
                slots.get(slot_of(e)).map_or(0, |s| hasher.hash_one(&s.key))
            });
        }
        let mut slots_target = None;
        if len < self.slots.capacity() / 4 {
            self.slots.shrink_to(target);
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

    /// Internal consistency (map ↔ slots ↔ heap), for the model checker.
    #[cfg(any(test, feature = "model"))]
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let n = self.slots.len();
        if self.index.len() != n || self.heap.slots() != n {
            return Err("map, slot vector and heap positions differ in length");
        }
        if self.extra.len() != n.saturating_mul(self.stride()) {
            return Err("custom deadlines do not match the slots and the registry");
        }
        if self.probes.len() != if self.probing { n } else { 0 } {
            return Err("probe state does not match the slots");
        }
        for (i, slot) in self.slots.iter().enumerate() {
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
            if let (true, Some(key)) = (wanted, key)
                && self.heap.position(i).and_then(|p| self.heap.get(p)) != Some((key, i))
            {
                return Err("heap item does not match the bucket's opening");
            }
            if self.shut_down && opening != Instant::ZERO {
                return Err("a gate survived shutdown");
            }
        }
        if !self.heap.is_consistent() {
            return Err("heap order or positions broken");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::backoff::BackoffConfig;
    use crate::backpressure::ThrottleCurve;
    use crate::rng::SplitMix64;
    use core::cell::Cell;
    use std::collections::hash_map::RandomState;
    use std::rc::Rc;

    type Gate = WriteGate<u32, RandomState>;

    const DISK: Reason = Reason::DISK_WRITE_LOCKED;
    const KV: Reason = Reason::KV_BACKPRESSURE;
    const RETRY: Reason = Reason::RETRIABLE_WRITE;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn at(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    fn gate() -> Gate {
        let mut cfg = WriteGateConfig::default();
        cfg.kv_curve = ThrottleCurve::fluss_landed();
        Gate::new(cfg)
    }

    fn install(g: &mut Gate, now: Instant, b: u32, r: Reason, d: Duration) -> Duration {
        let got = g.handle_throttle(now, &b, r, d);
        assert!(g.check_invariants().is_ok(), "{:?}", g.check_invariants());
        got.unwrap_or(Duration::MAX)
    }

    fn drain(g: &mut Gate) -> Option<GateAction> {
        let first = g.poll_action();
        assert_eq!(g.poll_action(), None, "wakes coalesce into one action");
        first
    }

    #[test]
    fn disk_install_uses_attempts_before_increment_and_the_preset() {
        let mut g = gate();
        let cfg = BackoffConfig::fluss_disk_write_locked();
        let mut expect = SplitMix64::new(5);
        let mut rng = SplitMix64::new(5);
        // First rejection: exponent 0, i.e. the 1 s initial backoff ±20 %.
        let want0 = cfg.delay_for(0, &mut expect);
        assert!(want0 >= ms(800) && want0 <= ms(1_200), "{want0:?}");
        assert_eq!(g.handle_disk_write_locked(at(0), &1, 0, &mut rng), want0);
        assert_eq!(
            g.check(at(0), &1),
            GateState::Closed {
                until: at(0) + want0,
                reason: DISK
            }
        );
        // Third attempt of another bucket: exponent 2 (4 s ±20 %).
        let want2 = cfg.delay_for(2, &mut expect);
        assert_eq!(g.handle_disk_write_locked(at(0), &2, 2, &mut rng), want2);
        assert!(want2 >= ms(3_200) && want2 <= ms(4_800), "{want2:?}");
        assert_eq!(rng, expect, "exactly one draw per install");
    }

    #[test]
    fn disk_install_never_goes_below_the_one_ms_floor() {
        // Whatever the backoff draws, a disk rejection holds the bucket at least 1 ms.
        let mut g = gate();
        let mut rng = SplitMix64::new(1);
        let got = g.handle_disk_write_locked(at(0), &1, 0, &mut rng);
        assert!(got >= DISK_WRITE_LOCKED_FLOOR);
        assert!(
            g.check(
                at(0) + DISK_WRITE_LOCKED_FLOOR - Duration::from_nanos(1),
                &1
            ) != GateState::Open
        );
    }

    #[test]
    fn bucket_is_closed_one_ns_before_its_deadline_and_open_at_it() {
        let mut g = gate();
        install(&mut g, at(0), 1, DISK, ms(1_000));
        let deadline = at(1_000);
        let just_before = deadline - Duration::from_nanos(1);
        assert_eq!(
            g.check(just_before, &1),
            GateState::Closed {
                until: deadline,
                reason: DISK
            }
        );
        assert_eq!(g.remaining(just_before, &1), Duration::from_nanos(1));
        assert_eq!(
            g.remaining_ms(just_before, &1),
            1,
            "a closed gate never reports 0 ms"
        );
        assert_eq!(g.check(deadline, &1), GateState::Open);
        assert_eq!(g.remaining(deadline, &1), Duration::ZERO);
        assert_eq!(g.remaining_ms(deadline, &1), 0);
    }

    #[test]
    fn remaining_ms_rounds_up() {
        let mut g = gate();
        install(&mut g, at(0), 1, RETRY, Duration::from_nanos(1_000_001));
        assert_eq!(g.remaining_ms(at(0), &1), 2);
        assert_eq!(g.remaining_ms(Instant::from_nanos(1_000_000), &1), 1);
    }

    #[test]
    fn repeated_reads_neither_redraw_nor_extend() {
        let mut g = gate();
        let mut rng = SplitMix64::new(11);
        let d = g.handle_disk_write_locked(at(0), &1, 3, &mut rng);
        let snapshot = (g.poll_timeout(), g.explain(at(0), &1));
        for step in 0..50u64 {
            let now = at(step * 10);
            assert_eq!(g.remaining(now, &1), d.saturating_sub(ms(step * 10)));
            assert_eq!(
                g.check(now, &1),
                GateState::Closed {
                    until: at(0) + d,
                    reason: DISK
                }
            );
        }
        assert_eq!((g.poll_timeout(), g.explain(at(0), &1)), snapshot);
    }

    #[test]
    fn shorter_backoff_never_shortens_pending_gate() {
        let mut g = gate();
        assert_eq!(install(&mut g, at(0), 1, DISK, ms(8_000)), ms(8_000));
        // A later, shorter install keeps the pending 8 s and reports what is left of it.
        assert_eq!(install(&mut g, at(1_000), 1, DISK, ms(1_000)), ms(7_000));
        assert_eq!(
            g.check(at(1_000), &1),
            GateState::Closed {
                until: at(8_000),
                reason: DISK
            }
        );
        // A longer one extends it.
        assert_eq!(install(&mut g, at(2_000), 1, DISK, ms(9_000)), ms(9_000));
        assert_eq!(g.poll_timeout(), Some(at(11_000)));
        assert_eq!(drain(&mut g), None, "never-shorten installs never wake");
    }

    #[test]
    fn kv_signal_latest_wins_shortens_and_clears() {
        let mut g = gate();
        assert_eq!(g.handle_kv_signal(at(0), &1, Signal::Full), ms(3_000));
        assert_eq!(drain(&mut g), None);
        // p = 0.1 under the landed curve (k = 2, 3000 ms): 3000 · 0.01 = 30 ms.
        assert_eq!(
            g.handle_kv_signal(at(100), &1, Signal::Pressure(100_000)),
            ms(30)
        );
        assert_eq!(drain(&mut g), Some(GateAction::Wake { at: at(130) }));
        assert_eq!(
            g.poll_timeout(),
            Some(at(130)),
            "the heap item re-sifted in place"
        );
        assert_eq!(
            g.handle_kv_signal(at(110), &1, Signal::Clear),
            Duration::ZERO
        );
        assert_eq!(drain(&mut g), Some(GateAction::Wake { at: at(110) }));
        assert_eq!(g.check(at(110), &1), GateState::Open);
        assert!(
            g.is_empty(),
            "a cleared bucket holding nothing is evicted at once"
        );
    }

    /// The issue's scenario: a 1000 ms disk gate plus a 2000 ms retry gate. KV Full (3000 ms)
    /// raises the remaining time: no wake; KV 30 ms lowers it from 3000 to 2000 ms (the retry
    /// gate): wake; KV clear leaves it at 2000 ms: no wake.
    #[test]
    fn remaining_is_max_across_reasons_and_wakes_only_when_it_decreases() {
        let mut g = gate();
        assert_eq!(g.config().kv_curve.delay(Signal::Full), ms(3_000));
        assert_eq!(g.config().kv_curve.delay(Signal::Pressure(100_000)), ms(30));
        let t0 = at(10_000);
        install(&mut g, t0, 7, DISK, ms(1_000));
        install(&mut g, t0, 7, RETRY, ms(2_000));
        assert_eq!(g.remaining(t0, &7), ms(2_000));
        assert_eq!(g.explain(t0, &7), Some((RETRY, t0 + ms(2_000))));
        drain(&mut g);

        assert_eq!(g.handle_kv_signal(t0, &7, Signal::Full), ms(3_000));
        assert_eq!(drain(&mut g), None, "KV Full at 3000 ms does not wake");
        assert_eq!(
            g.check(t0, &7),
            GateState::Closed {
                until: t0 + ms(3_000),
                reason: KV
            }
        );

        assert_eq!(
            g.handle_kv_signal(t0, &7, Signal::Pressure(100_000)),
            ms(2_000)
        );
        assert_eq!(
            drain(&mut g),
            Some(GateAction::Wake { at: t0 + ms(2_000) }),
            "KV 30 ms then does (3000 -> 2000 ms)"
        );
        assert_eq!(g.handle_kv_signal(t0, &7, Signal::Clear), ms(2_000));
        assert_eq!(drain(&mut g), None, "KV clear does not (2000 -> 2000 ms)");
        assert_eq!(g.poll_timeout(), Some(t0 + ms(2_000)));
    }

    #[test]
    fn shorter_kv_signal_under_longer_disk_gate_changes_nothing() {
        let mut g = gate();
        install(&mut g, at(0), 1, DISK, ms(5_000));
        g.handle_kv_signal(at(0), &1, Signal::Full);
        assert_eq!(
            g.handle_kv_signal(at(10), &1, Signal::Pressure(100_000)),
            ms(4_990)
        );
        assert_eq!(drain(&mut g), None);
        assert_eq!(g.poll_timeout(), Some(at(5_000)));
    }

    #[test]
    fn wakes_coalesce_to_the_earliest_opening_until_drained() {
        let mut g = gate();
        g.handle_kv_signal(at(0), &1, Signal::Full);
        g.handle_kv_signal(at(0), &2, Signal::Full);
        g.handle_kv_signal(at(0), &1, Signal::Pressure(100_000));
        g.handle_kv_signal(at(0), &2, Signal::Clear);
        assert_eq!(drain(&mut g), Some(GateAction::Wake { at: at(0) }));
    }

    #[test]
    fn explain_names_the_dominant_reason_and_ties_go_to_the_lower_index() {
        let mut g = gate();
        assert_eq!(g.explain(at(0), &1), None);
        install(&mut g, at(0), 1, RETRY, ms(500));
        install(&mut g, at(0), 1, DISK, ms(500));
        install(&mut g, at(0), 1, KV, ms(500));
        assert_eq!(g.explain(at(0), &1), Some((DISK, at(500))));
        install(&mut g, at(0), 1, KV, ms(501));
        assert_eq!(g.explain(at(0), &1), Some((KV, at(501))));
        assert_eq!(
            g.explain(at(501), &1),
            None,
            "expired reasons are not explained"
        );
    }

    #[test]
    fn poll_timeout_is_the_earliest_opening_among_known_leader_buckets() {
        let mut g = gate();
        assert_eq!(g.poll_timeout(), None);
        install(&mut g, at(0), 1, DISK, ms(300));
        install(&mut g, at(0), 2, DISK, ms(100));
        install(&mut g, at(0), 3, RETRY, ms(200));
        assert_eq!(g.poll_timeout(), Some(at(100)));
        g.handle_leader(at(0), &2, false);
        assert_eq!(
            g.poll_timeout(),
            Some(at(200)),
            "an unknown leader leaves the wake-ups"
        );
        g.handle_timeout(at(200));
        assert_eq!(g.poll_timeout(), Some(at(300)));
        g.handle_leader(at(50), &2, true);
        assert_eq!(
            g.poll_timeout(),
            Some(at(300)),
            "bucket 2 had expired when it rejoined"
        );
        assert_eq!(g.len(), 1);
    }

    #[test]
    fn unknown_leader_is_reported_first_and_drops_only_kv() {
        let mut g = gate();
        install(&mut g, at(0), 1, DISK, ms(1_000));
        g.handle_kv_signal(at(0), &1, Signal::Full);
        drain(&mut g);
        g.handle_leader(at(0), &1, false);
        assert_eq!(
            g.check(at(0), &1),
            GateState::UnknownLeader,
            "leader-first even while gated"
        );
        assert_eq!(
            g.remaining(at(0), &1),
            ms(1_000),
            "the disk gate survives the leader move"
        );
        assert_eq!(
            drain(&mut g),
            Some(GateAction::Wake { at: at(1_000) }),
            "3000 -> 1000 ms"
        );
        assert_eq!(g.poll_timeout(), None);
        assert_eq!(
            g.handle_kv_signal(at(10), &1, Signal::Full),
            ms(990),
            "old leader's word ignored"
        );
        g.handle_leader(at(20), &1, true);
        assert_eq!(
            g.check(at(20), &1),
            GateState::Closed {
                until: at(1_000),
                reason: DISK
            }
        );
        assert_eq!(
            g.poll_timeout(),
            Some(at(1_000)),
            "rejoined the wake-up computation"
        );
        assert!(g.check_invariants().is_ok());
    }

    #[test]
    fn unknown_leader_of_an_ungated_bucket_is_stored_until_known_again() {
        let mut g = gate();
        g.handle_leader(at(0), &9, true);
        assert!(
            g.is_empty(),
            "a known leader is the default and stores nothing"
        );
        g.handle_leader(at(0), &9, false);
        assert_eq!(g.check(at(0), &9), GateState::UnknownLeader);
        assert!(!g.is_leader_known(&9));
        assert_eq!(g.len(), 1);
        g.handle_timeout(at(1_000_000));
        assert_eq!(
            g.check(at(1_000_000), &9),
            GateState::UnknownLeader,
            "no deadline to expire"
        );
        g.handle_leader(at(1_000_000), &9, true);
        assert!(g.is_empty(), "evicted once known again");
        assert_eq!(g.check(at(1_000_000), &9), GateState::Open);
    }

    fn probing_gate(disk_probes: u32) -> Gate {
        let mut cfg = WriteGateConfig::default();
        assert!(cfg.set_probe(DISK, Some(disk_probes)).is_ok());
        Gate::new(cfg)
    }

    #[test]
    fn probe_mode_allows_n_sends_after_the_backoff_then_closes() {
        let mut g = probing_gate(2);
        install(&mut g, at(0), 1, DISK, ms(100));
        g.handle_send(at(50), &1); // a send while gated is not a probe
        assert_eq!(g.check(at(100), &1), GateState::Open);
        g.handle_send(at(100), &1);
        assert_eq!(
            g.check(at(100), &1),
            GateState::Open,
            "one of two probes used"
        );
        g.handle_send(at(101), &1);
        assert_eq!(g.check(at(101), &1), GateState::Probing { reason: DISK });
        g.handle_timeout(at(10_000));
        assert_eq!(
            g.check(at(10_000), &1),
            GateState::Probing { reason: DISK },
            "no deadline to expire"
        );
        assert_eq!(
            g.poll_timeout(),
            Some(at(100) + DEFAULT_PROBE_TTL),
            "the probe state's lapse is the next change"
        );
        assert_eq!(g.len(), 1);
    }

    #[test]
    fn an_unanswered_probe_state_lapses_ttl_after_the_bucket_opened_and_is_evicted() {
        let mut g = probing_gate(1);
        for b in 0..50 {
            install(&mut g, at(0), b, DISK, ms(5));
        }
        g.handle_send(at(5), &0);
        assert_eq!(g.check(at(5), &0), GateState::Probing { reason: DISK });
        let lapse = at(5) + DEFAULT_PROBE_TTL;
        g.handle_timeout(at(5));
        assert_eq!(g.poll_timeout(), Some(lapse));
        assert_eq!(g.len(), 50, "probe states outlive the backoff");
        let just_before = lapse - Duration::from_nanos(1);
        assert_eq!(
            g.check(just_before, &0),
            GateState::Probing { reason: DISK }
        );
        assert_eq!(g.check(lapse, &0), GateState::Open, "lapsed reads open");
        g.handle_timeout(lapse);
        assert!(
            g.is_empty(),
            "every gate and probe state lapsed: no entries"
        );
        assert_eq!(g.poll_timeout(), None);
        assert!(g.check_invariants().is_ok());
    }

    #[test]
    fn success_ends_probe_mode() {
        let mut g = probing_gate(1);
        install(&mut g, at(0), 1, DISK, ms(100));
        g.handle_send(at(100), &1);
        assert_eq!(g.check(at(100), &1), GateState::Probing { reason: DISK });
        g.handle_success(at(120), &1);
        assert_eq!(g.check(at(120), &1), GateState::Open);
        g.handle_send(at(130), &1);
        assert_eq!(
            g.check(at(130), &1),
            GateState::Open,
            "no probe limit after success"
        );
        assert!(g.is_empty());
    }

    #[test]
    fn new_rejection_regates_a_probing_bucket_with_a_fresh_allowance() {
        let mut g = probing_gate(1);
        install(&mut g, at(0), 1, DISK, ms(100));
        g.handle_send(at(100), &1);
        assert_eq!(g.check(at(100), &1), GateState::Probing { reason: DISK });
        install(&mut g, at(150), 1, DISK, ms(100));
        assert_eq!(
            g.check(at(150), &1),
            GateState::Closed {
                until: at(250),
                reason: DISK
            }
        );
        assert_eq!(
            g.check(at(250), &1),
            GateState::Open,
            "fresh allowance after the new backoff"
        );
        g.handle_send(at(250), &1);
        assert_eq!(g.check(at(250), &1), GateState::Probing { reason: DISK });
    }

    #[test]
    fn kv_pressure_does_not_reopen_a_used_disk_probe_allowance() {
        let mut g = probing_gate(1);
        install(&mut g, at(0), 1, DISK, ms(100));
        g.handle_send(at(100), &1);
        assert_eq!(g.check(at(100), &1), GateState::Probing { reason: DISK });
        // Default curve: 5000 ms · 0.1³ = 5 ms. The signal rides on an accepted write: no
        // rejection, no success, so the disk allowance stays used.
        assert_eq!(
            g.handle_kv_signal(at(100), &1, Signal::Pressure(100_000)),
            ms(5)
        );
        assert_eq!(g.check(at(200), &1), GateState::Probing { reason: DISK });
        g.handle_send(at(200), &1);
        assert_eq!(g.check(at(200), &1), GateState::Probing { reason: DISK });
    }

    #[test]
    fn a_retriable_rejection_regates_and_refreshes_the_probe_allowance() {
        let mut g = probing_gate(1);
        install(&mut g, at(0), 1, DISK, ms(100));
        g.handle_send(at(100), &1);
        assert_eq!(g.check(at(100), &1), GateState::Probing { reason: DISK });
        install(&mut g, at(110), 1, RETRY, ms(10));
        assert_eq!(
            g.check(at(120), &1),
            GateState::Open,
            "a rejection re-gates: fresh allowance"
        );
    }

    #[test]
    fn two_custom_reasons_with_different_rules_need_no_read_side_change() {
        let mut cfg = WriteGateConfig::default();
        let quota = cfg.register(ReasonSpec::new("quota", UpdateRule::LatestWins));
        let retry_after = cfg.register(ReasonSpec::new("retry-after", UpdateRule::NeverShorten));
        let (Ok(quota), Ok(retry_after)) = (quota, retry_after) else {
            panic!("registration refused");
        };
        assert_eq!((quota.index(), retry_after.index()), (3, 4));
        let mut g = Gate::new(cfg);
        install(&mut g, at(0), 1, quota, ms(500));
        install(&mut g, at(0), 1, quota, ms(100));
        assert_eq!(
            g.check(at(0), &1),
            GateState::Closed {
                until: at(100),
                reason: quota
            }
        );
        install(&mut g, at(0), 2, retry_after, ms(500));
        install(&mut g, at(0), 2, retry_after, ms(100));
        assert_eq!(
            g.check(at(0), &2),
            GateState::Closed {
                until: at(500),
                reason: retry_after
            }
        );
        assert_eq!(g.poll_timeout(), Some(at(100)));
        assert_eq!(g.remaining(at(0), &2), ms(500));
    }

    #[test]
    fn unregistered_reason_is_an_error_and_changes_nothing() {
        let mut g = gate();
        let mut other = WriteGateConfig::default();
        let Ok(foreign) = other.register(ReasonSpec::new("x", UpdateRule::LatestWins)) else {
            panic!("registration refused");
        };
        assert_eq!(
            g.handle_throttle(at(0), &1, foreign, ms(5)),
            Err(GateError::UnknownReason(foreign))
        );
        assert!(g.is_empty());
    }

    #[test]
    fn config_refuses_a_zero_probe_allowance_and_too_many_reasons() {
        let mut cfg = WriteGateConfig::default();
        assert!(matches!(
            cfg.set_probe(DISK, Some(0)),
            Err(crate::ConfigError::OutOfRange { .. })
        ));
        let spec = ReasonSpec::new("p", UpdateRule::NeverShorten).probe(Some(0));
        assert!(cfg.register(spec).is_err());
        for _ in 3..MAX_REASONS {
            assert!(
                cfg.register(ReasonSpec::new("r", UpdateRule::NeverShorten))
                    .is_ok()
            );
        }
        assert!(
            cfg.register(ReasonSpec::new("r", UpdateRule::NeverShorten))
                .is_err()
        );
        assert_eq!(cfg.reasons().len(), MAX_REASONS);
        assert!(cfg.validate().is_ok());
    }

    #[test]
    fn shutdown_refuses_installs_and_returns_zero() {
        let mut g = gate();
        let mut rng = SplitMix64::new(3);
        install(&mut g, at(0), 1, DISK, ms(1_000));
        g.handle_leader(at(0), &2, false);
        drain(&mut g);
        g.shutdown();
        assert!(g.is_shut_down());
        assert_eq!(
            drain(&mut g),
            Some(GateAction::Wake { at: at(0) }),
            "bucket 1 opened"
        );
        assert_eq!(g.check(at(0), &1), GateState::Open, "backoffs cleared");
        assert_eq!(
            g.check(at(0), &2),
            GateState::UnknownLeader,
            "leader knowledge kept"
        );
        let before = rng.clone();
        assert_eq!(
            g.handle_disk_write_locked(at(1), &1, 0, &mut rng),
            Duration::ZERO
        );
        assert_eq!(rng, before, "a refused install draws nothing");
        assert_eq!(g.handle_kv_signal(at(1), &1, Signal::Full), Duration::ZERO);
        assert_eq!(install(&mut g, at(1), 1, RETRY, ms(5)), Duration::ZERO);
        assert_eq!(g.poll_timeout(), None);
        assert_eq!(g.len(), 1);
        assert!(g.check_invariants().is_ok());
    }

    #[test]
    fn begin_close_keeps_honouring_gates() {
        let mut g = gate();
        install(&mut g, at(0), 1, DISK, ms(1_000));
        g.begin_close();
        assert!(g.is_closing());
        assert_eq!(
            g.check(at(10), &1),
            GateState::Closed {
                until: at(1_000),
                reason: DISK
            }
        );
        assert_eq!(
            install(&mut g, at(10), 2, DISK, ms(10)),
            ms(10),
            "still accepted"
        );
        assert_eq!(g.poll_timeout(), Some(at(20)));
    }

    #[test]
    fn handle_timeout_evicts_expired_gates_and_empties_the_maps() {
        let mut g = gate();
        // Enough buckets (even under miri) that the 16-bucket floor is below a quarter.
        let n = if cfg!(miri) { 200 } else { 1_000u32 };
        for b in 0..n {
            install(&mut g, at(0), b, DISK, ms(1 + u64::from(b * 7 % 97)));
        }
        let cap = g.index.capacity();
        g.handle_timeout(at(50));
        assert!(g.len() < n as usize && !g.is_empty());
        assert!(
            g.poll_timeout().is_some_and(|t| t > at(50)),
            "no expired gate survives"
        );
        g.handle_timeout(at(97));
        assert!(g.is_empty());
        assert_eq!((g.slots.len(), g.index.len(), g.gated_len()), (0, 0, 0));
        assert!(
            g.index.capacity() < cap / 4,
            "the map shrank: {} of {cap}",
            g.index.capacity()
        );
        assert_eq!(g.poll_timeout(), None);
    }

    #[test]
    fn an_emptied_gate_keeps_a_floor_capacity_for_the_next_install() {
        let mut g = gate();
        install(&mut g, at(0), 1, RETRY, ms(5));
        g.handle_timeout(at(10));
        assert!(g.is_empty());
        // Freeing everything at zero entries would re-allocate on the next install.
        assert!(g.index.capacity() >= 1 && g.slots.capacity() >= 1);
        assert!(g.heap.capacity() >= 1);
        let n = 200u32;
        for b in 0..n {
            install(&mut g, at(10), b, RETRY, ms(5));
        }
        g.handle_timeout(at(20));
        assert!(g.is_empty());
        assert!(
            g.index.capacity() >= MIN_CAPACITY && g.index.capacity() < 2 * MIN_CAPACITY,
            "shrunk to the floor, not to zero: {}",
            g.index.capacity()
        );
        assert!(g.slots.capacity() >= MIN_CAPACITY && g.slots.capacity() < n as usize);
        assert!(g.heap.capacity() >= MIN_CAPACITY && g.heap.capacity() < n as usize);
    }

    #[test]
    fn a_partly_expired_bucket_stays_until_its_last_gate() {
        let mut g = gate();
        install(&mut g, at(0), 1, DISK, ms(100));
        install(&mut g, at(0), 1, RETRY, ms(300));
        g.handle_timeout(at(200));
        assert_eq!(
            g.check(at(200), &1),
            GateState::Closed {
                until: at(300),
                reason: RETRY
            }
        );
        g.handle_timeout(at(300));
        assert!(g.is_empty());
    }

    #[test]
    fn extreme_values_saturate_without_panicking() {
        let mut g = gate();
        let mut rng = SplitMix64::new(2);
        assert_eq!(
            install(&mut g, at(0), 1, DISK, Duration::from_nanos(u64::MAX)),
            Instant::MAX - at(0)
        );
        assert_eq!(
            install(&mut g, at(0), 2, DISK, Duration::MAX),
            Instant::MAX - at(0)
        );
        assert_eq!(
            g.check(at(0), &2),
            GateState::Closed {
                until: Instant::MAX,
                reason: DISK
            }
        );
        let d = g.handle_disk_write_locked(at(0), &3, u32::MAX, &mut rng);
        assert!(
            d >= ms(8_000) && d <= ms(10_000),
            "attempt u32::MAX is capped: {d:?}"
        );
        g.handle_retriable_write(at(0), &3, u32::MAX, &mut rng);
        // At the end of time nothing can be gated any more, and everything opens.
        assert_eq!(
            install(&mut g, Instant::MAX, 4, DISK, ms(1)),
            Duration::ZERO
        );
        assert_eq!(g.check(Instant::MAX, &2), GateState::Open);
        g.handle_timeout(Instant::MAX);
        assert!(g.is_empty());
        g.handle_send(Instant::MAX, &1);
        g.handle_success(Instant::MAX, &1);
        assert_eq!(g.remaining_ms(Instant::MAX, &1), 0);
    }

    #[test]
    fn time_running_backwards_is_clamped() {
        let mut g = gate();
        install(&mut g, at(1_000), 1, DISK, ms(500));
        // An input from the past acts at the latest time seen: 1000 ms, not 0.
        assert_eq!(install(&mut g, at(0), 2, DISK, ms(500)), ms(500));
        assert_eq!(
            g.check(at(0), &2),
            GateState::Closed {
                until: at(1_500),
                reason: DISK
            }
        );
        g.handle_timeout(at(1_500));
        // A read from the past cannot reopen what time already closed.
        assert_eq!(g.remaining(at(0), &1), Duration::ZERO);
        assert!(g.is_empty());
        assert_eq!(
            g.handle_kv_signal(at(3), &1, Signal::Full),
            g.config().kv_curve.delay(Signal::Full)
        );
        assert_eq!(
            g.poll_timeout(),
            Some(at(1_500) + g.config().kv_curve.delay(Signal::Full))
        );
    }

    /// A key that counts every hash and equality test, to prove no input scans the buckets.
    #[derive(Clone)]
    struct CountingKey {
        id: u32,
        ops: Rc<Cell<u64>>,
    }

    impl PartialEq for CountingKey {
        fn eq(&self, other: &Self) -> bool {
            self.ops.set(self.ops.get() + 1);
            self.id == other.id
        }
    }
    impl Eq for CountingKey {}
    impl Hash for CountingKey {
        fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
            self.ops.set(self.ops.get() + 1);
            self.id.hash(state);
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn inputs_and_poll_timeout_touch_a_bounded_number_of_keys_among_100k() {
        let ops = Rc::new(Cell::new(0u64));
        let key = |id| CountingKey {
            id,
            ops: ops.clone(),
        };
        let mut g: WriteGate<CountingKey, RandomState> = WriteGate::new(WriteGateConfig::default());
        let mut rng = SplitMix64::new(8);
        let n = 100_000u32;
        for id in 0..n {
            // Scattered deadlines so the heap is deep and sifts really move items.
            let d = ms(1_000 + (u64::from(id).wrapping_mul(7_919) % 50_000));
            let _ = g.handle_throttle(at(0), &key(id), DISK, d);
        }
        assert_eq!(g.gated_len(), n as usize);
        let mut measure =
            |what: &str, f: &mut dyn FnMut(&mut WriteGate<CountingKey, RandomState>)| {
                ops.set(0);
                f(&mut g);
                assert!(ops.get() <= 64, "{what} touched {} keys", ops.get());
            };
        measure("poll_timeout", &mut |g| {
            assert_eq!(g.poll_timeout(), Some(at(1_000)));
        });
        measure("disk install", &mut |g| {
            g.handle_disk_write_locked(at(1), &key(77), 4, &mut rng);
        });
        measure("kv install (new bucket)", &mut |g| {
            g.handle_kv_signal(at(1), &key(n + 1), Signal::Full);
        });
        measure("kv shorten to the top", &mut |g| {
            // Default curve: 5000 ms · 0.1³ = 5 ms, earlier than every other bucket.
            g.handle_kv_signal(at(1), &key(n + 1), Signal::Pressure(100_000));
            assert_eq!(g.poll_timeout(), Some(at(6)));
        });
        measure("kv clear (evicts)", &mut |g| {
            g.handle_kv_signal(at(1), &key(n + 1), Signal::Clear);
            assert_eq!(g.len(), n as usize);
        });
        measure("leader unknown", &mut |g| {
            g.handle_leader(at(1), &key(5), false)
        });
        measure("leader known", &mut |g| {
            g.handle_leader(at(1), &key(5), true)
        });
        measure("send, success", &mut |g| {
            g.handle_send(at(1), &key(6));
            g.handle_success(at(1), &key(6));
        });
        measure("check, remaining", &mut |g| {
            let _ = g.check(at(1), &key(9));
            let _ = g.remaining(at(1), &key(9));
        });
        measure("timeout evicting one", &mut |g| g.handle_timeout(at(1_000)));
        assert!(g.check_invariants().is_ok());
    }
}
