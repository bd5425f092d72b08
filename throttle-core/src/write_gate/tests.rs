extern crate std;

use super::*;
use crate::backoff::BackoffConfig;
use crate::backpressure::ThrottleCurve;
use crate::rng::SplitMix64;
use core::cell::Cell;
use std::collections::hash_map::RandomState;
use std::rc::Rc;

type Gate = WriteGate<u32, RandomState>;

const DISK: Reason = Reason::DISK_WRITE_LOCKED;
const KV: Reason = Reason::KV_BACKPRESSURE;
const RETRY: Reason = Reason::RETRIABLE_WRITE;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at(n: u64) -> Instant {
    Instant::from_millis(n)
}

fn gate() -> Gate {
    let cfg = WriteGateConfig::default();
    assert_eq!(cfg.kv_curve(), &ThrottleCurve::fluss_landed());
    Gate::new(cfg).expect("a valid config")
}

fn install(g: &mut Gate, now: Instant, b: u32, r: Reason, d: Duration) -> Duration {
    let got = g.handle_throttle(now, &b, r, d);
    assert!(g.check_invariants().is_ok(), "{:?}", g.check_invariants());
    got.unwrap_or(Duration::MAX)
}

/// As [`install`], without the O(n) invariant check after it: for loops over many buckets,
/// which check once at the end (each check after each install made them quadratic, minutes
/// under miri).
fn install_many(
    g: &mut Gate,
    now: Instant,
    buckets: impl IntoIterator<Item = (u32, Duration)>,
    r: Reason,
) {
    for (b, d) in buckets {
        let _ = g.handle_throttle(now, &b, r, d);
    }
    assert!(g.check_invariants().is_ok(), "{:?}", g.check_invariants());
}

fn drain(g: &mut Gate) -> Option<GateAction> {
    let first = g.poll_action();
    assert_eq!(g.poll_action(), None, "wakes coalesce into one action");
    first
}

#[test]
fn disk_install_uses_attempts_before_increment_and_the_preset() {
    let mut g = gate();
    let cfg = BackoffConfig::fluss_disk_write_locked();
    let mut expect = SplitMix64::new(5);
    let mut rng = SplitMix64::new(5);
    // First rejection: exponent 0, i.e. the 1 s initial backoff ±20 %.
    let want0 = cfg.delay_for(0, &mut expect);
    assert!(want0 >= ms(800) && want0 <= ms(1_200), "{want0:?}");
    assert_eq!(g.handle_disk_write_locked(at(0), &1, 0, &mut rng), want0);
    assert_eq!(
        g.check(at(0), &1),
        GateState::Closed {
            until: at(0) + want0,
            reason: DISK
        }
    );
    // Third attempt of another bucket: exponent 2 (4 s ±20 %).
    let want2 = cfg.delay_for(2, &mut expect);
    assert_eq!(g.handle_disk_write_locked(at(0), &2, 2, &mut rng), want2);
    assert!(want2 >= ms(3_200) && want2 <= ms(4_800), "{want2:?}");
    assert_eq!(rng, expect, "exactly one draw per install");
}

#[test]
fn disk_install_never_goes_below_the_one_ms_floor() {
    // Whatever the backoff draws, a disk rejection holds the bucket at least 1 ms.
    let mut g = gate();
    let mut rng = SplitMix64::new(1);
    let got = g.handle_disk_write_locked(at(0), &1, 0, &mut rng);
    assert!(got >= DISK_WRITE_LOCKED_FLOOR);
    assert!(
        g.check(
            at(0) + DISK_WRITE_LOCKED_FLOOR - Duration::from_nanos(1),
            &1
        ) != GateState::Open
    );
}

#[test]
fn bucket_is_closed_one_ns_before_its_deadline_and_open_at_it() {
    let mut g = gate();
    install(&mut g, at(0), 1, DISK, ms(1_000));
    let deadline = at(1_000);
    let just_before = deadline - Duration::from_nanos(1);
    assert_eq!(
        g.check(just_before, &1),
        GateState::Closed {
            until: deadline,
            reason: DISK
        }
    );
    assert_eq!(g.remaining(just_before, &1), Duration::from_nanos(1));
    assert_eq!(
        g.remaining_ms(just_before, &1),
        1,
        "a closed gate never reports 0 ms"
    );
    assert_eq!(g.check(deadline, &1), GateState::Open);
    assert_eq!(g.remaining(deadline, &1), Duration::ZERO);
    assert_eq!(g.remaining_ms(deadline, &1), 0);
}

#[test]
fn remaining_ms_rounds_up() {
    let mut g = gate();
    install(&mut g, at(0), 1, RETRY, Duration::from_nanos(1_000_001));
    assert_eq!(g.remaining_ms(at(0), &1), 2);
    assert_eq!(g.remaining_ms(Instant::from_nanos(1_000_000), &1), 1);
}

#[test]
fn repeated_reads_neither_redraw_nor_extend() {
    let mut g = gate();
    let mut rng = SplitMix64::new(11);
    let d = g.handle_disk_write_locked(at(0), &1, 3, &mut rng);
    let snapshot = (g.poll_timeout(), g.explain(at(0), &1));
    for step in 0..50u64 {
        let now = at(step * 10);
        assert_eq!(g.remaining(now, &1), d.saturating_sub(ms(step * 10)));
        assert_eq!(
            g.check(now, &1),
            GateState::Closed {
                until: at(0) + d,
                reason: DISK
            }
        );
    }
    assert_eq!((g.poll_timeout(), g.explain(at(0), &1)), snapshot);
}

#[test]
fn shorter_backoff_never_shortens_pending_gate() {
    let mut g = gate();
    assert_eq!(install(&mut g, at(0), 1, DISK, ms(8_000)), ms(8_000));
    // A later, shorter install keeps the pending 8 s and reports what is left of it.
    assert_eq!(install(&mut g, at(1_000), 1, DISK, ms(1_000)), ms(7_000));
    assert_eq!(
        g.check(at(1_000), &1),
        GateState::Closed {
            until: at(8_000),
            reason: DISK
        }
    );
    // A longer one extends it.
    assert_eq!(install(&mut g, at(2_000), 1, DISK, ms(9_000)), ms(9_000));
    assert_eq!(g.poll_timeout(), Some(at(11_000)));
    assert_eq!(drain(&mut g), None, "never-shorten installs never wake");
}

#[test]
fn kv_signal_latest_wins_shortens_and_clears() {
    let mut g = gate();
    assert_eq!(g.handle_kv_signal(at(0), &1, Signal::Full), ms(3_000));
    assert_eq!(drain(&mut g), None);
    // p = 0.1 under the landed curve (k = 2, 3000 ms): 3000 · 0.01 = 30 ms.
    assert_eq!(
        g.handle_kv_signal(at(100), &1, Signal::Pressure(100_000)),
        ms(30)
    );
    assert_eq!(drain(&mut g), Some(GateAction::Wake { at: at(130) }));
    assert_eq!(
        g.poll_timeout(),
        Some(at(130)),
        "the heap item re-sifted in place"
    );
    assert_eq!(
        g.handle_kv_signal(at(110), &1, Signal::Clear),
        Duration::ZERO
    );
    assert_eq!(drain(&mut g), Some(GateAction::Wake { at: at(110) }));
    assert_eq!(g.check(at(110), &1), GateState::Open);
    assert!(
        g.is_empty(),
        "a cleared bucket holding nothing is evicted at once"
    );
}

/// The issue's scenario: a 1000 ms disk gate plus a 2000 ms retry gate. KV Full (3000 ms)
/// raises the remaining time: no wake; KV 30 ms lowers it from 3000 to 2000 ms (the retry
/// gate): wake; KV clear leaves it at 2000 ms: no wake.
#[test]
fn remaining_is_max_across_reasons_and_wakes_only_when_it_decreases() {
    let mut g = gate();
    assert_eq!(g.config().kv_curve().delay(Signal::Full), ms(3_000));
    assert_eq!(
        g.config().kv_curve().delay(Signal::Pressure(100_000)),
        ms(30)
    );
    let t0 = at(10_000);
    install(&mut g, t0, 7, DISK, ms(1_000));
    install(&mut g, t0, 7, RETRY, ms(2_000));
    assert_eq!(g.remaining(t0, &7), ms(2_000));
    assert_eq!(g.explain(t0, &7), Some((RETRY, t0 + ms(2_000))));
    drain(&mut g);

    assert_eq!(g.handle_kv_signal(t0, &7, Signal::Full), ms(3_000));
    assert_eq!(drain(&mut g), None, "KV Full at 3000 ms does not wake");
    assert_eq!(
        g.check(t0, &7),
        GateState::Closed {
            until: t0 + ms(3_000),
            reason: KV
        }
    );

    assert_eq!(
        g.handle_kv_signal(t0, &7, Signal::Pressure(100_000)),
        ms(2_000)
    );
    assert_eq!(
        drain(&mut g),
        Some(GateAction::Wake { at: t0 + ms(2_000) }),
        "KV 30 ms then does (3000 -> 2000 ms)"
    );
    assert_eq!(g.handle_kv_signal(t0, &7, Signal::Clear), ms(2_000));
    assert_eq!(drain(&mut g), None, "KV clear does not (2000 -> 2000 ms)");
    assert_eq!(g.poll_timeout(), Some(t0 + ms(2_000)));
}

#[test]
fn shorter_kv_signal_under_longer_disk_gate_changes_nothing() {
    let mut g = gate();
    install(&mut g, at(0), 1, DISK, ms(5_000));
    g.handle_kv_signal(at(0), &1, Signal::Full);
    assert_eq!(
        g.handle_kv_signal(at(10), &1, Signal::Pressure(100_000)),
        ms(4_990)
    );
    assert_eq!(drain(&mut g), None);
    assert_eq!(g.poll_timeout(), Some(at(5_000)));
}

#[test]
fn wakes_coalesce_to_the_earliest_opening_until_drained() {
    let mut g = gate();
    g.handle_kv_signal(at(0), &1, Signal::Full);
    g.handle_kv_signal(at(0), &2, Signal::Full);
    g.handle_kv_signal(at(0), &1, Signal::Pressure(100_000));
    g.handle_kv_signal(at(0), &2, Signal::Clear);
    assert_eq!(drain(&mut g), Some(GateAction::Wake { at: at(0) }));
}

#[test]
fn explain_names_the_dominant_reason_and_ties_go_to_the_lower_index() {
    let mut g = gate();
    assert_eq!(g.explain(at(0), &1), None);
    install(&mut g, at(0), 1, RETRY, ms(500));
    install(&mut g, at(0), 1, DISK, ms(500));
    install(&mut g, at(0), 1, KV, ms(500));
    assert_eq!(g.explain(at(0), &1), Some((DISK, at(500))));
    install(&mut g, at(0), 1, KV, ms(501));
    assert_eq!(g.explain(at(0), &1), Some((KV, at(501))));
    assert_eq!(
        g.explain(at(501), &1),
        None,
        "expired reasons are not explained"
    );
}

#[test]
fn reasons_lists_every_pending_reason_with_its_own_deadline_in_index_order() {
    let mut cfg = WriteGateConfig::default();
    let Ok(quota) = cfg.register(ReasonSpec::new("quota", UpdateRule::LatestWins)) else {
        panic!("registration refused");
    };
    let mut g = Gate::new(cfg).expect("a valid config");
    assert_eq!(g.reasons(at(0), &1).count(), 0, "an untracked bucket");
    install(&mut g, at(0), 1, quota, ms(900));
    install(&mut g, at(0), 1, KV, ms(300));
    install(&mut g, at(0), 1, DISK, ms(500));
    install(&mut g, at(0), 2, RETRY, ms(50));
    let listed: Vec<_> = g.reasons(at(0), &1).collect();
    assert_eq!(
        listed,
        [(DISK, at(500)), (KV, at(300)), (quota, at(900))],
        "built-in reasons by index, then the registered one; bucket 2's is not listed"
    );
    assert_eq!(
        listed.iter().map(|&(_, at)| at).max(),
        g.explain(at(0), &1).map(|(_, at)| at),
        "the bucket opens at the latest of them"
    );
    assert_eq!(
        g.reasons(at(300), &1).collect::<Vec<_>>(),
        [(DISK, at(500)), (quota, at(900))],
        "a deadline that has passed is not pending"
    );
    assert_eq!(g.reasons(at(900), &1).count(), 0, "all passed: open");
}

#[test]
fn with_a_wake_slack_poll_timeout_is_the_earliest_opening_plus_it_and_a_pass_opens_only_the_due() {
    let mut g = Gate::new(WriteGateConfig::default().with_wake_slack(ms(50))).unwrap();
    install(&mut g, at(0), 1, DISK, ms(100));
    install(&mut g, at(0), 2, DISK, ms(130));
    install(&mut g, at(0), 3, DISK, ms(160));
    assert_eq!(g.poll_timeout(), Some(at(150)));
    // Queries still answer the exact deadlines: nothing opens early.
    assert!(matches!(g.check(at(129), &2), GateState::Closed { until, .. } if until == at(130)));
    assert_eq!(g.remaining(at(100), &2), ms(30));
    // The pass at 150 evicts the buckets due by 150 (1 and 2), not 3.
    g.handle_timeout(at(150));
    assert_eq!((g.len(), g.gated_len()), (1, 1));
    assert_eq!(g.check(at(150), &1), GateState::Open);
    assert_eq!(g.check(at(150), &2), GateState::Open);
    assert!(matches!(g.check(at(150), &3), GateState::Closed { .. }));
    assert_eq!(g.poll_timeout(), Some(at(210)));
    install(&mut g, at(150), 4, KV, ms(500));
    g.handle_timeout(at(210));
    assert_eq!(g.poll_timeout(), Some(at(700)));
    // A wake (latest-wins KV shortened): it re-arms at the new opening plus the slack.
    install(&mut g, at(210), 4, KV, ms(10));
    assert_eq!(drain(&mut g), Some(GateAction::Wake { at: at(220) }));
    assert_eq!(g.poll_timeout(), Some(at(270)));
    // The slack saturates at the end of time, and its bound is checked.
    let mut far = Gate::new(WriteGateConfig::default().with_wake_slack(ms(50))).unwrap();
    far.handle_throttle(Instant::MAX - ms(1), &1, DISK, ms(10))
        .unwrap();
    assert_eq!(far.poll_timeout(), Some(Instant::MAX));
    let err = Gate::new(WriteGateConfig::default().with_wake_slack(MAX_WAKE_SLACK + ms(1)));
    assert!(
        matches!(
            err,
            Err(ConfigError::OutOfRange {
                got: 60_001,
                max: 60_000,
                ..
            })
        ),
        "{err:?}"
    );
}

#[test]
fn poll_timeout_is_the_earliest_opening_among_known_leader_buckets() {
    let mut g = gate();
    assert_eq!(g.poll_timeout(), None);
    install(&mut g, at(0), 1, DISK, ms(300));
    install(&mut g, at(0), 2, DISK, ms(100));
    install(&mut g, at(0), 3, RETRY, ms(200));
    assert_eq!(g.poll_timeout(), Some(at(100)));
    g.handle_leader(at(0), &2, false);
    assert_eq!(
        g.poll_timeout(),
        Some(at(200)),
        "an unknown leader leaves the wake-ups"
    );
    g.handle_timeout(at(200));
    assert_eq!(g.poll_timeout(), Some(at(300)));
    g.handle_leader(at(50), &2, true);
    assert_eq!(
        g.poll_timeout(),
        Some(at(300)),
        "bucket 2 had expired when it rejoined"
    );
    assert_eq!(g.len(), 1);
}

#[test]
fn unknown_leader_is_reported_first_and_drops_only_kv() {
    let mut g = gate();
    install(&mut g, at(0), 1, DISK, ms(1_000));
    g.handle_kv_signal(at(0), &1, Signal::Full);
    drain(&mut g);
    g.handle_leader(at(0), &1, false);
    assert_eq!(
        g.check(at(0), &1),
        GateState::UnknownLeader,
        "leader-first even while gated"
    );
    assert_eq!(
        g.remaining(at(0), &1),
        ms(1_000),
        "the disk gate survives the leader move"
    );
    assert_eq!(
        drain(&mut g),
        Some(GateAction::Wake { at: at(1_000) }),
        "3000 -> 1000 ms"
    );
    assert_eq!(g.poll_timeout(), None);
    assert_eq!(
        g.handle_kv_signal(at(10), &1, Signal::Full),
        ms(990),
        "old leader's word ignored"
    );
    g.handle_leader(at(20), &1, true);
    assert_eq!(
        g.check(at(20), &1),
        GateState::Closed {
            until: at(1_000),
            reason: DISK
        }
    );
    assert_eq!(
        g.poll_timeout(),
        Some(at(1_000)),
        "rejoined the wake-up computation"
    );
    assert!(g.check_invariants().is_ok());
}

#[test]
fn unknown_leader_of_an_ungated_bucket_is_stored_until_known_again() {
    let mut g = gate();
    g.handle_leader(at(0), &9, true);
    assert!(
        g.is_empty(),
        "a known leader is the default and stores nothing"
    );
    g.handle_leader(at(0), &9, false);
    assert_eq!(g.check(at(0), &9), GateState::UnknownLeader);
    assert!(!g.is_leader_known(&9));
    assert_eq!(g.len(), 1);
    g.handle_timeout(at(1_000_000));
    assert_eq!(
        g.check(at(1_000_000), &9),
        GateState::UnknownLeader,
        "no deadline to expire"
    );
    g.handle_leader(at(1_000_000), &9, true);
    assert!(g.is_empty(), "evicted once known again");
    assert_eq!(g.check(at(1_000_000), &9), GateState::Open);
}

fn probing_gate(disk_probes: u32) -> Gate {
    let mut cfg = WriteGateConfig::default();
    assert!(cfg.set_probe(DISK, Some(disk_probes)).is_ok());
    Gate::new(cfg).expect("a valid config")
}

#[test]
fn probe_mode_allows_n_sends_after_the_backoff_then_closes() {
    let mut g = probing_gate(2);
    install(&mut g, at(0), 1, DISK, ms(100));
    g.handle_send(at(50), &1); // a send while gated is not a probe
    assert_eq!(g.check(at(100), &1), GateState::Open);
    g.handle_send(at(100), &1);
    assert_eq!(
        g.check(at(100), &1),
        GateState::Open,
        "one of two probes used"
    );
    g.handle_send(at(101), &1);
    assert_eq!(g.check(at(101), &1), GateState::Probing { reason: DISK });
    g.handle_timeout(at(10_000));
    assert_eq!(
        g.check(at(10_000), &1),
        GateState::Probing { reason: DISK },
        "no deadline to expire"
    );
    assert_eq!(
        g.poll_timeout(),
        Some(at(100) + DEFAULT_PROBE_TTL),
        "the probe state's lapse is the next change"
    );
    assert_eq!(g.len(), 1);
}

#[test]
fn an_unanswered_probe_state_lapses_ttl_after_the_bucket_opened_and_is_evicted() {
    let mut g = probing_gate(1);
    let n = if cfg!(miri) { 12 } else { 50 };
    for b in 0..n {
        install(&mut g, at(0), b, DISK, ms(5));
    }
    g.handle_send(at(5), &0);
    assert_eq!(g.check(at(5), &0), GateState::Probing { reason: DISK });
    let lapse = at(5) + DEFAULT_PROBE_TTL;
    g.handle_timeout(at(5));
    assert_eq!(g.poll_timeout(), Some(lapse));
    assert_eq!(g.len(), n as usize, "probe states outlive the backoff");
    let just_before = lapse - Duration::from_nanos(1);
    assert_eq!(
        g.check(just_before, &0),
        GateState::Probing { reason: DISK }
    );
    assert_eq!(g.check(lapse, &0), GateState::Open, "lapsed reads open");
    g.handle_timeout(lapse);
    assert!(
        g.is_empty(),
        "every gate and probe state lapsed: no entries"
    );
    assert_eq!(g.poll_timeout(), None);
    assert!(g.check_invariants().is_ok());
}

#[test]
fn success_ends_probe_mode() {
    let mut g = probing_gate(1);
    install(&mut g, at(0), 1, DISK, ms(100));
    g.handle_send(at(100), &1);
    assert_eq!(g.check(at(100), &1), GateState::Probing { reason: DISK });
    g.handle_success(at(120), &1);
    assert_eq!(g.check(at(120), &1), GateState::Open);
    g.handle_send(at(130), &1);
    assert_eq!(
        g.check(at(130), &1),
        GateState::Open,
        "no probe limit after success"
    );
    assert!(g.is_empty());
}

#[test]
fn new_rejection_regates_a_probing_bucket_with_a_fresh_allowance() {
    let mut g = probing_gate(1);
    install(&mut g, at(0), 1, DISK, ms(100));
    g.handle_send(at(100), &1);
    assert_eq!(g.check(at(100), &1), GateState::Probing { reason: DISK });
    install(&mut g, at(150), 1, DISK, ms(100));
    assert_eq!(
        g.check(at(150), &1),
        GateState::Closed {
            until: at(250),
            reason: DISK
        }
    );
    assert_eq!(
        g.check(at(250), &1),
        GateState::Open,
        "fresh allowance after the new backoff"
    );
    g.handle_send(at(250), &1);
    assert_eq!(g.check(at(250), &1), GateState::Probing { reason: DISK });
}

#[test]
fn kv_pressure_does_not_reopen_a_used_disk_probe_allowance() {
    let mut g = probing_gate(1);
    install(&mut g, at(0), 1, DISK, ms(100));
    g.handle_send(at(100), &1);
    assert_eq!(g.check(at(100), &1), GateState::Probing { reason: DISK });
    // Default (landed) curve: 3000 ms · 0.1² = 30 ms. The signal rides on an accepted write:
    // no rejection, no success, so the disk allowance stays used.
    assert_eq!(
        g.handle_kv_signal(at(100), &1, Signal::Pressure(100_000)),
        ms(30)
    );
    assert_eq!(g.check(at(200), &1), GateState::Probing { reason: DISK });
    g.handle_send(at(200), &1);
    assert_eq!(g.check(at(200), &1), GateState::Probing { reason: DISK });
}

#[test]
fn a_retriable_rejection_regates_and_refreshes_the_probe_allowance() {
    let mut g = probing_gate(1);
    install(&mut g, at(0), 1, DISK, ms(100));
    g.handle_send(at(100), &1);
    assert_eq!(g.check(at(100), &1), GateState::Probing { reason: DISK });
    install(&mut g, at(110), 1, RETRY, ms(10));
    assert_eq!(
        g.check(at(120), &1),
        GateState::Open,
        "a rejection re-gates: fresh allowance"
    );
}

#[test]
fn two_custom_reasons_with_different_rules_need_no_read_side_change() {
    let mut cfg = WriteGateConfig::default();
    let quota = cfg.register(ReasonSpec::new("quota", UpdateRule::LatestWins));
    let retry_after = cfg.register(ReasonSpec::new("retry-after", UpdateRule::NeverShorten));
    let (Ok(quota), Ok(retry_after)) = (quota, retry_after) else {
        panic!("registration refused");
    };
    assert_eq!((quota.index(), retry_after.index()), (3, 4));
    let mut g = Gate::new(cfg).expect("a valid config");
    install(&mut g, at(0), 1, quota, ms(500));
    install(&mut g, at(0), 1, quota, ms(100));
    assert_eq!(
        g.check(at(0), &1),
        GateState::Closed {
            until: at(100),
            reason: quota
        }
    );
    install(&mut g, at(0), 2, retry_after, ms(500));
    install(&mut g, at(0), 2, retry_after, ms(100));
    assert_eq!(
        g.check(at(0), &2),
        GateState::Closed {
            until: at(500),
            reason: retry_after
        }
    );
    assert_eq!(g.poll_timeout(), Some(at(100)));
    assert_eq!(g.remaining(at(0), &2), ms(500));
}

#[test]
fn unregistered_reason_is_an_error_and_changes_nothing() {
    let mut g = gate();
    let mut other = WriteGateConfig::default();
    let Ok(foreign) = other.register(ReasonSpec::new("x", UpdateRule::LatestWins)) else {
        panic!("registration refused");
    };
    assert_eq!(
        g.handle_throttle(at(0), &1, foreign, ms(5)),
        Err(GateError::UnknownReason(foreign))
    );
    assert!(g.is_empty());
}

#[test]
fn config_refuses_a_zero_probe_allowance_and_too_many_reasons() {
    let mut cfg = WriteGateConfig::default();
    assert!(matches!(
        cfg.set_probe(DISK, Some(0)),
        Err(crate::ConfigError::OutOfRange { .. })
    ));
    let spec = ReasonSpec::new("p", UpdateRule::NeverShorten).probe(Some(0));
    assert!(cfg.register(spec).is_err());
    for _ in 3..MAX_REASONS {
        assert!(
            cfg.register(ReasonSpec::new("r", UpdateRule::NeverShorten))
                .is_ok()
        );
    }
    assert!(
        cfg.register(ReasonSpec::new("r", UpdateRule::NeverShorten))
            .is_err()
    );
    assert_eq!(cfg.reasons().len(), MAX_REASONS);
    assert!(cfg.validate().is_ok());
}

#[test]
fn close_refuses_installs_and_returns_zero() {
    let mut g = gate();
    let mut rng = SplitMix64::new(3);
    install(&mut g, at(0), 1, DISK, ms(1_000));
    g.handle_leader(at(0), &2, false);
    drain(&mut g);
    g.close();
    assert!(g.is_closed());
    assert_eq!(
        drain(&mut g),
        Some(GateAction::Wake { at: at(0) }),
        "bucket 1 opened"
    );
    assert_eq!(g.check(at(0), &1), GateState::Open, "backoffs cleared");
    assert_eq!(
        g.check(at(0), &2),
        GateState::UnknownLeader,
        "leader knowledge kept"
    );
    let before = rng.clone();
    assert_eq!(
        g.handle_disk_write_locked(at(1), &1, 0, &mut rng),
        Duration::ZERO
    );
    assert_eq!(rng, before, "a refused install draws nothing");
    assert_eq!(g.handle_kv_signal(at(1), &1, Signal::Full), Duration::ZERO);
    assert_eq!(install(&mut g, at(1), 1, RETRY, ms(5)), Duration::ZERO);
    assert_eq!(g.poll_timeout(), None);
    assert_eq!(g.len(), 1);
    assert!(g.check_invariants().is_ok());
}

#[test]
fn handle_timeout_evicts_expired_gates_and_empties_the_maps() {
    let mut g = gate();
    // Enough buckets (even under miri) that the 16-bucket floor is below a quarter.
    let n = if cfg!(miri) { 200 } else { 1_000u32 };
    install_many(
        &mut g,
        at(0),
        (0..n).map(|b| (b, ms(1 + u64::from(b * 7 % 97)))),
        DISK,
    );
    let cap = g.index.capacity();
    g.handle_timeout(at(50));
    assert!(g.len() < n as usize && !g.is_empty());
    assert!(
        g.poll_timeout().is_some_and(|t| t > at(50)),
        "no expired gate survives"
    );
    g.handle_timeout(at(97));
    assert!(g.is_empty());
    assert_eq!((g.slots.len(), g.index.len(), g.gated_len()), (0, 0, 0));
    assert!(
        g.index.capacity() < cap / 4,
        "the map shrank: {} of {cap}",
        g.index.capacity()
    );
    assert_eq!(g.poll_timeout(), None);
}

#[test]
fn an_emptied_gate_keeps_a_floor_capacity_for_the_next_install() {
    let mut g = gate();
    install(&mut g, at(0), 1, RETRY, ms(5));
    g.handle_timeout(at(10));
    assert!(g.is_empty());
    // Freeing everything at zero entries would re-allocate on the next install.
    assert!(g.index.capacity() >= 1 && g.slots.capacity() >= 1);
    assert!(g.heap.capacity() >= 1);
    let n = if cfg!(miri) { 64 } else { 200u32 };
    install_many(&mut g, at(10), (0..n).map(|b| (b, ms(5))), RETRY);
    g.handle_timeout(at(20));
    assert!(g.is_empty());
    assert!(
        g.index.capacity() >= MIN_CAPACITY && g.index.capacity() < 2 * MIN_CAPACITY,
        "shrunk to the floor, not to zero: {}",
        g.index.capacity()
    );
    assert!(g.slots.capacity() >= MIN_CAPACITY && g.slots.capacity() < n as usize);
    assert!(g.heap.capacity() >= MIN_CAPACITY && g.heap.capacity() < n as usize);
}

#[test]
fn a_partly_expired_bucket_stays_until_its_last_gate() {
    let mut g = gate();
    install(&mut g, at(0), 1, DISK, ms(100));
    install(&mut g, at(0), 1, RETRY, ms(300));
    g.handle_timeout(at(200));
    assert_eq!(
        g.check(at(200), &1),
        GateState::Closed {
            until: at(300),
            reason: RETRY
        }
    );
    g.handle_timeout(at(300));
    assert!(g.is_empty());
}

#[test]
fn extreme_values_saturate_without_panicking() {
    let mut g = gate();
    let mut rng = SplitMix64::new(2);
    assert_eq!(
        install(&mut g, at(0), 1, DISK, Duration::from_nanos(u64::MAX)),
        Instant::MAX - at(0)
    );
    assert_eq!(
        install(&mut g, at(0), 2, DISK, Duration::MAX),
        Instant::MAX - at(0)
    );
    assert_eq!(
        g.check(at(0), &2),
        GateState::Closed {
            until: Instant::MAX,
            reason: DISK
        }
    );
    let d = g.handle_disk_write_locked(at(0), &3, u32::MAX, &mut rng);
    assert!(
        d >= ms(8_000) && d <= ms(10_000),
        "attempt u32::MAX is capped: {d:?}"
    );
    g.handle_retriable_write(at(0), &3, u32::MAX, &mut rng);
    // At the end of time nothing can be gated any more, and everything opens.
    assert_eq!(
        install(&mut g, Instant::MAX, 4, DISK, ms(1)),
        Duration::ZERO
    );
    assert_eq!(g.check(Instant::MAX, &2), GateState::Open);
    g.handle_timeout(Instant::MAX);
    assert!(g.is_empty());
    g.handle_send(Instant::MAX, &1);
    g.handle_success(Instant::MAX, &1);
    assert_eq!(g.remaining_ms(Instant::MAX, &1), 0);
}

#[test]
fn time_running_backwards_is_clamped() {
    let mut g = gate();
    install(&mut g, at(1_000), 1, DISK, ms(500));
    // An input from the past acts at the latest time seen: 1000 ms, not 0.
    assert_eq!(install(&mut g, at(0), 2, DISK, ms(500)), ms(500));
    assert_eq!(
        g.check(at(0), &2),
        GateState::Closed {
            until: at(1_500),
            reason: DISK
        }
    );
    g.handle_timeout(at(1_500));
    // A read from the past cannot reopen what time already closed.
    assert_eq!(g.remaining(at(0), &1), Duration::ZERO);
    assert!(g.is_empty());
    assert_eq!(
        g.handle_kv_signal(at(3), &1, Signal::Full),
        g.config().kv_curve().delay(Signal::Full)
    );
    assert_eq!(
        g.poll_timeout(),
        Some(at(1_500) + g.config().kv_curve().delay(Signal::Full))
    );
}

/// A key that counts every hash and equality test, to prove no input scans the buckets.
#[derive(Clone)]
struct CountingKey {
    id: u32,
    ops: Rc<Cell<u64>>,
}

impl PartialEq for CountingKey {
    fn eq(&self, other: &Self) -> bool {
        self.ops.set(self.ops.get() + 1);
        self.id == other.id
    }
}
impl Eq for CountingKey {}
impl Hash for CountingKey {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.ops.set(self.ops.get() + 1);
        self.id.hash(state);
    }
}

#[test]
#[cfg_attr(miri, ignore)]
fn inputs_and_poll_timeout_touch_a_bounded_number_of_keys_among_100k() {
    let ops = Rc::new(Cell::new(0u64));
    let key = |id| CountingKey {
        id,
        ops: ops.clone(),
    };
    let mut g: WriteGate<CountingKey, RandomState> =
        WriteGate::new(WriteGateConfig::default()).expect("the default config is valid");
    let mut rng = SplitMix64::new(8);
    let n = 100_000u32;
    for id in 0..n {
        // Scattered deadlines so the heap is deep and sifts really move items.
        let d = ms(1_000 + (u64::from(id).wrapping_mul(7_919) % 50_000));
        let _ = g.handle_throttle(at(0), &key(id), DISK, d);
    }
    assert_eq!(g.gated_len(), n as usize);
    let mut measure = |what: &str, f: &mut dyn FnMut(&mut WriteGate<CountingKey, RandomState>)| {
        ops.set(0);
        f(&mut g);
        assert!(ops.get() <= 64, "{what} touched {} keys", ops.get());
    };
    measure("poll_timeout", &mut |g| {
        assert_eq!(g.poll_timeout(), Some(at(1_000)));
    });
    measure("disk install", &mut |g| {
        g.handle_disk_write_locked(at(1), &key(77), 4, &mut rng);
    });
    measure("kv install (new bucket)", &mut |g| {
        g.handle_kv_signal(at(1), &key(n + 1), Signal::Full);
    });
    measure("kv shorten to the top", &mut |g| {
        // Default (landed) curve: 3000 ms · 0.1² = 30 ms, earlier than every other bucket.
        g.handle_kv_signal(at(1), &key(n + 1), Signal::Pressure(100_000));
        assert_eq!(g.poll_timeout(), Some(at(31)));
    });
    measure("kv clear (evicts)", &mut |g| {
        g.handle_kv_signal(at(1), &key(n + 1), Signal::Clear);
        assert_eq!(g.len(), n as usize);
    });
    measure("leader unknown", &mut |g| {
        g.handle_leader(at(1), &key(5), false)
    });
    measure("leader known", &mut |g| {
        g.handle_leader(at(1), &key(5), true)
    });
    measure("send, success", &mut |g| {
        g.handle_send(at(1), &key(6));
        g.handle_success(at(1), &key(6));
    });
    measure("check, remaining", &mut |g| {
        let _ = g.check(at(1), &key(9));
        let _ = g.remaining(at(1), &key(9));
    });
    measure("timeout evicting one", &mut |g| g.handle_timeout(at(1_000)));
    assert!(g.check_invariants().is_ok());
}

// ------------------------------------------------------------------ panicking user keys

mod panicking_keys {
    use super::*;
    use crate::test_hasher::TestHasher;
    use crate::test_key::{Call, PanicKey, panics};
    use alloc::format;

    type KeyGate = WriteGate<PanicKey, TestHasher>;

    fn key_gate() -> KeyGate {
        let cfg = WriteGateConfig::default().with_kv_curve(ThrottleCurve::fluss_landed());
        KeyGate::new(cfg).expect("a valid config")
    }

    /// Issue 12: a `Hash` that panicked while the index grew left an orphan slot (in the
    /// slot vector, not in the map), and `len()` never returned to 0. The index now rehashes
    /// by stored hashes, so growing it runs no user code.
    #[test]
    fn a_key_whose_hash_panics_while_the_index_grows_leaves_no_orphan_slot() {
        let mut g = key_gate();
        let mut n = 0;
        while n == 0 || g.index.len() < g.index.capacity() {
            let _ = g.handle_throttle(at(0), &PanicKey(n), RETRY, ms(10));
            n += 1;
        }
        // The next new bucket grows the index; key 0's next `Hash` panics.
        let panicked = panics(0, Call::Hash, 0, || {
            let _ = g.handle_throttle(at(0), &PanicKey(n), RETRY, ms(10));
        });
        assert!(!panicked, "growing the index hashed a stored key");
        assert_eq!(g.check_invariants(), Ok(()));
        assert_eq!(g.len(), n as usize + 1);
        g.handle_timeout(at(10));
        assert_eq!(g.len(), 0, "every bucket evicted once its gate expired");
        assert_eq!(g.check_invariants(), Ok(()));
    }

    type Input = fn(&mut KeyGate, u32);

    /// Every input that takes a key, each at a later `now` than the gate has seen (so a clock
    /// advanced before the key's callbacks ran would show).
    const INPUTS: [(&str, Input); 8] = [
        ("install never-shorten", |g, k| {
            let _ = g.handle_throttle(at(5), &PanicKey(k), RETRY, ms(500));
        }),
        ("install latest-wins", |g, k| {
            let _ = g.handle_throttle(at(5), &PanicKey(k), KV, ms(1));
        }),
        ("clear", |g, k| {
            let _ = g.handle_kv_signal(at(5), &PanicKey(k), Signal::Clear);
        }),
        ("disk", |g, k| {
            let _ = g.handle_disk_write_locked(at(5), &PanicKey(k), 0, &mut SplitMix64::new(1));
        }),
        ("leader unknown", |g, k| {
            g.handle_leader(at(5), &PanicKey(k), false)
        }),
        ("leader known", |g, k| {
            g.handle_leader(at(5), &PanicKey(k), true)
        }),
        ("send", |g, k| g.handle_send(at(5), &PanicKey(k))),
        ("success", |g, k| g.handle_success(at(5), &PanicKey(k))),
    ];

    /// Whichever key callback panics at whichever call, the input did not happen: the gate is
    /// exactly as before (its `Debug` form), consistent, and the same input then works.
    #[test]
    #[cfg_attr(miri, ignore)] // some 200 cases, each formatting the machine twice: slow under miri
    fn a_panicking_key_callback_leaves_the_gate_as_it_was_and_serving() {
        let mut base = key_gate();
        for k in 0..4 {
            let _ = base.handle_throttle(at(0), &PanicKey(k), KV, ms(100 + u64::from(k)));
            let _ = base.handle_throttle(at(0), &PanicKey(k), RETRY, ms(200));
        }
        base.handle_leader(at(0), &PanicKey(2), false);
        let mut fired = 0;
        for (name, input) in INPUTS {
            // An existing bucket, one with an unknown leader, and a new one.
            for k in [1, 2, 9] {
                for call in [Call::Hash, Call::Eq, Call::Clone] {
                    for skip in 0..3 {
                        let mut g = base.clone();
                        let before = std::format!("{g:?}");
                        if panics(k, call, skip, || input(&mut g, k)) {
                            fired += 1;
                            let what = format!("{name} on {k}, {call:?} #{skip}");
                            assert_eq!(format!("{g:?}"), before, "{what}: the gate changed");
                        }
                        assert_eq!(g.check_invariants(), Ok(()), "{name} on {k}");
                        input(&mut g, k);
                        assert_eq!(g.check_invariants(), Ok(()), "{name} on {k}, unarmed");
                        for b in 0..10 {
                            g.handle_leader(at(6), &PanicKey(b), true);
                            g.handle_success(at(6), &PanicKey(b));
                        }
                        g.handle_timeout(Instant::MAX);
                        assert_eq!(g.len(), 0, "{name} on {k}: a bucket was stranded");
                    }
                }
            }
        }
        assert!(fired > 20, "only {fired} armed calls fired");
    }
}

use crate::rng::PanickingRng;

/// The `# Panics` contract of the drawing inputs: a panicking `Rng` reaches the caller and the
/// input did not happen, for a new bucket and for one already gated, and the gate serves on.
#[test]
fn a_panicking_rng_leaves_the_gate_as_it_was() {
    let mut g = gate();
    let mut rng = SplitMix64::new(3);
    g.handle_disk_write_locked(at(0), &1, 0, &mut rng);
    for bucket in [1, 2] {
        let before = std::format!("{g:?}");
        let disk = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
            g.handle_disk_write_locked(at(50), &bucket, 3, &mut PanickingRng)
        }));
        assert!(disk.is_err());
        let retry = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
            g.handle_retriable_write(at(60), &bucket, 3, &mut PanickingRng)
        }));
        assert!(retry.is_err());
        assert_eq!(std::format!("{g:?}"), before, "bucket {bucket}");
        assert_eq!(g.check_invariants(), Ok(()));
    }
    assert!(g.handle_disk_write_locked(at(70), &2, 0, &mut rng) > Duration::ZERO);
    assert!(matches!(g.check(at(70), &2), GateState::Closed { .. }));
}

// ------------------------------------------------------------------ the stored hash and memory

mod stored_hash {
    use super::*;
    use core::hash::BuildHasherDefault;
    use core::mem::size_of;

    /// A hasher whose output has its low 24 bits zero: every key lands on the same map hash,
    /// so only the key comparison (and, for moves, the slot index) tells entries apart.
    #[derive(Default)]
    struct HighBitsOnly(u64);

    impl core::hash::Hasher for HighBitsOnly {
        fn finish(&self) -> u64 {
            self.0 << 24
        }
        fn write(&mut self, bytes: &[u8]) {
            for &b in bytes {
                self.0 = self.0.rotate_left(8) ^ u64::from(b);
            }
        }
    }

    #[test]
    fn the_map_hash_is_rebuilt_exactly_from_the_three_stored_bytes() {
        let mut rng = SplitMix64::new(24);
        for _ in 0..if cfg!(miri) { 100 } else { 10_000 } {
            let h = rng.next_u64();
            let stored = StoredHash::of(h);
            assert_eq!(stored.map_hash(), map_hash(h), "rebuilt from {stored:?}");
            // Only the low 24 bits count: the rest of the hash never reaches the map.
            assert_eq!(map_hash(h ^ (rng.next_u64() << 24)), map_hash(h));
        }
        // The control byte (the map hash's top 7 bits) comes from every stored bit, not only
        // from bits that neighbouring buckets share.
        let tops: std::collections::BTreeSet<u64> =
            (0..24).map(|b| map_hash(1 << b) >> 57).collect();
        assert!(
            tops.len() > 12,
            "control bytes of single-bit hashes: {tops:?}"
        );
    }

    #[test]
    fn keys_whose_hashes_agree_in_the_stored_bits_stay_apart() {
        type Colliding = WriteGate<u64, BuildHasherDefault<HighBitsOnly>>;
        let mut g = Colliding::new(WriteGateConfig::default()).expect("a valid config");
        let n = if cfg!(miri) { 40 } else { 300 };
        // Growing the map several times, every entry with the same map hash.
        for k in 0..n {
            let _ = g.handle_throttle(at(0), &k, RETRY, ms(10 + k % 2 * 10));
        }
        g.handle_leader(at(0), &8, false);
        assert_eq!(g.check_invariants(), Ok(()));
        assert_eq!(g.len(), n as usize);
        for k in 0..n {
            let want = at(10 + k % 2 * 10);
            match g.check(at(0), &k) {
                GateState::UnknownLeader => assert_eq!(k, 8),
                GateState::Closed { until, .. } => assert_eq!(until, want, "bucket {k}"),
                other => panic!("bucket {k}: {other:?}"),
            }
        }
        // Evicting half moves the last slots into the holes: each move must find its own
        // entry among the identical map hashes, by slot index.
        g.handle_timeout(at(10));
        assert_eq!(g.check_invariants(), Ok(()));
        assert_eq!(g.len(), n as usize / 2 + 1, "the odd buckets and bucket 8");
        for k in (1..n).step_by(2) {
            assert_eq!(g.remaining(at(10), &k), ms(10), "bucket {k}");
        }
        g.handle_leader(at(10), &8, true);
        g.handle_timeout(at(20));
        assert!(g.is_empty());
        assert_eq!(g.check_invariants(), Ok(()));
    }

    /// Every byte the gate has allocated, by capacity (what the memory bench counts).
    fn allocated<K, S>(g: &WriteGate<K, S>) -> usize {
        g.index.allocation_size()
            + g.slots.capacity() * size_of::<Slot<K>>()
            + g.hashes.capacity() * size_of::<StoredHash>()
            + g.extra.capacity() * size_of::<Instant>()
            + g.probes.capacity() * size_of::<Probe>()
            + g.heap.allocation_size()
    }

    /// The memory target (`docs/write-gate.md`, `BENCHMARKS.md`: at most 64 bytes per gated
    /// `u64` bucket at a million) at an eighth of the bench's size, where every array sits at
    /// the same fill of its power of two (1 M / 2²⁰ = 125 000 / 2¹⁷), so the bytes per bucket
    /// are the bench's to within the map's 16 trailing control bytes.
    #[test]
    #[cfg_attr(miri, ignore)] // 125 000 installs
    fn a_gated_u64_bucket_costs_at_most_64_bytes_at_the_memory_benchs_fill() {
        assert_eq!(size_of::<Slot<u64>>(), 32, "check's record");
        assert_eq!(size_of::<StoredHash>(), 3);
        let n: u64 = 125_000;
        let mut g: WriteGate<u64, RandomState> =
            WriteGate::new(WriteGateConfig::default()).expect("a valid config");
        for k in 0..n {
            let _ = g.handle_throttle(at(0), &k, KV, ms(1 + k % 1000));
        }
        assert_eq!(g.gated_len(), n as usize);
        let bytes = allocated(&g);
        let per = bytes as f64 / n as f64;
        assert!(
            per <= 64.0,
            "{per:.2} bytes per gated bucket ({bytes} for {n})"
        );
        // Expiry gives it back (down to the floor capacity).
        g.handle_timeout(at(2_000));
        assert!(g.is_empty());
        assert!(allocated(&g) < 2_048, "{} bytes left", allocated(&g));
    }
}

/// `reopens_at` is the instant `check` changes by time alone: the deadline while closed, the
/// probe lapse while probing, nothing while open or leader-unknown.
#[test]
fn reopens_at_is_when_check_changes_by_time_alone() {
    let mut cfg = WriteGateConfig::default();
    cfg.set_probe(DISK, Some(1)).unwrap();
    cfg.set_probe_ttl(DISK, ms(500)).unwrap();
    let mut g = Gate::new(cfg).expect("valid");
    assert_eq!(g.reopens_at(at(0), &1), None, "an unknown bucket is open");
    install(&mut g, at(0), 1, DISK, ms(100));
    assert_eq!(g.reopens_at(at(0), &1), Some(at(100)));
    assert_eq!(g.reopens_at(at(99), &1), Some(at(100)));
    // Open at the deadline with one probe allowed: nothing changes by time while it is unused.
    assert_eq!(g.check(at(100), &1), GateState::Open);
    assert_eq!(g.reopens_at(at(100), &1), None);
    g.handle_send(at(100), &1);
    assert!(matches!(g.check(at(100), &1), GateState::Probing { .. }));
    assert_eq!(g.reopens_at(at(100), &1), Some(at(600)), "the probe lapse");
    assert_eq!(g.check(at(600), &1), GateState::Open);
    assert_eq!(g.reopens_at(at(600), &1), None);
    g.handle_leader(at(600), &2, false);
    assert_eq!(
        g.reopens_at(at(600), &2),
        None,
        "leader unknown: an input changes it"
    );
}

// ------------------------------------------------------------ snapshot-driven clients (issue 14)

mod snapshots {
    use super::*;
    use crate::test_hasher::TestHasher;
    use crate::test_key::{Call, PanicKey, panics};

    type KeyGate = WriteGate<PanicKey, TestHasher>;

    fn probing_key_gate() -> KeyGate {
        let mut cfg = WriteGateConfig::default();
        cfg.set_probe(DISK, Some(1)).expect("valid");
        KeyGate::new(cfg).expect("a valid config")
    }

    /// Bucket 0 gated by a long retry, 1 by a short KV throttle (the earliest deadline), 2
    /// with an unknown leader, 3 probing (its disk backoff passed, allowance used).
    fn populated() -> KeyGate {
        let mut g = probing_key_gate();
        let _ = g.handle_throttle(at(0), &PanicKey(0), RETRY, ms(900));
        let _ = g.handle_throttle(at(0), &PanicKey(1), KV, ms(100));
        g.handle_leader(at(0), &PanicKey(2), false);
        let _ = g.handle_throttle(at(0), &PanicKey(3), DISK, ms(5));
        g.handle_send(at(10), &PanicKey(3));
        assert!(matches!(
            g.check(at(10), &PanicKey(3)),
            GateState::Probing { .. }
        ));
        let _ = g.poll_action();
        assert_eq!(g.len(), 4);
        g
    }

    #[test]
    fn forget_drops_every_kind_of_state_and_emits_no_wake() {
        for k in 0..4 {
            let mut g = populated();
            assert!(g.forget(&PanicKey(k)), "bucket {k} had state");
            assert_eq!(g.check_invariants(), Ok(()));
            assert_eq!(g.len(), 3, "forgetting {k}");
            assert_eq!(g.check(at(10), &PanicKey(k)), GateState::Open);
            assert_eq!(g.remaining(at(10), &PanicKey(k)), Duration::ZERO);
            assert_eq!(g.poll_action(), None, "forgetting {k} woke the sender");
            assert!(!g.forget(&PanicKey(k)), "a second forget finds nothing");
            // Its deadline no longer takes part in the timeout.
            let want = if k == 1 { at(900) } else { at(100) };
            assert_eq!(g.poll_timeout(), Some(want), "forgetting {k}");
            g.handle_timeout(Instant::MAX);
            assert_eq!(g.poll_action(), None);
        }
        assert!(!populated().forget(&PanicKey(9)));
    }

    #[test]
    fn forget_runs_hash_and_eq_only_never_clone() {
        let mut g = populated();
        assert!(!panics(0, Call::Clone, 0, || {
            g.forget(&PanicKey(0));
        }));
        // A panicking `Eq` leaves the gate as it was.
        let mut g = populated();
        let before = std::format!("{g:?}");
        assert!(panics(1, Call::Eq, 0, || {
            g.forget(&PanicKey(1));
        }));
        assert_eq!(std::format!("{g:?}"), before);
        assert!(g.forget(&PanicKey(1)));
        assert_eq!(g.check_invariants(), Ok(()));
    }

    #[test]
    fn retain_keeps_exactly_the_buckets_the_closure_keeps() {
        for mask in 0u32..16 {
            let mut g = populated();
            let mut seen = std::vec::Vec::new();
            g.retain(|k| {
                seen.push(k.0);
                mask & (1 << k.0) != 0
            });
            seen.sort_unstable();
            assert_eq!(seen, [0, 1, 2, 3], "each bucket judged once");
            assert_eq!(g.check_invariants(), Ok(()), "mask {mask:04b}");
            assert_eq!(g.len(), mask.count_ones() as usize, "mask {mask:04b}");
            assert_eq!(g.poll_action(), None);
            for k in 0..4 {
                let kept = mask & (1 << k) != 0;
                let open = g.check(at(10), &PanicKey(k)) == GateState::Open;
                assert_eq!(open, !kept, "mask {mask:04b}, bucket {k}");
            }
            g.handle_timeout(Instant::MAX);
            assert_eq!(g.check_invariants(), Ok(()));
        }
    }

    #[test]
    fn retain_runs_no_key_callback() {
        for k in 0..4 {
            for call in [Call::Hash, Call::Eq, Call::Clone] {
                let mut g = populated();
                let fired = panics(k, call, 0, || g.retain(|b| b.0 % 2 == 0));
                assert!(!fired, "retain ran {call:?} of key {k}");
                assert_eq!(g.len(), 2);
            }
        }
    }

    #[test]
    fn a_panicking_retain_closure_leaves_the_gate_as_it_was() {
        // Unwinding is slow under miri: the first and the last bucket only.
        let panics: &[u32] = if cfg!(miri) { &[0, 3] } else { &[0, 1, 2, 3] };
        for &panic_on in panics {
            let mut g = populated();
            let before = std::format!("{g:?}");
            let out = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
                g.retain(|k| {
                    assert_ne!(k.0, panic_on, "the closure panics");
                    false
                })
            }));
            assert!(out.is_err());
            assert_eq!(std::format!("{g:?}"), before, "panic on {panic_on}");
            assert_eq!(g.check_invariants(), Ok(()));
            // Still serving: the same snapshot without the panic.
            g.retain(|k| k.0 != panic_on);
            assert_eq!(g.len(), 3);
            assert_eq!(g.check(at(10), &PanicKey(panic_on)), GateState::Open);
            assert_eq!(g.check_invariants(), Ok(()));
        }
    }

    #[test]
    fn retain_over_many_buckets_shrinks_and_keeps_the_heap_right() {
        let n = if cfg!(miri) { 100 } else { 1000 };
        let mut g = gate();
        install_many(
            &mut g,
            at(0),
            (0..n).map(|b| (b, ms(10 + u64::from(b)))),
            RETRY,
        );
        g.retain(|&b| b % 10 == 7);
        assert_eq!(g.check_invariants(), Ok(()));
        assert_eq!(g.len(), n as usize / 10);
        assert_eq!(g.poll_timeout(), Some(at(17)));
        g.retain(|_| false);
        assert!(g.is_empty());
        assert_eq!(g.poll_timeout(), None);
        assert_eq!(g.check_invariants(), Ok(()));
    }

    // ------------------------------------------------------------------- KV hard rejection

    fn hard_gate() -> Gate {
        let cfg = WriteGateConfig::default()
            .with_kv_hard_rejection_never_shorten()
            .expect("room for the reason");
        Gate::new(cfg).expect("a valid config")
    }

    #[test]
    fn a_kv_hard_rejection_is_never_shortened_with_the_never_shorten_rule() {
        let mut g = hard_gate();
        let hard = g.config().kv_hard_rejection().expect("registered");
        assert_eq!(g.handle_kv_signal(at(0), &1, Signal::Full), ms(3_000));
        // Later low-pressure and clear responses do not cut it short.
        assert_eq!(
            g.handle_kv_signal(at(100), &1, Signal::Pressure(100_000)),
            ms(2_900)
        );
        assert_eq!(g.handle_kv_signal(at(200), &1, Signal::Clear), ms(2_800));
        assert_eq!(g.poll_action(), None, "nothing opened earlier");
        assert_eq!(
            g.check(at(200), &1),
            GateState::Closed {
                until: at(3_000),
                reason: hard
            }
        );
        // A later hard rejection moves it later; pressure above it is latest-wins as ever.
        assert_eq!(g.handle_kv_signal(at(1_000), &1, Signal::Full), ms(3_000));
        assert_eq!(
            g.handle_kv_signal(at(1_000), &1, Signal::Pressure(999_000)),
            ms(3_000)
        );
        assert_eq!(g.check_invariants(), Ok(()));
        // Dropped with the leader, as KV pressure is.
        g.handle_leader(at(1_100), &1, false);
        g.handle_leader(at(1_100), &1, true);
        assert_eq!(g.remaining(at(1_100), &1), Duration::ZERO);
        assert!(g.is_empty());
    }

    #[test]
    fn without_the_rule_a_later_response_shortens_a_hard_rejection_as_in_fluss_java() {
        for cfg in [WriteGateConfig::default(), WriteGateConfig::fluss_landed()] {
            assert_eq!(cfg.kv_hard_rejection(), None);
            let mut g = Gate::new(cfg).expect("valid");
            assert_eq!(g.handle_kv_signal(at(0), &1, Signal::Full), ms(3_000));
            assert_eq!(
                g.handle_kv_signal(at(100), &1, Signal::Pressure(100_000)),
                ms(30)
            );
            assert_eq!(g.poll_action(), Some(GateAction::Wake { at: at(130) }));
            assert_eq!(
                g.handle_kv_signal(at(110), &1, Signal::Clear),
                Duration::ZERO
            );
        }
    }

    #[test]
    fn the_hard_rejection_reason_is_registered_once_and_refused_when_full() {
        let cfg = WriteGateConfig::default()
            .with_kv_hard_rejection_never_shorten()
            .and_then(WriteGateConfig::with_kv_hard_rejection_never_shorten)
            .expect("idempotent");
        assert_eq!(cfg.reasons().len(), 4);
        let mut full = WriteGateConfig::default();
        while full.reasons().len() < MAX_REASONS {
            full.register(ReasonSpec::new("x", UpdateRule::LatestWins))
                .expect("room");
        }
        let err = full.with_kv_hard_rejection_never_shorten().unwrap_err();
        assert_eq!(err.option(), &crate::options::write_gate::REASONS);
    }

    // ---------------------------------------------------------------------------- KV jitter

    #[test]
    fn kv_jitter_draws_from_the_callers_rng_within_its_range() {
        let cfg = WriteGateConfig::default().with_kv_jitter(200_000);
        let mut g = Gate::new(cfg).expect("valid");
        let mut rng = SplitMix64::new(42);
        let mut seen = std::collections::BTreeSet::new();
        let n = if cfg!(miri) { 40 } else { 200u32 };
        for b in 0..n {
            let mut expected_rng = rng.clone();
            let got = g.handle_kv_signal_jittered(at(0), &b, Signal::Pressure(500_000), &mut rng);
            // 750 ms ± 20 %, one uniform draw in whole nanoseconds from the caller's rng.
            let want = crate::rng::between_inclusive(&mut expected_rng, 600_000_000, 900_000_000);
            assert_eq!(got, Duration::from_nanos(want), "bucket {b}");
            assert_eq!(rng, expected_rng, "exactly one draw");
            seen.insert(got);
        }
        assert!(
            seen.len() as u32 > n * 19 / 20,
            "the draws spread: {} distinct",
            seen.len()
        );
        assert!(seen.iter().any(|d| *d < ms(700)) && seen.iter().any(|d| *d > ms(800)));
        // Fixed seed, fixed outcome.
        let mut g = Gate::new(WriteGateConfig::default().with_kv_jitter(200_000)).expect("valid");
        let first = g.handle_kv_signal_jittered(at(0), &1, Signal::Full, &mut SplitMix64::new(7));
        let mut h = Gate::new(WriteGateConfig::default().with_kv_jitter(200_000)).expect("valid");
        let again = h.handle_kv_signal_jittered(at(0), &1, Signal::Full, &mut SplitMix64::new(7));
        assert_eq!(first, again);
        assert_ne!(first, ms(3_000));
    }

    #[test]
    fn kv_jitter_off_or_a_zero_delay_draws_nothing() {
        let mut g = gate();
        let d =
            g.handle_kv_signal_jittered(at(0), &1, Signal::Pressure(500_000), &mut PanickingRng);
        assert_eq!(d, ms(750));
        let mut g = Gate::new(WriteGateConfig::default().with_kv_jitter(500_000)).expect("valid");
        assert_eq!(
            g.handle_kv_signal_jittered(at(0), &1, Signal::Clear, &mut PanickingRng),
            Duration::ZERO
        );
        // The plain input takes no rng and applies none.
        assert_eq!(
            g.handle_kv_signal(at(0), &1, Signal::Pressure(500_000)),
            ms(750)
        );
    }

    #[test]
    fn kv_jitter_is_validated() {
        let err = Gate::new(WriteGateConfig::default().with_kv_jitter(MAX_KV_JITTER_PPM + 1))
            .unwrap_err();
        assert_eq!(err.option(), &crate::options::write_gate::KV_JITTER);
        assert!(Gate::new(WriteGateConfig::default().with_kv_jitter(MAX_KV_JITTER_PPM)).is_ok());
    }

    // --------------------------------------------------------------------------------- timer

    #[test]
    fn the_timer_follows_poll_timeout_and_ignores_stale_firings() {
        let mut g = gate();
        let mut timer = GateTimer::new();
        assert_eq!(timer.update(g.poll_timeout()), TimerChange::Keep);
        let _ = g.handle_throttle(at(0), &1, RETRY, ms(500));
        assert_eq!(timer.update(g.poll_timeout()), TimerChange::Arm(at(500)));
        let _ = g.handle_throttle(at(0), &2, RETRY, ms(200));
        assert_eq!(timer.update(g.poll_timeout()), TimerChange::Arm(at(200)));
        assert_eq!(timer.update(g.poll_timeout()), TimerChange::Keep);
        g.forget(&2);
        assert_eq!(
            timer.update(g.poll_timeout()),
            TimerChange::Arm(at(500)),
            "later"
        );
        assert!(!timer.fire(at(200)), "the earlier arming is stale");
        assert!(timer.fire(at(500)));
        g.handle_timeout(at(500));
        assert_eq!(
            timer.update(g.poll_timeout()),
            TimerChange::Keep,
            "already disarmed"
        );
        let _ = g.handle_throttle(at(600), &1, RETRY, ms(10));
        assert_eq!(timer.update(g.poll_timeout()), TimerChange::Arm(at(610)));
        g.forget(&1);
        assert_eq!(timer.update(g.poll_timeout()), TimerChange::Disarm);
        assert_eq!(timer.armed(), None);
    }

    // ------------------------------------------------ the landed preset against Fluss Java

    /// The Java client's `RecordAccumulator.updateThrottle` (Fluss PR #3463), restated from
    /// its formula: a per-bucket map of expiry milliseconds, replaced on every response.
    /// `pressure ≥ 1` (the internal hard-rejection value) installs the whole ceiling;
    /// `pressure > 0` installs `(long) (maxThrottleMs · p · p)` in float arithmetic when that is
    /// positive; anything else removes the entry.
    fn java_update_throttle(expiry: &mut Option<u64>, now_ms: u64, max_ms: u64, pressure: f32) {
        if pressure >= 1.0 {
            *expiry = Some(now_ms + max_ms);
            return;
        }
        if pressure > 0.0 {
            // Java: long · float → float, then · float; `(long)` truncates toward zero.
            let delay = (max_ms as f32 * pressure * pressure) as i64;
            if delay > 0 {
                *expiry = Some(now_ms + delay as u64);
                return;
            }
        }
        *expiry = None;
    }

    /// The Java client's `isThrottled`-side reading: milliseconds left before `now`.
    fn java_remaining(expiry: Option<u64>, now_ms: u64) -> u64 {
        expiry.map_or(0, |e| e.saturating_sub(now_ms))
    }

    #[test]
    fn the_landed_preset_matches_the_java_update_throttle_arithmetic() {
        let cfg = WriteGateConfig::fluss_landed();
        let max_ms = 3_000;
        assert_eq!(cfg.kv_curve().max_throttle(), ms(max_ms));
        // The grid: every thousandth of pressure, the wire's edge values, and the hard
        // rejection (1.0f, and above it).
        let mut grid: std::vec::Vec<f32> = (0..=1000).map(|i| i as f32 / 1000.0).collect();
        grid.extend([
            1e-7,
            1e-4,
            0.0182,
            0.0183,
            0.05,
            0.333,
            0.9999,
            0.99999,
            1.0,
            1.5,
            -0.5,
            f32::NAN,
        ]);
        let mut mismatches = std::vec::Vec::new();
        // One response at a time from an unthrottled bucket.
        // Under miri a sample: the arithmetic is the same, and miri checks memory, not sums.
        let (single_step, pair_step) = if cfg!(miri) { (53, 331) } else { (1, 37) };
        for &p in grid.iter().step_by(single_step) {
            let mut g = Gate::new(cfg.clone()).expect("valid");
            let mut java = None;
            let now = 1_000;
            java_update_throttle(&mut java, now, max_ms, p);
            let got = g.handle_kv_signal(at(now), &1, Signal::from_f32(p));
            let want = java_remaining(java, now);
            if got != ms(want) {
                mismatches.push((p, got, want));
            }
        }
        assert_eq!(mismatches, [], "single responses (pressure, gate, Java ms)");
        // Sequences: every pair of grid pressures on one bucket, the second response 1..=7 ms
        // later, compared while the throttle runs down (latest wins, shortening included).
        let coarse: std::vec::Vec<f32> = grid.iter().copied().step_by(pair_step).collect();
        for &p1 in &coarse {
            for &p2 in &coarse {
                for gap in [1, 7, 500] {
                    let mut g = Gate::new(cfg.clone()).expect("valid");
                    let mut java = None;
                    java_update_throttle(&mut java, 0, max_ms, p1);
                    let _ = g.handle_kv_signal(at(0), &1, Signal::from_f32(p1));
                    java_update_throttle(&mut java, gap, max_ms, p2);
                    let _ = g.handle_kv_signal(at(gap), &1, Signal::from_f32(p2));
                    for t in [gap, gap + 1, 1_000, 2_999, 3_000 + gap] {
                        let got = g.remaining(at(t), &1);
                        let want = java_remaining(java, t);
                        assert_eq!(got, ms(want), "p {p1} then {p2} at {gap} ms, read at {t}");
                    }
                }
            }
        }
        // The whole gate, not only the curve: the backoffs are the Fluss clients' presets.
        assert_eq!(
            cfg.disk_write_locked(),
            &BackoffConfig::fluss_disk_write_locked()
        );
        assert_eq!(
            cfg.retriable_write(),
            &BackoffConfig::fluss_retriable_write()
        );
        assert_eq!(cfg.kv_hard_rejection(), None);
        assert_eq!(cfg.kv_jitter_ppm(), 0);
    }
}

#[test]
fn events_are_off_by_default_and_record_installs_and_wakes_once_on() {
    let mut g = gate();
    let mut rng = SplitMix64::new(5);
    g.handle_disk_write_locked(at(0), &1, 0, &mut rng);
    assert_eq!(g.poll_event(), None, "off by default");

    g.set_event_capacity(16);
    // A custom throttle: the reason's own opening and the bucket's are the same.
    install(&mut g, at(10), 2, RETRY, ms(500));
    assert_eq!(
        g.poll_event(),
        Some(GateEvent::Installed {
            bucket: 2,
            reason: RETRY,
            delay: ms(500),
            attempt: None,
            reason_opens_at: Some(at(510)),
            opens_at: at(510),
        })
    );
    // A disk rejection carries its attempt; a KV signal under it has its own, earlier opening.
    let wait = g.handle_disk_write_locked(at(10), &2, 3, &mut rng);
    let Some(GateEvent::Installed {
        reason: DISK,
        attempt: Some(3),
        delay,
        reason_opens_at: Some(own),
        opens_at,
        ..
    }) = g.poll_event()
    else {
        panic!("a disk install event");
    };
    assert_eq!((own, opens_at), (at(10) + delay, at(10) + wait));
    g.handle_kv_signal(at(10), &2, Signal::Pressure(100_000));
    let Some(GateEvent::Installed {
        reason: KV,
        reason_opens_at: Some(kv),
        opens_at: all,
        ..
    }) = g.poll_event()
    else {
        panic!("a kv install event");
    };
    assert!(kv < all && all == at(10) + wait);
    // Clearing the KV reason: no own opening. Lifting the retry throttle wakes.
    g.handle_kv_signal(at(20), &2, Signal::Clear);
    assert!(matches!(
        g.poll_event(),
        Some(GateEvent::Installed {
            reason: KV,
            reason_opens_at: None,
            ..
        })
    ));
    assert_eq!(g.poll_event(), None);
    // KV is latest-wins: a zero delay lifts it, and the bucket wakes.
    let lifted = install(&mut g, at(30), 3, KV, ms(100));
    assert_eq!(lifted, ms(100));
    g.handle_throttle(at(40), &3, KV, Duration::ZERO).ok();
    assert!(matches!(
        g.poll_event(),
        Some(GateEvent::Installed { bucket: 3, .. })
    ));
    assert!(matches!(
        g.poll_event(),
        Some(GateEvent::Installed { bucket: 3, reason_opens_at: None, opens_at, .. }) if opens_at == at(40)
    ));
    assert_eq!(g.poll_event(), Some(GateEvent::Wake { at: at(40) }));
    assert_eq!(g.poll_action(), Some(GateAction::Wake { at: at(40) }));
    assert_eq!(g.poll_event(), None);
    assert_eq!(g.events_dropped(), 0);
}

#[test]
fn a_full_event_queue_keeps_the_newest_and_counts_the_rest() {
    let mut g = gate();
    g.set_event_capacity(2);
    for b in 0..5 {
        install(&mut g, at(0), b, RETRY, ms(10));
    }
    assert_eq!(g.events_dropped(), 3);
    let buckets: Vec<u32> = core::iter::from_fn(|| g.poll_event())
        .map(|e| match e {
            GateEvent::Installed { bucket, .. } => bucket,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(buckets, [3, 4]);
}

#[test]
fn a_panicking_clone_for_an_event_leaves_the_gate_as_it_was() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    #[derive(Debug)]
    struct Bomb(u32, Rc<Cell<bool>>);
    impl core::hash::Hash for Bomb {
        fn hash<H: core::hash::Hasher>(&self, h: &mut H) {
            self.0.hash(h);
        }
    }
    impl PartialEq for Bomb {
        fn eq(&self, o: &Self) -> bool {
            self.0 == o.0
        }
    }
    impl Eq for Bomb {}
    impl Clone for Bomb {
        fn clone(&self) -> Self {
            assert!(!self.1.get(), "clone bomb");
            Bomb(self.0, Rc::clone(&self.1))
        }
    }
    let mut g: WriteGate<Bomb, RandomState> = WriteGate::new(WriteGateConfig::default()).unwrap();
    g.set_event_capacity(8);
    let armed = Rc::new(Cell::new(false));
    let key = Bomb(1, Rc::clone(&armed));
    g.handle_throttle(at(0), &key, RETRY, ms(100)).unwrap();
    assert!(g.poll_event().is_some());
    armed.set(true);
    let r = catch_unwind(AssertUnwindSafe(|| {
        g.handle_throttle(at(1), &key, RETRY, ms(900))
    }));
    assert!(r.is_err());
    assert!(g.check_invariants().is_ok());
    assert_eq!(g.remaining(at(1), &key), ms(99), "the input did not happen");
    assert_eq!(g.poll_event(), None);
}
