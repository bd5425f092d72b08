//! The machines' observation events as [`tracing`] events (feature `tracing`).
//!
//! [`Tracing`] is an [`EventSink`] for every event type: install it on a handle
//! (`gate.set_event_sink(Tracing)`), or hand it the events of a machine you drive yourself
//! (`Tracing.on_event(&e)` for each `poll_event()`). Each event becomes one `tracing` event
//! with a fixed target per machine, a level by how much an operator wants to see it, and its
//! values as fields: durations as integer `*_ms` fields, instants as `*_ns` on the machine's
//! timeline (the runtime's clock), keys and reasons by `Debug`.
//!
//! | target | event | level | fields |
//! |---|---|---|---|
//! | `throttle::gate` | gate installed | DEBUG | `bucket`, `reason`, `delay_ms`, `attempt`, `reason_opens_at_ns`, `opens_at_ns` |
//! | `throttle::gate` | gate wake | TRACE | `at_ns` |
//! | `throttle::window` | credit dispatched | TRACE | `shard`, `credit` |
//! | `throttle::window` | credit released | TRACE | `credit`, `in_flight` |
//! | `throttle::batch` | batch dispatched | DEBUG | `shard`, `credit`, `ops`, `bytes` |
//! | `throttle::batch` | batch credit released | TRACE | `credit`, `in_flight` |
//! | `throttle::failover` | refresh requested | DEBUG | `cause` |
//! | `throttle::failover` | retry decided | DEBUG | `attempt`, `delay_ms`, `cause` |
//! | `throttle::failover` | error surfaced | INFO | `reason` |
//! | `throttle::refresh` | refresh started | DEBUG | `generation` |
//! | `throttle::refresh` | refresh joined | TRACE | `generation`, `waiters` |
//! | `throttle::refresh` | refresh completed | DEBUG (WARN when it failed) | `generation`, `ok`, `released` |
//! | `throttle::refresh` | refresh refused | WARN | `held` |
//! | `throttle::conn` | connection opened | DEBUG | `conn` |
//! | `throttle::conn` | connection connected | DEBUG | `conn` |
//! | `throttle::conn` | connection closed | DEBUG (WARN for a failed or timed-out connect) | `conn`, `cause` |
//!
//! The message of each event is the text of its "event" column. Credits are named by
//! [`CreditId::seq`](crate::CreditId::seq), connections by [`ConnId::seq`](crate::ConnId::seq). The mapping is tested against a recording
//! subscriber (`tests/tracing_events.rs`).

use core::fmt::Debug;

use tracing::{Level, event};

use super::EventSink;
use super::FailoverEvent;
use crate::batcher::BatchEvent;
use crate::conn_key::{CloseCause, ConnEvent};
use crate::dispatch_window::WindowEvent;
use crate::failover::{CallEvent, RefreshEvent};
use crate::write_gate::GateEvent;

/// An [`EventSink`] that emits every event as a `tracing` event; see the [module docs](self)
/// for the targets, levels and fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tracing;

/// Whole milliseconds of `d`, saturating.
fn ms(d: core::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl<K: Debug> EventSink<GateEvent<K>> for Tracing {
    fn on_event(&self, e: &GateEvent<K>) {
        match e {
            GateEvent::Installed {
                bucket,
                reason,
                delay,
                attempt,
                reason_opens_at,
                opens_at,
            } => event!(
                target: "throttle::gate",
                Level::DEBUG,
                bucket = ?bucket,
                reason = ?reason,
                delay_ms = ms(*delay),
                attempt = *attempt,
                reason_opens_at_ns = reason_opens_at.map(|at| at.as_nanos()),
                opens_at_ns = opens_at.as_nanos(),
                "gate installed"
            ),
            GateEvent::Wake { at } => event!(
                target: "throttle::gate",
                Level::TRACE,
                at_ns = at.as_nanos(),
                "gate wake"
            ),
        }
    }
}

impl<K: Debug> EventSink<WindowEvent<K>> for Tracing {
    fn on_event(&self, e: &WindowEvent<K>) {
        match e {
            WindowEvent::Dispatched { shard, credit } => event!(
                target: "throttle::window",
                Level::TRACE,
                shard = ?shard,
                credit = credit.seq(),
                "credit dispatched"
            ),
            WindowEvent::Released { credit, in_flight } => event!(
                target: "throttle::window",
                Level::TRACE,
                credit = credit.seq(),
                in_flight = *in_flight,
                "credit released"
            ),
        }
    }
}

impl<K: Debug> EventSink<BatchEvent<K>> for Tracing {
    fn on_event(&self, e: &BatchEvent<K>) {
        match e {
            BatchEvent::Dispatched {
                shard,
                credit,
                ops,
                bytes,
            } => event!(
                target: "throttle::batch",
                Level::DEBUG,
                shard = ?shard,
                credit = credit.seq(),
                ops = u64::try_from(*ops).unwrap_or(u64::MAX),
                bytes = *bytes,
                "batch dispatched"
            ),
            BatchEvent::Released { credit, in_flight } => event!(
                target: "throttle::batch",
                Level::TRACE,
                credit = credit.seq(),
                in_flight = *in_flight,
                "batch credit released"
            ),
        }
    }
}

impl EventSink<CallEvent> for Tracing {
    fn on_event(&self, e: &CallEvent) {
        match e {
            CallEvent::RefreshRequested { cause } => event!(
                target: "throttle::failover",
                Level::DEBUG,
                cause = ?cause,
                "refresh requested"
            ),
            CallEvent::RetryDecided {
                attempt,
                delay,
                cause,
            } => event!(
                target: "throttle::failover",
                Level::DEBUG,
                attempt = *attempt,
                delay_ms = ms(*delay),
                cause = ?cause,
                "retry decided"
            ),
            CallEvent::ErrorSurfaced { reason } => event!(
                target: "throttle::failover",
                Level::INFO,
                reason = ?reason,
                "error surfaced"
            ),
        }
    }
}

impl EventSink<RefreshEvent> for Tracing {
    fn on_event(&self, e: &RefreshEvent) {
        match e {
            RefreshEvent::Started { generation } => event!(
                target: "throttle::refresh",
                Level::DEBUG,
                generation = generation.get(),
                "refresh started"
            ),
            RefreshEvent::Joined {
                generation,
                waiters,
            } => event!(
                target: "throttle::refresh",
                Level::TRACE,
                generation = generation.get(),
                waiters = u64::try_from(*waiters).unwrap_or(u64::MAX),
                "refresh joined"
            ),
            RefreshEvent::Completed {
                generation,
                ok: true,
                released,
            } => event!(
                target: "throttle::refresh",
                Level::DEBUG,
                generation = generation.get(),
                ok = true,
                released = u64::try_from(*released).unwrap_or(u64::MAX),
                "refresh completed"
            ),
            RefreshEvent::Completed {
                generation,
                ok: false,
                released,
            } => event!(
                target: "throttle::refresh",
                Level::WARN,
                generation = generation.get(),
                ok = false,
                released = u64::try_from(*released).unwrap_or(u64::MAX),
                "refresh completed"
            ),
            RefreshEvent::Refused { held } => event!(
                target: "throttle::refresh",
                Level::WARN,
                held = u64::try_from(*held).unwrap_or(u64::MAX),
                "refresh refused"
            ),
        }
    }
}

impl EventSink<FailoverEvent> for Tracing {
    fn on_event(&self, e: &FailoverEvent) {
        match e {
            FailoverEvent::Call(e) => self.on_event(e),
            FailoverEvent::Refresh(e) => self.on_event(e),
        }
    }
}

impl EventSink<ConnEvent> for Tracing {
    fn on_event(&self, e: &ConnEvent) {
        match e {
            ConnEvent::Opened { conn } => event!(
                target: "throttle::conn",
                Level::DEBUG,
                conn = conn.seq(),
                "connection opened"
            ),
            ConnEvent::Connected { conn } => event!(
                target: "throttle::conn",
                Level::DEBUG,
                conn = conn.seq(),
                "connection connected"
            ),
            ConnEvent::Closed {
                conn,
                cause: cause @ (CloseCause::ConnectFailed | CloseCause::ConnectTimedOut),
            } => event!(
                target: "throttle::conn",
                Level::WARN,
                conn = conn.seq(),
                cause = ?cause,
                "connection closed"
            ),
            ConnEvent::Closed { conn, cause } => event!(
                target: "throttle::conn",
                Level::DEBUG,
                conn = conn.seq(),
                cause = ?cause,
                "connection closed"
            ),
        }
    }
}
