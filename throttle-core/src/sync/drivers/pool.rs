//! [`ConnPool`]: connections keyed by `(uid, host, port)` over a [`ConnTable`], shared by many
//! tasks, with idle eviction from the table's deadlines and the table's connect backoff.
//!
//! The table decides (`handle_request`, under the lock); the pool carries the decisions out after the
//! lock is dropped: an `Open` becomes a connect task spawned on the runtime (so a cancelled
//! leaser never strands a connection in `Connecting`), a `Close` drops the pool's handle to the
//! connection. Leasers of a connecting endpoint sleep on a [`WakeSignal`] notified when any
//! connect ends, reading its epoch before routing (the same rule as [`wait_until`]).
//!
//! User code that panics fails the one lease it belonged to with [`PoolError::Panicked`]: a
//! key's `Hash`, `Eq` or `Clone` while the table routes it (the table runs them before it
//! changes anything), and `connect()` or its future (the connect task owns the endpoint's
//! `Connecting` state in a guard, which reports it closed if the task ends any other way).
//!
//! [`wait_until`]: super::wait_until

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt;
use core::future::Future;
use core::hash::{BuildHasher, Hash};
use core::ops::Deref;

use super::drive::{Timed, drive, drive_timeouts};
use super::events::{EventSink, EventTap, Observed};
use super::loom::{Arc, Mutex, lock};
use super::oneshot;
use super::oneshot::Sender;
use super::signal::wait_for;
use super::unwind;
use super::{Panicked, Runtime, WakeSignal};
use crate::conn_key::{
    ConnAction, ConnConfig, ConnEvent, ConnId, ConnKey, ConnTable, ConnectAttempt,
    EndpointSnapshot, Route,
};
use crate::error::ConfigError;
use crate::rng::SplitMix64;
use crate::snapshot::{Cursor, Page};
use crate::time::Instant;

/// Opens a connection to `host:port`. The runtime adapters provide a TCP one; a client wraps
/// its own protocol handshake the same way.
///
/// Each connect gets the table's [`ConnectAttempt`]: its timeout is
/// `max(min_connect_timeout, the attempt's backoff)` (gRPC's connection-backoff protocol).
/// The pool enforces it whatever the connector does: a connect still running at
/// [`ConnectAttempt::deadline`] is dropped and fails its lease with
/// [`PoolError::ConnectTimeout`]; a connector may also pass the timeout on (to a socket's
/// connect timeout, a handshake deadline) so it gives up on its own.
pub trait Connector<H>: Send + Sync + 'static {
    /// The connection. Shared by every request routed to its endpoint (the pool hands out
    /// `&Conn` through [`Lease`]), so it is typically a multiplexed client.
    type Conn: Send + Sync + 'static;
    /// Why a connect failed.
    type Error: Send + 'static;

    /// Connects to `host:port` within `attempt` (its [`timeout`](ConnectAttempt::timeout),
    /// or its [`deadline`](ConnectAttempt::deadline) on the runtime's clock). The future owns
    /// what it needs (`'static`).
    fn connect(
        &self,
        host: &H,
        port: u16,
        attempt: ConnectAttempt,
    ) -> impl Future<Output = Result<Self::Conn, Self::Error>> + Send + 'static;
}

/// Why [`ConnPool::lease`] gave no connection.
///
/// `Display` says what happened at this layer; the connector's error is the
/// [`source`](std::error::Error::source) of [`Connect`](Self::Connect). `std::error::Error`
/// is implemented when `E` is an error itself.
///
/// ```
/// use std::error::Error as _;
/// use throttle_sansio::sync::PoolError;
///
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// let e = PoolError::Connect(refused);
/// assert_eq!(e.to_string(), "connecting to the endpoint failed; it backs off now");
/// let cause = e.source().unwrap().downcast_ref::<std::io::Error>().unwrap();
/// assert_eq!(cause.kind(), std::io::ErrorKind::ConnectionRefused);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError<E> {
    /// This lease's connect failed; the endpoint now backs off.
    #[error("connecting to the endpoint failed; it backs off now")]
    Connect(#[source] E),
    /// This lease's connect was still running at its [`ConnectAttempt::deadline`]: the pool
    /// dropped it and reported it failed, so the endpoint backs off as after any failed
    /// connect.
    #[error("connecting to the endpoint took longer than {timeout:?}; it backs off now")]
    ConnectTimeout {
        /// The attempt's timeout.
        timeout: core::time::Duration,
    },
    /// The endpoint's last connect failed; lease again at `until`.
    #[error("the endpoint's last connect failed; it backs off until {until:?}")]
    Backoff {
        /// When the endpoint's backoff ends (runtime clock).
        until: Instant,
    },
    /// The table ran out of connection ids (see [`Route::Exhausted`]); build a new pool.
    #[error("the connection table has issued every connection id it can")]
    Exhausted,
    /// The pool was closed, or the runtime dropped this lease's connect task before it ended
    /// (it is shutting down).
    #[error("the connection pool is closed")]
    Closed,
    /// User code of this lease panicked: the key's `Hash`, `Eq` or `Clone` while it was
    /// routed, or the connect it started ([`Connector::connect`] or its future). Nothing is
    /// left connecting: the next lease of the key connects anew, without a backoff.
    #[error(transparent)]
    Panicked(#[from] Panicked),
}

struct PoolState<U, H, S, T> {
    table: ConnTable<U, H, S>,
    conns: BTreeMap<ConnId, Arc<T>>,
    rng: SplitMix64,
    closed: bool,
    /// Leases out (each holds its connection open).
    leased: usize,
    /// Connect tasks not yet reported back.
    connecting: usize,
    /// Batches of connection handles taken out under the lock and not yet dropped (they are
    /// dropped after unlock, so a connection's `Drop` never runs under the lock).
    dropping: usize,
}

impl<U, H, S, T> PoolState<U, H, S, T> {
    /// Closed, no lease out, no connect running and no handle being dropped: what
    /// [`ConnPool::closed`] waits for. (The pool's own handles to connections went at the
    /// close and a lease drops its handle before it ends, so no connection is open.)
    fn is_drained(&self) -> bool {
        self.closed && self.leased == 0 && self.connecting == 0 && self.dropping == 0
    }

    /// Counts handles just taken out of the state (`any`: there are some) as being dropped;
    /// pass the answer to [`PoolShared::drop_taken`].
    fn taking(&mut self, any: bool) -> bool {
        if any {
            self.dropping += 1;
        }
        any
    }
}

struct PoolShared<R, C: Connector<H>, U, H, S> {
    rt: R,
    connector: C,
    state: Mutex<PoolState<U, H, S, C::Conn>>,
    /// Notified when a connect ends (either way): leasers of a connecting endpoint re-route.
    connected: WakeSignal,
    /// Notified when an input moves the table's `poll_timeout` earlier: the timer loop re-arms.
    timer: WakeSignal,
    /// The table's event sink.
    tap: EventTap<ConnEvent>,
    /// Notified when the closed pool's last lease or connect ends: [`ConnPool::closed`].
    drained: WakeSignal,
}

/// A pool of connections keyed by [`ConnKey`] `(uid, host, port)`, over a [`ConnTable`].
/// `Clone + Send + Sync`; clones share the table.
///
/// # Contract
///
/// - [`lease(key)`](Self::lease) routes the key: an existing connection is leased at once; a
///   new one is connected by a task spawned on the runtime (concurrent leasers of the same
///   endpoint wait for it); an endpoint in connect backoff is refused with
///   [`PoolError::Backoff`]. The leaser whose connect failed gets [`PoolError::Connect`].
/// - Each connect is given the table's [`ConnectAttempt`] (timeout `max(min_connect_timeout,
///   the attempt's backoff)`, 20 s at least by default) and is cut at its deadline: the
///   leaser gets [`PoolError::ConnectTimeout`] and the endpoint backs off as after a failed
///   connect; leasers waiting on it route again.
/// - A [`Lease`] counts one request in flight on its connection until it is dropped (or
///   [`Lease::broken`] reports the connection dead); a connection with nothing in flight closes
///   after the table's `max_idle`.
/// - [`drive_timeouts`](Self::drive_timeouts) is the pool's timer loop (the table's
///   `poll_timeout` → sleep → `handle_timeout`; each `Close` drops the pool's handle to the
///   connection). Spawn it once per pool; without it idle connections are never closed.
///   Expiry is decided by the table against the runtime's clock, never by the timer firing.
/// - A panic in the key's `Hash`, `Eq` or `Clone`, or in the connect, fails that lease with
///   [`PoolError::Panicked`] and leaves the pool serving; see [`lease`](Self::lease).
///
/// The hasher `S` defaults to std's [`RandomState`](std::hash::RandomState), which
/// [`new`](ConnPool::new) uses; [`with_hasher`](Self::with_hasher) takes any other.
///
/// A connector whose "connection" is its address, on a tiny runtime of the example's own
/// (hidden: a [`ManualClock`](super::ManualClock) and a task queue that `block_on` polls;
/// `throttle_tokio::TokioRuntime` in an application):
///
/// ```
#[doc = include_str!("../doc/tiny_runtime.md")]
/// use throttle_sansio::conn_key::{ConnConfig, ConnKey, ConnectAttempt};
/// use throttle_sansio::sync::{ConnPool, Connector};
///
/// struct Dialer;
///
/// impl Connector<&'static str> for Dialer {
///     type Conn = String;
///     type Error = std::io::Error;
///
///     fn connect(
///         &self,
///         host: &&'static str,
///         port: u16,
///         _attempt: ConnectAttempt,
///     ) -> impl Future<Output = Result<String, std::io::Error>> + Send + 'static {
///         core::future::ready(Ok(format!("{host}:{port}")))
///     }
/// }
///
/// let rt = Tiny::default();
/// let pool: ConnPool<_, _, u32, &str> =
///     ConnPool::new(rt.clone(), Dialer, ConnConfig::default()).unwrap();
/// let key = ConnKey::new(7, "db-1", 9000);
/// let lease = rt.block_on(pool.lease(&key)).unwrap();
/// assert_eq!(&*lease, "db-1:9000");
/// let again = rt.block_on(pool.lease(&key)).unwrap(); // the same connection
/// assert_eq!((again.id(), pool.len()), (lease.id(), 1));
/// drop((lease, again));
/// pool.close(); // graceful shutdown: refuse new leases, then
/// rt.block_on(pool.closed()); // wait for every lease and connect to end
/// ```
pub struct ConnPool<R, C: Connector<H>, U, H, S = std::hash::RandomState> {
    shared: Arc<PoolShared<R, C, U, H, S>>,
}

impl<R, C: Connector<H>, U, H, S> Clone for ConnPool<R, C, U, H, S> {
    fn clone(&self) -> Self {
        ConnPool {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<R, C: Connector<H>, U, H, S> fmt::Debug for ConnPool<R, C, U, H, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnPool").finish_non_exhaustive()
    }
}

enum Step<T> {
    Leased(ConnId, Arc<T>),
    AwaitConnect,
    Connect(ConnId, ConnectAttempt),
    Err(PoolError<()>),
}

impl<R, C, U, H> ConnPool<R, C, U, H, std::hash::RandomState>
where
    R: Runtime,
    C: Connector<H>,
    U: Hash + Eq + Clone + Send + 'static,
    H: Hash + Eq + Clone + Send + 'static,
{
    /// A pool connecting with `connector`, hashing keys with a fresh std
    /// [`RandomState`](std::hash::RandomState); refuses an invalid `cfg`. For another
    /// hasher, [`with_hasher`](Self::with_hasher).
    pub fn new(rt: R, connector: C, cfg: ConnConfig) -> Result<Self, ConfigError> {
        Self::with_hasher(rt, connector, cfg, std::hash::RandomState::new())
    }
}

impl<R, C, U, H, S> ConnPool<R, C, U, H, S>
where
    R: Runtime,
    C: Connector<H>,
    U: Hash + Eq + Clone + Send + 'static,
    H: Hash + Eq + Clone + Send + 'static,
    S: BuildHasher + Clone + Send + 'static,
{
    /// A pool hashing keys with `hasher`.
    pub fn with_hasher(
        rt: R,
        connector: C,
        cfg: ConnConfig,
        hasher: S,
    ) -> Result<Self, ConfigError> {
        Ok(ConnPool {
            shared: Arc::new(PoolShared {
                rt,
                connector,
                state: Mutex::new(PoolState {
                    table: ConnTable::with_hasher(cfg, hasher)?,
                    conns: BTreeMap::new(),
                    rng: super::seed::client_rng(super::seed::next_client_id()),
                    closed: false,
                    leased: 0,
                    connecting: 0,
                    dropping: 0,
                }),
                connected: WakeSignal::new(),
                timer: WakeSignal::new(),
                tap: EventTap::default(),
                drained: WakeSignal::new(),
            }),
        })
    }

    /// Restarts the connect-backoff jitter from `seed` (tests; the default seed is random).
    pub fn reseed(&self, seed: u64) {
        lock(&self.shared.state).rng = SplitMix64::new(seed);
    }

    /// A connection to `key`, leased until the [`Lease`] is dropped. Cancel-safe: a connect
    /// already started finishes in its own task.
    ///
    /// A panic in the key's `Hash`, `Eq` or `Clone`, or in [`Connector::connect`] or its
    /// future for the connect this lease started, fails it with [`PoolError::Panicked`]; the
    /// endpoint is not left connecting (the next lease connects anew) and other leases are
    /// not affected. Leases waiting for that connect route again.
    ///
    /// # Panics
    ///
    /// If the runtime's [`spawn`](Runtime::spawn) panics when this lease starts a connect
    /// (`throttle_tokio::TokioRuntime` made and used outside a tokio runtime); the endpoint is
    /// not left connecting then either.
    pub async fn lease(
        &self,
        key: &ConnKey<U, H>,
    ) -> Result<Lease<R, C, U, H, S>, PoolError<C::Error>> {
        loop {
            // Read the epoch before routing, so a connect ending in between is not missed.
            let epoch = self.shared.connected.epoch();
            let step = self.shared.update(|st, now| {
                if st.closed {
                    return Step::Err(PoolError::Closed);
                }
                // The key's `Hash`, `Eq` and `Clone` run inside; the table changes nothing
                // before they have, so a panic there fails this lease alone.
                let st = &mut *st;
                let route = match unwind::call(|| st.table.handle_request(now, key, &mut st.rng)) {
                    Ok(route) => route,
                    Err(panicked) => return Step::Err(PoolError::Panicked(panicked)),
                };
                match route {
                    Route::Use(id) => match st.conns.get(&id) {
                        Some(conn) => match st.table.handle_send(now, id) {
                            Ok(()) => {
                                st.leased += 1;
                                Step::Leased(id, Arc::clone(conn))
                            }
                            Err(_) => Step::AwaitConnect, // unreachable: it is live
                        },
                        None => Step::AwaitConnect,
                    },
                    Route::Open(id, _, attempt) => {
                        st.connecting += 1;
                        Step::Connect(id, attempt)
                    }
                    Route::Wait { until } => Step::Err(PoolError::Backoff { until }),
                    _ => Step::Err(PoolError::Exhausted),
                }
            });
            match step {
                Step::Leased(id, conn) => {
                    return Ok(Lease {
                        conn,
                        end: LeaseEnd {
                            id,
                            pool: self.clone(),
                            finish: PoolShared::<R, C, U, H, S>::finish_lease,
                            broken: false,
                        },
                    });
                }
                Step::AwaitConnect => self.shared.connected.changed(epoch).await,
                Step::Connect(id, attempt) => {
                    let (tx, rx) = oneshot::channel();
                    // From here the endpoint's `Connecting` state is the guard's to end.
                    let mut guard = ConnectGuard {
                        pool: self.clone(),
                        id,
                        leaser: Some(tx),
                        finish: PoolShared::<R, C, U, H, S>::finish_connect,
                    };
                    let connect = unwind::call(|| {
                        self.shared.connector.connect(&key.host, key.port, attempt)
                    });
                    match connect {
                        Ok(connect) => {
                            let cut = self.shared.rt.sleep_until(attempt.deadline());
                            self.shared.rt.spawn(async move {
                                let mut guard = guard;
                                let ended = match within(unwind::catch(connect), cut).await {
                                    Some(Ok(Ok(conn))) => ConnectEnd::Connected(conn),
                                    Some(Ok(Err(e))) => ConnectEnd::Failed(e),
                                    Some(Err(Panicked)) => ConnectEnd::Panicked,
                                    None => ConnectEnd::TimedOut(attempt.timeout()),
                                };
                                guard.end(ended);
                            })
                        }
                        Err(Panicked) => guard.end(ConnectEnd::Panicked),
                    }
                    // A connect that succeeded sends nothing: route again, to its connection.
                    if let Ok(error) = rx.await {
                        return Err(error);
                    }
                }
                Step::Err(e) => {
                    return Err(match e {
                        PoolError::Backoff { until } => PoolError::Backoff { until },
                        PoolError::ConnectTimeout { timeout } => {
                            PoolError::ConnectTimeout { timeout }
                        }
                        PoolError::Closed => PoolError::Closed,
                        PoolError::Panicked(p) => PoolError::Panicked(p),
                        _ => PoolError::Exhausted,
                    });
                }
            }
        }
    }

    /// The pool's timer loop: closes idle connections and forgets old backoffs at the table's
    /// deadlines, forever. Spawn it once per pool (drop the task to stop it).
    pub async fn drive_timeouts(&self) {
        let shared = &*self.shared;
        drive_timeouts(&shared.rt, &shared.state, &shared.timer, || {
            shared.update(|st, now| st.table.handle_timeout(now));
        })
        .await;
    }

    /// One page of at most `max` tracked endpoints, each with its connection and stage,
    /// requests in flight, closing time and connect backoff, on the runtime's clock
    /// ([`ConnTable::snapshot`]). Start with `from = None`, then pass each page's `next` until
    /// it is `None`; the lock is held for one page at a time, and every endpoint tracked
    /// throughout the walk is listed exactly once.
    ///
    /// # Panics
    ///
    /// Only if the runtime's `now` or a key's `Clone` panics (under the lock, which changes
    /// nothing); the pool keeps serving.
    pub fn snapshot(&self, from: Option<Cursor>, max: usize) -> Page<EndpointSnapshot<U, H>> {
        let now = self.shared.rt.now();
        lock(&self.shared.state).table.snapshot(now, from, max)
    }

    /// Sends the table's observation events ([`ConnEvent`]: every connection opened,
    /// connected and closed, with why it closed) to `sink`, for every clone, replacing any
    /// sink set before, and turns them on (they are off until then, and cost nothing).
    ///
    /// The sink is called as [`GateHandle::set_event_sink`](super::GateHandle::set_event_sink)
    /// describes: outside the lock, once per event, in order, with a panic caught and counted
    /// ([`event_sink_panics`](Self::event_sink_panics)).
    pub fn set_event_sink(&self, sink: impl EventSink<ConnEvent> + 'static) {
        self.install_sink(Some(std::sync::Arc::new(sink)));
    }

    /// Removes the event sink and turns the table's events off again.
    pub fn clear_event_sink(&self) {
        self.install_sink(None);
    }

    fn install_sink(&self, sink: Option<std::sync::Arc<dyn EventSink<ConnEvent>>>) {
        self.shared.tap.install(
            core::slice::from_ref(&self.shared.state),
            sink,
            |st, capacity| {
                st.table.set_event_capacity(capacity);
            },
        );
    }

    /// Events the sink panicked on (each one lost; nothing else changed).
    pub fn event_sink_panics(&self) -> u64 {
        self.shared.tap.panics()
    }

    /// Events lost before a sink saw them: to the table's bound before the pool drained them,
    /// or delivered just after a [`clear_event_sink`](Self::clear_event_sink).
    pub fn events_dropped(&self) -> u64 {
        let dropped = lock(&self.shared.state).table.events_dropped();
        dropped.saturating_add(self.shared.tap.unseen())
    }

    /// Closes every connection of server `uid` (it left the cluster); returns how many.
    pub fn disconnect(&self, uid: &U) -> usize {
        self.shared.update(|st, now| st.table.disconnect(now, uid))
    }

    /// Refuses later leases and drops the pool's handles to every connection (leased ones stay
    /// open until their leases end). The table forgets every live connection, connecting or
    /// connected ([`ConnTable::close_all`]: a sink sees each as `ConnEvent::Closed` with
    /// [`CloseCause::Shutdown`](crate::conn_key::CloseCause::Shutdown)), so [`len`](Self::len)
    /// is 0 from here on. Idempotent.
    pub fn close(&self) {
        let (conns, counted, drained) = self.shared.update(|st, now| {
            st.closed = true;
            // Every live connection closes, recorded as `Closed { cause: Shutdown }`; the
            // pool's handles to them are taken here, so the `Close` actions find none.
            let _ = st.table.close_all(now);
            let conns = core::mem::take(&mut st.conns);
            let counted = st.taking(!conns.is_empty());
            (conns, counted, st.is_drained())
        });
        self.shared.connected.notify();
        self.shared.drained.notify_if(drained);
        self.shared.drop_taken(conns, counted);
    }

    /// Resolves once the pool is closed and nothing it started is still running: no lease
    /// out and no connect task unreported (so, the pool's handles having gone at the close,
    /// no connection open or connecting). With [`close`](Self::close), a graceful shutdown:
    /// `pool.close(); pool.closed().await`. Cancel-safe.
    pub async fn closed(&self) {
        wait_for(&self.shared.drained, || {
            lock(&self.shared.state).is_drained()
        })
        .await;
    }

    /// Live connections (connecting or connected).
    pub fn len(&self) -> usize {
        lock(&self.shared.state).table.len()
    }

    /// Whether no connection is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The live connection of `key`, if any.
    pub fn connection(&self, key: &ConnKey<U, H>) -> Option<ConnId> {
        lock(&self.shared.state).table.connection(key)
    }

    /// Leases in flight on `conn` (`None` if it is closed).
    pub fn in_flight(&self, conn: ConnId) -> Option<u64> {
        lock(&self.shared.state).table.in_flight(conn)
    }

    /// When `conn` closes for idleness if nothing happens (`None` while leased or closed).
    pub fn idle_deadline(&self, conn: ConnId) -> Option<Instant> {
        lock(&self.shared.state).table.idle_deadline(conn)
    }
}

impl<R, C, U, H, S> PoolShared<R, C, U, H, S>
where
    R: Runtime,
    C: Connector<H>,
    U: Hash + Eq + Clone,
    H: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    /// Runs `input` on the table under the lock, drains its `Close` actions (the connections
    /// are dropped after unlock) and re-arms the timer loop if its deadline moved earlier.
    fn update<T>(&self, input: impl FnOnce(&mut PoolState<U, H, S, C::Conn>, Instant) -> T) -> T {
        let mut closed = Vec::new();
        let mut counted = false;
        let input = |st: &mut PoolState<U, H, S, C::Conn>| input(st, self.rt.now());
        let out = drive(
            &self.state,
            &self.tap,
            &self.timer,
            input,
            |st, action| match action {
                ConnAction::Close(id) => {
                    if let Some(conn) = st.conns.remove(&id) {
                        if !counted {
                            counted = st.taking(true);
                        }
                        closed.push(conn);
                    }
                }
            },
        );
        self.drop_taken(closed, counted);
        out
    }

    /// Drops connection handles taken out of the state under the lock (`counted`: they were
    /// counted in `dropping` by [`PoolState::taking`]), then ends that count, so
    /// [`ConnPool::closed`] resolves only once they are gone.
    fn drop_taken<X>(&self, taken: X, counted: bool) {
        drop(taken);
        if counted {
            let drained = {
                let mut st = lock(&self.state);
                st.dropping = st.dropping.saturating_sub(1);
                st.is_drained()
            };
            self.drained.notify_if(drained);
        }
    }

    /// Reports a connect's end to the table; returns the error for the leaser that opened it.
    fn finish_connect(
        &self,
        id: ConnId,
        ended: ConnectEnd<C::Conn, C::Error>,
    ) -> Option<PoolError<C::Error>> {
        let (failed, stale, counted, drained) = self.update(|st, now| {
            st.connecting = st.connecting.saturating_sub(1);
            let (failed, stale) = match ended {
                ConnectEnd::Connected(conn) => {
                    if !st.closed && st.table.handle_connected(now, id) {
                        st.conns.insert(id, Arc::new(conn));
                        (None, None)
                    } else {
                        // Closed meanwhile (idle, disconnected, pool closed): drop it.
                        (None, Some(conn))
                    }
                }
                ConnectEnd::Failed(e) => {
                    let _ = st.table.handle_connect_failed(now, id);
                    (Some(PoolError::Connect(e)), None)
                }
                // Given up at the attempt's deadline: a failed connect, so it backs off.
                ConnectEnd::TimedOut(timeout) => {
                    let _ = st.table.handle_connect_failed(now, id);
                    (Some(PoolError::ConnectTimeout { timeout }), None)
                }
                // Not the server's fault: no backoff, the next lease connects at once.
                ConnectEnd::Panicked => {
                    st.table.handle_closed(now, id);
                    (Some(PoolError::Panicked(Panicked)), None)
                }
                ConnectEnd::Abandoned => {
                    st.table.handle_closed(now, id);
                    (Some(PoolError::Closed), None)
                }
            };
            let counted = st.taking(stale.is_some());
            (failed, stale, counted, st.is_drained())
        });
        self.connected.notify();
        self.drained.notify_if(drained);
        self.drop_taken(stale, counted);
        failed
    }

    /// A lease's end, as a plain `fn` the lease stores (see `Lease::finish`).
    fn finish_lease(pool: &ConnPool<R, C, U, H, S>, id: ConnId, broken: bool) {
        pool.shared.finish(id, broken);
    }

    fn finish(&self, id: ConnId, broken: bool) {
        let (dropped, counted, drained) = self.update(|st, now| {
            st.leased = st.leased.saturating_sub(1);
            let dropped = if broken {
                st.table.handle_closed(now, id);
                st.conns.remove(&id)
            } else {
                let _ = st.table.handle_finished(now, id);
                None
            };
            let counted = st.taking(dropped.is_some());
            (dropped, counted, st.is_drained())
        });
        self.drained.notify_if(drained);
        self.drop_taken(dropped, counted);
    }
}

/// `work`'s output, or `None` if `cut` resolves first (then `work` is dropped unfinished).
/// `work` is polled first, so a connect that is ready when its deadline also passes counts as
/// done.
async fn within<T>(work: impl Future<Output = T>, cut: impl Future<Output = ()>) -> Option<T> {
    let mut work = core::pin::pin!(work);
    let mut cut = core::pin::pin!(cut);
    core::future::poll_fn(|cx| {
        if let core::task::Poll::Ready(out) = work.as_mut().poll(cx) {
            return core::task::Poll::Ready(Some(out));
        }
        cut.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// How a connect task ended.
enum ConnectEnd<T, E> {
    Connected(T),
    Failed(E),
    /// Still running at the attempt's deadline (its timeout): dropped unfinished.
    TimedOut(core::time::Duration),
    /// `connect()` or its future panicked.
    Panicked,
    /// The task was dropped before the connect ended (the runtime shut down).
    Abandoned,
}

/// A started connect's obligation: report its end to the table exactly once (so the endpoint
/// never stays `Connecting`) and tell the leaser that opened it how it failed. Owned by the
/// connect task from the moment it is built, so `Drop` ends a task that never finished.
struct ConnectGuard<R, C: Connector<H>, U, H, S> {
    pool: ConnPool<R, C, U, H, S>,
    id: ConnId,
    /// `None` once ended.
    leaser: Option<Sender<PoolError<C::Error>>>,
    /// `PoolShared::finish_connect` for this pool's types, taken where their bounds hold (as
    /// [`LeaseEnd`]'s), so neither `end` nor `Drop` needs them.
    finish: ConnectFn<R, C, U, H, S>,
}

type ConnectFn<R, C, U, H, S> = fn(
    &PoolShared<R, C, U, H, S>,
    ConnId,
    ConnectEnd<<C as Connector<H>>::Conn, <C as Connector<H>>::Error>,
) -> Option<PoolError<<C as Connector<H>>::Error>>;

impl<R, C: Connector<H>, U, H, S> ConnectGuard<R, C, U, H, S> {
    fn end(&mut self, ended: ConnectEnd<C::Conn, C::Error>) {
        let Some(leaser) = self.leaser.take() else {
            return;
        };
        if let Some(error) = (self.finish)(&self.pool.shared, self.id, ended) {
            leaser.send(error);
        }
    }
}

impl<R, C: Connector<H>, U, H, S> Drop for ConnectGuard<R, C, U, H, S> {
    fn drop(&mut self) {
        let ended = if std::thread::panicking() {
            ConnectEnd::Panicked
        } else {
            ConnectEnd::Abandoned
        };
        self.end(ended);
    }
}

impl<U, H, S, T> Observed for PoolState<U, H, S, T>
where
    U: Hash + Eq + Clone,
    H: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    type Event = ConnEvent;

    fn poll_event(&mut self) -> Option<ConnEvent> {
        self.table.poll_event()
    }

    fn has_events(&self) -> bool {
        self.table.has_events()
    }
}

impl<U, H, S, T> Timed for PoolState<U, H, S, T>
where
    U: Hash + Eq + Clone,
    H: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    type Action = ConnAction;

    fn poll_timeout(&self) -> Option<Instant> {
        self.table.poll_timeout()
    }

    fn poll_action(&mut self) -> Option<ConnAction> {
        self.table.poll_action()
    }
}

/// One request's use of a pooled connection: derefs to the connection; counts as in flight
/// until dropped. `Send` (and `Sync`) for `Send + Sync` connections; not `Clone`.
///
/// ```
#[doc = include_str!("../doc/tiny_runtime.md")]
/// use throttle_sansio::conn_key::{ConnConfig, ConnKey, ConnectAttempt};
/// use throttle_sansio::sync::{ConnPool, Connector};
///
/// struct Dialer;
///
/// impl Connector<&'static str> for Dialer {
///     type Conn = String;
///     type Error = std::io::Error;
///
///     fn connect(
///         &self,
///         host: &&'static str,
///         port: u16,
///         _attempt: ConnectAttempt,
///     ) -> impl Future<Output = Result<String, std::io::Error>> + Send + 'static {
///         core::future::ready(Ok(format!("{host}:{port}")))
///     }
/// }
///
/// let rt = Tiny::default();
/// let pool: ConnPool<_, _, u32, &str> =
///     ConnPool::new(rt.clone(), Dialer, ConnConfig::default()).unwrap();
/// let key = ConnKey::new(7, "db-1", 9000);
/// let lease = rt.block_on(pool.lease(&key)).unwrap();
/// let conn = lease.id();
/// assert_eq!(pool.in_flight(conn), Some(1), "one request in flight on it");
/// drop(lease);
/// assert_eq!(pool.in_flight(conn), Some(0), "idle: it closes after max_idle");
/// let lease = rt.block_on(pool.lease(&key)).unwrap();
/// lease.broken(); // an I/O error on it: the pool forgets it
/// assert_eq!((pool.in_flight(conn), pool.len()), (None, 0));
/// ```
#[must_use = "a lease holds its connection busy until dropped"]
pub struct Lease<R, C: Connector<H>, U, H, S = std::hash::RandomState> {
    /// Declared before `end`, so it is dropped first: the lease's handle to the connection is
    /// gone before the pool hears the lease ended (and `closed()` may resolve).
    conn: Arc<C::Conn>,
    end: LeaseEnd<R, C, U, H, S>,
}

/// A lease's obligation: tell the pool it ended, exactly once, when dropped.
struct LeaseEnd<R, C: Connector<H>, U, H, S> {
    id: ConnId,
    pool: ConnPool<R, C, U, H, S>,
    /// `PoolShared::finish` for this pool's types, taken where their bounds hold, so `Drop`
    /// needs none.
    finish: FinishFn<R, C, U, H, S>,
    broken: bool,
}

impl<R, C: Connector<H>, U, H, S> Drop for LeaseEnd<R, C, U, H, S> {
    fn drop(&mut self) {
        (self.finish)(&self.pool, self.id, self.broken);
    }
}

type FinishFn<R, C, U, H, S> = fn(&ConnPool<R, C, U, H, S>, ConnId, bool);

impl<R, C: Connector<H>, U, H, S> Lease<R, C, U, H, S> {
    /// The connection's id in the pool's table.
    pub fn id(&self) -> ConnId {
        self.end.id
    }

    /// Reports the connection dead (an I/O error): the pool forgets it, and the next lease of
    /// its endpoint reconnects at once.
    pub fn broken(mut self) {
        self.end.broken = true;
    }
}

impl<R, C: Connector<H>, U, H, S> Deref for Lease<R, C, U, H, S> {
    type Target = C::Conn;
    fn deref(&self) -> &C::Conn {
        &self.conn
    }
}

impl<R, C: Connector<H>, U, H, S> fmt::Debug for Lease<R, C, U, H, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.end.id)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::test_support::{
        CONNECT_PANICS, Executor, FUTURE_PANICS, FakeConnector as Fake, NEVER, TestRuntime,
    };
    use core::time::Duration;
    use std::hash::RandomState;
    use std::sync::Mutex as StdMutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    type Pool<U = u32> = ConnPool<TestRuntime, Fake, U, u32, RandomState>;

    fn pool(exec: &Executor) -> (Pool, TestRuntime, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (pool, rt, connects, live, _) = hostile_pool(exec);
        (pool, rt, connects, live)
    }

    type Counter = Arc<AtomicUsize>;

    /// A pool over `Fake`, with its counters and its `hostile` switch.
    fn hostile_pool<U>(exec: &Executor) -> (Pool<U>, TestRuntime, Counter, Counter, Counter)
    where
        U: Hash + Eq + Clone + Send + Sync + 'static,
    {
        let mut rt = TestRuntime::new();
        rt.spawner = Some(exec.spawner());
        let fake = Fake::default();
        let (connects, live) = (Arc::clone(&fake.connects), Arc::clone(&fake.live));
        let hostile = Arc::clone(&fake.hostile);
        let cfg = ConnConfig::default().with_max_idle(Duration::from_secs(10));
        let pool = ConnPool::new(rt.clone(), fake, cfg).unwrap();
        (pool, rt, connects, live, hostile)
    }

    #[test]
    fn the_sink_sees_each_connection_open_connect_and_close_with_its_cause() {
        use crate::conn_key::CloseCause;
        let mut exec = Executor::default();
        let (pool, rt, _, _) = pool(&exec);
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let (log, probe) = (Arc::clone(&seen), pool.clone());
        pool.set_event_sink(move |e: &ConnEvent| {
            // Reading the pool here would deadlock if the sink ran under its lock.
            let _ = probe.len();
            log.lock().unwrap().push(*e);
        });
        let (good, refused) = (ConnKey::new(0, 10_001, 9123), ConnKey::new(1, 10_002, 0));
        let p = pool.clone();
        exec.spawn(async move {
            drop(p.lease(&good).await.unwrap());
            assert!(matches!(
                p.lease(&refused).await,
                Err(PoolError::Connect(_))
            ));
        });
        let p = pool.clone();
        exec.spawn(async move { p.drive_timeouts().await });
        exec.run_until_stalled();
        rt.clock.advance(Duration::from_secs(10));
        exec.run_until_stalled();
        let got = seen.lock().unwrap().clone();
        let shape: Vec<_> = got
            .iter()
            .map(|e| match e {
                ConnEvent::Opened { conn } => ("opened", conn.seq(), None),
                ConnEvent::Connected { conn } => ("connected", conn.seq(), None),
                ConnEvent::Closed { conn, cause } => ("closed", conn.seq(), Some(*cause)),
            })
            .collect();
        let (a, b) = (shape[0].1, shape[2].1);
        assert_eq!(
            shape,
            [
                ("opened", a, None),
                ("connected", a, None),
                ("opened", b, None),
                ("closed", b, Some(CloseCause::ConnectFailed)),
                ("closed", a, Some(CloseCause::Idle)),
            ]
        );
        assert_eq!((pool.events_dropped(), pool.event_sink_panics()), (0, 0));
        // The snapshot: the idle endpoint is gone, the refused one is tracked in backoff.
        let page = pool.snapshot(None, 8);
        let listed: Vec<_> = page
            .items
            .iter()
            .map(|e| (e.key.uid, e.conn, e.connect_failures))
            .collect();
        assert_eq!((listed, page.next), (alloc::vec![(1, None, 1)], None));
        pool.clear_event_sink();
        pool.disconnect(&0);
        assert_eq!(seen.lock().unwrap().len(), 5, "cleared: nothing more");
    }

    #[test]
    fn close_records_a_shutdown_close_for_each_live_connection_and_empties_the_table() {
        use crate::conn_key::CloseCause;
        let mut exec = Executor::default();
        let (pool, _rt, _, live) = pool(&exec);
        let (a, b) = (ConnKey::new(0, 10_001, 9123), ConnKey::new(1, 10_002, 9123));
        let held = Arc::new(StdMutex::new(None));
        let (p, h) = (pool.clone(), Arc::clone(&held));
        exec.spawn(async move {
            drop(p.lease(&a).await.unwrap());
            *h.lock().unwrap() = Some(p.lease(&b).await.unwrap());
        });
        exec.run_until_stalled();
        let (ida, idb) = (pool.connection(&a).unwrap(), pool.connection(&b).unwrap());
        assert_eq!((pool.len(), live.load(Ordering::SeqCst)), (2, 2));
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        pool.set_event_sink(move |e: &ConnEvent| log.lock().unwrap().push(*e));
        pool.close();
        let mut got = seen.lock().unwrap().clone();
        got.sort_by_key(|e| match e {
            ConnEvent::Closed { conn, .. } => conn.seq(),
            _ => u64::MAX,
        });
        let shutdown = |conn| ConnEvent::Closed {
            conn,
            cause: CloseCause::Shutdown,
        };
        let mut want = alloc::vec![shutdown(ida), shutdown(idb)];
        want.sort_by_key(|e| match e {
            ConnEvent::Closed { conn, .. } => conn.seq(),
            _ => u64::MAX,
        });
        assert_eq!(got, want);
        // The table forgot both; the leased connection stays open until its lease ends.
        assert_eq!((pool.len(), pool.connection(&b)), (0, None));
        assert_eq!(live.load(Ordering::SeqCst), 1);
        drop(held.lock().unwrap().take());
        assert_eq!(live.load(Ordering::SeqCst), 0);
        // Idempotent: nothing more is recorded.
        pool.close();
        assert_eq!(seen.lock().unwrap().len(), 2);
        assert_eq!(pool.events_dropped(), 0);
    }

    #[test]
    fn concurrent_leases_of_one_endpoint_share_one_connect_and_idle_close_after_max_idle() {
        let mut exec = Executor::default();
        let (pool, rt, connects, live) = pool(&exec);
        let key = ConnKey::new(0, 10_001, 9123);
        let ids = Arc::new(StdMutex::new(Vec::new()));
        for _ in 0..3 {
            let (p, ids) = (pool.clone(), Arc::clone(&ids));
            exec.spawn(async move {
                let lease = p.lease(&key).await.unwrap();
                ids.lock().unwrap().push(lease.id());
            });
        }
        let p = pool.clone();
        exec.spawn(async move { p.drive_timeouts().await });
        assert_eq!(exec.run_until_stalled(), 1, "only the timer loop is left");
        assert_eq!(connects.load(Ordering::SeqCst), 1);
        let ids = ids.lock().unwrap().clone();
        assert!(ids.len() == 3 && ids.iter().all(|id| *id == ids[0]));
        assert_eq!((pool.len(), live.load(Ordering::SeqCst)), (1, 1));
        rt.clock.advance(Duration::from_millis(9_999));
        exec.run_until_stalled();
        assert_eq!(pool.len(), 1, "1 ms before max_idle: still open");
        rt.clock.advance(Duration::from_millis(1));
        exec.run_until_stalled();
        assert_eq!(
            (pool.len(), live.load(Ordering::SeqCst)),
            (0, 0),
            "closed and dropped"
        );
    }

    #[test]
    fn closed_resolves_only_once_closed_and_the_last_lease_is_dropped() {
        use crate::sync::test_support::{CountingWaker, poll_once};
        let mut exec = Executor::default();
        let (pool, _rt, _, live) = pool(&exec);
        let held = Arc::new(StdMutex::new(Vec::new()));
        for port in [9123, 9124] {
            let (p, held) = (pool.clone(), Arc::clone(&held));
            exec.spawn(async move {
                let lease = p.lease(&ConnKey::new(0, 10_001, port)).await.unwrap();
                held.lock().unwrap().push(lease);
            });
        }
        assert_eq!(exec.run_until_stalled(), 0);
        assert_eq!(live.load(Ordering::SeqCst), 2);
        let (w, wakes) = CountingWaker::new();
        let mut closed = alloc::boxed::Box::pin(pool.closed());
        assert!(poll_once(&mut closed, &w).is_pending(), "not closed yet");
        pool.close();
        assert!(poll_once(&mut closed, &w).is_pending(), "two leases out");
        let last = held.lock().unwrap().pop();
        held.lock().unwrap().clear();
        assert!(poll_once(&mut closed, &w).is_pending(), "one lease out");
        assert_eq!(live.load(Ordering::SeqCst), 1, "its connection still open");
        let before = wakes.wakes();
        drop(last);
        assert!(
            wakes.wakes() > before,
            "the last lease's end wakes the waiter"
        );
        assert!(poll_once(&mut closed, &w).is_ready());
        assert_eq!(live.load(Ordering::SeqCst), 0, "every connection dropped");
    }

    #[test]
    fn a_held_lease_keeps_its_connection_open_past_max_idle() {
        let mut exec = Executor::default();
        let (pool, rt, _, live) = pool(&exec);
        let key = ConnKey::new(0, 1, 1);
        let held = Arc::new(StdMutex::new(None));
        let (p, h) = (pool.clone(), Arc::clone(&held));
        exec.spawn(async move { *h.lock().unwrap() = Some(p.lease(&key).await.unwrap()) });
        let p = pool.clone();
        exec.spawn(async move { p.drive_timeouts().await });
        exec.run_until_stalled();
        rt.clock.advance(Duration::from_secs(60));
        exec.run_until_stalled();
        assert_eq!(live.load(Ordering::SeqCst), 1);
        let lease = held.lock().unwrap().take().unwrap();
        assert_eq!(pool.idle_deadline(lease.id()), None);
        drop(lease);
        assert_eq!(
            pool.idle_deadline(pool.connection(&key).unwrap()),
            Some(Instant::from_millis(70_000))
        );
        rt.clock.advance(Duration::from_secs(10));
        exec.run_until_stalled();
        assert_eq!((pool.len(), live.load(Ordering::SeqCst)), (0, 0));
    }

    #[test]
    fn a_failed_connect_fails_its_leaser_and_refuses_the_endpoint_until_the_backoff_ends() {
        let mut exec = Executor::default();
        let (pool, rt, connects, _) = pool(&exec);
        pool.reseed(7);
        let key = ConnKey::new(1, 1, 0);
        let out = Arc::new(StdMutex::new(Vec::new()));
        let (p, o) = (pool.clone(), Arc::clone(&out));
        exec.spawn(async move {
            let first = p.lease(&key).await.map(|l| l.id());
            let second = p.lease(&key).await.map(|l| l.id());
            o.lock().unwrap().extend([first, second]);
        });
        exec.run_until_stalled();
        let out = out.lock().unwrap().clone();
        assert_eq!(out[0], Err(PoolError::Connect("refused")));
        let Err(PoolError::Backoff { until }) = out[1] else {
            panic!("{:?}", out[1])
        };
        // gRPC connection backoff: first delay 1 s ± 20 %.
        assert!(until >= Instant::from_millis(800) && until <= Instant::from_millis(1_200));
        assert_eq!(
            connects.load(Ordering::SeqCst),
            1,
            "no connect during the backoff"
        );
        rt.clock.advance_to(until);
        let (p, o2) = (pool.clone(), Arc::new(StdMutex::new(None)));
        let o = Arc::clone(&o2);
        exec.spawn(async move { *o.lock().unwrap() = Some(p.lease(&key).await.map(|l| l.id())) });
        exec.run_until_stalled();
        assert_eq!(
            connects.load(Ordering::SeqCst),
            2,
            "reconnects once the backoff ended"
        );
    }

    type Leased<U> = Arc<
        StdMutex<
            Vec<Result<Lease<TestRuntime, Fake, U, u32, RandomState>, PoolError<&'static str>>>,
        >,
    >;

    /// Spawns a task that leases `key` and keeps the outcome (the lease too) in `out`.
    fn spawn_lease<U>(exec: &Executor, pool: &Pool<U>, key: ConnKey<U, u32>, out: &Leased<U>)
    where
        U: Hash + Eq + Clone + Send + Sync + 'static,
    {
        let (p, o) = (pool.clone(), Arc::clone(out));
        exec.spawn(async move {
            let r = p.lease(&key).await;
            o.lock().unwrap().push(r);
        });
    }

    /// The pool's books agree with its table: every stored connection is `Connected`, every
    /// live entry is stored or has its connect task running, and the leases out are the
    /// requests in flight.
    fn assert_books<U>(pool: &Pool<U>, leased: usize)
    where
        U: Hash + Eq + Clone + Send + Sync + 'static,
    {
        let st = lock(&pool.shared.state);
        for id in st.conns.keys() {
            assert_eq!(
                st.table.state(*id),
                Some(crate::conn_key::ConnState::Connected)
            );
        }
        assert_eq!(st.table.len(), st.conns.len() + st.connecting);
        let in_flight: u64 = st
            .conns
            .keys()
            .filter_map(|id| st.table.in_flight(*id))
            .sum();
        assert_eq!((st.leased, in_flight), (leased, leased as u64));
    }

    #[test]
    fn a_connect_that_panics_fails_its_leaser_and_the_next_lease_connects_anew() {
        for (hostile_at, what) in [(CONNECT_PANICS, "connect()"), (FUTURE_PANICS, "its future")] {
            let mut exec = Executor::default();
            let (pool, _rt, connects, live, hostile) = hostile_pool::<u32>(&exec);
            let key = ConnKey::new(0, 10_001, 9123);
            let out: Leased<u32> = Arc::default();
            hostile.store(hostile_at, Ordering::SeqCst);
            spawn_lease(&exec, &pool, key, &out);
            spawn_lease(&exec, &pool, key, &out); // waits for the first one's connect
            assert_eq!(exec.run_until_stalled(), 0, "{what}: no lease left waiting");
            let got = core::mem::take(&mut *out.lock().unwrap());
            assert!(
                matches!(got[0], Err(PoolError::Panicked(Panicked))),
                "{what}: the opener fails with Panicked"
            );
            assert!(
                got[1].is_ok(),
                "{what}: the waiter routed again and connected"
            );
            assert_eq!(
                connects.load(Ordering::SeqCst),
                2,
                "{what}: a new connect, no backoff"
            );
            assert_eq!((pool.len(), live.load(Ordering::SeqCst)), (1, 1));
            assert_books(&pool, 1);
            drop(got);
            assert_books(&pool, 0);
            // Later leases reuse the connection.
            spawn_lease(&exec, &pool, key, &out);
            assert_eq!(exec.run_until_stalled(), 0);
            assert!(out.lock().unwrap()[0].is_ok());
            assert_eq!(connects.load(Ordering::SeqCst), 2, "{what}");
        }
    }

    #[test]
    fn a_connect_task_dropped_unfinished_leaves_nothing_connecting() {
        let mut exec = Executor::default();
        let (pool, _rt, _, _, hostile) = hostile_pool::<u32>(&exec);
        let key = ConnKey::new(0, 10_001, 9123);
        let (w, _) = crate::sync::test_support::CountingWaker::new();
        hostile.store(NEVER, Ordering::SeqCst);
        let mut lease = alloc::boxed::Box::pin(pool.lease(&key));
        assert!(crate::sync::test_support::poll_once(&mut lease, &w).is_pending());
        assert_eq!(exec.run_until_stalled(), 1, "the connect task waits");
        assert_eq!(pool.len(), 1, "connecting");
        drop(exec); // the runtime shuts down: the connect task is dropped unfinished
        assert_eq!(pool.len(), 0, "not left connecting");
        assert!(matches!(
            crate::sync::test_support::poll_once(&mut lease, &w),
            core::task::Poll::Ready(Err(PoolError::Closed))
        ));
        assert_books(&pool, 0);
    }

    use crate::test_key::{Touchy, arm_budget as arm};

    fn uid(id: u32, touchy: bool, eq_touchy: bool) -> Touchy {
        Touchy {
            id,
            touchy,
            eq_touchy,
        }
    }

    fn touchy(id: u32, port: u16) -> ConnKey<Touchy, u32> {
        ConnKey::new(uid(id, true, true), 10_001, port)
    }

    fn plain(id: u32, port: u16) -> ConnKey<Touchy, u32> {
        ConnKey::new(uid(id, false, false), 10_001, port)
    }

    #[test]
    fn a_key_whose_hash_eq_or_clone_panics_fails_that_lease_and_strands_nothing() {
        // Every budget from "the first call panics" to "none does": each user-code point of
        // routing a new key (beside a neighbour with the same uid) panics once.
        for budget in 0..16 {
            let mut exec = Executor::default();
            let (pool, rt, connects, _, _) = hostile_pool::<Touchy>(&exec);
            let out: Leased<Touchy> = Arc::default();
            spawn_lease(&exec, &pool, plain(1, 1), &out);
            exec.run_until_stalled();
            let key = touchy(1, 2);
            let moved = key.clone();
            arm(Some(budget));
            spawn_lease(&exec, &pool, moved, &out);
            exec.run_until_stalled();
            arm(None);
            let first = out.lock().unwrap().pop().unwrap();
            let panicked = matches!(first, Err(PoolError::Panicked(Panicked)));
            assert!(
                panicked || first.is_ok(),
                "budget {budget}: {:?}",
                first.err()
            );
            assert_books(&pool, 1 + usize::from(!panicked));
            // The same key again, and its neighbour: both served.
            spawn_lease(&exec, &pool, key.clone(), &out);
            spawn_lease(&exec, &pool, plain(1, 1), &out);
            assert_eq!(
                exec.run_until_stalled(),
                0,
                "budget {budget}: nothing hangs"
            );
            assert!(
                out.lock().unwrap().iter().all(Result::is_ok),
                "budget {budget}"
            );
            assert_eq!(
                connects.load(Ordering::SeqCst),
                2,
                "budget {budget}: one per endpoint"
            );
            assert_eq!(pool.disconnect(&uid(1, false, false)), 2, "budget {budget}");
            drop(first);
            out.lock().unwrap().clear();
            assert_books(&pool, 0);
            rt.clock.advance(Duration::from_secs(60));
            pool.shared.update(|st, now| st.table.handle_timeout(now));
            let st = lock(&pool.shared.state);
            assert_eq!(
                (st.table.len(), st.table.tracked_endpoints()),
                (0, 0),
                "budget {budget}"
            );
        }
    }

    #[test]
    fn growing_the_table_never_runs_a_stored_key_s_hash() {
        let mut exec = Executor::default();
        let (pool, _rt, _, _, _) = hostile_pool::<Touchy>(&exec);
        let out: Leased<Touchy> = Arc::default();
        // Its `Eq` never panics: a lookup may compare any stored key whose hash bits collide.
        spawn_lease(
            &exec,
            &pool,
            ConnKey::new(uid(0, true, false), 10_001, 1),
            &out,
        );
        exec.run_until_stalled();
        arm(Some(0));
        for id in 1..200 {
            spawn_lease(&exec, &pool, plain(id, 1), &out);
        }
        exec.run_until_stalled();
        arm(None);
        assert_eq!(out.lock().unwrap().len(), 200);
        assert!(out.lock().unwrap().iter().all(Result::is_ok));
        assert_books(&pool, 200);
    }

    #[test]
    fn a_panic_under_the_lock_is_recovered_and_the_pool_keeps_serving() {
        let mut exec = Executor::default();
        let (pool, _rt, _, _, _) = hostile_pool::<Touchy>(&exec);
        let out: Leased<Touchy> = Arc::default();
        spawn_lease(&exec, &pool, touchy(1, 1), &out);
        exec.run_until_stalled();
        arm(Some(0));
        // Queries and `disconnect` run the key's code under the lock and let its panic through.
        let key = touchy(1, 1);
        let query =
            std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| pool.connection(&key)));
        let gone = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
            pool.disconnect(&uid(1, true, true))
        }));
        arm(None);
        assert!(query.is_err() && gone.is_err());
        assert!(pool.shared.state.is_poisoned());
        assert_eq!(pool.len(), 1, "nothing changed");
        assert!(pool.connection(&key).is_some());
        spawn_lease(&exec, &pool, key, &out);
        spawn_lease(&exec, &pool, plain(2, 1), &out);
        assert_eq!(exec.run_until_stalled(), 0);
        assert!(out.lock().unwrap().iter().all(Result::is_ok));
        assert_books(&pool, 3);
    }

    // ------------------------------------------------------------ connect timeouts

    /// Each connect takes `fail_after` on the runtime's clock and then fails (`None`: it
    /// never ends); records the attempt it was given and counts its futures dropped.
    struct Timed {
        clock: crate::sync::ManualClock,
        attempts: Arc<StdMutex<Vec<ConnectAttempt>>>,
        fail_after: Option<Duration>,
        dropped: Arc<AtomicUsize>,
    }

    struct CountDrop(Arc<AtomicUsize>);
    impl Drop for CountDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Connector<u32> for Timed {
        type Conn = ();
        type Error = &'static str;
        fn connect(
            &self,
            _host: &u32,
            _port: u16,
            attempt: ConnectAttempt,
        ) -> impl Future<Output = Result<(), &'static str>> + Send + 'static {
            self.attempts.lock().unwrap().push(attempt);
            let (clock, fail_after) = (self.clock.clone(), self.fail_after);
            let dropped = CountDrop(Arc::clone(&self.dropped));
            async move {
                let _dropped = dropped;
                match fail_after {
                    Some(d) => {
                        let at = clock.now() + d;
                        clock.sleep_until(at).await;
                        Err("refused")
                    }
                    None => core::future::pending().await,
                }
            }
        }
    }

    type TimedPool = ConnPool<TestRuntime, Timed, u32, u32, RandomState>;
    type Attempts = Arc<StdMutex<Vec<ConnectAttempt>>>;

    /// A pool over `Timed` with gRPC's connection-backoff numbers without jitter
    /// (`doc/connection-backoff.md`, "Proposed Backoff Algorithm": 1 s, ×1.6, 120 s,
    /// MIN_CONNECT_TIMEOUT 20 s), its attempts and its count of dropped connect futures.
    fn timed_pool(
        exec: &Executor,
        fail_after: Option<Duration>,
    ) -> (TimedPool, TestRuntime, Attempts, Counter) {
        let mut rt = TestRuntime::new();
        rt.spawner = Some(exec.spawner());
        let attempts: Attempts = Arc::default();
        let dropped = Arc::new(AtomicUsize::new(0));
        let connector = Timed {
            clock: rt.clock.clone(),
            attempts: Arc::clone(&attempts),
            fail_after,
            dropped: Arc::clone(&dropped),
        };
        let backoff = crate::backoff::BackoffConfig::builder()
            .initial(Duration::from_secs(1))
            .max(Duration::from_secs(120))
            .multiplier(16, 10)
            .jitter(crate::backoff::Jitter::None)
            .build()
            .unwrap();
        let cfg = ConnConfig::default().with_connect_backoff(backoff);
        let pool = ConnPool::new(rt.clone(), connector, cfg).unwrap();
        (pool, rt, attempts, dropped)
    }

    type TimedOut = Arc<StdMutex<Vec<Result<ConnId, PoolError<&'static str>>>>>;

    fn spawn_timed_lease(exec: &Executor, pool: &TimedPool, out: &TimedOut) {
        let (p, o) = (pool.clone(), Arc::clone(out));
        exec.spawn(async move {
            let r = p.lease(&ConnKey::new(0, 1, 9123)).await.map(|l| l.id());
            o.lock().unwrap().push(r);
        });
    }

    /// The transport is told each attempt's timeout (`max(MIN_CONNECT_TIMEOUT, backoff)`,
    /// 20 s here), and a connect that hangs is cut at it: its future is dropped, its leaser
    /// fails with `ConnectTimeout`, the endpoint backs off as after a failed connect, and a
    /// leaser waiting on the same connect is not stranded: the 20 s connect outlasted its 1 s
    /// backoff, so it connects again at once (the document's `SleepUntil` on a past deadline).
    #[test]
    fn the_transport_gets_the_connect_timeout_and_a_hung_connect_is_cut_at_it() {
        let mut exec = Executor::default();
        let (pool, rt, attempts, dropped) = timed_pool(&exec, None);
        rt.clock.advance_to(Instant::from_millis(5_000));
        let out: TimedOut = Arc::default();
        spawn_timed_lease(&exec, &pool, &out);
        spawn_timed_lease(&exec, &pool, &out); // waits for the first one's connect
        assert_eq!(
            exec.run_until_stalled(),
            3,
            "two leasers and the connect task"
        );
        let first = attempts.lock().unwrap()[0];
        assert_eq!(
            first,
            ConnectAttempt::new(Instant::from_millis(5_000), Duration::from_secs(20))
        );
        assert_eq!(first.deadline(), Instant::from_millis(25_000));
        rt.clock.advance_to(Instant::from_millis(24_999));
        exec.run_until_stalled();
        assert!(out.lock().unwrap().is_empty(), "1 ms before the deadline");
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        rt.clock.advance_to(Instant::from_millis(25_000));
        assert_eq!(
            exec.run_until_stalled(),
            2,
            "the second leaser and its own connect, which hangs too"
        );
        assert_eq!(
            out.lock().unwrap()[..],
            [Err(PoolError::ConnectTimeout {
                timeout: Duration::from_secs(20)
            })]
        );
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "the hung connect was dropped"
        );
        let st = lock(&pool.shared.state);
        let key = ConnKey::new(0, 1, 9123);
        assert_eq!(st.table.connect_failures(&key), 1, "a failed connect");
        assert_eq!(st.connecting, 1, "the waiter's own connect");
        drop(st);
        // The waiter connected again at once; its attempt's backoff is the second (1.6 s),
        // its timeout still 20 s.
        let second = attempts.lock().unwrap()[1];
        assert_eq!(
            second,
            ConnectAttempt::new(Instant::from_millis(25_000), Duration::from_secs(20))
        );
        assert_eq!(pool.len(), 1);
        rt.clock.advance_to(Instant::from_millis(45_000));
        assert_eq!(exec.run_until_stalled(), 0);
        assert_eq!(out.lock().unwrap().len(), 2);
        assert_eq!((pool.len(), dropped.load(Ordering::SeqCst)), (0, 2));
        assert_eq!(lock(&pool.shared.state).connecting, 0);
    }

    /// `doc/connection-backoff.md`, "Proposed Backoff Algorithm", through the pool: a
    /// connect that starts at 5 s and fails 300 ms in, with a 1 s backoff, may be retried at
    /// 6 s (the attempt's start plus its backoff), not at 6.3 s.
    #[test]
    fn a_connect_failing_300_ms_in_is_retried_at_its_start_plus_the_backoff() {
        let mut exec = Executor::default();
        let (pool, rt, attempts, _) = timed_pool(&exec, Some(Duration::from_millis(300)));
        rt.clock.advance_to(Instant::from_millis(5_000));
        let out: TimedOut = Arc::default();
        spawn_timed_lease(&exec, &pool, &out);
        exec.run_until_stalled();
        rt.clock.advance_to(Instant::from_millis(5_300));
        exec.run_until_stalled();
        assert_eq!(
            out.lock().unwrap()[..],
            [Err(PoolError::Connect("refused"))]
        );
        spawn_timed_lease(&exec, &pool, &out);
        exec.run_until_stalled();
        assert_eq!(
            out.lock().unwrap()[1],
            Err(PoolError::Backoff {
                until: Instant::from_millis(6_000)
            })
        );
        rt.clock.advance_to(Instant::from_millis(6_000));
        spawn_timed_lease(&exec, &pool, &out);
        exec.run_until_stalled();
        assert_eq!(attempts.lock().unwrap().len(), 2, "reconnected at 6 s");
        assert_eq!(
            attempts.lock().unwrap()[1].started(),
            Instant::from_millis(6_000)
        );
    }
}
