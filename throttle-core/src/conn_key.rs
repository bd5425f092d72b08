//! Connection table: physical connections keyed by `(server uid, host, port)`.
//!
//! A client keeps one connection per server endpoint. Keying by the uid alone breaks when a
//! server uid moves (a coordinator failover reuses `cs-0` at a new address): requests keep
//! reaching the old, still-alive standby. Keying by the whole endpoint fixes that, and it
//! means requests routed by old and by new metadata each use their own connection instead of
//! replacing each other's.
//!
//! [`ConnTable`] decides which connection a request uses ([`ConnTable::handle_request`]), counts the
//! requests in flight on each, closes connections that stay idle for `max_idle`, and gates
//! reconnects to a key behind the gRPC connection backoff after a *failed* connect, following
//! gRPC's connection-backoff protocol: each attempt's backoff counts from the attempt's start
//! (or, optionally, from the failure), and each attempt is given
//! `max(min_connect_timeout, its backoff)` to connect ([`ConnectAttempt`]).
//!
//! # Driving contract
//!
//! - **Inputs** (mutate, take `now`): [`handle_request`](ConnTable::handle_request) (may open a connection),
//!   [`handle_connected`](ConnTable::handle_connected),
//!   [`handle_connect_failed`](ConnTable::handle_connect_failed),
//!   [`handle_send`](ConnTable::handle_send), [`handle_finished`](ConnTable::handle_finished),
//!   [`handle_closed`](ConnTable::handle_closed), [`disconnect`](ConnTable::disconnect),
//!   [`handle_timeout`](ConnTable::handle_timeout).
//! - **Pollers**: [`poll_action`](ConnTable::poll_action) (drain until `None` after every
//!   input: each [`ConnAction::Close`] asks the transport to close that connection) and
//!   [`poll_timeout`](ConnTable::poll_timeout) (call `handle_timeout` at or after it);
//!   [`poll_event`](ConnTable::poll_event) drains observations ([`ConnEvent`]) once
//!   [`set_event_capacity`](ConnTable::set_event_capacity) turned them on.
//! - **Queries** (`&self`): [`connection`](ConnTable::connection),
//!   [`state`](ConnTable::state), [`in_flight`](ConnTable::in_flight), …
//!
//! Per request: `handle_request` → on `Open(id, key, attempt)` start connecting `key`, give
//! the connect up at `attempt.deadline()`, and report `handle_connected` or
//! `handle_connect_failed` (a connect given up is a failed one); on `Use(id)` or `Open(id, ..)` call
//! `handle_send(id)` when the request is written (an `Err(Disconnected)` means route again)
//! and `handle_finished(id)` when its response arrives or it is abandoned; on
//! `Wait { until }` call `handle_request` again at `until`. Report every close the transport sees with
//! `handle_closed`.
//!
//! See `docs/conn-key.md` for the state diagram and the invariants.

use alloc::collections::{BinaryHeap, VecDeque};
use alloc::vec::Vec;
use core::cmp::Reverse;
use core::fmt;
use core::hash::{BuildHasher, Hash};
use core::time::Duration;

use hashbrown::HashTable;
use smallvec::SmallVec;

use crate::backoff::{Backoff, BackoffConfig};
use crate::error::ConfigError;
use crate::event::EventQueue;
use crate::rng::Rng;
use crate::slab::IdSpace;
use crate::snapshot::{Cursor, Page};
use crate::time::{Clock, Instant};

/// One server endpoint: the server's uid and the address it was announced at.
///
/// The uid is generic (`U: Hash + Eq + Clone`): Fluss uses strings such as `cs-0`, other
/// clients use integers. The host is generic too (a name, an `IpAddr`, an interned id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnKey<U, H> {
    /// The server's identity, stable across address changes.
    pub uid: U,
    /// The host the server is reachable at.
    pub host: H,
    /// The port the server is reachable at.
    pub port: u16,
}

impl<U, H> ConnKey<U, H> {
    /// The endpoint `uid` at `host:port`.
    pub const fn new(uid: U, host: H, port: u16) -> Self {
        ConnKey { uid, host, port }
    }
}

/// A connection's identity; never reused by the table that issued it.
///
/// It carries a sequence number (unique per table, never reused), the table's internal slot,
/// so every lookup is O(1) without hashing, and the issuing table's instance tag. An id from
/// another table, a closed connection or [`ConnId::from_bits`] of arbitrary bits is unknown to
/// this table: every method treats it as closed and changes nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    seq: u64,
    slot: u32,
    tag: u32,
}

impl ConnId {
    /// The id's sequence number: ids are issued in increasing order, starting at 1
    /// (so `from_bits(0)` is never a live id).
    pub const fn seq(self) -> u64 {
        self.seq
    }

    /// The id as 128 bits (tag, sequence number, slot), for adapters that store it compactly.
    pub const fn to_bits(self) -> u128 {
        ((self.tag as u128) << 96) | ((self.seq as u128) << 32) | self.slot as u128
    }

    /// The id with these bits. Arbitrary bits give an id the table does not know, which every
    /// method treats as closed.
    pub const fn from_bits(bits: u128) -> Self {
        ConnId {
            seq: (bits >> 32) as u64,
            slot: bits as u32,
            tag: (bits >> 96) as u32,
        }
    }
}

impl fmt::Debug for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConnId(#{}@{}/{})", self.seq, self.slot, self.tag)
    }
}

/// Where a request should go.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Route<U, H> {
    /// Send on this existing connection (it may still be connecting).
    Use(ConnId),
    /// Open a connection to this endpoint under this fresh id, then send on it. The
    /// [`ConnectAttempt`] says how long the transport may take to connect: a connect still
    /// running at its [`deadline`](ConnectAttempt::deadline) is to be given up and reported
    /// with [`ConnTable::handle_connect_failed`].
    Open(ConnId, ConnKey<U, H>, ConnectAttempt),
    /// The last connect to this endpoint failed; route again at `until`.
    Wait {
        /// When the endpoint's connect backoff ends.
        until: Instant,
    },
    /// The table has issued every connection id it can without reusing one (2^64 − 1
    /// connections, or 2^32 endpoints at once); build a new table.
    Exhausted,
}

/// An effect the transport must carry out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnAction {
    /// Close this connection: it was idle for `max_idle`, or its uid was disconnected.
    /// The table has already forgotten it; do not report it back with `handle_closed`.
    Close(ConnId),
}

/// An observation of the table, drained with [`ConnTable::poll_event`] once turned on with
/// [`ConnTable::set_event_capacity`] (off by default: see [`crate::event`]).
///
/// Events name connections by [`ConnId`] only (look the endpoint up with
/// [`ConnTable::key`] while it is live): building one clones no key and runs no user code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnEvent {
    /// [`ConnTable::handle_request`] answered [`Route::Open`] with this connection: a
    /// connect attempt started.
    Opened {
        /// The connection opened.
        conn: ConnId,
    },
    /// [`ConnTable::handle_connected`] accepted the connect of this connection (returned
    /// `true`).
    Connected {
        /// The connection now connected.
        conn: ConnId,
    },
    /// The table forgot this live connection, for `cause`. With [`CloseCause::Idle`],
    /// [`CloseCause::ConnectTimedOut`], [`CloseCause::Disconnected`] and
    /// [`CloseCause::Shutdown`] it also queued a
    /// [`ConnAction::Close`] for it, and the events come in the order of those actions.
    Closed {
        /// The connection closed.
        conn: ConnId,
        /// Why the table forgot it.
        cause: CloseCause,
    },
}

/// Why the table forgot a live connection ([`ConnEvent::Closed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CloseCause {
    /// [`ConnTable::handle_timeout`] closed a connected connection with nothing in flight
    /// for `max_idle` (it queued a [`ConnAction::Close`]).
    Idle,
    /// [`ConnTable::disconnect`] closed it with the other connections of its uid (it queued
    /// a [`ConnAction::Close`]).
    Disconnected,
    /// [`ConnTable::handle_connect_failed`] reported its connect failed; the endpoint backs
    /// off.
    ConnectFailed,
    /// [`ConnTable::handle_timeout`] found it still connecting at its
    /// [`ConnectAttempt::deadline`] (and its idle deadline): a failed connect, so the
    /// endpoint backs off, and it queued a [`ConnAction::Close`].
    ConnectTimedOut,
    /// The transport reported it closed with [`ConnTable::handle_closed`] (which returned
    /// `true`).
    Reported,
    /// [`ConnTable::close_all`] closed it with every other live connection (the client is
    /// shutting down; it queued a [`ConnAction::Close`]).
    Shutdown,
}

/// One tracked endpoint in a [`ConnTable::snapshot`] page, in plain terms.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndpointSnapshot<U, H> {
    /// The endpoint.
    pub key: ConnKey<U, H>,
    /// Its live connection and that connection's stage, if it has one.
    pub conn: Option<(ConnId, ConnState)>,
    /// Requests in flight on that connection (0 without one).
    pub in_flight: u64,
    /// When that connection closes if nothing happens (the idle close, or for a connecting
    /// one the later of it and the connect deadline); `None` while requests are in flight or
    /// without a connection.
    pub closes_at: Option<Instant>,
    /// Until when routes to it wait, as of the snapshot's `now` (its connect backoff).
    pub backoff_until: Option<Instant>,
    /// Failed connects since its last successful one.
    pub connect_failures: u32,
}

/// The life stage of a live connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnState {
    /// Opened by [`Route::Open`]; the connect has not been reported yet.
    Connecting,
    /// [`ConnTable::handle_connected`] was reported.
    Connected,
}

/// From when the connect backoff of a failed attempt counts ([`ConnConfig::with_backoff_from`]).
///
/// With a backoff `d` drawn for an attempt that started at `s` and failed at `f`, the next
/// attempt may start at `s + d` ([`AttemptStart`](Self::AttemptStart)) or at `f + d`
/// ([`Failure`](Self::Failure)). They differ only when connects take time: a connect that
/// fails 300 ms in with `d = 1 s` retries at `s + 1 s` or at `s + 1.3 s`, and one that takes
/// longer than `d` retries at once or waits `d` again.
///
/// ```
/// use throttle_sansio::conn_key::{BackoffFrom, ConnConfig};
///
/// assert_eq!(ConnConfig::default().backoff_from(), BackoffFrom::AttemptStart);
/// let go_like = ConnConfig::default().with_backoff_from(BackoffFrom::Failure);
/// assert_eq!(go_like.backoff_from(), BackoffFrom::Failure);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackoffFrom {
    /// The next attempt starts `d` after the failed attempt *started*, or at once if the
    /// attempt took longer than `d`: gRPC's connection-backoff protocol
    /// (`doc/connection-backoff.md`, "Proposed Backoff Algorithm": `SleepUntil(current_deadline)`)
    /// and gRPC core's subchannel. The default.
    #[default]
    AttemptStart,
    /// The next attempt starts `d` after the failure was reported, however long the connect
    /// took: grpc-go's `addrConn.resetTransport` (a timer of `backoffFor` started after
    /// `tryAllAddrs` fails), and this table before issue 15.
    Failure,
}

/// How long the transport may take over one connect, as the table hands it out with
/// [`Route::Open`] (and [`ConnTable::connect_attempt`]).
///
/// `timeout = max(min_connect_timeout, d)`, where `d` is the backoff drawn for this attempt
/// when it started (gRPC's `TryConnect(Max(current_deadline, now() + MIN_CONNECT_TIMEOUT))`:
/// `current_deadline − now()` is `d` at the attempt's start); `deadline = started + timeout`,
/// saturating at [`Instant::MAX`]. A connect still running at `deadline` should be given up
/// and reported as failed.
///
/// ```
/// use std::hash::RandomState;
/// use std::time::Duration;
/// use throttle_sansio::Instant;
/// use throttle_sansio::conn_key::{ConnConfig, ConnKey, ConnTable, Route};
/// use throttle_sansio::rng::SplitMix64;
///
/// let mut table: ConnTable<u32, u32, RandomState> =
///     ConnTable::new(ConnConfig::default()).unwrap();
/// let mut rng = SplitMix64::new(1);
/// let t = Instant::from_millis(5_000);
/// let Route::Open(_, _, attempt) = table.handle_request(t, &ConnKey::new(0, 1, 9123), &mut rng)
/// else { panic!() };
/// // The first backoff is about 1 s: the 20 s minimum connect timeout wins.
/// assert_eq!(attempt.started(), t);
/// assert_eq!(attempt.timeout(), Duration::from_secs(20));
/// assert_eq!(attempt.deadline(), Instant::from_millis(25_000));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnectAttempt {
    started: Instant,
    timeout: Duration,
}

impl ConnectAttempt {
    /// An attempt that started at `started` and may take `timeout` (for transports' tests;
    /// the table makes its own).
    pub const fn new(started: Instant, timeout: Duration) -> Self {
        ConnectAttempt { started, timeout }
    }

    /// When the attempt started (the route that opened it, on the table's clamped clock).
    pub const fn started(&self) -> Instant {
        self.started
    }

    /// How long the connect may take: `max(min_connect_timeout, this attempt's backoff)`.
    pub const fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `started + timeout`, saturating at [`Instant::MAX`]: when to give the connect up.
    pub fn deadline(&self) -> Instant {
        self.started + self.timeout
    }
}

/// A request was sent on a connection that is closed (or was never issued by this table).
///
/// Always retriable: the request never left, so route it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("connection {conn:?} is closed; route the request again")]
#[non_exhaustive]
pub struct Disconnected {
    /// The connection the request was meant for.
    pub conn: ConnId,
}

/// A finished request that the table cannot account for; nothing changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FinishError {
    /// The connection is closed; its requests already failed with it (harmless).
    #[error("connection {0:?} is closed")]
    Disconnected(ConnId),
    /// The connection has no request in flight: a finish without a send, or a double finish.
    #[error("connection {0:?} has no request in flight")]
    NotInFlight(ConnId),
}

/// Settings of a [`ConnTable`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnConfig {
    max_idle: Duration,
    connect_backoff: BackoffConfig,
    min_connect_timeout: Duration,
    backoff_from: BackoffFrom,
}

/// gRPC's `MIN_CONNECT_TIMEOUT` (`doc/connection-backoff.md`, "Proposed Backoff Algorithm":
/// 20 seconds): the least time a connect attempt is given, [`ConnConfig`]'s default.
pub const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

impl Default for ConnConfig {
    /// The Fluss client's connection settings (PR #4263's `NettyClient`):
    /// `netty.connection.max-idle-time` = 10 min. Fluss sets no pace for reconnects (it
    /// reconnects at once, a departure `docs/design.md` §7 lists), so the one setting it lacks is
    /// filled with gRPC's connection backoff, [`BackoffConfig::grpc_connection`] (1 s, ×1.6,
    /// ±20 %, 120 s), the only upstream that specifies one, with the rest of gRPC's
    /// connection-backoff protocol: each attempt may take at least [`MIN_CONNECT_TIMEOUT`]
    /// (20 s), and the backoff counts from the attempt's start ([`BackoffFrom::AttemptStart`]).
    fn default() -> Self {
        ConnConfig {
            max_idle: Duration::from_secs(600),
            connect_backoff: BackoffConfig::grpc_connection(),
            min_connect_timeout: MIN_CONNECT_TIMEOUT,
            backoff_from: BackoffFrom::AttemptStart,
        }
    }
}

impl ConnConfig {
    /// How long a connection with nothing in flight stays open (Fluss
    /// `netty.connection.max-idle-time`, default 10 min). At least 1 ns; `Duration::MAX`
    /// keeps idle connections for ever.
    #[must_use]
    pub fn with_max_idle(mut self, max_idle: Duration) -> Self {
        self.max_idle = max_idle;
        self
    }

    /// The backoff between failed connects to one endpoint (default: the gRPC connection
    /// backoff, 1 s, ×1.6, ±20 %, 120 s).
    #[must_use]
    pub fn with_connect_backoff(mut self, backoff: BackoffConfig) -> Self {
        self.connect_backoff = backoff;
        self
    }

    /// The least time a connect attempt is given (gRPC `MIN_CONNECT_TIMEOUT`, default 20 s):
    /// each [`ConnectAttempt`]'s timeout is `max(min_connect_timeout, its backoff)`. At least
    /// 1 ns; `Duration::MAX` gives every connect all the time there is.
    #[must_use]
    pub fn with_min_connect_timeout(mut self, timeout: Duration) -> Self {
        self.min_connect_timeout = timeout;
        self
    }

    /// From when a failed connect's backoff counts (default
    /// [`BackoffFrom::AttemptStart`], gRPC's protocol document and gRPC core;
    /// [`BackoffFrom::Failure`] is grpc-go's).
    #[must_use]
    pub fn with_backoff_from(mut self, from: BackoffFrom) -> Self {
        self.backoff_from = from;
        self
    }

    /// The least time a connect attempt is given.
    pub fn min_connect_timeout(&self) -> Duration {
        self.min_connect_timeout
    }

    /// From when a failed connect's backoff counts.
    pub fn backoff_from(&self) -> BackoffFrom {
        self.backoff_from
    }

    /// How long an idle connection stays open.
    pub fn max_idle(&self) -> Duration {
        self.max_idle
    }

    /// The backoff between failed connects to one endpoint.
    pub fn connect_backoff(&self) -> &BackoffConfig {
        &self.connect_backoff
    }

    /// Refuses a zero `max_idle` (a fresh connection would close before its first send) and
    /// a zero `min_connect_timeout` (a connect with no backoff would time out before it began).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (value, option) in [
            (self.max_idle, &crate::options::conn::MAX_IDLE),
            (
                self.min_connect_timeout,
                &crate::options::conn::MIN_CONNECT_TIMEOUT,
            ),
        ] {
            if value.is_zero() {
                return Err(ConfigError::OutOfRange {
                    option,
                    got: 0,
                    min: 1,
                    max: u64::MAX,
                    unit: "ns",
                });
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug)]
struct Conn {
    id: ConnId,
    state: ConnState,
    in_flight: u64,
    /// The connect attempt (meaningful while `Connecting`).
    attempt: ConnectAttempt,
    /// The backoff drawn for this attempt when it started, and the endpoint's sequence after
    /// that draw: committed by a failed connect, dropped by any other end.
    delay: Duration,
    drawn: Backoff,
}

impl Conn {
    /// When the connection may be closed with nothing in flight, given the idle deadline
    /// `idle_at`: a connecting one is never cut before its attempt's connect deadline (and
    /// the cut then counts as a failed connect, see `handle_timeout`).
    fn close_at(&self, idle_at: Instant) -> Instant {
        if self.state == ConnState::Connecting {
            idle_at.max(self.attempt.deadline())
        } else {
            idle_at
        }
    }
}

/// The backoff of the attempt about to start in sequence `seq`, drawn on a copy (the
/// sequence is committed only if the attempt fails). A delay the config's limits refuse is
/// replaced by the current attempt's: connecting never gives up by itself.
fn draw_attempt<R: Rng + ?Sized>(
    seq: &Backoff,
    cfg: &BackoffConfig,
    rng: &mut R,
) -> (Duration, Backoff) {
    let mut next = seq.clone();
    let attempt = next.attempt();
    let delay = match next.next_delay(cfg, rng) {
        Some(d) => d,
        None => cfg.delay_for(attempt, rng),
    };
    (delay, next)
}

/// Everything the table knows about one endpoint. It exists while the endpoint has a live
/// connection or a pending connect backoff (then `conn` is `None` and the backoff has drawn).
#[derive(Clone, Debug)]
struct Entry<U, H> {
    key: ConnKey<U, H>,
    /// The table's hashes of `key` and of `key.uid`, taken once when the entry was made:
    /// removing and rehashing read them, so no user `Hash` runs after an input's first change.
    key_hash: u64,
    uid_hash: u64,
    conn: Option<Conn>,
    backoff: Backoff,
    /// Routes before this instant answer `Wait`; meaningful while `backoff.attempt() > 0`.
    wait_until: Instant,
    /// Where this entry's one timer sits in `ConnTable::timers`: the idle close of a live
    /// connection with nothing in flight, or the eviction of a connection-less entry.
    heap_pos: Option<usize>,
}

/// The connection table.
///
/// # Driving contract
///
/// Inputs: `handle_request`, `handle_connected`, `handle_connect_failed`, `handle_send`,
/// `handle_finished`, `handle_closed`, `disconnect`, `handle_timeout` (each takes `now`, which
/// may run backwards: it is clamped). After each, drain `poll_action` until `None`. Call
/// `handle_timeout` at or after `poll_timeout`. Queries take `&self`. The full per-request
/// sequence is in the [module docs](self).
///
/// Costs: `handle_request` and every handler are O(log n) (one hash lookup at most, one sift in an
/// indexed binary heap; no allocation once grown); `poll_timeout` is O(1) (the heap's top);
/// `disconnect(uid)` is O(k log n) for the uid's k endpoints; `handle_timeout` is O(log n)
/// per expired entry plus amortised O(1) maintenance (it never scans the table).
///
/// ```
/// use std::hash::RandomState;
/// use throttle_sansio::Instant;
/// use throttle_sansio::conn_key::{ConnConfig, ConnKey, ConnTable, Route};
///
/// let mut table: ConnTable<&str, &str, RandomState> =
///     ConnTable::new(ConnConfig::default()).unwrap();
/// let mut rng = throttle_sansio::rng::SplitMix64::new(7); // draws connect backoffs
/// let now = Instant::ZERO;
/// let old = ConnKey::new("cs-0", "10.0.0.1", 9123);
/// let Route::Open(a, _, _) = table.handle_request(now, &old, &mut rng) else { panic!() };
/// table.handle_connected(now, a);
/// // The coordinator fails over: uid cs-0 now lives at another address.
/// let new = ConnKey::new("cs-0", "10.0.0.2", 9123);
/// let Route::Open(b, _, _) = table.handle_request(now, &new, &mut rng) else { panic!() };
/// assert_ne!(a, b);
/// // Old metadata keeps its connection.
/// assert_eq!(table.handle_request(now, &old, &mut rng), Route::Use(a));
/// ```
#[derive(Clone, Debug)]
pub struct ConnTable<U, H, S> {
    cfg: ConnConfig,
    clock: Clock,
    slots: Vec<Option<Entry<U, H>>>,
    /// Free slots, lowest first, so a shrinking table compacts towards the front. Entries at
    /// or past `slots.len()` are stale (their slot was trimmed off the end); since the heap
    /// hands out its smallest first, meeting one means all remaining ones are stale.
    free: BinaryHeap<Reverse<u32>>,
    hasher: S,
    /// The slot of each endpoint, placed by the entry's `key_hash`.
    by_key: HashTable<u32>,
    /// The slots of each uid's endpoints (never empty), placed by their `uid_hash`.
    by_uid: HashTable<UidSlots>,
    /// Indexed binary min-heap of `(deadline, slot)`; each entry knows its position, so a
    /// deadline moves in place in O(log n) and the heap never allocates once grown (a
    /// `BTreeSet` would allocate on node splits while routes re-key hot connections).
    timers: Vec<(Instant, u32)>,
    actions: VecDeque<ConnAction>,
    /// The table's instance tag and sequence numbers (the crate's one id rule: never wrap,
    /// bound to this table).
    ids: IdSpace,
    live: usize,
    /// Observations, off until [`Self::set_event_capacity`].
    events: EventQueue<ConnEvent>,
    /// Slots trimmed plus free-list entries visited by `shrink`, to pin its cost in tests.
    #[cfg(test)]
    maintenance_steps: u64,
}

/// The endpoints of one uid: their slots, and the uid's hash (every entry's `uid_hash`).
#[derive(Clone, Debug)]
struct UidSlots {
    hash: u64,
    slots: SmallVec<[u32; 2]>,
}

/// The stored key hash of the entry at `slot`, to rehash `by_key` without running user code.
fn key_hash_at<U, H>(slots: &[Option<Entry<U, H>>], slot: u32) -> u64 {
    slots
        .get(slot as usize)
        .and_then(Option::as_ref)
        .map_or(0, |e| e.key_hash)
}

/// The capacity every container keeps when it shrinks: a table that empties and refills
/// (one endpoint opened, idled out, reopened) reuses its storage instead of allocating
/// again each cycle (`docs/design.md` §2.6).
const SHRINK_FLOOR: usize = 16;

impl<U, H, S> ConnTable<U, H, S>
where
    U: Hash + Eq + Clone,
    H: Hash + Eq + Clone,
    S: BuildHasher + Clone,
{
    /// An empty table; refuses an invalid config.
    pub fn new(cfg: ConnConfig) -> Result<Self, ConfigError>
    where
        S: Default,
    {
        Self::with_hasher(cfg, S::default())
    }

    /// An empty table hashing keys with `hasher` (keys come from remote metadata: pass a
    /// randomly seeded hasher such as std's `RandomState`).
    pub fn with_hasher(cfg: ConnConfig, hasher: S) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(ConnTable {
            cfg,
            clock: Clock::default(),
            slots: Vec::new(),
            free: BinaryHeap::new(),
            hasher,
            by_key: HashTable::new(),
            by_uid: HashTable::new(),
            timers: Vec::new(),
            actions: VecDeque::new(),
            ids: IdSpace::new(),
            live: 0,
            events: EventQueue::new(),
            #[cfg(test)]
            maintenance_steps: 0,
        })
    }

    /// Gives the table the instance tag `tag` (for targets without 32-bit atomics, where
    /// every table otherwise has tag 0). Call it on a fresh table: ids issued before are no
    /// longer recognised.
    #[must_use]
    pub fn with_instance_tag(mut self, tag: u32) -> Self {
        self.ids.set_tag(tag);
        self
    }

    /// The table's settings.
    pub fn config(&self) -> &ConnConfig {
        &self.cfg
    }

    // ----- inputs -----

    /// A request for `node` arrived: chooses its connection. An input, not a query: it may
    /// open an entry, and it counts as activity on the connection it picks.
    ///
    /// `Use` the endpoint's live connection if it has one (connecting or connected); else
    /// `Wait` while its connect backoff runs; else `Open` a new connection under a fresh id.
    /// Only the exact endpoint is ever used: a uid at a new address gets its own connection,
    /// and the connection at the old address keeps serving requests routed by old metadata
    /// until it has been idle for `max_idle`. Routing to a connection counts as activity.
    ///
    /// An `Open` starts a connect attempt: it draws the attempt's backoff `d` from the
    /// endpoint's sequence with `rng` (the only answer that draws), and its
    /// [`ConnectAttempt`] has timeout `max(min_connect_timeout, d)`. If the attempt fails,
    /// the next one may start `d` after this route ([`BackoffFrom::AttemptStart`]) or `d`
    /// after the failure ([`BackoffFrom::Failure`]).
    ///
    /// # Panics
    ///
    /// Only if user code panics: the key's `Hash`, `Eq` or `Clone`, the hasher, or the `Rng`.
    /// The panic reaches the caller and the input did not happen: the table is as it was, and
    /// serves the next call.
    pub fn handle_request<R: Rng + ?Sized>(
        &mut self,
        now: Instant,
        node: &ConnKey<U, H>,
        rng: &mut R,
    ) -> Route<U, H> {
        // User code (`Hash`, `Eq`, `Clone` of the key, the rng) runs first, all of it, so
        // that a panic in it leaves the table as it was.
        let (key_hash, found) = self.lookup(node);
        let t = self.clock.peek(now);
        if let Some(slot) = found {
            // An exhausted id space answers `Exhausted` without drawing.
            let reopen = self
                .entry(slot)
                .filter(|e| e.conn.is_none() && t >= e.wait_until && self.ids.peek().is_ok())
                .map(|e| e.backoff.clone());
            let copy = reopen.map(|seq| {
                let key = node.clone();
                (key, draw_attempt(&seq, &self.cfg.connect_backoff, rng))
            });
            let now = self.clock.observe(now);
            return self.route_known(now, slot, copy);
        }
        let uid_hash = self.hasher.hash_one(&node.uid);
        let uid_anchor = self.uid_anchor(uid_hash, &node.uid);
        let copies = self.ids.peek().is_ok().then(|| {
            let keys = (node.clone(), node.clone());
            (
                keys,
                draw_attempt(&Backoff::new(), &self.cfg.connect_backoff, rng),
            )
        });
        let now = self.clock.observe(now);
        let Some(((key, copy), (delay, drawn))) = copies else {
            return Route::Exhausted;
        };
        let idle_at = now + self.cfg.max_idle;
        let Some(slot) = self.alloc_slot() else {
            return Route::Exhausted;
        };
        let Some(seq) = self.take_seq() else {
            return Route::Exhausted; // unreachable: checked above
        };
        let id = ConnId {
            seq,
            slot,
            tag: self.ids.tag(),
        };
        let attempt = self.attempt_at(now, delay);
        let entry = Entry {
            key,
            key_hash,
            uid_hash,
            conn: Some(Conn {
                id,
                state: ConnState::Connecting,
                in_flight: 0,
                attempt,
                delay,
                drawn,
            }),
            backoff: Backoff::new(),
            wait_until: Instant::ZERO,
            heap_pos: None,
        };
        if let Some(s) = self.slots.get_mut(slot as usize) {
            *s = Some(entry);
        }
        let slots = &self.slots;
        self.by_key
            .insert_unique(key_hash, slot, |&s| key_hash_at(slots, s));
        let uid = uid_anchor.and_then(|anchor| {
            self.by_uid
                .find_mut(uid_hash, |u| u.slots.first() == Some(&anchor))
        });
        match uid {
            Some(u) => u.slots.push(slot),
            None => {
                let mut slots = SmallVec::new();
                slots.push(slot);
                self.by_uid.insert_unique(
                    uid_hash,
                    UidSlots {
                        hash: uid_hash,
                        slots,
                    },
                    |u| u.hash,
                );
            }
        }
        self.live = self.live.saturating_add(1);
        self.set_deadline(slot, Some(idle_at.max(attempt.deadline())));
        // Every key copy and the draw were made before anything changed: no user code is left.
        self.events.emit(|| ConnEvent::Opened { conn: id });
        Route::Open(id, copy, attempt)
    }

    /// The connect attempt starting at `now` whose backoff is `delay`.
    fn attempt_at(&self, now: Instant, delay: Duration) -> ConnectAttempt {
        ConnectAttempt::new(now, delay.max(self.cfg.min_connect_timeout))
    }

    /// `handle_request` for an endpoint with an entry at `slot`; `copy` is the key to return
    /// and the attempt's draw, if the route opens a connection (made before anything changed).
    fn route_known(
        &mut self,
        now: Instant,
        slot: u32,
        copy: Option<(ConnKey<U, H>, (Duration, Backoff))>,
    ) -> Route<U, H> {
        let idle_at = now + self.cfg.max_idle;
        let Some(e) = self.entry_mut(slot) else {
            return Route::Exhausted; // unreachable: by_key only names used slots
        };
        if let Some(c) = &e.conn {
            let id = c.id;
            if c.in_flight == 0 {
                let at = c.close_at(idle_at);
                self.set_deadline(slot, Some(at));
            }
            return Route::Use(id);
        }
        if now < e.wait_until {
            return Route::Wait {
                until: e.wait_until,
            };
        }
        let Some((copy, (delay, drawn))) = copy else {
            return Route::Exhausted; // unreachable: the copy was made for exactly this case
        };
        let Some(seq) = self.take_seq() else {
            return Route::Exhausted;
        };
        let id = ConnId {
            seq,
            slot,
            tag: self.ids.tag(),
        };
        let attempt = self.attempt_at(now, delay);
        if let Some(e) = self.entry_mut(slot) {
            e.conn = Some(Conn {
                id,
                state: ConnState::Connecting,
                in_flight: 0,
                attempt,
                delay,
                drawn,
            });
        }
        self.live = self.live.saturating_add(1);
        self.set_deadline(slot, Some(idle_at.max(attempt.deadline())));
        // Every key copy and the draw were made before anything changed: no user code is left.
        self.events.emit(|| ConnEvent::Opened { conn: id });
        Route::Open(id, copy, attempt)
    }

    /// The transport connected `conn`: resets the endpoint's connect backoff, so the first
    /// reconnect after a later drop is immediate. Returns whether `conn` was connecting
    /// (otherwise nothing changes).
    pub fn handle_connected(&mut self, now: Instant, conn: ConnId) -> bool {
        let now = self.clock.observe(now);
        let Some(slot) = self.live_slot(conn) else {
            return false;
        };
        let Some(e) = self.entry_mut(slot) else {
            return false;
        };
        let Some(c) = e.conn.as_mut() else {
            return false;
        };
        if c.state != ConnState::Connecting {
            return false;
        }
        c.state = ConnState::Connected;
        let idle = c.in_flight == 0;
        e.backoff.reset();
        e.wait_until = Instant::ZERO;
        if idle {
            let at = now + self.cfg.max_idle;
            self.set_deadline(slot, Some(at));
        }
        self.events.emit(|| ConnEvent::Connected { conn });
        true
    }

    /// Connecting `conn` failed (or the transport gave it up at its
    /// [`ConnectAttempt::deadline`]): the connection is gone (fail its queued requests as
    /// [`Disconnected`]) and the endpoint backs off by the delay `d` drawn when the attempt
    /// started. Returns the instant from which [`handle_request`](Self::handle_request) opens
    /// again: `started + d` ([`BackoffFrom::AttemptStart`]; at or before `now` when the
    /// connect took longer than `d`, so the next route retries at once) or `now + d`
    /// ([`BackoffFrom::Failure`]). `None` if `conn` was not connecting (nothing changes).
    ///
    /// Draws nothing: the delay was drawn by the route that opened the attempt.
    pub fn handle_connect_failed(&mut self, now: Instant, conn: ConnId) -> Option<Instant> {
        let now = self.clock.observe(now);
        let slot = self.live_slot(conn)?;
        let (id, until) = self.fail_connect(slot, now)?;
        self.events.emit(|| ConnEvent::Closed {
            conn: id,
            cause: CloseCause::ConnectFailed,
        });
        Some(until)
    }

    /// Ends the connecting connection at `slot` as a failed connect: commits the backoff its
    /// attempt drew and returns its id and when the endpoint may be tried again. `None` (and
    /// nothing changes) if the slot's connection is not connecting.
    fn fail_connect(&mut self, slot: u32, now: Instant) -> Option<(ConnId, Instant)> {
        let max_idle = self.cfg.max_idle;
        let from = self.cfg.backoff_from;
        let e = self.slots.get_mut(slot as usize)?.as_mut()?;
        if e.conn.as_ref()?.state != ConnState::Connecting {
            return None;
        }
        let c = e.conn.take()?;
        let until = match from {
            BackoffFrom::AttemptStart => c.attempt.started() + c.delay,
            BackoffFrom::Failure => now + c.delay,
        };
        e.backoff = c.drawn;
        e.wait_until = until;
        self.live = self.live.saturating_sub(1);
        self.set_deadline(slot, Some(until.max(now) + max_idle));
        Some((c.id, until))
    }

    /// A request is being written on `conn`: counts it in flight (an in-flight connection is
    /// never closed for idleness). `Err(Disconnected)` if `conn` is closed: route again.
    pub fn handle_send(&mut self, now: Instant, conn: ConnId) -> Result<(), Disconnected> {
        let _ = self.clock.observe(now);
        let slot = self.live_slot(conn).ok_or(Disconnected { conn })?;
        if let Some(c) = self.entry_mut(slot).and_then(|e| e.conn.as_mut()) {
            c.in_flight = c.in_flight.saturating_add(1);
        }
        self.set_deadline(slot, None);
        Ok(())
    }

    /// A request on `conn` got its response (or was abandoned). When the last one finishes
    /// the idle deadline starts at `now`. Refused, with nothing changed, for a closed
    /// connection or one with nothing in flight.
    pub fn handle_finished(&mut self, now: Instant, conn: ConnId) -> Result<(), FinishError> {
        let now = self.clock.observe(now);
        let idle_at = now + self.cfg.max_idle;
        let slot = self
            .live_slot(conn)
            .ok_or(FinishError::Disconnected(conn))?;
        let c = self
            .entry_mut(slot)
            .and_then(|e| e.conn.as_mut())
            .ok_or(FinishError::Disconnected(conn))?;
        if c.in_flight == 0 {
            return Err(FinishError::NotInFlight(conn));
        }
        c.in_flight -= 1;
        if c.in_flight == 0 {
            let at = c.close_at(idle_at);
            self.set_deadline(slot, Some(at));
        }
        Ok(())
    }

    /// The transport saw `conn` close (remote close, I/O error). Forgets it only if it is
    /// still the endpoint's live connection: a late close of an old connection never evicts
    /// its replacement. Returns whether it was forgotten. No backoff: the next route to the
    /// endpoint reconnects immediately (a drop or a server restart is not a failed connect).
    pub fn handle_closed(&mut self, now: Instant, conn: ConnId) -> bool {
        let now = self.clock.observe(now);
        let Some(id) = self
            .live_slot(conn)
            .and_then(|slot| self.drop_conn(slot, now))
        else {
            return false;
        };
        self.events.emit(|| ConnEvent::Closed {
            conn: id,
            cause: CloseCause::Reported,
        });
        true
    }

    /// Closes every connection of server `uid`, at any address (e.g. the server left the
    /// cluster): queues one [`ConnAction::Close`] per connection and returns how many.
    /// Connect backoff of the uid's endpoints is kept (see the eviction rule).
    ///
    /// # Panics
    ///
    /// Only if user code panics: the uid's `Hash` or `Eq`, or the hasher. The
    /// panic reaches the caller and the input did not happen: the table is as it was, and
    /// serves the next call.
    pub fn disconnect(&mut self, now: Instant, uid: &U) -> usize {
        // The lookup (user `Hash`, `Eq`) runs before anything changes; closing runs none.
        let hash = self.hasher.hash_one(uid);
        let found: Option<SmallVec<[u32; 4]>> = self
            .uid_anchor(hash, uid)
            .and_then(|anchor| self.by_uid.find(hash, |u| u.slots.first() == Some(&anchor)))
            .map(|u| u.slots.iter().copied().collect());
        let now = self.clock.observe(now);
        let Some(slots) = found else {
            return 0;
        };
        slots
            .into_iter()
            .filter(|&slot| self.close_slot(slot, now, CloseCause::Disconnected))
            .count()
    }

    /// Closes every live connection, connecting or connected (the client shuts down): each
    /// queues a [`ConnAction::Close`] and records [`CloseCause::Shutdown`], in slot order.
    /// Returns how many. Endpoints keep their connect backoff, as after [`Self::disconnect`];
    /// the table serves later inputs as before. Runs no user code but the `Drop` of the keys
    /// of endpoints it forgets (as [`Self::handle_timeout`]).
    pub fn close_all(&mut self, now: Instant) -> usize {
        let now = self.clock.observe(now);
        let slots = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        (0..slots)
            .filter(|&slot| self.close_slot(slot, now, CloseCause::Shutdown))
            .count()
    }

    /// Closes the live connection in `slot`, if any, queuing its [`ConnAction::Close`] and
    /// recording its close for `cause`; returns whether there was one.
    fn close_slot(&mut self, slot: u32, now: Instant, cause: CloseCause) -> bool {
        let Some(id) = self.drop_conn(slot, now) else {
            return false;
        };
        self.actions.push_back(ConnAction::Close(id));
        self.events.emit(|| ConnEvent::Closed { conn: id, cause });
        true
    }

    /// Acts on every deadline at or before `now`: closes connections idle for `max_idle`
    /// (queuing [`ConnAction::Close`]) and forgets the connect backoff of endpoints without a
    /// connection for `max_idle` past their backoff. Shrinks the table once it is below a
    /// quarter of its capacity, keeping a small floor.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        // Each turn removes a connection or an entry, so the loop ends.
        while let Some(&(at, slot)) = self.timers.first() {
            if at > now {
                break;
            }
            let conn = self.entry(slot).map(|e| e.conn.as_ref().map(|c| c.state));
            match conn {
                Some(Some(ConnState::Connecting)) => {
                    // Still connecting at its connect deadline (which its timer never
                    // precedes): a failed connect, backoff and all, and the transport drops it.
                    if let Some((id, _)) = self.fail_connect(slot, now) {
                        self.actions.push_back(ConnAction::Close(id));
                        self.events.emit(|| ConnEvent::Closed {
                            conn: id,
                            cause: CloseCause::ConnectTimedOut,
                        });
                    }
                }
                Some(Some(_)) => {
                    if let Some(id) = self.drop_conn(slot, now) {
                        self.actions.push_back(ConnAction::Close(id));
                        self.events.emit(|| ConnEvent::Closed {
                            conn: id,
                            cause: CloseCause::Idle,
                        });
                    }
                }
                Some(None) => self.free_entry(slot),
                None => {
                    // Unreachable: a timer names a used slot. Drop it so the loop ends.
                    self.heap_remove(0);
                }
            }
        }
        self.shrink();
    }

    // ----- pollers -----

    /// The next action for the transport; call until `None` after every input.
    pub fn poll_action(&mut self) -> Option<ConnAction> {
        self.actions.pop_front()
    }

    /// The oldest undrained observation, if events are on ([`Self::set_event_capacity`]).
    /// Drain after [`Self::poll_action`].
    pub fn poll_event(&mut self) -> Option<ConnEvent> {
        self.events.pop()
    }

    /// For the `sync` handles' lock guard: whether an event is waiting (one length check).
    #[cfg(feature = "std")]
    #[inline]
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Record up to `capacity` undrained events (0, the default, turns them off: no input
    /// then builds one). Past the capacity the oldest is dropped and counted.
    pub fn set_event_capacity(&mut self, capacity: usize) {
        self.events.set_capacity(capacity);
    }

    /// Events lost to a full queue (or discarded by turning events off) so far.
    pub fn events_dropped(&self) -> u64 {
        self.events.dropped()
    }

    /// The earliest instant at which [`handle_timeout`](Self::handle_timeout) has work, in
    /// O(1) (the heap's top). `None` when no connection is idle and no backoff awaits
    /// eviction.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|&(at, _)| at)
    }

    // ----- queries -----

    /// The live connection of endpoint `key`, if any.
    ///
    /// # Panics
    ///
    /// Only if the key's `Hash` or `Eq`, or the hasher, panics; the table is unchanged.
    pub fn connection(&self, key: &ConnKey<U, H>) -> Option<ConnId> {
        let slot = self.lookup(key).1?;
        Some(self.entry(slot)?.conn.as_ref()?.id)
    }

    /// The stage of `conn`, or `None` if it is closed or unknown.
    pub fn state(&self, conn: ConnId) -> Option<ConnState> {
        Some(self.live_conn(conn)?.state)
    }

    /// The connect attempt of `conn` while it is connecting (`None` once connected, closed or
    /// unknown): the same [`ConnectAttempt`] its [`Route::Open`] carried.
    pub fn connect_attempt(&self, conn: ConnId) -> Option<ConnectAttempt> {
        let c = self.live_conn(conn)?;
        (c.state == ConnState::Connecting).then_some(c.attempt)
    }

    /// Requests in flight on `conn`, or `None` if it is closed or unknown.
    pub fn in_flight(&self, conn: ConnId) -> Option<u64> {
        Some(self.live_conn(conn)?.in_flight)
    }

    /// The endpoint of `conn`, or `None` if it is closed or unknown.
    pub fn key(&self, conn: ConnId) -> Option<&ConnKey<U, H>> {
        let slot = self.live_slot(conn)?;
        Some(&self.entry(slot)?.key)
    }

    /// When `conn` closes for idleness if nothing happens; `None` while it has requests in
    /// flight, or if it is closed or unknown.
    pub fn idle_deadline(&self, conn: ConnId) -> Option<Instant> {
        let slot = self.live_slot(conn)?;
        let pos = self.entry(slot)?.heap_pos?;
        self.timers.get(pos).map(|&(at, _)| at)
    }

    /// Until when `key` is in connect backoff as of `now`, or `None` if a route would not
    /// wait.
    ///
    /// # Panics
    ///
    /// Only if the key's `Hash` or `Eq`, or the hasher, panics; the table is unchanged.
    pub fn backoff_until(&self, now: Instant, key: &ConnKey<U, H>) -> Option<Instant> {
        let now = self.clock.peek(now);
        let e = self.entry(self.lookup(key).1?)?;
        (e.conn.is_none() && now < e.wait_until).then_some(e.wait_until)
    }

    /// Failed connects to `key` since its last successful one (0 when it has no backoff).
    ///
    /// # Panics
    ///
    /// Only if the key's `Hash` or `Eq`, or the hasher, panics; the table is unchanged.
    pub fn connect_failures(&self, key: &ConnKey<U, H>) -> u32 {
        self.lookup(key)
            .1
            .and_then(|s| self.entry(s))
            .map_or(0, |e| e.backoff.attempt())
    }

    /// One page of at most `max` tracked endpoints (with a live connection, or in connect
    /// backoff), each with its connection, requests in flight, closing time and backoff, as of
    /// `now`. Start with `from = None`, then pass each page's `next` until it is `None`.
    /// Endpoints keep their slot while tracked, so a walk over a table that changes between
    /// pages lists every endpoint tracked throughout **exactly once** (see
    /// [`crate::snapshot`]). O(`max` plus the free slots passed); allocates the page.
    ///
    /// # Panics
    ///
    /// Only if a key's `Clone` panics (each listed key is cloned); the table is unchanged.
    pub fn snapshot(
        &self,
        now: Instant,
        from: Option<Cursor>,
        max: usize,
    ) -> Page<EndpointSnapshot<U, H>> {
        let now = self.clock.peek(now);
        let max = max.max(1);
        let mut at = from
            .map_or(self.slots.len(), Cursor::at)
            .min(self.slots.len());
        let mut items = Vec::new();
        while at > 0 && items.len() < max {
            at -= 1;
            let Some(Some(e)) = self.slots.get(at) else {
                continue;
            };
            let conn = e.conn.as_ref();
            items.push(EndpointSnapshot {
                key: e.key.clone(),
                conn: conn.map(|c| (c.id, c.state)),
                in_flight: conn.map_or(0, |c| c.in_flight),
                closes_at: conn
                    .and(e.heap_pos)
                    .and_then(|pos| self.timers.get(pos))
                    .map(|&(at, _)| at),
                backoff_until: (conn.is_none() && now < e.wait_until).then_some(e.wait_until),
                connect_failures: e.backoff.attempt(),
            });
        }
        Page {
            items,
            next: (at > 0).then(|| Cursor::position(at)),
        }
    }

    /// Live connections (connecting or connected).
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no connection is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Endpoints the table holds state for: those with a live connection plus those whose
    /// connect backoff is not yet evicted. Zero once everything closed and was evicted.
    pub fn tracked_endpoints(&self) -> usize {
        self.by_key.len()
    }

    // ----- internals -----

    /// `key`'s hash and slot: with [`Self::uid_anchor`], the only places the table runs the
    /// key's `Hash` and `Eq`.
    fn lookup(&self, key: &ConnKey<U, H>) -> (u64, Option<u32>) {
        let hash = self.hasher.hash_one(key);
        let slots = &self.slots;
        let slot = self
            .by_key
            .find(hash, |&s| {
                slots
                    .get(s as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|e| e.key == *key)
            })
            .copied();
        (hash, slot)
    }

    /// The first slot of `uid`'s endpoints (whose hash is `hash`), if it has any: names its
    /// `by_uid` entry without comparing uids again.
    fn uid_anchor(&self, hash: u64, uid: &U) -> Option<u32> {
        let slots = &self.slots;
        self.by_uid
            .find(hash, |u| {
                u.slots
                    .first()
                    .and_then(|&s| slots.get(s as usize)?.as_ref())
                    .is_some_and(|e| e.key.uid == *uid)
            })
            .and_then(|u| u.slots.first().copied())
    }

    fn entry(&self, slot: u32) -> Option<&Entry<U, H>> {
        self.slots.get(slot as usize)?.as_ref()
    }

    fn entry_mut(&mut self, slot: u32) -> Option<&mut Entry<U, H>> {
        self.slots.get_mut(slot as usize)?.as_mut()
    }

    /// The slot of `conn` if it is the live connection there (stale and bogus ids are not).
    fn live_slot(&self, conn: ConnId) -> Option<u32> {
        let c = self.entry(conn.slot)?.conn.as_ref()?;
        (c.id == conn).then_some(conn.slot)
    }

    fn live_conn(&self, conn: ConnId) -> Option<&Conn> {
        let c = self.entry(conn.slot)?.conn.as_ref()?;
        (c.id == conn).then_some(c)
    }

    fn take_seq(&mut self) -> Option<u64> {
        self.ids.next().ok()
    }

    fn alloc_slot(&mut self) -> Option<u32> {
        while let Some(Reverse(slot)) = self.free.pop() {
            if (slot as usize) < self.slots.len() {
                if matches!(self.slots.get(slot as usize), Some(None)) {
                    return Some(slot);
                }
                continue; // unreachable: a free entry below the end names an empty slot
            }
            // The smallest entry is past the end, so every entry is stale. Dropping them
            // before the table grows keeps a trimmed slot from being handed out twice.
            self.free.clear();
        }
        let slot = u32::try_from(self.slots.len()).ok()?;
        self.slots.push(None);
        Some(slot)
    }

    /// Sets, moves or removes the slot's timer.
    fn set_deadline(&mut self, slot: u32, at: Option<Instant>) {
        let Some(e) = self.entry(slot) else {
            return;
        };
        match (e.heap_pos, at) {
            (None, None) => {}
            (Some(pos), None) => self.heap_remove(pos),
            (None, Some(at)) => {
                let pos = self.timers.len();
                self.timers.push((at, slot));
                self.set_heap_pos(pos);
                self.sift_up(pos);
            }
            (Some(pos), Some(at)) => {
                let Some(item) = self.timers.get_mut(pos) else {
                    return;
                };
                let old = item.0;
                item.0 = at;
                if at < old {
                    self.sift_up(pos);
                } else {
                    self.sift_down(pos);
                }
            }
        }
    }

    /// Records in the entry named by `timers[pos]` that its timer is at `pos`.
    fn set_heap_pos(&mut self, pos: usize) {
        if let Some(&(_, slot)) = self.timers.get(pos) {
            if let Some(e) = self.entry_mut(slot) {
                e.heap_pos = Some(pos);
            }
        }
    }

    fn heap_swap(&mut self, a: usize, b: usize) {
        if a < self.timers.len() && b < self.timers.len() {
            self.timers.swap(a, b);
            self.set_heap_pos(a);
            self.set_heap_pos(b);
        }
    }

    fn sift_up(&mut self, mut pos: usize) {
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if self.timers.get(pos) >= self.timers.get(parent) {
                break;
            }
            self.heap_swap(pos, parent);
            pos = parent;
        }
    }

    fn sift_down(&mut self, mut pos: usize) {
        loop {
            let left = pos.saturating_mul(2).saturating_add(1);
            let right = left.saturating_add(1);
            let mut least = pos;
            for child in [left, right] {
                if child < self.timers.len() && self.timers.get(child) < self.timers.get(least) {
                    least = child;
                }
            }
            if least == pos {
                break;
            }
            self.heap_swap(pos, least);
            pos = least;
        }
    }

    fn heap_remove(&mut self, pos: usize) {
        let Some(last) = self.timers.len().checked_sub(1) else {
            return;
        };
        if pos > last {
            return;
        }
        self.heap_swap(pos, last);
        if let Some((_, slot)) = self.timers.pop() {
            if let Some(e) = self.entry_mut(slot) {
                e.heap_pos = None;
            }
        }
        if pos < self.timers.len() {
            self.sift_up(pos);
            self.sift_down(pos);
        }
    }

    /// Forgets the slot's live connection. The entry stays only while the endpoint is in
    /// connect backoff, until `max(backoff end, now) + max_idle`.
    fn drop_conn(&mut self, slot: u32, now: Instant) -> Option<ConnId> {
        let max_idle = self.cfg.max_idle;
        let e = self.entry_mut(slot)?;
        let id = e.conn.take()?.id;
        let in_backoff = e.backoff.attempt() > 0;
        let forget = e.wait_until.max(now) + max_idle;
        self.live = self.live.saturating_sub(1);
        if in_backoff {
            self.set_deadline(slot, Some(forget));
        } else {
            self.free_entry(slot);
        }
        Some(id)
    }

    fn free_entry(&mut self, slot: u32) {
        self.set_deadline(slot, None);
        let Some(e) = self.slots.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        if e.conn.is_some() {
            self.live = self.live.saturating_sub(1);
        }
        // Found by stored hash and slot: no user code runs.
        if let Ok(found) = self.by_key.find_entry(e.key_hash, |&s| s == slot) {
            found.remove();
        }
        if let Ok(mut found) = self
            .by_uid
            .find_entry(e.uid_hash, |u| u.slots.contains(&slot))
        {
            let slots = &mut found.get_mut().slots;
            slots.retain(|s| *s != slot);
            if slots.is_empty() {
                found.remove();
            }
        }
        self.free.push(Reverse(slot));
    }

    /// Gives memory back once the table is below a quarter of what it holds, never below
    /// [`SHRINK_FLOOR`]. Costs O(1) plus work already paid for: O(1) per trailing slot
    /// trimmed, and a purge of stale free-list entries only once they outnumber the valid
    /// ones (so it visits fewer than two entries per slot trimmed since the last purge).
    fn shrink(&mut self) {
        let used = self.by_key.len();
        if used < self.slots.len() / 4 {
            // Allocation prefers low slots, so the used ones gather at the front. A live
            // connection in a high slot stops the trim: its id names that slot.
            while matches!(self.slots.last(), Some(None)) {
                self.slots.pop();
                #[cfg(test)]
                {
                    self.maintenance_steps += 1;
                }
            }
            let target = self.slots.len().saturating_mul(2).max(SHRINK_FLOOR);
            self.slots.shrink_to(target);
        }
        // Trimmed slots stay in the free heap (finding them there would cost a scan) until
        // they outnumber the valid entries; `alloc_slot` skips them meanwhile.
        let len = self.slots.len();
        let valid = len.saturating_sub(used);
        if self.free.len().saturating_sub(valid) > valid {
            #[cfg(test)]
            {
                self.maintenance_steps += self.free.len() as u64;
            }
            self.free.retain(|&Reverse(s)| (s as usize) < len);
        }
        if self.free.len() < self.free.capacity() / 4 {
            let target = self.free.len().saturating_mul(2).max(SHRINK_FLOOR);
            self.free.shrink_to(target);
        }
        if self.timers.len() < self.timers.capacity() / 4 {
            let target = self.timers.len().saturating_mul(2).max(SHRINK_FLOOR);
            self.timers.shrink_to(target);
        }
        if self.by_key.len() < self.by_key.capacity() / 4 {
            let target = self.by_key.len().saturating_mul(2).max(SHRINK_FLOOR);
            let slots = &self.slots;
            self.by_key.shrink_to(target, |&s| key_hash_at(slots, s));
        }
        if self.by_uid.len() < self.by_uid.capacity() / 4 {
            let target = self.by_uid.len().saturating_mul(2).max(SHRINK_FLOOR);
            self.by_uid.shrink_to(target, |u| u.hash);
        }
        if self.actions.is_empty() && self.actions.capacity() > 4 * SHRINK_FLOOR {
            self.actions.shrink_to(SHRINK_FLOOR);
        }
    }

    /// Internal consistency (slots ↔ key and uid maps ↔ timers, stored hashes), for the model
    /// checker and tests.
    #[cfg(any(test, feature = "model"))]
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let (mut used, mut live) = (0usize, 0usize);
        for (i, e) in self.slots.iter().enumerate() {
            let Some(e) = e else {
                continue;
            };
            let slot = u32::try_from(i).map_err(|_| "a slot index past u32")?;
            used += 1;
            live += usize::from(e.conn.is_some());
            if e.key_hash != self.hasher.hash_one(&e.key)
                || e.uid_hash != self.hasher.hash_one(&e.key.uid)
            {
                return Err("an entry's stored hashes are not its key's");
            }
            if self.lookup(&e.key).1 != Some(slot) {
                return Err("an entry's key does not find its slot");
            }
            if self
                .by_uid
                .find(e.uid_hash, |u| u.slots.contains(&slot))
                .is_none()
            {
                return Err("an entry is missing from its uid's endpoints");
            }
            if let Some(p) = e.heap_pos {
                if self.timers.get(p).map(|t| t.1) != Some(slot) {
                    return Err("an entry's timer position is wrong");
                }
            }
        }
        if self.by_key.len() != used {
            return Err("the key map and the used slots differ");
        }
        let by_uid: usize = self.by_uid.iter().map(|u| u.slots.len()).sum();
        if by_uid != used || self.by_uid.iter().any(|u| u.slots.is_empty()) {
            return Err("the uid map and the used slots differ");
        }
        if live != self.live {
            return Err("the live count is wrong");
        }
        for (p, &(_, slot)) in self.timers.iter().enumerate() {
            if self.entry(slot).and_then(|e| e.heap_pos) != Some(p) {
                return Err("a timer names an entry that does not know it");
            }
        }
        Ok(())
    }

    #[cfg(test)]
    fn set_next_seq(&mut self, seq: u64) {
        self.ids.skip_to(seq);
    }

    /// The table's instance tag (carried by every id it issues).
    #[cfg(test)]
    pub(crate) fn instance_tag(&self) -> u32 {
        self.ids.tag()
    }

    #[cfg(test)]
    fn slot_count(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests;
