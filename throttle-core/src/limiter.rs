//! Adaptive concurrency limits: a limit sized from what requests observe, not from
//! configuration.
//!
//! A [`Limiter`] takes one [`Sample`] per finished request (when it started and ended, how
//! many requests were in flight when it started, and whether it succeeded, was dropped, or
//! was rejected for a reason that says nothing about load) and returns the new limit when it
//! changes. Two algorithms, after Netflix's concurrency-limits:
//!
//! - [`Algorithm::Aimd`]: additive increase while the limit is in use, multiplicative decrease
//!   on a drop or a timeout ([`AimdConfig`]);
//! - [`Algorithm::Gradient2`]: the limit follows the ratio of a long-term average round trip
//!   to the current one ([`Gradient2Config`]).
//!
//! Either can sit behind a sample window ([`SampleWindowConfig`], Netflix's `WindowedLimit`)
//! that feeds it one aggregate per window instead of every sample.
//!
//! The machine is pure and integer-only: time comes in as `now`, round trips are nanoseconds,
//! ratios are ppm, Gradient2's fractional limit and average are 32.32 fixed point, and every
//! division rounds down. It holds a few hundred bytes of state and never allocates.
//! `docs/limiter.md` specifies the integer rules, where they differ from Netflix's floating
//! point, and how far (pinned by a float reference in the tests).
//!
//! ```
//! use throttle_sansio::Instant;
//! use throttle_sansio::limiter::{AimdConfig, Limiter, LimiterConfig, Sample};
//!
//! let mut limiter =
//!     Limiter::new(LimiterConfig::aimd(AimdConfig::default().with_limits(1, 4, 64))).unwrap();
//! let (start, end) = (Instant::from_millis(0), Instant::from_millis(3));
//! // Four in flight of a limit of 4: the limit is in use, so it grows by one.
//! assert_eq!(limiter.on_sample(end, Sample::ok(start, end, 4)), Some(5));
//! // A drop multiplies it by 0.9, rounded down.
//! assert_eq!(limiter.on_sample(end, Sample::dropped(start, end, 5)), Some(4));
//! assert_eq!(limiter.limit(), 4);
//! ```

use core::time::Duration;

use crate::error::ConfigError;
use crate::time::{Instant, duration_to_nanos};

mod config;
mod per_shard;
#[cfg(test)]
mod tests;

use config::PPM;
pub use config::{
    AimdConfig, Algorithm, Gradient2Config, LimiterConfig, MAX_LONG_WINDOW, MAX_RTT_TOLERANCE_PPM,
    SampleWindowConfig,
};
pub use per_shard::{BatchEnd, PerShard};

/// Fractional bits of the fixed-point values (Gradient2's limit estimate and average).
const FRAC: u32 = 32;

/// Samples Gradient2's long-term average takes as a plain mean before it starts decaying
/// (Netflix's `ExpAvgMeasurement` warm-up of 10).
pub const WARMUP_SAMPLES: u32 = 10;

/// Gradient2 shrinks its long-term average by this factor (ppm) whenever it is more than
/// twice the current round trip (Netflix: `× 0.95`).
pub const LONG_RTT_DECAY_PPM: u32 = 950_000;

/// What became of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It was served: its round trip measures the server (Netflix `onSuccess`).
    Ok,
    /// It was dropped for load: a timeout, a shed request, a server saying it is overloaded
    /// (Netflix `onDropped`).
    Dropped,
    /// It was refused for a reason that says nothing about load (a bad request, refused
    /// locally before it was sent): the limiter ignores it (Netflix `onIgnore`).
    Rejected,
}

/// One finished request, as the limiter sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sample {
    /// When the request was sent.
    pub start: Instant,
    /// When its answer (or its failure) came back. An `end` before `start` is a round trip
    /// of zero.
    pub end: Instant,
    /// Requests in flight when it was sent, itself included.
    pub in_flight: u32,
    /// What became of it.
    pub outcome: Outcome,
}

impl Sample {
    /// A served request.
    pub const fn ok(start: Instant, end: Instant, in_flight: u32) -> Self {
        Sample {
            start,
            end,
            in_flight,
            outcome: Outcome::Ok,
        }
    }

    /// A request dropped for load.
    pub const fn dropped(start: Instant, end: Instant, in_flight: u32) -> Self {
        Sample {
            start,
            end,
            in_flight,
            outcome: Outcome::Dropped,
        }
    }

    /// A request refused for a reason unrelated to load (ignored).
    pub const fn rejected(start: Instant, end: Instant, in_flight: u32) -> Self {
        Sample {
            start,
            end,
            in_flight,
            outcome: Outcome::Rejected,
        }
    }

    /// The round trip (zero if `end` is before `start`).
    pub fn rtt(&self) -> Duration {
        self.end.saturating_duration_since(self.start)
    }

    fn rtt_ns(&self) -> u64 {
        duration_to_nanos(self.rtt())
    }
}

/// The input an algorithm updates on: one sample, or one window's aggregate.
#[derive(Clone, Copy, Debug)]
struct Update {
    rtt_ns: u64,
    in_flight: u32,
    dropped: bool,
}

/// Gradient2's long-term round trip: a plain mean of the first [`WARMUP_SAMPLES`], then an
/// exponential average with factor `2 / (long_window + 1)`; 32.32 fixed-point nanoseconds.
#[derive(Clone, Copy, Debug)]
struct LongRtt {
    count: u32,
    sum_ns: u128,
    value: u128,
}

impl LongRtt {
    /// Adds a round trip (ns, at least 1) and returns the new average.
    fn add(&mut self, rtt_ns: u128, long_window: u32) -> u128 {
        if self.count < WARMUP_SAMPLES {
            self.count += 1;
            self.sum_ns += rtt_ns;
            self.value = (self.sum_ns << FRAC) / u128::from(self.count);
        } else {
            // value·(1 − f) + rtt·f with f = 2 / (n + 1), in one division.
            let n = u128::from(long_window);
            self.value = (self.value * (n - 1) + (rtt_ns << FRAC) * 2) / (n + 1);
        }
        self.value
    }
}

/// The open window's aggregate (Netflix's `ImmutableAverageSampleWindow`).
#[derive(Clone, Copy, Debug)]
struct Gathered {
    min_rtt_ns: u64,
    sum_ns: u128,
    max_in_flight: u32,
    count: u32,
    dropped: bool,
}

impl Gathered {
    const EMPTY: Gathered = Gathered {
        min_rtt_ns: u64::MAX,
        sum_ns: 0,
        max_in_flight: 0,
        count: 0,
        dropped: false,
    };
}

/// The sample window's state; its settings stay in the limiter's [`LimiterConfig`].
#[derive(Clone, Copy, Debug)]
struct Window {
    /// The open window ends here; `None` before the first sample (which closes a window at
    /// once, as Netflix's `nextUpdateTime` of 0 does).
    ends: Option<Instant>,
    gathered: Gathered,
}

impl Window {
    /// Adds a sample; returns the closed window's aggregate when this sample closed a window
    /// that holds enough samples.
    fn add(&mut self, config: &SampleWindowConfig, now: Instant, u: Update) -> Option<Update> {
        let Update {
            rtt_ns,
            in_flight,
            dropped,
        } = u;
        if rtt_ns < config.threshold_ns() {
            return None;
        }
        let g = &mut self.gathered;
        g.min_rtt_ns = g.min_rtt_ns.min(rtt_ns);
        g.sum_ns += u128::from(rtt_ns);
        g.max_in_flight = g.max_in_flight.max(in_flight);
        g.count = g.count.saturating_add(1);
        g.dropped |= dropped;
        if self.ends.is_some_and(|ends| now <= ends) {
            return None;
        }
        let closed = core::mem::replace(&mut self.gathered, Gathered::EMPTY);
        let (min, max) = config.window_ns();
        let next = closed.min_rtt_ns.saturating_mul(2).clamp(min, max);
        self.ends = Some(now.saturating_add(Duration::from_nanos(next)));
        // Netflix's readiness: enough samples, and a smallest round trip below the maximum.
        let ready = closed.count >= config.window_size && closed.min_rtt_ns < u64::MAX;
        ready.then(|| Update {
            rtt_ns: u64::try_from(closed.sum_ns / u128::from(closed.count)).unwrap_or(u64::MAX),
            in_flight: closed.max_in_flight,
            dropped: closed.dropped,
        })
    }
}

/// An adaptive concurrency limit: samples in, the current limit out.
///
/// Construct with [`Limiter::new`]; feed every finished request with
/// [`on_sample`](Self::on_sample); read [`limit`](Self::limit). The limit always lies within
/// the configured `[min, max]`.
#[derive(Clone, Debug)]
pub struct Limiter {
    config: LimiterConfig,
    limit: u32,
    /// Gradient2's limit estimate, 32.32 fixed point, within `[min, max]` (unused by AIMD).
    estimate: u128,
    /// Gradient2's long-term round trip (unused by AIMD).
    long: LongRtt,
    /// The sample window's state (unused without a window).
    window: Window,
}

impl Limiter {
    /// A limiter at the configuration's initial limit, or the error that
    /// [`LimiterConfig::validate`] finds.
    pub fn new(config: LimiterConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let (_, initial, _) = config.limits();
        Ok(Limiter {
            config,
            limit: initial,
            estimate: u128::from(initial) << FRAC,
            long: LongRtt {
                count: 0,
                sum_ns: 0,
                value: 0,
            },
            window: Window {
                ends: None,
                gathered: Gathered::EMPTY,
            },
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LimiterConfig {
        &self.config
    }

    /// The current limit, within `[min, max]`.
    #[inline]
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Gradient2's long-term round trip (Netflix `getRttNoLoad`), rounded down to a
    /// nanosecond; `None` for AIMD and before Gradient2's first update.
    pub fn rtt_no_load(&self) -> Option<Duration> {
        match self.config.algorithm {
            Algorithm::Gradient2(_) if self.long.count > 0 => Some(Duration::from_nanos(
                u64::try_from(self.long.value >> FRAC).unwrap_or(u64::MAX),
            )),
            _ => None,
        }
    }

    /// Gradient2's limit estimate in millionths of a request (its fractional part is kept
    /// between updates); AIMD's limit times a million.
    pub fn estimate_micros(&self) -> u64 {
        match self.config.algorithm {
            Algorithm::Aimd(_) => u64::from(self.limit) * u64::from(PPM),
            Algorithm::Gradient2(_) => {
                u64::try_from((self.estimate * u128::from(PPM)) >> FRAC).unwrap_or(u64::MAX)
            }
        }
    }

    /// Takes one finished request, given at `now` (the window's clock; a `now` earlier than
    /// the last closes no window). Returns the new limit if it changed.
    ///
    /// A [`Outcome::Rejected`] sample changes nothing. Behind a window, a sample updates the
    /// algorithm only when it closes a window that holds enough samples.
    pub fn on_sample(&mut self, now: Instant, sample: Sample) -> Option<u32> {
        let dropped = match sample.outcome {
            Outcome::Ok => false,
            Outcome::Dropped => true,
            Outcome::Rejected => return None,
        };
        let update = Update {
            rtt_ns: sample.rtt_ns(),
            in_flight: sample.in_flight,
            dropped,
        };
        let update = match &self.config.window {
            None => update,
            Some(config) => self.window.add(config, now, update)?,
        };
        let limit = self.update(update);
        (limit != self.limit).then(|| {
            self.limit = limit;
            limit
        })
    }

    fn update(&mut self, u: Update) -> u32 {
        match &self.config.algorithm {
            Algorithm::Aimd(c) => aimd(c, self.limit, u),
            Algorithm::Gradient2(c) => gradient2(c, &mut self.estimate, &mut self.long, u),
        }
    }
}

/// `docs/limiter.md`, "AIMD".
fn aimd(c: &AimdConfig, limit: u32, u: Update) -> u32 {
    let next = if u.dropped || u.rtt_ns > c.timeout_ns() {
        // < limit: the ratio is below 1, so this fits in u32.
        u32::try_from(u64::from(limit) * u64::from(c.backoff_ratio_ppm) / u64::from(PPM))
            .unwrap_or(limit)
    } else if u64::from(u.in_flight) * 2 >= u64::from(limit) {
        limit.saturating_add(1)
    } else {
        limit
    };
    next.clamp(c.min(), c.max())
}

/// `docs/limiter.md`, "Gradient2". Returns the new limit, `floor(estimate)`.
fn gradient2(c: &Gradient2Config, estimate: &mut u128, long: &mut LongRtt, u: Update) -> u32 {
    const ONE: u128 = 1 << FRAC;
    let ppm = u128::from(PPM);
    let short = u128::from(u.rtt_ns.max(1));
    let long_rtt = long.add(short, c.long_window);
    // Latency is back to normal after a long overload: pull the average down faster.
    if long_rtt > (short << FRAC) * 2 {
        long.value = long.value * u128::from(LONG_RTT_DECAY_PPM) / ppm;
    }
    let floor = |e: u128| u32::try_from(e >> FRAC).unwrap_or(u32::MAX);
    // Too few in flight to say anything about the limit (application-limited).
    if (u128::from(u.in_flight) << FRAC) * 2 < *estimate {
        return floor(*estimate);
    }
    let gradient = (u128::from(c.rtt_tolerance_ppm) * long_rtt / (ppm * short)).clamp(ONE / 2, ONE);
    let target = ((*estimate * gradient) >> FRAC) + (u128::from(c.queue_size) << FRAC);
    let smoothed = (*estimate * (ppm - u128::from(c.smoothing_ppm))
        + target * u128::from(c.smoothing_ppm))
        / ppm;
    *estimate = smoothed.clamp(u128::from(c.min()) << FRAC, u128::from(c.max()) << FRAC);
    floor(*estimate)
}
