use super::*;
use crate::rng::SplitMix64;
use crate::test_hasher::TestHasher;
use crate::write_gate::{Reason, WriteGateConfig};
use alloc::vec;
use core::time::Duration;

type W = PacedWriter<u32, u32, u32, TestHasher>;
type Action = WriterAction<u32, u32, u32>;

const T0: Instant = Instant::ZERO;

fn writer(cfg: PacedWriterConfig) -> W {
    match W::new(cfg) {
        Ok(w) => w,
        Err(e) => panic!("valid config refused: {e}"),
    }
}

fn actions(w: &mut W) -> Vec<Action> {
    let out: Vec<Action> = core::iter::from_fn(|| w.poll_action()).collect();
    assert_eq!(w.check_invariants(), Ok(()));
    out
}

/// `(request, node, bucket, id, records)` of every send in `actions`.
fn sends(w: &W, actions: &[Action]) -> Vec<(u64, u32, u32, BatchId, Vec<u32>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            WriterAction::Send {
                request,
                node,
                bucket,
                batch,
            } => Some((
                *request,
                *node,
                *bucket,
                *batch,
                w.batch(*batch)
                    .map(|b| b.records().to_vec())
                    .unwrap_or_default(),
            )),
            _ => None,
        })
        .collect()
}

fn drain_sends(w: &mut W, now: Instant) -> Vec<(u64, u32, u32, BatchId, Vec<u32>)> {
    w.drain(now);
    let a = actions(w);
    sends(w, &a)
}

fn respond(w: &mut W, now: Instant, id: BatchId, outcome: WriteOutcome) -> Vec<Action> {
    let mut rng = SplitMix64::new(3);
    assert_eq!(w.handle_response(now, id, outcome, &mut rng), Ok(()));
    actions(w)
}

const OK: WriteOutcome = WriteOutcome::Ok {
    pressure: Signal::Clear,
};

#[test]
fn a_disk_rejection_parks_the_bucket_for_the_backoff_then_resends() {
    let mut w = writer(PacedWriterConfig::default());
    w.set_leader(T0, 7, Some(1));
    w.append(T0, 7, 70, 100).unwrap();
    let s = drain_sends(&mut w, T0);
    assert_eq!(s.len(), 1);
    assert!(respond(&mut w, T0, s[0].3, WriteOutcome::DiskWriteLocked).is_empty());
    assert!(drain_sends(&mut w, T0).is_empty(), "gated bucket skipped");
    let wake = w.poll_timeout().expect("a batch waits behind the gate");
    let opens = w.gate().reopens_at(T0, &7).expect("gated");
    assert!(opens >= T0 + Duration::from_millis(800) && opens <= T0 + Duration::from_millis(1200));
    // The default slack: 5 % of the 1 s disk backoff.
    assert_eq!(wake, opens + Duration::from_millis(50));
    // Before the gate opens nothing is sent, however often the loop drains.
    for _ in 0..10 {
        assert!(drain_sends(&mut w, opens - Duration::from_nanos(1)).is_empty());
    }
    w.handle_timeout(wake);
    let s = drain_sends(&mut w, wake);
    assert_eq!(s.len(), 1);
    assert_eq!(w.batch(s[0].3).map(WriteBatch::attempts), Some(1));
    let done = respond(&mut w, wake, s[0].3, OK);
    assert!(matches!(&done[..], [WriterAction::Acked { batch }] if batch.records() == [70]));
    assert_eq!(w.pending_batches(), 0);
}

#[test]
fn with_the_disk_backoff_off_a_rejection_is_resent_at_the_next_drain() {
    let mut w = writer(PacedWriterConfig::default().with_disk_backoff(false));
    w.set_leader(T0, 7, Some(1));
    w.append(T0, 7, 1, 100).unwrap();
    let s = drain_sends(&mut w, T0);
    respond(&mut w, T0, s[0].3, WriteOutcome::DiskWriteLocked);
    assert_eq!(drain_sends(&mut w, T0).len(), 1);
    assert_eq!(w.poll_timeout(), None);
}

#[test]
fn an_unknown_leader_is_reported_once_even_while_gated() {
    let mut w = writer(PacedWriterConfig::default());
    w.set_leader(T0, 3, Some(1));
    w.append(T0, 3, 1, 100).unwrap();
    let s = drain_sends(&mut w, T0);
    respond(&mut w, T0, s[0].3, WriteOutcome::DiskWriteLocked);
    w.set_leader(T0, 3, None);
    w.drain(T0);
    assert_eq!(
        actions(&mut w),
        vec![WriterAction::RefreshLeader { bucket: 3 }]
    );
    assert_eq!(
        w.poll_timeout(),
        None,
        "no wake while the leader is unknown"
    );
    w.append(T0, 3, 2, 100).unwrap();
    w.drain(T0);
    assert!(actions(&mut w).is_empty(), "reported once per episode");
    // The leader is back: the bucket waits out its disk backoff, which survived the move.
    w.set_leader(T0, 3, Some(2));
    assert!(drain_sends(&mut w, T0).is_empty());
    let wake = w.poll_timeout().expect("still gated");
    w.handle_timeout(wake);
    let s = drain_sends(&mut w, wake);
    assert_eq!(
        (s[0].1, s[0].2, s[0].4.clone()),
        (2, 3, vec![1]),
        "the sealed retry first"
    );
}

#[test]
fn a_bucket_never_given_a_leader_asks_for_one() {
    let mut w = writer(PacedWriterConfig::default());
    w.append(T0, 9, 1, 10).unwrap();
    w.drain(T0);
    assert_eq!(
        actions(&mut w),
        vec![WriterAction::RefreshLeader { bucket: 9 }]
    );
    w.set_leader(T0, 9, Some(4));
    assert_eq!(drain_sends(&mut w, T0).len(), 1);
}

#[test]
fn a_batch_fails_after_max_retries_and_installs_nothing() {
    let mut w = writer(PacedWriterConfig::default().with_max_retries(1));
    w.set_leader(T0, 1, Some(1));
    w.append(T0, 1, 10, 10).unwrap();
    let s = drain_sends(&mut w, T0);
    respond(&mut w, T0, s[0].3, WriteOutcome::Retriable);
    assert!(
        drain_sends(&mut w, T0).is_empty(),
        "the retriable backoff gates it"
    );
    let t1 = w.poll_timeout().expect("gated batch waits");
    w.handle_timeout(t1);
    let s = drain_sends(&mut w, t1);
    let done = respond(&mut w, t1, s[0].3, WriteOutcome::Retriable);
    assert!(matches!(
        &done[..],
        [WriterAction::Failed { batch, cause: FailCause::RetriesExhausted { last: WriteOutcome::Retriable } }]
            if batch.attempts() == 1 && batch.records() == [10]
    ));
    assert_eq!(w.gate().remaining(t1, &1), Duration::ZERO);
    assert_eq!(w.pending_batches(), 0);
}

#[test]
fn max_retries_zero_fails_at_the_first_rejection_and_fatal_fails_at_once() {
    let mut w = writer(PacedWriterConfig::default().with_max_retries(0));
    w.set_leader(T0, 1, Some(1));
    w.append(T0, 1, 10, 10).unwrap();
    let s = drain_sends(&mut w, T0);
    let done = respond(&mut w, T0, s[0].3, WriteOutcome::DiskWriteLocked);
    assert!(matches!(&done[..], [WriterAction::Failed { .. }]));
    let mut w = writer(PacedWriterConfig::default());
    w.set_leader(T0, 1, Some(1));
    w.append(T0, 1, 10, 10).unwrap();
    let s = drain_sends(&mut w, T0);
    let done = respond(&mut w, T0, s[0].3, WriteOutcome::Fatal);
    assert!(matches!(
        &done[..],
        [WriterAction::Failed {
            cause: FailCause::Fatal,
            ..
        }]
    ));
    assert!(w.gate().is_empty());
}

/// Probe mode: after the backoff the gate allows one probe send; while it is used up the
/// bucket is `Probing`. A loop that drains again and again must not send more.
#[test]
fn probe_mode_does_not_spin() {
    let mut gate = WriteGateConfig::default();
    gate.set_probe(Reason::DISK_WRITE_LOCKED, Some(1)).unwrap();
    gate.set_probe_ttl(Reason::DISK_WRITE_LOCKED, Duration::from_secs(60))
        .unwrap();
    let cfg = PacedWriterConfig::default()
        .with_gate(gate)
        .with_batch_bytes(10)
        .with_max_retries(1);
    let mut w = writer(cfg);
    w.set_leader(T0, 5, Some(1));
    for r in 0..3 {
        w.append(T0, 5, r, 10).unwrap(); // one batch each
    }
    let s = drain_sends(&mut w, T0);
    respond(&mut w, T0, s[0].3, WriteOutcome::DiskWriteLocked);
    assert!(drain_sends(&mut w, T0).is_empty());
    let open = w.poll_timeout().expect("backoff");
    w.handle_timeout(open);
    // The probe.
    let probe = drain_sends(&mut w, open);
    assert_eq!(probe.len(), 1);
    let mut sent = 0;
    for _ in 0..100 {
        sent += drain_sends(&mut w, open).len();
    }
    assert_eq!(sent, 0, "the probe is in flight");
    // The probe is rejected for the last time: the batch fails and installs nothing, so the
    // bucket stays Probing with its allowance used and nothing in flight.
    let done = respond(&mut w, open, probe[0].3, WriteOutcome::DiskWriteLocked);
    assert!(matches!(&done[..], [WriterAction::Failed { .. }]));
    assert!(matches!(
        w.gate().check(open, &5),
        GateState::Probing { .. }
    ));
    let mut now = open;
    for _ in 0..100 {
        sent += drain_sends(&mut w, now).len();
        // A driver sleeps until poll_timeout: it is always ahead of `now`.
        let wake = w.poll_timeout().expect("the probe state lapses");
        assert!(wake > now);
        now += Duration::from_millis(1);
        w.handle_timeout(now.min(wake - Duration::from_nanos(1)));
    }
    assert_eq!(sent, 0, "no send while Probing");
    let lapse = w.poll_timeout().expect("lapse");
    assert_eq!(lapse, open + Duration::from_secs(60));
    w.handle_timeout(lapse);
    let s = drain_sends(&mut w, lapse);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].4, vec![1]);
}

/// A probe's success ends probe mode: the rest of the queue flows without waiting.
#[test]
fn a_successful_probe_reopens_the_bucket() {
    let mut gate = WriteGateConfig::default();
    gate.set_probe(Reason::DISK_WRITE_LOCKED, Some(1)).unwrap();
    let mut w = writer(
        PacedWriterConfig::default()
            .with_gate(gate)
            .with_batch_bytes(10),
    );
    w.set_leader(T0, 5, Some(1));
    for r in 0..3 {
        w.append(T0, 5, r, 10).unwrap();
    }
    let s = drain_sends(&mut w, T0);
    respond(&mut w, T0, s[0].3, WriteOutcome::DiskWriteLocked);
    assert!(drain_sends(&mut w, T0).is_empty());
    let open = w.poll_timeout().unwrap();
    w.handle_timeout(open);
    let probe = drain_sends(&mut w, open);
    respond(&mut w, open, probe[0].3, OK);
    for r in 1..3 {
        let s = drain_sends(&mut w, open);
        assert_eq!(s[0].4, vec![r]);
        respond(&mut w, open, s[0].3, OK);
    }
    assert_eq!(w.pending_batches(), 0);
}

#[test]
fn records_join_the_newest_unsent_batch_up_to_the_byte_limit() {
    let mut w = writer(PacedWriterConfig::default().with_batch_bytes(100));
    w.set_leader(T0, 1, Some(1));
    w.append(T0, 1, 1, 60).unwrap();
    w.append(T0, 1, 2, 40).unwrap(); // exactly 100: joins
    w.append(T0, 1, 3, 1).unwrap(); // new batch
    w.append(T0, 1, 4, 500).unwrap(); // too large: alone
    assert_eq!(w.queued_batches(), 3);
    let s = drain_sends(&mut w, T0);
    assert_eq!(s[0].4, vec![1, 2]);
    // Rejected: the batch is sealed; a record appended while it is gated starts a new
    // batch behind it.
    respond(&mut w, T0, s[0].3, WriteOutcome::DiskWriteLocked);
    w.append(T0, 1, 5, 1).unwrap();
    assert!(drain_sends(&mut w, T0).is_empty());
    let wake = w.poll_timeout().unwrap();
    w.handle_timeout(wake);
    let mut got = Vec::new();
    let mut now = wake;
    while w.pending_batches() > 0 {
        let s = drain_sends(&mut w, now);
        assert_eq!(s.len(), 1, "one batch per bucket in flight");
        got.push(s[0].4.clone());
        respond(&mut w, now, s[0].3, OK);
        now += Duration::from_millis(1);
    }
    assert_eq!(got, vec![vec![1, 2], vec![3], vec![4], vec![5]]);
}

#[test]
fn a_drain_groups_sends_per_leader_node_into_requests() {
    let mut w = writer(PacedWriterConfig::default());
    for (bucket, node) in [(1, 10), (2, 20), (3, 10), (4, 20), (5, 30)] {
        w.set_leader(T0, bucket, Some(node));
        w.append(T0, bucket, bucket * 100, 1).unwrap();
    }
    let s = drain_sends(&mut w, T0);
    let shape: Vec<(u64, u32, u32)> = s.iter().map(|x| (x.0, x.1, x.2)).collect();
    assert_eq!(
        shape,
        vec![(1, 10, 1), (1, 10, 3), (2, 20, 2), (2, 20, 4), (3, 30, 5)]
    );
    // The next drain numbers its requests afresh.
    for x in &s {
        respond(&mut w, T0, x.3, OK);
    }
    w.append(T0, 3, 1, 1).unwrap();
    let s = drain_sends(&mut w, T0);
    assert_eq!((s[0].0, s[0].1), (4, 10));
}

#[test]
fn a_bogus_or_repeated_answer_is_refused_and_changes_nothing() {
    let mut w = writer(PacedWriterConfig::default());
    let mut other = writer(PacedWriterConfig::default());
    let mut rng = SplitMix64::new(1);
    for x in [&mut w, &mut other] {
        x.set_leader(T0, 1, Some(1));
        x.append(T0, 1, 1, 1).unwrap();
    }
    let s = drain_sends(&mut w, T0);
    let theirs = drain_sends(&mut other, T0);
    assert_eq!(
        w.handle_response(T0, theirs[0].3, OK, &mut rng),
        Err(ResponseError::Unknown)
    );
    assert_eq!(w.in_flight(), 1);
    respond(&mut w, T0, s[0].3, WriteOutcome::Retriable);
    assert_eq!(
        w.handle_response(T0, s[0].3, OK, &mut rng),
        Err(ResponseError::AlreadyAnswered)
    );
    assert_eq!((w.in_flight(), w.queued_batches()), (0, 1));
}

#[test]
fn close_fails_what_is_held_back_and_leaves_flights_to_their_answers() {
    let mut w = writer(PacedWriterConfig::default().with_batch_bytes(1));
    w.set_leader(T0, 1, Some(1));
    w.set_leader(T0, 2, Some(1));
    for r in 0..3 {
        w.append(T0, 1, r, 1).unwrap();
    }
    w.append(T0, 2, 9, 1).unwrap();
    let s = drain_sends(&mut w, T0);
    assert_eq!(s.len(), 2);
    w.close();
    let failed = actions(&mut w);
    assert_eq!(failed.len(), 2, "the two queued batches of bucket 1");
    assert!(failed.iter().all(|a| matches!(
        a,
        WriterAction::Failed {
            cause: FailCause::Closed,
            ..
        }
    )));
    assert_eq!(w.append(T0, 1, 5, 1), Err(AppendRefused(5)));
    // In flight: a rejection now fails instead of retrying; a success is acked.
    let a = respond(&mut w, T0, s[0].3, WriteOutcome::DiskWriteLocked);
    assert!(matches!(
        &a[..],
        [WriterAction::Failed {
            cause: FailCause::Closed,
            ..
        }]
    ));
    let a = respond(&mut w, T0, s[1].3, OK);
    assert!(matches!(&a[..], [WriterAction::Acked { .. }]));
    w.close();
    assert!(actions(&mut w).is_empty(), "idempotent");
    assert_eq!(w.pending_batches(), 0);
}

#[test]
fn kv_pressure_paces_the_bucket_unless_switched_off() {
    for on in [true, false] {
        let mut w = writer(PacedWriterConfig::default().with_kv_pressure(on));
        w.set_leader(T0, 1, Some(1));
        w.append(T0, 1, 1, 1).unwrap();
        let s = drain_sends(&mut w, T0);
        w.append(T0, 1, 2, 1).unwrap();
        respond(
            &mut w,
            T0,
            s[0].3,
            WriteOutcome::Ok {
                pressure: Signal::Pressure(500_000),
            },
        );
        let s = drain_sends(&mut w, T0);
        assert_eq!(s.is_empty(), on);
        assert_eq!(w.poll_timeout().is_some(), on);
    }
}

#[test]
fn idle_buckets_without_a_leader_are_forgotten_and_memory_comes_back() {
    let mut w = writer(PacedWriterConfig::default());
    for b in 0..100 {
        w.append(T0, b, b, 1).unwrap();
    }
    w.drain(T0);
    assert_eq!(actions(&mut w).len(), 100);
    w.close();
    actions(&mut w);
    w.drain(T0);
    assert_eq!(w.buckets(), 0);
    let mut now = T0;
    for _ in 0..3 {
        now += Duration::from_secs(2);
        w.handle_timeout(now);
        assert_eq!(w.check_invariants(), Ok(()));
    }
    assert!(w.buckets.len() < 100);
}

#[test]
fn a_panicking_key_leaves_the_writer_consistent_and_every_batch_held_once() {
    use crate::test_key::{Call, PanicKey, panics};
    type P = PacedWriter<PanicKey, u32, u32, TestHasher>;
    for call in [Call::Hash, Call::Eq, Call::Clone] {
        for skip in 0..6 {
            let mut w: P = P::new(PacedWriterConfig::default()).unwrap();
            let mut rng = SplitMix64::new(1);
            for k in 0..3 {
                w.set_leader(T0, PanicKey(k), Some(1));
                w.append(T0, PanicKey(k), k, 1).unwrap();
            }
            let _ = panics(1, call, skip, || w.drain(T0));
            assert_eq!(w.check_invariants(), Ok(()));
            w.drain(T0);
            let mut ids = Vec::new();
            while let Some(a) = w.poll_action() {
                if let WriterAction::Send { batch, .. } = a {
                    ids.push(batch);
                }
            }
            assert_eq!(
                ids.len(),
                3,
                "{call:?} {skip}: every bucket sent exactly once"
            );
            let id = ids[0];
            let _ = panics(1, call, skip, || {
                let _ = w.handle_response(T0, id, OK, &mut rng);
            });
            let _ = panics(2, call, skip, || {
                let _ = w.append(T0, PanicKey(2), 7, 1);
            });
            assert_eq!(w.check_invariants(), Ok(()));
            for id in ids {
                let _ = w.handle_response(T0, id, OK, &mut rng);
            }
            w.drain(T0);
            while let Some(a) = w.poll_action() {
                if let WriterAction::Send { batch, .. } = a {
                    w.handle_response(T0, batch, OK, &mut rng).unwrap();
                }
            }
            assert_eq!(w.pending_batches(), 0, "{call:?} {skip}");
            assert_eq!(w.check_invariants(), Ok(()));
        }
    }
}

#[test]
fn a_bad_config_is_refused() {
    assert!(matches!(
        W::new(PacedWriterConfig::default().with_batch_bytes(0)),
        Err(ConfigError::OutOfRange {
            option: &crate::options::paced_writer::BATCH_BYTES,
            ..
        })
    ));
}

#[test]
fn kv_jitter_configured_on_the_gate_reaches_the_writers_kv_holds() {
    let hold = |jitter: u32, pressure: Signal| {
        let gate = WriteGateConfig::default().with_kv_jitter(jitter);
        let cfg = PacedWriterConfig::default().with_gate(gate);
        let mut w = writer(cfg.with_wake_slack(Duration::ZERO));
        w.set_leader(T0, 1, Some(1));
        w.append(T0, 1, 1, 1).unwrap();
        let s = drain_sends(&mut w, T0);
        w.append(T0, 1, 2, 1).unwrap();
        let outcome = match pressure {
            Signal::Full => WriteOutcome::StorageBackpressure,
            p => WriteOutcome::Ok { pressure: p },
        };
        respond(&mut w, T0, s[0].3, outcome);
        assert!(drain_sends(&mut w, T0).is_empty(), "the bucket is held");
        w.poll_timeout().map(|t| t - T0)
    };
    let nominal = [
        (Signal::Pressure(500_000), Duration::from_millis(750)),
        (Signal::Full, Duration::from_millis(3000)),
    ];
    for (signal, delay) in nominal {
        assert_eq!(hold(0, signal), Some(delay), "no jitter: the curve's delay");
        let jittered = hold(200_000, signal).expect("a hold");
        assert_ne!(
            jittered, delay,
            "±20 % jitter drawn from the writer's generator"
        );
        assert!(
            jittered >= delay * 4 / 5 && jittered <= delay * 6 / 5,
            "{jittered:?}"
        );
    }
}

#[test]
fn with_events_on_the_writer_yields_its_gate_s_install_with_the_reason_and_attempt() {
    let mut w = writer(PacedWriterConfig::default());
    w.set_leader(T0, 7, Some(1));
    w.append(T0, 7, 70, 100).unwrap();
    // Off by default: a rejection records nothing.
    let s = drain_sends(&mut w, T0);
    let _ = respond(&mut w, T0, s[0].3, WriteOutcome::DiskWriteLocked);
    assert_eq!((w.poll_event(), w.events_dropped()), (None, 0));
    w.set_event_capacity(8);
    assert!(drain_sends(&mut w, T0).is_empty(), "gated");
    let wake = w.poll_timeout().expect("gated");
    w.handle_timeout(wake);
    let s = drain_sends(&mut w, wake);
    let _ = respond(&mut w, wake, s[0].3, WriteOutcome::DiskWriteLocked);
    assert!(drain_sends(&mut w, wake).is_empty(), "gated again");
    let opens = w.poll_timeout().expect("gated again") - w.config().wake_slack();
    let got: Vec<_> = core::iter::from_fn(|| w.poll_event()).collect();
    assert!(
        matches!(
            &got[..],
            // The second rejection in a row: the disk backoff's attempt 1 (the first was 0).
            [GateEvent::Installed { bucket: 7, reason: Reason::DISK_WRITE_LOCKED, attempt: Some(1), opens_at, .. }]
                if *opens_at == opens
        ),
        "{got:?}"
    );
    assert_eq!(w.events_dropped(), 0);
}

/// Buckets whose gates open within the slack of the first travel in one request at the first
/// opening plus the slack; one opening later than that waits for its own wake, and none is
/// sent before its gate opens. With no slack each opening is its own wake.
#[test]
fn the_wake_slack_sends_the_buckets_opening_within_it_together_and_none_early() {
    let disk = crate::backoff::BackoffConfig::constant(Duration::from_secs(1)).unwrap();
    let run = |slack: Duration| {
        let gate = WriteGateConfig::default().with_disk_write_locked(disk.clone());
        let mut w = writer(
            PacedWriterConfig::default()
                .with_gate(gate)
                .with_wake_slack(slack),
        );
        // Buckets 1, 2, 3 rejected at 0, 10 and 70 ms: they open at 1.000, 1.010, 1.070 s.
        let ms = Duration::from_millis;
        for (b, at) in [(1u32, 0u64), (2, 10), (3, 70)] {
            let now = T0 + ms(at);
            w.set_leader(now, b, Some(9));
            w.append(now, b, b, 1).unwrap();
            let s = drain_sends(&mut w, now);
            assert_eq!(s.len(), 1);
            respond(&mut w, now, s[0].3, WriteOutcome::DiskWriteLocked);
        }
        let mut passes = Vec::new();
        while let Some(at) = w.poll_timeout() {
            // Never a bucket before its gate opens: a drain just before the wake sends
            // nothing that is still gated.
            w.handle_timeout(at);
            let sent = drain_sends(&mut w, at);
            for (_, _, b, id, _) in &sent {
                assert_eq!(w.gate().check(at, b), GateState::Open, "sent while gated");
                let _ = respond(&mut w, at, *id, OK);
            }
            let requests: Vec<u64> = sent.iter().map(|s| s.0).collect();
            let buckets: Vec<u32> = sent.iter().map(|s| s.2).collect();
            passes.push((at - T0, buckets, requests));
        }
        passes
    };
    let ms = Duration::from_millis;
    let coalesced = run(ms(50));
    assert_eq!(coalesced.len(), 2, "{coalesced:?}");
    assert_eq!(
        (coalesced[0].0, &coalesced[0].1[..]),
        (ms(1_050), &[1, 2][..])
    );
    assert_eq!(coalesced[0].2[0], coalesced[0].2[1], "one request for both");
    assert_eq!((coalesced[1].0, &coalesced[1].1[..]), (ms(1_120), &[3][..]));
    let exact = run(Duration::ZERO);
    let times: Vec<Duration> = exact.iter().map(|p| p.0).collect();
    assert_eq!(times, [ms(1_000), ms(1_010), ms(1_070)]);
}
