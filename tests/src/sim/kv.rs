//! Scenario 2: KV backpressure. A write burst outruns compaction; L0 grows, the server
//! piggybacks pressure from `Tf` and rejects from `Tr`; a client that ignores pressure against
//! our p³ ramp.
//!
//! Model: `buckets` KV buckets on one tablet server, each its own RocksDB: accepted bytes fill a
//! memtable of `write_buffer` bytes, and each full memtable flushes at once into one L0 file;
//! compaction removes one L0 file every `drain_every` while L0 > 0 (a fixed drain rate). The
//! server half is the core's [`ServerPressure`] (Tf = 12, Tr = 20): it decides per batch when
//! the request arrives. `writers` reference writers each append `record` bytes to every bucket
//! at `rate_per_bucket` for `burst`, then stop; the run ends when everything is acknowledged.
//! A request travels `rtt/2` each way and occupies one of `server_workers` threads for
//! `per_rpc + per_batch × batches`.
//!
//! The naive client is the writer before Fluss issue #3454's change: it ignores the piggybacked
//! pressure, and a storage-backpressure rejection is an ordinary retriable error (the
//! retriable-write backoff, 100 ms → 1 s ×2 ±20 %), so it only slows down once it is rejected.
//! Ours feeds every response's pressure to the p³ curve (5 s ceiling) and a rejection as
//! `Full` (the whole 5 s).

use std::time::Duration;

use throttle_sansio::Instant;
use throttle_sansio::backpressure::{Decision, PressureConfig, ServerPressure};
use throttle_sansio::rng::SplitMix64;

use super::table::{Table, bytes, thousands};
use super::writer::{
    BucketId, Completion, Policy, RefWriter, Request, Sleep, WriteBatch, WriteOutcome, WriterConfig,
};
use super::{EventQueue, WorkerPool, at_secs, scaled, uniform};

/// Parameters of the KV-backpressure scenario.
#[derive(Debug, Clone)]
pub struct KvParams {
    /// Writer clients.
    pub writers: u32,
    /// KV buckets (each its own RocksDB) every writer writes to.
    pub buckets: u32,
    /// Bytes per record.
    pub record: u64,
    /// Bytes per second each writer appends to each bucket during the burst.
    pub rate_per_bucket: u64,
    /// How long the burst lasts.
    pub burst: Duration,
    /// Memtable size: bytes per L0 file.
    pub write_buffer: u64,
    /// Compaction removes one L0 file this often.
    pub drain_every: Duration,
    /// Writer batch size.
    pub batch_bytes: u64,
    /// Round-trip network time.
    pub rtt: Duration,
    /// Server worker threads.
    pub server_workers: usize,
    /// Server time per request.
    pub per_rpc: Duration,
    /// Server time per batch.
    pub per_batch: Duration,
}

impl KvParams {
    /// 8 writers × 4 buckets, 64 KB records at 10 MB/s per writer per bucket (80 MB/s per
    /// bucket) for 20 s (× `scale`); 8 MB memtables, one L0 file compacted every 200 ms
    /// (40 MB/s per bucket, half the burst); 2 MB batches; 1 ms RTT; 8 server threads at
    /// 100 µs per request + 200 µs per batch.
    pub fn full(scale: f64) -> Self {
        KvParams {
            writers: 8,
            buckets: 4,
            record: 64 * 1024,
            rate_per_bucket: 10_000_000,
            burst: Duration::from_millis(scaled(20_000, scale, 100)),
            write_buffer: 8 * 1024 * 1024,
            drain_every: Duration::from_millis(200),
            batch_bytes: 2 * 1024 * 1024,
            rtt: Duration::from_millis(1),
            server_workers: 8,
            per_rpc: Duration::from_micros(100),
            per_batch: Duration::from_micros(200),
        }
    }
}

/// What one client population did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvResult {
    /// Batch sends rejected with storage backpressure.
    pub rejections: u64,
    /// Batch sends.
    pub batch_sends: u64,
    /// Times a bucket's L0 reached `Tr` (the server refusing every write: a stall).
    pub stalls: u64,
    /// Total time buckets spent at `L0 ≥ Tr` (summed over buckets).
    pub stalled_for: Duration,
    /// Highest L0 seen.
    pub peak_l0: u64,
    /// Bytes acknowledged.
    pub bytes_acked: u64,
    /// When the last batch was acknowledged.
    pub done_at: Instant,
    /// Batches failed (none expected: unlimited retries).
    pub failed: u64,
}

impl KvResult {
    /// Acknowledged bytes per second over the run.
    pub fn throughput(&self) -> f64 {
        self.bytes_acked as f64 / at_secs(self.done_at).max(1e-9)
    }
}

#[derive(Debug)]
enum Ev {
    Append(usize, BucketId),
    Wake(usize),
    Respond(usize, Vec<(WriteBatch, WriteOutcome)>),
    Compact(BucketId),
}

#[derive(Debug)]
struct Bucket {
    pressure: ServerPressure,
    l0: u64,
    memtable: u64,
    stalled_since: Option<Instant>,
}

impl Bucket {
    fn set_l0(&mut self, now: Instant, l0: u64, tr: u64, res: &mut KvResult) {
        self.l0 = l0;
        self.pressure.handle_l0(l0);
        res.peak_l0 = res.peak_l0.max(l0);
        match (self.stalled_since, l0 >= tr) {
            (None, true) => {
                self.stalled_since = Some(now);
                res.stalls += 1;
            }
            (Some(since), false) => {
                res.stalled_for += now.saturating_duration_since(since);
                self.stalled_since = None;
            }
            _ => {}
        }
    }
}

/// Run one population under `policy`.
pub fn run(p: &KvParams, policy: Policy, seed: u64) -> KvResult {
    let tr = 20;
    let cfg = WriterConfig {
        batch_bytes: p.batch_bytes,
        policy,
        ..WriterConfig::default()
    };
    let mut q: EventQueue<Ev> = EventQueue::new();
    let mut pool = WorkerPool::new(p.server_workers);
    let mut rng = SplitMix64::new(seed ^ 0x4B56);
    let mut res = KvResult::default();
    let half = p.rtt / 2;
    let burst_end = Instant::ZERO + p.burst;
    let interval = Duration::from_nanos(
        (u128::from(p.record) * 1_000_000_000 / u128::from(p.rate_per_bucket.max(1))) as u64,
    );
    let mut buckets: Vec<Bucket> = (0..p.buckets)
        .map(|_| Bucket {
            pressure: ServerPressure::new(PressureConfig::fluss_issue_3454()),
            l0: 0,
            memtable: 0,
            stalled_since: None,
        })
        .collect();
    let mut writers: Vec<(RefWriter, Sleep)> = (0..p.writers)
        .map(|w| {
            let mut wr = RefWriter::new(cfg.clone(), seed ^ (u64::from(w) << 24) ^ 0x5EED);
            for b in 0..p.buckets {
                wr.set_leader(Instant::ZERO, b, Some(0));
                q.at(
                    Instant::ZERO + uniform(&mut rng, Duration::ZERO, interval),
                    Ev::Append(w as usize, b),
                );
            }
            (wr, Sleep::default())
        })
        .collect();
    for b in 0..p.buckets {
        q.at(Instant::ZERO + p.drain_every, Ev::Compact(b));
    }

    while let Some((now, ev)) = q.pop() {
        let w = match ev {
            Ev::Append(w, b) => {
                writers[w].0.append(now, b, p.record);
                if now + interval < burst_end {
                    q.at(now + interval, Ev::Append(w, b));
                }
                w
            }
            Ev::Compact(b) => {
                let bk = &mut buckets[b as usize];
                if bk.l0 > 0 {
                    let l0 = bk.l0 - 1;
                    bk.set_l0(now, l0, tr, &mut res);
                }
                // Keep compacting while anything may still arrive.
                if now < burst_end || writers.iter().any(|(wr, _)| wr.pending_batches() > 0) {
                    q.at(now + p.drain_every, Ev::Compact(b));
                }
                continue;
            }
            Ev::Wake(w) => {
                if !writers[w].1.fire(now) {
                    continue;
                }
                writers[w].0.handle_timeout(now);
                w
            }
            Ev::Respond(w, answers) => {
                for (batch, outcome) in answers {
                    match writers[w].0.handle_response(now, batch, outcome) {
                        Some(Completion::Acked(b)) => {
                            res.bytes_acked += b.bytes;
                            res.done_at = now;
                        }
                        Some(Completion::Failed(_)) => res.failed += 1,
                        None => {}
                    }
                }
                w
            }
        };
        // Send what the writer can send now, then re-arm its sleep.
        let (wr, sleep) = &mut writers[w];
        for Request { batches, .. } in wr.drain(now) {
            let arrive = now + half;
            let cost = p.per_rpc + p.per_batch * batches.len() as u32;
            let (_, done) = pool.serve(arrive, cost);
            let mut answers = Vec::with_capacity(batches.len());
            for batch in batches {
                res.batch_sends += 1;
                let bk = &mut buckets[batch.bucket as usize];
                let decision = bk.pressure.decide();
                let outcome = match decision {
                    Decision::Reject { .. } => {
                        res.rejections += 1;
                        WriteOutcome::StorageBackpressure
                    }
                    _ => {
                        bk.memtable += batch.bytes;
                        if bk.memtable >= p.write_buffer {
                            let files = bk.memtable / p.write_buffer;
                            bk.memtable %= p.write_buffer;
                            let l0 = bk.l0 + files;
                            bk.set_l0(arrive, l0, tr, &mut res);
                        }
                        WriteOutcome::Ok {
                            pressure: decision.signal(),
                        }
                    }
                };
                answers.push((batch, outcome));
            }
            q.at(done + half, Ev::Respond(w, answers));
        }
        if let Some(at) = sleep.arm(wr.poll_timeout()) {
            q.at(at, Ev::Wake(w));
        }
    }
    for bk in &mut buckets {
        if let Some(since) = bk.stalled_since.take() {
            res.stalled_for += res.done_at.saturating_duration_since(since);
        }
    }
    res
}

/// Both populations on the same parameters.
#[derive(Debug, Clone)]
pub struct KvReport {
    /// The parameters.
    pub params: KvParams,
    /// The client that ignores pressure.
    pub naive: KvResult,
    /// Ours.
    pub ours: KvResult,
}

/// Run naive and ours.
pub fn compare(p: &KvParams, seed: u64) -> KvReport {
    KvReport {
        params: p.clone(),
        naive: run(p, Policy::NAIVE, seed),
        ours: run(p, Policy::OURS, seed),
    }
}

impl KvReport {
    /// The printed table.
    pub fn table(&self) -> Table {
        let p = &self.params;
        let mut t = Table::new(
            format!(
                "KV backpressure: {} writers x {} buckets, {}/s per bucket for {:?}; drain {} per {:?}; Tf=12 Tr=20",
                p.writers,
                p.buckets,
                bytes(p.rate_per_bucket * u64::from(p.writers)),
                p.burst,
                bytes(p.write_buffer),
                p.drain_every
            ),
            &[
                "client",
                "batch sends",
                "rejections",
                "stalls",
                "stalled for",
                "peak L0",
                "acked",
                "done at",
                "throughput",
            ],
        );
        for (name, r) in [
            ("naive (ignores pressure)", &self.naive),
            ("ours (p^3 ramp, 5 s)", &self.ours),
        ] {
            t.row(vec![
                name.into(),
                thousands(r.batch_sends),
                thousands(r.rejections),
                thousands(r.stalls),
                format!("{:.2} s", r.stalled_for.as_secs_f64()),
                r.peak_l0.to_string(),
                bytes(r.bytes_acked),
                format!("{:.2} s", at_secs(r.done_at)),
                format!("{}/s", bytes(r.throughput() as u64)),
            ]);
        }
        t
    }
}
