//! Scenario 3: read batching at maximum rate. A window of 4 batches in flight per shard
//! against unbounded dispatch.
//!
//! Model: `outstanding` reads are kept in flight by a closed loop: each delivered read is
//! re-issued after an application think time `U[0, think]`. One batcher thread (the client's
//! event loop) takes inputs one at a time from its queue: a read costs `c_op`, a response
//! `c_resp + c_deliver × reads`, and every batch it sends costs `c_send` (serialisation and the
//! gRPC write); when its queue is empty it calls `flush`. A batch travels `rtt/2` to the server
//! (one shard), waits for one of `server_workers` threads, costs `per_rpc + per_read × reads`
//! there, and the response travels back `rtt/2` into the batcher's queue.
//! The naive client is the same reader with no in-flight limit (Oxia 0.9.3's read path).

use std::collections::VecDeque;
use std::time::Duration;

use throttle_sansio::Instant;
use throttle_sansio::dispatch_window::CreditId;
use throttle_sansio::rng::SplitMix64;

use super::reader::{ReadId, ReaderAction, RefReader};
use super::table::{Table, thousands};
use super::{EventQueue, WorkerPool, quantile, scaled, uniform};

/// Parameters of the read-batching scenario.
#[derive(Debug, Clone)]
pub struct ReadParams {
    /// Reads kept in flight by the application.
    pub outstanding: u32,
    /// Reads to serve in all (the application stops issuing after this many).
    pub total_reads: u64,
    /// Largest batch (`maxRequestsPerBatch`).
    pub max_per_batch: u32,
    /// Round-trip network time.
    pub rtt: Duration,
    /// Server worker threads.
    pub server_workers: usize,
    /// Server time per RPC.
    pub per_rpc: Duration,
    /// Server time per read.
    pub per_read: Duration,
    /// Client batcher time per read taken from its queue.
    pub c_op: Duration,
    /// Client batcher time per batch sent.
    pub c_send: Duration,
    /// Client batcher time per response.
    pub c_resp: Duration,
    /// Client batcher time per read delivered.
    pub c_deliver: Duration,
    /// Largest application think time between a delivery and the next read.
    pub think: Duration,
}

impl ReadParams {
    /// 10,000 outstanding reads serving 5 M reads in all (both × `scale`); a 2-thread server
    /// where an RPC costs 30 µs and a read 1 µs; 100 µs RTT; batcher costs 0.2 µs per read,
    /// 20 µs per send, 1 µs per response + 0.1 µs per delivery; think time up to 1 ms.
    pub fn full(scale: f64) -> Self {
        ReadParams {
            outstanding: scaled(10_000, scale, 1) as u32,
            total_reads: scaled(5_000_000, scale, 1),
            max_per_batch: 1_000,
            rtt: Duration::from_micros(100),
            server_workers: 2,
            per_rpc: Duration::from_micros(30),
            per_read: Duration::from_micros(1),
            c_op: Duration::from_nanos(200),
            c_send: Duration::from_micros(20),
            c_resp: Duration::from_micros(1),
            c_deliver: Duration::from_nanos(100),
            think: Duration::from_millis(1),
        }
    }
}

/// What one client did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadResult {
    /// Read RPCs sent.
    pub rpcs: u64,
    /// Reads delivered.
    pub reads: u64,
    /// Largest batch sent.
    pub max_batch: u64,
    /// Read latency (issue to delivery), 50th percentile.
    pub p50: Duration,
    /// Read latency, 99th percentile.
    pub p99: Duration,
    /// Server busy fraction (0..1).
    pub server_utilisation: f64,
    /// When the last read was delivered.
    pub elapsed: Duration,
}

impl ReadResult {
    /// Mean reads per RPC.
    pub fn reads_per_rpc(&self) -> f64 {
        self.reads as f64 / self.rpcs.max(1) as f64
    }
}

#[derive(Debug)]
enum Ev {
    Issue(ReadId),
    Step,
    Arrive(CreditId, usize),
    Reply(CreditId),
}

#[derive(Debug)]
enum Input {
    Op(ReadId),
    Resp(CreditId),
}

/// Run one client (`max_in_flight = None`: unbounded).
pub fn run(p: &ReadParams, max_in_flight: Option<u32>, seed: u64) -> ReadResult {
    let mut reader = RefReader::new(max_in_flight, p.max_per_batch).expect("valid reader");
    let mut rng = SplitMix64::new(seed ^ 0x8EAD);
    let mut q: EventQueue<Ev> = EventQueue::new();
    let mut pool = WorkerPool::new(p.server_workers);
    let mut inputs: VecDeque<Input> = VecDeque::new();
    let mut busy = false;
    let mut issued = vec![Instant::ZERO; p.outstanding as usize];
    let mut latencies: Vec<Duration> = Vec::new();
    let mut res = ReadResult::default();
    let half = p.rtt / 2;
    let mut issued_total = 0u64;
    for id in 0..u64::from(p.outstanding).min(p.total_reads) {
        issued_total += 1;
        q.at(Instant::ZERO, Ev::Issue(id));
    }
    while let Some((now, ev)) = q.pop() {
        let input = match ev {
            Ev::Issue(id) => {
                issued[id as usize] = now;
                Some(Input::Op(id))
            }
            Ev::Reply(credit) => Some(Input::Resp(credit)),
            Ev::Arrive(credit, n) => {
                let cost = p.per_rpc + p.per_read * n as u32;
                let (_, done) = pool.serve(now, cost);
                q.at(done + half, Ev::Reply(credit));
                None
            }
            Ev::Step => {
                let mut cost = Duration::ZERO;
                match inputs.pop_front() {
                    Some(Input::Op(id)) => {
                        cost += p.c_op;
                        let _ = reader.submit(now, 0, id);
                    }
                    Some(Input::Resp(credit)) => {
                        cost += p.c_resp;
                        reader.handle_response(now, credit);
                    }
                    None => reader.flush(now),
                }
                let mut sent = false;
                while let Some(action) = reader.poll_action() {
                    match action {
                        ReaderAction::Send { credit, reads, .. } => {
                            cost += p.c_send;
                            sent = true;
                            res.rpcs += 1;
                            res.max_batch = res.max_batch.max(reads as u64);
                            q.at(now + cost + half, Ev::Arrive(credit, reads));
                        }
                        ReaderAction::Deliver(id) | ReaderAction::Fail(id) => {
                            cost += p.c_deliver;
                            res.reads += 1;
                            latencies.push(now + cost - issued[id as usize]);
                            res.elapsed = (now + cost).saturating_duration_since(Instant::ZERO);
                            if issued_total < p.total_reads {
                                issued_total += 1;
                                let think = uniform(&mut rng, Duration::ZERO, p.think);
                                q.at(now + cost + think, Ev::Issue(id));
                            }
                        }
                    }
                }
                if inputs.is_empty() && !sent && cost == Duration::ZERO {
                    busy = false;
                } else {
                    q.at(now + cost, Ev::Step);
                }
                None
            }
        };
        if let Some(input) = input {
            inputs.push_back(input);
            if !busy {
                busy = true;
                q.at(now, Ev::Step);
            }
        }
    }
    res.p50 = quantile(&mut latencies, 0.50);
    res.p99 = quantile(&mut latencies, 0.99);
    res.server_utilisation =
        pool.busy().as_secs_f64() / (res.elapsed.as_secs_f64() * p.server_workers as f64);
    res
}

/// Both clients on the same parameters.
#[derive(Debug, Clone)]
pub struct ReadReport {
    /// The parameters.
    pub params: ReadParams,
    /// Unbounded dispatch.
    pub naive: ReadResult,
    /// Window of 4.
    pub ours: ReadResult,
}

/// Run naive (unbounded) and ours (window 4).
pub fn compare(p: &ReadParams, seed: u64) -> ReadReport {
    ReadReport {
        params: p.clone(),
        naive: run(p, None, seed),
        ours: run(p, Some(4), seed),
    }
}

impl ReadReport {
    /// The printed table.
    pub fn table(&self) -> Table {
        let p = &self.params;
        let mut t = Table::new(
            format!(
                "read batching: {} outstanding reads, {} reads in all, server {} threads, {:?}/RPC + {:?}/read",
                p.outstanding,
                thousands(p.total_reads),
                p.server_workers,
                p.per_rpc,
                p.per_read
            ),
            &[
                "client",
                "RPCs",
                "reads/RPC",
                "max batch",
                "reads/s",
                "took",
                "p50",
                "p99",
                "server busy",
            ],
        );
        for (name, r) in [
            ("naive (unbounded dispatch)", &self.naive),
            ("ours (window 4)", &self.ours),
        ] {
            t.row(vec![
                name.into(),
                thousands(r.rpcs),
                format!("{:.1}", r.reads_per_rpc()),
                thousands(r.max_batch),
                thousands((r.reads as f64 / r.elapsed.as_secs_f64().max(1e-9)).round() as u64),
                format!("{:.3} s", r.elapsed.as_secs_f64()),
                format!("{:.2} ms", r.p50.as_secs_f64() * 1e3),
                format!("{:.2} ms", r.p99.as_secs_f64() * 1e3),
                format!("{:.0} %", r.server_utilisation * 100.0),
            ]);
        }
        t
    }
}
