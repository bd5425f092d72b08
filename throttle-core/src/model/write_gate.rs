//! Model checker for [`WriteGate`]: random installs of every reason, KV signals, leader
//! events, probe sends and successes, time running back and forth, `handle_timeout` and
//! `close` over a few `u8` buckets, against a naive reference.
//!
//! The reference is a list of `(bucket, reason, deadline)` records plus lists of unknown
//! leaders, armed probes and probe counters, answered by scanning. It shares no code with the
//! gate: jittered delays come from `BackoffConfig::delay_for` on a second, identically seeded
//! generator (the backoff module, not the code under test), KV delays from `ThrottleCurve`.
//!
//! After every operation it compares: install results, `remaining`, `check`, `explain` and
//! `reasons` for every bucket, `poll_timeout` (the earliest opening plus the wake slack the
//! seed's bits 56..60 pick, zero in half the runs), `len`, the `Wake` emitted (exactly when the reference
//! says that bucket's remaining time decreased, at its new opening instant), the gate's own
//! internal invariants, and after `handle_timeout` that no gate survives its deadline.
//!
//! Operations 10 and 11 are the snapshot inputs: `forget(b)`, and `retain` with a keep-mask
//! over the buckets, whose closure may panic on one bucket (through that key's armed `Eq`,
//! called by the closure: user code). The reference drops a forgotten bucket's records and
//! lists; a panicking `retain` must leave the gate exactly as it was. The seed's top bits pick
//! the KV options: bit 63 the never-shorten hard rejection (a `Full` signal installs on its own
//! never-shorten, leader-scoped reason, index 5), bits 60..63 the KV jitter that operation 4
//! (`handle_kv_signal_jittered`) draws; operation 3 is the plain `handle_kv_signal`.
//!
//! Buckets are [`Key`]s. Operations 16, 17 and 18 each arm one `Hash`, `Eq` or `Clone` call (in
//! that order) to panic and run another operation under `catch_unwind` (see [`super::user`]):
//! if the armed call fired, the gate must be exactly as before and the reference is rolled
//! back.

use alloc::format;
use alloc::vec::Vec;
use core::time::Duration;

use super::user::{self, Arm, Key};
use super::{Cursor, Divergence};
// The fixed FNV-1a hasher the tests and checkers share (no `std` needed).
use crate::backpressure::{Signal, ThrottleCurve};
use crate::rng::SplitMix64;
use crate::test_hasher::TestHasher as Fnv;
use crate::time::Instant;
use crate::write_gate::{
    GateAction, GateError, GateEvent, GateState, Reason, ReasonSpec, UpdateRule, WriteGate,
    WriteGateConfig,
};

const BUCKETS: u8 = 5;
/// The throttle reason selector of a reason the gate never registered.
const FOREIGN: usize = 5;

/// What the reference knows about a reason, decoded from the same config bits as the gate's.
#[derive(Clone, Copy, Debug)]
struct Rule {
    latest_wins: bool,
    leader_scoped: bool,
    probe: Option<u32>,
    /// Probe state time to live after the bucket opened, in ns.
    ttl: u64,
}

#[derive(Clone, Copy, Debug)]
struct Record {
    bucket: u8,
    reason: usize,
    deadline: u64,
}

/// The naive reference: records and lists, everything found by scanning.
#[derive(Clone, Debug, Default)]
struct Reference {
    rules: Vec<Rule>,
    last: u64,
    records: Vec<Record>,
    unknown: Vec<u8>,
    armed: Vec<(u8, usize)>,
    used: Vec<(u8, u32)>,
    /// When each bucket last opened: its latest deadline while one is pending, else the
    /// instant an input lifted the gate (the documented probe-lapse rule's starting point).
    opened: Vec<(u8, u64)>,
    shut: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Open,
    Closed { until: u64, reason: usize },
    Probing { reason: usize },
    UnknownLeader,
}

impl Reference {
    fn observe(&mut self, now: Instant) -> u64 {
        self.last = self.last.max(now.as_nanos());
        self.last
    }

    fn peek(&self, now: Instant) -> u64 {
        self.last.max(now.as_nanos())
    }

    fn is_unknown(&self, b: u8) -> bool {
        self.unknown.contains(&b)
    }

    fn remaining(&self, b: u8, now: u64) -> u64 {
        let mut best = 0;
        for r in &self.records {
            if r.bucket == b && r.deadline > now && r.deadline - now > best {
                best = r.deadline - now;
            }
        }
        best
    }

    fn touch(&mut self, b: u8, now: u64) {
        self.records
            .retain(|r| !(r.bucket == b && r.deadline <= now));
        self.drop_lapsed(b, now);
    }

    /// Documented rule (docs/write-gate.md): an unanswered probe state lapses the armed
    /// reasons' longest `probe_ttl` after the bucket last opened.
    fn lapse(&self, b: u8) -> Option<u64> {
        let ttl = self
            .armed
            .iter()
            .filter(|&&(x, _)| x == b)
            .filter_map(|&(_, r)| self.rules.get(r).map(|rule| rule.ttl))
            .max()?;
        let opened = self.opened.iter().find(|(x, _)| *x == b).map_or(0, |o| o.1);
        Some(opened.saturating_add(ttl))
    }

    fn drop_lapsed(&mut self, b: u8, now: u64) {
        let pending = self
            .records
            .iter()
            .any(|r| r.bucket == b && r.deadline > now);
        if !pending && self.lapse(b).is_some_and(|l| l <= now) {
            self.armed.retain(|&(x, _)| x != b);
            self.set_used(b, 0);
        }
    }

    /// After an input at `now` touched `b`: record when it opens or opened.
    fn note_opened(&mut self, b: u8, now: u64) {
        let latest = self
            .records
            .iter()
            .filter(|r| r.bucket == b && r.deadline > now)
            .map(|r| r.deadline)
            .max();
        let before = self.opened.iter().find(|(x, _)| *x == b).map(|o| o.1);
        let opened = match (latest, before) {
            (Some(d), _) => d,
            (None, Some(o)) => o.min(now),
            (None, None) => now,
        };
        self.opened.retain(|(x, _)| *x != b);
        self.opened.push((b, opened));
        self.drop_lapsed(b, now);
    }

    fn used(&self, b: u8) -> u32 {
        self.used
            .iter()
            .find(|(x, _)| *x == b)
            .map_or(0, |&(_, n)| n)
    }

    fn set_used(&mut self, b: u8, n: u32) {
        self.used.retain(|(x, _)| *x != b);
        self.used.push((b, n));
    }

    /// Returns (bucket remaining after, expected wake).
    fn install(&mut self, now: u64, b: u8, reason: usize, delay: Duration) -> (u64, Option<u64>) {
        if self.shut {
            return (0, None);
        }
        let Some(rule) = self.rules.get(reason).copied() else {
            return (0, None);
        };
        let delay_ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        let candidate = now.saturating_add(delay_ns);
        let pending = candidate > now;
        self.touch(b, now);
        let before = self.remaining(b, now);
        if !(rule.leader_scoped && self.is_unknown(b)) {
            let existing = self
                .records
                .iter()
                .position(|r| r.bucket == b && r.reason == reason);
            match (rule.latest_wins, pending, existing) {
                (_, true, None) => self.records.push(Record {
                    bucket: b,
                    reason,
                    deadline: candidate,
                }),
                (false, true, Some(i)) => {
                    if let Some(r) = self.records.get_mut(i) {
                        r.deadline = r.deadline.max(candidate);
                    }
                }
                (true, true, Some(i)) => {
                    if let Some(r) = self.records.get_mut(i) {
                        r.deadline = candidate;
                    }
                }
                (true, false, Some(i)) => {
                    self.records.remove(i);
                }
                (_, false, _) => {}
            }
            // `docs/design.md` §3.3: the allowance is given back by a success or "a new rejection
            // [that] re-gates" the bucket. Rejections are the never-shorten reasons'
            // installs; a latest-wins reason is a signal, not a rejection, and re-gates only
            // the probe mode it has itself.
            let is_rejection = !rule.latest_wins;
            let regates_own_probe = rule.latest_wins && rule.probe.is_some();
            if pending && (is_rejection || regates_own_probe) {
                self.set_used(b, 0);
            }
            if pending {
                if rule.probe.is_some() && !self.armed.contains(&(b, reason)) {
                    self.armed.push((b, reason));
                }
            } else if rule.latest_wins {
                self.armed.retain(|&x| x != (b, reason));
            }
        }
        self.note_opened(b, now);
        let after = self.remaining(b, now);
        (after, (after < before).then(|| now.saturating_add(after)))
    }

    fn leader(&mut self, now: u64, b: u8, known: bool) -> Option<u64> {
        self.touch(b, now);
        if known {
            self.unknown.retain(|&x| x != b);
            self.note_opened(b, now);
            return None;
        }
        let before = self.remaining(b, now);
        let rules = self.rules.clone();
        let scoped = |r: usize| rules.get(r).is_some_and(|x| x.leader_scoped);
        self.records
            .retain(|r| !(r.bucket == b && scoped(r.reason)));
        self.armed.retain(|&(x, r)| !(x == b && scoped(r)));
        if !self.is_unknown(b) {
            self.unknown.push(b);
        }
        self.note_opened(b, now);
        let after = self.remaining(b, now);
        (after < before).then(|| now.saturating_add(after))
    }

    fn send(&mut self, now: u64, b: u8) {
        self.touch(b, now);
        if self.armed.iter().any(|&(x, _)| x == b) && self.remaining(b, now) == 0 {
            let n = self.used(b).saturating_add(1);
            self.set_used(b, n);
        }
        self.note_opened(b, now);
    }

    fn success(&mut self, now: u64, b: u8) {
        self.touch(b, now);
        self.armed.retain(|&(x, _)| x != b);
        self.set_used(b, 0);
        self.note_opened(b, now);
    }

    fn timeout(&mut self, now: u64) {
        let unknown = self.unknown.clone();
        self.records
            .retain(|r| r.deadline > now || unknown.contains(&r.bucket));
        for b in 0..BUCKETS {
            if !unknown.contains(&b) {
                self.drop_lapsed(b, now);
            }
        }
    }

    /// `forget` / a bucket `retain` dropped: as if never seen.
    fn forget(&mut self, b: u8) {
        self.records.retain(|r| r.bucket != b);
        self.unknown.retain(|&x| x != b);
        self.armed.retain(|&(x, _)| x != b);
        self.used.retain(|(x, _)| *x != b);
        self.opened.retain(|(x, _)| *x != b);
    }

    /// Whether the gate holds state for `b` (what `len` counts, and what `retain` visits).
    fn has_state(&self, b: u8) -> bool {
        self.is_unknown(b)
            || self.records.iter().any(|r| r.bucket == b)
            || self.armed.iter().any(|&(x, _)| x == b)
    }

    fn close(&mut self) -> Option<u64> {
        let now = self.last;
        let gated = (0..BUCKETS).any(|b| self.remaining(b, now) > 0);
        self.records.clear();
        self.armed.clear();
        self.used.clear();
        self.shut = true;
        gated.then_some(now)
    }

    fn check(&self, now: u64, b: u8) -> Expect {
        if self.is_unknown(b) {
            return Expect::UnknownLeader;
        }
        if let Some((reason, until)) = self.explain(now, b) {
            return Expect::Closed { until, reason };
        }
        if self.lapse(b).is_none_or(|l| l <= now) {
            return Expect::Open;
        }
        let mut probe: Option<(usize, u32)> = None;
        for &(x, r) in &self.armed {
            if x != b {
                continue;
            }
            let Some(n) = self.rules.get(r).and_then(|rule| rule.probe) else {
                continue;
            };
            let better = match probe {
                None => true,
                Some((pr, pn)) => n < pn || (n == pn && r < pr),
            };
            if better {
                probe = Some((r, n));
            }
        }
        match probe {
            Some((reason, n)) if self.used(b) >= n => Expect::Probing { reason },
            _ => Expect::Open,
        }
    }

    fn explain(&self, now: u64, b: u8) -> Option<(usize, u64)> {
        let mut best: Option<(usize, u64)> = None;
        for r in &self.records {
            if r.bucket != b || r.deadline <= now {
                continue;
            }
            let better = match best {
                None => true,
                Some((br, bd)) => r.deadline > bd || (r.deadline == bd && r.reason < br),
            };
            if better {
                best = Some((r.reason, r.deadline));
            }
        }
        best
    }

    /// Every pending reason of `b` with its deadline, in reason order (one record per
    /// bucket and reason).
    fn reasons(&self, now: u64, b: u8) -> Vec<(usize, u64)> {
        let mut out: Vec<(usize, u64)> = self
            .records
            .iter()
            .filter(|r| r.bucket == b && r.deadline > now)
            .map(|r| (r.reason, r.deadline))
            .collect();
        out.sort_unstable();
        out
    }

    fn poll_timeout(&self) -> Option<u64> {
        let mut earliest: Option<u64> = None;
        for b in 0..BUCKETS {
            if self.is_unknown(b) {
                continue;
            }
            let opening = self
                .records
                .iter()
                .filter(|r| r.bucket == b)
                .map(|r| r.deadline)
                .max();
            let Some(o) = opening.or_else(|| self.lapse(b)) else {
                continue;
            };
            {
                earliest = Some(earliest.map_or(o, |e| e.min(o)));
            }
        }
        earliest
    }

    fn len(&self) -> usize {
        (0..BUCKETS).filter(|&b| self.has_state(b)).count()
    }
}

fn to_expect(s: GateState) -> Expect {
    match s {
        GateState::Open => Expect::Open,
        GateState::Closed { until, reason } => Expect::Closed {
            until: until.as_nanos(),
            reason: reason.index(),
        },
        GateState::Probing { reason } => Expect::Probing {
            reason: reason.index(),
        },
        GateState::UnknownLeader => Expect::UnknownLeader,
    }
}

/// A signal, or `None` for a kind not assigned yet (the operation is skipped).
fn signal(c: &mut Cursor<'_>) -> Option<Signal> {
    let s = match c.select(7)? {
        0 => Signal::Clear,
        1 => Signal::Full,
        2 => Signal::Pressure(100_000),
        3 => Signal::Pressure(c.u32()),
        4 => Signal::Pressure(0),
        _ => Signal::Pressure(c.u32() % 1_000_000),
    };
    Some(s)
}

/// The KV options the seed's top bits pick: (never-shorten hard rejection, jitter ppm).
fn kv_options(seed: u64) -> (bool, u32) {
    let jitter = match (seed >> 60) & 7 {
        4 => 1,
        5 => 100_000,
        6 => 250_000,
        7 => crate::write_gate::MAX_KV_JITTER_PPM,
        _ => 0,
    };
    (seed >> 63 == 1, jitter)
}

/// The wake slack the seed's bits 56..60 pick, in ns: none in half the runs, otherwise from a
/// millisecond (below the spans between installs) to the 60 s ceiling (past every backoff).
fn wake_slack(seed: u64) -> u64 {
    let ms = match (seed >> 56) & 15 {
        8 => 1,
        9 => 5,
        10 => 20,
        11 => 50,
        12 => 100,
        13 => 1_000,
        14 => 3_000,
        15 => 60_000,
        _ => 0,
    };
    ms * 1_000_000
}

/// The reason a KV signal installs on in the reference (5: the hard-rejection reason).
fn kv_index(hard: bool, s: Signal) -> usize {
    if hard && s == Signal::Full { 5 } else { 1 }
}

/// Build the gate's configuration and the reference's rules from one byte and the seed.
fn configure(
    bits: u8,
    seed: u64,
) -> Result<(WriteGateConfig, Vec<Rule>, [Reason; 5], Reason), Divergence> {
    let (kv_hard, kv_jitter) = kv_options(seed);
    let mut cfg = WriteGateConfig::default().with_kv_curve(ThrottleCurve::fluss_landed());
    let disk_probe = (bits & 1 != 0).then_some(1 + u32::from(bits >> 6));
    let kv_probe = (bits & 2 != 0).then_some(2);
    let quota_scoped = bits & 4 != 0;
    let quota_probe = (bits & 8 != 0).then_some(1);
    let after_probe = (bits & 16 != 0).then_some(3);
    // Short ttls so lapses happen within a run; otherwise the 10 min default.
    let ttl = if bits & 32 != 0 {
        Duration::from_millis(100)
    } else {
        crate::write_gate::DEFAULT_PROBE_TTL
    };
    let ttl_ns = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
    let err = |e| format!("config refused: {e}");
    cfg.set_probe(Reason::DISK_WRITE_LOCKED, disk_probe)
        .map_err(err)?;
    cfg.set_probe(Reason::KV_BACKPRESSURE, kv_probe)
        .map_err(err)?;
    cfg.set_probe_ttl(Reason::DISK_WRITE_LOCKED, ttl)
        .map_err(err)?;
    let quota = cfg
        .register(
            ReasonSpec::new("quota", UpdateRule::LatestWins)
                .leader_scoped(quota_scoped)
                .probe(quota_probe)
                .probe_ttl(Duration::from_millis(30)),
        )
        .map_err(err)?;
    let retry_after = cfg
        .register(ReasonSpec::new("retry-after", UpdateRule::NeverShorten).probe(after_probe))
        .map_err(err)?;
    let mut cfg = cfg
        .with_kv_jitter(kv_jitter)
        .with_wake_slack(Duration::from_nanos(wake_slack(seed)));
    if kv_hard {
        cfg = cfg.with_kv_hard_rejection_never_shorten().map_err(err)?;
        if cfg.kv_hard_rejection().map(Reason::index) != Some(5) {
            return Err("the hard-rejection reason is not at index 5".into());
        }
    }
    let mut other = cfg.clone();
    let foreign = other
        .register(ReasonSpec::new("foreign", UpdateRule::LatestWins))
        .map_err(err)?;
    let rule = |latest_wins, leader_scoped, probe, ttl| Rule {
        latest_wins,
        leader_scoped,
        probe,
        ttl,
    };
    let default_ttl = 600_000_000_000;
    let mut rules = alloc::vec![
        rule(false, false, disk_probe, ttl_ns),
        rule(true, true, kv_probe, default_ttl),
        rule(false, false, None, default_ttl),
        rule(true, quota_scoped, quota_probe, 30_000_000),
        rule(false, false, after_probe, default_ttl),
    ];
    if kv_hard {
        // Never-shorten, leader-scoped, no probe mode.
        rules.push(rule(false, true, None, default_ttl));
    }
    let handles = [
        Reason::DISK_WRITE_LOCKED,
        Reason::KV_BACKPRESSURE,
        Reason::RETRIABLE_WRITE,
        quota,
        retry_after,
    ];
    Ok((cfg, rules, handles, foreign))
}

type Gate = WriteGate<Key, Fnv>;

/// Operations before the panicking-callback ones (16 `Hash`, 17 `Eq`, 18 `Clone`).
const OPS: u8 = 16;

/// What one run carries from operation to operation.
struct State {
    gate: Gate,
    reference: Reference,
    gate_rng: SplitMix64,
    ref_rng: SplitMix64,
    now: Instant,
    handles: [Reason; 5],
    foreign: Reason,
    disk: crate::backoff::BackoffConfig,
    retriable: crate::backoff::BackoffConfig,
    curve: ThrottleCurve,
    /// The never-shorten KV hard rejection is on (its reason is index 5).
    kv_hard: bool,
    kv_jitter: u32,
}

/// What one operation did, for the checks after it.
struct Step {
    what: alloc::string::String,
    expected_wake: Option<u64>,
    install_result: Option<(Duration, u64)>,
    /// An install that reached the gate: bucket, reference reason index, attempt, clamped now.
    installed: Option<(u8, usize, Option<u32>, u64)>,
}

impl Step {
    fn new(what: alloc::string::String) -> Self {
        Step {
            what,
            expected_wake: None,
            install_result: None,
            installed: None,
        }
    }
}

/// Decode `data` into operations, drive the gate and the reference, and compare.
pub fn check(data: &[u8]) -> Result<(), Divergence> {
    let mut c = Cursor::new(data);
    let bits = c.u8();
    let seed = c.u64();
    let (cfg, rules, handles, foreign) = configure(bits, seed)?;
    let (kv_hard, kv_jitter) = kv_options(seed);
    let disk = cfg.disk_write_locked().clone();
    let retriable = cfg.retriable_write().clone();
    let curve = *cfg.kv_curve();
    let mut gate: Gate = match WriteGate::new(cfg) {
        Ok(gate) => gate,
        Err(e) => return Err(format!("config refused: {e}")),
    };
    // Events on in half the runs: the other half checks that none is ever recorded.
    let events = seed & 1 == 1;
    if events {
        gate.set_event_capacity(64);
    }
    let mut st = State {
        gate,
        reference: Reference {
            rules,
            ..Reference::default()
        },
        gate_rng: SplitMix64::new(seed),
        ref_rng: SplitMix64::new(seed),
        now: Instant::from_millis(u64::from(c.u16())),
        handles,
        foreign,
        disk,
        retriable,
        curve,
        kv_hard,
        kv_jitter,
    };
    let mut step = 0usize;
    while !c.is_empty() {
        step += 1;
        let Some(op) = c.select(OPS + Arm::OPS) else {
            continue;
        };
        let done = if op >= OPS {
            // A panicking key callback during another operation.
            let Some(arm) = Arm::decode(&mut c, op - OPS, BUCKETS) else {
                continue;
            };
            let Some(inner) = c.select(OPS) else {
                continue;
            };
            armed(arm, inner, &mut c, &mut st, step)?
        } else {
            apply(op, &mut c, &mut st, step)?
        };
        let Some(done) = done else {
            continue;
        };
        let fail = |m: alloc::string::String| format!("step {step}: after {}: {m}", done.what);

        if let Some((got, want)) = done.install_result {
            if u64::try_from(got.as_nanos()).unwrap_or(u64::MAX) != want {
                return Err(fail(format!(
                    "install returned {got:?}, reference {want} ns"
                )));
            }
        }
        let wake = st.gate.poll_action();
        let want_wake = done.expected_wake.map(|at| GateAction::Wake {
            at: Instant::from_nanos(at),
        });
        if wake != want_wake {
            return Err(fail(format!("wake {wake:?}, reference {want_wake:?}")));
        }
        if let Some(extra) = st.gate.poll_action() {
            return Err(fail(format!("a second action {extra:?}")));
        }
        check_events(&mut st, &done, wake, events).map_err(fail)?;
        st.gate.check_invariants().map_err(|e| fail(e.into()))?;
        compare(&st.gate, &st.reference, st.now, wake_slack(seed)).map_err(fail)?;
    }
    Ok(())
}

/// The events of one step: with events on, an install that changed or stored something
/// records exactly one `Installed` for its bucket and reason, whose openings are the
/// reference's, and the `Wake` events end at the step's wake action; with events off, none.
fn check_events(
    st: &mut State,
    done: &Step,
    wake: Option<GateAction>,
    on: bool,
) -> Result<(), alloc::string::String> {
    let got: Vec<GateEvent<Key>> = core::iter::from_fn(|| st.gate.poll_event()).collect();
    if !on {
        return match got.is_empty() {
            true => Ok(()),
            false => Err(format!("events while off: {got:?}")),
        };
    }
    if st.gate.events_dropped() != 0 {
        return Err("an event was dropped below the capacity".into());
    }
    let mut installs = 0;
    let mut earliest: Option<Instant> = None;
    for e in &got {
        match e {
            GateEvent::Installed {
                bucket,
                reason,
                attempt,
                reason_opens_at,
                opens_at,
                ..
            } => {
                installs += 1;
                let Some((b, r, want_attempt, t)) = done.installed else {
                    return Err(format!(
                        "an install event for a step that installs nothing: {e:?}"
                    ));
                };
                let own = st
                    .reference
                    .reasons(t, b)
                    .into_iter()
                    .find(|&(x, _)| x == r)
                    .map(|(_, d)| Instant::from_nanos(d));
                let remaining = done.install_result.map_or(0, |(_, want)| want);
                if *bucket != Key::new(b)
                    || reason.index() != r
                    || *attempt != want_attempt
                    || *reason_opens_at != own
                    || *opens_at != Instant::from_nanos(t.saturating_add(remaining))
                {
                    return Err(format!(
                        "event {e:?}, reference bucket {b} reason {r} attempt {want_attempt:?} own {own:?} opens {}",
                        t.saturating_add(remaining)
                    ));
                }
            }
            GateEvent::Wake { at } => earliest = Some(earliest.map_or(*at, |w| w.min(*at))),
        }
    }
    let stored = done.install_result.is_some_and(|(got, _)| !got.is_zero());
    if installs > 1 || (stored && installs == 0) {
        return Err(format!("{installs} install events: {got:?}"));
    }
    if earliest.map(|at| GateAction::Wake { at }) != wake {
        return Err(format!("wake events {got:?}, wake action {wake:?}"));
    }
    Ok(())
}

/// Operation `op` with `arm` armed. If the armed call fired, the gate must be unchanged;
/// the reference and both generators (the caller's, which the input may have drawn from
/// before the panic) roll back, and nothing is expected of the input.
fn armed(
    arm: Arm,
    op: u8,
    c: &mut Cursor<'_>,
    st: &mut State,
    step: usize,
) -> Result<Option<Step>, Divergence> {
    let before = user::snapshot(&st.gate);
    let saved = (
        st.reference.clone(),
        st.gate_rng.clone(),
        st.ref_rng.clone(),
    );
    match user::run(arm, || apply(op, c, st, step)) {
        Ok(done) => done,
        Err(user::Panicked) => {
            user::unchanged(&before, &st.gate, arm).map_err(|e| format!("step {step}: {e}"))?;
            (st.reference, st.gate_rng, st.ref_rng) = saved;
            Ok(Some(Step::new(format!("{op} with {arm:?} (panicked)"))))
        }
    }
}

/// Runs operation `op` on the gate and the reference; `None` when it was skipped.
fn apply(
    op: u8,
    c: &mut Cursor<'_>,
    st: &mut State,
    step: usize,
) -> Result<Option<Step>, Divergence> {
    let State {
        gate,
        reference,
        gate_rng,
        ref_rng,
        now,
        handles,
        foreign,
        disk,
        retriable,
        curve,
        kv_hard,
        kv_jitter,
    } = st;
    let now_v = *now;
    let b = c.below(BUCKETS);
    let key = Key::new(b);
    let mut done;
    match op {
        0 | 1 => {
            let attempts = c.small_or_extreme_u32();
            done = Step::new(format!("disk_write_locked(b{b}, attempts {attempts})"));
            let got = gate.handle_disk_write_locked(now_v, &key, attempts, gate_rng);
            let t = reference.observe(now_v);
            let (want, wake) = if reference.shut {
                (0, None)
            } else {
                let d = disk
                    .delay_for(attempts, ref_rng)
                    .max(Duration::from_millis(1));
                done.installed = Some((b, 0, Some(attempts), t));
                reference.install(t, b, 0, d)
            };
            done.install_result = Some((got, want));
            done.expected_wake = wake;
        }
        2 => {
            let attempts = c.small_or_extreme_u32();
            done = Step::new(format!("retriable_write(b{b}, attempts {attempts})"));
            let got = gate.handle_retriable_write(now_v, &key, attempts, gate_rng);
            let t = reference.observe(now_v);
            let (want, wake) = if reference.shut {
                (0, None)
            } else {
                let d = retriable.delay_for(attempts, ref_rng);
                done.installed = Some((b, 2, Some(attempts), t));
                reference.install(t, b, 2, d)
            };
            done.install_result = Some((got, want));
            done.expected_wake = wake;
        }
        3 => {
            let Some(s) = signal(c) else {
                return Ok(None);
            };
            done = Step::new(format!("kv_signal(b{b}, {s:?})"));
            let got = gate.handle_kv_signal(now_v, &key, s);
            let t = reference.observe(now_v);
            done.installed = (!reference.shut).then_some((b, kv_index(*kv_hard, s), None, t));
            let (want, wake) = reference.install(t, b, kv_index(*kv_hard, s), curve.delay(s));
            done.install_result = Some((got, want));
            done.expected_wake = wake;
        }
        4 => {
            let Some(s) = signal(c) else {
                return Ok(None);
            };
            done = Step::new(format!("kv_signal_jittered(b{b}, {s:?})"));
            let got = gate.handle_kv_signal_jittered(now_v, &key, s, gate_rng);
            let t = reference.observe(now_v);
            // The documented jitter: one uniform draw from d · (1 ± ppm / 10⁶) in whole ns,
            // only when on, the delay is not zero and the gate is open for installs.
            let d = curve.delay(s);
            let d = if reference.shut || *kv_jitter == 0 || d.is_zero() {
                d
            } else {
                let ns = d.as_nanos();
                let spread = ns * u128::from(*kv_jitter) / 1_000_000;
                let lo = u64::try_from(ns - spread).unwrap_or(u64::MAX);
                let hi = u64::try_from(ns + spread).unwrap_or(u64::MAX);
                Duration::from_nanos(crate::rng::between_inclusive(ref_rng, lo, hi))
            };
            done.installed = (!reference.shut).then_some((b, kv_index(*kv_hard, s), None, t));
            let (want, wake) = reference.install(t, b, kv_index(*kv_hard, s), d);
            done.install_result = Some((got, want));
            done.expected_wake = wake;
        }
        5 | 6 => {
            // Which reason is a variant: 0..=4 the registered ones, 5 one the gate never
            // saw (forever 5: a reason added later takes the next free value).
            let Some(r) = c.select(6).map(usize::from) else {
                return Ok(None);
            };
            let d = c.duration();
            done = Step::new(format!("throttle(b{b}, reason {r}, {d:?})"));
            if let Some(&reason) = handles.get(r).filter(|_| r != FOREIGN) {
                let got = gate.handle_throttle(now_v, &key, reason, d);
                let t = reference.observe(now_v);
                done.installed = (!reference.shut).then_some((b, r, None, t));
                let (want, wake) = reference.install(t, b, r, d);
                let got = got.map_err(|e| format!("step {step}: {}: {e}", done.what))?;
                done.install_result = Some((got, want));
                done.expected_wake = wake;
            } else {
                // Nothing changes, not even the clock.
                let got = gate.handle_throttle(now_v, &key, *foreign, d);
                if got != Err(GateError::UnknownReason(*foreign)) {
                    return Err(format!(
                        "step {step}: {}: got {got:?}, want the error",
                        done.what
                    ));
                }
            }
        }
        7 => {
            let known = c.bool();
            done = Step::new(format!("leader(b{b}, known {known})"));
            gate.handle_leader(now_v, &key, known);
            let t = reference.observe(now_v);
            done.expected_wake = reference.leader(t, b, known);
        }
        8 => {
            done = Step::new(format!("send(b{b})"));
            gate.handle_send(now_v, &key);
            let t = reference.observe(now_v);
            reference.send(t, b);
        }
        9 => {
            done = Step::new(format!("success(b{b})"));
            gate.handle_success(now_v, &key);
            let t = reference.observe(now_v);
            reference.success(t, b);
        }
        10 => {
            done = Step::new(format!("forget(b{b})"));
            let had = gate.forget(&key);
            if had != reference.has_state(b) {
                return Err(format!(
                    "step {step}: {}: returned {had}, reference {}",
                    done.what, !had
                ));
            }
            reference.forget(b);
        }
        11 => {
            // `b` is unused (read for the layout); a keep-mask and the bucket whose verdict
            // panics (`BUCKETS`: none).
            let mask = c.u8();
            let panic_on = c.below(BUCKETS + 1);
            done = Step::new(format!("retain(mask {mask:05b}, panic on {panic_on})"));
            let before = user::snapshot(gate);
            let mut visited = 0u32;
            let arm = Arm {
                callback: user::Callback::Eq,
                key: Some(panic_on),
                skip: 0,
            };
            // The closure is user code: for `panic_on` it calls that key's armed `Eq`.
            let out = user::run(arm, || {
                gate.retain(|k| {
                    visited |= 1 << k.id();
                    if k.id() == panic_on {
                        let _ = k.eq(&Key::new(k.id()));
                    }
                    mask & (1 << k.id()) != 0
                })
            });
            let judged = (0..BUCKETS).filter(|&x| reference.has_state(x));
            let want_visited = judged.fold(0u32, |m, x| m | 1 << x);
            match out {
                Err(user::Panicked) => {
                    user::unchanged(&before, gate, arm)
                        .map_err(|e| format!("step {step}: {}: {e}", done.what))?;
                }
                Ok(()) => {
                    if visited != want_visited {
                        return Err(format!(
                            "step {step}: {}: visited {visited:05b}, reference {want_visited:05b}",
                            done.what
                        ));
                    }
                    for x in 0..BUCKETS {
                        if mask & (1 << x) == 0 {
                            reference.forget(x);
                        }
                    }
                }
            }
        }
        12 => {
            done = Step::new(format!("handle_timeout({now_v:?})"));
            gate.handle_timeout(now_v);
            let t = reference.observe(now_v);
            reference.timeout(t);
            // The earliest opening left (the slack taken off) is later than the pass: with a
            // slack, the pass still evicted everything due by `t` and nothing else.
            let slack = gate.config().wake_slack();
            if let Some(p) = gate.poll_timeout().filter(|&p| p < Instant::MAX) {
                if (p - slack).as_nanos() <= t {
                    return Err(format!(
                        "step {step}: {}: a gate at {p:?} survived",
                        done.what
                    ));
                }
            }
        }
        13 => {
            // Was `begin_close`, a flag no decision read; kept as a step that changes
            // nothing so the corpus keeps its meaning.
            done = Step::new("is_closed".into());
            if gate.is_closed() != reference.shut {
                return Err(format!(
                    "step {step}: is_closed disagrees with the reference"
                ));
            }
        }
        15 if c.u8() < 8 => {
            done = Step::new("close".into());
            gate.close();
            done.expected_wake = reference.close();
        }
        // 14, and 15 when it does not close: a time step.
        _ => {
            *now = c.time_step(now_v);
            done = Step::new(format!("time -> {now:?}"));
        }
    }
    Ok(Some(done))
}

fn compare(
    gate: &Gate,
    reference: &Reference,
    now: Instant,
    slack: u64,
) -> Result<(), alloc::string::String> {
    let t = reference.peek(now);
    for b in 0..BUCKETS {
        let key = Key::new(b);
        let got = gate.remaining(now, &key);
        let want = reference.remaining(b, t);
        if u64::try_from(got.as_nanos()).unwrap_or(u64::MAX) != want {
            return Err(format!("remaining(b{b}) = {got:?}, reference {want} ns"));
        }
        let got = gate.check(now, &key);
        let want = reference.check(t, b);
        if to_expect(got) != want {
            return Err(format!("check(b{b}) = {got:?}, reference {want:?}"));
        }
        let got = gate
            .explain(now, &key)
            .map(|(r, at)| (r.index(), at.as_nanos()));
        let want = reference.explain(t, b);
        if got != want {
            return Err(format!("explain(b{b}) = {got:?}, reference {want:?}"));
        }
        let got: Vec<(usize, u64)> = gate
            .reasons(now, &key)
            .map(|(r, at)| (r.index(), at.as_nanos()))
            .collect();
        let want = reference.reasons(t, b);
        if got != want {
            return Err(format!("reasons(b{b}) = {got:?}, reference {want:?}"));
        }
    }
    // A paged walk of an unchanging gate lists each tracked bucket once, as the queries
    // (compared with the reference above) see it.
    let (mut listed, mut from) = (Vec::new(), None);
    loop {
        let page = gate.snapshot(now, from, 3);
        for item in &page.items {
            let reasons: Vec<_> = item
                .reasons
                .iter()
                .map(|r| (r.reason, r.opens_at))
                .collect();
            if item.state != gate.check(now, &item.bucket)
                || reasons != gate.reasons(now, &item.bucket).collect::<Vec<_>>()
            {
                return Err(format!("snapshot lists {item:?}, unlike check and reasons"));
            }
            listed.push(item.bucket.clone());
        }
        match page.next {
            Some(next) => from = Some(next),
            None => break,
        }
    }
    let count = listed.len();
    listed.sort_by_key(|k| k.id());
    listed.dedup();
    if count != gate.len() || listed.len() != count {
        return Err(format!(
            "snapshot listed {count} buckets ({} distinct) of {}",
            listed.len(),
            gate.len()
        ));
    }
    // The slack rule: the earliest opening plus the slack, saturating at the end of time.
    let got = gate.poll_timeout().map(Instant::as_nanos);
    let want = reference.poll_timeout().map(|d| d.saturating_add(slack));
    if got != want {
        return Err(format!(
            "poll_timeout = {got:?}, reference {want:?} (slack {slack} ns)"
        ));
    }
    if gate.len() != reference.len() {
        return Err(format!(
            "len = {}, reference {}",
            gate.len(),
            reference.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_short_inputs_pass() {
        assert_eq!(check(&[]), Ok(()));
        assert_eq!(check(&[0xFF; 64]), Ok(()));
    }

    #[test]
    #[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
    fn scripted_scenario_passes() {
        // Probes on everywhere; disk installs, KV signals, leader flips, sends, time steps.
        let mut bytes = alloc::vec![0x1F];
        bytes.extend_from_slice(&7u64.to_le_bytes());
        bytes.extend_from_slice(&[0, 0]);
        for round in 0u8..60 {
            bytes.extend_from_slice(&[round % 16, round % 5, round, 3, 7, 1]);
        }
        assert_eq!(check(&bytes), Ok(()));
    }
}
