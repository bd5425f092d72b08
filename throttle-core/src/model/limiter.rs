//! Model checker for the adaptive limiter ([`crate::limiter`]).
//!
//! Bytes become a configuration (valid or not: the checker compares the refusal too) and a
//! sequence of samples: times stepping forward, back and to the end of time, round trips from
//! zero to `u64::MAX` ns, ends before starts, in-flight counts up to `u32::MAX`, and all three
//! outcomes. The reference follows `docs/limiter.md` literally and shares no code with the
//! machine: the open window is a `Vec` of its samples whose minimum, sum and maximum are
//! recomputed when it closes, the warm-up mean is recomputed from a `Vec` of the first round
//! trips, and the arithmetic is written out from the page's formulas. After every sample the
//! checker compares the change reported, the limit, the estimate and the long-term round trip,
//! and checks that the limit stays within `[min, max]`.

use alloc::format;
use alloc::vec::Vec;
use core::time::Duration;

use super::{Cursor, Divergence};
use crate::limiter::{
    AimdConfig, Algorithm, Gradient2Config, Limiter, LimiterConfig, Outcome, Sample,
    SampleWindowConfig,
};
use crate::time::Instant;

const MILLION: u128 = 1_000_000;
const SCALE: u128 = 1 << 32;

fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

/// The page's validation rules, one predicate each, in the page's order.
fn valid(c: &LimiterConfig) -> bool {
    let (min, initial, max) = c.limits();
    let limits = min >= 1 && min <= max && min <= initial && initial <= max;
    let algorithm = match c.algorithm() {
        Algorithm::Aimd(a) => {
            a.backoff_ratio_ppm() >= 500_000
                && a.backoff_ratio_ppm() < 1_000_000
                && a.timeout() > Duration::ZERO
        }
        Algorithm::Gradient2(g) => {
            (1..=1_000_000).contains(&g.smoothing_ppm())
                && (1..=1 << 20).contains(&g.long_window())
                && (1_000_000..=1_000_000_000).contains(&g.rtt_tolerance_ppm())
        }
    };
    let window = c.window().is_none_or(|w| {
        w.min_window() > Duration::ZERO && w.min_window() <= w.max_window() && w.window_size() >= 1
    });
    limits && algorithm && window
}

struct RefWindow {
    config: SampleWindowConfig,
    end: Option<u64>,
    samples: Vec<(u64, u32, bool)>,
}

/// How often a run reached each interesting state (for the decoder's coverage test).
#[derive(Clone, Copy, Debug, Default)]
struct Coverage {
    /// Windowed updates of Gradient2 after its warm-up.
    windowed_after_warmup: u32,
    /// Decays of Gradient2's long-term round trip.
    decays: u32,
    /// Gradient2 updates held because the application did not use the limit.
    app_limited: u32,
    /// Gradient2 gradients strictly between 1/2 and 1.
    interior_gradients: u32,
    /// AIMD decreases.
    aimd_decreases: u32,
}

struct Reference {
    coverage: Coverage,
    config: LimiterConfig,
    limit: u32,
    /// Gradient2's estimate, in 2^-32 requests.
    estimate: u128,
    /// Gradient2's first round trips (up to ten), for the warm-up mean.
    first: Vec<u64>,
    /// Gradient2's long-term round trip, in 2^-32 ns.
    long: u128,
    window: Option<RefWindow>,
}

impl Reference {
    fn new(config: LimiterConfig) -> Self {
        let (_, initial, _) = config.limits();
        Reference {
            coverage: Coverage::default(),
            config,
            limit: initial,
            estimate: u128::from(initial) * SCALE,
            first: Vec::new(),
            long: 0,
            window: config.window().map(|w| RefWindow {
                config: *w,
                end: None,
                samples: Vec::new(),
            }),
        }
    }

    fn sample(&mut self, now: u64, rtt: u64, in_flight: u32, outcome: Outcome) -> Option<u32> {
        let dropped = match outcome {
            Outcome::Ok => false,
            Outcome::Dropped => true,
            Outcome::Rejected => return None,
        };
        let (rtt, in_flight, dropped) = match &mut self.window {
            None => (rtt, in_flight, dropped),
            Some(w) => {
                if rtt < ns(w.config.min_rtt_threshold()) {
                    return None;
                }
                w.samples.push((rtt, in_flight, dropped));
                if let Some(end) = w.end {
                    if now <= end {
                        return None;
                    }
                }
                let samples = core::mem::take(&mut w.samples);
                let smallest = samples.iter().map(|s| s.0).min().unwrap_or(u64::MAX);
                let length = u128::from(smallest)
                    .saturating_mul(2)
                    .max(u128::from(ns(w.config.min_window())))
                    .min(u128::from(ns(w.config.max_window())));
                w.end = Some(now.saturating_add(length as u64));
                if (samples.len() as u64) < u64::from(w.config.window_size())
                    || smallest == u64::MAX
                {
                    return None;
                }
                if self.first.len() >= 10 {
                    self.coverage.windowed_after_warmup += 1;
                }
                let sum: u128 = samples.iter().map(|s| u128::from(s.0)).sum();
                (
                    (sum / samples.len() as u128) as u64,
                    samples.iter().map(|s| s.1).max().unwrap_or(0),
                    samples.iter().any(|s| s.2),
                )
            }
        };
        let new = match *self.config.algorithm() {
            Algorithm::Aimd(a) => self.aimd(&a, rtt, in_flight, dropped),
            Algorithm::Gradient2(g) => self.gradient2(&g, rtt, in_flight),
        };
        if new == self.limit {
            None
        } else {
            self.limit = new;
            Some(new)
        }
    }

    fn aimd(&mut self, a: &AimdConfig, rtt: u64, in_flight: u32, dropped: bool) -> u32 {
        let l = u128::from(self.limit);
        let next = if dropped || rtt > ns(a.timeout()) {
            self.coverage.aimd_decreases += 1;
            l * u128::from(a.backoff_ratio_ppm()) / MILLION
        } else if 2 * u128::from(in_flight) >= l {
            l + 1
        } else {
            l
        };
        next.max(u128::from(a.min())).min(u128::from(a.max())) as u32
    }

    fn gradient2(&mut self, g: &Gradient2Config, rtt: u64, in_flight: u32) -> u32 {
        let short = u128::from(rtt.max(1));
        if self.first.len() < 10 {
            self.first.push(rtt.max(1));
            let sum: u128 = self.first.iter().map(|&r| u128::from(r)).sum();
            self.long = sum * SCALE / self.first.len() as u128;
        } else {
            let n = u128::from(g.long_window());
            // long·(1 − 2/(n+1)) + short·2/(n+1), over the common denominator n + 1.
            self.long = (self.long * (n + 1 - 2) + 2 * short * SCALE) / (n + 1);
        }
        let long_before_decay = self.long;
        if self.long > 2 * short * SCALE {
            self.long = self.long * 950_000 / MILLION;
            self.coverage.decays += 1;
        }
        let whole = |e: u128| (e / SCALE).min(u128::from(u32::MAX)) as u32;
        if 2 * u128::from(in_flight) * SCALE < self.estimate {
            self.coverage.app_limited += 1;
            return whole(self.estimate);
        }
        let gradient = (u128::from(g.rtt_tolerance_ppm()) * long_before_decay / (MILLION * short))
            .clamp(SCALE / 2, SCALE);
        if SCALE / 2 < gradient && gradient < SCALE {
            self.coverage.interior_gradients += 1;
        }
        let target = self.estimate * gradient / SCALE + u128::from(g.queue_size()) * SCALE;
        let s = u128::from(g.smoothing_ppm());
        let smoothed = (self.estimate * (MILLION - s) + target * s) / MILLION;
        self.estimate = smoothed
            .max(u128::from(g.min()) * SCALE)
            .min(u128::from(g.max()) * SCALE);
        whole(self.estimate)
    }

    fn estimate_micros(&self) -> u64 {
        match self.config.algorithm() {
            Algorithm::Gradient2(_) => (self.estimate * MILLION / SCALE) as u64,
            _ => u64::from(self.limit) * 1_000_000,
        }
    }

    fn rtt_no_load(&self) -> Option<Duration> {
        match self.config.algorithm() {
            Algorithm::Gradient2(_) if !self.first.is_empty() => {
                Some(Duration::from_nanos((self.long / SCALE) as u64))
            }
            _ => None,
        }
    }
}

/// The next `now`: mostly forward by up to a second, sometimes back or unchanged, and only
/// one step in 256 a leap to the end of time (after which no window closes again, so the
/// shared `Cursor::time_step`'s 1 in 16 would leave windowed runs mostly stuck).
fn time_step(c: &mut Cursor<'_>, now: Instant) -> Instant {
    match c.u8() {
        0 => Instant::MAX.saturating_sub(Duration::from_nanos(u64::from(c.u8()))),
        1..=15 => now.saturating_sub(Duration::from_micros(u64::from(c.u16()))),
        16..=31 => now,
        _ => now + Duration::from_micros(u64::from(c.u16()) * 16),
    }
}

/// A window time: mostly 1 µs to about 0.5 s, one in eight anything `Cursor::duration` gives.
fn window_time(c: &mut Cursor<'_>) -> Duration {
    match c.below(8) {
        0 => c.duration(),
        _ => Duration::from_micros(1 + u64::from(c.u16()) * 8),
    }
}

fn limits(c: &mut Cursor<'_>) -> (u32, u32, u32) {
    match c.below(4) {
        // Mostly valid, small.
        0 | 1 => {
            let min = 1 + u32::from(c.below(20));
            let max = min + u32::from(c.u8());
            let initial = min + u32::from(c.u8()) % (max - min + 1);
            (min, initial, max)
        }
        2 => (
            c.small_or_extreme_u32(),
            c.small_or_extreme_u32(),
            c.small_or_extreme_u32(),
        ),
        _ => (1, 1, u32::MAX),
    }
}

fn ppm(c: &mut Cursor<'_>, lo: u32, hi: u32) -> u32 {
    match c.below(8) {
        0 => c.u32(),
        1 => lo,
        2 => hi,
        _ => lo + c.u32() % (hi - lo + 1),
    }
}

fn config(c: &mut Cursor<'_>) -> LimiterConfig {
    let (min, initial, max) = limits(c);
    let base = match c.below(2) {
        0 => LimiterConfig::aimd(
            AimdConfig::default()
                .with_limits(min, initial, max)
                .with_backoff_ratio_ppm(ppm(c, 500_000, 999_999))
                .with_timeout(c.duration()),
        ),
        _ => LimiterConfig::gradient2(
            Gradient2Config::default()
                .with_limits(min, initial, max)
                .with_smoothing_ppm(ppm(c, 1, 1_000_000))
                .with_queue_size(c.small_or_extreme_u32())
                .with_long_window(match c.below(4) {
                    0 => c.u32(),
                    1 => 1 << 20,
                    _ => 1 + u32::from(c.u16() % 1_000),
                })
                .with_rtt_tolerance_ppm(ppm(c, 1_000_000, 1_000_000_000)),
        ),
    };
    if c.bool() {
        // Mostly in order (the max at least the min); one in eight drawn apart.
        let min_window = window_time(c);
        let max_window = if c.below(8) == 0 {
            window_time(c)
        } else {
            min_window.saturating_add(window_time(c))
        };
        base.with_window(
            SampleWindowConfig::default()
                .with_window_time(min_window, max_window)
                .with_window_size(u32::from(c.u8() % 12))
                .with_min_rtt_threshold(match c.below(3) {
                    0 => Duration::ZERO,
                    1 => c.duration(),
                    _ => Duration::from_micros(u64::from(c.u16())),
                }),
        )
    } else {
        base
    }
}

/// Runs the bytes; `Err` describes the first disagreement.
pub fn check(data: &[u8]) -> Result<(), Divergence> {
    run(data).map(|_| ())
}

/// [`check`], returning what the run reached.
fn run(data: &[u8]) -> Result<Coverage, Divergence> {
    let mut c = Cursor::new(data);
    let cfg = config(&mut c);
    let machine = Limiter::new(cfg);
    if machine.is_ok() != valid(&cfg) {
        return Err(format!(
            "{cfg:?}: machine says {:?}, reference says valid = {}",
            machine.as_ref().err(),
            valid(&cfg)
        ));
    }
    let Ok(mut machine) = machine else {
        return Ok(Coverage::default());
    };
    let mut reference = Reference::new(cfg);
    let (min, _, max) = cfg.limits();
    let mut now = Instant::ZERO;
    let mut step = 0u32;
    while !c.is_empty() {
        now = time_step(&mut c, now);
        let rtt = c.duration();
        let backwards = c.below(16) == 0;
        let in_flight = match c.below(4) {
            0 => c.small_or_extreme_u32(),
            _ => u32::from(c.u8()),
        };
        let outcome = match c.select(3) {
            Some(0) | None => Outcome::Ok,
            Some(1) => Outcome::Dropped,
            _ => Outcome::Rejected,
        };
        let start = now.saturating_sub(rtt);
        let sample = if backwards {
            // An end before its start: a round trip of zero.
            Sample {
                start: now,
                end: start,
                in_flight,
                outcome,
            }
        } else {
            Sample {
                start,
                end: now,
                in_flight,
                outcome,
            }
        };
        let got = machine.on_sample(now, sample);
        let want = reference.sample(now.as_nanos(), ns(sample.rtt()), in_flight, outcome);
        let state = |l: &Limiter| (l.limit(), l.estimate_micros(), l.rtt_no_load());
        let want_state = (
            reference.limit,
            reference.estimate_micros(),
            reference.rtt_no_load(),
        );
        if got != want || state(&machine) != want_state {
            return Err(format!(
                "step {step}: {cfg:?}, now {now:?}, {sample:?}: machine {got:?} {:?}, \
                 reference {want:?} {want_state:?}",
                state(&machine)
            ));
        }
        if !(min..=max).contains(&machine.limit()) {
            return Err(format!(
                "step {step}: limit {} outside [{min}, {max}]",
                machine.limit()
            ));
        }
        step += 1;
    }
    Ok(reference.coverage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_short_inputs_pass() {
        assert_eq!(check(&[]), Ok(()));
        assert_eq!(check(&[0, 3, 5, 1, 200, 7, 9, 1, 0, 4]), Ok(()));
    }

    #[test]
    #[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
    fn random_bytes_reach_valid_configurations_with_and_without_a_window() {
        // The decoder must not drift into testing refusals only.
        use crate::rng::{Rng, SplitMix64};
        let mut rng = SplitMix64::new(3);
        let (mut accepted, mut windowed) = (0, 0);
        for _ in 0..1000 {
            let data: Vec<u8> = (0..64).map(|_| rng.next_u64() as u8).collect();
            let cfg = config(&mut Cursor::new(&data));
            if valid(&cfg) {
                accepted += 1;
                windowed += usize::from(cfg.window().is_some());
            }
        }
        assert!(
            accepted >= 300 && windowed >= 120,
            "valid {accepted}, windowed {windowed}"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
    fn random_bytes_reach_every_interesting_state() {
        use crate::rng::{Rng, SplitMix64};
        let mut rng = SplitMix64::new(11);
        let mut total = Coverage::default();
        for _ in 0..400 {
            let data: Vec<u8> = (0..2048).map(|_| rng.next_u64() as u8).collect();
            let c = run(&data).unwrap_or_else(|d| panic!("{d}"));
            total.windowed_after_warmup += c.windowed_after_warmup;
            total.decays += c.decays;
            total.app_limited += c.app_limited;
            total.interior_gradients += c.interior_gradients;
            total.aimd_decreases += c.aimd_decreases;
        }
        let t = total;
        assert!(
            t.windowed_after_warmup >= 50
                && t.decays >= 50
                && t.app_limited >= 50
                && t.interior_gradients >= 50
                && t.aimd_decreases >= 50,
            "{t:?}"
        );
    }

    #[test]
    fn the_reference_refuses_what_the_page_refuses() {
        let g = Gradient2Config::default();
        assert!(valid(&LimiterConfig::gradient2(g)));
        assert!(!valid(&LimiterConfig::gradient2(
            g.with_long_window((1 << 20) + 1)
        )));
        assert!(!valid(&LimiterConfig::aimd(
            AimdConfig::default().with_limits(2, 1, 3)
        )));
    }

    #[test]
    #[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
    fn pseudo_random_inputs_pass() {
        crate::model::random_inputs_pass(check, 7, 400, 768);
    }
}
