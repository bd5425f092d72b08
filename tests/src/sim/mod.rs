//! A deterministic discrete-event simulator for whole clients built on `throttle-sansio`.
//!
//! Everything runs on virtual time ([`Instant`]) popped from one event queue
//! ([`EventQueue`]: a binary heap of `(instant, sequence, event)`), with randomness from seeded
//! [`SplitMix64`] generators. There is no wall clock and no thread, so a run is a pure function
//! of its seed and parameters: the same command prints the same table.
//!
//! - [`writer`]: the reference writer (accumulator + sender on the
//!   [`WriteGate`](throttle_sansio::WriteGate)), `docs/design.md` §6.
//! - [`reader`]: the reference reader (the [`Batcher`](throttle_sansio::Batcher) and its window).
//! - One module per scenario ([`disk`], [`kv`], [`reads`], [`lockstep`], [`failover`]), each
//!   comparing the client upstream had before a change (the "naive" one) with ours, and
//!   [`capacity`], fixed windows against adaptive limits.
//!
//! The server models, parameters and figures are described in `docs/simulation.md`.

pub mod capacity;
pub mod cli;
pub mod disk;
pub mod failover;
pub mod kv;
pub mod lockstep;
pub mod reader;
pub mod reads;
pub mod svg;
pub mod table;
pub mod writer;

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::time::Duration;

pub use throttle_sansio::Instant;
pub use throttle_sansio::rng::SplitMix64;

/// A hasher with a fixed key, so map iteration (and thus a run) is the same every time.
pub type DetHasher = BuildHasherDefault<DefaultHasher>;

/// One scheduled event; ordered by `(at, seq)` so equal instants pop in scheduling order.
#[derive(Debug)]
struct Scheduled<E> {
    at: Instant,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Scheduled<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<E> Eq for Scheduled<E> {}
impl<E> PartialOrd for Scheduled<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Scheduled<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// The simulator's clock and agenda: a min-heap of `(instant, sequence, event)`.
///
/// `pop` advances virtual time to the event's instant; events scheduled in the past run
/// "now" (time never goes backwards), and ties run in the order they were scheduled.
#[derive(Debug)]
pub struct EventQueue<E> {
    heap: BinaryHeap<Reverse<Scheduled<E>>>,
    seq: u64,
    now: Instant,
    popped: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            seq: 0,
            now: Instant::ZERO,
            popped: 0,
        }
    }
}

impl<E> EventQueue<E> {
    /// An empty agenda at the epoch.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current virtual time (the instant of the last popped event).
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Schedule `event` at `at` (clamped to now).
    pub fn at(&mut self, at: Instant, event: E) {
        let at = at.max(self.now);
        self.seq += 1;
        self.heap.push(Reverse(Scheduled {
            at,
            seq: self.seq,
            event,
        }));
    }

    /// Schedule `event` after `delay`.
    pub fn after(&mut self, delay: Duration, event: E) {
        self.at(self.now + delay, event);
    }

    /// The next event, advancing the clock to it.
    pub fn pop(&mut self) -> Option<(Instant, E)> {
        let Reverse(s) = self.heap.pop()?;
        self.now = s.at;
        self.popped += 1;
        Some((s.at, s.event))
    }

    /// The instant of the next event without popping it.
    pub fn peek_time(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse(s)| s.at)
    }

    /// Events popped so far.
    pub fn popped(&self) -> u64 {
        self.popped
    }

    /// Events still scheduled.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

/// A server with `n` identical worker threads serving requests first come, first served.
///
/// Arrivals must be offered in time order (they are, when offered as events pop); the pool
/// then computes each request's start and end in closed form, without events of its own.
#[derive(Debug, Clone)]
pub struct WorkerPool {
    free_at: BinaryHeap<Reverse<Instant>>,
    busy: Duration,
}

impl WorkerPool {
    /// `workers` threads, all idle (at least one).
    pub fn new(workers: usize) -> Self {
        WorkerPool {
            free_at: (0..workers.max(1))
                .map(|_| Reverse(Instant::ZERO))
                .collect(),
            busy: Duration::ZERO,
        }
    }

    /// A request arriving at `arrival` needing `cost` of one worker: returns `(start, done)`.
    pub fn serve(&mut self, arrival: Instant, cost: Duration) -> (Instant, Instant) {
        let free = self.free_at.pop().map_or(Instant::ZERO, |Reverse(t)| t);
        let start = arrival.max(free);
        let done = start + cost;
        self.free_at.push(Reverse(done));
        self.busy += cost;
        (start, done)
    }

    /// Total worker time spent serving.
    pub fn busy(&self) -> Duration {
        self.busy
    }
}

/// A uniform draw in `[lo, hi]` nanoseconds as a duration.
pub fn uniform(rng: &mut SplitMix64, lo: Duration, hi: Duration) -> Duration {
    let lo_ns = u64::try_from(lo.as_nanos()).unwrap_or(u64::MAX);
    let hi_ns = u64::try_from(hi.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(throttle_sansio::rng::between_inclusive(rng, lo_ns, hi_ns))
}

/// The `q`-quantile (0..=1) of `values` by nearest rank; sorts in place. Zero when empty.
pub fn quantile(values: &mut [Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// Seconds as a float, for printing only (no decision uses floats).
pub fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// `Instant` as seconds since the epoch, for printing only.
pub fn at_secs(t: Instant) -> f64 {
    t.as_nanos() as f64 / 1e9
}

/// Scale a count by `scale` (at least `min`), for `--scale`.
pub fn scaled(n: u64, scale: f64, min: u64) -> u64 {
    ((n as f64 * scale).round() as u64).max(min)
}
