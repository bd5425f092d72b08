extern crate std;

use super::*;
use crate::rng::SplitMix64;
use alloc::vec::Vec;
use std::hash::RandomState;

type Table = ConnTable<&'static str, &'static str, RandomState>;

const IDLE: Duration = Duration::from_secs(600);

fn table() -> Table {
    ConnTable::new(ConnConfig::default()).unwrap()
}

fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}

fn key(uid: &'static str, host: &'static str) -> ConnKey<&'static str, &'static str> {
    ConnKey::new(uid, host, 9123)
}

#[track_caller]
fn open(t: &mut Table, now: Instant, k: &ConnKey<&'static str, &'static str>) -> ConnId {
    match t.handle_request(now, k) {
        Route::Open(id, got) => {
            assert_eq!(&got, k, "Open names the routed endpoint");
            id
        }
        other => panic!("expected Open, got {other:?}"),
    }
}

fn drain(t: &mut Table) -> Vec<ConnAction> {
    core::iter::from_fn(|| t.poll_action()).collect()
}

#[test]
fn default_config_is_ten_minutes_idle_and_grpc_backoff() {
    let c = ConnConfig::default();
    assert_eq!(c.max_idle(), IDLE);
    assert_eq!(c.connect_backoff(), &BackoffConfig::grpc_connection());
    assert_eq!(c.validate(), Ok(()));
}

#[test]
fn zero_max_idle_is_refused_with_the_option_name() {
    let err = Table::new(ConnConfig::default().with_max_idle(Duration::ZERO)).unwrap_err();
    assert!(matches!(
        err,
        ConfigError::OutOfRange {
            option: &crate::options::conn::MAX_IDLE,
            got: 0,
            min: 1,
            ..
        }
    ));
    assert!(Table::new(ConnConfig::default().with_max_idle(Duration::from_nanos(1))).is_ok());
}

/// Fluss #4263: a coordinator failover reuses uid `cs-0` at a new address; keying by
/// uid + host + port gives the new address its own connection, and the old one is
/// cleaned up by the idle timeout (10 min).
#[test]
fn uid_moving_to_new_address_gets_own_connection_and_old_closes_when_idle() {
    let mut t = table();
    let old = key("cs-0", "10.0.0.1");
    let new = key("cs-0", "10.0.0.2");
    let a = open(&mut t, ms(0), &old);
    assert!(t.handle_connected(ms(0), a));
    t.handle_send(ms(0), a).unwrap();

    let b = open(&mut t, ms(100), &new);
    assert_ne!(a, b);
    assert!(b.seq() > a.seq());
    assert!(t.handle_connected(ms(100), b));
    assert_eq!(
        t.handle_request(ms(200), &new),
        Route::Use(b),
        "new requests use the new"
    );
    assert_eq!(t.len(), 2, "old and new coexist");

    t.handle_send(ms(200), b).unwrap(); // keep the new one busy
    t.handle_finished(ms(1_000), a).unwrap();
    let idle_at = ms(1_000) + IDLE;
    assert_eq!(t.idle_deadline(a), Some(idle_at));
    assert_eq!(t.poll_timeout(), Some(idle_at));

    t.handle_timeout(idle_at - Duration::from_nanos(1));
    assert!(drain(&mut t).is_empty(), "not a nanosecond early");
    t.handle_timeout(idle_at);
    assert_eq!(drain(&mut t), [ConnAction::Close(a)]);
    assert_eq!(t.connection(&old), None);
    assert_eq!(t.connection(&new), Some(b));
    assert_eq!(t.state(b), Some(ConnState::Connected));
    assert_eq!(t.poll_timeout(), None, "b has a request in flight");
}

#[test]
fn requests_by_old_and_new_metadata_never_evict_each_other() {
    let mut t = table();
    let old = key("cs-0", "10.0.0.1");
    let new = key("cs-0", "10.0.0.2");
    let a = open(&mut t, ms(0), &old);
    let b = open(&mut t, ms(0), &new);
    for i in 1..20 {
        let (k, want) = if i % 2 == 0 { (&old, a) } else { (&new, b) };
        assert_eq!(t.handle_request(ms(i), k), Route::Use(want));
        t.handle_send(ms(i), want).unwrap();
        t.handle_finished(ms(i), want).unwrap();
    }
    t.handle_timeout(ms(20));
    assert!(drain(&mut t).is_empty());
    assert_eq!((t.connection(&old), t.connection(&new)), (Some(a), Some(b)));
}

#[test]
fn late_close_of_replaced_connection_keeps_its_replacement() {
    let mut t = table();
    let k = key("ts-1", "10.0.0.1");
    let a = open(&mut t, ms(0), &k);
    t.handle_connected(ms(0), a);
    assert!(t.handle_closed(ms(1), a));
    let b = open(&mut t, ms(2), &k);
    assert_ne!(a, b, "ids are never reused");
    assert!(!t.handle_closed(ms(3), a), "a late close of `a` is ignored");
    assert_eq!(t.connection(&k), Some(b));
    assert_eq!(t.state(b), Some(ConnState::Connecting));
    assert!(!t.handle_connected(ms(3), a));
    assert_eq!(t.state(b), Some(ConnState::Connecting));
    assert!(t.handle_closed(ms(4), b));
    assert_eq!(t.tracked_endpoints(), 0);
}

#[test]
fn activity_resets_idle_deadline() {
    let mut t = table();
    let k = key("ts-1", "h");
    let a = open(&mut t, ms(0), &k);
    assert_eq!(t.idle_deadline(a), Some(ms(0) + IDLE));
    t.handle_connected(ms(1_000), a);
    assert_eq!(t.idle_deadline(a), Some(ms(1_000) + IDLE));
    assert_eq!(t.handle_request(ms(5_000), &k), Route::Use(a));
    assert_eq!(
        t.idle_deadline(a),
        Some(ms(5_000) + IDLE),
        "routing is activity"
    );
    t.handle_send(ms(6_000), a).unwrap();
    assert_eq!(
        t.idle_deadline(a),
        None,
        "busy connections have no idle deadline"
    );
    t.handle_finished(ms(7_000), a).unwrap();
    assert_eq!(t.poll_timeout(), Some(ms(7_000) + IDLE));
    t.handle_timeout(ms(6_999) + IDLE);
    assert!(drain(&mut t).is_empty());
    t.handle_timeout(ms(7_000) + IDLE);
    assert_eq!(drain(&mut t), [ConnAction::Close(a)]);
    assert_eq!(t.tracked_endpoints(), 0);
}

#[test]
fn in_flight_connection_never_closes_for_idleness() {
    let mut t = table();
    let a = open(&mut t, ms(0), &key("u", "h"));
    t.handle_send(ms(0), a).unwrap();
    t.handle_send(ms(0), a).unwrap();
    t.handle_finished(ms(1), a).unwrap();
    assert_eq!(t.in_flight(a), Some(1));
    assert_eq!(t.poll_timeout(), None);
    t.handle_timeout(Instant::MAX);
    assert!(drain(&mut t).is_empty());
    assert_eq!(t.state(a), Some(ConnState::Connecting));
}

/// gRPC connection backoff: 1 s initial, ×1.6, ±20 % jitter, 120 s cap; it grows only
/// across failed connects and a success resets it.
#[test]
fn connect_backoff_grows_across_failures_and_success_resets_it() {
    let mut t = table();
    let cfg = BackoffConfig::grpc_connection();
    let k = key("ts-2", "h");
    let mut rng = SplitMix64::new(42);
    let mut mirror_rng = rng.clone();
    let mut mirror = Backoff::new();

    let mut now = ms(0);
    let mut bases = [1_000u64, 1_600, 2_560, 4_096].into_iter();
    for attempt in 0..4u32 {
        let id = open(&mut t, now, &k);
        let until = t.handle_connect_failed(now, id, &mut rng).unwrap();
        let want = mirror.next_delay(&cfg, &mut mirror_rng).unwrap();
        assert_eq!(until, now + want, "attempt {attempt}");
        let base = Duration::from_millis(bases.next().unwrap());
        assert!(
            want >= base * 8 / 10 && want < base * 12 / 10,
            "{want:?} vs {base:?}"
        );
        assert_eq!(t.connect_failures(&k), attempt + 1);
        assert_eq!(t.len(), 0);
        let just_before = until - Duration::from_nanos(1);
        assert_eq!(t.handle_request(just_before, &k), Route::Wait { until });
        assert_eq!(t.backoff_until(just_before, &k), Some(until));
        now = until;
    }
    let id = open(&mut t, now, &k);
    assert!(t.handle_connected(now, id));
    assert_eq!(t.connect_failures(&k), 0, "success resets the backoff");
    // A later drop reconnects at once, and a failure starts again from 1 s.
    assert!(t.handle_closed(now, id));
    let id = open(&mut t, now, &k);
    let until = t.handle_connect_failed(now, id, &mut rng).unwrap();
    let d = until - now;
    assert!(d >= Duration::from_millis(800) && d < Duration::from_millis(1_200));
}

#[test]
fn first_reconnect_after_drop_or_server_restart_is_immediate() {
    let mut t = table();
    let k = key("ts-3", "h");
    let a = open(&mut t, ms(0), &k);
    t.handle_connected(ms(0), a);
    // The server restarts: the transport sees the connection drop.
    assert!(t.handle_closed(ms(5), a));
    let b = open(&mut t, ms(5), &k);
    assert!(b != a);
    assert_eq!(t.backoff_until(ms(5), &k), None);
    // Dropped again before connecting (not a connect failure): still no backoff.
    assert!(t.handle_closed(ms(6), b));
    let c = open(&mut t, ms(6), &k);
    assert!(t.handle_connected(ms(7), c));
    // Disconnecting the uid is a drop too.
    assert_eq!(t.disconnect(ms(8), &"ts-3"), 1);
    open(&mut t, ms(8), &k);
}

#[test]
fn backoff_of_endpoint_without_connection_is_forgotten_max_idle_after_gate_opens() {
    let mut t = table();
    let k = key("ts-4", "h");
    let mut rng = SplitMix64::new(7);
    let a = open(&mut t, ms(0), &k);
    let until = t.handle_connect_failed(ms(0), a, &mut rng).unwrap();
    assert_eq!(t.tracked_endpoints(), 1);
    assert_eq!(t.poll_timeout(), Some(until + IDLE));
    t.handle_timeout(until + IDLE - Duration::from_nanos(1));
    assert_eq!(t.connect_failures(&k), 1);
    t.handle_timeout(until + IDLE);
    assert!(
        drain(&mut t).is_empty(),
        "forgetting a backoff closes nothing"
    );
    assert_eq!(t.tracked_endpoints(), 0);
    assert_eq!(t.poll_timeout(), None);
    assert_eq!(t.connect_failures(&k), 0);
}

#[test]
fn connection_lost_while_in_backoff_keeps_backoff_for_max_idle_from_loss() {
    let mut t = table();
    let k = key("ts-4", "h");
    let mut rng = SplitMix64::new(7);
    let a = open(&mut t, ms(0), &k);
    let until = t.handle_connect_failed(ms(0), a, &mut rng).unwrap();
    let b = open(&mut t, until, &k);
    let lost = until + Duration::from_secs(3);
    assert!(t.handle_closed(lost, b));
    assert_eq!(
        t.connect_failures(&k),
        1,
        "a drop neither grows nor resets it"
    );
    assert_eq!(t.poll_timeout(), Some(lost + IDLE));
    assert!(
        matches!(t.handle_request(lost, &k), Route::Open(..)),
        "gate is open"
    );
}

#[test]
fn disconnect_closes_every_endpoint_of_a_uid_and_nothing_else() {
    let mut t = table();
    let a = open(&mut t, ms(0), &key("cs-0", "A"));
    let b = open(&mut t, ms(0), &key("cs-0", "B"));
    let c = open(&mut t, ms(0), &key("cs-1", "A"));
    t.handle_send(ms(0), b).unwrap();
    assert_eq!(t.disconnect(ms(1), &"cs-0"), 2);
    let mut closed = drain(&mut t);
    closed.sort_by_key(|ConnAction::Close(id)| *id);
    assert_eq!(closed, [ConnAction::Close(a), ConnAction::Close(b)]);
    assert_eq!(t.state(c), Some(ConnState::Connecting));
    assert_eq!(t.len(), 1);
    assert!(
        !t.handle_closed(ms(2), a),
        "the transport's echo is ignored"
    );
    assert_eq!(t.handle_send(ms(2), b), Err(Disconnected { conn: b }));
    assert_eq!(t.disconnect(ms(3), &"cs-0"), 0);
    assert_eq!(t.disconnect(ms(3), &"nobody"), 0);
    assert!(drain(&mut t).is_empty());
}

#[test]
fn send_on_closed_connection_is_retriable_disconnected() {
    let mut t = table();
    let k = key("u", "h");
    let a = open(&mut t, ms(0), &k);
    t.handle_send(ms(0), a).unwrap();
    t.handle_closed(ms(1), a);
    let err = t.handle_send(ms(2), a).unwrap_err();
    assert_eq!(err.conn, a);
    assert_eq!(
        t.handle_finished(ms(2), a),
        Err(FinishError::Disconnected(a))
    );
    // Routing again gives a fresh connection the request can use.
    let b = open(&mut t, ms(2), &k);
    assert_eq!(t.handle_send(ms(2), b), Ok(()));
}

#[test]
fn finish_without_send_is_refused_and_changes_nothing() {
    let mut t = table();
    let a = open(&mut t, ms(0), &key("u", "h"));
    assert_eq!(
        t.handle_finished(ms(9), a),
        Err(FinishError::NotInFlight(a))
    );
    assert_eq!(
        t.idle_deadline(a),
        Some(ms(0) + IDLE),
        "not counted as activity"
    );
    t.handle_send(ms(1), a).unwrap();
    t.handle_finished(ms(2), a).unwrap();
    assert_eq!(
        t.handle_finished(ms(3), a),
        Err(FinishError::NotInFlight(a))
    );
    assert_eq!(t.in_flight(a), Some(0));
}

#[test]
fn connect_failure_is_ignored_unless_connecting() {
    let mut t = table();
    let mut rng = SplitMix64::new(1);
    let k = key("u", "h");
    let a = open(&mut t, ms(0), &k);
    t.handle_connected(ms(0), a);
    let before = rng.clone();
    assert_eq!(t.handle_connect_failed(ms(1), a, &mut rng), None);
    assert_eq!(rng, before, "nothing drawn");
    assert_eq!(t.state(a), Some(ConnState::Connected));
    assert_eq!(t.connect_failures(&k), 0);
    assert!(!t.handle_connected(ms(2), a), "already connected");
}

#[test]
fn bogus_and_stale_ids_are_ignored_everywhere() {
    let mut t = table();
    let mut rng = SplitMix64::new(3);
    let live = open(&mut t, ms(0), &key("u", "h"));
    let stale = open(&mut t, ms(0), &key("u", "g"));
    t.handle_closed(ms(0), stale);
    let bogus = [
        stale,
        ConnId::from_bits(0),
        ConnId::from_bits(u128::MAX),
        ConnId::from_bits(live.to_bits() + (1 << 32)), // right slot, wrong seq
        ConnId::from_bits(u128::from(u32::MAX)),
    ];
    for id in bogus {
        assert_ne!(id, live);
        assert!(!t.handle_closed(ms(1), id));
        assert!(!t.handle_connected(ms(1), id));
        assert_eq!(t.handle_connect_failed(ms(1), id, &mut rng), None);
        assert_eq!(t.handle_send(ms(1), id), Err(Disconnected { conn: id }));
        assert_eq!(
            t.handle_finished(ms(1), id),
            Err(FinishError::Disconnected(id))
        );
        assert_eq!(
            (t.state(id), t.in_flight(id), t.key(id)),
            (None, None, None)
        );
    }
    assert_eq!(t.len(), 1);
    assert_eq!(t.state(live), Some(ConnState::Connecting));
    assert_eq!(t.idle_deadline(live), Some(ms(0) + IDLE));
    assert_eq!(ConnId::from_bits(live.to_bits()), live);
}

#[test]
fn time_running_backwards_is_clamped() {
    let mut t = table();
    let k = key("u", "h");
    let a = open(&mut t, ms(10_000), &k);
    t.handle_send(ms(10_000), a).unwrap();
    t.handle_finished(ms(1), a).unwrap();
    assert_eq!(
        t.idle_deadline(a),
        Some(ms(10_000) + IDLE),
        "clamped to 10 s"
    );
    t.handle_timeout(ms(0) + IDLE + Duration::from_secs(5));
    assert!(
        drain(&mut t).is_empty(),
        "a stale `now` closes nothing early"
    );
    let mut rng = SplitMix64::new(5);
    let until = t.handle_closed(ms(1), a).then(|| {
        let b = open(&mut t, ms(2), &k);
        t.handle_connect_failed(ms(3), b, &mut rng).unwrap()
    });
    assert!(until.unwrap() >= ms(10_000) + Duration::from_millis(800));
}

#[test]
#[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
fn extreme_instants_and_durations_saturate() {
    let mut t = table();
    let k = key("u", "h");
    let a = open(&mut t, Instant::MAX, &k);
    assert_eq!(t.idle_deadline(a), Some(Instant::MAX));
    let mut rng = SplitMix64::new(9);
    assert_eq!(
        t.handle_connect_failed(Instant::MAX, a, &mut rng),
        Some(Instant::MAX)
    );
    // The gate opens "at" MAX, and MAX is reached: routing opens again.
    let b = open(&mut t, ms(0), &k);
    t.handle_timeout(ms(0));
    assert_eq!(drain(&mut t), [ConnAction::Close(b)], "clock is at MAX");
    assert_eq!(
        t.tracked_endpoints(),
        0,
        "and its backoff is forgotten at once"
    );
    assert_eq!(t.poll_timeout(), None);

    let mut forever = Table::new(ConnConfig::default().with_max_idle(Duration::MAX)).unwrap();
    let c = open(&mut forever, ms(1), &k);
    assert_eq!(forever.poll_timeout(), Some(Instant::MAX));
    forever.handle_timeout(Instant::MAX - Duration::from_nanos(1));
    assert_eq!(forever.state(c), Some(ConnState::Connecting));
    let mut rng = SplitMix64::new(9);
    let other = key("u", "other");
    for _ in 0..1_000 {
        let id = open(&mut forever, Instant::MAX - Duration::from_secs(1), &other);
        forever.handle_connect_failed(Instant::MAX, id, &mut rng);
        forever.handle_timeout(Instant::MAX);
    }
    // Even a `Duration::MAX` idle deadline is reached at the end of time.
    assert!(drain(&mut forever).contains(&ConnAction::Close(c)));
    assert_eq!(forever.tracked_endpoints(), 0);
    assert_eq!(forever.connect_failures(&other), 0);
}

#[test]
fn id_exhaustion_is_an_outcome_and_never_reuses_an_id() {
    let mut t = table();
    t.set_next_seq(u64::MAX - 1);
    let k = key("u", "h");
    let last = open(&mut t, ms(0), &k);
    assert_eq!(last.seq(), u64::MAX - 1);
    assert_eq!(
        t.handle_request(ms(0), &key("u", "other")),
        Route::Exhausted
    );
    assert_eq!(
        t.handle_request(ms(0), &k),
        Route::Use(last),
        "live connections still work"
    );
    t.handle_closed(ms(0), last);
    assert_eq!(t.handle_request(ms(0), &k), Route::Exhausted);
    assert_eq!((t.len(), t.tracked_endpoints()), (0, 0));
    assert_eq!(t.poll_timeout(), None);
}

#[test]
fn poll_timeout_is_the_earliest_deadline_of_any_kind() {
    let mut t = table();
    let mut rng = SplitMix64::new(11);
    let a = open(&mut t, ms(5_000), &key("a", "h"));
    let b = open(&mut t, ms(1_000), &key("b", "h"));
    assert_eq!(t.poll_timeout(), Some(ms(5_000) + IDLE));
    t.handle_send(ms(5_000), a).unwrap();
    assert_eq!(
        t.poll_timeout(),
        Some(ms(5_000) + IDLE),
        "b's at 5 s, clock clamped"
    );
    let until = t.handle_connect_failed(ms(6_000), b, &mut rng).unwrap();
    assert_eq!(t.poll_timeout(), Some(until + IDLE));
    t.handle_finished(ms(6_000), a).unwrap();
    assert_eq!(t.poll_timeout(), Some(ms(6_000) + IDLE));
}

#[test]
#[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
fn table_gives_memory_back_after_a_burst() {
    let mut t: ConnTable<u32, u32, RandomState> = ConnTable::new(ConnConfig::default()).unwrap();
    let mut ids = Vec::new();
    for i in 0..1_000 {
        match t.handle_request(ms(0), &ConnKey::new(i, i, 1)) {
            Route::Open(id, _) => ids.push(id),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(t.slot_count(), 1_000);
    for id in &ids[3..] {
        assert!(t.handle_closed(ms(1), *id));
    }
    t.handle_timeout(ms(1));
    assert_eq!(t.slot_count(), 3, "trailing free slots are released");
    assert!(t.by_key.capacity() < 64);
    // Free slots are reused lowest first and ids stay fresh.
    let again = match t.handle_request(ms(2), &ConnKey::new(5000, 0, 1)) {
        Route::Open(id, _) => id,
        other => panic!("{other:?}"),
    };
    assert_eq!(again.slot, 3);
    assert!(ids.iter().all(|old| *old != again));
}

/// Opens `n` endpoints, closes all but the one in the highest slot, runs maintenance.
fn sparse_table(n: u32) -> (ConnTable<u32, u32, RandomState>, ConnId) {
    let mut t: ConnTable<u32, u32, RandomState> = ConnTable::new(ConnConfig::default()).unwrap();
    let mut ids = Vec::new();
    for i in 0..n {
        match t.handle_request(ms(0), &ConnKey::new(i, 0, 1)) {
            Route::Open(id, _) => ids.push(id),
            other => panic!("{other:?}"),
        }
    }
    let (&last, rest) = ids.split_last().unwrap();
    for id in rest {
        assert!(t.handle_closed(ms(0), *id));
    }
    t.handle_timeout(ms(0));
    (t, last)
}

/// `docs/design.md` §2.6, no scans on a hot path: a live connection in a high slot keeps the slots
/// below it (its id names its slot), and maintenance must not revisit them every call.
#[test]
#[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
fn handle_timeout_with_nothing_due_does_no_work_on_a_sparse_table() {
    let (mut t, last) = sparse_table(2_000);
    assert_eq!(t.slot_count(), 2_000, "the live top slot pins the others");
    assert_eq!(t.free.len(), 1_999);
    let steps = t.maintenance_steps;
    for k in 1..=200 {
        t.handle_timeout(ms(k));
    }
    assert_eq!(t.maintenance_steps, steps, "200 idle calls visited slots");
    assert_eq!(t.free.len(), 1_999);
    // Once the top connection closes, the trim and the purge run once, for about
    // two steps per trimmed slot, and then the table is empty.
    assert!(t.handle_closed(ms(300), last));
    t.handle_timeout(ms(300));
    assert_eq!((t.slot_count(), t.free.len()), (0, 0));
    assert!(t.maintenance_steps - steps <= 2 * 2_000);
    assert!(t.free.capacity() <= 2 * SHRINK_FLOOR);
    let after = t.maintenance_steps;
    t.handle_timeout(ms(301));
    assert_eq!(t.maintenance_steps, after);
}

/// Trimmed slots stay in the free heap until a purge; they must never be handed out
/// while the table regrows, or two endpoints would share a slot.
#[test]
#[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
fn trimmed_slots_left_in_the_free_list_are_never_handed_out_twice() {
    let mut t: ConnTable<u32, u32, RandomState> = ConnTable::new(ConnConfig::default()).unwrap();
    let mut ids = Vec::new();
    for i in 0..100 {
        match t.handle_request(ms(0), &ConnKey::new(i, 0, 1)) {
            Route::Open(id, _) => ids.push(id),
            other => panic!("{other:?}"),
        }
    }
    // Keep slots 0..5 and 60: 6 used of 100, so the table trims 61..100.
    for (i, id) in ids.iter().enumerate() {
        if !(i < 5 || i == 60) {
            assert!(t.handle_closed(ms(0), *id));
        }
    }
    t.handle_timeout(ms(0));
    assert_eq!(t.slot_count(), 61);
    assert_eq!(
        t.free.len(),
        55 + 39,
        "39 stale entries are kept, not purged"
    );
    let mut slots: Vec<u32> = [0, 1, 2, 3, 4, 60].into();
    for i in 1_000..1_100 {
        let key = ConnKey::new(i, 1, 1);
        let Route::Open(id, _) = t.handle_request(ms(1), &key) else {
            panic!("fresh endpoint opens")
        };
        slots.push(id.slot);
        assert_eq!(t.key(id), Some(&key));
    }
    let mut unique = slots.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), slots.len(), "a slot was handed out twice");
    assert_eq!(
        unique.last(),
        Some(&105),
        "the table filled its holes first"
    );
    for (i, id) in ids.iter().enumerate() {
        let live = i < 5 || i == 60;
        assert_eq!(t.key(*id).is_some(), live, "old connection {i}");
    }
}

/// `docs/design.md` §2.6: an endpoint opened, idled out and reopened must not make the table
/// give its storage back and allocate it again each cycle.
#[test]
fn emptied_table_keeps_a_floor_capacity() {
    let mut t: ConnTable<u32, u32, RandomState> =
        ConnTable::new(ConnConfig::default().with_max_idle(Duration::from_millis(1))).unwrap();
    let key = ConnKey::new(1, 1, 1);
    for k in 0..10 {
        assert!(matches!(t.handle_request(ms(2 * k), &key), Route::Open(..)));
        t.handle_timeout(ms(2 * k + 2));
        assert!(matches!(t.poll_action(), Some(ConnAction::Close(_))));
        assert_eq!(t.tracked_endpoints(), 0);
        assert!(t.timers.capacity() > 0, "timer heap freed");
        assert!(
            t.by_key.capacity() > 0 && t.by_uid.capacity() > 0,
            "maps freed"
        );
        assert!(
            t.slots.capacity() > 0 && t.free.capacity() > 0,
            "slots freed"
        );
    }
}

#[test]
fn another_tables_connection_id_is_unknown_and_closes_nothing() {
    let mut one = table();
    let mut two = table();
    assert_ne!(one.instance_tag(), two.instance_tag());
    let k = key("u", "h");
    let mine = open(&mut one, ms(0), &k);
    let theirs = open(&mut two, ms(0), &k);
    assert_eq!(
        (theirs.seq(), theirs.to_bits() as u32),
        (mine.seq(), mine.to_bits() as u32)
    );
    // Before the instance tag, this closed the first table's live connection.
    assert!(!one.handle_closed(ms(1), theirs));
    assert!(one.handle_send(ms(1), theirs).is_err());
    assert_eq!(one.state(theirs), None);
    assert!(
        one.state(mine).is_some(),
        "the live connection is untouched"
    );
    assert_eq!(one.handle_request(ms(2), &k), Route::Use(mine));
}

use crate::test_key::{Touchy, arm_budget};

fn uid(id: u32, touchy: bool) -> Touchy {
    Touchy {
        id,
        touchy,
        eq_touchy: touchy,
    }
}

type TouchyTable = ConnTable<Touchy, u32, RandomState>;

fn open_any<S: BuildHasher + Clone>(
    t: &mut ConnTable<Touchy, u32, S>,
    now: Instant,
    k: &ConnKey<Touchy, u32>,
) -> ConnId {
    match t.handle_request(now, k) {
        Route::Open(id, _) => id,
        other => panic!("expected Open, got {other:?}"),
    }
}

fn drain_any<S: BuildHasher + Clone>(t: &mut ConnTable<Touchy, u32, S>) {
    while t.poll_action().is_some() {}
}

/// Everything a panic could leave half-changed.
fn books(t: &TouchyTable) -> [usize; 6] {
    [
        t.len(),
        t.tracked_endpoints(),
        t.slot_count(),
        t.free.len(),
        t.by_uid.len(),
        t.timers.len(),
    ]
}

#[test]
fn a_key_code_panic_while_routing_leaves_the_table_unchanged_and_it_routes_again() {
    let plain = |id, port| ConnKey::new(uid(id, false), 1, port);
    let touchy = |id, port| ConnKey::new(uid(id, true), 1, port);
    // Budgets from "the first call panics" to "none does", for a new endpoint of a known uid,
    // a new uid, and an endpoint whose backoff ended (reopened under its old slot).
    for budget in 0..12 {
        for case in 0..3 {
            let mut t: TouchyTable = ConnTable::new(ConnConfig::default()).unwrap();
            let neighbour = open_any(&mut t, ms(0), &plain(1, 1));
            t.handle_connected(ms(0), neighbour);
            let key = match case {
                0 => touchy(1, 2),
                1 => touchy(2, 2),
                _ => {
                    let id = open_any(&mut t, ms(0), &plain(3, 3));
                    t.handle_connect_failed(ms(0), id, &mut SplitMix64::new(1));
                    touchy(3, 3)
                }
            };
            let now = ms(60_000); // past any first connect backoff
            let before = books(&t);
            arm_budget(Some(budget));
            let routed = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
                t.handle_request(now, &key)
            }));
            arm_budget(None);
            let id = match routed {
                Err(_) => {
                    assert_eq!(books(&t), before, "budget {budget}, case {case}");
                    match t.handle_request(now, &key) {
                        Route::Open(id, _) => id,
                        other => panic!("budget {budget}, case {case}: {other:?}"),
                    }
                }
                Ok(Route::Open(id, got)) => {
                    assert_eq!(got, key);
                    id
                }
                Ok(other) => panic!("budget {budget}, case {case}: {other:?}"),
            };
            assert_eq!(t.connection(&key), Some(id), "budget {budget}, case {case}");
            assert_eq!(t.handle_request(now, &key), Route::Use(id));
            // The books balance: disconnecting every uid and evicting leaves nothing.
            for n in 1..4 {
                t.disconnect(now, &uid(n, false));
            }
            drain_any(&mut t);
            t.handle_timeout(now + IDLE + Duration::from_secs(3_600));
            assert_eq!(books(&t)[..2], [0, 0], "budget {budget}, case {case}");
            assert_eq!(t.by_uid.len(), 0, "budget {budget}, case {case}");
        }
    }
}

#[test]
fn growing_shrinking_and_evicting_never_run_a_stored_key_s_code() {
    // A fixed hasher, so the test is the same on every run.
    let mut t: ConnTable<Touchy, u32, crate::test_hasher::TestHasher> =
        ConnTable::new(ConnConfig::default()).unwrap();
    // Its `Hash` and `Clone` panic; its `Eq` does not, as a lookup of another key may compare
    // it when their hash bits collide.
    let stored = Touchy {
        id: 0,
        touchy: true,
        eq_touchy: false,
    };
    let id = open_any(&mut t, ms(0), &ConnKey::new(stored, 1, 1));
    t.handle_connected(ms(0), id);
    arm_budget(Some(0));
    let kept = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
        // Under miri fewer keys: still past several growths and the shrink floor.
        for n in 1..if cfg!(miri) { 150 } else { 500 } {
            let _ = t.handle_request(ms(1), &ConnKey::new(uid(n, false), 1, 1));
        }
        // Disconnects, idle closes, evictions and shrinking, down to the stored key alone.
        t.disconnect(ms(2), &uid(7, false));
        let _ = t.handle_request(ms(2) + IDLE, &ConnKey::new(uid(0, false), 1, 1));
        t.handle_timeout(ms(2) + IDLE);
        drain_any(&mut t);
    }));
    arm_budget(None);
    assert!(kept.is_ok(), "a stored key's Hash or Clone ran");
    assert_eq!((t.len(), t.tracked_endpoints()), (1, 1));
    assert_eq!(t.connection(&ConnKey::new(uid(0, false), 1, 1)), Some(id));
}

// ------------------------------------------------------------------ panicking user keys

mod panicking_keys {
    use super::*;
    use crate::test_hasher::TestHasher;
    use crate::test_key::{Call, PanicKey, panics};
    use alloc::format;

    type KeyTable = ConnTable<PanicKey, PanicKey, TestHasher>;

    fn key(uid: u32, host: u32) -> ConnKey<PanicKey, PanicKey> {
        ConnKey::new(PanicKey(uid), PanicKey(host), 9123)
    }

    fn key_table() -> KeyTable {
        ConnTable::new(ConnConfig::default()).unwrap()
    }

    /// Forgetting an endpoint hashed its key again (to remove it from the maps) after its
    /// slot was already emptied: a panicking `Hash` there left the maps naming an empty slot.
    /// Entries now keep their hashes, so closing runs no user code.
    #[test]
    fn closing_a_connection_runs_no_key_hash() {
        let mut t = key_table();
        let Route::Open(id, _) = t.handle_request(ms(0), &key(1, 1)) else {
            panic!("a fresh endpoint opens");
        };
        let panicked = panics(1, Call::Hash, 0, || {
            assert!(t.handle_closed(ms(1), id));
        });
        assert!(!panicked, "forgetting the endpoint hashed its key");
        assert_eq!((t.len(), t.tracked_endpoints()), (0, 0));
        assert!(matches!(
            t.handle_request(ms(2), &key(1, 1)),
            Route::Open(..)
        ));
        assert_eq!(t.check_invariants(), Ok(()));
    }

    /// A new endpoint's key was cloned three times and its uid once, between the changes
    /// that store it: a panicking clone left a filled slot the maps did not name. Every copy
    /// is now made first.
    #[test]
    fn a_clone_panicking_while_an_endpoint_opens_leaves_the_table_unchanged() {
        let mut t = key_table();
        let before = format!("{t:?}");
        // Two copies: the entry's and the one `Open` returns.
        for skip in 0..2 {
            assert!(panics(1, Call::Clone, skip, || {
                let _ = t.handle_request(ms(1), &key(1, 2));
            }));
            assert_eq!(format!("{t:?}"), before, "clone #{skip}: the table changed");
        }
        assert!(matches!(
            t.handle_request(ms(1), &key(1, 2)),
            Route::Open(..)
        ));
        assert_eq!(t.check_invariants(), Ok(()));
    }

    type Input = fn(&mut KeyTable, u32, ConnId);

    const INPUTS: [(&str, Input); 7] = [
        ("request", |t, k, _| {
            let _ = t.handle_request(ms(5), &key(k, k));
        }),
        ("request at another host", |t, k, _| {
            let _ = t.handle_request(ms(5), &key(k, 7));
        }),
        ("disconnect", |t, k, _| {
            let _ = t.disconnect(ms(5), &PanicKey(k));
        }),
        ("closed", |t, _, id| {
            let _ = t.handle_closed(ms(5), id);
        }),
        ("connect failed", |t, _, id| {
            let _ = t.handle_connect_failed(ms(5), id, &mut SplitMix64::new(3));
        }),
        ("finished", |t, _, id| {
            let _ = t.handle_finished(ms(5), id);
        }),
        ("timeout", |t, _, _| t.handle_timeout(Instant::MAX)),
    ];

    /// Whichever key callback panics at whichever call, the input did not happen: the table
    /// is exactly as before (its `Debug` form), consistent, and the same input then works.
    #[test]
    #[cfg_attr(miri, ignore)] // some 200 cases, each formatting the machine twice: slow under miri
    fn a_panicking_key_callback_leaves_the_table_as_it_was_and_serving() {
        let mut base = key_table();
        let mut ids = Vec::new();
        for k in 0..3 {
            if let Route::Open(id, _) = base.handle_request(ms(0), &key(k, k)) {
                ids.push(id);
            }
        }
        // Endpoint 1 failed to connect (in backoff); endpoint 2 has a request in flight.
        let failed = ids.get(1).copied().expect("opened");
        let busy = ids.get(2).copied().expect("opened");
        let _ = base.handle_connect_failed(ms(0), failed, &mut SplitMix64::new(1));
        assert!(base.handle_connected(ms(0), busy));
        assert!(base.handle_send(ms(0), busy).is_ok());
        let mut fired = 0;
        for (name, input) in INPUTS {
            for (k, &id) in [0, 1, 2, 9].iter().zip(ids.iter().cycle()) {
                for call in [Call::Hash, Call::Eq, Call::Clone] {
                    for skip in 0..3 {
                        let mut t = base.clone();
                        let before = format!("{t:?}");
                        if panics(*k, call, skip, || input(&mut t, *k, id)) {
                            fired += 1;
                            let what = format!("{name} on {k}, {call:?} #{skip}");
                            assert_eq!(format!("{t:?}"), before, "{what}: the table changed");
                        }
                        assert_eq!(t.check_invariants(), Ok(()), "{name} on {k}");
                        input(&mut t, *k, id);
                        assert_eq!(t.check_invariants(), Ok(()), "{name} on {k}, unarmed");
                        for u in 0..10 {
                            let _ = t.disconnect(ms(6), &PanicKey(u));
                        }
                        t.handle_timeout(Instant::MAX);
                        assert_eq!(t.tracked_endpoints(), 0, "{name} on {k}: stranded");
                        assert_eq!(t.check_invariants(), Ok(()));
                    }
                }
            }
        }
        assert!(fired > 20, "only {fired} armed calls fired");
    }
}

use crate::rng::PanickingRng;

/// The `# Panics` contract of `handle_connect_failed`: a panicking `Rng` changes nothing but
/// the clock, so the connect is still `Connecting` and its failure can be reported again.
#[test]
fn a_panicking_rng_leaves_the_connect_connecting() {
    let mut t = table();
    let k = key("cs-0", "10.0.0.1");
    let Route::Open(id, _) = t.handle_request(ms(0), &k) else {
        panic!("a new endpoint opens")
    };
    let before = (
        t.state(id),
        t.connect_failures(&k),
        t.poll_timeout(),
        t.len(),
    );
    let failed = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
        t.handle_connect_failed(ms(5), id, &mut PanickingRng)
    }));
    assert!(failed.is_err());
    assert_eq!(
        (
            t.state(id),
            t.connect_failures(&k),
            t.poll_timeout(),
            t.len()
        ),
        before
    );
    assert_eq!(t.state(id), Some(ConnState::Connecting));
    assert_eq!(t.check_invariants(), Ok(()));
    let until = t.handle_connect_failed(ms(5), id, &mut SplitMix64::new(1));
    assert!(until.is_some_and(|u| u > ms(5)), "{until:?}");
    assert_eq!(t.connect_failures(&k), 1);
}
