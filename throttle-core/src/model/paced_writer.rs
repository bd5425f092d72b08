//! Model check of [`PacedWriter`] against a naive reference.
//!
//! The reference keeps, per bucket, a plain `Vec` of batches, the batch in flight and the
//! leader, and decides every drain by scanning all buckets: a bucket with queued batches, no
//! batch in flight and a known leader sends its head batch when its gate is open, and is
//! otherwise held back. It asks a second [`WriteGate`] (driven with the same inputs and the
//! same random stream) for the gate's answers: the gate has its own checker, and what is under
//! test here is the writer's bookkeeping on top of it (queues, joining, in-flight, attempts,
//! readiness, parking, the wake). It shares no code with the writer (no ready list, no parked
//! heap, no slot index, no id slab).
//!
//! Checked after every operation: the sends of each drain (bucket, node, records, attempts),
//! grouped into one request per node with request numbers never used before; refreshes
//! reported once per unknown-leader episode; every answer's end (acked, failed with its cause,
//! or re-queued); refusals of unknown and repeated ids with nothing changed; no send of a
//! bucket whose gate is closed or probing (the reference only sends open buckets), so the
//! probe allowance holds; attempts never above `max_retries`; after each drain,
//! `poll_timeout` equal to the earliest [`WriteGate::reopens_at`] among buckets that wait plus
//! the wake slack (none, the derived default, 5 ms or 1 s, from the flags byte), and later than the drain's `now` (a driver loop cannot spin); the queued and in-flight
//! counts; the writer's internal invariants. At the end the writer is closed and every batch
//! in flight answered: every record appended must have ended exactly once, in append order
//! per bucket.
//!
//! Buckets are [`Key`]s. Operations 9, 10 and 11 each arm one `Hash`, `Eq` or `Clone` call
//! (in that order) to panic during an append, a `set_leader`, a drain or a rejection's answer
//! (see [`super::user`]): if the armed call fired, the writer must be exactly as before and the
//! reference is rolled back, except for a drain, which keeps the sends it decided before the
//! panic (each one the reference allows) and leaves the other buckets for the next drain.

use alloc::format;
use alloc::vec::Vec;
use core::time::Duration;

use super::user::{self, Arm, Key};
use super::{Cursor, Divergence};
use crate::backpressure::Signal;
use crate::paced_writer::{
    AppendRefused, BatchId, FailCause, PacedWriter, PacedWriterConfig, ResponseError, WriteOutcome,
    WriterAction,
};
use crate::rng::SplitMix64;
use crate::test_hasher::TestHasher;
use crate::time::Instant;
use crate::write_gate::{GateState, Reason, WriteGate, WriteGateConfig};

const BUCKETS: u8 = 4;
const NODES: u8 = 3;
/// Operations the decoder assigns before the panicking-callback ones (see [`check`]); values
/// `OPS..OPS + Arm::OPS` arm a bucket's `Hash`, `Eq` or `Clone` during one of the first
/// `ARMED_OPS` operations (append, set_leader, drain, a rejection's answer).
pub const OPS: u8 = 9;
/// Operations that run under an armed callback.
const ARMED_OPS: u8 = 4;
/// Every assigned selector value: the proptest driver biases its bytes below this.
pub const SELECTORS: u8 = OPS + Arm::OPS;

type Machine = PacedWriter<Key, u8, u32, TestHasher>;
type Action = WriterAction<Key, u8, u32>;
type Gate = WriteGate<u8, TestHasher>;

#[derive(Clone, Debug, PartialEq, Eq)]
struct RefBatch {
    records: Vec<u32>,
    bytes: u64,
    attempts: u32,
}

#[derive(Clone, Debug, Default)]
struct RefBucket {
    queue: Vec<RefBatch>,
    in_flight: Option<(BatchId, RefBatch)>,
    leader: Option<u8>,
    told_unknown: bool,
    refresh_reported: bool,
}

impl RefBucket {
    fn held(&self) -> bool {
        !self.queue.is_empty()
            || self.in_flight.is_some()
            || self.leader.is_some()
            || self.told_unknown
    }
}

/// How a record ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Acked,
    Failed(FailCause),
}

struct State {
    /// The writer's wake slack.
    slack: Duration,
    m: Machine,
    gate: Gate,
    m_rng: SplitMix64,
    r_rng: SplitMix64,
    /// A second writer, whose ids must be refused as unknown.
    other: Machine,
    other_ids: Vec<BatchId>,
    buckets: Vec<RefBucket>,
    batch_bytes: u64,
    max_retries: u32,
    disk_backoff: bool,
    kv_pressure: bool,
    closed: bool,
    /// Inside an armed operation: answers are rejections only (one gate input each, so a
    /// panic leaves the writer exactly as it was).
    arming: bool,
    now: Instant,
    clock: Instant,
    next_record: u32,
    /// Every id the machine issued (to tell a repeated answer from a bogus one).
    issued: Vec<BatchId>,
    /// Request numbers already used.
    last_request: u64,
    /// `(bucket, record, end)` in the order records ended.
    ended: Vec<(u8, u32, End)>,
    appended: Vec<(u8, u32)>,
}

fn bucket_of(s: &mut State, b: u8) -> &mut RefBucket {
    let i = usize::from(b);
    if s.buckets.len() <= i {
        s.buckets.resize_with(i + 1, RefBucket::default);
    }
    &mut s.buckets[i]
}

fn fmt_actions(a: &[Action]) -> alloc::string::String {
    format!("{a:?}")
}

/// Decodes `data` into paced-writer operations, drives the writer and the reference, and
/// returns the first disagreement.
pub fn check(data: &[u8]) -> Result<(), Divergence> {
    let mut c = Cursor::new(data);
    let batch_bytes = match c.below(4) {
        0 => 1,
        1 => 16,
        2 => 64,
        _ => u64::MAX,
    };
    let max_retries = match c.below(5) {
        4 => u32::MAX,
        n => u32::from(n),
    };
    let flags = c.u8();
    let disk_backoff = flags & 1 == 0;
    let kv_pressure = flags & 2 == 0;
    let mut gate_cfg = WriteGateConfig::default();
    match c.below(3) {
        0 => {}
        n => {
            let _ = gate_cfg.set_probe(Reason::DISK_WRITE_LOCKED, Some(u32::from(n)));
            let _ = gate_cfg.set_probe(Reason::RETRIABLE_WRITE, Some(1));
            let ttl = match c.below(4) {
                0 => Duration::from_millis(5),
                1 => Duration::from_secs(2),
                2 => Duration::from_secs(60),
                _ => Duration::from_secs(600),
            };
            let _ = gate_cfg.set_probe_ttl(Reason::DISK_WRITE_LOCKED, ttl);
            let _ = gate_cfg.set_probe_ttl(Reason::RETRIABLE_WRITE, ttl);
        }
    }
    // The wake slack, from the flags' bits 2 and 3: none, the derived default (50 ms for the
    // default 1 s disk backoff), 5 ms, or 1 s (longer than the 5 ms probe lapses).
    let slack = match (flags >> 2) & 3 {
        0 => Some(Duration::ZERO),
        1 => None,
        2 => Some(Duration::from_millis(5)),
        _ => Some(Duration::from_secs(1)),
    };
    let cfg = PacedWriterConfig::default();
    let cfg = match slack {
        Some(slack) => cfg.with_wake_slack(slack),
        None => cfg,
    };
    let cfg = cfg
        .with_batch_bytes(batch_bytes)
        .with_max_retries(max_retries)
        .with_gate(gate_cfg.clone())
        .with_disk_backoff(disk_backoff)
        .with_kv_pressure(kv_pressure);
    let (Ok(m), Ok(other), Ok(gate)) = (
        Machine::new(cfg.clone()),
        Machine::new(cfg.clone()),
        Gate::new(gate_cfg),
    ) else {
        return Err(format!("config refused: {cfg:?}"));
    };
    let seed = c.u64();
    let mut s = State {
        slack: cfg.wake_slack(),
        m,
        gate,
        m_rng: SplitMix64::new(seed),
        r_rng: SplitMix64::new(seed),
        other,
        other_ids: Vec::new(),
        buckets: Vec::new(),
        batch_bytes,
        max_retries,
        disk_backoff,
        kv_pressure,
        closed: false,
        arming: false,
        now: Instant::ZERO,
        clock: Instant::ZERO,
        next_record: 0,
        issued: Vec::new(),
        last_request: 0,
        ended: Vec::new(),
        appended: Vec::new(),
    };
    // A foreign id for the "bogus answer" operation.
    s.other.set_leader(Instant::ZERO, Key::new(0), Some(0));
    let _ = s.other.append(Instant::ZERO, Key::new(0), 0, 1);
    s.other.drain(Instant::ZERO);
    while let Some(a) = s.other.poll_action() {
        if let WriterAction::Send { batch, .. } = a {
            s.other_ids.push(batch);
        }
    }
    let mut step = 0usize;
    while !c.is_empty() {
        step += 1;
        let Some(op) = c.select(OPS + Arm::OPS) else {
            continue;
        };
        if op >= OPS {
            // A panicking bucket `Hash`, `Eq` or `Clone` during another operation.
            let Some(arm) = Arm::decode(&mut c, op - OPS, BUCKETS) else {
                continue;
            };
            let Some(inner) = c.select(ARMED_OPS) else {
                continue;
            };
            armed(arm, inner, &mut c, &mut s)
                .map_err(|e| format!("step {step} (armed {arm:?}, op {inner}): {e}"))?;
        } else {
            apply(op, &mut c, &mut s).map_err(|e| format!("step {step} (op {op}): {e}"))?;
        }
        s.m.check_invariants()
            .map_err(|e| format!("step {step} (op {op}): invariant: {e}"))?;
        let (queued, flying) = s.buckets.iter().fold((0, 0), |(q, f), b| {
            (q + b.queue.len(), f + usize::from(b.in_flight.is_some()))
        });
        if (s.m.queued_batches(), s.m.in_flight()) != (queued, flying) {
            return Err(format!(
                "step {step}: queued/in flight {:?}, reference {:?}",
                (s.m.queued_batches(), s.m.in_flight()),
                (queued, flying)
            ));
        }
    }
    finish(&mut s).map_err(|e| format!("at the end: {e}"))
}

fn apply(op: u8, c: &mut Cursor<'_>, s: &mut State) -> Result<(), Divergence> {
    match op {
        0 => {
            let b = c.below(BUCKETS);
            let bytes = match c.u8() % 8 {
                0 => 0,
                1 => u64::MAX,
                n => u64::from(n) * 8,
            };
            step_time(s, c);
            append(s, b, bytes)
        }
        1 => {
            let b = c.below(BUCKETS);
            let leader = match c.below(NODES + 1) {
                n if n < NODES => Some(n),
                _ => None,
            };
            step_time(s, c);
            set_leader(s, b, leader)
        }
        2 => {
            step_time(s, c);
            drain(s)
        }
        3 => {
            let pick = c.u8();
            let outcome = match c.below(5) {
                0 if s.arming => WriteOutcome::Retriable,
                0 => WriteOutcome::Ok {
                    pressure: match c.below(4) {
                        0 => Signal::Clear,
                        1 => Signal::Full,
                        _ => Signal::Pressure(u32::from(c.u16()) * 15),
                    },
                },
                1 => WriteOutcome::DiskWriteLocked,
                2 => WriteOutcome::StorageBackpressure,
                3 => WriteOutcome::Retriable,
                _ => WriteOutcome::Fatal,
            };
            let at = time_step(c, s.now);
            let flying: Vec<BatchId> = s
                .buckets
                .iter()
                .filter_map(|b| b.in_flight.as_ref().map(|(id, _)| *id))
                .collect();
            if flying.is_empty() {
                return Ok(());
            }
            s.now = at;
            s.clock = s.clock.max(at);
            let id = flying[usize::from(pick) % flying.len()];
            respond(s, id, outcome)
        }
        4 => {
            // An answer the writer must refuse: repeated, or another writer's.
            let pick = c.u8();
            let answered: Vec<BatchId> = s
                .issued
                .iter()
                .copied()
                .filter(|id| {
                    !s.buckets
                        .iter()
                        .any(|b| b.in_flight.as_ref().is_some_and(|(f, _)| f == id))
                })
                .collect();
            let (id, want) = match (pick % 2, answered.is_empty()) {
                (0, false) => (
                    answered[usize::from(pick / 2) % answered.len()],
                    ResponseError::AlreadyAnswered,
                ),
                _ => match s.other_ids.first() {
                    Some(&id) => (id, ResponseError::Unknown),
                    None => return Ok(()),
                },
            };
            let before = (s.m.queued_batches(), s.m.in_flight());
            let got =
                s.m.handle_response(s.now, id, WriteOutcome::Fatal, &mut s.m_rng);
            if got != Err(want) {
                return Err(format!("bogus answer {id:?}: {got:?}, want Err({want:?})"));
            }
            if (s.m.queued_batches(), s.m.in_flight()) != before || s.m.poll_action().is_some() {
                return Err("a refused answer changed the writer".into());
            }
            Ok(())
        }
        5 => {
            step_time(s, c);
            s.m.handle_timeout(s.now);
            s.gate.handle_timeout(s.clock);
            expect_actions(s, &[], "handle_timeout")
        }
        6 => {
            if c.u8() % 4 != 0 {
                return Ok(()); // close rarely: most runs should stay open
            }
            close(s)
        }
        7 => {
            // The driver loop: sleep until poll_timeout, handle_timeout, drain.
            if let Some(at) = s.m.poll_timeout() {
                s.now = s.now.max(at);
                s.clock = s.clock.max(s.now);
                s.m.handle_timeout(s.now);
                s.gate.handle_timeout(s.now);
                drain(s)
            } else {
                Ok(())
            }
        }
        8 => {
            // Drains again and again at the same instant (a spinning driver): nothing more
            // may be sent than one drain sends.
            drain(s)?;
            for _ in 0..3 {
                s.m.drain(s.now);
                if let Some(a) = s.m.poll_action() {
                    return Err(format!("a repeated drain at the same instant acted: {a:?}"));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Runs operation `inner` with `arm` armed. If the armed call fired inside the writer: an
/// append, a set_leader or an answer must have changed nothing (and the reference is rolled
/// back); a drain keeps the sends it decided before the panic (each must be one the reference
/// allows, and the reference takes them), and leaves the rest for the next drain.
fn armed(arm: Arm, inner: u8, c: &mut Cursor<'_>, s: &mut State) -> Result<(), Divergence> {
    let before = user::snapshot(&s.m);
    let saved = (s.now, s.clock, s.m_rng.clone(), s.next_record);
    s.arming = true;
    let out = user::run(arm, || apply(inner, c, s));
    s.arming = false;
    match out {
        Ok(result) => result,
        Err(user::Panicked) if inner == 2 => partial_drain(s),
        Err(user::Panicked) => {
            user::unchanged(&before, &s.m, arm)?;
            // The gate may have drawn its jitter before the key panicked: nothing happened,
            // so the caller's generator is as before too.
            (s.now, s.clock, s.m_rng, s.next_record) = saved;
            expect_actions(s, &[], "a panicked input")
        }
    }
}

/// After a drain that panicked in a bucket's callback: every action it emitted must be one the
/// reference allows now; the reference takes the sends and refreshes.
fn partial_drain(s: &mut State) -> Result<(), Divergence> {
    let now = s.clock;
    let mut got = Vec::new();
    while let Some(a) = s.m.poll_action() {
        got.push(a);
    }
    for a in got {
        match a {
            WriterAction::Send {
                request,
                node,
                bucket,
                batch,
            } => {
                let b = bucket.id();
                let Some(bk) = s.buckets.get(usize::from(b)) else {
                    return Err(format!("a panicked drain sent unknown bucket {b}"));
                };
                let Some(head) = bk.queue.first().cloned() else {
                    return Err(format!("a panicked drain sent empty bucket {b}"));
                };
                let sent =
                    s.m.batch(batch)
                        .map(|x| (x.records().to_vec(), x.attempts()));
                if bk.in_flight.is_some()
                    || bk.leader != Some(node)
                    || s.gate.check(now, &b) != GateState::Open
                    || sent != Some((head.records.clone(), head.attempts))
                {
                    return Err(format!(
                        "a panicked drain sent bucket {b} ({sent:?} to {node}), reference {bk:?}"
                    ));
                }
                s.gate.handle_send(now, &b);
                let bk = bucket_of(s, b);
                let head = bk.queue.remove(0);
                bk.in_flight = Some((batch, head));
                s.issued.push(batch);
                s.last_request = s.last_request.max(request);
            }
            WriterAction::RefreshLeader { bucket } => {
                let b = bucket.id();
                let bk = bucket_of(s, b);
                if bk.leader.is_some() || bk.refresh_reported || bk.queue.is_empty() {
                    return Err(format!("a panicked drain reported bucket {b}: {bk:?}"));
                }
                bk.refresh_reported = true;
            }
            other => return Err(format!("a panicked drain emitted {other:?}")),
        }
    }
    Ok(())
}

fn append(s: &mut State, b: u8, bytes: u64) -> Result<(), Divergence> {
    let record = s.next_record;
    s.next_record += 1;
    let got = s.m.append(s.now, Key::new(b), record, bytes);
    if s.closed {
        return match got {
            Err(AppendRefused(r)) if r == record => Ok(()),
            other => Err(format!("append after close: {other:?}")),
        };
    }
    if let Err(e) = got {
        return Err(format!("append refused: {e:?}"));
    }
    s.appended.push((b, record));
    let limit = s.batch_bytes;
    let bk = bucket_of(s, b);
    match bk.queue.last_mut() {
        Some(last) if last.attempts == 0 && last.bytes.saturating_add(bytes) <= limit => {
            last.records.push(record);
            last.bytes = last.bytes.saturating_add(bytes);
        }
        _ => bk.queue.push(RefBatch {
            records: alloc::vec![record],
            bytes,
            attempts: 0,
        }),
    }
    expect_actions(s, &[], "append")
}

fn set_leader(s: &mut State, b: u8, leader: Option<u8>) -> Result<(), Divergence> {
    s.m.set_leader(s.now, Key::new(b), leader);
    // The writer feeds its gate on its own clock.
    let now = s.clock;
    let held = s.buckets.get(usize::from(b)).is_some_and(RefBucket::held);
    if held || leader.is_some() {
        s.gate.handle_leader(now, &b, leader.is_some());
        while s.gate.poll_action().is_some() {}
        let bk = bucket_of(s, b);
        bk.leader = leader;
        bk.told_unknown = leader.is_none();
        bk.refresh_reported = false;
    }
    expect_actions(s, &[], "set_leader")
}

fn drain(s: &mut State) -> Result<(), Divergence> {
    s.m.drain(s.now);
    let now = s.clock;
    let mut got = Vec::new();
    while let Some(a) = s.m.poll_action() {
        got.push(a);
    }
    // The reference: every bucket, by scan.
    let mut want_sends: Vec<(u8, u8, RefBatch)> = Vec::new();
    let mut want_refresh: Vec<u8> = Vec::new();
    for b in 0..BUCKETS {
        let Some(bk) = s.buckets.get(usize::from(b)) else {
            continue;
        };
        if bk.in_flight.is_some() || bk.queue.is_empty() {
            continue;
        }
        let Some(node) = bk.leader else {
            if !bk.refresh_reported {
                want_refresh.push(b);
                bucket_of(s, b).refresh_reported = true;
            }
            continue;
        };
        if s.gate.check(now, &b) != GateState::Open {
            continue;
        }
        s.gate.handle_send(now, &b);
        let bk = bucket_of(s, b);
        let head = bk.queue.remove(0);
        want_sends.push((b, node, head));
    }
    // The machine's actions, in its order: refreshes, then sends grouped by request.
    let mut refresh = Vec::new();
    let mut sends = Vec::new();
    let mut requests: Vec<(u64, u8)> = Vec::new();
    let mut seen_send = false;
    for a in &got {
        match a {
            WriterAction::RefreshLeader { bucket } => {
                if seen_send {
                    return Err(format!("a refresh after a send: {}", fmt_actions(&got)));
                }
                refresh.push(bucket.id());
            }
            WriterAction::Send {
                request,
                node,
                bucket,
                batch,
            } => {
                seen_send = true;
                match requests.last() {
                    Some(&(r, n)) if r == *request => {
                        if n != *node {
                            return Err(format!("one request, two nodes: {}", fmt_actions(&got)));
                        }
                    }
                    _ => {
                        if *request <= s.last_request
                            || requests.iter().any(|&(r, n)| r == *request || n == *node)
                        {
                            return Err(format!(
                                "request numbers reused or a node split: {}",
                                fmt_actions(&got)
                            ));
                        }
                        requests.push((*request, *node));
                    }
                }
                let Some(batch_ref) = s.m.batch(*batch) else {
                    return Err(format!("sent batch {batch:?} is not readable"));
                };
                if batch_ref.attempts() > s.max_retries {
                    return Err(format!(
                        "a batch sent after {} retries",
                        batch_ref.attempts()
                    ));
                }
                sends.push((
                    bucket.id(),
                    *node,
                    RefBatch {
                        records: batch_ref.records().to_vec(),
                        bytes: batch_ref.bytes(),
                        attempts: batch_ref.attempts(),
                    },
                    *batch,
                ));
            }
            other => return Err(format!("drain emitted {other:?}")),
        }
    }
    if let Some(&(r, _)) = requests.last() {
        s.last_request = r;
    }
    refresh.sort_unstable();
    sends.sort_by_key(|x| x.0);
    let got_sends: Vec<(u8, u8, RefBatch)> = sends
        .iter()
        .map(|(b, n, x, _)| (*b, *n, x.clone()))
        .collect();
    if refresh != want_refresh || got_sends != want_sends {
        return Err(format!(
            "drain at {now:?}: refresh {refresh:?} sends {got_sends:?}; reference refresh \
             {want_refresh:?} sends {want_sends:?}"
        ));
    }
    for (b, _, batch, id) in sends {
        s.issued.push(id);
        bucket_of(s, b).in_flight = Some((id, batch));
    }
    // The wake: the earliest instant a waiting bucket's gate answer changes.
    let mut want: Option<Instant> = None;
    for b in 0..BUCKETS {
        let Some(bk) = s.buckets.get(usize::from(b)) else {
            continue;
        };
        if bk.in_flight.is_some() || bk.queue.is_empty() || bk.leader.is_none() {
            continue;
        }
        let Some(at) = s.gate.reopens_at(now, &b) else {
            return Err(format!("bucket {b} waits on an open gate"));
        };
        want = Some(want.map_or(at, |w| w.min(at)));
    }
    // The slack rule: the earliest instant plus the slack.
    let want = want.map(|at| at + s.slack);
    let got = s.m.poll_timeout();
    if got != want {
        return Err(format!("poll_timeout {got:?}, reference {want:?}"));
    }
    if let Some(at) = got {
        if at <= s.clock {
            return Err(format!(
                "poll_timeout {at:?} not after the drain at {now:?}: a loop spins"
            ));
        }
    }
    Ok(())
}

/// The next `now`, and the writer's clock (the latest instant it has seen).
fn step_time(s: &mut State, c: &mut Cursor<'_>) {
    s.now = time_step(c, s.now);
    s.clock = s.clock.max(s.now);
}

/// Mostly forward by the spans the gate works at (a millisecond to a few seconds: backoffs of
/// 0.8 s to 10 s, probe lapses of 5 ms to 10 min), sometimes back, rarely to the end of time
/// (after which every deadline saturates and nothing is gated any more, so it must stay rare).
fn time_step(c: &mut Cursor<'_>, now: Instant) -> Instant {
    let ms = |n: u64| Duration::from_millis(n);
    match c.u8() {
        0 => now,
        1 => now + Duration::from_nanos(1),
        2 => now + ms(1),
        3 => now + ms(50),
        4 => now + ms(300),
        5 => now + ms(1_000),
        6 => now + ms(3_000),
        7 => now + ms(u64::from(c.u16())),
        8 => now.saturating_sub(ms(u64::from(c.u16()))),
        255 => Instant::MAX.saturating_sub(Duration::from_nanos(u64::from(c.u8()))),
        b => now + ms(u64::from(b) * 20),
    }
}

fn respond(s: &mut State, id: BatchId, outcome: WriteOutcome) -> Result<(), Divergence> {
    let got = s.m.handle_response(s.now, id, outcome, &mut s.m_rng);
    let now = s.clock;
    if let Err(e) = got {
        return Err(format!("answer to {id:?} refused: {e}"));
    }
    let Some(b) = (0..BUCKETS).find(|&b| {
        s.buckets
            .get(usize::from(b))
            .and_then(|bk| bk.in_flight.as_ref())
            .is_some_and(|(f, _)| *f == id)
    }) else {
        return Err("answered a batch the reference does not hold".into());
    };
    let Some((_, mut batch)) = bucket_of(s, b).in_flight.take() else {
        return Err("unreachable".into());
    };
    let retry = !s.closed && batch.attempts < s.max_retries;
    let attempts = batch.attempts;
    let end = match outcome {
        WriteOutcome::Ok { pressure } => {
            s.gate.handle_success(now, &b);
            if s.kv_pressure {
                s.gate.handle_kv_signal(now, &b, pressure);
            }
            Some(End::Acked)
        }
        WriteOutcome::Fatal => Some(End::Failed(FailCause::Fatal)),
        rejected if !retry => Some(End::Failed(if s.closed {
            FailCause::Closed
        } else {
            FailCause::RetriesExhausted { last: rejected }
        })),
        WriteOutcome::DiskWriteLocked => {
            if s.disk_backoff {
                s.gate
                    .handle_disk_write_locked(now, &b, attempts, &mut s.r_rng);
            }
            None
        }
        WriteOutcome::StorageBackpressure if s.kv_pressure => {
            s.gate.handle_kv_signal(now, &b, Signal::Full);
            None
        }
        _ => {
            s.gate
                .handle_retriable_write(now, &b, attempts, &mut s.r_rng);
            None
        }
    };
    while s.gate.poll_action().is_some() {}
    let want: Vec<(Vec<u32>, Option<End>)> = match end {
        Some(e) => alloc::vec![(batch.records.clone(), Some(e))],
        None => {
            batch.attempts += 1;
            bucket_of(s, b).queue.insert(0, batch);
            Vec::new()
        }
    };
    let mut got = Vec::new();
    while let Some(a) = s.m.poll_action() {
        match a {
            WriterAction::Acked { batch } => {
                got.push((batch.records().to_vec(), Some(End::Acked)));
                s.m.recycle(batch.into_records());
            }
            WriterAction::Failed { batch, cause } => {
                got.push((batch.records().to_vec(), Some(End::Failed(cause))));
                s.m.recycle(batch.into_records());
            }
            other => return Err(format!("an answer emitted {other:?}")),
        }
    }
    if got != want {
        return Err(format!(
            "answer {outcome:?}: got {got:?}, reference {want:?}"
        ));
    }
    for (records, end) in got {
        if let Some(end) = end {
            s.ended.extend(records.into_iter().map(|r| (b, r, end)));
        }
    }
    Ok(())
}

fn close(s: &mut State) -> Result<(), Divergence> {
    s.m.close();
    s.gate.close();
    s.closed = true;
    let mut want: Vec<Vec<u32>> = Vec::new();
    for b in 0..BUCKETS {
        let q = core::mem::take(&mut bucket_of(s, b).queue);
        for batch in q {
            s.ended.extend(
                batch
                    .records
                    .iter()
                    .map(|&r| (b, r, End::Failed(FailCause::Closed))),
            );
            want.push(batch.records);
        }
    }
    let mut got = Vec::new();
    while let Some(a) = s.m.poll_action() {
        match a {
            WriterAction::Failed {
                batch,
                cause: FailCause::Closed,
            } => got.push(batch.into_records()),
            other => return Err(format!("close emitted {other:?}")),
        }
    }
    got.sort();
    want.sort();
    if got != want {
        return Err(format!("close failed {got:?}, reference {want:?}"));
    }
    Ok(())
}

fn expect_actions(s: &mut State, want: &[Action], what: &str) -> Result<(), Divergence> {
    let mut got = Vec::new();
    while let Some(a) = s.m.poll_action() {
        got.push(a);
    }
    if got != want {
        return Err(format!(
            "{what} emitted {}, want {want:?}",
            fmt_actions(&got)
        ));
    }
    Ok(())
}

/// Close, answer everything in flight, and check that every record ended exactly once, in
/// append order per bucket.
fn finish(s: &mut State) -> Result<(), Divergence> {
    close(s)?;
    loop {
        let flying: Option<BatchId> = s
            .buckets
            .iter()
            .find_map(|b| b.in_flight.as_ref().map(|(id, _)| *id));
        let Some(id) = flying else {
            break;
        };
        respond(
            s,
            id,
            WriteOutcome::Ok {
                pressure: Signal::Clear,
            },
        )?;
    }
    if s.m.pending_batches() != 0 {
        return Err(format!(
            "{} batches left after close",
            s.m.pending_batches()
        ));
    }
    let mut ended: Vec<(u8, u32)> = s.ended.iter().map(|&(b, r, _)| (b, r)).collect();
    let mut appended = s.appended.clone();
    ended.sort_unstable();
    appended.sort_unstable();
    if ended != appended {
        return Err(format!(
            "records appended {appended:?} but ended {ended:?} (lost or duplicated)"
        ));
    }
    // FIFO per bucket: acked records of one bucket end in append order.
    for b in 0..BUCKETS {
        let acked: Vec<u32> = s
            .ended
            .iter()
            .filter(|&&(x, _, e)| x == b && e == End::Acked)
            .map(|&(_, r, _)| r)
            .collect();
        if acked.windows(2).any(|w| w[0] > w[1]) {
            return Err(format!("bucket {b} acked out of order: {acked:?}"));
        }
    }
    s.m.check_invariants().map_err(Into::into)
}
