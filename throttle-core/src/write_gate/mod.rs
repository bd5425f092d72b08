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

mod cleanup;
mod config;
pub(crate) use config::check_wake_slack;
pub(crate) mod heap;
mod queries;
mod timer;

use alloc::vec::Vec;
use core::hash::{BuildHasher, Hash};
use core::time::Duration;

use hashbrown::HashTable;

use crate::backpressure::Signal;
use crate::error::ConfigError;
use crate::event::EventQueue;
use crate::paced_writer::WriteOutcome;
use crate::rng::Rng;
use crate::time::{Clock, Instant, ceil_millis};

pub use config::{
    DEFAULT_PROBE_TTL, KV_HARD_REJECTION_NAME, MAX_KV_JITTER_PPM, MAX_REASONS, MAX_WAKE_SLACK,
    Reason, ReasonSpec, UpdateRule, WriteGateConfig,
};
use heap::IndexedHeap;

/// Which answers of a write feed the gate in [`WriteGate::handle_write_outcome`]: the paced
/// writer's [`with_disk_backoff`](crate::paced_writer::PacedWriterConfig::with_disk_backoff)
/// and [`with_kv_pressure`](crate::paced_writer::PacedWriterConfig::with_kv_pressure).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OutcomeFeed {
    /// A `DISK_WRITE_LOCKED` rejection backs the bucket off.
    pub disk_backoff: bool,
    /// Piggybacked pressure and storage-backpressure rejections feed the KV curve (off: a
    /// storage-backpressure rejection is an ordinary retriable error, pressure is ignored).
    pub kv_pressure: bool,
}

impl OutcomeFeed {
    /// Every answer feeds the gate (the default).
    pub const ALL: OutcomeFeed = OutcomeFeed {
        disk_backoff: true,
        kv_pressure: true,
    };
}

impl Default for OutcomeFeed {
    fn default() -> Self {
        OutcomeFeed::ALL
    }
}
pub use queries::{BucketSnapshot, ReasonOpening};
pub use timer::{GateTimer, TimerChange};

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

/// An observation of the gate, drained with [`WriteGate::poll_event`] once turned on with
/// [`WriteGate::set_event_capacity`] (off by default: see [`crate::event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GateEvent<K> {
    /// An install reached `bucket`'s `reason` (a rejection's backoff, a KV signal, a custom
    /// throttle), after the reason's update rule.
    Installed {
        /// The bucket.
        bucket: K,
        /// The reason installed on.
        reason: Reason,
        /// The delay this install asked for (after jitter and the disk floor).
        delay: Duration,
        /// The attempt the install was for: the `attempts` of a disk or retriable rejection,
        /// `None` for a signal or a custom throttle.
        attempt: Option<u32>,
        /// That reason's own opening after the install (a never-shorten reason keeps a later
        /// one); `None` when it holds nothing (a `Clear`, a zero delay, or a leader-scoped
        /// reason ignored while the leader is unknown).
        reason_opens_at: Option<Instant>,
        /// The bucket's opening over all its reasons (`now` when open).
        opens_at: Instant,
    },
    /// The gate emitted [`GateAction::Wake`]: some bucket now opens earlier, at `at`.
    Wake {
        /// The bucket's new opening.
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
const BUILTIN: usize = config::Builtin::ALL.len();

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

/// The bits of a key's hash that place its map entry: the low 24.
const STORED_MASK: u64 = (1 << 24) - 1;

/// Odd multiplier that spreads the 24 stored bits over the whole 64-bit map hash (Fibonacci
/// hashing: 2⁶⁴ / φ).
const SPREAD: u64 = 0x9E37_79B9_7F4A_7C15;

/// Where the map places a key whose hash is `hash`: a function of its low 24 bits only, so a
/// slot's [`StoredHash`] rebuilds it exactly. The multiplication is a bijection on the low
/// bits (the map's bucket index comes from the hasher's low bits, as in any `hashbrown` map)
/// and fills the top 7 bits (the map's control byte, which filters a probe before any key is
/// compared) from all 24. So a lookup compares a key other than its own only when the two
/// hashes agree in their low 24 bits: about `n / 2²⁴` extra comparisons per lookup among `n`
/// buckets (0.06 at a million), still correct but linear in `n` far past 16 M buckets.
#[inline]
fn map_hash(hash: u64) -> u64 {
    (hash & STORED_MASK).wrapping_mul(SPREAD)
}

/// The low 24 bits of a key's hash, which each slot keeps (3 bytes, byte-aligned, so the array
/// costs 3 bytes per slot) and from which [`map_hash`] is rebuilt: growing, shrinking and
/// evicting find and place map entries by it, so no user `Hash` runs after an input's lookup.
/// 24 bits and not 64 or 32 for memory: with 8 bytes a gated `u64` bucket cost 69.2 B at a
/// million, with 4 bytes 65.0 B, with 3 bytes 63.96 B (`docs/write-gate.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StoredHash([u8; 3]);

impl StoredHash {
    #[inline]
    fn of(hash: u64) -> Self {
        let [a, b, c, ..] = hash.to_le_bytes();
        StoredHash([a, b, c])
    }

    /// The map hash of the key this was taken from: `map_hash` of its full hash.
    #[inline]
    fn map_hash(self) -> u64 {
        let [a, b, c] = self.0;
        map_hash(u64::from(u32::from_le_bytes([a, b, c, 0])))
    }
}

/// The map hash of map entry `entry`'s slot, to rehash the map without running user code.
#[inline]
fn stored_map_hash(hashes: &[StoredHash], entry: u32) -> u64 {
    hashes.get(slot_of(entry)).map_or(0, |h| h.map_hash())
}

/// One bucket's key and built-in deadlines: 32 bytes for a `u64` key, so with the 4-byte map
/// entry, the 3-byte stored hash and the heap's 16 bytes a gated bucket costs about 64 bytes at
/// a million buckets (`docs/write-gate.md`), and a `check` reads one aligned 32-byte record
/// after the map. A slot exists while the bucket holds a stored deadline, an unknown leader or
/// an armed probe; it is evicted as soon as it holds none of them.
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
///   (evicts expired gates). Command: [`close`](Self::close).
/// - **Queries** (`&self`, expired deadlines read as open, nothing is re-drawn or extended):
///   [`check`](Self::check) (call before draining a bucket), [`remaining`](Self::remaining),
///   [`remaining_ms`](Self::remaining_ms), [`explain`](Self::explain).
/// - **Pollers**: after any input, drain [`poll_action`](Self::poll_action) until `None` (a
///   `Wake` means some bucket opens earlier than before), then sleep until
///   [`poll_timeout`](Self::poll_timeout) (the earliest opening among gated buckets with a
///   known leader, possibly already past) and call `handle_timeout` at that instant.
///
/// Every input and `poll_timeout` costs O(log n) in the number of gated buckets (an indexed
/// 4-ary heap); no input scans the buckets (only `close` does, once). The gate stores at
/// most 2³¹ − 2 buckets (slot indices are 31-bit): past that, an input for a new bucket stores
/// nothing (an install returns zero).
///
/// ```
/// use core::time::Duration;
/// use throttle_sansio::backpressure::Signal;
/// use throttle_sansio::rng::SplitMix64;
/// use throttle_sansio::write_gate::{GateAction, GateState, Reason, WriteGate, WriteGateConfig};
/// use throttle_sansio::Instant;
/// # #[derive(Default, Clone)] struct H; impl core::hash::BuildHasher for H {
/// #   type Hasher = F; fn build_hasher(&self) -> F { F(0) } }
/// # struct F(u64); impl core::hash::Hasher for F { fn finish(&self) -> u64 { self.0 }
/// #   fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.rotate_left(5) ^ u64::from(*x) } } }
///
/// let mut gate: WriteGate<u32, H> = WriteGate::new(WriteGateConfig::default())?;
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
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct WriteGate<K, S> {
    cfg: WriteGateConfig,
    hasher: S,
    /// One entry per stored bucket: its slot index (placed by the slot's hash in `hashes`) and
    /// the leader-unknown flag ([`LEADER_UNKNOWN`]).
    index: HashTable<u32>,
    /// Dense: evicting swaps the last slot in.
    slots: Vec<Slot<K>>,
    /// Each slot's [`StoredHash`] (the low 24 bits of its key's hash), taken once when the
    /// bucket was stored: moving, evicting and rehashing entries read it, so only the lookup at
    /// the start of an input runs the key's `Hash` (a panic there leaves the gate as it was).
    /// Apart from the slots, so `check`'s record stays 32 bytes.
    hashes: Vec<StoredHash>,
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
    closed: bool,
    /// Observations, off until [`Self::set_event_capacity`].
    events: EventQueue<GateEvent<K>>,
}

impl<K, S> WriteGate<K, S>
where
    K: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// A gate with no buckets, hashing keys with `hasher`; refuses an invalid `cfg`.
    pub fn with_hasher(cfg: WriteGateConfig, hasher: S) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(WriteGate {
            probing: cfg.reasons().iter().any(|r| r.probe_sends().is_some()),
            stride: cfg.reasons().len().saturating_sub(BUILTIN),
            cfg,
            hasher,
            index: HashTable::new(),
            slots: Vec::new(),
            hashes: Vec::new(),
            extra: Vec::new(),
            probes: Vec::new(),
            heap: IndexedHeap::default(),
            clock: Clock::default(),
            wake: None,
            closed: false,
            events: EventQueue::new(),
        })
    }

    /// A gate with no buckets and a default hasher; refuses an invalid `cfg`.
    pub fn new(cfg: WriteGateConfig) -> Result<Self, ConfigError>
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
    /// unless closed. Returns the bucket's remaining time (zero after [`Self::close`]).
    ///
    /// # Panics
    ///
    /// Only if user code panics: the bucket's `Hash`, `Eq` or `Clone`, the hasher, or the
    /// `Rng`. The panic reaches the caller and the input did not happen: the gate is as it
    /// was, and serves the next call.
    pub fn handle_disk_write_locked<R: Rng + ?Sized>(
        &mut self,
        now: Instant,
        bucket: &K,
        attempts: u32,
        rng: &mut R,
    ) -> Duration {
        if self.closed {
            self.clock.observe(now);
            return Duration::ZERO;
        }
        let delay = self
            .cfg
            .disk_write_locked
            .delay_for(attempts, rng)
            .max(DISK_WRITE_LOCKED_FLOOR);
        self.install(
            now,
            bucket,
            Reason::DISK_WRITE_LOCKED.index(),
            delay,
            Some(attempts),
        )
    }

    /// A write to `bucket` failed with another retriable error: like
    /// [`Self::handle_disk_write_locked`] with the `retriable_write` backoff and no floor (a
    /// zero delay, e.g. `initial = 0`, installs nothing).
    ///
    /// # Panics
    ///
    /// Only if user code panics: the bucket's `Hash`, `Eq` or `Clone`, the hasher, or the
    /// `Rng`. The panic reaches the caller and the input did not happen: the gate is as it
    /// was, and serves the next call.
    pub fn handle_retriable_write<R: Rng + ?Sized>(
        &mut self,
        now: Instant,
        bucket: &K,
        attempts: u32,
        rng: &mut R,
    ) -> Duration {
        if self.closed {
            self.clock.observe(now);
            return Duration::ZERO;
        }
        let delay = self.cfg.retriable_write.delay_for(attempts, rng);
        self.install(
            now,
            bucket,
            Reason::RETRIABLE_WRITE.index(),
            delay,
            Some(attempts),
        )
    }

    /// The leader of `bucket` reported KV backpressure `signal`: the throttle becomes
    /// `kv_curve.delay(signal)` from `now`, latest-wins (it may shorten or, on `Clear`, lift
    /// the KV throttle). Ignored while the bucket's leader is unknown (it is the old
    /// leader's word). Returns the bucket's remaining time.
    ///
    /// With [`WriteGateConfig::with_kv_hard_rejection_never_shorten`], a hard rejection
    /// ([`Signal::Full`]) installs the ceiling on that reason instead, never-shorten, so no
    /// later signal shortens it. No jitter, even when configured (it needs a generator:
    /// [`Self::handle_kv_signal_jittered`]).
    ///
    /// # Panics
    ///
    /// Only if user code panics: the bucket's `Hash`, `Eq` or `Clone`, or the hasher. The
    /// panic reaches the caller and the input did not happen: the gate is as it was, and
    /// serves the next call.
    pub fn handle_kv_signal(&mut self, now: Instant, bucket: &K, signal: Signal) -> Duration {
        let delay = self.cfg.kv_curve.delay(signal);
        let r = self.kv_reason(signal);
        self.install(now, bucket, r, delay, None)
    }

    /// [`Self::handle_kv_signal`] with the configured KV jitter
    /// ([`WriteGateConfig::with_kv_jitter`]): the curve's delay `d` becomes a uniform draw
    /// from `d · (1 ± jitter)` in whole nanoseconds. Draws from `rng` exactly once when the
    /// jitter is on, the delay is not zero and the gate is not closed; never otherwise (a
    /// `Clear` lifts the throttle exactly as without jitter).
    ///
    /// ```
    /// use core::time::Duration;
    /// use throttle_sansio::backpressure::Signal;
    /// use throttle_sansio::rng::SplitMix64;
    /// use throttle_sansio::write_gate::{WriteGate, WriteGateConfig};
    /// use throttle_sansio::Instant;
    /// # #[derive(Default, Clone)] struct H; impl core::hash::BuildHasher for H {
    /// #   type Hasher = F; fn build_hasher(&self) -> F { F(0) } }
    /// # struct F(u64); impl core::hash::Hasher for F { fn finish(&self) -> u64 { self.0 }
    /// #   fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.rotate_left(5) ^ u64::from(*x) } } }
    ///
    /// let cfg = WriteGateConfig::default().with_kv_jitter(100_000); // ±10 %
    /// let mut gate: WriteGate<u32, H> = WriteGate::new(cfg)?;
    /// let mut rng = SplitMix64::new(3);
    /// let t0 = Instant::from_millis(10);
    /// // 3000 ms · 0.5² = 750 ms, jittered into 675..=825 ms.
    /// let wait = gate.handle_kv_signal_jittered(t0, &1, Signal::Pressure(500_000), &mut rng);
    /// assert!(wait >= Duration::from_millis(675) && wait <= Duration::from_millis(825));
    /// # Ok::<(), throttle_sansio::ConfigError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// Only if user code panics: the bucket's `Hash`, `Eq` or `Clone`, the hasher, or the
    /// `Rng`. The panic reaches the caller and the input did not happen: the gate is as it
    /// was, and serves the next call.
    pub fn handle_kv_signal_jittered<R: Rng + ?Sized>(
        &mut self,
        now: Instant,
        bucket: &K,
        signal: Signal,
        rng: &mut R,
    ) -> Duration {
        let delay = self.cfg.kv_curve.delay(signal);
        let ppm = u64::from(self.cfg.kv_jitter_ppm);
        let delay = if self.closed || ppm == 0 || delay.is_zero() {
            delay
        } else {
            let ns = u128::from(crate::time::duration_to_nanos(delay));
            let spread = u64::try_from(ns * u128::from(ppm) / 1_000_000).unwrap_or(u64::MAX);
            let ns = u64::try_from(ns).unwrap_or(u64::MAX);
            Duration::from_nanos(crate::rng::between_inclusive(
                rng,
                ns.saturating_sub(spread),
                ns.saturating_add(spread),
            ))
        };
        let r = self.kv_reason(signal);
        self.install(now, bucket, r, delay, None)
    }

    /// The reason a KV `signal` installs on: the hard-rejection reason for `Full` when it is
    /// registered, else `KV_BACKPRESSURE`.
    fn kv_reason(&self, signal: Signal) -> usize {
        match (signal, self.cfg.kv_hard_rejection()) {
            (Signal::Full, Some(hard)) => hard.index(),
            _ => Reason::KV_BACKPRESSURE.index(),
        }
    }

    /// Install `delay` for `reason` (custom or built-in) on `bucket` under that reason's
    /// update rule, exactly as given (no floor, no jitter). Returns the bucket's remaining
    /// time, or [`GateError::UnknownReason`] (nothing changes) for a reason this gate's
    /// configuration did not register.
    ///
    /// # Panics
    ///
    /// Only if user code panics: the bucket's `Hash`, `Eq` or `Clone`, or the hasher. The
    /// panic reaches the caller and the input did not happen: the gate is as it was, and
    /// serves the next call.
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
        Ok(self.install(now, bucket, reason.index(), delay, None))
    }

    /// The leader of `bucket` became unknown (`known == false`) or known again.
    ///
    /// Unknown: the bucket's leader-scoped throttles (KV) are dropped, other gates survive;
    /// it leaves `poll_timeout` and [`Self::check`] reports `UnknownLeader` first. The state
    /// is stored even for an ungated bucket (so `check` can report it) until the leader is
    /// known again, when the bucket rejoins the wake-up computation or, holding nothing
    /// else, is evicted.
    ///
    /// # Panics
    ///
    /// Only if user code panics: the bucket's `Hash`, `Eq` or `Clone`, or the hasher. The
    /// panic reaches the caller and the input did not happen: the gate is as it was, and
    /// serves the next call.
    pub fn handle_leader(&mut self, now: Instant, bucket: &K, known: bool) {
        // User code first (the key's `Hash`, `Eq`, `Clone`): nothing changes before it returns.
        let (hash, found) = self.lookup(bucket);
        let fresh = (found.is_none() && !known).then(|| bucket.clone());
        let now = self.clock.observe(now);
        let entry = match (found, fresh) {
            (Some(e), _) => e,
            (None, None) => return,
            (None, Some(key)) => match self.insert(key, StoredHash::of(hash), LEADER_UNKNOWN) {
                Some(e) => e,
                None => return,
            },
        };
        let i = slot_of(entry);
        self.clean(i, now);
        if known {
            if entry & LEADER_UNKNOWN != 0 {
                self.set_leader_unknown(i, false);
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
                self.set_leader_unknown(i, true);
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
    ///
    /// # Panics
    ///
    /// Only if user code panics: the bucket's `Hash`, `Eq` or `Clone`, or the hasher. The
    /// panic reaches the caller and the input did not happen: the gate is as it was, and
    /// serves the next call.
    pub fn handle_send(&mut self, now: Instant, bucket: &K) {
        // The lookup (user `Hash`, `Eq`) runs before anything changes.
        let found = self.find(bucket);
        let now = self.clock.observe(now);
        let Some(entry) = found else {
            return;
        };
        let i = slot_of(entry);
        self.clean(i, now);
        let open = self.opening(i) == Instant::ZERO;
        if let Some(p) = self.probes.get_mut(i) {
            if p.armed != 0 && open {
                p.used = p.used.saturating_add(1);
            }
        }
        self.settle(i, entry & LEADER_UNKNOWN != 0, now);
    }

    /// The server's answer to a write to `bucket`, as a [`WriteOutcome`], fed to the gate: the
    /// one mapping from answers to gate inputs, shared by the paced writer and the tower
    /// write-gate layer.
    ///
    /// - `Ok { pressure }`: [`Self::handle_success`], then, with `feed.kv_pressure`, the
    ///   piggybacked pressure through [`Self::handle_kv_signal_jittered`].
    /// - `DiskWriteLocked`: with `feed.disk_backoff`, [`Self::handle_disk_write_locked`] at
    ///   `attempts`; without, nothing.
    /// - `StorageBackpressure`: with `feed.kv_pressure`, the KV curve's `Full` (jittered as
    ///   configured); without, an ordinary retriable error.
    /// - `Retriable`: [`Self::handle_retriable_write`] at `attempts`.
    /// - `Fatal`: nothing (the gate learns nothing from a non-retriable error).
    ///
    /// Draws from `rng` as the input it runs does.
    ///
    /// ```
    /// use throttle_sansio::paced_writer::WriteOutcome;
    /// use throttle_sansio::rng::SplitMix64;
    /// use throttle_sansio::write_gate::{OutcomeFeed, Reason, WriteGate, WriteGateConfig};
    /// use throttle_sansio::Instant;
    /// # #[derive(Default, Clone)] struct H; impl core::hash::BuildHasher for H {
    /// #   type Hasher = F; fn build_hasher(&self) -> F { F(0) } }
    /// # struct F(u64); impl core::hash::Hasher for F { fn finish(&self) -> u64 { self.0 }
    /// #   fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.rotate_left(5) ^ u64::from(*x) } } }
    ///
    /// let mut gate: WriteGate<u32, H> = WriteGate::new(WriteGateConfig::fluss_landed())?;
    /// let mut rng = SplitMix64::new(1);
    /// let t0 = Instant::from_millis(0);
    /// gate.handle_write_outcome(t0, &7, WriteOutcome::DiskWriteLocked, 0, OutcomeFeed::ALL, &mut rng);
    /// let wait = gate.remaining(t0, &7);
    /// assert_eq!(gate.explain(t0, &7), Some((Reason::DISK_WRITE_LOCKED, t0 + wait)));
    /// // Without the disk backoff, the same answer installs nothing.
    /// let off = OutcomeFeed { disk_backoff: false, ..OutcomeFeed::ALL };
    /// gate.handle_write_outcome(t0, &8, WriteOutcome::DiskWriteLocked, 0, off, &mut rng);
    /// assert!(gate.remaining(t0, &8).is_zero());
    /// # Ok::<(), throttle_sansio::ConfigError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// Only if user code panics: the bucket's `Hash`, `Eq` or `Clone`, the hasher, or the
    /// `Rng`. The panic reaches the caller; the input that panicked did not happen (for `Ok`
    /// with pressure, the success before it stays done), and the gate serves the next call.
    pub fn handle_write_outcome<R: Rng + ?Sized>(
        &mut self,
        now: Instant,
        bucket: &K,
        outcome: WriteOutcome,
        attempts: u32,
        feed: OutcomeFeed,
        rng: &mut R,
    ) {
        match outcome {
            WriteOutcome::Ok { pressure } => {
                self.handle_success(now, bucket);
                if feed.kv_pressure {
                    // Jittered if the config asks for it (`with_kv_jitter`); with no jitter
                    // configured this draws nothing.
                    self.handle_kv_signal_jittered(now, bucket, pressure, rng);
                }
            }
            WriteOutcome::DiskWriteLocked if feed.disk_backoff => {
                self.handle_disk_write_locked(now, bucket, attempts, rng);
            }
            WriteOutcome::StorageBackpressure if feed.kv_pressure => {
                self.handle_kv_signal_jittered(now, bucket, Signal::Full, rng);
            }
            WriteOutcome::StorageBackpressure | WriteOutcome::Retriable => {
                self.handle_retriable_write(now, bucket, attempts, rng);
            }
            WriteOutcome::DiskWriteLocked | WriteOutcome::Fatal => {
                self.clock.observe(now);
            }
        }
    }

    /// A write to `bucket` succeeded: probe mode ends for the bucket (its allowance resets).
    /// Pending deadlines stay: the success may answer a batch sent before the rejection.
    ///
    /// # Panics
    ///
    /// Only if user code panics: the bucket's `Hash`, `Eq` or `Clone`, or the hasher. The
    /// panic reaches the caller and the input did not happen: the gate is as it was, and
    /// serves the next call.
    pub fn handle_success(&mut self, now: Instant, bucket: &K) {
        // The lookup (user `Hash`, `Eq`) runs before anything changes.
        let found = self.find(bucket);
        let now = self.clock.observe(now);
        let Some(entry) = found else {
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

    // ---------------------------------------------------------------------------- pollers

    /// The next effect to carry out, if any. Drain until `None` after each input.
    pub fn poll_action(&mut self) -> Option<GateAction> {
        self.wake.take().map(|at| GateAction::Wake { at })
    }

    /// The oldest undrained observation, if events are on ([`Self::set_event_capacity`]).
    /// Drain after [`Self::poll_action`].
    pub fn poll_event(&mut self) -> Option<GateEvent<K>> {
        self.events.pop()
    }

    /// For the `sync` handles' lock guard: whether an event is waiting (one length check).
    #[cfg(feature = "std")]
    #[inline]
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Record up to `capacity` undrained events (0, the default, turns them off: no input
    /// then builds one). Past the capacity the oldest is dropped and counted.
    pub fn set_event_capacity(&mut self, capacity: usize) {
        self.events.set_capacity(capacity);
    }

    /// Events lost to a full queue (or discarded by turning events off) so far.
    pub fn events_dropped(&self) -> u64 {
        self.events.dropped()
    }

    /// The earliest opening among gated buckets whose leader is known, where a probing
    /// bucket's opening is its probe lapse ([`ReasonSpec::probe_ttl`] after its gates
    /// opened), plus the configured [wake slack](WriteGateConfig::with_wake_slack): sleep until
    /// then and call [`Self::handle_timeout`], which evicts every bucket due by that instant
    /// (all those opening within the slack after the first, in one pass). May be in the past
    /// (a gate expired but not yet evicted). `None` when no such bucket is gated. O(1).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.heap.peek().map(|(at, _)| at + self.cfg.wake_slack)
    }

    // ---------------------------------------------------------------------------- helpers

    /// `bucket`'s map entry (slot index and leader flag), comparing keys in the slots.
    #[inline]
    fn find(&self, bucket: &K) -> Option<u32> {
        self.lookup(bucket).1
    }

    /// `bucket`'s hash and map entry (see [`Self::lookup_slot`]).
    #[inline]
    fn lookup(&self, bucket: &K) -> (u64, Option<u32>) {
        let (hash, found) = self.lookup_slot(bucket);
        (hash, found.map(|(entry, _)| entry))
    }

    /// `bucket`'s full hash, and its map entry with the slot holding it: the only place the gate
    /// runs the key's `Hash` and `Eq` (the consistency check for the model aside).
    #[inline]
    fn lookup_slot(&self, bucket: &K) -> (u64, Option<(u32, &Slot<K>)>) {
        let hash = self.hasher.hash_one(bucket);
        let slots = &self.slots;
        let mut found = None;
        self.index
            .find(map_hash(hash), |&e| match slots.get(slot_of(e)) {
                Some(s) if s.key == *bucket => {
                    found = Some((e, s));
                    true
                }
                _ => false,
            });
        (hash, found)
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
        let none = [Instant::ZERO; BUILTIN];
        let builtin = self.slots.get(i).map_or(&none, |s| &s.deadlines);
        self.dominant_in(builtin, i, now)
    }

    /// [`Self::dominant`] of slot `i`, whose built-in deadlines are `builtin`.
    #[inline]
    fn dominant_in(
        &self,
        builtin: &[Instant; BUILTIN],
        i: usize,
        now: Instant,
    ) -> Option<(Reason, Instant)> {
        // The built-in reasons first, unrolled over the fixed-size array (the common gate has
        // no custom reason, and `check` is its hot path); ties keep the lower index.
        // Reason indices are below `MAX_REASONS` (64), so they count in `u8` as `Reason` does.
        let (mut best_r, mut best) = (0u8, Instant::ZERO);
        for (r, &d) in (0u8..).zip(builtin) {
            if d > best {
                (best_r, best) = (r, d);
            }
        }
        for (r, &d) in (BUILTIN as u8..).zip(self.extra_of(i)) {
            if d > best {
                (best_r, best) = (r, d);
            }
        }
        // The latest deadline is pending iff any is: a pending reason's deadline exceeds
        // `now`, so the maximum does too.
        (best > now).then(|| (config::reason_from_u8(best_r), best))
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

    /// Store a new bucket `key`, whose hash is `hash`, with nothing gated; returns its map
    /// entry. `None` (nothing stored) once [`heap::MAX_SLOTS`]` - 1` buckets are stored: slot
    /// indices must fit in 31 bits. Runs no user code: a growing map rehashes by the stored
    /// hashes.
    fn insert(&mut self, key: K, hash: StoredHash, flag: u32) -> Option<u32> {
        let i = self.slots.len();
        if i >= heap::MAX_SLOTS - 1 {
            return None;
        }
        let entry = (i as u32) | flag;
        self.slots.push(Slot {
            key,
            deadlines: [Instant::ZERO; BUILTIN],
        });
        self.hashes.push(hash);
        let stride = self.stride();
        self.extra
            .extend(core::iter::repeat_n(Instant::ZERO, stride));
        if self.probing {
            self.probes.push(Probe::default());
        }
        self.heap.add_slot();
        let hashes = &self.hashes;
        self.index
            .insert_unique(hash.map_hash(), entry, |&e| stored_map_hash(hashes, e));
        Some(entry)
    }

    /// Set or clear the leader-unknown flag of slot `i`.
    fn set_leader_unknown(&mut self, i: usize, unknown: bool) {
        let hash = self.hashes.get(i).map_or(0, |h| h.map_hash());
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
        self.events.emit(|| GateEvent::Wake { at });
    }

    /// The one install path every reason shares: clamp time, apply the reason's rule, arm
    /// probes, wake if the bucket's remaining time fell, and settle the heap.
    fn install(
        &mut self,
        now: Instant,
        bucket: &K,
        r: usize,
        delay: Duration,
        attempt: Option<u32>,
    ) -> Duration {
        let spec = self.cfg.reasons().get(r).copied();
        let t = self.clock.peek(now);
        let candidate = t + delay;
        let pending = candidate > t;
        // User code first (the key's `Hash`, `Eq`, and `Clone` for a new bucket), so that a
        // panic in it leaves the gate as it was.
        // With events on, the event's copy of the key is made here too.
        let (hash, found, fresh, noted) = if self.closed || spec.is_none() {
            (0, None, None, None)
        } else {
            let (hash, found) = self.lookup(bucket);
            let fresh = (found.is_none() && pending).then(|| bucket.clone());
            let noted = self.events.is_on().then(|| bucket.clone());
            (hash, found, fresh, noted)
        };
        let now = self.clock.observe(now);
        let Some(spec) = spec.filter(|_| !self.closed) else {
            return Duration::ZERO;
        };
        let entry = match (found, fresh) {
            (Some(e), _) => e,
            (None, Some(key)) => match self.insert(key, StoredHash::of(hash), 0) {
                Some(e) => e,
                None => return Duration::ZERO,
            },
            // Nothing stored and nothing to store: an absent bucket stays absent.
            (None, None) => return Duration::ZERO,
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
        if let Some(bucket) = noted {
            self.note_install(bucket, i, r, delay, attempt, now + after);
        }
        if after < before {
            self.push_wake(now + after);
        }
        self.settle(i, unknown, now);
        after
    }

    /// Record the [`GateEvent::Installed`] of an install on slot `i`'s reason `r` (events on).
    #[cold]
    fn note_install(
        &mut self,
        bucket: K,
        i: usize,
        r: usize,
        delay: Duration,
        attempt: Option<u32>,
        opens_at: Instant,
    ) {
        let own = self.deadlines(i).nth(r).filter(|&d| d != Instant::ZERO);
        let Some(reason) = reason_at(r) else {
            return;
        };
        self.events.emit(|| GateEvent::Installed {
            bucket,
            reason,
            delay,
            attempt,
            reason_opens_at: own,
            opens_at,
        });
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
        if self.opening(i) == Instant::ZERO && self.probe_lapse(i).is_some_and(|l| l <= now) {
            if let Some(p) = self.probes.get_mut(i) {
                *p = Probe::default();
            }
        }
    }
}

#[cfg(test)]
mod tests;
