//! Scenario 1: disk protection. Writes to a tablet server are rejected with
//! `DISK_WRITE_LOCKED` for a window; an immediately retrying writer against ours.
//!
//! Model: `writers` reference writers, each with one batch of `batch_bytes` per bucket
//! appended at t = 0, all buckets led by one tablet server. A request travels `rtt/2` each way
//! and occupies one of `server_workers` threads for `per_rpc + per_batch × batches`; the
//! server rejects every batch of a request whose service **starts** before `protection`, and
//! accepts it afterwards. Request bytes are `request_header + Σ batch bytes` (responses are not
//! counted). The naive writer is the same writer with the disk backoff input switched off:
//! on `DISK_WRITE_LOCKED` it re-enqueues the batch and the sender sends it again at once (the
//! Java client before Fluss PR #4293; unlimited retries as Fluss's default).

use std::time::Duration;

use throttle_sansio::Instant;
use throttle_sansio::backpressure::Signal;

use super::table::{Table, bytes, thousands};
use super::writer::{
    BucketId, Completion, Policy, RefWriter, Request, Sleep, WriteBatch, WriteOutcome, WriterConfig,
};
use super::{EventQueue, WorkerPool, at_secs, scaled};

/// Parameters of the disk-protection scenario.
#[derive(Debug, Clone)]
pub struct DiskParams {
    /// Writer clients.
    pub writers: u32,
    /// Buckets each writer writes one batch to.
    pub buckets: u32,
    /// How long disk protection rejects writes, from t = 0.
    pub protection: Duration,
    /// Round-trip network time.
    pub rtt: Duration,
    /// Server time per request.
    pub per_rpc: Duration,
    /// Server time per batch in a request.
    pub per_batch: Duration,
    /// Server worker threads.
    pub server_workers: usize,
    /// Payload bytes of each batch.
    pub batch_bytes: u64,
    /// Bytes of a request besides its batches.
    pub request_header: u64,
}

impl DiskParams {
    /// The setup of Fluss PR #4293's traffic comparison: one writer, one bucket, 5 s of protection.
    /// 50 µs RTT plus 17 µs of server time per rejected request gives one round trip per 67 µs,
    /// about 74 thousand requests in 5 s; a request is 4,158 bytes (PR #4293's bytes per RPC).
    pub fn single() -> Self {
        DiskParams {
            writers: 1,
            buckets: 1,
            protection: Duration::from_secs(5),
            rtt: Duration::from_micros(50),
            per_rpc: Duration::from_micros(12),
            per_batch: Duration::from_micros(5),
            server_workers: 16,
            batch_bytes: 4_100,
            request_header: 58,
        }
    }

    /// 1,000 buckets × 100 writers on the same server (16 worker threads).
    pub fn fleet(scale: f64) -> Self {
        DiskParams {
            writers: scaled(100, scale, 1) as u32,
            buckets: scaled(1_000, scale, 1) as u32,
            ..Self::single()
        }
    }
}

/// What one client population did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiskResult {
    /// Requests sent.
    pub rpcs: u64,
    /// Requests sent whose batches were all rejected.
    pub rejected_rpcs: u64,
    /// Batch sends rejected.
    pub rejected_batches: u64,
    /// Request bytes sent.
    pub bytes: u64,
    /// Request bytes sent while protection was on (requests sent before it ended).
    pub bytes_in_window: u64,
    /// When the last batch was acknowledged.
    pub completed_at: Instant,
    /// Batches that failed (exhausted retries).
    pub failed: u64,
    /// Events the simulator processed.
    pub events: u64,
    /// Batch sends before the bucket's gate opened (summed over writers; must be 0).
    pub early_sends: u64,
    /// The longest a bucket waited past its gate's opening (over writers): the wake slack
    /// at most, since the simulated timers are exact and each bucket has one batch.
    pub max_late: Duration,
}

#[derive(Debug)]
enum Ev {
    Wake(usize),
    Respond(usize, Vec<(WriteBatch, WriteOutcome)>),
}

/// Run one population of writers under `policy`.
pub fn run(p: &DiskParams, policy: Policy, seed: u64) -> DiskResult {
    let cfg = WriterConfig {
        batch_bytes: p.batch_bytes.max(1),
        policy,
        ..WriterConfig::default()
    };
    let mut q: EventQueue<Ev> = EventQueue::new();
    let mut pool = WorkerPool::new(p.server_workers);
    let mut res = DiskResult::default();
    let protection_end = Instant::ZERO + p.protection;
    let half = p.rtt / 2;
    let mut writers: Vec<(RefWriter, Sleep)> = (0..p.writers)
        .map(|w| {
            let mut wr = RefWriter::new(cfg.clone(), seed ^ (u64::from(w) << 20) ^ 0xD15C);
            for b in 0..p.buckets {
                wr.set_leader(Instant::ZERO, b as BucketId, Some(0));
                wr.append(Instant::ZERO, b as BucketId, p.batch_bytes);
            }
            (wr, Sleep::default())
        })
        .collect();

    // Send everything the writer can send now, then re-arm its sleep.
    let pump = |now: Instant,
                w: usize,
                writers: &mut [(RefWriter, Sleep)],
                q: &mut EventQueue<Ev>,
                pool: &mut WorkerPool,
                res: &mut DiskResult| {
        let (wr, sleep) = &mut writers[w];
        for req in wr.drain(now) {
            let Request { batches, .. } = req;
            let n = batches.len() as u64;
            let size = p.request_header + batches.iter().map(|b| b.bytes).sum::<u64>();
            res.rpcs += 1;
            res.bytes += size;
            if now < protection_end {
                res.bytes_in_window += size;
            }
            let cost = p.per_rpc + p.per_batch * n as u32;
            let (start, done) = pool.serve(now + half, cost);
            let outcome = if start < protection_end {
                res.rejected_rpcs += 1;
                res.rejected_batches += n;
                WriteOutcome::DiskWriteLocked
            } else {
                WriteOutcome::Ok {
                    pressure: Signal::Clear,
                }
            };
            let answers = batches.into_iter().map(|b| (b, outcome)).collect();
            q.at(done + half, Ev::Respond(w, answers));
        }
        if let Some(at) = sleep.arm(wr.poll_timeout()) {
            q.at(at, Ev::Wake(w));
        }
    };

    for w in 0..writers.len() {
        pump(Instant::ZERO, w, &mut writers, &mut q, &mut pool, &mut res);
    }
    while let Some((now, ev)) = q.pop() {
        match ev {
            Ev::Wake(w) => {
                let (wr, sleep) = &mut writers[w];
                if !sleep.fire(now) {
                    continue;
                }
                wr.handle_timeout(now);
                pump(now, w, &mut writers, &mut q, &mut pool, &mut res);
            }
            Ev::Respond(w, answers) => {
                for (batch, outcome) in answers {
                    match writers[w].0.handle_response(now, batch, outcome) {
                        Some(Completion::Acked(_)) => res.completed_at = now,
                        Some(Completion::Failed(_)) => res.failed += 1,
                        None => {}
                    }
                }
                pump(now, w, &mut writers, &mut q, &mut pool, &mut res);
            }
        }
    }
    res.events = q.popped();
    for (wr, _) in &writers {
        let stats = wr.stats();
        res.early_sends += stats.early_sends;
        res.max_late = res.max_late.max(stats.max_late);
    }
    res
}

/// Both populations on the same parameters.
#[derive(Debug, Clone)]
pub struct DiskReport {
    /// The parameters.
    pub params: DiskParams,
    /// The immediately retrying writer.
    pub naive: DiskResult,
    /// Ours.
    pub ours: DiskResult,
}

/// Run naive and ours.
pub fn compare(p: &DiskParams, seed: u64) -> DiskReport {
    DiskReport {
        params: p.clone(),
        naive: run(p, Policy::NAIVE, seed),
        ours: run(p, Policy::OURS, seed),
    }
}

impl DiskReport {
    /// The printed table.
    pub fn table(&self) -> Table {
        let p = &self.params;
        let mut t = Table::new(
            format!(
                "disk protection: {} writer(s) x {} bucket(s), writes rejected for {:?}",
                p.writers, p.buckets, p.protection
            ),
            &[
                "client",
                "RPCs",
                "rejected RPCs",
                "rejected batches",
                "bytes",
                "bytes in window",
                "all acked at",
                "failed",
                "sent early",
                "max late",
            ],
        );
        for (name, r) in [
            ("naive (immediate retry)", &self.naive),
            ("ours (gate, 1s..10s x2 +-20%, 50ms slack)", &self.ours),
        ] {
            t.row(vec![
                name.into(),
                thousands(r.rpcs),
                thousands(r.rejected_rpcs),
                thousands(r.rejected_batches),
                bytes(r.bytes),
                bytes(r.bytes_in_window),
                format!("{:.3} s", at_secs(r.completed_at)),
                thousands(r.failed),
                thousands(r.early_sends),
                format!("{:.1} ms", r.max_late.as_secs_f64() * 1e3),
            ]);
        }
        t
    }
}
