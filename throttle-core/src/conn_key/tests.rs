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
    open_with(t, now, k, &mut SplitMix64::new(0)).0
}

/// `open` drawing the attempt's backoff from `rng`; also returns the attempt.
#[track_caller]
fn open_with(
    t: &mut Table,
    now: Instant,
    k: &ConnKey<&'static str, &'static str>,
    rng: &mut SplitMix64,
) -> (ConnId, ConnectAttempt) {
    match t.handle_request(now, k, rng) {
        Route::Open(id, got, attempt) => {
            assert_eq!(&got, k, "Open names the routed endpoint");
            assert_eq!(t.connect_attempt(id), Some(attempt));
            (id, attempt)
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
        t.handle_request(ms(200), &new, &mut SplitMix64::new(0)),
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
        assert_eq!(
            t.handle_request(ms(i), k, &mut SplitMix64::new(0)),
            Route::Use(want)
        );
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
    assert_eq!(
        t.handle_request(ms(5_000), &k, &mut SplitMix64::new(0)),
        Route::Use(a)
    );
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
        let (id, _) = open_with(&mut t, now, &k, &mut rng);
        let until = t.handle_connect_failed(now, id).unwrap();
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
        assert_eq!(
            t.handle_request(just_before, &k, &mut SplitMix64::new(0)),
            Route::Wait { until }
        );
        assert_eq!(t.backoff_until(just_before, &k), Some(until));
        now = until;
    }
    let id = open(&mut t, now, &k);
    assert!(t.handle_connected(now, id));
    assert_eq!(t.connect_failures(&k), 0, "success resets the backoff");
    // A later drop reconnects at once, and a failure starts again from 1 s.
    assert!(t.handle_closed(now, id));
    let (id, _) = open_with(&mut t, now, &k, &mut rng);
    let until = t.handle_connect_failed(now, id).unwrap();
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
    let a = open(&mut t, ms(0), &k);
    let until = t.handle_connect_failed(ms(0), a).unwrap();
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
    let a = open(&mut t, ms(0), &k);
    let until = t.handle_connect_failed(ms(0), a).unwrap();
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
        matches!(
            t.handle_request(lost, &k, &mut SplitMix64::new(0)),
            Route::Open(..)
        ),
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
fn close_all_closes_connecting_and_connected_in_slot_order_and_the_table_goes_on() {
    let mut t = table();
    t.set_event_capacity(8);
    let a = open(&mut t, ms(0), &key("cs-0", "A")); // slot 0
    let b = open(&mut t, ms(0), &key("cs-1", "B"));
    assert!(t.handle_connected(ms(1), a));
    t.handle_send(ms(1), a).unwrap();
    while t.poll_event().is_some() {}
    assert_eq!(t.close_all(ms(2)), 2);
    assert_eq!(drain(&mut t), [ConnAction::Close(a), ConnAction::Close(b)]);
    let shutdown = |conn| ConnEvent::Closed {
        conn,
        cause: CloseCause::Shutdown,
    };
    let events: Vec<_> = core::iter::from_fn(|| t.poll_event()).collect();
    assert_eq!(events, [shutdown(a), shutdown(b)]);
    assert_eq!((t.len(), t.state(a), t.state(b)), (0, None, None));
    assert_eq!(
        t.handle_finished(ms(3), a),
        Err(FinishError::Disconnected(a))
    );
    assert_eq!(t.close_all(ms(3)), 0, "nothing left");
    // The table serves on: the endpoint gets a fresh connection.
    let c = open(&mut t, ms(4), &key("cs-0", "A"));
    assert!(c != a && t.state(c) == Some(ConnState::Connecting));
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
    assert_eq!(t.handle_connect_failed(ms(1), a), None);
    assert_eq!(t.handle_request(ms(1), &k, &mut rng), Route::Use(a));
    assert_eq!(rng, before, "only an Open draws");
    assert_eq!(t.state(a), Some(ConnState::Connected));
    assert_eq!(t.connect_failures(&k), 0);
    assert!(!t.handle_connected(ms(2), a), "already connected");
}

#[test]
fn bogus_and_stale_ids_are_ignored_everywhere() {
    let mut t = table();
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
        assert_eq!(t.handle_connect_failed(ms(1), id), None);
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
    let until = t.handle_closed(ms(1), a).then(|| {
        let b = open(&mut t, ms(2), &k);
        t.handle_connect_failed(ms(3), b).unwrap()
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
    assert_eq!(t.handle_connect_failed(Instant::MAX, a), Some(Instant::MAX));
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
    let other = key("u", "other");
    for _ in 0..1_000 {
        let id = open(&mut forever, Instant::MAX - Duration::from_secs(1), &other);
        forever.handle_connect_failed(Instant::MAX, id);
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
        t.handle_request(ms(0), &key("u", "other"), &mut SplitMix64::new(0)),
        Route::Exhausted
    );
    assert_eq!(
        t.handle_request(ms(0), &k, &mut SplitMix64::new(0)),
        Route::Use(last),
        "live connections still work"
    );
    t.handle_closed(ms(0), last);
    assert_eq!(
        t.handle_request(ms(0), &k, &mut SplitMix64::new(0)),
        Route::Exhausted
    );
    assert_eq!((t.len(), t.tracked_endpoints()), (0, 0));
    assert_eq!(t.poll_timeout(), None);
}

#[test]
fn poll_timeout_is_the_earliest_deadline_of_any_kind() {
    let mut t = table();
    let a = open(&mut t, ms(5_000), &key("a", "h"));
    let b = open(&mut t, ms(1_000), &key("b", "h"));
    assert_eq!(t.poll_timeout(), Some(ms(5_000) + IDLE));
    t.handle_send(ms(5_000), a).unwrap();
    assert_eq!(
        t.poll_timeout(),
        Some(ms(5_000) + IDLE),
        "b's at 5 s, clock clamped"
    );
    let until = t.handle_connect_failed(ms(6_000), b).unwrap();
    // b's attempt started at 5 s (clamped): its backoff counts from there.
    assert_eq!(t.poll_timeout(), Some(until.max(ms(6_000)) + IDLE));
    t.handle_finished(ms(6_000), a).unwrap();
    assert_eq!(t.poll_timeout(), Some(ms(6_000) + IDLE));
}

#[test]
#[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
fn table_gives_memory_back_after_a_burst() {
    let mut t: ConnTable<u32, u32, RandomState> = ConnTable::new(ConnConfig::default()).unwrap();
    let mut ids = Vec::new();
    for i in 0..1_000 {
        match t.handle_request(ms(0), &ConnKey::new(i, i, 1), &mut SplitMix64::new(0)) {
            Route::Open(id, ..) => ids.push(id),
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
    let again = match t.handle_request(ms(2), &ConnKey::new(5000, 0, 1), &mut SplitMix64::new(0)) {
        Route::Open(id, ..) => id,
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
        match t.handle_request(ms(0), &ConnKey::new(i, 0, 1), &mut SplitMix64::new(0)) {
            Route::Open(id, ..) => ids.push(id),
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
        match t.handle_request(ms(0), &ConnKey::new(i, 0, 1), &mut SplitMix64::new(0)) {
            Route::Open(id, ..) => ids.push(id),
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
        let Route::Open(id, ..) = t.handle_request(ms(1), &key, &mut SplitMix64::new(0)) else {
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
        let Route::Open(id, ..) = t.handle_request(ms(2 * k), &key, &mut SplitMix64::new(0)) else {
            panic!("the endpoint opens")
        };
        // Connected, so it idles out after 1 ms (a connecting one waits for its connect
        // deadline, 20 s).
        assert!(t.handle_connected(ms(2 * k), id));
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
    assert_eq!(
        one.handle_request(ms(2), &k, &mut SplitMix64::new(0)),
        Route::Use(mine)
    );
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
    match t.handle_request(now, k, &mut SplitMix64::new(0)) {
        Route::Open(id, ..) => id,
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
                    t.handle_connect_failed(ms(0), id);
                    touchy(3, 3)
                }
            };
            let now = ms(60_000); // past any first connect backoff
            let before = books(&t);
            arm_budget(Some(budget));
            let routed = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
                t.handle_request(now, &key, &mut SplitMix64::new(0))
            }));
            arm_budget(None);
            let id = match routed {
                Err(_) => {
                    assert_eq!(books(&t), before, "budget {budget}, case {case}");
                    match t.handle_request(now, &key, &mut SplitMix64::new(0)) {
                        Route::Open(id, ..) => id,
                        other => panic!("budget {budget}, case {case}: {other:?}"),
                    }
                }
                Ok(Route::Open(id, got, _)) => {
                    assert_eq!(got, key);
                    id
                }
                Ok(other) => panic!("budget {budget}, case {case}: {other:?}"),
            };
            assert_eq!(t.connection(&key), Some(id), "budget {budget}, case {case}");
            assert_eq!(
                t.handle_request(now, &key, &mut SplitMix64::new(0)),
                Route::Use(id)
            );
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
            let routed = t.handle_request(
                ms(1),
                &ConnKey::new(uid(n, false), 1, 1),
                &mut SplitMix64::new(0),
            );
            // Connected, so the idle timer closes it without a connect backoff to remember.
            if let Route::Open(id, ..) = routed {
                t.handle_connected(ms(1), id);
            }
        }
        // Disconnects, idle closes, evictions and shrinking, down to the stored key alone.
        t.disconnect(ms(2), &uid(7, false));
        let _ = t.handle_request(
            ms(2) + IDLE,
            &ConnKey::new(uid(0, false), 1, 1),
            &mut SplitMix64::new(0),
        );
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
        let Route::Open(id, ..) = t.handle_request(ms(0), &key(1, 1), &mut SplitMix64::new(0))
        else {
            panic!("a fresh endpoint opens");
        };
        let panicked = panics(1, Call::Hash, 0, || {
            assert!(t.handle_closed(ms(1), id));
        });
        assert!(!panicked, "forgetting the endpoint hashed its key");
        assert_eq!((t.len(), t.tracked_endpoints()), (0, 0));
        assert!(matches!(
            t.handle_request(ms(2), &key(1, 1), &mut SplitMix64::new(0)),
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
                let _ = t.handle_request(ms(1), &key(1, 2), &mut SplitMix64::new(0));
            }));
            assert_eq!(format!("{t:?}"), before, "clone #{skip}: the table changed");
        }
        assert!(matches!(
            t.handle_request(ms(1), &key(1, 2), &mut SplitMix64::new(0)),
            Route::Open(..)
        ));
        assert_eq!(t.check_invariants(), Ok(()));
    }

    type Input = fn(&mut KeyTable, u32, ConnId);

    const INPUTS: [(&str, Input); 7] = [
        ("request", |t, k, _| {
            let _ = t.handle_request(ms(5), &key(k, k), &mut SplitMix64::new(0));
        }),
        ("request at another host", |t, k, _| {
            let _ = t.handle_request(ms(5), &key(k, 7), &mut SplitMix64::new(0));
        }),
        ("disconnect", |t, k, _| {
            let _ = t.disconnect(ms(5), &PanicKey(k));
        }),
        ("closed", |t, _, id| {
            let _ = t.handle_closed(ms(5), id);
        }),
        ("connect failed", |t, _, id| {
            let _ = t.handle_connect_failed(ms(5), id);
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
            if let Route::Open(id, ..) =
                base.handle_request(ms(0), &key(k, k), &mut SplitMix64::new(0))
            {
                ids.push(id);
            }
        }
        // Endpoint 1 failed to connect (in backoff); endpoint 2 has a request in flight.
        let failed = ids.get(1).copied().expect("opened");
        let busy = ids.get(2).copied().expect("opened");
        let _ = base.handle_connect_failed(ms(0), failed);
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

/// The `# Panics` contract of `handle_request`: a panicking `Rng` (it draws the attempt's
/// backoff when a route opens) leaves the table exactly as it was, for a new endpoint and
/// for one whose backoff ended; the same route then opens. A `Use` draws nothing. (The
/// default gRPC backoff draws nothing for a first attempt, so this table jitters it.)
#[test]
fn a_panicking_rng_leaves_the_table_as_it_was() {
    let jittered_first = BackoffConfig::grpc_connection()
        .to_builder()
        .first_delay_unjittered(false)
        .build()
        .unwrap();
    let mut t = ConnTable::new(ConnConfig::default().with_connect_backoff(jittered_first)).unwrap();
    let fresh = key("cs-0", "10.0.0.1");
    let failed = key("cs-1", "10.0.0.1");
    let id = open(&mut t, ms(0), &failed);
    t.handle_connect_failed(ms(0), id).unwrap();
    for k in [fresh, failed] {
        let before = alloc::format!("{t:?}");
        let routed = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
            t.handle_request(ms(60_000), &k, &mut PanickingRng)
        }));
        assert!(routed.is_err(), "{k:?}: the rng was asked");
        assert_eq!(alloc::format!("{t:?}"), before, "{k:?}: the table changed");
        assert_eq!(t.check_invariants(), Ok(()));
        let id = open(&mut t, ms(60_000), &k);
        assert_eq!(
            t.handle_request(ms(60_000), &k, &mut PanickingRng),
            Route::Use(id),
            "a Use draws nothing"
        );
    }
}

// ------------------------------------------------------------------ gRPC connection backoff

/// A connecting connection is not closed for idleness before its connect deadline, and a
/// connect still running then has failed: its backoff counts (before, a `max_idle` shorter
/// than the connect timeout reopened a hung endpoint every `max_idle`, with no backoff).
#[test]
fn the_idle_timer_never_cuts_a_connect_before_its_deadline_and_then_counts_a_failure() {
    let mut t: Table =
        ConnTable::new(grpc_unjittered().with_max_idle(Duration::from_secs(5))).unwrap();
    let k = key("cs-0", "10.0.0.1");
    let Route::Open(id, _, attempt) = t.handle_request(ms(0), &k, &mut SplitMix64::new(1)) else {
        panic!("opens")
    };
    assert_eq!(attempt.deadline(), ms(20_000));
    assert_eq!(
        t.poll_timeout(),
        Some(ms(20_000)),
        "not the 5 s idle deadline"
    );
    // A second request while it connects does not pull the deadline in either.
    assert_eq!(
        t.handle_request(ms(4_000), &k, &mut SplitMix64::new(1)),
        Route::Use(id)
    );
    assert_eq!(t.poll_timeout(), Some(ms(20_000)));
    t.handle_timeout(ms(19_999));
    assert_eq!(t.poll_action(), None);
    assert_eq!(t.state(id), Some(ConnState::Connecting));
    t.handle_timeout(ms(20_000));
    assert_eq!(t.poll_action(), Some(ConnAction::Close(id)));
    assert_eq!(t.connect_failures(&k), 1, "the cut is a failed connect");
    // The attempt started at 0 with a 1 s backoff: the endpoint may open again at once, and
    // its next wait is 1.6 s.
    let Route::Open(_, _, next) = t.handle_request(ms(20_000), &k, &mut SplitMix64::new(1)) else {
        panic!("reopens once its backoff has passed")
    };
    assert_eq!(next.timeout(), Duration::from_secs(20));
}

/// gRPC's protocol (grpc/grpc `doc/connection-backoff.md`, "Proposed Backoff Algorithm":
/// `current_deadline = now() + INITIAL_BACKOFF`, no jitter) with the default table: an
/// endpoint's first attempt draws nothing, gets the 20 s minimum connect timeout, and its
/// failure gates it exactly 1 s after the attempt started; the second attempt draws.
#[test]
fn the_default_first_attempt_is_unjittered_and_later_ones_draw() {
    let mut t = table();
    let k = key("cs-0", "10.0.0.1");
    let Route::Open(id, _, attempt) = t.handle_request(ms(0), &k, &mut PanickingRng) else {
        panic!("a new endpoint opens without drawing")
    };
    assert_eq!(attempt.timeout(), Duration::from_secs(20));
    assert_eq!(attempt.deadline(), ms(20_000));
    assert_eq!(t.handle_connect_failed(ms(300), id), Some(ms(1_000)));
    let drew = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
        t.handle_request(ms(1_000), &k, &mut PanickingRng)
    }));
    assert!(drew.is_err(), "the second attempt's wait is jittered");
    let Route::Open(_, _, attempt) = t.handle_request(ms(1_000), &k, &mut SplitMix64::new(7))
    else {
        panic!("the endpoint reopens once its backoff ended")
    };
    // 1.6 s ± 20 %, and at least the 20 s minimum.
    assert_eq!(attempt.timeout(), Duration::from_secs(20));
}

/// The numbers of gRPC's connection-backoff protocol (grpc/grpc `doc/connection-backoff.md`,
/// "Proposed Backoff Algorithm": INITIAL_BACKOFF 1 s, MULTIPLIER 1.6, MAX_BACKOFF 120 s,
/// MIN_CONNECT_TIMEOUT 20 s) without the jitter, so every deadline is exact; 1 ns resolution
/// keeps the document's products (6.5536 s) whole.
fn grpc_unjittered() -> ConnConfig {
    let backoff = BackoffConfig::builder()
        .initial(Duration::from_secs(1))
        .max(Duration::from_secs(120))
        .multiplier(16, 10)
        .jitter(crate::backoff::Jitter::None)
        .resolution(Duration::from_nanos(1))
        .build()
        .unwrap();
    ConnConfig::default().with_connect_backoff(backoff)
}

fn grpc_table(from: BackoffFrom) -> Table {
    ConnTable::new(grpc_unjittered().with_backoff_from(from)).unwrap()
}

fn nanos(n: u64) -> Duration {
    Duration::from_nanos(n)
}

/// The document's backoffs, attempt by attempt: 1, 1.6, 2.56, 4.096, 6.5536, 10.48576,
/// 16.777216, 26.8435456, 42.94967296, 68.719476736, 109.9511627776 s (whole ns, rounded
/// down), then MAX_BACKOFF.
const GRPC_BACKOFFS_NS: [u64; 12] = [
    1_000_000_000,
    1_600_000_000,
    2_560_000_000,
    4_096_000_000,
    6_553_600_000,
    10_485_760_000,
    16_777_216_000,
    26_843_545_600,
    42_949_672_960,
    68_719_476_736,
    109_951_162_777,
    120_000_000_000,
];

#[test]
fn default_config_follows_the_grpc_protocol_document() {
    let c = ConnConfig::default();
    assert_eq!(c.min_connect_timeout(), Duration::from_secs(20));
    assert_eq!(MIN_CONNECT_TIMEOUT, Duration::from_secs(20));
    assert_eq!(c.backoff_from(), BackoffFrom::AttemptStart);
}

#[test]
fn zero_min_connect_timeout_is_refused_with_the_option_name() {
    let err =
        Table::new(ConnConfig::default().with_min_connect_timeout(Duration::ZERO)).unwrap_err();
    assert!(matches!(
        err,
        ConfigError::OutOfRange {
            option: &crate::options::conn::MIN_CONNECT_TIMEOUT,
            got: 0,
            min: 1,
            ..
        }
    ));
    let one = ConnConfig::default().with_min_connect_timeout(nanos(1));
    assert!(Table::new(one).is_ok());
}

/// `doc/connection-backoff.md`, "Proposed Backoff Algorithm": `SleepUntil(current_deadline)`
/// after a failed `TryConnect`, where `current_deadline` was set when the attempt started.
/// A connect that starts at t and fails 300 ms in, with a 1 s backoff, is retried at t + 1 s
/// (not at t + 1.3 s); the next one, started at t + 1 s and failing 50 ms in, at t + 2.6 s.
#[test]
fn each_deadline_counts_from_its_attempt_s_start() {
    let mut t = grpc_table(BackoffFrom::AttemptStart);
    let k = key("cs-0", "10.0.0.1");
    let mut start = ms(10_000);
    let mut fails_after = [300u64, 50, 999, 0, 4_000].into_iter();
    for (n, &backoff) in GRPC_BACKOFFS_NS.iter().take(5).enumerate() {
        let (id, attempt) = open_with(&mut t, start, &k, &mut SplitMix64::new(0));
        assert_eq!(attempt.started(), start, "attempt {n}");
        let failed = start + Duration::from_millis(fails_after.next().unwrap());
        let next = start + nanos(backoff);
        assert_eq!(
            t.handle_connect_failed(failed, id),
            Some(next),
            "attempt {n}"
        );
        assert_eq!(t.connect_failures(&k), n as u32 + 1);
        let before = next - nanos(1);
        assert_eq!(
            t.handle_request(before, &k, &mut SplitMix64::new(0)),
            Route::Wait { until: next },
            "attempt {n}: 1 ns before the deadline"
        );
        start = next;
    }
    // The sixth attempt starts exactly at the fifth's deadline: 10 s + 1 + 1.6 + 2.56 +
    // 4.096 + 6.5536 s.
    assert_eq!(start, ms(10_000) + nanos(15_809_600_000));
    let (_, attempt) = open_with(&mut t, start, &k, &mut SplitMix64::new(0));
    assert_eq!(attempt.started(), start);
}

/// The same document, when `TryConnect` takes longer than the backoff:
/// `SleepUntil(current_deadline)` returns at once (gRPC core's subchannel: "if the
/// connection attempt took longer than the backoff time, then the timer will fire
/// immediately"). The next route opens at the failure's instant.
#[test]
fn a_connect_slower_than_its_backoff_retries_at_once() {
    let mut t = grpc_table(BackoffFrom::AttemptStart);
    let k = key("cs-0", "10.0.0.1");
    let (a, _) = open_with(&mut t, ms(0), &k, &mut SplitMix64::new(0));
    // 5 s to fail, against a 1 s backoff: the deadline (1 s) is already past.
    assert_eq!(t.handle_connect_failed(ms(5_000), a), Some(ms(1_000)));
    assert_eq!(t.backoff_until(ms(5_000), &k), None);
    assert_eq!(t.connect_failures(&k), 1);
    let (b, attempt) = open_with(&mut t, ms(5_000), &k, &mut SplitMix64::new(0));
    assert_ne!(a, b);
    assert_eq!(attempt.started(), ms(5_000));
    // Its own backoff (1.6 s) counts from its start; it fails 1.6 s in, exactly at it.
    assert_eq!(t.handle_connect_failed(ms(6_600), b), Some(ms(6_600)));
    let (_, attempt) = open_with(&mut t, ms(6_600), &k, &mut SplitMix64::new(0));
    assert_eq!(attempt.started(), ms(6_600));
    // The endpoint's state is still evicted `max_idle` after the failure, not after the
    // (earlier) deadline.
    let mut t = grpc_table(BackoffFrom::AttemptStart);
    let (a, _) = open_with(&mut t, ms(0), &k, &mut SplitMix64::new(0));
    t.handle_connect_failed(ms(5_000), a);
    assert_eq!(t.poll_timeout(), Some(ms(5_000) + IDLE));
}

/// `doc/connection-backoff.md`: `TryConnect(Max(current_deadline, now() +
/// MIN_CONNECT_TIMEOUT))`, so an attempt may take `max(20 s, its backoff)`: 20 s while the
/// backoff is at most 20 s (the first seven: 1 … 16.777216 s), then the backoff itself
/// (26.8435456 s …), up to MAX_BACKOFF (120 s). Every attempt here fails at once.
#[test]
fn each_attempt_gets_max_of_min_connect_timeout_and_its_backoff() {
    for from in [BackoffFrom::AttemptStart, BackoffFrom::Failure] {
        let mut t = grpc_table(from);
        let k = key("cs-0", "10.0.0.1");
        let mut now = ms(0);
        let mut timeouts = Vec::new();
        for &backoff in GRPC_BACKOFFS_NS.iter().chain([&GRPC_BACKOFFS_NS[11]; 2]) {
            let (id, attempt) = open_with(&mut t, now, &k, &mut SplitMix64::new(0));
            assert_eq!(attempt.deadline(), now + attempt.timeout());
            timeouts.push(attempt.timeout().as_nanos() as u64);
            now = t.handle_connect_failed(now, id).unwrap();
            assert_eq!(now, attempt.started() + nanos(backoff), "{from:?}");
        }
        let s20 = 20_000_000_000;
        assert_eq!(
            timeouts,
            [
                s20,
                s20,
                s20,
                s20,
                s20,
                s20,
                s20,
                26_843_545_600,
                42_949_672_960,
                68_719_476_736,
                109_951_162_777,
                120_000_000_000,
                120_000_000_000,
                120_000_000_000,
            ],
            "{from:?}"
        );
    }
}

/// A smaller `min_connect_timeout` gives way to the backoff sooner: at 2 s, the third
/// attempt (backoff 2.56 s) gets 2.56 s. A success resets the sequence: the next attempt's
/// backoff is 1 s again, and its timeout the 2 s minimum.
#[test]
fn min_connect_timeout_is_configurable_and_a_success_restarts_the_sequence() {
    let cfg = grpc_unjittered().with_min_connect_timeout(Duration::from_secs(2));
    let mut t = Table::new(cfg).unwrap();
    let k = key("cs-0", "10.0.0.1");
    let mut now = ms(0);
    let mut timeouts = Vec::new();
    for _ in 0..3 {
        let (id, attempt) = open_with(&mut t, now, &k, &mut SplitMix64::new(0));
        timeouts.push(attempt.timeout());
        now = t.handle_connect_failed(now, id).unwrap();
    }
    assert_eq!(
        timeouts,
        [Duration::from_secs(2), Duration::from_secs(2), ms_d(2_560)]
    );
    let (id, _) = open_with(&mut t, now, &k, &mut SplitMix64::new(0));
    assert!(t.handle_connected(now, id));
    assert_eq!(t.connect_attempt(id), None, "connected: no attempt");
    assert!(t.handle_closed(now, id));
    let (id, attempt) = open_with(&mut t, now, &k, &mut SplitMix64::new(0));
    assert_eq!(attempt.timeout(), Duration::from_secs(2));
    assert_eq!(t.handle_connect_failed(now, id), Some(now + ms_d(1_000)));
}

fn ms_d(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// grpc-go's measure (`addrConn.resetTransport`: `time.NewTimer(backoffFor)` once
/// `tryAllAddrs` has failed), kept as an option: the 300 ms failure retries at t + 1.3 s,
/// and a connect slower than its backoff waits the whole backoff again.
#[test]
fn from_failure_option_counts_the_backoff_from_the_failure_like_grpc_go() {
    let mut t = grpc_table(BackoffFrom::Failure);
    let k = key("cs-0", "10.0.0.1");
    let (a, _) = open_with(&mut t, ms(10_000), &k, &mut SplitMix64::new(0));
    assert_eq!(t.handle_connect_failed(ms(10_300), a), Some(ms(11_300)));
    assert_eq!(
        t.handle_request(ms(11_000), &k, &mut SplitMix64::new(0)),
        Route::Wait { until: ms(11_300) },
        "still waiting where the protocol document would retry"
    );
    let (b, _) = open_with(&mut t, ms(11_300), &k, &mut SplitMix64::new(0));
    // Slower than its 1.6 s backoff: waits 1.6 s from the failure.
    assert_eq!(t.handle_connect_failed(ms(16_300), b), Some(ms(17_900)));
    assert_eq!(t.backoff_until(ms(16_300), &k), Some(ms(17_900)));
}

/// A connect that ends any other way than failing (dropped by the transport, or by
/// `disconnect`) gives its drawn backoff back: the sequence does not grow, and the next
/// attempt gets the same backoff.
#[test]
fn only_a_failed_connect_commits_the_drawn_backoff() {
    let mut t = grpc_table(BackoffFrom::AttemptStart);
    let k = key("cs-0", "10.0.0.1");
    let (a, _) = open_with(&mut t, ms(0), &k, &mut SplitMix64::new(0));
    t.handle_connect_failed(ms(0), a);
    let (b, _) = open_with(&mut t, ms(1_000), &k, &mut SplitMix64::new(0));
    assert!(t.handle_closed(ms(1_100), b));
    let (c, _) = open_with(&mut t, ms(1_100), &k, &mut SplitMix64::new(0));
    assert_eq!(t.disconnect(ms(1_200), &"cs-0"), 1);
    drain(&mut t);
    assert_eq!(t.connect_failures(&k), 1);
    let (d, _) = open_with(&mut t, ms(1_200), &k, &mut SplitMix64::new(0));
    assert!(c != d);
    assert_eq!(
        t.handle_connect_failed(ms(1_300), d),
        Some(ms(1_200) + ms_d(1_600)),
        "the second backoff, from d's start"
    );
}

// ------------------------------------------------------------------ observation events

mod events {
    use super::*;
    use crate::test_hasher::TestHasher;
    use crate::test_key::{Call, PanicKey, panics};

    fn events(t: &mut Table) -> Vec<ConnEvent> {
        core::iter::from_fn(|| t.poll_event()).collect()
    }

    fn closed(conn: ConnId, cause: CloseCause) -> ConnEvent {
        ConnEvent::Closed { conn, cause }
    }

    #[test]
    fn events_are_off_by_default() {
        let mut t = table();
        let a = open(&mut t, ms(0), &key("cs-0", "h1"));
        assert!(t.handle_connected(ms(0), a));
        let b = open(&mut t, ms(0), &key("cs-1", "h1"));
        assert!(t.handle_connect_failed(ms(0), b).is_some());
        assert!(t.handle_closed(ms(1), a));
        let c = open(&mut t, ms(2), &key("cs-2", "h1"));
        assert_eq!(t.disconnect(ms(2), &"cs-2"), 1);
        t.handle_timeout(Instant::MAX);
        assert_eq!(drain(&mut t), [ConnAction::Close(c)]);
        assert_eq!(t.poll_event(), None, "off by default");
        assert_eq!(t.events_dropped(), 0);
    }

    /// Every cause, in the order the inputs produced them (and, for the closes that queue an
    /// action, in the order of those actions); inputs that change nothing give nothing.
    #[test]
    fn each_input_reports_what_it_did_once_events_are_on() {
        let mut t = table();
        t.set_event_capacity(64);
        let (ka, kb, kc) = (key("cs-0", "h1"), key("cs-1", "h1"), key("cs-2", "h1"));
        // Opened, connected, later idle.
        let a = open(&mut t, ms(0), &ka);
        assert!(t.handle_connected(ms(0), a));
        assert!(!t.handle_connected(ms(0), a), "already connected: no event");
        assert_eq!(
            t.handle_request(ms(0), &ka, &mut SplitMix64::new(0)),
            Route::Use(a)
        );
        // A failed connect, a Wait, then a reopen under the endpoint's old entry.
        let b = open(&mut t, ms(0), &kb);
        assert!(t.handle_connect_failed(ms(0), b).is_some());
        assert!(
            t.handle_connect_failed(ms(0), b).is_none(),
            "gone: no event"
        );
        assert!(matches!(
            t.handle_request(ms(0), &kb, &mut SplitMix64::new(0)),
            Route::Wait { .. }
        ));
        assert_eq!(
            events(&mut t),
            [
                ConnEvent::Opened { conn: a },
                ConnEvent::Connected { conn: a },
                ConnEvent::Opened { conn: b },
                closed(b, CloseCause::ConnectFailed),
            ]
        );
        let b2 = open(&mut t, ms(5_000), &kb);
        assert!(t.handle_connected(ms(5_000), b2));
        // Reported by the transport; a late report of it, or of b, gives nothing.
        assert!(t.handle_closed(ms(5_000), b2));
        assert!(!t.handle_closed(ms(5_000), b2));
        assert!(!t.handle_closed(ms(5_000), b));
        // A connect that is still running at its deadline.
        let c = open(&mut t, ms(5_000), &kc);
        // Two endpoints of one uid, disconnected together.
        let d = open(&mut t, ms(5_000), &key("cs-3", "h1"));
        let e = open(&mut t, ms(5_000), &key("cs-3", "h2"));
        assert_eq!(t.disconnect(ms(5_000), &"cs-3"), 2);
        let actions = drain(&mut t);
        assert_eq!(actions, [ConnAction::Close(d), ConnAction::Close(e)]);
        assert_eq!(
            t.disconnect(ms(5_000), &"cs-3"),
            0,
            "nothing left: no event"
        );
        assert_eq!(
            events(&mut t),
            [
                ConnEvent::Opened { conn: b2 },
                ConnEvent::Connected { conn: b2 },
                closed(b2, CloseCause::Reported),
                ConnEvent::Opened { conn: c },
                ConnEvent::Opened { conn: d },
                ConnEvent::Opened { conn: e },
                closed(d, CloseCause::Disconnected),
                closed(e, CloseCause::Disconnected),
            ]
        );
        // a idles out at 600 s; c, opened at 5 s, is still connecting at its deadline.
        t.handle_timeout(ms(0) + IDLE);
        assert_eq!(drain(&mut t), [ConnAction::Close(a)]);
        assert_eq!(events(&mut t), [closed(a, CloseCause::Idle)]);
        t.handle_timeout(ms(5_000) + IDLE);
        assert_eq!(drain(&mut t), [ConnAction::Close(c)]);
        assert_eq!(events(&mut t), [closed(c, CloseCause::ConnectTimedOut)]);
        assert_eq!(t.connect_failures(&kc), 1, "a timed-out connect backs off");
        t.handle_timeout(Instant::MAX);
        assert_eq!(t.poll_event(), None, "evicting a backoff is no event");
        assert_eq!(t.events_dropped(), 0);
    }

    #[test]
    fn a_full_event_queue_evicts_the_oldest_and_counts_it() {
        let mut t = table();
        t.set_event_capacity(2);
        let a = open(&mut t, ms(0), &key("cs-0", "h1"));
        assert!(t.handle_connected(ms(0), a));
        assert!(t.handle_closed(ms(0), a));
        assert_eq!(t.events_dropped(), 1);
        assert_eq!(
            events(&mut t),
            [
                ConnEvent::Connected { conn: a },
                closed(a, CloseCause::Reported)
            ]
        );
        assert_eq!(t.events_dropped(), 1);
    }

    type KeyTable = ConnTable<PanicKey, PanicKey, TestHasher>;

    fn pkey(uid: u32, host: u32) -> ConnKey<PanicKey, PanicKey> {
        ConnKey::new(PanicKey(uid), PanicKey(host), 9123)
    }

    /// Events are built after the key's code ran: a panicking `Hash` or `Clone` while
    /// routing (a new endpoint, or one reopening after its backoff), or a panicking `Hash`
    /// while disconnecting, leaves no event and counts none dropped.
    #[test]
    fn a_panicking_key_callback_leaves_no_event() {
        let mut t: KeyTable = ConnTable::new(ConnConfig::default()).unwrap();
        t.set_event_capacity(64);
        let Route::Open(failed, ..) = t.handle_request(ms(0), &pkey(2, 2), &mut SplitMix64::new(0))
        else {
            panic!("a fresh endpoint opens");
        };
        assert!(t.handle_connect_failed(ms(0), failed).is_some());
        let Route::Open(live, ..) = t.handle_request(ms(0), &pkey(3, 3), &mut SplitMix64::new(0))
        else {
            panic!("a fresh endpoint opens");
        };
        while t.poll_event().is_some() {}
        let later = ms(60_000); // past the first connect backoff
        for (k, call, skip) in [
            (1, Call::Hash, 0),
            (1, Call::Clone, 0),
            (1, Call::Clone, 1),
            (2, Call::Hash, 0),
            (2, Call::Clone, 0),
        ] {
            assert!(
                panics(k, call, skip, || {
                    let _ = t.handle_request(later, &pkey(k, k), &mut SplitMix64::new(0));
                }),
                "route to {k}, {call:?} #{skip} fired"
            );
            assert_eq!(t.poll_event(), None, "route to {k}, {call:?} #{skip}");
        }
        assert!(panics(3, Call::Hash, 0, || {
            let _ = t.disconnect(later, &PanicKey(3));
        }));
        assert_eq!(t.poll_event(), None, "disconnect");
        assert_eq!(t.events_dropped(), 0);
        // Unarmed, the same inputs report.
        let Route::Open(reopened, ..) =
            t.handle_request(later, &pkey(2, 2), &mut SplitMix64::new(0))
        else {
            panic!("the endpoint reopens");
        };
        assert_eq!(t.disconnect(later, &PanicKey(3)), 1);
        assert_eq!(
            core::iter::from_fn(|| t.poll_event()).collect::<Vec<_>>(),
            [
                ConnEvent::Opened { conn: reopened },
                ConnEvent::Closed {
                    conn: live,
                    cause: CloseCause::Disconnected
                },
            ]
        );
    }
}

// ------------------------------------------------------------------- paged snapshot (issue 16)

#[test]
fn a_walk_over_a_changing_table_lists_every_steady_endpoint_exactly_once_with_its_state() {
    let mut t: ConnTable<u32, u32, RandomState> =
        ConnTable::new(ConnConfig::default().with_max_idle(Duration::from_secs(10))).unwrap();
    let mut rng = SplitMix64::new(3);
    let now = Instant::from_millis(1);
    let mut conns = Vec::new();
    for i in 0..60u32 {
        let Route::Open(id, _, _) = t.handle_request(now, &ConnKey::new(i, i, 1), &mut rng) else {
            panic!("a new endpoint opens");
        };
        conns.push(id);
    }
    // Endpoint 0 connected with a request in flight; endpoint 1 failed its connect.
    assert!(t.handle_connected(now, conns[0]));
    t.handle_send(now, conns[0]).unwrap();
    let until = t.handle_connect_failed(now, conns[1]).unwrap();
    let (mut seen, mut from, mut page_no) = (Vec::new(), None, 0u32);
    loop {
        let page = t.snapshot(now, from, 4);
        assert!(page.items.len() <= 4);
        seen.extend(page.items);
        let Some(next) = page.next else { break };
        from = Some(next);
        // Between pages: new endpoints take freed slots, and the last ones close.
        page_no += 1;
        let _ = t.handle_closed(now, conns[60 - page_no as usize]);
        let _ = t.handle_request(now, &ConnKey::new(500 + page_no, 0, 1), &mut rng);
    }
    for i in 0..40u32 {
        let n = seen.iter().filter(|e| e.key.uid == i).count();
        assert_eq!(n, 1, "endpoint {i} listed {n} times");
    }
    let of = |uid: u32| seen.iter().find(|e| e.key.uid == uid).expect("listed");
    let busy = of(0);
    assert_eq!(
        (busy.conn, busy.in_flight, busy.closes_at),
        (Some((conns[0], ConnState::Connected)), 1, None)
    );
    let failed = of(1);
    assert_eq!(
        (failed.conn, failed.backoff_until, failed.connect_failures),
        (None, (until > now).then_some(until), 1)
    );
    let idle = of(2);
    assert_eq!(idle.conn, Some((conns[2], ConnState::Connecting)));
    assert_eq!(idle.closes_at, t.idle_deadline(conns[2]));
}
