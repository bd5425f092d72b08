//! The reference writer (`docs/design.md` §6): the core's [`PacedWriter`] with the simulator's
//! bookkeeping around it.
//!
//! Every decision (per-bucket FIFO batches, leader-first readiness, gated buckets parked and
//! skipped, the earliest wake, `max_retries`) is the core machine's (`docs/paced-writer.md`);
//! this file only turns its actions into the simulator's requests and completions, owns the
//! writer's jitter generator, and counts.
//!
//! [`Policy`] switches the gate inputs off (the machine's `with_disk_backoff` and
//! `with_kv_pressure`) to obtain the clients upstream had before each change, so naive and
//! ours share every other line of code.

use std::collections::HashMap;
use std::time::Duration;

use throttle_sansio::Instant;
use throttle_sansio::paced_writer::{
    BatchId, FailCause, PacedWriter, PacedWriterConfig, WriterAction,
};
use throttle_sansio::rng::SplitMix64;
use throttle_sansio::write_gate::{WriteGate, WriteGateConfig};

pub use throttle_sansio::paced_writer::WriteOutcome;

use super::DetHasher;

/// A bucket (table bucket / partition) id.
pub type BucketId = u32;
/// A server (tablet server) id.
pub type NodeId = u32;

/// Which gate inputs the writer feeds. Every other behaviour is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Back off `DISK_WRITE_LOCKED` per bucket. Off: re-enqueue and resend at once (the Java
    /// client before Fluss PR #4293).
    pub disk_backoff: bool,
    /// Feed piggybacked pressure and storage-backpressure rejections to the KV curve. Off:
    /// ignore pressure and treat a rejection as an ordinary retriable error (retriable-write
    /// backoff).
    pub kv_pressure: bool,
    /// Wake coalescing: the core writer's default wake slack
    /// ([`PacedWriterConfig::wake_slack`], 50 ms for the 1 s disk backoff). Off: no slack, a
    /// wake at every gate opening (the clients upstream had, which have no such tolerance).
    pub coalesce: bool,
}

impl Policy {
    /// Every gate input on: our writer.
    pub const OURS: Policy = Policy {
        disk_backoff: true,
        kv_pressure: true,
        coalesce: true,
    };
    /// Both pacing inputs off: the writer before Fluss PR #4293 and issue #3454.
    pub const NAIVE: Policy = Policy {
        disk_backoff: false,
        kv_pressure: false,
        coalesce: false,
    };
}

/// The writer's settings.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// A batch closes before exceeding this many bytes (a larger record goes alone).
    pub batch_bytes: u64,
    /// Retries per batch before it fails (`client.writer.retries`).
    pub max_retries: u32,
    /// The gate's delay sources (disk backoff, KV curve, retriable-write backoff).
    pub gate: WriteGateConfig,
    /// Which gate inputs are fed.
    pub policy: Policy,
}

impl Default for WriterConfig {
    /// 2 MB batches (`client.writer.batch-size`), unlimited retries (Fluss's default,
    /// `Integer.MAX_VALUE`), the gate with Fluss issue #3454's KV curve (the one the KV
    /// scenario models), our policy.
    fn default() -> Self {
        let core = PacedWriterConfig::default();
        WriterConfig {
            batch_bytes: core.batch_bytes(),
            max_retries: core.max_retries(),
            gate: WriteGateConfig::fluss_issue_3454(),
            policy: Policy::OURS,
        }
    }
}

impl WriterConfig {
    /// The core machine's configuration.
    pub fn to_core(&self) -> PacedWriterConfig {
        let cfg = PacedWriterConfig::default()
            .with_batch_bytes(self.batch_bytes)
            .with_max_retries(self.max_retries)
            .with_gate(self.gate.clone())
            .with_disk_backoff(self.policy.disk_backoff)
            .with_kv_pressure(self.policy.kv_pressure);
        if self.policy.coalesce {
            cfg
        } else {
            cfg.with_wake_slack(Duration::ZERO)
        }
    }
}

/// A batch of records for one bucket, as the simulator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteBatch {
    /// Its bucket.
    pub bucket: BucketId,
    /// Payload bytes.
    pub bytes: u64,
    /// Records in it.
    pub records: u32,
    /// Retries so far (0 on the first send).
    pub attempts: u32,
    /// When its first record was appended.
    pub created: Instant,
    /// The core writer's id for this send.
    pub id: BatchId,
}

/// One RPC: the head batches of some buckets led by `node`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The destination.
    pub node: NodeId,
    /// The batches, at most one per bucket.
    pub batches: Vec<WriteBatch>,
}

impl Request {
    /// Payload bytes of all batches.
    pub fn payload_bytes(&self) -> u64 {
        self.batches.iter().map(|b| b.bytes).sum()
    }
}

/// How a batch left the writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// Acknowledged by the server.
    Acked(WriteBatch),
    /// Failed after `max_retries` retries.
    Failed(WriteBatch),
}

/// Counters a scenario reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Batch sends (first sends and retries).
    pub batch_sends: u64,
    /// Batches re-enqueued after a rejection.
    pub retries: u64,
    /// Batches acknowledged.
    pub acked: u64,
    /// Batches failed after `max_retries`.
    pub failed: u64,
    /// Batch sends of a bucket before the opening its gate gave after its last answer (a
    /// bucket sent early). Checked against the gate's own answer, not the writer's.
    pub early_sends: u64,
    /// The longest a bucket waited past that opening before its next send: at most the wake
    /// slack when the bucket had nothing else to wait for (one batch per bucket, as in
    /// `sim disk`).
    pub max_late: Duration,
}

/// The reference writer: a [`PacedWriter`] over `u32` buckets and nodes, records of `()`
/// (only their bytes matter), and its own jitter generator.
///
/// # Driving contract
///
/// - Inputs: [`append`](Self::append), [`set_leader`](Self::set_leader),
///   [`handle_response`](Self::handle_response) (once per batch sent),
///   [`handle_timeout`](Self::handle_timeout) (at or after [`poll_timeout`](Self::poll_timeout)).
/// - After any input, call [`drain`](Self::drain) and transmit the requests, then drain
///   [`poll_unknown_leader`](Self::poll_unknown_leader) (refresh metadata for those buckets), and
///   re-arm the sleep from [`poll_timeout`](Self::poll_timeout).
#[derive(Debug)]
pub struct RefWriter {
    w: PacedWriter<BucketId, NodeId, (), DetHasher>,
    rng: SplitMix64,
    unknown: Vec<BucketId>,
    stats: WriterStats,
    /// Per gated bucket, the opening its gate answered after the bucket's last answer.
    opens: HashMap<BucketId, Instant>,
}

impl RefWriter {
    /// An empty writer; `seed` seeds its jitter generator.
    pub fn new(cfg: WriterConfig, seed: u64) -> Self {
        RefWriter {
            w: PacedWriter::new(cfg.to_core()).expect("the writer's config is valid"),
            rng: SplitMix64::new(seed),
            unknown: Vec::new(),
            stats: WriterStats::default(),
            opens: HashMap::new(),
        }
    }

    /// Input: append a record of `bytes` bytes to `bucket`.
    pub fn append(&mut self, now: Instant, bucket: BucketId, bytes: u64) {
        // The simulator never closes its writers.
        let _ = self.w.append(now, bucket, (), bytes);
    }

    /// Input: `bucket`'s leader is `leader` (`None`: unknown, refresh metadata).
    pub fn set_leader(&mut self, now: Instant, bucket: BucketId, leader: Option<NodeId>) {
        self.w.set_leader(now, bucket, leader);
    }

    /// Output: the next bucket whose leader must be refreshed (leader-first readiness),
    /// reported by the last [`drain`](Self::drain).
    pub fn poll_unknown_leader(&mut self) -> Option<BucketId> {
        if self.unknown.is_empty() {
            None
        } else {
            Some(self.unknown.remove(0))
        }
    }

    /// The sender's sleep: the earliest gate opening while some batch waits behind a gate.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.w.poll_timeout()
    }

    /// Input: the sleep ended.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.w.handle_timeout(now);
    }

    /// Output: the requests to send now, one per leader node; gated buckets are skipped.
    pub fn drain(&mut self, now: Instant) -> Vec<Request> {
        self.w.drain(now);
        let mut out: Vec<Request> = Vec::new();
        let mut request = None;
        while let Some(action) = self.w.poll_action() {
            match action {
                WriterAction::Send {
                    request: r,
                    node,
                    bucket,
                    batch: id,
                } => {
                    let Some(b) = self.w.batch(id) else { continue };
                    let batch = WriteBatch {
                        bucket,
                        bytes: b.bytes(),
                        records: u32::try_from(b.len()).unwrap_or(u32::MAX),
                        attempts: b.attempts(),
                        created: b.created(),
                        id,
                    };
                    self.stats.batch_sends += 1;
                    if let Some(opens) = self.opens.remove(&bucket) {
                        if now < opens {
                            self.stats.early_sends += 1;
                        }
                        self.stats.max_late = self.stats.max_late.max(now - opens);
                    }
                    match out.last_mut() {
                        Some(req) if request == Some(r) => req.batches.push(batch),
                        _ => {
                            request = Some(r);
                            out.push(Request {
                                node,
                                batches: vec![batch],
                            });
                        }
                    }
                }
                WriterAction::RefreshLeader { bucket } => self.unknown.push(bucket),
                // Ends come from answers and close only, never from a drain.
                _ => {}
            }
        }
        out
    }

    /// Input: the server answered `outcome` for `batch` (sent earlier by [`Self::drain`]).
    /// Returns the batch if it left the writer (acknowledged or failed).
    pub fn handle_response(
        &mut self,
        now: Instant,
        mut batch: WriteBatch,
        outcome: WriteOutcome,
    ) -> Option<Completion> {
        self.w
            .handle_response(now, batch.id, outcome, &mut self.rng)
            .expect("each batch is answered once");
        // The gate's own opening for the bucket, to check the writer's next send against.
        match self.w.gate().reopens_at(now, &batch.bucket) {
            Some(at) => self.opens.insert(batch.bucket, at),
            None => self.opens.remove(&batch.bucket),
        };
        let mut done = None;
        while let Some(action) = self.w.poll_action() {
            match action {
                WriterAction::Acked { batch: b } => {
                    batch.attempts = b.attempts();
                    self.stats.acked += 1;
                    done = Some(Completion::Acked(batch.clone()));
                }
                WriterAction::Failed { batch: b, cause } => {
                    debug_assert!(!matches!(cause, FailCause::Closed));
                    batch.attempts = b.attempts();
                    self.stats.failed += 1;
                    done = Some(Completion::Failed(batch.clone()));
                }
                _ => {}
            }
        }
        if done.is_none() {
            self.stats.retries += 1;
        }
        done
    }

    /// Batches not yet acknowledged or failed (queued or in flight).
    pub fn pending_batches(&self) -> usize {
        self.w.pending_batches()
    }

    /// The counters.
    pub fn stats(&self) -> WriterStats {
        self.stats
    }

    /// The gate (for inspection).
    pub fn gate(&self) -> &WriteGate<BucketId, DetHasher> {
        self.w.gate()
    }
}

/// Keeps one pending wake-up event per sleeper: schedule only when the new instant is earlier
/// than the one already scheduled, and ignore stale events when they pop.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sleep {
    next: Option<Instant>,
}

impl Sleep {
    /// Whether a wake at `at` must be scheduled (and remember it).
    pub fn arm(&mut self, at: Option<Instant>) -> Option<Instant> {
        let at = at?;
        match self.next {
            Some(n) if n <= at => None,
            _ => {
                self.next = Some(at);
                Some(at)
            }
        }
    }

    /// A wake event for `at` popped: whether it is the current one (then it is consumed).
    pub fn fire(&mut self, at: Instant) -> bool {
        if self.next == Some(at) {
            self.next = None;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn writer(policy: Policy) -> RefWriter {
        let cfg = WriterConfig {
            policy,
            ..WriterConfig::default()
        };
        RefWriter::new(cfg, 1)
    }

    #[test]
    fn rejected_batch_is_gated_then_resent_after_the_disk_backoff() {
        let mut w = writer(Policy::OURS);
        let t0 = Instant::ZERO;
        w.set_leader(t0, 7, Some(1));
        w.append(t0, 7, 100);
        let reqs = w.drain(t0);
        assert_eq!(reqs.len(), 1);
        let batch = reqs[0].batches[0].clone();
        assert!(
            w.handle_response(t0, batch, WriteOutcome::DiskWriteLocked)
                .is_none()
        );
        assert!(w.drain(t0).is_empty(), "gated bucket skipped in drain");
        let wake = w.poll_timeout().expect("a batch waits behind the gate");
        // 1 s ± 20 %.
        assert!(
            wake >= t0 + Duration::from_millis(800) && wake <= t0 + Duration::from_millis(1200)
        );
        w.handle_timeout(wake);
        let reqs = w.drain(wake);
        assert_eq!(reqs[0].batches[0].attempts, 1);
    }

    #[test]
    fn naive_writer_resends_a_disk_rejection_at_once() {
        let mut w = writer(Policy::NAIVE);
        let t0 = Instant::ZERO;
        w.set_leader(t0, 7, Some(1));
        w.append(t0, 7, 100);
        let batch = w.drain(t0).remove(0).batches.remove(0);
        w.handle_response(t0, batch, WriteOutcome::DiskWriteLocked);
        assert_eq!(w.drain(t0).len(), 1);
        assert_eq!(w.poll_timeout(), None);
    }

    #[test]
    fn unknown_leader_is_reported_before_the_gate() {
        let mut w = writer(Policy::OURS);
        let t0 = Instant::ZERO;
        w.set_leader(t0, 3, Some(1));
        w.append(t0, 3, 100);
        let batch = w.drain(t0).remove(0).batches.remove(0);
        w.handle_response(t0, batch, WriteOutcome::DiskWriteLocked);
        w.set_leader(t0, 3, None);
        assert!(w.drain(t0).is_empty());
        assert_eq!(
            w.poll_unknown_leader(),
            Some(3),
            "refresh while still gated"
        );
    }

    #[test]
    fn batch_fails_after_max_retries_and_installs_nothing() {
        let cfg = WriterConfig {
            max_retries: 1,
            ..WriterConfig::default()
        };
        let mut w = RefWriter::new(cfg, 1);
        let t0 = Instant::ZERO;
        w.set_leader(t0, 1, Some(1));
        w.append(t0, 1, 10);
        let b = w.drain(t0).remove(0).batches.remove(0);
        w.handle_response(t0, b, WriteOutcome::Retriable);
        assert!(
            w.drain(t0).is_empty(),
            "the retriable-write backoff gates it"
        );
        let t1 = w.poll_timeout().expect("gated batch waits");
        w.handle_timeout(t1);
        let b = w.drain(t1).remove(0).batches.remove(0);
        let done = w.handle_response(t1, b, WriteOutcome::Retriable);
        assert!(matches!(done, Some(Completion::Failed(_))));
        assert_eq!(w.gate().remaining(t1, &1), Duration::ZERO);
        assert_eq!(w.pending_batches(), 0);
        assert_eq!(
            w.stats(),
            WriterStats {
                batch_sends: 2,
                retries: 1,
                acked: 0,
                failed: 1,
                early_sends: 0,
                // Sent at the wake: its opening plus the default 50 ms slack.
                max_late: Duration::from_millis(50),
            }
        );
    }

    #[test]
    fn sleep_keeps_only_the_earliest_wake() {
        let mut s = Sleep::default();
        let t = |ms| Some(Instant::from_millis(ms));
        assert_eq!(s.arm(t(10)), t(10));
        assert_eq!(s.arm(t(20)), None);
        assert_eq!(s.arm(t(5)), t(5));
        assert!(!s.fire(Instant::from_millis(10)), "stale");
        assert!(s.fire(Instant::from_millis(5)));
    }
}
