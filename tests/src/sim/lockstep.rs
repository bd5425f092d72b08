//! Scenario 4: lockstep retries. Clients lose their (throttling) server at t = 0 and retry
//! with the Gobblin throttling-client backoff (500 ms, ×2, at most 10 s) under each jitter
//! strategy; the server comes back at `recover` with a finite admission rate.
//!
//! Model: every client's call fails at t = 0. A call reaches the server `rtt/2` after it is
//! sent; while the server is down it fails, afterwards a token bucket (`rate` per second,
//! `burst` tokens) admits it or refuses it (throttled), and either answer is back `rtt/2`
//! later. A failed call is retried after the client's next backoff delay. The naive client is
//! Gobblin's before its change: the same sequence with no jitter (every client computes the
//! same delays, so they retry in the same instant).

use std::time::Duration;

use throttle_sansio::Instant;
use throttle_sansio::backoff::{Backoff, BackoffConfig, Jitter};
use throttle_sansio::rng::SplitMix64;

use super::table::{Table, thousands};
use super::{EventQueue, at_secs, scaled};

/// The jitter strategies compared, in table order.
pub const STRATEGIES: [(&str, Jitter); 6] = [
    ("no jitter (naive)", Jitter::None),
    ("proportional +-20%", Jitter::Proportional { ppm: 200_000 }),
    (
        "additive [0,500ms) (Gobblin fix)",
        Jitter::Additive {
            range: Duration::from_millis(500),
        },
    ),
    ("full", Jitter::Full),
    ("equal", Jitter::Equal),
    ("decorrelated", Jitter::Decorrelated),
];

/// Histogram bin width for "arrivals per 10 ms".
pub const BIN: Duration = Duration::from_millis(10);

/// Parameters of the lockstep scenario.
#[derive(Debug, Clone)]
pub struct LockstepParams {
    /// Clients that lose the server at t = 0.
    pub clients: u32,
    /// When the server is back.
    pub recover: Duration,
    /// Admissions per second once back.
    pub rate: u64,
    /// Token-bucket depth (admissions in a burst).
    pub burst: u64,
    /// Round-trip time of a call.
    pub rtt: Duration,
    /// Stop here even if some clients have not succeeded.
    pub horizon: Duration,
}

impl LockstepParams {
    /// 10,000 clients (× `scale`), server back at 10 s admitting 5,000 calls/s (burst 50, i.e.
    /// 10 ms worth), 1 ms RTT, one simulated hour at most.
    pub fn full(scale: f64) -> Self {
        let clients = scaled(10_000, scale, 1);
        LockstepParams {
            clients: clients as u32,
            recover: Duration::from_secs(10),
            // Capacity scales with the fleet so the contention stays the same.
            rate: scaled(5_000, scale, 1),
            burst: scaled(50, scale, 1),
            rtt: Duration::from_millis(1),
            horizon: Duration::from_secs(3_600),
        }
    }
}

/// What one strategy did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockstepResult {
    /// Most arrivals at the server in one 10 ms bin.
    pub peak_per_bin: u64,
    /// Retries sent (the call that failed at t = 0 is not counted).
    pub calls: u64,
    /// Calls refused by the token bucket after recovery.
    pub throttled: u64,
    /// When the last client succeeded (`None`: not all within the horizon).
    pub all_succeeded_at: Option<Instant>,
    /// Clients that succeeded.
    pub succeeded: u64,
    /// Retry arrivals per 10 ms bin from t = 0.
    pub histogram: Vec<u64>,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    /// A client's call reaches the server.
    Arrive(u32),
    /// A client learns its call failed and schedules the retry.
    Failed(u32),
}

/// Run one strategy.
pub fn run(p: &LockstepParams, jitter: Jitter, seed: u64) -> LockstepResult {
    let cfg = BackoffConfig::builder()
        .initial(Duration::from_millis(500))
        .max(Duration::from_secs(10))
        .multiplier(2, 1)
        .jitter(jitter)
        .build()
        .expect("valid backoff");
    let mut rng = SplitMix64::new(seed ^ 0x10C5);
    let mut backoffs = vec![Backoff::new(); p.clients as usize];
    let mut q: EventQueue<Ev> = EventQueue::new();
    let mut res = LockstepResult::default();
    let recover = Instant::ZERO + p.recover;
    let horizon = Instant::ZERO + p.horizon;
    let half = p.rtt / 2;
    // Token bucket in integer nano-tokens: one token is 10^9 nano-tokens.
    let cap = p.burst.max(1) * 1_000_000_000;
    let mut tokens = cap;
    let mut last = recover;
    // The call at t = 0 fails for everyone alike; what differs is the retries, so only they
    // are counted and binned.
    for c in 0..p.clients {
        q.at(Instant::ZERO + half, Ev::Failed(c));
    }
    while let Some((now, ev)) = q.pop() {
        if now > horizon {
            break;
        }
        match ev {
            Ev::Arrive(c) => {
                res.calls += 1;
                let bin = (now.as_nanos() / BIN.as_nanos() as u64) as usize;
                if res.histogram.len() <= bin {
                    res.histogram.resize(bin + 1, 0);
                }
                res.histogram[bin] += 1;
                if now < recover {
                    q.after(half, Ev::Failed(c));
                    continue;
                }
                let elapsed = now.saturating_duration_since(last).as_nanos() as u64;
                tokens = (tokens + elapsed.saturating_mul(p.rate)).min(cap);
                last = now;
                if tokens >= 1_000_000_000 {
                    tokens -= 1_000_000_000;
                    res.succeeded += 1;
                    if res.succeeded == u64::from(p.clients) {
                        res.all_succeeded_at = Some(now + half);
                    }
                } else {
                    res.throttled += 1;
                    q.after(half, Ev::Failed(c));
                }
            }
            Ev::Failed(c) => {
                let delay = backoffs[c as usize]
                    .next_delay(&cfg, &mut rng)
                    .unwrap_or(Duration::from_secs(10));
                q.after(delay + half, Ev::Arrive(c));
            }
        }
    }
    res.peak_per_bin = res.histogram.iter().copied().max().unwrap_or(0);
    res
}

/// Every strategy on the same parameters.
#[derive(Debug, Clone)]
pub struct LockstepReport {
    /// The parameters.
    pub params: LockstepParams,
    /// `(name, result)` in [`STRATEGIES`] order.
    pub results: Vec<(&'static str, LockstepResult)>,
}

/// Run all strategies.
pub fn compare(p: &LockstepParams, seed: u64) -> LockstepReport {
    LockstepReport {
        params: p.clone(),
        results: STRATEGIES
            .iter()
            .map(|&(name, j)| (name, run(p, j, seed)))
            .collect(),
    }
}

impl LockstepReport {
    /// The printed table.
    pub fn table(&self) -> Table {
        let p = &self.params;
        let mut t = Table::new(
            format!(
                "lockstep retries: {} clients lose the server at 0 s, back at {:?} admitting {}/s (burst {}); backoff 500ms x2 <=10s",
                p.clients, p.recover, p.rate, p.burst
            ),
            &[
                "jitter",
                "peak arrivals/10ms",
                "retries sent",
                "throttled",
                "all succeeded at",
            ],
        );
        for (name, r) in &self.results {
            t.row(vec![
                (*name).into(),
                thousands(r.peak_per_bin),
                thousands(r.calls),
                thousands(r.throttled),
                r.all_succeeded_at.map_or_else(
                    || {
                        format!(
                            "not by {:?} ({} left)",
                            p.horizon,
                            u64::from(p.clients) - r.succeeded
                        )
                    },
                    |t| format!("{:.2} s", at_secs(t)),
                ),
            ]);
        }
        t
    }

    /// The arrival histograms as an SVG document (one panel per strategy, first `span`).
    pub fn svg(&self, span: Duration) -> String {
        let series: Vec<(&str, &[u64])> = self
            .results
            .iter()
            .map(|(n, r)| (*n, r.histogram.as_slice()))
            .collect();
        super::svg::histogram_panels(
            &format!(
                "Arrivals per 10 ms at the server: {} clients, server down until {} s",
                self.params.clients,
                self.params.recover.as_secs()
            ),
            &series,
            BIN,
            span,
        )
    }
}
