//! Scenario 6: a shard server whose capacity drops 4× for a while (issue 18 item 4). A fixed
//! window per shard against the adaptive limiters (AIMD, Gradient2) driving the same window.
//!
//! Model: `users` closed-loop callers each issue one request (one batch of one operation) to
//! the shard, wait for its answer, think `U[0, think]`, and issue the next. The client's
//! [`DispatchWindow`] holds back the requests that find no credit (FIFO). A request travels
//! `rtt/2` to the server, which runs `workers` of them at once (`U[0.8, 1.2] × service`
//! each) and queues up to `queue_bound` more, first come first served; a request arriving at
//! a full queue is dropped (answered at once with an error), and its caller sends it again
//! at once (a retry keeps the request's first issue time, so its latency counts the drop).
//! The answer travels `rtt/2` back. At `phase` the server's workers drop from `workers` to
//! `workers / 4`, and at `2 × phase` they come back.
//!
//! Each client is the same window: fixed at a limit, or driven by a
//! [`PerShard`] limiter (the batch driver's wiring: an
//! answered batch is `Ok`, a dropped one is a drop). Per phase (`[0, phase)`,
//! `[phase, 2·phase)`, `[2·phase, 3·phase)`, each without its first `settle`, which leaves out
//! the start and the 2 s after each change) it reports the requests answered per second and
//! the p50/p99 latency of the answered ones (first issue to answer, waits in the window and
//! retries included).

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::time::Duration;

use throttle_sansio::Instant;
use throttle_sansio::dispatch_window::{CreditId, DispatchWindow, WindowConfig};
use throttle_sansio::limiter::{AimdConfig, BatchEnd, Gradient2Config, LimiterConfig, PerShard};
use throttle_sansio::rng::SplitMix64;

use super::table::{Table, thousands};
use super::{DetHasher, EventQueue, quantile, uniform};

/// Parameters of the capacity-change scenario.
#[derive(Debug, Clone)]
pub struct CapacityParams {
    /// Closed-loop callers.
    pub users: u32,
    /// Largest think time between an answer and the caller's next request.
    pub think: Duration,
    /// Round-trip network time.
    pub rtt: Duration,
    /// Server workers at full capacity (a quarter of them during the second phase).
    pub workers: u32,
    /// Mean server time per request (each draws `U[0.8, 1.2]` of it).
    pub service: Duration,
    /// Requests the server queues beyond its workers; more are dropped.
    pub queue_bound: usize,
    /// Length of each of the three phases.
    pub phase: Duration,
    /// The start of each phase left out of its figures.
    pub settle: Duration,
    /// The fixed windows tried, for the best one in hindsight.
    pub candidates: Vec<u32>,
}

impl CapacityParams {
    /// 96 callers thinking up to 2 ms; 1 ms RTT; 16 workers at 1 ms per request (16,000/s,
    /// 4,000/s in the second phase) queueing up to 64; phases of 10 s, 2 s left out of each.
    pub fn full() -> Self {
        CapacityParams {
            users: 96,
            think: Duration::from_millis(2),
            rtt: Duration::from_millis(1),
            workers: 16,
            service: Duration::from_millis(1),
            queue_bound: 64,
            phase: Duration::from_secs(10),
            settle: Duration::from_secs(2),
            candidates: vec![1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 96],
        }
    }

    /// The same server and callers on phases of 2 s, 0.5 s left out of each (the CI-sized
    /// run).
    pub fn ci() -> Self {
        CapacityParams {
            phase: Duration::from_secs(2),
            settle: Duration::from_millis(500),
            ..Self::full()
        }
    }
}

/// How a client sizes its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    /// A fixed limit.
    Fixed(u32),
    /// Netflix's AIMD (limits 1, 4, 256).
    Aimd,
    /// Netflix's Gradient2 (limits 1, 4, 256).
    Gradient2,
}

impl Sizing {
    fn name(self) -> String {
        match self {
            Sizing::Fixed(n) => format!("fixed {n}"),
            Sizing::Aimd => "AIMD".into(),
            Sizing::Gradient2 => "Gradient2".into(),
        }
    }

    fn limiter(self) -> Option<PerShard> {
        let cfg = match self {
            Sizing::Fixed(_) => return None,
            Sizing::Aimd => LimiterConfig::aimd(AimdConfig::default().with_limits(1, 4, 256)),
            Sizing::Gradient2 => {
                LimiterConfig::gradient2(Gradient2Config::default().with_limits(1, 4, 256))
            }
        };
        PerShard::new(cfg).ok()
    }
}

/// One phase's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseFigures {
    /// Requests answered per second.
    pub throughput: f64,
    /// Median latency of the answered requests.
    pub p50: Duration,
    /// 99th percentile latency of the answered requests.
    pub p99: Duration,
    /// Requests the server dropped per second.
    pub drops: f64,
}

/// What one client did.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The window's sizing.
    pub sizing: Sizing,
    /// Figures per phase (full, a quarter, full again).
    pub phases: [PhaseFigures; 3],
    /// Answered requests over the whole run.
    pub answered: u64,
    /// The window limit, sampled every [`BIN`].
    pub limit: Vec<u64>,
    /// Mean latency of the requests answered in each [`BIN`], in microseconds.
    pub latency_us: Vec<u64>,
}

/// The plots' time bin.
pub const BIN: Duration = Duration::from_millis(100);

#[derive(Debug)]
enum Ev {
    /// Caller `u` issues a new request.
    Issue(u32),
    /// Request `r` reaches the server.
    Arrive(u32),
    /// Request `r` finished on a worker.
    Finish(u32),
    /// The server's answer to `r` reaches the client: answered or dropped.
    Answer(u32, bool),
    /// The server now has this many workers.
    Workers(u32),
    /// Sample the window limit for the plot.
    Tick,
}

struct Request {
    user: u32,
    first_issue: Instant,
    credit: Option<CreditId>,
}

struct Run<'a> {
    p: &'a CapacityParams,
    q: EventQueue<Ev>,
    rng: SplitMix64,
    window: DispatchWindow<u8, u32, DetHasher>,
    limits: Option<PerShard>,
    reqs: Vec<Request>,
    // Server.
    workers: u32,
    busy: u32,
    queue: VecDeque<u32>,
    // Figures.
    latencies: [Vec<Duration>; 3],
    answered: [u64; 3],
    dropped: [u64; 3],
    total: u64,
    limit: Vec<u64>,
    bin_sum: Vec<(u64, u64)>,
}

impl Run<'_> {
    /// The phase `t` counts in, if it is past that phase's settling time.
    fn phase_of(&self, t: Instant) -> Option<usize> {
        let ns = t.as_nanos();
        let phase = self.p.phase.as_nanos() as u64;
        let i = (ns / phase.max(1)) as usize;
        (i < 3 && ns % phase >= self.p.settle.as_nanos() as u64).then_some(i)
    }

    fn end(&self) -> Instant {
        Instant::ZERO + self.p.phase * 3
    }

    /// Sends the window's dispatch of request `r` under `credit`.
    fn send(&mut self, now: Instant, r: u32, credit: CreditId) {
        self.reqs[r as usize].credit = Some(credit);
        let first = self.limits.as_mut().and_then(|l| l.on_sent(0, credit, now));
        if let Some(first) = first {
            self.resize(now, first);
        }
        self.q.after(self.p.rtt / 2, Ev::Arrive(r));
    }

    /// The limiter's new limit becomes the window's; what it sends goes out.
    fn resize(&mut self, now: Instant, limit: u32) {
        let limit = NonZeroUsize::new(limit as usize);
        for d in self.window.set_max_in_flight(&0, limit) {
            self.send(now, d.batch, d.credit);
        }
    }

    fn submit(&mut self, now: Instant, r: u32) {
        match self.window.submit(0, r) {
            Ok(Some(d)) => self.send(now, d.batch, d.credit),
            Ok(None) => {}
            Err(e) => panic!("the window refused a request: {e}"),
        }
    }

    fn start(&mut self, r: u32) {
        self.busy += 1;
        let lo = self.p.service * 4 / 5;
        let hi = self.p.service * 6 / 5;
        let cost = uniform(&mut self.rng, lo, hi);
        self.q.after(cost, Ev::Finish(r));
    }

    fn step(&mut self, now: Instant, ev: Ev) {
        match ev {
            Ev::Issue(user) => {
                let r = self.reqs.len() as u32;
                self.reqs.push(Request {
                    user,
                    first_issue: now,
                    credit: None,
                });
                self.submit(now, r);
            }
            Ev::Arrive(r) => {
                if self.busy < self.workers {
                    self.start(r);
                } else if self.queue.len() < self.p.queue_bound {
                    self.queue.push_back(r);
                } else {
                    if let Some(i) = self.phase_of(now) {
                        self.dropped[i] += 1;
                    }
                    self.q.after(self.p.rtt / 2, Ev::Answer(r, false));
                }
            }
            Ev::Finish(r) => {
                self.busy -= 1;
                self.q.after(self.p.rtt / 2, Ev::Answer(r, true));
                self.start_queued();
            }
            Ev::Workers(n) => {
                self.workers = n;
                self.start_queued();
            }
            Ev::Answer(r, ok) => self.answer(now, r, ok),
            Ev::Tick => {
                self.limit.push(u64::from(self.window.capacity_of(&0)));
                if now + BIN < self.end() {
                    self.q.after(BIN, Ev::Tick);
                }
            }
        }
    }

    fn start_queued(&mut self) {
        while self.busy < self.workers {
            let Some(next) = self.queue.pop_front() else {
                break;
            };
            self.start(next);
        }
    }

    fn answer(&mut self, now: Instant, r: u32, ok: bool) {
        let Some(credit) = self.reqs[r as usize].credit.take() else {
            return;
        };
        // As the batch driver does: release, feed the limiter, then send (a credit issued by
        // the release may reuse the released one's slot, so its `on_sent` comes after).
        let next = self.window.complete(credit);
        let end = if ok {
            BatchEnd::Answered
        } else {
            BatchEnd::Failed
        };
        let changed = self
            .limits
            .as_mut()
            .and_then(|l| l.on_end(credit, now, end));
        if let Ok(Some(d)) = next {
            self.send(now, d.batch, d.credit);
        }
        if let Some((_, limit)) = changed {
            self.resize(now, limit);
        }
        if !ok {
            // The caller sends it again at once.
            self.submit(now, r);
            return;
        }
        let req = &self.reqs[r as usize];
        let latency = now.saturating_duration_since(req.first_issue);
        let user = req.user;
        self.total += 1;
        if let Some(i) = self.phase_of(now) {
            self.answered[i] += 1;
            self.latencies[i].push(latency);
        }
        let bin = (now.as_nanos() / BIN.as_nanos() as u64) as usize;
        if self.bin_sum.len() <= bin {
            self.bin_sum.resize(bin + 1, (0, 0));
        }
        self.bin_sum[bin].0 += latency.as_micros() as u64;
        self.bin_sum[bin].1 += 1;
        if now < self.end() {
            let think = uniform(&mut self.rng, Duration::ZERO, self.p.think);
            self.q.after(think, Ev::Issue(user));
        }
    }
}

/// Runs one client for the three phases.
pub fn run(p: &CapacityParams, sizing: Sizing, seed: u64) -> RunResult {
    let initial = match sizing {
        Sizing::Fixed(n) => n.max(1) as usize,
        _ => 1,
    };
    let window = DispatchWindow::new(WindowConfig::default().with_max_in_flight(initial))
        .expect("a window of at least 1 is valid");
    let mut r = Run {
        p,
        q: EventQueue::new(),
        rng: SplitMix64::new(seed),
        window,
        limits: sizing.limiter(),
        reqs: Vec::new(),
        workers: p.workers,
        busy: 0,
        queue: VecDeque::new(),
        latencies: Default::default(),
        answered: [0; 3],
        dropped: [0; 3],
        total: 0,
        limit: Vec::new(),
        bin_sum: Vec::new(),
    };
    // As the batch driver does: the limiter's initial limit before the shard's first request.
    if let Some(first) = r.limits.as_mut().and_then(|l| l.open(0)) {
        r.resize(Instant::ZERO, first);
    }
    for u in 0..p.users {
        r.q.at(Instant::ZERO, Ev::Issue(u));
    }
    r.q.at(Instant::ZERO, Ev::Tick);
    r.q.at(Instant::ZERO + p.phase, Ev::Workers((p.workers / 4).max(1)));
    r.q.at(Instant::ZERO + p.phase * 2, Ev::Workers(p.workers));
    let end = r.end();
    while let Some((now, ev)) = r.q.pop() {
        if now >= end {
            break;
        }
        r.step(now, ev);
    }
    let counted = (p.phase.saturating_sub(p.settle)).as_secs_f64();
    let mut phases = [PhaseFigures::default(); 3];
    for (i, f) in phases.iter_mut().enumerate() {
        let lat = &mut r.latencies[i];
        *f = PhaseFigures {
            throughput: r.answered[i] as f64 / counted,
            p50: quantile(lat, 0.50),
            p99: quantile(lat, 0.99),
            drops: r.dropped[i] as f64 / counted,
        };
    }
    let latency_us = r
        .bin_sum
        .iter()
        .map(|&(sum, n)| sum.checked_div(n).unwrap_or(0))
        .collect();
    RunResult {
        sizing,
        phases,
        answered: r.total,
        limit: r.limit,
        latency_us,
    }
}

/// The comparison: a fixed window of 4, the best fixed window in hindsight (the smallest
/// candidate that answered within 1 % of the most any answered over the run), AIMD and
/// Gradient2.
#[derive(Debug, Clone)]
pub struct CapacityComparison {
    /// The scenario's parameters.
    pub params: CapacityParams,
    /// Every fixed candidate, in the order tried.
    pub fixed: Vec<RunResult>,
    /// The fixed window of 4 (Oxia's default).
    pub four: RunResult,
    /// The best fixed window in hindsight.
    pub best: RunResult,
    /// AIMD.
    pub aimd: RunResult,
    /// Gradient2.
    pub gradient2: RunResult,
}

/// Runs every client with the same seed.
pub fn compare(p: &CapacityParams, seed: u64) -> CapacityComparison {
    let mut fixed: Vec<RunResult> = p
        .candidates
        .iter()
        .map(|&n| run(p, Sizing::Fixed(n), seed))
        .collect();
    let four = match fixed.iter().find(|r| r.sizing == Sizing::Fixed(4)) {
        Some(r) => r.clone(),
        None => {
            let r = run(p, Sizing::Fixed(4), seed);
            fixed.push(r.clone());
            r
        }
    };
    // The smallest window that answered within 1 % of the most any answered: a larger one
    // adds only queueing (the same answers, later).
    let most = fixed.iter().map(|r| r.answered).max().unwrap_or(0);
    let best = fixed
        .iter()
        .filter(|r| r.answered.saturating_mul(100) >= most.saturating_mul(99))
        .min_by_key(|r| match r.sizing {
            Sizing::Fixed(n) => n,
            _ => u32::MAX,
        })
        .cloned()
        .unwrap_or_else(|| four.clone());
    CapacityComparison {
        params: p.clone(),
        fixed,
        four,
        best,
        aimd: run(p, Sizing::Aimd, seed),
        gradient2: run(p, Sizing::Gradient2, seed),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

impl CapacityComparison {
    /// The clients compared in the table and the plots.
    pub fn shown(&self) -> [&RunResult; 4] {
        [&self.four, &self.best, &self.aimd, &self.gradient2]
    }

    /// Per phase and client: throughput (and its share of the best fixed window's), p50, p99
    /// (and its ratio to the best fixed window's), drops.
    pub fn table(&self) -> Table {
        let p = &self.params;
        let mut t = Table::new(
            format!(
                "capacity change: {} callers, {} workers ({} from {} s to {} s), {} ms RTT, \
                 queue {}; phases of {} s, the first {} s of each left out; best fixed window \
                 in hindsight: {}",
                p.users,
                p.workers,
                (p.workers / 4).max(1),
                p.phase.as_secs_f64(),
                (p.phase * 2).as_secs_f64(),
                p.rtt.as_secs_f64() * 1e3,
                p.queue_bound,
                p.phase.as_secs_f64(),
                p.settle.as_secs_f64(),
                self.best.sizing.name()
            ),
            &[
                "phase",
                "client",
                "answered/s",
                "vs best",
                "p50 ms",
                "p99 ms",
                "p99 vs best",
                "drops/s",
            ],
        );
        for (i, phase) in ["full", "quarter", "full again"].iter().enumerate() {
            let best = self.best.phases[i];
            for r in self.shown() {
                let f = r.phases[i];
                t.row(vec![
                    phase.to_string(),
                    r.sizing.name(),
                    thousands(f.throughput.round() as u64),
                    format!("{:.3}", f.throughput / best.throughput.max(1e-9)),
                    ms(f.p50),
                    ms(f.p99),
                    format!(
                        "{:.2}",
                        f.p99.as_secs_f64() / best.p99.as_secs_f64().max(1e-12)
                    ),
                    thousands(f.drops.round() as u64),
                ]);
            }
        }
        t
    }

    /// Whether a client meets the issue's targets in every phase: throughput at least 95 % of
    /// the best fixed window's, p99 at most 1.2 × its p99.
    pub fn meets_targets(&self, r: &RunResult) -> bool {
        (0..3).all(|i| {
            let (f, b) = (r.phases[i], self.best.phases[i]);
            f.throughput >= 0.95 * b.throughput && f.p99.as_secs_f64() <= 1.2 * b.p99.as_secs_f64()
        })
    }

    /// The plot: each shown client's window limit, then its mean latency, per 100 ms.
    pub fn svg(&self) -> String {
        let span = self.params.phase * 3;
        let names: Vec<String> = self
            .shown()
            .iter()
            .flat_map(|r| {
                [
                    format!("{}: window limit", r.sizing.name()),
                    format!("{}: mean latency (µs)", r.sizing.name()),
                ]
            })
            .collect();
        let data: Vec<&[u64]> = self
            .shown()
            .iter()
            .flat_map(|r| [r.limit.as_slice(), r.latency_us.as_slice()])
            .collect();
        let series: Vec<(&str, &[u64])> = names.iter().map(String::as_str).zip(data).collect();
        super::svg::panels(
            "capacity change: window limit and mean latency per 100 ms",
            &series,
            BIN,
            span,
            "per 100 ms",
        )
    }
}

impl CapacityComparison {
    /// Every fixed candidate: answered over the run, and per phase throughput and p99.
    pub fn candidates_table(&self) -> Table {
        let mut t = Table::new(
            "fixed windows tried (the best in hindsight is the smallest that answered within 1 % \
             of the most)",
            &[
                "window",
                "answered",
                "full /s",
                "p99 ms",
                "quarter /s",
                "p99 ms",
                "full again /s",
                "p99 ms",
            ],
        );
        for r in &self.fixed {
            let mut row = vec![r.sizing.name(), thousands(r.answered)];
            for f in r.phases {
                row.push(thousands(f.throughput.round() as u64));
                row.push(ms(f.p99));
            }
            t.row(row);
        }
        t
    }
}
