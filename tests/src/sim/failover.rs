//! Scenario 5: coordinator failover during admin writes.
//!
//! Model: `callers` application tasks each issue admin writes (e.g. `createTable`) in a closed
//! loop, `think` apart. Coordinators all carry uid 0 (`cs-0`) and live at hosts 0, 1, 2, …;
//! host 0 leads first. At each failover the leader stalls for `pause` (its ZooKeeper session
//! expires) and the next host takes over `takeover` after the stall began; the old leader
//! resumes as a live standby that answers "not the leader" (checked before executing). A
//! coordinator executes writes one at a time (`exec` each); a write that started before the
//! stall is executed, but its response leaves only when the stall ends, after the client's
//! `timeout`, so the client sees a timeout for a write that did happen. Metadata refreshes take
//! `refresh` and return the leader as of their midpoint (the old one during the takeover gap).
//!
//! Clients:
//! - naive: the admin write gateway before the fix: no metadata refresh, connections keyed by
//!   uid only, every error surfaces to the application (which issues its next write).
//! - retry-all: refresh and retry once on every recoverable error (the first version of the
//!   upstream fix, before review) with the fixed `ConnTable`: it recovers, but retries writes
//!   whose outcome was unknown.
//! - ours: [`Call`] with the admin-write classification (not-leader: refresh and retry;
//!   timeout: refresh, then surface), one coalesced refresh for all callers
//!   ([`RefreshCoalescer`]), connections keyed by uid + host + port ([`ConnTable`]).

use std::collections::HashMap;
use std::time::Duration;

use throttle_sansio::Instant;
use throttle_sansio::conn_key::{ConnConfig, ConnId, ConnKey, ConnTable, Route};
use throttle_sansio::failover::{
    AdminWriteGateway, Call, CallAction, CallConfig, CoalesceAction, ErrorClassifier, ErrorKind,
    Generation, ReadOnlyGateway, RefreshCoalescer, Unlimited,
};
use throttle_sansio::rng::SplitMix64;

use super::table::{Table, thousands};
use super::{DetHasher, EventQueue, WorkerPool, at_secs};

/// Parameters of the failover scenario.
#[derive(Debug, Clone)]
pub struct FailoverParams {
    /// Concurrent application tasks issuing admin writes.
    pub callers: u32,
    /// Pause between a task's writes.
    pub think: Duration,
    /// Failovers during the run.
    pub failovers: u32,
    /// When the first failover happens.
    pub first_failover: Duration,
    /// Time between failovers (and after the last one until the run ends).
    pub period: Duration,
    /// How long the old leader stalls.
    pub pause: Duration,
    /// When the new leader takes over, after the stall began.
    pub takeover: Duration,
    /// Coordinator time to execute one write.
    pub exec: Duration,
    /// Coordinator time to answer "not the leader".
    pub reject: Duration,
    /// Round-trip network time.
    pub rtt: Duration,
    /// Client request timeout.
    pub timeout: Duration,
    /// Metadata refresh latency.
    pub refresh: Duration,
}

impl FailoverParams {
    /// 16 tasks writing every 10 ms; 3 failovers 10 s apart from 2 s; a 2 s stall, takeover
    /// after 500 ms; 2 ms per write, 1 ms RTT, 1 s request timeout, 5 ms refresh.
    pub fn full(scale: f64) -> Self {
        FailoverParams {
            callers: super::scaled(16, scale, 1) as u32,
            think: Duration::from_millis(10),
            failovers: 3,
            first_failover: Duration::from_secs(2),
            period: Duration::from_secs(10),
            pause: Duration::from_secs(2),
            takeover: Duration::from_millis(500),
            exec: Duration::from_millis(2),
            reject: Duration::from_micros(100),
            rtt: Duration::from_millis(1),
            timeout: Duration::from_secs(1),
            refresh: Duration::from_millis(5),
        }
    }

    fn failover_at(&self, i: u32) -> Instant {
        Instant::ZERO + self.first_failover + self.period * i
    }

    fn end(&self) -> Instant {
        self.failover_at(self.failovers.saturating_sub(1)) + self.period
    }

    /// The leading host at `t` (during a takeover gap, the old one: it is what metadata says).
    fn leader_at(&self, t: Instant) -> u32 {
        (0..self.failovers)
            .filter(|&i| t >= self.failover_at(i) + self.takeover)
            .count() as u32
    }

    /// The stall window of `host`, if it ever stalls (the leader stalls when it loses office).
    fn stall_of(&self, host: u32) -> Option<(Instant, Instant)> {
        (host < self.failovers).then(|| {
            let s = self.failover_at(host);
            (s, s + self.pause)
        })
    }

    /// Whether `host` may execute a write starting at `t`.
    fn leads(&self, host: u32, t: Instant) -> bool {
        let from = if host == 0 {
            Instant::ZERO
        } else {
            self.failover_at(host - 1) + self.takeover
        };
        let until = if host < self.failovers {
            self.failover_at(host)
        } else {
            Instant::MAX
        };
        t >= from && t < until
    }
}

/// Which client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// No refresh, uid-keyed connection.
    Naive,
    /// Refresh and retry on every recoverable error.
    RetryAll,
    /// Ours.
    Ours,
}

/// What one client did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailoverResult {
    /// Writes that completed successfully.
    pub completed: u64,
    /// Errors surfaced to the application.
    pub surfaced: u64,
    /// Of those, writes that had in fact executed (unknown outcome reported as an error).
    pub surfaced_executed: u64,
    /// Writes executed more than once.
    pub executed_twice: u64,
    /// Requests sent (first sends and retries).
    pub requests: u64,
    /// Metadata refreshes started.
    pub refreshes: u64,
    /// Per failover: time from the stall to the first success sent after it (`None`: never).
    pub recovery: Vec<Option<Duration>>,
    /// Connections opened.
    pub connections: u64,
}

#[derive(Debug)]
enum Ev {
    /// A task issues its next write.
    Issue(usize),
    /// The response to attempt `seq` of task `c`'s call: `Ok(())` or an error kind.
    Reply(usize, u64, Result<(), ErrorKind>),
    /// Attempt `seq` of task `c` timed out.
    Timeout(usize, u64),
    /// Refresh `g` finished, finding `leader`.
    Refreshed(Generation, u32),
}

#[derive(Debug)]
struct Task {
    call: Call,
    write: u64,
    seq: u64,
    sent_at: Instant,
    conn: Option<ConnId>,
    waiting: bool,
}

/// Everything one run mutates.
#[derive(Debug)]
struct World<'p> {
    p: &'p FailoverParams,
    client: Client,
    rng: SplitMix64,
    q: EventQueue<Ev>,
    pools: Vec<WorkerPool>,
    executions: HashMap<u64, u32>,
    table: ConnTable<u32, u32, DetHasher>,
    /// The naive transport: one connection per uid, bound to the first address it opened.
    by_uid: HashMap<u32, u32>,
    coalescer: RefreshCoalescer<usize>,
    budget: Unlimited,
    cached_leader: u32,
    next_write: u64,
    tasks: Vec<Task>,
    res: FailoverResult,
}

impl World<'_> {
    /// Send (or resend) task `c`'s write to the host its metadata names.
    fn send(&mut self, now: Instant, c: usize) {
        let p = self.p;
        let leader = self.cached_leader;
        let t = &mut self.tasks[c];
        t.seq += 1;
        t.sent_at = now;
        t.waiting = true;
        t.conn = None;
        self.res.requests += 1;
        let (host, connect) = match self.client {
            Client::Naive => {
                let fresh = !self.by_uid.contains_key(&0);
                (*self.by_uid.entry(0).or_insert(leader), fresh)
            }
            _ => match self.table.handle_request(
                now,
                &ConnKey::new(0, leader, 9123),
                &mut SplitMix64::new(0),
            ) {
                Route::Open(id, ..) => {
                    self.table.handle_connected(now, id);
                    let _ = self.table.handle_send(now, id);
                    t.conn = Some(id);
                    (leader, true)
                }
                Route::Use(id) => {
                    let _ = self.table.handle_send(now, id);
                    t.conn = Some(id);
                    (leader, false)
                }
                _ => (leader, false),
            },
        };
        if connect {
            self.res.connections += 1;
        }
        // Opening a connection costs one round trip before the request leaves.
        let depart = if connect { now + p.rtt } else { now };
        let arrive = depart + p.rtt / 2;
        // A stalled coordinator starts nothing until its stall ends.
        let stall = p.stall_of(host);
        let ready = match stall {
            Some((s, e)) if arrive >= s && arrive < e => e,
            _ => arrive,
        };
        let pool = &mut self.pools[host as usize];
        // The leadership check happens when the coordinator picks the request up.
        let (start, _) = pool.clone().serve(ready, Duration::ZERO);
        let leads = p.leads(host, start);
        let (start, done) = pool.serve(ready, if leads { p.exec } else { p.reject });
        let outcome = if p.leads(host, start) {
            *self.executions.entry(t.write).or_insert(0) += 1;
            Ok(())
        } else {
            Err(ErrorKind::NotLeader)
        };
        // A response due during a stall leaves when the stall ends.
        let leave = match stall {
            Some((s, e)) if done >= s && done < e => e,
            _ => done,
        };
        self.q.at(leave + p.rtt / 2, Ev::Reply(c, t.seq, outcome));
        self.q.at(now + p.timeout, Ev::Timeout(c, t.seq));
    }

    /// The attempt of task `c` ended (reply or timeout): free its connection slot.
    fn finish_attempt(&mut self, now: Instant, c: usize) {
        self.tasks[c].waiting = false;
        if let Some(id) = self.tasks[c].conn.take() {
            let _ = self.table.handle_finished(now, id);
        }
    }

    fn classify(&self, kind: ErrorKind) -> throttle_sansio::failover::ErrorClass {
        match self.client {
            Client::Ours => AdminWriteGateway.classify(&kind),
            _ => ReadOnlyGateway.classify(&kind),
        }
    }

    fn succeeded(&mut self, now: Instant, c: usize) {
        self.res.completed += 1;
        let sent = self.tasks[c].sent_at;
        for i in 0..self.p.failovers {
            let f = self.p.failover_at(i);
            let r = &mut self.res.recovery[i as usize];
            if r.is_none() && sent >= f {
                *r = Some(now.saturating_duration_since(f));
            }
        }
        self.q.after(self.p.think, Ev::Issue(c));
    }

    fn surfaced(&mut self, c: usize) {
        self.res.surfaced += 1;
        if self
            .executions
            .get(&self.tasks[c].write)
            .copied()
            .unwrap_or(0)
            > 0
        {
            self.res.surfaced_executed += 1;
        }
        self.q.after(self.p.think, Ev::Issue(c));
    }

    /// Carry out what task `c`'s call asks for.
    fn act(&mut self, now: Instant, c: usize, action: CallAction) {
        match action {
            CallAction::Send { .. } | CallAction::Retry { .. } => self.send(now, c),
            CallAction::Refresh => match self.coalescer.handle_refresh_needed(c) {
                CoalesceAction::Start(g) => {
                    self.res.refreshes += 1;
                    let found = self.p.leader_at(now + self.p.refresh / 2);
                    self.q.after(self.p.refresh, Ev::Refreshed(g, found));
                }
                CoalesceAction::Join(_) => {}
                _ => self.surfaced(c),
            },
            CallAction::Surface { .. } => self.surfaced(c),
            CallAction::Complete => self.succeeded(now, c),
            _ => {}
        }
    }

    fn error(&mut self, now: Instant, c: usize, kind: ErrorKind) {
        if self.client == Client::Naive {
            self.surfaced(c);
            return;
        }
        let class = self.classify(kind);
        let t = &mut self.tasks[c];
        let action = t
            .call
            .handle_error(now, class, &mut self.budget, &mut self.rng);
        self.act(now, c, action);
    }
}

/// Run one client.
pub fn run(p: &FailoverParams, client: Client, seed: u64) -> FailoverResult {
    let hosts = p.failovers as usize + 1;
    let mut w = World {
        p,
        client,
        rng: SplitMix64::new(seed ^ 0xFA11),
        q: EventQueue::new(),
        pools: (0..hosts).map(|_| WorkerPool::new(1)).collect(),
        executions: HashMap::new(),
        table: ConnTable::new(ConnConfig::default()).expect("valid conn config"),
        by_uid: HashMap::new(),
        coalescer: RefreshCoalescer::default(),
        budget: Unlimited,
        cached_leader: 0,
        next_write: 0,
        tasks: (0..p.callers)
            .map(|_| Task {
                call: Call::new(&CallConfig::default()),
                write: 0,
                seq: 0,
                sent_at: Instant::ZERO,
                conn: None,
                waiting: false,
            })
            .collect(),
        res: FailoverResult {
            recovery: vec![None; p.failovers as usize],
            ..FailoverResult::default()
        },
    };
    let end = p.end();
    for c in 0..w.tasks.len() {
        w.q.at(Instant::ZERO, Ev::Issue(c));
    }
    while let Some((now, ev)) = w.q.pop() {
        match ev {
            Ev::Issue(c) => {
                if now >= end {
                    continue;
                }
                w.next_write += 1;
                let t = &mut w.tasks[c];
                t.write = w.next_write;
                t.call = Call::new(&CallConfig::default());
                let a = t.call.start(now, &mut w.budget);
                w.act(now, c, a);
            }
            Ev::Reply(c, seq, outcome) => {
                if w.tasks[c].seq != seq || !w.tasks[c].waiting {
                    continue; // late reply after a timeout
                }
                w.finish_attempt(now, c);
                match (outcome, client) {
                    (Ok(()), Client::Naive) => w.succeeded(now, c),
                    (Ok(()), _) => {
                        let a = w.tasks[c].call.handle_success(now, &mut w.budget);
                        w.act(now, c, a);
                    }
                    (Err(kind), _) => w.error(now, c, kind),
                }
            }
            Ev::Timeout(c, seq) => {
                if w.tasks[c].seq != seq || !w.tasks[c].waiting {
                    continue;
                }
                w.finish_attempt(now, c);
                w.error(now, c, ErrorKind::Retriable);
            }
            Ev::Refreshed(g, leader) => {
                w.cached_leader = leader;
                let _ = w.coalescer.handle_refreshed(g, true);
                while let Some(r) = w.coalescer.poll_action() {
                    let c = r.waiter;
                    let t = &mut w.tasks[c];
                    let a = t
                        .call
                        .handle_refreshed(now, r.ok, &mut w.budget, &mut w.rng);
                    w.act(now, c, a);
                }
            }
        }
    }
    w.res.executed_twice = w.executions.values().filter(|&&n| n >= 2).count() as u64;
    w.res
}

/// All three clients on the same parameters.
#[derive(Debug, Clone)]
pub struct FailoverReport {
    /// The parameters.
    pub params: FailoverParams,
    /// `(name, result)`: naive, retry-all, ours.
    pub results: Vec<(&'static str, FailoverResult)>,
}

/// Run the three clients.
pub fn compare(p: &FailoverParams, seed: u64) -> FailoverReport {
    FailoverReport {
        params: p.clone(),
        results: vec![
            ("naive (uid conn, no refresh)", run(p, Client::Naive, seed)),
            (
                "retry-all (refresh+retry any error)",
                run(p, Client::RetryAll, seed),
            ),
            (
                "ours (ConnTable + Call + coalescer)",
                run(p, Client::Ours, seed),
            ),
        ],
    }
}

impl FailoverReport {
    /// The result of one client by name prefix (`naive`, `retry-all`, `ours`).
    pub fn get(&self, prefix: &str) -> Option<&FailoverResult> {
        self.results
            .iter()
            .find(|(n, _)| n.starts_with(prefix))
            .map(|(_, r)| r)
    }

    /// The printed table.
    pub fn table(&self) -> Table {
        let p = &self.params;
        let mut t = Table::new(
            format!(
                "coordinator failover: {} tasks writing every {:?}, {} failovers ({:?} stall, takeover +{:?}), timeout {:?}, run {:.0} s",
                p.callers,
                p.think,
                p.failovers,
                p.pause,
                p.takeover,
                p.timeout,
                at_secs(p.end())
            ),
            &[
                "client",
                "writes completed",
                "errors surfaced",
                "(of which executed)",
                "executed twice",
                "requests",
                "refreshes",
                "recovery mean",
                "recovery max",
            ],
        );
        for (name, r) in &self.results {
            let rec: Vec<Duration> = r.recovery.iter().flatten().copied().collect();
            let never = rec.len() < r.recovery.len();
            let fmt = |d: Option<Duration>| match (d, never) {
                (_, true) => "never".to_string(),
                (Some(d), false) => format!("{:.3} s", d.as_secs_f64()),
                (None, false) => "-".to_string(),
            };
            let mean = (!rec.is_empty()).then(|| rec.iter().sum::<Duration>() / rec.len() as u32);
            t.row(vec![
                (*name).into(),
                thousands(r.completed),
                thousands(r.surfaced),
                thousands(r.surfaced_executed),
                thousands(r.executed_twice),
                thousands(r.requests),
                thousands(r.refreshes),
                fmt(mean),
                fmt(rec.iter().max().copied()),
            ]);
        }
        t
    }
}
