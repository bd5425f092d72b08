//! Feature `tracing`: `sync::trace::Tracing` turns every observation event into one `tracing`
//! event with the target, level, message and fields its module docs list. Checked against a
//! hand-written recording subscriber (no tracing-subscriber), both as a handle's sink and fed
//! by hand from machines driven directly.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use throttle_sansio::failover::{
    Call, CallConfig, CoalescerConfig, ErrorClass, RefreshCoalescer, SurfaceReason, Unlimited,
};
use throttle_sansio::rng::SplitMix64;
use throttle_sansio::sync::trace::Tracing;
use throttle_sansio::sync::{EventSink, GateHandle, WindowHandle};
use throttle_sansio::{
    BatchEvent, DispatchWindow, Instant, Signal, WindowConfig, WindowEvent, WriteGateConfig,
};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// One recorded event: its target, level, and every field as text (`message` included).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    target: String,
    level: Level,
    fields: BTreeMap<String, String>,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// Records every event; spans are not used by the sink.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn core::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(Seen {
            target: event.metadata().target().to_owned(),
            level: *event.metadata().level(),
            fields,
        });
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Runs `f` with a fresh recorder as the thread's subscriber; returns what it recorded.
fn recorded(f: impl FnOnce()) -> Vec<Seen> {
    let rec = Recorder::default();
    tracing::subscriber::with_default(rec.clone(), f);
    let seen = rec.0.lock().unwrap();
    seen.clone()
}

fn expect(seen: &Seen, target: &str, level: Level, message: &str, fields: &[(&str, &str)]) {
    assert_eq!(
        (seen.target.as_str(), seen.level, seen.field("message")),
        (target, level, Some(message)),
        "{seen:?}"
    );
    for (name, value) in fields {
        assert_eq!(seen.field(name), Some(*value), "field {name} of {seen:?}");
    }
}

#[test]
fn a_gate_handle_with_the_tracing_sink_logs_each_install_with_its_fields() {
    let gate: GateHandle<u32> = GateHandle::new(WriteGateConfig::default()).unwrap();
    gate.set_event_sink(Tracing);
    let t = Instant::from_millis(5);
    let mut wait = core::time::Duration::ZERO;
    let seen = recorded(|| {
        wait = gate.handle_kv_signal(t, &7, Signal::Full);
        let _ = gate.handle_kv_signal(t, &7, Signal::Clear);
    });
    assert_eq!(seen.len(), 3, "{seen:?}");
    let opens = (t + wait).as_nanos().to_string();
    let delay = wait.as_millis().to_string();
    expect(
        &seen[0],
        "throttle::gate",
        Level::DEBUG,
        "gate installed",
        &[
            ("bucket", "7"),
            ("reason", "KvBackpressure"),
            ("delay_ms", &delay),
            ("reason_opens_at_ns", &opens),
            ("opens_at_ns", &opens),
        ],
    );
    assert_eq!(seen[0].field("attempt"), None, "a signal has no attempt");
    // The clear: the reason holds nothing, and the bucket opens now.
    expect(
        &seen[1],
        "throttle::gate",
        Level::DEBUG,
        "gate installed",
        &[("opens_at_ns", &t.as_nanos().to_string())],
    );
    assert_eq!(seen[1].field("reason_opens_at_ns"), None);
    expect(
        &seen[2],
        "throttle::gate",
        Level::TRACE,
        "gate wake",
        &[("at_ns", &t.as_nanos().to_string())],
    );
}

#[test]
fn a_window_handle_logs_credits_dispatched_and_released() {
    let window: WindowHandle<&str> = WindowHandle::new(WindowConfig::default()).unwrap();
    window.set_event_sink(Tracing);
    let seen = recorded(|| {
        let a = window.try_acquire("a").unwrap();
        let b = window.try_acquire("a").unwrap();
        drop(a);
        drop(b);
    });
    let shape: Vec<_> = seen
        .iter()
        .map(|s| {
            (
                s.level,
                s.field("message").unwrap_or(""),
                s.field("in_flight").unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (Level::TRACE, "credit dispatched", "-"),
            (Level::TRACE, "credit dispatched", "-"),
            (Level::TRACE, "credit released", "1"),
            (Level::TRACE, "credit released", "0"),
        ]
    );
    assert!(seen.iter().all(|s| s.target == "throttle::window"));
    assert_eq!(seen[0].field("shard"), Some("\"a\""));
    // Credits are named by their number, in issue order.
    assert_eq!(seen[0].field("credit"), seen[2].field("credit"));
    assert_ne!(seen[0].field("credit"), seen[1].field("credit"));
}

#[test]
fn a_calls_decisions_log_at_debug_and_its_surfaced_error_at_info() {
    let mut call = Call::new(&CallConfig::default().with_max_auto_retries(1));
    call.set_event_capacity(8);
    let (b, r) = (&mut Unlimited, &mut SplitMix64::new(1));
    let t = Instant::ZERO;
    let _ = call.start(t, b);
    let _ = call.handle_error(t, ErrorClass::REFRESH_AND_RETRY, b, r);
    let _ = call.handle_refreshed(t, true, b, r);
    let _ = call.handle_error(t, ErrorClass::RETRY, b, r);
    let events: Vec<_> = std::iter::from_fn(|| call.poll_event()).collect();
    let seen = recorded(|| events.iter().for_each(|e| Tracing.on_event(e)));
    assert_eq!(seen.len(), 3, "{seen:?}");
    expect(
        &seen[0],
        "throttle::failover",
        Level::DEBUG,
        "refresh requested",
        &[("cause", "Transient")],
    );
    expect(
        &seen[1],
        "throttle::failover",
        Level::DEBUG,
        "retry decided",
        &[("attempt", "1"), ("delay_ms", "0"), ("cause", "Transient")],
    );
    expect(
        &seen[2],
        "throttle::failover",
        Level::INFO,
        "error surfaced",
        &[("reason", &format!("{:?}", SurfaceReason::RetriesExhausted))],
    );
}

#[test]
fn the_refresh_logs_start_join_and_a_failed_end_at_warn() {
    let mut c = RefreshCoalescer::new(CoalescerConfig::default().with_max_waiters(2)).unwrap();
    c.set_event_capacity(8);
    let g = match c.handle_refresh_needed(1u8) {
        throttle_sansio::failover::CoalesceAction::Start(g) => g,
        other => panic!("{other:?}"),
    };
    let _ = c.handle_refresh_needed(2);
    let _ = c.handle_refresh_needed(3); // refused: two are held
    let _ = c.handle_refreshed(g, false);
    let events: Vec<_> = std::iter::from_fn(|| c.poll_event()).collect();
    let seen = recorded(|| events.iter().for_each(|e| Tracing.on_event(e)));
    let shape: Vec<_> = seen
        .iter()
        .map(|s| (s.level, s.field("message").unwrap_or("")))
        .collect();
    assert_eq!(
        shape,
        [
            (Level::DEBUG, "refresh started"),
            (Level::TRACE, "refresh joined"),
            (Level::WARN, "refresh refused"),
            (Level::WARN, "refresh completed"),
        ]
    );
    assert!(seen.iter().all(|s| s.target == "throttle::refresh"));
    let generation = g.get().to_string();
    assert_eq!(seen[1].field("waiters"), Some("2"));
    assert_eq!(seen[1].field("generation"), Some(generation.as_str()));
    assert_eq!(seen[2].field("held"), Some("2"));
    assert_eq!(
        (seen[3].field("ok"), seen[3].field("released")),
        (Some("false"), Some("2"))
    );
}

#[test]
fn a_batch_dispatch_logs_its_size_at_debug() {
    // A credit to name, from a window driven directly.
    let mut w: DispatchWindow<u8, (), std::hash::RandomState> =
        DispatchWindow::new(WindowConfig::default()).unwrap();
    let credit = w.submit(1, ()).unwrap().expect("free").credit;
    let events = [
        BatchEvent::Dispatched {
            shard: 4u8,
            credit,
            ops: 3,
            bytes: 120,
        },
        BatchEvent::Released {
            credit,
            in_flight: 0,
        },
    ];
    let seen = recorded(|| events.iter().for_each(|e| Tracing.on_event(e)));
    let id = credit.seq().to_string();
    expect(
        &seen[0],
        "throttle::batch",
        Level::DEBUG,
        "batch dispatched",
        &[
            ("shard", "4"),
            ("credit", &id),
            ("ops", "3"),
            ("bytes", "120"),
        ],
    );
    expect(
        &seen[1],
        "throttle::batch",
        Level::TRACE,
        "batch credit released",
        &[("credit", &id), ("in_flight", "0")],
    );
    // The window's own events go to their own target.
    let seen = recorded(|| {
        Tracing.on_event(&WindowEvent::<u8>::Released {
            credit,
            in_flight: 2,
        })
    });
    assert_eq!(seen[0].target, "throttle::window");
}

#[test]
fn connections_log_opened_and_a_failed_connect_closes_at_warn() {
    use throttle_sansio::conn_key::{CloseCause, ConnConfig, ConnEvent, ConnKey, ConnTable, Route};
    let mut table: ConnTable<u32, u32, std::hash::RandomState> =
        ConnTable::new(ConnConfig::default()).unwrap();
    table.set_event_capacity(8);
    let t = Instant::ZERO;
    let Route::Open(conn, _, _) =
        table.handle_request(t, &ConnKey::new(1, 2, 3), &mut SplitMix64::new(1))
    else {
        panic!("a new endpoint opens");
    };
    let _ = table.handle_connect_failed(t, conn);
    let mut events: Vec<_> = std::iter::from_fn(|| table.poll_event()).collect();
    events.push(ConnEvent::Closed {
        conn,
        cause: CloseCause::Idle,
    });
    let seen = recorded(|| events.iter().for_each(|e| Tracing.on_event(e)));
    let id = conn.seq().to_string();
    expect(
        &seen[0],
        "throttle::conn",
        Level::DEBUG,
        "connection opened",
        &[("conn", &id)],
    );
    expect(
        &seen[1],
        "throttle::conn",
        Level::WARN,
        "connection closed",
        &[("conn", &id), ("cause", "ConnectFailed")],
    );
    expect(
        &seen[2],
        "throttle::conn",
        Level::DEBUG,
        "connection closed",
        &[("cause", "Idle")],
    );
}
