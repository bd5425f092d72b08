//! The reference writer (`docs/design.md` §6): a record accumulator and a sender built on the
//! [`WriteGate`].
//!
//! It behaves like the Fluss Java writer after Fluss PR #4293, reduced to what pacing needs:
//!
//! - **Accumulator.** Per bucket, a FIFO of batches; records join the newest batch until it
//!   would exceed `batch_bytes`. A rejected batch goes back to the **front** of its bucket
//!   (ordering is kept: one batch per bucket in flight).
//! - **Readiness, leader-first.** A bucket whose leader is unknown is reported for a metadata
//!   refresh whether or not it is gated ([`RefWriter::poll_unknown_leader`]).
//! - **Drain.** [`RefWriter::drain`] takes the head batch of every open bucket and groups them
//!   into one request per leader node; gated buckets are skipped (their batches stay queued).
//! - **Sleep.** [`RefWriter::poll_timeout`] is the earliest gate opening while some batch waits
//!   behind a gate; the driver sleeps until then, calls [`RefWriter::handle_timeout`] and
//!   drains again.
//! - **Retries.** The sender owns `max_retries`: a batch rejected after that many retries fails
//!   and installs nothing; otherwise the rejection is fed to the gate (with the batch's attempt
//!   count before the increment) and the batch is re-enqueued.
//!
//! [`Policy`] switches the gate inputs off to obtain the clients upstream had before each
//! change, so naive and ours share every other line of code.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use throttle_sansio::Instant;
use throttle_sansio::backpressure::Signal;
use throttle_sansio::rng::SplitMix64;
use throttle_sansio::write_gate::{GateAction, GateState, WriteGate, WriteGateConfig};

use super::DetHasher;

/// A bucket (table bucket / partition) id.
pub type BucketId = u32;
/// A server (tablet server) id.
pub type NodeId = u32;

/// What the server answered for one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Written; the response piggybacks this KV pressure (`Clear` for log tables).
    Ok {
        /// The piggybacked pressure.
        pressure: Signal,
    },
    /// Rejected by disk protection (`DISK_WRITE_LOCKED`).
    DiskWriteLocked,
    /// Rejected with the retriable storage-backpressure error (`L0 ≥ Tr`).
    StorageBackpressure,
    /// Another retriable error.
    Retriable,
}

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
}

impl Policy {
    /// Every gate input on: our writer.
    pub const OURS: Policy = Policy {
        disk_backoff: true,
        kv_pressure: true,
    };
    /// Both pacing inputs off: the writer before Fluss PR #4293 and issue #3454.
    pub const NAIVE: Policy = Policy {
        disk_backoff: false,
        kv_pressure: false,
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
        WriterConfig {
            batch_bytes: 2 * 1024 * 1024,
            max_retries: i32::MAX as u32,
            gate: WriteGateConfig::fluss_issue_3454(),
            policy: Policy::OURS,
        }
    }
}

/// A batch of records for one bucket.
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

#[derive(Debug, Default)]
struct BucketState {
    queue: VecDeque<WriteBatch>,
    in_flight: bool,
    leader: Option<NodeId>,
    /// In `ready` (avoids duplicates).
    listed: bool,
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
    /// Times a drain skipped a bucket because its gate was closed.
    pub gated_skips: u64,
}

/// The reference writer. See the [module docs](self) for what it does.
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
    cfg: WriterConfig,
    gate: WriteGate<BucketId, DetHasher>,
    rng: SplitMix64,
    buckets: HashMap<BucketId, BucketState, DetHasher>,
    /// Buckets that may have a sendable head batch.
    ready: VecDeque<BucketId>,
    /// Buckets with queued batches behind a gate, by when to look again.
    recheck: BinaryHeap<Reverse<(Instant, BucketId)>>,
    unknown: VecDeque<BucketId>,
    stats: WriterStats,
}

impl RefWriter {
    /// An empty writer; `seed` seeds its jitter generator.
    pub fn new(cfg: WriterConfig, seed: u64) -> Self {
        RefWriter {
            gate: WriteGate::new(cfg.gate.clone()).expect("the writer's gate config is valid"),
            cfg,
            rng: SplitMix64::new(seed),
            buckets: HashMap::default(),
            ready: VecDeque::new(),
            recheck: BinaryHeap::new(),
            unknown: VecDeque::new(),
            stats: WriterStats::default(),
        }
    }

    /// Input: append a record of `bytes` bytes to `bucket`.
    pub fn append(&mut self, now: Instant, bucket: BucketId, bytes: u64) {
        let limit = self.cfg.batch_bytes;
        let st = self.buckets.entry(bucket).or_default();
        match st.queue.back_mut() {
            // The head batch of an idle bucket may still grow; a batch in flight left the queue.
            Some(b) if b.bytes + bytes <= limit => {
                b.bytes += bytes;
                b.records += 1;
            }
            _ => st.queue.push_back(WriteBatch {
                bucket,
                bytes,
                records: 1,
                attempts: 0,
                created: now,
            }),
        }
        self.mark_ready(bucket);
    }

    /// Input: `bucket`'s leader is `leader` (`None`: unknown, refresh metadata).
    pub fn set_leader(&mut self, now: Instant, bucket: BucketId, leader: Option<NodeId>) {
        self.gate.handle_leader(now, &bucket, leader.is_some());
        self.buckets.entry(bucket).or_default().leader = leader;
        self.drain_gate_actions(bucket);
        self.mark_ready(bucket);
    }

    /// Output: the next bucket whose leader must be refreshed (leader-first readiness).
    pub fn poll_unknown_leader(&mut self) -> Option<BucketId> {
        self.unknown.pop_front()
    }

    /// The sender's sleep: the earliest gate opening while some batch waits behind a gate.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let Reverse((recheck, _)) = *self.recheck.peek()?;
        // The gate's earliest opening is the sleep (`docs/design.md` §6); the writer's own
        // recheck index only says which buckets to look at. They agree unless a gate was lifted
        // early.
        Some(self.gate.poll_timeout().map_or(recheck, |g| g.min(recheck)))
    }

    /// Input: the sleep ended. Evicts expired gates and requeues the buckets that opened.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.gate.handle_timeout(now);
        while let Some(&Reverse((at, b))) = self.recheck.peek() {
            if at > now {
                break;
            }
            self.recheck.pop();
            self.mark_ready(b);
        }
    }

    /// Output: the requests to send now, one per leader node; gated buckets are skipped.
    pub fn drain(&mut self, now: Instant) -> Vec<Request> {
        let mut out: Vec<Request> = Vec::new();
        for _ in 0..self.ready.len() {
            let Some(b) = self.ready.pop_front() else {
                break;
            };
            let Some(st) = self.buckets.get_mut(&b) else {
                continue;
            };
            st.listed = false;
            if st.in_flight || st.queue.is_empty() {
                continue;
            }
            match self.gate.check(now, &b) {
                GateState::UnknownLeader => self.unknown.push_back(b),
                GateState::Closed { until, .. } => {
                    self.stats.gated_skips += 1;
                    self.recheck.push(Reverse((until, b)));
                }
                GateState::Probing { .. } => {
                    // Not configured by the scenarios; look again shortly rather than spin.
                    self.recheck
                        .push(Reverse((now + std::time::Duration::from_millis(1), b)));
                }
                _ => {
                    let Some(node) = st.leader else {
                        self.unknown.push_back(b);
                        continue;
                    };
                    let Some(batch) = st.queue.pop_front() else {
                        continue;
                    };
                    st.in_flight = true;
                    self.gate.handle_send(now, &b);
                    self.stats.batch_sends += 1;
                    match out.iter_mut().find(|r| r.node == node) {
                        Some(r) => r.batches.push(batch),
                        None => out.push(Request {
                            node,
                            batches: vec![batch],
                        }),
                    }
                }
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
        let b = batch.bucket;
        let policy = self.cfg.policy;
        let done = match outcome {
            WriteOutcome::Ok { pressure } => {
                self.gate.handle_success(now, &b);
                if policy.kv_pressure {
                    self.gate.handle_kv_signal(now, &b, pressure);
                }
                self.stats.acked += 1;
                Some(Completion::Acked(batch))
            }
            _ if batch.attempts >= self.cfg.max_retries => {
                self.stats.failed += 1;
                Some(Completion::Failed(batch))
            }
            rejected => {
                let attempts = batch.attempts;
                match rejected {
                    WriteOutcome::DiskWriteLocked if policy.disk_backoff => {
                        self.gate
                            .handle_disk_write_locked(now, &b, attempts, &mut self.rng);
                    }
                    WriteOutcome::DiskWriteLocked => {}
                    WriteOutcome::StorageBackpressure if policy.kv_pressure => {
                        self.gate.handle_kv_signal(now, &b, Signal::Full);
                    }
                    _ => {
                        self.gate
                            .handle_retriable_write(now, &b, attempts, &mut self.rng);
                    }
                }
                batch.attempts += 1;
                self.stats.retries += 1;
                if let Some(st) = self.buckets.get_mut(&b) {
                    st.queue.push_front(batch);
                }
                None
            }
        };
        if let Some(st) = self.buckets.get_mut(&b) {
            st.in_flight = false;
        }
        self.drain_gate_actions(b);
        self.mark_ready(b);
        done
    }

    /// Batches not yet acknowledged or failed (queued or in flight).
    pub fn pending_batches(&self) -> usize {
        self.buckets
            .values()
            .map(|s| s.queue.len() + usize::from(s.in_flight))
            .sum()
    }

    /// The counters.
    pub fn stats(&self) -> WriterStats {
        self.stats
    }

    /// The gate (for inspection).
    pub fn gate(&self) -> &WriteGate<BucketId, DetHasher> {
        &self.gate
    }

    fn mark_ready(&mut self, b: BucketId) {
        if let Some(st) = self.buckets.get_mut(&b)
            && !st.listed
        {
            st.listed = true;
            self.ready.push_back(b);
        }
    }

    /// A wake means `b`'s wait shrank: look at it again at its new opening.
    fn drain_gate_actions(&mut self, b: BucketId) {
        while let Some(action) = self.gate.poll_action() {
            if let GateAction::Wake { at } = action {
                self.recheck.push(Reverse((at, b)));
            }
        }
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
